//! Kernel mode: the context's events page ([`xiw_abi::events`]), which the
//! module's socket callbacks mark. A thread that polls an empty CQ looks at
//! its QP's slot instead of asking the socket, and the progress thread is
//! woken (through the context's eventfd) only while it sleeps, armed.

use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};

use xiw_abi::events::*;
use xiw_engine::recv::{LentRead, WriteTally};

use crate::sys;

/// The stream's next bytes, which the module took out of the socket into
/// the slot as it gave the stream back ([`StreamEvents::recall`]).
pub struct Handed {
    pub bytes: [u8; HAND_BYTES],
    pub len: usize,
    /// The socket may hold more: read it.
    pub more: bool,
}

pub struct StreamEvents {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory reached only through atomics; it
// stays mapped until the value is dropped.
unsafe impl Send for StreamEvents {}
unsafe impl Sync for StreamEvents {}

impl StreamEvents {
    /// Maps the page the module made for the context of `cmd_fd`.
    pub fn map(cmd_fd: RawFd, offset: u64, len: usize) -> io::Result<StreamEvents> {
        if len < EVENTS_BYTES {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        }
        // mmap's offset is an off_t.
        if i64::try_from(offset).is_err() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: the context's command fd, open while the context lives.
        let fd = unsafe { BorrowedFd::borrow_raw(cmd_fd) };
        let p = sys::map_shared(fd, offset, len)?;
        let ev = StreamEvents { base: p, len };
        let h = ev.header();
        if h.magic != EVENTS_MAGIC || h.version != EVENTS_VERSION || h.slots != SLOTS {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        }
        Ok(ev)
    }

    fn header(&self) -> &EventsHeader {
        // SAFETY: the mapping starts with the header (checked long enough).
        unsafe { &*(self.base as *const EventsHeader) }
    }

    fn summary(&self, word: usize) -> &SummaryWord {
        // SAFETY: `word` < SLOTS / 64 (callers'), inside the bitmap, aligned.
        unsafe { &*(self.base.add(SUMMARY_OFFSET + word * 8) as *const SummaryWord) }
    }

    fn slot(&self, slot: u32) -> Option<&EventsSlot> {
        if slot >= SLOTS {
            return None;
        }
        // SAFETY: slot < SLOTS, so the entry lies inside the mapping.
        Some(unsafe {
            &*(self.base.add(SLOTS_OFFSET + slot as usize * SLOT_BYTES) as *const EventsSlot)
        })
    }

    /// Takes the events marked in `slot` (0: nothing happened).
    #[inline]
    pub fn take(&self, slot: u32) -> u32 {
        let Some(s) = self.slot(slot) else { return 0 };
        // A plain load first: an application polling an empty CQ calls this
        // in a loop, and a read-modify-write would take the cache line from
        // the module on every turn.
        if s.events.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        s.events.swap(0, Ordering::AcqRel)
    }

    /// Takes the marks of `slot` (`EV_DATA`, `EV_WRITABLE`, `EV_CLOSED`),
    /// leaving its count of messages signalled ([`StreamEvents::signalled`])
    /// for [`Cq::owe_signalled`](crate::cq::Cq::owe_signalled).
    #[inline]
    pub fn take_marks(&self, slot: u32) -> u32 {
        let Some(s) = self.slot(slot) else { return 0 };
        // A plain load first, as in `take`.
        if s.events.load(Ordering::Relaxed) & EV_MARKS == 0 {
            return 0;
        }
        s.events.fetch_and(!EV_MARKS, Ordering::AcqRel) & EV_MARKS
    }

    /// The count of messages the module signalled in `slot`, not taken.
    #[inline]
    pub fn signalled(&self, slot: u32) -> u32 {
        self.slot(slot).map_or(0, |s| {
            s.events.load(Ordering::Acquire) >> EV_SIGNALLED_SHIFT
        })
    }

