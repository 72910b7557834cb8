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
//! | [`Timer::Session`] | as the heartbeat | no successful heartbeat for `session_timeout`: the coordinator is looked up again (member id, generation and partitions kept) |
//! | [`Timer::Revocation`] | waiting for the application to finish a revocation | the rebalance timeout ran out: the partitions are lost |
//! | [`Timer::Progress`] | the member is in the group | the application has not come back for records within `max_poll_interval` |
//! | [`Timer::OffsetFetch`] | an OffsetFetch must be retried for partitions still owned, coordinator known | the retry is due |
//! | [`Timer::Sync`] | a leader holds its SyncGroup (`leader_sync_delay`), coordinator known | the SyncGroup is sent |
//! | [`Timer::Metadata`] | this member assigned the live generation, in the group | [`Event::MetadataNeeded`] for every topic the group subscribes to, every `metadata_max_age` |
//!
//! A timer is armed only while firing it does something: one that fired and did nothing
//! would stay in the past and spin the driver's loop.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tracing::{debug, info, warn};

use super::assignor::{Assignor, MemberSubscription, PartitionRacks, RebalanceProtocol};
use super::consumer_protocol::{
    Assignment, Subscription, TopicPartition, decode_assignment, decode_subscription,
    encode_assignment, encode_subscription,
};
use super::messages::{CommitOffset, GroupRequest, GroupResponse};
use crate::proto::backoff::Backoff;
use crate::proto::error_name;
use crate::proto::metadata::NodeId;

/// The ConsumerProtocol version ottla writes; readers handle every version.
const SUBSCRIPTION_VERSION: i16 = 3;

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
}

impl GroupConfig {
    /// Defaults for `group_id` subscribing to `topics` with the given assignors.
    pub fn new(
        group_id: impl Into<String>,
        topics: Vec<String>,
        assignors: Vec<Arc<dyn Assignor>>,
    ) -> Self {
        Self {
            group_id: group_id.into(),
            topics,
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(3),
            max_poll_interval: Duration::from_secs(300),
            instance_id: None,
            assignors,
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            request_slack: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            leader_sync_delay: Duration::ZERO,
            close_timeout: Duration::from_secs(30),
            metadata_max_age: Duration::from_secs(300),
            rack: None,
            seed: 0x5eed,
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
}

/// How a request failed below the protocol (no response to interpret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The connection dropped or could not be made.
    Disconnected,
    /// No response within the request timeout.
    Timeout,
    /// The response could not be decoded, or the version is unusable.
    Protocol(String),
}

/// Why partitions were lost (taken away without a chance to commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostReason {
    /// The broker no longer knows this member id (UNKNOWN_MEMBER_ID).
    UnknownMember,
    /// The generation is no longer valid (ILLEGAL_GENERATION).
    IllegalGeneration,
    /// No successful heartbeat within the session timeout.
    SessionLapsed,
    /// The application did not finish a revocation within the rebalance timeout.
    RevocationTimedOut,
    /// The application did not come back within `max.poll.interval.ms`.
    ProgressTimeout,
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
}

/// What the member tells the application.
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
    /// call [`GroupMember::complete_revocation`] within the rebalance timeout.
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
    },
    /// A commit finished.
    CommitCompleted {
        /// The id [`GroupMember::commit`] returned.
        id: RequestId,
        /// What was committed, or why not.
        result: Result<Vec<CommitOffset>, CommitError>,
    },
    /// The application did not come back within `max.poll.interval.ms`; the member left
    /// the group (dynamic members send LeaveGroup) and rejoins on the next
    /// [`GroupMember::note_progress`].
    ProgressTimeout {
        /// The configured interval.
        max_poll_interval: Duration,
    },
    /// The leader needs partition counts for these topics
    /// ([`GroupMember::set_topic_partitions`]).
    MetadataNeeded {
        /// The topics.
        topics: Vec<String>,
    },
    /// The member left the group and is closed.
    Left,
    /// A fatal error; the member is closed.
    Fatal(GroupError),
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

/// The member's lifecycle state, as reported by [`GroupMember::state`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// What happens once a revocation completes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AfterRevoke {
    /// Eager: everything was revoked; now rejoin.
    Rejoin { reason: String },
    /// Cooperative: hand out `added`, then rejoin for the second round if anything was
    /// revoked.
    Assign {
        added: Vec<TopicPartition>,
        rejoin: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Unjoined {
        join_at: Instant,
        reason: String,
    },
    Joining {
        request: RequestId,
        deadline: Instant,
    },
    /// The leader holds its SyncGroup for `leader_sync_delay` (see [`GroupConfig`]).
    LeaderDelay {
        send_at: Instant,
        request: GroupRequest,
        generation: i32,
        protocol: String,
    },
    Syncing {
        request: RequestId,
        deadline: Instant,
        generation: i32,
        protocol: String,
        leader: bool,
    },
    Stable,
    Revoking {
        generation: i32,
        partitions: Vec<TopicPartition>,
        deadline: Instant,
        then: AfterRevoke,
    },
    Suspended,
    Leaving {
        request: Option<RequestId>,
        deadline: Instant,
    },
    Closed(Option<GroupError>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Coordinator {
    Unknown {
        lookup: Option<(RequestId, Instant)>,
        retry_at: Instant,
    },
    Known(NodeId),
}

/// A live generation: what commits and heartbeats are sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Generation {
    id: i32,
    protocol: String,
    rebalance: RebalanceProtocol,
}

#[derive(Debug, Clone)]
struct Heartbeat {
    /// The generation heartbeats carry: the live one, or while syncing the one the
    /// JoinGroup answer gave.
    generation: i32,
    next_at: Instant,
    in_flight: Option<RequestId>,
    last_ok: Instant,
    /// Heartbeats failed in a row: the retry waits `retry.backoff.ms` doubling to
    /// `retry.backoff.max.ms` (KIP-580), as the Java client's `Heartbeat.failHeartbeat`.
    failures: u32,
}

/// What an in-flight request was sent for, and with which generation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Sent {
    FindCoordinator,
    Join,
    Sync,
    Heartbeat {
        generation: i32,
    },
    Leave,
    Commit {
        generation: i32,
        offsets: Vec<CommitOffset>,
    },
    OffsetFetch {
        partitions: BTreeSet<TopicPartition>,
    },
}

#[derive(Debug, Clone)]
struct PendingFetch {
    generation: i32,
    partitions: BTreeSet<TopicPartition>,
    in_flight: Option<RequestId>,
    retry_at: Instant,
    /// OffsetFetches failed in a row, for the KIP-580 backoff.
    failures: u32,
}

/// How the member reacts to an error code: [`reaction`] for FindCoordinator,
/// JoinGroup, SyncGroup and OffsetFetch, [`heartbeat_reaction`] and
/// [`commit_reaction`] for the other two, each after the Java client's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reaction {
    /// NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE: rediscover, then resend.
    Rediscover,
    /// Transient: try again after backoff.
    Retry,
    /// REBALANCE_IN_PROGRESS: acquiesce and rejoin.
    Rebalance,
    /// UNKNOWN_MEMBER_ID: forget the member id; partitions lost; rejoin.
    ResetMember,
    /// ILLEGAL_GENERATION: forget the generation; partitions lost; rejoin.
    ResetGeneration,
    /// INVALID_REQUEST on SyncGroup (the mock's sync race): rejoin.
    Rejoin,
    /// Anything else non-retriable: fatal and sticky.
    Fatal,
}

/// The error-to-transition table of FindCoordinator, JoinGroup, SyncGroup and
/// OffsetFetch. `docs/rebalance.md` reproduces all three tables.
fn reaction(code: i16) -> Reaction {
    use ResponseError as E;
    match ResponseError::try_from_code(code) {
        None => Reaction::Retry,
        Some(E::NotCoordinator | E::CoordinatorNotAvailable) => Reaction::Rediscover,
        Some(
            E::CoordinatorLoadInProgress
            | E::RequestTimedOut
            | E::NetworkException
            | E::UnstableOffsetCommit,
        ) => Reaction::Retry,
        Some(E::RebalanceInProgress) => Reaction::Rebalance,
        Some(E::UnknownMemberId) => Reaction::ResetMember,
        Some(E::IllegalGeneration) => Reaction::ResetGeneration,
        Some(E::InvalidRequest) => Reaction::Rejoin,
        Some(
            E::FencedInstanceId
            | E::InconsistentGroupProtocol
            | E::InvalidSessionTimeout
            | E::GroupAuthorizationFailed
            | E::TopicAuthorizationFailed
            | E::ClusterAuthorizationFailed
            | E::GroupMaxSizeReached
            | E::InvalidGroupId
            | E::UnsupportedVersion,
        ) => Reaction::Fatal,
        // Anything else: the Java client raises it from poll() and tries again on the
        // next one, the consumer still usable; here the request is retried after the
        // backoff, with a warning naming the code. Only the codes above that say the
        // configuration is wrong close the member.
        Some(_) => Reaction::Retry,
    }
}

/// Whether an answer from the coordinator says it is not (or not yet) the coordinator.
fn refuses_coordination(response: &GroupResponse) -> bool {
    let refused = |code: i16| {
        code == ResponseError::NotCoordinator.code()
            || code == ResponseError::CoordinatorNotAvailable.code()
            || code == ResponseError::CoordinatorLoadInProgress.code()
    };
    match response {
        GroupResponse::FindCoordinator { .. } => false,
        GroupResponse::JoinGroup { error, .. }
        | GroupResponse::SyncGroup { error, .. }
        | GroupResponse::Heartbeat { error, .. }
        | GroupResponse::LeaveGroup { error, .. } => refused(*error),
        GroupResponse::OffsetCommit { partitions } => partitions.iter().any(|(_, e)| refused(*e)),
        GroupResponse::OffsetFetch { error, partitions } => {
            refused(*error) || partitions.iter().any(|(_, _, _, e)| refused(*e))
        }
    }
}

/// Heartbeat's table, after the Java client's `HeartbeatResponseHandler`: anything it
/// does not expect is tried again after the backoff (`Heartbeat.failHeartbeat`), never
/// read as a lost generation or a fatal error. GROUP_AUTHORIZATION_FAILED is fatal here
/// (configuration), where Java's heartbeat thread retries and its next JoinGroup or
/// commit raises it.
fn heartbeat_reaction(code: i16) -> Reaction {
    use ResponseError as E;
    match ResponseError::try_from_code(code) {
        Some(E::NotCoordinator | E::CoordinatorNotAvailable) => Reaction::Rediscover,
        Some(E::RebalanceInProgress) => Reaction::Rebalance,
        Some(E::UnknownMemberId) => Reaction::ResetMember,
        Some(E::IllegalGeneration) => Reaction::ResetGeneration,
        Some(E::FencedInstanceId | E::GroupAuthorizationFailed) => Reaction::Fatal,
        _ => Reaction::Retry,
    }
}

/// What a refused OffsetCommit does: to the member (`None`: nothing, the commit alone
/// fails), and whether the same commit may succeed later ([`CommitError::is_retriable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CommitReaction {
    member: Option<Reaction>,
    retriable: bool,
}

/// OffsetCommit's table, after the Java client's `OffsetCommitResponseHandler`. Codes
/// about what one commit carried (too-large metadata, a topic without rights) and codes
/// it does not expect (GROUP_ID_NOT_FOUND, STALE_MEMBER_EPOCH, ...: Java's "Unexpected
/// error in commit") fail that commit and change nothing else.
fn commit_reaction(code: i16) -> CommitReaction {
    use ResponseError as E;
    let (member, retriable) = match ResponseError::try_from_code(code) {
        // Java marks the coordinator unknown for these three.
        Some(E::NotCoordinator | E::CoordinatorNotAvailable | E::RequestTimedOut) => {
            (Some(Reaction::Rediscover), true)
        }
        Some(E::CoordinatorLoadInProgress | E::UnknownTopicOrPartition) => (None, true),
        // Java raises RebalanceInProgressException (not retriable there); here the same
        // offsets may go again once the member has rejoined and still owns them.
        Some(E::RebalanceInProgress) => (Some(Reaction::Rebalance), true),
        Some(E::UnknownMemberId) => (Some(Reaction::ResetMember), false),
        Some(E::IllegalGeneration) => (Some(Reaction::ResetGeneration), false),
        Some(E::FencedInstanceId | E::GroupAuthorizationFailed) => (Some(Reaction::Fatal), false),
        Some(e) => (None, e.is_retriable()),
        None => (None, false),
    };
    CommitReaction { member, retriable }
}

fn hint(code: i16) -> Option<&'static str> {
    use ResponseError as E;
    match ResponseError::try_from_code(code)? {
        E::FencedInstanceId => Some("another member uses the same group.instance.id"),
        E::InconsistentGroupProtocol => Some(
            "no assignor is shared with the group's other members (check partition.assignment.strategy)",
        ),
        E::InvalidSessionTimeout => {
            Some("session.timeout.ms is outside the broker's group.min/max.session.timeout.ms")
        }
        E::GroupAuthorizationFailed => Some("the principal lacks READ on the group"),
        E::TopicAuthorizationFailed => Some("the principal lacks READ on a topic"),
        E::GroupMaxSizeReached => Some("the group has group.max.size members already"),
        _ => None,
    }
}

