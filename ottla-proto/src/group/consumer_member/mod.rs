//! The consumer group protocol (KIP-848) as a sans-IO state machine: one request,
//! ConsumerGroupHeartbeat, carries the member's subscription and the partitions it
//! owns, and its answer carries the member's epoch and the assignment the broker
//! computed. There is no join barrier and no leader: a rebalance moves only the
//! partitions that change owner, and the members that keep theirs never stop.
//!
//! # Contract
//!
//! The same as [`GroupMember`](super::member::GroupMember)'s, so a driver, the
//! `Consumer` and the `Processor` work unchanged on either protocol: inputs through
//! `handle_response`, `handle_failure`, `handle_timeout` and the application's
//! commands (`commit`, `complete_revocation`, `note_progress`, `leave_with`,
//! `set_topic_ids`); outputs through `poll_request`, `poll_event`, `poll_timeout`. The
//! events are [`Event`]s, with the member epoch where the classic member gives a
//! generation.
//!
//! # Reconciliation
//!
//! The broker's answer is the member's target assignment, by topic id. The member:
//! 1. resolves the ids to names (an unknown id waits for metadata,
//!    [`Event::MetadataNeeded`]);
//! 2. asks the application to give back what the target drops
//!    ([`Event::RevokeRequested`]) and waits for [`ConsumerGroupMember::complete_revocation`],
//!    the application committing what it finished first;
//! 3. takes what the target adds ([`Event::Assigned`]) and fetches its committed
//!    offsets;
//! 4. acknowledges at once with a heartbeat carrying what it owns now, after every
//!    new target, even one that changed nothing the member owned (the broker waits
//!    for that acknowledgement before it moves on).
//!
//! The owned partitions are kept by topic id, with the names they were assigned
//! under (Java's `LocalAssignment` and `assignedTopicNamesCache`): what a heartbeat
//! reports never depends on the metadata of the moment.
//!
//! The broker gives a partition to its new owner only once the old owner acknowledged
//! giving it back, so no partition is ever owned twice; the member only ever holds
//! what the broker's last answer assigned it.
//!
//! # Timers
//!
//! | timer | armed while | fires |
//! |---|---|---|
//! | [`Timer::Coordinator`] | the coordinator is unknown and no lookup is in flight | a FindCoordinator is due (after backoff) |
//! | [`Timer::Request`] | a FindCoordinator or a heartbeat is in flight | the answer is overdue: treated as a failure |
//! | [`Timer::Heartbeat`] | in the group (or joining), coordinator known, no heartbeat in flight | the next heartbeat is due: at once to join, acknowledge or leave, else every interval the broker gives |
//! | [`Timer::Revocation`] | waiting for the application to finish a revocation | the rebalance timeout ran out: every partition is lost and the member rejoins |
//! | [`Timer::Session`] | in the group with a heartbeat answered | `session.timeout.ms` since the last heartbeat the broker accepted was sent: the broker has expired the member, so every partition is lost, the coordinator is looked up again and the member rejoins with epoch 0 |
//! | [`Timer::Progress`] | the member is in the group | the application has not come back within `max_poll_interval`: the member leaves (once the coordinator is known) |
//! | [`Timer::OffsetFetch`] | an OffsetFetch must be retried for partitions still owned | the retry is due |

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::common::{self, Core, Offsets, PendingFetch, millis};
use super::consumer_protocol::TopicPartition;
use super::member::{
    CommitError, Event, Failure, GroupConfig, GroupError, LostReason, Membership, Outgoing,
    RequestId, StateKind, Target, Timer,
};
use super::messages::{CommitOffset, GroupRequest, GroupResponse, OffsetFetchAnswer};
use crate::error_name;
use crate::metadata::NodeId;

mod errors;
mod timers;

use errors::{Reaction, hint, reaction};

/// The epoch a member joins with.
const JOIN_EPOCH: i32 = 0;
/// The epoch a member leaves with.
const LEAVE_EPOCH: i32 = -1;
/// The epoch a static member leaves with when it means to come back (KIP-848).
const STATIC_LEAVE_EPOCH: i32 = -2;

/// One member of a consumer group on the consumer protocol (KIP-848).
#[derive(Debug)]
pub struct ConsumerGroupMember {
    /// What both protocols' members hold; commits wait there as offsets, sent with the
    /// epoch of the moment they go out.
    /// Queued commits carry the incarnation they were made in.
    core: Core<Sent, QueuedCommit>,
    state: State,
    /// The epoch the broker gave in its last answer (0 before the first).
    epoch: i32,
    /// The interval the broker asks for (the configured one until it answers).
    interval: Duration,
    heartbeat: Heartbeat,
    /// What the last heartbeat the broker did not refuse carried; `None`: the next
    /// heartbeat carries every field (joining, and after any error, as Java's
    /// `sentFields.reset()`).
    sent_fields: Option<SentFields>,
    /// The broker's last assignment for this member, by topic id.
    target: BTreeMap<Uuid, BTreeSet<i32>>,
    /// Topic names by id, from metadata.
    names: BTreeMap<Uuid, String>,
    /// Ids already asked for in a [`Event::MetadataNeeded`], so one unknown id asks once
    /// per metadata answer.
    asked_ids: BTreeSet<Uuid>,
    /// The names of the topics the member owns partitions of, as they were when
    /// assigned: the acknowledgement reports them by id even while metadata has lost
    /// the topic (Java's `assignedTopicNamesCache`).
    assigned_names: BTreeMap<Uuid, String>,
    /// A target arrived since the last acknowledgement: the next heartbeat carries the
    /// owned partitions, at once, even if they did not change.
    ack_owed: bool,
    /// A heartbeat went out since the member last left: the broker may know it, so
    /// closing sends a leave.
    announced: bool,
    /// Counts the member's epoch-0 rejoins: what it owns now is that incarnation's. A
    /// commit made in an earlier one is never sent, nor sent again, with a later
    /// epoch (see [`QueuedCommit`]).
    incarnation: u64,
}

