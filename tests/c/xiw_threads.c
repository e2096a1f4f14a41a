// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Many application threads on xiw, through the real libibverbs.
 *
 *   xiw_threads qpex THREADS BATCHES
 *     THREADS threads post on one extended QP (ibv_wr_start .. ibv_wr_complete),
 *     each BATCHES batches of 1-4 RDMA Writes and Sends. Every WR must complete
 *     exactly once and successfully, every Send must arrive exactly once with its
 *     bytes, every Write must be in place with the bytes around it untouched.
 *
 *   xiw_threads churn SECONDS THREADS
 *     THREADS threads create, connect and destroy QP pairs as fast as they can
 *     (two device contexts per side), some used normally, some abandoned right
 *     after posting by one or both ends, while two steady QP pairs ping-pong
 *     checked messages. Every normal iteration and every steady message must
 *     complete successfully within 5 s with its bytes intact.
 *
 * The device is the first one libibverbs lists (or $XIW_DEVICE). Prints one
 * summary line on success; exits 1 with the reason on stderr otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "xiw_test.h"

#define LIMIT_NS (5ull * 1000000000ull)

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(mix(seed + i / 8) >> (8 * (i % 8)));
}

static int same(const uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(mix(seed + i / 8) >> (8 * (i % 8))))
			return 0;
	return 1;
}

static union ibv_gid gid_of(struct ibv_context *ctx)
{
	union ibv_gid g;

	if (ibv_query_gid(ctx, 1, 0, &g))
		die("ibv_query_gid: %s", strerror(errno));
	return g;
}

/* What the QPs here grant their peers. */
#define INIT_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static struct ibv_mr *reg(struct ibv_pd *pd, void *p, size_t n)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, p, n, IBV_ACCESS_LOCAL_WRITE |
					      IBV_ACCESS_REMOTE_WRITE);

	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));
	return mr;
}

static void *zalloc(size_t n)
{
	void *p = calloc(1, n);

	if (!p)
		die("out of memory");
	return p;
}

/* ---- qpex: many threads, one extended QP ---------------------------------- */

#define SLOT 32		/* target bytes per WR: at most 16 written, the rest guard */
#define MAXW 4		/* WRs per batch */
#define SEND_HDR 16
#define RECV_LEN 64
#define SQ_DEPTH 512
#define RQ_DEPTH 512

struct qpex {
	int threads, batches;
	struct ibv_qp *cqp, *sqp;	/* client (extended) and server QPs */
	struct ibv_qp_ex *x;
	struct ibv_cq *ccq, *scq;
	uint8_t *src, *dst, *rbuf;
	struct ibv_mr *src_mr, *dst_mr, *rbuf_mr;
	uint8_t *kind;			/* per WR: 0 none, 1 write, 2 send */
	_Atomic uint8_t *done;		/* per WR: completions seen at the client */
	_Atomic uint8_t *arrived;	/* per WR: Sends seen at the server */
	atomic_long inflight;		/* WRs posted, not yet completed */
	atomic_long sends_out;		/* Sends posted */
	atomic_long sends_in;		/* Sends received (and their receive reposted) */
	atomic_long completions, received;
	atomic_int stop, failed;
	long expect_wr, expect_send;
};

static size_t wr_index(const struct qpex *q, int t, int i, int j)
{
	return ((size_t)t * q->batches + i) * MAXW + j;
}

static uint64_t wr_seed(size_t idx)
{
	return mix(idx * 0x1000193ull + 7);
}

static void fail(atomic_int *flag, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "xiw_threads: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	atomic_store(flag, 1);
	/* Debugging aid: keep the process as it is, for a debugger to attach. */
	if (getenv("XIW_THREADS_HOLD"))
		for (;;)
			pause();
}

static void post_rbuf(struct qpex *q, uint64_t k)
{
	struct ibv_sge s = {
		.addr = (uintptr_t)(q->rbuf + (k % RQ_DEPTH) * RECV_LEN),
		.length = RECV_LEN,
		.lkey = q->rbuf_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = k % RQ_DEPTH, .sg_list = &s, .num_sge = 1 }, *bad;

	if (ibv_post_recv(q->sqp, &wr, &bad))
		die("ibv_post_recv: %s", strerror(errno));
}

