#!/usr/bin/env bash
# The Debian packages' life in a clean chroot of SUITE (tests/tests/packages.rs):
# install the earlier version (xiw, xiw-dbgsym, libxiwdv-dev, xiw-dkms), upgrade
# to the new one, use it (the suite's own libibverbs loads the provider through
# the packaged driver file; a C program builds against xiwdv.pc), remove,
# purge, and find nothing left behind. Must run as root. Prints "CHECK ..."
# lines for what was checked and "PACKAGES SUITE ok" at the end; exits
# non-zero with the reason otherwise.
#
#   bash tests/packages.sh SUITE NEW-DEBS-DIR OLD-DEBS-DIR
#
# The chroot is an overlay on a pristine debootstrap of SUITE
# (pkg/chroot.sh --base), so every run starts from the same clean system and
# leaves it unchanged; apt's downloads are kept under $XIW_CHROOTS/apt-SUITE.
set -euo pipefail

suite=${1:?usage: tests/packages.sh SUITE NEW-DEBS-DIR OLD-DEBS-DIR}
new=$(cd "${2:?}" && pwd)
old=$(cd "${3:?}" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
chroots=${XIW_CHROOTS:-/var/lib/xiw/chroots}

fail() {
    echo "packages.sh ($suite): $*" >&2
    exit 1
}
check() { echo "CHECK $suite: $*"; }

[[ $EUID -eq 0 ]] || fail "must be run as root"
version_of() {
    local f
    f=$(compgen -G "$1/xiw_*.deb" | head -n 1) || fail "no xiw_*.deb in $1"
    dpkg-deb -f "$f" Version
}
new_v=$(version_of "$new")
old_v=$(version_of "$old")
dpkg --compare-versions "$old_v" lt "$new_v" || fail "$old_v is not older than $new_v"

base=$(bash "$repo/pkg/chroot.sh" --base "$suite")

# Everything below runs in a mount namespace of its own: the overlay and the
# chroot's mounts vanish with it, whatever happens.
if [[ -z ${XIW_PACKAGES_INNER:-} ]]; then
    work=$(mktemp -d /var/tmp/xiw-packages.XXXXXX)
    [[ -n ${XIW_PACKAGES_KEEP:-} ]] || trap 'rm -rf -- "$work"' EXIT
    mkdir -p "$chroots/apt-$suite"
    rc=0
    XIW_PACKAGES_INNER=$work unshare --mount --propagation private \
        bash "${BASH_SOURCE[0]}" "$@" || rc=$?
    exit "$rc"
fi
work=$XIW_PACKAGES_INNER
root=$work/root
mkdir -p "$work/upper" "$work/work" "$root"
mount -t overlay overlay -o "lowerdir=$base,upperdir=$work/upper,workdir=$work/work" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
# A /dev of its own: `xiw up` makes its nodes there, not in the host's.
mount -t tmpfs -o mode=0755 tmpfs "$root/dev"
for n in null zero full random urandom tty; do
    touch "$root/dev/$n"
    mount --bind "/dev/$n" "$root/dev/$n"
done
mkdir -p "$root/dev/pts" "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${i%%:*}" "$root/dev/${i#*:}"; done
mount -t tmpfs tmpfs "$root/tmp"
mount --bind "$chroots/apt-$suite" "$root/var/cache/apt/archives"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/tmp/new" "$root/tmp/old"
cp "$new"/*.deb "$root/tmp/new/"
cp "$old"/*.deb "$root/tmp/old/"

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
apt_get() { in_root apt-get -o Dpkg::Use-Pty=0 -o APT::Keep-Downloaded-Packages=true \
    -y --no-install-recommends "$@"; }

# The tools this test uses (not the packages' dependencies, which apt must
# find from the packages themselves), installed before the first picture of
# the file system is taken.
apt_get update >/dev/null
tools=(ibverbs-utils gcc libc6-dev pkg-config)
apt_get install "${tools[@]}" >"$work/tools.log" 2>&1 || {
    tail -n 30 "$work/tools.log" >&2
    fail "installing ${tools[*]} failed"
}

# The file system's picture: every path and its type, without the places
# that change on their own (apt's lists and caches, logs, dpkg's status).
picture() {
    (cd "$root" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp \
        -o -path ./run -o -path ./var/cache -o -path ./var/lib/apt -o -path ./var/log \
        -o -path ./var/lib/dpkg/triggers -o -path ./var/lib/dpkg/updates \) -prune -o \
        ! -path './var/lib/dpkg/status*' ! -path './var/lib/dpkg/available*' \
        ! -path './var/lib/dpkg/diversions*' ! -path './var/lib/dpkg/lock*' \
        ! -path './etc/ld.so.cache' ! -path './var/lib/dpkg/info/format' \
        -printf '%y %p\n' | sort)
}
picture >"$work/before"

installed() { in_root dpkg-query -W -f='${Package} ${Version} ${Status}\n' "$@" 2>/dev/null || true; }
pkgs=(xiw xiw-dbgsym libxiwdv-dev xiw-dkms)

# 1. The earlier version.
# shellcheck disable=SC2046
apt_get install $(cd "$root" && for p in "${pkgs[@]}"; do compgen -G "tmp/old/${p}_*.deb" | sed 's|^|/|'; done) \
    >"$work/old.log" 2>&1 || {
    tail -n 40 "$work/old.log" >&2
    fail "installing $old_v failed"
}
for p in "${pkgs[@]}"; do
    installed "$p" | grep -x "$p $old_v install ok installed" >/dev/null || fail "$p $old_v is not installed: $(installed "$p")"
done
in_root xiw --version | grep . >/dev/null || fail "xiw --version printed nothing"
in_root test -f "/usr/src/xiw-$old_v/dkms.conf" || fail "no /usr/src/xiw-$old_v/dkms.conf"
in_root dkms status -m xiw | grep "$old_v" >/dev/null || fail "DKMS does not know xiw/$old_v: $(in_root dkms status -m xiw)"
check "installed $old_v: ${pkgs[*]} (apt added $(grep -c '^Setting up' "$work/old.log") packages), on libibverbs $(in_root dpkg-query -W -f='${Version}' libibverbs1) and dkms $(in_root dpkg-query -W -f='${Version}' dkms); DKMS has xiw/$old_v"

# 2. The upgrade.
# shellcheck disable=SC2046
apt_get install $(cd "$root" && for p in "${pkgs[@]}"; do compgen -G "tmp/new/${p}_*.deb" | sed 's|^|/|'; done) \
    >"$work/new.log" 2>&1 || {
    tail -n 40 "$work/new.log" >&2
    fail "upgrading to $new_v failed"
}
for p in "${pkgs[@]}"; do
    installed "$p" | grep -x "$p $new_v install ok installed" >/dev/null || fail "$p is not at $new_v after the upgrade: $(installed "$p")"
done
dkms_now=$(in_root dkms status -m xiw)
grep -q "$new_v" <<<"$dkms_now" || fail "DKMS does not know xiw/$new_v after the upgrade: $dkms_now"
if grep -q "$old_v[,:]" <<<"$dkms_now" || in_root test -e "/usr/src/xiw-$old_v"; then
    fail "the upgrade left xiw/$old_v behind: $dkms_now"
fi
check "upgraded to $new_v; DKMS has xiw/$new_v only, /usr/src/xiw-$old_v is gone"

# 3. Use: the suite's libibverbs finds the provider through the packaged
# driver file (no RDMAV_DRIVERS), and a C program builds against the
# development files and, linked with -lxiw, runs on the device.
up=$(in_root xiw up --netdev lo --root /tmp/xiw-tree 2>"$work/up.err") || {
    cat "$work/up.err" >&2
    fail "xiw up failed"
}
grep -q 'SYSFS_PATH=/tmp/xiw-tree' <<<"$up" || fail "xiw up printed no SYSFS_PATH: $up"
info=$(in_root env SYSFS_PATH=/tmp/xiw-tree ibv_devinfo -d xiw0 2>&1) || fail "ibv_devinfo -d xiw0 failed: $info"
grep -q 'transport:.*iWARP' <<<"$info" || fail "ibv_devinfo does not show an iWARP device: $info"
check "the suite's ibv_devinfo opens xiw0 through /etc/libibverbs.d/xiw.driver"
cat >"$root/tmp/dv.c" <<'EOF'
#include <infiniband/xiwdv.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "xiw0"))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		return 2;
	printf("xiwdv_is_xiw %d\n", xiwdv_is_xiw(ctx));
	return 0;
}
EOF
in_root sh -c 'gcc -o /tmp/dv /tmp/dv.c $(pkg-config --cflags --libs xiwdv)' >"$work/cc.log" 2>&1 || {
    cat "$work/cc.log" >&2
    fail "a program using xiwdv.h does not build with pkg-config's flags"
}
dv=$(in_root env SYSFS_PATH=/tmp/xiw-tree /tmp/dv 2>&1) || fail "the program linked with -lxiw failed: $dv"
[[ $dv == "xiwdv_is_xiw 1" ]] || fail "the program linked with -lxiw says: $dv"
in_root xiw down --root /tmp/xiw-tree >/dev/null 2>&1 || fail "xiw down failed"
check "a C program builds with \`pkg-config --cflags --libs xiwdv\` and, linked with -lxiw, finds xiw0 is xiw's"
for page in xiw.7 xiw.8 xiwdv.7 xiwdv.3 xiwdv_wr_flush.3; do
    sec=${page##*.}
    in_root test -e "/usr/share/man/man$sec/$page.gz" || fail "no man page /usr/share/man/man$sec/$page.gz"
done
check "man pages xiw(7), xiw(8), xiwdv(7), xiwdv(3) and its function names are installed"

# 4. Remove: only the configuration file stays.
apt_get remove "${pkgs[@]}" >"$work/remove.log" 2>&1 || {
    tail -n 30 "$work/remove.log" >&2
    fail "apt-get remove failed"
}
in_root test -f /etc/libibverbs.d/xiw.driver || fail "remove took the configuration file /etc/libibverbs.d/xiw.driver"
for f in /usr/bin/xiw /usr/src/xiw-$new_v /var/lib/dkms/xiw; do
    in_root test ! -e "$f" || fail "remove left $f"
done
check "removed: /etc/libibverbs.d/xiw.driver stays (a configuration file), the rest is gone"

# 5. Purge: nothing left.
# (dpkg: apt no longer knows the removed packages that came from files.)
in_root dpkg --purge "${pkgs[@]}" >"$work/purge.log" 2>&1 || {
    tail -n 30 "$work/purge.log" >&2
    fail "dpkg --purge failed"
}
left=$(installed "${pkgs[@]}")
[[ -z $left ]] || fail "dpkg still knows: $left"
# And what apt brought in for them.
apt_get -o APT::AutoRemove::RecommendsImportant=false -o APT::AutoRemove::SuggestsImportant=false autoremove --purge >"$work/autoremove.log" 2>&1 || {
    tail -n 30 "$work/autoremove.log" >&2
    fail "apt-get autoremove --purge failed"
}
picture >"$work/after"
if ! diff -u "$work/before" "$work/after" >"$work/diff"; then
    cat "$work/diff" >&2
    grep -h "not empty\|not removed" "$work/purge.log" "$work/autoremove.log" >&2 || true
    fail "purging left the file system different from before the install (above)"
fi
check "purged, with the dependencies apt brought in: the file system is as before the install ($(wc -l <"$work/before") paths compared)"
echo "PACKAGES $suite ok"
