#!/usr/bin/env bash
# Kernel mode's benchmark: one guest boot (tests/vm/guest/bench.sh), every
# device side by side on the same TCP path, printed as a table: xiw in kernel
# mode (its default, no MPA CRC, and with CRC), xiw in standalone mode,
# Linux's siw (its default: no CRC) and rxe; perftest's typical latency for 2-byte
# RDMA Write, Send and RDMA Read (µs) and RDMA Write bandwidth for 64 KiB and
# 1 MiB messages, and for 64 KiB over 4 QPs in both directions at once (the
# sum, MiB/s); qperf over rdma_cm (-cm1, completions awaited on a
# completion channel) on the kernel devices: rc_lat and rc_rdma_write_lat
# 2 B, rc_rdma_write_lat 64 KiB (µs, one way, the run's mean) and rc_bw
# 64 KiB (MiB/s); and the floor, plain TCP between two processes
# (xiw-bench's ping-pong, spinning and blocking, and stream). "—": the
# device cannot run the test (standalone mode has no rdma_cm); "failed":
# the run gave no number (the guest's output above the table says why).
#
# With --out DIR it also writes DIR/guest-bench.json (the run's values, in
# the sweep's JSON format), DIR/guest-bench.md (the table) and draws
# DIR/guest-bench-latency.svg and DIR/guest-bench-bandwidth.svg (a .png
# beside each): one group of bars per test, one bar per device, with
# xiw-bench --bars.
#
# With --sweep OUTDIR it sweeps every message size from 2 B to 8 MiB
# instead (xiw in kernel mode with its default, no CRC, siw, rxe, ib_write_lat -a
# and ib_write_bw -a, and the TCP floor), writes OUTDIR/guest-sweep.json and
# draws OUTDIR/guest-latency.svg and OUTDIR/guest-bandwidth.svg (a .png
# beside each) with xiw-bench --plot.
#
# usage: tests/vm/bench.sh [--out DIR | --sweep OUTDIR]
#        (after pkg/install.sh and cargo build --release)
# Environment: XIW_BENCH_ITERS (latency iterations, default 2000),
# XIW_BENCH_QPERF_SECONDS (each qperf test's duration, default 3),
# XIW_BENCH_ROUNDS (default 3: the devices take turns, each value is the
# median of its rounds, every round's values are printed after the table);
# with --sweep XIW_BENCH_SWEEP_LAT_ITERS and XIW_BENCH_SWEEP_BW_ITERS
# (iterations per size, default 60 each); XIW_BENCH_BIN (the directory of
# the xiw and xiw-bench programs, default target/release); and run.sh's
# (XIW_VM_PROVIDER defaults to libxiw.so beside those programs, the build
# they come from).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${XIW_BENCH_BIN:-$repo/target/release}
usage="usage: tests/vm/bench.sh [--out DIR | --sweep OUTDIR]"
sweep=
out=
case ${1:-} in
--sweep) sweep=${2:?$usage} ;;
--out) out=${2:?$usage} ;;
"") ;;
*) echo "$usage" >&2; exit 2 ;;
esac
for b in xiw xiw-bench; do
    [[ -x $bin/$b ]] || { echo "bench.sh: build first: cargo build --release ($b)" >&2; exit 1; }
done
# The provider of the same build as xiw and xiw-bench.
if [[ -z ${XIW_VM_PROVIDER:-} && -f $bin/libxiw.so ]]; then
    export XIW_VM_PROVIDER=$bin/libxiw.so
