#!/usr/bin/env bash
# Builds and installs xiw: the libibverbs provider, its driver file and the
# `xiw` command. With --uninstall, removes exactly those files again.
# Safe to run repeatedly.
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
# that is and fall back to Debian's multiarch path.
libdir=
if command -v pkg-config >/dev/null 2>&1; then
    libdir=$(pkg-config --variable=libdir libibverbs 2>/dev/null || true)
fi
if [[ -n $libdir ]]; then
    provider_dir=$libdir/libibverbs
else
    provider_dir=/usr/lib/x86_64-linux-gnu/libibverbs
fi

# The file name libibverbs looks for: lib<driver>-rdmav<private ABI>.so.
lib_dst=$provider_dir/libxiw-rdmav34.so
driver_dst=/etc/libibverbs.d/xiw.driver
bin_dst=/usr/local/bin/xiw

if [[ $mode == uninstall ]]; then
    for f in "$lib_dst" "$driver_dst" "$bin_dst"; do
        if [[ -e $f || -L $f ]]; then
            rm -f -- "$f"
            echo "removed $f" >&2
        else
            echo "not installed: $f" >&2
        fi
    done
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

# install(1) unlinks the destination before writing, so processes that have
# the old library mapped keep running on their copy.
install -D -m 0644 "$lib_src" "$lib_dst"
echo "installed $lib_dst (from $lib_src)" >&2
install -D -m 0644 "$repo/pkg/xiw.driver" "$driver_dst"
echo "installed $driver_dst" >&2
install -D -m 0755 "$bin_src" "$bin_dst"
echo "installed $bin_dst (from $bin_src)" >&2
