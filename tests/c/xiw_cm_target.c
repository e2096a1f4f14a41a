/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * A target for a hostile peer, over rdma_cm: listens on ADDR:PORT, accepts
 * one connection and tells the peer, in the private data of its accept (the
 * MPA Reply's, after RFC 6581's IRD/ORD block), three regions it may name,
 * each as STag, length (big-endian 32 bits each) and TO (64 bits):
 *
 *   r0  REGION_LEN bytes the peer may write (remote write, local write);
 *   r1  1000 bytes of the same PD it may only read (remote read);
 *   r2  1000 bytes it may write, but registered in another PD.
 *
 * All three sit in one page-aligned buffer of BUF_LEN bytes, with guard
 * bytes before, between and after them; every byte starts as FILL. It posts
 * two receives of 64 bytes and waits (30 s at most) for the connection to
 * end: the rdma_cm DISCONNECTED event, then both receives completed (2 s at
 * most). It prints, one per line:
 *
 *   regions r0 STAG LEN TO r1 ... r2 ...
 *   event NAME           each rdma_cm event after the request
 *   async NAME           each asynchronous event of the device
 *   wc WR_ID STATUS_NAME [len N data TEXT]   each completion
 *   end disconnected | end timeout
 *   qp STATE             the QP's state at the end (ibv_query_qp)
 *   changed none | changed A..B C..D ...   the bytes that differ from FILL,
 *                        as half-open ranges of offsets from r0's start
 *                        (negative before it)
 *   pattern ok | pattern bad at OFF: 0xV, not 0xW
 *                        whether every changed byte is what the peer
 *                        writes there: 1 + (X mod 251), X being the byte's
 *                        TO minus r0's TO, modulo 2^64 (never FILL)
 *   guards intact | guards touched at OFF
 *   r1 intact|touched, r2 intact|touched
 *
 * usage: xiw_cm_target ADDR PORT
 * exit: 0 once it ran to the end (the judgement is the caller's), 1 if it
 * could not (no connection within 30 s, a verb that failed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include "xiw_test.h"

#define FILL 0xfe
#define BUF_LEN 32768
#define R0_AT 1000
#define REGION_LEN 10000
#define R1_AT 12000
#define R2_AT 14000
#define RX_LEN 1000
#define RECV_LEN 64

/* What the peer writes at X bytes past r0's TO (never FILL). */
static uint8_t written(uint64_t x)
{
	return (uint8_t)(1 + x % 251);
}

static void put32(uint8_t *p, uint32_t v)
{
	v = htonl(v);
	memcpy(p, &v, 4);
}

static void put_region(uint8_t *p, struct ibv_mr *mr, void *at, uint32_t len)
{
	uint64_t to = (uintptr_t)at;

	put32(p, mr->rkey);
	put32(p + 4, len);
	put32(p + 8, (uint32_t)(to >> 32));
	put32(p + 12, (uint32_t)to);
}

/* The next rdma_cm event, or NULL if none within `ms` milliseconds. */
static struct rdma_cm_event *cm_event(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (!rdma_get_cm_event(ch, &ev))
		return ev;
	if (errno != EAGAIN)
		die("rdma_get_cm_event: %s", strerror(errno));
	if (poll(&p, 1, ms) <= 0)
		return NULL;
	if (!rdma_get_cm_event(ch, &ev))
		return ev;
	if (errno != EAGAIN)
		die("rdma_get_cm_event: %s", strerror(errno));
	return NULL;
}

static void nonblocking(int fd)
{
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
		die("fcntl: %s", strerror(errno));
}

static const char *qp_state_name(enum ibv_qp_state s)
{
	static const char *const names[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE",
					     "ERR" };

	return (unsigned int)s < sizeof(names) / sizeof(names[0]) ? names[s] : "unknown";
}

static int intact(const uint8_t *buf, size_t from, size_t to, size_t *bad)
{
	for (size_t i = from; i < to; i++) {
		if (buf[i] != FILL) {
			*bad = i;
			return 0;
		}
	}
	return 1;
}

/* The summary lines of the buffer (see the top of the file). */
static void report(const uint8_t *buf)
{
	static const size_t guards[][2] = {
		{ 0, R0_AT }, { R0_AT + REGION_LEN, R1_AT }, { R1_AT + RX_LEN, R2_AT },
		{ R2_AT + RX_LEN, BUF_LEN },
	};
	size_t bad = 0, i = 0, ranges = 0;
	int ok = 1, guarded = 1;

	printf("changed");
	while (i < BUF_LEN) {
		size_t start;

		if (buf[i] == FILL) {
			i++;
			continue;
		}
		start = i;
		while (i < BUF_LEN && buf[i] != FILL)
			i++;
		if (ranges++ < 32)
			printf(" %ld..%ld", (long)start - R0_AT, (long)i - R0_AT);
	}
	printf("%s\n", ranges ? (ranges > 32 ? " ..." : "") : " none");
	for (i = 0; i < BUF_LEN && ok; i++) {
		uint8_t want = written((uint64_t)((int64_t)i - R0_AT));

		if (buf[i] != FILL && buf[i] != want) {
			printf("pattern bad at %ld: 0x%02x, not 0x%02x\n", (long)i - R0_AT,
			       buf[i], want);
			ok = 0;
		}
	}
	if (ok)
		printf("pattern ok\n");
	for (i = 0; i < sizeof(guards) / sizeof(guards[0]) && guarded; i++) {
		if (!intact(buf, guards[i][0], guards[i][1], &bad)) {
			printf("guards touched at %ld\n", (long)bad - R0_AT);
			guarded = 0;
		}
	}
	if (guarded)
		printf("guards intact\n");
	printf("r1 %s\n", intact(buf, R1_AT, R1_AT + RX_LEN, &bad) ? "intact" : "touched");
	printf("r2 %s\n", intact(buf, R2_AT, R2_AT + RX_LEN, &bad) ? "intact" : "touched");
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP };
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param param = { .initiator_depth = 1, .responder_resources = 1 };
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen_id, *id = NULL;
	struct rdma_addrinfo *ai;
	struct rdma_cm_event *ev;
	struct ibv_pd *pd, *pd2;
	struct ibv_cq *cq;
	struct ibv_mr *mr0, *mr1, *mr2, *rmr;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	uint8_t pdata[48];
	static char rbuf[2][RECV_LEN];
	uint8_t *buf;
	uint64_t t0, ended = 0;
	int rc, done = 0, disconnected = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 3)
		die("usage: xiw_cm_target ADDR PORT");
	buf = aligned_alloc(4096, BUF_LEN);
	if (!buf)
		die("no memory");
	memset(buf, FILL, BUF_LEN);

	rc = rdma_getaddrinfo(argv[1], argv[2], &hints, &ai);
	if (rc)
		die("rdma_getaddrinfo: %s", gai_strerror(rc));
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP))
		die("rdma_create_id: %s", strerror(errno));
	if (rdma_bind_addr(listen_id, ai->ai_src_addr) || rdma_listen(listen_id, 1))
		die("rdma_bind_addr/rdma_listen: %s", strerror(errno));
	rdma_freeaddrinfo(ai);
	nonblocking(ch->fd);
	printf("listening on %s:%s\n", argv[1], argv[2]);

	t0 = now_ns();
	while (!id) {
		ev = cm_event(ch, 100);
		if (!ev) {
			if (now_ns() - t0 > 30000000000ull)
				die("no connection request within 30 s");
			continue;
		}
		if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
			die("%s before any request", rdma_event_str(ev->event));
		id = ev->id;
		rdma_ack_cm_event(ev);
	}

	pd = ibv_alloc_pd(id->verbs);
	pd2 = ibv_alloc_pd(id->verbs);
	cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
	if (!pd || !pd2 || !cq)
		die("PD or CQ: %s", strerror(errno));
	attr.send_cq = cq;
	attr.recv_cq = cq;
	if (rdma_create_qp(id, pd, &attr))
		die("rdma_create_qp: %s", strerror(errno));
	mr0 = ibv_reg_mr(pd, buf + R0_AT, REGION_LEN,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	mr1 = ibv_reg_mr(pd, buf + R1_AT, RX_LEN, IBV_ACCESS_REMOTE_READ);
	mr2 = ibv_reg_mr(pd2, buf + R2_AT, RX_LEN,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	rmr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr0 || !mr1 || !mr2 || !rmr)
		die("ibv_reg_mr: %s", strerror(errno));
	for (int i = 0; i < 2; i++)
		post_recv_one(id->qp, (uint64_t)i + 1, (uintptr_t)rbuf[i], RECV_LEN, rmr->lkey);
	put_region(pdata, mr0, buf + R0_AT, REGION_LEN);
	put_region(pdata + 16, mr1, buf + R1_AT, RX_LEN);
	put_region(pdata + 32, mr2, buf + R2_AT, RX_LEN);
	printf("regions r0 0x%x %u %p r1 0x%x %u %p r2 0x%x %u %p\n", mr0->rkey, REGION_LEN,
	       (void *)(buf + R0_AT), mr1->rkey, RX_LEN, (void *)(buf + R1_AT), mr2->rkey,
	       RX_LEN, (void *)(buf + R2_AT));
	param.private_data = pdata;
	param.private_data_len = sizeof(pdata);
	if (rdma_accept(id, &param))
		die("rdma_accept: %s", strerror(errno));
	nonblocking(id->verbs->async_fd);

	/*
	 * Until the connection ends and both receives have completed, or the
	 * time is up: rdma_cm events, asynchronous events, completions.
	 */
	t0 = now_ns();
	while (now_ns() - t0 < 30000000000ull &&
	       !(disconnected && (done == 2 || now_ns() - ended > 2000000000ull))) {
		struct ibv_async_event ae;
		struct ibv_wc wc;

		ev = cm_event(ch, 20);
		if (ev) {
			printf("event %s\n", rdma_event_str(ev->event));
			if (ev->event == RDMA_CM_EVENT_DISCONNECTED && !disconnected) {
				disconnected = 1;
				ended = now_ns();
			}
			rdma_ack_cm_event(ev);
		}
		while (!ibv_get_async_event(id->verbs, &ae)) {
			printf("async %s\n", ibv_event_type_str(ae.event_type));
			ibv_ack_async_event(&ae);
		}
		while ((rc = ibv_poll_cq(cq, 1, &wc)) == 1) {
			done++;
			printf("wc %llu %s", (unsigned long long)wc.wr_id,
			       ibv_wc_status_str(wc.status));
			if (wc.status == IBV_WC_SUCCESS && wc.wr_id >= 1 && wc.wr_id <= 2)
				printf(" len %u data %.*s", wc.byte_len,
				       (int)(wc.byte_len < RECV_LEN ? wc.byte_len : RECV_LEN),
				       rbuf[wc.wr_id - 1]);
			printf("\n");
		}
		if (rc < 0)
			die("ibv_poll_cq: %d", rc);
	}
	printf("end %s\n", disconnected ? "disconnected" : "timeout");
	if (ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &qia))
		printf("qp unknown (ibv_query_qp: %s)\n", strerror(errno));
	else
		printf("qp %s\n", qp_state_name(qa.qp_state));
	report(buf);

	if (!disconnected)
		rdma_disconnect(id);
	rdma_destroy_qp(id);
	if (ibv_dereg_mr(mr0) || ibv_dereg_mr(mr1) || ibv_dereg_mr(mr2) || ibv_dereg_mr(rmr))
		die("ibv_dereg_mr: %s", strerror(errno));
	if (ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) || ibv_dealloc_pd(pd2))
		die("CQ or PD: %s", strerror(errno));
	rdma_destroy_id(id);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	free(buf);
	return 0;
}
