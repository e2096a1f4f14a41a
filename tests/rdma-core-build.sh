#!/usr/bin/env bash
# Builds libibverbs of an rdma-core release from a source tree that a package
# registry carries, or takes a build of it that a registry carries, once, for
# running xiw under it (tests/rdma-core.sh --built VERSION). Prints the
# directory, which holds
#   build/lib/libibverbs.so.1.*   the library (real file name, soname link),
#                                 and libmlx5 and libefa of the same release
#   prefix/                       for a build from source, what the library
#                                 has compiled in: its provider directory
#                                 (prefix/lib/libibverbs) and configuration
#                                 directory (prefix/etc/libibverbs.d), both
#                                 empty here (a build taken whole keeps its
#                                 own: /etc/libibverbs.d, where this host's
#                                 providers are)
#   build/python/pyverbs/         with --pyverbs, for a build from source,
#                                 that release's pyverbs, built by Debian
#                                 12's cython3 and Python 3.11 against the
#                                 same libibverbs (its test suite is
#                                 src/tests/)
#
# usage: tests/rdma-core-build.sh VERSION [--pyverbs]
#
# The releases, and where they come from (each archive checked by its
# SHA-256; the trees are rdma-core's own, vendored whole):
#   39.0  PyPI, amd-mori 1.1.1: Ubuntu 22.04's build, in the wheel (with its
#         libnl), taken whole; no registry carries 39's source
#   48.0  PyPI, pyverbs 56.0rc1: a RHEL 8 build, in the wheel, likewise
#   52.0  crates.io, ibverbs-sys 0.2.1+52.0 (vendor/rdma-core)
#   55.0  crates.io, ibverbs-sys 0.3.2+55.0 (vendor/rdma-core)
#   57.0  PyPI, pyverbs 57.0 (its sdist carries rdma-core)
#   59.0  PyPI, pyverbs 59.0
# Kept under $XIW_RDMA_CORE_CACHE (default /var/cache/xiw-rdma-core/VERSION);
# a tree built from another archive is built afresh, and one built without
# pyverbs when pyverbs is asked for. pyverbs takes about 90 s of CPU beside
# the 40 s of the libraries; the wheels carry none of their release. Needs
# curl, cmake, ninja-build, gcc, python3, and for pyverbs cython3 and
# python3-dev; the man pages and the providers' netlink neighbour resolution
# are not built, nor any program.
set -euo pipefail

version=${1:?usage: tests/rdma-core-build.sh VERSION (39.0, 48.0, 52.0, 55.0, 57.0, 59.0) [--pyverbs]}
pyverbs=0
case ${2:-} in
--pyverbs) pyverbs=1 ;;
'') ;;
*) echo "rdma-core-build.sh: unknown argument ${2}" >&2; exit 2 ;;
esac
pypi=https://files.pythonhosted.org/packages
# A wheel's libraries directory, for a build taken whole.
wheel_libs=
case $version in
39.0)
    url=$pypi/bc/6c/d5e5434352ee68b93ffe52a86191983d4eb1c13925627c83808cb1471c91/amd_mori-1.1.1-cp310-cp310-manylinux_2_35_x86_64.whl
    sha=bedc395a01af4cbe9f627b63e9db8fcfa5fcf81a7792aed1f27e509c7f70cf7d
    wheel_libs=amd_mori.libs
    ;;
48.0)
    url=$pypi/7c/a0/83ce38420d749bbbc372d80174a7b7b736bcb8833b5029444826dad76aa8/pyverbs-56.0rc1-cp310-cp310-manylinux_2_28_x86_64.whl
    sha=6493b24e0b7b293edcf0cd1a9434fbcb3d83d5ef8ff39065e72eeccd60c8adf8
    wheel_libs=pyverbs.libs
    ;;
52.0)
    url=https://static.crates.io/crates/ibverbs-sys/ibverbs-sys-0.2.1+52.0.crate
    sha=704dccee9359a00ec543bfcdfcc4ad963ed130d22ce6f94a315cb36c0fabe160
    top=ibverbs-sys-0.2.1+52.0/vendor/rdma-core
    ;;
55.0)
    url=https://static.crates.io/crates/ibverbs-sys/ibverbs-sys-0.3.2+55.0.crate
    sha=8149ab8d940ea7e7073a24ba6e3ec6b0cc8ceab6ea3d562d60a21ca5cc23413a
    top=ibverbs-sys-0.3.2+55.0/vendor/rdma-core
    ;;
57.0)
    url=$pypi/20/71/c613d7a217002d046ad3964a7034a610b5bfd1ab6b75d5a0e140154bcc74/pyverbs-57.0.tar.gz
    sha=6d3a452bf14b8c56dec9281d64101573a7574bc879471bf0d3521168755ca9fe
    top=pyverbs-57.0/rdma-core
    ;;
59.0)
    url=$pypi/98/f5/c7f7425c53b313492f35cea6785fefe5d9b98040ce94a66a6f6354fc91ab/pyverbs-59.0.tar.gz
    sha=b30d56bb620b3d3b4301876f9a04c964be1c76cc6553a451e1465f1c6ac9f20e
    top=pyverbs-59.0/rdma-core
    ;;
