#!/usr/bin/env bash
# Runs xiw under another Debian release's rdma-core: the installed provider,
# the xiw command and the verbs check program are copied into a chroot of
# that release (pkg/chroot.sh), which brings up a device there and runs,
# each as a server/client pair over TCP on 127.0.0.1 with the chroot's own
# libibverbs: ib_write_lat and ib_read_bw (perftest), ibv_rc_pingpong
# (rdma-core's own) and xiw-verbs-check integrity; with --pyverbs FILE also
# that release's own test suite (python3-pyverbs), whose verbose output goes
# to FILE (and, run again with XIW_COMPLETION=placed, to FILE.placed) for the
# caller to judge (tests/tests/rdma_core.rs does); with --refused, for a
# release the provider does not serve, only that the provider refuses it (its
# one line at load, no xiw device listed). Prints one
# line per check; exits non-zero if any fails. Must run as root, after
# pkg/install.sh and a release build. The provider is installed there under
# the file name that release's libibverbs loads (libxiw-rdmavN.so, N its
# private ABI).
#
#   bash tests/rdma-core.sh trixie [EXPECTED_VERSION] [--pyverbs FILE]
#   bash tests/rdma-core.sh sid - (-: whatever release it has)
#   bash tests/rdma-core.sh sid 66.0 --refused
set -euo pipefail

suite=${1:?usage: tests/rdma-core.sh SUITE [EXPECTED_RDMA_CORE_VERSION] [--pyverbs FILE]}
expect=${2:-}
[[ $expect == - ]] && expect=
pyverbs_out=
refused=0
case ${3:-} in
--pyverbs) pyverbs_out=${4:?--pyverbs needs a file} ;;
--refused) refused=1 ;;
esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
root=$(bash "$repo/pkg/chroot.sh" "$suite")
libdir=usr/lib/x86_64-linux-gnu

