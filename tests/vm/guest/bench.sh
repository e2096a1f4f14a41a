# Guest (tests/vm/bench.sh): one boot, every device side by side on the
# same TCP path (both processes in the guest): xiw in kernel mode (its
# default, no MPA CRC, and with CRC), xiw in standalone mode (the RDMA modules
# unloaded for it, as on a kernel without RDMA), Linux's siw, and rxe
# (RoCE v2), with perftest's 2-byte latencies, 64 KiB and 1 MiB write
# bandwidth and 64 KiB write bandwidth over 4 QPs in both directions at
# once; qperf over rdma_cm (-cm1: its latency tests wait on a completion
# channel) on every device but standalone, which has no rdma_cm: rc_lat and
# rc_rdma_write_lat 2 B, rc_rdma_write_lat 64 KiB and rc_bw 64 KiB; and the
# TCP floor (xiw-bench's ping-pong and stream, spinning and blocking).
# Prints "BENCH DEVICE TEST_SIZE VALUE" lines: µs or MiB/s (2^20 bytes a
# second, what perftest calls MB/sec; qperf's decimal units are converted),
# "failed" where a run gave no number, "n/a" where a device cannot run a
# test. Environment (put at the top of this script by tests/vm/bench.sh):
# XIW_BENCH_ITERS (latency iterations), XIW_BENCH_QPERF_SECONDS (each qperf
# test's duration, default 3), XIW_BENCH_ROUNDS (rounds, default 3: the
# devices take turns, one run of every test each per round, and each value
# printed is the median of its rounds; every round's value is printed too,
# as "ROUNDS DEVICE TEST_SIZE V1 V2 ...").
# With XIW_BENCH_SWEEP=1 (tests/vm/bench.sh --sweep) it sweeps every size
# from 2 B to 8 MiB instead: ib_write_lat -a and ib_write_bw -a (-R) on xiw
# in kernel mode (its default, no CRC), siw and rxe, and the TCP floor (ping-pong
# busy-poll, stream) at the same sizes, one "BENCH DEVICE TEST_SIZE VALUE"
# line per size, and "BENCH info KEY TEXT" lines for the machine.
# siw
# modules: crc32c_generic libcrc32c crc32_generic udp_tunnel ip6_udp_tunnel rdma_rxe
# needs: /usr/bin/ib_write_lat /usr/bin/ib_send_lat /usr/bin/ib_read_lat /usr/bin/ib_write_bw
# needs: /usr/bin/qperf
# needs: /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so /etc/libibverbs.d/siw.driver
# needs: /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so /etc/libibverbs.d/rxe.driver
. /lib.sh
N=${XIW_BENCH_ITERS:-2000}
R=${XIW_BENCH_ROUNDS:-3}
port=18950
# emit DEVICE TEST_SIZE VALUE: one round's value, kept for the medians.
: >/tmp/rounds
emit() {
    echo "$1 $2 $3" >>/tmp/rounds
}
# medians: a "BENCH DEVICE TEST_SIZE VALUE" line for each value kept, in
# the order first kept: the median of its rounds that gave a number
# ("failed" if none did, "n/a" if the device cannot run it), and the rounds.
medians() {
    awk '{
        k = $1 " " $2
        if (!(k in all)) { order[++n] = k; all[k] = $3 } else all[k] = all[k] " " $3
        if ($3 ~ /^[0-9.]+$/) { c[k]++; x[k, c[k]] = $3 + 0 }
        if ($3 == "n/a") na[k] = 1
    }
    END {
        for (i = 1; i <= n; i++) {
            k = order[i]; m = c[k] + 0
            for (a = 2; a <= m; a++)
                for (b = a; b > 1 && x[k, b - 1] > x[k, b]; b--) {
                    t = x[k, b]; x[k, b] = x[k, b - 1]; x[k, b - 1] = t
                }
            if (m == 0) v = (k in na) ? "n/a" : "failed"
            else if (m % 2) v = sprintf("%.2f", x[k, (m + 1) / 2])
            else v = sprintf("%.2f", (x[k, m / 2] + x[k, m / 2 + 1]) / 2)
            print "BENCH " k " " v
            print "ROUNDS " k " " all[k]
        }
    }' /tmp/rounds
}

