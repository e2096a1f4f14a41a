//! Protection domains and memory registration.

use super::*;

pub(super) unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard(ptr::null_mut(), || {
        if ctx.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: ctx is ours.
        let sh = unsafe { shared(ctx) };
        let id = sh.next_id();
        // Kernel mode: the kernel's PD too, which its QPs and SRQs name.
        let kernel = match sh.kernel.map(|k| k.alloc_pd()).transpose() {
            Ok(k) => k,
            Err(e) => return null_err(e.errno()),
        };
        let pd = Box::new(XiwPd {
            ibv: ibv_pd {
                context: ctx,
                handle: kernel.unwrap_or(id),
            },
            id,
            parent: ptr::null_mut(),
            td: ptr::null_mut(),
            children: AtomicU32::new(0),
            uses: AtomicU32::new(0),
            kernel,
        });
        Box::into_raw(pd) as *mut ibv_pd
    })
}

/// `ibv_alloc_td`: a thread domain. xiw's queues keep their locks whatever
/// the domain (uncontended, they cost a few instructions), so a QP in one
/// behaves as any other.
pub(super) unsafe extern "C" fn alloc_td(
    ctx: *mut ibv_context,
    attr: *mut ibv_td_init_attr,
) -> *mut ibv_td {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller's attributes, if given.
        if ctx.is_null() || attr.is_null() || unsafe { (*attr).comp_mask } != 0 {
            return null_err(libc::EINVAL);
        }
        let td = Box::new(XiwTd {
            ibv: ibv_td { context: ctx },
            users: AtomicU32::new(0),
        });
        Box::into_raw(td) as *mut ibv_td
    })
}

pub(super) unsafe extern "C" fn dealloc_td(td: *mut ibv_td) -> i32 {
    guard(libc::EIO, || {
        if td.is_null() {
            return libc::EINVAL;
        }
        let t = td as *mut XiwTd;
        // SAFETY: every ibv_td handed out is the first member of an XiwTd.
        if unsafe { (*t).users.load(Ordering::Acquire) } > 0 {
            return libc::EBUSY;
        }
        // SAFETY: allocated by alloc_td with Box; handed back once.
        drop(unsafe { Box::from_raw(t) });
        0
    })
}

/// `ibv_alloc_parent_domain`: a PD that stands for `attr.pd` wherever a PD
/// goes (MRs, QPs, SRQs, CQs made with `IBV_CQ_INIT_ATTR_MASK_PD`), with a
/// thread domain and the application's allocators. The allocators are kept
/// but not called: xiw's queues are rings it maps itself, the memory the
/// kernel module shares in kernel mode.
pub(super) unsafe extern "C" fn alloc_parent_domain(
    ctx: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    guard(ptr::null_mut(), || {
        if ctx.is_null() || attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        let known = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
        if a.comp_mask & !known != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        // SAFETY: a PD of this context, as the verbs require.
        if a.pd.is_null() || unsafe { (*a.pd).context } != ctx {
            return null_err(libc::EINVAL);
        }
        // SAFETY: ours.
        let parent = unsafe { pd_of(a.pd) };
        if !parent.parent.is_null() {
            // A parent domain is made on a plain PD.
            return null_err(libc::EINVAL);
        }
        let td = a.td as *mut XiwTd;
        // SAFETY: a thread domain of this context, if given.
        if !td.is_null() && unsafe { (*td).ibv.context } != ctx {
            return null_err(libc::EINVAL);
        }
        // SAFETY: ctx is ours.
        let sh = unsafe { shared(ctx) };
        parent.children.fetch_add(1, Ordering::AcqRel);
        if !td.is_null() {
            // SAFETY: as above.
            unsafe { (*td).users.fetch_add(1, Ordering::AcqRel) };
        }
        let pd = Box::new(XiwPd {
            ibv: ibv_pd {
                context: ctx,
                handle: sh.next_id(),
            },
            id: parent.id,
            parent: a.pd,
            td,
            children: AtomicU32::new(0),
            uses: AtomicU32::new(0),
            kernel: parent.kernel,
        });
        Box::into_raw(pd) as *mut ibv_pd
    })
}