/// A commit waiting for the wire, or sent: its offsets, and the incarnation of the
/// member that made them. The offsets of an incarnation that lost its partitions must
/// not land with the next one's epoch: the next one may have taken the same partitions
/// back and fetched an older committed offset meanwhile, and a late commit would then
/// pass records it had not handled yet, and put the offset back when it commits its
/// own (chaos, consumer protocol, seed 773873162: a commit at epoch 9 answered
/// STALE_MEMBER_EPOCH was sent again at epoch 13, after a session lapse and a rejoin
/// that got the same partition back and fetched 769; it landed at 783 and the
/// member redid 769-782 below it).
#[derive(Debug, Clone)]
struct QueuedCommit {
    incarnation: u64,
    epoch: i32,
    offsets: Vec<CommitOffset>,
}

impl super::common::Commits for QueuedCommit {
    fn offsets(&self) -> &[CommitOffset] {
        &self.offsets
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Not in the group: the next heartbeat joins with epoch 0.
    Joining,
    /// In the group with the epoch in [`ConsumerGroupMember::epoch`].
    Stable,
    /// Waiting for the application to give `partitions` back (asked at `epoch`).
    Revoking {
        epoch: i32,
        partitions: Vec<TopicPartition>,
        deadline: Instant,
    },
    /// Out of the group on its own clock (a progress timeout, a session lapse, a
    /// revocation timeout): rejoins on the application's next progress (`rejoin`
    /// once it came back, or at once after a lapse). `leave_owed`: the leave
    /// heartbeat (with that epoch) must reach the broker first; it goes once the
    /// coordinator is known, and again to the next coordinator if it goes unanswered
    /// (`leave_sent`: in flight, overdue at that instant), until it is answered or
    /// until `give_up_at`, a session after it was first owed (so after the last
    /// heartbeat sent), when the broker has expired the member anyway. `why`: the leave's reason.
    Suspended {
        leave_owed: Option<i32>,
        rejoin: bool,
        leave_sent: Option<(RequestId, Instant)>,
        give_up_at: Instant,
        why: &'static str,
    },
    /// Closing: the leave heartbeat is in flight, or (`unsent`, with its epoch) waits
    /// for the coordinator to be found, until `deadline`.
    Leaving {
        deadline: Instant,
        unsent: Option<i32>,
    },
    Closed(Option<GroupError>),
}

#[derive(Debug, Clone)]
struct Heartbeat {
    next_at: Instant,
    /// The heartbeat in flight.
    in_flight: Option<InFlight>,
    /// Heartbeats failed in a row, for the KIP-580 backoff.
    failures: u32,
    /// When the last heartbeat the broker accepted was sent, while in the group. The
    /// broker renewed the member's session when it read that request, no earlier than
    /// this, so the session cannot have lapsed before `last_ok + session.timeout.ms`
    /// on the broker's clock either.
    last_ok: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    id: RequestId,
    sent_at: Instant,
    /// When the answer is overdue.
    deadline: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SentFields {
    topics: Vec<String>,
    regex: Option<String>,
    owned: BTreeSet<TopicPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Sent {
    FindCoordinator,
    Heartbeat {
        epoch: i32,
        fields: SentFields,
    },
    Leave,
    Commit {
        epoch: i32,
        /// The member's incarnation that made it ([`QueuedCommit`]).
        incarnation: u64,
        offsets: Vec<CommitOffset>,
    },
    OffsetFetch {
        partitions: BTreeSet<TopicPartition>,
    },
}

impl ConsumerGroupMember {
    /// A member with the client-generated `member_id` (KIP-1082: a random UUID,
    /// [`new_member_id`]) that will look for its coordinator at once.
    pub fn new(config: GroupConfig, member_id: String, now: Instant) -> Self {
        let interval = config.heartbeat_interval;
        let mut member = Self {
            core: Core::new(config, member_id, now),
            state: State::Joining,
            epoch: JOIN_EPOCH,
            interval,
            heartbeat: Heartbeat {
                next_at: now,
                in_flight: None,
                failures: 0,
                last_ok: None,
            },
            sent_fields: None,
            target: BTreeMap::new(),
            names: BTreeMap::new(),
            asked_ids: BTreeSet::new(),
            assigned_names: BTreeMap::new(),
            ack_owed: false,
            announced: false,
            incarnation: 0,
        };
        member.advance(now);
        member
    }

    // ----- getters -----

    /// The lifecycle state, in the classic member's terms.
    pub fn state(&self) -> StateKind {
        match &self.state {
            State::Joining => StateKind::Joining,
            State::Stable => StateKind::Stable,
            State::Revoking { .. } => StateKind::Revoking,
            State::Suspended { .. } => StateKind::Suspended,
            State::Leaving { .. } => StateKind::Leaving,
            State::Closed(_) => StateKind::Closed,
        }
    }

    /// The member epoch, while in the group.
    pub fn epoch(&self) -> Option<i32> {
        matches!(self.state, State::Stable | State::Revoking { .. }).then_some(self.epoch)
    }

    common::member_surface!();

    // ----- inputs -----

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
                Sent::Heartbeat { epoch, fields },
                GroupResponse::ConsumerGroupHeartbeat {
                    error,
                    error_message,
                    member_id,
                    member_epoch,
                    heartbeat_interval_ms,
                    assignment,
                },
            ) => {
                // Only the heartbeat in flight counts: one the member gave up on (it was
                // fenced, or moved coordinators since) says nothing about the member now.
                let f = self.heartbeat.in_flight.filter(|f| f.id == id)?;
                self.heartbeat.in_flight = None;
                if error != 0 {
                    self.on_heartbeat_error(now, epoch, error, error_message);
                } else {
                    self.on_heartbeat(
                        now,
                        f.sent_at,
                        fields,
                        member_id,
                        member_epoch,
                        heartbeat_interval_ms,
                        assignment,
                    );
                }
            }
            // The answer to a leave is not looked at (Java ignores it too): the member
            // is gone either way.
            (Sent::Leave, GroupResponse::ConsumerGroupHeartbeat { error, .. }) => {
                if matches!(self.state, State::Leaving { .. }) {
                    self.close(None);
                }
                self.leave_answered(now, id, error);
            }
            (
                Sent::Commit {
                    epoch,
                    incarnation,
                    offsets,
                },
                GroupResponse::OffsetCommit { partitions },
            ) => self.on_commit(now, id, epoch, incarnation, offsets, partitions),
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
            Sent::Heartbeat { .. } => {
                if self.heartbeat.in_flight.map(|f| f.id) != Some(id) {
                    return;
                }
                self.heartbeat.in_flight = None;
                if let Failure::Unsupported(detail) = failure {
                    let error = GroupError::ProtocolUnsupported {
                        group: self.core.config.group_id.clone(),
                        detail,
                    };
                    warn!(group = %self.core.config.group_id, %error, "fatal group error");
                    self.core.lose_all(LostReason::Fatal);
                    self.core.events.push_back(Event::Fatal(error.clone()));
                    return self.close(Some(error));
                }
                self.sent_fields = None;
                self.heartbeat.failures += 1;
                self.heartbeat.next_at = now + self.core.backoff.delay(self.heartbeat.failures);
                if same_coordinator {
                    self.mark_coordinator_unknown(now);
                }
            }
            Sent::Leave => {
                if matches!(self.state, State::Leaving { .. }) {
                    self.close(None);
                }
                if matches!(&self.state, State::Suspended { leave_sent: Some((sent, _)), .. } if *sent == id)
                {
                    self.leave_unread(now, same_coordinator);
                }
            }
            Sent::Commit { epoch, .. } => {
                self.core.commit_failed(id, failure);
                if self.epoch == epoch && same_coordinator {
                    self.mark_coordinator_unknown(now);
                }
            }
        }
    }

