#!/usr/bin/env bash
# Fetches one of Debian's own kernels (image, modules, headers and kbuild, all
# of one revision) and unpacks it once under $XIW_VM_CACHE (default
# /var/cache/xiw-vm/<kernel release>). Prints the unpacked root, which holds
#   boot/vmlinuz-<kver>            the kernel qemu boots
#   lib/modules/<kver>             its modules, with modules.dep
#   usr/src/linux-headers-<kver>   the build tree for out-of-tree modules
#   src/                           from the kernel's source (linux-source):
#                                  scripts/checkpatch.pl and its data files,
#                                  and drivers/infiniband/sw/siw
#
# usage: tests/vm/kernel.sh [bookworm]
# Nothing is installed on the host: the packages are only unpacked.
set -euo pipefail

suite=${1:-bookworm}
cache=${XIW_VM_CACHE:-/var/cache/xiw-vm}

case $suite in
bookworm) ;;
*)
    echo "kernel.sh: unknown suite '$suite' (known: bookworm)" >&2
    exit 2
    ;;
esac

# The kernel Debian 12 installs today: what linux-image-amd64 depends on.
image=$(apt-cache depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
if [[ -z $image ]]; then
    echo "kernel.sh: apt knows no linux-image-amd64 (run apt-get update)" >&2
    exit 1
fi
kver=${image#linux-image-}
version=$(apt-cache show "$image" | awk '$1 == "Version:" { print $2; exit }')
root=$cache/$kver
if [[ -e $root/.complete ]]; then
    echo "$root"
    exit 0
fi

# The headers package names the common headers and the kbuild tools it needs.
major=$(awk -F. '{ print $1 "." $2 }' <<<"$kver")
pkgs=("$image" "linux-headers-$kver" "linux-source-$major")
while read -r dep; do
    case $dep in
    linux-headers-*-common | linux-kbuild-*) pkgs+=("$dep") ;;
    esac
done < <(apt-cache depends "linux-headers-$kver" | awk '$1 == "Depends:" { print $2 }')

dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
(cd "$dl" && apt-get download -q "${pkgs[@]/%/=$version}" >&2) 2> >(grep -v "couldn't be accessed by user '_apt'" >&2)
rm -rf "$root"
mkdir -p "$root"
for deb in "$dl"/*.deb; do
    case $deb in
    */linux-source-*) ;;
    *) dpkg-deb -x "$deb" "$root" ;;
    esac
done

# Of the source, only what the tests use.
mkdir -p "$root/src"
dpkg-deb --fsys-tarfile "$dl"/linux-source-"$major"_*.deb |
    tar -xO "./usr/src/linux-source-$major.tar.xz" |
    tar -xJ -C "$root/src" --strip-components=1 \
        "linux-source-$major/scripts/checkpatch.pl" \
        "linux-source-$major/scripts/spelling.txt" \
        "linux-source-$major/scripts/const_structs.checkpatch" \
        "linux-source-$major/drivers/infiniband/sw/siw"

# The headers' Makefile includes the common tree by its absolute /usr/src
# path; point it at the unpacked one.
sed -i "s#/usr/src/#$root/usr/src/#" "$root/usr/src/linux-headers-$kver/Makefile"
depmod -b "$root" "$kver"
touch "$root/.complete"
echo "$root"
