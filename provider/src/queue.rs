//! A ring of [`xiw_abi::ring`] in its own mapping: memory of the xiw
//! module's in kernel mode (`XIW_METHOD_RING_ALLOC`, mapped from the
//! context's command fd, given back with the ring), anonymous memory in
//! standalone mode.
//! Slot access follows the index protocol in `xiw_abi::ring`: only the producer
//! writes a slot between `consumer` and `producer + entries`, only the consumer
//! reads a slot between `consumer` and `producer`.

use std::io;
use std::sync::atomic::Ordering;

use memmap2::{MmapMut, MmapOptions};
use xiw_abi::ring::*;

use crate::error::Error;
use crate::kernel::Kernel;

pub use xiw_abi::limits::MAX_SGE;

pub struct Ring {
    map: MmapMut,
    pub entries: u32,
    pub stride: u32,
    /// Kernel mode: the module's memory it lives in, by its offset.
    kernel: Option<(Kernel, u64)>,
}

// SAFETY: all shared state in the mapping is reached through atomics or through
// slots whose ownership the index protocol hands from one side to the other.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

impl Ring {
    /// A ring for at least `min_entries` slots of `stride` bytes, in the
    /// module's memory when `kernel` is given.
    pub fn new(
        kind: u32,
        min_entries: u32,
        stride: u32,
        owner_id: u32,
        kernel: Option<Kernel>,
    ) -> io::Result<Ring> {
        let entries = min_entries
            .max(1)
            .checked_next_power_of_two()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let len = ring_bytes(entries, stride);
        let (mut map, kernel) = match kernel {
            None => (MmapMut::map_anon(len)?, None),
            Some(k) => {
                let off = k
                    .ring_alloc(len as u64)
                    .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
                // SAFETY: a shared mapping of the memory the module just made
                // for this ring (zeroed, `len` bytes rounded up to pages), which
                // nothing else maps; it stays until the mapping is dropped.
                match unsafe { MmapOptions::new().offset(off).len(len).map_mut(k.fd()) } {
                    Ok(m) => (m, Some((k, off))),
                    Err(e) => {
                        let _ = k.ring_free(off);
                        return Err(e);
                    }
                }
            }
        };
        let hdr = map.as_mut_ptr() as *mut RingHeader;
        // SAFETY: the mapping is page aligned and at least RING_SLOTS_OFFSET bytes long;
        // it is fresh (zeroed), so writing the plain fields races with nobody.
        unsafe {
            (*hdr).magic = RING_MAGIC;
            (*hdr).version = RING_VERSION;
            (*hdr).kind = kind;
            (*hdr).entries = entries;
            (*hdr).stride = stride;
            (*hdr).owner_id = owner_id;
        }
        Ok(Ring {
            map,
            entries,
            stride,
            kernel,
        })
    }

    /// Kernel mode: where the module's memory of this ring is mapped from.
    pub fn kernel_offset(&self) -> Option<u64> {
        self.kernel.as_ref().map(|&(_, off)| off)
    }

    pub fn header(&self) -> &RingHeader {
        // SAFETY: the header was initialised in `new`; its shared fields are atomics.
        unsafe { &*(self.map.as_ptr() as *const RingHeader) }
    }

    pub fn producer(&self) -> u32 {
        self.header().producer.value.load(Ordering::Acquire)
    }

    pub fn consumer(&self) -> u32 {
        self.header().consumer.value.load(Ordering::Acquire)
    }

    pub fn publish(&self, producer: u32) {
        self.header()
            .producer
            .value
            .store(producer, Ordering::Release);
    }

    pub fn release(&self, consumer: u32) {
        self.header()
            .consumer
            .value
            .store(consumer, Ordering::Release);
    }

    /// Slots in use (posted and not yet consumed).
    pub fn used(&self) -> u32 {
        self.producer().wrapping_sub(self.consumer())
    }

    /// Pointer to slot `index` (free-running).
    pub fn slot(&self, index: u32) -> *mut u8 {
        let off = RING_SLOTS_OFFSET + (index & (self.entries - 1)) as usize * self.stride as usize;
        // SAFETY: `off + stride` lies inside the mapping by construction (`ring_bytes`).
        unsafe { (self.map.as_ptr() as *mut u8).add(off) }
    }

    /// Reads a `T` at byte `at` of slot `index`.
    ///
    /// # Safety
    /// The caller owns the slot under the index protocol and `at + size_of::<T>() <= stride`.
    pub unsafe fn read<T: Copy>(&self, index: u32, at: usize) -> T {
        // SAFETY: per the function contract.
        unsafe { std::ptr::read_unaligned(self.slot(index).add(at) as *const T) }
    }