    // ----- application commands -----

    /// The application changed its subscription (`Consumer::subscribe`,
    /// `subscribe_pattern`, `unsubscribe`): the next heartbeat, sent at once, carries
    /// the new topic names and regex, and the broker assigns accordingly (the Java
    /// client's `ConsumerMembershipManager` sends the changed subscription the same way).
    pub fn set_subscription(&mut self, now: Instant, topics: Vec<String>, regex: Option<String>) {
        let regex = regex.filter(|r| !r.is_empty());
        if topics == self.core.config.topics && regex == self.core.config.topic_regex {
            return;
        }
        info!(group = %self.core.config.group_id, member = %self.core.member_id, ?topics, ?regex, "subscription changed");
        self.core.config.topics = topics;
        self.core.config.topic_regex = regex;
        self.heartbeat.next_at = now;
        self.advance(now);
    }

    /// The application came back for records: resets the progress guard, and rejoins
    /// after a progress timeout.
    pub fn note_progress(&mut self, now: Instant) {
        self.core.last_progress = now;
        match &mut self.state {
            // The leave must reach the broker first, or the rejoin meets the member's
            // old incarnation (fenced, again and again, until its session ends).
            State::Suspended {
                leave_owed: Some(_),
                rejoin,
                ..
            } => *rejoin = true,
            State::Suspended {
                leave_owed: None, ..
            } => self.rejoin(now),
            _ => {}
        }
        self.advance(now);
    }

    /// The application finished giving back the partitions asked for at `epoch`
    /// (committed what it finished, stopped the rest). Another epoch is ignored.
    pub fn complete_revocation(&mut self, now: Instant, epoch: i32) {
        let partitions = match &self.state {
            State::Revoking {
                epoch: asked,
                partitions,
                ..
            } if *asked == epoch => partitions.clone(),
            _ => return,
        };
        self.core.give_back(&partitions);
        self.prune_names();
        self.state = State::Stable;
        self.reconcile(now);
        self.advance(now);
    }

    /// Commits `offsets` with the member's epoch. Every partition must be owned.
    pub fn commit(
        &mut self,
        now: Instant,
        offsets: Vec<CommitOffset>,
    ) -> Result<RequestId, CommitError> {
        self.core
            .may_commit(self.closed(), self.epoch(), &offsets)?;
        let id = self.core.outbox.reserve();
        let commit = QueuedCommit {
            incarnation: self.incarnation,
            epoch: self.epoch,
            offsets,
        };
        self.core.commits.push(id, commit);
        self.advance(now);
        Ok(id)
    }

    /// Topic names by id from the latest metadata: the member resolves assignments
    /// with them, and an assignment waiting for an unknown id goes on.
    pub fn set_topic_ids(&mut self, now: Instant, names: BTreeMap<Uuid, String>) {
        let grew = names.keys().any(|id| !self.names.contains_key(id));
        self.names = names;
        self.asked_ids.clear();
        if grew {
            self.reconcile(now);
        }
        self.advance(now);
    }

    /// Leaves the group: a dynamic member with epoch -1; a static member with -2, so
    /// the broker keeps its partitions for it until its session expires.
    pub fn leave(&mut self, now: Instant) {
        self.leave_with(now, Membership::Default)
    }

