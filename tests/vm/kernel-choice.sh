# Chooses, from what a Debian archive offers, one set of kernel packages that
# exist together: the image, its headers, their common headers, the kbuild
# tools and the source. Sourced by tests/vm/kernel.sh, and by the test of the
# choice itself (tests/tests/vm.rs), which feeds it recorded apt-cache output.
#
# The caller defines two functions that ask the archive:
#   apt_madison PKG        `apt-cache madison PKG`: "PKG | VERSION | SOURCE" lines
#   apt_depends PKG VER    the Depends field of PKG at version VER (one line)
#
# The rule, for each version linux-image-amd64 has (newest first), that is for
# each kernel ABI the archive's metapackage points to:
#   - the image and its headers at the metapackage's revision V (and, where
#     the image is itself a metapackage, the binary, modules and base
#     packages it names, at the revisions it names);
#   - the common headers at exactly V (the headers package asks for it so);
#   - the kbuild tools and the source at V if the archive still has V, or else
#     the newest revision of the same upstream version (V's "6.1.192" of
#     "6.1.192-2"): Debian republishes these two alone, and a rebuild of the
#     same upstream release does the same work.
# The first ABI for which every package exists is chosen. When none is,
# xiw_kernel_choose fails with one line naming what the newest ABI lacks.

# The versions of each package asked about, newest first (one a line).
declare -gA XIW_VERSIONS=()

