/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * A hostile MPA initiator for tests/c/xiw_cm_target.c: its frames are built
 * here by hand from the RFC figures (MPA: RFC 5044 and 6581; DDP: RFC 5041;
 * RDMAP: RFC 5040), with nothing of xiw's own code.
 *
 * It connects over TCP to HOST:PORT, sends an MPA Request of revision 2
 * asking for CRC if CRC is 1, with RFC 6581's IRD/ORD block (IRD 4, ORD 4,
 * peer-to-peer, a zero-length RDMA Write as ready-to-receive message),
 * reads the Reply (CRC is used if it says so) and the target's three
 * regions from its private data (STag, length, TO each: r0 writable, r1
 * read-only, r2 of another PD), sends the ready-to-receive Write, waits
 * half a second and then plays SCENARIO:
 *
 *   valid        Writes into r0: 100 bytes at its start (sent alone), then
 *                in one send 2200 bytes at 1000 (across a page), a Write of
 *                two segments over 7000..8000 (across a page), the last 64
 *                bytes, and a zero-length Write to an STag that does not exist
 *   badstag      64 bytes to an STag never advertised (0x42424200)
 *   badkey       64 bytes to r0's STag with its lowest bit flipped
 *   overrun      64 bytes ending one byte past r0's end
 *   underrun     64 bytes starting one byte before r0's TO
 *   wrap         64 bytes to r0 at TO 2^64 - 32 (the TO wraps)
 *   badcrc       100 bytes at r0's start with a wrong CRC field
 *   ddpver2      100 bytes at r0's start, DDP version 2
 *   ddpver3      the same, DDP version 3
 *   rdmapver     the same, RDMAP version 0
 *   rsvd         100 bytes at r0's start with every reserved bit of the DDP
 *                control byte set, then 100 at 200 with RDMAP's upper
 *                reserved bit set (RFC 5041 and 5040: not checked on receive)
 *   split        2000 bytes at 2000 sent in two parts, split in the header,
 *                and 1000 at 5000 split in the payload, 300 ms between the
 *                parts; 300 ms later 100 whole ones at 9000
 *   good-bad     in one send: 100 bytes at r0's start, then 100 at 200 to
 *                the STag never advertised
 *   bad-good     in one send: the bad one first, then the good one
 *   good-badcrc  in one send: 100 good bytes at r0's start, then 100 at 200
 *                with a wrong CRC field
 *   rights       64 bytes to r1 (no remote write right)
 *   otherpd      64 bytes to r2 (another PD)
 *
 * Every payload byte at TO t is 1 + ((t - r0's TO) mod 2^64) mod 251.
 * Then it listens for 1.5 s: if the target says nothing, it sends a Send of
 * "done" (queue 0, MSN 1) and listens for 1.5 s more; if the target says
 * nothing still it prints "open" and closes. Once the target says anything,
 * it reads until the stream ends (15 s at most) and prints each FPDU:
 * "terminate layer L etype E ecode C" for a Terminate (RFC 5040 section
 * 4.8), "fpdu ..." for another; with CRC, "crc bad" after one whose CRC
 * is wrong; then "closed" (the end), "reset" or "timeout".
 *
 * usage: xiw_hostile_peer HOST PORT CRC SCENARIO
 * exit: 0 once it ran to the end (the judgement is the caller's), 1 if the
 * MPA exchange failed.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xiw_test.h"

/* DDP control (RFC 5041 figure 3): T, L, 4 reserved bits, DV. */
#define DDP_T 0x80
#define DDP_L 0x40
#define DDP_RSVD 0x3c
#define DDP_V1 0x01
/* RDMAP control (RFC 5040 figure 3): RV, reserved, opcode. */
#define RDMAP_V1 0x40
#define OP_WRITE 0x0
#define OP_SEND 0x3
#define OP_TERMINATE 0x7

static int fd, crc;
static uint8_t out[1 << 17];
static size_t olen;

/* r0, r1, r2 of the target: STag, length, TO. */
static struct {
	uint32_t stag, len;
	uint64_t to;
} r[3];

/* CRC32c (Castagnoli, reflected), bit by bit. */
static uint32_t crc32c(const uint8_t *p, size_t n)
{
	uint32_t c = ~0u;

	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = c >> 1 ^ (0x82f63b78u & -(c & 1));
	}
	return ~c;
}

static void pause_ms(int ms)
{
	usleep((useconds_t)ms * 1000);
}

/* Sends the first `n` bytes of what is queued; keeps the rest queued. */
static void send_some(size_t n)
{
	size_t at = 0;

	while (at < n) {
		ssize_t w = write(fd, out + at, n - at);

		if (w <= 0)
			die("sending: %s", strerror(errno));
		at += (size_t)w;
	}
	memmove(out, out + n, olen - n);
	olen -= n;
}

static void send_all(void)
{
	send_some(olen);
}

/*
 * Queues the FPDU of `ulpdu` (RFC 5044 section 4, no markers): ULPDU
 * length, ULPDU, pad to 4, CRC field (the CRC32c of all before it, least
 * significant byte first; not checked without CRC); a wrong one if `bad`.
 */
static void fpdu(const uint8_t *ulpdu, size_t n, int bad)
{
	uint8_t *f = out + olen;
	size_t at = 2 + n;
	uint32_t c;

	if (n > 0xffff || olen + n + 10 > sizeof(out))
		die("FPDU too large");
	f[0] = (uint8_t)(n >> 8);
	f[1] = (uint8_t)n;
	memcpy(f + 2, ulpdu, n);
	while (at % 4)
		f[at++] = 0;
	c = crc ? crc32c(f, at) : 0;
	if (bad)
		c ^= 0xffffffffu;
	for (int k = 0; k < 4; k++)
		f[at++] = (uint8_t)(c >> (8 * k));
	olen += at;
}

/* What the peer writes at TO `to`. */
static uint8_t written(uint64_t to)
{
	return (uint8_t)(1 + (to - r[0].to) % 251);
}

/*
 * Queues one tagged segment (RFC 5041 figure 4: DDP control, RDMAP control,
 * STag, TO, payload) of `len` bytes at `to` of `stag`.
 */
static void segment(uint8_t ddp, uint8_t rdmap, uint32_t stag, uint64_t to, uint32_t len,
		    int bad)
{
	static uint8_t u[14 + 65535];

	if (len > sizeof(u) - 14)
		die("segment too large");
	u[0] = ddp;
	u[1] = rdmap;
	put_be32(u + 2, stag);
	put_be32(u + 6, (uint32_t)(to >> 32));
	put_be32(u + 10, (uint32_t)to);
	for (uint32_t i = 0; i < len; i++)
		u[14 + i] = written(to + i);
	fpdu(u, 14 + len, bad);
}

/* A whole RDMA Write of one segment, version 1, nothing reserved set. */
static void write_(uint32_t stag, uint64_t to, uint32_t len)
{
	segment(DDP_T | DDP_L | DDP_V1, RDMAP_V1 | OP_WRITE, stag, to, len, 0);
}

/* A Send of `text` on queue 0 with MSN `msn` (RFC 5041 figure 5). */
static void send_msg(const char *text, uint32_t msn)
{
	uint8_t u[18 + 64] = { DDP_L | DDP_V1, RDMAP_V1 | OP_SEND };
	size_t n = strlen(text);

	put_be32(u + 6, 0);
	put_be32(u + 10, msn);
	put_be32(u + 14, 0);
	memcpy(u + 18, text, n);
	fpdu(u, 18 + n, 0);
}

/* Whether the target sends anything within `ms` milliseconds. */
static int target_speaks(int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) > 0;
}

/* Reads until the stream ends (15 s at most) and prints its FPDUs. */
static void read_to_end(void)
{
	static uint8_t in[1 << 16];
	size_t have = 0, at = 0;
	const char *end = "closed";
	uint64_t t0 = now_ns();

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t got;

		if (have == sizeof(in)) {
			end = "overflow";
			break;
		}
		if (poll(&p, 1, 500) <= 0) {
			if (now_ns() - t0 > 15000000000ull) {
				end = "timeout";
				break;
			}
			continue;
		}
		got = read(fd, in + have, sizeof(in) - have);
		if (got == 0)
			break;
		if (got < 0) {
			end = errno == ECONNRESET ? "reset" : strerror(errno);
			break;
		}
		have += (size_t)got;
	}
	while (at + 2 <= have) {
		size_t len = (size_t)in[at] << 8 | in[at + 1];
		size_t total = (2 + len + 3) / 4 * 4 + 4;
		const uint8_t *u = in + at + 2;

		if (at + total > have) {
			printf("partial fpdu of %zu bytes\n", have - at);
			break;
		}
		if (len >= 20 && !(u[0] & DDP_T) && (u[1] & 0x1f) == OP_TERMINATE &&
		    get_be32(u + 6) == 2)
			printf("terminate layer %u etype %u ecode %u\n", u[18] >> 4, u[18] & 15,
			       u[19]);
		else
			printf("fpdu ctrl 0x%02x 0x%02x len %zu\n", len ? u[0] : 0,
			       len > 1 ? u[1] : 0, len);
		if (crc) {
			const uint8_t *t = in + at + total - 4;
			uint32_t want = crc32c(in + at, total - 4);

			if ((t[0] | t[1] << 8 | t[2] << 16 | (uint32_t)t[3] << 24) != want)
				printf("crc bad\n");
		}
		at += total;
	}
	printf("%s\n", end);
}

