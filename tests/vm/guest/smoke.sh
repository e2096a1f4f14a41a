# Guest, on any kernel the module is built for (every Debian kernel's run
# in tests/tests/vm_kernels.rs, and the module built by DKMS, use it): load,
# device, a program with completion events, rping over rdma_cm, removal,
# loading by `rdma link add` from the kernel's module tree (run.sh then
# fails the run on a warning or oops in the kernel's log).
# Prints "ok: ..." or "FAIL: ..." per check; exits with the failures.
# needs: /usr/bin/rping
. /lib.sh
echo "kernel $(uname -r)"
echo "xiw srcversion $(cat /sys/module/xiw/srcversion)"
check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"
check "ibv_devinfo: xiw0, iWARP, port active" \
    "ibv_devinfo -d xiw0 >/tmp/devinfo 2>&1 && grep -q 'transport:.*iWARP' /tmp/devinfo && grep -q PORT_ACTIVE /tmp/devinfo"
check "ibv_rc_pingpong with completion events (-e), data checked" \
    "ibv_rc_pingpong -d xiw0 -g 0 -e -c -n 200 >/tmp/server 2>&1 & sleep 1;
     timeout 60 ibv_rc_pingpong -d xiw0 -g 0 -e -c -n 200 10.77.0.1 >/tmp/client 2>&1; c=\$?;
     wait; [ \$c -eq 0 ] && grep -q '200 iters' /tmp/client && grep -q '200 iters' /tmp/server"
check "rping -v -C 100 over rdma_cm, data verified" \
    "pair 'rping -s -a 10.77.0.1 -C 100 -v' 'rping -c -a 10.77.0.1 -C 100 -v' &&
     grep -q 'ping data: rdma-ping-99: ' /tmp/client && grep -q 'rdma-ping-99: ' /tmp/server"
check "rdma link delete xiw0" "rdma link delete xiw0"
check "rmmod" "rmmod xiw"
# As DKMS installs it: in the kernel's module tree, found by its alias.
check "rdma link add ... type xiw loads the module (alias rdma-link-xiw)" \
    "d=/lib/modules/\$(uname -r)/updates/dkms; mkdir -p \$d && cp /lib/modules/xiw.ko \$d/ &&
     depmod && grep -q 'rdma.link.xiw' /lib/modules/\$(uname -r)/modules.alias &&
     echo /bin/modprobe >/proc/sys/kernel/modprobe && [ ! -d /sys/module/xiw ] &&
     rdma link add xiw0 type xiw netdev dummy0 && [ -d /sys/module/xiw ] &&
     rdma link delete xiw0 && rmmod xiw"
exit $fails
