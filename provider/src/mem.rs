//! Protection domains, memory regions and STag checks.
//!
//! An STag is `index << 8 | key` (RFC 5040 section 8.1.1 rule 8: difficult to
//! predict): the index is the table slot scrambled with a random mask of the
//! table's, the key is drawn at random at each registration of the slot (and
//! differs from the one before, so that a stale STag misses). Every access from the
//! network or from a work request goes through [`MrTable`], which checks STag,
//! PD, permission and bounds before a byte is touched, under a read lock that
//! deregistration waits for, so memory is never touched after `ibv_dereg_mr`.
//! The memory of an on-demand paging MR is only ever copied through the
//! kernel ([`crate::odp`]): it may not be mapped.

use parking_lot::{RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::Error;
use crate::persist::{Hash, Media};

use xiw_abi::verbs::*;

/// Why an access was refused (the engine's type: it maps it to a Terminate).
pub use xiw_engine::fault::AccessFault as AccessError;
use xiw_engine::send::Span;
pub use xiw_engine::send::WindowBind;

/// Who reaches registered memory: a QP, of protection domain `pd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct By {
    pub pd: u32,
    pub qpn: u32,
}

/// An entry of the table: a memory region, or a memory window (RFC 5040
/// section 2.1: a window is an STag that grants a peer access to a part of a
/// region, with rights of its own).
pub struct Mr {
    /// Host address of the first byte.
    pub addr: u64,
    /// Address the peer uses for the first byte (the tagged offset base).
    pub iova: u64,
    pub len: u64,
    pub access: u32,
    pub pd: u32,
    pub key: u8,
    valid: AtomicBool,
    /// Kernel mode: the handle of the kernel's object of a region the
    /// module may place RDMA Writes into (`1 << 32 | handle`; 0: none).
    kplace: AtomicU64,
    /// The medium behind a flushable or verifiable MR, and its Verify hash.
    pub ext: Option<Box<MrExt>>,
    /// A memory window: what it is bound to.
    pub window: Option<Window>,
    /// For a region: the windows bound to it now (it stays registered
    /// meanwhile).
    windows: u32,
}

/// What a memory window is bound to (its bounds and rights are the entry's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// 1 or 2 (`IBV_MW_TYPE_*`).
    pub kind: u8,
    /// The region it is bound to (its STag), if it is bound.
    pub mr: Option<u32>,
    /// Type 2: the QP it was bound through, the only one that may use it.
    pub qpn: u32,
}

/// Rights a peer's request needs: what only a region's key may give locally
/// is never asked of a window.
const REMOTE_RIGHTS: u32 = IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_ATOMIC
    | ACCESS_FLUSH_GLOBAL
    | ACCESS_FLUSH_PERSISTENT
    | ACCESS_VERIFY;

/// The rights a window may grant (`IBV_ACCESS_ZERO_BASED` is not a right).
const WINDOW_RIGHTS: u32 =
    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

impl Mr {
    /// An on-demand paging MR: its memory may not be mapped.
    pub fn odp(&self) -> bool {
        self.access & IBV_ACCESS_ON_DEMAND != 0
    }
}

/// What RDMA Flush and Verify need to know about an MR (draft-talpey-rdma-commit
/// section 2.4: attributes kept locally, never on the wire).
pub struct MrExt {
    pub media: Media,
    pub hash: Option<Hash>,
}

impl Mr {
    /// DDP's checks first (STag valid, same stream/PD, base and bounds: RFC 5041
    /// section 7.2), then RDMAP's access rights (RFC 5040 section 7.2) against both
    /// the MR's and the QP's (`allowed`) permissions.
    fn check(
        &self,
        by: By,
        to: u64,
        len: u64,
        need: u32,
        allowed: u32,
    ) -> Result<u64, AccessError> {
        if !self.valid.load(Ordering::Acquire) {
            return Err(AccessError::InvalidStag);
        }
        if let Some(w) = &self.window {
            // A window is a key for peers only, and a type 2 window one for
            // the stream of the QP it was bound through (RFC 5041 section
            // 7.2: the STag is associated with the stream).
            if need & REMOTE_RIGHTS == 0 {
                return Err(AccessError::InvalidStag);
            }
            if w.kind == 2 && w.qpn != by.qpn {
                return Err(AccessError::WrongPd);
            }
        }
        if self.pd != by.pd {
            return Err(AccessError::WrongPd);
        }
        to.checked_add(len).ok_or(AccessError::Wrap)?;
        // Written so that nothing overflows for an MR of the whole address
        // space (implicit on-demand paging: iova 0, length u64::MAX).
        let off = to.checked_sub(self.iova).ok_or(AccessError::Bounds)?;
        if off > self.len || len > self.len - off {
            return Err(AccessError::Bounds);
        }
        if self.access & allowed & need != need {
            return Err(AccessError::Access);
        }
        Ok(self.addr + off)
    }
}

/// The attributes of a registered MR (see [`MrTable::view`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrView {
    pub pd: u32,
    pub addr: u64,
    pub len: u64,
    pub iova: u64,
    pub access: u32,
    pub hash: Option<Hash>,
    /// Windows bound to the region.
    pub windows: u32,
}

impl Mr {
    fn view(&self) -> MrView {
        MrView {
            pd: self.pd,
            addr: self.addr,
            len: self.len,
            iova: self.iova,
            access: self.access,
            hash: self.ext.as_ref().and_then(|e| e.hash),
            windows: self.windows,
        }
    }
}