/// One member of a consumer group (the classic protocol).
#[derive(Debug)]
pub struct GroupMember {
    config: GroupConfig,
    state: State,
    coordinator: Coordinator,
    member_id: String,
    generation: Option<Generation>,
    heartbeat: Option<Heartbeat>,
    /// What the application holds right now.
    owned: BTreeSet<TopicPartition>,
    /// The last assignment received, kept for sticky assignors' user data.
    last_assignment: Vec<TopicPartition>,
    last_generation: i32,
    /// Partition counts of subscribed topics, for the leader.
    partitions_per_topic: BTreeMap<String, i32>,
    /// Topics other members subscribe to, whose counts a leader also needs.
    other_topics: BTreeSet<String>,
    /// The racks of each partition's replicas, for rack-aware assignment.
    partition_racks: PartitionRacks,
    /// The leader's last cooperative assignment left partitions for a second round.
    held_back: bool,
    /// What the leader assigned with, to notice metadata changes that need a rebalance.
    assigned_with: Option<BTreeMap<String, i32>>,
    /// When the leader next asks for fresh metadata (while `assigned_with` is set).
    metadata_at: Option<Instant>,
    last_progress: Instant,
    fetch: Option<PendingFetch>,
    sent: BTreeMap<RequestId, Sent>,
    /// Bumped each time a coordinator is found; requests to the coordinator record it.
    /// The driver closes the connection to a coordinator given up on, so requests
    /// still on it fail: such a failure says nothing about the coordinator found since.
    coordinator_epoch: u64,
    sent_epoch: BTreeMap<RequestId, u64>,
    next_request: u64,
    failures: u32,
    /// Coordinators given up on (NOT_COORDINATOR and the like) since one last answered
    /// a request without such an error: the pace of rediscovery backs off with it.
    rediscoveries: u32,
    backoff: Backoff,
    /// OffsetCommits go out one at a time, in the order they were made, so a later
    /// commit can never be overtaken (and undone) by an earlier one: the one on the
    /// wire, and the ones waiting for it.
    commit_in_flight: Option<RequestId>,
    commit_queue: VecDeque<(RequestId, GroupRequest)>,
    requests: VecDeque<Outgoing>,
    events: VecDeque<Event>,
}

impl GroupMember {
    /// A member that will look for its coordinator at once.
    pub fn new(config: GroupConfig, now: Instant) -> Self {
        let backoff = Backoff::new(config.retry_backoff, config.retry_backoff_max, config.seed);
        let mut member = Self {
            config,
            state: State::Unjoined {
                join_at: now,
                reason: "first join".into(),
            },
            coordinator: Coordinator::Unknown {
                lookup: None,
                retry_at: now,
            },
            member_id: String::new(),
            generation: None,
            heartbeat: None,
            owned: BTreeSet::new(),
            last_assignment: Vec::new(),
            last_generation: -1,
            partitions_per_topic: BTreeMap::new(),
            other_topics: BTreeSet::new(),
            partition_racks: PartitionRacks::new(),
            held_back: false,
            assigned_with: None,
            metadata_at: None,
            last_progress: now,
            fetch: None,
            sent: BTreeMap::new(),
            coordinator_epoch: 0,
            sent_epoch: BTreeMap::new(),
            next_request: 0,
            failures: 0,
            rediscoveries: 0,
            backoff,
            commit_in_flight: None,
            commit_queue: VecDeque::new(),
            requests: VecDeque::new(),
            events: VecDeque::new(),
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
            State::Syncing { .. } | State::LeaderDelay { .. } => StateKind::Syncing,
            State::Stable => StateKind::Stable,
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

    /// The member id ("" before the broker assigned one).
    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    /// The coordinator, if known.
    pub fn coordinator(&self) -> Option<NodeId> {
        match self.coordinator {
            Coordinator::Known(n) => Some(n),
            Coordinator::Unknown { .. } => None,
        }
    }

    /// The partitions the application owns.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.owned.iter().cloned().collect()
    }

    /// Whether this member is the group's configured static member.
    pub fn is_static(&self) -> bool {
        self.config.instance_id.is_some()
    }

    /// The configuration.
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// The fatal error, if closed by one.
    pub fn error(&self) -> Option<&GroupError> {
        match &self.state {
            State::Closed(e) => e.as_ref(),
            _ => None,
        }
    }

    // ----- outputs -----

    /// The next request to send.
    #[must_use]
    pub fn poll_request(&mut self) -> Option<Outgoing> {
        self.requests.pop_front()
    }

    /// The next event for the application.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`GroupMember::handle_timeout`] must next be called. `None` only when closed
    /// or suspended (then only the application can move the member).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_timer().map(|(_, at)| at)
    }

