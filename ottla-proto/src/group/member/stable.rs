//! In a generation: heartbeats, commits, committed offsets, and leaving the generation
//! (a rebalance, a revocation, a reset).

use crate::group::messages::OffsetFetchAnswer;
use std::collections::BTreeSet;
use std::time::Instant;

use kafka_protocol::ResponseError;

use super::super::assignor::RebalanceProtocol;
use super::super::common::{Offsets, PendingFetch};
use super::super::consumer_protocol::TopicPartition;
use super::super::messages::CommitOffset;
use super::GroupMember;
use super::errors::{Reaction, commit_reaction, heartbeat_reaction, reaction};
use super::state::{AfterRevoke, State};
use crate::error_name;
use crate::group::types::{CommitError, Event, LostReason, RequestId};

impl GroupMember {
    pub(super) fn on_heartbeat(
        &mut self,
        now: Instant,
        id: RequestId,
        generation: i32,
        error: i16,
    ) {
        let syncing = matches!(
            self.state,
            State::Assigning { .. } | State::Syncing { .. } | State::LeaderDelay { .. }
        );
        let Some(hb) = self.state.heartbeat_mut() else {
            return;
        };
        if hb.in_flight != Some(id) {
            return;
        }
        hb.in_flight = None;
        if hb.generation != generation {
            return;
        }
        // REBALANCE_IN_PROGRESS is an answer from a broker that still counts this member
        // in: it renews the session as a success does.
        // From when it was sent, not answered: an answer read late (a slow network, a
        // starved runtime) must not stretch the session past the broker's.
        if error == 0 || error == ResponseError::RebalanceInProgress.code() {
            hb.last_ok = hb.last_ok.max(hb.sent_at);
        }
        if error == 0 {
            hb.failures = 0;
            return;
        }
        match heartbeat_reaction(error) {
            Reaction::Rediscover => self.core.mark_coordinator_unknown(now),
            Reaction::Retry => {
                hb.failures += 1;
                hb.next_at = now + self.core.backoff.delay(hb.failures);
            }
            // While syncing the rebalance is this one (Java ignores the answer
            // outside STABLE).
            Reaction::Rebalance if syncing => {}
            Reaction::Rebalance => self.rebalance(now, "the group is rebalancing"),
            Reaction::ResetMember => {
                self.reset(now, LostReason::UnknownMember, true, "unknown member id")
            }
            Reaction::ResetGeneration | Reaction::Rejoin => self.reset(
                now,
                LostReason::IllegalGeneration,
                false,
                "illegal generation",
            ),
            Reaction::Fatal => self.fatal("Heartbeat", error),
        }
    }

    pub(super) fn on_commit(
        &mut self,
        now: Instant,
        id: RequestId,
        generation: i32,
        offsets: Vec<CommitOffset>,
        partitions: Vec<(TopicPartition, i16)>,
    ) {
        let first_error = partitions.iter().map(|(_, e)| *e).find(|e| *e != 0);
        // A commit of the generation a cooperative member is leaving can reach the
        // coordinator after the member's JoinGroup: ILLEGAL_GENERATION or
        // REBALANCE_IN_PROGRESS then speak of that older generation, and the join in
        // flight (or the sync) decides the member's fate, not this answer. (Java: a
        // commit whose generation changed meanwhile gets RebalanceInProgressException
        // and resets nothing.)
        let rejoining = matches!(
            self.state,
            State::Joining { .. }
                | State::Assigning { .. }
                | State::LeaderDelay { .. }
                | State::Syncing { .. }
        ) && first_error.is_some_and(|code| {
            code == ResponseError::IllegalGeneration.code()
                || code == ResponseError::RebalanceInProgress.code()
        });
        let stale = self.generation() != Some(generation) || rejoining;
        let result = match first_error {
            None => Ok(offsets),
            Some(_) if stale => Err(CommitError::Stale { generation }),
            Some(code) => Err(CommitError::Broker {
                code,
                name: error_name(code),
            }),
        };
        self.core
            .events
            .push_back(Event::CommitCompleted { id, result });
        let Some(code) = first_error else { return };
        if stale {
            return;
        }
        let Some(reaction) = commit_reaction(code).member else {
            return;
        };
        match reaction {
            Reaction::Rediscover => self.core.mark_coordinator_unknown(now),
            Reaction::Retry | Reaction::Rejoin => {}
            Reaction::Rebalance => {
                if matches!(self.state, State::Stable { .. }) {
                    self.rebalance(now, "commit found the group rebalancing");
                }
            }
            Reaction::ResetMember => self.reset(
                now,
                LostReason::UnknownMember,
                true,
                "unknown member id on commit",
            ),
            Reaction::ResetGeneration => self.reset(
                now,
                LostReason::IllegalGeneration,
                false,
                "illegal generation on commit",
            ),
            Reaction::Fatal => self.fatal("OffsetCommit", code),
        }
    }

