# Helpers every guest script sources (run.sh puts this file at /lib.sh).

fails=0
# check NAME COMMAND: prints "ok: NAME" or "FAIL: NAME" (counted in $fails).
check() {
    if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi
}

# wait_listen PORT [NETNS]: until something listens on TCP port PORT (in
# network namespace NETNS if given), 10 s at most.
wait_listen() {
    n=0
    while [ $n -lt 100 ] && ! ${2:+/usr/bin/ip netns exec $2} netstat -ltn | grep -q ":$1 "; do
        sleep 0.1
        n=$((n + 1))
    done
}

# wait_gone PID TENTHS: until process PID has exited, TENTHS tenths of a
# second at most; true if it has.
wait_gone() {
    n=0
    while kill -0 "$1" 2>/dev/null && [ $n -lt "$2" ]; do
        sleep 0.1
        n=$((n + 1))
    done
    ! kill -0 "$1" 2>/dev/null
}

# pair SERVER CLIENT [PORT [NETNS]]: runs the server command, then (once
# something listens on TCP port PORT, in network namespace NETNS if given,
# or after a second) the client command (120 s at most, or $pair_timeout
# seconds if set); the server is
# killed if the client fails, so nothing hangs. Their output is left in
# /tmp/server and /tmp/client. True if both exit 0.
pair() {
    # exec: $s is the server itself (killed below), not a shell above it.
    eval "exec $1" >/tmp/server 2>&1 &
    s=$!
    if [ -n "$3" ]; then
        wait_listen "$3" "$4"
    else
        sleep 1
    fi
    eval "timeout ${pair_timeout:-120} $2" >/tmp/client 2>&1
    c=$?
    [ $c -eq 0 ] || kill $s 2>/dev/null
    wait $s
    r=$?
    # The last lines of each; more of them when either side failed.
    k=4
    [ $c -eq 0 ] && [ $r -eq 0 ] || k=40
    echo "--- server ($r)"; tail -$k /tmp/server; echo "--- client ($c)"; tail -$k /tmp/client
    [ $c -eq 0 ] && [ $r -eq 0 ]
}

# perftest_ok SIZE ITERS: the client printed its result line for SIZE bytes
# and ITERS iterations and neither side reported an error. perftest's
# ib_send_bw over iWARP never deregisters a credit MR, so its own teardown
# fails (dealloc_pd: EBUSY) on any device: that, after a complete table, is
# all that is allowed.
perftest_ok() {
    ! cat /tmp/server /tmp/client | grep -E "Couldn't|Failed|rror|Unable" |
        grep -v -e 'Failed to deallocate PD - ' -e "^Couldn't destroy all SEND resources" |
        grep -q . &&
        grep -qE "^ *$1 +$2 " /tmp/client && return 0
    # Not: everything both sides said, for the record.
    echo "--- server, whole"; cat /tmp/server; echo "--- client, whole"; cat /tmp/client
    return 1
}

# perftest_pair SERVER CLIENT PORT [NETNS]: pair for perftest with -R. Its
# client makes two rdma_cm connections, the second as soon as the first has
# carried the parameters, while its server only then starts listening for
# it: a client quicker than the server is refused (perftest's own race, seen
# with Linux's siw as client, whose rdma_connect fails; xiw's client hears it
# as the REJECTED event, ECONNREFUSED). Such a refusal, and only that, is run
# once more, and said so.
perftest_pair() {
    pair "$@" && return 0
    grep -q -e "Connection refused" -e "RDMA_CM_EVENT_REJECTED; error: -111" /tmp/client || return 1
    echo "--- the client's second connection came before the server listened; once more"
    pair "$@"
}

# agreed_crc: the CRC the xiw processes of the last pair reported for their
# connections (XIW_DEBUG=1's "connected to ... CRC on|off" lines in
# /tmp/server and /tmp/client): "on" or "off", once each.
agreed_crc() {
    grep -ho 'connected to .*CRC o[nf]*' /tmp/server /tmp/client | sed 's/.*CRC //' | sort -u | tr -d '\n'
}