/// What an MR is registered as: its PD, host address, length, the address
/// the peer uses for its first byte, access flags and flush/verify attributes.
pub struct MrSpec {
    pub pd: u32,
    pub addr: u64,
    pub len: u64,
    pub iova: u64,
    pub access: u32,
    pub ext: Option<Box<MrExt>>,
    /// A memory window (bound to nothing yet) rather than a region.
    pub window: Option<Window>,
}

impl MrSpec {
    fn into_mr(self, key: u8) -> Mr {
        Mr {
            addr: self.addr,
            iova: self.iova,
            len: self.len,
            access: self.access,
            pd: self.pd,
            key,
            // A window grants nothing until it is bound.
            valid: AtomicBool::new(self.window.is_none()),
            kplace: AtomicU64::new(0),
            ext: self.ext,
            window: self.window,
            windows: 0,
        }
    }
}

/// Access bits a local work request needs (not in `enum ibv_access_flags`).
pub const NEED_NONE: u32 = 0;

#[derive(Default)]
pub struct MrTable {
    slots: RwLock<Slots>,
    /// Kernel mode: the module, told when a region it places into is
    /// invalidated.
    kernel: Option<crate::kernel::Kernel>,
}

struct Slots {
    mrs: Vec<Option<Mr>>,
    keys: Vec<u8>,
    free: Vec<u32>,
    /// Scrambles slots into STag indices (24 bits, not 0).
    mask: u32,
    /// State of the generator of keys (xorshift64*).
    rng: u64,
}

impl Default for Slots {
    fn default() -> Slots {
        use std::hash::{BuildHasher, Hasher};
        // The standard library's randomly keyed hasher: a seed no peer can know.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x7869_775f_7374_6167);
        let seed = h.finish() | 1;
        Slots {
            mrs: Vec::new(),
            keys: Vec::new(),
            free: Vec::new(),
            mask: ((seed >> 40) as u32 & 0x00ff_ffff).max(1),
            rng: seed,
        }
    }
}

impl Slots {
    /// The table slot an STag names.
    fn slot_of(&self, stag: u32) -> usize {
        ((stag >> 8) ^ self.mask) as usize
    }

    /// A random key other than `prev`.
    fn next_key(&mut self, prev: u8) -> u8 {
        loop {
            self.rng ^= self.rng >> 12;
            self.rng ^= self.rng << 25;
            self.rng ^= self.rng >> 27;
            let k = (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
            if k != prev {
                return k;
            }
        }
    }
}

impl MrTable {
    pub fn register(&self, pd: u32, addr: u64, len: u64, iova: u64, access: u32) -> u32 {
        self.register_ext(MrSpec {
            pd,
            addr,
            len,
            iova,
            access,
            ext: None,
            window: None,
        })
    }

    /// As [`MrTable::register`], with the flush/verify attributes of the MR.
    pub fn register_ext(&self, spec: MrSpec) -> u32 {
        let mut s = self.slots.write();
        let index = match s.free.pop() {
            Some(i) => i,
            None => {
                // The slot whose STag index would be 0 is never used: STags
                // below 256 stay invalid.
                if s.mrs.len() as u32 == s.mask {
                    s.mrs.push(None);
                    s.keys.push(0);
                }
                s.mrs.push(None);
                s.keys.push(0);
                (s.mrs.len() - 1) as u32
            }
        };
        let prev = s.keys[index as usize];
        let key = s.next_key(prev);
        s.keys[index as usize] = key;
        s.mrs[index as usize] = Some(spec.into_mr(key));
        (index ^ s.mask) << 8 | key as u32
    }

    /// What the MR `stag` is registered as now; None if `stag` names no MR.
    pub fn view(&self, stag: u32) -> Option<MrView> {
        let s = self.slots.read();
        lookup(&s, stag).ok().map(Mr::view)
    }

    /// Registers the MR `stag` anew as `spec`, keeping its STag
    /// (`ibv_rereg_mr`), if it is still what `was` says: the caller computes
    /// `spec` from `was` without the table locked, and tries again on
    /// `Some(false)` (another change came between). Under the write lock, so
    /// no access is in flight across the change. A Local Invalidate done
    /// before is undone. None if `stag` names no MR.
    pub fn replace(&self, stag: u32, was: &MrView, spec: MrSpec) -> Option<bool> {
        let mut s = self.slots.write();
        if lookup(&s, stag).ok()?.view() != *was {
            return Some(false);
        }
        let slot = s.slot_of(stag);
        s.mrs[slot] = Some(spec.into_mr(stag as u8));
        Some(true)
    }

    /// Removes an MR; waits for any access in progress (it holds the read
    /// lock). `EINVAL` if `stag` names no region, `EBUSY` while windows are
    /// bound to it.
    pub fn deregister(&self, stag: u32) -> Result<(), Error> {
        let mut s = self.slots.write();
        let mr = lookup(&s, stag).map_err(|_| Error::invalid("no memory region has this key"))?;
        if mr.window.is_some() {
            return Err(Error::invalid(
                "the key is a memory window's, not a region's",
            ));
        }
        if mr.windows > 0 {
            return Err(Error::Busy("memory windows are bound to the region".into()));
        }
        let index = s.slot_of(stag);
        s.mrs[index] = None;
        s.free.push(index as u32);
        Ok(())
    }

    /// Kernel mode: a table whose regions the module may place into.
    pub fn with_kernel(kernel: Option<crate::kernel::Kernel>) -> MrTable {
        MrTable {
            kernel,
            ..MrTable::default()
        }
    }

    /// The TO base of a plain region (none of persistent media or a Verify
    /// hash's, no window): one the module may place into.
    pub fn plain_iova(&self, stag: u32) -> Option<u64> {
        let s = self.slots.read();
        let mr = lookup(&s, stag).ok()?;
        (mr.ext.is_none() && mr.window.is_none()).then_some(mr.iova)
    }

