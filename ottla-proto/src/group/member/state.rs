//! The member's private state: what each lifecycle state owns, and what each request
//! in flight was sent for.

use std::collections::BTreeSet;
use std::time::Instant;

use super::super::assignor::RebalanceProtocol;
use super::super::consumer_protocol::TopicPartition;
use super::super::messages::{CommitOffset, GroupRequest};
use crate::group::types::{GroupError, RequestId};

/// What happens once a revocation completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterRevoke {
    /// Eager: everything was revoked; now rejoin.
    Rejoin { reason: String },
    /// Cooperative: hand out `added`, then rejoin for the second round if anything was
    /// revoked.
    Assign {
        added: Vec<TopicPartition>,
        rejoin: bool,
    },
}

/// The lifecycle state. The heartbeat lives in the states that have one: from the
/// JoinGroup answer (`Assigning`, `LeaderDelay`, `Syncing`) through the generation (`Stable`,
/// `Revoking`), as the Java client heartbeats from COMPLETING_REBALANCE on; leaving
/// those states ends it.
#[derive(Debug, Clone)]
pub(super) enum State {
    Unjoined {
        join_at: Instant,
        reason: String,
    },
    Joining {
        request: RequestId,
        deadline: Instant,
    },
    /// The leader's assignment (`job`) is computed off the member's task; the member
    /// heartbeats meanwhile. Past `deadline` (the rebalance timeout, after which the
    /// broker gives up on the leader's SyncGroup) the member rejoins.
    Assigning {
        job: u64,
        deadline: Instant,
        generation: i32,
        protocol: String,
        /// The ConsumerProtocol version the assignments are written in.
        version: i16,
        heartbeat: Heartbeat,
    },
    /// The leader holds its SyncGroup for `leader_sync_delay` (see [`GroupConfig`]).
    LeaderDelay {
        send_at: Instant,
        request: GroupRequest,
        generation: i32,
        protocol: String,
        heartbeat: Heartbeat,
    },
    Syncing {
        request: RequestId,
        deadline: Instant,
        generation: i32,
        protocol: String,
        leader: bool,
        heartbeat: Heartbeat,
    },
    Stable {
        heartbeat: Heartbeat,
    },
    Revoking {
        heartbeat: Heartbeat,
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

impl State {
    /// The heartbeat, in the states that have one.
    pub(super) fn heartbeat(&self) -> Option<&Heartbeat> {
        match self {
            State::Assigning { heartbeat, .. }
            | State::LeaderDelay { heartbeat, .. }
            | State::Syncing { heartbeat, .. }
            | State::Stable { heartbeat }
            | State::Revoking { heartbeat, .. } => Some(heartbeat),
            _ => None,
        }
    }

    /// The heartbeat, in the states that have one.
    pub(super) fn heartbeat_mut(&mut self) -> Option<&mut Heartbeat> {
        match self {
            State::Assigning { heartbeat, .. }
            | State::LeaderDelay { heartbeat, .. }
            | State::Syncing { heartbeat, .. }
            | State::Stable { heartbeat }
            | State::Revoking { heartbeat, .. } => Some(heartbeat),
            _ => None,
        }
    }
}

/// A live generation: what commits and heartbeats are sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Generation {
    pub(super) id: i32,
    pub(super) protocol: String,
    pub(super) rebalance: RebalanceProtocol,
}

#[derive(Debug, Clone)]
pub(super) struct Heartbeat {
    /// The generation heartbeats carry: the live one, or while syncing the one the
    /// JoinGroup answer gave.
    pub(super) generation: i32,
    pub(super) next_at: Instant,
    pub(super) in_flight: Option<RequestId>,
    /// When the heartbeat in flight was sent: the broker renews the session when it
    /// reads it, no earlier.
    pub(super) sent_at: Instant,
    /// The start of the session as the broker counts it, at the latest: when the last
    /// heartbeat it accepted was sent (or the generation's JoinGroup answer came).
    pub(super) last_ok: Instant,
    /// Heartbeats failed in a row: the retry waits `retry.backoff.ms` doubling to
    /// `retry.backoff.max.ms` (KIP-580), as the Java client's `Heartbeat.failHeartbeat`.
    pub(super) failures: u32,
}

/// What an in-flight request was sent for, and with which generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Sent {
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

/// A queued classic commit: its request, and what it is sent for.
impl super::super::common::Commits for (GroupRequest, Sent) {
    fn offsets(&self) -> &[CommitOffset] {
        match &self.1 {
            Sent::Commit { offsets, .. } => offsets,
            _ => &[],
        }
    }
}
