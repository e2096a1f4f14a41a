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

const _: () = {
    use core::mem::size_of;
    assert!(size_of::<CmdHdr>() == 8);
    assert!(size_of::<CreateCq>() == 32);
    assert!(size_of::<CreateCqResp>() == 8);
    assert!(size_of::<DestroyCq>() == 16);
    assert!(size_of::<DestroyCqResp>() == 8);
    assert!(size_of::<IoctlHdr>() == 24);
    assert!(size_of::<IoctlAttr>() == 16);
};
