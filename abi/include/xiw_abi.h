/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * xiw shared queue layout: the C twin of abi/src/ring.rs.
 *
 * One ring per mapping: struct xiw_ring_header, then `entries` slots of
 * `stride` bytes. Indices are free-running 32-bit counters; slot = index &
 * (entries - 1). The producer fills a slot, then stores `producer` with
 * release semantics; the consumer loads `producer` with acquire semantics,
 * reads the slot, then stores `consumer` with release semantics.
 *
 * abi/tests/c_header.rs compiles this file and checks every offset, size and
 * constant against the Rust definitions.
 */
#ifndef XIW_ABI_H
#define XIW_ABI_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <stdint.h>
typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef int32_t __s32;
typedef uint64_t __u64;
#endif

/* The device's identity and limits (abi/src/limits.rs). */
#define XIW_KERNEL_DRIVER_ID	0x7869u
#define XIW_UVERBS_ABI_VERSION	1u
#define XIW_VENDOR_ID		0x787769u
#define XIW_VENDOR_PART_ID	1u
#define XIW_MAX_QP		16384u
#define XIW_MAX_QP_WR		16384u
#define XIW_MAX_SGE		16u
#define XIW_MAX_INLINE		256u
#define XIW_MAX_CQE		(1u << 20)
#define XIW_MAX_MR		(1u << 24)
#define XIW_MAX_SRQ		16384u
#define XIW_MAX_PD		65536u
#define XIW_MAX_MSG_SZ		(1u << 31)
#define XIW_MAX_RD_ATOMIC	128u

/*
 * The module's own uverbs methods (driver namespace: ids from 1 << 12, as
 * UVERBS_ID_NS_SHIFT says), called with RDMA_VERBS_IOCTL on the context's
 * command fd and xiw's driver id.
 *
 * CQ_NOTIFY: the provider wrote a completion to an armed CQ; the module
 * signals the CQ's completion channel. One attribute: the CQ's handle.
 *
 * CQ_RING: the CQ's ring is the context's ring at this offset (after
 * XIW_METHOD_RING_ALLOC; again after a resize). The module then may take
 * the ring's arm word itself (compare-and-swap to XIW_CQ_ARM_NONE, as the
 * provider does when it stores the completion the CQ is armed for) and
 * signal the channel from the socket's receive path, when the FPDU at the
 * head of a lent stream (XIW_PLACE_KERNEL) completes a receive of a QP
 * whose receive CQ this is. Attributes: the CQ's handle, the offset.
 */
#define XIW_UVERBS_DRIVER_NS	(1u << 12)

enum xiw_uverbs_cq_methods {
	XIW_METHOD_CQ_NOTIFY = XIW_UVERBS_DRIVER_NS,
	XIW_METHOD_CQ_EVENT,
	XIW_METHOD_CQ_RING,
};

enum xiw_uverbs_cq_notify_attrs {
	XIW_ATTR_CQ_NOTIFY_HANDLE = XIW_UVERBS_DRIVER_NS,
};

enum xiw_uverbs_cq_ring_attrs {
	XIW_ATTR_CQ_RING_HANDLE = XIW_UVERBS_DRIVER_NS,
	XIW_ATTR_CQ_RING_OFFSET,
};

/*
 * QP_EVENT, CQ_EVENT, SRQ_EVENT: the provider found an async event of its
 * object (the QP failed, the CQ overran, the SRQ reached its limit); the
 * module raises it on the kernel's object, so it reaches the context's async
 * event fd. Attributes: the object's handle and the event (enum
 * ib_event_type, which is enum ibv_event_type's numbering).
 */
enum xiw_uverbs_qp_methods {
	XIW_METHOD_QP_EVENT = XIW_UVERBS_DRIVER_NS,
	XIW_METHOD_QP_STREAM,
};

