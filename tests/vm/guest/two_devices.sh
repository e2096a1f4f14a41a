# Guest: two RDMA devices on one host, in one network namespace: xiw0 on
# dummy0 (10.77.0.1) and, on dummy1 (10.78.0.1), first a second xiw device,
# xiw1, then Linux's siw, siw0. A connection from one device's address to
# the other's goes through the loopback: the module connects to wherever the
# routing table reaches, and a listen on an address takes connections
# whatever netdev they come through. Both directions between xiw0 and xiw1
# (rping, data verified; ibv_rc_pingpong, data checked) and between xiw0 and
# siw0 (rping; ucmatose); xiw's provider says which address each of its
# connections joined. A wildcard listen is taken by both devices on one
# port. Then connects that do not come up, told as rdma_cm events once
# rdma_connect has returned: refused (REJECTED), unanswered (UNREACHABLE
# after the module's 10 s); a process killed while its connect is pending;
# rmmod while one is pending. Prints "ok: ..." or "FAIL: ..." per check;
# exits with the number of failures.
# siw
# modules: crc32c_generic libcrc32c
# needs: /usr/bin/ip /usr/bin/rping /usr/bin/ucmatose
# needs: /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so /etc/libibverbs.d/siw.driver
. /lib.sh
IP=/usr/bin/ip
A=10.77.0.1
B=10.78.0.1
# On dummy0's subnet, nobody: dummy drops what it is given (and needs no
# neighbour), so a TCP connection there is never answered.
NOBODY=10.77.0.99
X="env XIW_DEBUG=1"

$IP link add dummy1 type dummy
$IP addr add $B/24 dev dummy1
$IP link set dummy1 up
$IP addr show

# joined SIDE PEER ROLE: xiw's provider in the SIDE (server or client)
# process made its QP's stream of a connection with PEER, as ROLE
# (initiator or responder).
joined() {
    grep -qF "connected to Some(($2, 0)) ($3" "/tmp/$1" && return 0
    echo "--- the $1's provider said:"
    grep 'connected to' "/tmp/$1"
    return 1
}
# rping_ok ADDR FROM [LISTEN]: rping -v -V, 200 pings, the server listening
# on ADDR (or LISTEN), the client connecting to ADDR from FROM; every ping's
# data checked by both.
rping_ok() {
    pair "$X rping -s -a ${3:-$1} -C 200 -v -V" "$X rping -c -a $1 -I $2 -C 200 -v -V" 7174 &&
        grep -q 'rdma-ping-199: ' /tmp/client && grep -q 'rdma-ping-199: ' /tmp/server
}
# wildcard_ok ADDR: rping -v -V, 200 pings, the server listening on the
# wildcard address (so on every device, on one port), a client from ADDR to
# ADDR (the device of ADDR at both ends).
wildcard_ok() {
    rping_ok $1 $1 0.0.0.0
}
# ucma_ok ADDR FROM: ucmatose, 4 connections x 50 messages, the server bound
# to ADDR, the client connecting to it from FROM.
ucma_ok() {
    pair "$X ucmatose -b $1 -c 4 -C 50" "$X ucmatose -s $1 -b $2 -c 4 -C 50" 7471 &&
        grep -q 'return status 0' /tmp/client && grep -q 'return status 0' /tmp/server
}
# connecting: whether rdma_cm has an id connecting to NOBODY.
connecting() {
    rdma resource show cm_id | grep "dst-addr $NOBODY:" | grep -q 'state CONNECT '
}
# pending_then WHAT: starts an rping client connecting to NOBODY and, once
# its connect is pending (10 s at most), runs WHAT (which sets $r), timed
# (into $t). False if the connect was never seen pending. The client goes.
pending_then() {
    rping -c -a $NOBODY -I $A -C 1 >/tmp/client 2>&1 &
    p=$!
    n=0
    while [ $n -lt 100 ] && ! connecting; do
        sleep 0.1
        n=$((n + 1))
    done
    rdma resource show cm_id
    connecting || { kill -9 $p; wait $p; return 1; }
    t0=$(date +%s)
    eval "$1"
    t=$(($(date +%s) - t0))
    kill -9 $p 2>/dev/null
    wait $p
    echo "--- $t s"
    cat /tmp/client
}

check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"
check "rdma link add xiw1 type xiw netdev dummy1" "rdma link add xiw1 type xiw netdev dummy1"
rdma link show

check "rping -v -V -C 200, xiw1 server ($B), xiw0 client ($A)" \
    "rping_ok $B $A && joined client $B initiator && joined server $A responder"