# Asks the archive, once, which versions PKG has.
xiw_load() {
    [[ -n ${XIW_VERSIONS[$1]+set} ]] && return
    XIW_VERSIONS[$1]=$(apt_madison "$1" | awk -F'|' -v p="$1" '
        { n = $1; v = $2; gsub(/ /, "", n); gsub(/ /, "", v) }
        n == p && v != "" && !seen[v]++ { print v }' | xiw_sort_versions)
}

# The versions PKG has, newest first (after xiw_load PKG).
xiw_versions() {
    [[ -z ${XIW_VERSIONS[$1]} ]] || printf '%s\n' "${XIW_VERSIONS[$1]}"
}

# Sorts versions (one a line) newest first, by Debian's ordering.
xiw_sort_versions() {
    local -a vs=()
    local v i j t
    mapfile -t vs
    for ((i = 1; i < ${#vs[@]}; i++)); do
        t=${vs[i]}
        for ((j = i - 1; j >= 0; j--)); do
            dpkg --compare-versions "${vs[j]}" lt "$t" || break
            vs[j + 1]=${vs[j]}
        done
        vs[j + 1]=$t
    done
    ((${#vs[@]} == 0)) || printf '%s\n' "${vs[@]}"
}

# True if PKG has exactly version VER.
xiw_has() {
    xiw_load "$1"
    xiw_versions "$1" | grep -xF -- "$2" >/dev/null
}

# The version of PKG to take for revision VER: VER itself, or the newest
# revision of VER's upstream version. Prints nothing if neither exists.
xiw_same_upstream() {
    local pkg=$1 ver=$2 up v
    xiw_load "$pkg"
    if xiw_has "$pkg" "$ver"; then
        echo "$ver"
        return
    fi
    up=${ver%-*}
    while read -r v; do
        if [[ ${v%-*} == "$up" ]]; then
            echo "$v"
            return
        fi
    done < <(xiw_versions "$pkg")
}

# The packages (name and operator-less version, or name alone) a Depends
# field lists, one a line; of alternatives, the first.
xiw_dep_list() {
    tr ',' '\n' | sed -e 's/|.*//' -e 's/^ *//' -e 's/ *$//' -e 's/ *(\([<>=]*\) *\([^)]*\))/ \1 \2/' | grep -v '^$'
}

# Within xiw_kernel_choose, for the kernel at revision $ver: takes package
# NAME at $ver or at the newest revision of its upstream version (into
# `out`, with a note if not at $ver), or counts it as missing.
xiw_take_same_upstream() {
    local name=$1 pick
    xiw_load "$name"
    pick=$(xiw_same_upstream "$name" "$ver")
    if [[ -z $pick ]]; then
        missing+="${missing:+, }$name (${ver%-*}-*)"
    else
        out+=("pkg $name $pick")
        [[ $pick == "$ver" ]] || out+=("note $name $pick for $ver")
    fi
}

# xiw_kernel_choose: prints the chosen set, or fails (status 1) with one line
# on stderr. Output lines:
#   kver KVER                    the kernel's release (uname -r)
#   pkg NAME VERSION             a package to fetch (image, its binary and
#                                modules if apart, headers, common
#                                headers, kbuild, source)
#   note TEXT                    a package taken at another revision than V
#   compiler NAME                the compiler the headers ask for (gcc-N), if any
xiw_kernel_choose() {
    local first_missing= v image kver ver headers name op dver major missing
    local -a out
    while read -r v; do
        out=()
        missing=
        image=
        while read -r name op dver; do
            if [[ $name == linux-image-[0-9]* ]]; then
                image=$name
                ver=${dver:-$v}
                break
            fi
        done < <(apt_depends linux-image-amd64 "$v" | xiw_dep_list)
        if [[ -z $image ]]; then
            missing="an image in linux-image-amd64 $v's Depends"
        else
            kver=${image#linux-image-}
            headers=linux-headers-$kver
            out+=("kver $kver")
            for name in "$image" "$headers"; do
                if xiw_has "$name" "$ver"; then
                    out+=("pkg $name $ver")
                else
                    missing+="${missing:+, }$name (= $ver)"
                fi
            done
            # An image that is only a metapackage (unstable's, from 7.x on)
            # names the packages that hold the kernel, its modules and their
            # base files: each at exactly the revision it asks for.
            if [[ -z $missing ]]; then
                while read -r name op dver; do
                    case $name in
                    linux-binary-"$kver" | linux-modules-"$kver" | linux-base-"$kver")
                        if xiw_has "$name" "${dver:-$ver}"; then
                            out+=("pkg $name ${dver:-$ver}")
                        else
                            missing+="${missing:+, }$name (= ${dver:-$ver})"
                        fi
                        ;;
                    esac
                done < <(apt_depends "$image" "$ver" | xiw_dep_list)
            fi
            if [[ -z $missing ]]; then
                while read -r name op dver; do
                    case $name in
                    linux-headers-*-common)
                        if xiw_has "$name" "${dver:-$ver}"; then
                            out+=("pkg $name ${dver:-$ver}")
                        else
                            missing+="${missing:+, }$name (= ${dver:-$ver})"
                        fi
                        ;;
                    linux-kbuild-*) xiw_take_same_upstream "$name" ;;
                    gcc-[0-9]*) out+=("compiler $name") ;;
                    esac
                done < <(apt_depends "$headers" "$ver" | xiw_dep_list)
                major=$(awk -F. '{ print $1 "." $2 }' <<<"$kver")
                xiw_take_same_upstream "linux-source-$major"
            fi
        fi
        if [[ -z $missing ]]; then
            printf '%s\n' "${out[@]}"
            [[ -z $first_missing ]] || echo "note not the newest kernel: $first_missing"
            return 0
        fi
        [[ -n $first_missing ]] || first_missing="linux-image-amd64 $v needs $missing"
    done < <(xiw_load linux-image-amd64 && xiw_versions linux-image-amd64)
    if [[ -z $first_missing ]]; then
        echo "kernel.sh: the archive has no linux-image-amd64 (run apt-get update)" >&2
    else
        echo "kernel.sh: no kernel whose packages all exist: $first_missing, and no older one has all of its own" >&2
    fi
    return 1
}

# Run as a program, it chooses from recorded apt-cache output instead:
#   bash tests/vm/kernel-choice.sh --from DIR     DIR/madison.txt (madison lines of
#                                                 every package) and DIR/show.txt
#                                                 (apt-cache show stanzas)
#   bash tests/vm/kernel-choice.sh --record DIR   chooses from this host's apt and
#                                                 records what it asked into DIR
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -euo pipefail
    dir=${2:?usage: kernel-choice.sh --from DIR | --record DIR}
    case $1 in
    --from)
        apt_madison() { cat "$dir/madison.txt"; }
        apt_depends() {
            awk -v p="$1" -v v="$2" 'BEGIN { RS = ""; FS = "\n" }
                {
                    pk = ""; ve = ""; de = ""
                    for (i = 1; i <= NF; i++) {
                        if ($i ~ /^Package: /) pk = substr($i, 10)
                        if ($i ~ /^Version: /) ve = substr($i, 10)
                        if ($i ~ /^Depends: /) de = substr($i, 10)
                    }
                    if (pk == p && ve == v) { print de; exit }
                }' "$dir/show.txt"
        }
        ;;
    --record)
        mkdir -p "$dir"
        : >"$dir/madison.txt"
        : >"$dir/show.txt"
        apt_madison() { apt-cache madison "$1" 2>/dev/null | tee -a "$dir/madison.txt"; }
        apt_depends() {
            apt-cache show "$1=$2" 2>/dev/null | grep -E '^(Package|Version|Depends):' | tee -a "$dir/show.txt" |
                awk '/^Depends:/ { sub(/^Depends: */, ""); print; exit }'
            echo >>"$dir/show.txt"
        }
        ;;
    *)
        echo "usage: kernel-choice.sh --from DIR | --record DIR" >&2
        exit 2
        ;;
    esac
    xiw_kernel_choose
fi