/*
 * QP_STREAM: the provider connected the QP's stream itself (modify_qp with
 * the peer's address; its own MPA exchange): the module watches it from
 * now on as a stream rdma_cm handed over (its events marked in the QP's
 * slot, its Writes placed while lent), and holds the socket until it ends
 * or the QP goes. Attributes: the QP's handle, the socket's descriptor in
 * the calling process, flags (XIW_QP_STREAM_CRC: MPA CRC was agreed). The
 * descriptor XIW_QP_STREAM_NONE: the provider lets go of the stream (it
 * ends it, or connects the QP anew), and so does the module.
 */
enum xiw_uverbs_qp_stream_attrs {
	XIW_ATTR_QP_STREAM_HANDLE = XIW_UVERBS_DRIVER_NS,
	XIW_ATTR_QP_STREAM_FD,
	XIW_ATTR_QP_STREAM_FLAGS,
};

#define XIW_QP_STREAM_CRC	1u
#define XIW_QP_STREAM_NONE	0xffffffffu

enum xiw_uverbs_srq_methods {
	XIW_METHOD_SRQ_EVENT = XIW_UVERBS_DRIVER_NS,
};

enum xiw_uverbs_event_attrs {
	XIW_ATTR_EVENT_HANDLE = XIW_UVERBS_DRIVER_NS,
	XIW_ATTR_EVENT_TYPE,
};

/*
 * The driver data of CREATE_QP: the QP number the provider chose, which the
 * module takes as the kernel's (so rdma_cm and the provider name it alike).
 */
struct xiw_create_qp_req {
	__u32 qpn;
	__u32 reserved;
};

/*
 * The driver data of GET_CONTEXT: an eventfd of the provider's, which the
 * module signals when a connection the connection manager set up waits for
 * the provider (XIW_METHOD_TAKE_STREAM); -1 for none.
 */
struct xiw_alloc_ucontext_req {
	__s32 cm_eventfd;
	__u32 reserved;
};

/*
 * TAKE_STREAM, on the caller's own context: the next connection the
 * connection manager set up for one of its QPs (rdma_connect, rdma_accept),
 * MPA done. Its socket becomes a descriptor of the calling process. The
 * application is told the connection is established on the next call (the
 * provider calls until -EAGAIN, which says none waits), once the provider
 * has made the socket its QP's stream.
 */
enum xiw_uverbs_device_methods {
	XIW_METHOD_TAKE_STREAM = XIW_UVERBS_DRIVER_NS,
	XIW_METHOD_RING_ALLOC,
	XIW_METHOD_RING_FREE,
};

enum xiw_uverbs_take_stream_attrs {
	XIW_ATTR_TAKE_STREAM_RESP = XIW_UVERBS_DRIVER_NS,
};

/*
 * RING_ALLOC, on the caller's own context: zeroed memory of the module's for
 * one of the context's rings (send, receive, SRQ or completion queue, laid
 * out as the ring section below), of LEN bytes (at most
 * XIW_RING_MAX_BYTES); OFFSET says where the provider maps it on the command
 * fd (mmap, MAP_SHARED). RING_FREE gives it back (the memory goes once the
 * provider's mapping is gone); the context's rings go with the context.
 */
enum xiw_uverbs_ring_attrs {
	XIW_ATTR_RING_LEN = XIW_UVERBS_DRIVER_NS,
	XIW_ATTR_RING_OFFSET,
};

#define XIW_RING_MAX_BYTES	(1u << 27)
/* Rings a context holds at most: two per QP, one per CQ and SRQ. */
#define XIW_RINGS_PER_CONTEXT	(4u * XIW_MAX_QP)

/* The ready-to-receive message agreed (RFC 6581). */
#define XIW_RTR_NONE	0u
#define XIW_RTR_SEND	1u
#define XIW_RTR_WRITE	2u
#define XIW_RTR_READ	3u