pub(super) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> i32 {
    guard(libc::EIO, || {
        if pd.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: pd is ours.
        let (p, sh) = unsafe { (pd_of(pd), shared((*pd).context)) };
        if !p.parent.is_null() {
            if p.uses.load(Ordering::Acquire) > 0 {
                return libc::EBUSY;
            }
            // A parent domain: its PD and thread domain are free of it.
            // SAFETY: the PD and thread domain outlive their parent domains.
            unsafe {
                pd_of(p.parent).children.fetch_sub(1, Ordering::AcqRel);
                if !p.td.is_null() {
                    (*p.td).users.fetch_sub(1, Ordering::AcqRel);
                }
                drop(Box::from_raw(pd as *mut XiwPd));
            }
            return 0;
        }
        if p.children.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        let id = p.id;
        let (mrs, qps) = (sh.mrs.count_for_pd(id), sh.qps.pd_has_qps(id));
        if mrs > 0 || qps {
            crate::log::debug(
                &sh.log,
                format_args!("dealloc_pd: still in use ({mrs} MRs, QPs: {qps})"),
            );
            return libc::EBUSY;
        }
        if let (Some(k), Some(h)) = (sh.kernel, p.kernel) {
            if let Err(e) = k.dealloc_pd(h) {
                return e.errno();
            }
        }
        // SAFETY: allocated by alloc_pd with Box; the application hands it back once.
        drop(unsafe { Box::from_raw(pd as *mut XiwPd) });
        0
    })
}

pub(super) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: i32,
) -> *mut ibv_mr {
    guard(ptr::null_mut(), || {
        // SAFETY: the caller's arguments, as libibverbs passes them.
        match unsafe { register_mr(pd, addr, len, iova, access as u32, None) } {
            Ok(mr) => mr,
            Err(e) => null_err(e.errno()),
        }
    })
}

/// Registers memory, with a Verify hash for the direct verbs' registration.
/// On failure: why (also logged).
///
/// # Safety
/// `pd` is null or one of this provider's protection domains.
pub(crate) unsafe fn register_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
    hash: Option<crate::persist::Hash>,
) -> Result<*mut ibv_mr, Error> {
    if pd.is_null() {
        return Err(Error::invalid("no protection domain"));
    }
    // SAFETY: pd is ours.
    let (p, ctx) = unsafe { (pd_of(pd), (*pd).context) };
    // SAFETY: as above.
    let sh = unsafe { shared(ctx) };
    let refuse = |e: Error| {
        crate::log::debug(&sh.log, format_args!("reg_mr: {e}"));
        Err(e)
    };
    let (access, ext) = match checked(sh, addr as u64, len as u64, access, hash) {
        Ok(v) => v,
        Err(e) => return refuse(e),
    };
    let internal = if hash.is_some() {
        access | mem::ACCESS_VERIFY
    } else {
        access
    };
    let stag = sh.mrs.register_ext(mem::MrSpec {
        pd: p.id,
        addr: addr as u64,
        len: len as u64,
        iova,
        access: internal,
        ext,
        window: None,
    });
    let kernel = match kernel_mr(sh, p.kernel, addr as u64, len as u64, access, stag) {
        Ok(h) => h,
        Err(e) => {
            let _ = sh.mrs.deregister(stag);
            return refuse(Error::Kernel {
                what: "the region",
                errno: e.errno(),
            });
        }
    };
    let mr = Box::new(XiwMr {
        vmr: verbs_mr {
            ibv_mr: ibv_mr {
                context: ctx,
                pd,
                addr,
                length: len,
                handle: stag,
                lkey: stag,
                rkey: stag,
            },
            mr_type: IBV_MR_TYPE_MR,
            access: access as i32,
        },
        dm: ptr::null_mut(),
        kernel,
    });
    // SAFETY: pd is ours.
    unsafe { domain_use(pd, true) };
    Ok(Box::into_raw(mr) as *mut ibv_mr)
}

