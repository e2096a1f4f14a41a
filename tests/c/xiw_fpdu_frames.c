/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The kernel module's FPDU parser (kernel-shim/xiw_fpdu.c, built for user
 * space) on frames laid out by hand from RFC 5044 (FPDU), RFC 5041 section
 * 4.3 (tagged DDP header) and RFC 5040 section 4.1 (RDMAP control): which
 * are placed, which are left for user space, when more bytes are needed,
 * every refusal of the region check and of the Read Response check, and the
 * CRC32c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xiw_fpdu.h"

static int checks;

#define CHECK(c)                                                               \
	do {                                                                   \
		checks++;                                                      \
		if (!(c)) {                                                    \
			fprintf(stderr, "xiw_fpdu_frames:%d: %s\n", __LINE__, #c); \
			exit(1);                                               \
		}                                                              \
	} while (0)

static void put_be(u8 *p, u64 v, int n)
{
	while (n--) {
		p[n] = (u8)v;
		v >>= 8;
	}
}

/*
 * An FPDU of a tagged segment: ULPDU_Length, DDP control, RDMAP control,
 * STag, TO, payload, zero pad and the CRC (little-endian). Returns its length.
 */
static u32 frame(u8 *f, u8 ddp, u8 rdmap, u32 stag, u64 to, const char *payload)
{
	u32 n = (u32)strlen(payload), ulpdu = 14 + n, covered = (2 + ulpdu + 3) / 4 * 4;
	u32 crc;

	memset(f, 0, covered + 4);
	put_be(f, ulpdu, 2);
	f[2] = ddp;
	f[3] = rdmap;
	put_be(f + 4, stag, 4);
	put_be(f + 8, to, 8);
	memcpy(f + 16, payload, n);
	crc = xiw_fpdu_crc(0, f, covered);
	f[covered] = (u8)crc;
	f[covered + 1] = (u8)(crc >> 8);
	f[covered + 2] = (u8)(crc >> 16);
	f[covered + 3] = (u8)(crc >> 24);
	return covered + 4;
}

static int head(const u8 *f, u32 have, struct xiw_fpdu *out)
{
	memset(out, 0, sizeof(*out));
	return xiw_fpdu_head(f, have, out);
}

static void frames(void)
{
	u8 f[64];
	struct xiw_fpdu w;
	u32 n, have;

	/* T, L, DV 1 | RV 1, RDMA Write; STag 0x12345 (index 0x123, key 0x45). */
	n = frame(f, 0xc1, 0x40, 0x12345, 0x1000, "abcdef");
	CHECK(n == 28); /* 2 + 20 + 2 pad + 4 */
	CHECK(head(f, n, &w) == XIW_FPDU_PLACE);
	CHECK(w.total == 28 && w.stag == 0x12345 && w.to == 0x1000);
	CHECK(w.data_len == 6 && w.last);
	CHECK(memcmp(f + XIW_FPDU_HEAD, "abcdef", 6) == 0);
	CHECK(xiw_fpdu_crc_ok(f, n));
	f[20] ^= 0x10;
	CHECK(!xiw_fpdu_crc_ok(f, n));
	CHECK(head(f, n, &w) == XIW_FPDU_PLACE); /* the CRC is not head's */
	/* A 64-bit TO, not the last segment. */
	n = frame(f, 0x81, 0x40, 0xffffffff, 0x0102030405060708ull, "x");
	CHECK(head(f, n, &w) == XIW_FPDU_PLACE);
	CHECK(w.to == 0x0102030405060708ull && w.stag == 0xffffffff && !w.last);
	CHECK(w.total == 2 + 15 + 3 + 4 && w.data_len == 1);
	/* Until its 16 bytes are there, it takes more. */
	for (have = 0; have < XIW_FPDU_HEAD; have++)
		CHECK(head(f, have, &w) == XIW_FPDU_MORE);
	CHECK(head(f, 2, &w) == XIW_FPDU_MORE && w.total == 24);
	CHECK(head(f, XIW_FPDU_HEAD, &w) == XIW_FPDU_PLACE);
	/* A zero-length Write: only the header, no pad. */
	n = frame(f, 0xc1, 0x40, 7, 0, "");
	CHECK(n == 20 && head(f, n, &w) == XIW_FPDU_PLACE);
	CHECK(w.data_len == 0 && w.total == 20 && xiw_fpdu_crc_ok(f, n));
	/* The longest ULPDU. */
	put_be(f, 0xffff, 2);
	CHECK(head(f, 16, &w) == XIW_FPDU_PLACE);
	CHECK(w.total == 2 + 65535 + 3 + 4 && w.data_len == 65535 - 14);

	/* A Read Response: the same header, for the Read's check. */
	n = frame(f, 0x81, 0x42, 0x12345, 0x2000, "abc");
	CHECK(head(f, n, &w) == XIW_FPDU_READ);
	CHECK(w.stag == 0x12345 && w.to == 0x2000 && w.data_len == 3 && !w.last);
	n = frame(f, 0xc1, 0x42, 0x12345, 0x2003, "");
	CHECK(head(f, n, &w) == XIW_FPDU_READ && w.last && w.data_len == 0);

	/* Shorter than a tagged header: known from the length alone. */
	put_be(f, 13, 2);
	CHECK(head(f, 2, &w) == XIW_FPDU_UP && w.total == 20);
	put_be(f, 0, 2);
	CHECK(head(f, 2, &w) == XIW_FPDU_UP && w.total == 8);
}

/*
 * Headers whose first two bytes are not those of a clean RDMA Write or Read
 * Response.
 */
static void left_up(void)
{
	static const u8 bad[][2] = {
		{ 0x41, 0x40 }, /* untagged (T 0) */
		{ 0x41, 0x43 }, /* an untagged Send */
		{ 0xc0, 0x40 }, /* DDP version 0 */
		{ 0xc2, 0x40 }, /* DDP version 2 */
		{ 0xc5, 0x40 }, /* DDP reserved bits */
		{ 0xe1, 0x40 },
		{ 0xc1, 0x00 }, /* RDMAP version 0 */
		{ 0xc1, 0x80 }, /* RDMAP version 2 */
		{ 0xc1, 0x60 }, /* RDMAP reserved bit */
		{ 0xc1, 0x41 }, /* Read Request, tagged */
		{ 0xc1, 0x43 }, /* Send, tagged */
		{ 0xc1, 0x62 }, /* Read Response, RDMAP reserved bit */
		{ 0xc1, 0x02 }, /* Read Response, RDMAP version 0 */
		{ 0xc9, 0x42 }, /* Read Response, DDP reserved bit */
		{ 0xc1, 0x50 }, /* Atomic Write Request */
	};
	struct xiw_fpdu w;
	u8 f[64];
	size_t i;
	u32 n;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		n = frame(f, bad[i][0], bad[i][1], 0x100, 0, "data");
		CHECK(head(f, n, &w) == XIW_FPDU_UP);
		CHECK(w.total == n);
		CHECK(head(f, XIW_FPDU_HEAD - 1, &w) == XIW_FPDU_MORE);
	}
}

