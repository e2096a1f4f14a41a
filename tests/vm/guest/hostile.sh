# Guest: every byte from the network is hostile, in kernel mode too. A
# hand-written MPA initiator (tests/c/xiw_hostile_peer.c, frames built from
# the RFC figures) connects over TCP to an rdma_cm target
# (tests/c/xiw_cm_target.c: three regions between guard bytes, two
# receives posted), sends the ready-to-receive Write and then one scenario
# of RDMA Writes, good or malformed. The module places what it may from the
# socket (kernel-shim/xiw_place.c) and leaves the rest to the provider,
# whose engine builds the Terminates: each fault must get the Terminate
# (layer, error type, error code) standalone mode sends for it
# (tests/tests/hostile.rs, the engine's recv/errors.rs), the stream must
# close and the target's QP fail cleanly (its receives flushed, the
# connection ended, the program done in time), no byte outside what the
# scenario may write may change (guards, the read-only region, the other
# PD's), and the kernel must log no warning. Good Writes land where they
# should, the connection stays up (a Send behind them completes), and the
# module's count of placed FPDUs shows the kernel path ran; a bad frame
# small enough to be handed up in the events slot gets the same Terminate
# from there.
# Prints "ok: ..." or "FAIL: ..." per check; exits with the number of
# failures.
. /lib.sh

placed() { cat /sys/module/xiw/parameters/fpdus_placed; }
handed() { cat /sys/module/xiw/parameters/fpdus_handed; }
port=7400

# attack SCENARIO CRC: one target, one peer asking for CRC or not; their
# output in /tmp/target and /tmp/peer, the kernel's log meanwhile in
# /tmp/klog; sets pr and tr (their exit codes), hung (the target did not
# end within 40 s), delta (FPDUs the module placed) and hdelta (FPDUs it
# handed up).
attack() {
    port=$((port + 1))
    k=$(dmesg | wc -l)
    a=$(placed)
    h=$(handed)
    xiw_cm_target 10.77.0.1 $port >/tmp/target 2>&1 &
    t=$!
    wait_listen $port
    timeout 30 xiw_hostile_peer 10.77.0.1 $port "$2" "$1" >/tmp/peer 2>&1
    pr=$?
    hung=0
    if ! wait_gone $t 400; then
        hung=1
        kill -9 $t
    fi
    wait $t
    tr=$?
    delta=$(($(placed) - a))
    hdelta=$(($(handed) - h))
    dmesg | tail -n +$((k + 1)) >/tmp/klog
    echo "--- peer ($pr)"
    cat /tmp/peer
    echo "--- target ($tr)"
    cat /tmp/target
    echo "--- FPDUs placed by the module: $delta, handed up: $hdelta"
}

