// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Async events against destroy, through the real libibverbs.
 *
 *   xiw_events ROUNDS
 *
 * Each round makes a QP fail (its peer never answers, with a 50 ms connect
 * time-out) so that it raises IBV_EVENT_QP_FATAL, then either
 *  - reads the event and destroys the QP from another thread: the destroy must
 *    not return before the event is acknowledged (ibv_get_async_event(3): the
 *    QP's memory stays valid until then), and returns 0 after; or
 *  - destroys the QP without reading the event: no event of it may be
 *    delivered afterwards.
 * Prints one summary line on success; exits 1 with the reason otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static void die(const char *what)
{
	fprintf(stderr, "xiw_events: %s\n", what);
	exit(1);
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;

/* A QP that fails soon: its peer is a QP number nothing listens for. */
static struct ibv_qp *failing_qp(void)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	union ibv_gid gid;

	if (!qp)
		die("ibv_create_qp failed");
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				  IBV_QP_ACCESS_FLAGS))
		die("modify_qp to INIT failed");
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid failed");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = 1 << 8;
	a.max_dest_rd_atomic = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = gid;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				  IBV_QP_MIN_RNR_TIMER))
		die("modify_qp to RTR failed");
	return qp;
}

/* Whether an event is ready within `ms`. */
static int event_ready(int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1;
}

static atomic_int destroyed;
static int destroy_rc;

static void *destroyer(void *qp)
{
	destroy_rc = ibv_destroy_qp(qp);
	atomic_store(&destroyed, 1);
	return NULL;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20, n;
	struct ibv_device **list;

	setenv("XIW_CONNECT_TIMEOUT_MS", "50", 1);
	list = ibv_get_device_list(&n);
	if (!list || n == 0)
		die("no RDMA device");
	ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!ctx)
		die("cannot open the device");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cq)
		die("ibv_alloc_pd / ibv_create_cq failed");

	for (int r = 0; r < rounds; r++) {
		struct ibv_qp *qp = failing_qp();
		struct ibv_async_event ev;
		char msg[160];

		if (!event_ready(5000))
			die("a failing QP raised no async event within 5 s");
		if (r % 2) {
			/* Destroyed unread: its event must be gone. */
			if (ibv_destroy_qp(qp))
				die("ibv_destroy_qp failed");
			if (event_ready(100)) {
				ibv_get_async_event(ctx, &ev);
				snprintf(msg, sizeof(msg), "round %d: event %s delivered for a QP "
					 "destroyed before it was read", r,
					 ibv_event_type_str(ev.event_type));
				die(msg);
			}
			continue;
		}
		if (ibv_get_async_event(ctx, &ev))
			die("ibv_get_async_event failed");
		if (ev.event_type != IBV_EVENT_QP_FATAL || ev.element.qp != qp) {
			snprintf(msg, sizeof(msg), "round %d: expected QP fatal for this QP, got %s",
				 r, ibv_event_type_str(ev.event_type));
			die(msg);
		}
		pthread_t t;

		atomic_store(&destroyed, 0);
		pthread_create(&t, NULL, destroyer, qp);
		usleep(50000);
		if (atomic_load(&destroyed)) {
			snprintf(msg, sizeof(msg), "round %d: ibv_destroy_qp returned before "
				 "its event was acknowledged", r);
			die(msg);
		}
		ibv_ack_async_event(&ev);
		pthread_join(t, NULL);
		if (destroy_rc)
			die("ibv_destroy_qp failed after the acknowledgement");
	}
	if (event_ready(0))
		die("an event is left over at the end");
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	printf("events: %d rounds: destroy waited for every read event's acknowledgement, "
	       "and no event of a destroyed QP was delivered\n", rounds);
	return 0;
}
