// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * On-demand paging on xiw, through the real libibverbs.
 *
 *   xiw_odp
 *
 * Two QPs of one process, A and B, connected to each other on one device.
 *
 * - Capabilities: odp_caps report on-demand paging, implicit ODP, and Send,
 *   Receive, Write, Read, atomics and SRQ receives on RC (nothing on UD/UC).
 * - Registration: an ODP MR over memory that is not mapped yet is accepted
 *   (a plain one is refused with EFAULT) and serves once the memory is
 *   mapped; ODP with flush rights is refused (EOPNOTSUPP).
 * - Traffic through ODP MRs: Send/Receive, a large Write and Read (larger
 *   than what xiw would otherwise place straight from the stream),
 *   fetch-and-add and compare-and-swap, and an implicit ODP MR (the whole
 *   address space) as local key and as remote key.
 * - Memory unmapped under an ODP MR, each case on a fresh pair of QPs: a
 *   Send gathering from it completes with IBV_WC_LOC_PROT_ERR, a receive
 *   into it with IBV_WC_LOC_PROT_ERR, a Read into it with
 *   IBV_WC_LOC_PROT_ERR; a peer's Write into it, Read from it and atomic on
 *   it complete at the peer with IBV_WC_REM_ACCESS_ERR. The process lives on
 *   and no byte around the hole changes.
 * - ibv_advise_mr: prefetch (read, write, without faults; synchronous or
 *   not) of ODP memory; a synchronous prefetch of unmapped memory fails with
 *   EFAULT; a non-ODP MR, a bad key or a range outside the MR is EINVAL, an
 *   unknown advice EOPNOTSUPP.
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
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "xiw_test.h"

#ifndef IBV_ACCESS_FLUSH_GLOBAL
#define IBV_ACCESS_FLUSH_GLOBAL (1 << 8) /* rdma-core 45 and later */
#endif

#define PAGE 4096
/* Larger than any threshold for placing a payload straight from the stream. */
#define BIG (256 * 1024)
#define ODP_RIGHTS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ON_DEMAND)
#define QP_RIGHTS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
		   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static void post_atomic(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, void *result,
			uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t add_or_cmp,
			uint64_t swap)
{
	struct ibv_sge sge = { .addr = (uintptr_t)result, .length = 8, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = add_or_cmp;
	wr.wr.atomic.swap = swap;
	if (ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send (atomic WR %" PRIu64 "): %s", id, strerror(errno));
}

static void *map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	return p;
}

static struct ibv_mr *reg(void *addr, size_t len, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);

	if (!mr)
		die("ibv_reg_mr(%p, %zu, %#x): %s", addr, len, access, strerror(errno));
	return mr;
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(i * 7 + seed);
}

static void check_caps(void)
{
	struct ibv_device_attr_ex a;
	uint32_t want = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
			IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;

	if (ibv_query_device_ex(ctx, NULL, &a))
		die("ibv_query_device_ex: %s", strerror(errno));
	if (a.odp_caps.general_caps != (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT))
		die("odp_caps.general_caps %#" PRIx64, a.odp_caps.general_caps);
	if (a.odp_caps.per_transport_caps.rc_odp_caps != want ||
	    a.odp_caps.per_transport_caps.uc_odp_caps ||
	    a.odp_caps.per_transport_caps.ud_odp_caps)
		die("odp_caps per transport: rc %#x uc %#x ud %#x",
		    a.odp_caps.per_transport_caps.rc_odp_caps,
		    a.odp_caps.per_transport_caps.uc_odp_caps,
		    a.odp_caps.per_transport_caps.ud_odp_caps);
}

