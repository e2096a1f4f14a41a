// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Memory windows on xiw, through the real libibverbs.
 *
 *   xiw_mw
 *
 * QPs of one process connected in pairs on one device; A owns the memory, B
 * is the peer that reaches it through windows.
 *
 * - Capabilities: IBV_DEVICE_MEM_WINDOW and _TYPE_2B, max_mw; a window of an
 *   unknown type is refused (EINVAL).
 * - Type 1 (ibv_bind_mw): the bind completes with IBV_WC_BIND_MW and gives
 *   the window a new key; the peer writes and reads through it, within its
 *   bounds and rights only; the old key, a range past the window, a right it
 *   does not grant, and the window after it is unbound (length 0) are
 *   refused (IBV_WC_REM_ACCESS_ERR at the peer); the window's key is no local
 *   key (IBV_WC_LOC_PROT_ERR); the region cannot be deregistered while a
 *   window is bound to it (EBUSY).
 * - Type 2 (IBV_WR_BIND_MW, and ibv_wr_bind_mw on an extended QP): zero-based
 *   addressing; only the QP it was bound through serves it; binding it again
 *   while bound, or to a region without IBV_ACCESS_MW_BIND, completes with
 *   IBV_WC_MW_BIND_ERR; a key of another window or a type 1 window in the
 *   work request is refused at post (EINVAL); Local Invalidate and the peer's
 *   Send with Invalidate (reported with IBV_WC_WITH_INV) end it; freeing it
 *   ends it too.
 * - Remote invalidation of regions (RFC 5040 section 8.1.1 rule 7): the peer's
 *   Send with Invalidate may end a region enabled for remote access only if
 *   no other stream may use it (its PD has no other QP); otherwise the
 *   receive fails, the Terminate says the STag cannot be invalidated, and
 *   the region stays valid. A region without remote access may be ended.
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

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

/* On a fresh pair, B's Read of `len` bytes at `raddr` under `rkey` is refused. */
static void refused_read(uint64_t raddr, uint32_t len, uint32_t rkey, uint8_t *sink,
			 uint32_t lkey, const char *what)
{
	struct pair p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);

	post_one(p.b, 99, IBV_WR_RDMA_READ, (uintptr_t)sink, len, lkey, raddr, rkey);
	expect_wc(p.cq_b, 99, IBV_WC_REM_ACCESS_ERR, what);
	free_pair(&p);
}

/* Posts a type 2 bind of `mw` under `rkey` on `qp`; returns what ibv_post_send said. */
static int post_bind2(struct ibv_qp *qp, uint64_t id, struct ibv_mw *mw, uint32_t rkey,
		      struct ibv_mr *mr, uint64_t addr, uint64_t len, unsigned int access)
{
	struct ibv_send_wr wr = { .wr_id = id, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr, .addr = addr,
							  .length = len,
							  .mw_access_flags = access };
	return ibv_post_send(qp, &wr, &bad);
}

