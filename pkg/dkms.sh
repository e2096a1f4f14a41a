#!/usr/bin/env bash
# xiw.ko through DKMS from this checkout, so that the module is rebuilt for
# every kernel the host installs (needs dkms and the kernel's headers). On
# Debian and Ubuntu the xiw-dkms package (pkg/debs.sh) does this and more;
# this script is for systems without it, and leaves a package's source alone.
#
#   bash pkg/dkms.sh add              source into /usr/src/xiw-VERSION, known to DKMS
#   bash pkg/dkms.sh install [KVER]   add, build and install for KVER (default: running kernel)
#   bash pkg/dkms.sh build KVER DIR   add and build for KVER against the headers in DIR
#                                     (a kernel not installed here); prints the .ko's path
#   bash pkg/dkms.sh remove           every build and the source again
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
src=/usr/src/xiw-$version

usage() {
    sed -n '5,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
}

if [[ $EUID -ne 0 ]]; then
    echo "$0: must be run as root (it writes to /usr/src and /var/lib/dkms)" >&2
    exit 1
fi
command -v dkms >/dev/null || {
    echo "$0: dkms is not installed (apt-get install dkms)" >&2
    exit 1
}

# The package's files are dpkg's to change.
if command -v dpkg >/dev/null && dpkg -S "$src/dkms.conf" >/dev/null 2>&1; then
    echo "$0: $src belongs to the xiw-dkms package; use dkms directly" \
        "(dkms build -m xiw -v $version -k KVER) or remove the package first" >&2
    exit 1
fi

add() {
    # A fresh copy each time: an earlier one of the same version may be stale.
    if dkms status -m xiw -v "$version" | grep . >/dev/null; then
        dkms remove -m xiw -v "$version" --all >&2
    fi
    rm -rf "$src"
    mkdir -p "$src/kernel-shim" "$src/abi/include"
    cp "$repo"/kernel-shim/{Kbuild,Makefile,*.c,*.h} "$src/kernel-shim/"
    cp "$repo/abi/include/xiw_abi.h" "$src/abi/include/"
    sed "s/@VERSION@/$version/" "$repo/pkg/dkms.conf" >"$src/dkms.conf"
    dkms add -m xiw -v "$version" >&2
}

case ${1:-} in
add) add ;;
install)
    add
    dkms install -m xiw -v "$version" -k "${2:-$(uname -r)}" >&2
    ;;
build)
    (($# == 3)) || usage
    add
    dkms build -m xiw -v "$version" -k "$2" --kernelsourcedir "$3" >&2
    echo "/var/lib/dkms/xiw/$version/$2/$(uname -m)/module/xiw.ko"
    ;;
remove)
    if dkms status -m xiw -v "$version" | grep . >/dev/null; then
        dkms remove -m xiw -v "$version" --all >&2
    fi
    rm -rf "$src"
    ;;
*) usage ;;
esac
