//! Finding the coordinator, and giving up on it.

use std::time::Instant;

use tracing::info;

use super::GroupMember;
use super::errors::{Reaction, reaction};
use super::state::Coordinator;
use super::types::{Event, RequestId};
use crate::proto::metadata::NodeId;

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
        let Coordinator::Unknown { lookup, retry_at } = &mut self.coordinator else {
            return;
        };
        if lookup.map(|(l, _)| l) != Some(id) {
            return;
        }
        *lookup = None;
        if error != 0 || node_id < 0 {
            match reaction(error) {
                Reaction::Fatal => return self.fatal("FindCoordinator", error),
                _ => {
                    self.failures += 1;
                    *retry_at = now + self.backoff.delay(self.failures);
                    return;
                }
            }
        }
        self.failures = 0;
        let node = NodeId(node_id);
        self.coordinator = Coordinator::Known(node);
        self.coordinator_epoch += 1;
        info!(group = %self.config.group_id, coordinator = node_id, %host, port, "coordinator found");
        self.events.push_back(Event::CoordinatorFound {
            node,
            address: format!("{host}:{port}"),
        });
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
        if let Coordinator::Known(node) = self.coordinator {
            // The first rediscovery waits retry.backoff.ms; a coordinator that keeps
            // refusing after being found again is asked at a pace that backs off to
            // retry.backoff.max.ms (KIP-580), until a request goes through.
            self.rediscoveries = self.rediscoveries.saturating_add(1);
            let wait = if self.rediscoveries <= 1 {
                self.config.retry_backoff
            } else {
                self.backoff.delay(self.rediscoveries)
            };
            info!(group = %self.config.group_id, coordinator = node.0, rediscoveries = self.rediscoveries, ?wait, "coordinator unknown; rediscovering");
            self.coordinator = Coordinator::Unknown {
                lookup: None,
                retry_at: now + wait,
            };
        }
    }
}
