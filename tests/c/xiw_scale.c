// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Scale, through the real libibverbs, between two processes that exchange
 * their GID and QP numbers over a plain TCP socket (out of band), then
 * connect in standalone mode (RESET -> INIT -> RTR -> RTS; RTR starts the
 * connection).
 *
 *   xiw_scale scale server PORT NQPS [DEPTH]
 *   xiw_scale scale client ADDR PORT NQPS [DEPTH]
 *   xiw_scale limit   (max_qp QPs can be created, the next is refused)
 *
 * NQPS RC QPs on each side, QP i of one connected to QP i of the other,
 * with DEPTH (default 4) send and receive requests of one SGE each, no
 * inline data, on one send CQ and one receive CQ shared by all. Every QP
 * has one receive posted before the connections start; once all are in RTS
 * each side sends one 64-byte Send over every QP, naming the QP's index
 * and both QP numbers, and checks that every receive arrives on the QP it
 * was meant for with exactly those bytes, and that every Send completes
 * successfully. Standalone mode uses a TCP socket per QP, so RLIMIT_NOFILE
 * is raised (the soft limit to the hard one, and the hard one too when it
 * is below what NQPS needs and the process may raise it). Prints one line:
 *
 *   scale ok (SIDE): qps=N depth=D create_ms=.. rts_ms=.. rts_max_ms=..
 *     rts_max_qp=.. send_ms=.. connect_ms=.. rss_before_kb=..
 *     rss_after_kb=.. rss_idle_kb=.. bytes_per_qp=.. idle_bytes_per_qp=..
 *     fds_before=.. fds_after=.. nofile=.. threads=.. destroy_ms=..
 *
 * create_ms: creating the QPs, moving them to INIT and posting a receive on
 * each; rts_ms: from the first modify to RTR until the last QP is in RTS
 * (rts_max_ms: the slowest QP's two modify calls, rts_max_qp: its index);
 * send_ms: from the first Send posted until every Send of this side has
 * completed and every Send of the peer has arrived; connect_ms: the two
 * together, from the first modify to RTR until every QP has carried a Send
 * both ways (a QP in RTS may still be connecting: its Send waits for it).
 * rss_before_kb: VmRSS with the device open, buffers registered and CQs
 * made, before the first QP; rss_after_kb: right after the Sends;
 * rss_idle_kb: 2.5 s later, once idle QPs have given their staging buffers
 * back; bytes_per_qp: (after - before) / NQPS (idle_bytes_per_qp likewise).
 *
 *   xiw_scale flood server PORT RECVS
 *   xiw_scale flood client ADDR PORT SENDS SIZE [SECONDS]
 *
 * One QP pair. The server (receiver) posts only RECVS receives and never
 * more; the client (sender) posts SENDS Sends of SIZE bytes, signaled, as
 * fast as its send queue (128 deep) takes them, for at most SECONDS
 * (default 20), then waits until every one it posted has completed. A Send
 * that finds no receive ends the stream with a Terminate (RFC 5040): the
 * receiver's QP goes to error and the sender's requests complete in error
 * after it. A Send completes once TCP has taken it, so the sender may see
 * more Sends succeed than the receiver had receives for: those were still
 * on the way when the Terminate came back. Both sides sample their VmRSS
 * every 5 ms from before the QP is made to the end, and print what
 * happened:
 *
 *   flood ok (receiver): recvs_posted=.. recvs_ok=.. recvs_err=..
 *     err_status=.. qp_state=.. events=.. err_after_ms=.. rss_before_kb=..
 *     rss_peak_growth_kb=.. rss_end_growth_kb=..
 *   flood ok (sender): sends=.. size=.. posted=.. ok=.. flushed=..
 *     other_err=.. first_err_seq=.. first_err_status=.. post_errno=..
 *     first_err_ms=.. total_ms=.. qp_state=.. events=.. rss_before_kb=..
 *     rss_peak_growth_kb=.. rss_end_growth_kb=..
 *
 * exit: 0 when everything checked held (every request completed exactly
 * once, in order, every delivered byte right, nothing hung); 1 with the
 * reason on stderr otherwise.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xiw_test.h"

enum {
	SLOT = 64,		/* bytes of each Send in scale mode */
	MAGIC = 0x5843414c,	/* "XCAL": first word of each payload */
	FLOOD_DEPTH = 128,	/* the flooding sender's send queue */
	SAMPLE_US = 5000,	/* VmRSS sampling period */
	IDLE_WAIT_MS = 2500,	/* idle QPs trim their buffers within ~2 s */
};

/* ---- small helpers --------------------------------------------------- */

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A "Key:   N kB" line of /proc/self/status, in kB (0 if absent). */
static long status_kb(const char *key)
{
	char line[256];
	size_t k = strlen(key);
	long v = 0;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, k) && line[k] == ':') {
			v = strtol(line + k + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

static long fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	long n = 0;

	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ".", ".." and the directory's own descriptor */
}

/*
 * Raises the soft RLIMIT_NOFILE to the hard limit, and both to `need` when
 * the hard limit is lower and the process may raise it (CAP_SYS_RESOURCE),
 * as a server holding many connections would. Returns the soft limit.
 */
static rlim_t raise_nofile(rlim_t need)
{
	struct rlimit r;

	if (getrlimit(RLIMIT_NOFILE, &r))
		die("getrlimit: %s", strerror(errno));
	if (r.rlim_max < need) {
		struct rlimit up = { .rlim_cur = need, .rlim_max = need };

		if (!setrlimit(RLIMIT_NOFILE, &up))
			r = up;
	}
	if (r.rlim_cur < r.rlim_max) {
		r.rlim_cur = r.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &r))
			die("setrlimit: %s", strerror(errno));
	}
	if (r.rlim_cur < need)
		die("RLIMIT_NOFILE is %llu and cannot be raised; %llu needed (one socket per QP)",
		    (unsigned long long)r.rlim_cur, (unsigned long long)need);
	return r.rlim_cur;
}