struct xiw_stream {
	__u32 qpn;
	__s32 fd;
	/* This side's IRD and ORD, and the peer's, as agreed. */
	__u16 ird;
	__u16 ord;
	__u16 peer_ird;
	__u16 peer_ord;
	__u8 initiator;
	__u8 crc;
	__u8 rtr;
	__u8 reserved[5];
};

/*
 * Stream events (kernel mode). The module keeps one events page per context,
 * which the provider maps (GET_CONTEXT's driver response gives its mmap
 * offset and length). Each QP has a slot in it (CREATE_QP's driver response
 * gives its index). The module's callbacks on a QP's socket mark what
 * happened in the slot's `events` (XIW_EV_*, or'ed in), and on a slot's
 * first mark set its bit in the summary bitmap (64-bit words after the
 * header) and `pending`; the provider takes a slot's events by exchanging
 * them with 0, so an empty poll costs no system call. When the provider's
 * progress thread sleeps it sets `armed`, and the module, finding it set,
 * clears it and signals the context's eventfd. A slot whose `hint` is
 * XIW_EV_HINT_APP (the application's own polling took its last events)
 * signals only if its events are still there after the module's
 * `event_delay_us`.
 *
 * A slot's `place` says who reads the stream: the provider
 * (XIW_PLACE_USER) or, handed over by the provider at an FPDU boundary with
 * nothing buffered, the module (XIW_PLACE_KERNEL), which places whole RDMA
 * Writes that pass its checks from the socket and gives the stream back
 * (XIW_PLACE_USER and a mark) at the first FPDU it leaves in the socket.
 * `write_len` and `after_write` (valid with XIW_PLACE_F_AFTER_WRITE) are the
 * Write accounting Immediate Data needs (RFC 7306): the stream's reader owns
 * them.
 *
 * A small FPDU the module does not place, whole in the socket, it may hand up
 * instead of leaving it there: it takes its bytes out of the socket into the
 * slot's `hand` (`hand_len` of them, the next bytes of the stream) and gives
 * the stream back as XIW_PLACE_HANDED, so that the provider needs no read of
 * the socket for it. The module claims the stream (XIW_PLACE_KERNEL to
 * XIW_PLACE_HANDED, by compare-and-swap, so not once the provider took it
 * back) before it takes a byte, having cleared `hand_len` first, and sets
 * XIW_HAND_DONE in it once the bytes are there.
 * XIW_HAND_MORE: the socket may hold more (bytes came after, or were there
 * already).
 *
 * With XIW_PLACE_F_READ in `flags`, the Read Responses of the provider's
 * oldest outstanding Read are lent too: the module places a whole Read
 * Response segment for `read_stag` at exactly `read_to`, no longer than
 * `read_left` (and exactly that long if it is the last), into a region of
 * its table granting local writes, advances `read_to` and `read_left`, and
 * clears the flag with the last segment, marking the stream for the
 * provider to complete the Read.
 */
#define XIW_EVENTS_MAGIC	0x78697745u	/* "xiwE" */
#define XIW_EVENTS_VERSION	4u
#define XIW_EVENTS_SLOTS	XIW_MAX_QP
#define XIW_EVENTS_SUMMARY_OFFSET	64u
#define XIW_EVENTS_SLOTS_OFFSET	(XIW_EVENTS_SUMMARY_OFFSET + XIW_EVENTS_SLOTS / 8)
#define XIW_EVENTS_SLOT_BYTES	128u
#define XIW_EVENTS_BYTES	(XIW_EVENTS_SLOTS_OFFSET + XIW_EVENTS_SLOTS * XIW_EVENTS_SLOT_BYTES)

#define XIW_EV_DATA		(1u << 0)	/* bytes (or the end) to read */
#define XIW_EV_WRITABLE		(1u << 1)	/* room to send again */
#define XIW_EV_CLOSED		(1u << 2)	/* the stream closed or broke */
/*
 * Bits 8 and up count the messages among the marked bytes whose receive
 * CQ's completion channel the module woke already: the provider stores
 * their completions without signalling again.
 */