/// Kernel mode: the kernel's object for a region of the PD whose kernel
/// handle is `pd` (`rdma resource`; the kernel's PD stays in use while it
/// lives); none in standalone mode, and none for an implicit on-demand
/// paging region, which is no range.
fn kernel_mr(
    sh: &Shared,
    pd: Option<u32>,
    addr: u64,
    len: u64,
    access: u32,
    stag: u32,
) -> Result<Option<u32>, Error> {
    let (Some(k), Some(pd)) = (sh.kernel, pd) else {
        return Ok(None);
    };
    if len == u64::MAX || addr.checked_add(len).is_none() {
        return Ok(None);
    }
    // The module places RDMA Writes and Read Responses into a plain
    // region that may be written (not one paged on demand, nor one on
    // persistent media or with a Verify hash, whose writes the provider
    // follows itself).
    let plain = sh.mrs.plain_iova(stag);
    let place = access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) != 0
        && access & IBV_ACCESS_ON_DEMAND == 0
        && plain.is_some();
    let req = xiw_abi::kernel::RegMrReq {
        stag,
        flags: if place {
            xiw_abi::kernel::REG_MR_PLACE
        } else {
            0
        },
        iova: plain.unwrap_or(addr),
    };
    let h = k.reg_mr(pd, addr, len, access, req)?;
    if place {
        sh.mrs.set_kernel_place(stag, h);
    }
    Ok(Some(h))
}

/// The access flags a registration keeps, and the MR's flush/verify attributes.
type Checked = (u32, Option<Box<mem::MrExt>>);

/// Checks the access flags and the range of a registration.
fn checked(
    sh: &Shared,
    addr: u64,
    len: u64,
    access: u32,
    hash: Option<crate::persist::Hash>,
) -> Result<Checked, Error> {
    // Bits from IBV_ACCESS_OPTIONAL_FIRST up may be ignored by a provider.
    let access = access & (IBV_ACCESS_OPTIONAL_FIRST - 1);
    if access & !mem::SUPPORTED_ACCESS != 0 {
        return Err(Error::unsupported(format!(
            "unsupported access flags {access:#x}"
        )));
    }
    let wants_write = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if access & wants_write != 0 && access & IBV_ACCESS_LOCAL_WRITE == 0 {
        return Err(Error::invalid(
            "remote write or atomic access needs local write access",
        ));
    }
    let odp = access & IBV_ACCESS_ON_DEMAND != 0;
    // Implicit on-demand paging: the whole address space (iova = address).
    let implicit = odp && addr == 0 && len == u64::MAX;
    if (addr == 0 && len > 0 && !implicit) || addr.checked_add(len).is_none() {
        return Err(Error::invalid(format!("bad range {addr:#x}+{len}")));
    }
    let durable = mem::ACCESS_FLUSH_GLOBAL | mem::ACCESS_FLUSH_PERSISTENT;
    if odp && (access & durable != 0 || hash.is_some()) {
        // Flush and Verify reach the memory through a pointer (the medium).
        return Err(Error::unsupported(
            "on-demand paging memory cannot be flushable or verifiable",
        ));
    }
    let writable = access & (IBV_ACCESS_LOCAL_WRITE | wants_write) != 0;
    // On-demand paging memory need not be mapped now: every access checks.
    if len > 0 && !odp && !mapped(addr, len, writable) {
        return Err(Error::NotMapped(
            format!("{addr:#x}+{len} is not mapped with the needed protection").into(),
        ));
    }
    Ok((access, mr_ext(sh, addr, len, access, hash)?))
}

/// `ibv_rereg_mr`: new translation, PD or access flags for an MR, which
/// keeps its keys. On failure the MR is unchanged, errno is set and the
/// errno is returned (libibverbs reports IBV_REREG_MR_ERR_CMD).
pub(super) unsafe extern "C" fn rereg_mr(
    vmr: *mut verbs_mr,
    flags: i32,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: i32,
) -> i32 {
    guard(libc::EIO, || {
        // SAFETY: the caller's arguments, as libibverbs passes them.
        let r = unsafe {
            rereg(
                vmr,
                flags as u32,
                pd,
                addr as u64,
                len as u64,
                access as u32,
            )
        };
        match r {
            Ok(()) => {
                if flags as u32 & IBV_REREG_MR_CHANGE_PD != 0 {
                    // SAFETY: both are PDs of this provider; libibverbs moves
                    // `mr->pd` to the new one after this returns.
                    unsafe {
                        domain_use((*vmr).ibv_mr.pd, false);
                        domain_use(pd, true);
                    }
                }
                0
            }
            Err(e) => {
                set_errno(e.errno());
                e.errno()
            }
        }
    })
}

