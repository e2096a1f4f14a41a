//! The private provider ABI of rdma-core, as rdma-core 44 (Debian 12), 56
//! (Debian 13) and 65 (Debian unstable) lay it out.
//!
//! `infiniband/driver.h` is internal to rdma-core and not installed, so these
//! structures are mirrored by hand from rdma-core v44.0; what later releases
//! changed follows from the release number ([`Layout`]). Sizes and offsets
//! are asserted at compile time; a mismatch breaks the build, not a program.
//! What differs between the releases served:
//! - rdma-core 45 appended `wr_flush` to `ibv_qp_ex`, which moves the fields
//!   of `verbs_qp` behind it; `verbs_qp` leaves room for both.
//! - rdma-core 65 (private ABI 65) added six entries at the front of
//!   `verbs_context` (its `ibv_context` stays last) and 17 to
//!   `verbs_context_ops`, which stays in alphabetical order; the helpers
//!   carry the symbol version `IBVERBS_PRIVATE_65`.

#![allow(non_camel_case_types)]

use crate::verbs::*;
use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};

/// An rdma-core release whose private ABI this file mirrors; what differs
/// between them follows from the release number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The release series (`44` for 44.0) ...
    pub major: u32,
    /// ... and the releases of it that were checked (`None`: every one).
    pub minor: Option<u32>,
}

/// The rdma-core releases this provider serves: 44.0 (Debian 12), 56.x
/// (Debian 13; 56.1 to 56.4 have the same driver.h and verbs.h), both of
/// private ABI 34, and 65.0 (Debian unstable), private ABI 65. Releases in
/// between (57 to 64) moved the ABI in other ways and are not accepted.
pub const LAYOUTS: &[Layout] = &[
    Layout {
        major: 44,
        minor: Some(0),
    },
    Layout {
        major: 56,
        minor: None,
    },
    Layout {
        major: 65,
        minor: Some(0),
    },
];

/// The bytes rdma-core 65 puts in `verbs_context` in front of rdma-core 44's
/// fields: `free_buf`, `alloc_buf`, `dm_export_dmabuf_fd`, `reg_mr_ex`,
/// `dealloc_dmah`, `alloc_dmah`.
pub const CONTEXT_FRONT_65: usize = 6 * size_of::<usize>();

/// Room for the entries any served release has in front of rdma-core 44's
/// `verbs_context` (a provider context starts with it, see
/// [`Layout::context_front`]).
pub type ContextFront = [usize; CONTEXT_FRONT_65 / size_of::<usize>()];

impl Layout {
    /// The private ABI number: the provider file name
    /// (`libxiw-rdmavN.so`), `verbs_register_driver_N` and the symbol
    /// version `IBVERBS_PRIVATE_N` of the helpers.
    pub const fn private_abi(&self) -> u32 {
        if self.major >= 65 {
            65
        } else {
            34
        }
    }

    /// `ibv_qp_ex` ends with `wr_flush` (rdma-core 45 and later).
    pub const fn qp_ex_flush(&self) -> bool {
        self.major >= 45
    }

    /// Offset of `verbs_qp.comp_mask`: right after `ibv_qp_ex`.
    pub const fn qp_comp_mask(&self) -> usize {
        size_of::<ibv_qp_ex>() + if self.qp_ex_flush() { 8 } else { 0 }
    }

    /// libibverbs exports `ibv_wr_opcode_str` (rdma-core 49 and later): a
    /// probe that confirms the release a file name claims.
    pub const fn has_wr_opcode_str(&self) -> bool {
        self.major >= 49
    }

    /// How many bytes this release's `verbs_context` has in front of the
    /// fields of rdma-core 44's: a provider context that starts with a
    /// [`ContextFront`] and then rdma-core 44's `verbs_context` hands this
    /// release the context `ContextFront` bytes minus this into it, so that
    /// `ibv_context` (last in every release) is where it expects.
    pub const fn context_front(&self) -> usize {
        if self.major >= 65 {
            CONTEXT_FRONT_65
        } else {
            0
        }
    }

