//! A test harness for the group members, shared by their own scenario tests and by
//! suites outside the crate (the `testing` feature): a member on a virtual clock, with
//! the steps every scenario takes (drain requests and events, move the clock, answer a
//! request, find the coordinator).
//!
//! Protocol-specific steps (a classic join, a consumer-protocol heartbeat) stay with
//! the tests of each protocol, as inherent `impl`s inside the crate or extension
//! traits outside it.

use std::time::{Duration, Instant};

use super::member::{Event, LostReason, Outgoing, RequestId, StateKind};
use super::messages::{GroupRequest, GroupResponse};

/// What the harness drives: either group member, through their one contract.
pub use super::GroupMachine as Machine;

/// A member `m` on a virtual clock `now`.
#[derive(Debug)]
pub struct Harness<M> {
    /// The member.
    pub m: M,
    /// The clock.
    pub now: Instant,
}

impl<M: Machine> Harness<M> {
    /// `m`, created at `now`.
    pub fn at(m: M, now: Instant) -> Self {
        Harness { m, now }
    }

    /// The next request, which must exist.
    #[track_caller]
    pub fn request(&mut self) -> Outgoing {
        self.m.poll_request().expect("a request")
    }

    /// Asserts that no request is waiting.
    #[track_caller]
    pub fn no_request(&mut self) {
        assert_eq!(self.m.poll_request(), None);
    }

    /// Every request waiting.
    pub fn requests(&mut self) -> Vec<Outgoing> {
        std::iter::from_fn(|| self.m.poll_request()).collect()
    }

    /// Every event waiting but the consumer protocol's epoch news
    /// ([`Event::MemberEpoch`], which comes with most heartbeats there).
    pub fn events(&mut self) -> Vec<Event> {
        let mut events = self.all_events();
        events.retain(|e| !matches!(e, Event::MemberEpoch { .. }));
        events
    }

    /// Every event waiting.
    pub fn all_events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.m.poll_event()).collect()
    }

    /// Moves the clock by `d` and fires what is due.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.m.handle_timeout(self.now);
    }

    /// Answers request `id` now.
    pub fn respond(&mut self, id: RequestId, r: GroupResponse) {
        self.m.handle_response(self.now, id, r);
        // A leader's assignment is computed at once, on this thread.
        self.m.assign_inline(self.now);
    }

    /// Answers FindCoordinator `id` with node `node` at `h:1`.
    pub fn found(&mut self, id: RequestId, node: i32) {
        self.respond(
            id,
            GroupResponse::FindCoordinator {
                error: 0,
                node_id: node,
                host: "h".into(),
                port: 1,
            },
        );
    }

    /// Refuses FindCoordinator `id` with `code`.
    pub fn lookup_refused(&mut self, id: RequestId, code: i16) {
        self.respond(
            id,
            GroupResponse::FindCoordinator {
                error: code,
                node_id: -1,
                host: String::new(),
                port: -1,
            },
        );
    }

    /// The next request must be a FindCoordinator to any broker; answers it with
    /// `node`.
    #[track_caller]
    pub fn find_coordinator(&mut self, node: i32) {
        let out = self.request();
        assert!(
            matches!(out.request, GroupRequest::FindCoordinator { .. }),
            "{out:?}"
        );
        assert_eq!(out.target, super::member::Target::AnyBroker);
        self.found(out.id, node);
    }

    /// The application did not come back in time: the events say so and give up every
    /// partition, and the member is suspended until the application's next progress.
    #[track_caller]
    pub fn progress_timed_out(&mut self) {
        let ev = self.events();
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::ProgressTimeout { .. })),
            "{ev:?}"
        );
        assert!(lost(&ev, LostReason::ProgressTimeout), "{ev:?}");
        assert_eq!(self.m.state(), StateKind::Suspended);
    }
}

/// Whether `events` report partitions lost for `reason`.
pub fn lost(events: &[Event], reason: LostReason) -> bool {
    events
        .iter()
        .any(|e| matches!(e, Event::Lost { reason: r, .. } if *r == reason))
}
