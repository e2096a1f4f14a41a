/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * xiwdv.h - direct verbs of the xiw software iWARP RNIC.
 *
 * The operations rdma-core 44's verbs.h cannot express:
 *   - RDMA Flush, RDMA Verify and Atomic Write (draft-talpey-rdma-commit-01),
 *   - the masked and swap forms of the RFC 7306 atomic operations,
 *   - registration of flushable and verifiable memory.
 *
 * Everything else (FetchAdd, CmpSwap, Write with Immediate, Send with
 * Immediate, Atomic Write) goes through the ordinary verbs.
 *
 * The work request builders below extend struct ibv_qp_ex: call them between
 * ibv_wr_start() and ibv_wr_complete() exactly like ibv_wr_rdma_write(), with
 * qpx->wr_id and qpx->wr_flags set first. A builder that is given bad
 * arguments makes the following ibv_wr_complete() fail with EINVAL and post
 * nothing. The QP must have been created by xiw with ibv_create_qp_ex();
 * xiwdv_is_xiw() tells whether a context belongs to xiw.
 *
 * Flag and opcode values are those of rdma-core 45 and later, so code moves
 * to upstream ibv_wr_flush() one to one.
 *
 * Link with `pkg-config --cflags --libs xiwdv`. See xiwdv(3).
 */
#ifndef XIWDV_H
#define XIWDV_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Memory registration ------------------------------------------------ */

/* Access flags for ibv_reg_mr() / xiwdv_reg_mr() (rdma-core 45+ values). */
#ifndef IBV_ACCESS_FLUSH_GLOBAL
#define IBV_ACCESS_FLUSH_GLOBAL (1 << 8)
#endif
#ifndef IBV_ACCESS_FLUSH_PERSISTENT
#define IBV_ACCESS_FLUSH_PERSISTENT (1 << 9)
#endif
#define XIWDV_ACCESS_FLUSH_GLOBAL IBV_ACCESS_FLUSH_GLOBAL
#define XIWDV_ACCESS_FLUSH_PERSISTENT IBV_ACCESS_FLUSH_PERSISTENT

/* Hash algorithms for RDMA Verify, chosen per MR when it is registered. */
enum xiwdv_hash {
	XIWDV_HASH_NONE = 0,   /* not verifiable */
	XIWDV_HASH_CRC32C = 1, /* 4 bytes, big-endian CRC32c */
	XIWDV_HASH_SHA256 = 2, /* 32 bytes */
};

#define XIWDV_MAX_HASH_LEN 32

enum xiwdv_mr_attr_mask {
	XIWDV_MR_ATTR_VERIFY_HASH = 1 << 0,
};

struct xiwdv_mr_attr {
	uint64_t comp_mask;   /* enum xiwdv_mr_attr_mask */
	uint32_t verify_hash; /* enum xiwdv_hash */
	uint32_t reserved;
};

/*
 * ibv_reg_mr() with xiw's attributes. access may hold the ordinary flags and
 * IBV_ACCESS_FLUSH_GLOBAL / IBV_ACCESS_FLUSH_PERSISTENT (which plain
 * ibv_reg_mr() accepts as well). IBV_ACCESS_FLUSH_PERSISTENT needs memory that
 * can be made durable: a shared mapping of a file on a persistent file system
 * (a DAX mapping with MAP_SYNC, or any file whose pages msync() writes back).
 * Anonymous memory and files on tmpfs/ramfs/hugetlbfs are refused.
 *
 * A verifiable MR (attr->verify_hash set) lets the peer ask for the hash of a
 * range, read back from the medium behind the memory.
 *
 * Returns NULL with errno set on failure; xiwdv_last_error() says why.
 */
struct ibv_mr *xiwdv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			    unsigned int access,
			    const struct xiwdv_mr_attr *attr);

/* Why the calling thread's last failed xiwdv or registration call failed
 * (a static or thread-local string; never NULL). */
const char *xiwdv_last_error(void);

/* ---- Device ---------------------------------------------------------------- */

/* Nonzero if ctx is an xiw device context. */
int xiwdv_is_xiw(struct ibv_context *ctx);

enum xiwdv_device_caps {
	XIWDV_CAP_ATOMICS = 1 << 0,        /* RFC 7306 FetchAdd and CmpSwap, masked forms */
	XIWDV_CAP_IMMEDIATE = 1 << 1,      /* RFC 7306 Immediate Data */
	XIWDV_CAP_FLUSH_GLOBAL = 1 << 2,   /* RDMA Flush to global visibility */
	XIWDV_CAP_FLUSH_PERSISTENT = 1 << 3, /* RDMA Flush to persistence */
	XIWDV_CAP_VERIFY = 1 << 4,         /* RDMA Verify */
	XIWDV_CAP_ATOMIC_WRITE = 1 << 5,   /* Atomic Write */
};

