//! The timer table: which timer is armed in which state, and what firing it does.

use std::collections::BTreeSet;
use std::time::Instant;

use tracing::warn;

use super::GroupMember;
use super::state::State;
use crate::group::types::{Event, Failure, LostReason, Timer};

impl GroupMember {
    /// The earliest armed timer and when it fires.
    pub fn next_timer(&self) -> Option<(Timer, Instant)> {
        self.armed().into_iter().min_by_key(|(_, at)| *at)
    }

    /// Every armed timer and when it fires: the one table that [`GroupMember::next_timer`]
    /// reads, [`GroupMember::handle_timeout`] fires from, and whose sends
    /// (`Coordinator`, `Join`, `Sync`, `Heartbeat`, `OffsetFetch`) `advance` makes.
    fn armed(&self) -> Vec<(Timer, Instant)> {
        let mut timers: Vec<(Timer, Instant)> = Vec::new();
        let in_group = !matches!(
            self.state,
            State::Closed(_) | State::Suspended | State::Leaving { .. }
        );
        if in_group {
            timers.extend(self.core.coordinator.timer());
        }
        match &self.state {
            State::Unjoined { join_at, .. }
                if self.coordinator().is_some() && !self.rejoin_held =>
            {
                timers.push((Timer::Join, *join_at))
            }
            State::Joining { deadline, .. }
            | State::Assigning { deadline, .. }
            | State::Syncing { deadline, .. }
            | State::Leaving { deadline, .. } => timers.push((Timer::Request, *deadline)),
            State::Revoking { deadline, .. } => timers.push((Timer::Revocation, *deadline)),
            // Armed only when `advance` can send it: a timer that fires and does nothing
            // stays in the past and spins the driver (found by fuzzing).
            State::LeaderDelay { send_at, .. } if self.coordinator().is_some() => {
                timers.push((Timer::Sync, *send_at))
            }
            _ => {}
        }
        if let Some(hb) = self.state.heartbeat() {
            if hb.in_flight.is_none() && self.coordinator().is_some() {
                timers.push((Timer::Heartbeat, hb.next_at));
            }
            timers.push((
                Timer::Session,
                hb.last_ok + self.core.config.session_timeout,
            ));
        } else if let Some(at) = self.kept_session_deadline() {
            timers.push((Timer::Session, at));
        }
        if let Some(at) = self.metadata_at.filter(|_| in_group) {
            timers.push((Timer::Metadata, at));
        }
        if in_group {
            timers.push((Timer::Progress, self.core.progress_deadline()));
        }
        // As `advance` decides to send it: in the group, with partitions left to ask for
        // (a revocation may have taken them all while a retry was pending).
        if in_group && self.coordinator().is_some() {
            if let Some(at) = self.core.offsets_due_at() {
                timers.push((Timer::OffsetFetch, at));
            }
        }
        timers
    }

    // ----- inputs -----

