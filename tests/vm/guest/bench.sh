# Guest (tests/vm/bench.sh): one boot, every device side by side on the
# same TCP path (both processes in the guest): xiw in kernel mode (its
# default MPA CRC, and without), xiw in standalone mode (the RDMA modules
# unloaded for it, as on a kernel without RDMA), Linux's siw, and rxe
# (RoCE v2), with perftest's 2-byte latencies and 64 KiB and 1 MiB write
# bandwidth, and the TCP floor (xiw-bench's ping-pong and stream, spinning
# and blocking). Prints "BENCH DEVICE TEST VALUE" lines (µs or MB/s).
# siw
# modules: crc32c_generic libcrc32c crc32_generic udp_tunnel ip6_udp_tunnel rdma_rxe
# needs: /usr/bin/ib_write_lat /usr/bin/ib_send_lat /usr/bin/ib_read_lat /usr/bin/ib_write_bw
# needs: /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so /etc/libibverbs.d/siw.driver
# needs: /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so /etc/libibverbs.d/rxe.driver
. /lib.sh
N=${XIW_BENCH_ITERS:-2000}
port=18950

# perf NAME DEVICE-ARGS ADDRESS: the five perftest runs, with DEVICE-ARGS on
# both ends and the client pointed at ADDRESS.
perf() {
    for t in "ib_write_lat -s 2 -n $N" "ib_send_lat -s 2 -n $N" "ib_read_lat -s 2 -n $N" \
        "ib_write_bw -s 65536 -n 2000" "ib_write_bw -s 1048576 -n 200"; do
        port=$((port + 1))
        perftest_pair "$t $2 -p $port -F" "$t $2 -p $port -F $3" $port >/dev/null 2>&1
        result "$1" $t
    done
}
# result NAME TOOL -s SIZE ...: the BENCH line of the run just made
# (perftest's typical latency, or its average bandwidth).
result() {
    case $2 in
    *_lat) v=$(awk -v s="$4" '$1 == s && NF >= 9 { print $5 }' /tmp/client) ;;
    *) v=$(awk -v s="$4" '$1 == s && NF >= 5 { print $4 }' /tmp/client) ;;
    esac
    echo "BENCH $1 $2_$4 ${v:-failed}"
}

# The floor: plain TCP between two processes on the same path.
floor() {
    for spec in "lat-spin 2 $N 200" "lat-block 2 $N 200" "bw 65536 2000 100" "bw 1048576 200 10"; do
        port=$((port + 1))
        xiw-bench floor-server $port $spec >/dev/null 2>&1 &
        s=$!
        wait_listen $port
        r=$(timeout 120 xiw-bench floor-client 127.0.0.1 $port $spec 2>/dev/null | awk '/RESULT/ { split($2, a, "="); print a[2] }')
        kill -9 $s 2>/dev/null
        wait $s
        set -- $spec
        echo "BENCH tcp $1_$2 ${r:-failed}"
    done
}

floor

# Standalone: as on a kernel without RDMA.
for m in siw rdma_rxe xiw rdma_ucm rdma_cm iw_cm ib_cm ib_uverbs ib_core; do
    rmmod $m 2>/dev/null
done
eval "$(xiw up --netdev dummy0 2>/dev/null)"
perf xiw-standalone "-d xiw0 -x 0" 10.77.0.1
xiw down >/dev/null 2>&1
unset SYSFS_PATH

while read -r m; do
    insmod "/lib/modules/$m" 2>/dev/null
done </modules.list

ip link add dummy1 type dummy && ip link set dummy1 up && ip addr add 10.77.1.1/24 dev dummy1
ip link add dummy2 type dummy && ip link set dummy2 up && ip addr add 10.77.2.1/24 dev dummy2
rdma link add xiw0 type xiw netdev dummy0
rdma link add siw0 type siw netdev dummy1
rdma link add rxe0 type rxe netdev dummy2
rdma link show

perf xiw-kernel "-d xiw0 -R" 10.77.0.1
echo 0 >/sys/module/xiw/parameters/mpa_crc
perf xiw-kernel-nocrc "-d xiw0 -R" 10.77.0.1
echo 1 >/sys/module/xiw/parameters/mpa_crc
perf siw "-d siw0 -R" 10.77.1.1
perf rxe "-d rxe0 -R" 10.77.2.1
exit 0