static void type1(uint8_t *buf, struct ibv_mr *mr, uint8_t *peer, struct ibv_mr *pmr)
{
	struct pair p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);

	if (!mw)
		die("ibv_alloc_mw type 1: %s", strerror(errno));
	uint32_t before = mw->rkey;
	struct ibv_mw_bind bind = {
		.wr_id = 1,
		.send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = (uintptr_t)buf + 64, .length = 128,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
						  IBV_ACCESS_REMOTE_READ },
	};

	if (ibv_bind_mw(p.a, mw, &bind))
		die("ibv_bind_mw: %s", strerror(errno));
	struct ibv_wc wc = expect_wc(p.cq_a, 1, IBV_WC_SUCCESS, "the type 1 bind");


	if (wc.opcode != IBV_WC_BIND_MW)
		die("the bind completed as opcode %d, not IBV_WC_BIND_MW", wc.opcode);
	if (mw->rkey == before || (mw->rkey >> 8) != (before >> 8))
		die("the bind did not give the window a new key (%#x, was %#x)", mw->rkey, before);
	uint32_t key = mw->rkey;

	/* The peer writes through the window, then sends: A sees the bytes. */
	memset(peer, 0x5a, 16);
	post_recv_one(p.a, 100, (uintptr_t)buf + 1024, 8, mr->lkey);
	post_one(p.b, 2, IBV_WR_RDMA_WRITE, (uintptr_t)peer, 16, pmr->lkey, (uintptr_t)buf + 64,
	     key);
	post_one(p.b, 3, IBV_WR_SEND, (uintptr_t)peer, 8, pmr->lkey, 0, 0);
	expect_wc(p.cq_b, 2, IBV_WC_SUCCESS, "a Write through the window");
	expect_wc(p.cq_b, 3, IBV_WC_SUCCESS, "the Send after it");
	expect_wc(p.cq_a, 100, IBV_WC_SUCCESS, "A's receive");
	if (memcmp(buf + 64, peer, 16))
		die("the Write through the window landed other bytes");
	/* ... and reads the end of it. */
	memset(buf + 64 + 112, 0x33, 16);
	post_one(p.b, 4, IBV_WR_RDMA_READ, (uintptr_t)peer + 64, 16, pmr->lkey,
	     (uintptr_t)buf + 64 + 112, key);
	expect_wc(p.cq_b, 4, IBV_WC_SUCCESS, "a Read through the window");
	if (memcmp(peer + 64, buf + 64 + 112, 16))
		die("the Read through the window brought other bytes");

	/* The region stays while a window is bound to it. */
	if (ibv_dereg_mr(mr) != EBUSY)
		die("deregistering a region with a bound window: expected EBUSY");

	/* The window's key is no local key. */
	post_one(p.a, 5, IBV_WR_SEND, (uintptr_t)buf + 64, 8, key, 0, 0);
	expect_wc(p.cq_a, 5, IBV_WC_LOC_PROT_ERR, "a Send with the window's key as lkey");
	free_pair(&p);

	refused_read((uintptr_t)buf + 64 + 120, 16, key, peer, pmr->lkey,
		     "a Read past the window's end");
	refused_read((uintptr_t)buf + 32, 16, key, peer, pmr->lkey,
		     "a Read before the window's start");
	refused_read((uintptr_t)buf + 64, 8, before, peer, pmr->lkey,
		     "a Read with the window's old key");

	/* Bound again read-only: a Write is refused; the Read behind it says so. */
	p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);
	bind.wr_id = 6;
	bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	if (ibv_bind_mw(p.a, mw, &bind))
		die("ibv_bind_mw read-only: %s", strerror(errno));
	expect_wc(p.cq_a, 6, IBV_WC_SUCCESS, "the read-only bind");
	post_one(p.b, 7, IBV_WR_RDMA_WRITE, (uintptr_t)peer, 8, pmr->lkey, (uintptr_t)buf + 64,
	     mw->rkey);
	post_one(p.b, 8, IBV_WR_RDMA_READ, (uintptr_t)peer, 8, pmr->lkey, (uintptr_t)buf + 64,
	     mw->rkey);
	wc = next_wc(p.cq_b, "a Write through a read-only window");
	if (wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS)
		wc = next_wc(p.cq_b, "the Read after the Write");
	if (wc.status != IBV_WC_REM_ACCESS_ERR)
		die("a Write through a read-only window: WR %" PRIu64 " completed with %s",
		    wc.wr_id, ibv_wc_status_str(wc.status));
	free_pair(&p);

	/* Unbound (length 0): nothing through it. */
	p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);
	bind.wr_id = 9;
	bind.bind_info = (struct ibv_mw_bind_info){ .mr = mr };
	if (ibv_bind_mw(p.a, mw, &bind))
		die("ibv_bind_mw length 0: %s", strerror(errno));
	expect_wc(p.cq_a, 9, IBV_WC_SUCCESS, "the unbinding bind");
	free_pair(&p);
	refused_read((uintptr_t)buf + 64, 8, mw->rkey, peer, pmr->lkey,
		     "a Read through an unbound window");
	if (ibv_dealloc_mw(mw))
		die("ibv_dealloc_mw: %s", strerror(errno));
}

