// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Device memory on xiw, through the real libibverbs.
 *
 *   xiw_dm
 *
 * - max_dm_size is reported; allocations past it (alone, or with what is
 *   allocated already) fail with ENOMEM, unknown attributes with EINVAL.
 * - ibv_memcpy_to_dm/_from_dm move bytes at offsets and lengths in multiples
 *   of 4, inside the allocation; anything else is refused.
 * - ibv_reg_dm_mr needs IBV_ACCESS_ZERO_BASED and a range inside the device
 *   memory; through the MR a peer writes and reads the device memory, and a
 *   Send gathers from it (QPs of one process connected on one device).
 * - ibv_free_dm is refused (EBUSY) while an MR is registered on it.
 *
 * The device is the first one libibverbs lists (or $XIW_DEVICE). Prints one
 * summary line on success; exits 1 with the reason on stderr otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "xiw_test.h"

#define LEN 4096
#define QP_RIGHTS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_dm *alloc(struct ibv_context *ctx, size_t len, uint32_t comp_mask)
{
	struct ibv_alloc_dm_attr a = { .length = len, .log_align_req = 6, .comp_mask = comp_mask };

	return ibv_alloc_dm(ctx, &a);
}

int main(void)
{
	struct ibv_context *ctx = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_device_attr_ex attr;
	union ibv_gid gid;
	int checks = 0;

	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, 0, &gid) || ibv_query_device_ex(ctx, NULL, &attr))
		die("querying the device: %s", strerror(errno));
	uint64_t max = attr.max_dm_size;

	if (max < LEN)
		die("max_dm_size %" PRIu64, max);

	/* Allocation limits. */
	errno = 0;
	if (alloc(ctx, max + 1, 0) || errno != ENOMEM)
		die("device memory past max_dm_size: %s, expected ENOMEM", strerror(errno));
	errno = 0;
	if (alloc(ctx, LEN, 1) || errno != EINVAL)
		die("device memory with an unknown comp_mask: %s, expected EINVAL", strerror(errno));
	struct ibv_dm *big = alloc(ctx, max - LEN, 0);

	if (!big)
		die("ibv_alloc_dm of max_dm_size - %d: %s", LEN, strerror(errno));
	errno = 0;
	if (alloc(ctx, 2 * LEN, 0) || errno != ENOMEM)
		die("device memory past what is left: %s, expected ENOMEM", strerror(errno));
	struct ibv_dm *dm = alloc(ctx, LEN, 0);

	if (!dm)
		die("ibv_alloc_dm of what is left: %s", strerror(errno));
	if (ibv_free_dm(big))
		die("ibv_free_dm: %s", strerror(errno));
	checks += 5;

	/* Copies. */
	uint8_t in[LEN], out[LEN];

	for (int i = 0; i < LEN; i++)
		in[i] = (uint8_t)(i * 13 + 1);
	if (ibv_memcpy_to_dm(dm, 0, in, LEN) || ibv_memcpy_from_dm(out, dm, 0, LEN) ||
	    memcmp(in, out, LEN))
		die("a copy to and from device memory did not round-trip");
	if (!ibv_memcpy_to_dm(dm, 2, in, 8) || !ibv_memcpy_to_dm(dm, 4, in, 6) ||
	    !ibv_memcpy_to_dm(dm, LEN - 4, in, 8) || !ibv_memcpy_from_dm(out, dm, LEN + 4, 4) ||
	    !ibv_memcpy_from_dm(out, dm, 0, LEN + 4))
		die("a misaligned or out-of-range copy was accepted");
	checks += 2;

	/* MRs on it. */
	errno = 0;
	if (ibv_reg_dm_mr(pd, dm, 0, LEN, IBV_ACCESS_LOCAL_WRITE) || errno != EINVAL)
		die("ibv_reg_dm_mr without IBV_ACCESS_ZERO_BASED: %s, expected EINVAL",
		    strerror(errno));
	errno = 0;
	if (ibv_reg_dm_mr(pd, dm, 64, LEN, QP_RIGHTS | IBV_ACCESS_ZERO_BASED) || errno != EINVAL)
		die("ibv_reg_dm_mr past the device memory: %s, expected EINVAL", strerror(errno));
	struct ibv_mr *dmr = ibv_reg_dm_mr(pd, dm, 1024, 2048, QP_RIGHTS | IBV_ACCESS_ZERO_BASED);

	if (!dmr)
		die("ibv_reg_dm_mr: %s", strerror(errno));
	if (ibv_free_dm(dm) != EBUSY)
		die("freeing device memory with an MR on it: expected EBUSY");
	checks += 3;

	struct ibv_cq *cq_a = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *cq_b = ibv_create_cq(ctx, 16, NULL, NULL, 0);

	if (!cq_a || !cq_b)
		die("ibv_create_cq: %s", strerror(errno));
	struct ibv_qp *a = rc_qp(ctx, pd, cq_a, 0), *b = rc_qp(ctx, pd, cq_b, 0);

	connect_qp(a, QP_RIGHTS, gid, b->qp_num);
	connect_qp(b, QP_RIGHTS, gid, a->qp_num);
	uint8_t *buf = calloc(1, LEN);
	struct ibv_mr *mr = buf ? ibv_reg_mr(pd, buf, LEN, QP_RIGHTS) : NULL;

	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));

	/* B writes into the device memory (zero-based: offset 16 of the MR). */
	memset(buf, 0x6c, 64);
	post_recv_one(a, 100, (uintptr_t)buf + 2048, 8, mr->lkey);
	post_one(b, 1, IBV_WR_RDMA_WRITE, (uintptr_t)buf, 64, mr->lkey, 16, dmr->rkey);
	post_one(b, 2, IBV_WR_SEND, (uintptr_t)buf, 8, mr->lkey, 0, 0);
	wait_wc(cq_b, 1, "a Write into device memory");
	wait_wc(cq_b, 2, "the Send after it");
	wait_wc(cq_a, 100, "A's receive");
	if (ibv_memcpy_from_dm(out, dm, 1024 + 16, 64) || memcmp(out, buf, 64))
		die("the Write did not land in the device memory");

	/* B reads it back; A sends from it. */
	memset(buf + 512, 0, 64);
	post_one(b, 3, IBV_WR_RDMA_READ, (uintptr_t)buf + 512, 64, mr->lkey, 16, dmr->rkey);
	wait_wc(cq_b, 3, "a Read from device memory");
	if (memcmp(buf + 512, buf, 64))
		die("the Read from device memory brought other bytes");
	post_recv_one(b, 101, (uintptr_t)buf + 1024, 32, mr->lkey);
	post_one(a, 4, IBV_WR_SEND, 16, 32, dmr->lkey, 0, 0);
	wait_wc(cq_a, 4, "a Send from device memory");
	wait_wc(cq_b, 101, "B's receive of it");
	if (memcmp(buf + 1024, buf, 32))
		die("the Send from device memory carried other bytes");
	checks += 3;

	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq_a) ||
	    ibv_destroy_cq(cq_b) || ibv_dereg_mr(mr) || ibv_dereg_mr(dmr) || ibv_free_dm(dm))
		die("cleaning up: %s", strerror(errno));
	/* All of it is free again. */
	struct ibv_dm *all = alloc(ctx, max, 0);

	if (!all || ibv_free_dm(all))
		die("device memory of max_dm_size once everything is freed: %s",
		    strerror(errno));
	if (ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("cleaning up: %s", strerror(errno));
	free(buf);
	printf("dm ok: %d checks, max_dm_size %" PRIu64 "\n", checks + 1, max);
	return 0;
}