static void write_all(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			die("control socket write: %s", strerror(errno));
		p += w;
		n -= (size_t)w;
	}
}

static void read_all(int fd, void *buf, size_t n)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("control socket read: %s", r ? strerror(errno) : "the peer closed it");
		p += r;
		n -= (size_t)r;
	}
}

/* Both sides reach this point before either goes on. */
static void barrier(int fd)
{
	char c = 'b';

	write_all(fd, &c, 1);
	read_all(fd, &c, 1);
	if (c != 'b')
		die("control socket: out of step");
}

static int ctl_listen_accept(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_ANY) };
	int one = 1, l, c;

	l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0)
		die("socket: %s", strerror(errno));
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, 1))
		die("listening on port %d: %s", port, strerror(errno));
	c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept: %s", strerror(errno));
	close(l);
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return c;
}

static int ctl_connect(const char *addr, int port)
{
	struct sockaddr_in sa = ipv4_addr(addr, port);
	double deadline = now_ms() + 10000;
	int one = 1;

	for (;;) {
		int c = socket(AF_INET, SOCK_STREAM, 0);

		if (c < 0)
			die("socket: %s", strerror(errno));
		if (!connect(c, (struct sockaddr *)&sa, sizeof(sa))) {
			setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			return c;
		}
		close(c);
		if (now_ms() > deadline)
			die("connecting to %s:%d: %s", addr, port, strerror(errno));
		usleep(10000);
	}
}

static const char *state_str(enum ibv_qp_state s)
{
	static const char *const names[] = { "RESET", "INIT", "RTR", "RTS",
					     "SQD", "SQE", "ERR" };

	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		die("ibv_query_qp: %s", strerror(errno));
	return a.qp_state;
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
			      uint32_t depth)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = { .max_send_wr = depth, .max_recv_wr = depth, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 0 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };

	if (!qp)
		return NULL;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS))
		die("modify_qp to INIT: %s", strerror(errno));
	return qp;
}

/* Posts one Send of one SGE; returns errno of a refusal (0: posted). */
static int post_send_one(struct ibv_qp *qp, uint64_t id, uint64_t addr, uint32_t len,
			 uint32_t lkey)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

	return ibv_post_send(qp, &wr, &bad);
}

/* ---- VmRSS sampler ---------------------------------------------------- */

static atomic_long rss_peak;
static atomic_bool sampling;

static void *sampler(void *arg)
{
	(void)arg;
	while (atomic_load(&sampling)) {
		long v = status_kb("VmRSS");

		if (v > atomic_load(&rss_peak))
			atomic_store(&rss_peak, v);
		usleep(SAMPLE_US);
	}
	return NULL;
}

