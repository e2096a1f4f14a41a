//! What is framed and not yet taken by the stream: the sender's own bytes
//! and the spans of registered memory between them, handed out in stream
//! order ([`Sender::pieces`]) and let go as the stream takes them
//! ([`Sender::advance`]).

use super::{Piece, Sender, Span};

/// A framing buffer up to this size is kept when its QP goes idle.
const TRIM_KEEP: usize = 16 * 1024;

impl<L: Clone + Default, P> Sender<L, P> {
    /// Bytes framed and not yet taken by the stream, up to the first span
    /// (all of them when [`Sender::has_spans`] is false).
    pub fn pending(&self) -> &[u8] {
        let end = self.spans.front().map_or(self.buf.len(), |&(at, _)| at);
        &self.buf[self.off..end]
    }

    pub fn has_pending(&self) -> bool {
        self.off < self.buf.len() || !self.spans.is_empty()
    }

    /// Some of what is pending lies in registered memory.
    pub fn has_spans(&self) -> bool {
        !self.spans.is_empty()
    }

    /// Hands `f` what is framed and not yet taken, in stream order, until it
    /// returns false.
    pub fn pieces(&self, mut f: impl FnMut(Piece<'_>) -> bool) {
        let mut at = self.off;
        for (k, &(pos, span)) in self.spans.iter().enumerate() {
            if at < pos && !f(Piece::Bytes(&self.buf[at..pos])) {
                return;
            }
            at = pos;
            let skip = if k == 0 { self.span_off } else { 0 };
            let rest = Span {
                to: span.to.wrapping_add(skip as u64),
                len: span.len - skip,
                ..span
            };
            if !f(Piece::Span(rest)) {
                return;
            }
        }
        if at < self.buf.len() {
            f(Piece::Bytes(&self.buf[at..]));
        }
    }

    /// Bytes framed and not yet taken by the stream, spans included.
    pub(super) fn queued(&self) -> u64 {
        self.framed - self.written
    }

    /// The stream took `n` more bytes.
    #[inline]
    pub fn advance(&mut self, n: usize) {
        self.written += n as u64;
        self.active = true;
        if self.spans.is_empty() && n == self.buf.len() - self.off {
            // All of it: the usual case for small messages.
            self.buf.clear();
            self.off = 0;
            return;
        }
        self.advance_part(n);
    }

    /// [`Sender::advance`] for anything but all that is pending.
    fn advance_part(&mut self, n: usize) {
        let mut n = n;
        while n > 0 {
            match self.spans.front() {
                Some(&(pos, span)) if pos == self.off => {
                    let t = n.min((span.len - self.span_off) as usize);
                    self.span_off += t as u32;
                    n -= t;
                    if self.span_off == span.len {
                        self.spans.pop_front();
                        self.span_off = 0;
                    }
                }
                next => {
                    let end = next.map_or(self.buf.len(), |&(pos, _)| pos);
                    let t = n.min(end - self.off);
                    assert!(t > 0, "the stream took more than was pending");
                    self.off += t;
                    n -= t;
                }
            }
        }
        if self.off == self.buf.len() && self.spans.is_empty() {
            self.buf.clear();
            self.off = 0;
        }
    }

    /// Frees the buffer of a QP that sent nothing since the last pass; true
    /// while it still holds a large one.
    pub fn trim(&mut self) -> bool {
        let idle = !std::mem::replace(&mut self.active, false);
        if idle && !self.has_pending() && self.buf.capacity() > TRIM_KEEP {
            self.buf = Vec::new();
            self.off = 0;
        }
        self.buf.capacity() > TRIM_KEEP
    }
}