/* Traffic through ODP MRs, the sending side's memory mapped after it was registered. */
static void traffic(void)
{
	size_t size = BIG + 4 * PAGE;
	uint8_t *ma = map(size), *mb = map(size);
	struct ibv_mr *mra = reg(ma, size, ODP_RIGHTS), *mrb = reg(mb, size, ODP_RIGHTS);

	/* Memory that is not mapped: only an ODP registration takes it. */
	uint8_t *late = map(PAGE);

	if (munmap(late, PAGE))
		die("munmap: %s", strerror(errno));
	errno = 0;
	if (ibv_reg_mr(pd, late, PAGE, IBV_ACCESS_LOCAL_WRITE) || errno != EFAULT)
		die("a plain MR over unmapped memory: %s, expected EFAULT", strerror(errno));
	struct ibv_mr *mrl = reg(late, PAGE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);

	if (mmap(late, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		 -1, 0) != late)
		die("mmap at the registered address: %s", strerror(errno));
	errno = 0;
	if (ibv_reg_mr(pd, ma, PAGE, ODP_RIGHTS | IBV_ACCESS_FLUSH_GLOBAL) ||
	    errno != EOPNOTSUPP)
		die("ODP with flush rights: %s, expected EOPNOTSUPP", strerror(errno));

	struct pair p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);

	/* A sends from the memory mapped after registration. */
	fill(late, 64, 1);
	post_recv_one(p.b, 100, (uintptr_t)mb, 64, mrb->lkey);
	post_one(p.a, 1, IBV_WR_SEND, (uintptr_t)late, 64, mrl->lkey, 0, 0);
	wait_wc(p.cq_a, 1, "A's Send from memory mapped after registration");
	wait_wc(p.cq_b, 100, "B's receive into ODP memory");
	if (memcmp(mb, late, 64))
		die("B received other bytes than A sent");

	/* B writes BIG bytes into A's ODP memory, then sends: placed before. */
	fill(mb, BIG, 2);
	post_recv_one(p.a, 101, (uintptr_t)ma + BIG + PAGE, 8, mra->lkey);
	post_one(p.b, 2, IBV_WR_RDMA_WRITE, (uintptr_t)mb, BIG, mrb->lkey, (uintptr_t)ma,
		  mra->rkey);
	post_one(p.b, 3, IBV_WR_SEND, (uintptr_t)mb, 8, mrb->lkey, 0, 0);
	wait_wc(p.cq_b, 2, "B's large Write");
	wait_wc(p.cq_b, 3, "B's Send after it");
	wait_wc(p.cq_a, 101, "A's receive after the Write");
	if (memcmp(ma, mb, BIG))
		die("the large Write into ODP memory landed other bytes");

	/* B reads BIG bytes of A's ODP memory into its own. */
	fill(ma, BIG, 3);
	memset(mb, 0, BIG);
	post_one(p.b, 4, IBV_WR_RDMA_READ, (uintptr_t)mb, BIG, mrb->lkey, (uintptr_t)ma,
		  mra->rkey);
	wait_wc(p.cq_b, 4, "B's large Read");
	if (memcmp(ma, mb, BIG))
		die("the large Read from ODP memory brought other bytes");

	/* Atomics on a word of A's ODP memory. */
	uint64_t *word = (uint64_t *)(ma + BIG), *result = (uint64_t *)(mb + BIG);

	*word = 5;
	post_atomic(p.b, 5, IBV_WR_ATOMIC_FETCH_AND_ADD, result, mrb->lkey, (uintptr_t)word,
		    mra->rkey, 3, 0);
	wait_wc(p.cq_b, 5, "B's fetch-and-add");
	if (*result != 5 || *word != 8)
		die("fetch-and-add: got %" PRIu64 ", word %" PRIu64, *result, *word);
	post_atomic(p.b, 6, IBV_WR_ATOMIC_CMP_AND_SWP, result, mrb->lkey, (uintptr_t)word,
		    mra->rkey, 8, 42);
	wait_wc(p.cq_b, 6, "B's compare-and-swap");
	if (*result != 8 || *word != 42)
		die("compare-and-swap: got %" PRIu64 ", word %" PRIu64, *result, *word);

	/* The whole address space, implicitly: any memory of the process. */
	struct ibv_mr *imr = ibv_reg_mr(pd, NULL, SIZE_MAX, ODP_RIGHTS);

	if (!imr)
		die("implicit ODP MR: %s", strerror(errno));
	uint8_t *heap_a = malloc(PAGE), *heap_b = malloc(PAGE);

	if (!heap_a || !heap_b)
		die("out of memory");
	fill(heap_a, PAGE, 4);
	memset(heap_b, 0, PAGE);
	post_recv_one(p.b, 102, (uintptr_t)heap_b, PAGE, imr->lkey);
	post_one(p.a, 7, IBV_WR_SEND, (uintptr_t)heap_a, PAGE, imr->lkey, 0, 0);
	wait_wc(p.cq_a, 7, "A's Send through the implicit MR");
	wait_wc(p.cq_b, 102, "B's receive through the implicit MR");
	if (memcmp(heap_a, heap_b, PAGE))
		die("the implicit MR carried other bytes");
	fill(heap_b, PAGE, 5);
	post_recv_one(p.a, 103, (uintptr_t)ma, 8, mra->lkey);
	post_one(p.b, 8, IBV_WR_RDMA_WRITE, (uintptr_t)heap_b, PAGE, imr->lkey,
		  (uintptr_t)heap_a, imr->rkey);
	post_one(p.b, 9, IBV_WR_SEND, (uintptr_t)mb, 8, mrb->lkey, 0, 0);
	wait_wc(p.cq_b, 8, "B's Write through the implicit MR");
	wait_wc(p.cq_b, 9, "B's Send after it");
	wait_wc(p.cq_a, 103, "A's receive after it");
	if (memcmp(heap_a, heap_b, PAGE))
		die("the Write through the implicit MR landed other bytes");

	free_pair(&p);
	if (ibv_dereg_mr(imr) || ibv_dereg_mr(mrl) || ibv_dereg_mr(mra) || ibv_dereg_mr(mrb))
		die("ibv_dereg_mr: %s", strerror(errno));
	free(heap_a);
	free(heap_b);
	munmap(late, PAGE);
	munmap(ma, size);
	munmap(mb, size);
}

