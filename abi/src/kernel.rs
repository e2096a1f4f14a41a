//! How the provider talks to the kernel module (kernel mode): the RDMA
//! core's command interfaces on a context's command fd, as Linux's
//! `rdma/ib_user_verbs.h` and `rdma/rdma_user_ioctl_cmds.h` lay them out,
//! and the module's own methods (`include/xiw_abi.h`).

/// Legacy `write()` commands: a header, then the command.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CmdHdr {
    pub command: u32,
    /// Header and command, in 32-bit words.
    pub in_words: u16,
    /// The response, in 32-bit words.
    pub out_words: u16,
}

/// `IB_USER_VERBS_CMD_ALLOC_PD`.
pub const CMD_ALLOC_PD: u32 = 3;
/// `IB_USER_VERBS_CMD_DEALLOC_PD`.
pub const CMD_DEALLOC_PD: u32 = 4;
/// `IB_USER_VERBS_CMD_CREATE_QP`.
pub const CMD_CREATE_QP: u32 = 24;
/// `IB_USER_VERBS_CMD_MODIFY_QP`.
pub const CMD_MODIFY_QP: u32 = 26;
/// `IB_USER_VERBS_CMD_DESTROY_QP`.
pub const CMD_DESTROY_QP: u32 = 27;
/// `IB_USER_VERBS_CMD_CREATE_SRQ`.
pub const CMD_CREATE_SRQ: u32 = 32;
/// `IB_USER_VERBS_CMD_DESTROY_SRQ`.
pub const CMD_DESTROY_SRQ: u32 = 35;

/// `struct ib_uverbs_alloc_pd`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocPd {
    pub response: u64,
}

/// `struct ib_uverbs_alloc_pd_resp`; `struct ib_uverbs_dealloc_pd` is the
/// same one handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PdHandle {
    pub pd_handle: u32,
}

/// `struct ib_uverbs_create_qp`, then xiw's driver data: the QP number the
/// provider chose (the module takes it as the kernel's QPN, so rdma_cm and
/// the provider name the QP alike).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateQp {
    pub response: u64,
    pub user_handle: u64,
    pub pd_handle: u32,
    pub send_cq_handle: u32,
    pub recv_cq_handle: u32,
    pub srq_handle: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub sq_sig_all: u8,
    pub qp_type: u8,
    pub is_srq: u8,
    pub reserved: u8,
    /// xiw's `struct xiw_create_qp_req`.
    pub req: CreateQpReq,
}

/// `struct xiw_create_qp_req` (`include/xiw_abi.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateQpReq {
    pub qpn: u32,
    pub reserved: u32,
}

/// `struct ib_uverbs_create_qp_resp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateQpResp {
    pub qp_handle: u32,
    pub qpn: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub reserved: u32,
}

/// `struct ib_uverbs_modify_qp`, of which the provider sets only the state:
/// the kernel's QP follows the provider's, for `rdma resource` and the
/// connection manager.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModifyQp {
    /// `dest` and `alt_dest` (`struct ib_uverbs_qp_dest`), unused.
    pub dests: [u8; 64],
    pub qp_handle: u32,
    pub attr_mask: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub qp_state: u8,
    /// `cur_qp_state` to `alt_timeout`, and two reserved bytes, unused.
    pub rest: [u8; 15],
}

/// `IB_QP_STATE`.
pub const QP_STATE: u32 = 1;

/// `struct ib_uverbs_destroy_qp` and `struct ib_uverbs_destroy_srq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DestroyObj {
    pub response: u64,
    pub handle: u32,
    pub reserved: u32,
}

/// `struct ib_uverbs_destroy_qp_resp`, `struct ib_uverbs_destroy_srq_resp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DestroyObjResp {
    pub events_reported: u32,
}

/// `struct ib_uverbs_create_srq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateSrq {
    pub response: u64,
    pub user_handle: u64,
    pub pd_handle: u32,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ib_uverbs_create_srq_resp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateSrqResp {
    pub srq_handle: u32,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srqn: u32,
}

/// `IB_QPT_RC`.
pub const QPT_RC: u8 = 2;

/// `IB_USER_VERBS_CMD_CREATE_CQ`.
pub const CMD_CREATE_CQ: u32 = 18;
/// `IB_USER_VERBS_CMD_DESTROY_CQ`.
pub const CMD_DESTROY_CQ: u32 = 20;

/// `struct ib_uverbs_create_cq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateCq {
    /// Where the kernel writes [`CreateCqResp`].
    pub response: u64,
    /// What completion events report for the CQ: its `ibv_cq` pointer.
    pub user_handle: u64,
    pub cqe: u32,
    pub comp_vector: u32,
    /// The completion channel's fd, or -1.
    pub comp_channel: i32,
    pub reserved: u32,
}

/// `struct ib_uverbs_create_cq_resp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateCqResp {
    pub cq_handle: u32,
    pub cqe: u32,
}

/// `struct ib_uverbs_destroy_cq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DestroyCq {
    pub response: u64,
    pub cq_handle: u32,
    pub reserved: u32,
}

