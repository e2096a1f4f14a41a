//! Registration with libibverbs, devices and contexts.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use xiw_abi::driver::*;
use xiw_abi::verbs::*;

use crate::context::{Config, Shared};
use crate::error::Error;
use crate::rdma_core::{self, Private};
use crate::sysfs_tree::DeviceInfo;
use crate::verbs::{self, XiwContext};

/// `uverbsN/abi_version` that `xiw up` writes and the kernel module reports.
pub use xiw_abi::limits::UVERBS_ABI_VERSION as UVERBS_ABI;

struct MatchTable([verbs_match_ent; 3]);
// SAFETY: immutable static data pointing at static strings.
unsafe impl Sync for MatchTable {}

/// Devices the kernel module registered carry xiw's driver id; those `xiw
/// up` describes (standalone mode) are matched by name.
static MATCH: MatchTable = MatchTable([
    verbs_match_ent {
        driver_data: ptr::null_mut(),
        u: verbs_match_ent_u {
            driver_id: xiw_abi::limits::DRIVER_ID as u64,
        },
        vendor: 0,
        device: 0,
        kind: VERBS_MATCH_DRIVER_ID,
    },
    verbs_match_ent {
        driver_data: ptr::null_mut(),
        u: verbs_match_ent_u {
            modalias: c"rdma_device:*Nxiw*".as_ptr(),
        },
        vendor: 0,
        device: 0,
        kind: VERBS_MATCH_MODALIAS,
    },
    verbs_match_ent {
        driver_data: ptr::null_mut(),
        u: verbs_match_ent_u { driver_id: 0 },
        vendor: 0,
        device: 0,
        kind: VERBS_MATCH_SENTINEL,
    },
]);

static DEVICE_OPS: verbs_device_ops = verbs_device_ops {
    name: c"xiw".as_ptr(),
    match_min_abi_version: UVERBS_ABI,
    match_max_abi_version: UVERBS_ABI,
    match_table: &MATCH.0 as *const _ as *const verbs_match_ent,
    static_providers: ptr::null(),
    match_device: None,
    alloc_context: Some(alloc_context),
    import_context: None,
    alloc_device: Some(alloc_device),
    uninit_device: Some(uninit_device),
};

/// The ops every xiw device carries: how a context is recognised as xiw's.
pub fn device_ops() -> *const verbs_device_ops {
    &DEVICE_OPS
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = register;

extern "C" fn register() {
    // Not loaded by libibverbs (the `xiw` command): nothing to register with.
    if !rdma_core::loaded() {
        return;
    }
    let _ = catch_unwind(|| match rdma_core::detect() {
        Ok(_) => {
            let register = rdma_core::private()
                .expect("checked by detect")
                .register_driver;
            // SAFETY: DEVICE_OPS is a static that lives as long as the library.
            unsafe { register(&DEVICE_OPS) }
        }
        Err(why) => eprintln!("xiw: not registering: {why}"),
    });
}

unsafe extern "C" fn alloc_device(_sysfs: *mut verbs_sysfs_dev) -> *mut verbs_device {
    catch_unwind(|| {
        // SAFETY: verbs_device is plain data that libibverbs fills in; zero is valid.
        let dev: Box<verbs_device> = Box::new(unsafe { std::mem::zeroed() });
        Box::into_raw(dev)
    })
    .unwrap_or(ptr::null_mut())
}

unsafe extern "C" fn uninit_device(dev: *mut verbs_device) {
    if !dev.is_null() {
        // SAFETY: allocated by alloc_device.
        drop(unsafe { Box::from_raw(dev) });
    }
}

unsafe extern "C" fn alloc_context(
    dev: *mut ibv_device,
    cmd_fd: i32,
    _private: *mut libc::c_void,
) -> *mut verbs_context {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: libibverbs passes the device it matched to us, and the
        // device's command fd.
        unsafe { new_context(dev, cmd_fd) }.unwrap_or(ptr::null_mut())
    }))
    .unwrap_or(ptr::null_mut())
}

