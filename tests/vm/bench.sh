#!/usr/bin/env bash
# Kernel mode's benchmark: one guest boot (tests/vm/guest/bench.sh), every
# device side by side on the same TCP path, printed as a table: xiw in kernel
# mode (its default MPA CRC, and without), xiw in standalone mode, Linux's
# siw (its default: no CRC) and rxe; perftest's typical latency for 2-byte
# RDMA Write, Send and RDMA Read (µs) and RDMA Write bandwidth for 64 KiB and
# 1 MiB messages (MB/s); and the floor, plain TCP between two processes
# (xiw-bench's ping-pong, spinning and blocking, and stream).
#
# usage: tests/vm/bench.sh   (after pkg/install.sh and cargo build --release)
# Environment: XIW_BENCH_ITERS (latency iterations, default 2000), and
# run.sh's.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$repo/target/release
for b in xiw xiw-bench; do
    [[ -x $bin/$b ]] || { echo "bench.sh: build first: cargo build --release ($b)" >&2; exit 1; }
done
out=$(XIW_VM_TIMEOUT=${XIW_VM_TIMEOUT:-2400} bash "$repo/tests/vm/run.sh" \
    "$repo/tests/vm/guest/bench.sh" "$bin/xiw" "$bin/xiw-bench")
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