/// `struct ib_uverbs_destroy_cq_resp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DestroyCqResp {
    pub comp_events_reported: u32,
    pub async_events_reported: u32,
}

/// `RDMA_VERBS_IOCTL`: `_IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr)`.
pub const RDMA_VERBS_IOCTL: u64 = (3 << 30) | (24 << 16) | (0x1b << 8) | 1;

/// `struct ib_uverbs_ioctl_hdr`, followed by `num_attrs` [`IoctlAttr`]s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoctlHdr {
    /// Header and attributes, in bytes.
    pub length: u16,
    pub object_id: u16,
    pub method_id: u16,
    pub num_attrs: u16,
    pub reserved1: u64,
    pub driver_id: u32,
    pub reserved2: u32,
}

/// `struct ib_uverbs_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IoctlAttr {
    pub attr_id: u16,
    pub len: u16,
    pub flags: u16,
    pub attr_data: u16,
    /// An object's handle, a value, or a pointer.
    pub data: u64,
}

/// `UVERBS_ATTR_F_MANDATORY`.
pub const ATTR_F_MANDATORY: u16 = 1;
/// `UVERBS_OBJECT_CQ`.
pub const OBJECT_CQ: u16 = 3;

/// The driver namespace of method and attribute ids (`UVERBS_ID_NS_SHIFT`).
pub const DRIVER_NS: u16 = 1 << 12;
/// The module's method on a CQ: the provider wrote a completion to an
/// armed CQ; the module signals its completion channel.
pub const METHOD_CQ_NOTIFY: u16 = DRIVER_NS;
/// Its one attribute: the CQ's handle.
pub const ATTR_CQ_NOTIFY_HANDLE: u16 = DRIVER_NS;
/// The module's method naming a CQ's ring (`ATTR_CQ_RING_OFFSET`, from
/// `METHOD_RING_ALLOC`), after creation and after each resize: the module
/// may then take the ring's arm word itself and signal the completion
/// channel straight from the socket's receive path, for an FPDU at the head
/// of a lent stream that completes a receive of a QP whose receive CQ it is.
pub const METHOD_CQ_RING: u16 = DRIVER_NS + 2;
pub const ATTR_CQ_RING_HANDLE: u16 = DRIVER_NS;
pub const ATTR_CQ_RING_OFFSET: u16 = DRIVER_NS + 1;
/// `UVERBS_OBJECT_QP`, `UVERBS_OBJECT_SRQ`.
pub const OBJECT_QP: u16 = 4;
pub const OBJECT_SRQ: u16 = 5;
/// The module's methods raising an async event the provider found on its
/// QP, CQ or SRQ (on the kernel's object, so it reaches the async event fd).
pub const METHOD_QP_EVENT: u16 = DRIVER_NS;
pub const METHOD_CQ_EVENT: u16 = DRIVER_NS + 1;
pub const METHOD_SRQ_EVENT: u16 = DRIVER_NS;
/// The module's method on a QP whose stream the provider connected itself
/// (modify_qp, its own MPA exchange): the module watches that socket from
/// then on as one rdma_cm handed over (its events marked in the QP's slot,
/// its Writes placed while lent) and holds it until it ends or the QP goes.
pub const METHOD_QP_STREAM: u16 = DRIVER_NS + 1;
pub const ATTR_QP_STREAM_HANDLE: u16 = DRIVER_NS;
/// The socket's descriptor in the calling process, or `QP_STREAM_NONE`.
pub const ATTR_QP_STREAM_FD: u16 = DRIVER_NS + 1;
/// `QP_STREAM_CRC` if MPA CRC was agreed.
pub const ATTR_QP_STREAM_FLAGS: u16 = DRIVER_NS + 2;
pub const QP_STREAM_CRC: u32 = 1;
/// `ATTR_QP_STREAM_FD`: the provider lets go of the QP's stream.
pub const QP_STREAM_NONE: u32 = u32::MAX;
/// `UVERBS_OBJECT_DEVICE`: methods on the caller's own context.
pub const OBJECT_DEVICE: u16 = 0;
/// The next connection rdma_cm set up for one of the context's QPs, MPA done
/// (`struct xiw_stream` out); EAGAIN if none waits.
pub const METHOD_TAKE_STREAM: u16 = DRIVER_NS;
pub const ATTR_TAKE_STREAM_RESP: u16 = DRIVER_NS;
/// Memory of the module's for one ring of the context (`ATTR_RING_LEN`
/// bytes in, `ATTR_RING_OFFSET` out: where to map it on the command fd).
pub const METHOD_RING_ALLOC: u16 = DRIVER_NS + 1;
/// Gives a ring back (`ATTR_RING_OFFSET` in).
pub const METHOD_RING_FREE: u16 = DRIVER_NS + 2;
pub const ATTR_RING_LEN: u16 = DRIVER_NS;
pub const ATTR_RING_OFFSET: u16 = DRIVER_NS + 1;
/// The largest ring the module makes.
pub const RING_MAX_BYTES: u64 = 1 << 27;
/// The rings a context holds at most.
pub const RINGS_PER_CONTEXT: u32 = 4 * crate::limits::MAX_QP;

