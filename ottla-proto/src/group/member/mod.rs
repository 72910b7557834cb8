//! The group member: the classic consumer-group protocol as one sans-IO state machine.
//!
//! # Contract
//!
//! Inputs: [`GroupMember::handle_response`], [`GroupMember::handle_failure`] and
//! [`GroupMember::handle_timeout`] for the network and the clock; the application's
//! commands ([`GroupMember::commit`], [`GroupMember::complete_revocation`],
//! [`GroupMember::note_progress`], [`GroupMember::leave`],
//! [`GroupMember::set_topic_partitions`]). After every input, drain
//! [`GroupMember::poll_request`] and [`GroupMember::poll_event`] until `None`, then arm
//! one timer at [`GroupMember::poll_timeout`].
//!
//! Time only comes in as `now`; jitter comes from the configured seed. The same inputs
//! give the same outputs.
//!
//! # Timers
//!
//! | timer | armed while | fires |
//! |---|---|---|
//! | [`Timer::Coordinator`] | the coordinator is unknown and no lookup is in flight | a FindCoordinator is due (after backoff) |
//! | [`Timer::Join`] | `Unjoined`, coordinator known | JoinGroup is due (after backoff) |
//! | [`Timer::Request`] | a FindCoordinator, JoinGroup, SyncGroup or LeaveGroup is in flight | the response is overdue: treated as a failure |
//! | [`Timer::Heartbeat`] | a generation is live or being synced (from the JoinGroup answer on, as in the Java client), no heartbeat in flight | the next heartbeat is due |
//! | [`Timer::Session`] | as the heartbeat, and while a cooperative member rejoins with partitions kept | no successful heartbeat for `session_timeout`: the partitions are lost, the coordinator is looked up again and the member rejoins under the same member id |
//! | [`Timer::Revocation`] | waiting for the application to finish a revocation | the rebalance timeout ran out: the partitions are lost |
//! | [`Timer::Progress`] | the member is in the group | the application has not come back for records within `max_poll_interval` |
//! | [`Timer::OffsetFetch`] | an OffsetFetch must be retried for partitions still owned, coordinator known | the retry is due |
//! | [`Timer::Sync`] | a leader holds its SyncGroup (`leader_sync_delay`), coordinator known | the SyncGroup is sent |
//! | [`Timer::Metadata`] | this member assigned the live generation, in the group | [`Event::MetadataNeeded`] for every topic the group subscribes to, every `metadata_max_age` |
//!
//! A timer is armed only while firing it does something: one that fired and did nothing
//! would stay in the past and spin the driver's loop.

mod coordinator;
mod errors;
pub(crate) use errors::commit_reaction;
mod join;
mod revocation;
mod stable;
mod state;
mod timers;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use tracing::info;

use super::assignor::PartitionRacks;
use super::common::{self, Core};
use super::consumer_protocol::TopicPartition;
use super::messages::{CommitOffset, GroupRequest, GroupResponse};
pub use crate::group::types::{
    AssignmentDone, AssignmentJob, CommitError, DEFAULT_CLOSE_TIMEOUT, DEFAULT_COOPERATIVE_UPGRADE,
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_POLL_INTERVAL, DEFAULT_SESSION_TIMEOUT, Event, Failure,
    GroupConfig, GroupError, GroupProtocol, LostReason, Membership, Outgoing, RequestId, StateKind,
    Target, Timer, check_heartbeat,
};
use crate::metadata::NodeId;
use errors::{Reaction, hint, reaction};
pub use revocation::{PendingRevocation, RevocationCommit, RevocationStep};
use state::{Generation, Sent, State};