fi
# The guest sees no environment of the host's: the knobs go in at the top of
# its script.
work=$(mktemp -d /tmp/xiw-bench-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
{
    for v in XIW_BENCH_ITERS XIW_BENCH_QPERF_SECONDS XIW_BENCH_ROUNDS XIW_BENCH_SWEEP_LAT_ITERS XIW_BENCH_SWEEP_BW_ITERS; do
        if [[ -n ${!v:-} ]]; then
            [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench.sh: $v is not a number" >&2; exit 2; }
            echo "$v=${!v}"
        fi
    done
    [[ -z $sweep ]] || echo "XIW_BENCH_SWEEP=1"
    cat "$repo/tests/vm/guest/bench.sh"
} >"$work/bench.sh"
# A guest that stopped early (run.sh's status) still has its values shown,
# the rest "missing"; the status is this script's.
rc=0
console=$(XIW_VM_TIMEOUT=${XIW_VM_TIMEOUT:-2400} bash "$repo/tests/vm/run.sh" \
    "$work/bench.sh" "$bin/xiw" "$bin/xiw-bench") || rc=$?
# What the host was: the guest cannot tell.
host_note() {
    local cpu
    cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    echo "BENCH info note guest: Debian's kernel under qemu-system-x86_64 TCG (emulated, no KVM), -smp 2 -m 2048, both processes of every pair in the guest; host: $(nproc) CPUs ($cpu), Linux $(uname -r)"
}
if [[ -n $sweep ]]; then
    mkdir -p "$sweep"
    {
        grep '^BENCH ' <<<"$console"
        host_note
    } >"$work/lines"
    "$bin/xiw-bench" --from-bench "$work/lines" --json "$sweep/guest-sweep.json" \
        --title "xiw kernel mode beside siw, rxe and TCP in a qemu guest"
    "$bin/xiw-bench" --plot "$sweep/guest-sweep.json" --out "$sweep" --prefix guest
    exit $rc
fi
# The guest's own account of anything that failed, then the table.
grep -v '^BENCH ' <<<"$console" | grep -E '^ |FAIL|failed' >&2 || true
table() {
    grep '^BENCH ' <<<"$console" | awk '
{ v[$2 " " $3] = $4 }
# A cell: the value, "—" where the device cannot run the test, "missing"
# where the guest printed nothing (it stopped before).
function cell(key) {
    if (!(key in v)) return "missing"
    if (v[key] == "n/a") return "—"
    return v[key]
}
END {
    n = split("xiw-kernel xiw-kernel-crc xiw-standalone siw rxe", dev, " ")
    split("xiw kernel mode (no CRC)|xiw kernel mode (CRC)|xiw standalone (no CRC)|siw (no CRC)|rxe", head, "|")
    nt = split("ib_write_lat_2 ib_send_lat_2 ib_read_lat_2 ib_write_bw_65536 ib_write_bw_1048576 ib_write_bw_q4_bidir_65536 qperf_rc_lat_2 qperf_rc_rdma_write_lat_2 qperf_rc_rdma_write_lat_65536 qperf_rc_bw_65536", test, " ")
    split("ib_write_lat 2 B, µs|ib_send_lat 2 B, µs|ib_read_lat 2 B, µs|ib_write_bw 64 KiB, MiB/s|ib_write_bw 1 MiB, MiB/s|ib_write_bw -q 4 -b 64 KiB (sum), MiB/s|qperf rc_lat 2 B, µs|qperf rc_rdma_write_lat 2 B, µs|qperf rc_rdma_write_lat 64 KiB, µs|qperf rc_bw 64 KiB, MiB/s", name, "|")
    split("lat-spin_2|lat-spin_2|lat-spin_2|bw_65536|bw_1048576||lat-spin_2|lat-spin_2|lat-spin_65536|bw_65536", fl, "|")
    split("lat-block_2|lat-block_2|lat-block_2||||lat-block_2|lat-block_2|lat-block_65536|", fb, "|")
    printf "| |"; for (d = 1; d <= n; d++) printf " %s |", head[d]; print " TCP floor (spin / block) |"
    printf "|---|"; for (d = 1; d <= n; d++) printf "---:|"; print "---:|"
    for (t = 1; t <= nt; t++) {
        printf "| %s |", name[t]
        for (d = 1; d <= n; d++) printf " %s |", cell(dev[d] " " test[t])
        f = "—"
        if (fl[t] != "") f = cell("tcp " fl[t])
        if (fb[t] != "") f = f " / " cell("tcp " fb[t])
        print " " f " |"
    }
}'
}
table
echo
echo "Every round (device, test, one value a round):"
grep '^ROUNDS ' <<<"$console" | cut -d' ' -f2-
[[ -n $out ]] || exit $rc
mkdir -p "$out"
table >"$out/guest-bench.md"
{
    grep '^BENCH ' <<<"$console"
    host_note
} >"$work/lines"
"$bin/xiw-bench" --from-bench "$work/lines" --json "$out/guest-bench.json" \
    --tool "tests/vm/bench.sh" \
    --title "xiw kernel mode beside siw, rxe and TCP in a qemu guest, one boot"
"$bin/xiw-bench" --bars "$out/guest-bench.json" --out "$out" --prefix guest-bench
exit $rc