static void *qpex_poster(void *arg)
{
	struct qpex *q = ((void **)arg)[0];
	int t = (int)(intptr_t)((void **)arg)[1];
	uint64_t rnd = mix(0xabcdef + t);

	for (int i = 0; i < q->batches && !atomic_load(&q->failed); i++) {
		int n = 1 + (int)((rnd = mix(rnd)) % MAXW);
		int sends = 0;
		uint64_t t0 = now_ns();

		for (int j = 0; j < n; j++)
			sends += q->kind[wr_index(q, t, i, j)] == 2;
		/* Room on the SQ and in the server's receive queue. */
		while (atomic_load(&q->inflight) + n > SQ_DEPTH ||
		       atomic_load(&q->sends_out) + sends - atomic_load(&q->sends_in) > RQ_DEPTH) {
			if (atomic_load(&q->failed))
				return NULL;
			if (now_ns() - t0 > LIMIT_NS) {
				fail(&q->failed, "thread %d batch %d: no room for 5 s", t, i);
				return NULL;
			}
			sched_yield();
		}
		atomic_fetch_add(&q->inflight, n);
		atomic_fetch_add(&q->sends_out, sends);
		ibv_wr_start(q->x);
		for (int j = 0; j < n; j++) {
			size_t idx = wr_index(q, t, i, j);
			uint8_t *src = q->src + idx * SLOT;
			uint32_t len = 1 + (uint32_t)(mix(wr_seed(idx)) % 16);

			q->x->wr_id = idx;
			q->x->wr_flags = IBV_SEND_SIGNALED;
			if (q->kind[idx] == 1) {
				ibv_wr_rdma_write(q->x, q->dst_mr->rkey,
						  (uintptr_t)(q->dst + idx * SLOT));
				ibv_wr_set_sge(q->x, q->src_mr->lkey, (uintptr_t)src, len);
			} else {
				uint64_t h[2] = { idx, len };

				memcpy(src, h, SEND_HDR);
				ibv_wr_send(q->x);
				if (idx % 3 == 0)
					ibv_wr_set_inline_data(q->x, src, SEND_HDR + len);
				else
					ibv_wr_set_sge(q->x, q->src_mr->lkey, (uintptr_t)src,
						       SEND_HDR + len);
			}
			if (idx % 5 == 0)
				sched_yield();	/* let another thread try to barge in */
		}
		int r = ibv_wr_complete(q->x);

		if (r) {
			fail(&q->failed, "thread %d batch %d: ibv_wr_complete: %s", t, i,
			     strerror(r));
			return NULL;
		}
	}
	return NULL;
}

static void *qpex_client_poller(void *arg)
{
	struct qpex *q = arg;
	struct ibv_wc wc[32];
	uint64_t last = now_ns();

	while (atomic_load(&q->completions) < q->expect_wr && !atomic_load(&q->failed)) {
		int n = ibv_poll_cq(q->ccq, 32, wc);

		if (n < 0) {
			fail(&q->failed, "client ibv_poll_cq: %d", n);
			break;
		}
		if (n == 0 && now_ns() - last > LIMIT_NS) {
			fail(&q->failed, "client: no completion for 5 s (%ld of %ld)",
			     atomic_load(&q->completions), q->expect_wr);
			break;
		}
		for (int k = 0; k < n; k++) {
			uint64_t idx = wc[k].wr_id;

			last = now_ns();
			if (wc[k].status != IBV_WC_SUCCESS) {
				fail(&q->failed, "client WR %" PRIu64 ": %s", idx,
				     ibv_wc_status_str(wc[k].status));
				continue;
			}
			if (idx >= (uint64_t)q->threads * q->batches * MAXW || !q->kind[idx] ||
			    atomic_fetch_add(&q->done[idx], 1)) {
				fail(&q->failed, "client: completion for WR %" PRIu64
				     " that was not posted or completed already", idx);
				continue;
			}
			atomic_fetch_sub(&q->inflight, 1);
			atomic_fetch_add(&q->completions, 1);
		}
	}
	return NULL;
}

