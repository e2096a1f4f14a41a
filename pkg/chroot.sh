#!/usr/bin/env bash
# Makes, once, a Debian chroot of another release with that release's
# rdma-core, perftest and rdma-core's tools, for running xiw against its
# libibverbs (tests/rdma-core.sh). Prints the chroot's path. Must run as root.
#
#   bash pkg/chroot.sh trixie          # Debian 13, rdma-core 56.1
#   bash pkg/chroot.sh --base bookworm # a bare minbase system, nothing added:
#                                      # what the package tests start from
#
# The chroot lives under $XIW_CHROOTS (default /var/lib/xiw/chroots) and is
# made by mmdebstrap (debootstrap where it is missing; mmdebstrap takes half
# the time) from Debian's archive (the default mirror); a chroot that was made
# completely is kept and reused.
set -euo pipefail

bare=0
if [[ ${1:-} == --base ]]; then
    bare=1
    shift
fi
suite=${1:?usage: pkg/chroot.sh [--base] SUITE (e.g. trixie)}
base=${XIW_CHROOTS:-/var/lib/xiw/chroots}
root=$base/$suite
((bare)) && root=$base/$suite-base

if [[ $EUID -ne 0 ]]; then
    echo "$0: must be run as root (debootstrap)" >&2
    exit 1
fi
if [[ -f $root/.xiw-ready ]]; then
    echo "$root"
    exit 0
fi
if ! command -v mmdebstrap >/dev/null 2>&1 && ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends mmdebstrap >&2
fi
# bootstrap [PACKAGE,...]: a minbase system of $suite in $root. mmdebstrap
# stops at any error of the archive's indices (unstable has them for hours
# at a time); debootstrap, which reads them more leniently, then tries.
bootstrap() {
    if command -v mmdebstrap >/dev/null 2>&1; then
        if mmdebstrap --quiet --mode=root --variant=minbase ${1:+--include="$1"} "$suite" "$root" >&2; then
            return 0
        fi
        command -v debootstrap >/dev/null 2>&1 || return 1
        echo "xiw: mmdebstrap failed; trying debootstrap" >&2
        rm -rf "$root"
    fi
    debootstrap --variant=minbase ${1:+--include="$1"} "$suite" "$root" >&2
}
rm -rf "$root"
mkdir -p "$base"
if ((bare)); then
    echo "xiw: making a bare $suite chroot in $root" >&2
    bootstrap
else
    pkgs=libibverbs1,ibverbs-utils,perftest,rdma-core,iproute2,procps,python3-pyverbs
    echo "xiw: making a $suite chroot in $root ($pkgs)" >&2
    bootstrap "$pkgs"
fi
touch "$root/.xiw-ready"
echo "$root"
