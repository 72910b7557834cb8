//! The contract both group members share (the classic one, `member`, and KIP-848's,
//! `consumer_member`): configuration, requests, events, errors, states.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::assignor::{AssignError, Assignor, MemberSubscription, PartitionRacks};
use super::consumer_protocol::{Assignment, TopicPartition};
use super::member::commit_reaction;
use super::messages::{CommitOffset, GroupRequest};
use crate::metadata::NodeId;

/// Configuration of one group member.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// `group.id`.
    pub group_id: String,
    /// The topics subscribed to.
    pub topics: Vec<String>,
    /// `session.timeout.ms` (default 45 s).
    pub session_timeout: Duration,
    /// `heartbeat.interval.ms` (default 3 s).
    pub heartbeat_interval: Duration,
    /// `max.poll.interval.ms` (default 300 s): the rebalance timeout sent in JoinGroup,
    /// the bound on a revocation, and the progress guard.
    pub max_poll_interval: Duration,
    /// `group.instance.id`, for static membership (KIP-345).
    pub instance_id: Option<String>,
    /// Assignors in preference order; the first is the member's favourite.
    pub assignors: Vec<Arc<dyn Assignor>>,
    /// The automatic second bounce of a move to cooperative rebalancing, for a list
    /// that offers eager assignors beside cooperative ones. `None` (the default here,
    /// and for any list the application sets) keeps the Java client's rule: a member
    /// offering an eager assignor gives everything back at every rebalance. `Some(hold)`
    /// (ottla's default assignor list): once the group has chosen a cooperative
    /// assignor in every generation for `hold`, the member stops offering the eager
    /// ones and rebalances cooperatively; a member without a cooperative assignor that
    /// joins later is refused by the broker (INCONSISTENT_GROUP_PROTOCOL), as after
    /// the Java client's manual second bounce. See docs/rebalance.md.
    pub cooperative_upgrade: Option<Duration>,
    /// `retry.backoff.ms` (default 100 ms), doubled per consecutive failure.
    pub retry_backoff: Duration,
    /// `retry.backoff.max.ms` (default 1 s).
    pub retry_backoff_max: Duration,
    /// How long a JoinGroup may stay unanswered before it counts as failed; the broker
    /// may hold a JoinGroup for the whole rebalance timeout, so this is
    /// `max_poll_interval` plus this slack (default 5 s, as in the Java client).
    pub request_slack: Duration,
    /// `request.timeout.ms` (default 30 s): how long a SyncGroup may stay unanswered,
    /// as in the Java client. A follower's SyncGroup waits at the broker for the
    /// leader's, which comes at once; a coordinator gone silent is noticed after this,
    /// not after the rebalance timeout (305 s by default).
    pub request_timeout: Duration,
    /// How long the leader waits before sending its SyncGroup (default 0). The
    /// librdkafka mock cluster answers a follower's SyncGroup that arrives after the
    /// leader's with INVALID_REQUEST; when every member is equally fast, the leader
    /// wins every race and the group never forms. A few milliseconds for the
    /// followers to get theirs in breaks the tie; a real broker needs none.
    pub leader_sync_delay: Duration,
    /// How long a LeaveGroup may wait for its answer before the member closes anyway
    /// (default 30 s, the Java client's close timeout). During a join the LeaveGroup
    /// waits behind the JoinGroup the broker holds on the same connection.
    pub close_timeout: Duration,
    /// `metadata.max.age.ms` (default 5 min): how often a leader asks for fresh
    /// metadata ([`Event::MetadataNeeded`]) to notice subscribed topics that gained
    /// partitions or were deleted since it assigned, as the Java client's leader does.
    pub metadata_max_age: Duration,
    /// `client.rack`: sent in the subscription, so rack-aware assignors (KIP-881) give
    /// this member partitions with a replica in its rack when balance allows.
    pub rack: Option<String>,
    /// Seed for backoff jitter.
    pub seed: u64,
    /// `group.protocol`: the classic protocol (JoinGroup and SyncGroup, assignment by
    /// the group's leader) or KIP-848's consumer protocol (ConsumerGroupHeartbeat,
    /// assignment by the broker).
    pub protocol: GroupProtocol,
    /// `group.remote.assignor` (consumer protocol only): the broker's assignor
    /// (`uniform`, `range`), or `None` for the broker's default.
    pub remote_assignor: Option<String>,
    /// A regular expression the broker matches topic names against (consumer
    /// protocol only, `SubscribedTopicRegex`; RE2J syntax on Kafka): the member is
    /// subscribed to every topic it matches, beside `topics`.
    pub topic_regex: Option<String>,
}