/// # Safety
/// `vmr` is one of this provider's MRs; `pd` is null or one of its PDs.
unsafe fn rereg(
    vmr: *mut verbs_mr,
    flags: u32,
    pd: *mut ibv_pd,
    addr: u64,
    len: u64,
    access: u32,
) -> Result<(), Error> {
    if vmr.is_null() {
        return Err(Error::invalid("no memory region"));
    }
    if flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
        return Err(Error::invalid("unknown rereg flags"));
    }
    // SAFETY: vmr is ours.
    if !unsafe { (*(vmr as *mut XiwMr)).dm }.is_null() {
        return Err(Error::invalid(
            "device memory MRs stay on their device memory",
        ));
    }
    // SAFETY: vmr is ours.
    let (stag, ctx) = unsafe { ((*vmr).ibv_mr.lkey, (*vmr).ibv_mr.context) };
    // SAFETY: as above.
    let sh = unsafe { shared(ctx) };
    let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        if pd.is_null() {
            return Err(Error::invalid("IBV_REREG_MR_CHANGE_PD names no PD"));
        }
        // SAFETY: pd is ours, per the function contract.
        Some(unsafe { pd_of(pd).id })
    } else {
        None
    };
    // The checks (the process's mappings, the medium behind the memory) run
    // without the MR table locked; the change applies only to the MR they
    // were made for.
    let kept = loop {
        let old = sh
            .mrs
            .view(stag)
            .ok_or(Error::invalid("the MR is no longer registered"))?;
        if old.windows > 0 {
            // They would lose their memory.
            return Err(Error::Busy("memory windows are bound to the region".into()));
        }
        // A new translation is tagged from its own address, as registration does.
        let (addr, len, iova) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            (addr, len, addr)
        } else {
            (old.addr, old.len, old.iova)
        };
        let internal = old.access & mem::ACCESS_VERIFY;
        let access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            access
        } else {
            old.access & !mem::ACCESS_VERIFY
        };
        let (access, ext) = checked(sh, addr, len, access, old.hash).inspect_err(|e| {
            crate::log::debug(&sh.log, format_args!("rereg_mr: {e}"));
        })?;
        let spec = mem::MrSpec {
            pd: new_pd.unwrap_or(old.pd),
            addr,
            len,
            iova,
            access: access | internal,
            ext,
            window: None,
        };
        match sh.mrs.replace(stag, &old, spec) {
            None => return Err(Error::invalid("the MR is no longer registered")),
            Some(true) => break access,
            Some(false) => continue,
        }
    };
    // SAFETY: vmr is ours; libibverbs updates pd, addr and length itself.
    unsafe { (*vmr).access = kept as i32 };
    // Kernel mode: the kernel's object follows (its PD, range and rights).
    // SAFETY: vmr is ours.
    let x = unsafe { &mut *(vmr as *mut XiwMr) };
    if let (Some(k), Some(h)) = (sh.kernel, x.kernel) {
        let _ = k.dereg_mr(h);
        let pd_k = if pd.is_null() || flags & IBV_REREG_MR_CHANGE_PD == 0 {
            // SAFETY: the MR's current PD, ours.
            unsafe { pd_of(x.vmr.ibv_mr.pd).kernel }
        } else {
            // SAFETY: pd is ours, per the function contract.
            unsafe { pd_of(pd).kernel }
        };
        let now = sh.mrs.view(stag);
        x.kernel = now.and_then(|v| {
            kernel_mr(sh, pd_k, v.addr, v.len, kept, stag)
                .ok()
                .flatten()
        });
    }
    Ok(())
}

/// The flush/verify attributes of a new MR: the medium behind it, found now,
/// for flush-to-persistence and Verify (draft-talpey-rdma-commit section 2.4:
/// memory that cannot be made durable is refused at registration).
pub(super) fn mr_ext(
    sh: &Shared,
    addr: u64,
    len: u64,
    access: u32,
    hash: Option<crate::persist::Hash>,
) -> Result<Option<Box<mem::MrExt>>, Error> {
    let flush = access & (mem::ACCESS_FLUSH_GLOBAL | mem::ACCESS_FLUSH_PERSISTENT);
    if (flush != 0 || hash.is_some()) && !sh.cfg.extensions {
        return Err(Error::unsupported(
            "flushable and verifiable memory need the extensions (XIW_EXTENSIONS=0)",
        ));
    }
    let persistent = access & mem::ACCESS_FLUSH_PERSISTENT != 0;
    if !(persistent || hash.is_some()) || len == 0 {
        return Ok(None);
    }
    let media = crate::persist::Media::probe(addr, len)?;
    if let Some(why) = persistent.then(|| media.why_not_durable()).flatten() {
        return Err(Error::Media(format!(
            "IBV_ACCESS_FLUSH_PERSISTENT: {why}; map a file on a persistent file system \
             (MAP_SHARED) instead"
        )));
    }
    Ok(Some(Box::new(mem::MrExt { media, hash })))
}

