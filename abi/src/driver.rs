//! The private provider ABI of rdma-core, as every release from 39.0 to
//! 65.x lays it out.
//!
//! `infiniband/driver.h` is internal to rdma-core and not installed, so these
//! structures are mirrored by hand from rdma-core v44.0; what other releases
//! changed follows from the release number ([`Layout`]), as read from each
//! release's `libibverbs/driver.h`, `verbs.h` and `libibverbs.map.in`. Sizes
//! and offsets are asserted at compile time; a mismatch breaks the build, not
//! a program. What differs between the releases served (eight layouts:
//! 39-43, 44, 45-56, 57-58, 59-61, 62-63, 64, 65):
//! - the private ABI number (the provider's file name `libNAME-rdmavN.so`,
//!   `verbs_register_driver_N`, the symbol version `IBVERBS_PRIVATE_N`): 34
//!   up to 56, 57 for 57-58, 59 for 59-63, 64, 65;
//! - `ibv_qp_ex`: 39-43 end with `wr_abort` (344 bytes), 44 appended
//!   `wr_atomic_write` (352), 45 `wr_flush` (360); `verbs_qp.comp_mask`
//!   follows it, and libibverbs reads it there;
//! - `verbs_context` grows at its front (its `ibv_context` stays last): 3
//!   entries in 59, one more in 62, two more in 64;
//! - `verbs_context_ops` (alphabetical) gained 3 entries in 59, 2 in 62 (no
//!   new private ABI number), 2 in 64 and 10 in 65;
//! - `ibv_cmd_get_context` took an `fd_arr` argument from 57 on;
//! - `ibv_port_attr` grew by `active_speed_ex` in 49 (the mirror has 44's,
//!   which writes no byte a release before 49 lacks; from 49 on libibverbs
//!   zeroes the whole struct before asking).

#![allow(non_camel_case_types)]

use crate::verbs::*;
use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};

/// An rdma-core release series this file mirrors (every minor release of a
/// series has its layout: no minor release changed one); what differs
/// between them follows from the number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The release series (`44` for 44.0 to 44.x).
    pub major: u32,
}

/// The oldest and the newest release series served.
pub const OLDEST: u32 = 39;
pub const NEWEST: u32 = 65;

/// Every release series served, 39 to 65.
pub const LAYOUTS: [Layout; (NEWEST - OLDEST + 1) as usize] = {
    let mut all = [Layout { major: OLDEST }; (NEWEST - OLDEST + 1) as usize];
    let mut i = 0;
    while i < all.len() {
        all[i].major = OLDEST + i as u32;
        i += 1;
    }
    all
};

/// The release whose headers the structures here mirror.
pub const MIRRORED: &Layout = &LAYOUTS[(44 - OLDEST) as usize];

/// The most bytes a served release puts in `verbs_context` in front of
/// rdma-core 44's fields (64's and 65's `free_buf`, `alloc_buf`,
/// `dm_export_dmabuf_fd`, `reg_mr_ex`, `dealloc_dmah`, `alloc_dmah`).
pub const CONTEXT_FRONT_MAX: usize = 6 * size_of::<usize>();

/// Room for the entries any served release has in front of rdma-core 44's
/// `verbs_context` (a provider context starts with it, see
/// [`Layout::context_front`]).
pub type ContextFront = [usize; CONTEXT_FRONT_MAX / size_of::<usize>()];

/// Where a probe symbol is exported: a public version node, or the private
/// node of the release's private ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Public(&'static core::ffi::CStr),
    Private,
}

/// Symbols libibverbs exports from a release on: which of them a library
/// has confirms the release its file name claims (releases 39 to 48 export
/// the same set; there the name alone tells them apart).
pub const PROBES: &[(&core::ffi::CStr, Node, u32)] = &[
    (c"ibv_wr_opcode_str", Node::Private, 49),
    (c"ibv_cmd_create_cq_ex2", Node::Private, 53),
    (c"ibv_reg_mr_ex", Node::Public(c"IBVERBS_1.15"), 59),
    (
        c"ibv_dm_export_dmabuf_fd",
        Node::Public(c"IBVERBS_1.16"),
        62,
    ),
    (c"ibv_alloc_buf", Node::Public(c"IBVERBS_1.17"), 64),
    (c"ibv_create_comp_cntr", Node::Public(c"IBVERBS_1.18"), 65),
];