    /// Kernel mode: the module may place RDMA Writes into the region of
    /// `stag` (its kernel object `handle`), until it is invalidated.
    pub fn set_kernel_place(&self, stag: u32, handle: u32) {
        if let Ok(mr) = lookup(&self.slots.read(), stag) {
            mr.kplace
                .store(1 << 32 | u64::from(handle), Ordering::Release);
        }
    }

    /// Invalidates an STag for a Local Invalidate: a region, or a type 2
    /// window, which is unbound. RFC 5040 section 6.4.
    pub fn invalidate(&self, stag: u32, by: By) -> Result<(), AccessError> {
        self.invalidate_as(stag, by, None)
    }

    /// Invalidates an STag for the peer's Send with Invalidate, which RFC
    /// 5040 allows only for an STag associated with this stream (sections
    /// 5.3 and 8.1.1 rule 7): a type 2 window bound through this QP, or a
    /// region that is not enabled for remote access on several streams —
    /// `shared` says whether other QPs of its protection domain exist.
    pub fn invalidate_remote(
        &self,
        stag: u32,
        by: By,
        shared: &mut dyn FnMut() -> bool,
    ) -> Result<(), AccessError> {
        self.invalidate_as(stag, by, Some(shared))
    }

    fn invalidate_as(
        &self,
        stag: u32,
        by: By,
        remote: Option<&mut dyn FnMut() -> bool>,
    ) -> Result<(), AccessError> {
        let window = {
            let s = self.slots.read();
            let mr = lookup(&s, stag)?;
            if mr.pd != by.pd {
                return Err(AccessError::WrongPd);
            }
            if mr.window.is_none() {
                let remote_access =
                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
                if let Some(shared) = remote {
                    if mr.access & remote_access != 0 && shared() {
                        return Err(AccessError::WrongPd);
                    }
                }
                mr.valid.store(false, Ordering::Release);
                let k = mr.kplace.swap(0, Ordering::AcqRel);
                // Not under the table's lock: the module may wait for a
                // placement under way.
                drop(s);
                // The module stops placing into it before the invalidation
                // is done (a Local Invalidate completes, the Send with
                // Invalidate's bytes after it are taken in).
                if let (Some(kernel), true) = (self.kernel, k != 0) {
                    let _ = kernel.mr_invalidate(k as u32);
                }
                return Ok(());
            }
            mr.window
        };
        let mut s = self.slots.write();
        let index = s.slot_of(stag);
        match lookup(&s, stag)?.window {
            Some(w) if Some(w) == window && w.kind == 2 => {
                if w.mr.is_none() {
                    return Err(AccessError::InvalidStag);
                }
                if remote.is_some() && w.qpn != by.qpn {
                    return Err(AccessError::WrongPd);
                }
                unbind(&mut s, index);
                Ok(())
            }
            // A type 1 window is unbound by binding it with length 0.
            _ => Err(AccessError::Access),
        }
    }

    /// A memory window of type `kind` (1 or 2) in protection domain `pd`,
    /// bound to nothing; its STag.
    pub fn alloc_window(&self, pd: u32, kind: u8) -> u32 {
        self.register_ext(MrSpec {
            pd,
            addr: 0,
            len: 0,
            iova: 0,
            access: 0,
            ext: None,
            window: Some(Window {
                kind,
                mr: None,
                qpn: 0,
            }),
        })
    }

    /// Frees the window of STag index `index` (its STag without the key:
    /// a type 2 window's key changes with each bind), unbinding it; false if
    /// there is none.
    pub fn free_window(&self, index: u32) -> bool {
        let mut s = self.slots.write();
        let index = s.slot_of(index << 8);
        if !matches!(s.mrs.get(index), Some(Some(m)) if m.window.is_some()) {
            return false;
        }
        unbind(&mut s, index);
        s.mrs[index] = None;
        s.free.push(index as u32);
        true
    }

    /// Carries out `bind` through a QP of `by`: the window whose new STag is
    /// `stag` (its index, with a new key) is bound to `[to, to+len)` of the
    /// region `mr`, granting `access` (remote read, write, atomic;
    /// `IBV_ACCESS_ZERO_BASED` to address it from 0); length 0 unbinds it. The window must be of type `kind`
    /// and of the QP's protection domain, and a type 2 window unbound; the
    /// region must be of that domain, allow binding and hold the range; a
    /// window granting remote write or atomic access needs a region that
    /// allows local writes. On failure nothing changes.
    pub fn bind_window(&self, by: By, bind: &WindowBind) -> Result<(), AccessError> {
        let &WindowBind {
            stag,
            kind,
            mr,
            to,
            len,
            access,
        } = bind;
        let mut s = self.slots.write();
        let index = s.slot_of(stag);
        let w = match s.mrs.get(index) {
            Some(Some(w)) => w,
            _ => return Err(AccessError::InvalidStag),
        };
        let Some(win) = w.window.filter(|w| w.kind == kind) else {
            return Err(AccessError::InvalidStag);
        };
        if w.pd != by.pd {
            return Err(AccessError::WrongPd);
        }
        if kind == 2 && win.mr.is_some() {
            return Err(AccessError::Access);
        }
        if access & !(WINDOW_RIGHTS | IBV_ACCESS_ZERO_BASED) != 0 {
            return Err(AccessError::Access);
        }
        let bound = if len == 0 {
            None
        } else {
            let r = lookup(&s, mr)?;
            if r.window.is_some() {
                return Err(AccessError::InvalidStag);
            }
            let host = r.check(by, to, len, IBV_ACCESS_MW_BIND, u32::MAX)?;
            let writes = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
            if access & writes != 0 && r.access & IBV_ACCESS_LOCAL_WRITE == 0 {
                return Err(AccessError::Access);
            }
            Some((host, r.access & IBV_ACCESS_ON_DEMAND))
        };
        unbind(&mut s, index);
        s.keys[index] = stag as u8;
        if let Some((host, odp)) = bound {
            let r = s.slot_of(mr);
            if let Some(Some(r)) = s.mrs.get_mut(r) {
                r.windows += 1;
            }
            let Some(Some(w)) = s.mrs.get_mut(index) else {
                unreachable!("looked up above")
            };
            w.addr = host;
            w.iova = if access & IBV_ACCESS_ZERO_BASED != 0 {
                0
            } else {
                to
            };
            w.len = len;
            w.access = (access & WINDOW_RIGHTS) | odp;
            w.window = Some(Window {
                kind,
                mr: Some(mr),
                qpn: by.qpn,
            });
            w.valid.store(true, Ordering::Release);
        }
        if let Some(Some(w)) = s.mrs.get_mut(index) {
            w.key = stag as u8;
        }
        Ok(())
    }

