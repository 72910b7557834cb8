//! The timer table: which timer is armed in which state, and what firing it does.

use std::time::Instant;

use tracing::warn;

use super::{ConsumerGroupMember, State, Timer};
use crate::group::member::{Failure, LostReason};

impl ConsumerGroupMember {
    /// The earliest armed timer and when it fires.
    pub fn next_timer(&self) -> Option<(Timer, Instant)> {
        let mut timers: Vec<(Timer, Instant)> = Vec::new();
        if self.has_business() {
            timers.extend(self.core.coordinator.timer());
        }
        if let State::Leaving { deadline, .. } = &self.state {
            timers.push((Timer::Request, *deadline));
        }
        if let State::Suspended {
            leave_owed: Some(_),
            leave_sent,
            give_up_at,
            ..
        } = &self.state
        {
            timers.push((Timer::Request, *give_up_at));
            if let Some((_, overdue)) = leave_sent {
                timers.push((Timer::Request, *overdue));
            }
        }
        let in_group = matches!(
            self.state,
            State::Joining | State::Stable | State::Revoking { .. }
        );
        // Only where `advance` sends one: a timer that fires and does nothing stays in
        // the past and spins the driver.
        if in_group && self.coordinator().is_some() {
            match self.heartbeat.in_flight {
                Some(f) => timers.push((Timer::Request, f.deadline)),
                // Joining and acknowledging go at once from `advance`; what is left to
                // wait for is the interval or a failure's backoff.
                None => timers.push((Timer::Heartbeat, self.heartbeat.next_at)),
            }
        }
        if let Some(at) = self.session_deadline() {
            timers.push((Timer::Session, at));
        }
        if let State::Revoking { deadline, .. } = &self.state {
            timers.push((Timer::Revocation, *deadline));
        }
        if in_group {
            timers.push((Timer::Progress, self.core.progress_deadline()));
        }
        if in_group && self.coordinator().is_some() {
            if let Some(at) = self.core.offsets_due_at() {
                timers.push((Timer::OffsetFetch, at));
            }
        }
        timers.into_iter().min_by_key(|(_, at)| *at)
    }

    // ----- inputs -----

    /// The clock moved; fire whatever is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if matches!(&self.state, State::Revoking { deadline, .. } if now >= *deadline) {
            // Every partition is lost, not only those under revocation: the member
            // rejoins as a new incarnation and owns nothing (Java's
            // `transitionToFenced`). Losing only the revoked ones left the kept ones
            // with the application, fetched and handled after the rejoin.
            warn!(group = %self.core.config.group_id, "revocation not completed within the rebalance timeout; partitions lost");
            self.fence(now, LostReason::RevocationTimedOut, "revocation timed out");
            self.leave_before_rejoining(
                now,
                "the revocation was not completed within the rebalance timeout",
            );
        }
        if self.session_deadline().is_some_and(|at| now >= at) {
            // No heartbeat accepted for a session: the broker has expired this member
            // and handed its partitions on (it starts its clock no earlier than the
            // request this member sent). Keeping them, as the Java client does, leaves
            // a zombie handling partitions another member owns until the coordinator
            // answers again; as the classic member, they are lost here and the member
            // rejoins under the same id once the coordinator is found again.
            warn!(group = %self.core.config.group_id, member = %self.core.member_id, session = ?self.core.config.session_timeout, "no heartbeat accepted within the session timeout; partitions lost, rediscovering the coordinator and rejoining");
            self.fence(now, LostReason::SessionLapsed, "session lapsed");
            self.mark_coordinator_unknown(now);
            self.leave_before_rejoining(now, "no heartbeat accepted within the session timeout");
        }
        if matches!(self.state, State::Leaving { deadline, .. } if now >= deadline) {
            self.close(None);
        }
        self.leave_owed_due(now);
        if let Some(f) = self.heartbeat.in_flight {
            if now >= f.deadline {
                self.handle_failure(now, f.id, Failure::Timeout);
            }
        }
        if let Some(id) = self.core.coordinator.overdue(now) {
            self.handle_failure(now, id, Failure::Timeout);
        }
        let in_group = matches!(
            self.state,
            State::Joining | State::Stable | State::Revoking { .. }
        );
        if in_group && now >= self.core.progress_deadline() {
            self.progress_timeout(now);
        }
        self.advance(now);
    }

    /// When the session lapses without a heartbeat accepted: in the group, once one
    /// was (`session.timeout.ms`, which the consumer protocol does not send: set it to
    /// the broker's `group.consumer.session.timeout.ms`, 45 s by default on Kafka as
    /// here).
    fn session_deadline(&self) -> Option<Instant> {
        if !matches!(self.state, State::Stable | State::Revoking { .. }) {
            return None;
        }
        Some(self.heartbeat.last_ok? + self.core.config.session_timeout)
    }
}