    /// [`ConsumerGroupMember::leave`], saying whether the member leaves for good (-1,
    /// static or not, as Java's `CloseOptions.LEAVE_GROUP`) or stays until its session
    /// expires (no heartbeat at all).
    pub fn leave_with(&mut self, now: Instant, membership: Membership) {
        if matches!(self.state, State::Closed(_) | State::Leaving { .. }) {
            return;
        }
        // In the group with any epoch (the librdkafka mock answers a join with epoch 0
        // while the new member's partitions are still held by others), or joining: a
        // join the broker may have read made this member one of the group's, which
        // would otherwise hold partitions for a session (Java leaves from JOINING too).
        // A leave owed since a progress timeout goes now, on the way out.
        let owed = match &self.state {
            State::Suspended { leave_owed, .. } => *leave_owed,
            _ => None,
        };
        let joined = self.announced
            && matches!(
                self.state,
                State::Joining | State::Stable | State::Revoking { .. }
            );
        let epoch = match membership {
            Membership::Default if self.core.config.instance_id.is_some() => {
                Some(STATIC_LEAVE_EPOCH)
            }
            Membership::Default | Membership::Leave => Some(LEAVE_EPOCH),
            Membership::Remain => None,
        };
        let epoch = match (epoch, joined) {
            (Some(epoch), true) => Some(epoch),
            (Some(_), false) => owed,
            (None, _) => None,
        };
        self.core.owned.clear();
        self.assigned_names.clear();
        self.core.fetch = None;
        self.heartbeat.in_flight = None;
        let Some(epoch) = epoch else {
            return self.close(None);
        };
        // Sent now, or once the coordinator is found, within the close timeout.
        self.state = State::Leaving {
            deadline: now + self.core.config.close_timeout,
            unsent: Some(epoch),
        };
        self.advance(now);
    }

    // ----- private -----

    /// How long a heartbeat may wait for its answer before the member gives up on the
    /// coordinator and looks it up again: two of the broker's intervals (at least 1 s),
    /// at most `request.timeout.ms`. Better than Java's `request.timeout.ms` alone: the
    /// member does not know its session (the broker keeps it), and a heartbeat held by a
    /// silent broker for 30 s outlives any session; found by the chaos runner, whose
    /// members were expired behind a silent coordinator that had meanwhile moved.
    /// Looking up again costs a FindCoordinator and a heartbeat with every field.
    fn heartbeat_timeout(&self) -> Duration {
        (self.interval * 2)
            .max(Duration::from_secs(1))
            .min(self.core.config.request_timeout)
    }

    /// An acknowledgement is due: a target arrived, or the owned set changed, since
    /// the broker last heard it.
    fn ack_due(&self) -> bool {
        matches!(self.state, State::Stable)
            && (self.ack_owed
                || self
                    .sent_fields
                    .as_ref()
                    .is_some_and(|f| f.owned != self.core.owned))
    }

    /// Whether the member has something to send the coordinator, so looks it up: in
    /// the group (or joining), or owing a leave.
    fn has_business(&self) -> bool {
        match &self.state {
            State::Closed(_) => false,
            State::Suspended { leave_owed, .. } => leave_owed.is_some(),
            State::Leaving { unsent, .. } => unsent.is_some(),
            State::Joining | State::Stable | State::Revoking { .. } => true,
        }
    }

    /// Sends whatever is due. Called after every input.
    fn advance(&mut self, now: Instant) {
        if !self.has_business() {
            return;
        }
        self.core
            .find_coordinator_if_due(now, || Sent::FindCoordinator);
        // The rest goes to the coordinator.
        let Some(node) = self.coordinator() else {
            return;
        };
        match &mut self.state {
            State::Leaving { unsent, .. } => {
                if let Some(epoch) = unsent.take() {
                    self.send_leave(node, epoch, "the consumer is closing");
                }
                return;
            }
            State::Suspended {
                leave_owed: Some(epoch),
                leave_sent,
                why,
                ..
            } => {
                // The rejoin waits for the leave's answer (`leave_answered`).
                if leave_sent.is_none() {
                    let (epoch, why) = (*epoch, *why);
                    let id = self.send_leave(node, epoch, why);
                    // Overdue well within the session it may be retried for.
                    let overdue = now
                        + self
                            .heartbeat_timeout()
                            .min(self.core.config.session_timeout / 3);
                    if let State::Suspended { leave_sent, .. } = &mut self.state {
                        *leave_sent = Some((id, overdue));
                    }
                }
                return;
            }
            State::Suspended {
                leave_owed: None,
                rejoin: false,
                ..
            } => return,
            State::Suspended {
                leave_owed: None,
                rejoin: true,
                ..
            } => self.rejoin(now),
            _ => {}
        }
        while let Some((id, commit)) = self.core.commits.next() {
            if commit.incarnation != self.incarnation {
                // Made before the partitions were lost: it goes nowhere.
                self.core.commits.settled(id);
                self.core.events.push_back(Event::CommitCompleted {
                    id,
                    result: Err(CommitError::Stale {
                        generation: commit.epoch,
                    }),
                });
                continue;
            }
            let QueuedCommit {
                incarnation,
                offsets,
                ..
            } = commit;
            let request = GroupRequest::OffsetCommit {
                group: self.core.config.group_id.clone(),
                generation: self.epoch,
                member_id: self.core.member_id.clone(),
                instance_id: self.core.config.instance_id.clone(),
                offsets: offsets.clone(),
            };
            let sent = Sent::Commit {
                epoch: self.epoch,
                incarnation,
                offsets,
            };
            let epoch = self.core.coordinator.epoch();
            self.core
                .outbox
                .send_as(id, Target::Coordinator(node), request, sent, epoch);
            break;
        }
        let due = self.heartbeat.in_flight.is_none()
            && (now >= self.heartbeat.next_at
                || ((matches!(self.state, State::Joining) || self.ack_due())
                    && self.heartbeat.failures == 0));
        if due {
            self.send_heartbeat(now, node);
        }
        let member = Some((self.core.member_id.clone(), self.epoch));
        self.core
            .fetch_offsets_if_due(now, node, member, |partitions| Sent::OffsetFetch {
                partitions,
            });
    }

