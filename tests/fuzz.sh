#!/usr/bin/env bash
# Runs every fuzz target of the protocol engine (provider/engine/fuzz) for a
# bounded time and fails on any crash. cargo-fuzz needs nightly-only rustc
# flags, which a stable toolchain accepts with RUSTC_BOOTSTRAP=1.
#
#   bash tests/fuzz.sh            # 10 s per target (what the test command runs)
#   XIW_FUZZ_SECONDS=600 bash tests/fuzz.sh mpa_setup   # longer, one target
#
# The corpus grows in target/fuzz-corpus/<target> (seeded from
# provider/engine/fuzz/seeds); a crash leaves its input in
# provider/engine/fuzz/artifacts/<target>/.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${XIW_FUZZ_SECONDS:-10}
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cd "$repo/provider/engine"
targets=("$@")
if ((${#targets[@]} == 0)); then
    mapfile -t targets < <(cargo fuzz list)
fi
cargo fuzz build -O >/dev/null
failed=0
for t in "${targets[@]}"; do
    corpus="$repo/target/fuzz-corpus/$t"
    mkdir -p "$corpus"
    cp -n fuzz/seeds/"$t"/* "$corpus"/ 2>/dev/null || true
    log=$(mktemp /tmp/xiw-fuzz-"$t".XXXXXX.log)
    if cargo fuzz run -O "$t" "$corpus" -- -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        runs=$(grep -m1 -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
        echo "fuzz $t: ok, $runs executions in ${seconds}s, no crash"
    else
        echo "fuzz $t: FAILED (log: $log)"
        tail -40 "$log"
        failed=$((failed + 1))
    fi
done
echo "fuzz: $((${#targets[@]} - failed)) passed, $failed failed"
((failed == 0))