check "rping -v -V -C 200, xiw0 server ($A), xiw1 client ($B)" \
    "rping_ok $A $B && joined client $A initiator && joined server $B responder"
check "ibv_rc_pingpong -c 4 KiB x 200, xiw1 server, xiw0 client" \
    "pair 'ibv_rc_pingpong -d xiw1 -g 0 -c -n 200 -s 4096' 'ibv_rc_pingpong -d xiw0 -g 0 -c -n 200 -s 4096 $B' 18515 &&
     grep -q '200 iters' /tmp/client"
check "ibv_rc_pingpong -c 4 KiB x 200, xiw0 server, xiw1 client" \
    "pair 'ibv_rc_pingpong -d xiw0 -g 0 -c -n 200 -s 4096' 'ibv_rc_pingpong -d xiw1 -g 0 -c -n 200 -s 4096 $A' 18515 &&
     grep -q '200 iters' /tmp/client"

check "rping -v -V -C 200, wildcard server (xiw0 and xiw1 on one port), xiw1 client" \
    "wildcard_ok $B && joined client $B initiator && joined server $B responder"

# Not checked, said: a wildcard listen is bound to its netdev (as siw's is),
# and the kernel answers such a listener only through that netdev, so a
# client on another netdev of this host is not answered.
echo "--- not checked: xiw0 client to a wildcard server at xiw1's address"
if pair "rping -s -a 0.0.0.0 -C 10 -v" "rping -c -a $B -I $A -C 10 -v" 7174; then
    echo "--- it connected"
else
    echo "--- it did not connect"
fi

check "rdma link delete xiw1" "rdma link delete xiw1"
check "rdma link add siw0 type siw netdev dummy1" "rdma link add siw0 type siw netdev dummy1"
rdma link show

check "rping -v -V -C 200, siw0 server ($B), xiw0 client ($A)" \
    "rping_ok $B $A && joined client $B initiator"
check "rping -v -V -C 200, xiw0 server ($A), siw0 client ($B)" \
    "rping_ok $A $B && joined server $B responder"
check "ucmatose 4 x 50, siw0 server ($B), xiw0 client ($A)" \
    "ucma_ok $B $A && joined client $B initiator"
check "ucmatose 4 x 50, xiw0 server ($A), siw0 client ($B)" \
    "ucma_ok $A $B && joined server $B responder"
check "rping -v -V -C 200, wildcard server (xiw0 and siw0 on one port), xiw0 client" \
    "wildcard_ok $A && joined client $A initiator && joined server $A responder"
check "rping -v -V -C 200, wildcard server (xiw0 and siw0 on one port), siw0 client" \
    "wildcard_ok $B"
# Connects that do not come up: rdma_connect returns at once, the outcome
# is an event.
check "xiw0's connect to a port nobody listens on: the REJECTED event (ECONNREFUSED)" \
    "timeout 60 rping -c -a $B -I $A -p 7999 -C 1 >/tmp/client 2>&1; cat /tmp/client;
     grep -q 'cma event RDMA_CM_EVENT_REJECTED, error -111' /tmp/client"
check "xiw0's connect nobody answers: the UNREACHABLE event (ETIMEDOUT) after 10 s" \
    "t0=\$(date +%s); timeout 60 rping -c -a $NOBODY -I $A -C 1 >/tmp/client 2>&1; t=\$((\$(date +%s) - t0));
     cat /tmp/client; echo \"--- \$t s\";
     grep -q 'cma event RDMA_CM_EVENT_UNREACHABLE, error -110' /tmp/client && [ \$t -ge 9 ] && [ \$t -le 40 ]"
# The module bounds a pending connect by its own deadline (10 s): a process
# killed meanwhile, and rmmod, wait for it at most.
check "a process killed while its connect is pending goes within 20 s, with its rdma_cm id" \
    "pending_then 'kill -9 \$p; wait \$p' && [ \$t -le 20 ] && ! rdma resource show cm_id | grep -q 'dst-addr $NOBODY:'"
check "rmmod xiw while a connect is pending, within 30 s" \
    "pending_then 'timeout 60 rmmod xiw; r=\$?' && [ \$r -eq 0 ] && [ \$t -le 30 ]"

rdma resource show cm_id
check "no rdma_cm id left" "! rdma resource show cm_id 2>/dev/null | grep -q ."
check "rdma link delete siw0" "rdma link delete siw0"
exit $fails
