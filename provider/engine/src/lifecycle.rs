//! A QP's connection from its driver's point of view, from the first attempt
//! to the end: the deadlines that bound it (the connect deadline, the retry
//! of a refused connect, the linger after the peer's orderly close, the wait
//! for room for a Terminate) and what a failure does, in what order.
//!
//! The driver tells a [`Lifecycle`] what happened (a failure found, the
//! Terminate written or blocked, the connection attempt started, refused or
//! established, the QP moved to the error state or reset) and carries out the
//! [`Action`]s it returns, in order. Time comes in only through
//! [`Lifecycle::handle_timeout`], from the driver that runs the timers; the
//! threads that report the other events read no clock, so a deadline an
//! event asks for starts at the next `handle_timeout`, which the
//! [`Action::Timer`] that comes with it asks the driver for.
//! [`Lifecycle::poll_timeout`] names the earliest deadline running.

use std::time::{Duration, Instant};

use crate::fault::{Event, Fail, Status};

/// How long a failing QP waits for room to send its Terminate before it
/// fails without it.
pub const TERMINATE_WAIT: Duration = Duration::from_secs(1);

/// How long an initiator waits before it connects again to a peer that
/// refused or reset the connection (not listening yet, or between attempts).
pub const CONNECT_RETRY: Duration = Duration::from_millis(20);

/// The deadlines a driver configures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a connection attempt may take, from RTR until the stream is
    /// up (a responder: until its stream has carried the initiator's first
    /// FPDU).
    pub connect_timeout: Duration,
    /// How long a QP whose peer closed its end in order stays up before it
    /// fails, so the application can reap what the peer sent first.
    pub linger: Duration,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            connect_timeout: Duration::from_secs(10),
            linger: Duration::from_secs(1),
        }
    }
}

/// What the driver does, in the order given.
#[derive(Debug)]
pub enum Action {
    /// Run this QP's timers from now on (call [`Lifecycle::handle_timeout`]
    /// as time passes, until [`Lifecycle::poll_timeout`] is `None`): a
    /// deadline was asked for. The driver may run them already.
    Timer,
    /// Queue this Terminate body ahead of everything else (nothing follows
    /// it) and write what the stream takes now, then report how that went:
    /// [`Lifecycle::terminate_blocked`] if the rest waits for room on the
    /// stream, [`Lifecycle::terminate_written`] otherwise (all of it went,
    /// there is no stream, or writing failed). Always the last action of
    /// its batch.
    Terminate(Vec<u8>),
    /// Take nothing more in from the peer, and watch the stream for room
    /// only: the Terminate goes on going out as room comes.
    StopReading,
    /// The responder's stream ended before the initiator's first FPDU: it
    /// belonged to an attempt the initiator abandoned. Drop it and wait for
    /// the next attempt (answering one already held), reporting
    /// [`Lifecycle::withdrawn`].
    Reopen,
    /// Connect to the peer again: the retry's time came.
    Connect,
    /// Move the QP to the error state for this failure, then report
    /// [`Lifecycle::entered_error`] and carry out its steps. With no locks
    /// held that failing takes.
    Fail(Fail),
}

/// What moving the QP to the error state does, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Take the stream away from both sides of the data path: nothing more
    /// is read or written.
    Detach,
    /// Close the connection: an established stream gracefully (what is
    /// queued, then FIN), one still being set up, and every connection held
    /// for the QP, at once.
    Close,
    /// Tell whoever mirrors the QP's state (the kernel's QP) that it failed.
    Mirror,
    /// Complete the receive in progress, if any, with this status.
    FailRecv(Status),
    /// Raise this asynchronous event.
    Raise(Event),
    /// Complete every outstanding work request: the send queue first, its
    /// oldest request that had started with the first failure's status and
    /// the rest flushed, then the receive queue, flushed; a request that
    /// failed is reported before anything flushed, also where both queues
    /// share a CQ.
    Flush,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// No attempt: a new QP, or one reset.
    Idle,
    /// RTR: connecting to the peer, or waiting for its Request.
    Connecting,
    /// The stream is up.
    Established { initiator: bool },
    /// The connection is over.
    Closed,
}

