# Guest: the fault tests of tests/tests/faults.rs in kernel mode, after a
# data integrity run (tests/tests/integrity.rs's, with the module placing
# Writes). Two
# `xiw-verbs-check fault` processes (given to run.sh) on a device the module
# registered connect by modify_qp; the provider shares each stream with the
# module, which places the RDMA Writes from the socket. One streams one kind
# of operation to the other (the victim) while the fault strikes, with a QP
# pair inside its own process carrying checked traffic beside it (the
# bystander). Every work request must complete exactly once and in order,
# the first failure with a status the fault calls for and the rest flushed,
# the victim's QP in error, nothing hanging, and the bystander still
# carrying checked traffic after. Faults:
# - the peer killing itself with SIGKILL in the middle of each kind of
#   operation (send, write, read, atomic, flush, atomic-write);
# - the target deregistering the region the Writes land in while they are
#   in flight: no byte may land after ibv_dereg_mr returns (the module's
#   placement into it waits or stops), with and without completions
#   confirmed by the peer (XIW_COMPLETION=placed: the refused Write itself
#   fails with IBV_WC_REM_ACCESS_ERR);
# - the victim's TCP connection aborted in the middle of the stream (`ss
#   -K`, which resets it), the bystander's left alone;
# - the victim's stream silent (nftables dropping every segment of it, as
#   a link that goes down; the drops counted, at least one) for longer than the stream's time-out
#   (XIW_STREAM_TIMEOUT_MS): the oldest request fails with
#   IBV_WC_RETRY_EXC_ERR; and for less: nothing fails;
# - 1% of every TCP segment dropped at random while `xiw-verbs-check soak`
#   runs (every byte checked) and while `ib_write_bw` runs.
# Then: the module placed Writes meanwhile, no kernel warning, and the
# processes' kernel objects gone. Prints "ok: ..." or "FAIL: ..." per
# check; exits with the number of failures.
# needs: /usr/bin/ss /usr/sbin/nft /usr/bin/ib_write_bw
# checks: 20
# modules: inet_diag tcp_diag nf_tables nft_numgen
. /lib.sh

placed() { cat /sys/module/xiw/parameters/fpdus_placed; }
port=7600

# integrity: `xiw-verbs-check integrity` between two processes, 4 QPs:
# Sends, RDMA Writes and RDMA Reads of every size from 0 B to 1 MiB (FPDU
# boundaries included), every byte and completion checked on both sides;
# true if both report success and the module placed some of the Writes.
integrity() {
    port=$((port + 1))
    a=$(placed)
    pair "xiw-verbs-check integrity --dev xiw0 --port $port --timeout 80" \
        "xiw-verbs-check integrity --dev xiw0 --port $port --timeout 80 --server 10.77.0.1 --qps 4 --ops 200 --seed 11" \
        $port || return 1
    b=$(placed)
    echo "placed: $((b - a))"
    grep -q "integrity ok (client): " /tmp/client && grep -q "integrity ok (server): " /tmp/server &&
        [ $((b - a)) -gt 0 ]
}

# fault KILLED OPTS...: one server and one client with `--case OPTS`; true
# if the client reports success and the server was killed by SIGKILL
# (KILLED=1) or reports success too (KILLED=0). $inject, if set, runs
# beside them with the out-of-band port as its argument.
fault() {
    killed=$1
    shift
    port=$((port + 1))
    cases=
    for c in "$@"; do cases="$cases --case $c"; done
    xiw-verbs-check fault --dev xiw0 --port $port --timeout 80 $cases >/tmp/server 2>&1 &
    s=$!
    wait_listen $port
    if [ -n "$inject" ]; then
        $inject $port $s &
    fi
    timeout 120 xiw-verbs-check fault --dev xiw0 --port $port --timeout 80 $cases \
        --server 10.77.0.1 >/tmp/client 2>&1
    c=$?
    [ $c -eq 0 ] || kill $s 2>/dev/null
    wait $s
    r=$?
    wait 2>/dev/null
    echo "--- server ($r)"; tail -3 /tmp/server; echo "--- client ($c)"; tail -3 /tmp/client
    grep -q "fault ok (client): " /tmp/client && [ $c -eq 0 ] || return 1
    if [ "$killed" = 1 ]; then
        [ $r -eq 137 ]
    else
        [ $r -eq 0 ] && grep -q "fault ok (server): " /tmp/server
    fi
}

# victim_ports PORT SERVER: the local ports of the server's TCP connections
# but the out-of-band one (the victim's stream; the bystander's are the
# client's own, to itself).
victim_ports() {
    for lp in $(ss -tnpH state established | grep "pid=$2," | awk '{ print $3 }' | sed 's/.*://'); do
        [ "$lp" = "$1" ] || echo "$lp"
    done
}

# reset PORT SERVER: 1.5 s in, aborts the victim's TCP connections.
reset() {
    sleep 1.5
    for lp in $(victim_ports "$1" "$2"); do
        ss -K -tnH state established "( sport = :$lp )" >/dev/null
    done
}

