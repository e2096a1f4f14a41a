#!/usr/bin/env bash
# Fetches one of Debian's own kernels (image, modules, headers and kbuild, all
# of one revision) and unpacks it once. Prints the unpacked root, which holds
#   boot/vmlinuz-<kver>            the kernel qemu boots
#   lib/modules/<kver>             its modules, with modules.dep
#   usr/src/linux-headers-<kver>   the build tree for out-of-tree modules
#   src/                           from the kernel's source (linux-source):
#                                  scripts/checkpatch.pl and its data files,
#                                  and drivers/infiniband/sw/siw (bookworm's
#                                  kernel only: the tests that read them run
#                                  there)
#
# usage: tests/vm/kernel.sh [bookworm|bookworm-backports|trixie|sid]
#
# bookworm (Debian 12, the default): unpacked under $XIW_VM_CACHE (default
# /var/cache/xiw-vm/<kver>); its build tools run on this (Debian 12) host.
# bookworm-backports: the newer kernel Debian 12's backports offer, built for
# Debian 12 (its build tools run on this host too); asked of the archive
# through an apt state of its own (under $XIW_VM_CACHE/apt-bookworm-backports,
# refreshed daily), so the host's apt never sees the suite.
# trixie (Debian 13) and sid (unstable): their build tools need that
# release's compiler and libraries, so the kernel is fetched and unpacked
# inside the release's chroot of pkg/chroot.sh (under /var/cache/xiw-vm/<kver>
# there), where modules for it are built; the root then also holds a file
# `.chroot` naming the chroot.
# Nothing is installed on the host: the packages are only unpacked.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
suite=${1:-bookworm}

# Options for every apt command (an apt state of the suite's own, if any).
apt_opts=()
case $suite in
bookworm)
    chroot_dir=
    inner=${XIW_VM_CACHE:-/var/cache/xiw-vm}
    ;;
bookworm-backports)
    chroot_dir=
    inner=${XIW_VM_CACHE:-/var/cache/xiw-vm}
    state=$inner/apt-$suite
    apt_opts=(-o "Dir::Etc::sourcelist=$state/sources.list" -o Dir::Etc::sourceparts=-
        -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache")
    ;;
trixie | sid)
    chroot_dir=$(bash "$repo/pkg/chroot.sh" "$suite")
    inner=/var/cache/xiw-vm
    ;;
*)
    echo "kernel.sh: unknown suite '$suite' (known: bookworm, bookworm-backports, trixie, sid)" >&2
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

# One kernel.sh at a time per cache: others wait (they may want the same
# kernel, which is unpacked in place).
mkdir -p "$chroot_dir$inner"
exec 9>"$chroot_dir$inner/.lock"
flock 9

if [[ -n $chroot_dir && ! -e $chroot_dir/.xiw-kbuild ]]; then
    # The kernel's build tools, with the suite's compiler.
    # Unstable's Release file may be past its Valid-Until on a mirror that lags;
    # its signature is still checked.
    in_suite apt-get -o Acquire::Check-Valid-Until=false update -qq >&2
    in_suite apt-get install -y -qq --no-install-recommends make libelf1t64 libssl3t64 zlib1g xz-utils pahole >&2
    touch "$chroot_dir/.xiw-kbuild"
fi

if [[ $suite == bookworm-backports ]]; then
    if [[ -z $(find "$state/lists" -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null) ]]; then
        mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
            >"$state/sources.list"
        apt-get "${apt_opts[@]}" update -qq >&2
    fi
fi

# The archive, as tests/vm/kernel-choice.sh asks it.
apt_madison() { in_suite apt-cache "${apt_opts[@]}" madison "$1" 2>/dev/null; }
apt_depends() {
    in_suite apt-cache "${apt_opts[@]}" show "$1=$2" 2>/dev/null |
        awk '/^Depends:/ { sub(/^Depends: */, ""); print; exit }'
}
# shellcheck source=kernel-choice.sh
source "$repo/tests/vm/kernel-choice.sh"

