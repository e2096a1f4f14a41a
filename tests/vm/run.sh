#!/usr/bin/env bash
# Boots Debian's own kernel under qemu (TCG) with xiw.ko and the installed
# provider, runs a test script inside the guest and prints the guest's
# console. Exits with the script's exit status (or 124 if the guest did not
# finish in time).
#
# usage: tests/vm/run.sh GUEST_SCRIPT [FILE...]
#   GUEST_SCRIPT  a busybox sh script, run in the guest as /test.sh with
#                 xiw.ko and the RDMA core modules loaded, dummy0 up at
#                 10.77.0.1/24 and lo up
#   FILE...       programs the script runs, copied with the libraries they
#                 link against and put on the guest's PATH; the script's own
#                 `# needs: FILE...` lines name more, `# tree: DIR...` lines
#                 whole directories, `# modules: NAME...` lines more modules
#                 of the kernel to load, and a `# siw` line Linux's siw,
#                 built from the kernel's source
#
# The provider must be installed on the host first (pkg/install.sh): the
# guest gets the same files (or XIW_VM_PROVIDER names the provider library
# to use instead). Environment: XIW_VM_SUITE (the Debian release whose
# kernel boots, as tests/vm/kernel.sh names it: bookworm, the default,
# bookworm-backports, trixie or sid), XIW_VM_TIMEOUT (seconds,
# default 600, for the whole run), XIW_VM_BOOT_TIMEOUT (seconds the kernel
# may take to reach init before it is stopped and booted once more, default
# 240), XIW_VM_KEEP=1 keeps the work directory, XIW_VM_MODULE names
# an xiw.ko built for the guest's kernel elsewhere (by DKMS, say) to load
# instead of building one.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
script=${1:?usage: run.sh GUEST_SCRIPT [FILE...]}
shift

root=$(bash "$repo/tests/vm/kernel.sh" "${XIW_VM_SUITE:-bookworm}")
kver=$(basename "$root")
modroot=$root/lib/modules/$kver

work=$(mktemp -d /tmp/xiw-vm.XXXXXX)
if [[ ${XIW_VM_KEEP:-0} != 1 ]]; then
    trap 'rm -rf "$work"' EXIT
fi

# The module, built against the guest kernel's headers (out of the source
# tree, which stays clean).
# A kernel of another Debian release is built for in that release's chroot.
chroot_dir=
if [[ -f $root/.chroot ]]; then
    chroot_dir=$(cat "$root/.chroot")
fi
mkdir -p "$work/build"
if [[ -n ${XIW_VM_MODULE:-} ]]; then
    cp "$XIW_VM_MODULE" "$work/build/xiw.ko"
else
    src=$chroot_dir/tmp/xiw-module.$$
    rm -rf "$src"
    mkdir -p "$src/build" "$src/abi/include"
    cp "$repo"/kernel-shim/{Kbuild,Makefile,*.c,*.h} "$src/build/"
    cp "$repo/abi/include/xiw_abi.h" "$src/abi/include/"
    # Built once for each source and kernel (its set of packages): kept
    # beside the kernel, the last few.
    kept=$root/.xiw-modules
    key=$({
        (cd "$src" && find . -type f | LC_ALL=C sort | xargs sha256sum)
        cat "$root/.complete"
    } | sha256sum | cut -c1-24)
    if [[ -f $kept/$key.ko ]]; then
        echo "run.sh: xiw.ko for $kver as built before from the same source" >&2
    else
        if [[ -n $chroot_dir ]]; then
            # With the chroot's own /proc (7.x's objtool reads it), mounted in a
            # mount namespace of the build's own, which takes it away after.
            unshare -m chroot "$chroot_dir" sh -c 'mount -t proc proc /proc && exec "$@"' sh \
                make -s -j"$(nproc)" -C "${root#"$chroot_dir"}/usr/src/linux-headers-$kver" \
                M="${src#"$chroot_dir"}/build" modules >&2
        else
            make -s -j"$(nproc)" -C "$root/usr/src/linux-headers-$kver" M="$src/build" modules >&2
        fi
        mkdir -p "$kept"
        cp "$src/build/xiw.ko" "$kept/$key.ko.$$"
        mv "$kept/$key.ko.$$" "$kept/$key.ko"
        find "$kept" -name '*.ko' -printf '%T@ %p\n' | sort -rn | tail -n +9 | cut -d' ' -f2- | xargs -r rm -f
    fi
    cp "$kept/$key.ko" "$work/build/xiw.ko"
    rm -rf "$src"
fi

ir=$work/initrd
mkdir -p "$ir"/{bin,dev,proc,sys,tmp,run,etc,lib64}