static void region_check(void)
{
	int pd = 0, other = 0;
	struct xiw_fpdu w = { .stag = 0x12345, .to = 0x2010, .data_len = 16 };
	const struct xiw_fpdu_mr good = {
		.stag = 0x12345, .pd = &pd, .iova = 0x2000, .len = 0x100,
		.access = XIW_FPDU_REMOTE_WRITE | 1, .valid = true,
	};
	struct xiw_fpdu_mr mr;
	const u32 rw = XIW_FPDU_REMOTE_WRITE;
	u64 off = 0;

	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) == 0 && off == 0x10);
	CHECK(xiw_fpdu_check(&w, NULL, &pd, rw, &off) != 0);
	CHECK(xiw_fpdu_check(&w, &good, &other, rw, &off) != 0);
	CHECK(xiw_fpdu_check(&w, &good, &pd, 0, &off) != 0);
	CHECK(xiw_fpdu_check(&w, &good, &pd, 4 | 8, &off) != 0);
	mr = good;
	mr.stag = 0x12346; /* another key */
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) != 0);
	mr.stag = 0x22345; /* another index */
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) != 0);
	mr = good;
	mr.valid = false;
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) != 0);
	mr = good;
	mr.access = 1 | 4;
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) != 0);

	/* Bounds: the last byte, one past it, before the start. */
	w.to = 0x2100 - 16;
	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) == 0 && off == 0xf0);
	w.to++;
	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) != 0);
	w.to = 0x1fff;
	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) != 0);
	/* Zero length: anywhere from the start to the end, inclusive. */
	w.data_len = 0;
	w.to = 0x2100;
	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) == 0 && off == 0x100);
	w.to = 0x2000;
	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) == 0 && off == 0);
	w.to = 0x2101;
	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) != 0);
	w.to = 0x1fff;
	CHECK(xiw_fpdu_check(&w, &good, &pd, rw, &off) != 0);
	/* A region of the whole address space: a Write may not wrap. */
	mr = good;
	mr.iova = 0;
	mr.len = ~0ull;
	w.to = ~0ull - 8;
	w.data_len = 8;
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) == 0 && off == ~0ull - 8);
	w.data_len = 9;
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) != 0);
	w.data_len = 10;
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) != 0);
	/* A region that ends at 2^64: up to its last byte but one. */
	mr.iova = ~0ull - 0xff;
	mr.len = 0x100;
	w.to = mr.iova;
	w.data_len = 0xff;
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) == 0 && off == 0);
	w.data_len = 0x100;
	CHECK(xiw_fpdu_check(&w, &mr, &pd, rw, &off) != 0);
}

