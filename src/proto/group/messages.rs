//! The group member's requests and responses, independent of wire versions.
//!
//! The member state machine speaks these; `proto::group::codec` turns them into
//! `kafka-protocol` requests for the negotiated version and turns responses back. The
//! simulated coordinator in `protocol-tests` speaks them directly.

use bytes::Bytes;

use super::consumer_protocol::TopicPartition;

/// A request the group member wants sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRequest {
    /// Find the coordinator of `group` (key type 0, group).
    FindCoordinator {
        /// The group id.
        group: String,
    },
    /// The first barrier of a rebalance.
    JoinGroup {
        /// The group id.
        group: String,
        /// Empty on a first join (the broker assigns one, KIP-394).
        member_id: String,
        /// `group.instance.id` for static members (KIP-345).
        instance_id: Option<String>,
        /// `session.timeout.ms`.
        session_timeout_ms: i32,
        /// `max.poll.interval.ms`, the time members get to rejoin.
        rebalance_timeout_ms: i32,
        /// Always `consumer`.
        protocol_type: String,
        /// `(assignor name, encoded subscription)` in preference order.
        protocols: Vec<(String, Bytes)>,
        /// Why the member (re)joins (KIP-800, JoinGroup v8+).
        reason: Option<String>,
    },
    /// The second barrier: the leader sends assignments, followers send none.
    SyncGroup {
        /// The group id.
        group: String,
        /// The generation joined.
        generation: i32,
        /// This member.
        member_id: String,
        /// `group.instance.id`.
        instance_id: Option<String>,
        /// Always `consumer` (v5+).
        protocol_type: String,
        /// The chosen assignor (v5+).
        protocol_name: String,
        /// `(member id, encoded assignment)`; empty for followers.
        assignments: Vec<(String, Bytes)>,
    },
    /// Liveness within a generation.
    Heartbeat {
        /// The group id.
        group: String,
        /// The generation.
        generation: i32,
        /// This member.
        member_id: String,
        /// `group.instance.id`.
        instance_id: Option<String>,
    },
    /// Leave the group (dynamic members on close).
    LeaveGroup {
        /// The group id.
        group: String,
        /// This member.
        member_id: String,
        /// `group.instance.id`.
        instance_id: Option<String>,
        /// Why (KIP-800, v5+).
        reason: Option<String>,
    },
    /// Commit offsets for owned partitions in the current generation.
    OffsetCommit {
        /// The group id.
        group: String,
        /// The generation that owns the partitions.
        generation: i32,
        /// This member.
        member_id: String,
        /// `group.instance.id`.
        instance_id: Option<String>,
        /// What to commit.
        offsets: Vec<CommitOffset>,
    },
    /// Read committed offsets for newly assigned partitions.
    OffsetFetch {
        /// The group id.
        group: String,
        /// The partitions.
        partitions: Vec<TopicPartition>,
        /// Whether to wait for pending transactional commits (KIP-447, v7+).
        require_stable: bool,
    },
}

impl GroupRequest {
    /// The API this request is sent with.
    pub fn api(&self) -> kafka_protocol::messages::ApiKey {
        use kafka_protocol::messages::ApiKey;
        match self {
            GroupRequest::FindCoordinator { .. } => ApiKey::FindCoordinator,
            GroupRequest::JoinGroup { .. } => ApiKey::JoinGroup,
            GroupRequest::SyncGroup { .. } => ApiKey::SyncGroup,
            GroupRequest::Heartbeat { .. } => ApiKey::Heartbeat,
            GroupRequest::LeaveGroup { .. } => ApiKey::LeaveGroup,
            GroupRequest::OffsetCommit { .. } => ApiKey::OffsetCommit,
            GroupRequest::OffsetFetch { .. } => ApiKey::OffsetFetch,
        }
    }
}

/// One partition's offset to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOffset {
    /// The partition.
    pub partition: TopicPartition,
    /// The next offset to consume (last processed + 1).
    pub offset: i64,
    /// The leader epoch of the last processed record, or -1 (KIP-320, v6+).
    pub leader_epoch: i32,
    /// Free-form metadata.
    pub metadata: Option<String>,
}

/// A JoinGroup member entry, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    /// The member id.
    pub member_id: String,
    /// Its `group.instance.id`, if static.
    pub instance_id: Option<String>,
    /// Its encoded subscription for the chosen protocol.
    pub metadata: Bytes,
}

/// A response, reduced to what the member needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupResponse {
    /// FindCoordinator.
    FindCoordinator {
        /// Error code (0 for none).
        error: i16,
        /// The coordinator's node id.
        node_id: i32,
        /// Its host.
        host: String,
        /// Its port.
        port: i32,
    },
    /// JoinGroup.
    JoinGroup {
        /// Error code.
        error: i16,
        /// The generation formed.
        generation: i32,
        /// The chosen assignor.
        protocol_name: Option<String>,
        /// The leader's member id.
        leader: String,
        /// This member's id (also set with MEMBER_ID_REQUIRED).
        member_id: String,
        /// Every member, for the leader only.
        members: Vec<JoinedMember>,
        /// KIP-814: the leader must not assign (static leader rejoined, v9+).
        skip_assignment: bool,
    },
    /// SyncGroup.
    SyncGroup {
        /// Error code.
        error: i16,
        /// The chosen assignor (v5+).
        protocol_name: Option<String>,
        /// This member's encoded assignment.
        assignment: Bytes,
    },
    /// Heartbeat.
    Heartbeat {
        /// Error code.
        error: i16,
    },
    /// LeaveGroup.
    LeaveGroup {
        /// Top-level error code, or the member's own error where reported (v3+).
        error: i16,
    },
    /// OffsetCommit.
    OffsetCommit {
        /// Per partition error codes.
        partitions: Vec<(TopicPartition, i16)>,
    },
    /// OffsetFetch.
    OffsetFetch {
        /// Top-level (or group-level, v8+) error code.
        error: i16,
        /// `(partition, committed offset or -1, leader epoch or -1, error code)`.
        partitions: Vec<(TopicPartition, i64, i32, i16)>,
    },
}
