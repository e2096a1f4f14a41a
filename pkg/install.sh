#!/usr/bin/env bash
# Installs a built xiw (`cargo build --release` first, as any user): the
# libibverbs provider under every private-ABI file name it serves, its driver
# file, the `xiw` tool, the man pages, and the direct verbs for C programs
# (header, pkg-config file, link-time symlinks, man pages). It never builds.
# With --uninstall it removes exactly those files again (give the same
# options). On Debian and Ubuntu the packages (pkg/debs.sh) are the better
# way; their build uses this script with --destdir.
#
#   bash pkg/install.sh [--prefix DIR] [--libdir DIR] [--sysconfdir DIR]
#                       [--destdir DIR] [--target DIR] [--uninstall]
#
#   --prefix DIR      where the files go (default /usr/local)
#   --libdir DIR      the library directory (default: libibverbs' own, with
#                     its /usr replaced by the prefix: /usr/local/lib/x86_64-linux-gnu)
#   --sysconfdir DIR  libibverbs' configuration directory's parent (default /etc:
#                     libibverbs reads /etc/libibverbs.d whatever the prefix)
#   --destdir DIR     stage the files under DIR (packaging); nothing outside it
#                     is touched and ldconfig is not run
#   --target DIR      cargo's target directory (default: $CARGO_TARGET_DIR, else
#                     target/ of this repository)
#
# libibverbs loads providers from its own directory by short name; a provider
# installed elsewhere is named in the driver file by its absolute path, which
# libibverbs accepts as well.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
    sed -n '10,20s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit "${1:-2}"
}

mode=install
prefix=/usr/local
libdir=
sysconfdir=/etc
destdir=
target=${CARGO_TARGET_DIR:-$repo/target}
while (($#)); do
    case $1 in
    --prefix | --libdir | --sysconfdir | --destdir | --target)
        (($# >= 2)) && [[ -n $2 ]] || {
            echo "$0: $1 needs a directory" >&2
            usage
        }
        case $1 in
        --prefix) prefix=$2 ;;
        --libdir) libdir=$2 ;;
        --sysconfdir) sysconfdir=$2 ;;
        --destdir) destdir=$2 ;;
        --target) target=$2 ;;
        esac
        shift 2
        ;;
    --uninstall)
        mode=uninstall
        shift
        ;;
    -h | --help) usage 0 ;;
    *)
        echo "$0: unknown argument '$1'" >&2
        usage
        ;;
    esac