/* Three pages, the middle one unmapped, under an ODP MR. */
struct holed {
	uint8_t *base;
	struct ibv_mr *mr;
};

static struct holed holed(void)
{
	struct holed h = { .base = map(3 * PAGE) };

	if (munmap(h.base + PAGE, PAGE))
		die("munmap: %s", strerror(errno));
	fill(h.base, PAGE, 9);
	fill(h.base + 2 * PAGE, PAGE, 10);
	h.mr = reg(h.base, 3 * PAGE, ODP_RIGHTS);
	return h;
}

/* No byte around the hole changed. */
static void check_around(struct holed *h, const char *what)
{
	uint8_t want[PAGE];

	fill(want, PAGE, 9);
	if (memcmp(h->base, want, PAGE))
		die("%s: the page before the hole changed", what);
	fill(want, PAGE, 10);
	if (memcmp(h->base + 2 * PAGE, want, PAGE))
		die("%s: the page after the hole changed", what);
}

static void unmapped(void)
{
	enum { SEND_FROM, RECV_INTO, READ_INTO, READ_FROM, ATOMIC_ON, WRITE_ACROSS, CASES };
	struct pair p[CASES];
	uint8_t *buf = map(2 * PAGE);
	struct ibv_mr *mr = reg(buf, 2 * PAGE, QP_RIGHTS);

	/*
	 * Everything the cases use is made first: a page the process maps later
	 * (a queue's ring) could land in the hole.
	 */
	for (int i = 0; i < CASES; i++)
		p[i] = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);
	struct holed h = holed();
	uint64_t hole = (uintptr_t)h.base + PAGE;

	/* A Send gathering from the hole fails locally. */
	post_one(p[SEND_FROM].a, 1, IBV_WR_SEND, hole, 64, h.mr->lkey, 0, 0);
	expect_wc(p[SEND_FROM].cq_a, 1, IBV_WC_LOC_PROT_ERR, "a Send from unmapped ODP memory");

	/* A receive into the hole fails locally. */
	post_recv_one(p[RECV_INTO].a, 100, hole, 64, h.mr->lkey);
	post_one(p[RECV_INTO].b, 2, IBV_WR_SEND, (uintptr_t)buf, 64, mr->lkey, 0, 0);
	expect_wc(p[RECV_INTO].cq_a, 100, IBV_WC_LOC_PROT_ERR,
		  "a receive into unmapped ODP memory");
	check_around(&h, "receive");

	/* A Read whose sink is the hole fails locally. */
	post_one(p[READ_INTO].a, 3, IBV_WR_RDMA_READ, hole, 64, h.mr->lkey, (uintptr_t)buf,
		  mr->rkey);
	expect_wc(p[READ_INTO].cq_a, 3, IBV_WC_LOC_PROT_ERR, "a Read into unmapped ODP memory");
	check_around(&h, "Read sink");

	/* A peer's Read from the hole is refused. */
	post_one(p[READ_FROM].b, 4, IBV_WR_RDMA_READ, (uintptr_t)buf, 64, mr->lkey, hole,
		  h.mr->rkey);
	expect_wc(p[READ_FROM].cq_b, 4, IBV_WC_REM_ACCESS_ERR,
		  "a Read from unmapped ODP memory");

	/* A peer's atomic on the hole is refused. */
	post_atomic(p[ATOMIC_ON].b, 5, IBV_WR_ATOMIC_FETCH_AND_ADD, buf, mr->lkey, hole,
		    h.mr->rkey, 1, 0);
	expect_wc(p[ATOMIC_ON].cq_b, 5, IBV_WC_REM_ACCESS_ERR,
		  "an atomic on unmapped ODP memory");

	/*
	 * A peer's Write across the hole (from the page before it) is refused:
	 * the Write completed when it was handed to the stream, so the Read
	 * behind it reports the Terminate.
	 */
	struct pair *w = &p[WRITE_ACROSS];

	memset(buf, 0xee, 2 * PAGE);
	post_one(w->b, 6, IBV_WR_RDMA_WRITE, (uintptr_t)buf, 2 * PAGE, mr->lkey,
		  (uintptr_t)h.base, h.mr->rkey);
	post_one(w->b, 7, IBV_WR_RDMA_READ, (uintptr_t)buf, 8, mr->lkey, (uintptr_t)h.base,
		  h.mr->rkey);
	struct ibv_wc wc = next_wc(w->cq_b, "a Write across unmapped ODP memory");

	if (wc.wr_id == 6 && wc.status == IBV_WC_SUCCESS)
		wc = next_wc(w->cq_b, "the Read after the Write");
	if (wc.status != IBV_WC_REM_ACCESS_ERR)
		die("a Write across unmapped ODP memory: WR %" PRIu64 " completed with %s, "
		    "expected IBV_WC_REM_ACCESS_ERR", wc.wr_id, ibv_wc_status_str(wc.status));

	for (int i = 0; i < CASES; i++)
		free_pair(&p[i]);
	if (ibv_dereg_mr(h.mr) || ibv_dereg_mr(mr))
		die("ibv_dereg_mr: %s", strerror(errno));
	munmap(h.base, PAGE);
	munmap(h.base + 2 * PAGE, PAGE);
	munmap(buf, 2 * PAGE);
}

