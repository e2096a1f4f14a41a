/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * What xiw's C test programs share: failing with a message, opening the
 * device under test (the first one libibverbs lists, or $XIW_DEVICE), and
 * connecting a QP in standalone mode (RTR starts the connection).
 */
#ifndef XIW_TEST_H
#define XIW_TEST_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <infiniband/verbs.h>

/* Prints "PROGRAM: message" on stderr and exits 1. */
static inline void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "%s: ", program_invocation_short_name);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

/* CLOCK_MONOTONIC in nanoseconds. */
/* Network byte order, for frames built by hand from the RFC figures. */
/* The IPv4 socket address IP:PORT, or dies saying IP is not one. */
static inline struct sockaddr_in ipv4_addr(const char *ip, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };

	if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1)
		die("not an IPv4 address: %s", ip);
	return sa;
}

static inline void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads exactly `n` bytes of `fd`, or dies saying the stream ended in `what`. */
static inline void read_exact(int fd, uint8_t *p, size_t n, const char *what)
{
	while (n) {
		ssize_t got = read(fd, p, n);

		if (got <= 0)
			die("the stream ended in %s", what);
		p += got;
		n -= (size_t)got;
	}
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* splitmix64: deterministic bytes and choices from a seed. */
static inline uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static inline struct ibv_context *open_dev(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *want = getenv("XIW_DEVICE");
	struct ibv_context *ctx = NULL;

	if (!list || n == 0)
		die("no RDMA device");
	for (int i = 0; i < n && !ctx; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		die("cannot open the device");
	return ctx;
}

/* INIT -> RTR (which starts the connection in standalone mode) -> RTS. */
static inline int to_rts(struct ibv_qp *qp, union ibv_gid peer, uint32_t peer_qpn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer_qpn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer, .hop_limit = 64 } },
	};
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		return r;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* RESET -> INIT on port 1, `access` granted to the peer; 0 or an error. */
static inline int to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = access,
	};

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS);
}

/* RESET -> INIT (port 1, `access` granted to the peer) -> RTR -> RTS. */
static inline void connect_qp(struct ibv_qp *qp, int access, union ibv_gid peer,
			      uint32_t peer_qpn)
{
	if (to_init(qp, access))
		die("modify_qp to INIT: %s", strerror(errno));
	if (to_rts(qp, peer, peer_qpn))
		die("modify_qp to RTR/RTS: %s", strerror(errno));
}

/* The next completion on `cq` (5 s at most). */
static inline struct ibv_wc next_wc(struct ibv_cq *cq, const char *what)
{
	struct timespec t0, t;
	struct ibv_wc wc;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n < 0)
			die("%s: ibv_poll_cq: %d", what, n);
		if (n == 1)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			die("%s: no completion within 5 s", what);
	}
}

/* The next completion on `cq` is `wr_id` with `status`; returns it. */
static inline struct ibv_wc expect_wc(struct ibv_cq *cq, uint64_t wr_id,
				      enum ibv_wc_status status, const char *what)
{
	struct ibv_wc wc = next_wc(cq, what);

	if (wc.wr_id != wr_id || wc.status != status)
		die("%s: WR %llu completed with %s; expected WR %llu with %s", what,
		    (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
		    (unsigned long long)wr_id, ibv_wc_status_str(status));
	return wc;
}

/* ibv_create_qp_ex with `at`, extended (ibv_wr_*) with `send_ops` if not 0. */
static inline struct ibv_qp *qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *at,
				   uint64_t send_ops)
{
	struct ibv_qp *qp;

	if (send_ops) {
		at->comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		at->send_ops_flags = send_ops;
	}
	qp = ibv_create_qp_ex(ctx, at);
	if (!qp)
		die("ibv_create_qp_ex: %s", strerror(errno));
	return qp;
}

/*
 * An RC QP of `pd` on `cq` (both queues) with room for 16 requests of one
 * SGE each; extended (ibv_wr_*) with `send_ops` if that is not 0.
 */
static inline struct ibv_qp *rc_qp(struct ibv_context *ctx, struct ibv_pd *pd,
				   struct ibv_cq *cq, uint64_t send_ops)
{
	struct ibv_qp_init_attr_ex at = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};

	return qp_ex(ctx, &at, send_ops);
}

/* Posts one signaled request of one SGE (none if `len` is 0). */
static inline void post_one(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op,
			    uint64_t addr, uint32_t len, uint32_t lkey, uint64_t raddr,
			    uint32_t rkey)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = len ? 1 : 0,
				  .opcode = op, .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (op == IBV_WR_SEND_WITH_INV)
		wr.invalidate_rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send (WR %llu): %s", (unsigned long long)id, strerror(errno));
}

/* Posts one receive of one SGE. */
static inline void post_recv_one(struct ibv_qp *qp, uint64_t id, uint64_t addr, uint32_t len,
				 uint32_t lkey)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_recv(qp, &wr, &bad))
		die("ibv_post_recv (WR %llu): %s", (unsigned long long)id, strerror(errno));
}

/* Two QPs of one process connected to each other: A and B, each on its CQ. */
struct pair {
	struct ibv_cq *cq_a, *cq_b;
	struct ibv_qp *a, *b;
};

/* A (extended with `send_ops` if not 0) and B of `pd`, connected, granting `access`. */
static inline struct pair rc_pair(struct ibv_context *ctx, struct ibv_pd *pd, union ibv_gid gid,
				  int access, uint64_t send_ops)
{
	struct pair p = {
		.cq_a = ibv_create_cq(ctx, 32, NULL, NULL, 0),
		.cq_b = ibv_create_cq(ctx, 32, NULL, NULL, 0),
	};

	if (!p.cq_a || !p.cq_b)
		die("ibv_create_cq: %s", strerror(errno));
	p.a = rc_qp(ctx, pd, p.cq_a, send_ops);
	p.b = rc_qp(ctx, pd, p.cq_b, 0);
	connect_qp(p.a, access, gid, p.b->qp_num);
	connect_qp(p.b, access, gid, p.a->qp_num);
	return p;
}

static inline void free_pair(struct pair *p)
{
	if (ibv_destroy_qp(p->a) || ibv_destroy_qp(p->b) || ibv_destroy_cq(p->cq_a) ||
	    ibv_destroy_cq(p->cq_b))
		die("destroying a pair: %s", strerror(errno));
}

/* Waits for the successful completion of `wr_id` on `cq` (5 s at most). */
static inline void wait_wc(struct ibv_cq *cq, uint64_t wr_id, const char *what)
{
	expect_wc(cq, wr_id, IBV_WC_SUCCESS, what);
}

#endif