/* The Read Response check against the Read lent, and its advance. */
static void read_check(void)
{
	int pd = 0, other = 0;
	struct xiw_fpdu w = { .stag = 0x12345, .to = 0x2010, .data_len = 16 };
	struct xiw_fpdu_read rd = { .stag = 0x12345, .to = 0x2010, .left = 48 };
	const struct xiw_fpdu_mr good = {
		.stag = 0x12345, .pd = &pd, .iova = 0x2000, .len = 0x100,
		.access = XIW_FPDU_LOCAL_WRITE, .valid = true,
	};
	struct xiw_fpdu_mr mr;
	u64 off = 0;

	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) == 0 && off == 0x10);
	CHECK(xiw_fpdu_check_read(&w, NULL, &good, &pd, &off) != 0);
	CHECK(xiw_fpdu_check_read(&w, &rd, NULL, &pd, &off) != 0);
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &other, &off) != 0);
	/* A region without the local write right, however remote its rights. */
	mr = good;
	mr.access = XIW_FPDU_REMOTE_WRITE | 4 | 8;
	CHECK(xiw_fpdu_check_read(&w, &rd, &mr, &pd, &off) != 0);
	mr = good;
	mr.valid = false;
	CHECK(xiw_fpdu_check_read(&w, &rd, &mr, &pd, &off) != 0);
	/* Another STag, another TO than where the Read's data has reached. */
	w.stag = 0x12346;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.stag = 0x12345;
	w.to = 0x2011;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.to = 0x2000;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.to = 0x2010;
	/* More than is left; the last with less or more than is left. */
	w.data_len = 49;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.data_len = 47;
	w.last = true;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.data_len = 48;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) == 0);
	/* The region's bounds hold even where the Read's do. */
	rd.left = 0x200;
	w.data_len = 0x100;
	w.last = false;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.data_len = 0xf0;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) == 0);
	/* Placed: the next segment goes after it; the last one ends the Read. */
	rd.left = 48;
	w.data_len = 16;
	CHECK(!xiw_fpdu_read_placed(&rd, &w));
	CHECK(rd.to == 0x2020 && rd.left == 32);
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.to = 0x2020;
	w.data_len = 32;
	w.last = true;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) == 0 && off == 0x20);
	CHECK(xiw_fpdu_read_placed(&rd, &w) && rd.left == 0 && rd.to == 0x2040);
	/* Nothing is left: only a zero-length last segment would fit. */
	w.to = 0x2040;
	w.data_len = 1;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) != 0);
	w.data_len = 0;
	CHECK(xiw_fpdu_check_read(&w, &rd, &good, &pd, &off) == 0);
}

/* CRC32c a bit at a time: the definition, to check the module's routine by. */
static u32 crc_bits(const u8 *p, size_t n)
{
	u32 c = ~0u;
	int k;

	while (n--) {
		c ^= *p++;
		for (k = 0; k < 8; k++)
			c = c >> 1 ^ (c & 1 ? 0x82f63b78 : 0);
	}
	return ~c;
}

static void crc(void)
{
	static const char digits[] = "123456789";
	u8 t[4] = { 0x83, 0x92, 0x06, 0xe3 };
	static u8 data[700];
	size_t i, n;
	u32 c;

	/* Every length and split point of a few, at odd offsets too. */
	for (i = 0; i < sizeof(data); i++)
		data[i] = (u8)(i * 131 + 7);
	for (n = 0; n + 3 <= sizeof(data); n++) {
		CHECK(xiw_fpdu_crc(0, data + 3, n) == crc_bits(data + 3, n));
		c = xiw_fpdu_crc(0, data, n / 3);
		CHECK(xiw_fpdu_crc(c, data + n / 3, n - n / 3) == crc_bits(data, n));
	}

	/* The CRC32c check value, whole and in two pieces. */
	CHECK(xiw_fpdu_crc(0, digits, 9) == 0xe3069283);
	c = xiw_fpdu_crc(0, digits, 4);
	CHECK(xiw_fpdu_crc(c, digits + 4, 5) == 0xe3069283);
	CHECK(xiw_fpdu_crc(0, digits, 0) == 0);
	/* On the wire, least significant byte first. */
	CHECK(xiw_fpdu_trailer_ok(0xe3069283, t));
	t[0] ^= 1;
	CHECK(!xiw_fpdu_trailer_ok(0xe3069283, t));
	CHECK(!xiw_fpdu_crc_ok(t, 3));
}

