// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Whole lifetimes of a device context, over and over, through the real
 * libibverbs: nothing may stay behind.
 *
 *   xiw_cycles [--no-memory-check] [CYCLES]
 *
 * Each cycle (CYCLES, 1000 by default) opens the device, queries it, allocates
 * a PD, registers two MRs (4 KiB local, 1 MiB with remote access), creates a
 * plain CQ and an extended one (ibv_create_cq_ex), tries a completion channel
 * (standalone mode has none: either the channel or a CQ on it must be refused
 * cleanly, and a channel made is destroyed again), an SRQ and four QPs: A
 * (plain), B (extended, receiving from the SRQ), C (extended with send
 * operations, left idle) and D (moved to INIT only). A and B are connected to
 * each other; A writes 64 KiB into B's MR and sends a message that B receives
 * through the SRQ, and both are checked byte for byte. Then everything is
 * destroyed in reverse order and the device is closed.
 *
 * Resident memory (VmRSS), address space (VmSize), the number of open file
 * descriptors and the number of threads are measured after a warm-up (a
 * tenth of the cycles, at most 50) and at the end. The descriptors and
 * threads must be exactly where they were; memory may grow by at most
 * RSS_SLACK_KIB and VM_SLACK_KIB (see there). --no-memory-check skips the
 * memory bounds (under valgrind the process's memory is the tool's), but
 * still prints the figures.
 *
 * The device is the first one libibverbs lists (or $XIW_DEVICE). Prints one
 * result line on success; exits 1 with the reason on stderr otherwise.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "xiw_test.h"

#define SMALL (4u << 10)
#define BIG (1u << 20)
#define WRITE_LEN (64u << 10)
#define MSG_LEN 3000u

/*
 * How much resident memory may grow between the end of the warm-up and the
 * last cycle: 1 MiB, so with the default 1,000 cycles (950 measured) a cycle
 * that leaves more than about 1.1 KiB behind fails. A cycle allocates far
 * more than that (a context and its progress thread, four QPs with their
 * rings, CQs, an SRQ), so losing any one of them whole shows at once. What
 * moves without a leak is glibc's malloc: where in its arenas the next
 * cycle's blocks land, and which freed pages it has returned yet. That does
 * not grow with the number of cycles: 0 to 60 KiB over 950 and 4,950
 * measured cycles on the development machine.
 */
#define RSS_SLACK_KIB 1024l

/*
 * Address space catches what resident memory cannot: a mapping left behind
 * that was never touched (a ring, a thread's stack). One leaked mapping per
 * cycle is at least a page, 950 cycles at least 3.7 MiB. What moves without
 * a leak is glibc's heap top (brk) and the arenas of the progress threads,
 * reserved once and reused: 0 to 4 KiB over 950 and 4,950 measured cycles.
 */
#define VM_SLACK_KIB 4096l