static void *qpex_server(void *arg)
{
	struct qpex *q = arg;
	struct ibv_wc wc[32];
	uint64_t last = now_ns(), posted = RQ_DEPTH;

	while (atomic_load(&q->received) < q->expect_send && !atomic_load(&q->failed)) {
		int n = ibv_poll_cq(q->scq, 32, wc);

		if (n < 0) {
			fail(&q->failed, "server ibv_poll_cq: %d", n);
			break;
		}
		if (n == 0 && now_ns() - last > LIMIT_NS) {
			fail(&q->failed, "server: no receive for 5 s (%ld of %ld)",
			     atomic_load(&q->received), q->expect_send);
			break;
		}
		for (int k = 0; k < n; k++) {
			uint8_t *m = q->rbuf + wc[k].wr_id * RECV_LEN;
			uint64_t h[2];

			last = now_ns();
			if (wc[k].status != IBV_WC_SUCCESS) {
				fail(&q->failed, "server receive: %s",
				     ibv_wc_status_str(wc[k].status));
				continue;
			}
			memcpy(h, m, sizeof(h));
			if (wc[k].byte_len < SEND_HDR || h[0] >= (uint64_t)q->threads * q->batches * MAXW ||
			    q->kind[h[0]] != 2 || h[1] != wc[k].byte_len - SEND_HDR ||
			    h[1] != 1 + mix(wr_seed(h[0])) % 16 ||
			    !same(m + SEND_HDR, h[1], wr_seed(h[0]))) {
				fail(&q->failed, "server: a Send arrived with wrong bytes "
				     "(length %u, says WR %" PRIu64 " of length %" PRIu64 ")",
				     wc[k].byte_len, h[0], h[1]);
				continue;
			}
			if (atomic_fetch_add(&q->arrived[h[0]], 1)) {
				fail(&q->failed, "server: Send of WR %" PRIu64 " arrived twice", h[0]);
				continue;
			}
			atomic_fetch_add(&q->received, 1);
			post_rbuf(q, posted++);
			atomic_fetch_add(&q->sends_in, 1);
		}
	}
	return NULL;
}