# One set of packages that exist together, for the newest kernel that has one;
# chosen again whenever apt's package lists, or the rule, change.
lists=$chroot_dir/var/lib/apt/lists
[[ $suite != bookworm-backports ]] || lists=$state/lists
memo=$chroot_dir$inner/.choice-$suite
key=$({
    find "$lists" -maxdepth 1 -name '*_Packages*' -printf '%f %s %T@\n' | sort
    cat "$repo/tests/vm/kernel-choice.sh"
} | md5sum)
if [[ -f $memo && $(head -1 "$memo") == "$key" ]]; then
    choice=$(tail -n +2 "$memo")
else
    choice=$(xiw_kernel_choose) || exit 1
    mkdir -p "$chroot_dir$inner"
    printf '%s\n%s\n' "$key" "$choice" >"$memo"
fi
kver=$(awk '$1 == "kver" { print $2 }' <<<"$choice")
compiler=$(awk '$1 == "compiler" { print $2 }' <<<"$choice")
mapfile -t spec < <(awk '$1 == "pkg" { print $2 "=" $3 }' <<<"$choice")
root=$chroot_dir$inner/$kver
# The cache is what was fetched: another set of packages for the same kernel
# release (a later revision of its kbuild tools, say) is fetched afresh.
if [[ -e $root/.complete ]] && [[ $(cat "$root/.complete") == "$(printf '%s\n' "${spec[@]}")" ]]; then
    echo "$root"
    exit 0
fi
echo "kernel.sh: $suite's kernel $kver from ${spec[*]}" >&2
sed -n 's/^note /kernel.sh: note: /p' <<<"$choice" >&2
major=$(awk -F. '{ print $1 "." $2 }' <<<"$kver")
if [[ -n $chroot_dir && -n $compiler ]]; then
    in_suite apt-get install -y -qq --no-install-recommends "$compiler" >&2
fi

mkdir -p "$chroot_dir/tmp"
dl=$(mktemp -d "$chroot_dir/tmp/xiw-kernel-dl.XXXXXX")
trap 'rm -rf "$dl"' EXIT
# The source only for Debian 12's own kernel: the tests that read it
# (checkpatch, siw) run there. Another suite's set still has to have one.
fetch=()
for p in "${spec[@]}"; do
    [[ $suite != bookworm && $p == linux-source-* ]] || fetch+=("$p")
done
in_suite sh -c 'cd "$1" && shift && apt-get download -q "$@"' sh "${dl#"$chroot_dir"}" "${apt_opts[@]}" "${fetch[@]}" \
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
if [[ $suite == bookworm ]]; then
    mkdir -p "$root/src"
    dpkg-deb --fsys-tarfile "$dl"/linux-source-"$major"_*.deb |
        tar -xO "./usr/src/linux-source-$major.tar.xz" |
        tar -xJ -C "$root/src" --strip-components=1 \
            "linux-source-$major/scripts/checkpatch.pl" \
            "linux-source-$major/scripts/spelling.txt" \
            "linux-source-$major/scripts/const_structs.checkpatch" \
            "linux-source-$major/drivers/infiniband/sw/siw"
fi

# The headers' Makefile includes the common tree by its absolute /usr/src
# path; point it at the unpacked one (as the build sees it).
sed -i "s#/usr/src/#$inner/$kver/usr/src/#" "$root/usr/src/linux-headers-$kver/Makefile"
# Debian 13 ships its modules under /usr/lib only.
if [[ ! -e $root/lib ]]; then
    ln -s usr/lib "$root/lib"
fi
# Unstable's kernel (7.x) is beside its modules, not in /boot.
if [[ ! -e $root/boot/vmlinuz-$kver && -e $root/lib/modules/$kver/vmlinuz ]]; then
    mkdir -p "$root/boot"
    ln -s "../lib/modules/$kver/vmlinuz" "$root/boot/vmlinuz-$kver"
fi
depmod -b "$root" "$kver"
if [[ -n $chroot_dir ]]; then
    echo "$chroot_dir" >"$root/.chroot"
fi
printf '%s\n' "${spec[@]}" >"$root/.complete"
echo "$root"
