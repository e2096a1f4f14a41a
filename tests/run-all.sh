#!/usr/bin/env bash
# Runs every xiw test: installs missing Debian packages, builds, makes xiw's
# Debian packages (pkg/debs.sh) and installs them on this host, then runs the
# unit tests and the whole-program tests (real libibverbs, rdma-core tools and
# perftest, the packages in clean chroots, the kernel module in a guest) one
# at a time, and prints a summary. Must run as root. Exits non-zero if
# anything fails.
#
# Extra arguments go to the test binaries (after `--`), e.g. a name filter:
#   bash tests/run-all.sh perftest
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [[ $EUID -ne 0 ]]; then
    echo "$0: must be run as root (it installs packages and the provider, and makes devices)" >&2
    exit 1
fi

# shellcheck source=../pkg/deps.sh
source "$repo/pkg/deps.sh"
xiw_ensure_packages
xiw_ensure_cargo

start=$(date +%s)
# phase TEXT: the step's heading, with the seconds since the start.
phase() { echo "== [$(($(date +%s) - start)) s] $*" >&2; }
# What comes from Debian's archive, made while the build runs (it is mostly
# waiting on the network), each made once and then kept: the chroots of
# Debian 13 (trixie) and unstable (sid) with their rdma-core
# (tests/tests/rdma_core.rs), the bare Debian 12 and 13 chroots the packages
# are tested in (tests/tests/packages.rs), and Debian's guest kernels
# (tests/vm/kernel.sh; a kernel not fetched here is fetched by its test).
fetch_log=$(mktemp /tmp/xiw-fetch.XXXXXX.log)
(
    set -e
    bash "$repo/pkg/chroot.sh" trixie >/dev/null
    # Unstable is at times not installable for a day or two (a transition
    # under way): the sid test then says so in the summary instead of failing
    # the run.
    bash "$repo/pkg/chroot.sh" sid >/dev/null || echo "xiw: no Debian unstable chroot today (see the sid test)"
    bash "$repo/pkg/chroot.sh" --base bookworm >/dev/null
    bash "$repo/pkg/chroot.sh" --base trixie >/dev/null
    for k in bookworm bookworm-backports trixie sid; do
        bash "$repo/tests/vm/kernel.sh" "$k" >/dev/null || echo "xiw: Debian's $k kernel was not fetched in advance"
    done
) >"$fetch_log" 2>&1 &
fetch_pid=$!
trap '[[ -z ${fetch_pid:-} ]] || kill -- "$fetch_pid" 2>/dev/null || true' EXIT

phase "style: cargo fmt --check, cargo clippy -D warnings"
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings

phase "build (release, all targets)"
cargo build --release --workspace --all-targets

phase "Debian packages (pkg/debs.sh), installed on this host"
bash "$repo/pkg/debs.sh" --no-build >/dev/null
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
# The tests run the installed xiw: one left in /usr/local by a from-source
# install (pkg/install.sh) would come first in PATH.
if [[ -e /usr/local/bin/xiw ]]; then
    echo "xiw: removing the from-source install in /usr/local first" >&2
    bash "$repo/pkg/install.sh" --uninstall >/dev/null 2>&1 || true
fi
# dpkg -i, not apt: it reinstalls a version already installed (every run
# packages the tree anew); the packages' dependencies are in pkg/deps.sh.
dpkg -i --force-confmiss "${CARGO_TARGET_DIR:-$repo/target}"/debian/{xiw,xiw-dbgsym,libxiwdv-dev}_"$version"_*.deb \
    "${CARGO_TARGET_DIR:-$repo/target}/debian/xiw-dkms_${version}_all.deb" >&2

# Debian 13's and unstable's rdma-core, for tests/tests/rdma_core.rs (made
# once, then kept).
# Lines a passing test has for the summary (tests/src/harness.rs, notice).
XIW_NOTICES=$(mktemp /tmp/xiw-notices.XXXXXX)
export XIW_NOTICES

phase "waiting for the chroots and guest kernels (log: $fetch_log)"
fetch_rc=0
wait "$fetch_pid" || fetch_rc=$?
fetch_pid=
cat "$fetch_log" >&2
if ((fetch_rc != 0)); then
    echo "xiw: making the Debian 13 chroots failed (above)" >&2
    exit "$fetch_rc"
fi

log=$(mktemp /tmp/xiw-tests.XXXXXX.log)
phase "test (log: $log)"
# One test at a time: the whole-program tests load both cores and must not
# disturb each other's measurements. --no-fail-fast: every binary runs.
status=0
cargo test --release --workspace --no-fail-fast -- --test-threads=1 "$@" 2>&1 | tee "$log" || status=$?

# The protocol engine's fuzz targets, a bounded time each (tests/fuzz.sh).
fuzzlog=$(mktemp /tmp/xiw-fuzz.XXXXXX.log)
if (($# == 0)); then
    phase "fuzz (log: $fuzzlog)"
    bash "$repo/tests/fuzz.sh" 2>&1 | tee "$fuzzlog" || status=$?
fi

# Summary: one line per test binary ("Running ..." then its "test result:").
echo
echo "==================== xiw test summary ===================="
awk '
    function flush() { if (name != "" && !done) printf "  %-46s %s\n", name, "NO RESULT (the test binary crashed or was killed?)" }
    /^ *Running / {
        flush()
        bin = $NF; gsub(/[()]/, "", bin); sub(/^.*\//, "", bin); sub(/-[0-9a-f]+$/, "", bin)
        name = ($2 == "unittests") ? "unit " $3 " (" bin ")" : $2
        done = 0
        next
    }
    /^ *Doc-tests / { flush(); name = "doc-tests " $2; done = 0; next }
    /^test result:/ {
        sub(/^test result: /, "")
        printf "  %-46s %s\n", name, $0
        done = 1
    }
    END { flush() }
' "$log"
grep -E '^fuzz ' "$fuzzlog" | sed 's/^/  /' || true
failed=$(grep -E '^test .* \.\.\. FAILED$' "$log" || true)
if [[ -n $failed ]]; then
    echo "  failed tests:"
    sed -e 's/^test /    /' -e 's/ \.\.\. FAILED$//' <<<"$failed"
fi
sed 's/^/  /' "$XIW_NOTICES"
echo "  total time: $(($(date +%s) - start)) s"
if ((status != 0)); then
    echo "RESULT: FAILED (cargo test exited with $status)"
    echo "=========================================================="
    exit "$status"
fi
echo "RESULT: all tests passed"
echo "=========================================================="