    /// `ops` (in rdma-core 44's order) as this release's `verbs_context_ops`:
    /// entries it added are NULL (libibverbs then answers EOPNOTSUPP). The
    /// table is longer than the release reads where it has fewer entries.
    pub fn ops_table(&self, ops: &verbs_context_ops) -> [Op; OPS_MAX] {
        const { assert!(size_of::<verbs_context_ops>() == OPS_44.len() * size_of::<Op>()) };
        // SAFETY: verbs_context_ops is repr(C), OPS_44.len() entries of Op.
        let old: [Op; OPS_44.len()] = unsafe { core::mem::transmute_copy(ops) };
        let mut out = [None; OPS_MAX];
        let added: &[&str] = if self.major >= 65 { OPS_ADDED_65 } else { &[] };
        // Both lists are in alphabetical order, as the release's struct is.
        let (mut i, mut j) = (0, 0);
        for slot in out.iter_mut().take(OPS_44.len() + added.len()) {
            if j < added.len() && (i == OPS_44.len() || added[j] < OPS_44[i]) {
                j += 1;
            } else {
                *slot = old[i];
                i += 1;
            }
        }
        out
    }

    /// The layout of release `major.minor`, if it is one of [`LAYOUTS`].
    pub fn of(major: u32, minor: u32) -> Option<&'static Layout> {
        LAYOUTS
            .iter()
            .find(|l| l.major == major && l.minor.is_none_or(|m| m == minor))
    }

    /// The releases served, for messages: "44.0, 56.x, 65.0".
    pub fn known() -> String {
        LAYOUTS
            .iter()
            .map(|l| match l.minor {
                Some(m) => format!("{}.{m}", l.major),
                None => format!("{}.x", l.major),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Fills in the part of a `verbs_qp` after the `ibv_qp_ex` of rdma-core
    /// 44: `wr_flush` where this release has it, and `comp_mask`.
    pub fn set_qp_tail(&self, q: &mut verbs_qp, comp_mask: u32, wr_flush: Option<WrFlush>) {
        let tail = &mut q.tail;
        if self.qp_ex_flush() {
            let f = wr_flush.map_or(0, |f| f as usize);
            tail[..size_of::<usize>()].copy_from_slice(&f.to_ne_bytes());
        }
        let at = self.qp_comp_mask() - size_of::<ibv_qp_ex>();
        tail[at..at + 4].copy_from_slice(&comp_mask.to_ne_bytes());
    }

    /// `verbs_qp.comp_mask` as this release places it.
    #[cfg(test)]
    fn qp_comp_mask_of(&self, q: &verbs_qp) -> u32 {
        let at = self.qp_comp_mask() - size_of::<ibv_qp_ex>();
        u32::from_ne_bytes(q.tail[at..at + 4].try_into().expect("4 bytes"))
    }
}

/// The entries of rdma-core 44's `verbs_context_ops` (also 56's), in order.
pub const OPS_44: [&str; 76] = [
    "advise_mr",
    "alloc_dm",
    "alloc_mw",
    "alloc_null_mr",
    "alloc_parent_domain",
    "alloc_pd",
    "alloc_td",
    "async_event",
    "attach_counters_point_flow",
    "attach_mcast",
    "bind_mw",
    "close_xrcd",
    "cq_event",
    "create_ah",
    "create_counters",
    "create_cq",
    "create_cq_ex",
    "create_flow",
    "create_flow_action_esp",
    "create_qp",
    "create_qp_ex",
    "create_rwq_ind_table",
    "create_srq",
    "create_srq_ex",
    "create_wq",
    "dealloc_mw",
    "dealloc_pd",
    "dealloc_td",
    "dereg_mr",
    "destroy_ah",
    "destroy_counters",
    "destroy_cq",
    "destroy_flow",
    "destroy_flow_action",
    "destroy_qp",
    "destroy_rwq_ind_table",
    "destroy_srq",
    "destroy_wq",
    "detach_mcast",
    "free_context",
    "free_dm",
    "get_srq_num",
    "import_dm",
    "import_mr",
    "import_pd",
    "modify_cq",
    "modify_flow_action_esp",
    "modify_qp",
    "modify_qp_rate_limit",
    "modify_srq",
    "modify_wq",
    "open_qp",
    "open_xrcd",
    "poll_cq",
    "post_recv",
    "post_send",
    "post_srq_ops",
    "post_srq_recv",
    "query_device_ex",
    "query_ece",
    "query_port",
    "query_qp",
    "query_qp_data_in_order",
    "query_rt_values",
    "query_srq",
    "read_counters",
    "reg_dm_mr",
    "reg_dmabuf_mr",
    "reg_mr",
    "req_notify_cq",
    "rereg_mr",
    "resize_cq",
    "set_ece",
    "unimport_dm",
    "unimport_mr",
    "unimport_pd",
];

/// The entries rdma-core 65 added to `verbs_context_ops`, in order.
pub const OPS_ADDED_65: &[&str] = &[
    "alloc_buf",
    "alloc_dmah",
    "create_comp_cntr",
    "dealloc_dmah",
    "destroy_comp_cntr",
    "dm_export_dmabuf_fd",
    "free_buf",
    "inc_comp_cntr",
    "inc_err_comp_cntr",
    "qp_attach_comp_cntr",
    "query_comp_cntr_caps",
    "query_port_speed",
    "read_comp_cntr",
    "read_err_comp_cntr",
    "reg_mr_ex",
    "set_comp_cntr",
    "set_err_comp_cntr",
];

/// The most entries a served release's `verbs_context_ops` has (65's 93).
pub const OPS_MAX: usize = 93;

/// `ibv_qp_ex.wr_flush` (rdma-core 45 and later).
pub type WrFlush = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8);

pub const VERBS_MATCH_SENTINEL: u8 = 0;
pub const VERBS_MATCH_PCI: u8 = 1;
pub const VERBS_MATCH_MODALIAS: u8 = 2;
pub const VERBS_MATCH_DRIVER_ID: u8 = 3;

pub const VERBS_QP_XRCD: u32 = 1 << 0;
pub const VERBS_QP_EX: u32 = 1 << 1;

pub const VERBS_LOG_LEVEL_NONE: u32 = 0;
pub const VERBS_LOG_ERR: u32 = 1;
pub const VERBS_LOG_WARN: u32 = 2;
pub const VERBS_LOG_INFO: u32 = 3;
pub const VERBS_LOG_DEBUG: u32 = 4;

/// `enum ibv_mr_type` (driver.h).
pub const IBV_MR_TYPE_MR: u32 = 0;
pub const IBV_MR_TYPE_NULL_MR: u32 = 1;
pub const IBV_MR_TYPE_IMPORTED_MR: u32 = 2;
pub const IBV_MR_TYPE_DMABUF_MR: u32 = 3;

pub const IBV_SYSFS_NAME_MAX: usize = 64;
pub const IBV_SYSFS_PATH_MAX: usize = 256;

#[repr(C)]
#[derive(Clone, Copy)]
pub union verbs_match_ent_u {
    pub modalias: *const c_char,
    pub driver_id: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct verbs_match_ent {
    pub driver_data: *mut c_void,
    pub u: verbs_match_ent_u,
    pub vendor: u16,
    pub device: u16,
    pub kind: u8,
}
// SAFETY: match tables are immutable statics holding pointers to static strings.
unsafe impl Sync for verbs_match_ent {}

#[repr(C)]
pub struct list_node {
    pub next: *mut list_node,
    pub prev: *mut list_node,
}

#[repr(C)]
pub struct verbs_sysfs_dev {
    pub entry: list_node,
    pub provider_data: *mut c_void,
    pub match_: *const verbs_match_ent,
    pub flags: c_uint,
    pub sysfs_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub sysfs_cdev: libc::dev_t,
    pub ibdev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub modalias: [c_char; 512],
    pub node_guid: u64,
    pub driver_id: u32,
    pub node_type: ibv_node_type,
    pub ibdev_idx: c_int,
    pub num_ports: u32,
    pub abi_ver: u32,
    pub time_created: libc::timespec,
}

#[repr(C)]
pub struct verbs_device_ops {
    pub name: *const c_char,
    pub match_min_abi_version: u32,
    pub match_max_abi_version: u32,
    pub match_table: *const verbs_match_ent,
    pub static_providers: *const *const verbs_device_ops,
    pub match_device: Option<unsafe extern "C" fn(*mut verbs_sysfs_dev) -> bool>,
    pub alloc_context:
        Option<unsafe extern "C" fn(*mut ibv_device, c_int, *mut c_void) -> *mut verbs_context>,
    pub import_context: Option<unsafe extern "C" fn(*mut ibv_device, c_int) -> *mut verbs_context>,
    pub alloc_device: Option<unsafe extern "C" fn(*mut verbs_sysfs_dev) -> *mut verbs_device>,
    pub uninit_device: Option<unsafe extern "C" fn(*mut verbs_device)>,
}
// SAFETY: the ops table is an immutable static.
unsafe impl Sync for verbs_device_ops {}

#[repr(C)]
pub struct verbs_device {
    pub device: ibv_device,
    pub ops: *const verbs_device_ops,
    pub refcount: c_int,
    pub entry: list_node,
    pub sysfs: *mut verbs_sysfs_dev,
    pub core_support: u64,
}

#[repr(C)]
pub struct verbs_mr {
    pub ibv_mr: ibv_mr,
    pub mr_type: u32,
    pub access: c_int,
}

#[repr(C)]
pub union verbs_qp_u {
    pub qp: core::mem::ManuallyDrop<ibv_qp>,
    pub qp_ex: core::mem::ManuallyDrop<ibv_qp_ex>,
}

/// `struct verbs_qp`: the `ibv_qp_ex` of rdma-core 44, then room for what
/// follows it in any release of [`LAYOUTS`] (`wr_flush`, `comp_mask`,
/// `xrcd`), written through [`Layout::set_qp_tail`].
#[repr(C)]
pub struct verbs_qp {
    pub u: verbs_qp_u,
    pub tail: [u8; 32],
}

#[repr(C)]
pub union verbs_cq {
    pub cq: core::mem::ManuallyDrop<ibv_cq>,
    pub cq_ex: core::mem::ManuallyDrop<ibv_cq_ex>,
}

#[repr(C)]
pub struct verbs_xrcd {
    pub xrcd: ibv_xrcd,
    pub comp_mask: u32,
    pub handle: u32,
}

#[repr(C)]
pub struct verbs_srq {
    pub srq: ibv_srq,
    pub srq_type: ibv_srq_type,
    pub xrcd: *mut verbs_xrcd,
    pub cq: *mut ibv_cq,
    pub srq_num: u32,
}

/// An entry of `verbs_context_ops` xiw leaves NULL (or any entry, untyped).
pub type Op = Option<unsafe extern "C" fn()>;

/// `struct verbs_context_ops`: 76 entries in rdma-core 44's (alphabetical) order.
/// Entries xiw implements are typed; the rest are left NULL, which libibverbs
/// answers with EOPNOTSUPP, and are declared as opaque pointers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct verbs_context_ops {
    pub advise_mr: Option<
        unsafe extern "C" fn(
            *mut ibv_pd,
            ib_uverbs_advise_mr_advice,
            u32,
            *mut ibv_sge,
            u32,
        ) -> c_int,
    >,
    pub alloc_dm:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_alloc_dm_attr) -> *mut ibv_dm>,
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, ibv_mw_type) -> *mut ibv_mw>,
    pub alloc_null_mr: Op,
    pub alloc_parent_domain: Option<
        unsafe extern "C" fn(*mut ibv_context, *mut ibv_parent_domain_init_attr) -> *mut ibv_pd,
    >,
    pub alloc_pd: Option<unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd>,
    pub alloc_td:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_td_init_attr) -> *mut ibv_td>,
    pub async_event: Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event)>,
    pub attach_counters_point_flow: Op,
    pub attach_mcast: Op,
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int>,
    pub close_xrcd: Op,
    pub cq_event: Op,
    pub create_ah: Op,
    pub create_counters: Op,
    pub create_cq: Option<
        unsafe extern "C" fn(*mut ibv_context, c_int, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
    >,
    pub create_cq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex>,
    pub create_flow: Op,
    pub create_flow_action_esp: Op,
    pub create_qp: Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp>,
    pub create_qp_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp>,
    pub create_rwq_ind_table: Op,
    pub create_srq:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq>,
    pub create_srq_ex:
        Option<unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq>,
    pub create_wq: Op,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    pub dealloc_pd: Option<unsafe extern "C" fn(*mut ibv_pd) -> c_int>,
    pub dealloc_td: Option<unsafe extern "C" fn(*mut ibv_td) -> c_int>,
    pub dereg_mr: Option<unsafe extern "C" fn(*mut verbs_mr) -> c_int>,
    pub destroy_ah: Op,
    pub destroy_counters: Op,
    pub destroy_cq: Option<unsafe extern "C" fn(*mut ibv_cq) -> c_int>,
    pub destroy_flow: Op,
    pub destroy_flow_action: Op,
    pub destroy_qp: Option<unsafe extern "C" fn(*mut ibv_qp) -> c_int>,
    pub destroy_rwq_ind_table: Op,
    pub destroy_srq: Option<unsafe extern "C" fn(*mut ibv_srq) -> c_int>,
    pub destroy_wq: Op,
    pub detach_mcast: Op,
    pub free_context: Option<unsafe extern "C" fn(*mut ibv_context)>,
    pub free_dm: Option<unsafe extern "C" fn(*mut ibv_dm) -> c_int>,
    pub get_srq_num: Op,
    pub import_dm: Op,
    pub import_mr: Op,
    pub import_pd: Op,
    pub modify_cq: Op,
    pub modify_flow_action_esp: Op,
    pub modify_qp: Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int>,
    pub modify_qp_rate_limit: Op,
    pub modify_srq: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int>,
    pub modify_wq: Op,
    pub open_qp: Op,
    pub open_xrcd: Op,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_srq_ops: Op,
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            *mut ibv_context,
            *const ibv_query_device_ex_input,
            *mut ibv_device_attr_ex,
            usize,
        ) -> c_int,
    >,
    pub query_ece: Op,
    pub query_port: Option<unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int>,
    pub query_qp: Option<
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int,
    >,
    pub query_qp_data_in_order: Op,
    pub query_rt_values: Op,
    pub query_srq: Option<unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int>,
    pub read_counters: Op,
    pub reg_dm_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut ibv_dm, u64, usize, u32) -> *mut ibv_mr>,
    pub reg_dmabuf_mr: Op,
    pub reg_mr:
        Option<unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub rereg_mr: Option<
        unsafe extern "C" fn(*mut verbs_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int,
    >,
    pub resize_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub set_ece: Op,
    pub unimport_dm: Op,
    pub unimport_mr: Op,
    pub unimport_pd: Op,
}