/// `group.protocol`: which consumer-group protocol a member speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GroupProtocol {
    /// The classic protocol (JoinGroup, SyncGroup, Heartbeat): the default, as in the
    /// Java client; every broker since 0.9 has it.
    #[default]
    Classic,
    /// KIP-848's protocol (ConsumerGroupHeartbeat, Kafka 4.0+): the broker assigns,
    /// and rebalances move only the partitions that change owner.
    Consumer,
}

impl GroupProtocol {
    /// The Java property value: `classic` or `consumer`.
    pub fn name(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

impl std::str::FromStr for GroupProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "classic" => Ok(GroupProtocol::Classic),
            "consumer" => Ok(GroupProtocol::Consumer),
            other => Err(format!(
                "group.protocol must be classic or consumer, not {other:?}"
            )),
        }
    }
}

/// How long the group must have chosen a cooperative assignor, generation after
/// generation, before a member on ottla's default assignor list drops its eager ones
/// ([`GroupConfig::cooperative_upgrade`]): long enough for a rolling deployment of the
/// group, so that a member of the previous client restarted within it still finds a
/// protocol in common.
pub const DEFAULT_COOPERATIVE_UPGRADE: Duration = Duration::from_secs(600);
/// `session.timeout.ms`'s default (the Java client's since Kafka 3.0).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(45);
/// `heartbeat.interval.ms`'s default (the Java client's).
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// How long a close may take by default, the member's leave and the consumer's commit
/// on close alike (`crate::session::CloseCommit`): the Java consumer's `close()` timeout
/// (`DEFAULT_CLOSE_TIMEOUT_MS`, 30 s).
pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(30);
/// `max.poll.interval.ms`'s default (the Java client's).
pub const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// The one check of `heartbeat.interval.ms` against `session.timeout.ms`, for every
/// builder: below it, or the error message (the Java client refuses the same). Above a
/// third of it, two lost heartbeats in a row end the session; that is allowed, as in
/// the Java client, with a warning.
pub fn check_heartbeat(session: Duration, heartbeat: Duration) -> Result<(), String> {
    if heartbeat >= session {
        return Err(format!(
            "{heartbeat:?} must be lower than session.timeout.ms ({session:?}), and at most a third of it"
        ));
    }
    if heartbeat.saturating_mul(3) > session {
        tracing::warn!(
            ?heartbeat,
            ?session,
            "heartbeat.interval.ms is more than a third of session.timeout.ms: two lost heartbeats end the session"
        );
    }
    Ok(())
}

impl GroupConfig {
    /// How long a JoinGroup may wait for its answer: the broker holds it until the
    /// rebalance completes, up to the rebalance timeout (`max.poll.interval.ms`), so it
    /// gets that plus [`GroupConfig::request_slack`], as in the Java client. The member
    /// arms its timer with it and hands it to the driver with the request
    /// ([`Outgoing::wait`]): one number, computed here.
    pub fn join_wait(&self) -> Duration {
        self.max_poll_interval + self.request_slack
    }

    /// Defaults for `group_id` subscribing to `topics` with the given assignors.
    pub fn new(
        group_id: impl Into<String>,
        topics: Vec<String>,
        assignors: Vec<Arc<dyn Assignor>>,
    ) -> Self {
        Self {
            group_id: group_id.into(),
            topics,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            max_poll_interval: DEFAULT_MAX_POLL_INTERVAL,
            instance_id: None,
            assignors,
            cooperative_upgrade: None,
            retry_backoff: crate::backoff::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: crate::backoff::DEFAULT_RETRY_BACKOFF_MAX,
            request_slack: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            leader_sync_delay: Duration::ZERO,
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
            metadata_max_age: Duration::from_secs(300),
            rack: None,
            seed: 0x5eed,
            protocol: GroupProtocol::Classic,
            remote_assignor: None,
            topic_regex: None,
        }
    }
}

/// Identifies one request the member asked to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Where a request must go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Any broker (FindCoordinator).
    AnyBroker,
    /// The group coordinator.
    Coordinator(NodeId),
}

/// A request to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Report the outcome with this id.
    pub id: RequestId,
    /// Where to send it.
    pub target: Target,
    /// What to send.
    pub request: GroupRequest,
    /// How long the broker may hold it, when that is longer than `request.timeout.ms`
    /// (a JoinGroup: [`GroupConfig::join_wait`]). `None`: the request timeout.
    pub wait: Option<Duration>,
}

pub use crate::Failure;

