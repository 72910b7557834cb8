//! What the fetcher keeps per partition (its position, leader, pause, backoff), per
//! fetched response (the buffered data), per fetch session and per fetch in flight.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

use super::ConsumerRecord;
use super::types::{FetchError, ResetReason};
use crate::fetch::batch::{Batches, CommittedFilter};
use crate::fetch::request::TargetRef;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Position {
    /// Waiting for the group's committed offset.
    AwaitingCommitted,
    /// Must be reset through ListOffsets.
    NeedsReset(ResetReason),
    /// A ListOffsets for it is in flight to this broker.
    Resetting(NodeId, ResetReason),
    /// Fetching from `offset`; `epoch` is the leader epoch of the last record delivered.
    At { offset: i64, epoch: i32 },
    /// Stopped until the application seeks; where it stopped, if it had a position.
    Stopped(Option<(i64, i32)>),
}

#[derive(Debug)]
pub(super) struct PartitionState {
    pub(super) topic: Arc<str>,
    pub(super) topic_id: Uuid,
    pub(super) leader: Option<NodeId>,
    pub(super) leader_epoch: i32,
    /// The replica the leader named to fetch from (KIP-392) and until when: fetches go
    /// there instead of to the leader while the leader is known.
    pub(super) read_replica: Option<(NodeId, Instant)>,
    pub(super) position: Position,
    /// `Some(since)`: paused by the application since then.
    pub(super) paused: Option<Instant>,
    pub(super) high_watermark: i64,
    pub(super) last_stable_offset: i64,
    pub(super) log_start_offset: i64,
    pub(super) retry_at: Option<Instant>,
    /// Failed fetches or ListOffsets of this partition in a row (the backoff's step).
    pub(super) failures: u32,
    /// Fetched data of this partition waits in the buffer, since this time.
    pub(super) buffered: Option<Instant>,
    /// What [`Fetcher::consumed`](super::Fetcher::consumed) reports while `moved_round` is
    /// the current round: the position as the round began. In a later round, the position
    /// itself.
    pub(super) consumed: Option<(i64, i32)>,
    /// The last [`Fetcher::mark_consumed`](super::Fetcher::mark_consumed) round in which
    /// the position moved (0: none).
    pub(super) moved_round: u64,
}

impl PartitionState {
    /// The broker to fetch this partition from at `now`: the replica the leader named,
    /// until it expires, else the leader; none while the leader is unknown.
    pub(super) fn source(&self, now: Instant) -> Option<NodeId> {
        let leader = self.leader?;
        match self.read_replica {
            Some((replica, until)) if now < until => Some(replica),
            _ => Some(leader),
        }
    }

    /// Whether `node` is the replica this partition fetches from instead of its leader.
    pub(super) fn reads_from_replica(&self, node: NodeId) -> bool {
        self.read_replica.is_some_and(|(r, _)| r == node) && self.leader != Some(node)
    }

    /// What [`Fetcher::consumed`](super::Fetcher::consumed) reports in `round`: the
    /// position as of the round's start. Marking a round is one increment, not a set of the
    /// partitions that moved (a lookup, an insert and a name cloned per record `recv`
    /// delivered).
    pub(super) fn consumed_in(&self, round: u64) -> Option<(i64, i32)> {
        if self.moved_round == round {
            return self.consumed;
        }
        match self.position {
            Position::At { offset, epoch } | Position::Stopped(Some((offset, epoch))) => {
                Some((offset, epoch))
            }
            _ => self.consumed,
        }
    }

    /// Moves the position, keeping what the round began with for
    /// [`Fetcher::consumed`](super::Fetcher::consumed).
    pub(super) fn set_position(&mut self, round: u64, position: Position) {
        if self.moved_round != round {
            self.consumed = self.consumed_in(round);
            self.moved_round = round;
        }
        self.position = position;
    }
}

/// One partition's fetched data, drained record by record.
#[derive(Debug)]
pub(super) struct Completed {
    pub(super) tp: TopicPartition,
    pub(super) topic: Arc<str>,
    pub(super) batches: Batches,
    /// The response this data came from (see
    /// [`Fetcher::charges`](super::Fetcher::charges)).
    pub(super) charge: u64,
    pub(super) filter: Option<CommittedFilter>,
    pub(super) records: VecDeque<ConsumerRecord>,
    /// A bad record found after good ones: the partition stops here once those are out.
    pub(super) pending_error: Option<FetchError>,
    pub(super) batch_epoch: i32,
    pub(super) batch_end: i64,
}

/// What one fetch session (KIP-227) with a broker holds.
#[derive(Debug, Default, Clone)]
pub(super) struct Session {
    /// 0: none; the next request is a full one that asks for a session.
    pub(super) id: i32,
    pub(super) epoch: i32,
    /// What the broker believes each partition's fetch state is.
    pub(super) partitions: SentList,
}

/// Partitions of a fetch or a session, sorted by topic and partition (the order of
/// [`Fetcher`](super::Fetcher)'s map). The topic is the partition's shared name: building
/// one costs a reference count, not an allocation, and a member with 10,000 partitions
/// builds one per Fetch.
pub(super) type SentList = Vec<(Arc<str>, i32, SentPartition)>;

/// An entry of a [`SentList`] as a request target.
pub(super) fn target_ref((topic, partition, p): &(Arc<str>, i32, SentPartition)) -> TargetRef<'_> {
    TargetRef {
        topic,
        topic_id: p.topic_id,
        partition: *partition,
        offset: p.offset,
        leader_epoch: p.leader_epoch,
        max_bytes: p.max_bytes,
    }
}

/// The entries of `topic` in a sorted list.
pub(super) fn sent_of_topic<'a>(
    list: &'a SentList,
    topic: &str,
) -> &'a [(Arc<str>, i32, SentPartition)] {
    let from = list.partition_point(|(t, _, _)| &**t < topic);
    let to = list.partition_point(|(t, _, _)| &**t <= topic);
    list.get(from..to).unwrap_or(&[])
}

/// The entry of `partition` among one topic's sorted entries.
pub(super) fn sent_in(
    sent: &[(Arc<str>, i32, SentPartition)],
    partition: i32,
) -> Option<&SentPartition> {
    sent.binary_search_by_key(&partition, |(_, p, _)| *p)
        .ok()
        .and_then(|i| sent.get(i))
        .map(|(_, _, sent)| sent)
}

/// The entry of `topic`/`partition` in a sorted list.
pub(super) fn sent_find<'a>(
    list: &'a SentList,
    topic: &str,
    partition: i32,
) -> Option<&'a SentPartition> {
    list.binary_search_by(|(t, p, _)| (&**t, *p).cmp(&(topic, partition)))
        .ok()
        .and_then(|i| list.get(i))
        .map(|(_, _, sent)| sent)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SentPartition {
    pub(super) offset: i64,
    pub(super) max_bytes: i32,
    pub(super) leader_epoch: i32,
    pub(super) topic_id: Uuid,
}

#[derive(Debug)]
pub(super) struct InFlightFetch {
    /// Set by [`Fetcher::build_fetch`](super::Fetcher::build_fetch); `None` while only
    /// claimed.
    pub(super) version: Option<i16>,
    /// Every partition this fetch covers (sent or left in the session unchanged).
    pub(super) partitions: SentList,
    pub(super) session_sent: (i32, i32),
}