    /// Takes only the count of messages the module signalled
    /// ([`EV_SIGNALLED_ONE`]) from `slot`'s events, leaving the rest marked.
    #[inline]
    pub fn take_signalled(&self, slot: u32) -> u32 {
        let Some(s) = self.slot(slot) else { return 0 };
        if s.events.load(Ordering::Relaxed) < EV_SIGNALLED_ONE {
            return 0;
        }
        s.events.fetch_and(EV_MARKS, Ordering::AcqRel) >> EV_SIGNALLED_SHIFT
    }

    /// Says who took the slot's last events ([`HINT_APP`] or [`HINT_PROGRESS`]).
    #[inline]
    pub fn hint(&self, slot: u32, hint: u32) {
        if let Some(s) = self.slot(slot) {
            if s.hint.load(Ordering::Relaxed) != hint {
                s.hint.store(hint, Ordering::Relaxed);
            }
        }
    }

    /// Lends the stream of `slot` to the module, which may place whole RDMA
    /// Writes from its head, with the engine's Write tally, and the Read
    /// Responses of `read` (the caller holds no byte of it and is between
    /// two FPDUs).
    pub fn lend(&self, slot: u32, t: WriteTally, read: Option<LentRead>) {
        let Some(s) = self.slot(slot) else { return };
        s.write_len.store(t.write_len, Ordering::Relaxed);
        s.after_write
            .store(t.after_write.unwrap_or(0), Ordering::Relaxed);
        let mut flags = if t.after_write.is_some() {
            PLACE_F_AFTER_WRITE
        } else {
            0
        };
        if let Some(r) = read {
            s.read_stag.store(r.stag, Ordering::Relaxed);
            s.read_to.store(r.to, Ordering::Relaxed);
            s.read_left.store(r.left, Ordering::Relaxed);
            flags |= PLACE_F_READ;
        }
        s.flags.store(flags, Ordering::Relaxed);
        // The tally before the stream (the module: the reverse).
        s.place.store(PLACE_KERNEL, Ordering::Release);
    }

    /// Whether the stream of `slot` is still lent to the module, which then
    /// placed all that came (it gives the stream back at the first FPDU it
    /// does not place, and marks it).
    pub fn still_lent(&self, slot: u32) -> bool {
        self.slot(slot)
            .is_some_and(|s| s.place.load(Ordering::Acquire) == PLACE_KERNEL)
    }

    /// Takes the stream of `slot` back from the module: it places nothing
    /// from the next batch of bytes on (one under way ends before the
    /// socket lets the caller read). If the module had handed it back with
    /// bytes in the slot ([`PLACE_HANDED`]), those are the stream's next
    /// bytes: returned, and the module is done with the stream.
    pub fn recall(&self, slot: u32) -> Option<Handed> {
        let s = self.slot(slot)?;
        if s.place.load(Ordering::Relaxed) == PLACE_USER
            || s.place.swap(PLACE_USER, Ordering::SeqCst) != PLACE_HANDED
        {
            return None;
        }
        // The module claimed the stream (clearing `hand_len` first) and
        // is copying at most HAND_BYTES from the socket in its receive
        // callback: a matter of moments. Bounded all the same: a module
        // that never finished would otherwise hang this thread; nothing is
        // taken from the slot then, and the socket is read for what follows.
        // Read after the swap: a mark of bytes that came later is either
        // seen here (HAND_MORE) or made after it, for a later pass.
        let mut word = s.hand_len.load(Ordering::Acquire);
        let mut since = None;
        while word & HAND_DONE == 0 {
            if since.get_or_insert_with(std::time::Instant::now).elapsed()
                > std::time::Duration::from_secs(1)
            {
                return Some(Handed {
                    bytes: [0; HAND_BYTES],
                    len: 0,
                    more: true,
                });
            }
            std::thread::yield_now();
            word = s.hand_len.load(Ordering::Acquire);
        }
        // SAFETY: the module writes `hand` only between its claim and its
        // release of HAND_DONE, which the load above synchronises with; a
        // volatile copy of plain bytes in the mapping.
        let bytes = unsafe { std::ptr::read_volatile(std::ptr::addr_of!(s.hand)) };
        Some(Handed {
            bytes,
            len: ((word & HAND_LEN_MASK) as usize).min(HAND_BYTES),
            more: word & HAND_MORE != 0,
        })
    }