    /// A heartbeat: every field when joining or after an error (the broker needs the
    /// subscription and rebalance timeout to place a member it does not know); the
    /// owned partitions whenever they changed since the broker last heard them, or a
    /// target is to be acknowledged; the rest left out (null: unchanged).
    fn send_heartbeat(&mut self, now: Instant, node: NodeId) {
        let joining = matches!(self.state, State::Joining);
        let epoch = if joining { JOIN_EPOCH } else { self.epoch };
        let full = joining || self.sent_fields.is_none();
        let topics_changed = self.sent_fields.as_ref().is_none_or(|f| {
            f.topics != self.core.config.topics || f.regex != self.core.config.topic_regex
        });
        let owned_changed = self
            .sent_fields
            .as_ref()
            .is_none_or(|f| f.owned != self.core.owned);
        // Names and regex go together, the regex empty for a subscription by names
        // (an empty regex is "none" to the broker; librdkafka sends the same, and the
        // librdkafka mock insists on both or neither).
        let (names, regex) = if full || topics_changed {
            let regex = self.core.config.topic_regex.clone().unwrap_or_default();
            (Some(self.core.config.topics.clone()), Some(regex))
        } else {
            (None, None)
        };
        let topic_partitions = (full || owned_changed || self.ack_owed).then(|| self.owned_by_id());
        self.ack_owed = false;
        let request = GroupRequest::ConsumerGroupHeartbeat {
            group: self.core.config.group_id.clone(),
            member_id: self.core.member_id.clone(),
            member_epoch: epoch,
            instance_id: self.core.config.instance_id.clone(),
            rack_id: if full {
                self.core.config.rack.clone()
            } else {
                None
            },
            rebalance_timeout_ms: if full {
                millis(self.core.config.max_poll_interval)
            } else {
                -1
            },
            subscribed_topic_names: names,
            subscribed_topic_regex: regex,
            server_assignor: if full {
                self.core.config.remote_assignor.clone()
            } else {
                None
            },
            topic_partitions,
        };
        let fields = SentFields {
            topics: self.core.config.topics.clone(),
            regex: self.core.config.topic_regex.clone(),
            owned: self.core.owned.clone(),
        };
        let id = self.core.send(
            Target::Coordinator(node),
            request,
            Sent::Heartbeat { epoch, fields },
        );
        self.announced = true;
        self.heartbeat.in_flight = Some(InFlight {
            id,
            sent_at: now,
            deadline: now + self.heartbeat_timeout(),
        });
        self.heartbeat.next_at = now + self.interval;
    }

    fn send_leave(&mut self, node: NodeId, epoch: i32, reason: &str) -> RequestId {
        debug!(group = %self.core.config.group_id, member = %self.core.member_id, epoch, reason, "leaving");
        let id = self.core.send(
            Target::Coordinator(node),
            GroupRequest::ConsumerGroupHeartbeat {
                group: self.core.config.group_id.clone(),
                member_id: self.core.member_id.clone(),
                member_epoch: epoch,
                instance_id: self.core.config.instance_id.clone(),
                rack_id: None,
                rebalance_timeout_ms: -1,
                subscribed_topic_names: None,
                subscribed_topic_regex: None,
                server_assignor: None,
                topic_partitions: None,
            },
            Sent::Leave,
        );
        self.announced = false;
        self.heartbeat.in_flight = None;
        id
    }

    /// The owned partitions by topic id, for the acknowledgement, through the names
    /// they were assigned under: never through the metadata of the moment, which may
    /// have lost a topic (a topic-level error) while the member still holds it, and
    /// the broker would read the omission as a release.
    fn owned_by_id(&self) -> Vec<(Uuid, Vec<i32>)> {
        let ids: BTreeMap<&str, Uuid> = self
            .assigned_names
            .iter()
            .map(|(id, n)| (n.as_str(), *id))
            .collect();
        let mut out: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
        for tp in &self.core.owned {
            if let Some(id) = ids.get(tp.topic.as_str()) {
                out.entry(*id).or_default().push(tp.partition);
            }
        }
        out.into_iter().collect()
    }

    /// A topic's name: from the assignment it was taken under, else from metadata.
    fn name_of(&self, id: &Uuid) -> Option<&String> {
        self.assigned_names.get(id).or_else(|| self.names.get(id))
    }

    /// Forgets the names of topics the member no longer owns a partition of.
    fn prune_names(&mut self) {
        let owned = &self.core.owned;
        self.assigned_names
            .retain(|_, name| owned.iter().any(|tp| tp.topic == *name));
    }

    fn coordinator_found(&mut self, now: Instant) {
        // The member keeps its id and epoch across a coordinator move (the group's
        // state is the broker's, not the connection's): the next heartbeat goes at
        // once, with every field.
        self.heartbeat.in_flight = None;
        self.heartbeat.next_at = now;
        self.heartbeat.failures = 0;
        self.sent_fields = None;
    }

