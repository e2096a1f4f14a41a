/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xiw: which FPDUs the module may place itself. An FPDU (RFC 5044, no
 * markers) is a 2-byte ULPDU_Length, the ULPDU, 0 to 3 pad bytes that bring
 * length field, ULPDU and pad to a multiple of 4, and a 4-byte CRC field,
 * present even when no CRC was negotiated (then it is not checked). Its
 * first 16 bytes tell whether it is a tagged RDMA Write or RDMA Read
 * Response of DDP and RDMAP version 1 with every reserved bit clear (RFC 5041
 * section 4.3, RFC 5040 section 4.1): only such a segment is placed here;
 * anything else is left, with everything after it, for the protocol engine
 * in user space.
 *
 * The parser keeps no state, and some of the engine's decisions depend on
 * its state: the caller places only on a stream the engine has in its steady
 * state (past the peer's ready-to-receive message of RFC 6581, no Immediate
 * Data waiting for its Send), and tells the engine of every Write it placed
 * (the Immediate Data that may follow a Write reports the Write's length).
 * A Read Response answers the oldest Read the engine sent: the caller places
 * only those of the Read the engine lent it (struct xiw_fpdu_read), and
 * gives back what is left of it.
 *
 * Builds in the kernel and, without __KERNEL__, in user space (the fuzz
 * target that checks it against the engine).
 */
#ifndef XIW_FPDU_H
#define XIW_FPDU_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <stdbool.h>
#include <stddef.h>
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#endif

/* The MPA length field and the tagged DDP header, RDMAP control included. */
#define XIW_FPDU_HEAD 16

/* The IB_ACCESS_LOCAL_WRITE and IB_ACCESS_REMOTE_WRITE rights. */
#define XIW_FPDU_LOCAL_WRITE 1
#define XIW_FPDU_REMOTE_WRITE 2

/* A tagged RDMA Write or Read Response segment, as xiw_fpdu_head() found it. */
struct xiw_fpdu {
	u32 total;	/* the whole FPDU: 2 + ULPDU + pad + 4 */
	u32 stag;
	u64 to;
	u32 data_len;	/* payload bytes, from offset XIW_FPDU_HEAD */
	bool last;	/* the L bit: the last segment of the Write */
};

enum {
	XIW_FPDU_MORE,	/* too few bytes to tell */
	XIW_FPDU_PLACE,	/* a tagged RDMA Write: check it, place it */
	XIW_FPDU_UP,	/* anything else: leave it for user space */
	XIW_FPDU_READ,	/* an RDMA Read Response: check it against the Read */
};

/*
 * The Read whose Read Responses the engine lent: a segment goes to `stag`
 * at exactly `to`, of at most `left` bytes, and of exactly `left` if it is
 * the last.
 */
struct xiw_fpdu_read {
	u32 stag;
	u64 to;
	u64 left;
};

/*
 * A registered region the module can reach. Only regions go in: a memory
 * window (a type 2 one is for a single QP) is left for user space.
 */
struct xiw_fpdu_mr {
	u32 stag;	/* index and key */
	const void *pd;
	u64 iova;
	u64 len;
	u32 access;	/* IB_ACCESS_* */
	bool valid;
};

/*
 * What an FPDU the module does not place will complete once user space has
 * processed it, for the completion channel (xiw_fpdu_event()): nothing it
 * can tell, a receive, or a receive whose message asked for a solicited
 * event. A hint only: it decides whether a completion channel is woken
 * early, never what is written or completed.
 */
enum {
	XIW_FPDU_EV_NONE,
	XIW_FPDU_EV_RECV,
	XIW_FPDU_EV_SOLICITED,
};

int xiw_fpdu_head(const u8 *hdr, u32 have, struct xiw_fpdu *f);
int xiw_fpdu_event(const u8 *hdr, u32 have);
int xiw_fpdu_check(const struct xiw_fpdu *f, const struct xiw_fpdu_mr *mr,
		   const void *qp_pd, u32 qp_access, u64 *off);
int xiw_fpdu_check_read(const struct xiw_fpdu *f,
			const struct xiw_fpdu_read *rd,
			const struct xiw_fpdu_mr *mr, const void *qp_pd,
			u64 *off);
bool xiw_fpdu_read_placed(struct xiw_fpdu_read *rd, const struct xiw_fpdu *f);

/*
 * CRC32c (Castagnoli) as MPA uses it: the CRC of the bytes a finished value
 * @crc covers followed by @p (from 0: the CRC of @p alone). An FPDU is right
 * when the CRC of all but its last 4 bytes, in little-endian byte order,
 * is those 4 bytes.
 */
u32 xiw_fpdu_crc(u32 crc, const void *p, size_t n);
bool xiw_fpdu_trailer_ok(u32 crc, const u8 *trailer);
bool xiw_fpdu_crc_ok(const u8 *fpdu, u32 total);

#endif
