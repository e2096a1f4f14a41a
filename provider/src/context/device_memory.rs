//! Device memory (`ibv_alloc_dm`): how much of it the context has allocated.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct DeviceMemory {
    /// Bytes allocated.
    bytes: AtomicU64,
}

impl DeviceMemory {
    /// Counts `len` more bytes, unless that would pass `max`; false then.
    pub fn reserve(&self, len: u64, max: u64) -> bool {
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(len).filter(|&n| n <= max)
            })
            .is_ok()
    }

    /// Counts `len` bytes freed.
    pub fn release(&self, len: u64) {
        self.bytes.fetch_sub(len, Ordering::AcqRel);
    }
}
