# Guest: an xiw device through `rdma link`, seen by unmodified rdma-core
# tools through the kernel, then removed and the module unloaded. Every check
# prints "ok: ..." or "FAIL: ..."; the exit status is the number of failures.
. /lib.sh

check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"
check "a second device on the same netdev is refused" "! rdma link add xiw1 type xiw netdev dummy0 2>/dev/null"
rdma link show >/tmp/link
cat /tmp/link
check "rdma link show: xiw0 active on dummy0" "grep -q 'link xiw0/1 state ACTIVE physical_state LINK_UP netdev dummy0' /tmp/link"
check "node type RNIC" "grep -q '^4: RNIC' /sys/class/infiniband/xiw0/node_type"
mac=$(cat /sys/class/net/dummy0/address | tr -d :)
gid0=$(cat /sys/class/infiniband/xiw0/ports/1/gids/0)
gid1=$(cat /sys/class/infiniband/xiw0/ports/1/gids/1 | tr -d :)
check "GID 0 is the netdev's IPv4 address" "[ \"$gid0\" = 0000:0000:0000:0000:0000:ffff:0a4d:0001 ]"
check "GID 1 is the netdev's hardware address" "[ \"$gid1\" = \"${mac}00000000000000000000\" ]"
ip addr add 10.77.1.1/24 dev dummy0
ip addr del 10.77.0.1/24 dev dummy0
sleep 1
check "GID 0 follows the address" "grep -q 'ffff:0a4d:0101' /sys/class/infiniband/xiw0/ports/1/gids/0"
ip addr add 10.77.0.1/24 dev dummy0
ip addr del 10.77.1.1/24 dev dummy0
sleep 1

ibv_devices >/tmp/devices 2>&1
cat /tmp/devices
check "ibv_devices lists xiw0" "grep -q '^ *xiw0 ' /tmp/devices"
ibv_devinfo -v -d xiw0 >/tmp/devinfo 2>&1
echo "ibv_devinfo exit $?"
cat /tmp/devinfo
check "ibv_devinfo opens xiw0 through the kernel" "grep -q 'hca_id:.*xiw0' /tmp/devinfo"
check "transport iWARP" "grep -q 'transport:.*iWARP' /tmp/devinfo"
check "port active" "grep -q 'state:.*PORT_ACTIVE' /tmp/devinfo"
check "the provider's limits (max_qp 16384)" "grep -q 'max_qp:.*16384' /tmp/devinfo"

ip link set dummy0 down
check "port down with its netdev" "rdma link show | grep -q 'xiw0/1 state DOWN'"
ip link set dummy0 up

check "rdma link delete xiw0" "rdma link delete xiw0"
check "no device left" "[ -z \"\$(ls /sys/class/infiniband)\" ]"
check "rdma link add again, then rmmod with the device present" "rdma link add xiw0 type xiw netdev dummy0 && rmmod xiw"
check "no device after rmmod" "[ -z \"\$(ls /sys/class/infiniband)\" ]"
check "the module loads again" "insmod /lib/modules/xiw.ko"
check "removing the netdev removes the device" "ip link add dummy9 type dummy && rdma link add xiw9 type xiw netdev dummy9 && ip link del dummy9 && sleep 1 && [ -z \"\$(ls /sys/class/infiniband)\" ]"
check "rmmod" "rmmod xiw"

# A process holding the device open does not keep it: link delete and rmmod
# cut it off (it goes on running) instead of waiting for it.
insmod /lib/modules/xiw.ko
rdma link add xiw0 type xiw netdev dummy0
ibv_rc_pingpong -d xiw0 -g 0 >/tmp/held 2>&1 &
held=$!
sleep 1
check "rdma link delete with a process holding the device" "timeout 20 rdma link delete xiw0"
check "the process was cut off, not killed" "kill -0 $held"
rdma link add xiw0 type xiw netdev dummy0
ibv_rc_pingpong -d xiw0 -g 0 >/tmp/held2 2>&1 &
held2=$!
sleep 1
check "rmmod with a process holding the device" "timeout 20 rmmod xiw"
kill -9 $held $held2
wait
check "no module left" "! lsmod | grep -q '^xiw '"
exit $fails