static int run_qpex(int threads, int batches)
{
	struct ibv_context *cctx = open_dev(), *sctx = open_dev();
	struct ibv_pd *cpd = ibv_alloc_pd(cctx), *spd = ibv_alloc_pd(sctx);
	struct qpex *q = zalloc(sizeof(*q));
	size_t wrs = (size_t)threads * batches * MAXW;

	if (!cpd || !spd)
		die("ibv_alloc_pd: %s", strerror(errno));
	q->threads = threads;
	q->batches = batches;
	q->ccq = ibv_create_cq(cctx, 4096, NULL, NULL, 0);
	q->scq = ibv_create_cq(sctx, 4096, NULL, NULL, 0);
	if (!q->ccq || !q->scq)
		die("ibv_create_cq: %s", strerror(errno));

	struct ibv_qp_init_attr_ex xa = {
		.send_cq = q->ccq, .recv_cq = q->ccq,
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = cpd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND,
	};
	q->cqp = ibv_create_qp_ex(cctx, &xa);
	if (!q->cqp)
		die("ibv_create_qp_ex: %s", strerror(errno));
	q->x = ibv_qp_to_qp_ex(q->cqp);
	struct ibv_qp_init_attr sa = {
		.send_cq = q->scq, .recv_cq = q->scq,
		.cap = { .max_send_wr = 1, .max_recv_wr = RQ_DEPTH, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	q->sqp = ibv_create_qp(spd, &sa);
	if (!q->sqp)
		die("ibv_create_qp: %s", strerror(errno));

	q->src = zalloc(wrs * SLOT);
	q->dst = zalloc(wrs * SLOT);
	q->rbuf = zalloc(RQ_DEPTH * RECV_LEN);
	q->kind = zalloc(wrs);
	q->done = zalloc(wrs);
	q->arrived = zalloc(wrs);
	q->src_mr = reg(cpd, q->src, wrs * SLOT);
	q->dst_mr = reg(spd, q->dst, wrs * SLOT);
	q->rbuf_mr = reg(spd, q->rbuf, RQ_DEPTH * RECV_LEN);

	/* Decide every batch up front: its size, and each WR's kind and bytes. */
	for (int t = 0; t < threads; t++) {
		uint64_t rnd = mix(0xabcdef + t);

		for (int i = 0; i < batches; i++) {
			int n = 1 + (int)((rnd = mix(rnd)) % MAXW);

			for (int j = 0; j < n; j++) {
				size_t idx = wr_index(q, t, i, j);
				uint32_t len = 1 + (uint32_t)(mix(wr_seed(idx)) % 16);

				q->kind[idx] = (mix(idx ^ 0x5555) & 1) ? 1 : 2;
				q->expect_wr++;
				if (q->kind[idx] == 2) {
					q->expect_send++;
					fill(q->src + idx * SLOT + SEND_HDR, len, wr_seed(idx));
				} else {
					fill(q->src + idx * SLOT, len, wr_seed(idx));
				}
			}
		}
	}
	union ibv_gid cg = gid_of(cctx), sg = gid_of(sctx);

	if (to_init(q->cqp, INIT_ACCESS) || to_init(q->sqp, INIT_ACCESS))
		die("modify_qp to INIT: %s", strerror(errno));
	for (uint64_t k = 0; k < RQ_DEPTH; k++)
		post_rbuf(q, k);
	if (to_rts(q->cqp, sg, q->sqp->qp_num) || to_rts(q->sqp, cg, q->cqp->qp_num))
		die("connecting the QPs: %s", strerror(errno));

	pthread_t *th = zalloc(sizeof(pthread_t) * threads), cpoll, srv;
	void **args = zalloc(sizeof(void *) * 2 * threads);
	uint64_t t0 = now_ns();

	pthread_create(&cpoll, NULL, qpex_client_poller, q);
	pthread_create(&srv, NULL, qpex_server, q);
	for (int t = 0; t < threads; t++) {
		args[2 * t] = q;
		args[2 * t + 1] = (void *)(intptr_t)t;
		pthread_create(&th[t], NULL, qpex_poster, &args[2 * t]);
	}
	for (int t = 0; t < threads; t++)
		pthread_join(th[t], NULL);
	pthread_join(cpoll, NULL);
	pthread_join(srv, NULL);
	if (atomic_load(&q->failed))
		return 1;

	/*
	 * Every Send has arrived, and each thread's last Send followed its Writes
	 * on the same stream: the Writes are placed. Send one more, posted after
	 * all completions, so that the very last Writes are placed too.
	 */
	atomic_store(&q->failed, 0);
	q->expect_send++;
	{
		size_t idx = wrs;	/* outside the table: the closing Send */
		uint8_t fin[SEND_HDR] = { 0 };
		struct ibv_sge s = { (uintptr_t)fin, SEND_HDR, 0 };
		struct ibv_send_wr wr = { .wr_id = idx, .sg_list = &s, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *bad;
		struct ibv_wc wc;
		uint64_t start = now_ns();
		int got = 0;

		if (ibv_post_send(q->cqp, &wr, &bad))
			die("closing send: %s", strerror(errno));
		while (got < 2 && now_ns() - start < LIMIT_NS) {
			if (ibv_poll_cq(q->ccq, 1, &wc) == 1) {
				if (wc.status)
					die("closing send: %s", ibv_wc_status_str(wc.status));
				got++;
			}
			if (ibv_poll_cq(q->scq, 1, &wc) == 1) {
				if (wc.status || wc.byte_len != SEND_HDR)
					die("closing receive: %s, %u bytes",
					    ibv_wc_status_str(wc.status), wc.byte_len);
				got++;
			}
		}
		if (got < 2)
			die("closing send/receive did not complete within 5 s");
	}

	long bad_sends = 0, bad_writes = 0, bad_bytes = 0;

	for (size_t idx = 0; idx < wrs; idx++) {
		const uint8_t *d = q->dst + idx * SLOT;
		uint32_t len = 1 + (uint32_t)(mix(wr_seed(idx)) % 16), w = 0;

		if (q->kind[idx] && atomic_load(&q->done[idx]) != 1)
			die("WR %zu completed %d times", idx, atomic_load(&q->done[idx]));
		if (q->kind[idx] == 2 && atomic_load(&q->arrived[idx]) != 1)
			bad_sends++;
		if (q->kind[idx] == 1) {
			w = len;
			if (!same(d, len, wr_seed(idx)))
				bad_writes++;
		}
		for (size_t b = w; b < SLOT; b++)
			bad_bytes += d[b] != 0;
	}
	if (bad_sends || bad_writes || bad_bytes)
		die("%ld Sends missing, %ld Writes not in place, %ld bytes written "
		    "outside any Write", bad_sends, bad_writes, bad_bytes);
	/* Misuse: completing a batch never started fails and posts nothing. */
	if (ibv_wr_complete(q->x) != EINVAL)
		die("ibv_wr_complete without ibv_wr_start did not answer EINVAL");
	printf("qpex: %d threads x %d batches: %ld WRs (%ld Sends) completed once each, "
	       "every byte checked, %.0f WR/s\n", threads, batches, q->expect_wr,
	       q->expect_send - 1, q->expect_wr / ((now_ns() - t0) / 1e9));
	return 0;
}

/* ---- churn: QPs created, connected and destroyed beside steady traffic ---- */

#define CTXS 2
#define MSG 64

struct side {
	struct ibv_context *ctx[CTXS];
	struct ibv_pd *pd[CTXS];
	union ibv_gid gid[CTXS];
};

struct churn {
	struct side a, b;
	uint64_t until;
	atomic_int failed;
	atomic_long normal, abandoned, steady;
	atomic_ulong slowest_ns;	/* the slowest normal iteration */
};

struct endpoint {
	struct ibv_cq *cq;
	uint8_t *buf;
	struct ibv_mr *mr;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
};

static void ep_init(struct endpoint *e, struct ibv_context *ctx, struct ibv_pd *pd)
{
	e->ctx = ctx;
	e->pd = pd;
	e->cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!e->cq)
		die("ibv_create_cq: %s", strerror(errno));
	e->buf = zalloc(2 * MSG);
	e->mr = reg(pd, e->buf, 2 * MSG);
}

static void ep_fini(struct endpoint *e)
{
	int r;

	ibv_dereg_mr(e->mr);
	free(e->buf);
	r = ibv_destroy_cq(e->cq);
	if (r)
		die("ibv_destroy_cq: %s", strerror(r));
}

static struct ibv_qp *new_qp(struct endpoint *e)
{
	struct ibv_qp_init_attr a = {
		.send_cq = e->cq, .recv_cq = e->cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = MSG },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(e->pd, &a);

	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	if (to_init(qp, INIT_ACCESS))
		die("modify_qp to INIT: %s", strerror(errno));
	return qp;
}

static void destroy_qp(struct ibv_qp *qp)
{
	int r = ibv_destroy_qp(qp);

	if (r)
		die("ibv_destroy_qp: %s", strerror(r));
}

static void post_endpoint_recv(struct ibv_qp *qp, struct endpoint *e, uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)e->buf, MSG, e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;

	if (ibv_post_recv(qp, &wr, &bad))
		die("ibv_post_recv: %s", strerror(errno));
}

/* A Write of the message into the peer's second half, then the Send of it. */
static int post_write_send(struct ibv_qp *qp, struct endpoint *e, struct endpoint *peer,
			   uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)e->buf, MSG, e->mr->lkey };
	struct ibv_send_wr send = { .wr_id = id | 1, .sg_list = &s, .num_sge = 1,
				    .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr write = { .wr_id = id, .next = &send, .sg_list = &s, .num_sge = 1,
				     .opcode = IBV_WR_RDMA_WRITE,
				     .send_flags = IBV_SEND_SIGNALED,
				     .wr.rdma = { (uintptr_t)(peer->buf + MSG), peer->mr->rkey } };
	struct ibv_send_wr *bad;

	return ibv_post_send(qp, &write, &bad);
}