done
for d in "$prefix" "$sysconfdir"; do
    [[ $d == /* ]] || {
        echo "$0: '$d' is not an absolute path" >&2
        exit 2
    }
done
prefix=${prefix%/}
[[ -n $prefix ]] || prefix=/
[[ $target == /* ]] || target=$PWD/$target
[[ -z $destdir || $destdir == /* ]] || destdir=$PWD/$destdir

# libibverbs' own library directory: providers there are found by short name.
ibv_libdir=
if command -v pkg-config >/dev/null 2>&1; then
    ibv_libdir=$(pkg-config --variable=libdir libibverbs 2>/dev/null || true)
fi
if [[ -z $ibv_libdir ]]; then
    if multiarch=$(gcc -print-multiarch 2>/dev/null) && [[ -n $multiarch ]]; then
        ibv_libdir=/usr/lib/$multiarch
    elif [[ -d /usr/lib64 ]]; then
        ibv_libdir=/usr/lib64
    else
        ibv_libdir=/usr/lib
    fi
fi
if [[ -z $libdir ]]; then
    case $ibv_libdir in
    /usr/*) libdir=${prefix%/}/${ibv_libdir#/usr/} ;;
    *) libdir=${prefix%/}/lib ;;
    esac
fi
[[ $libdir == /* ]] || {
    echo "$0: --libdir '$libdir' is not an absolute path" >&2
    exit 2
}
includedir=${prefix%/}/include
mandir=${prefix%/}/share/man
bindir=${prefix%/}/bin
provider_dir=$libdir/libibverbs

# The file name libibverbs looks for: lib<driver>-rdmav<private ABI>.so. It is
# also the library's soname. Later releases load providers by their own
# private ABI number (57 for rdma-core 57-58, 59 for 59-63, 64, 65): the same
# library serves each (it finds the release it runs under when it loads).
soname=libxiw-rdmav34.so
abi_links=()
for abi in 57 59 64 65; do
    abi_links+=("libxiw-rdmav$abi.so")
done
if [[ $provider_dir == "$ibv_libdir/libibverbs" ]]; then
    driver_line="driver xiw"
else
    driver_line="driver $provider_dir/libxiw"
fi
driver_file=$sysconfdir/libibverbs.d/xiw.driver

# Direct verbs. A program linked with -lxiw (through libxiw.so) records the
# soname, which the loader finds in libdir; both names are symlinks to the
# provider itself, so when libibverbs later dlopens the provider glibc sees the
# same file and hands back the copy already loaded: one provider instance.
link_target=libibverbs/$soname
# One man page name per function of xiwdv.h, each a symlink to xiwdv.3.
man_aliases=(xiwdv_reg_mr xiwdv_last_error xiwdv_is_xiw xiwdv_query_device
    xiwdv_wr_flush xiwdv_wr_verify xiwdv_wr_atomic_masked_fetch_add
    xiwdv_wr_atomic_masked_cmp_swp xiwdv_wr_atomic_swap)

# Every file and symlink, as "KIND DEST [SOURCE-or-LINK-TARGET]":
# f (file, mode 0644), x (file, 0755), l (symlink), g (generated file).
manifest=()
manifest+=("f $provider_dir/$soname $target/release/libxiw.so")
for a in "${abi_links[@]}"; do manifest+=("l $provider_dir/$a $soname"); done
manifest+=("g $driver_file driver")
manifest+=("x $bindir/xiw $target/release/xiw")
for m in xiw.7 xiw.8; do
    manifest+=("f $mandir/man${m##*.}/$m $repo/docs/man/$m")
done
manifest+=("l $libdir/$soname $link_target")
manifest+=("l $libdir/libxiw.so $link_target")
manifest+=("f $includedir/infiniband/xiwdv.h $repo/xiwdv/include/infiniband/xiwdv.h")
manifest+=("g $libdir/pkgconfig/xiwdv.pc pc")
manifest+=("f $mandir/man3/xiwdv.3 $repo/xiwdv/man/xiwdv.3")
manifest+=("f $mandir/man7/xiwdv.7 $repo/xiwdv/man/xiwdv.7")
for a in "${man_aliases[@]}"; do manifest+=("l $mandir/man3/$a.3 xiwdv.3"); done

say() { echo "$*" >&2; }

if [[ $mode == uninstall ]]; then
    if [[ -z $destdir && $EUID -ne 0 && ! -w $libdir ]]; then
        echo "$0: $libdir is not writable: run as root" >&2
        exit 1
    fi
    for entry in "${manifest[@]}"; do
        read -r kind dst src <<<"$entry"
        path=$destdir$dst
        if [[ $kind == l ]]; then
            if [[ -L $path && $(readlink -- "$path") == "$src" ]]; then
                rm -f -- "$path"
                say "removed $path"
            elif [[ -e $path || -L $path ]]; then
                say "left $path alone: not the symlink to $src this script installs"
            fi
        elif [[ -e $path || -L $path ]]; then
            rm -f -- "$path"
            say "removed $path"
        fi
    done
    if [[ -z $destdir ]] && command -v ldconfig >/dev/null 2>&1; then
        ldconfig
    fi
    if [[ -d /run/xiw ]]; then
        say "note: xiw devices are still set up under /run/xiw; take them down with" \
            "'xiw down' (the repository's build, now that $bindir/xiw is gone)"
    fi
    exit 0
fi

# Everything must be built: this script never builds.
for f in "$target/release/libxiw.so" "$target/release/xiw"; do
    if [[ ! -f $f ]]; then
        echo "$0: $f is missing: build first (cargo build --release -p xiw), as your own user" >&2
        exit 1
    fi
done
if [[ -z $destdir && $EUID -ne 0 && ! -w $(dirname "$libdir") ]]; then
    echo "$0: cannot write to $libdir: run as root (or give --prefix and --destdir)" >&2
    exit 1
fi
# Programs linked with -lxiw find the provider by its soname.
if command -v readelf >/dev/null 2>&1; then
    built_soname=$(readelf -d "$target/release/libxiw.so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
    if [[ $built_soname != "$soname" ]]; then
        echo "$0: $target/release/libxiw.so has soname '$built_soname', expected '$soname'" >&2
        exit 1
    fi
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
echo "$driver_line" >"$tmp/driver"
sed -e "s|@LIBDIR@|$libdir|g" -e "s|@INCLUDEDIR@|$includedir|g" \
    -e "s|@VERSION@|${version:-0}|g" "$repo/xiwdv/xiwdv.pc.in" >"$tmp/pc"

for entry in "${manifest[@]}"; do
    read -r kind dst src <<<"$entry"
    path=$destdir$dst
    case $kind in
    # install(1) unlinks the destination before writing, so processes that
    # have the old library mapped keep running on their copy.
    f) install -D -m 0644 -- "$src" "$path" ;;
    x) install -D -m 0755 -- "$src" "$path" ;;
    g) install -D -m 0644 -- "$tmp/$src" "$path" ;;
    l)
        mkdir -p -- "$(dirname "$path")"
        ln -sfn -- "$src" "$path"
        ;;
    esac
    say "installed $path${src:+ ($src)}"
done
if [[ -z $destdir ]] && command -v ldconfig >/dev/null 2>&1; then
    ldconfig
fi