/// A context of `dev` on `cmd_fd`: libibverbs' part, the kernel's (kernel
/// mode), the shared state and its progress thread, then the ops. None if
/// any step fails, what was made undone.
///
/// # Safety
/// `dev` is a device libibverbs matched to xiw; `cmd_fd` is its command fd.
unsafe fn new_context(dev: *mut ibv_device, cmd_fd: i32) -> Option<*mut verbs_context> {
    // SAFETY: per the contract.
    let (info, kernel) = unsafe { device_info(dev) }?;
    // Registration found them (no context is made before it).
    let lib = rdma_core::private()?;
    let layout = rdma_core::layout();
    // SAFETY: per the contract.
    let ctx = unsafe { init_context(lib, layout, dev, cmd_fd) }?;
    let vctx = XiwContext::release_vctx(ctx, layout);
    // The kernel's context for the device comes first: the RDMA core
    // holds the device for as long as it lives.
    let (cm_ev, drv) = if kernel {
        // SAFETY: vctx was just made on the device's command fd.
        unsafe { kernel_context(lib, ctx, vctx, &info) }?
    } else {
        (None, xiw_abi::kernel::AllocUcontextResp::default())
    };
    let kernel_cmd = kernel.then(|| crate::kernel::Kernel::new(cmd_fd));
    // SAFETY: ctx and vctx were just made, not yet handed out.
    let (mut sh, async_r) = unsafe { shared_state(lib, ctx, vctx, info, kernel_cmd) }?;
    if kernel {
        watch_kernel_events(&mut sh, cmd_fd, &drv, cm_ev);
    }
    let sh = Arc::new(sh);
    sh.log.vctx.store(vctx as usize, Ordering::Release);
    // SAFETY: as above.
    let thread = unsafe { start_progress(lib, ctx, vctx, &sh) }?;
    let ops = layout.ops_table(&verbs_context_ops {
        free_context: Some(free_context),
        ..verbs::ops()
    });
    // SAFETY: ctx is ours and initialised by libibverbs.
    unsafe {
        (*ctx).sh = Arc::into_raw(sh);
        (*ctx).progress = Box::into_raw(Box::new(thread));
        // Kernel mode: libibverbs asks the kernel for the async event fd
        // (async_fd stays -1), which the module raises the provider's
        // events on; the provider's own is for standalone mode.
        if !kernel {
            (*ctx).vctx.context.async_fd = async_r.into_raw_fd();
        }
        (*ctx).vctx.context.num_comp_vectors = crate::verbs::COMP_VECTORS;
        (lib.set_ops)(vctx, ops.as_ptr());
    }
    Some(vctx)
}