/*
 * An FPDU of an untagged segment (RFC 5041 section 4.4): ULPDU_Length, DDP
 * control, RDMAP control, Invalidate STag, QN, MSN, MO, payload, pad, CRC.
 */
static u32 untagged(u8 *f, u8 ddp, u8 rdmap, u32 qn, const char *payload)
{
	u32 n = (u32)strlen(payload), ulpdu = 18 + n, covered = (2 + ulpdu + 3) / 4 * 4;

	memset(f, 0, covered + 4);
	put_be(f, ulpdu, 2);
	f[2] = ddp;
	f[3] = rdmap;
	put_be(f + 8, qn, 4);
	put_be(f + 12, 1, 4);
	memcpy(f + 20, payload, n);
	return covered + 4;
}

/* Which FPDUs left for user space complete a receive (xiw_fpdu_event). */
static void events(void)
{
	static const struct {
		u8 ddp, rdmap;
		u32 qn;
		int ev;
	} cases[] = {
		{ 0x41, 0x43, 0, XIW_FPDU_EV_RECV },	  /* Send */
		{ 0x41, 0x44, 0, XIW_FPDU_EV_RECV },	  /* Send with Invalidate */
		{ 0x41, 0x45, 0, XIW_FPDU_EV_SOLICITED }, /* Send with SE */
		{ 0x41, 0x46, 0, XIW_FPDU_EV_SOLICITED }, /* ... and Invalidate */
		{ 0x41, 0x48, 0, XIW_FPDU_EV_RECV },	  /* Immediate Data */
		{ 0x41, 0x49, 0, XIW_FPDU_EV_SOLICITED }, /* ... with SE */
		{ 0x01, 0x43, 0, XIW_FPDU_EV_NONE },	  /* not the last segment */
		{ 0x41, 0x43, 1, XIW_FPDU_EV_NONE },	  /* queue 1 */
		{ 0x41, 0x41, 1, XIW_FPDU_EV_NONE },	  /* Read Request */
		{ 0x41, 0x47, 2, XIW_FPDU_EV_NONE },	  /* Terminate */
		{ 0x41, 0x4a, 3, XIW_FPDU_EV_NONE },	  /* Atomic Request */
		{ 0x41, 0x40, 0, XIW_FPDU_EV_NONE },	  /* a Write, untagged */
		{ 0x42, 0x43, 0, XIW_FPDU_EV_NONE },	  /* DDP version 2 */
		{ 0x43, 0x43, 0, XIW_FPDU_EV_NONE },	  /* DDP version 3 */
		{ 0x45, 0x43, 0, XIW_FPDU_EV_NONE },	  /* DDP reserved bit */
		{ 0x41, 0x03, 0, XIW_FPDU_EV_NONE },	  /* RDMAP version 0 */
		{ 0x41, 0x63, 0, XIW_FPDU_EV_NONE },	  /* RDMAP reserved bit */
		{ 0xc1, 0x43, 0, XIW_FPDU_EV_NONE },	  /* tagged */
	};
	struct xiw_fpdu w;
	u8 f[64];
	size_t i;
	u32 n, have;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		n = untagged(f, cases[i].ddp, cases[i].rdmap, cases[i].qn, "hi");
		CHECK(xiw_fpdu_event(f, n) == cases[i].ev);
		/* Never placed, whatever it completes. */
		CHECK(head(f, n, &w) == XIW_FPDU_UP && w.total == n);
	}
	/* Too few bytes to see the queue number: nothing told. */
	n = untagged(f, 0x41, 0x43, 0, "hi");
	for (have = 0; have < 12; have++)
		CHECK(xiw_fpdu_event(f, have) == XIW_FPDU_EV_NONE);
	CHECK(xiw_fpdu_event(f, 12) == XIW_FPDU_EV_RECV);
	/* A ULPDU shorter than an untagged header is nothing. */
	put_be(f, 17, 2);
	CHECK(xiw_fpdu_event(f, n) == XIW_FPDU_EV_NONE);
}

int main(void)
{
	frames();
	left_up();
	events();
	region_check();
	read_check();
	crc();
	printf("xiw_fpdu_frames: %d checks\n", checks);
	return 0;
}