impl Layout {
    /// The private ABI number: the provider file name
    /// (`libxiw-rdmavN.so`), `verbs_register_driver_N` and the symbol
    /// version `IBVERBS_PRIVATE_N` of the helpers.
    pub const fn private_abi(&self) -> u32 {
        match self.major {
            ..=56 => 34,
            57..=58 => 57,
            59..=63 => 59,
            64 => 64,
            _ => 65,
        }
    }

    /// The library's own minor version: libibverbs of release R.M is the
    /// file `libibverbs.so.1.<this>.R.M`.
    pub const fn library_minor(&self) -> u32 {
        match self.major {
            ..=58 => 14,
            59..=61 => 15,
            62..=63 => 16,
            64 => 17,
            _ => 18,
        }
    }

    /// `ibv_qp_ex` has `wr_atomic_write` (rdma-core 44 and later).
    pub const fn qp_ex_atomic_write(&self) -> bool {
        self.major >= 44
    }

    /// `ibv_qp_ex` ends with `wr_flush` (rdma-core 45 and later).
    pub const fn qp_ex_flush(&self) -> bool {
        self.major >= 45
    }

    /// Offset of `verbs_qp.comp_mask`: right after this release's
    /// `ibv_qp_ex`, which is 344 bytes, 352 with `wr_atomic_write`, 360 with
    /// `wr_flush` too.
    pub const fn qp_comp_mask(&self) -> usize {
        if self.qp_ex_flush() {
            360
        } else if self.qp_ex_atomic_write() {
            352
        } else {
            344
        }
    }

    /// `ibv_cmd_get_context` takes an `fd_arr` (rdma-core 57 and later).
    pub const fn get_context_fd_arr(&self) -> bool {
        self.major >= 57
    }

    /// Whether a library of this release exports the probe symbol of
    /// [`PROBES`] that arrived in `since`.
    pub const fn has_probe(&self, since: u32) -> bool {
        self.major >= since
    }

    /// How many bytes this release's `verbs_context` has in front of the
    /// fields of rdma-core 44's: a provider context that starts with a
    /// [`ContextFront`] and then rdma-core 44's `verbs_context` hands this
    /// release the context `ContextFront` bytes minus this into it, so that
    /// `ibv_context` (last in every release) is where it expects.
    pub const fn context_front(&self) -> usize {
        let entries = match self.major {
            ..=58 => 0,
            59..=61 => 3,
            62..=63 => 4,
            _ => 6,
        };
        entries * size_of::<usize>()
    }

    /// How many entries this release's `verbs_context_ops` has.
    pub fn ops_len(&self) -> usize {
        OPS_44.len()
            + OPS_ADDED
                .iter()
                .filter(|(_, since)| self.major >= *since)
                .count()
    }

    /// `ops` (in rdma-core 44's order) as this release's `verbs_context_ops`:
    /// entries it added are NULL (libibverbs then answers EOPNOTSUPP). The
    /// table is longer than the release reads where it has fewer entries.
    pub fn ops_table(&self, ops: &verbs_context_ops) -> [Op; OPS_MAX] {
        const { assert!(size_of::<verbs_context_ops>() == OPS_44.len() * size_of::<Op>()) };
        // SAFETY: verbs_context_ops is repr(C), OPS_44.len() entries of Op.
        let old: [Op; OPS_44.len()] = unsafe { core::mem::transmute_copy(ops) };
        let mut out = [None; OPS_MAX];
        let mut added = OPS_ADDED
            .iter()
            .filter(|(_, since)| self.major >= *since)
            .map(|(name, _)| *name)
            .peekable();
        // Both lists are in alphabetical order, as the release's struct is.
        let mut i = 0;
        for slot in out.iter_mut().take(self.ops_len()) {
            match added.peek() {
                Some(a) if i == OPS_44.len() || *a < OPS_44[i] => {
                    added.next();
                }
                _ => {
                    *slot = old[i];
                    i += 1;
                }
            }
        }
        out
    }

