/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * durable_log - a remote durable log on xiw's direct verbs.
 *
 * The server maps a log file and registers it for RDMA Flush and Verify;
 * after the connection is set up its CPU does nothing for the log. The
 * client appends records: for each one it posts, in a single batch,
 *
 *   RDMA Write   the record into its slot               (unsignaled)
 *   RDMA Flush   the record's range to persistence      (unsignaled)
 *   Atomic Write the new commit counter (8 bytes)       (unsignaled)
 *   RDMA Flush   the counter to persistence             (signaled)
 *
 * and once the last completion arrives, record and counter are durable at
 * the server. At the end one RDMA Verify has the server hash the appended
 * records as they are on its medium and compare with the client's CRC32c.
 *
 *   durable_log --server --file PATH --port P [--dev xiw0]
 *   durable_log --client HOST --port P --records N [--size BYTES] [--dev xiw0]
 *
 * Log file layout (LOG_SIZE bytes): a header page holding the commit counter
 * (records committed, a uint64_t in the client's byte order) at offset 0 and
 * LOG_MAGIC at offset 8; record r (from 0) at LOG_HDR + r * size. Record r
 * holds r + 1 as a little-endian uint64_t, then byte k is (r + 1) * 131 + k
 * (mod 256). A log is appended with the same --size every time.
 *
 * Build: gcc -std=c11 -Wall -Wextra -O2 -o durable_log durable_log.c \
 *            $(pkg-config --cflags --libs xiwdv)
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <infiniband/xiwdv.h>

#define LOG_SIZE (1u << 20)
#define LOG_HDR 4096u
#define LOG_MAGIC "xiwdvlog"
#define LOG_MAGIC_OFF 8u

#define PORT_NUM 1
#define GID_INDEX 0
#define RD_ATOMIC 16
#define SQ_DEPTH 64
#define CQ_DEPTH 64
#define CQ_TIMEOUT_S 20
#define VERIFY_WR_ID UINT64_MAX

/* What each side tells the other over TCP, as one text line. */
struct peer_info {
	uint32_t qpn;
	union ibv_gid gid;
	uint32_t rkey;   /* server only: the log MR */
	uint64_t addr;   /* server only: where the log file is mapped */
	uint64_t len;    /* server only: LOG_SIZE */
	uint64_t commit; /* server only: records committed so far */
};

struct rdma {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("durable_log: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* CRC32c (Castagnoli): reflected polynomial 0x82F63B78, init and final xor
 * 0xFFFFFFFF, the hash xiw computes for XIWDV_HASH_CRC32C. */
static uint32_t crc32c(const uint8_t *p, size_t n)
{
	uint32_t crc = 0xFFFFFFFFu;

	while (n--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
	}
	return crc ^ 0xFFFFFFFFu;
}

static void fill_record(uint8_t *rec, uint64_t r, size_t size)
{
	uint64_t seq = r + 1;

	for (size_t k = 0; k < 8; k++)
		rec[k] = (uint8_t)(seq >> (8 * k));
	for (size_t k = 8; k < size; k++)
		rec[k] = (uint8_t)(seq * 131 + k);
}

static uint64_t parse_u64(const char *s, const char *what, uint64_t min, uint64_t max)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *end || *s == '-' || v < min || v > max)
		die("bad %s '%s' (expected %" PRIu64 "..%" PRIu64 ")", what, s, min, max);
	return v;
}

/* ---- TCP side channel ---------------------------------------------------- */

static int tcp_listen_accept(const char *port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *res, *ai;
	int lfd = -1, fd, one = 1, rc;

	rc = getaddrinfo(NULL, port, &hints, &res);
	if (rc)
		die("getaddrinfo(port %s): %s", port, gai_strerror(rc));
	/* Prefer IPv6: on Linux a :: socket takes IPv4 clients as well. */
	for (int pass = 0; pass < 2 && lfd < 0; pass++) {
		for (ai = res; ai; ai = ai->ai_next) {
			if ((ai->ai_family == AF_INET6) != (pass == 0))
				continue;
			lfd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
			if (lfd < 0)
				continue;
			setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
			if (bind(lfd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(lfd, 1) == 0)
				break;
			close(lfd);
			lfd = -1;
		}
	}
	freeaddrinfo(res);
	if (lfd < 0)
		die("cannot listen on TCP port %s: %s", port, strerror(errno));
	fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	close(lfd);
	return fd;
}

static int tcp_connect(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res, *ai;
	int fd = -1, rc;

	rc = getaddrinfo(host, port, &hints, &res);
	if (rc)
		die("getaddrinfo(%s, %s): %s", host, port, gai_strerror(rc));
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
		if (fd < 0)
			continue;
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		die("cannot connect to %s port %s: %s", host, port, strerror(errno));
	return fd;
}

static void send_line(int fd, const char *line)
{
	size_t off = 0, len = strlen(line);

	while (off < len) {
		ssize_t n = send(fd, line + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("send to peer: %s", n < 0 ? strerror(errno) : "connection closed");
		off += (size_t)n;
	}
}

/* Reads one '\n'-terminated line (without it); false on EOF before any byte. */
static bool recv_line(int fd, char *buf, size_t cap)
{
	size_t len = 0;

	for (;;) {
		char c;
		ssize_t n = recv(fd, &c, 1, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("receive from peer: %s", strerror(errno));
		if (n == 0) {
			if (len == 0)
				return false;
			die("peer closed the connection in the middle of a message");
		}
		if (c == '\n')
			break;
		if (len + 1 >= cap)
			die("peer sent an overlong message");
		buf[len++] = c;
	}
	buf[len] = '\0';
	return true;
}

static void send_info(int fd, const struct peer_info *pi)
{
	char line[256], gid[33];

	for (int i = 0; i < 16; i++)
		snprintf(gid + 2 * i, 3, "%02x", pi->gid.raw[i]);
	snprintf(line, sizeof(line),
		 "%08" PRIx32 " %s %08" PRIx32 " %016" PRIx64 " %016" PRIx64 " %016" PRIx64 "\n",
		 pi->qpn, gid, pi->rkey, pi->addr, pi->len, pi->commit);
	send_line(fd, line);
}

static void recv_info(int fd, struct peer_info *pi)
{
	char line[256], gid[33];

	if (!recv_line(fd, line, sizeof(line)))
		die("peer closed the connection before sending its QP information");
	if (sscanf(line, "%" SCNx32 " %32s %" SCNx32 " %" SCNx64 " %" SCNx64 " %" SCNx64,
		   &pi->qpn, gid, &pi->rkey, &pi->addr, &pi->len, &pi->commit) != 6 ||
	    strlen(gid) != 32)
		die("malformed QP information from peer: '%s'", line);
	for (int i = 0; i < 16; i++) {
		unsigned int b;

		if (sscanf(gid + 2 * i, "%2x", &b) != 1)
			die("malformed GID from peer: '%s'", gid);
		pi->gid.raw[i] = (uint8_t)b;
	}
}

/* ---- Verbs --------------------------------------------------------------- */

static void open_device(struct rdma *r, const char *name)
{
	struct ibv_device **list;
	struct xiwdv_device_attr dattr;
	int n, rc;

	list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; i < n && !r->ctx; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
			r->ctx = ibv_open_device(list[i]);
			if (!r->ctx)
				die("ibv_open_device(%s): %s", name, strerror(errno));
		}
	}
	ibv_free_device_list(list);
	if (!r->ctx)
		die("no RDMA device named %s (is SYSFS_PATH set? see xiw up)", name);
	if (!xiwdv_is_xiw(r->ctx))
		die("%s is not an xiw device", name);

	rc = xiwdv_query_device(r->ctx, &dattr);
	if (rc)
		die("xiwdv_query_device: %s", strerror(rc));
	if (!(dattr.caps & XIWDV_CAP_FLUSH_PERSISTENT) || !(dattr.caps & XIWDV_CAP_ATOMIC_WRITE) ||
	    !(dattr.caps & XIWDV_CAP_VERIFY) || !(dattr.hashes & (1u << XIWDV_HASH_CRC32C)))
		die("%s lacks RDMA Flush to persistence, Atomic Write or CRC32c Verify", name);

	r->pd = ibv_alloc_pd(r->ctx);
	if (!r->pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	/* No completion channel: standalone xiw has none, and the client polls. */
	r->cq = ibv_create_cq(r->ctx, CQ_DEPTH, NULL, NULL, 0);
	if (!r->cq)
		die("ibv_create_cq: %s", strerror(errno));
}

static void local_info(const struct rdma *r, struct peer_info *pi)
{
	memset(pi, 0, sizeof(*pi));
	pi->qpn = r->qp->qp_num;
	if (ibv_query_gid(r->ctx, PORT_NUM, GID_INDEX, &pi->gid))
		die("ibv_query_gid: %s", strerror(errno));
}

/* INIT -> RTR -> RTS towards the peer's QP, as ibv_rc_pingpong -g 0 does. */
static void connect_qp(struct ibv_qp *qp, const struct peer_info *peer)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = PORT_NUM;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_ACCESS_FLAGS);
	if (rc)
		die("modify QP to INIT: %s", strerror(rc));

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = RD_ATOMIC;
	a.min_rnr_timer = 12;
	/* iWARP addresses the peer by IP: the GID is required. */
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = GID_INDEX;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = PORT_NUM;
	rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					   IBV_QP_MIN_RNR_TIMER);
	if (rc)
		die("modify QP to RTR: %s", strerror(rc));

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = RD_ATOMIC;
	rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc)
		die("modify QP to RTS: %s", strerror(rc));
}