#define XIW_EV_SIGNALLED_SHIFT	8
#define XIW_EV_SIGNALLED_ONE	(1u << XIW_EV_SIGNALLED_SHIFT)
/* The marks (the bits below the count), taken apart from the count. */
#define XIW_EV_MARKS		(XIW_EV_SIGNALLED_ONE - 1)

#define XIW_EV_HINT_PROGRESS	0u
#define XIW_EV_HINT_APP		1u

struct xiw_events_header {
	__u32 magic;
	__u32 version;
	__u32 slots;
	__u32 cm;	/* a connection waits for XIW_METHOD_TAKE_STREAM */
	__u32 armed;
	__u32 pending;
	__u32 reserved[10];
};

#define XIW_PLACE_USER		0u
#define XIW_PLACE_KERNEL	1u
#define XIW_PLACE_HANDED	2u
#define XIW_PLACE_F_AFTER_WRITE	(1u << 0)
#define XIW_PLACE_F_READ	(1u << 1)
#define XIW_HAND_BYTES		28u
#define XIW_HAND_LEN_MASK	0xffffu
#define XIW_HAND_MORE		(1u << 31)
#define XIW_HAND_DONE		(1u << 30)

struct xiw_events_slot {
	__u32 events;
	__u32 hint;
	__u32 place;
	__u32 flags;
	__u64 write_len;	/* of the Write message whose last segment is due */
	__u64 after_write;	/* of the Write message just before */
	__u32 hand_len;		/* bytes in `hand`, and XIW_HAND_MORE */
	__u8 hand[XIW_HAND_BYTES];
	__u32 read_stag;	/* the lent Read's sink STag */
	__u32 read_reserved;
	__u64 read_to;		/* where its next Read Response segment goes */
	__u64 read_left;	/* its bytes still to come */
	__u64 reserved[5];
};

/*
 * The driver data of REG_MR: the STag the provider gave the region, which
 * the module takes as the kernel's MR's keys, and flags. With
 * XIW_REG_MR_PLACE (a region with local write rights) the module pins the
 * region's pages, within the caller's locked-memory limit, to place RDMA
 * Writes (remote write rights) and Read Responses (the sink of a Read) into
 * it from the socket; a region it cannot pin is registered all the same,
 * and the provider places for it.
 */
#define XIW_REG_MR_PLACE	(1u << 0)

struct xiw_reg_mr_req {
	__u32 stag;
	__u32 flags;
	__u64 iova;	/* what peers name the region's first byte (its TO) */
};

/*
 * MR_INVALIDATE, on an MR of the caller's: the region's STag was
 * invalidated; the module places nothing more into it, and returns once a
 * placement under way is over.
 */
enum xiw_uverbs_mr_methods {
	XIW_METHOD_MR_INVALIDATE = XIW_UVERBS_DRIVER_NS,
};

enum xiw_uverbs_mr_invalidate_attrs {
	XIW_ATTR_MR_INVALIDATE_HANDLE = XIW_UVERBS_DRIVER_NS,
};

/* GET_CONTEXT's driver response: where the events page is. */
struct xiw_alloc_ucontext_resp {
	__u64 events_offset;
	__u32 events_len;
	__u32 reserved;
};

/* CREATE_QP's driver response: the QP's slot in the events page. */
struct xiw_create_qp_resp {
	__u32 events_slot;
	__u32 reserved;
};

/* A completion of a Send that asked for a solicited event (internal). */
#define XIW_CQE_F_SOLICITED	0x80u

#define XIW_RING_MAGIC		0x78697752u	/* "xiwR" */
#define XIW_RING_VERSION	1u

#define XIW_RING_KIND_SQ	1u
#define XIW_RING_KIND_RQ	2u
#define XIW_RING_KIND_SRQ	3u
#define XIW_RING_KIND_CQ	4u

#define XIW_RING_SLOTS_OFFSET	256u

#define XIW_RING_F_NEED_DOORBELL	(1u << 0)
#define XIW_RING_F_ERROR		(1u << 1)

