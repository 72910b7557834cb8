//! The error reaction table: what each broker error code on a ConsumerGroupHeartbeat
//! does to the member, after the Java client's handler; the settings to name with a
//! fatal one.

use kafka_protocol::ResponseError;

/// What an error code on a ConsumerGroupHeartbeat does (the Java client's
/// `AbstractHeartbeatRequestManager.onErrorResponse` and librdkafka's handler).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reaction {
    /// NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE: find it again, then heartbeat.
    Rediscover,
    /// Transient: heartbeat again after the backoff, with every field.
    Retry,
    /// FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID: the partitions are lost; rejoin with
    /// epoch 0 and the same member id.
    Fenced,
    /// GROUP_ID_NOT_FOUND: the group is gone (deleted, or its coordinator lost it) or
    /// is a classic group. To a member in the group: lost and rejoin with epoch 0,
    /// which creates the group again; to a join: fatal (a classic group of that id).
    GroupGone,
    /// TOPIC_AUTHORIZATION_FAILED: reported to the application, retried after the
    /// backoff (KAFKA-18813).
    TopicAuthorization,
    /// Configuration or a broker that cannot serve this member: closed, sticky.
    Fatal,
}

pub(super) fn reaction(code: i16) -> Reaction {
    use ResponseError as E;
    match ResponseError::try_from_code(code) {
        Some(E::NotCoordinator | E::CoordinatorNotAvailable) => Reaction::Rediscover,
        Some(E::FencedMemberEpoch | E::UnknownMemberId) => Reaction::Fenced,
        Some(E::GroupIdNotFound) => Reaction::GroupGone,
        Some(E::TopicAuthorizationFailed) => Reaction::TopicAuthorization,
        Some(
            E::GroupAuthorizationFailed
            | E::InvalidRequest
            | E::GroupMaxSizeReached
            | E::UnsupportedAssignor
            | E::UnsupportedVersion
            | E::UnreleasedInstanceId
            | E::FencedInstanceId
            | E::InvalidRegularExpression
            | E::InvalidGroupId,
        ) => Reaction::Fatal,
        // COORDINATOR_LOAD_IN_PROGRESS retries in Java too. Java closes the member on codes it does not expect; ottla retries them
        // after the backoff with a warning, as its classic member does, since a
        // member that stays can recover and one that closed cannot.
        _ => Reaction::Retry,
    }
}

pub(super) fn hint(code: i16) -> Option<&'static str> {
    use ResponseError as E;
    match ResponseError::try_from_code(code)? {
        E::UnsupportedAssignor => {
            Some("group.remote.assignor names an assignor the broker does not have")
        }
        E::UnsupportedVersion => Some(
            "the broker does not support the consumer group protocol (set group.protocol=classic)",
        ),
        E::UnreleasedInstanceId => {
            Some("a member with this group.instance.id has not left the group yet")
        }
        E::FencedInstanceId => Some("another member uses the same group.instance.id"),
        E::GroupAuthorizationFailed => Some("the principal lacks READ on the group"),
        E::GroupMaxSizeReached => Some("the group has group.max.size members already"),
        E::InvalidRegularExpression => Some("the subscription's regular expression is invalid"),
        E::GroupIdNotFound => Some(
            "a classic group with this group.id exists and the broker does not convert it (group.consumer.migration.policy); use group.protocol=classic or another group.id",
        ),
        _ => None,
    }
}