    pub(super) fn on_offset_fetch(
        &mut self,
        now: Instant,
        id: RequestId,
        asked: BTreeSet<TopicPartition>,
        answer: OffsetFetchAnswer,
    ) {
        let fatal = |code| reaction(code) == Reaction::Fatal;
        match self.core.offsets_answer(now, id, &asked, answer, fatal) {
            Offsets::Fatal(code) => self.fatal("OffsetFetch", code),
            Offsets::Rediscover => self.core.mark_coordinator_unknown(now),
            Offsets::Taken => {}
        }
    }

    /// A rebalance is needed while in a generation: eager members give everything back
    /// first; cooperative members rejoin keeping their partitions.
    pub(super) fn rebalance(&mut self, now: Instant, reason: &str) {
        // The hold of the second bounce may have passed during the generation.
        self.maybe_upgrade(now);
        let Some(generation) = self.generation.clone() else {
            return self.enter_unjoined(now, false, reason);
        };
        let State::Stable { heartbeat } = &self.state else {
            return;
        };
        if generation.rebalance == RebalanceProtocol::Eager && !self.core.owned.is_empty() {
            let partitions = self.assignment();
            // Heartbeats go on while the application gives the partitions back, as in
            // the Java client: until this member sends its JoinGroup, the broker still
            // expects its heartbeats, and removes it after `session_timeout` without
            // them, however long the rebalance timeout is.
            self.state = State::Revoking {
                heartbeat: heartbeat.clone(),
                generation: generation.id,
                partitions: partitions.clone(),
                deadline: now + self.core.config.max_poll_interval,
                then: AfterRevoke::Rejoin {
                    reason: reason.to_string(),
                },
            };
            self.core.events.push_back(Event::RevokeRequested {
                generation: generation.id,
                partitions,
            });
        } else {
            self.enter_unjoined(now, false, reason);
        }
    }

    pub(super) fn finish_revocation(&mut self, now: Instant) {
        let State::Revoking {
            heartbeat,
            generation,
            then,
            ..
        } = std::mem::replace(&mut self.state, State::Suspended)
        else {
            return;
        };
        self.state = State::Stable { heartbeat };
        match then {
            AfterRevoke::Rejoin { reason } => {
                self.core.owned.clear();
                self.enter_unjoined(now, false, &reason);
            }
            AfterRevoke::Assign { added, rejoin } => {
                self.grant(now, generation, added);
                if rejoin {
                    self.enter_unjoined(now, false, "second round of a cooperative rebalance");
                }
            }
        }
    }

    /// Hands `added` to the application and asks for their committed offsets.
    pub(super) fn grant(&mut self, now: Instant, generation: i32, added: Vec<TopicPartition>) {
        if added.is_empty() {
            return;
        }
        self.core.owned.extend(added.iter().cloned());
        self.core.events.push_back(Event::Assigned {
            generation,
            added: added.clone(),
            assignment: self.assignment(),
        });
        PendingFetch::grant(
            &mut self.core.fetch,
            now,
            generation,
            added,
            &self.core.owned,
        );
    }

    /// Leaves the generation: heartbeats stop; the member rejoins after `backoff` (or at
    /// once). Owned partitions stay owned (cooperative), unless the caller lost them.
    pub(super) fn enter_unjoined(&mut self, now: Instant, with_backoff: bool, reason: &str) {
        if matches!(
            self.state,
            State::Closed(_) | State::Leaving { .. } | State::Suspended
        ) {
            return;
        }
        let join_at = if with_backoff {
            self.failures += 1;
            now + self.core.backoff.delay(self.failures)
        } else {
            now
        };
        // Heartbeats stop (with the state that holds them) until the next generation
        // forms: from its JoinGroup on, the broker counts a member as alive until the
        // rebalance completes. A member that keeps partitions while it rejoins keeps
        // its session clock (see `session_lapsed`).
        if let Some(hb) = self.state.heartbeat() {
            self.kept_session = Some(hb.last_ok);
        }
        self.state = State::Unjoined {
            join_at,
            reason: reason.to_string(),
        };
    }

    /// The generation is gone: partitions are lost, and the member id too if the
    /// broker no longer knows it.
    pub(super) fn reset(
        &mut self,
        now: Instant,
        why: LostReason,
        forget_member: bool,
        reason: &str,
    ) {
        self.core.lose_all(why);
        self.kept_session = None;
        self.leave_generation();
        if forget_member {
            self.core.member_id.clear();
        }
        self.enter_unjoined(now, false, reason);
        self.rejoin_held = self.closing;
    }

    /// Out of the generation: no generation to commit with, no committed offsets to
    /// fetch. What the member owns is the caller's to settle; heartbeats end with the
    /// state the caller moves to.
    pub(super) fn leave_generation(&mut self) {
        self.generation = None;
        self.core.fetch = None;
    }
}
