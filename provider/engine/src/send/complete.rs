//! Completions of this side's work requests: a Send or Write is done once
//! the stream has taken its last byte, a local request once what was framed
//! before it is.

use super::{Completion, SendHost, Sender};
use crate::fault::{AccessFault, Status};

impl<L: Clone + Default, P> Sender<L, P> {
    /// Reports the work requests whose last byte the stream has taken.
    pub fn complete_written<H: SendHost>(&mut self, host: &mut H) {
        while let Some(&(idx, pos)) = self.done_at.front() {
            if pos > self.written {
                break;
            }
            self.done_at.pop_front();
            host.completed(idx, Completion::Success);
        }
    }

    /// The request [`Sender::frame_now`] framed, whose bytes the stream has
    /// not all taken yet, is send queue index `idx`: it completes through
    /// [`Sender::complete_written`] once they are.
    pub fn complete_at(&mut self, idx: u32) {
        self.done_at.push_back((idx, self.framed));
    }

    /// A local work request (Local Invalidate, a window bind) carried out:
    /// it completes in order once what was framed before it is taken, or
    /// failed with the memory bind error.
    pub(super) fn local_done<H: SendHost>(
        &mut self,
        host: &mut H,
        idx: u32,
        r: Result<(), AccessFault>,
    ) {
        match r {
            Ok(()) => self.done_at.push_back((idx, self.framed)),
            Err(_) => host.completed(idx, Completion::Error(Status::MemoryBind)),
        }
    }
}