    /// Writes a `T` at byte `at` of slot `index`.
    ///
    /// # Safety
    /// As for [`Ring::read`].
    pub unsafe fn write<T: Copy>(&self, index: u32, at: usize, v: T) {
        // SAFETY: per the function contract.
        unsafe { std::ptr::write_unaligned(self.slot(index).add(at) as *mut T, v) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The module's memory goes once the mapping (dropped next) is gone.
        if let Some((k, off)) = self.kernel {
            let _ = k.ring_free(off);
        }
    }
}

/// A work request's SGEs: a few without a heap allocation.
pub type SgeList = smallvec::SmallVec<[Sge; 4]>;

/// An SGE list of `n` entries made by `f`, pushed one by one: collecting
/// through `Extend` costs more than the copies for the usual one or two.
pub fn sges_of(n: usize, f: impl Fn(usize) -> Sge) -> SgeList {
    let mut v = SgeList::new();
    if n > v.inline_size() {
        v.reserve_exact(n);
    }
    for k in 0..n {
        v.push(f(k));
    }
    v
}

/// A receive WQE's SGEs: one (the usual case) without a heap allocation,
/// so that taking a receive off its ring and moving it through the engine
/// copies little.
pub type RecvSges = smallvec::SmallVec<[Sge; 1]>;

/// A receive WQE taken off a ring.
#[derive(Clone, Debug, Default)]
pub struct RecvJob {
    pub wr_id: u64,
    pub sges: RecvSges,
    pub length: u64,
}

/// The pieces of an SGE list that message bytes `[off, off + n)` fall in, in
/// order: (lkey, address, length).
pub fn sge_spans(
    sges: &[Sge],
    mut off: u64,
    mut n: usize,
) -> impl Iterator<Item = (u32, u64, usize)> + '_ {
    let mut it = sges.iter();
    std::iter::from_fn(move || loop {
        if n == 0 {
            return None;
        }
        let s = it.next()?;
        if off >= s.length as u64 {
            off -= s.length as u64;
            continue;
        }
        let take = ((s.length as u64 - off) as usize).min(n);
        let span = (s.lkey, s.addr.wrapping_add(off), take);
        off = 0;
        n -= take;
        return Some(span);
    })
}

/// Posts receive WQEs, each a wr_id and its SGEs, on a ring (a QP's RQ or an SRQ);
/// `Err((index, why))` names the first refused. The caller serialises
/// producers.
pub fn post_recv_ring<'a>(
    ring: &Ring,
    max_sge: u32,
    wrs: impl Iterator<Item = (u64, &'a [Sge])>,
) -> Result<(), (usize, Error)> {
    let mut p = ring.producer();
    for (i, (wr_id, sges)) in wrs.enumerate() {
        if sges.len() > max_sge as usize {
            return Err((i, Error::invalid("more SGEs than the queue takes")));
        }
        if p.wrapping_sub(ring.consumer()) >= ring.entries {
            return Err((i, Error::NoMemory("the receive queue is full".into())));
        }
        const AT: usize = std::mem::size_of::<RecvWqe>();
        // SAFETY: slot `p` is free and producers are serialised by the caller's lock;
        // `max_sge` SGEs fit the stride the ring was made with, behind the header.
        unsafe {
            if let [s] = sges {
                // The usual receive: one SGE, stored as a value.
                ring.write(
                    p,
                    0,
                    RecvWqe {
                        wr_id,
                        num_sge: 1,
                        length: s.length,
                    },
                );
                ring.write(p, AT, *s);
            } else {
                let length: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
                let hdr = RecvWqe {
                    wr_id,
                    num_sge: sges.len() as u32,
                    length: length.min(u32::MAX as u64) as u32,
                };
                ring.write(p, 0, hdr);
                std::ptr::copy_nonoverlapping(
                    sges.as_ptr() as *const u8,
                    ring.slot(p).add(AT),
                    std::mem::size_of_val(sges),
                );
            }
        }
        p = p.wrapping_add(1);
        ring.publish(p);
    }
    Ok(())
}

/// The index and header of the oldest receive WQE on a ring, if one is
/// posted; the caller serialises consumers.
#[inline]
fn front(ring: &Ring) -> Option<(u32, RecvWqe)> {
    let c = ring.consumer();
    if ring.producer() == c {
        return None;
    }
    // SAFETY: slot `c` is published and consumers are serialised by the caller.
    Some((c, unsafe { ring.read(c, 0) }))
}

/// Takes the oldest receive WQE off a ring if it has exactly one SGE: its
/// wr_id and that SGE (None, and nothing taken, otherwise). The caller
/// serialises consumers.
#[inline]
pub fn take_single(ring: &Ring) -> Option<(u64, Sge)> {
    let (c, hdr) = front(ring).filter(|(_, h)| h.num_sge == 1)?;
    // SAFETY: as in `front`; a WQE with one SGE has it right behind the header.
    let sge = unsafe { ring.read::<Sge>(c, std::mem::size_of::<RecvWqe>()) };
    ring.release(c.wrapping_add(1));
    Some((hdr.wr_id, sge))
}

/// Takes the oldest receive WQE off a ring; the caller serialises consumers.
#[inline]
pub fn take_recv_ring(ring: &Ring) -> Option<RecvJob> {
    let (c, hdr) = front(ring)?;
    const AT: usize = std::mem::size_of::<RecvWqe>();
    const SGE: usize = std::mem::size_of::<Sge>();
    let n = (hdr.num_sge as usize).min(MAX_SGE as usize);
    // SAFETY: as in `front`; the ring's stride holds `MAX_SGE` SGEs behind the
    // header at most.
    let sges = unsafe {
        if n == 1 {
            RecvSges::from_buf([ring.read::<Sge>(c, AT)])
        } else {
            (0..n).map(|k| ring.read::<Sge>(c, AT + k * SGE)).collect()
        }
    };
    ring.release(c.wrapping_add(1));
    Some(RecvJob {
        wr_id: hdr.wr_id,
        // The poster's sum of the SGE lengths (saturated at 4 GiB - 1, more
        // than a message can carry).
        length: u64::from(hdr.length),
        sges,
    })
}
