#!/usr/bin/env bash
# The xiw demo for a fresh Debian 12 machine (as root): installs the missing
# packages it needs (XIW_DEMO_PKGS in pkg/deps.sh), builds the provider and
# the `xiw` command (nothing is installed system-wide), brings up an xiw
# device on `lo` in standalone mode (in its own tree, /run/xiw/demo), runs
# perftest's RDMA Write latency test between two processes over it through
# `xiw exec` (so it works on any kernel, with or without ib_core), prints the
# result table and takes the device down again. Exits non-zero on any error.
#
# Arguments go to ib_write_lat on both sides (default: -a -n 200, every size
# from 2 B to 8 MiB), e.g.:  bash pkg/demo.sh -s 64 -n 10000
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
root=/run/xiw/demo
args=("$@")
((${#args[@]})) || args=(-a -n 200)

if [[ $EUID -ne 0 ]]; then
    echo "$0: must be run as root (it installs packages and makes a device)" >&2
    exit 1
fi

# shellcheck source=deps.sh
source "$repo/pkg/deps.sh"
xiw_ensure_packages "${XIW_DEMO_PKGS[@]}"
xiw_ensure_cargo

echo "== building xiw (cargo build --release -p xiw)" >&2
cargo build --release -p xiw
target=${CARGO_TARGET_DIR:-$repo/target}
[[ $target == /* ]] || target=$repo/$target
xiw=$target/release/xiw
provider=$target/release/libxiw.so
for f in "$xiw" "$provider"; do
    if [[ ! -f $f ]]; then
        echo "$0: the build left no $f" >&2
        exit 1
    fi
done

work=$(mktemp -d /tmp/xiw-demo.XXXXXX)
server_pid=
cleanup() {
    local rc=$?
    if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [[ -e $root ]]; then
        "$xiw" down --root "$root" >&2 || rc=1
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== bringing up xiw0 on lo (tree $root)" >&2
# Its one line for a shell (export SYSFS_PATH=..., printed where root makes
# the nodes) is not needed: every program runs through `xiw exec`. A failure
# here stops the script (set -e).
"$xiw" up --netdev lo --root "$root" --provider "$provider" >&2
"$xiw" exec --root "$root" -- ibv_devinfo -d xiw0

# A free TCP port for perftest's out-of-band exchange, below the ephemeral range.
port_in_use() { ss -Htln "sport = :$1" | grep . >/dev/null; }
port=$((10000 + RANDOM % 20000))
while port_in_use "$port"; do port=$((10000 + RANDOM % 20000)); done

echo "== ib_write_lat ${args[*]} (server and client on 127.0.0.1, port $port)" >&2
timeout 600 "$xiw" exec --root "$root" -- ib_write_lat -d xiw0 -p "$port" "${args[@]}" \
    >"$work/server.out" 2>"$work/server.err" &
server_pid=$!
for _ in $(seq 1 500); do
    port_in_use "$port" && break
    if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
    sleep 0.02
done
if ! port_in_use "$port"; then
    echo "$0: the ib_write_lat server did not start:" >&2
    cat "$work/server.out" "$work/server.err" >&2
    exit 1
fi

client_rc=0
timeout 600 "$xiw" exec --root "$root" -- ib_write_lat -d xiw0 -p "$port" "${args[@]}" 127.0.0.1 \
    >"$work/client.out" 2>"$work/client.err" || client_rc=$?
server_rc=0
wait "$server_pid" || server_rc=$?
server_pid=

cat "$work/client.out"
if ((client_rc != 0 || server_rc != 0)); then
    echo "$0: ib_write_lat failed (client exit $client_rc, server exit $server_rc)" >&2
    echo "--- client stderr:" >&2
    cat "$work/client.err" >&2
    echo "--- server output:" >&2
    cat "$work/server.out" "$work/server.err" >&2
    exit 1
fi
if ! grep -qE '^ [0-9]+ +[0-9]+ +[0-9.]+' "$work/client.out"; then
    echo "$0: ib_write_lat printed no result rows" >&2
    exit 1
fi
echo "== done; taking xiw0 down" >&2
