#!/usr/bin/env bash
# Makes, once, a Debian chroot of another release with that release's
# rdma-core, perftest and rdma-core's tools, for running xiw against its
# libibverbs (tests/rdma-core.sh). Prints the chroot's path. Must run as root.
#
#   bash pkg/chroot.sh trixie      # Debian 13, rdma-core 56.1
#
# The chroot lives under $XIW_CHROOTS (default /var/lib/xiw/chroots) and is
# made by debootstrap from Debian's archive (the default mirror); a chroot that
# was made completely is kept and reused.
set -euo pipefail

suite=${1:?usage: pkg/chroot.sh SUITE (e.g. trixie)}
base=${XIW_CHROOTS:-/var/lib/xiw/chroots}
root=$base/$suite

if [[ $EUID -ne 0 ]]; then
    echo "$0: must be run as root (debootstrap)" >&2
    exit 1
fi
if [[ -f $root/.xiw-ready ]]; then
    echo "$root"
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends debootstrap >&2
fi
rm -rf "$root"
mkdir -p "$base"
pkgs=libibverbs1,ibverbs-utils,perftest,rdma-core,iproute2,procps,python3-pyverbs
echo "xiw: making a $suite chroot in $root (debootstrap, $pkgs)" >&2
debootstrap --variant=minbase --include="$pkgs" "$suite" "$root" >&2
touch "$root/.xiw-ready"
echo "$root"