static void type2(uint8_t *buf, struct ibv_mr *mr, uint8_t *peer, struct ibv_mr *pmr)
{
	struct pair p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0), other = rc_pair(ctx, pd, gid, QP_RIGHTS, 0), ex = rc_pair(ctx, pd, gid, QP_RIGHTS, IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_RDMA_READ);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2), *w1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	struct ibv_mr *nobind = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	unsigned int rw = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

	if (!mw || !w1 || !nobind)
		die("ibv_alloc_mw / ibv_reg_mr: %s", strerror(errno));

	/* Refused at post: another window's key, a type 1 window. */
	if (post_bind2(p.a, 1, mw, ibv_inc_rkey(w1->rkey), mr, (uintptr_t)buf, 8, rw) != EINVAL)
		die("a type 2 bind under another window's key: expected EINVAL");
	if (post_bind2(p.a, 1, w1, ibv_inc_rkey(w1->rkey), mr, (uintptr_t)buf, 8, rw) != EINVAL)
		die("IBV_WR_BIND_MW of a type 1 window: expected EINVAL");
	struct ibv_mw_bind b1 = { .wr_id = 1, .bind_info = { .mr = mr } };

	if (ibv_bind_mw(p.a, mw, &b1) != EINVAL)
		die("ibv_bind_mw of a type 2 window: expected EINVAL");

	/* A region without IBV_ACCESS_MW_BIND: the bind fails when carried out. */
	uint32_t key = ibv_inc_rkey(mw->rkey);

	if (post_bind2(p.a, 2, mw, key, nobind, (uintptr_t)buf, 64, rw))
		die("ibv_post_send bind: %s", strerror(errno));
	expect_wc(p.cq_a, 2, IBV_WC_MW_BIND_ERR, "a bind to a region without the bind right");
	free_pair(&p);
	p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);

	/* Zero-based, on [buf+256, buf+512). */
	if (post_bind2(p.a, 3, mw, key, mr, (uintptr_t)buf + 256, 256,
		       rw | IBV_ACCESS_ZERO_BASED))
		die("ibv_post_send bind: %s", strerror(errno));
	struct ibv_wc wc = expect_wc(p.cq_a, 3, IBV_WC_SUCCESS, "the type 2 bind");

	if (wc.opcode != IBV_WC_BIND_MW)
		die("the bind completed as opcode %d, not IBV_WC_BIND_MW", wc.opcode);
	memset(buf + 256 + 16, 0x44, 16);
	post_one(p.b, 4, IBV_WR_RDMA_READ, (uintptr_t)peer, 16, pmr->lkey, 16, key);
	expect_wc(p.cq_b, 4, IBV_WC_SUCCESS, "a zero-based Read through the window");
	if (memcmp(peer, buf + 256 + 16, 16))
		die("the zero-based Read brought other bytes");

	/* Another QP of the same PD does not serve it. */
	post_one(other.b, 5, IBV_WR_RDMA_READ, (uintptr_t)peer, 16, pmr->lkey, 16, key);
	expect_wc(other.cq_b, 5, IBV_WC_REM_ACCESS_ERR, "a Read through another QP");
	free_pair(&other);

	/* Bound already: binding again fails. */
	if (post_bind2(p.a, 6, mw, ibv_inc_rkey(key), mr, (uintptr_t)buf, 64, rw))
		die("ibv_post_send bind: %s", strerror(errno));
	expect_wc(p.cq_a, 6, IBV_WC_MW_BIND_ERR, "binding a bound type 2 window");
	free_pair(&p);

	/* Local Invalidate ends it. */
	p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);
	struct ibv_send_wr inv = { .wr_id = 7, .opcode = IBV_WR_LOCAL_INV,
				   .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = key }, *bad;

	if (ibv_post_send(p.a, &inv, &bad))
		die("ibv_post_send local invalidate: %s", strerror(errno));
	expect_wc(p.cq_a, 7, IBV_WC_SUCCESS, "Local Invalidate of the window");
	post_one(p.b, 8, IBV_WR_RDMA_READ, (uintptr_t)peer, 16, pmr->lkey, 16, key);
	expect_wc(p.cq_b, 8, IBV_WC_REM_ACCESS_ERR, "a Read through the invalidated window");
	free_pair(&p);

	/* Bound through an extended QP; the peer's Send with Invalidate ends it. */
	key = ibv_inc_rkey(key);
	ibv_wr_start(ibv_qp_to_qp_ex(ex.a));
	ibv_qp_to_qp_ex(ex.a)->wr_id = 9;
	ibv_qp_to_qp_ex(ex.a)->wr_flags = IBV_SEND_SIGNALED;
	struct ibv_mw_bind_info info = { .mr = mr, .addr = (uintptr_t)buf + 256, .length = 256,
					 .mw_access_flags = rw };

	ibv_wr_bind_mw(ibv_qp_to_qp_ex(ex.a), mw, key, &info);
	if (ibv_wr_complete(ibv_qp_to_qp_ex(ex.a)))
		die("ibv_wr_complete of a bind: %s", strerror(errno));
	expect_wc(ex.cq_a, 9, IBV_WC_SUCCESS, "ibv_wr_bind_mw");
	post_one(ex.b, 10, IBV_WR_RDMA_READ, (uintptr_t)peer, 16, pmr->lkey, (uintptr_t)buf + 256,
	     key);
	expect_wc(ex.cq_b, 10, IBV_WC_SUCCESS, "a Read through the window bound with ibv_wr_*");
	post_recv_one(ex.a, 101, (uintptr_t)buf + 1024, 8, mr->lkey);
	post_one(ex.b, 11, IBV_WR_SEND_WITH_INV, (uintptr_t)peer, 8, pmr->lkey, 0, key);
	expect_wc(ex.cq_b, 11, IBV_WC_SUCCESS, "Send with Invalidate of the window");
	wc = expect_wc(ex.cq_a, 101, IBV_WC_SUCCESS, "the receive of the Send with Invalidate");
	if (!(wc.wc_flags & IBV_WC_WITH_INV) || wc.invalidated_rkey != key)
		die("the receive does not report the window invalidated (flags %#x, key %#x)",
		    wc.wc_flags, wc.invalidated_rkey);
	post_one(ex.b, 12, IBV_WR_RDMA_READ, (uintptr_t)peer, 16, pmr->lkey, (uintptr_t)buf + 256,
	     key);
	expect_wc(ex.cq_b, 12, IBV_WC_REM_ACCESS_ERR, "a Read through the window invalidated");
	free_pair(&ex);

	/* Bound once more, then freed: nothing through it. */
	p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);
	key = ibv_inc_rkey(key);
	if (post_bind2(p.a, 13, mw, key, mr, (uintptr_t)buf, 64, rw))
		die("ibv_post_send bind: %s", strerror(errno));
	expect_wc(p.cq_a, 13, IBV_WC_SUCCESS, "the last bind");
	if (ibv_dealloc_pd(pd) != EBUSY)
		die("freeing a PD with windows: expected EBUSY");
	if (ibv_dealloc_mw(mw) || ibv_dealloc_mw(w1))
		die("ibv_dealloc_mw: %s", strerror(errno));
	post_one(p.b, 14, IBV_WR_RDMA_READ, (uintptr_t)peer, 16, pmr->lkey, (uintptr_t)buf, key);
	expect_wc(p.cq_b, 14, IBV_WC_REM_ACCESS_ERR, "a Read through a freed window");
	free_pair(&p);
	if (ibv_dereg_mr(nobind))
		die("ibv_dereg_mr: %s", strerror(errno));
}