static void close_rdma(struct rdma *r)
{
	if (r->qp && ibv_destroy_qp(r->qp))
		die("ibv_destroy_qp: %s", strerror(errno));
	if (r->cq && ibv_destroy_cq(r->cq))
		die("ibv_destroy_cq: %s", strerror(errno));
	if (r->pd && ibv_dealloc_pd(r->pd))
		die("ibv_dealloc_pd: %s", strerror(errno));
	if (r->ctx && ibv_close_device(r->ctx))
		die("ibv_close_device: %s", strerror(errno));
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Busy-polls for the completion of wr_id; unsignaled work requests show up
 * only if they fail, and then fail the program. */
static void wait_completion(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_opcode opcode,
			    struct ibv_wc *out)
{
	double deadline = now_s() + CQ_TIMEOUT_S;
	struct ibv_wc wc;

	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);

		if (n < 0)
			die("ibv_poll_cq failed");
		if (n == 0) {
			if (now_s() > deadline)
				die("no completion for work request %" PRIu64 " after %d s", wr_id,
				    CQ_TIMEOUT_S);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS)
			die("work request %" PRIu64 " (opcode %d) failed: %s (vendor error %" PRIu32 ")",
			    wc.wr_id, (int)wc.opcode, ibv_wc_status_str(wc.status), wc.vendor_err);
		if (wc.wr_id != wr_id || wc.opcode != opcode)
			die("unexpected completion: work request %" PRIu64 " opcode %d", wc.wr_id,
			    (int)wc.opcode);
		if (out)
			*out = wc;
		return;
	}
}