#define XIW_CQ_ARM_NONE		0u
#define XIW_CQ_ARM_NEXT		1u
#define XIW_CQ_ARM_SOLICITED	2u

#define XIW_OP_SEND			0
#define XIW_OP_SEND_INV			1
#define XIW_OP_SEND_IMM			2
#define XIW_OP_WRITE			3
#define XIW_OP_WRITE_IMM		4
#define XIW_OP_READ			5
#define XIW_OP_ATOMIC_CMP_SWP		6
#define XIW_OP_ATOMIC_FETCH_ADD		7
#define XIW_OP_LOCAL_INV		8
#define XIW_OP_ATOMIC_WRITE		9
#define XIW_OP_FLUSH			10
#define XIW_OP_VERIFY			11
#define XIW_OP_ATOMIC_MASKED_CMP_SWP	12
#define XIW_OP_ATOMIC_MASKED_FETCH_ADD	13
#define XIW_OP_ATOMIC_SWAP		14
#define XIW_OP_BIND_MW			15

#define XIW_WQE_SIGNALED	(1u << 0)
#define XIW_WQE_SOLICITED	(1u << 1)
#define XIW_WQE_FENCE		(1u << 2)
#define XIW_WQE_INLINE		(1u << 3)

struct xiw_cache_line_u32 {
	__u32 value;
	__u32 pad[15];
} __attribute__((aligned(64)));

struct xiw_ring_header {
	__u32 magic;
	__u32 version;
	__u32 kind;
	__u32 entries;
	__u32 stride;
	__u32 owner_id;
	__u32 reserved[10];
	struct xiw_cache_line_u32 producer;
	struct xiw_cache_line_u32 consumer;
	__u32 flags;
	__u32 arm;
	__u32 arm_seq;
	__u32 doorbell;
	__u32 reserved2[12];
};

struct xiw_sge {
	__u64 addr;
	__u32 length;
	__u32 lkey;
};

struct xiw_send_wqe {
	__u64 wr_id;
	__u8 opcode;
	__u8 flags;
	__u8 num_sge;
	__u8 op_flags;
	__u32 imm_or_inv;
	__u64 remote_addr;
	__u32 rkey;
	__u32 length;
	__u64 operand0;
	__u64 operand1;
	__u64 mask0;
	__u64 mask1;
};

struct xiw_recv_wqe {
	__u64 wr_id;
	__u32 num_sge;
	__u32 length;
};

struct xiw_cqe {
	__u64 wr_id;
	__u32 byte_len;
	__u32 imm_or_inv;
	__u32 qp_num;
	__u32 vendor_err;
	__u8 opcode;
	__u8 status;
	__u8 wc_flags;
	__u8 reserved[5];
};

_Static_assert(sizeof(struct xiw_ring_header) == XIW_RING_SLOTS_OFFSET, "ring header size");
_Static_assert(sizeof(struct xiw_send_wqe) == 64, "send WQE header size");
_Static_assert(sizeof(struct xiw_recv_wqe) == 16, "receive WQE header size");
_Static_assert(sizeof(struct xiw_sge) == 16, "SGE size");
_Static_assert(sizeof(struct xiw_cqe) == 32, "CQE size");
_Static_assert(sizeof(struct xiw_stream) == 24, "stream size");
_Static_assert(sizeof(struct xiw_events_header) == XIW_EVENTS_SUMMARY_OFFSET, "events header size");
_Static_assert(sizeof(struct xiw_events_slot) == XIW_EVENTS_SLOT_BYTES, "events slot size");
_Static_assert(sizeof(struct xiw_alloc_ucontext_resp) == 16, "ucontext response size");
_Static_assert(sizeof(struct xiw_create_qp_resp) == 8, "create_qp response size");
_Static_assert(sizeof(struct xiw_reg_mr_req) == 16, "reg_mr request size");

#endif /* XIW_ABI_H */
