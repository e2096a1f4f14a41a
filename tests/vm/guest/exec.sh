# Guest: `xiw exec` on a kernel with the RDMA core loaded (ib_core,
# ib_uverbs, rdma_cm, ...), beside a kernel-mode xiw device: programs run
# through `xiw exec` see the devices of a standalone tree (and only those),
# as root, as an unprivileged user on root's tree (its node in place, so no
# namespace is needed) and on their own (nodes in a namespace of the
# program's, the provider from the user's own directory); programs outside
# see the kernel's devices as before, and /dev is as it was after `xiw
# down`.
# Prints "ok: ..." or "FAIL: ..." per check; exits with the failures.
# needs: /usr/bin/xiw /usr/bin/ib_write_lat /usr/bin/setpriv
. /lib.sh

check "rdma link add xk0 type xiw netdev dummy0 (kernel mode)" \
    "rdma link add xk0 type xiw netdev dummy0"
ls /dev/infiniband >/tmp/dev-before
check "outside: ibv_devices lists the kernel's xk0" "ibv_devices | grep -q xk0"

# Root: the tree's node goes beside the kernel's, under a name of its own.
check "root: xiw up on a kernel with the RDMA core says to use xiw exec, its node beside the kernel's" \
    "xiw up --root /tmp/rt --netdev lo >/tmp/up.out 2>/tmp/up.err; r=\$?; cat /tmp/up.err;
     [ \$r -eq 0 ] && [ ! -s /tmp/up.out ] && grep -q 'RDMA core (ib_core is loaded)' /tmp/up.err &&
     grep -q 'xiw exec --root /tmp/rt -- PROGRAM' /tmp/up.err &&
     [ -c /dev/infiniband/xiw_uverbs0 ] && [ -c /dev/infiniband/uverbs0 ] &&
     [ \"\$(stat -c %t:%T /dev/infiniband/uverbs0)\" != 1:7 ] &&
     [ \"\$(stat -c %t:%T /dev/infiniband/xiw_uverbs0)\" = 1:7 ]"
check "root: inside xiw exec, ibv_devices lists xiw0 and not xk0" \
    "xiw exec --root /tmp/rt -- ibv_devices >/tmp/in 2>&1; cat /tmp/in; grep -q xiw0 /tmp/in && ! grep -q xk0 /tmp/in"
check "root: with the node in place, xiw exec makes no namespace" \
    "[ \"\$(xiw exec --root /tmp/rt -- readlink /proc/self/ns/mnt)\" = \"\$(readlink /proc/self/ns/mnt)\" ]"
check "root: inside xiw exec, an RDMA netlink socket fails, a route netlink one works" \
    "! xiw exec --root /tmp/rt -- rdma dev show >/tmp/in 2>&1 && cat /tmp/in &&
     xiw exec --root /tmp/rt -- ip -o link show lo | grep -q LOOPBACK"
X="xiw exec --root /tmp/rt --"
check "root: ib_write_lat between two xiw exec processes" \
    "pair '$X ib_write_lat -d xiw0 -s 2 -n 1000' '$X ib_write_lat -d xiw0 -s 2 -n 1000 127.0.0.1' 18515 &&
     perftest_ok 2 1000"
check "root: ibv_rc_pingpong between two xiw exec processes, data checked" \
    "pair '$X ibv_rc_pingpong -d xiw0 -g 0 -n 200 -c' '$X ibv_rc_pingpong -d xiw0 -g 0 -n 200 -c 127.0.0.1' 18515 &&
     grep -q '200 iters' /tmp/server && grep -q '200 iters' /tmp/client"

# An unprivileged user, with the provider in a directory of their own and
# no driver file in /etc/libibverbs.d while they run.
# util-linux's setpriv (busybox's has no --reuid).
U="/usr/bin/setpriv --reuid=1000 --regid=1000 --clear-groups --"
mkdir -p /tmp/u
cp /usr/lib/x86_64-linux-gnu/libibverbs/libxiw-rdmav34.so /tmp/u/libxiw.so
chown -R 1000:1000 /tmp/u
mv /etc/libibverbs.d/xiw.driver /tmp/xiw.driver.aside
check "user: root's tree through xiw exec, with no namespace (its node is in place)" \
    "[ \"\$($U xiw exec --root /tmp/rt -- readlink /proc/self/ns/user)\" = \"\$(readlink /proc/self/ns/user)\" ] &&
     $U xiw exec --root /tmp/rt -- ibv_devinfo -d xiw0 | grep -q PORT_ACTIVE"
check "user: xiw up --provider in their own directory" \
    "$U xiw up --root /tmp/u/t --netdev lo --provider /tmp/u/libxiw.so 2>/tmp/up.err; r=\$?; cat /tmp/up.err;
     [ \$r -eq 0 ] && [ \"\$(readlink /tmp/u/t/provider/libxiw-rdmav34.so)\" = /tmp/u/libxiw.so ]"
check "user: inside, their own uid, no capabilities, the filter, ibv_devices lists xiw0 only" \
    "$U xiw exec --root /tmp/u/t -- sh -c 'id -u; grep -E \"^(Seccomp|CapEff):\" /proc/self/status; ibv_devices' >/tmp/in 2>&1;
     cat /tmp/in; grep -qx 1000 /tmp/in && grep -q 'Seccomp:.2' /tmp/in && grep -q 'CapEff:.0000000000000000' /tmp/in &&
     grep -q xiw0 /tmp/in && ! grep -q xk0 /tmp/in"
X="$U xiw exec --root /tmp/u/t --"
check "user: ib_write_lat between two xiw exec processes" \
    "pair '$X ib_write_lat -d xiw0 -s 2 -n 1000' '$X ib_write_lat -d xiw0 -s 2 -n 1000 127.0.0.1' 18515 &&
     perftest_ok 2 1000"
check "user: ibv_rc_pingpong between two xiw exec processes, data checked" \
    "pair '$X ibv_rc_pingpong -d xiw0 -g 0 -n 200 -c' '$X ibv_rc_pingpong -d xiw0 -g 0 -n 200 -c 127.0.0.1' 18515 &&
     grep -q '200 iters' /tmp/server && grep -q '200 iters' /tmp/client"
check "user: xiw down" "$U xiw down --root /tmp/u/t && [ ! -e /tmp/u/t ]"
mv /tmp/xiw.driver.aside /etc/libibverbs.d/xiw.driver

# Outside, nothing changed.
check "outside: xk0 still listed and opened, port active" \
    "ibv_devices | grep -q xk0 && ibv_devinfo -d xk0 | grep -q PORT_ACTIVE"
check "root: xiw down" "xiw down --root /tmp/rt && [ ! -e /tmp/rt ]"
check "outside: /dev/infiniband as before" "ls /dev/infiniband | cmp -s - /tmp/dev-before"
check "rdma link delete xk0" "rdma link delete xk0"
exit $fails
