# Guest: programs that connect through rdma_cm (librdmacm), which only
# kernel mode can serve: the module's connection manager makes the TCP
# connection and the MPA exchange and hands the socket to the provider.
# Both processes run in the guest, on dummy0 (xiw at both ends, so xiw in
# both roles). Prints "ok: ..." or "FAIL: ..." per check; exits with the
# number of failures.
# needs: /usr/bin/rping /usr/bin/ucmatose /usr/bin/rstream /usr/bin/riostream
# needs: /usr/bin/ib_write_lat /usr/bin/ib_read_lat /usr/bin/ib_send_bw /usr/bin/ib_write_bw
. /lib.sh

check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"
check "rping -v -C 1000, data verified" \
    "pair 'rping -s -a 10.77.0.1 -C 1000 -v' 'rping -c -a 10.77.0.1 -C 1000 -v' &&
     grep -q 'ping data: rdma-ping-999: ' /tmp/client && grep -q 'rdma-ping-999: ' /tmp/server"
check "ucmatose, 4 connections x 50 messages" \
    "pair 'ucmatose -b 10.77.0.1 -c 4 -C 50' 'ucmatose -s 10.77.0.1 -c 4 -C 50' &&
     grep -q 'return status 0' /tmp/client && grep -q 'return status 0' /tmp/server"
check "rstream, 1000 x 64 KiB, data verified" \
    "pair 'rstream -b 10.77.0.1 -C 1000 -S 65536 -T v' 'rstream -s 10.77.0.1 -C 1000 -S 65536 -T v'"
check "riostream, 100 x 4 KiB, data verified" \
    "pair 'riostream -b 10.77.0.1 -C 100 -S 4096 -T v' 'riostream -s 10.77.0.1 -C 100 -S 4096 -T v'"
check "ib_write_lat -R 2 B" \
    "perftest_pair 'ib_write_lat -d xiw0 -R -p 18601 -s 2 -n 1000 -F' 'ib_write_lat -d xiw0 -R -p 18601 -s 2 -n 1000 -F 10.77.0.1' 18601 && perftest_ok 2 1000"
check "ib_read_lat -R 2 B" \
    "perftest_pair 'ib_read_lat -d xiw0 -R -p 18602 -s 2 -n 500 -F' 'ib_read_lat -d xiw0 -R -p 18602 -s 2 -n 500 -F 10.77.0.1' 18602 && perftest_ok 2 500"
check "ib_send_bw -R 64 KiB" \
    "perftest_pair 'ib_send_bw -d xiw0 -R -p 18603 -s 65536 -n 200 -F' 'ib_send_bw -d xiw0 -R -p 18603 -s 65536 -n 200 -F 10.77.0.1' 18603; perftest_ok 65536 200"
check "ib_write_bw -R 1 MiB" \
    "perftest_pair 'ib_write_bw -d xiw0 -R -p 18604 -s 1048576 -n 50 -F' 'ib_write_bw -d xiw0 -R -p 18604 -s 1048576 -n 50 -F 10.77.0.1' 18604 && perftest_ok 1048576 50"
check "no rdma_cm connection left" "! rdma resource show cm_id 2>/dev/null | grep -q 'state CONNECT\|ESTABLISHED'"
check "rdma link delete xiw0" "rdma link delete xiw0"
check "rmmod" "rmmod xiw"
exit $fails