/* B sends with Invalidate of `rkey` to A, which receives into `buf`; A's receive's status. */
static enum ibv_wc_status send_inv(struct pair *p, uint8_t *buf, uint32_t lkey, uint32_t rkey,
				   uint8_t *peer, struct ibv_mr *pmr, struct ibv_wc *wc)
{
	post_recv_one(p->a, 200, (uintptr_t)buf + 2048, 8, lkey);
	post_one(p->b, 20, IBV_WR_SEND_WITH_INV, (uintptr_t)peer, 8, pmr->lkey, 0, rkey);
	*wc = next_wc(p->cq_a, "the receive of a Send with Invalidate");
	return wc->status;
}

static void remote_invalidation(uint8_t *peer, struct ibv_mr *pmr)
{
	uint8_t *buf = calloc(1, LEN);
	struct ibv_mr *shared = ibv_reg_mr(pd, buf, LEN, QP_RIGHTS);
	struct ibv_mr *local = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_wc wc;

	if (!buf || !shared || !local)
		die("ibv_reg_mr: %s", strerror(errno));

	/* A region every QP of the PD may use: not the peer's to end. */
	struct pair p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);

	if (send_inv(&p, buf, local->lkey, shared->rkey, peer, pmr, &wc) == IBV_WC_SUCCESS)
		die("a peer invalidated a region other streams may use");
	free_pair(&p);
	p = rc_pair(ctx, pd, gid, QP_RIGHTS, 0);
	post_one(p.b, 21, IBV_WR_RDMA_READ, (uintptr_t)peer, 8, pmr->lkey, (uintptr_t)buf,
		 shared->rkey);
	expect_wc(p.cq_b, 21, IBV_WC_SUCCESS, "a Read through the region the peer could not end");

	/* A region without remote access: the peer may end it. */
	if (send_inv(&p, buf, local->lkey, local->lkey, peer, pmr, &wc) != IBV_WC_SUCCESS ||
	    !(wc.wc_flags & IBV_WC_WITH_INV) || wc.invalidated_rkey != local->lkey)
		die("Send with Invalidate of a region without remote access: %s",
		    ibv_wc_status_str(wc.status));
	free_pair(&p);

	/* A region whose PD has one QP, the one the peer sends to: it may end it. */
	struct ibv_pd *own = ibv_alloc_pd(ctx);
	struct ibv_cq *cq_a = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *cq_b = ibv_create_cq(ctx, 16, NULL, NULL, 0);

	if (!own || !cq_a || !cq_b)
		die("ibv_alloc_pd / ibv_create_cq: %s", strerror(errno));
	struct ibv_mr *mine = ibv_reg_mr(own, buf, LEN, QP_RIGHTS);

	if (!mine)
		die("ibv_reg_mr: %s", strerror(errno));
	p = (struct pair){ .cq_a = cq_a, .cq_b = cq_b, .a = rc_qp(ctx, own, cq_a, 0),
			   .b = rc_qp(ctx, pd, cq_b, 0) };
	connect_qp(p.a, QP_RIGHTS, gid, p.b->qp_num);
	connect_qp(p.b, QP_RIGHTS, gid, p.a->qp_num);
	if (send_inv(&p, buf, mine->lkey, mine->rkey, peer, pmr, &wc) != IBV_WC_SUCCESS ||
	    !(wc.wc_flags & IBV_WC_WITH_INV) || wc.invalidated_rkey != mine->rkey)
		die("Send with Invalidate of a region of the stream's own: %s",
		    ibv_wc_status_str(wc.status));
	expect_wc(p.cq_b, 20, IBV_WC_SUCCESS, "the Send with Invalidate");
	post_one(p.b, 22, IBV_WR_RDMA_READ, (uintptr_t)peer, 8, pmr->lkey, (uintptr_t)buf,
		 mine->rkey);
	expect_wc(p.cq_b, 22, IBV_WC_REM_ACCESS_ERR, "a Read through the region the peer ended");
	free_pair(&p);
	if (ibv_dereg_mr(shared) || ibv_dereg_mr(local) || ibv_dereg_mr(mine) ||
	    ibv_dealloc_pd(own))
		die("cleaning up: %s", strerror(errno));
	free(buf);
}

