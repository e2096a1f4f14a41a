//! Diagnostics: silent unless asked. `XIW_DEBUG=1` prints to stderr; otherwise
//! messages go through libibverbs' own log (VERBS_LOG_LEVEL / VERBS_LOG_FILE).

use std::ffi::CString;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

use xiw_abi::driver;

/// Where a device context's diagnostics go.
pub struct Target {
    /// The device name, at the start of every line.
    pub ibdev: String,
    /// XIW_DEBUG: to stderr.
    pub debug: bool,
    /// The `verbs_context` for libibverbs' log (0 until the context is handed out).
    pub vctx: AtomicUsize,
}

impl Target {
    pub fn new(ibdev: String) -> Target {
        Target {
            ibdev,
            debug: env_debug(),
            vctx: AtomicUsize::new(0),
        }
    }
}

pub fn debug(t: &Target, args: fmt::Arguments) {
    emit(t, driver::VERBS_LOG_DEBUG, args)
}

pub fn warn(t: &Target, args: fmt::Arguments) {
    emit(t, driver::VERBS_LOG_WARN, args)
}

fn emit(sh: &Target, level: u32, args: fmt::Arguments) {
    if sh.debug {
        // Wall-clock time, so the lines of two processes can be lined up.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!(
            "{}.{:06} xiw: {}: {}",
            t.as_secs(),
            t.subsec_micros(),
            sh.ibdev,
            args
        );
        return;
    }
    let vctx = sh.vctx.load(Ordering::Acquire);
    if vctx == 0 {
        return;
    }
    let Ok(msg) = CString::new(format!("xiw: {}: {}\n", sh.ibdev, args)) else {
        return;
    };
    let Some(lib) = crate::rdma_core::private() else {
        return;
    };
    // SAFETY: `vctx` is the live context that owns `sh`; the format takes one C string.
    unsafe { (lib.log)(vctx as *mut _, level, c"%s".as_ptr(), msg.as_ptr()) };
}

/// Whether XIW_DEBUG asks for diagnostics on stderr.
pub fn env_debug() -> bool {
    std::env::var_os("XIW_DEBUG").is_some_and(|v| !v.is_empty() && v != "0")
}
