//! A coordinator found: what it means to the classic member.

use std::time::Instant;

use super::GroupMember;

impl GroupMember {
    pub(super) fn coordinator_found(&mut self, now: Instant) {
        // A coordinator found starts the rejoin backoff over, as before the lookup had
        // a failure count of its own.
        self.failures = 0;
        // Heartbeats resume on the new coordinator at once. The session clock goes on:
        // Java resets it here (`heartbeat.resetSessionTimeout()`), but the broker renewed
        // nothing, and a member that took the lookup for a renewal handled partitions
        // for up to a session after the broker had expired it (chaos under load).
        if let Some(hb) = self.state.heartbeat_mut() {
            hb.next_at = now;
            // One still unanswered went to the old coordinator; its answer, if it ever
            // comes, no longer counts.
            hb.in_flight = None;
        }
    }
}
