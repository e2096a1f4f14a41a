# Guest: unmodified programs that reach the device through rdma_cm, each
# with its result checked: fio's rdma engine (RDMA Write, RDMA Read, and
# Send with every block's crc32c verified by the receiver), libfabric's
# fi_pingpong over the verbs provider (MSG endpoints, with its data checks at
# every size, and RDM endpoints through ofi_rxm), and an MPI ping-pong of two
# ranks with Open MPI 4.1 over libfabric (tests/c/xiw_mpi_pingpong.c, every
# byte checked). Both ends run in the guest, on dummy0. Prints "ok: ..." or
# "FAIL: ..." per check; exits with the number of failures.
# needs: /usr/bin/fio /usr/bin/fi_info /usr/bin/fi_pingpong
# needs: /usr/bin/mpirun /usr/bin/orterun /usr/bin/orted
# tree: /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi /etc/openmpi
. /lib.sh

check "rdma link add xiw0 type xiw netdev dummy0" "rdma link add xiw0 type xiw netdev dummy0"

# fio: the server is the job that reads (it waits for the connection), the
# client the one that writes, with the verb it names.
fio_pair() {
    pair "fio --name=srv --ioengine=rdma --port=$1 --rw=read $2" \
        "fio --name=cli --ioengine=rdma --hostname=10.77.0.1 --port=$1 --rw=write $3" $1 &&
        grep -q "err= 0" /tmp/server && grep -q "err= 0" /tmp/client
}
check "fio rdma, RDMA Write, 16 MiB in 64 KiB blocks" \
    "fio_pair 18901 '--bs=64k --size=16m --iodepth=4' '--verb=write --bs=64k --size=16m --iodepth=4' &&
     grep -q 'WRITE: .*io=16.0MiB' /tmp/client"
check "fio rdma, RDMA Read, 16 MiB in 64 KiB blocks" \
    "fio_pair 18902 '--bs=64k --size=16m --iodepth=4' '--verb=read --bs=64k --size=16m --iodepth=4' &&
     grep -q 'WRITE: .*io=16.0MiB' /tmp/client"
# iWARP has no receiver-not-ready retry: the server has a receive posted for
# every Send (64 blocks, 64 deep).
check "fio rdma, Send, 64 x 4 KiB, every block's crc32c verified by the receiver" \
    "fio_pair 18903 '--bs=4k --size=256k --iodepth=64 --verify=crc32c' '--verb=send --bs=4k --size=256k --iodepth=8 --verify=crc32c' &&
     grep -q 'READ: .*io=256KiB' /tmp/server"
check "fio's verify catches data that does not match (a Send without its headers)" \
    "! fio_pair 18904 '--bs=4k --size=256k --iodepth=64 --verify=crc32c' '--verb=send --bs=4k --size=256k --iodepth=8' &&
     grep -q 'verify: bad magic header\\|verify failed' /tmp/server"

# libfabric's verbs provider takes the devices of the interfaces named by
# FI_VERBS_IFACE.
export FI_VERBS_IFACE=dummy0
check "fi_info: xiw0 is a verbs domain, iWARP" \
    "fi_info -p verbs >/tmp/fi 2>&1; cat /tmp/fi; grep -q 'domain: xiw0' /tmp/fi && grep -q FI_PROTO_IWARP /tmp/fi"
check "fi_pingpong, verbs MSG endpoints, 1 KiB x 1000" \
    "pair 'fi_pingpong -p verbs -e msg -I 1000 -S 1024' 'fi_pingpong -p verbs -e msg -I 1000 -S 1024 10.77.0.1' &&
     grep -qE '^1k +1k +=1k' /tmp/client"
check "fi_pingpong, verbs MSG endpoints, every size to 6 MiB, data checked (-c)" \
    "pair 'fi_pingpong -p verbs -e msg -I 10 -S all -c' 'fi_pingpong -p verbs -e msg -I 10 -S all -c 10.77.0.1' &&
     grep -qE '^6m +10 +=10' /tmp/client"
check "fi_pingpong, RDM endpoints through verbs;ofi_rxm, 1 KiB x 200" \
    "pair 'fi_pingpong -p \"verbs;ofi_rxm\" -e rdm -I 200 -S 1024' 'fi_pingpong -p \"verbs;ofi_rxm\" -e rdm -I 200 -S 1024 10.77.0.1' &&
     grep -qE '^1k +200 +=200' /tmp/client"

# Open MPI 4.1 over libfabric (its ofi MTL on verbs;ofi_rxm): Debian builds
# its openib BTL without the rdmacm connection method that iWARP needs.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
check "Open MPI ping-pong, 2 ranks, 1 B to 1 MiB, every byte checked, on xiw0" \
    "timeout 300 mpirun -np 2 --mca plm isolated --mca pml cm --mca mtl ofi \
        --mca mtl_ofi_provider_include 'verbs;ofi_rxm' --mca mtl_base_verbose 10 \
        xiw_mpi_pingpong 20 >/tmp/mpi 2>&1; r=\$?; grep -v 'mca' /tmp/mpi;
     [ \$r -eq 0 ] && grep -q 'mtl:ofi:provider: xiw0' /tmp/mpi &&
     grep -q '1048576 bytes: .* 20 iterations checked' /tmp/mpi"

check "no rdma_cm connection left" "! rdma resource show cm_id 2>/dev/null | grep -q 'state CONNECT\|ESTABLISHED'"
check "rdma link delete xiw0" "rdma link delete xiw0"
check "rmmod" "rmmod xiw"
exit $fails