int main(void)
{
	struct ibv_device_attr a;

	ctx = open_dev();
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid: %s", strerror(errno));
	if (ibv_query_device(ctx, &a))
		die("ibv_query_device: %s", strerror(errno));
	if (!(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW) ||
	    !(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) || a.max_mw <= 0)
		die("memory windows not reported: cap flags %#x, max_mw %d",
		    a.device_cap_flags, a.max_mw);
	errno = 0;
	if (ibv_alloc_mw(pd, (enum ibv_mw_type)3) || errno != EINVAL)
		die("a window of type 3: %s, expected EINVAL", strerror(errno));

	uint8_t *buf = calloc(1, LEN), *peer = calloc(1, LEN);

	if (!buf || !peer)
		die("out of memory");
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mr *pmr = ibv_reg_mr(pd, peer, LEN, IBV_ACCESS_LOCAL_WRITE);

	if (!mr || !pmr)
		die("ibv_reg_mr: %s", strerror(errno));
	type1(buf, mr, peer, pmr);
	type2(buf, mr, peer, pmr);
	remote_invalidation(peer, pmr);
	if (ibv_dereg_mr(mr) || ibv_dereg_mr(pmr))
		die("ibv_dereg_mr once the windows are gone: %s", strerror(errno));
	if (ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("cleaning up: %s", strerror(errno));
	printf("mw ok: type 1 and type 2 windows: binds, access, refusals, invalidation; "
	       "remote invalidation of regions\n");
	return 0;
}