# Modules: the RDMA core and its dependencies, in load order, then xiw.
declare -A loaded=()
order=()
deps_of() {
    awk -v m="$1" -F': *' '$1 == m { print $2 }' "$modroot/modules.dep"
}
want() {
    local m=$1 d
    [[ -n ${loaded[$m]:-} ]] && return
    loaded[$m]=1
    for d in $(deps_of "$m"); do
        want "$d"
    done
    order+=("$m")
}
# More modules of the kernel a guest script names on `# modules:` lines.
more=$(awk '/^# modules:/ { sub(/^# modules:/, ""); print }' "$script")
# What xiw.ko itself needs (6.1's CRC32c library, with the implementations
# its crypto lookup loads: modprobe follows that soft dependency to every
# module of the alias crypto-crc32c, busybox's insmod does not; the lookup
# then takes the fastest, the SSE 4.2 one where the CPU has it, as on a real
# machine).
own=$(/sbin/modinfo -F depends "$work/build/xiw.ko" | tr ',' ' ')
case " $own " in
*" libcrc32c "*)
    for c in crc32c_generic crc32c-intel; do
        if grep -q "/$c\.ko" "$modroot/modules.dep"; then
            own="$c $own"
        fi
    done
    ;;
esac
# shellcheck disable=SC2086 # a list of names
for m in ib_core ib_uverbs iw_cm ib_cm rdma_cm rdma_ucm dummy $own $more; do
    path=$(awk -F: -v m="$m" '{ n = $1; sub(/.*\//, "", n); sub(/\.ko(\.xz)?$/, "", n) } n == m { print $1; exit }' "$modroot/modules.dep")
    [[ -n $path ]] || { echo "run.sh: no module $m in $kver" >&2; exit 1; }
    want "$path"
done
mkdir -p "$ir/lib/modules"
: >"$ir/modules.list"
for m in "${order[@]}"; do
    # busybox's insmod takes plain modules: Debian 13's are xz-compressed.
    name=$(basename "$m" .xz)
    case $m in
    *.xz) xz -dc "$modroot/$m" >"$ir/lib/modules/$name" ;;
    *) cp "$modroot/$m" "$ir/lib/modules/" ;;
    esac
    echo "$name" >>"$ir/modules.list"