impl verbs_context_ops {
    /// A table with every entry NULL.
    pub const EMPTY: Self = {
        // SAFETY: every field is an Option of a function pointer; all-zero is all None.
        unsafe { core::mem::zeroed() }
    };
}

// The provider calls libibverbs' public functions (ibv_dontfork_range and
// the like, declared by the bindings of verbs.h): it links the library.
#[link(name = "ibverbs")]
extern "C" {}

/// The private helpers of libibverbs a provider calls, under the symbol
/// version of their private ABI (`IBVERBS_PRIVATE_34`, `_65`). They are
/// looked up at run time (`dlvsym`), not linked: a program or library that
/// links them cannot even start under an rdma-core of another private ABI.
/// Their C types are the same in every release served.
pub mod private {
    use super::*;
    use core::ffi::CStr;

    /// The symbol version the helpers of private ABI `abi` carry.
    pub fn version(abi: u32) -> &'static CStr {
        match abi {
            65 => c"IBVERBS_PRIVATE_65",
            _ => c"IBVERBS_PRIVATE_34",
        }
    }

    /// `verbs_register_driver_N` of private ABI `abi`.
    pub fn register_driver(abi: u32) -> &'static CStr {
        match abi {
            65 => c"verbs_register_driver_65",
            _ => c"verbs_register_driver_34",
        }
    }
    pub type RegisterDriver = unsafe extern "C" fn(ops: *const verbs_device_ops);

    pub const INIT_AND_ALLOC_CONTEXT: &core::ffi::CStr = c"_verbs_init_and_alloc_context";
    pub type InitAndAllocContext = unsafe extern "C" fn(
        device: *mut ibv_device,
        cmd_fd: c_int,
        alloc_size: usize,
        context_offset: *mut verbs_context,
        driver_id: u32,
    ) -> *mut c_void;

    /// Makes the kernel's context for a device a kernel driver registered
    /// (the `GET_CONTEXT` command on the context's command fd). Private ABI
    /// 65 added the `fd_arr` argument (file descriptors to pass along; none
    /// here).
    pub const CMD_GET_CONTEXT: &core::ffi::CStr = c"ibv_cmd_get_context";
    pub type CmdGetContext34 = unsafe extern "C" fn(
        context: *mut verbs_context,
        cmd: *mut c_void,
        cmd_size: usize,
        resp: *mut c_void,
        resp_size: usize,
    ) -> c_int;
    pub type CmdGetContext65 = unsafe extern "C" fn(
        context: *mut verbs_context,
        cmd: *mut c_void,
        cmd_size: usize,
        fd_arr: *mut c_void,
        resp: *mut c_void,
        resp_size: usize,
    ) -> c_int;
    /// `struct ibv_get_context`: the command header (`ib_uverbs_cmd_hdr`)
    /// and the response pointer, then xiw's driver data
    /// (`kernel::AllocUcontextReq`).
    pub const GET_CONTEXT_CMD_SIZE: usize = 16 + 8;
    /// `struct ib_uverbs_get_context_resp`: async_fd and num_comp_vectors.
    pub const GET_CONTEXT_RESP_SIZE: usize = 8;

    pub const UNINIT_CONTEXT: &core::ffi::CStr = c"verbs_uninit_context";
    pub type UninitContext = unsafe extern "C" fn(context: *mut verbs_context);

    pub const SET_OPS: &core::ffi::CStr = c"verbs_set_ops";
    /// `ops`: the first entry of the release's `verbs_context_ops`
    /// ([`Layout::ops_table`]).
    pub type SetOps = unsafe extern "C" fn(vctx: *mut verbs_context, ops: *const Op);

    pub const LOG: &core::ffi::CStr = c"__verbs_log";
    pub type Log =
        unsafe extern "C" fn(ctx: *mut verbs_context, level: u32, fmt: *const c_char, ...);
}

