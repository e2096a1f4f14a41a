// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Parent and thread domains on xiw, through the real libibverbs.
 *
 *   xiw_domains
 *
 * A thread domain and a parent domain over a PD: the parent domain stands for
 * the PD wherever one goes (an MR, a QP, a CQ made with
 * IBV_CQ_INIT_ATTR_MASK_PD). QP A lives in the parent domain, QP B in the
 * plain PD; the two are connected to each other on the one device. A writes
 * to B and sends to it, B reads from A's MR (registered through the parent
 * domain) and receives into it: one protection domain. Also checks the
 * refusals: a thread domain with unknown attributes, a parent domain over a
 * parent domain, a CQ naming a plain PD as its parent domain, and freeing a
 * PD or thread domain a parent domain still uses, or a parent domain its
 * objects still use (EBUSY).
 *
 * The device is the first one libibverbs lists (or $XIW_DEVICE). Prints one
 * summary line on success; exits 1 with the reason on stderr otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "xiw_test.h"

#define LEN 4096

static void post(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, struct ibv_mr *mr,
		 size_t off, size_t len, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr + off, .length = len,
			       .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send (WR %" PRIu64 "): %s", id, strerror(errno));
}

static void *no_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
		      uint64_t resource_type)
{
	(void)pd, (void)pd_context, (void)size, (void)alignment, (void)resource_type;
	return IBV_ALLOCATOR_USE_DEFAULT;
}

static void no_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type)
{
	(void)pd, (void)pd_context, (void)ptr, (void)resource_type;
}

int main(void)
{
	struct ibv_context *ctx = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	union ibv_gid gid;
	int cookie = 0;

	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid: %s", strerror(errno));

	struct ibv_td_init_attr tda = { .comp_mask = 1 };

	errno = 0;
	if (ibv_alloc_td(ctx, &tda) || errno != EINVAL)
		die("ibv_alloc_td with unknown attributes: %s, expected EINVAL", strerror(errno));
	tda.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(ctx, &tda);

	if (!td)
		die("ibv_alloc_td: %s", strerror(errno));
	struct ibv_parent_domain_init_attr pda = {
		.pd = pd,
		.td = td,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.alloc = no_alloc,
		.free = no_free,
		.pd_context = &cookie,
	};
	struct ibv_pd *dom = ibv_alloc_parent_domain(ctx, &pda);

	if (!dom)
		die("ibv_alloc_parent_domain: %s", strerror(errno));
	struct ibv_parent_domain_init_attr nested = { .pd = dom };

	errno = 0;
	if (ibv_alloc_parent_domain(ctx, &nested) || errno != EINVAL)
		die("a parent domain over a parent domain: %s, expected EINVAL", strerror(errno));
	if (ibv_dealloc_pd(pd) != EBUSY)
		die("ibv_dealloc_pd of a PD a parent domain uses: expected EBUSY");
	if (ibv_dealloc_td(td) != EBUSY)
		die("ibv_dealloc_td of a thread domain a parent domain uses: expected EBUSY");

	struct ibv_cq_init_attr_ex cqa = {
		.cqe = 16,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
		.parent_domain = pd,
	};

	errno = 0;
	if (ibv_create_cq_ex(ctx, &cqa) || errno != EINVAL)
		die("a CQ naming a plain PD as its parent domain: %s, expected EINVAL",
		    strerror(errno));
	cqa.parent_domain = dom;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cqa);

	if (!cqx)
		die("ibv_create_cq_ex with the parent domain: %s", strerror(errno));
	struct ibv_cq *cq_a = ibv_cq_ex_to_cq(cqx);
	struct ibv_cq *cq_b = ibv_create_cq(ctx, 16, NULL, NULL, 0);

	if (!cq_b)
		die("ibv_create_cq: %s", strerror(errno));

	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	uint8_t *buf_a = calloc(1, LEN), *buf_b = calloc(1, LEN);

	if (!buf_a || !buf_b)
		die("out of memory");
	struct ibv_mr *mr_a = ibv_reg_mr(dom, buf_a, LEN, access);
	struct ibv_mr *mr_b = ibv_reg_mr(pd, buf_b, LEN, access);

	if (!mr_a || !mr_b)
		die("ibv_reg_mr: %s", strerror(errno));
	if (mr_a->pd != dom)
		die("the MR does not name the parent domain it was registered through");

	struct ibv_qp *qa = rc_qp(ctx, dom, cq_a, 0), *qb = rc_qp(ctx, pd, cq_b, 0);

	connect_qp(qa, access, gid, qb->qp_num);
	connect_qp(qb, access, gid, qa->qp_num);

	for (int i = 0; i < LEN; i++)
		buf_a[i] = (uint8_t)(i * 7 + 1);
	/* B receives into A's MR: the parent domain's MR is the PD's. */
	struct ibv_sge rsge = { .addr = (uintptr_t)buf_a + 3072, .length = 512, .lkey = mr_a->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 10, .sg_list = &rsge, .num_sge = 1 }, *rbad;

	if (ibv_post_recv(qb, &rwr, &rbad))
		die("ibv_post_recv: %s", strerror(errno));
	post(qa, 1, IBV_WR_RDMA_WRITE, mr_a, 0, 1024, (uintptr_t)buf_b, mr_b->rkey);
	post(qa, 2, IBV_WR_SEND, mr_a, 1024, 512, 0, 0);
	wait_wc(cq_a, 1, "A's Write");
	wait_wc(cq_a, 2, "A's Send");
	wait_wc(cq_b, 10, "B's receive");
	post(qb, 3, IBV_WR_RDMA_READ, mr_b, 2048, 1024, (uintptr_t)buf_a, mr_a->rkey);
	wait_wc(cq_b, 3, "B's Read");
	for (int i = 0; i < 1024; i++) {
		if (buf_b[i] != (uint8_t)(i * 7 + 1))
			die("the Write left byte %d wrong", i);
		if (buf_b[2048 + i] != (uint8_t)(i * 7 + 1))
			die("the Read returned byte %d wrong", i);
	}
	for (int i = 0; i < 512; i++)
		if (buf_a[3072 + i] != (uint8_t)((1024 + i) * 7 + 1))
			die("the Send placed byte %d wrong", i);

	if (ibv_dealloc_pd(dom) != EBUSY)
		die("ibv_dealloc_pd of a parent domain with a QP, MR and CQ: expected EBUSY");
	if (ibv_destroy_qp(qa) || ibv_destroy_qp(qb))
		die("ibv_destroy_qp: %s", strerror(errno));
	if (ibv_dereg_mr(mr_a) || ibv_dereg_mr(mr_b))
		die("ibv_dereg_mr: %s", strerror(errno));
	if (ibv_destroy_cq(cq_a) || ibv_destroy_cq(cq_b))
		die("ibv_destroy_cq: %s", strerror(errno));
	if (ibv_dealloc_pd(dom))
		die("ibv_dealloc_pd of the parent domain failed");
	if (ibv_dealloc_td(td))
		die("ibv_dealloc_td failed");
	if (ibv_dealloc_pd(pd))
		die("ibv_dealloc_pd failed");
	ibv_close_device(ctx);
	printf("domains ok: parent domain QP, MR and CQ, thread domain, refusals checked\n");
	return 0;
}