/// True if `[addr, addr+len)` is mapped readable (and writable if asked), as
/// pinning would find it; later accesses rely on this.
pub(super) fn mapped(addr: u64, len: u64, writable: bool) -> bool {
    match crate::maps::read() {
        Ok(maps) => crate::maps::covered(&maps, addr, len, writable),
        // Without /proc the check cannot be made; the registration goes ahead.
        Err(_) => true,
    }
}

/// `IBV_ADVISE_MR_FLAG_FLUSH`: the prefetch is done when the call returns.
const ADVISE_FLUSH: u32 = 1 << 0;

/// `ibv_advise_mr`: prefetch the pages of on-demand paging memory (for
/// reading, or for writing), or, without faults, only validate the request
/// (xiw holds no translation that could be primed). A synchronous prefetch
/// (`IBV_ADVISE_MR_FLAG_FLUSH`) reports memory that is not mapped
/// (`EFAULT`); an asynchronous one, like an RNIC's, does not. Returns 0 or
/// an errno.
pub(super) unsafe extern "C" fn advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> i32 {
    guard(libc::EIO, || {
        let write = match advice {
            IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH | IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT => {
                false
            }
            IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE => true,
            _ => return libc::EOPNOTSUPP,
        };
        if flags & !ADVISE_FLUSH != 0 {
            return libc::EOPNOTSUPP;
        }
        if pd.is_null() || sg_list.is_null() || num_sge == 0 {
            return libc::EINVAL;
        }
        // SAFETY: pd is ours; the caller passes `num_sge` SGEs.
        let (p, sh, sges) = unsafe {
            (
                pd_of(pd),
                shared((*pd).context),
                std::slice::from_raw_parts(sg_list, num_sge as usize),
            )
        };
        // Every SGE is checked before any page is brought in.
        let mut ranges = Vec::with_capacity(sges.len());
        let by = mem::By { pd: p.id, qpn: 0 };
        let needed = if write { IBV_ACCESS_LOCAL_WRITE } else { 0 };
        for s in sges {
            // The checks of a local access (key, PD, bounds, rights; a
            // window's key is no local key); then it must be ODP memory.
            let len = s.length as usize;
            match sh
                .mrs
                .with_mr_allowed(s.lkey, by, s.addr, len, needed, u32::MAX, |host, mr| {
                    (host, mr.odp())
                }) {
                Ok((host, true)) => ranges.push((host, len as u64)),
                _ => return libc::EINVAL,
            }
        }
        if advice == IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT {
            return 0;
        }
        for (addr, len) in ranges {
            if let Err(e) = crate::odp::populate(addr, len, write) {
                let e = e.errno();
                crate::log::debug(
                    &sh.log,
                    format_args!("advise_mr: {addr:#x}+{len} not brought in: errno {e}"),
                );
                if flags & ADVISE_FLUSH != 0 {
                    return e;
                }
            }
        }
        0
    })
}

pub(super) unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> i32 {
    guard(libc::EIO, || {
        if vmr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: vmr is ours.
        let (stag, ctx) = unsafe { ((*vmr).ibv_mr.lkey, (*vmr).ibv_mr.context) };
        // SAFETY: as above.
        let sh = unsafe { shared(ctx) };
        if let Err(e) = sh.mrs.deregister(stag) {
            // EBUSY: memory windows are bound to it.
            return e.errno();
        }
        // SAFETY: ours.
        if let (Some(k), Some(h)) = (sh.kernel, unsafe { (*(vmr as *mut XiwMr)).kernel }) {
            let _ = k.dereg_mr(h);
        }
        // SAFETY: ours; a device memory it is on outlives it (free_dm waits
        // for its MRs).
        unsafe { dm_released((*(vmr as *mut XiwMr)).dm) };
        // SAFETY: the MR's PD (libibverbs keeps `pd` current across rereg).
        unsafe { domain_use((*vmr).ibv_mr.pd, false) };
        // SAFETY: allocated by reg_mr with Box; handed back once.
        drop(unsafe { Box::from_raw(vmr as *mut XiwMr) });
        0
    })
}
