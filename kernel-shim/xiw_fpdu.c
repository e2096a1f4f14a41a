// SPDX-License-Identifier: GPL-2.0
/*
 * xiw: the FPDUs the module may place itself, and the check of their
 * target (see xiw_fpdu.h).
 */

#ifdef __KERNEL__
#include <linux/errno.h>
#ifdef XIW_CRC32C_IN_CRC32_H
#include <linux/crc32.h>
#else
#include <linux/crc32c.h>
#endif
#else
#include <errno.h>
#endif

#include "xiw_fpdu.h"

/* ULPDU_Length (RFC 5044) and the tagged DDP header (RFC 5041). */
#define FPDU_LEN_FIELD 2
#define FPDU_CRC_FIELD 4
#define DDP_TAGGED_LEN 14
#define DDP_UNTAGGED_LEN 18

/*
 * DDP control: T, L, 4 reserved bits, DV. RDMAP control: RV, a reserved bit
 * and a 5-bit opcode (the commit draft's), RDMA Write being 0.
 */
#define DDP_T 0x80
#define DDP_L 0x40
#define DDP_V1 0x01
#define RDMAP_WRITE_V1 0x40
#define RDMAP_READ_RESPONSE_V1 0x42
#define RDMAP_V1_MASK 0xe0
#define RDMAP_V1 0x40

static u32 be_at(const u8 *p, int n)
{
	u32 v = 0;

	while (n--)
		v = v << 8 | *p++;
	return v;
}

int xiw_fpdu_head(const u8 *hdr, u32 have, struct xiw_fpdu *f)
{
	u32 ulpdu;

	if (have < FPDU_LEN_FIELD)
		return XIW_FPDU_MORE;
	ulpdu = be_at(hdr, 2);
	f->total = (FPDU_LEN_FIELD + ulpdu + 3) / 4 * 4 + FPDU_CRC_FIELD;
	if (ulpdu < DDP_TAGGED_LEN)
		return XIW_FPDU_UP;
	if (have < XIW_FPDU_HEAD)
		return XIW_FPDU_MORE;
	/* Every bit but L is fixed; anything else is judged in user space. */
	if ((hdr[2] & ~DDP_L) != (DDP_T | DDP_V1) ||
	    (hdr[3] != RDMAP_WRITE_V1 && hdr[3] != RDMAP_READ_RESPONSE_V1))
		return XIW_FPDU_UP;
	f->last = !!(hdr[2] & DDP_L);
	f->stag = be_at(hdr + 4, 4);
	f->to = (u64)be_at(hdr + 8, 4) << 32 | be_at(hdr + 12, 4);
	f->data_len = ulpdu - DDP_TAGGED_LEN;
	return hdr[3] == RDMAP_WRITE_V1 ? XIW_FPDU_PLACE : XIW_FPDU_READ;
}

/*
 * The last segment of a message on the untagged queue of Sends (queue 0),
 * DDP and RDMAP version 1, reserved bits clear, whose RDMAP opcode is a
 * Send (with or without Invalidate, with or without Solicited Event) or
 * RFC 7306's Immediate Data (with or without Solicited Event): the
 * messages whose arrival completes a receive.
 */
int xiw_fpdu_event(const u8 *hdr, u32 have)
{
	u32 ulpdu;

	if (have < FPDU_LEN_FIELD + 10)
		return XIW_FPDU_EV_NONE;
	ulpdu = be_at(hdr, 2);
	if (ulpdu < DDP_UNTAGGED_LEN || hdr[2] != (DDP_L | DDP_V1) ||
	    (hdr[3] & RDMAP_V1_MASK) != RDMAP_V1 || be_at(hdr + 8, 4) != 0)
		return XIW_FPDU_EV_NONE;
	switch (hdr[3] & 0x1f) {
	case 0x3:	/* Send */
	case 0x4:	/* Send with Invalidate */
	case 0x8:	/* Immediate Data */
		return XIW_FPDU_EV_RECV;
	case 0x5:	/* Send with Solicited Event */
	case 0x6:	/* Send with Solicited Event and Invalidate */
	case 0x9:	/* Immediate Data with Solicited Event */
		return XIW_FPDU_EV_SOLICITED;
	default:
		return XIW_FPDU_EV_NONE;
	}
}