/// One member of a consumer group (the classic protocol).
#[derive(Debug)]
pub struct GroupMember {
    /// What both protocols' members hold: OffsetCommits wait there one on the wire at
    /// a time in the order made, each built with the generation it was made in.
    core: Core<Sent, (GroupRequest, Sent)>,
    state: State,
    generation: Option<Generation>,
    /// The last assignment received, kept for sticky assignors' user data.
    last_assignment: Vec<TopicPartition>,
    last_generation: i32,
    /// Partition counts of subscribed topics, for the leader.
    partitions_per_topic: BTreeMap<String, i32>,
    /// Topics other members subscribe to, whose counts a leader also needs.
    other_topics: BTreeSet<String>,
    /// The racks of each partition's replicas, for rack-aware assignment.
    /// Shared with the assignment job (no copy of a large cluster's map per rebalance).
    partition_racks: Arc<PartitionRacks>,
    /// The leader's last cooperative assignment left partitions for a second round.
    held_back: bool,
    /// What the leader assigned with, to notice metadata changes that need a rebalance.
    assigned_with: Option<BTreeMap<String, i32>>,
    /// When the leader next asks for fresh metadata (while `assigned_with` is set).
    metadata_at: Option<Instant>,
    /// JoinGroups and SyncGroups failed in a row, for the rejoin backoff.
    failures: u32,
    /// The application is closing ([`GroupMember::prepare_to_close`]).
    closing: bool,
    /// Closing, the member lost its generation: it does not join again, and the
    /// LeaveGroup that follows goes out at once.
    rejoin_held: bool,
    /// While a cooperative member rejoins with the partitions it keeps (no heartbeat
    /// from its JoinGroup to the next generation): the start of its session as the
    /// broker last renewed it, the send time of the last heartbeat accepted.
    /// [`Timer::Session`] runs on from it until the next generation starts.
    kept_session: Option<Instant>,
    /// The leader's assignment, until the driver takes it ([`GroupMember::poll_assignment`]).
    assignment_job: Option<AssignmentJob>,
    /// The id of the last assignment job made.
    next_job: u64,
    /// Since when every generation chose a cooperative assignor (the first of the
    /// run), for the automatic second bounce ([`GroupConfig::cooperative_upgrade`]).
    cooperative_since: Option<Instant>,
    /// The second bounce happened: the member offers its cooperative assignors only.
    upgraded: bool,
    /// The subscription changed while a rebalance was under way: rejoin once it ends.
    resubscribe: bool,
}

impl GroupMember {
    /// A member that will look for its coordinator at once.
    pub fn new(config: GroupConfig, now: Instant) -> Self {
        let mut member = Self {
            core: Core::new(config, String::new(), now),
            state: State::Unjoined {
                join_at: now,
                reason: "first join".into(),
            },
            generation: None,
            last_assignment: Vec::new(),
            last_generation: -1,
            partitions_per_topic: BTreeMap::new(),
            other_topics: BTreeSet::new(),
            partition_racks: Arc::new(PartitionRacks::new()),
            held_back: false,
            assigned_with: None,
            metadata_at: None,
            failures: 0,
            closing: false,
            rejoin_held: false,
            kept_session: None,
            assignment_job: None,
            next_job: 0,
            cooperative_since: None,
            upgraded: false,
            resubscribe: false,
        };
        member.advance(now);
        member
    }

    // ----- getters -----

    /// The lifecycle state.
    pub fn state(&self) -> StateKind {
        match &self.state {
            State::Unjoined { .. } => StateKind::Unjoined,
            State::Joining { .. } => StateKind::Joining,
            State::Assigning { .. } | State::Syncing { .. } | State::LeaderDelay { .. } => {
                StateKind::Syncing
            }
            State::Stable { .. } => StateKind::Stable,
            State::Revoking { .. } => StateKind::Revoking,
            State::Suspended => StateKind::Suspended,
            State::Leaving { .. } => StateKind::Leaving,
            State::Closed(_) => StateKind::Closed,
        }
    }

    /// The live generation, if any.
    pub fn generation(&self) -> Option<i32> {
        self.generation.as_ref().map(|g| g.id)
    }

    common::member_surface!();

    /// The answer to request `id`, sent for `sent` (FindCoordinator and OffsetFetch aside); a
    /// response of another kind is given back.
    fn on_response(
        &mut self,
        now: Instant,
        id: RequestId,
        sent: Sent,
        response: GroupResponse,
    ) -> Option<(Sent, GroupResponse)> {
        match (sent, response) {
            (
                Sent::Join,
                GroupResponse::JoinGroup {
                    error,
                    generation,
                    protocol_name,
                    leader,
                    member_id,
                    members,
                    skip_assignment,
                },
            ) => self.on_join(
                now,
                id,
                error,
                generation,
                protocol_name,
                leader,
                member_id,
                members,
                skip_assignment,
            ),
            (
                Sent::Sync,
                GroupResponse::SyncGroup {
                    error, assignment, ..
                },
            ) => self.on_sync(now, id, error, assignment),
            (Sent::Heartbeat { generation }, GroupResponse::Heartbeat { error }) => {
                self.on_heartbeat(now, id, generation, error)
            }
            (Sent::Leave, GroupResponse::LeaveGroup { .. }) => {
                if matches!(self.state, State::Leaving { request: Some(r), .. } if r == id) {
                    self.close(None);
                }
            }
            (
                Sent::Commit {
                    generation,
                    offsets,
                },
                GroupResponse::OffsetCommit { partitions },
            ) => self.on_commit(now, id, generation, offsets, partitions),
            (sent, response) => return Some((sent, response)),
        }
        None
    }