    /// Runs `f` on the host memory `[to, to+len)` of `stag` after every check.
    /// The slice is only valid inside `f`; deregistration waits for it.
    pub fn with_mem<R>(
        &self,
        stag: u32,
        by: By,
        to: u64,
        len: usize,
        need: u32,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<R, AccessError> {
        self.with_mem_allowed(stag, by, to, len, need, u32::MAX, f)
    }

    /// As [`MrTable::with_mem`], for a remote request on a QP whose
    /// `qp_access_flags` are `allowed`.
    #[allow(clippy::too_many_arguments)]
    pub fn with_mem_allowed<R>(
        &self,
        stag: u32,
        by: By,
        to: u64,
        len: usize,
        need: u32,
        allowed: u32,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<R, AccessError> {
        self.with_mr_allowed(stag, by, to, len, need, allowed, |host, _| {
            f(host as *mut u8)
        })
    }

    /// As [`MrTable::with_mem_allowed`], also handing `f` the MR itself.
    #[allow(clippy::too_many_arguments)]
    pub fn with_mr_allowed<R>(
        &self,
        stag: u32,
        by: By,
        to: u64,
        len: usize,
        need: u32,
        allowed: u32,
        f: impl FnOnce(u64, &Mr) -> R,
    ) -> Result<R, AccessError> {
        self.with_reader(|r| {
            let (host, mr) = r.mr(stag, by, to, len, need, allowed)?;
            Ok(f(host as u64, mr))
        })
    }

    /// Every check of an access to `[to, to+len)` of `stag` (a peer's
    /// request, before it is carried out); memory of an on-demand paging MR
    /// must also be mapped now, as the access needs it.
    pub fn check(
        &self,
        stag: u32,
        by: By,
        to: u64,
        len: usize,
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessError> {
        self.with_mr_allowed(stag, by, to, len, need, allowed, |p, mr| {
            let write = need
                & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)
                != 0;
            if mr.odp() && len > 0 && !crate::odp::accessible(p, len as u64, write) {
                return Err(AccessError::Access);
            }
            Ok(())
        })?
    }

    /// Runs `f` on the 64-bit word at `to` (RFC 7306 section 5: the caller has
    /// checked the alignment); `None` if the word is not 8-byte aligned.
    pub fn atomic<R>(
        &self,
        stag: u32,
        by: By,
        to: u64,
        need: u32,
        allowed: u32,
        f: impl FnOnce(&AtomicU64) -> R,
    ) -> Result<Option<R>, AccessError> {
        self.with_mr_allowed(stag, by, to, 8, need, allowed, |p, mr| {
            if !p.is_multiple_of(8) {
                return Ok(None);
            }
            // On-demand paging: the word must be there now (an application
            // that unmaps it while it is the target of an atomic it asked a
            // peer for races with its own request).
            if mr.odp() && !crate::odp::accessible(p, 8, true) {
                return Err(AccessError::Access);
            }
            // SAFETY: the 8 bytes at `p` are inside a registered MR, which stays
            // registered while the table's read lock is held, mapped writable
            // and aligned; other accesses to it are the application's, which an
            // RNIC's atomics are not atomic against anyway (RFC 7306 section 5.4
            // rule 2).
            Ok(Some(f(unsafe { AtomicU64::from_ptr(p as *mut u64) })))
        })?
    }

    /// Copies `data` into `[to, to+len)` of `stag`, after every check.
    #[inline]
    pub fn write(
        &self,
        stag: u32,
        by: By,
        to: u64,
        data: &[u8],
        need: u32,
    ) -> Result<(), AccessError> {
        self.write_allowed(stag, by, to, data, need, u32::MAX)
    }

    /// As [`MrTable::write`], for a remote request on a QP whose `qp_access_flags` are `allowed`.
    #[inline]
    pub fn write_allowed(
        &self,
        stag: u32,
        by: By,
        to: u64,
        data: &[u8],
        need: u32,
        allowed: u32,
    ) -> Result<(), AccessError> {
        self.with_mr_allowed(stag, by, to, data.len(), need, allowed, |p, mr| {
            if mr.odp() {
                return odp_write(p, data);
            }
            // SAFETY: the range lies inside a registered MR (checked under the read lock,
            // which deregistration must wait for); registration is the owner's promise
            // that the memory stays mapped and writable while registered.
            unsafe { copy_to(p as *mut u8, data) };
            Ok(())
        })?
    }

    /// Appends `[to, to+len)` of `stag` to `out`, after every check.
    pub fn read(
        &self,
        stag: u32,
        by: By,
        to: u64,
        len: usize,
        need: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), AccessError> {
        self.with_mr_allowed(stag, by, to, len, need, u32::MAX, |p, mr| {
            let at = out.len();
            out.resize(at + len, 0);
            // SAFETY: `len` bytes at `p` inside `mr`, checked under the read lock held here.
            let r = unsafe { copy_from(p, mr, &mut out[at..]) };
            if r.is_err() {
                out.truncate(at);
            }
            r
        })?
    }

    /// Copies each local buffer of `parts` (key, address, length) in turn
    /// into `out`, after the checks of a local read; the bytes copied. Fails
    /// if any check fails or they do not fit.
    pub fn gather(
        &self,
        by: By,
        parts: impl Iterator<Item = (u32, u64, usize)>,
        out: &mut [u8],
    ) -> Result<usize, AccessError> {
        self.with_reader(|r| {
            let mut at = 0;
            for (key, addr, len) in parts.filter(|p| p.2 > 0) {
                let dst = out.get_mut(at..at + len).ok_or(AccessError::Bounds)?;
                let (src, mr) = r.mr(key, by, addr, len, NEED_NONE, u32::MAX)?;
                // SAFETY: `len` bytes inside a registered MR, which stays
                // registered while the reader lives.
                unsafe { copy_from(src as u64, mr, dst)? };
                at += len;
            }
            Ok(at)
        })
    }

    /// As [`MrTable::gather`] for one SGE: fills `out` from `[to, to+len)`
    /// of `stag`, after every check (nothing to check for no bytes).
    #[inline]
    pub fn read_into(&self, stag: u32, by: By, to: u64, out: &mut [u8]) -> Result<(), AccessError> {
        if out.is_empty() {
            return Ok(());
        }
        self.with_mr_allowed(stag, by, to, out.len(), NEED_NONE, u32::MAX, |p, mr| {
            // SAFETY: `out.len()` bytes inside a registered MR, which stays
            // registered while the read lock is held.
            unsafe { copy_from(p, mr, out) }
        })?
    }

    /// Runs `f` with the table held for reading: memory [`Reader::mem`]
    /// resolves stays registered until `f` returns (deregistration waits).
    pub fn with_reader<R>(&self, f: impl FnOnce(&Reader<'_>) -> R) -> R {
        f(&Reader(self.slots.read()))
    }

    /// Whether the stream may be read straight into the memory of `stag`
    /// ([`Reader::mem`]): not for an on-demand paging MR.
    pub fn in_place(&self, stag: u32) -> bool {
        let s = self.slots.read();
        lookup(&s, stag).is_ok_and(|m| !m.odp())
    }

    pub fn access_of(&self, stag: u32) -> Option<u32> {
        let s = self.slots.read();
        lookup(&s, stag).ok().map(|m| m.access)
    }

    /// Regions and windows of protection domain `pd`.
    pub fn count_for_pd(&self, pd: u32) -> usize {
        let s = self.slots.read();
        s.mrs.iter().flatten().filter(|m| m.pd == pd).count()
    }
}

/// The MR table held for reading (see [`MrTable::with_reader`]).
pub struct Reader<'a>(RwLockReadGuard<'a, Slots>);

impl Reader<'_> {
    /// The host address of `[to, to+len)` of `stag`, after every check (the
    /// MR must grant `need`, and the QP `allowed` for a remote access);
    /// valid while the reader lives. Memory of an on-demand paging MR is
    /// refused: it is only copied through the kernel (see
    /// [`MrTable::in_place`]).
    pub fn mem(
        &self,
        stag: u32,
        by: By,
        to: u64,
        len: usize,
        need: u32,
        allowed: u32,
    ) -> Result<*mut u8, AccessError> {
        match self.mr(stag, by, to, len, need, allowed)? {
            (_, mr) if mr.odp() => Err(AccessError::Access),
            (at, _) => Ok(at),
        }
    }

    /// As [`Reader::mem`], with the MR itself.
    #[inline(always)]
    fn mr(
        &self,
        stag: u32,
        by: By,
        to: u64,
        len: usize,
        need: u32,
        allowed: u32,
    ) -> Result<(*mut u8, &Mr), AccessError> {
        let mr = lookup(&self.0, stag)?;
        let at = mr.check(by, to, len as u64, need, allowed)?;
        // Through a window, the region must still be valid too.
        if let Some(Window { mr: Some(r), .. }) = mr.window {
            if !lookup(&self.0, r)?.valid.load(Ordering::Acquire) {
                return Err(AccessError::InvalidStag);
            }
        }
        Ok((at as *mut u8, mr))
    }

    /// The spans of registered memory `parts` (key, address, length) cover,
    /// each checked for `need`, appended to `out`; they must hold `n` bytes
    /// in all. False, with nothing appended, if some lie in an on-demand
    /// paging MR, which the stream may not reach in place.
    pub fn spans(
        &self,
        by: By,
        parts: impl Iterator<Item = (u32, u64, usize)>,
        n: usize,
        need: u32,
        out: &mut Vec<Span>,
    ) -> Result<bool, AccessError> {
        let mut found = 0;
        let start = out.len();
        for (key, addr, len) in parts {
            if self.mr(key, by, addr, len, need, u32::MAX)?.1.odp() {
                out.truncate(start);
                return Ok(false);
            }
            out.push(Span {
                stag: key,
                to: addr,
                len: len as u32,
                need,
            });
            found += len;
        }
        if found != n {
            return Err(AccessError::Bounds);
        }
        Ok(true)
    }
}

/// Copies `src` to `dst`. The payloads of small messages are copied in
/// line, by a pair of overlapping loads and stores, which costs less than a
/// call to `memcpy` for them; longer ones through `memcpy`.
///
/// # Safety
/// `dst` is valid for `src.len()` bytes of writes and does not overlap `src`.
#[inline(always)]
unsafe fn copy_to(dst: *mut u8, src: &[u8]) {
    let (s, n) = (src.as_ptr(), src.len());
    // SAFETY: every access lies inside the first `n` bytes of `s` and `dst`.
    unsafe {
        if n > 16 {
            std::ptr::copy_nonoverlapping(s, dst, n);
        } else if n >= 8 {
            let (a, b) = (
                s.cast::<u64>().read_unaligned(),
                s.add(n - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(a);
            dst.add(n - 8).cast::<u64>().write_unaligned(b);
        } else if n >= 4 {
            let (a, b) = (
                s.cast::<u32>().read_unaligned(),
                s.add(n - 4).cast::<u32>().read_unaligned(),
            );
            dst.cast::<u32>().write_unaligned(a);
            dst.add(n - 4).cast::<u32>().write_unaligned(b);
        } else if n >= 2 {
            let (a, b) = (
                s.cast::<u16>().read_unaligned(),
                s.add(n - 2).cast::<u16>().read_unaligned(),
            );
            dst.cast::<u16>().write_unaligned(a);
            dst.add(n - 2).cast::<u16>().write_unaligned(b);
        } else if n == 1 {
            *dst = *s;
        }
    }
}

/// Copies `data` to `p` in an on-demand paging MR (kept out of line: the
/// common write goes to pinned memory).
#[cold]
#[inline(never)]
fn odp_write(p: u64, data: &[u8]) -> Result<(), AccessError> {
    crate::odp::write(p, data)
        .then_some(())
        .ok_or(AccessError::Access)
}

/// Fills `out` from `p` in `mr`: in line from pinned memory, through the
/// page check of an on-demand paging MR otherwise.
///
/// # Safety
/// The `out.len()` bytes at `p` lie inside `mr`, which stays registered for
/// the call (the caller holds the table's read lock).
#[inline(always)]
unsafe fn copy_from(p: u64, mr: &Mr, out: &mut [u8]) -> Result<(), AccessError> {
    if mr.odp() {
        return odp_read(p, out);
    }
    // SAFETY: per the function contract.
    unsafe {
        copy_to(
            out.as_mut_ptr(),
            std::slice::from_raw_parts(p as *const u8, out.len()),
        )
    };
    Ok(())
}

/// Fills `out` from `p` in an on-demand paging MR (out of line, as [`odp_write`]).
#[cold]
#[inline(never)]
fn odp_read(p: u64, out: &mut [u8]) -> Result<(), AccessError> {
    crate::odp::read(p, out)
        .then_some(())
        .ok_or(AccessError::Access)
}

/// Unbinds the window at `index`, if it is bound: it grants nothing, and its
/// region may go.
fn unbind(s: &mut Slots, index: usize) {
    let Some(Some(w)) = s.mrs.get_mut(index) else {
        return;
    };
    let Some(win) = w.window.as_mut() else {
        return;
    };
    let Some(mr) = win.mr.take() else { return };
    w.valid.store(false, Ordering::Release);
    w.len = 0;
    w.access = 0;
    let r = s.slot_of(mr);
    if let Some(Some(r)) = s.mrs.get_mut(r) {
        r.windows -= 1;
    }
}

#[inline(always)]
fn lookup(s: &Slots, stag: u32) -> Result<&Mr, AccessError> {
    match s.mrs.get(s.slot_of(stag)) {
        Some(Some(mr)) if mr.key == stag as u8 => Ok(mr),
        _ => Err(AccessError::InvalidStag),
    }
}

/// Access flags xiw understands at registration.
/// The commit draft's rights (rdma-core 45+ `IBV_ACCESS_FLUSH_*`) and xiw's
/// own Verify right, as the engine defines them.
pub use xiw_engine::queue1::access::{
    FLUSH_GLOBAL as ACCESS_FLUSH_GLOBAL, FLUSH_PERSISTENT as ACCESS_FLUSH_PERSISTENT,
    VERIFY as ACCESS_VERIFY,
};

pub const SUPPORTED_ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
    | IBV_ACCESS_ON_DEMAND
    | IBV_ACCESS_MW_BIND
    // A hint that the memory is huge pages: nothing to do with it.
    | IBV_ACCESS_HUGETLB
    | ACCESS_FLUSH_GLOBAL
    | ACCESS_FLUSH_PERSISTENT
    | IBV_ACCESS_RELAXED_ORDERING;

#[cfg(test)]
mod tests {
    use super::*;

    /// QP 0x100 of PD 1, QP 0x200 of PD 1, QP 0x300 of PD 2.
    const P1: By = By { pd: 1, qpn: 0x100 };
    const P1B: By = By { pd: 1, qpn: 0x200 };
    const P2: By = By { pd: 2, qpn: 0x300 };

    /// A replacement computed from a view applies only while the MR is still
    /// what the view says, and keeps the STag.
    #[test]
    fn replace_applies_only_to_the_mr_it_was_made_for() {
        let t = MrTable::default();
        let spec = |addr, access| MrSpec {
            pd: 1,
            addr,
            len: 64,
            iova: addr,
            access,
            ext: None,
            window: None,
        };
        let stag = t.register(1, 0x1000, 64, 0x1000, IBV_ACCESS_LOCAL_WRITE);
        let old = t.view(stag).expect("registered");
        assert_eq!((old.addr, old.access), (0x1000, IBV_ACCESS_LOCAL_WRITE));
        assert_eq!(
            t.replace(stag, &old, spec(0x2000, IBV_ACCESS_LOCAL_WRITE)),
            Some(true)
        );
        assert_eq!(
            t.view(stag).map(|v| v.addr),
            Some(0x2000),
            "same STag, new place"
        );
        // `old` no longer describes it: a change made from it is refused.
        assert_eq!(t.replace(stag, &old, spec(0x3000, 0)), Some(false));
        assert_eq!(t.view(stag).map(|v| v.addr), Some(0x2000));
        assert_eq!(t.deregister(stag), Ok(()));
        assert_eq!(t.view(stag), None);
        assert_eq!(t.replace(stag, &old, spec(0x3000, 0)), None);
    }

    #[test]
    fn stag_checks() {
        let t = MrTable::default();
        let mut buf = vec![0u8; 64];
        let addr = buf.as_mut_ptr() as u64;
        let stag = t.register(
            1,
            addr,
            64,
            0x1000,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
        );
        assert_ne!(stag >> 8, 0);
        t.write(stag, P1, 0x1010, b"abc", IBV_ACCESS_REMOTE_WRITE)
            .unwrap();
        assert_eq!(&buf[16..19], b"abc");
        assert_eq!(
            t.write(stag, P2, 0x1010, b"x", 0),
            Err(AccessError::WrongPd)
        );
        assert_eq!(
            t.write(stag, P1, 0x103f, b"xy", 0),
            Err(AccessError::Bounds)
        );
        assert_eq!(t.write(stag, P1, 0xfff, b"x", 0), Err(AccessError::Bounds));
        assert_eq!(
            t.write(stag, P1, u64::MAX, b"xy", 0),
            Err(AccessError::Wrap)
        );
        assert_eq!(
            t.write(stag, P1, 0x1000, b"x", IBV_ACCESS_REMOTE_READ),
            Err(AccessError::Access)
        );
        assert_eq!(
            t.write(stag ^ 1, P1, 0x1000, b"x", 0),
            Err(AccessError::InvalidStag)
        );
        t.invalidate(stag, P1).unwrap();
        assert_eq!(
            t.write(stag, P1, 0x1000, b"x", 0),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(t.deregister(stag), Ok(()));
        let again = t.register(1, addr, 64, addr, 0);
        assert_ne!(again, stag, "a reused slot gets a new key");
        assert_eq!(
            t.write(stag, P1, 0x1000, b"x", 0),
            Err(AccessError::InvalidStag)
        );
    }

    /// STags are hard to predict (RFC 5040 section 8.1.1 rule 8): two tables
    /// hand out other STags for the same registrations, none has index 0,
    /// and a slot registered again gets another key.
    #[test]
    fn stags_are_hard_to_predict() {
        let (a, b) = (MrTable::default(), MrTable::default());
        let sa: Vec<u32> = (0..8)
            .map(|_| a.register(1, 0x1000, 64, 0x1000, 0))
            .collect();
        let sb: Vec<u32> = (0..8)
            .map(|_| b.register(1, 0x1000, 64, 0x1000, 0))
            .collect();
        assert_ne!(sa, sb);
        assert!(sa.iter().chain(&sb).all(|s| s >> 8 != 0));
        for &s in &sa {
            assert_eq!(a.deregister(s), Ok(()));
            let again = a.register(1, 0x1000, 64, 0x1000, 0);
            assert_eq!(again >> 8, s >> 8, "the slot is reused");
            assert_ne!(again, s, "with another key");
            assert!(a.view(s).is_none(), "the old STag misses");
        }
    }

    /// A peer may end a region enabled for remote access only if no other
    /// stream may use it (RFC 5040 section 8.1.1 rule 7); one without remote
    /// access it may end.
    #[test]
    fn remote_invalidation_of_regions() {
        let t = MrTable::default();
        let remote = t.register(
            1,
            0x1000,
            64,
            0x1000,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
        );
        let local = t.register(1, 0x1000, 64, 0x1000, IBV_ACCESS_LOCAL_WRITE);
        let mut asked = 0;
        assert_eq!(
            t.invalidate_remote(remote, P1, &mut || {
                asked += 1;
                true
            }),
            Err(AccessError::WrongPd)
        );
        assert_eq!(asked, 1);
        assert!(t.view(remote).is_some());
        t.invalidate_remote(local, P1, &mut || true).unwrap();
        assert_eq!(
            t.invalidate_remote(remote, P2, &mut || false),
            Err(AccessError::WrongPd),
            "another PD's"
        );
        t.invalidate_remote(remote, P1, &mut || false).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            t.read(remote, P1, 0x1000, 1, IBV_ACCESS_REMOTE_READ, &mut out),
            Err(AccessError::InvalidStag)
        );
    }

    /// Windows: bound to part of a region with rights of their own, for
    /// peers only; a type 2 window for the QP it was bound through, unbound
    /// by invalidation; a region with bound windows stays registered.
    #[test]
    fn memory_windows() {
        let t = MrTable::default();
        let mut buf = vec![0u8; 256];
        let addr = buf.as_mut_ptr() as u64;
        let rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
        let mr = t.register(1, addr, 256, 0x1000, rw);
        let plain = t.register(1, addr, 256, 0x1000, IBV_ACCESS_LOCAL_WRITE);
        let w1 = t.alloc_window(1, 1);
        let w2 = t.alloc_window(1, 2);
        let next = |stag: u32| stag & !0xff | (stag + 1) & 0xff;
        let write = IBV_ACCESS_REMOTE_WRITE;
        assert_eq!(
            t.write(w1, P1, 0x1000, b"x", write),
            Err(AccessError::InvalidStag),
            "unbound"
        );
        // Type 1: bound to [0x1040, 0x1080) for remote writes.
        let b1 = next(w1);
        t.bind_window(
            P1,
            &WindowBind {
                stag: b1,
                kind: 1,
                mr,
                to: 0x1040,
                len: 64,
                access: write,
            },
        )
        .unwrap();
        t.write(b1, P1B, 0x1040, b"abc", write).unwrap();
        assert_eq!(&buf[0x40..0x43], b"abc");
        assert_eq!(
            t.write(w1, P1, 0x1040, b"x", write),
            Err(AccessError::InvalidStag),
            "old key"
        );
        assert_eq!(
            t.write(b1, P1, 0x1030, b"x", write),
            Err(AccessError::Bounds)
        );
        assert_eq!(
            t.write(b1, P1, 0x107f, b"xy", write),
            Err(AccessError::Bounds)
        );
        assert_eq!(
            t.write(b1, P2, 0x1040, b"x", write),
            Err(AccessError::WrongPd)
        );
        let mut out = Vec::new();
        assert_eq!(
            t.read(b1, P1, 0x1040, 1, IBV_ACCESS_REMOTE_READ, &mut out),
            Err(AccessError::Access),
            "no read right"
        );
        assert_eq!(
            t.read(b1, P1, 0x1040, 1, NEED_NONE, &mut out),
            Err(AccessError::InvalidStag),
            "not a local key"
        );
        assert_eq!(t.deregister(mr).map_err(|e| e.errno()), Err(libc::EBUSY));
        assert_eq!(t.view(mr).map(|v| v.windows), Some(1));
        // Refused binds: another type, a region without the bind right, a
        // range outside it, rights a read-only region cannot back.
        assert_eq!(
            t.bind_window(
                P1,
                &WindowBind {
                    stag: next(w2),
                    kind: 1,
                    mr,
                    to: 0x1000,
                    len: 8,
                    access: write
                }
            ),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(
            t.bind_window(
                P1,
                &WindowBind {
                    stag: next(b1),
                    kind: 1,
                    mr: plain,
                    to: 0x1000,
                    len: 8,
                    access: write
                }
            ),
            Err(AccessError::Access)
        );
        assert_eq!(
            t.bind_window(
                P1,
                &WindowBind {
                    stag: next(b1),
                    kind: 1,
                    mr,
                    to: 0x10f0,
                    len: 32,
                    access: write
                }
            ),
            Err(AccessError::Bounds)
        );
        assert_eq!(
            t.bind_window(
                P2,
                &WindowBind {
                    stag: next(b1),
                    kind: 1,
                    mr,
                    to: 0x1000,
                    len: 8,
                    access: write
                }
            ),
            Err(AccessError::WrongPd)
        );
        let ro = t.register(1, addr, 256, 0x1000, IBV_ACCESS_MW_BIND);
        assert_eq!(
            t.bind_window(
                P1,
                &WindowBind {
                    stag: next(b1),
                    kind: 1,
                    mr: ro,
                    to: 0x1000,
                    len: 8,
                    access: write
                }
            ),
            Err(AccessError::Access)
        );
        t.write(b1, P1, 0x1040, b"d", write).unwrap();
        // A type 1 window cannot be invalidated; a bind of length 0 unbinds it.
        assert_eq!(t.invalidate(b1, P1), Err(AccessError::Access));
        let u1 = next(b1);
        t.bind_window(
            P1,
            &WindowBind {
                stag: u1,
                kind: 1,
                mr,
                to: 0,
                len: 0,
                access: 0,
            },
        )
        .unwrap();
        assert_eq!(
            t.write(u1, P1, 0x1040, b"x", write),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(t.view(mr).map(|v| v.windows), Some(0));
        // Type 2, zero-based: for the QP it was bound through only.
        let b2 = next(w2);
        t.bind_window(
            P1,
            &WindowBind {
                stag: b2,
                kind: 2,
                mr,
                to: 0x1080,
                len: 16,
                access: write | IBV_ACCESS_ZERO_BASED,
            },
        )
        .unwrap();
        t.write(b2, P1, 4, b"z", write).unwrap();
        assert_eq!(buf[0x84], b'z');
        assert_eq!(t.write(b2, P1B, 4, b"z", write), Err(AccessError::WrongPd));
        assert_eq!(
            t.bind_window(
                P1,
                &WindowBind {
                    stag: next(b2),
                    kind: 2,
                    mr,
                    to: 0x1080,
                    len: 16,
                    access: write
                }
            ),
            Err(AccessError::Access),
            "bound already"
        );
        // The region invalidated: nothing through the window either.
        t.invalidate(mr, P1).unwrap();
        assert_eq!(
            t.write(b2, P1, 4, b"z", write),
            Err(AccessError::InvalidStag)
        );
        // Remote invalidation must come through the QP it was bound through.
        assert_eq!(
            t.invalidate_remote(b2, P1B, &mut || false),
            Err(AccessError::WrongPd)
        );
        t.invalidate_remote(b2, P1, &mut || false).unwrap();
        assert_eq!(
            t.invalidate_remote(b2, P1, &mut || false),
            Err(AccessError::InvalidStag)
        );
        assert_eq!(t.view(mr).map(|v| v.windows), Some(0));
        assert_eq!(t.deregister(mr), Ok(()));
        assert_eq!(
            t.deregister(w2).map_err(|e| e.errno()),
            Err(libc::EINVAL),
            "a window is no region"
        );
        assert!(t.free_window(b2 >> 8));
        assert!(!t.free_window(b2 >> 8));
        assert!(!t.free_window(mr >> 8), "a region is no window");
        assert!(t.free_window(u1 >> 8));
        assert_eq!(t.count_for_pd(1), 2);
    }
}