/// The device's description, and whether the kernel module registered it
/// (rather than `xiw up` describing it).
///
/// # Safety
/// `dev` is a device libibverbs matched to xiw.
unsafe fn device_info(dev: *mut ibv_device) -> Option<(DeviceInfo, bool)> {
    // SAFETY: per the contract.
    let path = unsafe { CStr::from_ptr((*dev).ibdev_path.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let dir = std::path::Path::new(&path);
    // A device `xiw up` described, or one the kernel module registered.
    let kernel = !DeviceInfo::is_standalone(dir);
    let info = if kernel {
        DeviceInfo::from_kernel(dir)
    } else {
        DeviceInfo::load(dir).map_err(|e| Error::Device(format!("{e} (run `xiw up`)")))
    };
    match info {
        Ok(i) => Some((i, kernel)),
        Err(e) => {
            eprintln!("xiw: cannot use the device at {path}: {e}");
            None
        }
    }
}

/// libibverbs' part of the context: an XiwContext of zeroed bytes with this
/// release's verbs_context in it, initialised.
///
/// # Safety
/// `dev` is a device libibverbs matched to xiw; `cmd_fd` is its command fd.
unsafe fn init_context(
    lib: &Private,
    layout: &Layout,
    dev: *mut ibv_device,
    cmd_fd: i32,
) -> Option<*mut XiwContext> {
    // Where this release's verbs_context starts in an XiwContext at 0,
    // as libibverbs takes it (a pointer-typed offset).
    let offset = XiwContext::release_vctx(ptr::null_mut(), layout);
    // SAFETY: libibverbs allocates size_of::<XiwContext>() zeroed bytes with its
    // verbs_context at `offset`, and initialises it.
    let ctx = unsafe {
        (lib.init_and_alloc_context)(
            dev,
            cmd_fd,
            std::mem::size_of::<XiwContext>(),
            offset,
            xiw_abi::limits::DRIVER_ID,
        )
    } as *mut XiwContext;
    (!ctx.is_null()).then_some(ctx)
}

/// Undoes `init_context`, for a context that cannot be completed.
///
/// # Safety
/// `ctx` and its `vctx` come from `init_context` and were not handed out.
unsafe fn undo_init(lib: &Private, ctx: *mut XiwContext, vctx: *mut verbs_context) {
    // SAFETY: undo _verbs_init_and_alloc_context.
    unsafe {
        (lib.uninit_context)(vctx);
        libc::free(ctx as *mut libc::c_void);
    }
}

/// Kernel mode: the kernel's context for the device, and the eventfd the
/// module signals when rdma_cm has a connection for the provider.
///
/// # Safety
/// `vctx` was just made on the device's command fd, `ctx` around it.
unsafe fn kernel_context(
    lib: &Private,
    ctx: *mut XiwContext,
    vctx: *mut verbs_context,
    info: &DeviceInfo,
) -> Option<(Option<OwnedFd>, xiw_abi::kernel::AllocUcontextResp)> {
    let cm_ev = crate::context::reactor::eventfd().ok();
    let fd = cm_ev.as_ref().map_or(-1, |e| e.as_raw_fd());
    // SAFETY: per the contract.
    match unsafe { lib.get_context(vctx, fd) } {
        Ok(d) => Some((cm_ev, d)),
        Err(e) => {
            eprintln!("xiw: {}: {e}", info.ibdev);
            // SAFETY: per the contract; not handed out.
            unsafe { undo_init(lib, ctx, vctx) };
            None
        }
    }
}

/// The context's shared state and the read end of its async-event socket.
///
/// # Safety
/// `ctx` and its `vctx` come from `init_context` and were not handed out.
unsafe fn shared_state(
    lib: &Private,
    ctx: *mut XiwContext,
    vctx: *mut verbs_context,
    info: DeviceInfo,
    kernel_cmd: Option<crate::kernel::Kernel>,
) -> Option<(Shared, OwnedFd)> {
    match Shared::new(info, Config::from_env(), kernel_cmd) {
        Ok(v) => Some(v),
        Err(e) => {
            if crate::log::env_debug() {
                eprintln!("xiw: cannot set up the device context: {e}");
            }
            // SAFETY: per the contract.
            unsafe { undo_init(lib, ctx, vctx) };
            None
        }
    }
}

/// Kernel mode: the module's events page, where it has one, and rdma_cm's
/// connections on `cm_ev`; without either the context still works (streams
/// polled, or no rdma_cm connections), as the log says.
fn watch_kernel_events(
    sh: &mut Shared,
    cmd_fd: i32,
    drv: &xiw_abi::kernel::AllocUcontextResp,
    cm_ev: Option<OwnedFd>,
) {
    if drv.events_len > 0 {
        match crate::events_page::StreamEvents::map(
            cmd_fd,
            drv.events_offset,
            drv.events_len as usize,
        ) {
            Ok(ev) => sh.kernel_events.page = Some(ev),
            Err(e) => crate::log::warn(
                &sh.log,
                format_args!("the module's events page cannot be mapped ({e}): streams are polled"),
            ),
        }
    }
    if let Some(ev) = cm_ev {
        if let Err(e) = sh.kernel_events.watch_cm(ev, &sh.reactor) {
            crate::log::warn(
                &sh.log,
                format_args!("rdma_cm connections cannot reach this context: {e}"),
            );
        }
    }
}

/// The context's progress thread, running the reactor on `sh`.
///
/// # Safety
/// `ctx` and its `vctx` come from `init_context` and were not handed out.
unsafe fn start_progress(
    lib: &Private,
    ctx: *mut XiwContext,
    vctx: *mut verbs_context,
    sh: &Arc<Shared>,
) -> Option<std::thread::JoinHandle<()>> {
    let worker = sh.clone();
    let thread = std::thread::Builder::new()
        .name("xiw-progress".into())
        .spawn(move || crate::context::reactor::run(worker));
    match thread {
        Ok(t) => Some(t),
        Err(_) => {
            // SAFETY: per the contract.
            unsafe { undo_init(lib, ctx, vctx) };
            None
        }
    }
}

pub(crate) unsafe extern "C" fn free_context(ibctx: *mut ibv_context) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: a context of ours.
        let ctx = unsafe { XiwContext::of(ibctx) };
        // SAFETY: set in alloc_context; taken back exactly once here.
        let (sh, thread) = unsafe { (Arc::from_raw((*ctx).sh), Box::from_raw((*ctx).progress)) };
        sh.listener.settle_closing();
        sh.reactor.stop();
        let _ = thread.join();
        sh.media.stop();
        sh.log.vctx.store(0, Ordering::Release);
        drop(sh);
        // SAFETY: undo _verbs_init_and_alloc_context (whose helpers were
        // found, or there would be no context); libibverbs calloc'd the block.
        unsafe {
            if let Some(lib) = rdma_core::private() {
                (lib.uninit_context)(XiwContext::release_vctx(ctx, rdma_core::layout()));
            }
            libc::free(ctx as *mut libc::c_void);
        }
    }));
}