    /// Request `id`, sent for `sent` (FindCoordinator and OffsetFetch aside), failed without a
    /// response; `same_coordinator`: it went to the coordinator known now.
    fn on_failure(
        &mut self,
        now: Instant,
        id: RequestId,
        sent: Sent,
        same_coordinator: bool,
        failure: Failure,
    ) {
        match sent {
            // Taken by `handle_failure` (`member_surface!`).
            Sent::FindCoordinator | Sent::OffsetFetch { .. } => {}
            // Java marks the coordinator unknown on any failed coordinator request: the
            // connection is gone, and the coordinator may have moved with it.
            Sent::Join => {
                if matches!(self.state, State::Joining { request, .. } if request == id) {
                    if same_coordinator {
                        self.core.mark_coordinator_unknown(now);
                    }
                    self.enter_unjoined(now, true, "JoinGroup failed");
                }
            }
            Sent::Sync => {
                if matches!(&self.state, State::Syncing { request, .. } if *request == id) {
                    if same_coordinator {
                        self.core.mark_coordinator_unknown(now);
                    }
                    self.enter_unjoined(now, true, "SyncGroup failed");
                }
            }
            Sent::Heartbeat { generation } => {
                let mut current = false;
                if let Some(hb) = self.state.heartbeat_mut() {
                    if hb.in_flight == Some(id) {
                        hb.in_flight = None;
                        hb.failures += 1;
                        hb.next_at = now + self.core.backoff.delay(hb.failures);
                    }
                    current = hb.generation == generation && same_coordinator;
                }
                if current {
                    self.core.mark_coordinator_unknown(now);
                }
            }
            Sent::Leave => {
                if matches!(self.state, State::Leaving { request: Some(r), .. } if r == id) {
                    self.close(None);
                }
            }
            Sent::Commit { generation, .. } => {
                self.core.commit_failed(id, failure);
                if self.generation() == Some(generation) && same_coordinator {
                    self.core.mark_coordinator_unknown(now);
                }
            }
        }
    }

    // ----- application commands -----

    /// The application came back for records: resets the progress guard, and rejoins
    /// after a progress timeout.
    pub fn note_progress(&mut self, now: Instant) {
        self.core.last_progress = now;
        if matches!(self.state, State::Suspended) {
            self.state = State::Unjoined {
                join_at: now,
                reason: "application resumed after a progress timeout".into(),
            };
        }
        self.advance(now);
    }

    /// The application finished the revocation of `generation`'s partitions (committed
    /// what it finished, stopped the rest). A stale generation is ignored.
    pub fn complete_revocation(&mut self, now: Instant, generation: i32) {
        let partitions = match &self.state {
            State::Revoking {
                generation: g,
                partitions,
                ..
            } if *g == generation => partitions.clone(),
            _ => return,
        };
        self.core.give_back(&partitions);
        self.finish_revocation(now);
        self.advance(now);
    }

    /// Commits `offsets` with the live generation. Every partition must be owned, so a
    /// commit for a revoked or lost partition is impossible.
    pub fn commit(
        &mut self,
        now: Instant,
        offsets: Vec<CommitOffset>,
    ) -> Result<RequestId, CommitError> {
        let in_group = matches!(self.state, State::Stable { .. } | State::Revoking { .. });
        let live = self.generation().filter(|_| in_group);
        let generation = self.core.may_commit(self.closed(), live, &offsets)?;
        let request = GroupRequest::OffsetCommit {
            group: self.core.config.group_id.clone(),
            generation,
            member_id: self.core.member_id.clone(),
            instance_id: self.core.config.instance_id.clone(),
            offsets: offsets.clone(),
        };
        let id = self.core.outbox.reserve();
        let sent = Sent::Commit {
            generation,
            offsets,
        };
        self.core.commits.push(id, (request, sent));
        self.advance(now);
        Ok(id)
    }

