#!/usr/bin/env bash
# Kernel mode's benchmark: one guest boot (tests/vm/guest/bench.sh), every
# device side by side on the same TCP path, printed as a table: xiw in kernel
# mode (its default MPA CRC, and without), xiw in standalone mode, Linux's
# siw (its default: no CRC) and rxe; perftest's typical latency for 2-byte
# RDMA Write, Send and RDMA Read (µs) and RDMA Write bandwidth for 64 KiB and
# 1 MiB messages (MB/s); and the floor, plain TCP between two processes
# (xiw-bench's ping-pong, spinning and blocking, and stream).
#
# With --sweep OUTDIR it sweeps every message size from 2 B to 8 MiB
# instead (xiw in kernel mode with its default CRC, siw, rxe, ib_write_lat -a
# and ib_write_bw -a, and the TCP floor), writes OUTDIR/guest-sweep.json and
# draws OUTDIR/guest-latency.svg and OUTDIR/guest-bandwidth.svg (a .png
# beside each) with xiw-bench --plot.
#
# usage: tests/vm/bench.sh [--sweep OUTDIR]
#        (after pkg/install.sh and cargo build --release)
# Environment: XIW_BENCH_ITERS (latency iterations, default 2000);
# with --sweep XIW_BENCH_SWEEP_LAT_ITERS and XIW_BENCH_SWEEP_BW_ITERS
# (iterations per size, default 60 each); and run.sh's (XIW_VM_PROVIDER
# defaults to target/release/libxiw.so, the build the programs come from).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$repo/target/release
sweep=
case ${1:-} in
--sweep) sweep=${2:?usage: tests/vm/bench.sh --sweep OUTDIR} ;;
"") ;;
*) echo "usage: tests/vm/bench.sh [--sweep OUTDIR]" >&2; exit 2 ;;
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
    for v in XIW_BENCH_ITERS XIW_BENCH_SWEEP_LAT_ITERS XIW_BENCH_SWEEP_BW_ITERS; do
        if [[ -n ${!v:-} ]]; then
            [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench.sh: $v is not a number" >&2; exit 2; }
            echo "$v=${!v}"
        fi
    done
    [[ -z $sweep ]] || echo "XIW_BENCH_SWEEP=1"
    cat "$repo/tests/vm/guest/bench.sh"
} >"$work/bench.sh"
out=$(XIW_VM_TIMEOUT=${XIW_VM_TIMEOUT:-2400} bash "$repo/tests/vm/run.sh" \
    "$work/bench.sh" "$bin/xiw" "$bin/xiw-bench")
if [[ -n $sweep ]]; then
    mkdir -p "$sweep"
    {
        grep '^BENCH ' <<<"$out"
        cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
        echo "BENCH info note guest: Debian's kernel under qemu-system-x86_64 TCG (emulated, no KVM), -smp 2 -m 2048, both processes of every pair in the guest; host: $(nproc) CPUs ($cpu), Linux $(uname -r)"
    } >"$work/lines"
    "$bin/xiw-bench" --from-bench "$work/lines" --json "$sweep/guest-sweep.json" \
        --title "xiw kernel mode beside siw, rxe and TCP in a qemu guest"
    "$bin/xiw-bench" --plot "$sweep/guest-sweep.json" --out "$sweep" --prefix guest
    exit 0
fi
grep '^BENCH ' <<<"$out" | awk '
{ v[$2 " " $3] = $4 }
END {
    n = split("xiw-kernel xiw-kernel-nocrc xiw-standalone siw rxe", dev, " ")
    split("xiw kernel mode (CRC)|xiw kernel mode (no CRC)|xiw standalone (CRC)|siw (no CRC)|rxe", head, "|")
    split("ib_write_lat_2 ib_send_lat_2 ib_read_lat_2 ib_write_bw_65536 ib_write_bw_1048576", test, " ")
    split("ib_write_lat 2 B, µs|ib_send_lat 2 B, µs|ib_read_lat 2 B, µs|ib_write_bw 64 KiB, MB/s|ib_write_bw 1 MiB, MB/s", name, "|")
    split("lat-spin_2|lat-spin_2|lat-spin_2|bw_65536|bw_1048576", fl, "|")
    split("lat-block_2|lat-block_2|lat-block_2||", fb, "|")
    printf "| |"; for (d = 1; d <= n; d++) printf " %s |", head[d]; print " TCP floor (spin / block) |"
    printf "|---|"; for (d = 1; d <= n; d++) printf "---:|"; print "---:|"
    for (t = 1; t <= 5; t++) {
        printf "| %s |", name[t]
        for (d = 1; d <= n; d++) printf " %s |", v[dev[d] " " test[t]]
        f = v["tcp " fl[t]]
        if (fb[t] != "") f = f " / " v["tcp " fb[t]]
        print " " f " |"
    }
}'
