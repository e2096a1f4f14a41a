/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * An operation a peer may not know, over rdma_cm: connects to SERVER:PORT,
 * posts OP (an RFC 7306 fetch-and-add, or the commit draft's Atomic Write)
 * and then a Send, and checks that the operation fails (a peer that does not
 * speak it answers with a Terminate, or resets the stream) and the Send
 * behind it is flushed, each within 5 seconds. Prints the completions it got.
 *
 * usage: xiw_cm_ext SERVER PORT fetch-add|atomic-write
 * exit: 0 as expected, 1 otherwise.
 */
#define _GNU_SOURCE
#include <netdb.h>
#include <rdma/rdma_cma.h>

#include "xiw_test.h"

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_conn_param param = { .initiator_depth = 1, .responder_resources = 1 };
	struct ibv_qp_init_attr_ex attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
				  IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	static uint64_t buf[2];
	struct rdma_cm_id *id;
	struct ibv_qp_ex *qpx;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	uint8_t value[8] = { 1 };
	int add, rc;

	if (argc != 4)
		die("usage: xiw_cm_ext SERVER PORT fetch-add|atomic-write");
	add = !strcmp(argv[3], "fetch-add");
	if (!add && strcmp(argv[3], "atomic-write"))
		die("unknown operation %s", argv[3]);
	rc = rdma_getaddrinfo(argv[1], argv[2], &hints, &ai);
	if (rc)
		die("rdma_getaddrinfo: %s", gai_strerror(rc));
	if (rdma_create_ep(&id, ai, NULL, NULL))
		die("rdma_create_ep: %s", strerror(errno));
	rdma_freeaddrinfo(ai);
	attr.pd = ibv_alloc_pd(id->verbs);
	cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	if (!attr.pd || !cq)
		die("PD or CQ: %s", strerror(errno));
	attr.send_cq = cq;
	attr.recv_cq = cq;
	if (rdma_create_qp_ex(id, &attr))
		die("rdma_create_qp_ex: %s", strerror(errno));
	mr = ibv_reg_mr(attr.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));
	if (rdma_connect(id, &param))
		die("rdma_connect: %s", strerror(errno));
	fprintf(stderr, "connected\n");

	qpx = ibv_qp_to_qp_ex(id->qp);
	ibv_wr_start(qpx);
	qpx->wr_id = 1;
	if (add) {
		ibv_wr_atomic_fetch_add(qpx, 0x1234, 0, 1);
		ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)buf, 8);
	} else {
		ibv_wr_atomic_write(qpx, 0x1234, 0, value);
	}
	qpx->wr_id = 2;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)&buf[1], 8);
	rc = ibv_wr_complete(qpx);
	if (rc)
		die("posting: %s", strerror(rc));

	wc = next_wc(cq, argv[3]);
	printf("wr %llu: %s\n", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	if (wc.wr_id != 1 || wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_WR_FLUSH_ERR)
		die("the %s did not fail first", argv[3]);
	wc = next_wc(cq, "the Send");
	printf("wr %llu: %s\n", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	if (wc.wr_id != 2 || wc.status != IBV_WC_WR_FLUSH_ERR)
		die("the Send behind it was not flushed");

	rdma_disconnect(id);
	rdma_destroy_qp(id);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(attr.pd);
	rdma_destroy_id(id);
	return 0;
}
