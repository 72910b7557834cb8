//! Joining a generation: JoinGroup, the leader's assignment, SyncGroup, and the errors
//! of both barriers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tracing::{debug, info, warn};

use super::super::assignor::{Assignor, MemberSubscription, RebalanceProtocol};
use super::super::common::millis;
use super::super::consumer_protocol::{
    Assignment, Subscription, TopicPartition, decode_assignment, decode_subscription,
    encode_assignment, encode_subscription,
};
use super::super::messages::{GroupRequest, JoinedMember};
use super::GroupMember;
use super::errors::{Reaction, reaction};
use super::state::{AfterRevoke, Generation, Heartbeat, Sent, State};
use crate::error_name;
use crate::group::types::{
    AssignmentDone, AssignmentJob, Event, GroupError, LostReason, RequestId, Target,
};
use crate::metadata::NodeId;

/// The ConsumerProtocol version ottla writes; readers handle every version.
pub(super) const SUBSCRIPTION_VERSION: i16 = 3;

impl GroupMember {
    pub(super) fn send_join(&mut self, now: Instant, node: NodeId, reason: String) {
        let mut protocols = Vec::new();
        for assignor in self.offered() {
            let owned: Vec<TopicPartition> = self.core.owned.iter().cloned().collect();
            let subscription = Subscription {
                topics: self.core.config.topics.clone(),
                user_data: assignor
                    .subscription_user_data(&self.last_assignment, self.last_generation),
                owned_partitions: owned,
                generation_id: self.generation().unwrap_or(self.last_generation),
                rack_id: self.core.config.rack.clone(),
            };
            match encode_subscription(&subscription, SUBSCRIPTION_VERSION) {
                Ok(bytes) => protocols.push((assignor.name().to_string(), bytes)),
                Err(e) => {
                    warn!(group = %self.core.config.group_id, assignor = assignor.name(), error = %e, "cannot encode subscription")
                }
            }
        }
        let request = GroupRequest::JoinGroup {
            group: self.core.config.group_id.clone(),
            member_id: self.core.member_id.clone(),
            instance_id: self.core.config.instance_id.clone(),
            session_timeout_ms: millis(self.core.config.session_timeout),
            rebalance_timeout_ms: millis(self.core.config.max_poll_interval),
            protocol_type: "consumer".into(),
            protocols,
            reason: Some(reason.clone()),
        };
        debug!(group = %self.core.config.group_id, member = %self.core.member_id, %reason, "joining");
        let wait = self.core.config.join_wait();
        let id = self
            .core
            .send_waiting(Target::Coordinator(node), request, Sent::Join, wait);
        self.state = State::Joining {
            request: id,
            deadline: now + wait,
        };
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_join(
        &mut self,
        now: Instant,
        id: RequestId,
        error: i16,
        generation: i32,
        protocol_name: Option<String>,
        leader: String,
        member_id: String,
        members: Vec<JoinedMember>,
        skip_assignment: bool,
    ) {
        if !matches!(self.state, State::Joining { request, .. } if request == id) {
            return;
        }
        if error == ResponseError::MemberIdRequired.code() {
            // KIP-394: the broker assigned an id; rejoin with it at once.
            self.core.member_id = member_id;
            return self.enter_unjoined(now, false, "member id assigned (KIP-394)");
        }
        if error == ResponseError::InconsistentGroupProtocol.code() {
            if self.upgraded {
                return self.downgrade(now);
            }
            return self.no_common_assignor();
        }
        if error != 0 {
            return self.on_rebalance_error(now, "JoinGroup", error);
        }
        self.failures = 0;
        self.core.member_id = member_id;
        let Some(protocol) = protocol_name else {
            return self.no_common_assignor();
        };
        let is_leader = leader == self.core.member_id;
        // As the Java client (heartbeats from COMPLETING_REBALANCE on): the broker
        // counts the session from the JoinGroup answer, and a coordinator that goes
        // silent now is noticed by the session clock as in a generation.
        let heartbeat = Heartbeat {
            generation,
            next_at: now + self.core.config.heartbeat_interval,
            in_flight: None,
            sent_at: now,
            last_ok: now,
            failures: 0,
        };
        self.kept_session = None;
        if is_leader && !skip_assignment {
            // The assignment runs off the member's task (`poll_assignment`), the member
            // heartbeating meanwhile; its result comes back through `assignment_done`.
            match self.prepare_assignment(&protocol, &members) {
                Ok((job, version)) => {
                    self.next_job += 1;
                    let id = self.next_job;
                    self.state = State::Assigning {
                        job: id,
                        deadline: now + self.core.config.max_poll_interval,
                        generation,
                        protocol,
                        version,
                        heartbeat,
                    };
                    self.assignment_job = Some(AssignmentJob { id, ..job });
                }
                Err(e) => self.assignment_failed(e),
            }
            return;
        }
        self.sync_with(now, (generation, protocol, false), Vec::new(), heartbeat);
    }

    /// The assignment of job `done.id` was computed: the leader sends it in its
    /// SyncGroup. A result for a job the member no longer waits for (it rejoined, lost
    /// the group, or closed meanwhile) is dropped.
    pub fn assignment_done(&mut self, now: Instant, done: AssignmentDone) {
        let State::Assigning {
            job,
            generation,
            protocol,
            version,
            heartbeat,
            ..
        } = &self.state
        else {
            return;
        };
        if *job != done.id {
            return;
        }
        let (generation, protocol, version, heartbeat) =
            (*generation, protocol.clone(), *version, heartbeat.clone());
        match self.finish_assignment(&protocol, done, version) {
            Ok(assignments) => {
                self.metadata_at = Some(now + self.core.config.metadata_max_age);
                self.sync_with(now, (generation, protocol, true), assignments, heartbeat);
            }
            Err(e) => self.assignment_failed(e),
        }
        self.advance(now);
    }

    /// The leader's assignment to compute, once per JoinGroup answer that makes this
    /// member the leader; see [`AssignmentJob`]. `None` when there is none, or the
    /// member no longer waits for it.
    pub fn poll_assignment(&mut self) -> Option<AssignmentJob> {
        let job = self.assignment_job.take()?;
        matches!(self.state, State::Assigning { job: id, .. } if id == job.id).then_some(job)
    }

    /// Runs the pending assignment on the caller's thread and hands the result back:
    /// for drivers to which blocking for the assignor's time does not matter (tests,
    /// simulations).
    pub fn assign_inline(&mut self, now: Instant) {
        while let Some(job) = self.poll_assignment() {
            let done = job.run();
            self.assignment_done(now, done);
        }
    }

    /// An assignment that cannot be made is fatal: through `close`, like every fatal
    /// error, since a closed member has no generation, heartbeat or offset fetch left
    /// (found by fuzzing: the offset fetch's timer stayed armed and `generation()`
    /// answered).
    fn assignment_failed(&mut self, e: GroupError) {
        self.core.lose_all(LostReason::Fatal);
        self.core.events.push_back(Event::Fatal(e.clone()));
        self.close(Some(e));
    }

    /// The SyncGroup of `(generation, protocol, leader)` with `assignments` (the
    /// leader's; empty for a follower), at once or after the leader's sync delay.
    fn sync_with(
        &mut self,
        now: Instant,
        (generation, protocol, is_leader): (i32, String, bool),
        assignments: Vec<(String, Bytes)>,
        heartbeat: Heartbeat,
    ) {
        let Some(node) = self.coordinator() else {
            return self.enter_unjoined(now, false, "coordinator lost during join");
        };
        let request = GroupRequest::SyncGroup {
            group: self.core.config.group_id.clone(),
            generation,
            member_id: self.core.member_id.clone(),
            instance_id: self.core.config.instance_id.clone(),
            protocol_type: "consumer".into(),
            protocol_name: protocol.clone(),
            assignments,
        };
        if is_leader && !self.core.config.leader_sync_delay.is_zero() {
            self.state = State::LeaderDelay {
                send_at: now + self.core.config.leader_sync_delay,
                request,
                generation,
                protocol,
                heartbeat,
            };
            return;
        }
        let sync = (generation, protocol, is_leader);
        self.send_sync(now, node, request, sync, heartbeat);
    }

    /// Sends the SyncGroup `request` of `(generation, protocol, leader)`, heartbeating
    /// meanwhile with `heartbeat`.
    pub(super) fn send_sync(
        &mut self,
        now: Instant,
        node: NodeId,
        request: GroupRequest,
        (generation, protocol, leader): (i32, String, bool),
        heartbeat: Heartbeat,
    ) {
        let id = self
            .core
            .send(Target::Coordinator(node), request, Sent::Sync);
        self.state = State::Syncing {
            request: id,
            deadline: now + self.core.config.request_timeout,
            generation,
            protocol,
            leader,
            heartbeat,
        };
    }

    /// The leader's assignment job for `members`, and the ConsumerProtocol version to
    /// answer in.
    pub(super) fn prepare_assignment(
        &mut self,
        protocol: &str,
        members: &[JoinedMember],
    ) -> Result<(AssignmentJob, i16), GroupError> {
        let group = self.core.config.group_id.clone();
        let Some(assignor) = self
            .core
            .config
            .assignors
            .iter()
            .find(|a| a.name() == protocol)
            .cloned()
        else {
            return Err(GroupError::Assignment {
                group,
                assignor: protocol.to_string(),
                message: "the group chose an assignor this member does not have".into(),
            });
        };
        let mut subs = Vec::with_capacity(members.len());
        let mut version = SUBSCRIPTION_VERSION;
        for m in members {
            // Answer each member in the lowest ConsumerProtocol version any member
            // spoke, so older clients in a mixed group can read their assignment.
            if let Some(v) = m
                .metadata
                .get(..2)
                .map(|b| i16::from_be_bytes([b[0], b[1]]))
            {
                version = version.min(v.max(0));
            }
            let subscription =
                decode_subscription(m.metadata.clone()).map_err(|e| GroupError::Assignment {
                    group: group.clone(),
                    assignor: protocol.to_string(),
                    message: format!("member {}: {e}", m.member_id),
                })?;
            // A member listed twice counts once, the later entry winning, as in the
            // Java leader's map of subscriptions by member id.
            if let Some(i) = subs
                .iter()
                .position(|s: &MemberSubscription| s.member_id == m.member_id)
            {
                warn!(group = %group, member = %m.member_id, "the JoinGroup answer lists a member twice; assigning it once");
                subs.remove(i);
            }
            subs.push(MemberSubscription {
                member_id: m.member_id.clone(),
                instance_id: m.instance_id.clone(),
                subscription,
            });
        }
        let wanted: BTreeSet<String> = subs
            .iter()
            .flat_map(|s| s.subscription.topics.iter().cloned())
            .collect();
        let missing: Vec<String> = wanted
            .iter()
            .filter(|t| !self.partitions_per_topic.contains_key(*t))
            .cloned()
            .collect();
        if !missing.is_empty() {
            // Assign what is known; the new counts trigger a rebalance when they arrive.
            self.other_topics.extend(missing.iter().cloned());
            self.core
                .events
                .push_back(Event::MetadataNeeded { topics: missing });
        }
        let counts: BTreeMap<String, i32> = self
            .partitions_per_topic
            .iter()
            .filter(|(t, _)| wanted.contains(*t))
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        let job = AssignmentJob {
            id: 0,
            assignor,
            counts,
            racks: Arc::clone(&self.partition_racks),
            subs,
        };
        Ok((job, version))
    }

    /// The assignments of `done` as the SyncGroup carries them, checked.
    fn finish_assignment(
        &mut self,
        protocol: &str,
        done: AssignmentDone,
        version: i16,
    ) -> Result<Vec<(String, Bytes)>, GroupError> {
        let group = self.core.config.group_id.clone();
        let AssignmentDone {
            assignor,
            counts,
            subs,
            result,
            ..
        } = done;
        let result = result.map_err(|e| GroupError::Assignment {
            group: group.clone(),
            assignor: protocol.to_string(),
            message: e.to_string(),
        })?;
        // As the Java client, every cooperative assignor but the built-in sticky one,
        // whose handling of stale and double claims the check would misread.
        if assignor.protocol() == RebalanceProtocol::Cooperative
            && assignor.name() != "cooperative-sticky"
        {
            validate_cooperative(&subs, &result).map_err(|message| GroupError::Assignment {
                group: group.clone(),
                assignor: protocol.to_string(),
                message,
            })?;
        }
        let assigned: usize = result.values().map(|a| a.partitions.len()).sum();
        let total: usize = counts
            .values()
            .map(|n| usize::try_from(*n).unwrap_or(0))
            .sum();
        // A cooperative assignor holds back partitions that change owner. Their old
        // owners rejoin after revoking them, but if one of them is gone (a static
        // member restarted between the rounds), nobody would: so the leader itself
        // asks for the second round.
        self.held_back = assigned < total;
        self.assigned_with = Some(counts);
        let mut out = Vec::with_capacity(result.len());
        for (member, assignment) in result {
            let bytes =
                encode_assignment(&assignment, version).map_err(|e| GroupError::Assignment {
                    group: group.clone(),
                    assignor: protocol.to_string(),
                    message: e.to_string(),
                })?;
            out.push((member, bytes));
        }
        Ok(out)
    }

    pub(super) fn on_sync(&mut self, now: Instant, id: RequestId, error: i16, assignment: Bytes) {
        let State::Syncing {
            request,
            generation,
            protocol,
            leader,
            ..
        } = &self.state
        else {
            return;
        };
        if *request != id {
            return;
        }
        let (generation, protocol, leader) = (*generation, protocol.clone(), *leader);
        if error != 0 {
            return self.on_rebalance_error(now, "SyncGroup", error);
        }
        let assignment = match decode_assignment(assignment) {
            Ok(a) => a,
            Err(e) => {
                warn!(group = %self.core.config.group_id, error = %e, "undecodable assignment; rejoining");
                return self.enter_unjoined(now, true, "undecodable assignment");
            }
        };
        if !leader {
            self.assigned_with = None;
            self.metadata_at = None;
        }
        // The run of generations on a cooperative assignor, for the second bounce.
        let chosen_cooperative = self
            .core
            .config
            .assignors
            .iter()
            .any(|a| a.name() == protocol && a.protocol() == RebalanceProtocol::Cooperative);
        if chosen_cooperative {
            self.cooperative_since.get_or_insert(now);
        } else {
            self.cooperative_since = None;
        }
        self.maybe_upgrade(now);
        let rebalance = self.rebalance_protocol();
        self.generation = Some(Generation {
            id: generation,
            protocol: protocol.clone(),
            rebalance,
        });
        self.last_generation = generation;
        // Heartbeats started with the JoinGroup answer; they go on at their own pace,
        // into the generation.
        let Some(heartbeat) = self.state.heartbeat().cloned() else {
            return;
        };
        debug!(group = %self.core.config.group_id, member = %self.core.member_id, generation, leader, "synced");
        self.core.events.push_back(Event::Joined {
            generation,
            member_id: self.core.member_id.clone(),
            leader,
            protocol,
        });
        let Assignment { partitions, .. } = assignment;
        let target: BTreeSet<TopicPartition> = partitions.into_iter().collect();
        self.last_assignment = target.iter().cloned().collect();
        let revoked: Vec<TopicPartition> = self.core.owned.difference(&target).cloned().collect();
        let added: Vec<TopicPartition> = target.difference(&self.core.owned).cloned().collect();
        let second_round = leader
            && rebalance == RebalanceProtocol::Cooperative
            && std::mem::take(&mut self.held_back);
        if revoked.is_empty() {
            self.state = State::Stable { heartbeat };
            self.grant(now, generation, added);
            if second_round {
                self.enter_unjoined(now, false, "partitions held back for the second round");
            }
        } else {
            // Cooperative (KIP-429): give back only what moves, then take what is new,
            // then rejoin so the moved partitions reach their new owners.
            self.state = State::Revoking {
                heartbeat,
                generation,
                partitions: revoked.clone(),
                deadline: now + self.core.config.max_poll_interval,
                then: AfterRevoke::Assign {
                    added,
                    rejoin: true,
                },
            };
            self.core.events.push_back(Event::RevokeRequested {
                generation,
                partitions: revoked,
            });
        }
    }

    /// The assignors this member offers in its JoinGroup: all of them, or once the
    /// second bounce happened ([`GroupConfig::cooperative_upgrade`]) the cooperative
    /// ones only.
    ///
    /// [`GroupConfig::cooperative_upgrade`]: crate::group::GroupConfig::cooperative_upgrade
    pub(super) fn offered(&self) -> impl Iterator<Item = &Arc<dyn Assignor>> {
        let upgraded = self.upgraded;
        self.core
            .config
            .assignors
            .iter()
            .filter(move |a| !upgraded || a.protocol() == RebalanceProtocol::Cooperative)
    }

    /// As the Java client (`ConsumerCoordinator`): a member is cooperative only when
    /// every assignor it offers is. A member that also offers an eager one (`range`
    /// beside `cooperative-sticky`, the first bounce of a move to cooperative) gives
    /// everything back before it rejoins, because the next generation may choose
    /// that eager assignor, which hands a partition still held here straight to
    /// another member (docs/rebalance.md).
    pub(super) fn rebalance_protocol(&self) -> RebalanceProtocol {
        if self
            .offered()
            .all(|a| a.protocol() == RebalanceProtocol::Cooperative)
        {
            RebalanceProtocol::Cooperative
        } else {
            RebalanceProtocol::Eager
        }
    }

    /// The automatic second bounce: once every generation has chosen a cooperative
    /// assignor for the hold, the member offers only its cooperative assignors, and
    /// so rebalances cooperatively from its next rebalance on. Safe at any point of a
    /// generation: every member of this generation offers the cooperative assignor it
    /// chose, so the next generation chooses a cooperative one again, or this member's
    /// JoinGroup is refused before any partition moves ([`GroupMember::downgrade`]).
    pub(super) fn maybe_upgrade(&mut self, now: Instant) {
        let (Some(hold), Some(since)) =
            (self.core.config.cooperative_upgrade, self.cooperative_since)
        else {
            return;
        };
        if self.upgraded || now.saturating_duration_since(since) < hold {
            return;
        }
        if self.rebalance_protocol() == RebalanceProtocol::Cooperative {
            return;
        }
        self.upgraded = true;
        info!(
            group = %self.core.config.group_id,
            member = %self.core.member_id,
            hold_s = hold.as_secs(),
            offered = ?self.offered().map(|a| a.name()).collect::<Vec<_>>(),
            "the group chose a cooperative assignor in every generation for the hold: offering only cooperative assignors, rebalancing cooperatively from now on (the second bounce)"
        );
        if let Some(generation) = self.generation.as_mut() {
            generation.rebalance = RebalanceProtocol::Cooperative;
        }
    }

    /// A member that dropped its eager assignors was refused: a member without a
    /// cooperative assignor joined the group meanwhile (a rollback, or one more
    /// instance of the previous client). Its JoinGroup came before this one, so the
    /// join round is still open and no partition has moved: this member offers its
    /// whole list again, gives back what it holds, as an eager member would have done
    /// before joining, and rejoins.
    fn downgrade(&mut self, now: Instant) {
        self.upgraded = false;
        self.cooperative_since = None;
        warn!(
            group = %self.core.config.group_id,
            member = %self.core.member_id,
            "INCONSISTENT_GROUP_PROTOCOL after dropping the eager assignors: a member without a cooperative assignor joined; offering every assignor again and rebalancing eagerly"
        );
        let reason = "a member without a cooperative assignor joined".to_string();
        let Some(generation) = self.generation.as_mut() else {
            return self.enter_unjoined(now, false, &reason);
        };
        generation.rebalance = RebalanceProtocol::Eager;
        let generation = generation.id;
        if self.core.owned.is_empty() {
            return self.enter_unjoined(now, false, &reason);
        }
        let partitions = self.assignment();
        // Heartbeats go on while the partitions are given back, as in an eager
        // rebalance (`rebalance`): the broker still counts this member's session.
        self.state = State::Revoking {
            heartbeat: Heartbeat {
                generation,
                next_at: now,
                in_flight: None,
                sent_at: now,
                last_ok: self.kept_session.take().unwrap_or(now),
                failures: 0,
            },
            generation,
            partitions: partitions.clone(),
            deadline: now + self.core.config.max_poll_interval,
            then: AfterRevoke::Rejoin { reason },
        };
        self.core.events.push_back(Event::RevokeRequested {
            generation,
            partitions,
        });
    }

    /// Errors on JoinGroup and SyncGroup.
    /// INCONSISTENT_GROUP_PROTOCOL on JoinGroup (or a JoinGroup answer that names no
    /// assignor): fatal, as in the Java client, with the assignors this member offered,
    /// so the error says what to change.
    fn no_common_assignor(&mut self) {
        if self.closed().is_some() {
            return;
        }
        let error = GroupError::InconsistentGroupProtocol {
            group: self.core.config.group_id.clone(),
            offered: self
                .core
                .config
                .assignors
                .iter()
                .map(|a| a.name().to_string())
                .collect(),
        };
        let error = self.core.fail(error);
        self.close(Some(error));
    }

    pub(super) fn on_rebalance_error(&mut self, now: Instant, api: &'static str, error: i16) {
        debug!(group = %self.core.config.group_id, member = %self.core.member_id, api, error = %error_name(error), "rebalance request failed");
        match reaction(error) {
            Reaction::Rediscover => {
                self.core.mark_coordinator_unknown(now);
                self.enter_unjoined(now, false, "coordinator moved during the rebalance");
            }
            Reaction::Retry => {
                if ResponseError::try_from_code(error).is_some_and(|e| !e.is_retriable()) {
                    warn!(group = %self.core.config.group_id, api, error = %error_name(error), "unexpected error; rejoining after the backoff");
                }
                self.enter_unjoined(now, true, "transient error during the rebalance")
            }
            Reaction::Rebalance | Reaction::Rejoin => {
                self.enter_unjoined(now, false, "the rebalance restarted")
            }
            Reaction::ResetMember => {
                self.reset(now, LostReason::UnknownMember, true, "unknown member id")
            }
            Reaction::ResetGeneration => self.reset(
                now,
                LostReason::IllegalGeneration,
                false,
                "illegal generation",
            ),
            Reaction::Fatal => self.fatal(api, error),
        }
    }
}

/// KIP-429's rule for a cooperative assignment: a partition that one member owned and
/// another is now given must first be revoked, in a round of its own, so no partition
/// may be added to one member in the same round it is taken from another. The Java
/// client's leader checks this for assignors other than its own cooperative-sticky
/// (`ConsumerCoordinator.validateCooperativeAssignment`), and so does ottla's. The
/// error names the partitions and their owners.
pub(super) fn validate_cooperative(
    subs: &[MemberSubscription],
    result: &BTreeMap<String, Assignment>,
) -> Result<(), String> {
    let mut revoked: BTreeMap<&TopicPartition, &str> = BTreeMap::new();
    let mut added: BTreeMap<&TopicPartition, &str> = BTreeMap::new();
    for sub in subs {
        let owned = &sub.subscription.owned_partitions;
        let assigned: &[TopicPartition] = result
            .get(&sub.member_id)
            .map_or(&[], |a| a.partitions.as_slice());
        for tp in owned.iter().filter(|tp| !assigned.contains(tp)) {
            revoked.insert(tp, &sub.member_id);
        }
        for tp in assigned.iter().filter(|tp| !owned.contains(tp)) {
            added.insert(tp, &sub.member_id);
        }
    }
    let moved: Vec<String> = added
        .iter()
        .filter_map(|(tp, to)| {
            revoked
                .get(tp)
                .map(|from| format!("{tp} from {from} to {to}"))
        })
        .collect();
    if moved.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the cooperative assignment moves owned partitions directly, which gives them two owners: {}",
        moved.join(", ")
    ))
}