static pthread_t start_sampler(void)
{
	pthread_t t;

	atomic_store(&rss_peak, status_kb("VmRSS"));
	atomic_store(&sampling, true);
	if (pthread_create(&t, NULL, sampler, NULL))
		die("pthread_create");
	return t;
}

static void stop_sampler(pthread_t t)
{
	atomic_store(&sampling, false);
	pthread_join(t, NULL);
}

/* Reads every pending async event (non-blocking); appends their names. */
static void drain_async(struct ibv_context *ctx, char *names, size_t cap)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };

	while (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
		struct ibv_async_event ev;
		size_t used = strlen(names);

		if (ibv_get_async_event(ctx, &ev))
			break;
		snprintf(names + used, cap - used, "%s%s", used ? "," : "",
			 ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
}

/* Spaces would split the result line's fields: "local QP ..." -> "local_QP_...". */
static const char *field(const char *s)
{
	static char buf[8][96];
	static int next;
	char *b = buf[next++ % 8];

	snprintf(b, sizeof(buf[0]), "%s", *s ? s : "none");
	for (char *p = b; *p; p++)
		if (*p == ' ')
			*p = '_';
	return b;
}

/* ---- scale ------------------------------------------------------------ */

/* What one side's Send over QP `i` carries. */
static void fill_slot(uint8_t *p, uint32_t i, uint32_t from_qpn, uint32_t to_qpn)
{
	uint32_t h[4] = { MAGIC, i, from_qpn, to_qpn };

	memcpy(p, h, sizeof(h));
	for (int j = sizeof(h); j < SLOT; j++)
		p[j] = (uint8_t)(i * 31 + j * 7 + (from_qpn & 0xff));
}

static int scale(int server, const char *addr, int port, uint32_t n, uint32_t depth)
{
	const char *side = server ? "server" : "client";
	rlim_t nofile = raise_nofile((rlim_t)n + 256);
	int ctl = server ? ctl_listen_accept(port) : ctl_connect(addr, port);
	struct ibv_context *ctx = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	size_t bytes = (size_t)n * SLOT;
	uint8_t *sbuf = malloc(bytes), *rbuf = malloc(bytes), *expect = malloc(SLOT);
	uint8_t *got_send = malloc(n), *got_recv = malloc(n);
	struct ibv_qp **qps = malloc(n * sizeof(*qps));
	uint32_t *mine = malloc(4 * (size_t)n), *theirs = malloc(4 * (size_t)n);
	struct ibv_mr *smr, *rmr;
	struct ibv_cq *scq, *rcq;
	union ibv_gid gid, peer_gid;
	uint32_t peer_n;
	double t0, t1, t2, t3, t4, deadline;
	long rss0, rss1, rss2, fds0, fds1, threads;
	uint32_t nsend = 0, nrecv = 0, rts_max_i = 0;
	double rts_max = 0;
	struct ibv_wc wc[64];

	if (!pd || !sbuf || !rbuf || !expect || !got_send || !got_recv || !qps || !mine ||
	    !theirs)
		die("setting up: %s", strerror(errno));
	/* Touched now, so that only what the QPs take shows in the difference. */
	memset(sbuf, 0, bytes);
	memset(rbuf, 0, bytes);
	memset(got_send, 0, n);
	memset(got_recv, 0, n);
	memset(qps, 0, n * sizeof(*qps));
	memset(mine, 0, 4 * (size_t)n);
	memset(theirs, 0, 4 * (size_t)n);
	smr = ibv_reg_mr(pd, sbuf, bytes, 0);
	rmr = ibv_reg_mr(pd, rbuf, bytes, IBV_ACCESS_LOCAL_WRITE);
	scq = ibv_create_cq(ctx, (int)n, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, (int)n, NULL, NULL, 0);
	if (!smr || !rmr || !scq || !rcq)
		die("registering memory or making CQs: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid: %s", strerror(errno));
	fds0 = fd_count();
	rss0 = status_kb("VmRSS");

	/* Every QP in INIT with its one receive posted before anything connects. */
	t0 = now_ms();
	for (uint32_t i = 0; i < n; i++) {
		qps[i] = make_qp(pd, scq, rcq, depth);
		if (!qps[i])
			die("ibv_create_qp #%u of %u: %s (fds in use: %ld)", i, n,
			    strerror(errno), fd_count());
		post_recv_one(qps[i], i, (uint64_t)(uintptr_t)(rbuf + (size_t)i * SLOT), SLOT,
			      rmr->lkey);
		mine[i] = qps[i]->qp_num;
	}
	t1 = now_ms();

	/* Out of band: GID, count, QP numbers (the server reads first, so
	 * neither side writes into a full socket while the other does too). */
	if (server) {
		read_all(ctl, &peer_gid, sizeof(peer_gid));
		read_all(ctl, &peer_n, sizeof(peer_n));
		if (peer_n != n)
			die("the client made %u QPs, this side %u", peer_n, n);
		read_all(ctl, theirs, 4 * (size_t)n);
	}
	write_all(ctl, &gid, sizeof(gid));
	write_all(ctl, &n, sizeof(n));
	write_all(ctl, mine, 4 * (size_t)n);
	if (!server) {
		read_all(ctl, &peer_gid, sizeof(peer_gid));
		read_all(ctl, &peer_n, sizeof(peer_n));
		if (peer_n != n)
			die("the server made %u QPs, this side %u", peer_n, n);
		read_all(ctl, theirs, 4 * (size_t)n);
	}
	for (uint32_t i = 0; i < n; i++)
		fill_slot(sbuf + (size_t)i * SLOT, i, mine[i], theirs[i]);
	barrier(ctl);

	t2 = now_ms();
	for (uint32_t i = 0; i < n; i++) {
		double m0 = now_ms(), m;

		if (to_rts(qps[i], peer_gid, theirs[i]))
			die("modify_qp to RTR/RTS, QP #%u of %u: %s (fds in use: %ld)", i, n,
			    strerror(errno), fd_count());
		m = now_ms() - m0;
		if (m > rts_max) {
			rts_max = m;
			rts_max_i = i;
		}
	}
	t3 = now_ms();

	for (uint32_t i = 0; i < n; i++) {
		int e = post_send_one(qps[i], i, (uint64_t)(uintptr_t)(sbuf + (size_t)i * SLOT),
				      SLOT, smr->lkey);

		if (e)
			die("ibv_post_send on QP #%u: %s", i, strerror(e));
	}
	deadline = now_ms() + 60000;
	while (nsend < n || nrecv < n) {
		int k = ibv_poll_cq(scq, 64, wc), progress = 0;

		if (k < 0)
			die("ibv_poll_cq (send): %d", k);
		for (int j = 0; j < k; j++) {
			uint64_t i = wc[j].wr_id;

			if (wc[j].status != IBV_WC_SUCCESS || wc[j].opcode != IBV_WC_SEND)
				die("the Send over QP #%llu completed with %s (opcode %d); %u of %u sends done",
				    (unsigned long long)i, ibv_wc_status_str(wc[j].status),
				    wc[j].opcode, nsend, n);
			if (i >= n || got_send[i])
				die("send completion for QP #%llu: unknown or twice",
				    (unsigned long long)i);
			if (wc[j].qp_num != mine[i])
				die("send completion of QP #%llu names QP %u, not %u",
				    (unsigned long long)i, wc[j].qp_num, mine[i]);
			got_send[i] = 1;
		}
		nsend += (uint32_t)k;
		progress += k;
		k = ibv_poll_cq(rcq, 64, wc);
		if (k < 0)
			die("ibv_poll_cq (recv): %d", k);
		for (int j = 0; j < k; j++) {
			uint64_t i = wc[j].wr_id;

			if (wc[j].status != IBV_WC_SUCCESS || wc[j].opcode != IBV_WC_RECV)
				die("the receive of QP #%llu completed with %s (opcode %d)",
				    (unsigned long long)i, ibv_wc_status_str(wc[j].status),
				    wc[j].opcode);
			if (i >= n || got_recv[i])
				die("receive completion for QP #%llu: unknown or twice",
				    (unsigned long long)i);
			if (wc[j].qp_num != mine[i] || wc[j].byte_len != SLOT)
				die("receive #%llu: QP %u, %u bytes; expected QP %u, %d bytes",
				    (unsigned long long)i, wc[j].qp_num, wc[j].byte_len,
				    mine[i], SLOT);
			fill_slot(expect, (uint32_t)i, theirs[i], mine[i]);
			if (memcmp(expect, rbuf + i * SLOT, SLOT))
				die("receive #%llu: the bytes are not the peer's Send over QP #%llu",
				    (unsigned long long)i, (unsigned long long)i);
			got_recv[i] = 1;
		}
		nrecv += (uint32_t)k;
		progress += k;
		if (!progress && now_ms() > deadline) {
			uint32_t i = 0;

			while (i < n && got_send[i] && got_recv[i])
				i++;
			die("after 60 s only %u of %u Sends completed and %u of %u arrived; QP #%u (QPN %u, peer %u) is in %s",
			    nsend, n, nrecv, n, i, mine[i], theirs[i],
			    state_str(qp_state(qps[i])));
		}
	}
	t4 = now_ms();
	rss1 = status_kb("VmRSS");
	fds1 = fd_count();
	threads = status_kb("Threads");

	/* Every QP of both sides has carried its Send: now idle. */
	barrier(ctl);
	usleep(IDLE_WAIT_MS * 1000);
	rss2 = status_kb("VmRSS");
	barrier(ctl);

	{
		double d0 = now_ms(), d1;

		for (uint32_t i = 0; i < n; i++)
			if (ibv_destroy_qp(qps[i]))
				die("ibv_destroy_qp #%u: %s", i, strerror(errno));
		d1 = now_ms();
		if (ibv_destroy_cq(scq) || ibv_destroy_cq(rcq) || ibv_dereg_mr(smr) ||
		    ibv_dereg_mr(rmr) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
			die("tearing down: %s", strerror(errno));
		printf("scale ok (%s): qps=%u depth=%u create_ms=%.1f rts_ms=%.1f rts_max_ms=%.1f rts_max_qp=%u send_ms=%.1f connect_ms=%.1f rss_before_kb=%ld rss_after_kb=%ld rss_idle_kb=%ld bytes_per_qp=%.0f idle_bytes_per_qp=%.0f fds_before=%ld fds_after=%ld nofile=%llu threads=%ld destroy_ms=%.1f\n",
		       side, n, depth, t1 - t0, t3 - t2, rts_max, rts_max_i, t4 - t3, t4 - t2,
		       rss0, rss1, rss2, (rss1 - rss0) * 1024.0 / n, (rss2 - rss0) * 1024.0 / n,
		       fds0, fds1, (unsigned long long)nofile, threads, d1 - d0);
	}
	barrier(ctl);
	close(ctl);
	return 0;
}

/* ---- flood ------------------------------------------------------------ */

struct flood_hello {
	union ibv_gid gid;
	uint32_t qpn;
	uint32_t size;
};

/* The payload of flood Send `seq`: its number, then a pattern of it. */
static void fill_flood(uint8_t *p, uint32_t size, uint64_t seq)
{
	memcpy(p, &seq, sizeof(seq));
	for (uint32_t j = sizeof(seq); j < size; j++)
		p[j] = (uint8_t)(seq * 13 + j);
}

static int flood_receiver(int port, uint32_t recvs)
{
	int ctl = ctl_listen_accept(port);
	struct ibv_context *ctx = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct flood_hello me = { 0 }, peer;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	uint8_t *buf, *expect;
	uint32_t ok = 0, bad = 0;
	enum ibv_wc_status err_status = IBV_WC_SUCCESS;
	enum ibv_qp_state st = IBV_QPS_RTS;
	char events[512] = "";
	double go, err_at = -1, next_check = 0, deadline;
	long rss0;
	pthread_t smp;
	int done = 0;

	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	read_all(ctl, &peer, sizeof(peer));
	if (peer.size < 8 || peer.size > (1u << 20))
		die("Send size %u out of range", peer.size);
	buf = malloc((size_t)peer.size * (recvs ? recvs : 1));
	expect = malloc(peer.size);
	if (!buf || !expect)
		die("malloc");
	memset(buf, 0, (size_t)peer.size * (recvs ? recvs : 1));
	mr = ibv_reg_mr(pd, buf, (size_t)peer.size * (recvs ? recvs : 1),
			IBV_ACCESS_LOCAL_WRITE);
	cq = ibv_create_cq(ctx, (int)recvs + 16, NULL, NULL, 0);
	if (!mr || !cq)
		die("ibv_reg_mr / ibv_create_cq: %s", strerror(errno));
	rss0 = status_kb("VmRSS");
	smp = start_sampler();
	qp = make_qp(pd, cq, cq, recvs ? recvs : 1);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	for (uint32_t i = 0; i < recvs; i++)
		post_recv_one(qp, i, (uint64_t)(uintptr_t)(buf + (size_t)i * peer.size),
			      peer.size, mr->lkey);
	if (ibv_query_gid(ctx, 1, 0, &me.gid))
		die("ibv_query_gid: %s", strerror(errno));
	me.qpn = qp->qp_num;
	write_all(ctl, &me, sizeof(me));
	if (to_rts(qp, peer.gid, peer.qpn))
		die("modify_qp to RTR/RTS: %s", strerror(errno));
	barrier(ctl);

	/* Until the sender says it is done: take what arrives, watch the QP. */
	go = now_ms();
	deadline = go + 60000;
	while (!done) {
		struct ibv_wc wc;
		int k = ibv_poll_cq(cq, 1, &wc);

		if (k < 0)
			die("ibv_poll_cq: %d", k);
		if (k == 1) {
			if (wc.status == IBV_WC_SUCCESS) {
				if (wc.wr_id != ok || ok >= recvs || bad)
					die("receive WR %llu completed as receive #%u",
					    (unsigned long long)wc.wr_id, ok);
				fill_flood(expect, peer.size, ok);
				if (wc.byte_len != peer.size ||
				    memcmp(expect, buf + (size_t)ok * peer.size, peer.size))
					die("receive #%u: not Send #%u's bytes", ok, ok);
				ok++;
			} else {
				if (!bad)
					err_status = wc.status;
				bad++;
			}
			continue;
		}
		usleep(100);
		if (now_ms() >= next_check) {
			struct pollfd p = { .fd = ctl, .events = POLLIN };

			next_check = now_ms() + 10;
			st = qp_state(qp);
			if (st == IBV_QPS_ERR && err_at < 0)
				err_at = now_ms() - go;
			drain_async(ctx, events, sizeof(events));
			if (poll(&p, 1, 0) == 1)
				done = 1;
			if (now_ms() > deadline)
				die("the sender did not finish within 60 s");
		}
	}
	{
		char c;

		read_all(ctl, &c, 1);
		if (c != 'd')
			die("control socket: out of step");
	}
	/* Whatever else the QP reports once the sender is done. */
	usleep(200000);
	for (;;) {
		struct ibv_wc wc;
		int k = ibv_poll_cq(cq, 1, &wc);

		if (k <= 0)
			break;
		if (wc.status == IBV_WC_SUCCESS)
			die("a receive completed successfully after the flood ended");
		if (!bad)
			err_status = wc.status;
		bad++;
	}
	st = qp_state(qp);
	drain_async(ctx, events, sizeof(events));
	stop_sampler(smp);
	if (ok + bad != recvs && st == IBV_QPS_ERR)
		die("%u receives posted, %u completed (ok %u, in error %u)", recvs, ok + bad, ok,
		    bad);
	printf("flood ok (receiver): recvs_posted=%u recvs_ok=%u recvs_err=%u err_status=%s qp_state=%s events=%s err_after_ms=%.1f rss_before_kb=%ld rss_peak_growth_kb=%ld rss_end_growth_kb=%ld\n",
	       recvs, ok, bad, field(bad ? ibv_wc_status_str(err_status) : "none"),
	       state_str(st), field(events), err_at, rss0, atomic_load(&rss_peak) - rss0,
	       status_kb("VmRSS") - rss0);
	fflush(stdout);
	barrier(ctl);
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) ||
	    ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("tearing down: %s", strerror(errno));
	close(ctl);
	return 0;
}

/* What the sender's completions came to, in order. */
struct tally {
	uint64_t done, ok, flushed, other, first_err;
	enum ibv_wc_status first_status;
	double first_err_ms;
};

/*
 * Takes up to 64 completions: each must be the next Send's, and none may
 * succeed after one failed. Returns how many it took.
 */
static int reap(struct ibv_cq *cq, struct tally *t, double t0)
{
	struct ibv_wc wc[64];
	int k = ibv_poll_cq(cq, 64, wc);

	if (k < 0)
		die("ibv_poll_cq: %d", k);
	for (int j = 0; j < k; j++, t->done++) {
		if (wc[j].wr_id != t->done)
			die("Send %llu completed where Send %llu was next",
			    (unsigned long long)wc[j].wr_id, (unsigned long long)t->done);
		if (wc[j].status == IBV_WC_SUCCESS) {
			if (t->first_err != UINT64_MAX)
				die("Send %llu succeeded after Send %llu failed",
				    (unsigned long long)t->done, (unsigned long long)t->first_err);
			t->ok++;
			continue;
		}
		if (t->first_err == UINT64_MAX) {
			t->first_err = t->done;
			t->first_status = wc[j].status;
			t->first_err_ms = now_ms() - t0;
		}
		if (wc[j].status == IBV_WC_WR_FLUSH_ERR)
			t->flushed++;
		else
			t->other++;
	}
	return k;
}

static int flood_sender(const char *addr, int port, uint64_t sends, uint32_t size,
			double seconds)
{
	int ctl = ctl_connect(addr, port);
	struct ibv_context *ctx = open_dev();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct flood_hello me = { .size = size }, peer;
	size_t bytes = (size_t)size * FLOOD_DEPTH;
	uint8_t *buf = malloc(bytes);
	struct tally t = { .first_err = UINT64_MAX };
	uint64_t posted = 0;
	int post_errno = 0;
	char events[512] = "";
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	double t0, deadline;
	long rss0;
	pthread_t smp;
	struct ibv_wc extra;

	if (!pd || !buf)
		die("setting up: %s", strerror(errno));
	memset(buf, 0, bytes);
	mr = ibv_reg_mr(pd, buf, bytes, 0);
	cq = ibv_create_cq(ctx, 2 * FLOOD_DEPTH, NULL, NULL, 0);
	if (!mr || !cq)
		die("ibv_reg_mr / ibv_create_cq: %s", strerror(errno));
	rss0 = status_kb("VmRSS");
	smp = start_sampler();
	qp = make_qp(pd, cq, cq, FLOOD_DEPTH);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	if (ibv_query_gid(ctx, 1, 0, &me.gid))
		die("ibv_query_gid: %s", strerror(errno));
	me.qpn = qp->qp_num;
	write_all(ctl, &me, sizeof(me));
	read_all(ctl, &peer, sizeof(peer));
	if (to_rts(qp, peer.gid, peer.qpn))
		die("modify_qp to RTR/RTS: %s", strerror(errno));
	barrier(ctl);

	t0 = now_ms();
	deadline = t0 + seconds * 1000;
	while (posted < sends && now_ms() < deadline && !post_errno) {
		while (posted < sends && posted - t.done < FLOOD_DEPTH) {
			uint8_t *p = buf + (posted % FLOOD_DEPTH) * size;

			fill_flood(p, size, posted);
			post_errno = post_send_one(qp, posted, (uint64_t)(uintptr_t)p, size,
						   mr->lkey);
			if (post_errno)
				break;
			posted++;
		}
		reap(cq, &t, t0);
	}
	/* Every posted Send must complete: none may be left hanging. */
	deadline = now_ms() + 15000;
	while (t.done < posted) {
		int k = reap(cq, &t, t0);

		if (!k && now_ms() > deadline)
			die("%llu of %llu posted Sends never completed (15 s after the last post; QP in %s)",
			    (unsigned long long)(posted - t.done), (unsigned long long)posted,
			    state_str(qp_state(qp)));
	}
	{
		double total = now_ms() - t0;
		enum ibv_qp_state st = qp_state(qp);
		char c = 'd';

		if (ibv_poll_cq(cq, 1, &extra) != 0)
			die("a completion beyond the requests posted");
		write_all(ctl, &c, 1);
		drain_async(ctx, events, sizeof(events));
		stop_sampler(smp);
		printf("flood ok (sender): sends=%llu size=%u posted=%llu ok=%llu flushed=%llu other_err=%llu first_err_seq=%lld first_err_status=%s post_errno=%s first_err_ms=%.1f total_ms=%.1f qp_state=%s events=%s rss_before_kb=%ld rss_peak_growth_kb=%ld rss_end_growth_kb=%ld\n",
		       (unsigned long long)sends, size, (unsigned long long)posted,
		       (unsigned long long)t.ok, (unsigned long long)t.flushed,
		       (unsigned long long)t.other,
		       t.first_err == UINT64_MAX ? -1LL : (long long)t.first_err,
		       field(t.first_err == UINT64_MAX ? "none" : ibv_wc_status_str(t.first_status)),
		       post_errno ? strerrorname_np(post_errno) : "0", t.first_err_ms, total,
		       state_str(st), field(events), rss0, atomic_load(&rss_peak) - rss0,
		       status_kb("VmRSS") - rss0);
		fflush(stdout);
	}
	barrier(ctl);
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) ||
	    ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("tearing down: %s", strerror(errno));
	close(ctl);
	return 0;
}