/* A field of /proc/self/status in kB ("VmRSS"); exits if there is none. */
static long status_kib(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	size_t n = strlen(field);
	long v = -1;

	if (!f)
		die("opening /proc/self/status: %s", strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	if (v < 0)
		die("no %s in /proc/self/status", field);
	return v;
}

/* Entries of a /proc directory, less "." and "..". */
static int count_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int n = 0;

	if (!d)
		die("opening %s: %s", path, strerror(errno));
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Open descriptors, not counting the one that reads the directory. */
static int open_fds(void)
{
	return count_entries("/proc/self/fd") - 1;
}

struct usage {
	long rss_kib, vm_kib;
	int fds, threads;
};

static struct usage usage_now(void)
{
	struct usage u = {
		.rss_kib = status_kib("VmRSS"),
		.vm_kib = status_kib("VmSize"),
		.fds = open_fds(),
		.threads = count_entries("/proc/self/task"),
	};

	return u;
}

static uint8_t pattern(uint32_t cycle, size_t i)
{
	return (uint8_t)(cycle * 131u + i * 7u + (i >> 8));
}

static struct ibv_qp *cycle_qp(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *scq,
			       struct ibv_cq *rcq, struct ibv_srq *srq, uint64_t send_ops)
{
	struct ibv_qp_init_attr_ex at = {
		.send_cq = scq,
		.recv_cq = rcq,
		.srq = srq,
		.cap = { .max_send_wr = 8, .max_recv_wr = srq ? 0 : 8, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};

	return qp_ex(ctx, &at, send_ops);
}

/* A destroy verb's result: 0, or the error number (some set errno instead). */
static void gone(int r, const char *what)
{
	if (r)
		die("%s: %s", what, strerror(r > 0 ? r : errno));
}

static void post_recv_srq(struct ibv_srq *srq, uint64_t id, uint8_t *buf, uint32_t len,
			  uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	if (ibv_post_srq_recv(srq, &wr, &bad))
		die("ibv_post_srq_recv: %s", strerror(errno));
}

/*
 * Standalone mode has no completion channels: either libibverbs cannot make
 * one, or the provider refuses a CQ on it with EOPNOTSUPP. A channel that was
 * made is destroyed again (its descriptor must go with it).
 */
static void channel_refused(struct ibv_context *ctx)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq;

	if (!ch)
		return;
	errno = 0;
	cq = ibv_create_cq(ctx, 8, NULL, ch, 0);
	if (cq)
		die("a CQ with a completion channel in standalone mode");
	if (errno != EOPNOTSUPP)
		die("a CQ with a completion channel: %s, expected EOPNOTSUPP", strerror(errno));
	gone(ibv_destroy_comp_channel(ch), "ibv_destroy_comp_channel");
}

/* The receive completion of `wr_id` on the extended CQ, read field by field. */
static void expect_recv_ex(struct ibv_cq_ex *cq, uint64_t wr_id, uint32_t len, uint32_t qpn)
{
	struct ibv_poll_cq_attr pa = { 0 };
	uint64_t t0 = now_ns();
	int r;

	while ((r = ibv_start_poll(cq, &pa)) == ENOENT)
		if (now_ns() - t0 > 5000000000ull)
			die("receive: no completion within 5 s");
	if (r)
		die("ibv_start_poll: %s", strerror(r));
	if (cq->status != IBV_WC_SUCCESS || cq->wr_id != wr_id ||
	    ibv_wc_read_opcode(cq) != IBV_WC_RECV || ibv_wc_read_byte_len(cq) != len ||
	    ibv_wc_read_qp_num(cq) != qpn)
		die("receive: WR %" PRIu64 " %s, opcode %d, %u bytes, QP %#x; expected WR %"
		    PRIu64 ", %u bytes on QP %#x", cq->wr_id, ibv_wc_status_str(cq->status),
		    (int)ibv_wc_read_opcode(cq), ibv_wc_read_byte_len(cq), ibv_wc_read_qp_num(cq),
		    wr_id, len, qpn);
	ibv_end_poll(cq);
}

/* Buffers outlive the cycles: what a cycle leaves behind is the provider's. */
struct bufs {
	uint8_t *a_small, *a_big, *b_small, *b_big;
};

static void cycle(uint32_t n, const struct bufs *m)
{
	struct ibv_context *ctx = open_dev();
	struct ibv_device_attr_ex dev;
	struct ibv_port_attr port;
	union ibv_gid gid;
	struct ibv_pd *pd;
	struct ibv_mr *a_small, *a_big, *b_small, *b_big;
	struct ibv_cq *cq;
	struct ibv_cq_ex *cqx;
	struct ibv_srq *srq;
	struct ibv_qp *a, *b, *c, *d;
	int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

	if (ibv_query_device_ex(ctx, NULL, &dev) || ibv_query_port(ctx, 1, &port) ||
	    ibv_query_gid(ctx, 1, 0, &gid))
		die("querying the device: %s", strerror(errno));
	if (port.state != IBV_PORT_ACTIVE)
		die("port 1 is not active (%d)", (int)port.state);

	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	a_small = ibv_reg_mr(pd, m->a_small, SMALL, IBV_ACCESS_LOCAL_WRITE);
	a_big = ibv_reg_mr(pd, m->a_big, BIG, remote);
	b_small = ibv_reg_mr(pd, m->b_small, SMALL, IBV_ACCESS_LOCAL_WRITE);
	b_big = ibv_reg_mr(pd, m->b_big, BIG, remote);
	if (!a_small || !a_big || !b_small || !b_big)
		die("ibv_reg_mr: %s", strerror(errno));

	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq: %s", strerror(errno));
	struct ibv_cq_init_attr_ex cqa = {
		.cqe = 64,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM,
	};
	cqx = ibv_create_cq_ex(ctx, &cqa);
	if (!cqx)
		die("ibv_create_cq_ex: %s", strerror(errno));
	channel_refused(ctx);

	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 2 } };

	srq = ibv_create_srq(pd, &sa);
	if (!srq)
		die("ibv_create_srq: %s", strerror(errno));

	a = cycle_qp(ctx, pd, cq, cq, NULL, 0);
	b = cycle_qp(ctx, pd, cq, ibv_cq_ex_to_cq(cqx), srq, 0);
	c = cycle_qp(ctx, pd, ibv_cq_ex_to_cq(cqx), cq, NULL,
		     IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ);
	d = cycle_qp(ctx, pd, cq, cq, NULL, 0);
	if (to_init(d, IBV_ACCESS_LOCAL_WRITE))
		die("modify_qp to INIT: %s", strerror(errno));

	/* A and B, connected to each other on this one context. */
	if (to_init(a, remote))
		die("modify_qp to INIT: %s", strerror(errno));
	if (to_init(b, remote))
		die("modify_qp to INIT: %s", strerror(errno));
	for (size_t i = 0; i < MSG_LEN; i++)
		m->a_small[i] = pattern(n, i);
	for (size_t i = 0; i < WRITE_LEN; i++)
		m->a_big[i] = pattern(n + 1, i);
	memset(m->b_small, 0, SMALL);
	memset(m->b_big, 0, WRITE_LEN + 64);
	post_recv_srq(srq, n, m->b_small, SMALL, b_small->lkey);
	if (to_rts(a, gid, b->qp_num) || to_rts(b, gid, a->qp_num))
		die("connecting A and B: %s", strerror(errno));
	post_one(a, 1, IBV_WR_RDMA_WRITE, (uintptr_t)m->a_big, WRITE_LEN, a_big->lkey,
		 (uintptr_t)m->b_big, b_big->rkey);
	post_one(a, 2, IBV_WR_SEND, (uintptr_t)m->a_small, MSG_LEN, a_small->lkey, 0, 0);
	wait_wc(cq, 1, "the RDMA Write");
	wait_wc(cq, 2, "the Send");
	expect_recv_ex(cqx, n, MSG_LEN, b->qp_num);
	/* The Send follows the Write on one stream: both are placed by now. */
	for (size_t i = 0; i < MSG_LEN; i++)
		if (m->b_small[i] != pattern(n, i))
			die("cycle %u: received byte %zu is wrong", n, i);
	for (size_t i = 0; i < WRITE_LEN; i++)
		if (m->b_big[i] != pattern(n + 1, i))
			die("cycle %u: written byte %zu is wrong", n, i);
	for (size_t i = WRITE_LEN; i < WRITE_LEN + 64; i++)
		if (m->b_big[i])
			die("cycle %u: byte %zu past the Write changed", n, i);

	gone(ibv_destroy_qp(d), "ibv_destroy_qp(D)");
	gone(ibv_destroy_qp(c), "ibv_destroy_qp(C)");
	gone(ibv_destroy_qp(b), "ibv_destroy_qp(B)");
	gone(ibv_destroy_qp(a), "ibv_destroy_qp(A)");
	gone(ibv_destroy_srq(srq), "ibv_destroy_srq");
	gone(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), "ibv_destroy_cq (extended)");
	gone(ibv_destroy_cq(cq), "ibv_destroy_cq");
	gone(ibv_dereg_mr(b_big), "ibv_dereg_mr");
	gone(ibv_dereg_mr(b_small), "ibv_dereg_mr");
	gone(ibv_dereg_mr(a_big), "ibv_dereg_mr");
	gone(ibv_dereg_mr(a_small), "ibv_dereg_mr");
	gone(ibv_dealloc_pd(pd), "ibv_dealloc_pd");
	gone(ibv_close_device(ctx), "ibv_close_device");
}