    /// The application changed its subscription (`Consumer::subscribe`, a pattern's
    /// matches changing, `unsubscribe`): the member rejoins with the new topics, as the
    /// Java client's `subscribe` does ("subscription changed"): at once from a
    /// generation (eagerly or cooperatively, as any rebalance), or once the rebalance
    /// under way ends, whose JoinGroup carried the old topics. Partitions of topics no
    /// longer subscribed are revoked by the assignment that follows. Counts of the new
    /// topics come with the next [`GroupMember::set_topic_partitions`].
    pub fn set_subscription(&mut self, now: Instant, topics: Vec<String>) {
        let mut topics = topics;
        topics.sort();
        topics.dedup();
        let mut current = self.core.config.topics.clone();
        current.sort();
        current.dedup();
        if topics == current {
            return;
        }
        info!(group = %self.core.config.group_id, member = %self.core.member_id, ?topics, "subscription changed; rejoining");
        self.partitions_per_topic
            .retain(|t, _| topics.contains(t) || self.other_topics.contains(t));
        self.core.config.topics = topics;
        self.resubscribe = true;
        self.advance(now);
    }

    /// New partition counts for subscribed topics. A leader whose assignment was
    /// computed with other counts asks for a rebalance.
    pub fn set_topic_partitions(&mut self, now: Instant, counts: BTreeMap<String, i32>) {
        for (t, n) in counts {
            if self.core.config.topics.contains(&t) || self.other_topics.contains(&t) {
                self.partitions_per_topic.insert(t, n);
            }
        }
        if let Some(with) = &self.assigned_with {
            let changed = with
                .iter()
                .any(|(t, n)| self.partitions_per_topic.get(t) != Some(n))
                || self
                    .core
                    .config
                    .topics
                    .iter()
                    .chain(self.other_topics.iter())
                    .any(|t| self.partitions_per_topic.contains_key(t) && !with.contains_key(t));
            if changed && matches!(self.state, State::Stable { .. }) {
                info!(group = %self.core.config.group_id, "partition counts changed since the leader assigned; rebalancing");
                self.assigned_with = None;
                self.metadata_at = None;
                self.rebalance(now, "metadata changed");
            }
        }
        self.advance(now);
    }

    /// The racks holding a replica of each partition, from the latest metadata, for a
    /// leader's rack-aware assignment (KIP-881). Changes nothing until the next
    /// assignment: racks alone do not start a rebalance (the Java client's leader also
    /// rebalances when a partition's racks change; ottla does not yet).
    pub fn set_partition_racks(&mut self, racks: PartitionRacks) {
        self.partition_racks = Arc::new(racks);
    }

    /// The application is closing: its last commit may still go out, and a rebalance
    /// that keeps this member's partitions (cooperative) is still joined so that it can
    /// commit them, but a generation lost now (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID)
    /// is not joined again. The Java client's close commits and leaves without
    /// joining either. Without this a JoinGroup went out, the broker held it (for up to
    /// the rebalance timeout), and the LeaveGroup queued behind it on the coordinator's
    /// connection: the close and the next member's join both waited.
    /// [`GroupMember::leave`] follows.
    pub fn prepare_to_close(&mut self) {
        self.closing = true;
    }

    /// Leaves the group: a dynamic member sends LeaveGroup; a static member just stops
    /// (as in the Java client), so a restart within the session timeout keeps its
    /// partitions. The application must have finished with its partitions.
    pub fn leave(&mut self, now: Instant) {
        self.leave_with(now, Membership::Default)
    }

    /// [`GroupMember::leave`], saying whether the member leaves the group or stays in
    /// it until its session expires (the Java client's `CloseOptions`). A static member
    /// that leaves sends its `group.instance.id`, so the broker removes it at once.
    pub fn leave_with(&mut self, now: Instant, membership: Membership) {
        if matches!(self.state, State::Closed(_) | State::Leaving { .. }) {
            return;
        }
        let send = match membership {
            Membership::Default => !self.is_static(),
            Membership::Leave => true,
            Membership::Remain => false,
        };
        let request = match (self.coordinator(), self.core.member_id.is_empty(), send) {
            (Some(node), false, true) => Some(self.core.send(
                Target::Coordinator(node),
                GroupRequest::LeaveGroup {
                    group: self.core.config.group_id.clone(),
                    member_id: self.core.member_id.clone(),
                    instance_id: self.core.config.instance_id.clone(),
                    reason: Some("the consumer is closing".into()),
                },
                Sent::Leave,
            )),
            _ => None,
        };
        self.leave_generation();
        self.core.owned.clear();
        match request {
            Some(r) => {
                self.state = State::Leaving {
                    request: Some(r),
                    deadline: now + self.core.config.close_timeout,
                }
            }
            None => self.close(None),
        }
    }