/// Why partitions were lost (taken away without a chance to commit).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The broker no longer knows this member id (UNKNOWN_MEMBER_ID; under KIP-848
    /// also GROUP_ID_NOT_FOUND to a member already in the group: the group itself is
    /// gone, and the member rejoins with epoch 0).
    UnknownMember,
    /// The generation is no longer valid (ILLEGAL_GENERATION).
    IllegalGeneration,
    /// No successful heartbeat within the session timeout.
    SessionLapsed,
    /// The application did not finish a revocation within the rebalance timeout.
    RevocationTimedOut,
    /// The application did not come back within `max.poll.interval.ms`.
    ProgressTimeout,
    /// The broker fenced this member's epoch (FENCED_MEMBER_EPOCH, KIP-848): another
    /// member may own the partitions already.
    FencedEpoch,
    /// The member hit a fatal error.
    Fatal,
}

/// A fatal group error: the member is closed and every later command returns it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The broker answered with a non-retriable error code.
    #[error("group {group}: {api} failed with {name} (code {code}){}", hint.map(|h| format!(": {h}")).unwrap_or_default())]
    Broker {
        /// The group id.
        group: String,
        /// The API that failed.
        api: &'static str,
        /// The Kafka error code.
        code: i16,
        /// Its name.
        name: String,
        /// What to change, when known.
        hint: Option<&'static str>,
    },
    /// JoinGroup failed with INCONSISTENT_GROUP_PROTOCOL (23): the group's members
    /// share none of the assignors this member offered. A librdkafka group offers
    /// `range,roundrobin` by default, the Java client `range,cooperative-sticky`, and
    /// ottla `cooperative-sticky`; `docs/migrating.md` gives the rolling upgrade. The
    /// Java client throws `InconsistentGroupProtocolException` here.
    #[error(
        "group {group}: JoinGroup failed with INCONSISTENT_GROUP_PROTOCOL (code 23): the group's members share none of the assignors this member offered ({}); offer one the group uses, first in partition.assignment.strategy (ConsumerBuilder::assignors; librdkafka's default is range,roundrobin): docs/migrating.md, \"Joining a group of librdkafka members\", gives the rolling upgrade",
        offered.join(",")
    )]
    InconsistentGroupProtocol {
        /// The group id.
        group: String,
        /// The assignors this member offered, in its order of preference.
        offered: Vec<String>,
    },
    /// The leader could not compute an assignment.
    #[error("group {group}: assignor {assignor} failed: {message}")]
    Assignment {
        /// The group id.
        group: String,
        /// The assignor's name.
        assignor: String,
        /// Why.
        message: String,
    },
    /// `group.protocol=consumer` on a broker without KIP-848's ConsumerGroupHeartbeat.
    #[error(
        "group {group}: the broker does not support the consumer group protocol (KIP-848, ConsumerGroupHeartbeat): {detail}; set group.protocol=classic, or use a Kafka 4.0+ broker"
    )]
    ProtocolUnsupported {
        /// The group id.
        group: String,
        /// What the broker said.
        detail: String,
    },
    /// The broker refused the member access to topics it subscribes to
    /// (TOPIC_AUTHORIZATION_FAILED on ConsumerGroupHeartbeat). Not fatal: the member
    /// stays and asks again, so granting the ACL is enough (KAFKA-18813).
    #[error(
        "group {group}: {api} failed with TOPIC_AUTHORIZATION_FAILED (code 29) for topic(s) {}: the principal lacks DESCRIBE on them (and READ to consume); grant the ACL, the member keeps retrying{}",
        topics.join(","),
        message.as_deref().map(|m| format!(" (broker: {m})")).unwrap_or_default()
    )]
    TopicAuthorization {
        /// The group id.
        group: String,
        /// The API that was refused.
        api: &'static str,
        /// The topics the member subscribes to (the broker does not say which of them
        /// it refused; its message may).
        topics: Vec<String>,
        /// The broker's error message, if any.
        message: Option<String>,
    },
    /// The member was closed.
    #[error("group {group}: member closed")]
    Closed {
        /// The group id.
        group: String,
    },
}

