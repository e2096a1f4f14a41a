# Guest: xiw against Linux's own software iWARP driver, siw (built by run.sh
# from the kernel's source), over a veth pair. siw binds only netdevs of the
# initial network namespace: siw0 is on veth0 (10.78.0.1) there, xiw0 on
# veth1 (10.78.0.2) in namespace "b". Both directions (each side as server
# and as client) with unmodified rdma_cm programs, with MPA CRC asked for by
# xiw and not asked for by either (siw's defaults ask for none), checking
# which was agreed; then the RFC 7306 and commit-draft operations, which siw
# does not speak, fail cleanly when an application asks for them. Prints
# "ok: ..." or "FAIL: ..." per check; exits with the number of failures.
# siw
# checks: 26 (some run in loops)
# modules: veth crc32c_generic libcrc32c
# needs: /usr/bin/ip /usr/bin/rping /usr/bin/ib_write_lat /usr/bin/ib_read_lat /usr/bin/ib_send_bw
# needs: /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so /etc/libibverbs.d/siw.driver
. /lib.sh
IP=/usr/bin/ip
B="$IP netns exec b"

$IP netns add b
$IP link add veth0 type veth peer name veth1
$IP link set veth1 netns b
$IP addr add 10.78.0.1/24 dev veth0
$IP link set veth0 up
$B ip link set lo up
$B ip addr add 10.78.0.2/24 dev veth1
$B ip link set veth1 up
check "rdma link add siw0 type siw netdev veth0" "rdma link add siw0 type siw netdev veth0"
check "rdma link add xiw0 type xiw netdev veth1 (namespace b)" "$B rdma link add xiw0 type xiw netdev veth1"
rdma link show

# xiw CMD...: the command line that runs CMD in namespace b, with xiw's
# diagnostics (the connections it made, with their CRC) on stderr.
xiw() {
    echo "env XIW_DEBUG=1 $B $*"
}
for crc in 1 0; do
    echo "$crc" >/sys/module/xiw/parameters/mpa_crc
    want=$([ $crc = 1 ] && echo on || echo off)
    t="CRC $want"
    check "rping -v -C 200, siw server, xiw client ($t)" \
        "pair 'rping -s -a 10.78.0.1 -C 200 -v' \"\$(xiw rping -c -a 10.78.0.1 -C 200 -v)\" 7174 &&
         grep -q 'rdma-ping-199: ' /tmp/client && grep -q 'rdma-ping-199: ' /tmp/server &&
         [ \"\$(agreed_crc)\" = $want ]"
    check "rping -v -C 200, xiw server, siw client ($t)" \
        "pair \"\$(xiw rping -s -a 10.78.0.2 -C 200 -v)\" 'rping -c -a 10.78.0.2 -C 200 -v' 7174 b &&
         grep -q 'rdma-ping-199: ' /tmp/client && grep -q 'rdma-ping-199: ' /tmp/server &&
         [ \"\$(agreed_crc)\" = $want ]"
    p=$((18700 + crc * 10))
    # perftest's ib_send_bw exits 1 over iWARP (see perftest_ok).
    for t2 in "ib_write_lat 2 1000 &&" "ib_read_lat 2 500 &&" "ib_send_bw 65536 200 ;"; do
        set -- $t2
        p=$((p + 1))
        check "$1 -R $2 B, siw server, xiw client ($t)" \
            "perftest_pair '$1 -d siw0 -R -p $p -s $2 -n $3 -F' '$B $1 -d xiw0 -R -p $p -s $2 -n $3 -F 10.78.0.1' $p $4
             perftest_ok $2 $3"
        p=$((p + 1))
        check "$1 -R $2 B, xiw server, siw client ($t)" \
            "perftest_pair '$B $1 -d xiw0 -R -p $p -s $2 -n $3 -F' '$1 -d siw0 -R -p $p -s $2 -n $3 -F 10.78.0.2' $p b $4
             perftest_ok $2 $3"
    done
done

# One local port for rdma_cm connections in a row (xiw_cm_reconnect): the
# TIME_WAIT a closed one leaves on it does not keep the next from binding it,
# as rdma_cm, whose port space forgets the port at once, expects. The
# servers are persistent rpings on two ports (one 4-tuple per connection).
# reconnect SERVER_NS_CMD CLIENT_NS_CMD SERVER_ADDR CLIENT_ADDR LPORT [SERVER_NETNS]
reconnect() {
    $1 rping -s -P -a $3 -p 7175 >/tmp/server 2>&1 & s1=$!
    $1 rping -s -P -a $3 -p 7176 >>/tmp/server 2>&1 & s2=$!
    wait_listen 7175 $6; wait_listen 7176 $6
    timeout 60 $2 xiw_cm_reconnect $4 $5 $3 7175 7176; c=$?
    echo "TIME_WAIT on port $5: $($2 netstat -tn | grep -c ":$5 .*TIME_WAIT")"
    kill $s1 $s2 2>/dev/null; wait $s1 $s2
    [ $c -eq 0 ]
}
check "one local port for two rdma_cm connections in a row, xiw client, siw server" \
    "reconnect '' '$B' 10.78.0.1 10.78.0.2 40000"
check "one local port for two rdma_cm connections in a row, siw client, xiw server" \
    "reconnect '$B' '' 10.78.0.2 10.78.0.1 40001 b"

# siw knows neither RFC 7306 nor the commit draft: asked for, they fail
# (siw ends the stream) and what follows is flushed; no hang either side.
for op in fetch-add atomic-write; do
    check "$op against siw fails cleanly, the Send behind it flushed" \
        "rping -s -a 10.78.0.1 -C 1 >/tmp/server 2>&1 & s=\$!; sleep 1;
         timeout 60 $B xiw_cm_ext 10.78.0.1 7174 $op >/tmp/client 2>&1; c=\$?;
         kill \$s 2>/dev/null; wait \$s; cat /tmp/client; [ \$c -eq 0 ]"
done

rdma resource show cm_id
check "no rdma_cm connection left" "! rdma resource show cm_id 2>/dev/null | grep -q 'state CONNECT\|ESTABLISHED'"
check "rdma link delete xiw0" "rdma link delete xiw0"
check "rdma link delete siw0" "rdma link delete siw0"
check "rmmod xiw" "rmmod xiw"
exit $fails