    /// The Write tally as the module left it: read after a read of the
    /// socket (which waits for a batch the module was placing) that
    /// followed [`StreamEvents::recall`].
    pub fn tally(&self, slot: u32) -> WriteTally {
        let Some(s) = self.slot(slot) else {
            return WriteTally::default();
        };
        fence(Ordering::Acquire);
        let after = s.flags.load(Ordering::Relaxed) & PLACE_F_AFTER_WRITE != 0;
        WriteTally {
            write_len: s.write_len.load(Ordering::Relaxed),
            after_write: after.then(|| s.after_write.load(Ordering::Relaxed)),
        }
    }

    /// Lends the Read Responses of `r` with the stream of `slot`, lent
    /// already with none: the module takes them from its next pass on.
    pub fn lend_read(&self, slot: u32, r: LentRead) {
        let Some(s) = self.slot(slot) else { return };
        s.read_stag.store(r.stag, Ordering::Relaxed);
        s.read_to.store(r.to, Ordering::Relaxed);
        s.read_left.store(r.left, Ordering::Relaxed);
        // The Read before the flag (the module: the reverse); the module
        // changes the other flags in place, so this one is or'ed in.
        s.flags.fetch_or(PLACE_F_READ, Ordering::Release);
    }

    /// What the module left of the Read lent with the stream: the bytes
    /// still to come, and whether it placed the last segment. Read as
    /// [`StreamEvents::tally`] is, after it.
    pub fn read_left(&self, slot: u32) -> (u64, bool) {
        let Some(s) = self.slot(slot) else {
            return (u64::MAX, false);
        };
        let done = s.flags.load(Ordering::Relaxed) & PLACE_F_READ == 0;
        (s.read_left.load(Ordering::Relaxed), done)
    }

    /// Whether any slot was marked since the last [`StreamEvents::drain`].
    #[inline]
    pub fn any(&self) -> bool {
        self.header().pending.load(Ordering::Relaxed) != 0
    }

    /// The slots marked since the last call, each once (some may have had
    /// their events taken meanwhile), among slots `0..=last` (the highest
    /// the context has given out: no others are ever marked); false if none
    /// was.
    pub fn drain(&self, last: u32, mut f: impl FnMut(u32)) -> bool {
        if self.header().pending.swap(0, Ordering::AcqRel) == 0 {
            return false;
        }
        for w in 0..=(last.min(SLOTS - 1) / 64) as usize {
            let s = self.summary(w);
            if s.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = s.swap(0, Ordering::AcqRel);
            while bits != 0 {
                f(w as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        true
    }

    /// The progress thread is about to sleep: the module wakes it for the
    /// next mark. False if a mark came meanwhile (do not sleep).
    pub fn arm(&self) -> bool {
        let h = self.header();
        h.armed.store(1, Ordering::SeqCst);
        // The store before the look at `pending` (the module: the reverse).
        fence(Ordering::SeqCst);
        if h.pending.load(Ordering::SeqCst) != 0 {
            h.armed.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The progress thread is awake.
    pub fn disarm(&self) {
        self.header().armed.store(0, Ordering::Relaxed);
    }

    /// Whether the module queued a connection since the last call.
    pub fn take_cm(&self) -> bool {
        let cm: &AtomicU32 = &self.header().cm;
        cm.load(Ordering::Relaxed) != 0 && cm.swap(0, Ordering::AcqRel) != 0
    }
}

impl Drop for StreamEvents {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; nothing uses it
        // after the value is gone.
        let _ = unsafe { sys::unmap(self.base, self.len) };
    }
}
