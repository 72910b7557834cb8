//! The error reaction tables: what each broker error code does to the member, one
//! table per API family, each after the Java client's handler.

use kafka_protocol::ResponseError;

/// How the member reacts to an error code: [`reaction`] for FindCoordinator,
/// JoinGroup, SyncGroup and OffsetFetch, [`heartbeat_reaction`] and
/// [`commit_reaction`] for the other two, each after the Java client's handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reaction {
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
pub(super) fn reaction(code: i16) -> Reaction {
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

/// Heartbeat's table, after the Java client's `HeartbeatResponseHandler`: anything it
/// does not expect is tried again after the backoff (`Heartbeat.failHeartbeat`), never
/// read as a lost generation or a fatal error. GROUP_AUTHORIZATION_FAILED is fatal here
/// (configuration), where Java's heartbeat thread retries and its next JoinGroup or
/// commit raises it.
pub(super) fn heartbeat_reaction(code: i16) -> Reaction {
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
pub(crate) struct CommitReaction {
    pub(super) member: Option<Reaction>,
    pub(crate) retriable: bool,
}

/// OffsetCommit's table, after the Java client's `OffsetCommitResponseHandler`. Codes
/// about what one commit carried (too-large metadata, a topic without rights) and codes
/// it does not expect (GROUP_ID_NOT_FOUND, STALE_MEMBER_EPOCH, ...: Java's "Unexpected
/// error in commit") fail that commit and change nothing else.
pub(crate) fn commit_reaction(code: i16) -> CommitReaction {
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

pub(super) fn hint(code: i16) -> Option<&'static str> {
    use ResponseError as E;
    match ResponseError::try_from_code(code)? {
        E::FencedInstanceId => Some("another member uses the same group.instance.id"),
        E::InconsistentGroupProtocol => Some(
            "no assignor is shared with the group's other members (check partition.assignment.strategy; docs/migrating.md)",
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
