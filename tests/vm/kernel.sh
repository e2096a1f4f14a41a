#!/usr/bin/env bash
# Fetches one of Debian's own kernels (image, modules, headers and kbuild, all
# of one revision) and unpacks it once. Prints the unpacked root, which holds
#   boot/vmlinuz-<kver>            the kernel qemu boots
#   lib/modules/<kver>             its modules, with modules.dep
#   usr/src/linux-headers-<kver>   the build tree for out-of-tree modules
#   src/                           from the kernel's source (linux-source):
#                                  scripts/checkpatch.pl and its data files,
#                                  and drivers/infiniband/sw/siw
#
# usage: tests/vm/kernel.sh [bookworm|trixie]
#
# bookworm (Debian 12, the default): unpacked under $XIW_VM_CACHE (default
# /var/cache/xiw-vm/<kver>); its build tools run on this (Debian 12) host.
# trixie (Debian 13): its build tools need Debian 13's compiler and
# libraries, so it is fetched and unpacked inside the Debian 13 chroot of
# pkg/chroot.sh (under /var/cache/xiw-vm/<kver> there), where modules for it
# are built; the root then also holds a file `.chroot` naming the chroot.
# Nothing is installed on the host: the packages are only unpacked.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
suite=${1:-bookworm}

case $suite in
bookworm)
    chroot_dir=
    inner=${XIW_VM_CACHE:-/var/cache/xiw-vm}
    ;;
trixie)
    chroot_dir=$(bash "$repo/pkg/chroot.sh" trixie)
    inner=/var/cache/xiw-vm
    ;;
*)
    echo "kernel.sh: unknown suite '$suite' (known: bookworm, trixie)" >&2
    exit 2
    ;;
esac

# Runs a command where the suite's apt and build tools are.
in_suite() {
    if [[ -n $chroot_dir ]]; then
        chroot "$chroot_dir" env DEBIAN_FRONTEND=noninteractive "$@"
    else
        "$@"
    fi
}

if [[ -n $chroot_dir && ! -e $chroot_dir/.xiw-kbuild ]]; then
    # The kernel's build tools, with the suite's compiler.
    in_suite apt-get update -qq >&2
    in_suite apt-get install -y -qq --no-install-recommends make libelf1t64 libssl3t64 zlib1g xz-utils pahole >&2
    touch "$chroot_dir/.xiw-kbuild"
fi

# The kernel the suite installs today: what linux-image-amd64 depends on.
image=$(in_suite apt-cache depends linux-image-amd64 | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }')
if [[ -z $image ]]; then
    echo "kernel.sh: apt knows no linux-image-amd64 for $suite (run apt-get update)" >&2
    exit 1
fi
kver=${image#linux-image-}
version=$(in_suite apt-cache show "$image" | awk '$1 == "Version:" { print $2; exit }')
root=$chroot_dir$inner/$kver
if [[ -e $root/.complete ]]; then
    echo "$root"
    exit 0
fi

# The headers package names the common headers, the kbuild tools and the
# compiler it needs.
major=$(awk -F. '{ print $1 "." $2 }' <<<"$kver")
pkgs=("$image" "linux-headers-$kver" "linux-source-$major")
compiler=
while read -r dep; do
    case $dep in
    linux-headers-*-common | linux-kbuild-*) pkgs+=("$dep") ;;
    gcc-[0-9]*) compiler=$dep ;;
    esac
done < <(in_suite apt-cache depends "linux-headers-$kver" | awk '$1 ~ /Depends:$/ { print $2 }')
if [[ -n $chroot_dir && -n $compiler ]]; then
    in_suite apt-get install -y -qq --no-install-recommends "$compiler" >&2
fi

dl=$chroot_dir/tmp/xiw-kernel-dl
rm -rf "$dl"
mkdir -p "$dl"
trap 'rm -rf "$dl"' EXIT
spec=()
for p in "${pkgs[@]}"; do
    spec+=("$p=$version")
done
in_suite sh -c 'cd "$1" && shift && apt-get download -q "$@"' sh "${dl#"$chroot_dir"}" "${spec[@]}" \
    >&2 2> >(grep -v "couldn't be accessed by user '_apt'" >&2)
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
# path; point it at the unpacked one (as the build sees it).
sed -i "s#/usr/src/#$inner/$kver/usr/src/#" "$root/usr/src/linux-headers-$kver/Makefile"
# Debian 13 ships its modules under /usr/lib only.
if [[ ! -e $root/lib ]]; then
    ln -s usr/lib "$root/lib"
fi
depmod -b "$root" "$kver"
if [[ -n $chroot_dir ]]; then
    echo "$chroot_dir" >"$root/.chroot"
fi
touch "$root/.complete"
echo "$root"
