//! A coordinator found: what it means to the classic member.

use std::time::Instant;

use super::GroupMember;

impl GroupMember {
    pub(super) fn coordinator_found(&mut self, now: Instant) {
        // A coordinator found starts the rejoin backoff over, as before the lookup had
        // a failure count of its own.
        self.failures = 0;
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