// Layout of rdma-core 44 on x86-64, checked at compile time.
const _: () = {
    assert!(size_of::<verbs_match_ent>() == 24);
    assert!(size_of::<verbs_device_ops>() == 72);
    assert!(size_of::<ibv_device>() == 664);
    assert!(size_of::<verbs_device>() == 712);
    assert!(offset_of!(verbs_device, ops) == 664);
    assert!(offset_of!(verbs_device, refcount) == 672);
    assert!(offset_of!(verbs_device, entry) == 680);
    assert!(offset_of!(verbs_device, sysfs) == 696);
    assert!(offset_of!(verbs_device, core_support) == 704);
    assert!(size_of::<verbs_context_ops>() == 76 * 8);
    assert!(offset_of!(verbs_context_ops, alloc_pd) == 5 * 8);
    assert!(offset_of!(verbs_context_ops, free_context) == 39 * 8);
    assert!(offset_of!(verbs_context_ops, poll_cq) == 53 * 8);
    assert!(offset_of!(verbs_context_ops, query_device_ex) == 58 * 8);
    assert!(offset_of!(verbs_context_ops, reg_mr) == 68 * 8);
    assert!(offset_of!(verbs_context_ops, unimport_pd) == 75 * 8);
    assert!(size_of::<ibv_context>() == 328);
    assert!(size_of::<verbs_context>() == 648);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(size_of::<ibv_qp>() == 160);
    assert!(size_of::<ibv_qp_ex>() == 352);
    assert!(offset_of!(ibv_qp_ex, wr_atomic_write) == 344);
    assert!(offset_of!(verbs_qp, tail) == 352);
    // Every layout's comp_mask and xrcd pointer (8-aligned after it) fit.
    let mut i = 0;
    while i < LAYOUTS.len() {
        let l = &LAYOUTS[i];
        assert!((l.qp_comp_mask() + 4).next_multiple_of(8) + 8 <= size_of::<verbs_qp>());
        i += 1;
    }
    assert!(size_of::<ibv_cq>() == 128);
    assert!(size_of::<ibv_cq_ex>() == 288);
    assert!(size_of::<verbs_cq>() == 288);
    assert!(offset_of!(verbs_mr, mr_type) == size_of::<ibv_mr>());
    assert!(size_of::<verbs_sysfs_dev>() == 992);
};

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn flush_stub(_: *mut ibv_qp_ex, _: u32, _: u64, _: usize, _: u8, _: u8) {}

    /// rdma-core 44 reads `comp_mask` right after its `ibv_qp_ex`; 56 reads
    /// `wr_flush` there and `comp_mask` 8 bytes on.
    #[test]
    fn the_qp_tail_is_laid_out_per_release() {
        let l44 = Layout::of(44, 0).expect("44.0");
        let l56 = Layout::of(56, 1).expect("56.1");
        assert_eq!(Layout::of(56, 4), Some(l56));
        assert_eq!(Layout::of(44, 1), None);
        assert_eq!(Layout::of(57, 0), None);
        assert_eq!(Layout::known(), "44.0, 56.x, 65.0");
        // As driver.h and verbs.h of v44.0 and v56.1 place it.
        assert_eq!((l44.qp_comp_mask(), l56.qp_comp_mask()), (352, 360));
        // SAFETY: plain data; all-zero is valid.
        let mut q: verbs_qp = unsafe { core::mem::zeroed() };
        l44.set_qp_tail(&mut q, VERBS_QP_EX, Some(flush_stub));
        assert_eq!(q.tail[..4], VERBS_QP_EX.to_ne_bytes());
        assert!(q.tail[4..].iter().all(|&b| b == 0), "44 has no wr_flush");
        assert_eq!(l44.qp_comp_mask_of(&q), VERBS_QP_EX);
        // SAFETY: as above.
        let mut q: verbs_qp = unsafe { core::mem::zeroed() };
        l56.set_qp_tail(&mut q, VERBS_QP_EX, Some(flush_stub));
        let f = flush_stub as WrFlush as usize;
        assert_eq!(q.tail[..8], f.to_ne_bytes());
        assert_eq!(q.tail[8..12], VERBS_QP_EX.to_ne_bytes());
        assert_eq!(l56.qp_comp_mask_of(&q), VERBS_QP_EX);
        // SAFETY: as above.
        let mut q: verbs_qp = unsafe { core::mem::zeroed() };
        l56.set_qp_tail(&mut q, VERBS_QP_EX, None);
        assert!(q.tail[..8].iter().all(|&b| b == 0), "no flush: NULL");
    }

    unsafe extern "C" fn op_stub() {}

    /// rdma-core 65's table: 93 entries, its 17 new ones NULL, every other
    /// where its alphabetical order puts it (as in v65.0's driver.h).
    #[test]
    fn the_ops_table_is_laid_out_per_release() {
        let mut all = OPS_44.to_vec();
        all.extend_from_slice(OPS_ADDED_65);
        all.sort_unstable();
        assert!(OPS_44.is_sorted() && OPS_ADDED_65.is_sorted());
        assert_eq!(all.len(), OPS_MAX);
        let ops = verbs_context_ops {
            alloc_null_mr: Some(op_stub),
            query_rt_values: Some(op_stub),
            reg_mr: Some(reg_mr_stub),
            unimport_pd: Some(op_stub),
            ..verbs_context_ops::EMPTY
        };
        let l44 = Layout::of(44, 0).expect("44.0");
        let l65 = Layout::of(65, 0).expect("65.0");
        let t44 = l44.ops_table(&ops);
        let t65 = l65.ops_table(&ops);
        let set = |t: &[Op]| -> Vec<usize> {
            t.iter()
                .enumerate()
                .filter(|(_, o)| o.is_some())
                .map(|(i, _)| i)
                .collect()
        };
        // 44: alloc_null_mr 3, query_rt_values 63, reg_mr 68, unimport_pd 75;
        // 65: 5, 75, 82, 92.
        assert_eq!(set(&t44), [3, 63, 68, 75]);
        assert_eq!(set(&t65), [5, 75, 82, 92]);
        for (i, name) in all.iter().enumerate() {
            let want = ["alloc_null_mr", "query_rt_values", "reg_mr", "unimport_pd"].contains(name);
            assert_eq!(t65[i].is_some(), want, "{name} at {i}");
        }
        assert_eq!((l44.private_abi(), l65.private_abi()), (34, 65));
        assert_eq!((l44.context_front(), l65.context_front()), (0, 48));
        assert_eq!(Layout::of(56, 1).map(|l| l.private_abi()), Some(34));
        assert_eq!(Layout::of(64, 0), None);
        assert_eq!(private::register_driver(65), c"verbs_register_driver_65");
    }

    unsafe extern "C" fn reg_mr_stub(
        _: *mut ibv_pd,
        _: *mut c_void,
        _: usize,
        _: u64,
        _: c_int,
    ) -> *mut ibv_mr {
        core::ptr::null_mut()
    }
}