    /// The clock moved; fire whatever is due, in the order of `FIRING`, each timer
    /// looked up again in the table after the one before fired; then send what is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        for timer in FIRING {
            let due = self.armed().iter().any(|(t, at)| *t == timer && now >= *at);
            if due {
                self.fire(now, timer);
            }
        }
        self.advance(now);
    }

    /// What a due timer does, besides the sends `advance` makes.
    fn fire(&mut self, now: Instant, timer: Timer) {
        match timer {
            Timer::Revocation => self.revocation_timed_out(now),
            Timer::Session => self.session_lapsed(now),
            Timer::Request => self.requests_overdue(now),
            Timer::Metadata => self.metadata_due(now),
            Timer::Progress => self.progress_timeout(now),
            Timer::Coordinator
            | Timer::Join
            | Timer::Sync
            | Timer::Heartbeat
            | Timer::OffsetFetch => {}
        }
    }

    fn revocation_timed_out(&mut self, now: Instant) {
        if let State::Revoking {
            deadline,
            partitions,
            ..
        } = &self.state
        {
            if now >= *deadline {
                let partitions = partitions.clone();
                warn!(group = %self.core.config.group_id, "revocation not completed within the rebalance timeout; partitions lost");
                self.core.lose(partitions, LostReason::RevocationTimedOut);
                self.finish_revocation(now);
            }
        }
    }

    fn session_lapsed(&mut self, now: Instant) {
        // A session with no successful heartbeat: the coordinator has, in all
        // likelihood, removed this member and given its partitions to others already
        // (its clock is the same session timeout, started no later). Keeping them, as
        // the Java client's heartbeat thread does (it only rediscovers the coordinator),
        // leaves a zombie that goes on processing partitions another member now owns
        // until the next heartbeat answer says so. As librdkafka ("session timed out
        // ... revoking assignment and rejoining group"), the partitions are lost here:
        // nothing more is committed for them and the member rejoins. Unlike librdkafka,
        // it keeps its member id: if the coordinator still knows it, the rejoin is
        // that member's, and if not, UNKNOWN_MEMBER_ID gives a fresh one; forgetting
        // the id here left a ghost the next join phase waited a whole session for.
        //
        // A cooperative member rejoining with the partitions it keeps has no heartbeat
        // from its JoinGroup to the next generation, and the clock runs on from the
        // last heartbeat accepted: a JoinGroup left unanswered for a session is a
        // silent coordinator, or one that moved (the librdkafka mock closes the join
        // phase a session after it began, and expels who has not rejoined). Java and
        // librdkafka check no session there (librdkafka only in its steady state) and
        // keep the partitions until the join answer or its timeout
        // (`max.poll.interval.ms` + 5 s): handled twice meanwhile (chaos under load).
        // The cost: on Kafka, which holds a JoinGroup up to the rebalance timeout, a
        // join phase longer than a session (a slow member) makes this member give its
        // partitions up and take them back from the last commit.
        let lapsed = match self.state.heartbeat_mut() {
            Some(hb) => now >= hb.last_ok + self.core.config.session_timeout,
            None => self.kept_session_deadline().is_some_and(|at| now >= at),
        };
        if lapsed {
            warn!(group = %self.core.config.group_id, member = %self.core.member_id, "no successful heartbeat within the session timeout; partitions lost, rediscovering the coordinator and rejoining");
            self.core.mark_coordinator_unknown(now);
            self.reset(now, LostReason::SessionLapsed, false, "session lapsed");
        }
    }

    /// When the session of a member rejoining with partitions kept runs out: armed only
    /// while it has no heartbeat and still owns partitions.
    fn kept_session_deadline(&self) -> Option<Instant> {
        let rejoining = matches!(self.state, State::Unjoined { .. } | State::Joining { .. });
        self.kept_session
            .filter(|_| rejoining && !self.core.owned.is_empty())
            .map(|at| at + self.core.config.session_timeout)
    }

    /// JoinGroup, SyncGroup, LeaveGroup and FindCoordinator past their deadlines.
    fn requests_overdue(&mut self, now: Instant) {
        let overdue = match &self.state {
            State::Joining { request, deadline }
            | State::Syncing {
                request, deadline, ..
            } if now >= *deadline => Some(*request),
            _ => None,
        };
        if let Some(id) = overdue {
            self.handle_failure(now, id, Failure::Timeout);
        }
        if matches!(self.state, State::Assigning { deadline, .. } if now >= deadline) {
            // The broker has given up on this leader's SyncGroup by now (it waits for
            // the rebalance timeout); the late result is dropped when it comes.
            warn!(group = %self.core.config.group_id, "the assignment took longer than the rebalance timeout (max.poll.interval.ms); rejoining");
            self.enter_unjoined(
                now,
                true,
                "the assignment took longer than the rebalance timeout",
            );
        }
        if let State::Leaving { deadline, .. } = &self.state {
            if now >= *deadline {
                self.close(None);
            }
        }
        if let Some(id) = self.core.coordinator.overdue(now) {
            self.handle_failure(now, id, Failure::Timeout);
        }
    }

    /// The leader's periodic metadata check.
    fn metadata_due(&mut self, now: Instant) {
        self.metadata_at = Some(now + self.core.config.metadata_max_age);
        let topics: BTreeSet<String> = self
            .core
            .config
            .topics
            .iter()
            .chain(self.other_topics.iter())
            .cloned()
            .collect();
        self.core.events.push_back(Event::MetadataNeeded {
            topics: topics.into_iter().collect(),
        });
    }
}

/// The order in which due timers fire: a revocation's deadline first (its partitions
/// are lost before anything else looks at them), the session, overdue requests, then
/// the leader's metadata check and the progress guard.
const FIRING: [Timer; 5] = [
    Timer::Revocation,
    Timer::Session,
    Timer::Request,
    Timer::Metadata,
    Timer::Progress,
];