# out_table TABLE: a new nftables table TABLE with a chain `out` on the
# output hook.
out_table() {
    nft add table inet "$1"
    nft add chain inet "$1" out '{ type filter hook output priority 0 ; }'
}

# dropped TABLE: removes nftables table TABLE, leaving in /tmp/dropped the
# number of segments its rules dropped (they count them).
dropped() {
    nft list table inet "$1" | awk '{ for (i = 1; i < NF; i++) if ($i == "packets") n += $(i + 1) } END { print n + 0 }' >/tmp/dropped
    nft delete table inet "$1"
    echo "segments dropped: $(cat /tmp/dropped)"
}

# silence PORT SERVER: 1.5 s in, every segment of the victim's stream is
# dropped (both ways) for $down seconds, as over a link that is down; then
# it flows again.
silence() {
    sleep 1.5
    out_table xiwdown
    for lp in $(victim_ports "$1" "$2"); do
        nft add rule inet xiwdown out tcp sport "$lp" counter drop
        nft add rule inet xiwdown out tcp dport "$lp" counter drop
    done
    sleep "$down"
    dropped xiwdown
}

# lossy on|off: 1% of the TCP segments sent are dropped at random.
lossy() {
    if [ "$1" = on ]; then
        out_table xiwloss
        nft add rule inet xiwloss out meta l4proto tcp numgen random mod 100 lt 1 counter drop
    else
        dropped xiwloss
    fi
}

check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"
dmesg -c >/dev/null
check "data integrity with the module placing Writes: every byte of Sends, Writes and Reads of 0 B to 1 MiB checked" \
    "integrity"
a=$(placed)
for op in send write read atomic flush atomic-write; do
    check "the peer killed with SIGKILL during $op" "fault 1 kill op=$op"
done
check "memory deregistered while remote Writes are in flight: no byte lands after ibv_dereg_mr" \
    "fault 0 dereg op=write"
check "the same with completions confirmed by the peer: the refused Write fails with IBV_WC_REM_ACCESS_ERR" \
    "export XIW_COMPLETION=placed; fault 0 dereg op=write expect=access; r=\$?; unset XIW_COMPLETION; [ \$r -eq 0 ]"
check "the victim's TCP connection reset in the middle of the stream" \
    "inject=reset; fault 0 op=mixed; r=\$?; inject=; [ \$r -eq 0 ]"
check "the victim's stream silent for 8 s, stream time-out 2 s: the oldest request fails with IBV_WC_RETRY_EXC_ERR" \
    "export XIW_STREAM_TIMEOUT_MS=2000; down=8; inject=silence; fault 0 op=mixed expect=retry; r=\$?; inject=; unset XIW_STREAM_TIMEOUT_MS; [ \$r -eq 0 ] && [ \$(cat /tmp/dropped) -gt 0 ]"
check "the victim's stream silent for 2 s, stream time-out 10 s: nothing fails" \
    "export XIW_STREAM_TIMEOUT_MS=10000; down=2; inject=silence; fault 0 op=mixed expect=survive secs=6; r=\$?; inject=; unset XIW_STREAM_TIMEOUT_MS; [ \$r -eq 0 ] && [ \$(cat /tmp/dropped) -gt 0 ]"
check "soak through 1% loss: 4 QPs both ways, every byte checked" \
    "lossy on; pair_timeout=200 pair 'xiw-verbs-check soak --dev xiw0 --port 7690 --timeout 180' 'xiw-verbs-check soak --dev xiw0 --port 7690 --server 10.77.0.1 --qps 4 --ops 1000 --seed 21 --timeout 180' 7690; r=\$?; lossy off;
     [ \$r -eq 0 ] && [ \$(cat /tmp/dropped) -gt 0 ] && grep -q 'soak ok (client): ' /tmp/client && grep -q 'soak ok (server): ' /tmp/server"
check "ib_write_bw 64 KiB through 1% loss" \
    "lossy on; perftest_pair 'ib_write_bw -d xiw0 -p 7691 -s 65536 -n 500 -F' 'ib_write_bw -d xiw0 -p 7691 -s 65536 -n 500 -F 10.77.0.1' 7691; r=\$?; lossy off; [ \$r -eq 0 ] && [ \$(cat /tmp/dropped) -gt 0 ] && perftest_ok 65536 500"
check "the module placed Writes of these streams" \
    "b=\$(placed); echo \"placed: \$((b - a))\"; [ \$((b - a)) -gt 0 ]"
sleep 1
check "no kernel warning" "dmesg >/tmp/dmesg; tail -5 /tmp/dmesg; ! grep -qiE 'WARNING|BUG|Oops|refcount|leak|hung' /tmp/dmesg"
check "the processes' kernel objects are gone" \
    "! rdma resource show qp link xiw0/1 | grep -q lqpn && ! rdma resource show mr dev xiw0 | grep -q mrn"
check "rdma link delete xiw0" "rdma link delete xiw0"
check "rmmod" "rmmod xiw"
exit $fails
