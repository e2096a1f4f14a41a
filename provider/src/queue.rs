//! A ring of [`xiw_abi::ring`] in its own anonymous mapping.
//!
//! The mapping is what a kernel shim would share; here both sides are in-process.
//! Slot access follows the index protocol in `xiw_abi::ring`: only the producer
//! writes a slot between `consumer` and `producer + entries`, only the consumer
//! reads a slot between `consumer` and `producer`.

use std::io;
use std::sync::atomic::Ordering;

use memmap2::MmapMut;
use xiw_abi::ring::*;

pub struct Ring {
    map: MmapMut,
    pub entries: u32,
    pub stride: u32,
}

// SAFETY: all shared state in the mapping is reached through atomics or through
// slots whose ownership the index protocol hands from one side to the other.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

impl Ring {
    pub fn new(kind: u32, min_entries: u32, stride: u32, owner_id: u32) -> io::Result<Ring> {
        let entries = min_entries
            .max(1)
            .checked_next_power_of_two()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut map = MmapMut::map_anon(ring_bytes(entries, stride))?;
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
        })
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