/* Waits for completions with wr_id in [id, id + n) on `cq`; others are stale. */
static int wait_cq(struct ibv_cq *cq, uint64_t id, int n, const char *who, const char *what,
		   atomic_int *failed)
{
	uint64_t start = now_ns();
	struct ibv_wc wc;

	while (n > 0) {
		int r = ibv_poll_cq(cq, 1, &wc);

		if (r < 0) {
			fail(failed, "%s: ibv_poll_cq %d", who, r);
			return -1;
		}
		if (r == 0) {
			if (now_ns() - start > LIMIT_NS) {
				fail(failed, "%s: iteration %#" PRIx64 ": %d completion(s) of "
				     "%s missing after 5 s", who, id, n, what);
				return -1;
			}
			continue;
		}
		if ((wc.wr_id & ~1ull) != id)
			continue;	/* a flushed WR of an abandoned iteration */
		if (wc.status != IBV_WC_SUCCESS) {
			fail(failed, "%s: iteration %#" PRIx64 " WR %s (vendor %u)", who, id,
			     ibv_wc_status_str(wc.status), wc.vendor_err);
			return -1;
		}
		if (wc.opcode == IBV_WC_RECV && wc.byte_len != MSG) {
			fail(failed, "%s: received %u bytes, not %d", who, wc.byte_len, MSG);
			return -1;
		}
		n--;
	}
	return 0;
}