# The chroot's rdma-core, from its libibverbs' file name.
lib=$(basename "$(readlink -f "$root/$libdir/libibverbs.so.1")")
version=${lib#libibverbs.so.1.*.}
echo "rdma-core in the $suite chroot: $version ($lib)"
if [[ -n $expect && $version != "$expect" ]]; then
    echo "FAIL: expected rdma-core $expect in the $suite chroot" >&2
    exit 1
fi

# The provider file name this libibverbs loads: its private ABI number.
abi=$(find "$root/$libdir/libibverbs" -name 'lib*-rdmav*.so' ! -name 'libxiw-*' -printf '%f\n' |
    sed -n 's/.*-rdmav\([0-9]*\)\.so$/\1/p' | sort -u | head -1)
echo "its providers are loaded as lib<name>-rdmav$abi.so"
rm -f "$root/$libdir/libibverbs/"libxiw-rdmav*.so
install -D -m 0644 "/$libdir/libibverbs/libxiw-rdmav34.so" "$root/$libdir/libibverbs/libxiw-rdmav$abi.so"
install -D -m 0644 /etc/libibverbs.d/xiw.driver "$root/etc/libibverbs.d/xiw.driver"
for b in xiw xiw-verbs-check; do
    install -D -m 0755 "$repo/target/release/$b" "$root/usr/local/bin/$b"
done

# /proc for the tools, /dev for /dev/full (the device node's number) and the
# node itself, /sys for what the test suite asks of the machine (huge pages);
# unmounted on the way out. The device itself is found under SYSFS_PATH.
mounted=()
cleanup() {
    chroot "$root" xiw down --root /run/xiw/chroot >/dev/null 2>&1 || true
    local m
    for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
for m in proc dev sys; do
    if ! mountpoint -q "$root/$m"; then
        mount --bind "/$m" "$root/$m"
        mounted+=("$root/$m")
    fi
done

in_root() { chroot "$root" env SYSFS_PATH=/run/xiw/chroot "$@"; }
chroot "$root" xiw up --netdev lo --root /run/xiw/chroot >/dev/null

if ((refused)); then
    out=$(in_root ibv_devices 2>&1) || true
    sed 's/^/  ibv_devices: /' <<<"$out"
    if grep -q "^xiw: not registering: running with rdma-core $version; this provider serves" <<<"$out" &&
        ! grep -qw xiw0 <<<"$out"; then
        echo "ok: rdma-core $version ($suite) is refused with one line"
        exit 0
    fi
    echo "FAIL: rdma-core $version ($suite) is not refused with one line"
    exit 1
fi

fails=0
port=$((19500 + RANDOM % 400))
# pair NAME SERVER_CMD... -- CLIENT_ARGS...: the server in the background, the
# client with CLIENT_ARGS appended to the same command.
pair() {
    local name=$1 out
    shift
    local -a cmd=()
    while [[ $1 != -- ]]; do cmd+=("$1"); shift; done
    shift
    port=$((port + 1))
    out=$(mktemp -d /tmp/xiw-chroot.XXXXXX)
    in_root timeout 120 "${cmd[@]//@PORT@/$port}" >"$out/server.out" 2>&1 &
    local spid=$! rc=0 src=0
    sleep 1
    in_root timeout 120 "${cmd[@]//@PORT@/$port}" "$@" >"$out/client.out" 2>&1 || rc=$?
    wait "$spid" || src=$?
    if ((rc == 0 && src == 0)); then
        echo "ok: $name: $(grep -E "$check_re" "$out/client.out" | tail -1 | tr -s ' ')"
    else
        echo "FAIL: $name (client exit $rc, server exit $src)"
        sed 's/^/  client: /' "$out/client.out" | tail -15
        sed 's/^/  server: /' "$out/server.out" | tail -15
        fails=$((fails + 1))
    fi
    rm -rf "$out"
}

check_re='^ *[0-9]'
pair "ib_write_lat -s 64 -n 1000" ib_write_lat -d xiw0 -p @PORT@ -F -s 64 -n 1000 -- 127.0.0.1
pair "ib_read_bw -s 65536 -n 1000" ib_read_bw -d xiw0 -p @PORT@ -F -s 65536 -n 1000 -- 127.0.0.1
check_re='bytes in'
pair "ibv_rc_pingpong -n 1000" ibv_rc_pingpong -d xiw0 -g 0 -p @PORT@ -n 1000 -- 127.0.0.1
check_re='ok'
pair "xiw-verbs-check integrity" xiw-verbs-check integrity --port @PORT@ --qps 4 --ops 150 -- --server 127.0.0.1

if [[ -n $pyverbs_out ]]; then
    # The suite of rdma-core 49 and later asks `rdma link show -j` for each
    # device's netdev; standalone mode has no RDMA netlink, so the tool fails.
    # In front of it on PATH, a stand-in answers what is true here: no links
    # are known to the kernel (the suite then treats the device as the suite
    # of 44.0 does, which reads sysfs instead). Every other use of the tool
    # goes to the real one.
    mkdir -p "$root/opt/xiw-test-path"
    printf '%s\n' '#!/bin/sh' \
        '# rdma link show -j for a kernel without RDMA (see tests/rdma-core.sh)' \
        'if [ "$*" = "link show -j" ]; then echo "[]"; exit 0; fi' \
        'exec /usr/bin/rdma "$@"' >"$root/opt/xiw-test-path/rdma"
    chmod 0755 "$root/opt/xiw-test-path/rdma"
    rm -rf "$root/tmp/xiw-pyverbs"
    cp -r "$root/usr/share/doc/rdma-core/tests" "$root/tmp/xiw-pyverbs"
    find "$root/tmp/xiw-pyverbs" -name '*.gz' -exec gunzip -f {} +
    # Twice: with the default completions, and with completions confirmed by
    # the peer (XIW_COMPLETION=placed) into FILE.placed.
    for mode in sent placed; do
        out=$pyverbs_out
        [[ $mode == placed ]] && out=$pyverbs_out.placed
        echo "pyverbs: running rdma-core $version's test suite, XIW_COMPLETION=$mode (output: $out)"
        (cd / && in_root env PATH=/opt/xiw-test-path:/usr/local/bin:/usr/bin:/bin \
            XIW_COMPLETION=$mode \
            timeout 900 python3 /tmp/xiw-pyverbs/run_tests.py --dev xiw0 --gid 0 -v) \
            >"$out" 2>&1 || true
    done
    rm -rf "$root/tmp/xiw-pyverbs"
fi

if ((fails > 0)); then
    echo "rdma-core $version ($suite): $fails check(s) failed"
    exit 1
fi
echo "rdma-core $version ($suite): all checks passed"