/// A deadline: off, asked for (it starts at the next time passed in), or
/// running until an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    Off,
    Asked(Duration),
    At(Instant),
}

impl Timer {
    fn start(&mut self, now: Instant) {
        if let Timer::Asked(d) = *self {
            *self = Timer::At(now + d);
        }
    }

    fn at(self) -> Option<Instant> {
        match self {
            Timer::At(t) => Some(t),
            _ => None,
        }
    }

    fn due(self, now: Instant) -> bool {
        matches!(self, Timer::At(t) if now >= t)
    }
}

/// A failure whose Terminate is going out: it applies once the stream has
/// taken the Terminate, or at the end of its wait for room.
#[derive(Debug)]
struct Terminating {
    fail: Fail,
    /// Off while the first write is under way.
    wait: Timer,
}

/// One QP's lifecycle; see the [module](self) documentation.
#[derive(Debug)]
pub struct Lifecycle {
    timings: Timings,
    phase: Phase,
    /// The connection attempt's deadline. A responder keeps it once its
    /// stream is up, unchecked: should the stream turn out to belong to an
    /// abandoned attempt, it waits for the next one until then.
    connect: Timer,
    /// The next connect to a peer that refused.
    retry: Timer,
    /// The peer closed its end in order: the QP fails then.
    linger: Timer,
    /// The first failure, while its Terminate goes out: later ones wait
    /// behind it and are dropped.
    terminating: Option<Terminating>,
    /// The QP is in the error state: the stream is gone, and a failure
    /// found now only flushes.
    errored: bool,
}

impl Default for Lifecycle {
    fn default() -> Lifecycle {
        Lifecycle::new(Timings::default())
    }
}

impl Lifecycle {
    pub fn new(timings: Timings) -> Lifecycle {
        Lifecycle {
            timings,
            phase: Phase::Idle,
            connect: Timer::Off,
            retry: Timer::Off,
            linger: Timer::Off,
            terminating: None,
            errored: false,
        }
    }

    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// RTR: a connection attempt starts, bounded by the connect timeout.
    pub fn connecting(&mut self) -> Vec<Action> {
        self.phase = Phase::Connecting;
        self.connect = Timer::Asked(self.timings.connect_timeout);
        vec![Action::Timer]
    }

    /// The attempt could not even start (RTR failed): nothing stays armed.
    pub fn start_failed(&mut self) {
        self.phase = Phase::Idle;
        self.connect = Timer::Off;
        self.retry = Timer::Off;
    }

    /// The peer refused (or reset) the connection: connect again after
    /// [`CONNECT_RETRY`], within the attempt's deadline. The driver runs
    /// the QP's timers already, for that deadline.
    pub fn refused(&mut self) {
        self.retry = Timer::Asked(CONNECT_RETRY);
    }

    /// The stream is up (the MPA exchange is done): an initiator's attempt
    /// is over, a responder's lasts until the initiator's first FPDU.
    pub fn established(&mut self, initiator: bool) {
        self.phase = Phase::Established { initiator };
        if initiator {
            self.connect = Timer::Off;
            self.retry = Timer::Off;
        }
    }

    /// The responder dropped its stream (a newer attempt of the peer came, or
    /// the stream belonged to an abandoned one) and waits for the next
    /// attempt, until the original deadline.
    pub fn withdrawn(&mut self) -> Vec<Action> {
        self.phase = Phase::Connecting;
        self.linger = Timer::Off;
        vec![Action::Timer]
    }

