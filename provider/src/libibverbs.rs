//! The libibverbs this process runs: which rdma-core release it is, and so
//! which private ABI layout the provider must use (`xiw_abi::driver::Layout`).

use std::ffi::CStr;
use std::sync::OnceLock;

use xiw_abi::driver::*;

/// The layout of the rdma-core this process runs, found at registration.
static LAYOUT: OnceLock<&'static Layout> = OnceLock::new();

/// Records the layout found at registration.
pub fn set_layout(l: &'static Layout) {
    let _ = LAYOUT.set(l);
}

/// The private ABI layout in use (rdma-core 44's before registration).
pub fn layout() -> &'static Layout {
    LAYOUT.get().copied().unwrap_or(&LAYOUTS[0])
}

/// Which of [`LAYOUTS`] the loaded libibverbs has: the release its file
/// name carries, confirmed by a symbol that only some releases export.
pub fn detect() -> Result<&'static Layout, String> {
    let v =
        rdma_core_version().ok_or("cannot tell which rdma-core version loaded this provider")?;
    let (major, minor) = v
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| format!("cannot read the rdma-core version {v:?}"))?;
    let l = Layout::of(major, minor).ok_or_else(|| {
        format!(
            "running with rdma-core {v}; this provider serves rdma-core {} (private ABI {PRIVATE_ABI})",
            Layout::known()
        )
    })?;
    // SAFETY: looking a versioned symbol up among those already loaded.
    let probe = unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"ibv_wr_opcode_str".as_ptr(),
            c"IBVERBS_PRIVATE_34".as_ptr(),
        )
    };
    if probe.is_null() == l.has_wr_opcode_str {
        return Err(format!(
            "libibverbs is named as rdma-core {v}, but its symbols are not that release's"
        ));
    }
    Ok(l)
}

/// The rdma-core version of the libibverbs in this process, from its file name
/// (`libibverbs.so.1.14.44.0` is rdma-core 44.0).
fn rdma_core_version() -> Option<String> {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for a symbol we link.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: the address of a libibverbs function.
    if unsafe { libc::dladdr(verbs_register_driver_34 as *const libc::c_void, &mut info) } == 0
        || info.dli_fname.is_null()
    {
        return None;
    }
    // SAFETY: dladdr returns a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_str()
        .ok()?
        .to_owned();
    let real = std::fs::canonicalize(&path).ok()?;
    let name = real.file_name()?.to_str()?;
    let v = name.strip_prefix("libibverbs.so.1.")?;
    let (_, core) = v.split_once('.')?;
    Some(core.to_owned())
}
