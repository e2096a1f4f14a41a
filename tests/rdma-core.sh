#!/usr/bin/env bash
# Runs xiw under another rdma-core release: either another Debian release's,
# in a chroot of it (pkg/chroot.sh) into which the installed provider, the xiw
# command and the verbs check program are copied; or, with --built, a
# libibverbs built from the source a package registry carries
# (tests/rdma-core-build.sh), run on this host by Debian 12's own tools. There
# it brings up a device and runs, each as a server/client pair over TCP on
# 127.0.0.1 with that release's libibverbs: ib_write_lat and ib_read_bw
# (perftest), ibv_rc_pingpong (rdma-core's own) and xiw-verbs-check
# integrity; with --pyverbs FILE also that release's own test suite (in a
# chroot its python3-pyverbs; for a build from source the pyverbs built with
# it and the tree's tests/), whose verbose output goes to FILE (and, run again
# with XIW_COMPLETION=placed, to FILE.placed) for the caller to judge
# (tests/tests/rdma_core.rs does); with --refused, for a release the provider
# does not serve, only that the provider refuses it (its one line at load, no
# xiw device listed). Prints one line per check; exits non-zero if any fails.
# Must run as root, after pkg/install.sh and a release build. The provider is
# put where that libibverbs loads it from, under the file name it loads
# (libxiw-rdmavN.so, N its private ABI).
#
#   bash tests/rdma-core.sh trixie [EXPECTED_VERSION] [--pyverbs FILE]
#   bash tests/rdma-core.sh sid - (-: whatever release it has)
#   bash tests/rdma-core.sh sid 66.0 --refused
#   bash tests/rdma-core.sh --built 59.0 [--pyverbs FILE]
#   bash tests/rdma-core.sh --built DIR   (DIR laid out as rdma-core-build.sh does)
set -euo pipefail

usage="usage: tests/rdma-core.sh SUITE [EXPECTED_RDMA_CORE_VERSION] [--pyverbs FILE | --refused] | --built VERSION|DIR [--pyverbs FILE]"
suite=${1:?$usage}
expect=${2:-}
[[ $expect == - ]] && expect=
pyverbs_out=
refused=0
case ${3:-} in
--pyverbs) pyverbs_out=${4:?--pyverbs needs a file} ;;
--refused) refused=1 ;;
esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
provider=/usr/lib/x86_64-linux-gnu/libibverbs/libxiw-rdmav34.so

built=0
if [[ $suite == --built ]]; then
    built=1
    # A libibverbs built from source, on this host: its compiled-in provider
    # and configuration directories (under the build's prefix/) hold xiw
    # alone; programs find the library by LD_LIBRARY_PATH.
    # A release tests/rdma-core-build.sh knows, or a directory laid out as
    # it lays one out (a libibverbs built elsewhere).
    if [[ -d ${expect:?$usage} ]]; then
        build=$(cd "$expect" && pwd)
        expect=
    else
        # Its pyverbs too, for the test suite.
        build=$(bash "$repo/tests/rdma-core-build.sh" "$expect" ${pyverbs_out:+--pyverbs})
    fi
    suite="built from source"
    [[ -d $build/src ]] || suite="a registry's build"
    lib=$(basename "$(readlink -f "$build/build/lib/libibverbs.so.1")")
    # Its private ABI: the verbs_register_driver_N it exports.
    abi=$(objdump -T "$build/build/lib/$lib" | sed -n 's/.* verbs_register_driver_\([0-9]*\)$/\1/p' | head -1)
    # A build from source looks in its own prefix; one taken whole (from a
    # wheel) in /etc/libibverbs.d, which names the installed provider.
    if [[ -d $build/prefix ]]; then
        rm -f "$build/prefix/lib/libibverbs/"libxiw-rdmav*.so
        install -m 0644 "$provider" "$build/prefix/lib/libibverbs/libxiw-rdmav$abi.so"
        install -m 0644 /etc/libibverbs.d/xiw.driver "$build/prefix/etc/libibverbs.d/xiw.driver"
    fi
    tree=/run/xiw/built-$(basename "$build")
    cleanup() {
        "$repo/target/release/xiw" down --root "$tree" >/dev/null 2>&1 || true
        [[ -z ${host_work:-} ]] || rm -rf "$host_work"
    }
    trap cleanup EXIT
    "$repo/target/release/xiw" up --netdev lo --root "$tree" >/dev/null
    in_root() {
        env SYSFS_PATH="$tree" LD_LIBRARY_PATH="$build/build/lib" \
            PATH="$repo/target/release:$PATH" "$@"
    }
    # The tools must take the library built, not Debian's.
    for b in ib_write_lat ibv_rc_pingpong xiw-verbs-check; do
        # ldd's whole output first: a grep that stops at its first match
        # would leave ldd writing into a closed pipe, and pipefail would
        # take that SIGPIPE for a failure.
        deps=$(in_root ldd "$(in_root which "$b")" 2>&1) || true
        if ! grep -q "libibverbs.so.1 => $build/build/lib/" <<<"$deps"; then
            echo "FAIL: $b does not load $build/build/lib/libibverbs.so.1; ldd says:" >&2
            echo "$deps" >&2
            exit 1
        fi
    done