static uint8_t *page_alloc(size_t n)
{
	void *p;

	if (posix_memalign(&p, 4096, n))
		die("out of memory");
	memset(p, 0, n);
	return p;
}

int main(int argc, char **argv)
{
	int check_memory = 1, arg = 1;
	long cycles = 1000, warmup;
	struct bufs m;
	struct usage u0, u1;
	uint64_t t0, t1, t2;

	if (arg < argc && !strcmp(argv[arg], "--no-memory-check")) {
		check_memory = 0;
		arg++;
	}
	if (arg < argc)
		cycles = strtol(argv[arg++], NULL, 10);
	if (arg != argc || cycles < 2) {
		fprintf(stderr, "usage: xiw_cycles [--no-memory-check] [CYCLES (at least 2)]\n");
		return 2;
	}
	warmup = cycles / 10 < 50 ? cycles / 10 : 50;
	if (warmup < 1)
		warmup = 1;

	m.a_small = page_alloc(SMALL);
	m.a_big = page_alloc(BIG);
	m.b_small = page_alloc(SMALL);
	m.b_big = page_alloc(BIG);

	t0 = now_ns();
	for (long i = 0; i < warmup; i++)
		cycle((uint32_t)i, &m);
	u0 = usage_now();
	t1 = now_ns();
	for (long i = warmup; i < cycles; i++)
		cycle((uint32_t)i, &m);
	t2 = now_ns();
	u1 = usage_now();

	printf("cycles: %ld (%ld measured after %ld warm-up), %.1f ms each: RSS %ld -> %ld KiB "
	       "(%+ld), VmSize %ld -> %ld KiB (%+ld), fds %d -> %d, threads %d -> %d, "
	       "%.2f s in all\n", cycles, cycles - warmup, warmup,
	       (t2 - t1) / 1e6 / (double)(cycles - warmup), u0.rss_kib, u1.rss_kib,
	       u1.rss_kib - u0.rss_kib, u0.vm_kib, u1.vm_kib, u1.vm_kib - u0.vm_kib, u0.fds,
	       u1.fds, u0.threads, u1.threads, (t2 - t0) / 1e9);
	fflush(stdout);
	if (u1.fds != u0.fds)
		die("open file descriptors went from %d to %d", u0.fds, u1.fds);
	if (u1.threads != u0.threads)
		die("threads went from %d to %d", u0.threads, u1.threads);
	if (check_memory && u1.rss_kib - u0.rss_kib > RSS_SLACK_KIB)
		die("resident memory grew by %ld KiB over %ld cycles (at most %ld allowed)",
		    u1.rss_kib - u0.rss_kib, cycles - warmup, RSS_SLACK_KIB);
	if (check_memory && u1.vm_kib - u0.vm_kib > VM_SLACK_KIB)
		die("address space grew by %ld KiB over %ld cycles (at most %ld allowed)",
		    u1.vm_kib - u0.vm_kib, cycles - warmup, VM_SLACK_KIB);
	free(m.a_small);
	free(m.a_big);
	free(m.b_small);
	free(m.b_big);
	return 0;
}