// Every ring the provider makes fits: the largest CQ, and the largest send
// queue (the widest stride: every SGE, or the inline data).
const _: () = {
    use crate::ring::{ring_bytes, send_stride, Cqe};
    let cq_entries = (crate::limits::MAX_CQE + 1).next_power_of_two();
    assert!(ring_bytes(cq_entries, size_of::<Cqe>() as u32) as u64 <= RING_MAX_BYTES);
    let sq = send_stride(crate::limits::MAX_SGE, crate::limits::MAX_INLINE);
    assert!(ring_bytes(crate::limits::MAX_QP_WR, sq) as u64 <= RING_MAX_BYTES);
};

/// `struct xiw_stream`: a connection the module hands over.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Stream {
    pub qpn: u32,
    /// The socket, now a descriptor of this process.
    pub fd: i32,
    /// This side's IRD and ORD, and the peer's, as agreed.
    pub ird: u16,
    pub ord: u16,
    pub peer_ird: u16,
    pub peer_ord: u16,
    pub initiator: u8,
    pub crc: u8,
    /// `RTR_*`.
    pub rtr: u8,
    pub reserved: [u8; 5],
}

pub const RTR_NONE: u8 = 0;
pub const RTR_SEND: u8 = 1;
pub const RTR_WRITE: u8 = 2;
pub const RTR_READ: u8 = 3;

/// `struct xiw_alloc_ucontext_req`: GET_CONTEXT's driver data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocUcontextReq {
    /// The eventfd the module signals when a connection waits (-1: none).
    pub cm_eventfd: i32,
    pub reserved: u32,
}

/// `struct xiw_alloc_ucontext_resp`: GET_CONTEXT's driver response, where
/// the context's events page is (see [`crate::events`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AllocUcontextResp {
    /// The mmap offset on the command fd (0 with `events_len` 0: none).
    pub events_offset: u64,
    pub events_len: u32,
    pub reserved: u32,
}

/// `IB_USER_VERBS_CMD_REG_MR`.
pub const CMD_REG_MR: u32 = 9;
/// `IB_USER_VERBS_CMD_DEREG_MR`.
pub const CMD_DEREG_MR: u32 = 13;

/// `struct ib_uverbs_reg_mr`, then xiw's driver data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegMr {
    pub response: u64,
    pub start: u64,
    pub length: u64,
    pub hca_va: u64,
    pub pd_handle: u32,
    pub access_flags: u32,
    /// xiw's `struct xiw_reg_mr_req`.
    pub req: RegMrReq,
}

/// `struct xiw_reg_mr_req` (`include/xiw_abi.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegMrReq {
    pub stag: u32,
    /// `REG_MR_*`.
    pub flags: u32,
    /// The address peers name the region's first byte by (its TO base;
    /// the kernel's own object takes the virtual address).
    pub iova: u64,
}

/// [`RegMrReq::flags`]: pin the region (one with local write rights) so
/// that the module places RDMA Writes and Read Responses into it from the
/// socket (a region it cannot pin is registered all the same).
pub const REG_MR_PLACE: u32 = 1 << 0;
/// `UVERBS_OBJECT_MR`.
pub const OBJECT_MR: u16 = 7;
/// The module's method on an MR: its STag was invalidated; returns once
/// the module places nothing more into it.
pub const METHOD_MR_INVALIDATE: u16 = DRIVER_NS;
pub const ATTR_MR_INVALIDATE_HANDLE: u16 = DRIVER_NS;

/// `struct ib_uverbs_reg_mr_resp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegMrResp {
    pub mr_handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ib_uverbs_dereg_mr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DeregMr {
    pub mr_handle: u32,
}

/// `struct xiw_create_qp_resp`: CREATE_QP's driver response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CreateQpDrvResp {
    /// The QP's slot in the events page.
    pub events_slot: u32,
    pub reserved: u32,
}

/// Their attributes: the object's handle, and the event (`ibv_event_type`).
pub const ATTR_EVENT_HANDLE: u16 = DRIVER_NS;
pub const ATTR_EVENT_TYPE: u16 = DRIVER_NS + 1;

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<CmdHdr>() == 8);
    assert!(size_of::<CreateCq>() == 32);
    assert!(size_of::<CreateCqResp>() == 8);
    assert!(size_of::<DestroyCq>() == 16);
    assert!(size_of::<DestroyCqResp>() == 8);
    assert!(size_of::<IoctlHdr>() == 24);
    assert!(size_of::<CreateQp>() == 64);
    assert!(size_of::<ModifyQp>() == 112);
    assert!(size_of::<Stream>() == 24);
    assert!(size_of::<AllocUcontextReq>() == 8);
    assert!(size_of::<AllocUcontextResp>() == 16);
    assert!(size_of::<CreateQpDrvResp>() == 8);
    assert!(size_of::<RegMr>() == 56);
    assert!(size_of::<RegMrResp>() == 12);
    assert!(size_of::<CreateQpResp>() == 32);
    assert!(size_of::<CreateSrq>() == 32);
    assert!(size_of::<CreateSrqResp>() == 16);
    assert!(size_of::<IoctlAttr>() == 16);
};