static void scenario(const char *s)
{
	const uint32_t bad_stag = 0x42424200;
	uint64_t to0 = r[0].to;
	uint32_t st0 = r[0].stag;

	if (!strcmp(s, "valid")) {
		write_(st0, to0, 100);
		send_all();
		pause_ms(100);
		write_(st0, to0 + 1000, 2200);
		segment(DDP_T | DDP_V1, RDMAP_V1 | OP_WRITE, st0, to0 + 7000, 500, 0);
		segment(DDP_T | DDP_L | DDP_V1, RDMAP_V1 | OP_WRITE, st0, to0 + 7500, 500, 0);
		write_(st0, to0 + r[0].len - 64, 64);
		write_(bad_stag, 0, 0);
	} else if (!strcmp(s, "badstag")) {
		write_(bad_stag, to0, 64);
	} else if (!strcmp(s, "badkey")) {
		if ((st0 ^ 1) == r[1].stag || (st0 ^ 1) == r[2].stag)
			die("r0's STag with its lowest bit flipped is another region's");
		write_(st0 ^ 1, to0, 64);
	} else if (!strcmp(s, "overrun")) {
		write_(st0, to0 + r[0].len - 63, 64);
	} else if (!strcmp(s, "underrun")) {
		write_(st0, to0 - 1, 64);
	} else if (!strcmp(s, "wrap")) {
		write_(st0, ~0ull - 31, 64);
	} else if (!strcmp(s, "badcrc")) {
		segment(DDP_T | DDP_L | DDP_V1, RDMAP_V1 | OP_WRITE, st0, to0, 100, 1);
	} else if (!strcmp(s, "ddpver2")) {
		segment(DDP_T | DDP_L | 2, RDMAP_V1 | OP_WRITE, st0, to0, 100, 0);
	} else if (!strcmp(s, "ddpver3")) {
		segment(DDP_T | DDP_L | 3, RDMAP_V1 | OP_WRITE, st0, to0, 100, 0);
	} else if (!strcmp(s, "rdmapver")) {
		segment(DDP_T | DDP_L | DDP_V1, OP_WRITE, st0, to0, 100, 0);
	} else if (!strcmp(s, "rsvd")) {
		segment(DDP_T | DDP_L | DDP_RSVD | DDP_V1, RDMAP_V1 | OP_WRITE, st0, to0, 100, 0);
		segment(DDP_T | DDP_L | DDP_V1, RDMAP_V1 | 0x20 | OP_WRITE, st0, to0 + 200, 100, 0);
	} else if (!strcmp(s, "split")) {
		write_(st0, to0 + 2000, 2000);
		send_some(8);
		pause_ms(300);
		send_all();
		write_(st0, to0 + 5000, 1000);
		send_some(2 + 14 + 300);
		pause_ms(300);
		send_all();
		pause_ms(300);
		write_(st0, to0 + 9000, 100);
	} else if (!strcmp(s, "good-bad")) {
		write_(st0, to0, 100);
		write_(bad_stag, to0 + 200, 100);
	} else if (!strcmp(s, "bad-good")) {
		write_(bad_stag, to0 + 200, 100);
		write_(st0, to0, 100);
	} else if (!strcmp(s, "good-badcrc")) {
		write_(st0, to0, 100);
		segment(DDP_T | DDP_L | DDP_V1, RDMAP_V1 | OP_WRITE, st0, to0 + 200, 100, 1);
	} else if (!strcmp(s, "tiny-good-bad")) {
		/* Frames of 24 bytes: the module hands the bad one up whole. */
		write_(st0, to0, 4);
		write_(bad_stag, to0 + 200, 4);
	} else if (!strcmp(s, "tiny-good-badcrc")) {
		write_(st0, to0, 4);
		segment(DDP_T | DDP_L | DDP_V1, RDMAP_V1 | OP_WRITE, st0, to0 + 200, 4, 1);
	} else if (!strcmp(s, "rights")) {
		write_(r[1].stag, r[1].to, 64);
	} else if (!strcmp(s, "otherpd")) {
		write_(r[2].stag, r[2].to, 64);
	} else {
		die("unknown scenario %s", s);
	}
	send_all();
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa;
	uint8_t req[24], rep[20], pd[512];
	static const uint8_t rtr[14] = { DDP_T | DDP_L | DDP_V1, RDMAP_V1 | OP_WRITE };
	unsigned int pd_len, ird, ord;
	int one = 1;

	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc != 5)
		die("usage: xiw_hostile_peer HOST PORT CRC SCENARIO");
	sa = ipv4_addr(argv[1], atoi(argv[2]));
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		die("connect: %s", strerror(errno));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

	/* MPA Request (RFC 5044 figure 10): key, M C R S + reserved, Rev, PD_Length. */
	memcpy(req, "MPA ID Req Frame", 16);
	req[16] = (atoi(argv[3]) ? 0x40 : 0) | 0x10;
	req[17] = 2;
	req[18] = 0;
	req[19] = 4;
	/* RFC 6581 section 9: IRD 4 with P2P; ORD 4 with the zero-length Write. */
	req[20] = 0x80;
	req[21] = 4;
	req[22] = 0x80;
	req[23] = 4;
	if (write(fd, req, sizeof(req)) != (ssize_t)sizeof(req))
		die("sending the Request: %s", strerror(errno));

	read_exact(fd, rep, sizeof(rep), "the MPA Reply");
	if (memcmp(rep, "MPA ID Rep Frame", 16))
		die("not an MPA Reply");
	if (rep[16] & 0x20)
		die("the target rejected the connection");
	if (rep[16] & 0x80)
		die("the target asks for markers");
	if (!(rep[16] & 0x10))
		die("the Reply has no IRD/ORD block");
	crc = !!(rep[16] & 0x40);
	pd_len = (unsigned int)rep[18] << 8 | rep[19];
	if (pd_len < 4 + 48 || pd_len > sizeof(pd))
		die("Reply private data of %u bytes", pd_len);
	read_exact(fd, pd, pd_len, "the MPA Reply");
	ird = (unsigned int)pd[0] << 8 | pd[1];
	ord = (unsigned int)pd[2] << 8 | pd[3];
	printf("reply rev %u crc %d ird 0x%04x ord 0x%04x\n", rep[17], crc, ird, ord);
	if (!(ird & 0x8000) || !(ord & 0x8000))
		die("the target did not agree to peer-to-peer with a Write RTR");
	for (int i = 0; i < 3; i++) {
		const uint8_t *p = pd + 4 + 16 * i;

		r[i].stag = get_be32(p);
		r[i].len = get_be32(p + 4);
		r[i].to = (uint64_t)get_be32(p + 8) << 32 | get_be32(p + 12);
	}
	printf("regions r0 0x%x %u 0x%llx r1 0x%x %u 0x%llx r2 0x%x %u 0x%llx\n", r[0].stag,
	       r[0].len, (unsigned long long)r[0].to, r[1].stag, r[1].len,
	       (unsigned long long)r[1].to, r[2].stag, r[2].len, (unsigned long long)r[2].to);
	if (r[0].len < 10000)
		die("r0 is too small for the scenarios");

	/* The ready-to-receive message: a zero-length RDMA Write, STag 0, TO 0. */
	fpdu(rtr, sizeof(rtr), 0);
	send_all();
	pause_ms(500);

	scenario(argv[4]);
	printf("sent %s\n", argv[4]);
	if (!target_speaks(1500)) {
		send_msg("done", 1);
		send_all();
		printf("sent done\n");
		if (!target_speaks(1500)) {
			printf("open\n");
			close(fd);
			return 0;
		}
	}
	read_to_end();
	close(fd);
	return 0;
}
