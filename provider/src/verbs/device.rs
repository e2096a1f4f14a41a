//! Device and port queries, and async events.

use super::*;

pub(super) unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> i32 {
    guard(libc::EIO, || {
        if ctx.is_null() || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ctx is ours (libibverbs only calls us with our contexts).
        let sh = unsafe { shared(ctx) };
        let a = device_attr(sh);
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller provides `attr_size` writable bytes at `attr`.
        unsafe { ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
        0
    })
}

/// `IB_UVERBS_DEVICE_FLUSH_GLOBAL`, `_FLUSH_PERSISTENT` and `_ATOMIC_WRITE` of
/// newer kernels and rdma-core (device_cap_flags_ex bits).
pub const DEVICE_FLUSH_GLOBAL: u64 = 1 << 38;
pub const DEVICE_FLUSH_PERSISTENT: u64 = 1 << 39;
pub const DEVICE_ATOMIC_WRITE: u64 = 1 << 40;

pub fn device_attr(sh: &Shared) -> ibv_device_attr_ex {
    let mut a = ibv_device_attr_ex::default();
    let o = &mut a.orig_attr;
    let fw = b"0.1.0";
    for (i, b) in fw.iter().enumerate() {
        o.fw_ver[i] = *b as _;
    }
    o.node_guid = sh.dev.node_guid.to_be();
    o.sys_image_guid = sh.dev.node_guid.to_be();
    o.max_mr_size = u64::MAX >> 1;
    o.page_size_cap = !4095u64;
    o.vendor_id = VENDOR_ID;
    o.vendor_part_id = VENDOR_PART_ID;
    o.hw_ver = 0;
    o.max_qp = MAX_QP as i32;
    o.max_qp_wr = crate::qp::MAX_QP_WR as i32;
    // Memory windows: type 1, and type 2 tied to the QP and PD it is bound
    // through (2B).
    o.device_cap_flags = IBV_DEVICE_SYS_IMAGE_GUID
        | IBV_DEVICE_MEM_MGT_EXTENSIONS
        | IBV_DEVICE_MEM_WINDOW
        | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    o.max_sge = crate::qp::MAX_SGE as i32;
    o.max_sge_rd = crate::qp::MAX_SGE as i32;
    o.max_cq = MAX_QP as i32 * 2;
    o.max_cqe = MAX_CQE as i32;
    o.max_mr = MAX_MR as i32;
    // Windows and regions share the STag table.
    o.max_mw = MAX_MR as i32;
    o.max_pd = MAX_PD as i32;
    o.max_qp_rd_atom = crate::qp::MAX_RD_ATOMIC as i32;
    o.max_res_rd_atom = (crate::qp::MAX_RD_ATOMIC * MAX_QP) as i32;
    o.max_qp_init_rd_atom = crate::qp::MAX_RD_ATOMIC as i32;
    // Atomics are carried out with CPU atomic instructions on the responder's
    // memory: atomic against other QPs of this device and the host's own CPUs.
    o.atomic_cap = if sh.cfg.extensions {
        IBV_ATOMIC_GLOB
    } else {
        IBV_ATOMIC_NONE
    };
    o.max_srq = MAX_SRQ as i32;
    o.max_srq_wr = crate::qp::MAX_QP_WR as i32;
    o.max_srq_sge = crate::qp::MAX_SGE as i32;
    o.max_pkeys = 1;
    o.phys_port_cnt = 1;
    a.device_cap_flags_ex = o.device_cap_flags as u64;
    if sh.cfg.extensions {
        a.device_cap_flags_ex |=
            DEVICE_FLUSH_GLOBAL | DEVICE_FLUSH_PERSISTENT | DEVICE_ATOMIC_WRITE;
    }
    a.phys_port_cnt_ex = 1;
    // On-demand paging: the provider reaches registered memory from user
    // space, so an MR need not be mapped at registration (nor the whole
    // address space, implicitly); see crate::odp. Reliable connections only.
    a.odp_caps.general_caps = u64::from(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT);
    a.odp_caps.per_transport_caps.rc_odp_caps = ODP_RC_CAPS;
    a.max_dm_size = super::dm::MAX_DM;
    a
}

/// What on-demand paging MRs serve on an RC QP.
pub const ODP_RC_CAPS: u32 = IBV_ODP_SUPPORT_SEND
    | IBV_ODP_SUPPORT_RECV
    | IBV_ODP_SUPPORT_WRITE
    | IBV_ODP_SUPPORT_READ
    | IBV_ODP_SUPPORT_ATOMIC
    | IBV_ODP_SUPPORT_SRQ_RECV;

pub(super) unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> i32 {
    guard(libc::EIO, || {
        if ctx.is_null() || attr.is_null() || port != 1 {
            return libc::EINVAL;
        }
        // SAFETY: ctx is ours.
        let sh = unsafe { shared(ctx) };
        let up = link_up(&sh.dev.netdev);
        let a = ibv_port_attr {
            state: if up { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
            max_mtu: IBV_MTU_4096,
            active_mtu: sysfs_tree::ibv_mtu_for(sh.dev.mtu) as ibv_mtu,
            gid_tbl_len: 1,
            max_msg_sz: MAX_MSG_SZ,
            pkey_tbl_len: 1,
            max_vl_num: 1,
            active_width: 1,
            active_speed: 4,
            phys_state: if up { 5 } else { 3 },
            link_layer: IBV_LINK_LAYER_ETHERNET as u8,
            ..Default::default()
        };
        // SAFETY: the caller passes a full ibv_port_attr.
        unsafe { *attr = a };
        0
    })
}

pub(super) fn link_up(netdev: &str) -> bool {
    match std::fs::read_to_string(format!("/sys/class/net/{netdev}/operstate")) {
        Ok(s) => matches!(s.trim(), "up" | "unknown"),
        Err(_) => true,
    }
}

/// libibverbs has read an event from `async_fd`: the next one may go.
pub(super) unsafe extern "C" fn async_event(ctx: *mut ibv_context, ev: *mut ibv_async_event) {
    guard((), || {
        if ctx.is_null() || ev.is_null() {
            return;
        }
        // SAFETY: ctx is ours; ev is the event libibverbs just filled in.
        let (sh, ev) = unsafe { (shared(ctx), &*ev) };
        // Kernel mode: the kernel's async event fd, which needs no pacing.
        if sh.kernel.is_some() {
            return;
        }
        // SAFETY: every member of the element union is a pointer or a port
        // number; the pointer member covers the whole of it for QP, CQ and SRQ
        // events, and a port number is not what the queue compares against.
        let element = unsafe { ev.element.qp } as u64;
        sh.async_events.queue.read_by_app(element, ev.event_type);
    })
}
