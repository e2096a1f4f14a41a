// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Completion channels (kernel mode): an armed CQ signals its channel once
 * for the next completion; an unarmed one never does; a CQ armed for
 * solicited events only is signalled by a Send with the solicited flag or by
 * a failed request, not by an ordinary Send; two CQs share one channel and
 * the event names the right one; acknowledged events let the CQ go. Without
 * the kernel module (standalone mode) a CQ with a channel is refused with
 * EOPNOTSUPP, or the channel itself cannot be made.
 *
 * usage: xiw_channel [standalone]
 */
#define _GNU_SOURCE
#include <poll.h>

#include "xiw_test.h"

enum { MS_NONE = 300, MS_EVENT = 5000 };

static struct ibv_comp_channel *ch;
static uint8_t buf[4096];
static struct ibv_mr *mr;

/* The CQ whose event arrives within `ms`, or NULL if none does. */
static struct ibv_cq *event_within(int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *cq_ctx;

	if (poll(&p, 1, ms) < 0)
		die("poll: %s", strerror(errno));
	if (!(p.revents & POLLIN))
		return NULL;
	if (ibv_get_cq_event(ch, &cq, &cq_ctx))
		die("ibv_get_cq_event: %s", strerror(errno));
	if (cq->cq_context != cq_ctx)
		die("the event's CQ context is not the CQ's");
	ibv_ack_cq_events(cq, 1);
	return cq;
}

static void expect_event(struct ibv_cq *want, const char *what)
{
	struct ibv_cq *got = event_within(MS_EVENT);

	if (got != want)
		die("%s: %s", what, got ? "the event named another CQ" : "no event");
}

static void expect_none(const char *what)
{
	if (event_within(MS_NONE))
		die("%s: an event came that should not have", what);
}

static void arm(struct ibv_cq *cq, int solicited)
{
	if (ibv_req_notify_cq(cq, solicited))
		die("ibv_req_notify_cq: %s", strerror(errno));
}

static void send_one(struct ibv_qp *qp, uint64_t id, unsigned int flags)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = flags }, *bad;

	if (ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send: %s", strerror(errno));
}

int main(int argc, char **argv)
{
	struct ibv_context *ctx = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	union ibv_gid gid;
	struct ibv_cq *cq_a, *cq_b;
	struct ibv_qp *a, *b;

	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid: %s", strerror(errno));
	ch = ibv_create_comp_channel(ctx);
	if (argc > 1 && !strcmp(argv[1], "standalone")) {
		struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 8, NULL, ch, 0) : NULL;

		if (cq)
			die("a CQ with a completion channel in standalone mode");
		if (ch && errno != EOPNOTSUPP)
			die("a CQ with a channel: %s, expected EOPNOTSUPP", strerror(errno));
		printf("events ok: refused in standalone mode (%s)\n",
		       ch ? "the CQ, EOPNOTSUPP" : "the channel");
		return 0;
	}
	if (!ch)
		die("ibv_create_comp_channel: %s", strerror(errno));
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	cq_a = ibv_create_cq(ctx, 32, (void *)0xa, ch, 0);
	cq_b = ibv_create_cq(ctx, 32, (void *)0xb, ch, 0);
	if (!mr || !cq_a || !cq_b)
		die("setting up: %s", strerror(errno));
	a = rc_qp(ctx, pd, cq_a, 0);
	b = rc_qp(ctx, pd, cq_b, 0);
	connect_qp(a, 0, gid, b->qp_num);
	connect_qp(b, 0, gid, a->qp_num);

	/* Not armed: completions come, events do not. */
	post_recv_one(b, 100, (uintptr_t)buf + 1024, 1024, mr->lkey);
	send_one(a, 1, IBV_SEND_SIGNALED);
	wait_wc(cq_a, 1, "an unarmed Send");
	wait_wc(cq_b, 100, "an unarmed receive");
	expect_none("completions on unarmed CQs");

	/* Armed for the next completion: one event, naming the CQ; then disarmed. */
	post_recv_one(b, 109, (uintptr_t)buf + 1024, 1024, mr->lkey);
	arm(cq_a, 0);
	send_one(a, 2, IBV_SEND_SIGNALED);
	expect_event(cq_a, "a Send on an armed CQ");
	wait_wc(cq_a, 2, "the Send");
	wait_wc(cq_b, 109, "its receive");
	post_recv_one(b, 101, (uintptr_t)buf + 1024, 1024, mr->lkey);
	arm(cq_b, 0);
	send_one(a, 3, 0);
	expect_event(cq_b, "a receive on the other armed CQ of the channel");
	wait_wc(cq_b, 101, "the receive");
	post_recv_one(b, 110, (uintptr_t)buf + 1024, 1024, mr->lkey);
	send_one(a, 4, IBV_SEND_SIGNALED);
	wait_wc(cq_a, 4, "a Send after the event");
	wait_wc(cq_b, 110, "its receive");
	expect_none("a completion after the event, not re-armed");

	/* Solicited only: an ordinary Send does not signal, a solicited one does. */
	post_recv_one(b, 102, (uintptr_t)buf + 1024, 1024, mr->lkey);
	post_recv_one(b, 103, (uintptr_t)buf + 1024, 1024, mr->lkey);
	arm(cq_b, 1);
	send_one(a, 5, 0);
	wait_wc(cq_b, 102, "an unsolicited receive");
	expect_none("an ordinary Send on a CQ armed for solicited events");
	send_one(a, 6, IBV_SEND_SOLICITED);
	expect_event(cq_b, "a solicited Send");
	wait_wc(cq_b, 103, "the solicited receive");

	/* A failed request signals a CQ armed for solicited events too. */
	post_recv_one(b, 104, (uintptr_t)buf + 1024, 1024, mr->lkey);
	arm(cq_b, 1);
	{
		struct ibv_qp_attr at = { .qp_state = IBV_QPS_ERR };

		if (ibv_modify_qp(b, &at, IBV_QP_STATE))
			die("ibv_modify_qp to ERR: %s", strerror(errno));
	}
	expect_event(cq_b, "a flushed receive on a CQ armed for solicited events");
	expect_wc(cq_b, 104, IBV_WC_WR_FLUSH_ERR, "the flushed receive");

	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq_a) ||
	    ibv_destroy_cq(cq_b) || ibv_destroy_comp_channel(ch) || ibv_dereg_mr(mr) ||
	    ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("cleaning up: %s", strerror(errno));
	printf("events ok: unarmed, next, two CQs on one channel, solicited only, errors\n");
	return 0;
}
