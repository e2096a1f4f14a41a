# Guest: programs that connect by modify_qp with the peer's GID and QPN
# (ibv_rc_pingpong, perftest without -R) on a device the kernel module
# registered, with and without completion channels (-e: the kernel's
# channel, signalled by the module when the provider completes work on an
# armed CQ), and async events through the kernel's async event fd. Both
# processes run in the guest, on dummy0. Runs tests/c/xiw_channel.c,
# xiw_async.c and xiw_events.c (built on the host, given to run.sh). Prints "ok: ..." or "FAIL: ..." per check and
# exits with the number of failures.
# needs: /usr/bin/ib_write_lat /usr/bin/ib_send_bw /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ib_write_bw
. /lib.sh
# pair PROGRAM ARGS...: the program as server, and as client of 10.77.0.1.
pairs() {
    pair "$*" "$* 10.77.0.1"
}
send_bw_ok() {
    perftest_ok "$1" "$2" && grep -qE "^ *$1 +$2 " /tmp/server
}

check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"
# The kernel's objects of a process: its PD, CQ, MR and QP (under the provider's QP number, in the provider's
# state), gone when the process is killed. The
# provider's QP numbers are the TCP port its context listens on, shifted by
# 8, plus an index.
ibv_rc_pingpong -d xiw0 -g 0 >/tmp/lone 2>&1 &
lone=$!
sleep 1
rdma resource show qp link xiw0/1 >/tmp/qps 2>&1
rdma resource show cq dev xiw0 >/tmp/cqs 2>&1
rdma resource show pd dev xiw0 >/tmp/pds 2>&1
rdma resource show mr dev xiw0 >/tmp/mrs 2>&1
cat /tmp/qps /tmp/cqs /tmp/pds /tmp/mrs
qpn=$(sed -n 's/.*lqpn \([0-9]*\) .*/\1/p' /tmp/qps | head -1)
check "rdma resource show: the QP under the provider's number, in INIT" \
    "grep -qE '^link xiw0/1 lqpn [0-9]+ .*type RC state INIT .*comm ibv_rc_pingpong' /tmp/qps &&
     netstat -ltn | grep -q \"10.77.0.1:$((${qpn:-0} >> 8)) \""
check "rdma resource show: its CQ and PD" \
    "grep -qE '^dev xiw0 cqn .*comm ibv_rc_pingpong' /tmp/cqs && grep -qE '^dev xiw0 pdn .*comm ibv_rc_pingpong' /tmp/pds"
check "rdma resource show: its MR" \
    "grep -qE '^dev xiw0 mrn [0-9]+ .*comm ibv_rc_pingpong' /tmp/mrs"
# Its rings (the CQ's, the QP's send and receive queues) and the events page
# are the module's memory, mapped from the device's command fd.
grep uverbs /proc/$lone/maps
check "its CQ, send and receive rings and events page are mapped from the device" \
    "[ \$(grep -c '/dev/infiniband/uverbs' /proc/$lone/maps) -eq 4 ]"
kill -9 $lone
wait $lone 2>/dev/null
sleep 1
check "a killed process's objects are gone" \
    "! rdma resource show qp link xiw0/1 | grep -q lqpn && ! rdma resource show cq dev xiw0 | grep -q cqn && ! rdma resource show pd dev xiw0 | grep -q pdn && ! rdma resource show mr dev xiw0 | grep -q mrn"

check "ibv_rc_pingpong, 4 KiB x 200, data checked (-c)" \
    "pairs ibv_rc_pingpong -d xiw0 -g 0 -c -n 200 -s 4096 && grep -q '200 iters' /tmp/client"
check "ibv_rc_pingpong, 1 MiB x 20" \
    "pairs ibv_rc_pingpong -d xiw0 -g 0 -n 20 -s 1048576 && grep -q '20 iters' /tmp/client"
check "ibv_rc_pingpong with completion events (-e), 4 KiB x 500" \
    "pairs ibv_rc_pingpong -d xiw0 -g 0 -e -n 500 -s 4096 && grep -q '500 iters' /tmp/client"
check "ibv_rc_pingpong with completion events (-e), 1 B x 2000, data checked" \
    "pairs ibv_rc_pingpong -d xiw0 -g 0 -e -c -n 2000 -s 1 && grep -q '2000 iters' /tmp/client"
check "ib_send_lat with completion events (-e)" \
    "pairs ib_send_lat -d xiw0 -x 0 -s 64 -n 1000 -e -F && grep -qE '^ *64 +1000' /tmp/client"
check "completion channels: arming, solicited only, errors, two CQs (xiw_channel)" \
    "XIW_DEVICE=xiw0 xiw_channel"
check "port events through the kernel's async event fd (xiw_async)" \
    "XIW_DEVICE=xiw0 xiw_async 'ip link set dummy0 down' 'ip link set dummy0 up'"
check "QP fatal events through the kernel, destroy waiting for their acknowledgement (xiw_events)" \
    "xiw_events 10"
check "ib_write_lat 2 B" "pairs ib_write_lat -d xiw0 -x 0 -s 2 -n 2000 -F && grep -qE '^ *2 +2000' /tmp/client"
# A stream the provider connected itself is shared with the module
# (XIW_METHOD_QP_STREAM), which places its RDMA Writes from the socket as it
# does those of rdma_cm's streams; with XIW_KERNEL_PLACE=0 the stream is the
# provider's alone.
placed() { cat /sys/module/xiw/parameters/fpdus_placed; }
check "ib_write_lat: the module places the Writes of a stream the provider connected (at least 1000 of both sides' 2 x 1000)" \
    "a=\$(placed); pairs ib_write_lat -d xiw0 -x 0 -s 2 -n 1000 -F; r=\$?;
     [ \$r -eq 0 ] && grep -qE '^ *2 +1000' /tmp/client &&
     b=\$(placed) && echo \"placed: \$((b - a))\" && [ \$((b - a)) -ge 1000 ]"
check "ib_write_lat with XIW_KERNEL_PLACE=0: none placed by the module" \
    "a=\$(placed); export XIW_KERNEL_PLACE=0; pairs ib_write_lat -d xiw0 -x 0 -s 2 -n 300 -F; r=\$?; unset XIW_KERNEL_PLACE;
     [ \$r -eq 0 ] && grep -qE '^ *2 +300' /tmp/client && b=\$(placed) && echo \"placed: \$((b - a))\" && [ \$((b - a)) -eq 0 ]"
check "ib_write_bw 64 KiB: Writes placed by the module" \
    "a=\$(placed); pairs ib_write_bw -d xiw0 -x 0 -s 65536 -n 500 -F; r=\$?;
     [ \$r -eq 0 ] && grep -qE '^ *65536 +500' /tmp/client &&
     b=\$(placed) && echo \"placed: \$((b - a))\" && [ \$((b - a)) -gt 0 ]"
check "ib_read_lat 2 B" "pairs ib_read_lat -d xiw0 -x 0 -s 2 -n 1000 -F && grep -qE '^ *2 +1000' /tmp/client"
check "ib_send_bw 64 KiB" "pairs ib_send_bw -d xiw0 -x 0 -s 65536 -n 500 -F; send_bw_ok 65536 500"
check "rdma link delete xiw0" "rdma link delete xiw0"
check "rmmod" "rmmod xiw"
exit $fails
