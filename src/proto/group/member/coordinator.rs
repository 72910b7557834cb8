//! A coordinator found: what it means to the classic member.

use std::time::Instant;

use super::super::common::Lookup;
use super::GroupMember;
use super::errors::{Reaction, reaction};
use super::types::RequestId;

impl GroupMember {
    pub(super) fn on_find_coordinator(
        &mut self,
        now: Instant,
        id: RequestId,
        error: i16,
        node: (i32, String, i32),
    ) {
        match self.core.coordinator_answer(now, id, error, node) {
            Lookup::Refused(code) if reaction(code) == Reaction::Fatal => {
                return self.fatal("FindCoordinator", code);
            }
            Lookup::Stale | Lookup::Refused(_) => return,
            // A coordinator found starts the rejoin backoff over, as before the lookup
            // had a failure count of its own.
            Lookup::Found(_) => self.failures = 0,
        }
        // Heartbeats resume on the new coordinator at once, with a fresh session clock
        // (Java's `heartbeat.resetSessionTimeout()` on a coordinator found).
        if let Some(hb) = self.state.heartbeat_mut() {
            hb.next_at = now;
            hb.last_ok = now;
            // One still unanswered went to the old coordinator; its answer, if it ever
            // comes, no longer counts.
            hb.in_flight = None;
        }
    }
}