static void complete_batch(struct ibv_qp_ex *qpx, const char *what)
{
	int rc = ibv_wr_complete(qpx);

	if (rc)
		die("posting %s: %s (%s)", what, strerror(rc), xiwdv_last_error());
}

/* ---- Server -------------------------------------------------------------- */

/* Maps PATH, creating a fresh log if it is empty or new; refuses any other file. */
static uint8_t *map_log(const char *path)
{
	struct stat st;
	uint8_t *base;
	bool fresh;
	int fd;

	fd = open(path, O_RDWR | O_CREAT, 0644);
	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	if (fstat(fd, &st))
		die("stat %s: %s", path, strerror(errno));
	fresh = st.st_size == 0;
	if (fresh && ftruncate(fd, LOG_SIZE))
		die("extend %s to %u bytes: %s", path, LOG_SIZE, strerror(errno));
	if (!fresh && st.st_size < (off_t)LOG_SIZE)
		die("%s is not a durable_log file (too short)", path);
	base = mmap(NULL, LOG_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
		die("mmap %s: %s", path, strerror(errno));
	close(fd);
	if (fresh) {
		memcpy(base + LOG_MAGIC_OFF, LOG_MAGIC, 8);
		if (msync(base, LOG_HDR, MS_SYNC))
			die("msync %s: %s", path, strerror(errno));
	} else if (memcmp(base + LOG_MAGIC_OFF, LOG_MAGIC, 8) != 0) {
		die("%s is not a durable_log file (no magic)", path);
	}
	return base;
}

static int run_server(const char *dev, const char *path, const char *port)
{
	struct xiwdv_mr_attr attr = { .comp_mask = XIWDV_MR_ATTR_VERIFY_HASH,
				      .verify_hash = XIWDV_HASH_CRC32C };
	struct ibv_qp_init_attr qia;
	struct peer_info me, peer;
	struct rdma r = { 0 };
	struct ibv_mr *mr;
	uint64_t commit;
	uint8_t *base;
	char line[64];
	int fd;

	base = map_log(path);
	open_device(&r, dev);
	mr = xiwdv_reg_mr(r.pd, base, LOG_SIZE,
			  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_FLUSH_PERSISTENT |
				  IBV_ACCESS_FLUSH_GLOBAL,
			  &attr);
	if (!mr)
		die("xiwdv_reg_mr(%s): %s: %s", path, strerror(errno), xiwdv_last_error());

	/* The server posts nothing: its QP only answers the client's requests. */
	memset(&qia, 0, sizeof(qia));
	qia.send_cq = r.cq;
	qia.recv_cq = r.cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = 1;
	qia.cap.max_recv_wr = 1;
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	r.qp = ibv_create_qp(r.pd, &qia);
	if (!r.qp)
		die("ibv_create_qp: %s", strerror(errno));

	fd = tcp_listen_accept(port);
	local_info(&r, &me);
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)base;
	me.len = LOG_SIZE;
	memcpy(&commit, base, sizeof(commit));
	me.commit = commit;
	send_info(fd, &me);
	recv_info(fd, &peer);
	connect_qp(r.qp, &peer);

	/* From here on the client works alone; wait for it to finish. */
	if (!recv_line(fd, line, sizeof(line)) || strcmp(line, "done") != 0)
		die("the client went away without finishing");
	memcpy(&commit, base, sizeof(commit));
	printf("durable_log: server: client done, commit counter %" PRIu64 "\n", commit);
	close(fd);

	if (ibv_dereg_mr(mr))
		die("ibv_dereg_mr: %s", strerror(errno));
	close_rdma(&r);
	munmap(base, LOG_SIZE);
	return 0;
}