    #[allow(clippy::too_many_arguments)]
    fn on_heartbeat(
        &mut self,
        now: Instant,
        sent_at: Instant,
        fields: SentFields,
        member_id: Option<String>,
        member_epoch: i32,
        heartbeat_interval_ms: i32,
        assignment: Option<Vec<(Uuid, Vec<i32>)>>,
    ) {
        self.heartbeat.failures = 0;
        if !matches!(
            self.state,
            State::Joining | State::Stable | State::Revoking { .. }
        ) {
            return;
        }
        self.sent_fields = Some(fields);
        if let Some(id) = member_id.filter(|id| !id.is_empty()) {
            self.core.member_id = id;
        }
        // librdkafka ignores an interval of 0 or less, as does this.
        if let Some(ms) = u64::try_from(heartbeat_interval_ms)
            .ok()
            .filter(|ms| *ms > 0)
        {
            let interval = Duration::from_millis(ms);
            if interval != self.interval {
                self.heartbeat.next_at = now + interval;
                self.interval = interval;
            }
        }
        if member_epoch < 0 {
            return;
        }
        self.heartbeat.last_ok = Some(sent_at);
        let joined = matches!(self.state, State::Joining);
        if !joined && member_epoch != self.epoch {
            self.core.events.push_back(Event::MemberEpoch {
                epoch: member_epoch,
            });
        }
        self.epoch = member_epoch;
        if joined {
            self.state = State::Stable;
            info!(group = %self.core.config.group_id, member = %self.core.member_id, epoch = member_epoch, "joined");
            self.core.events.push_back(Event::Joined {
                generation: member_epoch,
                member_id: self.core.member_id.clone(),
                leader: false,
                protocol: self
                    .core
                    .config
                    .remote_assignor
                    .clone()
                    .unwrap_or_else(|| "consumer".into()),
            });
        }
        if let Some(assignment) = assignment {
            let target: BTreeMap<Uuid, BTreeSet<i32>> = assignment
                .into_iter()
                .map(|(id, ps)| (id, ps.into_iter().collect()))
                .collect();
            // A new target is acknowledged once reconciled, whatever it changed: one
            // that revokes only partitions this member never took (their topic id
            // unresolved) changes nothing owned, and the broker waits for the
            // acknowledgement until the rebalance timeout, then fences the member.
            // Java's `maybeReconcile` acknowledges the same way; the same target again
            // (a full heartbeat's answer) is not new.
            if target != self.target {
                self.ack_owed = true;
                self.target = target;
            }
        }
        self.reconcile(now);
    }

    fn on_heartbeat_error(
        &mut self,
        now: Instant,
        sent_epoch: i32,
        error: i16,
        message: Option<String>,
    ) {
        // Every error: the next heartbeat carries every field (Java's
        // `resetHeartbeatState`).
        self.sent_fields = None;
        let reaction = reaction(error);
        debug!(group = %self.core.config.group_id, member = %self.core.member_id, epoch = sent_epoch, error = %error_name(error), ?message, ?reaction, "heartbeat refused");
        match reaction {
            Reaction::Rediscover => {
                self.heartbeat.next_at = now;
                self.mark_coordinator_unknown(now);
            }
            Reaction::Retry => {
                if error != ResponseError::CoordinatorLoadInProgress.code() {
                    warn!(group = %self.core.config.group_id, error = %error_name(error), ?message, "heartbeat refused; retrying after the backoff");
                }
                self.back_off(now);
            }
            Reaction::TopicAuthorization => {
                let error = GroupError::TopicAuthorization {
                    group: self.core.config.group_id.clone(),
                    api: "ConsumerGroupHeartbeat",
                    topics: self.subscription(),
                    message,
                };
                warn!(group = %self.core.config.group_id, %error, "heartbeat refused; retrying after the backoff");
                self.core.events.push_back(Event::Error(error));
                self.back_off(now);
            }
            Reaction::Fenced if sent_epoch == JOIN_EPOCH => {
                // A join fenced: the broker still holds an older incarnation of this
                // member id (a leave that never arrived). Nothing is owned; ask again
                // after the backoff rather than at once, which would spin against the
                // broker until that incarnation's session ends.
                self.fence(now, LostReason::FencedEpoch, "join fenced");
                self.back_off(now);
            }
            Reaction::Fenced => {
                let why = if error == ResponseError::UnknownMemberId.code() {
                    LostReason::UnknownMember
                } else {
                    LostReason::FencedEpoch
                };
                let fenced = why == LostReason::FencedEpoch;
                self.fence(now, why, "fenced by the coordinator");
                // FENCED_MEMBER_EPOCH leaves the member's incarnation on the broker with
                // its partitions (Kafka and the mock alike); UNKNOWN_MEMBER_ID says it is
                // gone. A bare epoch-0 join then meets that incarnation: a broker before
                // KAFKA-19233 fences it until the session ends, and the librdkafka mock
                // answered it with the incarnation's epoch and no assignment while it
                // held the partitions for it: stalled for good (chaos seed 340586618).
                if fenced {
                    self.leave_before_rejoining(now, "fenced by the coordinator");
                }
            }
            // The group is gone (deleted, or lost by its coordinator): a join creates
            // it again. Java closes the member here; a member that rejoins recovers.
            Reaction::GroupGone if sent_epoch != JOIN_EPOCH => {
                self.fence(now, LostReason::UnknownMember, "the group is gone");
            }
            Reaction::GroupGone | Reaction::Fatal => self.fatal("ConsumerGroupHeartbeat", error),
        }
    }

    /// The next heartbeat waits for the KIP-580 backoff.
    fn back_off(&mut self, now: Instant) {
        self.heartbeat.failures += 1;
        self.heartbeat.next_at = now + self.core.backoff.delay(self.heartbeat.failures);
    }

    /// What the member subscribes to, for an error message: the topics, or the regex.
    fn subscription(&self) -> Vec<String> {
        let mut topics = self.core.config.topics.clone();
        topics.extend(
            self.core
                .config
                .topic_regex
                .iter()
                .map(|r| format!("/{r}/")),
        );
        topics
    }

    /// The member is out of the group: every owned partition is lost (`reason`), the
    /// heartbeat in flight is given up (a late answer must not put the member back at
    /// its old epoch), and it rejoins at once with epoch 0 and the same member id (as
    /// Java's `transitionToFenced`).
    fn fence(&mut self, now: Instant, reason: LostReason, why: &str) {
        info!(group = %self.core.config.group_id, member = %self.core.member_id, why, "rejoining with epoch 0");
        self.core.lose_all(reason);
        self.rejoin(now);
    }

