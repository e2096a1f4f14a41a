#!/usr/bin/env bash
# Builds xiw's Debian packages into target/debian/ (or --out DIR):
#   xiw            the provider (every private-ABI file name), its driver file,
#                  the xiw tool, xiw(7) and xiw(8); stripped
#   xiw-dbgsym     their debug symbols
#   libxiwdv-dev   xiwdv.h, xiwdv.pc, the link-time name, xiwdv(3) and xiwdv(7)
#   xiw-dkms       the module's source and dkms.conf
# Runs as any user: `cargo build --release` first (unless --no-build), then
# dpkg-buildpackage (debhelper, dh-dkms) on a staging tree made from
# pkg/debian/, which packages that build without compiling anything.
#
#   bash pkg/debs.sh [--out DIR] [--version VERSION] [--no-build]
#
#   --version VERSION  the packages' version (default: the workspace's, from
#                      Cargo.toml); the tests make an earlier one to upgrade from
#   --no-build         package what target/release holds
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
[[ $target == /* ]] || target=$repo/$target
out=$target/debian
version=
build=1
while (($#)); do
    case $1 in
    --out | --version)
        (($# >= 2)) && [[ -n $2 ]] || {
            echo "$0: $1 needs a value" >&2
            exit 2
        }
        [[ $1 == --out ]] && out=$2 || version=$2
        shift 2
        ;;
    --no-build)
        build=0
        shift
        ;;
    -h | --help)
        sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
        exit 0
        ;;
    *)
        echo "$0: unknown argument '$1'" >&2
        exit 2
        ;;
    esac
done
[[ $out == /* ]] || out=$PWD/$out
cargo_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
version=${version:-$cargo_version}
if ! [[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]]; then
    echo "$0: '$version' is not a version for a native Debian package" >&2
    exit 2
fi
for tool in dpkg-buildpackage dh dh_dkms; do
    command -v "$tool" >/dev/null || {
        echo "$0: $tool is missing (apt-get install dpkg-dev debhelper dh-dkms fakeroot)" >&2
        exit 1
    }
done

if ((build)); then
    command -v cargo >/dev/null || {
        echo "$0: cargo not found on PATH" >&2
        exit 1
    }
    echo "== cargo build --release -p xiw" >&2
    (cd "$repo" && cargo build --release -p xiw)
fi

stage=$out/build
src=$stage/xiw-$version
rm -rf "$stage"
mkdir -p "$src"
cp -a "$repo/pkg/debian" "$src/debian"
# The changelog carries the version; its date is the commit's, so that the
# same tree packages the same way.
date=$(git -C "$repo" log -1 --format=%aD 2>/dev/null || date -R)
cat >"$src/debian/changelog" <<EOF
xiw ($version) unstable; urgency=medium

  * xiw $version.

 -- The xiw developers <xiw@packages.invalid>  $date
EOF
# dh_dkms installs debian/xiw-dkms.dkms as the module source's dkms.conf.
sed "s/@VERSION@/$version/" "$repo/pkg/dkms.conf" >"$src/debian/xiw-dkms.dkms"

echo "== dpkg-buildpackage -b (xiw $version)" >&2
(cd "$src" && XIW_REPO=$repo XIW_TARGET=$target dpkg-buildpackage -b -uc -us --no-check-builddeps >&2) || {
    echo "$0: dpkg-buildpackage failed" >&2
    exit 1
}
mkdir -p "$out"
arch=$(dpkg --print-architecture)
debs=("xiw_${version}_$arch.deb" "xiw-dbgsym_${version}_$arch.deb"
    "libxiwdv-dev_${version}_$arch.deb" "xiw-dkms_${version}_all.deb")
for d in "${debs[@]}"; do
    [[ -f $stage/$d ]] || {
        echo "$0: dpkg-buildpackage made no $d" >&2
        exit 1
    }
    mv -f "$stage/$d" "$out/$d"
    echo "$out/$d"
done
rm -rf "$stage"