/* ---- Client -------------------------------------------------------------- */

static int run_client(const char *dev, const char *host, const char *port, uint64_t nrec,
		      uint64_t size)
{
	struct ibv_qp_init_attr_ex qia;
	struct peer_info me, peer;
	struct rdma r = { 0 };
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	struct ibv_wc wc;
	uint8_t *buf, *hash, expected[4];
	uint64_t area, first, commit;
	size_t total;
	uint32_t crc;
	int fd;

	open_device(&r, dev);
	memset(&qia, 0, sizeof(qia));
	qia.send_cq = r.cq;
	qia.recv_cq = r.cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = SQ_DEPTH;
	qia.cap.max_recv_wr = 1;
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	qia.pd = r.pd;
	qia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_WRITE |
			     XIWDV_QP_EX_WITH_FLUSH | XIWDV_QP_EX_WITH_VERIFY;
	r.qp = ibv_create_qp_ex(r.ctx, &qia);
	if (!r.qp)
		die("ibv_create_qp_ex: %s", strerror(errno));
	qpx = ibv_qp_to_qp_ex(r.qp);
	if (!qpx)
		die("ibv_qp_to_qp_ex: the QP has no extended interface");

	fd = tcp_connect(host, port);
	recv_info(fd, &peer);
	local_info(&r, &me);
	send_info(fd, &me);

	if (peer.len != LOG_SIZE || peer.commit > (LOG_SIZE - LOG_HDR) / size)
		die("the server's log looks wrong (length %" PRIu64 ", commit %" PRIu64 ")",
		    peer.len, peer.commit);
	first = peer.commit;
	area = (LOG_SIZE - LOG_HDR) / size;
	if (nrec > area - first)
		die("log full: room for %" PRIu64 " more records of %" PRIu64 " bytes",
		    area - first, size);

	/* The records, then room for the hash a Verify returns: one MR for both. */
	total = (size_t)(nrec * size);
	buf = aligned_alloc(64, (total + XIWDV_MAX_HASH_LEN + 63) & ~(size_t)63);
	if (!buf)
		die("out of memory for %zu bytes of records", total);
	hash = buf + total;
	for (uint64_t i = 0; i < nrec; i++)
		fill_record(buf + i * size, first + i, size);
	mr = ibv_reg_mr(r.pd, buf, total + XIWDV_MAX_HASH_LEN, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));

	connect_qp(r.qp, &peer);

	for (uint64_t i = 0; i < nrec; i++) {
		uint64_t slot = peer.addr + LOG_HDR + (first + i) * size;

		/* Atomic Write sends these 8 bytes as they are in memory; they stay
		 * untouched until the batch has completed. */
		commit = first + i + 1;

		ibv_wr_start(qpx);
		qpx->wr_id = i;
		qpx->wr_flags = 0;
		ibv_wr_rdma_write(qpx, peer.rkey, slot);
		ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)(buf + i * size), (uint32_t)size);
		/* The Flush covers the Write ahead of it: the responder answers
		 * once the record is durable. */
		qpx->wr_flags = 0;
		xiwdv_wr_flush(qpx, peer.rkey, slot, size, XIWDV_FLUSH_PERSISTENT,
			       XIWDV_FLUSH_RANGE);
		/* Not placed before the Flush ahead of it has completed: the
		 * counter never covers a record that is not durable yet. */
		qpx->wr_flags = 0;
		ibv_wr_atomic_write(qpx, peer.rkey, peer.addr, &commit);
		qpx->wr_flags = IBV_SEND_SIGNALED;
		xiwdv_wr_flush(qpx, peer.rkey, peer.addr, sizeof(commit), XIWDV_FLUSH_PERSISTENT,
			       XIWDV_FLUSH_RANGE);
		complete_batch(qpx, "a record");
		/* Completions are in order: this one means the whole batch is done. */
		wait_completion(r.cq, i, XIWDV_WC_FLUSH, NULL);
	}

	/* Read the appended records back from the server's medium and compare. */
	crc = crc32c(buf, total);
	for (int k = 0; k < 4; k++)
		expected[k] = (uint8_t)(crc >> (24 - 8 * k));
	memset(hash, 0, XIWDV_MAX_HASH_LEN);
	ibv_wr_start(qpx);
	qpx->wr_id = VERIFY_WR_ID;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	xiwdv_wr_verify(qpx, peer.rkey, peer.addr + LOG_HDR + first * size, (uint32_t)total,
			expected, sizeof(expected));
	ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)hash, XIWDV_MAX_HASH_LEN);
	complete_batch(qpx, "the verify");
	wait_completion(r.cq, VERIFY_WR_ID, XIWDV_WC_VERIFY, &wc);
	if (wc.byte_len != sizeof(expected) || memcmp(hash, expected, sizeof(expected)) != 0)
		die("verify returned a different hash (%" PRIu32 " bytes, %02x%02x%02x%02x)",
		    wc.byte_len, hash[0], hash[1], hash[2], hash[3]);

	if (ibv_dereg_mr(mr))
		die("ibv_dereg_mr: %s", strerror(errno));
	close_rdma(&r);
	free(buf);
	send_line(fd, "done\n");
	close(fd);

	printf("durable_log: records %" PRIu64 "..%" PRIu64 " of %" PRIu64
	       " bytes, crc32c %08" PRIx32 "\n",
	       first, first + nrec - 1, size, crc);
	printf("durable_log: %" PRIu64 " records durable, verify ok\n", nrec);
	return 0;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: durable_log --server --file PATH --port P [--dev NAME]\n"
	      "       durable_log --client HOST --port P --records N [--size BYTES] [--dev NAME]\n",
	      f);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "server", no_argument, NULL, 'S' },
		{ "client", required_argument, NULL, 'c' },
		{ "file", required_argument, NULL, 'f' },
		{ "port", required_argument, NULL, 'p' },
		{ "records", required_argument, NULL, 'n' },
		{ "size", required_argument, NULL, 's' },
		{ "dev", required_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *dev = "xiw0", *host = NULL, *path = NULL, *port = NULL;
	uint64_t nrec = 0, size = 256;
	bool server = false;
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'S':
			server = true;
			break;
		case 'c':
			host = optarg;
			break;
		case 'f':
			path = optarg;
			break;
		case 'p':
			parse_u64(optarg, "port", 1, 65535);
			port = optarg;
			break;
		case 'n':
			nrec = parse_u64(optarg, "record count", 1, LOG_SIZE - LOG_HDR);
			break;
		case 's':
			size = parse_u64(optarg, "record size", 8, LOG_SIZE - LOG_HDR);
			break;
		case 'd':
			dev = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || server == (host != NULL) || !port ||
	    (server && (!path || nrec)) || (!server && (path || !nrec))) {
		usage(stderr);
		return 2;
	}
	/* One line per event, also when stdout is a pipe. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	return server ? run_server(dev, path, port) : run_client(dev, host, port, nrec, size);
}