    /// A failure was found on the QP's stream or its work. `first_fpdu_due`:
    /// the stream has not yet carried the initiator's first FPDU (the
    /// receive side still waits for it).
    ///
    /// The first failure stands while its Terminate goes out. A stream
    /// failure on a responder's stream before the initiator's first FPDU
    /// reopens (the attempt was abandoned); the peer's orderly close lingers
    /// on an established stream; a failure with a Terminate sends it first;
    /// anything else fails the QP at once. Once the QP is in the error
    /// state, a failure only flushes.
    pub fn fail(&mut self, f: Fail, first_fpdu_due: bool) -> Vec<Action> {
        if self.terminating.is_some() {
            return Vec::new();
        }
        if self.errored {
            return self.end(f);
        }
        let established = matches!(self.phase, Phase::Established { .. });
        if f.term.is_none()
            && self.phase == (Phase::Established { initiator: false })
            && first_fpdu_due
        {
            return vec![Action::Reopen];
        }
        if f.linger && established {
            if self.linger != Timer::Off {
                return Vec::new();
            }
            self.linger = Timer::Asked(self.timings.linger);
            return vec![Action::Timer];
        }
        if let Some(body) = f.term.clone() {
            self.terminating = Some(Terminating {
                fail: f,
                wait: Timer::Off,
            });
            return vec![Action::Terminate(body)];
        }
        self.end(f)
    }

    /// The stream has taken the whole Terminate, or has none to take it (no
    /// stream, or writing failed): its failure applies, unless the QP
    /// failed meanwhile.
    pub fn terminate_written(&mut self) -> Vec<Action> {
        match self.terminating.take() {
            Some(t) if !self.errored => self.end(t.fail),
            _ => Vec::new(),
        }
    }

    /// The stream took part of the Terminate: the rest goes out as room
    /// comes, for at most [`TERMINATE_WAIT`]; meanwhile nothing more is read.
    pub fn terminate_blocked(&mut self) -> Vec<Action> {
        match &mut self.terminating {
            Some(t) if t.wait == Timer::Off => {
                t.wait = Timer::Asked(TERMINATE_WAIT);
                vec![Action::StopReading, Action::Timer]
            }
            _ => Vec::new(),
        }
    }

    /// A Terminate waits for room on the stream: the driver reports
    /// [`Lifecycle::terminate_written`] once the stream has taken it (it
    /// checks whenever it passes the time in, writing what it can).
    pub fn awaits_room(&self) -> bool {
        self.terminating
            .as_ref()
            .is_some_and(|t| t.wait != Timer::Off)
    }

    /// The failure whose Terminate is going out, if any.
    pub fn terminating(&self) -> Option<&Fail> {
        self.terminating.as_ref().map(|t| &t.fail)
    }

    /// The QP is in the error state.
    pub fn errored(&self) -> bool {
        self.errored
    }

    /// The QP moved to the error state, for a failure (with the status of the
    /// receive it hit, if any, and its event) or because the application
    /// asked (no event). `fresh`: it left a state with a connection (it was
    /// neither in error nor reset): its connection ends. Returns the steps,
    /// in order.
    pub fn entered_error(
        &mut self,
        fresh: bool,
        rq_status: Option<Status>,
        event: Option<Event>,
    ) -> Vec<Step> {
        self.errored = true;
        if !fresh {
            return vec![Step::Flush];
        }
        self.close();
        let mut steps = vec![Step::Detach, Step::Close, Step::Mirror];
        steps.extend(rq_status.map(Step::FailRecv));
        steps.extend(event.map(Step::Raise));
        steps.push(Step::Flush);
        steps
    }

    /// The connection is closed (the QP failed, or is being destroyed):
    /// no connect deadline, retry or linger any more. A Terminate still
    /// going out keeps its wait.
    pub fn close(&mut self) {
        self.phase = Phase::Closed;
        self.disarm();
    }

    /// The QP is back in RESET: nothing of the connection is left.
    pub fn reset(&mut self) {
        *self = Lifecycle::new(self.timings);
    }