done
cp "$work/build/xiw.ko" "$ir/lib/modules/"
echo xiw.ko >>"$ir/modules.list"
# A script with a `# siw` line gets Linux's own software iWARP driver too,
# built from the kernel's source (Debian does not ship it) against the same
# headers, and loaded after xiw.
if grep -q '^# siw$' "$script"; then
    siwsrc=$root/src/drivers/infiniband/sw/siw
    [[ -d $siwsrc && -z $chroot_dir ]] || { echo "run.sh: no siw source for $kver" >&2; exit 1; }
    mkdir -p "$work/siw"
    cp "$siwsrc"/* "$work/siw/"
    make -s -C "$root/usr/src/linux-headers-$kver" M="$work/siw" CONFIG_RDMA_SIW=m modules >&2
    strip --strip-debug -o "$ir/lib/modules/siw.ko" "$work/siw/siw.ko"
    echo siw.ko >>"$ir/modules.list"
fi

# A file and, for a shared library, its real name behind the link (the
# provider tells rdma-core's release by libibverbs' versioned file name).
copy() {
    local f=$1 real
    real=$(readlink -f "$f")
    mkdir -p "$ir$(dirname "$f")" "$ir$(dirname "$real")"
    [[ -e $ir$real ]] || cp "$real" "$ir$real"
    if [[ $f != "$real" && ! -e $ir$f ]]; then
        ln -s "$real" "$ir$f"
    fi
}
copy_with_libs() {
    local f=$1 lib
    copy "$f"
    for lib in $(ldd "$f" 2>/dev/null | awk '/=> \// { print $3 } /^\t\/lib64/ { print $1 }'); do
        copy "$lib"
    done
}

cp /bin/busybox "$ir/bin/busybox"
bins=(/usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/rdma /usr/bin/ibv_rc_pingpong /usr/bin/timeout)
# The provider the host has installed, or XIW_VM_PROVIDER (a build of it).
provdir=/usr/lib/x86_64-linux-gnu/libibverbs
provider=${XIW_VM_PROVIDER:-$provdir/libxiw-rdmav34.so}
needs=$(awk '/^# needs:/ { sub(/^# needs:/, ""); print }' "$script")
# shellcheck disable=SC2206 # a list of paths without spaces
extra=($needs)
for f in "${bins[@]}" "$provider" "${extra[@]}"; do
    copy_with_libs "$f"
done
# Whole directories a script names on `# tree:` lines (plug-ins, data),
# with the libraries of the shared objects in them.
trees=$(awk '/^# tree:/ { sub(/^# tree:/, ""); print }' "$script")
for d in $trees; do
    mkdir -p "$ir$(dirname "$d")"
    cp -a "$d" "$ir$(dirname "$d")/"
    while read -r f; do
        copy_with_libs "$f"
    done < <(find "$d" -name '*.so*' -type f)
done
# What every system has.
printf '127.0.0.1 localhost\n127.0.1.1 xiw-guest\n' >"$ir/etc/hosts"
# The programs given here go to /usr/local/bin (their own paths may be
# under /tmp, which the guest mounts afresh).
mkdir -p "$ir/usr/local/bin"
for f in "$@"; do
    copy_with_libs "$f"
    cp "$(readlink -f "$f")" "$ir/usr/local/bin/$(basename "$f")"
done
rm -f "$ir$provdir/libxiw-rdmav34.so"
mkdir -p "$ir$provdir"
cp "$(readlink -f "$provider")" "$ir$provdir/libxiw-rdmav34.so"
mkdir -p "$ir/etc/libibverbs.d"
# The guest's provider is in rdma-core's own directory whatever prefix the
# host installed it under (pkg/install.sh's /usr/local names it by path).
echo "driver xiw" >"$ir/etc/libibverbs.d/xiw.driver"
# libgcc_s is loaded at run time by programs that unwind (pthread_cancel).
for lib in /lib/x86_64-linux-gnu/libgcc_s.so.1; do
    copy "$lib"
done

cp "$script" "$ir/test.sh"
cp "$repo/tests/vm/guest/lib.sh" "$ir/lib.sh"
cat >"$ir/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin:/usr/local/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# The kernel logs to the second serial port; the script's output goes to
# the first.
exec >/dev/ttyS0 2>&1 </dev/null
echo "XIW-VM-INIT"
mount -t tmpfs tmp /tmp
while read -r m; do
    insmod "/lib/modules/$m" || echo "XIW-VM: insmod $m failed"
done </modules.list
hostname xiw-guest
ip link set lo up
ip link set dummy0 up
ip addr add 10.77.0.1/24 dev dummy0
echo "XIW-VM-START"
sh /test.sh
echo "XIW-VM-EXIT $?"
if dmesg | grep -E "BUG|WARNING|Oops|Call Trace" >/dev/null; then
    echo "XIW-VM: kernel log has a warning or oops:"
    dmesg | tail -60
    echo "XIW-VM-DMESG-BAD"
fi
echo o >/proc/sysrq-trigger
sleep 5
poweroff -f
INIT
chmod +x "$ir/init" "$ir/test.sh"
(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

console=$work/console.log
klog=$work/kernel.log
# The markers init prints may stand anywhere on their line: the firmware
# writes its terminal set-up (escape codes, no newline) to the same port
# before the kernel starts. marker NAME prints what follows NAME on the
# console, for the last line that has it; true if one does.
marker() {
    tr -d '\r\000' <"$console" | awk -v m="$1" '
        i = index($0, m) { v = substr($0, i + length(m)); sub(/^ /, "", v); found = 1 }
        END { if (found) print v; exit !found }'
}
# One boot. The watchdog stops a kernel that has not reached init in
# boot_limit seconds (and returns 1); once init has spoken, only the whole
# run's limit (XIW_VM_TIMEOUT) applies to the script.
boot_limit=${XIW_VM_BOOT_TIMEOUT:-240}
boot() {
    : >"$console"
    : >"$klog"
    timeout "${XIW_VM_TIMEOUT:-600}" qemu-system-x86_64 \
        -accel tcg,thread=multi -cpu max -m 2048 -smp 2 \
        -nographic -no-reboot -monitor none \
        -serial "file:$console" -serial "file:$klog" \
        -kernel "$root/boot/vmlinuz-$kver" -initrd "$work/initrd.gz" \
        -append "console=ttyS1 loglevel=6 panic=-1 oops=panic" \
        -nic none </dev/null >&2 &
    local qemu=$! t=0
    until marker XIW-VM-INIT >/dev/null; do
        if ! kill -0 "$qemu" 2>/dev/null; then
            wait "$qemu" || true
            return 0
        fi
        if ((t >= boot_limit)); then
            kill "$qemu" 2>/dev/null || true
            wait "$qemu" || true
            return 1
        fi
        sleep 1
        t=$((t + 1))
    done
    echo "run.sh: the guest reached init in about $t s" >&2
    wait "$qemu" || true
}
if ! boot; then
    # The kernel stalled before running any of this project's code (the
    # module loads from init): say so, show where, and boot once more.
    echo "run.sh: the guest kernel did not reach init in ${boot_limit} s; its log ends:" >&2
    tr -d '\r' <"$klog" | tail -30 >&2
    echo "run.sh: booting again" >&2
    boot || true
fi
tr -d '\r' <"$console"
rc=$(marker XIW-VM-EXIT) || rc=
if [[ -z $rc ]]; then
    echo "run.sh: the guest did not finish its script; its kernel log ends:" >&2
    tr -d '\r' <"$klog" | tail -40 >&2
    exit 124
fi
if marker XIW-VM-DMESG-BAD >/dev/null; then
    echo "run.sh: the guest kernel logged a warning or an oops" >&2
    exit 125
fi
exit "$rc"