/// Why a commit was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The member has no live generation (rebalancing, or not yet joined).
    #[error("no live generation to commit with")]
    NoGeneration,
    /// The coordinator is not known right now; retry later.
    #[error("coordinator unknown")]
    CoordinatorUnknown,
    /// A partition in the commit is not owned by this member.
    #[error("partition {0} is not owned by this member")]
    NotOwned(TopicPartition),
    /// The broker refused the commit.
    #[error("commit failed with {name} (code {code})")]
    Broker {
        /// The first failing error code.
        code: i16,
        /// Its name.
        name: String,
    },
    /// The request failed below the protocol; the commit may or may not have happened.
    #[error("commit request failed: {0:?}")]
    Request(Failure),
    /// The response belongs to a generation that has ended; it changed nothing.
    #[error("commit answered after generation {generation} ended")]
    Stale {
        /// The generation the commit was sent with.
        generation: i32,
    },
    /// The member is closed.
    #[error(transparent)]
    Closed(GroupError),
}

impl CommitError {
    /// Whether the same commit may succeed later without losing the partitions: the
    /// group is rebalancing, the coordinator is moving, or the request was lost.
    pub fn is_retriable(&self) -> bool {
        match self {
            CommitError::NoGeneration
            | CommitError::CoordinatorUnknown
            | CommitError::Request(_)
            | CommitError::Stale { .. } => true,
            CommitError::Broker { code, .. } => commit_reaction(*code).retriable,
            CommitError::NotOwned(_) | CommitError::Closed(_) => false,
        }
    }

    /// Whether the coordinator said this member's generation or member id is no longer
    /// valid (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID): its partitions are lost, this
    /// commit can never succeed, and the next owner starts at the last committed offset.
    pub fn membership_lost(&self) -> bool {
        use kafka_protocol::ResponseError as E;
        matches!(self, CommitError::Broker { code, .. }
            if *code == E::IllegalGeneration.code() || *code == E::UnknownMemberId.code())
    }
}

/// What the member tells its driver. Exhaustive on purpose: a driver must decide on
/// every one (the application sees `ottla::ConsumerEvent`, mapped from these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The coordinator was found (or changed).
    CoordinatorFound {
        /// Its node id.
        node: NodeId,
        /// Its `host:port`.
        address: String,
    },
    /// A generation was joined (after SyncGroup).
    Joined {
        /// The generation.
        generation: i32,
        /// This member's id.
        member_id: String,
        /// Whether this member computed the assignment.
        leader: bool,
        /// The assignor chosen by the group.
        protocol: String,
    },
    /// The consumer protocol: the member's epoch moved on without a join (the
    /// broker's answer to a heartbeat). Transactional offsets carry it (KIP-447: the
    /// coordinator refuses any other epoch), so the consumer's group metadata follows.
    MemberEpoch {
        /// The epoch.
        epoch: i32,
    },
    /// Partitions were added to this member.
    Assigned {
        /// The generation.
        generation: i32,
        /// The partitions added.
        added: Vec<TopicPartition>,
        /// Everything owned now.
        assignment: Vec<TopicPartition>,
    },
    /// The application must stop work on these partitions, commit what it finished and
    /// call [`GroupMember::complete_revocation`](super::GroupMember::complete_revocation) within the rebalance timeout.
    RevokeRequested {
        /// The generation the partitions belong to.
        generation: i32,
        /// The partitions to give back.
        partitions: Vec<TopicPartition>,
    },
    /// Partitions were taken away without a chance to commit: drop in-flight work.
    Lost {
        /// The partitions.
        partitions: Vec<TopicPartition>,
        /// Why.
        reason: LostReason,
    },
    /// Committed offsets of newly assigned partitions (`-1`: none committed).
    CommittedOffsets {
        /// The generation they were fetched for.
        generation: i32,
        /// `(partition, offset, leader epoch)`.
        offsets: Vec<(TopicPartition, i64, i32)>,
        /// The metadata committed with those offsets, where it is not empty (the
        /// Processor's records finished past its commit).
        metadata: Vec<(TopicPartition, String)>,
    },
    /// A commit finished.
    CommitCompleted {
        /// The id [`GroupMember::commit`](super::GroupMember::commit) returned.
        id: RequestId,
        /// What was committed, or why not.
        result: Result<Vec<CommitOffset>, CommitError>,
    },
    /// The application did not come back within `max.poll.interval.ms`; the member left
    /// the group (dynamic members send LeaveGroup) and rejoins on the next
    /// [`GroupMember::note_progress`](super::GroupMember::note_progress).
    ProgressTimeout {
        /// The configured interval.
        max_poll_interval: Duration,
    },
    /// The leader needs partition counts for these topics
    /// ([`GroupMember::set_topic_partitions`](super::GroupMember::set_topic_partitions)).
    MetadataNeeded {
        /// The topics.
        topics: Vec<String>,
    },
    /// The member left the group and is closed.
    Left,
    /// A fatal error; the member is closed.
    Fatal(GroupError),
    /// An error the application must hear of while the member keeps running and
    /// retrying: a missing topic ACL on the heartbeat (TOPIC_AUTHORIZATION_FAILED), a
    /// missing group ACL on FindCoordinator. Once the ACL is granted the member goes
    /// on by itself. The Java client throws these from `poll` and keeps going too.
    Error(GroupError),
}