    // ----- private: transitions -----

    /// Sends whatever is due. Called after every input.
    fn advance(&mut self, now: Instant) {
        if matches!(
            self.state,
            State::Closed(_) | State::Leaving { .. } | State::Suspended
        ) {
            return;
        }
        if self.resubscribe {
            match self.state {
                State::Stable { .. } => {
                    self.resubscribe = false;
                    self.rebalance(now, "subscription changed");
                }
                // The next JoinGroup carries the new topics.
                State::Unjoined { .. } => self.resubscribe = false,
                _ => {}
            }
        }
        self.core
            .find_coordinator_if_due(now, || Sent::FindCoordinator);
        // The rest goes to the coordinator.
        let Some(node) = self.coordinator() else {
            return;
        };
        if let Some((id, (request, sent))) = self.core.commits.next() {
            let epoch = self.core.coordinator.epoch();
            self.core
                .outbox
                .send_as(id, Target::Coordinator(node), request, sent, epoch);
        }
        if matches!(&self.state, State::LeaderDelay { send_at, .. } if now >= *send_at) {
            if let State::LeaderDelay {
                request,
                generation,
                protocol,
                heartbeat,
                ..
            } = std::mem::replace(&mut self.state, State::Suspended)
            {
                self.send_sync(now, node, request, (generation, protocol, true), heartbeat);
            }
        }
        if let State::Unjoined { join_at, reason } = &self.state {
            if now >= *join_at && !self.rejoin_held {
                let reason = reason.clone();
                self.send_join(now, node, reason);
            }
        }
        let heartbeat_due = self
            .state
            .heartbeat()
            .filter(|hb| hb.in_flight.is_none() && now >= hb.next_at)
            .map(|hb| hb.generation);
        if let Some(generation) = heartbeat_due {
            let request = GroupRequest::Heartbeat {
                group: self.core.config.group_id.clone(),
                generation,
                member_id: self.core.member_id.clone(),
                instance_id: self.core.config.instance_id.clone(),
            };
            let id = self.core.send(
                Target::Coordinator(node),
                request,
                Sent::Heartbeat { generation },
            );
            if let Some(hb) = self.state.heartbeat_mut() {
                hb.in_flight = Some(id);
                hb.sent_at = now;
                hb.next_at = now + self.core.config.heartbeat_interval;
            }
        }
        // Committed offsets do not depend on the generation, so a fetch outlives a
        // rebalance: partitions granted just before another round still get theirs.
        self.core
            .fetch_offsets_if_due(now, node, None, |partitions| Sent::OffsetFetch {
                partitions,
            });
    }

    /// Gives up on the coordinator (the classic member's heartbeat state stays: the
    /// session clock decides).
    fn mark_coordinator_unknown(&mut self, now: Instant) {
        self.core.mark_coordinator_unknown(now);
    }

    fn progress_timeout(&mut self, now: Instant) {
        self.core.progress_timed_out();
        if let (Some(node), false, false) = (
            self.coordinator(),
            self.core.member_id.is_empty(),
            self.is_static(),
        ) {
            self.core.send(
                Target::Coordinator(node),
                GroupRequest::LeaveGroup {
                    group: self.core.config.group_id.clone(),
                    member_id: self.core.member_id.clone(),
                    instance_id: None,
                    reason: Some("consumer poll timeout has expired".into()),
                },
                Sent::Leave,
            );
            self.core.member_id.clear();
        }
        self.core.lose_all(LostReason::ProgressTimeout);
        self.leave_generation();
        self.state = State::Suspended;
        let _ = now;
    }

    fn close(&mut self, error: Option<GroupError>) {
        self.core.fail_queued(&error);
        self.leave_generation();
        let clean = error.is_none();
        self.state = State::Closed(error);
        if clean {
            self.core.events.push_back(Event::Left);
        }
    }
}

#[cfg(test)]
mod tests;
