# Guest: `xiw status` on a kernel with the RDMA core and the xiw module:
# it lists the module's devices (from RDMA netlink) and not siw's, beside a
# standalone tree's, and a device deleted is gone from the list. The JSON
# documents and what the kernel says itself (`rdma -j dev`, `rdma -j link`,
# /sys/class/infiniband_verbs, the nodes in /dev/infiniband) go to the
# console on lines of their own (XIW-...), for the host to compare; the
# script checks what it can without a JSON parser.
# Prints "ok: ..." or "FAIL: ..." per check; exits with the failures.
# siw
# modules: crc32c_generic libcrc32c
# needs: /usr/bin/ip
. /lib.sh
IP=/usr/bin/ip

$IP link add dummy1 type dummy
$IP addr add 10.78.0.1/24 dev dummy1
$IP link set dummy1 up
$IP link add dummy2 type dummy
$IP addr add 10.79.0.1/24 dev dummy2
$IP link set dummy2 up

# What the kernel says, for the host: the devices and links as the rdma
# tool lists them, each uverbs entry with its device and number, and each
# node in /dev/infiniband with its number.
facts() {
    echo "XIW-RDMA-DEV-$1 $(rdma -j dev show)"
    echo "XIW-RDMA-LINK-$1 $(rdma -j link show)"
    for d in /sys/class/infiniband_verbs/uverbs*; do
        [ -e "$d/ibdev" ] && echo "XIW-UVERBS-$1 $(basename "$d") $(cat "$d/ibdev") $(cat "$d/dev")"
    done
    for n in /dev/infiniband/*; do
        [ -c "$n" ] && echo "XIW-NODE-$1 $n $(stat -c '%t:%T' "$n")"
    done
}

# status TAG [ARGS]: xiw status -j ARGS, its document on an XIW-STATUS-TAG
# line, and the table for the record; true if both exit 0 and the document
# is one line.
status() {
    tag=$1
    shift
    xiw status -j "$@" >/tmp/status.json 2>/tmp/status.err
    r=$?
    cat /tmp/status.err
    echo "XIW-STATUS-$tag $(cat /tmp/status.json)"
    xiw status "$@"
    t=$?
    [ $r -eq 0 ] && [ $t -eq 0 ] && [ "$(wc -l </tmp/status.json)" -eq 1 ]
}

check "nothing yet: xiw status -j prints [] and exits 0, one line on stderr" \
    "xiw status -j >/tmp/j 2>/tmp/e; r=\$?; cat /tmp/j /tmp/e;
     [ \$r -eq 0 ] && [ \"\$(cat /tmp/j)\" = '[]' ] && [ \"\$(wc -l </tmp/e)\" -eq 1 ] &&
     grep -q '^xiw status: no xiw devices: ' /tmp/e"
check "nothing yet: the table is empty" "[ -z \"\$(xiw status 2>/dev/null)\" ]"

check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"
check "rdma link add xiw1 type xiw netdev dummy1" "rdma link add xiw1 type xiw netdev dummy1"
check "rdma link add siw0 type siw netdev dummy2" "rdma link add siw0 type siw netdev dummy2"
# A parameter changed from its default, to be seen in the listing.
echo Y >/sys/module/xiw/parameters/mpa_crc
echo "XIW-MODULE $(cat /sys/module/xiw/version) mpa_crc=$(cat /sys/module/xiw/parameters/mpa_crc)"
rdma link show
facts 1
check "two kernel devices: xiw status lists them" "status 1"
check "two kernel devices: the table has a kernel row for xiw0 and xiw1, none for siw0, and the module's line" \
    "xiw status >/tmp/t; grep -q '^xiw0 *kernel *dummy0 *ACTIVE ' /tmp/t &&
     grep -q '^xiw1 *kernel *dummy1 *ACTIVE ' /tmp/t && ! grep -q siw0 /tmp/t &&
     grep -q '^kernel module: xiw .*mpa_crc=Y' /tmp/t"

# A standalone tree at the default place (as root: /run/xiw/sysfs), beside.
check "xiw up --netdev lo (the default tree)" "xiw up --netdev lo 2>/tmp/up.err || { cat /tmp/up.err; false; }"
facts 2
check "kernel devices and the default tree: xiw status lists both kinds" "status 2"
check "kernel devices and the default tree: the table names the tree" \
    "xiw status | grep -qx 'standalone tree: SYSFS_PATH=/run/xiw/sysfs'"

check "rdma link delete xiw1" "rdma link delete xiw1"
facts 3
check "xiw1 deleted: xiw status lists the rest" "status 3"
check "xiw1 deleted: the table has no xiw1 row" "! xiw status | grep -q '^xiw1 '"

check "xiw down" "xiw down"
check "rdma link delete xiw0 and siw0" "rdma link delete xiw0 && rdma link delete siw0"
check "all gone: xiw status -j prints [] again" \
    "[ \"\$(xiw status -j 2>/dev/null)\" = '[]' ]"
exit $fails
