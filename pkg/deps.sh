# Sourced by tests/run-all.sh, pkg/demo.sh and .ci/run: the Debian 12 packages
# xiw needs to build, install and be tested, and a function that installs the
# missing ones.

# Build: bindgen needs libclang and the rdma-core headers; cargo links with cc;
# `xiw exec`'s filter links libseccomp (libseccomp2, on every system).
XIW_BUILD_PKGS=(ca-certificates gcc libc6-dev pkg-config clang libclang-dev libibverbs-dev librdmacm-dev libseccomp-dev)
# The Debian packages (pkg/debs.sh): dpkg-buildpackage with debhelper, which
# strips into a -dbgsym package, and dh-dkms for xiw-dkms.
XIW_DEB_PKGS=(dpkg-dev debhelper dh-dkms fakeroot)
# The demo (pkg/demo.sh): the build, and what runs ib_write_lat over a
# device: ibv_devinfo, perftest, ss.
XIW_DEMO_PKGS=("${XIW_BUILD_PKGS[@]}" ibverbs-utils perftest iproute2)
# Run and test: libibverbs and its tools, perftest, ip/ss (iproute2), pgrep etc.
# (procps), man-db and groff (groff-base) to check the man pages, rdma-core's own
# test suite (python3-pyverbs), mmdebstrap (debootstrap where it is missing) for the chroots of other Debian
# releases whose rdma-core the provider is tested against (pkg/chroot.sh).
# The xiwdv example is built with gcc and pkg-config, above. curl, cmake and
# ninja-build fetch and build libibverbs of rdma-core releases no Debian suite
# has, from the source that crates.io and PyPI carry (tests/rdma-core-build.sh);
# cython3 and python3-dev build the pyverbs of the same tree, which runs that
# release's own test suite.
# Kernel mode (tests/vm/): make, gcc-12 (through gcc), libelf1, libssl3 and
# zlib for the kernel's build tools, dwarves (pahole: the module's BTF, for
# bookworm-backports' 6.12 kernel), kmod (depmod), xz-utils, cpio and
# busybox-static for the guest's initramfs, qemu to boot it, perl for
# checkpatch.pl; the programs run in the guest: fio (its rdma engine),
# libfabric's fi_pingpong, Open MPI with its headers (to build the MPI
# ping-pong of tests/c/) and qperf (tests/vm/bench.sh's rdma_cm latency and
# bandwidth); dkms, which pkg/dkms.sh builds the module with;
# nftables, which injects TCP resets and packet loss in the fault tests;
# valgrind, which runs whole programs under memcheck (tests/tests/sanitizers.rs).
# fonts-dejavu-core: the font xiw-bench lays out its pictures' text with.
XIW_RUNTIME_PKGS=(rdma-core ibverbs-utils ibverbs-providers rdmacm-utils perftest iproute2 procps man-db groff-base python3-pyverbs debootstrap mmdebstrap
    make libelf1 libssl3 zlib1g dwarves kmod xz-utils cpio busybox-static qemu-system-x86 perl
    fio libfabric-bin openmpi-bin libopenmpi-dev qperf dkms nftables valgrind curl cmake ninja-build cython3 python3-dev fonts-dejavu-core)

# Installs (apt-get) whichever of the packages named are not installed yet
# (default: every package above); touches apt not at all when everything is
# present.
xiw_ensure_packages() {
    local missing=() p want=("$@")
    ((${#want[@]})) || want=("${XIW_BUILD_PKGS[@]}" "${XIW_DEB_PKGS[@]}" "${XIW_RUNTIME_PKGS[@]}")
    for p in "${want[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    if ((${#missing[@]} == 0)); then
        echo "xiw: all required packages are installed" >&2
        return 0
    fi
    echo "xiw: installing missing packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# Puts cargo on PATH (rustup installs it in ~/.cargo/bin, which sudo and
# non-login shells may not have); fails loudly without it. Debian 12's own
# rustc is too old for this workspace (rust-version 1.87), so it is not
# installed from apt.
xiw_ensure_cargo() {
    if ! command -v cargo >/dev/null 2>&1 && [[ -x ${HOME:-/root}/.cargo/bin/cargo ]]; then
        export PATH="${HOME:-/root}/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        echo "xiw: cargo not found: install a Rust toolchain >= 1.89 (https://rustup.rs)" >&2
        return 1
    fi
}