static void *churn_worker(void *arg)
{
	struct churn *c = ((void **)arg)[0];
	int w = (int)(intptr_t)((void **)arg)[1];
	struct endpoint ea[CTXS], eb[CTXS];
	uint64_t rnd = mix(0x1234 + w);
	char who[64];

	for (int k = 0; k < CTXS; k++) {
		ep_init(&ea[k], c->a.ctx[k], c->a.pd[k]);
		ep_init(&eb[k], c->b.ctx[k], c->b.pd[k]);
	}
	for (uint64_t it = 1; now_ns() < c->until && !atomic_load(&c->failed); it++) {
		int ka = (int)((rnd = mix(rnd)) % CTXS), kb = (int)((rnd = mix(rnd)) % CTXS);
		int mode = (int)((rnd = mix(rnd)) % 8);	/* 0-4 normal, 5-7 abandoned */
		struct endpoint *a = &ea[ka], *b = &eb[kb];
		struct ibv_qp *qa = new_qp(a), *qb = new_qp(b);
		uint64_t id = ((uint64_t)w << 48) | (it << 1), t0 = now_ns();

		struct ibv_wc stale[16];

		/* Forget what the QPs of abandoned iterations left in the CQs. */
		while (ibv_poll_cq(a->cq, 16, stale) > 0 || ibv_poll_cq(b->cq, 16, stale) > 0)
			;
		snprintf(who, sizeof(who), "worker %d (QPs %#x/%#x)", w, qa->qp_num, qb->qp_num);
		fill(a->buf, MSG, id);
		memset(b->buf, 0, 2 * MSG);
		post_endpoint_recv(qb, b, id);
		if (to_rts(qa, c->b.gid[kb], qb->qp_num) || to_rts(qb, c->a.gid[ka], qa->qp_num)) {
			fail(&c->failed, "%s: connecting: %s", who, strerror(errno));
			mode = 7;
		} else if (post_write_send(qa, a, b, id)) {
			fail(&c->failed, "%s: ibv_post_send: %s", who, strerror(errno));
			mode = 7;
		} else if (mode < 5) {
			if (!wait_cq(a->cq, id, 2, who, "the Write and Send", &c->failed) &&
			    !wait_cq(b->cq, id, 1, who, "the receive", &c->failed)) {
				uint64_t took = now_ns() - t0;
				unsigned long prev = atomic_load(&c->slowest_ns);

				while (took > prev &&
				       !atomic_compare_exchange_weak(&c->slowest_ns, &prev, took))
					;
				if (same(b->buf, MSG, id) && same(b->buf + MSG, MSG, id))
					atomic_fetch_add(&c->normal, 1);
				else
					fail(&c->failed, "%s: the Send or Write arrived with "
					     "wrong bytes", who);
			}
		} else {
			atomic_fetch_add(&c->abandoned, 1);
		}
		/* Mode 5: the requester goes first, 6: the responder, else both at once. */
		if (mode == 6) {
			destroy_qp(qb);
			qb = NULL;
		}
		destroy_qp(qa);
		if (mode == 5)
			usleep((useconds_t)(mix(rnd) % 2000));
		if (qb)
			destroy_qp(qb);
	}
	for (int k = 0; k < CTXS; k++) {
		ep_fini(&ea[k]);
		ep_fini(&eb[k]);
	}
	return NULL;
}

