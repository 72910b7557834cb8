//! Finding the coordinator, and giving up on it.

use std::time::Instant;

use tracing::info;

use super::super::common::{Lookup, coordinator_answer};
use super::GroupMember;
use super::errors::{Reaction, reaction};
use super::types::RequestId;

impl GroupMember {
    pub(super) fn on_find_coordinator(
        &mut self,
        now: Instant,
        id: RequestId,
        error: i16,
        node_id: i32,
        host: String,
        port: i32,
    ) {
        let answer = coordinator_answer(
            &mut self.coordinator,
            &mut self.backoff,
            &mut self.events,
            &self.config.group_id,
            now,
            id,
            error,
            (node_id, host, port),
        );
        match answer {
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
        if let Some(hb) = &mut self.heartbeat {
            hb.next_at = now;
            hb.last_ok = now;
            // One still unanswered went to the old coordinator; its answer, if it ever
            // comes, no longer counts.
            hb.in_flight = None;
        }
    }

    pub(super) fn mark_coordinator_unknown(&mut self, now: Instant) {
        let first = self.config.retry_backoff;
        if let Some((node, rediscoveries, wait)) =
            self.coordinator.mark_unknown(now, first, &mut self.backoff)
        {
            info!(group = %self.config.group_id, coordinator = node.0, rediscoveries, ?wait, "coordinator unknown; rediscovering");
        }
    }
}