    /// The layout of release series `major` (any minor release), if it is
    /// served.
    pub fn of(major: u32) -> Option<&'static Layout> {
        LAYOUTS.iter().find(|l| l.major == major)
    }

    /// The releases served, for messages.
    pub fn known() -> String {
        format!("{OLDEST}.0 to {NEWEST}.x")
    }

    /// Fills in what follows rdma-core 39's `ibv_qp_ex` in a `verbs_qp`, as
    /// this release lays it out: `wr_atomic_write` and `wr_flush` where the
    /// release has them (44, 45), and `comp_mask` after them, where
    /// libibverbs reads it. The caller sets `wr_atomic_write` (for
    /// releases that have it) before.
    pub fn set_qp_tail(&self, q: &mut verbs_qp, comp_mask: u32, wr_flush: Option<WrFlush>) {
        if !self.qp_ex_atomic_write() {
            // SAFETY: the union's ibv_qp_ex is plain data the caller filled in.
            unsafe { (*q.u.qp_ex).wr_atomic_write = None };
        }
        let base = (q as *mut verbs_qp).cast::<u8>();
        // SAFETY: every offset written lies inside verbs_qp (asserted below
        // for every layout); the bytes are plain data.
        unsafe {
            if self.qp_ex_flush() {
                let f = wr_flush.map_or(0, |f| f as usize);
                base.add(size_of::<ibv_qp_ex>())
                    .cast::<usize>()
                    .write_unaligned(f);
            }
            base.add(self.qp_comp_mask())
                .cast::<u32>()
                .write_unaligned(comp_mask);
        }
    }

    /// `verbs_qp.comp_mask` as this release places it.
    #[cfg(test)]
    fn qp_comp_mask_of(&self, q: &verbs_qp) -> u32 {
        let base = (q as *const verbs_qp).cast::<u8>();
        // SAFETY: inside verbs_qp, as in set_qp_tail.
        unsafe { base.add(self.qp_comp_mask()).cast::<u32>().read_unaligned() }
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

/// The entries later releases added to `verbs_context_ops`, in
/// alphabetical order, with the release that added each.
pub const OPS_ADDED: &[(&str, u32)] = &[
    ("alloc_buf", 64),
    ("alloc_dmah", 59),
    ("create_comp_cntr", 65),
    ("dealloc_dmah", 59),
    ("destroy_comp_cntr", 65),
    ("dm_export_dmabuf_fd", 62),
    ("free_buf", 64),
    ("inc_comp_cntr", 65),
    ("inc_err_comp_cntr", 65),
    ("qp_attach_comp_cntr", 65),
    ("query_comp_cntr_caps", 65),
    ("query_port_speed", 62),
    ("read_comp_cntr", 65),
    ("read_err_comp_cntr", 65),
    ("reg_mr_ex", 59),
    ("set_comp_cntr", 65),
    ("set_err_comp_cntr", 65),
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
/// version of their private ABI (`IBVERBS_PRIVATE_34`, `_57`, `_59`,
/// `_64`, `_65`). They are
/// looked up at run time (`dlvsym`), not linked: a program or library that
/// links them cannot even start under an rdma-core of another private ABI.
/// Their C types are the same in every release served.
pub mod private {
    use super::*;
    use core::ffi::CStr;

    /// Every private ABI number a served release has, oldest first, with
    /// the symbol version its helpers carry and its `verbs_register_driver_N`.
    pub const ABIS: [(u32, &CStr, &CStr); 5] = [
        (34, c"IBVERBS_PRIVATE_34", c"verbs_register_driver_34"),
        (57, c"IBVERBS_PRIVATE_57", c"verbs_register_driver_57"),
        (59, c"IBVERBS_PRIVATE_59", c"verbs_register_driver_59"),
        (64, c"IBVERBS_PRIVATE_64", c"verbs_register_driver_64"),
        (65, c"IBVERBS_PRIVATE_65", c"verbs_register_driver_65"),
    ];

    /// The entry of [`ABIS`] for `abi`, one a served release has
    /// ([`Layout::private_abi`]).
    fn entry(abi: u32) -> &'static (u32, &'static CStr, &'static CStr) {
        ABIS.iter()
            .find(|e| e.0 == abi)
            .expect("a private ABI number of a served release")
    }

    /// The symbol version the helpers of private ABI `abi` carry.
    pub fn version(abi: u32) -> &'static CStr {
        entry(abi).1
    }

    /// `verbs_register_driver_N` of private ABI `abi`.
    pub fn register_driver(abi: u32) -> &'static CStr {
        entry(abi).2
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
    /// (the `GET_CONTEXT` command on the context's command fd). rdma-core 57
    /// added the `fd_arr` argument (file descriptors to pass along; none
    /// here; [`Layout::get_context_fd_arr`]).
    pub const CMD_GET_CONTEXT: &core::ffi::CStr = c"ibv_cmd_get_context";
    pub type CmdGetContext34 = unsafe extern "C" fn(
        context: *mut verbs_context,
        cmd: *mut c_void,
        cmd_size: usize,
        resp: *mut c_void,
        resp_size: usize,
    ) -> c_int;
    pub type CmdGetContext57 = unsafe extern "C" fn(
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
    // The mirror is 44's: a provider built against other headers would
    // write ibv_port_attr bytes that releases before 49 do not have.
    assert!(size_of::<ibv_port_attr>() == 52);
    // Every layout's comp_mask and xrcd pointer (8-aligned after it) fit,
    // and its context front fits the room left for it.
    let mut i = 0;
    while i < LAYOUTS.len() {
        let l = &LAYOUTS[i];
        assert!((l.qp_comp_mask() + 4).next_multiple_of(8) + 8 <= size_of::<verbs_qp>());
        assert!(l.qp_comp_mask() >= offset_of!(ibv_qp_ex, wr_atomic_write));
        assert!(l.context_front() <= CONTEXT_FRONT_MAX);
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

    /// Where libibverbs reads `comp_mask`: right after its `ibv_qp_ex`,
    /// which 39-43 end with `wr_abort` (344), 44 with `wr_atomic_write`
    /// (352), 45 and later with `wr_flush` (360), as each release's verbs.h
    /// and driver.h place them.
    #[test]
    fn the_qp_tail_is_laid_out_per_release() {
        let l = |r| Layout::of(r).expect("served");
        assert_eq!(Layout::of(56), Some(l(56)));
        assert_eq!(Layout::of(38), None);
        assert_eq!(Layout::of(66), None);
        assert_eq!(Layout::known(), "39.0 to 65.x");
        let offsets: Vec<usize> = [39, 43, 44, 45, 56, 65].map(|r| l(r).qp_comp_mask()).into();
        assert_eq!(offsets, [344, 344, 352, 360, 360, 360]);
        let f = flush_stub as WrFlush as usize;
        let with = |l: &Layout, flush| {
            // SAFETY: plain data; all-zero is valid.
            let mut q: verbs_qp = unsafe { core::mem::zeroed() };
            // SAFETY: as above; the caller's part.
            unsafe { (*q.u.qp_ex).wr_atomic_write = Some(atomic_write_stub) };
            l.set_qp_tail(&mut q, VERBS_QP_EX, flush);
            // SAFETY: the bytes of a plain-data struct, all initialised.
            let bytes: [u8; size_of::<verbs_qp>()] = unsafe { core::mem::transmute(q) };
            bytes
        };
        // 39: comp_mask where 44 has wr_atomic_write, nothing after it.
        let q = with(l(39), Some(flush_stub));
        assert_eq!(q[344..348], VERBS_QP_EX.to_ne_bytes());
        assert!(q[348..].iter().all(|&b| b == 0), "39 has no more");
        // 44: wr_atomic_write kept, comp_mask after it, no wr_flush.
        let q = with(l(44), Some(flush_stub));
        assert_eq!(
            q[344..352],
            (atomic_write_stub as AtomicWriteFn as usize).to_ne_bytes()
        );
        assert_eq!(q[352..356], VERBS_QP_EX.to_ne_bytes());
        assert!(q[356..].iter().all(|&b| b == 0), "44 has no wr_flush");
        // 56: wr_flush, then comp_mask; NULL when there is no Flush.
        let q = with(l(56), Some(flush_stub));
        assert_eq!(q[352..360], f.to_ne_bytes());
        assert_eq!(q[360..364], VERBS_QP_EX.to_ne_bytes());
        let q = with(l(56), None);
        assert!(q[352..360].iter().all(|&b| b == 0), "no flush: NULL");
        for l in LAYOUTS {
            let mut q: verbs_qp = unsafe { core::mem::zeroed() };
            l.set_qp_tail(&mut q, VERBS_QP_EX, None);
            assert_eq!(l.qp_comp_mask_of(&q), VERBS_QP_EX, "{}", l.major);
        }
    }

    unsafe extern "C" fn op_stub() {}

    /// Each release's table has its own length and puts every entry where
    /// its alphabetical order does, those it added NULL: the positions of
    /// four entries in each layout, as that release's driver.h numbers them.
    #[test]
    fn the_ops_table_is_laid_out_per_release() {
        let mut all: Vec<&str> = OPS_44.to_vec();
        all.extend(OPS_ADDED.iter().map(|(n, _)| *n));
        all.sort_unstable();
        assert!(OPS_44.is_sorted() && OPS_ADDED.is_sorted());
        assert_eq!(all.len(), OPS_MAX);
        let ops = verbs_context_ops {
            alloc_null_mr: Some(op_stub),
            query_rt_values: Some(op_stub),
            reg_mr: Some(reg_mr_stub),
            unimport_pd: Some(op_stub),
            ..verbs_context_ops::EMPTY
        };
        let set = |t: &[Op]| -> Vec<usize> {
            t.iter()
                .enumerate()
                .filter(|(_, o)| o.is_some())
                .map(|(i, _)| i)
                .collect()
        };
        // (release, entries, alloc_null_mr, query_rt_values, reg_mr, unimport_pd)
        for (r, len, want) in [
            (39, 76, [3, 63, 68, 75]),
            (58, 76, [3, 63, 68, 75]),
            (59, 79, [4, 65, 70, 78]),
            (61, 79, [4, 65, 70, 78]),
            (62, 81, [4, 67, 72, 80]),
            (64, 83, [5, 69, 74, 82]),
            (65, 93, [5, 75, 82, 92]),
        ] {
            let l = Layout::of(r).expect("served");
            assert_eq!(l.ops_len(), len, "{r}");
            assert_eq!(set(&l.ops_table(&ops)), want, "{r}");
        }
        let t65 = Layout::of(65).expect("65").ops_table(&ops);
        for (i, name) in all.iter().enumerate() {
            let want = ["alloc_null_mr", "query_rt_values", "reg_mr", "unimport_pd"].contains(name);
            assert_eq!(t65[i].is_some(), want, "{name} at {i}");
        }
    }

    /// The private ABI number, the library's file name, the context's front
    /// and get_context's arguments, release by release.
    #[test]
    fn the_releases_differ_as_their_headers_say() {
        let row = |r| {
            let l = Layout::of(r).expect("served");
            (
                l.private_abi(),
                l.library_minor(),
                l.context_front(),
                l.get_context_fd_arr(),
            )
        };
        assert_eq!(row(39), (34, 14, 0, false));
        assert_eq!(row(56), (34, 14, 0, false));
        assert_eq!(row(57), (57, 14, 0, true));
        assert_eq!(row(58), (57, 14, 0, true));
        assert_eq!(row(59), (59, 15, 24, true));
        assert_eq!(row(61), (59, 15, 24, true));
        assert_eq!(row(62), (59, 16, 32, true));
        assert_eq!(row(63), (59, 16, 32, true));
        assert_eq!(row(64), (64, 17, 48, true));
        assert_eq!(row(65), (65, 18, 48, true));
        for (abi, _, _) in private::ABIS {
            let n = format!("verbs_register_driver_{abi}");
            assert_eq!(private::register_driver(abi).to_str(), Ok(n.as_str()));
            let v = format!("IBVERBS_PRIVATE_{abi}");
            assert_eq!(private::version(abi).to_str(), Ok(v.as_str()));
        }
        // Every number listed is some release's, and every release's is listed.
        let abis: Vec<u32> = LAYOUTS.iter().map(|l| l.private_abi()).collect();
        assert!(private::ABIS.iter().all(|e| abis.contains(&e.0)));
        assert!(abis.iter().all(|a| private::ABIS.iter().any(|e| e.0 == *a)));
    }

    type AtomicWriteFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void);
    unsafe extern "C" fn atomic_write_stub(_: *mut ibv_qp_ex, _: u32, _: u64, _: *const c_void) {}

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
