// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Many application threads on the same xiw objects at once, through the real
 * libibverbs: one context, one PD, two QP pairs in the process, two shared CQs.
 *
 *   xiw_shared ROUNDS WRS [POSTERS [POLLERS]]
 *
 *   A1 -> B1: B1 receives on its own receive queue.
 *   A2 -> B2: B2 receives from an SRQ.
 *   A1 and A2 are extended QPs. POSTERS threads (default 4) post to each of
 *   them at the same time, half through ibv_post_send (lists of 1-4 WRs),
 *   half through ibv_wr_start .. ibv_wr_complete (batches of 1-4): WRS RDMA
 *   Writes and Sends each (1-3 SGEs or inline), every one signaled with a
 *   wr_id of its own, each thread's last WR a Send. A Write lands in a slot of
 *   its own in one target MR; a Send carries its wr_id in its first 8 bytes
 *   and then bytes derived from it.
 *   A1 and A2 complete on one send CQ, B1 and B2 on one receive CQ; POLLERS
 *   threads (default 3; the first one with ibv_start_poll .. ibv_end_poll)
 *   poll both at once.
 *   Two threads per receive queue (B1's RQ, the SRQ) post receives at the
 *   same time, each into a buffer of its own (not reused within a round).
 *   Meanwhile one thread registers and deregisters MRs, one creates and
 *   destroys CQs (ibv_create_cq and ibv_create_cq_ex), one creates, connects,
 *   uses (one checked Send, completing on the shared CQs) and destroys QP
 *   pairs.
 *   A round ends when every WR and receive has completed and been checked;
 *   the next one (ROUNDS in all) reuses the QPs, CQs and buffers, with
 *   wr_ids of its own, while the pollers and the churn go on throughout.
 *
 * A Send is posted only after a receive waiting for it has been posted
 * (ibv_post_recv returned): an untagged message without a receive would end
 * the stream with a Terminate (RFC 5040 section 7.2).
 *
 * Checked: every completion is successful, names a WR that was posted and
 * has not completed before, on the right QP with the right opcode; every
 * receive holds the bytes of the Send it names, with the right length, and
 * every Send arrives exactly once; every Write slot holds its bytes and no
 * byte outside a slot (target MR, receive buffers) changed. The Writes are
 * checked once every Send has arrived: each poster's last WR is a Send on the
 * QP of its Writes, and a Send is delivered only after what came before it on
 * the stream is placed. A watchdog turns a thread that stops making progress,
 * or traffic that stops completing, into a failure ("possible deadlock").
 * $XIW_SHARED_SLOW multiplies the time limits (for runs under valgrind).
 *
 * The device is the first one libibverbs lists (or $XIW_DEVICE). Prints one
 * summary line on success; exits 1 with the reason on stderr otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "xiw_test.h"

#define NQ 2			/* sending QPs: A1 -> B1 (its own RQ), A2 -> B2 (SRQ) */
#define SQ_DEPTH 256		/* WRs in flight per sending QP */
#define RQ_DEPTH 256		/* receives waiting, B1's RQ and the SRQ each */
#define CQ_DEPTH 2048
#define HDR 8			/* a Send's first bytes: its wr_id */
#define MAX_SEND 256		/* a Send's length, header included */
#define RSLOT 272		/* receive buffer: MAX_SEND for the Send, then a guard */
#define MAX_WRITE 8192
#define MAX_INLINE 256
#define RND_BYTES (1u << 20)	/* the bytes every payload is a window of */
#define MAX_BATCH 4
#define RECV_POSTERS 2		/* per receive queue */
/*
 * Time limits, in seconds; $XIW_SHARED_SLOW multiplies them (for runs under
 * valgrind, which is many times slower).
 */
#define STALL_S (10 * slow)	/* no progress for this long: possible deadlock */
#define FINAL_S (30 * slow)	/* for the last completions once every WR is posted */
#define CHURN_S (5 * slow)	/* for the completions of a churn QP pair's Send */
#define CHURN_MSG 64
#define CHURN_MRS 8		/* MRs the MR churn keeps registered at once */

/*
 * wr_id: a tag in the top 4 bits; for a WR of a poster and for a receive, the
 * round in bits 40-55, the poster (or receive queue) in bits 32-39 and the
 * WR's (or receive's) sequence number in the low 32 bits.
 */
#define TAG_SHIFT 60
enum { TAG_WR = 1, TAG_RECV = 2, TAG_CHURN = 3 };

static atomic_uint round_now;
static int slow = 1;

static uint64_t id_of(unsigned int tag, int who, uint32_t s)
{
	return ((uint64_t)tag << TAG_SHIFT) | ((uint64_t)atomic_load(&round_now) << 40) |
	       ((uint64_t)who << 32) | s;
}

static uint64_t wr_id_of(int t, uint32_t s)
{
	return id_of(TAG_WR, t, s);
}

static uint64_t recv_id_of(int q, uint32_t slot)
{
	return id_of(TAG_RECV, q, slot);
}

/* Whether `id` has `tag` and belongs to this round; its "who" and number. */
static int id_is(uint64_t id, unsigned int tag, int *who, uint32_t *s)
{
	*who = (int)((id >> 32) & 0xff);
	*s = (uint32_t)id;
	return id >> TAG_SHIFT == tag && ((id >> 40) & 0xffff) == atomic_load(&round_now);
}

/* ---- state ---------------------------------------------------------------- */

struct state {
	int wrs, posters, pollers;	/* WRs per poster, posters per QP, pollers */
	int nposters;			/* NQ * posters */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	struct ibv_cq_ex *scx, *rcx;	/* the shared send and receive CQs */
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *a[NQ], *b[NQ];
	struct ibv_qp_ex *ax[NQ];
	struct ibv_srq *srq;

	uint8_t *rnd;			/* payload source: WR idx sends rnd[off(idx)..] */
	struct ibv_mr *rnd_mr;
	uint64_t *hdr;			/* each Send's header (its wr_id) */
	struct ibv_mr *hdr_mr;
	uint8_t *dst;			/* the Writes' target */
	size_t dst_len;
	struct ibv_mr *dst_mr;
	uint8_t *rbuf[NQ];		/* receive buffers, one per receive */
	struct ibv_mr *rbuf_mr[NQ];

	/* Per WR, index t * wrs + s: decided before any thread starts. */
	uint8_t *is_send;
	uint32_t *len;			/* Send: header included */
	size_t *woff;			/* Write: its slot in dst */
	/* Per WR, as it happens. */
	_Atomic uint8_t *posted, *done, *arrived;

	/* Per receive queue. */
	long nrecv[NQ];			/* receives to post: the Sends aimed at it */
	_Atomic uint8_t *rposted[NQ], *rdone[NQ];
	_Atomic uint32_t *rlen[NQ];	/* byte_len of each receive */
	atomic_long recv_alloc[NQ];	/* receive slots taken by the posters */
	atomic_long recv_posted[NQ];	/* receives whose ibv_post_recv returned */
	atomic_long recv_used[NQ];	/* receives completed and checked */
	atomic_long credits[NQ];	/* Sends allowed to post: <= recv_posted */
	atomic_long inflight[NQ];	/* SQ slots taken, not completed yet */

	long expect_wr, expect_send, writes;	/* per round */
	uint64_t write_bytes, send_bytes;
	atomic_long send_wcs, recv_wcs;		/* this round's */
	atomic_long posted_api[2];	/* WRs posted by ibv_post_send, by ibv_wr_* */
	atomic_long polled_ex;		/* completions read through ibv_start_poll */
	atomic_int traffic_done, stop_churn, stop_pollers, stop_watchdog;

	/* The QP churn's current pair, for the pollers to check against. */
	atomic_ulong churn_it;		/* 0: no pair in use */
	atomic_uint churn_qpa, churn_qpb;
	atomic_int churn_seen;		/* 1: its Send completed, 2: its receive */
	atomic_long mr_churn, cq_churn, qp_churn;
};

static struct state S;

/* ---- failing, and the watchdog -------------------------------------------- */

static void counters(FILE *f)
{
	fprintf(f, "  round %u: send completions %ld of %ld, receive completions %ld of %ld, "
		"receives posted %ld/%ld (RQ) %ld/%ld (SRQ), in flight %ld/%ld, "
		"credits %ld/%ld; churn: %ld MRs, %ld CQs, %ld QP pairs\n",
		atomic_load(&round_now), atomic_load(&S.send_wcs), S.expect_wr,
		atomic_load(&S.recv_wcs), S.expect_send, atomic_load(&S.recv_posted[0]), S.nrecv[0],
		atomic_load(&S.recv_posted[1]), S.nrecv[1], atomic_load(&S.inflight[0]),
		atomic_load(&S.inflight[1]),
		atomic_load(&S.credits[0]), atomic_load(&S.credits[1]),
		atomic_load(&S.mr_churn), atomic_load(&S.cq_churn), atomic_load(&S.qp_churn));
}

/*
 * Prints the reason and the counters, and exits 1 at once: the other threads
 * may be stuck (or keep failing), so nothing is torn down.
 */
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
	static atomic_int failing;
	va_list ap;

	if (atomic_exchange(&failing, 1))
		for (;;)
			pause();	/* the first failure exits */
	va_start(ap, fmt);
	fprintf(stderr, "xiw_shared: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	counters(stderr);
	fflush(stderr);
	_exit(1);
}

/*
 * The first few WRs posted but not completed and receives posted but not
 * completed, for a failure message. Read while other threads may change
 * them: a hint, not a check.
 */
static const char *outstanding(void)
{
	static char text[512];
	size_t total = (size_t)S.nposters * S.wrs, used = 0;
	int shown = 0;

	used += (size_t)snprintf(text, sizeof(text), "not completed:");
	for (size_t idx = 0; S.posted && idx < total && shown < 6; idx++)
		if (atomic_load(&S.posted[idx]) && !atomic_load(&S.done[idx])) {
			used += (size_t)snprintf(text + used, sizeof(text) - used, " WR %#" PRIx64,
						 wr_id_of((int)(idx / S.wrs),
							  (uint32_t)(idx % S.wrs)));
			shown++;
		}
	for (int q = 0; q < NQ; q++)
		for (long k = 0; S.rposted[q] && k < S.nrecv[q] && shown < 12; k++)
			if (atomic_load(&S.rposted[q][k]) && !atomic_load(&S.rdone[q][k])) {
				used += (size_t)snprintf(text + used, sizeof(text) - used,
							 " receive %#" PRIx64,
							 recv_id_of(q, (uint32_t)k));
				shown++;
			}
	if (!shown)
		snprintf(text + used, sizeof(text) - used, " none");
	return text;
}

/* A thread the watchdog follows: it must bump `n` at least every STALL_S. */
struct beat {
	char name[40];
	atomic_ulong n;
	atomic_int live;
};

#define MAX_BEATS 128
static struct beat beats[MAX_BEATS];
static atomic_int nbeats;

static struct beat *beat_new(const char *fmt, int i)
{
	int k = atomic_fetch_add(&nbeats, 1);

	if (k >= MAX_BEATS)
		die("too many threads");
	snprintf(beats[k].name, sizeof(beats[k].name), fmt, i);
	atomic_store(&beats[k].live, 1);
	return &beats[k];
}

static void beat(struct beat *b)
{
	atomic_fetch_add_explicit(&b->n, 1, memory_order_relaxed);
}

static void *watchdog(void *arg)
{
	uint64_t seen[MAX_BEATS] = { 0 }, since[MAX_BEATS], t = now_ns();
	long work = -1;
	uint64_t work_since = t;

	(void)arg;
	for (int k = 0; k < MAX_BEATS; k++)
		since[k] = t;
	while (!atomic_load(&S.stop_watchdog)) {
		char stuck[512] = "";
		size_t used = 0;
		long w;

		usleep(200000);
		t = now_ns();
		w = atomic_load(&S.send_wcs) + atomic_load(&S.recv_wcs);
		for (int k = 0; k < atomic_load(&nbeats); k++) {
			uint64_t n = atomic_load(&beats[k].n);

			if (n != seen[k] || !atomic_load(&beats[k].live)) {
				seen[k] = n;
				since[k] = t;
			} else if (t - since[k] > STALL_S * 1000000000ull &&
				   used < sizeof(stuck) - 48) {
				used += (size_t)snprintf(stuck + used, sizeof(stuck) - used, " %s",
							 beats[k].name);
			}
		}
		if (used)
			fail("no progress for %d s: possible deadlock (threads stuck:%s)",
			     STALL_S, stuck);
		if (w != work || atomic_load(&S.traffic_done)) {
			work = w;
			work_since = t;
		} else if (t - work_since > STALL_S * 1000000000ull) {
			fail("no completion for %d s: possible deadlock (%s)", STALL_S,
			     outstanding());
		}
	}
	return NULL;
}

/* Waits a little (other threads need the CPUs to make room). */
static void relax(unsigned int *spins)
{
	if (++*spins < 64)
		sched_yield();
	else
		usleep(50);
}

/*
 * Takes `n` units of `*ctr`, as long as it stays at or below `*limit` (or
 * `lim` if `limit` is NULL): a compare-and-swap loop, so that concurrent
 * takers never overshoot.
 */
static void take(atomic_long *ctr, long n, atomic_long *limit, long lim, struct beat *b)
{
	long cur = atomic_load(ctr);
	unsigned int spins = 0;

	for (;;) {
		long max = limit ? atomic_load(limit) : lim;

		if (cur + n <= max) {
			if (atomic_compare_exchange_weak(ctr, &cur, cur + n))
				return;
			continue;
		}
		beat(b);
		relax(&spins);
		cur = atomic_load(ctr);
	}
}

/* ---- what each WR is ------------------------------------------------------ */

static size_t rnd_off(size_t idx)
{
	return mix(idx * 0x9e3779b1ull + 17) % (RND_BYTES - MAX_WRITE);
}

static int uses_inline(size_t idx)
{
	return idx % 3 == 0 && S.len[idx] <= MAX_INLINE;
}

/*
 * The pieces of WR `idx`'s payload: a Send's header, then its window of
 * `rnd`, split in two at times (so 1 to 3 SGEs). Returns how many.
 */
static int pieces(size_t idx, struct ibv_sge *sge)
{
	uint32_t n = S.len[idx];
	uint8_t *p = S.rnd + rnd_off(idx);
	int k = 0;

	if (S.is_send[idx]) {
		sge[k++] = (struct ibv_sge){ (uintptr_t)&S.hdr[idx], HDR, S.hdr_mr->lkey };
		n -= HDR;
	}
	if (n >= 2 && mix(idx) % 4 == 0) {
		uint32_t cut = 1 + (uint32_t)(mix(idx + 1) % (n - 1));

		sge[k++] = (struct ibv_sge){ (uintptr_t)p, cut, S.rnd_mr->lkey };
		sge[k++] = (struct ibv_sge){ (uintptr_t)(p + cut), n - cut, S.rnd_mr->lkey };
	} else if (n) {
		sge[k++] = (struct ibv_sge){ (uintptr_t)p, n, S.rnd_mr->lkey };
	}
	return k;
}

/* ---- posters --------------------------------------------------------------- */

struct poster {
	int t, q, api;			/* api 0: ibv_post_send, 1: ibv_wr_* */
	struct beat *b;
};

static void post_list(struct poster *p, uint32_t s, int n)
{
	struct ibv_send_wr wr[MAX_BATCH], *bad = NULL;
	struct ibv_sge sge[MAX_BATCH][3];

	memset(wr, 0, sizeof(wr));
	for (int j = 0; j < n; j++) {
		size_t idx = (size_t)p->t * S.wrs + s + j;

		wr[j].wr_id = wr_id_of(p->t, s + j);
		wr[j].next = j + 1 < n ? &wr[j + 1] : NULL;
		wr[j].sg_list = sge[j];
		wr[j].num_sge = pieces(idx, sge[j]);
		wr[j].send_flags = IBV_SEND_SIGNALED | (uses_inline(idx) ? IBV_SEND_INLINE : 0);
		if (S.is_send[idx]) {
			wr[j].opcode = IBV_WR_SEND;
		} else {
			wr[j].opcode = IBV_WR_RDMA_WRITE;
			wr[j].wr.rdma.remote_addr = (uintptr_t)(S.dst + S.woff[idx]);
			wr[j].wr.rdma.rkey = S.dst_mr->rkey;
		}
	}
	int r = ibv_post_send(S.a[p->q], wr, &bad);

	if (r)
		fail("poster %d: ibv_post_send of WRs %u..%u: %s (bad WR %#" PRIx64 ")", p->t, s,
		     s + n - 1, strerror(r), bad ? bad->wr_id : 0);
}

static void post_batch(struct poster *p, uint32_t s, int n)
{
	struct ibv_qp_ex *x = S.ax[p->q];

	ibv_wr_start(x);
	for (int j = 0; j < n; j++) {
		size_t idx = (size_t)p->t * S.wrs + s + j;
		struct ibv_sge sge[3];
		int k = pieces(idx, sge);

		x->wr_id = wr_id_of(p->t, s + j);
		x->wr_flags = IBV_SEND_SIGNALED;
		if (S.is_send[idx])
			ibv_wr_send(x);
		else
			ibv_wr_rdma_write(x, S.dst_mr->rkey, (uintptr_t)(S.dst + S.woff[idx]));
		if (uses_inline(idx)) {
			struct ibv_data_buf buf[3];

			for (int i = 0; i < k; i++)
				buf[i] = (struct ibv_data_buf){ (void *)(uintptr_t)sge[i].addr,
								sge[i].length };
			ibv_wr_set_inline_data_list(x, (size_t)k, buf);
		} else {
			ibv_wr_set_sge_list(x, (size_t)k, sge);
		}
		if (idx % 7 == 0)
			sched_yield();	/* let other threads try to barge in */
	}
	int r = ibv_wr_complete(x);

	if (r)
		fail("poster %d: ibv_wr_complete of WRs %u..%u: %s", p->t, s, s + n - 1,
		     strerror(r));
}

static void *poster(void *arg)
{
	struct poster *p = arg;
	uint64_t rnd = mix(0x5eed + (uint64_t)p->t + ((uint64_t)atomic_load(&round_now) << 8));

	for (uint32_t s = 0; s < (uint32_t)S.wrs;) {
		int n = 1 + (int)((rnd = mix(rnd)) % MAX_BATCH), sends = 0;

		if (n > S.wrs - (int)s)
			n = S.wrs - (int)s;
		for (int j = 0; j < n; j++) {
			size_t idx = (size_t)p->t * S.wrs + s + j;

			sends += S.is_send[idx];
			if (S.is_send[idx])
				S.hdr[idx] = wr_id_of(p->t, s + j);
			atomic_store(&S.posted[idx], 1);
		}
		/* Room in the send queue, then a receive for every Send. */
		take(&S.inflight[p->q], n, NULL, SQ_DEPTH, p->b);
		take(&S.credits[p->q], sends, &S.recv_posted[p->q], 0, p->b);
		if (p->api)
			post_batch(p, s, n);
		else
			post_list(p, s, n);
		atomic_fetch_add(&S.posted_api[p->api], n);
		s += (uint32_t)n;
		beat(p->b);
	}
	atomic_store(&p->b->live, 0);
	return NULL;
}

/* ---- receive posters ------------------------------------------------------ */

struct rposter {
	int q, k;
	struct beat *b;
};

static void *rposter(void *arg)
{
	struct rposter *p = arg;
	int q = p->q;
	uint64_t rnd = mix(0x4ecf + (uint64_t)(q * 16 + p->k) +
			   ((uint64_t)atomic_load(&round_now) << 8));
	unsigned int spins = 0;

	for (;;) {
		long n = 1 + (long)((rnd = mix(rnd)) % MAX_BATCH);
		long cur = atomic_load(&S.recv_alloc[q]);

		beat(p->b);
		if (cur >= S.nrecv[q])
			break;
		if (n > S.nrecv[q] - cur)
			n = S.nrecv[q] - cur;
		/* At most RQ_DEPTH receives waiting in the queue. */
		if (cur + n - atomic_load(&S.recv_used[q]) > RQ_DEPTH) {
			relax(&spins);
			continue;
		}
		if (!atomic_compare_exchange_weak(&S.recv_alloc[q], &cur, cur + n))
			continue;
		spins = 0;

		struct ibv_recv_wr wr[MAX_BATCH], *bad = NULL;
		struct ibv_sge sge[MAX_BATCH];

		for (long j = 0; j < n; j++) {
			uint32_t slot = (uint32_t)(cur + j);

			sge[j] = (struct ibv_sge){ (uintptr_t)(S.rbuf[q] + (size_t)slot * RSLOT),
						   MAX_SEND, S.rbuf_mr[q]->lkey };
			wr[j] = (struct ibv_recv_wr){ .wr_id = recv_id_of(q, slot),
						      .next = j + 1 < n ? &wr[j + 1] : NULL,
						      .sg_list = &sge[j], .num_sge = 1 };
			atomic_store(&S.rposted[q][slot], 1);
		}
		int r = q ? ibv_post_srq_recv(S.srq, wr, &bad) : ibv_post_recv(S.b[0], wr, &bad);

		if (r)
			fail("receive poster %d/%d: posting receives %ld..%ld: %s", q, p->k, cur,
			     cur + n - 1, strerror(r));
		/* Only now may Sends count on these receives. */
		atomic_fetch_add(&S.recv_posted[q], n);
	}
	atomic_store(&p->b->live, 0);
	return NULL;
}

/* ---- pollers --------------------------------------------------------------- */

struct wcx {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num, vendor_err;
};

static void churn_wc(const struct wcx *w, int recv)
{
	unsigned int long it = (unsigned int long)((w->wr_id & ((1ull << TAG_SHIFT) - 1)) >> 1);
	unsigned int want_qp = atomic_load(recv ? &S.churn_qpb : &S.churn_qpa);
	int bit = recv ? 2 : 1;

	if ((int)(w->wr_id & 1) != recv || it == 0 || it != atomic_load(&S.churn_it))
		fail("%s completion %#" PRIx64 " of a churn QP pair that is not in use "
		     "(current iteration %lu)", recv ? "receive" : "send", w->wr_id,
		     atomic_load(&S.churn_it));
	if (w->qp_num != want_qp)
		fail("churn completion %#" PRIx64 " on QP %#x, expected %#x", w->wr_id, w->qp_num,
		     want_qp);
	if (w->opcode != (recv ? IBV_WC_RECV : IBV_WC_SEND) ||
	    (recv && w->byte_len != CHURN_MSG))
		fail("churn completion %#" PRIx64 ": opcode %d, %u bytes", w->wr_id, w->opcode,
		     w->byte_len);
	if (atomic_fetch_or(&S.churn_seen, bit) & bit)
		fail("churn completion %#" PRIx64 " seen twice", w->wr_id);
}

static void send_wc(const struct wcx *w)
{
	int t;
	uint32_t s;
	int ours = id_is(w->wr_id, TAG_WR, &t, &s);
	size_t idx = (size_t)t * S.wrs + s;

	if (w->status != IBV_WC_SUCCESS)
		fail("send completion %#" PRIx64 ": %s (vendor error %u)", w->wr_id,
		     ibv_wc_status_str(w->status), w->vendor_err);
	if (w->wr_id >> TAG_SHIFT == TAG_CHURN) {
		churn_wc(w, 0);
		return;
	}
	if (!ours || t >= S.nposters || s >= (uint32_t)S.wrs || !atomic_load(&S.posted[idx]))
		fail("send completion %#" PRIx64 " for a WR that was never posted (in round %u)",
		     w->wr_id, atomic_load(&round_now));
	if (atomic_exchange(&S.done[idx], 1))
		fail("WR %#" PRIx64 " completed twice", w->wr_id);

	int q = t / S.posters;

	if (w->qp_num != S.a[q]->qp_num)
		fail("WR %#" PRIx64 " completed on QP %#x, posted on %#x", w->wr_id, w->qp_num,
		     S.a[q]->qp_num);
	if (w->opcode != (S.is_send[idx] ? IBV_WC_SEND : IBV_WC_RDMA_WRITE))
		fail("WR %#" PRIx64 " (a %s) completed with opcode %d", w->wr_id,
		     S.is_send[idx] ? "Send" : "Write", w->opcode);
	atomic_fetch_sub(&S.inflight[q], 1);
	atomic_fetch_add(&S.send_wcs, 1);
}

static void recv_wc(const struct wcx *w)
{
	int q;
	uint32_t slot;
	int ours = id_is(w->wr_id, TAG_RECV, &q, &slot);

	if (w->status != IBV_WC_SUCCESS)
		fail("receive completion %#" PRIx64 ": %s (vendor error %u)", w->wr_id,
		     ibv_wc_status_str(w->status), w->vendor_err);
	if (w->wr_id >> TAG_SHIFT == TAG_CHURN) {
		churn_wc(w, 1);
		return;
	}
	if (!ours || q >= NQ || slot >= S.nrecv[q] || !atomic_load(&S.rposted[q][slot]))
		fail("receive completion %#" PRIx64 " for a receive that was never posted "
		     "(in round %u)", w->wr_id, atomic_load(&round_now));
	if (atomic_exchange(&S.rdone[q][slot], 1))
		fail("receive %#" PRIx64 " completed twice", w->wr_id);
	if (w->qp_num != S.b[q]->qp_num || w->opcode != IBV_WC_RECV)
		fail("receive %#" PRIx64 ": opcode %d on QP %#x, expected a receive on %#x",
		     w->wr_id, w->opcode, w->qp_num, S.b[q]->qp_num);
	if (w->byte_len < HDR || w->byte_len > MAX_SEND)
		fail("receive %#" PRIx64 ": %u bytes", w->wr_id, w->byte_len);

	const uint8_t *m = S.rbuf[q] + (size_t)slot * RSLOT;
	uint64_t id;

	memcpy(&id, m, HDR);

	int t;
	uint32_t s;
	int sent = id_is(id, TAG_WR, &t, &s);
	size_t idx = (size_t)t * S.wrs + s;

	if (!sent || t >= S.nposters || s >= (uint32_t)S.wrs || !S.is_send[idx] ||
	    t / S.posters != q)
		fail("receive %#" PRIx64 " on queue %d: holds %u bytes naming %#" PRIx64
		     ", not a Send posted to this queue", w->wr_id, q, w->byte_len, id);
	if (w->byte_len != S.len[idx] ||
	    memcmp(m + HDR, S.rnd + rnd_off(idx), S.len[idx] - HDR))
		fail("receive %#" PRIx64 ": Send %#" PRIx64 " arrived with wrong bytes "
		     "(%u bytes, expected %u)", w->wr_id, id, w->byte_len, S.len[idx]);
	if (!atomic_load(&S.posted[idx]))
		fail("receive %#" PRIx64 ": Send %#" PRIx64 " arrived before it was posted",
		     w->wr_id, id);
	if (atomic_exchange(&S.arrived[idx], 1))
		fail("Send %#" PRIx64 " arrived twice (again in receive %#" PRIx64 ")", id,
		     w->wr_id);
	atomic_store(&S.rlen[q][slot], w->byte_len);
	atomic_fetch_add(&S.recv_used[q], 1);
	atomic_fetch_add(&S.recv_wcs, 1);
}

/* Polls up to 16 completions of `cq`, through ibv_poll_cq or ibv_start_poll. */
static int poll_some(struct ibv_cq_ex *cqx, int ex, void (*check)(const struct wcx *))
{
	struct wcx w[16];
	int n = 0;

	if (!ex) {
		struct ibv_wc wc[16];

		n = ibv_poll_cq(ibv_cq_ex_to_cq(cqx), 16, wc);
		if (n < 0)
			fail("ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++)
			w[i] = (struct wcx){ wc[i].wr_id, wc[i].status, wc[i].opcode,
					     wc[i].byte_len, wc[i].qp_num, wc[i].vendor_err };
	} else {
		struct ibv_poll_cq_attr attr = { 0 };
		int r = ibv_start_poll(cqx, &attr);

		if (r == ENOENT)
			return 0;
		if (r)
			fail("ibv_start_poll: %s", strerror(r));
		do {
			w[n++] = (struct wcx){ cqx->wr_id, cqx->status, ibv_wc_read_opcode(cqx),
					       ibv_wc_read_byte_len(cqx),
					       ibv_wc_read_qp_num(cqx),
					       ibv_wc_read_vendor_err(cqx) };
		} while (n < 16 && !(r = ibv_next_poll(cqx)));
		if (r && r != ENOENT)
			fail("ibv_next_poll: %s", strerror(r));
		ibv_end_poll(cqx);
		atomic_fetch_add(&S.polled_ex, n);
	}
	/* Checked after the poll: a completion must stand for itself once out. */
	for (int i = 0; i < n; i++)
		check(&w[i]);
	return n;
}

struct pollarg {
	int k;
	struct beat *b;
};

static void *poller(void *arg)
{
	struct pollarg *p = arg;
	int ex = p->k == 0;
	unsigned int idle = 0;

	while (!atomic_load(&S.stop_pollers)) {
		int n = poll_some(S.scx, ex, send_wc) + poll_some(S.rcx, ex, recv_wc);

		beat(p->b);
		if (n)
			idle = 0;
		else if (++idle > 256)
			usleep(20);	/* nothing for a while: leave the CPUs to the others */
	}
	atomic_store(&p->b->live, 0);
	return NULL;
}

/* ---- churn ----------------------------------------------------------------- */

static void *mr_churn(void *arg)
{
	struct beat *b = arg;
	size_t arena_len = 8u << 20;
	uint8_t *arena = malloc(arena_len);
	struct ibv_mr *mr[CHURN_MRS] = { 0 };
	void *own[CHURN_MRS] = { 0 };
	uint64_t rnd = 0x3e3e;
	const struct ibv_mr *shared[] = { S.rnd_mr, S.hdr_mr, S.dst_mr, S.rbuf_mr[0],
					  S.rbuf_mr[1] };
	static const int access[] = {
		IBV_ACCESS_LOCAL_WRITE,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
		IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
		IBV_ACCESS_REMOTE_READ,
	};

	if (!arena)
		fail("out of memory");
	memset(arena, 0x5a, arena_len);
	while (!atomic_load(&S.stop_churn)) {
		int i = (int)((rnd = mix(rnd)) % CHURN_MRS);

		beat(b);
		if (mr[i]) {
			int r = ibv_dereg_mr(mr[i]);

			if (r)
				fail("MR churn: ibv_dereg_mr: %s", strerror(r));
			free(own[i]);
			mr[i] = NULL;
			own[i] = NULL;
			atomic_fetch_add(&S.mr_churn, 1);
			continue;
		}
		/* 1 byte to 4 MiB, from the arena at any offset or freshly allocated. */
		uint64_t shift = (rnd = mix(rnd)) % 23;
		size_t len = 1 + (size_t)((rnd = mix(rnd)) % (1ull << shift));
		uint8_t *p;

		if (rnd & (1ull << 40)) {
			p = arena + (rnd >> 20) % (arena_len - len);
		} else {
			p = own[i] = malloc(len);
			if (!p)
				fail("out of memory");
			memset(p, 0, len);
		}
		mr[i] = ibv_reg_mr(S.pd, p, len, access[(rnd >> 8) % 4]);
		if (!mr[i])
			fail("MR churn: ibv_reg_mr of %zu bytes: %s", len, strerror(errno));
		for (size_t k = 0; k < sizeof(shared) / sizeof(*shared); k++)
			if (mr[i]->lkey == shared[k]->lkey || mr[i]->rkey == shared[k]->rkey)
				fail("MR churn: a new MR got key %#x/%#x, which a registered MR "
				     "holds", mr[i]->lkey, mr[i]->rkey);
	}
	for (int i = 0; i < CHURN_MRS; i++) {
		if (mr[i] && ibv_dereg_mr(mr[i]))
			fail("MR churn: ibv_dereg_mr at the end");
		free(own[i]);
	}
	free(arena);
	atomic_store(&b->live, 0);
	return NULL;
}

static void *cq_churn(void *arg)
{
	struct beat *b = arg;
	uint64_t rnd = 0xc0c0;

	while (!atomic_load(&S.stop_churn)) {
		struct ibv_cq *cq[4];
		int n = 1 + (int)((rnd = mix(rnd)) % 4);

		beat(b);
		for (int i = 0; i < n; i++) {
			int cqe = 1 + (int)((rnd = mix(rnd)) % 4096);

			if (rnd & 1) {
				struct ibv_wc wc;

				cq[i] = ibv_create_cq(S.ctx, cqe, NULL, NULL, 0);
				if (!cq[i])
					fail("CQ churn: ibv_create_cq(%d): %s", cqe,
					     strerror(errno));
				if (ibv_poll_cq(cq[i], 1, &wc) != 0)
					fail("CQ churn: a new CQ is not empty");
			} else {
				struct ibv_cq_init_attr_ex a = {
					.cqe = (uint32_t)cqe,
					.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM,
				};
				struct ibv_cq_ex *x = ibv_create_cq_ex(S.ctx, &a);
				struct ibv_poll_cq_attr pa = { 0 };

				if (!x)
					fail("CQ churn: ibv_create_cq_ex(%d): %s", cqe,
					     strerror(errno));
				if (ibv_start_poll(x, &pa) != ENOENT)
					fail("CQ churn: a new extended CQ is not empty");
				cq[i] = ibv_cq_ex_to_cq(x);
			}
		}
		while (n--) {
			int r = ibv_destroy_cq(cq[n]);

			if (r)
				fail("CQ churn: ibv_destroy_cq: %s", strerror(r));
			atomic_fetch_add(&S.cq_churn, 1);
		}
	}
	atomic_store(&b->live, 0);
	return NULL;
}

/* A QP of the churn: small, completing on the shared CQs. */
static struct ibv_qp *churn_qp(void)
{
	struct ibv_qp_init_attr a = {
		.send_cq = S.scq, .recv_cq = S.rcq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(S.pd, &a);

	if (!qp)
		fail("QP churn: ibv_create_qp: %s", strerror(errno));
	if (to_init(qp, IBV_ACCESS_LOCAL_WRITE))
		fail("QP churn: modify_qp to INIT: %s", strerror(errno));
	return qp;
}

static void *qp_churn(void *arg)
{
	struct beat *b = arg;

	for (uint64_t it = 1; !atomic_load(&S.stop_churn); it++) {
		uint8_t *buf = malloc(2 * CHURN_MSG);
		struct ibv_mr *mr;
		struct ibv_qp *qa, *qb;
		uint64_t id = ((uint64_t)TAG_CHURN << TAG_SHIFT) | (it << 1), t0;
		int r;

		beat(b);
		if (!buf)
			fail("out of memory");
		qa = churn_qp();
		qb = churn_qp();
		for (int i = 0; i < CHURN_MSG; i++)
			buf[i] = (uint8_t)(mix(id + (uint64_t)i / 8) >> (8 * (i % 8)));
		memset(buf + CHURN_MSG, 0, CHURN_MSG);
		mr = ibv_reg_mr(S.pd, buf, 2 * CHURN_MSG, IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			fail("QP churn: ibv_reg_mr: %s", strerror(errno));
		if (to_rts(qa, S.gid, qb->qp_num) || to_rts(qb, S.gid, qa->qp_num))
			fail("QP churn: connecting QPs %#x and %#x: %s", qa->qp_num, qb->qp_num,
			     strerror(errno));
		atomic_store(&S.churn_seen, 0);
		atomic_store(&S.churn_qpa, qa->qp_num);
		atomic_store(&S.churn_qpb, qb->qp_num);
		atomic_store(&S.churn_it, (unsigned int long)it);

		struct ibv_sge rs = { (uintptr_t)(buf + CHURN_MSG), CHURN_MSG, mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = id | 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
		struct ibv_sge ss = { (uintptr_t)buf, CHURN_MSG, mr->lkey };
		struct ibv_send_wr sw = { .wr_id = id, .sg_list = &ss, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *sbad;

		r = ibv_post_recv(qb, &rw, &rbad);
		if (r)
			fail("QP churn: ibv_post_recv: %s", strerror(r));
		r = ibv_post_send(qa, &sw, &sbad);
		if (r)
			fail("QP churn: ibv_post_send: %s", strerror(r));
		/* The pollers see both completions on the shared CQs. */
		t0 = now_ns();
		while (atomic_load(&S.churn_seen) != 3) {
			if (now_ns() - t0 > CHURN_S * 1000000000ull)
				fail("QP churn: iteration %" PRIu64 " (QPs %#x, %#x): completions "
				     "seen %d of 3 after %d s", it, qa->qp_num, qb->qp_num, CHURN_S,
				     atomic_load(&S.churn_seen));
			usleep(50);
		}
		if (memcmp(buf, buf + CHURN_MSG, CHURN_MSG))
			fail("QP churn: iteration %" PRIu64 ": the Send arrived with wrong bytes",
			     it);
		/* Whatever comes from this pair from now on is a stray completion. */
		atomic_store(&S.churn_it, 0);
		r = ibv_destroy_qp(qa);
		if (!r)
			r = ibv_destroy_qp(qb);
		if (r)
			fail("QP churn: ibv_destroy_qp: %s", strerror(r));
		r = ibv_dereg_mr(mr);
		if (r)
			fail("QP churn: ibv_dereg_mr: %s", strerror(r));
		free(buf);
		atomic_fetch_add(&S.qp_churn, 1);
	}
	atomic_store(&b->live, 0);
	return NULL;
}

/* ---- set-up, the run, the checks ------------------------------------------ */

static void *zalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

static struct ibv_mr *reg(void *p, size_t n, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(S.pd, p, n, access);

	if (!mr)
		die("ibv_reg_mr of %zu bytes: %s", n, strerror(errno));
	return mr;
}

static struct ibv_cq_ex *shared_cq(void)
{
	struct ibv_cq_init_attr_ex a = {
		.cqe = CQ_DEPTH,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM,
	};
	struct ibv_cq_ex *x = ibv_create_cq_ex(S.ctx, &a);

	if (!x)
		die("ibv_create_cq_ex: %s", strerror(errno));
	return x;
}

static void setup(void)
{
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

	S.ctx = open_dev();
	S.pd = ibv_alloc_pd(S.ctx);
	if (!S.pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	if (ibv_query_gid(S.ctx, 1, 0, &S.gid))
		die("ibv_query_gid: %s", strerror(errno));
	S.scx = shared_cq();
	S.rcx = shared_cq();
	S.scq = ibv_cq_ex_to_cq(S.scx);
	S.rcq = ibv_cq_ex_to_cq(S.rcx);

	struct ibv_srq_init_attr sa = { .attr = { .max_wr = RQ_DEPTH, .max_sge = 1 } };

	S.srq = ibv_create_srq(S.pd, &sa);
	if (!S.srq)
		die("ibv_create_srq: %s", strerror(errno));
	for (int q = 0; q < NQ; q++) {
		struct ibv_qp_init_attr_ex xa = {
			.send_cq = S.scq, .recv_cq = S.rcq,
			.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = 1, .max_send_sge = 3,
				 .max_recv_sge = 1, .max_inline_data = MAX_INLINE },
			.qp_type = IBV_QPT_RC,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = S.pd,
			.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND,
		};
		struct ibv_qp_init_attr ba = {
			.send_cq = S.scq, .recv_cq = S.rcq,
			.srq = q ? S.srq : NULL,
			.cap = { .max_send_wr = 1, .max_recv_wr = q ? 0 : RQ_DEPTH,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};

		S.a[q] = ibv_create_qp_ex(S.ctx, &xa);
		if (!S.a[q])
			die("ibv_create_qp_ex: %s", strerror(errno));
		S.ax[q] = ibv_qp_to_qp_ex(S.a[q]);
		S.b[q] = ibv_create_qp(S.pd, &ba);
		if (!S.b[q])
			die("ibv_create_qp: %s", strerror(errno));
		if (to_init(S.a[q], access) || to_init(S.b[q], access))
			die("modify_qp to INIT: %s", strerror(errno));
		if (to_rts(S.a[q], S.gid, S.b[q]->qp_num) || to_rts(S.b[q], S.gid, S.a[q]->qp_num))
			die("connecting QPs %#x and %#x: %s", S.a[q]->qp_num, S.b[q]->qp_num,
			    strerror(errno));
	}
}

/* Decides every WR: Send or Write, its length, and a Write's slot. */
static void plan(void)
{
	size_t total = (size_t)S.nposters * S.wrs, cur = 0;

	S.is_send = zalloc(total);
	S.len = zalloc(total * sizeof(*S.len));
	S.woff = zalloc(total * sizeof(*S.woff));
	S.posted = zalloc(total);
	S.done = zalloc(total);
	S.arrived = zalloc(total);
	S.hdr = zalloc(total * sizeof(*S.hdr));
	for (size_t idx = 0; idx < total; idx++) {
		uint64_t r = mix(idx ^ 0x77777777ull);
		int t = (int)(idx / S.wrs);

		S.is_send[idx] = idx % S.wrs == (size_t)S.wrs - 1 || (r & 1);
		if (S.is_send[idx]) {
			S.len[idx] = HDR + (uint32_t)((r >> 8) % (MAX_SEND - HDR + 1));
			S.nrecv[t / S.posters]++;
			S.send_bytes += S.len[idx];
		} else {
			unsigned int sel = (unsigned int)((r >> 8) % 100);
			uint64_t v = r >> 16;

			S.len[idx] = sel < 70 ? 1 + v % 64 :
				     sel < 95 ? 65 + v % 960 : 1025 + v % (MAX_WRITE - 1024);
			/* A gap of 1-16 bytes before each slot: it must stay untouched. */
			cur += 1 + (r >> 48) % 16;
			S.woff[idx] = cur;
			cur += S.len[idx];
			S.writes++;
			S.write_bytes += S.len[idx];
		}
	}
	S.expect_wr = (long)total;
	S.expect_send = S.nrecv[0] + S.nrecv[1];
	S.dst_len = cur + 64;
	S.dst = zalloc(S.dst_len);
	S.rnd = zalloc(RND_BYTES);
	for (size_t i = 0; i < RND_BYTES; i += 8) {
		uint64_t v = mix(i + 0xabc);

		memcpy(S.rnd + i, &v, 8);
	}
	S.rnd_mr = reg(S.rnd, RND_BYTES, IBV_ACCESS_LOCAL_WRITE);
	S.hdr_mr = reg(S.hdr, total * sizeof(*S.hdr), IBV_ACCESS_LOCAL_WRITE);
	S.dst_mr = reg(S.dst, S.dst_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	for (int q = 0; q < NQ; q++) {
		S.rbuf[q] = zalloc((size_t)S.nrecv[q] * RSLOT);
		S.rbuf_mr[q] = reg(S.rbuf[q], (size_t)S.nrecv[q] * RSLOT, IBV_ACCESS_LOCAL_WRITE);
		S.rposted[q] = zalloc((size_t)S.nrecv[q]);
		S.rdone[q] = zalloc((size_t)S.nrecv[q]);
		S.rlen[q] = zalloc((size_t)S.nrecv[q] * sizeof(*S.rlen[q]));
	}
}

/* After the run: every WR and receive once, every byte where it belongs. */
static void check_all(void)
{
	size_t total = (size_t)S.nposters * S.wrs, pos = 0, stray = 0;
	long bad_writes = 0, missing = 0;

	for (size_t idx = 0; idx < total; idx++) {
		if (atomic_load(&S.done[idx]) != 1)
			fail("WR %#" PRIx64 " never completed",
			     wr_id_of((int)(idx / S.wrs), (uint32_t)(idx % S.wrs)));
		if (S.is_send[idx]) {
			missing += atomic_load(&S.arrived[idx]) != 1;
			continue;
		}
		for (; pos < S.woff[idx]; pos++)
			stray += S.dst[pos] != 0;
		bad_writes += memcmp(S.dst + pos, S.rnd + rnd_off(idx), S.len[idx]) != 0;
		pos += S.len[idx];
	}
	for (; pos < S.dst_len; pos++)
		stray += S.dst[pos] != 0;
	for (int q = 0; q < NQ; q++)
		for (long slot = 0; slot < S.nrecv[q]; slot++) {
			const uint8_t *m = S.rbuf[q] + (size_t)slot * RSLOT;

			if (atomic_load(&S.rdone[q][slot]) != 1)
				fail("receive %#" PRIx64 " never completed",
				     recv_id_of(q, (uint32_t)slot));
			for (size_t i = atomic_load(&S.rlen[q][slot]); i < RSLOT; i++)
				stray += m[i] != 0;
		}
	if (missing || bad_writes || stray)
		fail("%ld Sends never arrived, %ld Writes not in place, %zu bytes changed "
		     "outside every Write and Send", missing, bad_writes, stray);
}

/* Fails unless a verb that answers an errno value answered 0. */
static void must(int r, const char *what)
{
	if (r)
		fail("%s: %s", what, strerror(r));
}

/* Clears what a round leaves behind, for the next one. */
static void new_round(unsigned int r)
{
	size_t total = (size_t)S.nposters * S.wrs;

	/* First: from now on a completion of an earlier round is a stray one. */
	atomic_store(&round_now, r);
	if (atomic_load(&S.inflight[0]) || atomic_load(&S.inflight[1]))
		fail("WRs still in flight after the round");
	memset(S.dst, 0, S.dst_len);
	memset((void *)S.posted, 0, total);
	memset((void *)S.done, 0, total);
	memset((void *)S.arrived, 0, total);
	for (int q = 0; q < NQ; q++) {
		memset(S.rbuf[q], 0, (size_t)S.nrecv[q] * RSLOT);
		memset((void *)S.rposted[q], 0, (size_t)S.nrecv[q]);
		memset((void *)S.rdone[q], 0, (size_t)S.nrecv[q]);
		memset((void *)S.rlen[q], 0, (size_t)S.nrecv[q] * sizeof(*S.rlen[q]));
		atomic_store(&S.recv_alloc[q], 0);
		atomic_store(&S.recv_posted[q], 0);
		atomic_store(&S.recv_used[q], 0);
		atomic_store(&S.credits[q], 0);
	}
	atomic_store(&S.send_wcs, 0);
	atomic_store(&S.recv_wcs, 0);
	atomic_store(&S.traffic_done, 0);
}

int main(int argc, char **argv)
{
	if (argc < 3 || argc > 5) {
		fprintf(stderr, "usage: xiw_shared ROUNDS WRS [POSTERS [POLLERS]]\n");
		return 2;
	}
	int rounds = atoi(argv[1]);

	S.wrs = atoi(argv[2]);
	S.posters = argc > 3 ? atoi(argv[3]) : 4;
	S.pollers = argc > 4 ? atoi(argv[4]) : 3;
	if (rounds < 1 || rounds > 1000 || S.wrs < 1 || S.posters < 2 || S.posters % 2 ||
	    S.posters > 32 || S.pollers < 1 || S.pollers > 16)
		die("ROUNDS in 1..1000, WRS >= 1, POSTERS even in 2..32, POLLERS in 1..16");
	S.nposters = NQ * S.posters;
	if (getenv("XIW_SHARED_SLOW"))
		slow = atoi(getenv("XIW_SHARED_SLOW"));
	if (slow < 1)
		die("XIW_SHARED_SLOW must be a whole number >= 1");
	setup();
	plan();

	pthread_t churn[3], *pth = zalloc(sizeof(pthread_t) * (size_t)S.nposters), wd;
	pthread_t *lth = zalloc(sizeof(pthread_t) * (size_t)S.pollers);
	pthread_t rth[NQ * RECV_POSTERS];
	struct poster *pa = zalloc(sizeof(*pa) * (size_t)S.nposters);
	struct rposter ra[NQ * RECV_POSTERS];
	struct pollarg *la = zalloc(sizeof(*la) * (size_t)S.pollers);
	struct beat *me = beat_new("main", 0);
	uint64_t t0 = now_ns(), busy_ns = 0;

	atomic_store(&me->live, 0);
	for (int t = 0; t < S.nposters; t++) {
		pa[t] = (struct poster){ t, t / S.posters, t % 2, beat_new("poster %d", t) };
		atomic_store(&pa[t].b->live, 0);
	}
	for (int i = 0; i < NQ * RECV_POSTERS; i++) {
		ra[i] = (struct rposter){ i / RECV_POSTERS, i % RECV_POSTERS,
					  beat_new(i < RECV_POSTERS ? "RQ poster %d" :
						   "SRQ poster %d", i % RECV_POSTERS) };
		atomic_store(&ra[i].b->live, 0);
	}
	pthread_create(&wd, NULL, watchdog, NULL);
	for (int i = 0; i < S.pollers; i++) {
		la[i] = (struct pollarg){ i, beat_new("poller %d", i) };
		pthread_create(&lth[i], NULL, poller, &la[i]);
	}
	pthread_create(&churn[0], NULL, mr_churn, beat_new("MR churn", 0));
	pthread_create(&churn[1], NULL, cq_churn, beat_new("CQ churn", 0));
	pthread_create(&churn[2], NULL, qp_churn, beat_new("QP churn", 0));

	for (int r = 1; r <= rounds; r++) {
		uint64_t start = now_ns();

		new_round((unsigned int)r);
		for (int i = 0; i < NQ * RECV_POSTERS; i++) {
			atomic_store(&ra[i].b->live, 1);
			pthread_create(&rth[i], NULL, rposter, &ra[i]);
		}
		for (int t = 0; t < S.nposters; t++) {
			atomic_store(&pa[t].b->live, 1);
			pthread_create(&pth[t], NULL, poster, &pa[t]);
		}
		for (int t = 0; t < S.nposters; t++)
			pthread_join(pth[t], NULL);
		uint64_t t_posted = now_ns();

		/* Every WR is posted: the rest must complete within FINAL_S. */
		atomic_store(&me->live, 1);
		while (atomic_load(&S.send_wcs) < S.expect_wr ||
		       atomic_load(&S.recv_wcs) < S.expect_send) {
			beat(me);
			if (now_ns() - t_posted > FINAL_S * 1000000000ull)
				fail("round %d: completions missing %d s after the last WR was "
				     "posted (%s)", r, FINAL_S, outstanding());
			usleep(1000);
		}
		busy_ns += now_ns() - start;
		atomic_store(&S.traffic_done, 1);
		for (int i = 0; i < NQ * RECV_POSTERS; i++)
			pthread_join(rth[i], NULL);
		/* A completion beyond the expected ones would show up here, and fail. */
		usleep(200000);
		beat(me);
		check_all();
		beat(me);
		atomic_store(&me->live, 0);
	}
	atomic_store(&me->live, 1);
	atomic_store(&S.stop_churn, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(churn[i], NULL);
	beat(me);
	atomic_store(&S.stop_pollers, 1);
	for (int i = 0; i < S.pollers; i++)
		pthread_join(lth[i], NULL);
	beat(me);

	if (!atomic_load(&S.mr_churn) || !atomic_load(&S.cq_churn) || !atomic_load(&S.qp_churn))
		fail("a churn thread did nothing");

	/* Nothing is left in the shared CQs. */
	struct ibv_wc wc;

	if (ibv_poll_cq(S.scq, 1, &wc) || ibv_poll_cq(S.rcq, 1, &wc))
		fail("a completion is left over (wr_id %#" PRIx64 ")", wc.wr_id);
	for (int q = 0; q < NQ; q++) {
		beat(me);
		must(ibv_destroy_qp(S.a[q]), "ibv_destroy_qp");
		must(ibv_destroy_qp(S.b[q]), "ibv_destroy_qp");
	}
	beat(me);
	must(ibv_destroy_srq(S.srq), "ibv_destroy_srq");
	must(ibv_destroy_cq(S.scq), "ibv_destroy_cq");
	must(ibv_destroy_cq(S.rcq), "ibv_destroy_cq");
	must(ibv_dereg_mr(S.rnd_mr), "ibv_dereg_mr");
	must(ibv_dereg_mr(S.hdr_mr), "ibv_dereg_mr");
	must(ibv_dereg_mr(S.dst_mr), "ibv_dereg_mr");
	for (int q = 0; q < NQ; q++)
		must(ibv_dereg_mr(S.rbuf_mr[q]), "ibv_dereg_mr");
	must(ibv_dealloc_pd(S.pd), "ibv_dealloc_pd");
	must(ibv_close_device(S.ctx) ? errno : 0, "ibv_close_device");
	atomic_store(&S.stop_watchdog, 1);
	pthread_join(wd, NULL);

	double secs = busy_ns / 1e9;

	printf("shared: %d rounds, %d posters on 2 QPs (%ld WRs by ibv_post_send, %ld by "
	       "ibv_wr_*), %d receive posters, %d pollers (%ld completions by ibv_start_poll): "
	       "per round %ld WRs completed once each (%ld Sends, %" PRIu64 " bytes; %ld Writes, "
	       "%" PRIu64 " bytes) and %ld receives once each (%ld RQ, %ld SRQ), every byte "
	       "checked; %.1f s of traffic (%.0f WR/s), %.1f s in all; beside it %ld MRs, "
	       "%ld CQs, %ld QP pairs created and destroyed\n",
	       rounds, S.nposters, atomic_load(&S.posted_api[0]), atomic_load(&S.posted_api[1]),
	       NQ * RECV_POSTERS, S.pollers, atomic_load(&S.polled_ex), S.expect_wr,
	       S.expect_send, S.send_bytes, S.writes, S.write_bytes, S.expect_send, S.nrecv[0],
	       S.nrecv[1], secs, rounds * S.expect_wr / secs, (now_ns() - t0) / 1e9,
	       atomic_load(&S.mr_churn), atomic_load(&S.cq_churn), atomic_load(&S.qp_churn));
	return 0;
}
