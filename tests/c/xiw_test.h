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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* RESET -> INIT (port 1, `access` granted to the peer) -> RTR -> RTS. */
static inline void connect_qp(struct ibv_qp *qp, int access, union ibv_gid peer,
			      uint32_t peer_qpn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = access,
	};

	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				      IBV_QP_ACCESS_FLAGS))
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

/* Waits for the successful completion of `wr_id` on `cq` (5 s at most). */
static inline void wait_wc(struct ibv_cq *cq, uint64_t wr_id, const char *what)
{
	struct ibv_wc wc = next_wc(cq, what);

	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id)
		die("%s: completion of WR %llu with %s, expected WR %llu", what,
		    (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
		    (unsigned long long)wr_id);
}

#endif