# hostile SCENARIO CRC TERMINATE CHANGED [PLACED]: runs the scenario and
# judges it. TERMINATE is "none" (no Terminate: the target's first receive
# gets the peer's "done", the stream stays up until the peer closes) or
# "LAYER ETYPE ECODE" (exactly that Terminate, then the stream ends and
# both receives are flushed). CHANGED is the target's list of changed
# ranges (offsets from r0's start), "none" if nothing may change. PLACED:
# ge1 (the module placed at least one FPDU), eq1 (one) or eq0 (none).
# HANDED (optional): eq1, the module handed exactly one FPDU up.
wrong() {
    echo "wrong: $*"
    w=1
}
hostile() {
    attack "$1" "$2"
    w=0
    [ $hung -eq 0 ] || wrong "the target did not end within 40 s"
    [ $pr -eq 0 ] || wrong "the peer failed ($pr)"
    [ $tr -eq 0 ] || wrong "the target failed ($tr)"
    grep -qE "^reply rev 2 crc $2 " /tmp/peer || wrong "the Reply's CRC flag is not $2"
    if [ "$3" = none ]; then
        ! grep -q '^terminate' /tmp/peer || wrong "a Terminate"
        grep -qx 'sent done' /tmp/peer && grep -qx open /tmp/peer ||
            wrong "the stream did not stay up"
        grep -qx 'wc 1 success len 4 data done' /tmp/target ||
            wrong "the Send behind the Writes did not complete"
        grep -qx 'wc 2 Work Request Flushed Error' /tmp/target ||
            wrong "the second receive was not flushed at the end"
    else
        want=$(echo "$3" | awk '{ print "terminate layer " $1 " etype " $2 " ecode " $3 }')
        [ "$(grep -c '^terminate' /tmp/peer)" -eq 1 ] && [ "$(grep -m1 '^terminate' /tmp/peer)" = "$want" ] ||
            wrong "not exactly one Terminate, $want"
        ! grep -qx 'crc bad' /tmp/peer || wrong "an FPDU with a bad CRC from the target"
        tail -1 /tmp/peer | grep -qxE 'closed|reset' || wrong "the stream did not end"
        grep -qx 'wc 1 Work Request Flushed Error' /tmp/target &&
            grep -qx 'wc 2 Work Request Flushed Error' /tmp/target ||
            wrong "the receives were not both flushed"
        ! grep -q '^wc .* success' /tmp/target || wrong "a receive succeeded"
    fi
    grep -qx 'end disconnected' /tmp/target || wrong "the target saw no disconnect"
    grep -qx 'qp ERR' /tmp/target || wrong "the target's QP is not in the error state"
    grep -qx "changed $4" /tmp/target || wrong "changed bytes other than $4"
    grep -qx 'pattern ok' /tmp/target || wrong "bytes not the peer's, or misplaced"
    grep -qx 'guards intact' /tmp/target && grep -qx 'r1 intact' /tmp/target &&
        grep -qx 'r2 intact' /tmp/target || wrong "a guard or another region changed"
    case $5 in
    ge1) [ $delta -ge 1 ] || wrong "the module placed nothing" ;;
    eq0 | eq1) [ $delta -eq "${5#eq}" ] || wrong "the module placed $delta FPDUs" ;;
    esac
    case ${6:-} in
    eq1) [ $hdelta -eq 1 ] || wrong "the module handed up $hdelta FPDUs" ;;
    esac
    ! grep -qiE 'WARNING|BUG|Oops|Call Trace|refcount' /tmp/klog || {
        cat /tmp/klog
        wrong "a kernel warning"
    }
    return $w
}

# The kernel's log from here on is the one judged (the boot's is not).
k0=$(dmesg | wc -l)
check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"

# With CRC: the module asks for it (mpa_crc=1; its default is 0).
echo 1 >/sys/module/xiw/parameters/mpa_crc
check "CRC: valid Writes (across pages, two segments, up to the last byte, a zero-length one to no STag): placed by the module, data in place, no Terminate, the stream stays up" \
    "hostile valid 1 none '0..100 1000..3200 7000..8000 9936..10000' ge1"
check "CRC: Write to an STag never advertised: DDP tagged buffer, invalid STag (1 1 0)" \
    "hostile badstag 1 '1 1 0' none eq0"
check "CRC: Write to r0's STag with another key: invalid STag (1 1 0)" \
    "hostile badkey 1 '1 1 0' none eq0"
check "CRC: Write one byte past the region's end: base or bounds (1 1 1), nothing placed" \
    "hostile overrun 1 '1 1 1' none eq0"
check "CRC: Write from one byte before the region's TO: base or bounds (1 1 1), nothing placed" \
    "hostile underrun 1 '1 1 1' none eq0"
check "CRC: Write whose TO wraps: TO wrap (1 1 3)" \
    "hostile wrap 1 '1 1 3' none eq0"
check "CRC: Write with a bad CRC: MPA CRC error (2 0 2), nothing placed" \
    "hostile badcrc 1 '2 0 2' none eq0"