static int advise(enum ibv_advise_mr_advice advice, uint32_t flags, uint64_t addr, uint32_t len,
		  uint32_t lkey)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };

	return ibv_advise_mr(pd, advice, flags, &sge, 1);
}

static void prefetch(void)
{
	/* Made before the hole, which a later mapping could fill. */
	uint8_t *plain = map(PAGE);
	struct ibv_mr *mr = reg(plain, PAGE, IBV_ACCESS_LOCAL_WRITE);
	struct holed h = holed();
	uint64_t base = (uintptr_t)h.base;
	int r;

	if ((r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, base, PAGE,
			h.mr->lkey)) ||
	    (r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH,
			base + 2 * PAGE, PAGE, h.mr->lkey)) ||
	    (r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, base, PAGE, h.mr->lkey)) ||
	    (r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, IBV_ADVISE_MR_FLAG_FLUSH, base,
			3 * PAGE, h.mr->lkey)))
		die("prefetching ODP memory: %s", strerror(r));
	r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, base, 3 * PAGE,
		   h.mr->lkey);
	if (r != EFAULT)
		die("a synchronous prefetch over unmapped memory: %s, expected EFAULT",
		    strerror(r));
	r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, base, 3 * PAGE, h.mr->lkey);
	if (r)
		die("an asynchronous prefetch over unmapped memory: %s, expected success",
		    strerror(r));
	if ((r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, (uintptr_t)plain, PAGE, mr->lkey)) !=
	    EINVAL)
		die("prefetching a plain MR: %s, expected EINVAL", strerror(r));
	if ((r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, base, PAGE, h.mr->lkey + 1)) != EINVAL)
		die("prefetching with a bad key: %s, expected EINVAL", strerror(r));
	if ((r = advise(IBV_ADVISE_MR_ADVICE_PREFETCH, 0, base + 2 * PAGE, 2 * PAGE,
			h.mr->lkey)) != EINVAL)
		die("prefetching beyond the MR: %s, expected EINVAL", strerror(r));
	if ((r = advise((enum ibv_advise_mr_advice)7, 0, base, PAGE, h.mr->lkey)) != EOPNOTSUPP)
		die("an unknown advice: %s, expected EOPNOTSUPP", strerror(r));
	if (ibv_dereg_mr(h.mr) || ibv_dereg_mr(mr))
		die("ibv_dereg_mr: %s", strerror(errno));
	munmap(h.base, PAGE);
	munmap(h.base + 2 * PAGE, PAGE);
	munmap(plain, PAGE);
}

int main(void)
{
	ctx = open_dev();
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid: %s", strerror(errno));
	check_caps();
	traffic();
	unmapped();
	prefetch();
	if (ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("cleaning up: %s", strerror(errno));
	printf("odp ok: caps, registration of unmapped memory, Send/Receive, large Write and "
	       "Read, atomics, implicit MR; 6 faults on unmapped memory; prefetch\n");
	return 0;
}