# perf NAME DEVICE-ARGS ADDRESS: the perftest runs, with DEVICE-ARGS on
# both ends and the client pointed at ADDRESS. The last: 4 QPs (-q 4), each
# writing 64 KiB messages both ways at once (-b); perftest prints the sum
# of both directions over every QP.
perf() {
    for t in "ib_write_lat -s 2 -n $N" "ib_send_lat -s 2 -n $N" "ib_read_lat -s 2 -n $N" \
        "ib_write_bw -s 65536 -n 2000" "ib_write_bw -s 1048576 -n 200" \
        "ib_write_bw -s 65536 -n 500 -q 4 -b"; do
        port=$((port + 1))
        perftest_pair "$t $2 -p $port -F" "$t $2 -p $port -F $3" $port >/tmp/pair 2>&1 ||
            sed 's/^/  /' /tmp/pair
        result "$1" $t
    done
}
# result NAME TOOL -s SIZE -n ITERS [-q 4 -b]: the BENCH line of the run
# just made (perftest's typical latency, or its average bandwidth).
result() {
    case $2 in
    *_lat) v=$(awk -v s="$4" '$1 == s && NF >= 9 { print $5 }' /tmp/client) ;;
    *) v=$(awk -v s="$4" '$1 == s && NF >= 5 { print $4 }' /tmp/client) ;;
    esac
    name=$2
    [ "${9:-}" = -b ] && name=${name}_q${8}_bidir
    emit "$1" "${name}_$4" "${v:-failed}"
}

# The qperf tests: TEST SIZE.
QPERF_TESTS="rc_lat:2 rc_rdma_write_lat:2 rc_rdma_write_lat:65536 rc_bw:65536"
QT=${XIW_BENCH_QPERF_SECONDS:-3}
# qperf_value FILE: the result qperf printed ("latency = 5.6 ms",
# "bw = 12.1 MB/sec"; decimal prefixes, thousands with commas), in µs or
# MiB/s; nothing if there is none.
qperf_value() {
    awk '$2 == "=" && ($1 == "latency" || $1 == "bw") && NF >= 4 {
        v = $3; gsub(",", "", v); u = $4
        f["ns"] = 0.001; f["us"] = 1; f["ms"] = 1000; f["sec"] = 1000000
        m = 1048576
        f["bytes/sec"] = 1 / m; f["KB/sec"] = 1000 / m; f["MB/sec"] = 1e6 / m
        f["GB/sec"] = 1e9 / m; f["TB/sec"] = 1e12 / m
        if (v ~ /^[0-9.]+$/ && (u in f)) { printf "%.2f\n", v * f[u]; exit }
    }' "$1"
}
# qperf_all NAME ADDRESS: each qperf test against a server of its own
# (started afresh, so one test's failure leaves the next alone), -t QT
# seconds; rdma_cm finds the device by ADDRESS on both ends.
qperf_all() {
    for q in $QPERF_TESTS; do
        qtest=${q%:*}
        qsize=${q#*:}
        port=$((port + 1))
        qperf -lp $port >/tmp/server 2>&1 &
        qpid=$!
        wait_listen $port
        timeout 120 qperf -cm1 -lp $port -t "$QT" -e 4 "$2" -m "$qsize" "$qtest" >/tmp/client 2>&1
        c=$?
        v=
        [ $c -eq 0 ] && v=$(qperf_value /tmp/client)
        # (quietly: the shell would say the server was terminated)
        { kill $qpid; wait $qpid; } 2>/dev/null
        if [ -z "$v" ]; then
            echo "  qperf $qtest -m $qsize on $1 ($c):"
            sed 's/^/    /' /tmp/client /tmp/server
        fi
        emit "$1" "qperf_${qtest}_$qsize" "${v:-failed}"
    done
}
# qperf_none NAME: a device without rdma_cm runs no qperf test.
qperf_none() {
    for q in $QPERF_TESTS; do
        emit "$1" "qperf_${q%:*}_${q#*:}" n/a
    done
}

# The floor: plain TCP between two processes on the same path.
floor() {
    for spec in "lat-spin 2 $N 200" "lat-block 2 $N 200" "lat-spin 65536 $N 200" \
        "lat-block 65536 $N 200" "bw 65536 2000 100" "bw 1048576 200 10"; do
        port=$((port + 1))
        xiw-bench floor-server $port $spec >/dev/null 2>&1 &
        s=$!
        wait_listen $port
        r=$(timeout 120 xiw-bench floor-client 127.0.0.1 $port $spec 2>/dev/null | awk '/RESULT/ { split($2, a, "="); print a[2] }')
        kill -9 $s 2>/dev/null
        wait $s
        set -- $spec
        emit tcp "$1_$2" "${r:-failed}"
    done
}

# The sweep: every size of perftest's -a (2 B to 8 MiB, powers of two) with
# few iterations, as TCG is slow (one boot stays within about 15 minutes).
if [ "${XIW_BENCH_SWEEP:-0}" = 1 ]; then
    NL=${XIW_BENCH_SWEEP_LAT_ITERS:-60}
    NB=${XIW_BENCH_SWEEP_BW_ITERS:-60}
    # A whole -a run may take minutes under TCG (lib.sh's pair).
    pair_timeout=900
    # siw counts its registrations against RLIMIT_MEMLOCK even for root, and
    # -a registers two 8 MiB buffers.
    ulimit -l unlimited
    sizes=
    k=1
    while [ $k -le 23 ]; do
        sizes="${sizes:+$sizes,}$((1 << k))"
        k=$((k + 1))
    done
    echo "BENCH info kernel $(uname -r)"
    echo "BENCH info cpus $(grep -c '^processor' /proc/cpuinfo)"
    echo "BENCH info cpu $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
    echo "BENCH info note iterations per size: latency $NL (ib_write_lat -a -n $NL -R, TCP ping-pong $NL after $((NL / 10)) of warm-up), bandwidth $NB (ib_write_bw -a -n $NB -R, TCP stream $NB messages)"
    # sweep_floor MODE ITERS WARMUP KEY: one floor pair over every size.
    sweep_floor() {
        port=$((port + 1))
        xiw-bench floor-server $port "$1" "$sizes" "$2" "$3" >/dev/null 2>&1 &
        s=$!
        wait_listen $port
        timeout 900 xiw-bench floor-client 127.0.0.1 $port "$1" "$sizes" "$2" "$3" 2>/dev/null |
            awk -v m="$1" -v k="$4" '/^RESULT/ {
                v = ""; n = ""
                for (i = 2; i <= NF; i++) {
                    split($i, a, "=")
                    if (a[1] == k) v = a[2]
                    if (a[1] == "size") n = a[2]
                }
                if (n != "") print "BENCH tcp " m "_" n " " (v == "" ? "failed" : v)
            }'
        kill -9 $s 2>/dev/null
        wait $s
    }
    # sweep_perf NAME DEVICE-ARGS ADDRESS: ib_write_lat -a and ib_write_bw -a.
    sweep_perf() {
        for t in "ib_write_lat -a -n $NL" "ib_write_bw -a -n $NB"; do
            port=$((port + 1))
            perftest_pair "$t $2 -p $port -F" "$t $2 -p $port -F $3" $port >/tmp/pair 2>&1 ||
                sed 's/^/  /' /tmp/pair
            set -- "$1" "$2" "$3" $t
            case $4 in
            *_lat) col=5 nf=9 ;;
            *) col=4 nf=5 ;;
            esac
            got=$(awk -v c=$col -v nf=$nf -v name="$1" -v tool="$4" \
                '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= nf { print "BENCH " name " " tool "_" $1 " " $c }' /tmp/client)
            if [ -n "$got" ]; then
                echo "$got"
            else
                echo "BENCH $1 $4_2 failed"
            fi
            set -- "$1" "$2" "$3"
        done
    }
    sweep_floor lat-spin $NL $((NL / 10)) typical_us
    sweep_floor bw $NB 0 bw_mibs
    ip link add dummy1 type dummy && ip link set dummy1 up && ip addr add 10.77.1.1/24 dev dummy1
    ip link add dummy2 type dummy && ip link set dummy2 up && ip addr add 10.77.2.1/24 dev dummy2
    rdma link add xiw0 type xiw netdev dummy0
    rdma link add siw0 type siw netdev dummy1
    rdma link add rxe0 type rxe netdev dummy2
    sweep_perf xiw-kernel "-d xiw0 -R" 10.77.0.1
    sweep_perf siw "-d siw0 -R" 10.77.1.1
    sweep_perf rxe "-d rxe0 -R" 10.77.2.1
    exit 0