check "CRC: tagged Write of DDP version 2: invalid DDP version (1 1 4)" \
    "hostile ddpver2 1 '1 1 4' none eq0"
check "CRC: tagged Write of DDP version 3: invalid DDP version (1 1 4)" \
    "hostile ddpver3 1 '1 1 4' none eq0"
check "CRC: Write of RDMAP version 0: invalid RDMAP version (0 2 5)" \
    "hostile rdmapver 1 '0 2 5' none eq0"
check "CRC: Writes with reserved bits set (not checked on receive): left to the provider, which places them" \
    "hostile rsvd 1 none '0..100 200..300' eq0"
check "CRC: Writes split over two TCP sends: the provider places them, the module the whole one after" \
    "hostile split 1 none '2000..4000 5000..6000 9000..9100' ge1"
check "CRC: a good Write, then one to no STag in the same send: the module places the first, invalid STag (1 1 0)" \
    "hostile good-bad 1 '1 1 0' '0..100' eq1"
check "CRC: a Write to no STag, then a good one in the same send: invalid STag (1 1 0), nothing placed" \
    "hostile bad-good 1 '1 1 0' none eq0"
check "CRC: a good Write, then one with a bad CRC in the same send: the module places the first, CRC error (2 0 2)" \
    "hostile good-badcrc 1 '2 0 2' '0..100' eq1"
# Frames small enough to go up in the events slot (kernel-mode.md, small
# messages): the module places the good one and hands the bad one up whole;
# the provider's engine judges it from there.
check "CRC: a good 4-byte Write, then one to no STag in the same send: the module places the first and hands the second up, invalid STag (1 1 0)" \
    "hostile tiny-good-bad 1 '1 1 0' '0..4' eq1 eq1"
check "CRC: a good 4-byte Write, then one with a bad CRC in the same send: placed, handed up, CRC error (2 0 2)" \
    "hostile tiny-good-badcrc 1 '2 0 2' '0..4' eq1 eq1"
check "CRC: Write to a region without remote write: RDMAP access rights (0 1 2)" \
    "hostile rights 1 '0 1 2' none eq0"
check "CRC: Write to a region of another PD: STag not associated (1 1 2)" \
    "hostile otherpd 1 '1 1 2' none eq0"

# Without CRC: neither end asks for it.
echo 0 >/sys/module/xiw/parameters/mpa_crc
check "no CRC: valid Writes: placed by the module, data in place, no Terminate" \
    "hostile valid 0 none '0..100 1000..3200 7000..8000 9936..10000' ge1"
check "no CRC: a wrong CRC field is not looked at: the Write placed by the module" \
    "hostile badcrc 0 none '0..100' ge1"
check "no CRC: Write one byte past the region's end: base or bounds (1 1 1)" \
    "hostile overrun 0 '1 1 1' none eq0"
check "no CRC: Writes split over two TCP sends: placed" \
    "hostile split 0 none '2000..4000 5000..6000 9000..9100' ge1"
check "no CRC: a good Write, then one to no STag in the same send: the module places the first, invalid STag (1 1 0)" \
    "hostile good-bad 0 '1 1 0' '0..100' eq1"
check "no CRC: a good 4-byte Write, then one to no STag in the same send: placed, handed up, invalid STag (1 1 0)" \
    "hostile tiny-good-bad 0 '1 1 0' '0..4' eq1 eq1"

check "no rdma_cm connection left" "! rdma resource show cm_id 2>/dev/null | grep -q 'state CONNECT\|ESTABLISHED'"
check "no kernel warning" "dmesg | tail -n +\$((k0 + 1)) >/tmp/dmesg; tail -5 /tmp/dmesg; ! grep -iE 'WARNING|BUG|Oops|refcount|leak|hung' /tmp/dmesg"
check "rdma link delete xiw0" "rdma link delete xiw0"
check "rmmod" "rmmod xiw"
exit $fails