/* ---- limit ------------------------------------------------------------ */

/*
 * As many QPs as the device reports (max_qp) can be created, and the next
 * one is refused with ENOMEM; once one is destroyed, another fits.
 */
static int limit(void)
{
	struct ibv_context *ctx = open_dev();
	struct ibv_device_attr da;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp **qps;
	struct ibv_qp *extra;
	int max, n, err;

	if (ibv_query_device(ctx, &da))
		die("ibv_query_device: %s", strerror(errno));
	max = da.max_qp;
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	qps = calloc((size_t)max + 1, sizeof(*qps));
	if (!pd || !cq || !qps)
		die("setting up: %s", strerror(errno));
	for (n = 0; n <= max; n++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = cq,
			.recv_cq = cq,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};

		errno = 0;
		qps[n] = ibv_create_qp(pd, &ia);
		if (!qps[n])
			break;
	}
	err = errno;
	if (n != max || err != ENOMEM)
		die("created %d QPs of max_qp %d; the next one: %s", n, max,
		    n > max ? "created too" : strerror(err));
	if (ibv_destroy_qp(qps[max / 2]))
		die("ibv_destroy_qp: %s", strerror(errno));
	{
		struct ibv_qp_init_attr ia = {
			.send_cq = cq,
			.recv_cq = cq,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
				 .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};

		extra = ibv_create_qp(pd, &ia);
		if (!extra)
			die("no QP after one was destroyed: %s", strerror(errno));
		qps[max / 2] = extra;
	}
	for (int i = 0; i < max; i++)
		if (ibv_destroy_qp(qps[i]))
			die("ibv_destroy_qp: %s", strerror(errno));
	free(qps);
	if (ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("tearing down: %s", strerror(errno));
	printf("limit ok: max_qp=%d created=%d next=ENOMEM\n", max, n);
	return 0;
}