struct xiwdv_device_attr {
	uint64_t caps;        /* enum xiwdv_device_caps */
	uint32_t hashes;      /* bit (1 << enum xiwdv_hash) per supported algorithm */
	uint32_t max_hash_len;
	uint64_t reserved[4];
};

/* Fills attr; 0 or an errno value (EOPNOTSUPP if ctx is not xiw). */
int xiwdv_query_device(struct ibv_context *ctx, struct xiwdv_device_attr *attr);

/* ---- Work requests ---------------------------------------------------------- */

/* send_ops_flags for ibv_create_qp_ex(): upstream IBV_QP_EX_WITH_FLUSH. */
#define XIWDV_QP_EX_WITH_FLUSH (1 << 11)
/* xiw-only: RDMA Verify and the masked/swap atomics. */
#define XIWDV_QP_EX_WITH_VERIFY (1ULL << 32)
#define XIWDV_QP_EX_WITH_MASKED_ATOMICS (1ULL << 33)

/* Flush placement types (upstream enum ibv_placement_type); OR them. */
enum xiwdv_placement_type {
	XIWDV_FLUSH_GLOBAL = 1 << 0,
	XIWDV_FLUSH_PERSISTENT = 1 << 1,
};

/* Flush selectivity (upstream enum ibv_selectivity_level). The wire format of
 * draft-talpey-rdma-commit-01 carries a range only: XIWDV_FLUSH_MR is refused. */
enum xiwdv_selectivity_level {
	XIWDV_FLUSH_RANGE = 0,
	XIWDV_FLUSH_MR = 1,
};

/* Work completion opcodes of the new operations (enum ibv_wc_opcode values). */
#define XIWDV_WC_FLUSH 8                  /* upstream IBV_WC_FLUSH */
#define XIWDV_WC_VERIFY IBV_WC_DRIVER1
/* Atomic Write completes as IBV_WC_ATOMIC_WRITE; masked atomics as
 * IBV_WC_FETCH_ADD / IBV_WC_COMP_SWAP, swap as IBV_WC_COMP_SWAP. */

/*
 * RDMA Flush of [remote_addr, remote_addr + len) under rkey: completes once
 * the responder has made every byte of the range durable (type has
 * XIWDV_FLUSH_PERSISTENT) and/or visible to every CPU (XIWDV_FLUSH_GLOBAL).
 * len must fit in 32 bits. No local buffer.
 */
void xiwdv_wr_flush(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr,
		    size_t len, uint8_t type, uint8_t level);

/*
 * RDMA Verify: the responder reads [remote_addr, remote_addr + len) back from
 * its medium and hashes it with the algorithm of the MR behind rkey. Set the
 * local buffer for the returned hash with ibv_wr_set_sge() (at least the hash
 * length; byte_len of the completion is the hash length). With expected
 * (expected_len bytes, at most XIWDV_MAX_HASH_LEN) a mismatch makes the
 * responder send a Terminate: the verify completes with IBV_WC_REM_OP_ERR and
 * the QP goes to the error state. expected may be NULL (expected_len 0).
 */
void xiwdv_wr_verify(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr,
		     uint32_t len, const void *expected, size_t expected_len);

/*
 * RFC 7306 masked FetchAdd: adds add to the 64-bit word at remote_addr
 * (8-byte aligned); a carry does not propagate out of a bit that is set in
 * boundary_mask (so the mask splits the word into independent fields). The
 * original value is written to the buffer set with ibv_wr_set_sge() (8 bytes).
 */
void xiwdv_wr_atomic_masked_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey,
				      uint64_t remote_addr, uint64_t add,
				      uint64_t boundary_mask);

/*
 * RFC 7306 masked CmpSwap: if ((original ^ compare) & compare_mask) == 0 the
 * word becomes (original & ~swap_mask) | (swap & swap_mask). The original
 * value is returned as for xiwdv_wr_atomic_masked_fetch_add().
 */
void xiwdv_wr_atomic_masked_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey,
				    uint64_t remote_addr, uint64_t compare,
				    uint64_t compare_mask, uint64_t swap,
				    uint64_t swap_mask);

/* Unconditional swap (a CmpSwap whose compare mask is zero). */
void xiwdv_wr_atomic_swap(struct ibv_qp_ex *qpx, uint32_t rkey,
			  uint64_t remote_addr, uint64_t swap);

#ifdef __cplusplus
}
#endif

#endif /* XIWDV_H */