    /// The member gave its partitions up on its own clock (a session lapsed, a
    /// revocation timed out), so the broker may still count it in, with those
    /// partitions. A join (epoch 0) under the same member id would then meet that
    /// incarnation: a broker before KAFKA-19233 fences it until the session ends, and
    /// the librdkafka mock answered it with the old epoch and no assignment, so the
    /// broker held the partitions for a member that owned none and they stalled for
    /// good (chaos, consumer protocol, seed 216083087). The member leaves first (epoch
    /// -1, or -2 for a static member, whose partitions the broker then keeps for it),
    /// once the coordinator is known, and rejoins right after.
    fn leave_before_rejoining(&mut self, now: Instant, why: &'static str) {
        if !self.announced {
            return;
        }
        let epoch = if self.core.config.instance_id.is_some() {
            STATIC_LEAVE_EPOCH
        } else {
            LEAVE_EPOCH
        };
        self.state = State::Suspended {
            leave_owed: Some(epoch),
            rejoin: true,
            leave_sent: None,
            give_up_at: self.leave_give_up_at(now),
            why,
        };
    }

    /// Until when a leave owed before a rejoin is worth sending: a session from now,
    /// so at least a session after the last heartbeat sent (the broker may have read
    /// it without its answer reaching this member: a silent broker holds answers
    /// back). By then the broker has expired the member anyway, and a join under the
    /// same id is a new member's.
    fn leave_give_up_at(&self, now: Instant) -> Instant {
        now + self.core.config.session_timeout
    }

    /// The answer to leave `id` came, with `error`: a rejoin waiting for it goes now,
    /// unless the leave did not reach the group (the broker is not, or not yet, its
    /// coordinator); then it goes again to the coordinator found next.
    fn leave_answered(&mut self, now: Instant, id: RequestId, error: i16) {
        let State::Suspended {
            leave_owed,
            leave_sent,
            rejoin,
            ..
        } = &mut self.state
        else {
            return;
        };
        if leave_sent.is_none_or(|(sent, _)| sent != id) {
            return;
        }
        let unread = [
            ResponseError::NotCoordinator,
            ResponseError::CoordinatorNotAvailable,
            ResponseError::CoordinatorLoadInProgress,
        ]
        .iter()
        .any(|e| e.code() == error);
        if unread {
            // Chaos, seed 848527062: a leave answered NOT_COORDINATOR was taken as
            // done, the join met the old incarnation and the group stalled.
            return self.leave_unread(now, true);
        }
        *leave_owed = None;
        *leave_sent = None;
        if *rejoin {
            self.rejoin(now);
            self.advance(now);
        }
    }

    /// A leave owed before a rejoin: its answer overdue (sent again to the next
    /// coordinator), or no longer needed (`give_up_at`).
    fn leave_owed_due(&mut self, now: Instant) {
        let State::Suspended {
            leave_owed: leave_owed @ Some(_),
            leave_sent,
            give_up_at,
            rejoin,
            ..
        } = &mut self.state
        else {
            return;
        };
        if now >= *give_up_at {
            debug!(group = %self.core.config.group_id, member = %self.core.member_id, "the leave went unanswered for a session; the broker has expired this member, rejoining");
            *leave_owed = None;
            *leave_sent = None;
            if *rejoin {
                self.rejoin(now);
            }
            return;
        }
        if leave_sent.is_some_and(|(_, overdue)| now >= overdue) {
            self.leave_unread(now, true);
        }
    }

    /// The leave owed before a rejoin did not reach the group (no answer, or the
    /// broker is not its coordinator): it goes again, to the coordinator found next
    /// (`coordinator_at_fault`: the one it went to is given up on).
    fn leave_unread(&mut self, now: Instant, coordinator_at_fault: bool) {
        if let State::Suspended { leave_sent, .. } = &mut self.state {
            *leave_sent = None;
        }
        if coordinator_at_fault {
            self.mark_coordinator_unknown(now);
        }
    }

    /// Joining again with epoch 0, owning nothing.
    fn rejoin(&mut self, now: Instant) {
        self.incarnation += 1;
        self.core.owned.clear();
        self.assigned_names.clear();
        self.target.clear();
        self.core.fetch = None;
        self.epoch = JOIN_EPOCH;
        self.sent_fields = None;
        self.ack_owed = false;
        self.state = State::Joining;
        self.heartbeat.in_flight = None;
        self.heartbeat.last_ok = None;
        self.heartbeat.next_at = now;
    }

    /// Moves the owned partitions toward the target: revocation first (the
    /// application gives them back and commits), then the new ones, then an
    /// acknowledgement (the next heartbeat carries the owned set, at once).
    fn reconcile(&mut self, now: Instant) {
        if !matches!(self.state, State::Stable) {
            return;
        }
        let mut assigned = BTreeSet::new();
        let mut unknown = Vec::new();
        for (id, partitions) in &self.target {
            match self.name_of(id) {
                Some(name) => assigned.extend(
                    partitions
                        .iter()
                        .map(|p| TopicPartition::new(name.clone(), *p)),
                ),
                None => unknown.push(*id),
            }
        }
        let ask: Vec<Uuid> = unknown
            .into_iter()
            .filter(|id| self.asked_ids.insert(*id))
            .collect();
        if !ask.is_empty() {
            // The topic ids come from metadata; the broker named a topic this member
            // has not seen yet. Refresh it; the rest of the assignment goes on.
            debug!(group = %self.core.config.group_id, ?ask, "assignment names unknown topic ids; asking for metadata");
            self.core.events.push_back(Event::MetadataNeeded {
                topics: self.core.config.topics.clone(),
            });
        }
        // Every owned partition's topic id is known (`assigned_names`), so what the
        // target drops is exact, whatever metadata says now.
        let revoked: Vec<TopicPartition> = self
            .core
            .owned
            .iter()
            .filter(|tp| !assigned.contains(*tp))
            .cloned()
            .collect();
        if !revoked.is_empty() {
            debug!(group = %self.core.config.group_id, epoch = self.epoch, ?revoked, "revoking");
            self.state = State::Revoking {
                epoch: self.epoch,
                partitions: revoked.clone(),
                deadline: now + self.core.config.max_poll_interval,
            };
            self.core.events.push_back(Event::RevokeRequested {
                generation: self.epoch,
                partitions: revoked,
            });
            return;
        }
        let added: Vec<TopicPartition> = assigned.difference(&self.core.owned).cloned().collect();
        if added.is_empty() {
            return;
        }
        for (id, partitions) in &self.target {
            if let Some(name) = self.name_of(id).cloned() {
                if added.iter().any(|tp| tp.topic == name) && !partitions.is_empty() {
                    self.assigned_names.insert(*id, name);
                }
            }
        }
        self.core.owned.extend(added.iter().cloned());
        debug!(group = %self.core.config.group_id, epoch = self.epoch, ?added, "assigned");
        self.core.events.push_back(Event::Assigned {
            generation: self.epoch,
            added: added.clone(),
            assignment: self.assignment(),
        });
        PendingFetch::grant(
            &mut self.core.fetch,
            now,
            self.epoch,
            added,
            &self.core.owned,
        );
    }