/*
 * The whole STag, a valid region of the QP's PD, [to, to + len) inside it
 * without wrapping (for len 0, to may be the end), and the rights `need`.
 */
static int xiw_fpdu_reach(const struct xiw_fpdu *f,
			  const struct xiw_fpdu_mr *mr, const void *qp_pd,
			  u32 need, u64 *off)
{
	u64 at;

	if (!mr || !mr->valid || mr->stag != f->stag || mr->pd != qp_pd)
		return -ENOENT;
	if (!need || (mr->access & need) != need)
		return -EACCES;
	if (f->to < mr->iova || f->data_len > ~(u64)0 - f->to)
		return -ERANGE;
	at = f->to - mr->iova;
	if (at > mr->len || f->data_len > mr->len - at)
		return -ERANGE;
	*off = at;
	return 0;
}

/*
 * As the provider's check of a peer's access (and never more lenient): the
 * region reached, and the right to write remotely granted by both the region
 * and the QP.
 */
int xiw_fpdu_check(const struct xiw_fpdu *f, const struct xiw_fpdu_mr *mr,
		   const void *qp_pd, u32 qp_access, u64 *off)
{
	return xiw_fpdu_reach(f, mr, qp_pd, qp_access & XIW_FPDU_REMOTE_WRITE,
			      off);
}

/*
 * As the engine's check of a Read Response (and never more lenient): the
 * segment goes exactly where the lent Read's data has reached and fits what
 * is left of it (all of it, if the last), into a region reached with the
 * right to write locally (the sink is the requester's own memory).
 */
int xiw_fpdu_check_read(const struct xiw_fpdu *f,
			const struct xiw_fpdu_read *rd,
			const struct xiw_fpdu_mr *mr, const void *qp_pd,
			u64 *off)
{
	if (!rd || f->stag != rd->stag || f->to != rd->to ||
	    f->data_len > rd->left || (f->last && f->data_len != rd->left))
		return -ENOENT;
	return xiw_fpdu_reach(f, mr, qp_pd, XIW_FPDU_LOCAL_WRITE, off);
}

/* A segment xiw_fpdu_check_read() accepted was placed; true if the last. */
bool xiw_fpdu_read_placed(struct xiw_fpdu_read *rd, const struct xiw_fpdu *f)
{
	rd->to += f->data_len;
	rd->left -= f->data_len;
	return f->last;
}

#ifdef __KERNEL__
/* The kernel's CRC32c (not inverted), the fastest the machine has. */
u32 xiw_fpdu_crc(u32 crc, const void *p, size_t n)
{
	return ~crc32c(~crc, p, n);
}
#else
/* CRC32c, reflected, four bits at a time. */
static const u32 crc32c_nibble[16] = {
	0x00000000, 0x105ec76f, 0x20bd8ede, 0x30e349b1,
	0x417b1dbc, 0x5125dad3, 0x61c69362, 0x7198540d,
	0x82f63b78, 0x92a8fc17, 0xa24bb5a6, 0xb21572c9,
	0xc38d26c4, 0xd3d3e1ab, 0xe330a81a, 0xf36e6f75,
};

u32 xiw_fpdu_crc(u32 crc, const void *p, size_t n)
{
	const u8 *b = p;

	crc = ~crc;
	while (n--) {
		crc ^= *b++;
		crc = crc >> 4 ^ crc32c_nibble[crc & 15];
		crc = crc >> 4 ^ crc32c_nibble[crc & 15];
	}
	return ~crc;
}
#endif

bool xiw_fpdu_trailer_ok(u32 crc, const u8 *trailer)
{
	return crc == (trailer[0] | trailer[1] << 8 | trailer[2] << 16 |
		       (u32)trailer[3] << 24);
}

bool xiw_fpdu_crc_ok(const u8 *fpdu, u32 total)
{
	if (total < FPDU_CRC_FIELD)
		return false;
	total -= FPDU_CRC_FIELD;
	return xiw_fpdu_trailer_ok(xiw_fpdu_crc(0, fpdu, total), fpdu + total);
}