static void *churn_steady(void *arg)
{
	struct churn *c = ((void **)arg)[0];
	int s = (int)(intptr_t)((void **)arg)[1];
	struct endpoint a, b;
	struct ibv_qp *qa, *qb;
	char who[64];

	ep_init(&a, c->a.ctx[s % CTXS], c->a.pd[s % CTXS]);
	ep_init(&b, c->b.ctx[s % CTXS], c->b.pd[s % CTXS]);
	qa = new_qp(&a);
	qb = new_qp(&b);
	snprintf(who, sizeof(who), "steady pair %d (QPs %#x/%#x)", s, qa->qp_num, qb->qp_num);
	if (to_rts(qa, c->b.gid[s % CTXS], qb->qp_num) ||
	    to_rts(qb, c->a.gid[s % CTXS], qa->qp_num))
		die("%s: connecting: %s", who, strerror(errno));
	for (uint64_t it = 1; now_ns() < c->until && !atomic_load(&c->failed); it++) {
		uint64_t id = ((uint64_t)(0xff00 | s) << 48) | (it << 1);

		fill(a.buf, MSG, id);
		post_endpoint_recv(qb, &b, id);
		if (post_write_send(qa, &a, &b, id)) {
			fail(&c->failed, "%s: ibv_post_send: %s", who, strerror(errno));
			break;
		}
		if (wait_cq(a.cq, id, 2, who, "the Write and Send", &c->failed) ||
		    wait_cq(b.cq, id, 1, who, "the receive", &c->failed))
			break;
		if (!same(b.buf, MSG, id) || !same(b.buf + MSG, MSG, id)) {
			fail(&c->failed, "%s: message %" PRIu64 " arrived with wrong bytes", who, it);
			break;
		}
		atomic_fetch_add(&c->steady, 1);
		usleep(100);	/* steady, not flooding: the churn gets the CPUs */
	}
	destroy_qp(qa);
	destroy_qp(qb);
	ep_fini(&a);
	ep_fini(&b);
	return NULL;
}

static void side_open(struct side *s)
{
	for (int k = 0; k < CTXS; k++) {
		s->ctx[k] = open_dev();
		s->pd[k] = ibv_alloc_pd(s->ctx[k]);
		if (!s->pd[k])
			die("ibv_alloc_pd: %s", strerror(errno));
		s->gid[k] = gid_of(s->ctx[k]);
	}
}

static int run_churn(int seconds, int threads)
{
	struct churn *c = zalloc(sizeof(*c));
	pthread_t *th = zalloc(sizeof(pthread_t) * (threads + 2));
	void **args = zalloc(sizeof(void *) * 2 * (threads + 2));

	side_open(&c->a);
	side_open(&c->b);
	c->until = now_ns() + (uint64_t)seconds * 1000000000ull;
	for (int t = 0; t < threads + 2; t++) {
		args[2 * t] = c;
		args[2 * t + 1] = (void *)(intptr_t)(t < threads ? t : t - threads);
		pthread_create(&th[t], NULL, t < threads ? churn_worker : churn_steady,
			       &args[2 * t]);
	}
	for (int t = 0; t < threads + 2; t++)
		pthread_join(th[t], NULL);
	if (atomic_load(&c->failed))
		return 1;
	if (atomic_load(&c->normal) == 0 || atomic_load(&c->steady) == 0)
		die("nothing ran: %ld normal iterations, %ld steady messages",
		    atomic_load(&c->normal), atomic_load(&c->steady));
	printf("churn: %d s, %d threads: %ld normal iterations and %ld steady messages, "
	       "all complete and intact (slowest %.1f ms); %ld iterations abandoned\n",
	       seconds, threads, atomic_load(&c->normal), atomic_load(&c->steady),
	       atomic_load(&c->slowest_ns) / 1e6, atomic_load(&c->abandoned));
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "qpex"))
		return run_qpex(atoi(argv[2]), atoi(argv[3]));
	if (argc == 4 && !strcmp(argv[1], "churn"))
		return run_churn(atoi(argv[2]), atoi(argv[3]));
	fprintf(stderr, "usage: xiw_threads qpex THREADS BATCHES | churn SECONDS THREADS\n");
	return 2;
}
