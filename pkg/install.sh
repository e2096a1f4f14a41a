#!/usr/bin/env bash
# Builds and installs xiw: the libibverbs provider, its driver file, the
# `xiw` command, and the direct verbs (xiwdv) for C programs: header,
# pkg-config file, link-time symlinks and man pages. With --uninstall,
# removes exactly those files again. Safe to run repeatedly.
set -euo pipefail

usage() {
    echo "usage: $0 [--uninstall]" >&2
}

mode=install
case $# in
0) ;;
1)
    case $1 in
    --uninstall) mode=uninstall ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        usage
        exit 2
        ;;
    esac
    ;;
*)
    usage
    exit 2
    ;;
esac

if [[ $EUID -ne 0 ]]; then
    echo "$0: must be run as root (it writes to /usr and /etc)" >&2
    exit 1
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# libibverbs dlopens providers from <libdir>/libibverbs; ask pkg-config where
# that is (and where its headers are) and fall back to Debian's paths.
libdir=
includedir=
if command -v pkg-config >/dev/null 2>&1; then
    libdir=$(pkg-config --variable=libdir libibverbs 2>/dev/null || true)
    includedir=$(pkg-config --variable=includedir libibverbs 2>/dev/null || true)
fi
libdir=${libdir:-/usr/lib/x86_64-linux-gnu}
includedir=${includedir:-/usr/include}
provider_dir=$libdir/libibverbs

# The file name libibverbs looks for: lib<driver>-rdmav<private ABI>.so. It is
# also the library's soname.
soname=libxiw-rdmav34.so
lib_dst=$provider_dir/$soname
# Later releases load providers by their own private ABI number (57 for
# rdma-core 57-58, 59 for 59-63, 64, 65): the same library serves each (it
# finds the release it runs under when it loads).
abi_link_dsts=()
for abi in 57 59 64 65; do
    abi_link_dsts+=("$provider_dir/libxiw-rdmav$abi.so")
done
driver_dst=/etc/libibverbs.d/xiw.driver
bin_dst=/usr/local/bin/xiw

# Direct verbs. A program linked with -lxiw (through libxiw.so) records the
# soname, which the loader finds in <libdir>; both names are symlinks to the
# provider itself, so when libibverbs later dlopens the provider glibc sees the
# same inode and hands back the copy already loaded: one provider instance.
link_target=libibverbs/$soname
link_dsts=("$libdir/$soname" "$libdir/libxiw.so")
header_dst=$includedir/infiniband/xiwdv.h
pc_dst=$libdir/pkgconfig/xiwdv.pc
man_dir=/usr/share/man/man3
man_dst=$man_dir/xiwdv.3
# One man page name per function of xiwdv.h, each a symlink to xiwdv.3.
man_aliases=(xiwdv_reg_mr xiwdv_last_error xiwdv_is_xiw xiwdv_query_device
    xiwdv_wr_flush xiwdv_wr_verify xiwdv_wr_atomic_masked_fetch_add
    xiwdv_wr_atomic_masked_cmp_swp xiwdv_wr_atomic_swap)
man_alias_dsts=()
for a in "${man_aliases[@]}"; do
    man_alias_dsts+=("$man_dir/$a.3")
done

# Removes symlink $1 if it points to $2 (as this script made it); leaves
# anything else alone.
remove_link() {
    if [[ -L $1 && $(readlink -- "$1") == "$2" ]]; then
        rm -f -- "$1"
        echo "removed $1" >&2
    elif [[ -e $1 || -L $1 ]]; then
        echo "left $1 alone: not the symlink to $2 this script installs" >&2
    else
        echo "not installed: $1" >&2
    fi
}

if [[ $mode == uninstall ]]; then
    for l in "${link_dsts[@]}"; do
        remove_link "$l" "$link_target"
    done
    for l in "${abi_link_dsts[@]}"; do
        remove_link "$l" "$soname"
    done
    for l in "${man_alias_dsts[@]}"; do
        remove_link "$l" xiwdv.3
    done
    for f in "$lib_dst" "$driver_dst" "$bin_dst" "$header_dst" "$pc_dst" "$man_dst"; do
        if [[ -e $f || -L $f ]]; then
            rm -f -- "$f"
            echo "removed $f" >&2
        else
            echo "not installed: $f" >&2
        fi
    done
    if command -v ldconfig >/dev/null 2>&1; then
        ldconfig
    fi
    if [[ -d /run/xiw ]]; then
        echo "note: xiw devices are still set up under /run/xiw; remove them with" \
            "'xiw down' (from the repository build, since $bin_dst is gone)" >&2
    fi
    exit 0
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "$0: cargo not found on PATH (with sudo, try: sudo env PATH=\"\$PATH\" $0)" >&2
    exit 1
fi

echo "building xiw (release) in $repo" >&2
(cd "$repo" && cargo build --release -p xiw)

target=${CARGO_TARGET_DIR:-target}
[[ $target == /* ]] || target=$repo/$target # cargo ran in $repo
lib_src=$target/release/libxiw.so
bin_src=$target/release/xiw
for f in "$lib_src" "$bin_src"; do
    if [[ ! -f $f ]]; then
        echo "$0: the build did not produce $f" >&2
        exit 1
    fi
done
# Programs linked with -lxiw find the provider by its soname (see link_dsts).
if command -v readelf >/dev/null 2>&1; then
    built_soname=$(readelf -d "$lib_src" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
    if [[ $built_soname != "$soname" ]]; then
        echo "$0: $lib_src has soname '${built_soname}', expected '$soname'" >&2
        exit 1
    fi
else
    echo "$0: readelf not found (binutils); not checking the soname of $lib_src" >&2
fi

# install(1) unlinks the destination before writing, so processes that have
# the old library mapped keep running on their copy.
install -D -m 0644 "$lib_src" "$lib_dst"
echo "installed $lib_dst (from $lib_src)" >&2
for l in "${abi_link_dsts[@]}"; do
    ln -sfn -- "$soname" "$l"
    echo "installed $l -> $soname" >&2
done
install -D -m 0644 "$repo/pkg/xiw.driver" "$driver_dst"
echo "installed $driver_dst" >&2
install -D -m 0755 "$bin_src" "$bin_dst"
echo "installed $bin_dst (from $bin_src)" >&2

# Direct verbs.
for l in "${link_dsts[@]}"; do
    ln -sfn -- "$link_target" "$l"
    echo "installed $l -> $link_target" >&2
done
if command -v ldconfig >/dev/null 2>&1; then
    ldconfig
fi
install -D -m 0644 "$repo/xiwdv/include/infiniband/xiwdv.h" "$header_dst"
echo "installed $header_dst" >&2
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
pc_tmp=$(mktemp)
trap 'rm -f -- "$pc_tmp"' EXIT
sed -e "s|@LIBDIR@|$libdir|g" -e "s|@INCLUDEDIR@|$includedir|g" \
    -e "s|@VERSION@|${version:-0}|g" "$repo/xiwdv/xiwdv.pc.in" >"$pc_tmp"
install -D -m 0644 "$pc_tmp" "$pc_dst"
echo "installed $pc_dst" >&2
install -D -m 0644 "$repo/xiwdv/man/xiwdv.3" "$man_dst"
echo "installed $man_dst" >&2
for l in "${man_alias_dsts[@]}"; do
    ln -sfn -- xiwdv.3 "$l"
done
echo "installed ${#man_alias_dsts[@]} man page names in $man_dir (symlinks to xiwdv.3)" >&2