    /// The earliest armed timer and when it fires.
    pub fn next_timer(&self) -> Option<(Timer, Instant)> {
        let mut timers: Vec<(Timer, Instant)> = Vec::new();
        let in_group = !matches!(
            self.state,
            State::Closed(_) | State::Suspended | State::Leaving { .. }
        );
        match &self.coordinator {
            Coordinator::Unknown {
                lookup: None,
                retry_at,
            } if in_group => timers.push((Timer::Coordinator, *retry_at)),
            Coordinator::Unknown {
                lookup: Some((_, deadline)),
                ..
            } if in_group => timers.push((Timer::Request, *deadline)),
            _ => {}
        }
        match &self.state {
            State::Unjoined { join_at, .. } if self.coordinator().is_some() => {
                timers.push((Timer::Join, *join_at))
            }
            State::Joining { deadline, .. }
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
        if let Some(hb) = &self.heartbeat {
            if hb.in_flight.is_none() && self.coordinator().is_some() {
                timers.push((Timer::Heartbeat, hb.next_at));
            }
            timers.push((Timer::Session, hb.last_ok + self.config.session_timeout));
        }
        if let Some(at) = self.metadata_at
            && in_group
        {
            timers.push((Timer::Metadata, at));
        }
        if in_group {
            timers.push((
                Timer::Progress,
                self.last_progress + self.config.max_poll_interval,
            ));
        }
        // As `advance` decides to send it: in the group, with partitions left to ask for
        // (a revocation may have taken them all while a retry was pending).
        if let Some(f) = &self.fetch {
            if in_group
                && f.in_flight.is_none()
                && !f.partitions.is_empty()
                && self.coordinator().is_some()
            {
                timers.push((Timer::OffsetFetch, f.retry_at));
            }
        }
        timers.into_iter().min_by_key(|(_, at)| *at)
    }

    // ----- inputs -----

    /// The clock moved; fire whatever is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let State::Revoking {
            deadline,
            partitions,
            ..
        } = &self.state
        {
            if now >= *deadline {
                let partitions = partitions.clone();
                warn!(group = %self.config.group_id, "revocation not completed within the rebalance timeout; partitions lost");
                self.lose(partitions, LostReason::RevocationTimedOut);
                self.finish_revocation(now);
            }
        }
        // As the Java client's heartbeat thread: a session with no successful heartbeat
        // makes the member doubt its coordinator, not its membership. It rediscovers
        // the coordinator keeping its member id, generation and partitions, and the
        // session clock starts over (again when the coordinator is found). Only the
        // coordinator can say the member is gone (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION
        // on the next heartbeat); forgetting the id here left a ghost the next join
        // phase waited a whole session for.
        if let Some(hb) = &mut self.heartbeat {
            if now >= hb.last_ok + self.config.session_timeout {
                hb.last_ok = now;
                warn!(group = %self.config.group_id, member = %self.member_id, "no successful heartbeat within the session timeout; rediscovering the coordinator");
                self.mark_coordinator_unknown(now);
            }
        }
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
        if let State::Leaving { deadline, .. } = &self.state {
            if now >= *deadline {
                self.close(None);
            }
        }
        if let Coordinator::Unknown {
            lookup: Some((id, deadline)),
            ..
        } = &self.coordinator
        {
            if now >= *deadline {
                let id = *id;
                self.handle_failure(now, id, Failure::Timeout);
            }
        }
        let in_group = !matches!(
            self.state,
            State::Closed(_) | State::Suspended | State::Leaving { .. }
        );
        if let Some(at) = self.metadata_at
            && in_group
            && now >= at
        {
            self.metadata_at = Some(now + self.config.metadata_max_age);
            let topics: BTreeSet<String> = self
                .config
                .topics
                .iter()
                .chain(self.other_topics.iter())
                .cloned()
                .collect();
            self.events.push_back(Event::MetadataNeeded {
                topics: topics.into_iter().collect(),
            });
        }
        if in_group && now >= self.last_progress + self.config.max_poll_interval {
            self.progress_timeout(now);
        }
        self.advance(now);
    }

    /// A response to request `id` arrived.
    pub fn handle_response(&mut self, now: Instant, id: RequestId, response: GroupResponse) {
        if self.commit_in_flight == Some(id) {
            self.commit_in_flight = None;
        }
        self.sent_epoch.remove(&id);
        let Some(sent) = self.sent.remove(&id) else {
            debug!(group = %self.config.group_id, ?id, "response to an unknown request dropped");
            return;
        };
        if !matches!(response, GroupResponse::FindCoordinator { .. })
            && !refuses_coordination(&response)
        {
            self.rediscoveries = 0;
        }
        match (sent, response) {
            (
                Sent::FindCoordinator,
                GroupResponse::FindCoordinator {
                    error,
                    node_id,
                    host,
                    port,
                },
            ) => self.on_find_coordinator(now, id, error, node_id, host, port),
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
            (
                Sent::OffsetFetch { partitions: asked },
                GroupResponse::OffsetFetch { error, partitions },
            ) => self.on_offset_fetch(now, id, asked, error, partitions),
            (sent, response) => {
                warn!(group = %self.config.group_id, ?sent, ?response, "response of the wrong kind; treated as a failure");
                self.sent.insert(id, sent);
                self.handle_failure(
                    now,
                    id,
                    Failure::Protocol("response of the wrong kind".into()),
                );
                return;
            }
        }
        self.advance(now);
    }

    /// Request `id` failed without a response.
    pub fn handle_failure(&mut self, now: Instant, id: RequestId, failure: Failure) {
        if self.commit_in_flight == Some(id) {
            self.commit_in_flight = None;
        }
        // Sent to the coordinator known now, not to one given up on since.
        let same_coordinator = self
            .sent_epoch
            .remove(&id)
            .is_none_or(|epoch| epoch == self.coordinator_epoch);
        let Some(sent) = self.sent.remove(&id) else {
            return;
        };
        debug!(group = %self.config.group_id, ?id, ?sent, ?failure, "group request failed");
        match sent {
            Sent::FindCoordinator => {
                if let Coordinator::Unknown { lookup, retry_at } = &mut self.coordinator {
                    if lookup.map(|(l, _)| l) == Some(id) {
                        *lookup = None;
                        self.failures += 1;
                        *retry_at = now + self.backoff.delay(self.failures);
                    }
                }
            }
            // Java marks the coordinator unknown on any failed coordinator request: the
            // connection is gone, and the coordinator may have moved with it.
            Sent::Join => {
                if matches!(self.state, State::Joining { request, .. } if request == id) {
                    if same_coordinator {
                        self.mark_coordinator_unknown(now);
                    }
                    self.enter_unjoined(now, true, "JoinGroup failed");
                }
            }
            Sent::Sync => {
                if matches!(&self.state, State::Syncing { request, .. } if *request == id) {
                    if same_coordinator {
                        self.mark_coordinator_unknown(now);
                    }
                    self.enter_unjoined(now, true, "SyncGroup failed");
                }
            }
            Sent::Heartbeat { generation } => {
                let mut current = false;
                if let Some(hb) = &mut self.heartbeat {
                    if hb.in_flight == Some(id) {
                        hb.in_flight = None;
                        hb.failures += 1;
                        hb.next_at = now + self.backoff.delay(hb.failures);
                    }
                    current = hb.generation == generation && same_coordinator;
                }
                if current {
                    self.mark_coordinator_unknown(now);
                }
            }
            Sent::Leave => {
                if matches!(self.state, State::Leaving { request: Some(r), .. } if r == id) {
                    self.close(None);
                }
            }
            Sent::Commit { generation, .. } => {
                self.events.push_back(Event::CommitCompleted {
                    id,
                    result: Err(CommitError::Request(failure)),
                });
                if self.generation() == Some(generation) && same_coordinator {
                    self.mark_coordinator_unknown(now);
                }
            }
            Sent::OffsetFetch { .. } => {
                if let Some(f) = &mut self.fetch {
                    if f.in_flight == Some(id) {
                        f.in_flight = None;
                        f.failures += 1;
                        f.retry_at = now + self.backoff.delay(f.failures);
                        if same_coordinator {
                            self.mark_coordinator_unknown(now);
                        }
                    }
                }
            }
        }
        self.advance(now);
    }

    // ----- application commands -----

    /// The application came back for records: resets the progress guard, and rejoins
    /// after a progress timeout.
    pub fn note_progress(&mut self, now: Instant) {
        self.last_progress = now;
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
        let State::Revoking {
            generation: g,
            partitions,
            ..
        } = &self.state
        else {
            return;
        };
        if *g != generation {
            return;
        }
        for p in partitions.clone() {
            self.owned.remove(&p);
        }
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
        if let State::Closed(e) = &self.state {
            return Err(CommitError::Closed(e.clone().unwrap_or(
                GroupError::Closed {
                    group: self.config.group_id.clone(),
                },
            )));
        }
        let Some(generation) = self.generation.as_ref().map(|g| g.id) else {
            return Err(CommitError::NoGeneration);
        };
        if !matches!(self.state, State::Stable | State::Revoking { .. }) {
            return Err(CommitError::NoGeneration);
        }
        if self.coordinator().is_none() {
            return Err(CommitError::CoordinatorUnknown);
        }
        if let Some(bad) = offsets.iter().find(|o| !self.owned.contains(&o.partition)) {
            return Err(CommitError::NotOwned(bad.partition.clone()));
        }
        let request = GroupRequest::OffsetCommit {
            group: self.config.group_id.clone(),
            generation,
            member_id: self.member_id.clone(),
            instance_id: self.config.instance_id.clone(),
            offsets: offsets.clone(),
        };
        let id = RequestId(self.next_request);
        self.next_request += 1;
        self.sent.insert(
            id,
            Sent::Commit {
                generation,
                offsets,
            },
        );
        self.commit_queue.push_back((id, request));
        self.advance(now);
        Ok(id)
    }

    /// New partition counts for subscribed topics. A leader whose assignment was
    /// computed with other counts asks for a rebalance.
    pub fn set_topic_partitions(&mut self, now: Instant, counts: BTreeMap<String, i32>) {
        for (t, n) in counts {
            if self.config.topics.contains(&t) || self.other_topics.contains(&t) {
                self.partitions_per_topic.insert(t, n);
            }
        }
        if let Some(with) = &self.assigned_with {
            let changed = with
                .iter()
                .any(|(t, n)| self.partitions_per_topic.get(t) != Some(n))
                || self
                    .config
                    .topics
                    .iter()
                    .chain(self.other_topics.iter())
                    .any(|t| self.partitions_per_topic.contains_key(t) && !with.contains_key(t));
            if changed && matches!(self.state, State::Stable) {
                info!(group = %self.config.group_id, "partition counts changed since the leader assigned; rebalancing");
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
        self.partition_racks = racks;
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
        let request = match (self.coordinator(), self.member_id.is_empty(), send) {
            (Some(node), false, true) => Some(self.send(
                Target::Coordinator(node),
                GroupRequest::LeaveGroup {
                    group: self.config.group_id.clone(),
                    member_id: self.member_id.clone(),
                    instance_id: self.config.instance_id.clone(),
                    reason: Some("the consumer is closing".into()),
                },
                Sent::Leave,
            )),
            _ => None,
        };
        self.heartbeat = None;
        self.generation = None;
        self.owned.clear();
        match request {
            Some(r) => {
                self.state = State::Leaving {
                    request: Some(r),
                    deadline: now + self.config.close_timeout,
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
        if let Coordinator::Unknown {
            lookup: None,
            retry_at,
        } = self.coordinator
        {
            if now >= retry_at {
                let id = self.send(
                    Target::AnyBroker,
                    GroupRequest::FindCoordinator {
                        group: self.config.group_id.clone(),
                    },
                    Sent::FindCoordinator,
                );
                let deadline = now + self.config.session_timeout.max(Duration::from_secs(10));
                self.coordinator = Coordinator::Unknown {
                    lookup: Some((id, deadline)),
                    retry_at,
                };
            }
        }
        let Some(node) = self.coordinator() else {
            return;
        };
        if self.commit_in_flight.is_none() {
            if let Some((id, request)) = self.commit_queue.pop_front() {
                self.commit_in_flight = Some(id);
                self.push(Outgoing {
                    id,
                    target: Target::Coordinator(node),
                    request,
                });
            }
        }
        if let State::LeaderDelay { send_at, .. } = &self.state
            && now >= *send_at
            && let State::LeaderDelay {
                request,
                generation,
                protocol,
                ..
            } = std::mem::replace(&mut self.state, State::Stable)
        {
            self.send_sync(now, node, request, generation, protocol, true);
        }
        if let State::Unjoined { join_at, reason } = &self.state {
            if now >= *join_at {
                let reason = reason.clone();
                self.send_join(now, node, reason);
            }
        }
        let heartbeat_due = self
            .heartbeat
            .as_ref()
            .filter(|hb| hb.in_flight.is_none() && now >= hb.next_at)
            .map(|hb| hb.generation);
        if let Some(generation) = heartbeat_due {
            let request = GroupRequest::Heartbeat {
                group: self.config.group_id.clone(),
                generation,
                member_id: self.member_id.clone(),
                instance_id: self.config.instance_id.clone(),
            };
            let id = self.send(
                Target::Coordinator(node),
                request,
                Sent::Heartbeat { generation },
            );
            if let Some(hb) = &mut self.heartbeat {
                hb.in_flight = Some(id);
                hb.next_at = now + self.config.heartbeat_interval;
            }
        }
        // Committed offsets do not depend on the generation, so a fetch outlives a
        // rebalance: partitions granted just before another round still get theirs.
        if let Some(f) = &mut self.fetch {
            let owned = &self.owned;
            f.partitions.retain(|p| owned.contains(p));
        }
        let fetch_due = self.fetch.as_ref().is_some_and(|f| {
            f.in_flight.is_none() && now >= f.retry_at && !f.partitions.is_empty()
        });
        if fetch_due {
            if let Some(f) = &self.fetch {
                let asked = f.partitions.clone();
                let request = GroupRequest::OffsetFetch {
                    group: self.config.group_id.clone(),
                    partitions: asked.iter().cloned().collect(),
                    // As the Java client: a new owner never resumes before a
                    // pending transactional commit of its partitions settles
                    // (dropped below OffsetFetch v7, which lacks the flag).
                    require_stable: true,
                };
                let id = self.send(
                    Target::Coordinator(node),
                    request,
                    Sent::OffsetFetch { partitions: asked },
                );
                if let Some(f) = &mut self.fetch {
                    f.in_flight = Some(id);
                }
            }
        }
    }

    fn send(&mut self, target: Target, request: GroupRequest, sent: Sent) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        self.sent.insert(id, sent);
        self.push(Outgoing {
            id,
            target,
            request,
        });
        id
    }

    /// Queues `out` for the driver; a request to the coordinator records which one.
    fn push(&mut self, out: Outgoing) {
        if matches!(out.target, Target::Coordinator(_)) {
            self.sent_epoch.insert(out.id, self.coordinator_epoch);
        }
        self.requests.push_back(out);
    }

    fn send_join(&mut self, now: Instant, node: NodeId, reason: String) {
        let mut protocols = Vec::new();
        for assignor in &self.config.assignors {
            let owned: Vec<TopicPartition> = self.owned.iter().cloned().collect();
            let subscription = Subscription {
                topics: self.config.topics.clone(),
                user_data: assignor
                    .subscription_user_data(&self.last_assignment, self.last_generation),
                owned_partitions: owned,
                generation_id: self.generation().unwrap_or(self.last_generation),
                rack_id: self.config.rack.clone(),
            };
            match encode_subscription(&subscription, SUBSCRIPTION_VERSION) {
                Ok(bytes) => protocols.push((assignor.name().to_string(), bytes)),
                Err(e) => {
                    warn!(group = %self.config.group_id, assignor = assignor.name(), error = %e, "cannot encode subscription")
                }
            }
        }
        let request = GroupRequest::JoinGroup {
            group: self.config.group_id.clone(),
            member_id: self.member_id.clone(),
            instance_id: self.config.instance_id.clone(),
            session_timeout_ms: millis(self.config.session_timeout),
            rebalance_timeout_ms: millis(self.config.max_poll_interval),
            protocol_type: "consumer".into(),
            protocols,
            reason: Some(reason.clone()),
        };
        debug!(group = %self.config.group_id, member = %self.member_id, %reason, "joining");
        let id = self.send(Target::Coordinator(node), request, Sent::Join);
        self.state = State::Joining {
            request: id,
            deadline: now + self.config.max_poll_interval + self.config.request_slack,
        };
    }

    fn on_find_coordinator(
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

    #[allow(clippy::too_many_arguments)]
    fn on_join(
        &mut self,
        now: Instant,
        id: RequestId,
        error: i16,
        generation: i32,
        protocol_name: Option<String>,
        leader: String,
        member_id: String,
        members: Vec<super::messages::JoinedMember>,
        skip_assignment: bool,
    ) {
        if !matches!(self.state, State::Joining { request, .. } if request == id) {
            return;
        }
        if error == ResponseError::MemberIdRequired.code() {
            // KIP-394: the broker assigned an id; rejoin with it at once.
            self.member_id = member_id;
            return self.enter_unjoined(now, false, "member id assigned (KIP-394)");
        }
        if error != 0 {
            return self.on_rebalance_error(now, "JoinGroup", error);
        }
        self.failures = 0;
        self.member_id = member_id;
        let Some(protocol) = protocol_name else {
            return self.fatal("JoinGroup", ResponseError::InconsistentGroupProtocol.code());
        };
        let is_leader = leader == self.member_id;
        let assignments = if is_leader && !skip_assignment {
            match self.assign(&protocol, &members) {
                Ok(a) => {
                    self.metadata_at = Some(now + self.config.metadata_max_age);
                    a
                }
                Err(e) => {
                    // Through `close`, like every fatal error: a closed member has no
                    // generation, heartbeat or offset fetch left (found by fuzzing: the
                    // offset fetch's timer stayed armed and `generation()` answered).
                    self.lose_all(LostReason::Fatal);
                    self.events.push_back(Event::Fatal(e.clone()));
                    self.close(Some(e));
                    return;
                }
            }
        } else {
            Vec::new()
        };
        let Some(node) = self.coordinator() else {
            return self.enter_unjoined(now, false, "coordinator lost during join");
        };
        // As the Java client (heartbeats from COMPLETING_REBALANCE on): the broker
        // counts the session from the JoinGroup answer, and a coordinator that goes
        // silent now is noticed by the session clock as in a generation.
        self.heartbeat = Some(Heartbeat {
            generation,
            next_at: now + self.config.heartbeat_interval,
            in_flight: None,
            last_ok: now,
            failures: 0,
        });
        let request = GroupRequest::SyncGroup {
            group: self.config.group_id.clone(),
            generation,
            member_id: self.member_id.clone(),
            instance_id: self.config.instance_id.clone(),
            protocol_type: "consumer".into(),
            protocol_name: protocol.clone(),
            assignments,
        };
        if is_leader && !self.config.leader_sync_delay.is_zero() {
            self.state = State::LeaderDelay {
                send_at: now + self.config.leader_sync_delay,
                request,
                generation,
                protocol,
            };
            return;
        }
        self.send_sync(now, node, request, generation, protocol, is_leader);
    }

    fn send_sync(
        &mut self,
        now: Instant,
        node: NodeId,
        request: GroupRequest,
        generation: i32,
        protocol: String,
        leader: bool,
    ) {
        let id = self.send(Target::Coordinator(node), request, Sent::Sync);
        self.state = State::Syncing {
            request: id,
            deadline: now + self.config.request_timeout,
            generation,
            protocol,
            leader,
        };
    }

    fn assign(
        &mut self,
        protocol: &str,
        members: &[super::messages::JoinedMember],
    ) -> Result<Vec<(String, Bytes)>, GroupError> {
        let group = self.config.group_id.clone();
        let Some(assignor) = self
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
            self.events
                .push_back(Event::MetadataNeeded { topics: missing });
        }
        let counts: BTreeMap<String, i32> = self
            .partitions_per_topic
            .iter()
            .filter(|(t, _)| wanted.contains(*t))
            .map(|(t, n)| (t.clone(), *n))
            .collect();
        let result = assignor
            .assign_with_racks(&counts, &self.partition_racks, &subs)
            .map_err(|e| GroupError::Assignment {
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

    fn on_sync(&mut self, now: Instant, id: RequestId, error: i16, assignment: Bytes) {
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
                warn!(group = %self.config.group_id, error = %e, "undecodable assignment; rejoining");
                return self.enter_unjoined(now, true, "undecodable assignment");
            }
        };
        if !leader {
            self.assigned_with = None;
            self.metadata_at = None;
        }
        let rebalance = self
            .config
            .assignors
            .iter()
            .find(|a| a.name() == protocol)
            .map(|a| a.protocol())
            .unwrap_or(RebalanceProtocol::Eager);
        self.generation = Some(Generation {
            id: generation,
            protocol: protocol.clone(),
            rebalance,
        });
        self.last_generation = generation;
        // Heartbeats started with the JoinGroup answer; they go on at their own pace.
        if self.heartbeat.as_ref().map(|hb| hb.generation) != Some(generation) {
            self.heartbeat = Some(Heartbeat {
                generation,
                next_at: now + self.config.heartbeat_interval,
                in_flight: None,
                last_ok: now,
                failures: 0,
            });
        }
        debug!(group = %self.config.group_id, member = %self.member_id, generation, leader, "synced");
        self.events.push_back(Event::Joined {
            generation,
            member_id: self.member_id.clone(),
            leader,
            protocol,
        });
        let Assignment { partitions, .. } = assignment;
        let target: BTreeSet<TopicPartition> = partitions.into_iter().collect();
        self.last_assignment = target.iter().cloned().collect();
        let revoked: Vec<TopicPartition> = self.owned.difference(&target).cloned().collect();
        let added: Vec<TopicPartition> = target.difference(&self.owned).cloned().collect();
        let second_round = leader
            && rebalance == RebalanceProtocol::Cooperative
            && std::mem::take(&mut self.held_back);
        if revoked.is_empty() {
            self.state = State::Stable;
            self.grant(now, generation, added);
            if second_round {
                self.enter_unjoined(now, false, "partitions held back for the second round");
            }
        } else {
            // Cooperative (KIP-429): give back only what moves, then take what is new,
            // then rejoin so the moved partitions reach their new owners.
            self.state = State::Revoking {
                generation,
                partitions: revoked.clone(),
                deadline: now + self.config.max_poll_interval,
                then: AfterRevoke::Assign {
                    added,
                    rejoin: true,
                },
            };
            self.events.push_back(Event::RevokeRequested {
                generation,
                partitions: revoked,
            });
        }
    }

    fn on_heartbeat(&mut self, now: Instant, id: RequestId, generation: i32, error: i16) {
        let syncing = matches!(
            self.state,
            State::Syncing { .. } | State::LeaderDelay { .. }
        );
        let Some(hb) = &mut self.heartbeat else {
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
        if error == 0 || error == ResponseError::RebalanceInProgress.code() {
            hb.last_ok = now;
        }
        if error == 0 {
            hb.failures = 0;
            return;
        }
        match heartbeat_reaction(error) {
            Reaction::Rediscover => self.mark_coordinator_unknown(now),
            Reaction::Retry => {
                hb.failures += 1;
                hb.next_at = now + self.backoff.delay(hb.failures);
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

    fn on_commit(
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
            State::Joining { .. } | State::LeaderDelay { .. } | State::Syncing { .. }
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
        self.events.push_back(Event::CommitCompleted { id, result });
        let Some(code) = first_error else { return };
        if stale {
            return;
        }
        let Some(reaction) = commit_reaction(code).member else {
            return;
        };
        match reaction {
            Reaction::Rediscover => self.mark_coordinator_unknown(now),
            Reaction::Retry | Reaction::Rejoin => {}
            Reaction::Rebalance => {
                if matches!(self.state, State::Stable) {
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

    fn on_offset_fetch(
        &mut self,
        now: Instant,
        id: RequestId,
        asked: BTreeSet<TopicPartition>,
        error: i16,
        partitions: Vec<(TopicPartition, i64, i32, i16)>,
    ) {
        let Some(f) = &mut self.fetch else { return };
        if f.in_flight != Some(id) {
            return;
        }
        f.in_flight = None;
        let code = if error != 0 {
            error
        } else {
            partitions
                .iter()
                .map(|p| p.3)
                .find(|e| *e != 0)
                .unwrap_or(0)
        };
        if code != 0 {
            match reaction(code) {
                Reaction::Fatal => self.fatal("OffsetFetch", code),
                Reaction::Rediscover => {
                    f.retry_at = now;
                    self.mark_coordinator_unknown(now);
                }
                _ => {
                    f.failures += 1;
                    f.retry_at = now + self.backoff.delay(f.failures);
                }
            }
            return;
        }
        f.failures = 0;
        let generation = f.generation;
        // Partitions granted after the request went out stay pending for the next one.
        f.partitions.retain(|p| !asked.contains(p));
        if f.partitions.is_empty() {
            self.fetch = None;
        }
        let offsets: Vec<(TopicPartition, i64, i32)> = partitions
            .into_iter()
            .filter(|p| asked.contains(&p.0) && self.owned.contains(&p.0))
            .map(|(tp, offset, epoch, _)| (tp, offset, epoch))
            .collect();
        self.events.push_back(Event::CommittedOffsets {
            generation,
            offsets,
        });
    }

    /// Errors on JoinGroup and SyncGroup.
    fn on_rebalance_error(&mut self, now: Instant, api: &'static str, error: i16) {
        debug!(group = %self.config.group_id, member = %self.member_id, api, error = %error_name(error), "rebalance request failed");
        match reaction(error) {
            Reaction::Rediscover => {
                self.mark_coordinator_unknown(now);
                self.enter_unjoined(now, false, "coordinator moved during the rebalance");
            }
            Reaction::Retry => {
                if ResponseError::try_from_code(error).is_some_and(|e| !e.is_retriable()) {
                    warn!(group = %self.config.group_id, api, error = %error_name(error), "unexpected error; rejoining after the backoff");
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

    /// A rebalance is needed while in a generation: eager members give everything back
    /// first; cooperative members rejoin keeping their partitions.
    fn rebalance(&mut self, now: Instant, reason: &str) {
        let Some(generation) = self.generation.clone() else {
            return self.enter_unjoined(now, false, reason);
        };
        if !matches!(self.state, State::Stable) {
            return;
        }
        if generation.rebalance == RebalanceProtocol::Eager && !self.owned.is_empty() {
            let partitions = self.assignment();
            // Heartbeats go on while the application gives the partitions back, as in
            // the Java client: until this member sends its JoinGroup, the broker still
            // expects its heartbeats, and removes it after `session_timeout` without
            // them, however long the rebalance timeout is.
            self.state = State::Revoking {
                generation: generation.id,
                partitions: partitions.clone(),
                deadline: now + self.config.max_poll_interval,
                then: AfterRevoke::Rejoin {
                    reason: reason.to_string(),
                },
            };
            self.events.push_back(Event::RevokeRequested {
                generation: generation.id,
                partitions,
            });
        } else {
            self.enter_unjoined(now, false, reason);
        }
    }

    fn finish_revocation(&mut self, now: Instant) {
        let State::Revoking {
            generation, then, ..
        } = std::mem::replace(&mut self.state, State::Stable)
        else {
            return;
        };
        match then {
            AfterRevoke::Rejoin { reason } => {
                self.owned.clear();
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
    fn grant(&mut self, now: Instant, generation: i32, added: Vec<TopicPartition>) {
        if added.is_empty() {
            return;
        }
        self.owned.extend(added.iter().cloned());
        self.events.push_back(Event::Assigned {
            generation,
            added: added.clone(),
            assignment: self.assignment(),
        });
        let mut pending = self.fetch.take().unwrap_or(PendingFetch {
            generation,
            partitions: BTreeSet::new(),
            in_flight: None,
            retry_at: now,
            failures: 0,
        });
        pending.generation = generation;
        pending.partitions.extend(added);
        let owned = &self.owned;
        pending.partitions.retain(|p| owned.contains(p));
        self.fetch = Some(pending);
    }

    /// Leaves the generation: heartbeats stop; the member rejoins after `backoff` (or at
    /// once). Owned partitions stay owned (cooperative), unless the caller lost them.
    fn enter_unjoined(&mut self, now: Instant, with_backoff: bool, reason: &str) {
        if matches!(
            self.state,
            State::Closed(_) | State::Leaving { .. } | State::Suspended
        ) {
            return;
        }
        let join_at = if with_backoff {
            self.failures += 1;
            now + self.backoff.delay(self.failures)
        } else {
            now
        };
        // Heartbeats stop until the next generation forms: from its JoinGroup on, the
        // broker counts a member as alive until the rebalance completes.
        self.heartbeat = None;
        self.state = State::Unjoined {
            join_at,
            reason: reason.to_string(),
        };
    }

    /// The generation is gone: partitions are lost, and the member id too if the
    /// broker no longer knows it.
    fn reset(&mut self, now: Instant, why: LostReason, forget_member: bool, reason: &str) {
        self.lose_all(why);
        self.generation = None;
        self.heartbeat = None;
        self.fetch = None;
        if forget_member {
            self.member_id.clear();
        }
        if let State::Revoking { .. } = self.state {
            self.state = State::Stable;
        }
        self.enter_unjoined(now, false, reason);
    }

    fn progress_timeout(&mut self, now: Instant) {
        warn!(group = %self.config.group_id, interval = ?self.config.max_poll_interval, "the application did not come back within max.poll.interval.ms; leaving the group");
        self.events.push_back(Event::ProgressTimeout {
            max_poll_interval: self.config.max_poll_interval,
        });
        if let (Some(node), false, false) = (
            self.coordinator(),
            self.member_id.is_empty(),
            self.is_static(),
        ) {
            self.send(
                Target::Coordinator(node),
                GroupRequest::LeaveGroup {
                    group: self.config.group_id.clone(),
                    member_id: self.member_id.clone(),
                    instance_id: None,
                    reason: Some("consumer poll timeout has expired".into()),
                },
                Sent::Leave,
            );
            self.member_id.clear();
        }
        self.lose_all(LostReason::ProgressTimeout);
        self.generation = None;
        self.heartbeat = None;
        self.fetch = None;
        self.state = State::Suspended;
        let _ = now;
    }

    fn mark_coordinator_unknown(&mut self, now: Instant) {
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

    fn lose(&mut self, partitions: Vec<TopicPartition>, reason: LostReason) {
        for p in &partitions {
            self.owned.remove(p);
        }
        if !partitions.is_empty() {
            self.events.push_back(Event::Lost { partitions, reason });
        }
    }

    fn lose_all(&mut self, reason: LostReason) {
        let all = self.assignment();
        self.lose(all, reason);
    }

    fn fatal(&mut self, api: &'static str, code: i16) {
        // Closed is sticky: a late answer (a FindCoordinator still in flight when the
        // application left) must not turn a clean close into an error. Found by fuzzing.
        if matches!(self.state, State::Closed(_)) {
            return;
        }
        let error = GroupError::Broker {
            group: self.config.group_id.clone(),
            api,
            code,
            name: error_name(code),
            hint: hint(code),
        };
        warn!(group = %self.config.group_id, %error, "fatal group error");
        self.lose_all(LostReason::Fatal);
        self.events.push_back(Event::Fatal(error.clone()));
        self.close(Some(error));
    }

    fn close(&mut self, error: Option<GroupError>) {
        let clean = error.is_none();
        let closed = error.clone().unwrap_or(GroupError::Closed {
            group: self.config.group_id.clone(),
        });
        for (id, _) in std::mem::take(&mut self.commit_queue) {
            self.sent.remove(&id);
            self.events.push_back(Event::CommitCompleted {
                id,
                result: Err(CommitError::Closed(closed.clone())),
            });
        }
        self.generation = None;
        self.heartbeat = None;
        self.fetch = None;
        self.state = State::Closed(error);
        if clean {
            self.events.push_back(Event::Left);
        }
    }
}

/// KIP-429's rule for a cooperative assignment: a partition that one member owned and
/// another is now given must first be revoked, in a round of its own, so no partition
/// may be added to one member in the same round it is taken from another. The Java
/// client's leader checks this for assignors other than its own cooperative-sticky
/// (`ConsumerCoordinator.validateCooperativeAssignment`), and so does ottla's. The
/// error names the partitions and their owners.
fn validate_cooperative(
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

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    //! Scenario tests, one per transition of the error table, named
    //! `<state>_<input>_<outcome>`. Each asserts the exact requests and events.

    use super::super::assignor::builtin;
    use super::super::messages::JoinedMember;
    use super::*;

    const GROUP: &str = "g";
    const TOPIC: &str = "t";

    fn tp(p: i32) -> TopicPartition {
        TopicPartition {
            topic: TOPIC.into(),
            partition: p,
        }
    }

    fn config(assignor: &str) -> GroupConfig {
        let a: Arc<dyn Assignor> = Arc::from(builtin(assignor).expect("builtin assignor"));
        let mut c = GroupConfig::new(GROUP, vec![TOPIC.into()], vec![a]);
        c.session_timeout = Duration::from_secs(10);
        c.heartbeat_interval = Duration::from_secs(1);
        c.max_poll_interval = Duration::from_secs(30);
        c
    }

    struct H {
        m: GroupMember,
        now: Instant,
    }

    impl H {
        fn new(c: GroupConfig) -> Self {
            let now = Instant::now();
            let mut m = GroupMember::new(c, now);
            m.set_topic_partitions(now, BTreeMap::from([(TOPIC.to_string(), 4)]));
            H { m, now }
        }
        fn request(&mut self) -> Outgoing {
            self.m.poll_request().expect("a request")
        }
        fn no_request(&mut self) {
            assert_eq!(self.m.poll_request(), None);
        }
        fn events(&mut self) -> Vec<Event> {
            std::iter::from_fn(|| self.m.poll_event()).collect()
        }
        fn advance(&mut self, d: Duration) {
            self.now += d;
            self.m.handle_timeout(self.now);
        }
        fn respond(&mut self, id: RequestId, r: GroupResponse) {
            self.m.handle_response(self.now, id, r);
        }
        fn find_coordinator(&mut self) {
            let out = self.request();
            assert!(
                matches!(out.request, GroupRequest::FindCoordinator { .. }),
                "{out:?}"
            );
            assert_eq!(out.target, Target::AnyBroker);
            self.respond(
                out.id,
                GroupResponse::FindCoordinator {
                    error: 0,
                    node_id: 2,
                    host: "h".into(),
                    port: 1,
                },
            );
        }
        /// Joins as the only member (the leader) with `assignment` being whatever the
        /// assignor gives a single member: all 4 partitions.
        fn join_alone(&mut self) -> i32 {
            self.join_alone_p("range")
        }
        /// [`H::join_alone`] with the group choosing `protocol`.
        fn join_alone_p(&mut self, protocol: &str) -> i32 {
            self.find_coordinator();
            let join = self.request();
            let GroupRequest::JoinGroup {
                protocols,
                member_id,
                ..
            } = &join.request
            else {
                panic!("{join:?}")
            };
            assert_eq!(member_id, "");
            let metadata = protocols[0].1.clone();
            self.respond(
                join.id,
                join_response(ResponseError::MemberIdRequired.code(), 0, "m1", "", vec![]),
            );
            let join = self.request();
            let GroupRequest::JoinGroup { member_id, .. } = &join.request else {
                panic!()
            };
            assert_eq!(
                member_id, "m1",
                "rejoins at once with the id the broker gave"
            );
            let members = vec![JoinedMember {
                member_id: "m1".into(),
                instance_id: None,
                metadata,
            }];
            self.respond(
                join.id,
                join_response_p(protocol, 0, 7, "m1", "m1", members),
            );
            let sync = self.request();
            let GroupRequest::SyncGroup {
                assignments,
                generation,
                ..
            } = &sync.request
            else {
                panic!("{sync:?}")
            };
            assert_eq!(*generation, 7);
            let mine = assignments
                .iter()
                .find(|(m, _)| m == "m1")
                .expect("leader assigns itself")
                .1
                .clone();
            self.respond(
                sync.id,
                GroupResponse::SyncGroup {
                    error: 0,
                    protocol_name: None,
                    assignment: mine,
                },
            );
            7
        }
        /// A rebalance announced by a heartbeat, the member's JoinGroup answered with
        /// itself alone as leader of `generation` (with `protocol`): its SyncGroup.
        fn rejoin_alone(&mut self, protocol: &str, generation: i32) -> Outgoing {
            let hb = self.heartbeat();
            self.respond(
                hb.id,
                GroupResponse::Heartbeat {
                    error: ResponseError::RebalanceInProgress.code(),
                },
            );
            let join = self.request();
            let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
                panic!("{join:?}")
            };
            let members = vec![JoinedMember {
                member_id: "m1".into(),
                instance_id: None,
                metadata: protocols[0].1.clone(),
            }];
            self.respond(
                join.id,
                join_response_p(protocol, 0, generation, "m1", "m1", members),
            );
            self.request()
        }
        /// Answers the leader's own SyncGroup with what it assigned itself.
        fn answer_own_sync(&mut self, sync: &Outgoing) {
            let GroupRequest::SyncGroup { assignments, .. } = &sync.request else {
                panic!("{sync:?}")
            };
            let mine = assignments[0].1.clone();
            self.respond(
                sync.id,
                GroupResponse::SyncGroup {
                    error: 0,
                    protocol_name: None,
                    assignment: mine,
                },
            );
        }
        /// Commits `offset` of partition `p` of the test topic, without metadata.
        fn commit_one(&mut self, p: i32, offset: i64) -> Result<RequestId, CommitError> {
            self.m.commit(
                self.now,
                vec![CommitOffset {
                    partition: tp(p),
                    offset,
                    leader_epoch: -1,
                    metadata: None,
                }],
            )
        }
        fn heartbeat(&mut self) -> Outgoing {
            self.advance(Duration::from_secs(1));
            let hb = self.request();
            assert!(
                matches!(hb.request, GroupRequest::Heartbeat { .. }),
                "{hb:?}"
            );
            hb
        }
    }

    fn join_response(
        error: i16,
        generation: i32,
        member: &str,
        leader: &str,
        members: Vec<JoinedMember>,
    ) -> GroupResponse {
        join_response_p("range", error, generation, member, leader, members)
    }

    fn join_response_p(
        protocol: &str,
        error: i16,
        generation: i32,
        member: &str,
        leader: &str,
        members: Vec<JoinedMember>,
    ) -> GroupResponse {
        GroupResponse::JoinGroup {
            error,
            generation,
            protocol_name: Some(protocol.into()),
            leader: leader.into(),
            member_id: member.into(),
            members,
            skip_assignment: false,
        }
    }

    fn stable(assignor: &str) -> H {
        let mut h = H::new(config(assignor));
        h.join_alone();
        let ev = h.events();
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::Assigned { added, .. } if added.len() == 4)),
            "{ev:?}"
        );
        assert_eq!(h.m.state(), StateKind::Stable);
        // The OffsetFetch for the new partitions.
        let fetch = h.request();
        assert!(
            matches!(fetch.request, GroupRequest::OffsetFetch { ref partitions, .. } if partitions.len() == 4)
        );
        h
    }

    #[test]
    fn stable_offset_fetch_answered_after_a_new_generation_still_gives_offsets() {
        // A cooperative member granted partitions at generation 7 rejoins before its
        // OffsetFetch is answered. The answer still counts: the committed offsets do
        // not depend on the generation, and without them the fetcher never starts.
        let mut h = H::new(config("cooperative-sticky"));
        h.join_alone_p("cooperative-sticky");
        h.events();
        let fetch = h.request();
        assert!(matches!(fetch.request, GroupRequest::OffsetFetch { .. }));
        let fetch_id = fetch.id;
        let sync = h.rejoin_alone("cooperative-sticky", 8);
        h.answer_own_sync(&sync);
        assert_eq!(h.m.generation(), Some(8));
        h.events();
        h.respond(
            fetch_id,
            GroupResponse::OffsetFetch {
                error: 0,
                partitions: (0..4).map(|p| (tp(p), 10 + i64::from(p), -1, 0)).collect(),
            },
        );
        let ev = h.events();
        assert!(
            ev.iter().any(
                |e| matches!(e, Event::CommittedOffsets { offsets, .. } if offsets.len() == 4)
            ),
            "{ev:?}"
        );
    }

    #[test]
    fn joining_assignment_error_closes_like_every_fatal_error() {
        // Found by the group_ops fuzz target: a leader that could not assign closed by
        // setting the state alone, so the closed member still reported its generation
        // and kept the offset fetch's timer armed.
        let mut h = H::new(config("cooperative-sticky"));
        h.join_alone_p("cooperative-sticky");
        h.events();
        let _fetch = h.request();
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        let join = h.request();
        assert_eq!(
            h.m.generation(),
            Some(7),
            "cooperative: kept while rejoining"
        );
        h.respond(
            join.id,
            join_response_p("no-such-assignor", 0, 8, "m1", "m1", vec![]),
        );
        let ev = h.events();
        assert!(
            matches!(ev[..], [.., Event::Fatal(GroupError::Assignment { .. })]),
            "{ev:?}"
        );
        assert_eq!(h.m.state(), StateKind::Closed);
        assert_eq!(h.m.generation(), None);
        assert_eq!(h.m.poll_timeout(), None);
        assert!(h.m.assignment().is_empty());
        h.no_request();
    }

    /// A cooperative assignor that breaks KIP-429: it gives everything to the last member,
    /// whoever owns it now.
    #[derive(Debug)]
    struct Mover;

    impl Assignor for Mover {
        fn name(&self) -> &'static str {
            "mover"
        }
        fn protocol(&self) -> RebalanceProtocol {
            RebalanceProtocol::Cooperative
        }
        fn assign(
            &self,
            partitions_per_topic: &BTreeMap<String, i32>,
            members: &[super::super::assignor::MemberSubscription],
        ) -> Result<BTreeMap<String, Assignment>, super::super::assignor::AssignError> {
            let all: Vec<TopicPartition> = partitions_per_topic
                .iter()
                .flat_map(|(t, n)| (0..*n).map(move |p| TopicPartition::new(t.clone(), p)))
                .collect();
            let last = members.len().saturating_sub(1);
            Ok(members
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let partitions = if i == last { all.clone() } else { Vec::new() };
                    (
                        m.member_id.clone(),
                        Assignment {
                            partitions,
                            user_data: None,
                        },
                    )
                })
                .collect())
        }
    }

    #[test]
    fn joining_a_cooperative_assignment_that_moves_an_owned_partition_directly_is_refused() {
        // KIP-429: a partition changes owner in two rounds, revoked by the old owner
        // first. Nothing checked a custom assignor, so one that moved an owned partition
        // directly gave it two owners. The Java client's leader refuses such an
        // assignment (`validateCooperativeAssignment`, an IllegalStateException out of
        // poll); here it is a fatal `GroupError::Assignment` naming the partition.
        let mut c = config("range");
        c.assignors = vec![Arc::new(Mover)];
        let mut h = H::new(c);
        h.find_coordinator();
        let join = h.request();
        let subscription = |owned: Vec<TopicPartition>| {
            encode_subscription(
                &Subscription {
                    topics: vec![TOPIC.into()],
                    user_data: None,
                    owned_partitions: owned,
                    generation_id: 7,
                    rack_id: None,
                },
                SUBSCRIPTION_VERSION,
            )
            .expect("subscription")
        };
        let members = vec![
            JoinedMember {
                member_id: "m1".into(),
                instance_id: None,
                metadata: subscription((0..4).map(tp).collect()),
            },
            JoinedMember {
                member_id: "m2".into(),
                instance_id: None,
                metadata: subscription(Vec::new()),
            },
        ];
        h.respond(join.id, join_response_p("mover", 0, 8, "m1", "m1", members));
        let ev = h.events();
        let Some(Event::Fatal(GroupError::Assignment { message, .. })) = ev.last() else {
            panic!("{ev:?}");
        };
        assert!(
            message.contains("t-0") && message.contains("m2"),
            "{message}"
        );
        assert_eq!(h.m.state(), StateKind::Closed);
    }

    #[test]
    fn syncing_an_illegal_generation_answer_to_the_last_generations_commit_changes_nothing() {
        // A cooperative member commits in generation 7, then rejoins keeping its
        // partitions; the commit reaches the coordinator after the JoinGroup, which
        // already moved the group to generation 8, and is refused ILLEGAL_GENERATION
        // while the member syncs. The member reset and lost every partition, though
        // its own generation was fine: the answer is about an older one.
        let mut h = H::new(config("cooperative-sticky"));
        h.join_alone_p("cooperative-sticky");
        h.events();
        let _fetch = h.request();
        let commit = h.commit_one(0, 5).expect("commit");
        let _sent = h.request();
        let sync = h.rejoin_alone("cooperative-sticky", 8);
        assert_eq!(h.m.state(), StateKind::Syncing);
        h.events();
        h.respond(
            commit,
            GroupResponse::OffsetCommit {
                partitions: vec![(tp(0), ResponseError::IllegalGeneration.code())],
            },
        );
        let ev = h.events();
        assert!(
            matches!(&ev[..], [Event::CommitCompleted { result: Err(e), .. }] if e.is_retriable()),
            "{ev:?}"
        );
        assert_eq!(h.m.state(), StateKind::Syncing);
        assert_eq!(h.m.assignment().len(), 4);
        h.answer_own_sync(&sync);
        assert_eq!(h.m.generation(), Some(8));
        assert_eq!(h.m.assignment().len(), 4);
        assert!(
            !h.events().iter().any(|e| matches!(e, Event::Lost { .. })),
            "nothing lost"
        );
    }

    #[test]
    fn stable_commits_go_out_one_at_a_time_and_a_queued_one_may_follow_the_join() {
        // The one-commit-in-flight queue lived in the driver, where neither the
        // simulation nor the fuzzer saw it. A commit queued behind another reaches the
        // coordinator after the member's next JoinGroup, and its ILLEGAL_GENERATION
        // answer while syncing speaks of the older generation: the member keeps its
        // partitions.
        let mut h = H::new(config("cooperative-sticky"));
        h.join_alone_p("cooperative-sticky");
        h.events();
        let _fetch = h.request();
        let a = h.commit_one(0, 5).expect("a");
        let b = h.commit_one(0, 6).expect("b");
        assert_eq!(h.request().id, a);
        h.no_request();
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        let join = h.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!("{join:?}")
        };
        let metadata = protocols[0].1.clone();
        h.no_request();
        h.respond(
            a,
            GroupResponse::OffsetCommit {
                partitions: vec![(tp(0), 0)],
            },
        );
        let sent_b = h.request();
        assert_eq!(sent_b.id, b, "b goes out once a is answered");
        assert!(
            matches!(&sent_b.request, GroupRequest::OffsetCommit { generation: 7, offsets, .. } if offsets[0].offset == 6),
            "{sent_b:?}"
        );
        let members = vec![JoinedMember {
            member_id: "m1".into(),
            instance_id: None,
            metadata,
        }];
        h.respond(
            join.id,
            join_response_p("cooperative-sticky", 0, 8, "m1", "m1", members),
        );
        let sync = h.request();
        h.events();
        h.respond(
            b,
            GroupResponse::OffsetCommit {
                partitions: vec![(tp(0), ResponseError::IllegalGeneration.code())],
            },
        );
        let ev = h.events();
        assert!(
            matches!(&ev[..], [Event::CommitCompleted { id, result: Err(CommitError::Stale { generation: 7 }) }] if *id == b),
            "{ev:?}"
        );
        h.answer_own_sync(&sync);
        assert_eq!(h.m.generation(), Some(8));
        assert_eq!(h.m.assignment().len(), 4);
    }

    #[test]
    fn closing_fails_the_queued_commits() {
        let mut h = stable("range");
        let a = h.commit_one(0, 5).expect("a");
        let b = h.commit_one(1, 5).expect("b");
        assert_eq!(h.request().id, a);
        h.m.leave(h.now);
        let leave = h.request();
        assert!(matches!(leave.request, GroupRequest::LeaveGroup { .. }));
        h.respond(leave.id, GroupResponse::LeaveGroup { error: 0 });
        assert_eq!(h.m.state(), StateKind::Closed);
        let ev = h.events();
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::CommitCompleted { id, result: Err(_) } if *id == b)),
            "the queued commit is answered: {ev:?}"
        );
        h.no_request();
    }

    #[test]
    fn stable_leader_asks_for_metadata_every_max_age_and_rebalances_when_a_topic_grows() {
        // Partition counts reached the member once, at startup: a leader never learnt
        // that a subscribed topic gained partitions, and the new ones were never
        // assigned. Java's leader checks its assignment snapshot against metadata
        // refreshed at least every metadata.max.age.ms.
        let mut c = config("range");
        c.metadata_max_age = Duration::from_secs(20);
        c.session_timeout = Duration::from_secs(60);
        c.max_poll_interval = Duration::from_secs(600);
        let mut h = H::new(c);
        h.join_alone();
        h.events();
        let _fetch = h.request();
        let start = h.now;
        let mut asked = None;
        for _ in 0..20 {
            let hb = h.heartbeat();
            h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
            h.m.note_progress(h.now);
            if let Some(Event::MetadataNeeded { topics }) = h
                .events()
                .into_iter()
                .find(|e| matches!(e, Event::MetadataNeeded { .. }))
            {
                asked = Some((h.now, topics));
                break;
            }
        }
        let (at, topics) = asked.expect("the leader asks for metadata within max age");
        assert_eq!(topics, vec![TOPIC.to_string()]);
        assert!(at - start >= Duration::from_secs(20), "not before max age");
        // The topic grew from 4 to 6 partitions: rebalance, and the new ones are assigned.
        h.m.set_topic_partitions(h.now, BTreeMap::from([(TOPIC.to_string(), 6)]));
        let ev = h.events();
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::RevokeRequested { .. })),
            "an eager leader gives back and rejoins: {ev:?}"
        );
    }

    #[test]
    fn stable_leader_rebalances_when_a_subscribed_topic_is_deleted() {
        // The driver reports a topic the broker no longer knows with 0 partitions.
        let mut h = stable("range");
        h.m.set_topic_partitions(h.now, BTreeMap::from([(TOPIC.to_string(), 0)]));
        let ev = h.events();
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::RevokeRequested { .. })),
            "{ev:?}"
        );
    }

    #[test]
    fn syncing_unanswered_times_out_after_the_request_timeout() {
        // A follower's SyncGroup waited max.poll.interval.ms + 5 s (305 s by default) for
        // a coordinator that had gone silent. The Java client sends SyncGroup with
        // request.timeout.ms.
        let mut c = config("range");
        c.request_timeout = Duration::from_secs(10);
        let mut h = H::new(c);
        h.find_coordinator();
        let join = h.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!("{join:?}")
        };
        let metadata = protocols[0].1.clone();
        let members = vec![JoinedMember {
            member_id: "m0".into(),
            instance_id: None,
            metadata,
        }];
        // A follower: m0 leads.
        h.respond(join.id, join_response_p("range", 0, 3, "m1", "m0", members));
        let sync = h.request();
        assert!(matches!(sync.request, GroupRequest::SyncGroup { .. }));
        h.advance(Duration::from_secs(10) - Duration::from_millis(1));
        assert_eq!(h.m.state(), StateKind::Syncing);
        h.advance(Duration::from_millis(1));
        assert_eq!(h.m.state(), StateKind::Unjoined);
        assert_eq!(
            h.m.coordinator(),
            None,
            "the silent coordinator is looked up again"
        );
    }

    /// A follower's JoinGroup answered: its SyncGroup, in flight.
    fn syncing_follower(h: &mut H, generation: i32) -> Outgoing {
        h.find_coordinator();
        let join = h.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!("{join:?}")
        };
        let members = vec![JoinedMember {
            member_id: "m0".into(),
            instance_id: None,
            metadata: protocols[0].1.clone(),
        }];
        h.respond(
            join.id,
            join_response_p("range", 0, generation, "m1", "m0", members),
        );
        let sync = h.request();
        assert!(matches!(sync.request, GroupRequest::SyncGroup { .. }));
        sync
    }

    #[test]
    fn syncing_heartbeats_with_the_new_generation_and_ignores_a_rebalance_answer() {
        // The Java client heartbeats from the JoinGroup response on (COMPLETING_REBALANCE):
        // a follower whose leader is slow to assign stays alive at the broker, and a
        // coordinator gone silent is noticed by the session clock too. ottla sent none
        // until the SyncGroup was answered.
        let mut h = H::new(config("range"));
        let sync = syncing_follower(&mut h, 3);
        h.advance(Duration::from_secs(1));
        let hb = h.request();
        assert!(
            matches!(hb.request, GroupRequest::Heartbeat { generation: 3, ref member_id, .. } if member_id == "m1"),
            "a heartbeat of the new generation while syncing: {hb:?}"
        );
        // REBALANCE_IN_PROGRESS while syncing is what a broker may say before it has
        // the leader's assignment; Java ignores it outside STABLE.
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        h.no_request();
        assert_eq!(h.m.state(), StateKind::Syncing);
        let hb = h.heartbeat();
        h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
        // The assignment comes; heartbeats go on at their own pace, same generation.
        let assignment = encode_assignment(
            &Assignment {
                partitions: vec![tp(0)],
                user_data: None,
            },
            0,
        )
        .expect("assignment");
        h.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment,
            },
        );
        assert_eq!(h.m.state(), StateKind::Stable);
        let _fetch = h.request();
        let hb = h.heartbeat();
        assert!(matches!(
            hb.request,
            GroupRequest::Heartbeat { generation: 3, .. }
        ));
    }

    #[test]
    fn syncing_heartbeat_illegal_generation_rejoins_and_drops_the_sync_answer() {
        let mut h = H::new(config("range"));
        let sync = syncing_follower(&mut h, 3);
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::IllegalGeneration.code(),
            },
        );
        let join = h.request();
        assert!(
            matches!(join.request, GroupRequest::JoinGroup { ref member_id, .. } if member_id == "m1"),
            "rejoins keeping the id: {join:?}"
        );
        assert_eq!(h.m.state(), StateKind::Joining);
        h.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment: Bytes::new(),
            },
        );
        assert_eq!(h.m.state(), StateKind::Joining, "the stale sync is dropped");
    }
    #[test]
    fn closed_late_fatal_find_coordinator_answer_keeps_the_clean_close() {
        // Found by the group_ops fuzz target: a member that left while its
        // FindCoordinator was in flight turned its clean close into a fatal error (and
        // emitted Fatal after Left) when that lookup was answered with a fatal code.
        let mut h = H::new(config("range"));
        let lookup = h.request();
        assert!(matches!(
            lookup.request,
            GroupRequest::FindCoordinator { .. }
        ));
        h.m.leave(h.now);
        assert_eq!(h.events(), vec![Event::Left]);
        h.respond(
            lookup.id,
            GroupResponse::FindCoordinator {
                error: ResponseError::GroupAuthorizationFailed.code(),
                node_id: -1,
                host: String::new(),
                port: -1,
            },
        );
        assert_eq!(h.events(), vec![]);
        assert_eq!(h.m.state(), StateKind::Closed);
        assert_eq!(h.m.error(), None);
        assert_eq!(
            h.m.commit(h.now, vec![]),
            Err(CommitError::Closed(GroupError::Closed {
                group: GROUP.into()
            }))
        );
    }

    #[test]
    fn joining_offset_fetch_retry_for_revoked_partitions_leaves_no_timer_due() {
        // Found by the group_ops fuzz target: the partitions of a pending OffsetFetch
        // were revoked, then the fetch failed. Its retry timer stayed armed with nothing
        // left to ask for, so `poll_timeout` stayed in the past and the driver's loop
        // spun for as long as the JoinGroup was held.
        let mut h = H::new(config("range"));
        h.join_alone();
        h.events();
        let fetch = h.request();
        assert!(matches!(fetch.request, GroupRequest::OffsetFetch { .. }));
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        h.events();
        h.m.complete_revocation(h.now, 7);
        let join = h.request();
        assert!(matches!(join.request, GroupRequest::JoinGroup { .. }));
        h.respond(
            fetch.id,
            GroupResponse::OffsetFetch {
                error: ResponseError::CoordinatorLoadInProgress.code(),
                partitions: vec![],
            },
        );
        h.advance(Duration::from_secs(1));
        h.no_request();
        assert_eq!(h.m.state(), StateKind::Joining);
        let next = h.m.poll_timeout().expect("the JoinGroup's timer");
        assert!(next > h.now, "{:?} is due and stays due", h.m.next_timer());
    }

    #[test]
    fn leader_delay_with_the_coordinator_unknown_leaves_no_timer_due() {
        // Found by the group_ops fuzz target: a leader holding its SyncGroup lost its
        // coordinator (a commit of the generation it is leaving failed); the held
        // SyncGroup's timer stayed armed though it cannot be sent until the coordinator
        // is found again, and the driver's loop spun.
        let mut c = config("cooperative-sticky");
        c.leader_sync_delay = Duration::from_millis(50);
        let mut h = H::new(c);
        h.find_coordinator();
        let join = h.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!("{join:?}")
        };
        let members = vec![JoinedMember {
            member_id: "m1".into(),
            instance_id: None,
            metadata: protocols[0].1.clone(),
        }];
        h.respond(
            join.id,
            join_response_p("cooperative-sticky", 0, 7, "m1", "m1", members.clone()),
        );
        h.no_request();
        h.advance(Duration::from_millis(50));
        let sync = h.request();
        let GroupRequest::SyncGroup { assignments, .. } = &sync.request else {
            panic!("{sync:?}")
        };
        let mine = assignments[0].1.clone();
        h.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment: mine,
            },
        );
        let _fetch = h.request();
        h.events();
        let commit = h.commit_one(0, 1).expect("stable");
        let _ = h.request();
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        let join = h.request();
        h.respond(
            join.id,
            join_response_p("cooperative-sticky", 0, 8, "m1", "m1", members),
        );
        assert_eq!(h.m.state(), StateKind::Syncing, "holding the SyncGroup");
        h.m.handle_failure(h.now, commit, Failure::Disconnected);
        assert_eq!(h.m.coordinator(), None);
        h.events();
        h.advance(Duration::from_millis(60));
        h.no_request();
        let next = h.m.poll_timeout().expect("the coordinator lookup's timer");
        assert!(next > h.now, "{:?} is due and stays due", h.m.next_timer());
    }

    #[test]
    fn unjoined_member_id_required_rejoins_at_once_with_the_given_id() {
        // Asserted inside join_alone.
        stable("range");
    }

    #[test]
    fn stable_heartbeat_rebalance_in_progress_eager_revokes_everything_then_rejoins() {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        let ev = h.events();
        assert_eq!(
            ev,
            vec![Event::RevokeRequested {
                generation: 7,
                partitions: (0..4).map(tp).collect()
            }]
        );
        assert_eq!(h.m.state(), StateKind::Revoking);
        h.no_request();
        // Commits are still possible with the old generation while revoking.
        let commit = h.commit_one(0, 5);
        assert!(commit.is_ok());
        let _ = h.request();
        h.m.complete_revocation(h.now, 7);
        let join = h.request();
        let GroupRequest::JoinGroup {
            member_id,
            protocols,
            ..
        } = &join.request
        else {
            panic!("{join:?}")
        };
        assert_eq!(member_id, "m1");
        let sub = decode_subscription(protocols[0].1.clone()).unwrap();
        assert!(
            sub.owned_partitions.is_empty(),
            "eager members own nothing when they rejoin"
        );
        assert!(h.m.assignment().is_empty());
    }

    #[test]
    fn stable_heartbeat_not_coordinator_rediscovers_and_resumes_heartbeats_without_rejoining() {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::NotCoordinator.code(),
            },
        );
        assert!(h.events().is_empty());
        assert_eq!(h.m.coordinator(), None);
        h.advance(Duration::from_millis(200));
        h.find_coordinator();
        assert!(matches!(h.events()[..], [Event::CoordinatorFound { .. }]));
        let hb = h.request();
        assert!(
            matches!(hb.request, GroupRequest::Heartbeat { generation: 7, .. }),
            "heartbeat at once on the new coordinator: {hb:?}"
        );
        assert_eq!(h.m.state(), StateKind::Stable);
        assert_eq!(h.m.assignment().len(), 4);
    }

    #[test]
    fn stable_heartbeat_unknown_member_id_loses_partitions_and_rejoins_without_an_id() {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::UnknownMemberId.code(),
            },
        );
        assert_eq!(
            h.events(),
            vec![Event::Lost {
                partitions: (0..4).map(tp).collect(),
                reason: LostReason::UnknownMember
            }]
        );
        let join = h.request();
        assert!(
            matches!(&join.request, GroupRequest::JoinGroup { member_id, .. } if member_id.is_empty())
        );
        assert_eq!(h.m.generation(), None);
    }

    #[test]
    fn stable_heartbeat_illegal_generation_loses_partitions_and_rejoins_keeping_the_id() {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::IllegalGeneration.code(),
            },
        );
        assert_eq!(
            h.events(),
            vec![Event::Lost {
                partitions: (0..4).map(tp).collect(),
                reason: LostReason::IllegalGeneration
            }]
        );
        let join = h.request();
        assert!(
            matches!(&join.request, GroupRequest::JoinGroup { member_id, .. } if member_id == "m1")
        );
    }

    #[test]
    fn stable_heartbeat_fenced_instance_id_is_fatal_and_sticky() {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::FencedInstanceId.code(),
            },
        );
        let ev = h.events();
        assert!(matches!(
            &ev[0],
            Event::Lost {
                reason: LostReason::Fatal,
                ..
            }
        ));
        assert!(matches!(
            &ev[1],
            Event::Fatal(GroupError::Broker { code: 82, .. })
        ));
        assert_eq!(h.m.state(), StateKind::Closed);
        let err = h.m.commit(h.now, vec![]).unwrap_err();
        assert!(
            matches!(
                err,
                CommitError::Closed(GroupError::Broker { code: 82, .. })
            ),
            "{err:?}"
        );
        h.advance(Duration::from_secs(60));
        h.no_request();
        assert_eq!(h.m.poll_timeout(), None);
    }

    #[test]
    fn joining_coordinator_load_in_progress_retries_after_backoff() {
        let mut h = H::new(config("range"));
        h.find_coordinator();
        let join = h.request();
        h.respond(
            join.id,
            join_response(
                ResponseError::CoordinatorLoadInProgress.code(),
                -1,
                "",
                "",
                vec![],
            ),
        );
        h.no_request();
        assert_eq!(h.m.next_timer().map(|t| t.0), Some(Timer::Join));
        h.advance(Duration::from_secs(2));
        assert!(matches!(
            h.request().request,
            GroupRequest::JoinGroup { .. }
        ));
    }

    #[test]
    fn joining_inconsistent_group_protocol_is_fatal_and_names_the_cause() {
        let mut h = H::new(config("range"));
        h.find_coordinator();
        let join = h.request();
        h.respond(
            join.id,
            join_response(
                ResponseError::InconsistentGroupProtocol.code(),
                -1,
                "",
                "",
                vec![],
            ),
        );
        let ev = h.events();
        let Some(Event::Fatal(e)) = ev.last() else {
            panic!("{ev:?}")
        };
        assert!(
            e.to_string().contains("partition.assignment.strategy"),
            "{e}"
        );
    }

    #[test]
    fn syncing_an_unexpected_error_code_rejoins_after_backoff_instead_of_closing() {
        // The Java client raises an unexpected SyncGroup (or JoinGroup, FindCoordinator,
        // OffsetFetch) error from poll() and rejoins on the next one; the consumer stays
        // usable. ottla closed the member for good. Seen in chaos runs: the librdkafka
        // mock answered a SyncGroup INVALID_PARTITIONS (37) after giving two clients one
        // member id.
        let mut h = H::new(config("range"));
        let sync = syncing_follower(&mut h, 3);
        h.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: ResponseError::InvalidPartitions.code(),
                protocol_name: None,
                assignment: Bytes::new(),
            },
        );
        assert_eq!(h.m.state(), StateKind::Unjoined);
        assert!(
            !h.events().iter().any(|e| matches!(e, Event::Fatal(_))),
            "not fatal"
        );
        h.advance(Duration::from_secs(1));
        let join = h.request();
        assert!(
            matches!(join.request, GroupRequest::JoinGroup { .. }),
            "{join:?}"
        );
    }

    #[test]
    fn joining_a_member_listed_twice_is_assigned_once() {
        // The Java leader keys subscriptions by member id, so a member listed twice (the
        // librdkafka mock gave two clients one id) counts once; ottla's leader refused
        // the whole assignment and closed for good.
        let mut h = H::new(config("range"));
        h.find_coordinator();
        let join = h.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!("{join:?}")
        };
        let metadata = protocols[0].1.clone();
        let member = |id: &str| JoinedMember {
            member_id: id.into(),
            instance_id: None,
            metadata: metadata.clone(),
        };
        h.respond(
            join.id,
            join_response_p(
                "range",
                0,
                3,
                "m1",
                "m1",
                vec![member("m1"), member("m0"), member("m0")],
            ),
        );
        let sync = h.request();
        let GroupRequest::SyncGroup { assignments, .. } = &sync.request else {
            panic!("{sync:?}")
        };
        let members: Vec<&str> = assignments.iter().map(|(m, _)| m.as_str()).collect();
        assert_eq!(members.len(), 2, "{members:?}");
        assert!(!h.events().iter().any(|e| matches!(e, Event::Fatal(_))));
    }

    #[test]
    fn syncing_invalid_request_rejoins() {
        let mut h = H::new(config("range"));
        h.find_coordinator();
        let join = h.request();
        h.respond(join.id, join_response(0, 3, "m2", "m1", vec![]));
        let sync = h.request();
        assert!(
            matches!(&sync.request, GroupRequest::SyncGroup { assignments, .. } if assignments.is_empty()),
            "followers send no assignments"
        );
        h.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: ResponseError::InvalidRequest.code(),
                protocol_name: None,
                assignment: Bytes::new(),
            },
        );
        assert!(matches!(
            h.request().request,
            GroupRequest::JoinGroup { .. }
        ));
    }

    #[test]
    fn stable_session_lapse_rediscovers_keeping_the_member_id_and_partitions() {
        // A lapse used to lose the partitions and forget the member id, so the member
        // rejoined as a stranger and its old id stayed a ghost for a session timeout.
        let mut h = stable("range");
        // Heartbeats go out but are never answered, for a whole session (10 s).
        let mut lookup = None;
        for _ in 0..1100 {
            h.advance(Duration::from_millis(10));
            while let Some(out) = h.m.poll_request() {
                if matches!(out.request, GroupRequest::FindCoordinator { .. }) {
                    lookup = Some(out);
                }
            }
            if lookup.is_some() {
                break;
            }
        }
        let lookup = lookup.expect("the lapse rediscovers the coordinator");
        let ev = h.events();
        assert!(
            !ev.iter().any(|e| matches!(e, Event::Lost { .. })),
            "{ev:?}"
        );
        assert_eq!(h.m.assignment().len(), 4);
        assert_eq!(h.m.member_id(), "m1");
        // Found again: the heartbeat goes out at once, same member and generation.
        h.respond(
            lookup.id,
            GroupResponse::FindCoordinator {
                error: 0,
                node_id: 2,
                host: "b2".into(),
                port: 9092,
            },
        );
        let hb = h.request();
        let GroupRequest::Heartbeat {
            member_id,
            generation,
            ..
        } = &hb.request
        else {
            panic!("{hb:?}");
        };
        assert_eq!(
            (member_id.as_str(), Some(*generation)),
            ("m1", h.m.generation())
        );
        // The coordinator removed it meanwhile: only now are the partitions lost.
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::UnknownMemberId.code(),
            },
        );
        let ev = h.events();
        assert!(
            ev.contains(&Event::Lost {
                partitions: (0..4).map(tp).collect(),
                reason: LostReason::UnknownMember
            }),
            "{ev:?}"
        );
    }

    #[test]
    fn a_failure_from_the_coordinator_given_up_on_leaves_the_new_one_known() {
        // The driver closes the connection to a coordinator the member gave up on (as
        // the Java client), so the heartbeat and commit still on it fail. Found again
        // meanwhile, the member must not give up on the new coordinator for them.
        let mut h = stable("range");
        let commit = h.commit_one(0, 5).expect("commit");
        let _sent = h.request();
        let mut lookup = None;
        let mut stale_heartbeat = None;
        for _ in 0..1100 {
            h.advance(Duration::from_millis(10));
            while let Some(out) = h.m.poll_request() {
                match out.request {
                    GroupRequest::FindCoordinator { .. } => lookup = Some(out),
                    GroupRequest::Heartbeat { .. } => stale_heartbeat = Some(out),
                    _ => {}
                }
            }
            if lookup.is_some() {
                break;
            }
        }
        let (lookup, stale) = (lookup.expect("lapse"), stale_heartbeat.expect("heartbeat"));
        h.respond(
            lookup.id,
            GroupResponse::FindCoordinator {
                error: 0,
                node_id: 2,
                host: "b2".into(),
                port: 9092,
            },
        );
        let hb = h.request();
        assert!(matches!(hb.request, GroupRequest::Heartbeat { .. }));
        h.m.handle_failure(h.now, stale.id, Failure::Disconnected);
        h.m.handle_failure(h.now, commit, Failure::Disconnected);
        assert_eq!(
            h.m.coordinator(),
            Some(NodeId(2)),
            "failures on the old connection say nothing about the new coordinator"
        );
        h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
        assert_eq!(h.m.state(), StateKind::Stable);
    }

    #[test]
    fn a_late_heartbeat_response_from_an_old_generation_is_dropped() {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::IllegalGeneration.code(),
            },
        );
        let _ = h.events();
        // The same response again (a duplicate) changes nothing.
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::FencedInstanceId.code(),
            },
        );
        assert!(h.events().is_empty());
        assert_ne!(h.m.state(), StateKind::Closed);
    }

    #[test]
    fn stable_commit_for_an_unowned_partition_is_refused() {
        let mut h = stable("range");
        let other = TopicPartition {
            topic: "other".into(),
            partition: 0,
        };
        let err =
            h.m.commit(
                h.now,
                vec![CommitOffset {
                    partition: other.clone(),
                    offset: 1,
                    leader_epoch: -1,
                    metadata: None,
                }],
            )
            .unwrap_err();
        assert_eq!(err, CommitError::NotOwned(other));
        let id = h.commit_one(1, 1).unwrap();
        let out = h.request();
        assert_eq!(out.id, id);
        assert!(
            matches!(&out.request, GroupRequest::OffsetCommit { generation: 7, member_id, .. } if member_id == "m1")
        );
    }

    #[test]
    fn stable_commit_refused_for_its_content_fails_only_that_commit() {
        // OFFSET_METADATA_TOO_LARGE once closed the member for good; the Java client
        // fails the commit and carries on. So for the other codes about the commit's
        // content.
        let mut h = stable("range");
        for code in [
            ResponseError::OffsetMetadataTooLarge,
            ResponseError::InvalidCommitOffsetSize,
            ResponseError::TopicAuthorizationFailed,
            ResponseError::UnknownTopicOrPartition,
        ] {
            let commit = |offset| {
                vec![CommitOffset {
                    partition: tp(1),
                    offset,
                    leader_epoch: -1,
                    metadata: Some("x".repeat(5000)),
                }]
            };
            let id = h.m.commit(h.now, commit(1)).unwrap();
            let _ = h.request();
            h.respond(
                id,
                GroupResponse::OffsetCommit {
                    partitions: vec![(tp(1), code.code())],
                },
            );
            let ev = h.events();
            assert!(
                matches!(
                    &ev[..],
                    [Event::CommitCompleted { result: Err(CommitError::Broker { code: c, .. }), .. }] if *c == code.code()
                ),
                "{code:?}: {ev:?}"
            );
            assert_eq!(h.m.state(), StateKind::Stable, "{code:?}");
            let id =
                h.m.commit(h.now, commit(2))
                    .expect("the member still commits");
            let out = h.request();
            assert_eq!(out.id, id);
            h.respond(
                id,
                GroupResponse::OffsetCommit {
                    partitions: vec![(tp(1), 0)],
                },
            );
            let ev = h.events();
            assert!(
                matches!(&ev[..], [Event::CommitCompleted { result: Ok(_), .. }]),
                "{code:?}: {ev:?}"
            );
        }
    }

    #[test]
    fn stable_heartbeat_unexpected_errors_retry_and_keep_the_partitions() {
        // INVALID_REQUEST on a heartbeat was read as ILLEGAL_GENERATION (partitions lost,
        // rejoin), UNSUPPORTED_VERSION closed the member. The Java client's heartbeat
        // raises "Unexpected error in heartbeat response" and tries again after its
        // backoff (`Heartbeat::failHeartbeat`).
        for code in [
            ResponseError::InvalidRequest,
            ResponseError::UnsupportedVersion,
            ResponseError::GroupIdNotFound,
        ] {
            let mut h = stable("range");
            let hb = h.heartbeat();
            h.respond(hb.id, GroupResponse::Heartbeat { error: code.code() });
            assert_eq!(h.events(), vec![], "{code:?}");
            assert_eq!(h.m.state(), StateKind::Stable, "{code:?}");
            assert_eq!(h.m.assignment().len(), 4, "{code:?}");
            h.no_request();
            h.advance(h.m.config().retry_backoff * 2);
            let again = h.request();
            assert!(
                matches!(again.request, GroupRequest::Heartbeat { .. }),
                "{code:?}: {again:?}"
            );
        }
    }

    #[test]
    fn stable_commit_unexpected_errors_fail_that_commit_only() {
        // GROUP_ID_NOT_FOUND (Kafka's answer on OffsetCommit v9+ for a group that no
        // longer exists) and STALE_MEMBER_EPOCH closed the member for good; the Java
        // client raises "Unexpected error in commit" to the committer and carries on.
        let mut h = stable("range");
        for code in [
            ResponseError::GroupIdNotFound,
            ResponseError::StaleMemberEpoch,
            ResponseError::InvalidRequest,
        ] {
            let id = h.commit_one(1, 1).expect("the member commits");
            let _ = h.request();
            h.respond(
                id,
                GroupResponse::OffsetCommit {
                    partitions: vec![(tp(1), code.code())],
                },
            );
            let ev = h.events();
            let [
                Event::CommitCompleted {
                    result: Err(err), ..
                },
            ] = &ev[..]
            else {
                panic!("{code:?}: {ev:?}");
            };
            assert!(!err.is_retriable(), "{code:?}");
            assert_eq!(h.m.state(), StateKind::Stable, "{code:?}");
        }
    }

    #[test]
    fn commit_retriability_follows_the_reaction_table() {
        let broker = |e: ResponseError| CommitError::Broker {
            code: e.code(),
            name: error_name(e.code()),
        };
        // NETWORK_EXCEPTION was not retriable, so the final commit at close gave up.
        for retriable in [
            ResponseError::NetworkException,
            ResponseError::RequestTimedOut,
            ResponseError::CoordinatorLoadInProgress,
            ResponseError::CoordinatorNotAvailable,
            ResponseError::NotCoordinator,
            ResponseError::UnknownTopicOrPartition,
            ResponseError::RebalanceInProgress,
        ] {
            assert!(broker(retriable).is_retriable(), "{retriable:?}");
        }
        for fatal in [
            ResponseError::UnknownMemberId,
            ResponseError::IllegalGeneration,
            ResponseError::FencedInstanceId,
            ResponseError::GroupAuthorizationFailed,
            ResponseError::OffsetMetadataTooLarge,
            ResponseError::GroupIdNotFound,
        ] {
            assert!(!broker(fatal).is_retriable(), "{fatal:?}");
        }
    }

    /// Steps the clock by 5 ms until a request `wanted` picks goes out, answering the
    /// other requests (heartbeats) without error; the time it took.
    fn wait_for(h: &mut H, wanted: impl Fn(&GroupRequest) -> bool) -> (Duration, Outgoing) {
        let start = h.now;
        for _ in 0..2000 {
            while let Some(out) = h.m.poll_request() {
                if wanted(&out.request) {
                    return (h.now - start, out);
                }
                if matches!(out.request, GroupRequest::Heartbeat { .. }) {
                    h.respond(out.id, GroupResponse::Heartbeat { error: 0 });
                }
            }
            h.advance(Duration::from_millis(5));
        }
        panic!("no such request in 10 s");
    }

    #[test]
    fn stable_offset_fetch_asks_for_stable_offsets_and_backs_off_exponentially() {
        // UNSTABLE_OFFSET_COMMIT: a transactional commit of these partitions is pending.
        // The Java client asks with require_stable (so a new owner never resumes before
        // it settles) and retries with KIP-580's backoff, 100 ms doubling to 1 s; ottla
        // asked without the flag and retried every 100 ms.
        let mut h = H::new(config("range"));
        h.join_alone();
        h.events();
        let mut fetch = h.request();
        let mut waits = Vec::new();
        for _ in 0..6 {
            let GroupRequest::OffsetFetch { require_stable, .. } = &fetch.request else {
                panic!("{fetch:?}");
            };
            assert!(require_stable, "{fetch:?}");
            h.respond(
                fetch.id,
                GroupResponse::OffsetFetch {
                    error: 0,
                    partitions: (0..4)
                        .map(|p| (tp(p), -1, -1, ResponseError::UnstableOffsetCommit.code()))
                        .collect(),
                },
            );
            let (waited, next) =
                wait_for(&mut h, |r| matches!(r, GroupRequest::OffsetFetch { .. }));
            waits.push(waited);
            fetch = next;
        }
        let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
        // 100, 200, 400, 800, 1000, 1000 ms, each within ±20% jitter (and 5 ms steps).
        for (i, expected) in [100u128, 200, 400, 800, 1000, 1000].into_iter().enumerate() {
            let (lo, hi) = (expected * 8 / 10, expected * 12 / 10 + 5);
            assert!((lo..=hi).contains(&ms[i]), "retry {i}: {ms:?}");
        }
    }

    #[test]
    fn stable_heartbeat_retries_back_off_exponentially_and_start_over_after_a_success() {
        let mut h = stable("range");
        let mut gaps = Vec::new();
        let mut hb = h.heartbeat();
        for _ in 0..5 {
            h.respond(
                hb.id,
                GroupResponse::Heartbeat {
                    error: ResponseError::RequestTimedOut.code(),
                },
            );
            let (waited, next) = wait_for(&mut h, |r| matches!(r, GroupRequest::Heartbeat { .. }));
            gaps.push(waited.as_millis());
            hb = next;
        }
        for (i, expected) in [100u128, 200, 400, 800, 1000].into_iter().enumerate() {
            let (lo, hi) = (expected * 8 / 10, expected * 12 / 10 + 5);
            assert!((lo..=hi).contains(&gaps[i]), "retry {i}: {gaps:?}");
        }
        // A success starts the count over: the next failure waits 100 ms again.
        h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
        let (_, hb) = wait_for(&mut h, |r| matches!(r, GroupRequest::Heartbeat { .. }));
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RequestTimedOut.code(),
            },
        );
        let (waited, _) = wait_for(&mut h, |r| matches!(r, GroupRequest::Heartbeat { .. }));
        assert!(waited <= Duration::from_millis(125), "{waited:?}");
    }

    #[test]
    fn stable_commit_rebalance_in_progress_acquiesces() {
        let mut h = stable("range");
        let id = h.commit_one(1, 1).unwrap();
        let _ = h.request();
        h.respond(
            id,
            GroupResponse::OffsetCommit {
                partitions: vec![(tp(1), ResponseError::RebalanceInProgress.code())],
            },
        );
        let ev = h.events();
        assert!(
            matches!(
                &ev[0],
                Event::CommitCompleted {
                    result: Err(CommitError::Broker { code: 27, .. }),
                    ..
                }
            ),
            "{ev:?}"
        );
        assert!(matches!(&ev[1], Event::RevokeRequested { .. }), "{ev:?}");
    }

    #[test]
    fn stable_progress_timeout_leaves_and_rejoins_on_progress() {
        let mut h = stable("range");
        for _ in 0..30 {
            h.advance(Duration::from_secs(1));
            while let Some(o) = h.m.poll_request() {
                if matches!(o.request, GroupRequest::Heartbeat { .. }) {
                    h.respond(o.id, GroupResponse::Heartbeat { error: 0 });
                }
            }
        }
        let ev = h.events();
        assert!(
            ev.iter()
                .any(|e| matches!(e, Event::ProgressTimeout { .. })),
            "{ev:?}"
        );
        assert!(
            ev.iter().any(|e| matches!(
                e,
                Event::Lost {
                    reason: LostReason::ProgressTimeout,
                    ..
                }
            )),
            "{ev:?}"
        );
        assert_eq!(h.m.state(), StateKind::Suspended);
        h.m.note_progress(h.now);
        assert!(matches!(
            h.request().request,
            GroupRequest::JoinGroup { .. }
        ));
    }

    #[test]
    fn revoking_without_ack_within_the_rebalance_timeout_loses_the_partitions() {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        let _ = h.events();
        // The application keeps polling but never finishes the revocation. Heartbeats
        // go on meanwhile, answered REBALANCE_IN_PROGRESS, which keeps the session.
        let mut heartbeats = 0;
        let mut others = Vec::new();
        for _ in 0..30 {
            h.m.note_progress(h.now);
            h.advance(Duration::from_secs(1));
            while let Some(out) = h.m.poll_request() {
                if matches!(out.request, GroupRequest::Heartbeat { .. }) {
                    heartbeats += 1;
                    h.respond(
                        out.id,
                        GroupResponse::Heartbeat {
                            error: ResponseError::RebalanceInProgress.code(),
                        },
                    );
                } else {
                    others.push(out);
                }
            }
        }
        assert!(heartbeats >= 10, "{heartbeats} heartbeats while revoking");
        let ev = h.events();
        assert!(
            ev.iter().any(|e| matches!(
                e,
                Event::Lost {
                    reason: LostReason::RevocationTimedOut,
                    ..
                }
            )),
            "{ev:?}"
        );
        assert!(
            matches!(&others[..], [o] if matches!(o.request, GroupRequest::JoinGroup { .. })),
            "{others:?}"
        );
    }

    #[test]
    fn static_member_leave_sends_no_leave_group() {
        let mut c = config("range");
        c.instance_id = Some("instance-1".into());
        let mut h = H::new(c);
        h.join_alone();
        let _ = h.events();
        while h.m.poll_request().is_some() {}
        h.m.leave(h.now);
        h.no_request();
        assert_eq!(h.events(), vec![Event::Left]);
    }

    #[test]
    fn static_member_asked_to_leave_for_good_sends_leave_group_with_its_instance_id() {
        // Java 4.1's CloseOptions: a static member that is going away for good (a
        // scale-in) leaves at once instead of holding its partitions for a session.
        let mut c = config("range");
        c.instance_id = Some("instance-1".into());
        let mut h = H::new(c);
        h.join_alone();
        let _ = h.events();
        while h.m.poll_request().is_some() {}
        h.m.leave_with(h.now, Membership::Leave);
        let leave = h.request();
        assert!(
            matches!(&leave.request, GroupRequest::LeaveGroup { member_id, instance_id: Some(i), .. } if member_id == "m1" && i == "instance-1"),
            "{leave:?}"
        );
        h.respond(leave.id, GroupResponse::LeaveGroup { error: 0 });
        assert_eq!(h.m.state(), StateKind::Closed);
    }

    #[test]
    fn dynamic_member_asked_to_remain_sends_no_leave_group() {
        let mut h = stable("range");
        while h.m.poll_request().is_some() {}
        h.m.leave_with(h.now, Membership::Remain);
        h.no_request();
        assert_eq!(h.m.state(), StateKind::Closed);
    }

    #[test]
    fn joining_leave_waits_for_the_held_join_group_up_to_the_close_timeout() {
        // The broker holds a JoinGroup for the rebalance, and the LeaveGroup behind it
        // on the same connection waits. The member gave up after min(session, 5 s) and
        // the process could exit with the LeaveGroup unread, so the group waited a
        // session for the ghost. The Java client waits up to its close timeout (30 s).
        let mut h = H::new(config("range"));
        h.find_coordinator();
        let join = h.request();
        h.respond(
            join.id,
            join_response(ResponseError::MemberIdRequired.code(), 0, "m1", "", vec![]),
        );
        let _held = h.request();
        h.events();
        h.m.leave(h.now);
        let leave = h.request();
        assert!(
            matches!(&leave.request, GroupRequest::LeaveGroup { member_id, .. } if member_id == "m1")
        );
        h.advance(Duration::from_secs(29));
        assert_eq!(h.m.state(), StateKind::Leaving);
        h.respond(leave.id, GroupResponse::LeaveGroup { error: 0 });
        assert_eq!(h.events(), vec![Event::Left]);
        assert_eq!(h.m.state(), StateKind::Closed);
        // Unanswered, it closes at the close timeout.
        let mut h = stable("range");
        h.m.leave(h.now);
        let _leave = h.request();
        h.advance(h.m.config().close_timeout - Duration::from_millis(1));
        assert_eq!(h.m.state(), StateKind::Leaving);
        h.advance(Duration::from_millis(1));
        assert_eq!(h.m.state(), StateKind::Closed);
    }

    #[test]
    fn dynamic_member_leave_sends_leave_group() {
        let mut h = stable("range");
        h.m.leave(h.now);
        let out = h.request();
        assert!(
            matches!(&out.request, GroupRequest::LeaveGroup { member_id, .. } if member_id == "m1")
        );
        h.respond(out.id, GroupResponse::LeaveGroup { error: 0 });
        assert_eq!(h.events(), vec![Event::Left]);
        assert_eq!(h.m.state(), StateKind::Closed);
    }

    #[test]
    fn cooperative_sync_revokes_only_moved_partitions_then_assigns_and_rejoins() {
        let mut h = H::new(config("cooperative-sticky"));
        h.find_coordinator();
        // Follower in generation 1 with partitions 0..4.
        let join = h.request();
        h.respond(
            join.id,
            join_response_p("cooperative-sticky", 0, 1, "m2", "m1", vec![]),
        );
        let sync = h.request();
        let full = encode_assignment(
            &Assignment {
                partitions: (0..4).map(tp).collect(),
                user_data: None,
            },
            3,
        )
        .unwrap();
        h.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment: full,
            },
        );
        let _ = h.events();
        while h.m.poll_request().is_some() {}
        // A rebalance: cooperative members rejoin keeping their partitions.
        let hb = h.heartbeat();
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        assert!(
            h.events().is_empty(),
            "no revocation before the new assignment is known"
        );
        let join = h.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!()
        };
        let sub = decode_subscription(protocols[0].1.clone()).unwrap();
        assert_eq!(
            sub.owned_partitions.len(),
            4,
            "owned partitions travel in the subscription"
        );
        h.respond(
            join.id,
            join_response_p("cooperative-sticky", 0, 2, "m2", "m1", vec![]),
        );
        let sync = h.request();
        let half = encode_assignment(
            &Assignment {
                partitions: vec![tp(0), tp(1)],
                user_data: None,
            },
            3,
        )
        .unwrap();
        h.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment: half,
            },
        );
        let ev = h.events();
        assert!(
            matches!(&ev[..], [Event::Joined { generation: 2, .. }, Event::RevokeRequested { generation: 2, partitions }] if partitions == &vec![tp(2), tp(3)]),
            "{ev:?}"
        );
        assert_eq!(
            h.m.assignment().len(),
            4,
            "nothing is taken before the application acknowledges"
        );
        h.m.complete_revocation(h.now, 2);
        assert_eq!(h.m.assignment(), vec![tp(0), tp(1)]);
        // Second round of KIP-429.
        let next = h.request();
        assert!(
            matches!(next.request, GroupRequest::JoinGroup { .. }),
            "{next:?}"
        );
    }
}