    /// The earliest deadline running, if any (a deadline asked for since
    /// the last [`Lifecycle::handle_timeout`] starts at its next call).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let wait = self.terminating.as_ref().and_then(|t| t.wait.at());
        let attempt = match self.phase {
            Phase::Established { .. } | Phase::Closed => [None, None],
            Phase::Idle | Phase::Connecting => [self.connect.at(), self.retry.at()],
        };
        [wait, self.linger.at()]
            .into_iter()
            .chain(attempt)
            .flatten()
            .min()
    }

    /// Time passed: it is `now`. Starts the deadlines asked for, and returns
    /// what those that have passed do: the Terminate's wait ends (its
    /// failure applies without it, unless the QP failed meanwhile), the
    /// linger ends, the attempt's deadline passes, the retry's time comes.
    /// At most one failure comes out of one call.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<Action> {
        if let Some(t) = &mut self.terminating {
            t.wait.start(now);
        }
        for t in [&mut self.connect, &mut self.retry, &mut self.linger] {
            t.start(now);
        }
        if self.terminating.as_ref().is_some_and(|t| t.wait.due(now)) {
            let t = self.terminating.take().expect("terminating");
            if !self.errored {
                return self.end(t.fail);
            }
        }
        if self.linger != Timer::Off {
            if self.linger.due(now) {
                self.linger = Timer::Off;
                return self.end(Fail::stream("the peer closed the connection"));
            }
            return Vec::new();
        }
        if matches!(self.phase, Phase::Established { .. } | Phase::Closed) {
            return Vec::new();
        }
        if self.connect.due(now) {
            let ms = self.timings.connect_timeout.as_millis();
            return self.end(Fail::stream(format!(
                "no connection with the peer within {ms} ms"
            )));
        }
        if self.retry.due(now) {
            self.retry = Timer::Off;
            return vec![Action::Connect];
        }
        Vec::new()
    }

    /// `f` fails the QP: its connection's deadlines end with it.
    fn end(&mut self, f: Fail) -> Vec<Action> {
        self.disarm();
        vec![Action::Fail(f)]
    }

    /// No connect deadline, retry or linger any more.
    fn disarm(&mut self) {
        self.connect = Timer::Off;
        self.retry = Timer::Off;
        self.linger = Timer::Off;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::terminate::Cause;

    const T: Timings = Timings {
        connect_timeout: Duration::from_millis(500),
        linger: Duration::from_millis(300),
    };

    fn life() -> Lifecycle {
        Lifecycle::new(T)
    }

    fn t0() -> Instant {
        Instant::now()
    }

    /// A QP connecting, its deadline running since the instant returned.
    fn connecting_since() -> (Lifecycle, Instant) {
        let mut l = life();
        l.connecting();
        let now = t0();
        l.handle_timeout(now);
        (l, now)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn a_terminate() -> Fail {
        Fail::local(Status::LocalProtection, "bad lkey")
    }

    fn peer_closed() -> Fail {
        Fail {
            linger: true,
            ..Fail::stream("peer closed the connection")
        }
    }

    fn is_timer(a: &[Action]) -> bool {
        matches!(a, [Action::Timer])
    }

    fn failed(a: &[Action]) -> Option<&Fail> {
        match a {
            [Action::Fail(f)] => Some(f),
            _ => None,
        }
    }

    #[test]
    fn the_connect_deadline_starts_when_time_first_passes_in() {
        let mut l = life();
        assert!(is_timer(&l.connecting()));
        // Asked for, not running yet: no clock was read.
        assert_eq!(l.poll_timeout(), None);
        let now = t0();
        assert!(l.handle_timeout(now).is_empty());
        assert_eq!(l.poll_timeout(), Some(now + T.connect_timeout));
        assert!(l.handle_timeout(now + ms(499)).is_empty());
        let a = l.handle_timeout(now + ms(500));
        let f = failed(&a).expect("the deadline fails the QP");
        assert_eq!(f.why, "no connection with the peer within 500 ms");
        assert_eq!(f.event, Event::QpFatal);
        assert!(f.sq_status.is_none() && f.rq_status.is_none());
        assert_eq!(l.poll_timeout(), None);
        assert!(l.handle_timeout(now + ms(900)).is_empty());
    }

    #[test]
    fn an_initiator_established_has_no_deadline_left() {
        let (mut l, now) = connecting_since();
        l.established(true);
        assert_eq!(l.poll_timeout(), None);
        assert!(l.handle_timeout(now + ms(10_000)).is_empty());
    }

    #[test]
    fn a_failed_start_leaves_nothing_armed() {
        let mut l = life();
        l.connecting();
        l.start_failed();
        let now = t0();
        assert!(l.handle_timeout(now).is_empty());
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn a_refused_connect_is_retried_within_the_deadline() {
        let (mut l, now) = connecting_since();
        l.refused();
        let at = now + ms(100);
        assert!(l.handle_timeout(at).is_empty(), "the retry starts now");
        assert_eq!(l.poll_timeout(), Some(at + CONNECT_RETRY));
        assert!(l.handle_timeout(at + ms(19)).is_empty());
        assert!(matches!(
            l.handle_timeout(at + CONNECT_RETRY)[..],
            [Action::Connect]
        ));
        // Once.
        assert_eq!(l.poll_timeout(), Some(now + T.connect_timeout));
        assert!(l.handle_timeout(at + ms(40)).is_empty());
        // Refused until the deadline: it fails the QP, no retry after.
        l.refused();
        l.handle_timeout(now + ms(490));
        assert!(failed(&l.handle_timeout(now + ms(510))).is_some());
        assert!(l.handle_timeout(now + ms(600)).is_empty());
    }

    #[test]
    fn a_responder_keeps_its_deadline_unchecked_and_resumes_it_when_withdrawn() {
        let (mut l, now) = connecting_since();
        l.established(false);
        assert_eq!(l.poll_timeout(), None, "unchecked while the stream is up");
        assert!(l.handle_timeout(now + ms(600)).is_empty());
        // The stream ends before the initiator's first FPDU: reopen.
        let a = l.fail(Fail::stream("reset"), true);
        assert!(matches!(a[..], [Action::Reopen]));
        assert!(is_timer(&l.withdrawn()));
        assert_eq!(l.poll_timeout(), Some(now + T.connect_timeout));
        assert!(failed(&l.handle_timeout(now + ms(600))).is_some());
    }

    #[test]
    fn only_a_responders_stream_failure_before_the_first_fpdu_reopens() {
        let mut l = life();
        l.connecting();
        l.established(false);
        // A Terminate is sent, not reopened for.
        assert!(matches!(
            l.fail(a_terminate(), true)[..],
            [Action::Terminate(_)]
        ));
        let mut l = life();
        l.connecting();
        l.established(false);
        assert!(failed(&l.fail(Fail::stream("reset"), false)).is_some());
        let mut l = life();
        l.connecting();
        l.established(true);
        assert!(failed(&l.fail(Fail::stream("reset"), true)).is_some());
    }

    #[test]
    fn the_peers_orderly_close_lingers_then_fails() {
        let mut l = life();
        l.established(true);
        assert!(is_timer(&l.fail(peer_closed(), false)));
        // Once: a second close does not restart it.
        assert!(l.fail(peer_closed(), false).is_empty());
        let now = t0();
        assert!(l.handle_timeout(now).is_empty());
        assert_eq!(l.poll_timeout(), Some(now + T.linger));
        assert!(l.fail(peer_closed(), false).is_empty());
        assert!(l.handle_timeout(now + ms(299)).is_empty());
        let a = l.handle_timeout(now + ms(300));
        let f = failed(&a).expect("the linger ends");
        assert_eq!(f.why, "the peer closed the connection");
        assert!(!f.linger);
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn an_orderly_close_before_the_stream_is_up_fails_at_once() {
        let mut l = life();
        l.connecting();
        assert!(failed(&l.fail(peer_closed(), false)).is_some());
    }

    #[test]
    fn a_failure_while_lingering_supersedes_it() {
        let mut l = life();
        l.established(true);
        l.fail(peer_closed(), false);
        let now = t0();
        l.handle_timeout(now);
        assert!(failed(&l.fail(Fail::stream("reset"), false)).is_some());
        assert_eq!(l.poll_timeout(), None, "the linger ended with it");
    }

    #[test]
    fn a_terminate_written_at_once_fails_the_qp_with_its_failure() {
        let mut l = life();
        l.established(true);
        let f = a_terminate();
        let body = f.term.clone().unwrap();
        let a = l.fail(f, false);
        assert!(matches!(&a[..], [Action::Terminate(b)] if *b == body));
        // Meanwhile later failures are dropped: the first stands.
        assert!(l.fail(Fail::stream("later"), false).is_empty());
        assert!(l.fail(Fail::timed_out("later"), false).is_empty());
        let a = l.terminate_written();
        let f = failed(&a).expect("the failure applies");
        assert_eq!(f.sq_status, Some(Status::LocalProtection));
        assert_eq!(f.term.as_deref(), Some(&body[..]), "kept whole");
        assert!(l.terminating().is_none());
    }

    #[test]
    fn a_terminate_waits_for_room_then_times_out() {
        let mut l = life();
        l.established(true);
        assert!(matches!(
            l.fail(a_terminate(), false)[..],
            [Action::Terminate(_)]
        ));
        assert!(matches!(
            l.terminate_blocked()[..],
            [Action::StopReading, Action::Timer]
        ));
        assert!(l.awaits_room());
        assert_eq!(l.terminating().unwrap().why, "bad lkey");
        let now = t0();
        assert!(l.handle_timeout(now).is_empty());
        assert_eq!(l.poll_timeout(), Some(now + TERMINATE_WAIT));
        assert!(l.fail(Fail::stream("later"), false).is_empty());
        assert!(l.handle_timeout(now + ms(999)).is_empty());
        let a = l.handle_timeout(now + TERMINATE_WAIT);
        let f = failed(&a).expect("fails without the rest of the Terminate");
        assert_eq!(f.why, "bad lkey");
        assert!(!l.awaits_room());
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn a_terminate_that_gets_room_fails_the_qp_then() {
        let mut l = life();
        l.established(true);
        l.fail(a_terminate(), false);
        l.terminate_blocked();
        let now = t0();
        l.handle_timeout(now);
        assert!(failed(&l.terminate_written()).is_some());
        assert!(l.handle_timeout(now + ms(2000)).is_empty());
    }

    #[test]
    fn a_terminate_wait_ends_quietly_if_the_qp_failed_meanwhile() {
        let mut l = life();
        l.established(true);
        l.fail(a_terminate(), false);
        l.terminate_blocked();
        let now = t0();
        l.handle_timeout(now);
        // The application moves the QP to the error state.
        l.entered_error(true, None, None);
        assert_eq!(l.poll_timeout(), Some(now + TERMINATE_WAIT));
        assert!(l.handle_timeout(now + TERMINATE_WAIT).is_empty());
        assert_eq!(l.poll_timeout(), None);
        // Or the stream went with it.
        let mut l = life();
        l.fail(a_terminate(), false);
        l.terminate_blocked();
        l.entered_error(true, None, None);
        assert!(l.terminate_written().is_empty());
    }

    #[test]
    fn after_the_error_state_a_failure_only_flushes() {
        let mut l = life();
        l.established(true);
        let steps = l.entered_error(true, None, Some(Event::QpFatal));
        assert_eq!(steps.len(), 5);
        // No Terminate, no linger: the stream is gone.
        let f = failed(&l.fail(a_terminate(), false)).map(|f| f.why.clone());
        assert_eq!(f.as_deref(), Some("bad lkey"));
        assert!(failed(&l.fail(peer_closed(), false)).is_some());
        assert_eq!(
            l.entered_error(false, Some(Status::LocalLength), Some(Event::QpFatal)),
            [Step::Flush]
        );
    }

    #[test]
    fn the_error_state_is_entered_in_order() {
        let mut l = life();
        assert_eq!(
            l.entered_error(true, Some(Status::RemoteAccess), Some(Event::QpAccessError)),
            [
                Step::Detach,
                Step::Close,
                Step::Mirror,
                Step::FailRecv(Status::RemoteAccess),
                Step::Raise(Event::QpAccessError),
                Step::Flush,
            ]
        );
        // The application's own: no event.
        let mut l = life();
        assert_eq!(
            l.entered_error(true, None, None),
            [Step::Detach, Step::Close, Step::Mirror, Step::Flush]
        );
        assert!(l.errored());
    }

    #[test]
    fn entering_the_error_state_ends_the_attempt() {
        let mut l = life();
        l.connecting();
        l.refused();
        let now = t0();
        l.handle_timeout(now);
        l.entered_error(true, None, Some(Event::QpFatal));
        assert_eq!(l.poll_timeout(), None);
        assert!(l.handle_timeout(now + ms(10_000)).is_empty());
    }

    #[test]
    fn closing_ends_the_deadlines_but_not_a_terminate_wait() {
        let mut l = life();
        l.established(true);
        l.fail(peer_closed(), false);
        let now = t0();
        l.handle_timeout(now);
        l.close();
        assert_eq!(l.poll_timeout(), None);
        assert!(l.handle_timeout(now + ms(1000)).is_empty());

        let mut l = life();
        l.established(true);
        l.fail(a_terminate(), false);
        l.terminate_blocked();
        l.handle_timeout(now);
        l.close();
        assert_eq!(l.poll_timeout(), Some(now + TERMINATE_WAIT));
        assert!(failed(&l.handle_timeout(now + TERMINATE_WAIT)).is_some());
    }

    #[test]
    fn reset_clears_everything() {
        let mut l = life();
        l.connecting();
        l.established(false);
        l.fail(peer_closed(), false);
        l.refused();
        let now = t0();
        l.handle_timeout(now);
        l.fail(a_terminate(), false);
        l.terminate_blocked();
        l.handle_timeout(now);
        l.entered_error(false, None, None);
        l.reset();
        assert_eq!(l.poll_timeout(), None);
        assert!(!l.awaits_room() && l.terminating().is_none() && !l.errored());
        assert!(l.handle_timeout(now + ms(10_000)).is_empty());
        assert_eq!(l.timings(), T);
        // And the QP starts afresh: a failure fails it, with its Terminate.
        assert!(matches!(
            l.fail(Fail::terminate(Cause::MPA_CRC, None, None, "crc"), false)[..],
            [Action::Terminate(_)]
        ));
    }

    #[test]
    fn a_linger_fires_even_while_a_terminate_waits() {
        // As it always has: whichever deadline passes first fails the QP.
        let mut l = life();
        l.established(true);
        l.fail(peer_closed(), false);
        let now = t0();
        l.handle_timeout(now);
        // A failure with a Terminate while lingering: it is sent.
        assert!(matches!(
            l.fail(a_terminate(), false)[..],
            [Action::Terminate(_)]
        ));
        l.terminate_blocked();
        l.handle_timeout(now + ms(10));
        let a = l.handle_timeout(now + T.linger);
        assert_eq!(
            failed(&a).map(|f| f.why.as_str()),
            Some("the peer closed the connection")
        );
        l.entered_error(true, None, Some(Event::QpFatal));
        assert!(l.handle_timeout(now + ms(2000)).is_empty());
        assert_eq!(l.poll_timeout(), None);
    }
}