else
    root=$(bash "$repo/pkg/chroot.sh" "$suite")
    libdir=usr/lib/x86_64-linux-gnu
    lib=$(basename "$(readlink -f "$root/$libdir/libibverbs.so.1")")
    # The provider file name this libibverbs loads: its private ABI number.
    abi=$(find "$root/$libdir/libibverbs" -name 'lib*-rdmav*.so' ! -name 'libxiw-*' -printf '%f\n' |
        sed -n 's/.*-rdmav\([0-9]*\)\.so$/\1/p' | sort -u | head -1)
    rm -f "$root/$libdir/libibverbs/"libxiw-rdmav*.so
    install -D -m 0644 "$provider" "$root/$libdir/libibverbs/libxiw-rdmav$abi.so"
    install -D -m 0644 /etc/libibverbs.d/xiw.driver "$root/etc/libibverbs.d/xiw.driver"
    for b in xiw xiw-verbs-check; do
        install -D -m 0755 "$repo/target/release/$b" "$root/usr/local/bin/$b"
    done

    # /proc for the tools, /dev for /dev/full (the device node's number) and
    # the node itself, /sys for what the test suite asks of the machine (huge
    # pages); unmounted on the way out. The device itself is found under
    # SYSFS_PATH.
    mounted=()
    cleanup() {
        chroot "$root" xiw down --root /run/xiw/chroot >/dev/null 2>&1 || true
        [[ -z ${host_work:-} ]] || rm -rf "$host_work"
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
fi

# The release, from its libibverbs' file name.
version=${lib#libibverbs.so.1.*.}
echo "rdma-core ($suite): $version ($lib)"
echo "its providers are loaded as lib<name>-rdmav$abi.so"
if [[ -n $expect && $version != "$expect" ]]; then
    echo "FAIL: expected rdma-core $expect ($suite)" >&2
    exit 1
fi

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

# xiw exec with this release's libibverbs: as root, and as an unprivileged
# user (uid 65534), on the tree above (its nodes are in /dev; in a chroot no
# user namespace can be made); on this host, also as that user on a tree of
# their own, whose node xiw exec makes in a namespace of the program's and
# whose provider it names through RDMAV_DRIVERS.
check_re='bytes in'
# (No `--` in the commands: pair takes the first one as its separator.)
as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
exec_tree=${tree:-/run/xiw/chroot}
pair "xiw exec (root): ibv_rc_pingpong -n 500" xiw exec --root "$exec_tree" \
    ibv_rc_pingpong -d xiw0 -g 0 -p @PORT@ -n 500 -- 127.0.0.1
pair "xiw exec (uid 65534): ibv_rc_pingpong -n 500" "${as_user[@]}" xiw exec --root "$exec_tree" \
    ibv_rc_pingpong -d xiw0 -g 0 -p @PORT@ -n 500 -- 127.0.0.1
if ((built)); then
    user_home=$(mktemp -d /tmp/xiw-exec-user.XXXXXX)
    chmod 0755 "$user_home"
    chown 65534:65534 "$user_home"
    # The provider as this libibverbs would load it, so it is loaded once.
    user_provider=$provider
    [[ -d $build/prefix ]] && user_provider=$build/prefix/lib/libibverbs/libxiw-rdmav$abi.so
    in_root "${as_user[@]}" xiw up --root "$user_home/tree" --netdev lo --provider "$user_provider" 2>/dev/null
    pair "xiw exec (uid 65534, a tree of its own): ibv_rc_pingpong -n 500" "${as_user[@]}" \
        xiw exec --root "$user_home/tree" ibv_rc_pingpong -d xiw0 -g 0 -p @PORT@ -n 500 -- 127.0.0.1
    rm -rf "$user_home"
fi

if [[ -n $pyverbs_out ]]; then
    # The suite and its PATH: in a chroot, Debian's python3-pyverbs with the
    # tests its package carries; for a build from source, the pyverbs built
    # with the library (PYTHONPATH) and the tree's own tests/. `work` is the
    # scratch directory as the suite sees it, `host_work` as this host does.
    if ((!built)); then
        work=/tmp/xiw-pyverbs
        host_work=$root$work
        suite_src=$root/usr/share/doc/rdma-core/tests
        suite_path=/usr/local/bin:/usr/bin:/bin
        suite_env=()
    else
        if [[ ! -d $build/build/python/pyverbs || ! -f $build/src/tests/run_tests.py ]]; then
            echo "FAIL: $build has no pyverbs and test suite of rdma-core $version" >&2
            exit 1
        fi
        work=$(mktemp -d /tmp/xiw-pyverbs.XXXXXX)
        host_work=$work
        suite_src=$build/src/tests
        suite_path=$repo/target/release:/usr/bin:/bin
        suite_env=(PYTHONPATH="$build/build/python")
        # The suite must take the pyverbs built, and that pyverbs the
        # library built (python3-pyverbs of Debian 12 is installed too).
        maps=$(in_root env "${suite_env[@]}" /usr/bin/python3 -c \
            'import pyverbs, pyverbs.device; print(pyverbs.__file__); print(open("/proc/self/maps").read())')
        if [[ $(head -1 <<<"$maps") != "$build/build/python/pyverbs/__init__.py" ]] ||
            ! grep -q " $build/build/lib/libibverbs.so" <<<"$maps" ||
            grep -q " /usr/lib/x86_64-linux-gnu/libibverbs.so" <<<"$maps"; then
            echo "FAIL: pyverbs does not load as built in $build:" >&2
            grep -E 'pyverbs|libibverbs' <<<"$maps" | head -5 >&2
            exit 1
        fi
        echo "pyverbs: rdma-core $version's, built with its libibverbs ($build/build/python)"
    fi
    rm -rf "$host_work"
    mkdir -p "$host_work/path"
    cp -r "$suite_src" "$host_work/tests"
    find "$host_work/tests" -name '*.gz' -exec gunzip -f {} +
    # The suite of rdma-core 49 and later asks `rdma link show -j` for each
    # device's netdev; standalone mode has no RDMA netlink, so the tool fails.
    # In front of it on PATH, a stand-in answers what is true here: no links
    # are known to the kernel (the suite then treats the device as the suite
    # of 44.0 does, which reads sysfs instead). Every other use of the tool
    # goes to the real one.
    printf '%s\n' '#!/bin/sh' \
        '# rdma link show -j for a kernel without RDMA (see tests/rdma-core.sh)' \
        'if [ "$*" = "link show -j" ]; then echo "[]"; exit 0; fi' \
        'exec /usr/bin/rdma "$@"' >"$host_work/path/rdma"
    chmod 0755 "$host_work/path/rdma"
    # Twice: with the default completions, and with completions confirmed by
    # the peer (XIW_COMPLETION=placed) into FILE.placed.
    for mode in sent placed; do
        out=$pyverbs_out
        [[ $mode == placed ]] && out=$pyverbs_out.placed
        echo "pyverbs: running rdma-core $version's test suite, XIW_COMPLETION=$mode (output: $out)"
        (cd / && in_root env PATH="$work/path:$suite_path" "${suite_env[@]}" \
            XIW_COMPLETION=$mode \
            timeout 900 /usr/bin/python3 "$work/tests/run_tests.py" --dev xiw0 --gid 0 -v) \
            >"$out" 2>&1 || true
    done
    rm -rf "$host_work"
fi

if ((fails > 0)); then
    echo "rdma-core $version ($suite): $fails check(s) failed"
    exit 1
fi
echo "rdma-core $version ($suite): all checks passed"