/// The member's timers (see the table in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timer {
    /// A FindCoordinator is due.
    Coordinator,
    /// A JoinGroup is due.
    Join,
    /// A group request in flight is overdue.
    Request,
    /// A heartbeat is due.
    Heartbeat,
    /// The session lapses without a successful heartbeat.
    Session,
    /// A revocation must be complete.
    Revocation,
    /// The application must have come back for records.
    Progress,
    /// An OffsetFetch retry is due.
    OffsetFetch,
    /// The leader's delayed SyncGroup is due.
    Sync,
    /// The leader's periodic metadata check is due (`metadata_max_age`).
    Metadata,
}

/// The member's lifecycle state, as reported by [`GroupMember::state`](super::GroupMember::state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateKind {
    /// Not in a generation; JoinGroup is due once the coordinator is known.
    Unjoined,
    /// JoinGroup sent; waiting at the first barrier.
    Joining,
    /// SyncGroup sent; waiting at the second barrier.
    Syncing,
    /// In a generation, heartbeating.
    Stable,
    /// Waiting for the application to finish a revocation.
    Revoking,
    /// Left after a progress timeout; waiting for the application.
    Suspended,
    /// LeaveGroup sent.
    Leaving,
    /// Closed; sticky.
    Closed,
}

/// Whether a closing member leaves the group (the Java client's
/// `CloseOptions.GroupMembershipOperation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Membership {
    /// A dynamic member leaves; a static member stays until its session expires, so a
    /// restart within it keeps the partitions.
    #[default]
    Default,
    /// Leave the group now, static or not (a static member sends its
    /// `group.instance.id`): its partitions move at once.
    Leave,
    /// Stay in the group until the session expires, dynamic or not: no LeaveGroup.
    Remain,
}

/// The leader's assignment, computed off the member's task: a large group's can take
/// longer than a session, and the member goes on heartbeating meanwhile (as the Java
/// client's heartbeat thread does while its main thread assigns). Take it with
/// `GroupMember::poll_assignment`, call [`AssignmentJob::run`] where blocking is
/// harmless (the driver uses a blocking thread), and give the result back with
/// `GroupMember::assignment_done`. `run` is the assignor's computation and nothing
/// else: no I/O, no clock.
pub struct AssignmentJob {
    pub(super) id: u64,
    pub(super) assignor: Arc<dyn Assignor>,
    pub(super) counts: BTreeMap<String, i32>,
    pub(super) racks: Arc<PartitionRacks>,
    pub(super) subs: Vec<MemberSubscription>,
}

impl AssignmentJob {
    /// Runs the assignor.
    pub fn run(self) -> AssignmentDone {
        // A user's assignor that panics fails the member as an assignment error would,
        // instead of taking the thread (and, inline, the driver) down with it.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.assignor
                .assign_with_racks(&self.counts, &self.racks, &self.subs)
        }))
        .unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(AssignError::Panicked(message))
        });
        AssignmentDone {
            id: self.id,
            assignor: self.assignor,
            counts: self.counts,
            subs: self.subs,
            result,
        }
    }

    /// How many members and partitions it assigns.
    pub fn size(&self) -> (usize, usize) {
        let partitions = self
            .counts
            .values()
            .map(|n| usize::try_from(*n).unwrap_or(0))
            .sum();
        (self.subs.len(), partitions)
    }
}

impl std::fmt::Debug for AssignmentJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (members, partitions) = self.size();
        f.debug_struct("AssignmentJob")
            .field("id", &self.id)
            .field("assignor", &self.assignor.name())
            .field("members", &members)
            .field("partitions", &partitions)
            .finish()
    }
}

/// What [`AssignmentJob::run`] computed.
pub struct AssignmentDone {
    pub(super) id: u64,
    pub(super) assignor: Arc<dyn Assignor>,
    pub(super) counts: BTreeMap<String, i32>,
    pub(super) subs: Vec<MemberSubscription>,
    pub(super) result: Result<BTreeMap<String, Assignment>, AssignError>,
}

impl std::fmt::Debug for AssignmentDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssignmentDone")
            .field("id", &self.id)
            .field("assignor", &self.assignor.name())
            .field("ok", &self.result.is_ok())
            .finish()
    }
}