fi

echo "BENCH info kernel $(uname -r)"
echo "BENCH info cpus $(grep -c '^processor' /proc/cpuinfo)"
echo "BENCH info cpu $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
echo "BENCH info note perftest: $N iterations for latency (-n), typical (median) latency, average bandwidth; qperf: -t $QT s a test, its mean latency; -R (rdma_cm) on the kernel devices, none in standalone mode; each value the median of $R rounds, the devices taking turns"

# Standalone: as on a kernel without RDMA.
for m in siw rdma_rxe xiw rdma_ucm rdma_cm iw_cm ib_cm ib_uverbs ib_core; do
    rmmod $m 2>/dev/null
done
eval "$(xiw up --netdev dummy0 2>/dev/null)"
round=0
while [ $round -lt "$R" ]; do
    floor
    perf xiw-standalone "-d xiw0 -x 0" 10.77.0.1
    qperf_none xiw-standalone
    round=$((round + 1))
done
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

round=0
while [ $round -lt "$R" ]; do
    perf xiw-kernel "-d xiw0 -R" 10.77.0.1
    qperf_all xiw-kernel 10.77.0.1
    echo 1 >/sys/module/xiw/parameters/mpa_crc
    perf xiw-kernel-crc "-d xiw0 -R" 10.77.0.1
    qperf_all xiw-kernel-crc 10.77.0.1
    echo 0 >/sys/module/xiw/parameters/mpa_crc
    perf siw "-d siw0 -R" 10.77.1.1
    qperf_all siw 10.77.1.1
    perf rxe "-d rxe0 -R" 10.77.2.1
    qperf_all rxe 10.77.2.1
    round=$((round + 1))
done
medians
exit 0