/* ---- main ------------------------------------------------------------- */

static unsigned long num(const char *s, unsigned long lo, unsigned long hi, const char *what)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (*s == '\0' || *end != '\0' || v < lo || v > hi)
		die("%s: %s is not a number from %lu to %lu", what, s, lo, hi);
	return v;
}

static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	fprintf(stderr,
		"usage: xiw_scale scale server PORT NQPS [DEPTH]\n"
		"       xiw_scale scale client ADDR PORT NQPS [DEPTH]\n"
		"       xiw_scale flood server PORT RECVS\n"
		"       xiw_scale flood client ADDR PORT SENDS SIZE [SECONDS]\n"
		"       xiw_scale limit\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int server;
	char **a;
	int n;

	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (argc == 2 && !strcmp(argv[1], "limit"))
		return limit();
	if (argc < 4)
		usage();
	server = !strcmp(argv[2], "server");
	if (!server && strcmp(argv[2], "client"))
		usage();
	/* After the role: the server's arguments, or the client's after ADDR. */
	a = argv + (server ? 3 : 4);
	n = argc - (server ? 3 : 4);
	if (!strcmp(argv[1], "scale")) {
		if (n < 2 || n > 3)
			usage();
		return scale(server, server ? NULL : argv[3],
			     (int)num(a[0], 1, 65535, "PORT"),
			     (uint32_t)num(a[1], 1, 1 << 20, "NQPS"),
			     n == 3 ? (uint32_t)num(a[2], 1, 4096, "DEPTH") : 4);
	}
	if (!strcmp(argv[1], "flood")) {
		if (server) {
			if (n != 2)
				usage();
			return flood_receiver((int)num(a[0], 1, 65535, "PORT"),
					      (uint32_t)num(a[1], 0, 4096, "RECVS"));
		}
		if (n < 3 || n > 4)
			usage();
		return flood_sender(argv[3], (int)num(a[0], 1, 65535, "PORT"),
				    num(a[1], 1, 100000000, "SENDS"),
				    (uint32_t)num(a[2], 8, 1 << 20, "SIZE"),
				    n == 4 ? (double)num(a[3], 1, 600, "SECONDS") : 20);
	}
	usage();
}