    fn on_commit(
        &mut self,
        now: Instant,
        id: RequestId,
        epoch: i32,
        incarnation: u64,
        offsets: Vec<CommitOffset>,
        partitions: Vec<(TopicPartition, i16)>,
    ) {
        let first_error = partitions.iter().map(|(_, e)| *e).find(|e| *e != 0);
        let Some(code) = first_error else {
            self.core.events.push_back(Event::CommitCompleted {
                id,
                result: Ok(offsets),
            });
            return;
        };
        // STALE_MEMBER_EPOCH: the epoch moved on while the commit was on its way (a
        // heartbeat answer bumped it). The same offsets go again with the new epoch
        // if the member still owns them (Java retries with the latest epoch too), and
        // has owned them since: not after a rejoin ([`QueuedCommit`]).
        if code == ResponseError::StaleMemberEpoch.code()
            && self.epoch != epoch
            && incarnation == self.incarnation
            && matches!(self.state, State::Stable | State::Revoking { .. })
            && offsets
                .iter()
                .all(|o| self.core.owned.contains(&o.partition))
        {
            debug!(group = %self.core.config.group_id, old = epoch, new = self.epoch, "commit had a stale epoch; sending it again");
            let commit = QueuedCommit {
                incarnation,
                epoch,
                offsets,
            };
            self.core.commits.retry(id, commit);
            return;
        }
        let result = Err(CommitError::Broker {
            code,
            name: error_name(code),
        });
        self.core
            .events
            .push_back(Event::CommitCompleted { id, result });
        match ResponseError::try_from_code(code) {
            Some(
                ResponseError::NotCoordinator
                | ResponseError::CoordinatorNotAvailable
                | ResponseError::RequestTimedOut,
            ) => self.mark_coordinator_unknown(now),
            Some(ResponseError::GroupAuthorizationFailed) => {
                self.fatal("OffsetCommit", code);
            }
            // UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH with no newer
            // epoch: the commit alone fails; the heartbeat learns the member's fate.
            _ => {}
        }
    }

    fn on_offset_fetch(
        &mut self,
        now: Instant,
        id: RequestId,
        asked: BTreeSet<TopicPartition>,
        answer: OffsetFetchAnswer,
    ) {
        let fatal = |code| code == ResponseError::GroupAuthorizationFailed.code();
        match self.core.offsets_answer(now, id, &asked, answer, fatal) {
            Offsets::Fatal(code) => self.fatal("OffsetFetch", code),
            Offsets::Rediscover => self.mark_coordinator_unknown(now),
            Offsets::Taken => {}
        }
    }

    fn progress_timeout(&mut self, now: Instant) {
        self.core.progress_timed_out();
        // As Java: a leave heartbeat whose answer is not waited for; the member
        // rejoins with epoch 0 on the application's next progress. With the
        // coordinator unknown now, the leave goes once it is found, before any rejoin.
        let joined = self.announced
            && matches!(
                self.state,
                State::Joining | State::Stable | State::Revoking { .. }
            );
        let epoch = if self.core.config.instance_id.is_some() {
            STATIC_LEAVE_EPOCH
        } else {
            LEAVE_EPOCH
        };
        self.core.lose_all(LostReason::ProgressTimeout);
        let give_up_at = self.leave_give_up_at(now);
        self.rejoin(now);
        self.state = State::Suspended {
            leave_owed: joined.then_some(epoch),
            rejoin: false,
            leave_sent: None,
            give_up_at,
            why: "consumer poll timeout has expired",
        };
    }

    fn mark_coordinator_unknown(&mut self, now: Instant) {
        if self.coordinator().is_some() {
            self.heartbeat.in_flight = None;
            self.sent_fields = None;
        }
        self.core.mark_coordinator_unknown(now);
    }

    fn close(&mut self, error: Option<GroupError>) {
        self.core.fail_queued(&error);
        let clean = error.is_none();
        self.core.owned.clear();
        self.assigned_names.clear();
        self.core.fetch = None;
        self.heartbeat.in_flight = None;
        self.state = State::Closed(error);
        if clean {
            self.core.events.push_back(Event::Left);
        }
    }
}

/// A member id as KIP-1082 asks: a random UUID, in Kafka's text form (22 characters of
/// URL-safe base64, as Java's `Uuid.toString`), made from `entropy` (the driver's).
pub fn new_member_id(entropy: [u8; 16]) -> String {
    use base64::Engine;
    let uuid = uuid::Builder::from_random_bytes(entropy).into_uuid();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid.as_bytes())
}

#[cfg(test)]
mod tests;