*)
    echo "rdma-core-build.sh: no source known for rdma-core $version (known: 39.0, 48.0, 52.0, 55.0, 57.0, 59.0)" >&2
    exit 2
    ;;
esac
# amd-mori's wheel carries libibverbs alone; pyverbs' wheel carries the
# pyverbs of 56.0rc1 (not 48.0's), built for Python 3.10; neither carries a
# test suite.
if [[ -n $wheel_libs ]] && ((pyverbs)); then
    echo "rdma-core-build.sh: the wheel of rdma-core $version carries no pyverbs and test suite of that release" >&2
    exit 1
fi

dir=${XIW_RDMA_CORE_CACHE:-/var/cache/xiw-rdma-core}/$version
# What a finished directory was made from (the archive and this recipe's
# revision, and whether it has pyverbs): anything else is made afresh. One
# with pyverbs serves a caller that does not ask for it.
made="$sha recipe 2"
with_pyverbs="$made, pyverbs"
if [[ -f $dir/.complete ]]; then
    had=$(cat "$dir/.complete")
    if [[ $had == "$with_pyverbs" || ($had == "$made" && $pyverbs == 0) ]]; then
        echo "$dir"
        exit 0
    fi
fi
rm -rf "$dir"
mkdir -p "$dir/unpacked"
echo "rdma-core-build.sh: rdma-core $version from $url" >&2
curl -fsSL --retry 3 -o "$dir/archive" "$url"
if ! echo "$sha  $dir/archive" | sha256sum -c --quiet >&2; then
    echo "rdma-core-build.sh: $url is not the archive expected (SHA-256 $sha)" >&2
    exit 1
fi

if [[ -n $wheel_libs ]]; then
    # The wheel's tool renamed the libraries (libibverbs-<hash>.so.1.14.R.M)
    # and names them so in their dependencies: the library is laid out under
    # its own name beside the libnl it needs, found by LD_LIBRARY_PATH.
    python3 -m zipfile -e "$dir/archive" "$dir/unpacked" >&2
    mkdir -p "$dir/build/lib"
    from=("$dir/unpacked/$wheel_libs"/libibverbs-*.so.1.*)
    [[ -f ${from[0]} ]] || { echo "rdma-core-build.sh: no libibverbs in $url" >&2; exit 1; }
    name=libibverbs.so.1.${from[0]##*.so.1.}
    cp "${from[0]}" "$dir/build/lib/$name"
    cp "$dir/unpacked/$wheel_libs"/libnl-* "$dir/build/lib/"
    ln -s "$name" "$dir/build/lib/libibverbs.so.1"
    rm -rf "$dir/unpacked" "$dir/archive"
    if [[ $name != "libibverbs.so.1.14.$version" ]]; then
        echo "rdma-core-build.sh: the wheel carries $name, not rdma-core $version" >&2
        exit 1
    fi
    echo "$made" >"$dir/.complete"
    echo "$dir"
    exit 0
fi

tar -xzf "$dir/archive" -C "$dir/unpacked" "$top"
mv "$dir/unpacked/$top" "$dir/src"
rm -rf "$dir/unpacked" "$dir/archive"
got=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$dir/src/CMakeLists.txt")
if [[ $got != "$version" ]]; then
    echo "rdma-core-build.sh: the tree is rdma-core '$got', not $version" >&2
    exit 1
fi

# The compiled-in directories point into prefix/, which holds nothing but
# what a test puts there: no other provider is ever loaded.
# With pyverbs: Debian's own Python (not another python3 earlier on PATH),
# whose cython3 the build runs. Its modules are compiled without
# optimisation, which takes a fifth of the time -O3 takes (the Cython
# output is large, and what the tests measure is the provider): the tree
# puts CMAKE_C_FLAGS before its -O3 for its libraries and again after it
# for pyverbs' modules, so the -O0 given here is the last word for pyverbs
# alone.
pyverbs_flags=(-DNO_PYVERBS=1)
if ((pyverbs)); then
    pyverbs_flags=(-DNO_PYVERBS=0 -DPYTHON_EXECUTABLE=/usr/bin/python3 -DCMAKE_C_FLAGS=-O0)
fi
cmake -S "$dir/src" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$dir/prefix" -DCMAKE_INSTALL_SYSCONFDIR="$dir/prefix/etc" \
    -DNO_MAN_PAGES=1 -DENABLE_RESOLVE_NEIGH=0 -DENABLE_STATIC=0 "${pyverbs_flags[@]}" >&2
# perftest links mlx5's and efa's direct-verbs libraries, which link the
# private ABI of their own release: built from the same tree, so that a
# tool loads one release throughout.
ninja -C "$dir/build" ibverbs mlx5 efa >&2
# pyverbs (its mlx5 and efa modules too: the suite imports them whatever the
# device), and librdmacm, which it links.
if ((pyverbs)); then
    if ! grep -q '^build pyverbs/all:' "$dir/build/build.ninja"; then
        echo "rdma-core-build.sh: rdma-core $version's build has no pyverbs (cython3 and python3-dev installed?)" >&2
        exit 1
    fi
    ninja -C "$dir/build" pyverbs/all >&2
    made=$with_pyverbs
fi
mkdir -p "$dir/prefix/lib/libibverbs" "$dir/prefix/etc/libibverbs.d"
echo "$made" >"$dir/.complete"
echo "$dir"
