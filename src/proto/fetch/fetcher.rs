//! The fetcher, sans-IO: positions, leaders, fetch sessions, offset resets, pause and
//! resume, and a bounded buffer of fetched data that the application drains record by
//! record.
//!
//! The driver asks which brokers can be fetched from ([`Fetcher::claim_fetches`]), has
//! the fetcher build each request at the version the broker negotiated
//! ([`Fetcher::build_fetch`]), and hands back the response ([`Fetcher::handle_fetch`])
//! or the failure. Offset resets go the same way through ListOffsets. The application
//! side drains records with [`Fetcher::next_record`]. Nothing here reads a clock: every
//! call that needs the time takes `now`.
//!
//! Rules this module keeps (see docs/architecture.md):
//! - At most one Fetch in flight per broker, and a partition is never in a request while
//!   fetched data of it waits in the buffer.
//! - Data is kept only if the partition's position still equals the offset it was
//!   fetched from; a seek, reset, revocation or reassignment discards it.
//! - No new fetch starts while the buffered bytes are at the cap, and a request asks for
//!   no more than the room left (the broker may still return one whole batch, KIP-74).
//! - A corrupt batch stops its partition at the batch's offset with a typed error; the
//!   position never moves past a record that was not delivered.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};
use uuid::Uuid;

use super::batch::{BatchError, BatchOptions, Batches, CommittedFilter, control_markers};
use super::record::Shared;
use super::request::{
    FetchParams, IsolationLevel, TargetRef, fetch_request_refs, forgotten_topics_refs,
};
use crate::proto::backoff::Backoff;
use crate::proto::error_name;
use crate::proto::group::consumer_protocol::TopicPartition;
use crate::proto::metadata::{ClusterMetadata, NodeId};
use crate::proto::needs_metadata_refresh;

/// `auto.offset.reset`: where to start without a valid position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OffsetReset {
    /// The log start offset.
    Earliest,
    /// The log end offset (the last stable offset under `read_committed`). The default,
    /// as in the Java client.
    #[default]
    Latest,
    /// No reset: the partition stops with [`FetchError::NoOffset`] or
    /// [`FetchError::OutOfRange`].
    None,
}

/// Fetcher configuration (the Java client's names).
#[derive(Debug, Clone)]
pub struct FetcherConfig {
    /// `fetch.min.bytes`, `fetch.max.wait.ms`, `fetch.max.bytes`, `isolation.level`.
    pub params: FetchParams,
    /// `max.partition.fetch.bytes` (default 1 MiB).
    pub partition_max_bytes: i32,
    /// The cap on fetched bytes not yet delivered, across partitions (default 64 MiB).
    pub buffer_max_bytes: usize,
    /// `auto.offset.reset`.
    pub reset: OffsetReset,
    /// `check.crcs` and the inflation bound.
    pub batch: BatchOptions,
    /// `retry.backoff.ms`: the pause after a first failed fetch or ListOffsets,
    /// doubling with each consecutive failure (KIP-580).
    pub retry_backoff: Duration,
    /// `retry.backoff.max.ms`: the cap of that pause.
    pub retry_backoff_max: Duration,
    /// Seeds the backoff's jitter.
    pub seed: u64,
    /// Use incremental fetch sessions (KIP-227) where the broker offers them.
    pub sessions: bool,
}

impl Default for FetcherConfig {
    fn default() -> Self {
        Self {
            params: FetchParams::default(),
            partition_max_bytes: 1024 * 1024,
            buffer_max_bytes: 64 * 1024 * 1024,
            reset: OffsetReset::Latest,
            batch: BatchOptions::default(),
            retry_backoff: crate::proto::backoff::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: crate::proto::backoff::DEFAULT_RETRY_BACKOFF_MAX,
            seed: 0x0fe7_c4e5,
            sessions: true,
        }
    }
}

pub use super::record::{ConsumerRecord, ConsumerRecordBuilder, Header, Headers, TimestampType};

/// Why a partition stopped. The partition stays assigned and stopped until the
/// application seeks it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// A batch failed its checks (CRC, layout, codec).
    #[error("{topic}/{partition} stopped at offset {offset}: {source}")]
    Corrupt {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The batch's base offset, where the partition stopped.
        offset: i64,
        /// What was wrong.
        source: BatchError,
    },
    /// The position is out of range and `auto.offset.reset` is `none`.
    #[error("{topic}/{partition}: offset {offset} is out of range and auto.offset.reset is none")]
    OutOfRange {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The position.
        offset: i64,
    },
    /// No committed offset and `auto.offset.reset` is `none`.
    #[error("{topic}/{partition}: no committed offset and auto.offset.reset is none")]
    NoOffset {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
    /// A broker error that retrying cannot fix (authorization, for instance).
    #[error("{topic}/{partition}: {api} failed with {}", error_name(*code))]
    Broker {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The API.
        api: &'static str,
        /// The error code.
        code: i16,
    },
}

impl FetchError {
    /// The partition that stopped.
    pub fn topic_partition(&self) -> TopicPartition {
        let (topic, partition) = match self {
            FetchError::Corrupt {
                topic, partition, ..
            }
            | FetchError::OutOfRange {
                topic, partition, ..
            }
            | FetchError::NoOffset { topic, partition }
            | FetchError::Broker {
                topic, partition, ..
            } => (topic, partition),
        };
        TopicPartition {
            topic: topic.clone(),
            partition: *partition,
        }
    }
}

/// Why a position was reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetReason {
    /// The partition had no committed offset.
    NoCommittedOffset,
    /// The broker answered OFFSET_OUT_OF_RANGE for this position.
    OutOfRange {
        /// The position that was out of range.
        offset: i64,
    },
    /// The application asked for it ([`Fetcher::reset`]).
    Requested,
}

/// What the fetcher tells the driver and the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetcherEvent {
    /// Leaders are unknown or moved: refresh metadata, then call
    /// [`Fetcher::update_metadata`].
    MetadataNeeded,
    /// A position was set by `auto.offset.reset`.
    OffsetReset {
        /// The partition.
        partition: TopicPartition,
        /// Why.
        reason: ResetReason,
        /// The new position.
        offset: i64,
    },
    /// A partition stopped; the same error is also returned once by
    /// [`Fetcher::next_record`].
    PartitionStopped(FetchError),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Position {
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
struct PartitionState {
    topic: Arc<str>,
    topic_id: Uuid,
    leader: Option<NodeId>,
    leader_epoch: i32,
    position: Position,
    /// `Some(since)`: paused by the application since then.
    paused: Option<Instant>,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    retry_at: Option<Instant>,
    /// Failed fetches or ListOffsets of this partition in a row (the backoff's step).
    failures: u32,
    /// Fetched data of this partition waits in the buffer, since this time.
    buffered: Option<Instant>,
    /// What [`Fetcher::consumed`] reports while `moved_round` is the current round:
    /// the position as the round began. In a later round, the position itself.
    consumed: Option<(i64, i32)>,
    /// The last [`Fetcher::mark_consumed`] round in which the position moved (0: none).
    moved_round: u64,
}

impl PartitionState {
    /// What [`Fetcher::consumed`] reports in `round`: the position as of the round's
    /// start. Marking a round is one increment, not a set of the partitions that moved
    /// (a lookup, an insert and a name cloned per record `recv` delivered).
    fn consumed_in(&self, round: u64) -> Option<(i64, i32)> {
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

    /// Moves the position, keeping what the round began with for [`Fetcher::consumed`].
    fn set_position(&mut self, round: u64, position: Position) {
        if self.moved_round != round {
            self.consumed = self.consumed_in(round);
            self.moved_round = round;
        }
        self.position = position;
    }
}

/// One partition's fetched data, drained record by record.
#[derive(Debug)]
struct Completed {
    tp: TopicPartition,
    topic: Arc<str>,
    batches: Batches,
    /// The response this data came from (see [`Fetcher::charges`]).
    charge: u64,
    filter: Option<CommittedFilter>,
    records: VecDeque<ConsumerRecord>,
    /// A bad record found after good ones: the partition stops here once those are out.
    pending_error: Option<FetchError>,
    batch_epoch: i32,
    batch_end: i64,
}

/// What one fetch session (KIP-227) with a broker holds.
#[derive(Debug, Default, Clone)]
struct Session {
    /// 0: none; the next request is a full one that asks for a session.
    id: i32,
    epoch: i32,
    /// What the broker believes each partition's fetch state is.
    partitions: SentList,
}

/// Partitions of a fetch or a session, sorted by topic and partition (the order of
/// [`Fetcher`]'s map). The topic is the partition's shared name: building one costs a
/// reference count, not an allocation, and a member with 10,000 partitions builds
/// one per Fetch.
type SentList = Vec<(Arc<str>, i32, SentPartition)>;

/// An entry of a [`SentList`] as a request target.
fn target_ref((topic, partition, p): &(Arc<str>, i32, SentPartition)) -> TargetRef<'_> {
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
fn sent_of_topic<'a>(list: &'a SentList, topic: &str) -> &'a [(Arc<str>, i32, SentPartition)] {
    let from = list.partition_point(|(t, _, _)| &**t < topic);
    let to = list.partition_point(|(t, _, _)| &**t <= topic);
    list.get(from..to).unwrap_or(&[])
}

/// The entry of `partition` among one topic's sorted entries.
fn sent_in(sent: &[(Arc<str>, i32, SentPartition)], partition: i32) -> Option<&SentPartition> {
    sent.binary_search_by_key(&partition, |(_, p, _)| *p)
        .ok()
        .and_then(|i| sent.get(i))
        .map(|(_, _, sent)| sent)
}

/// The entry of `topic`/`partition` in a sorted list.
fn sent_find<'a>(list: &'a SentList, topic: &str, partition: i32) -> Option<&'a SentPartition> {
    list.binary_search_by(|(t, p, _)| (&**t, *p).cmp(&(topic, partition)))
        .ok()
        .and_then(|i| list.get(i))
        .map(|(_, _, sent)| sent)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SentPartition {
    offset: i64,
    max_bytes: i32,
    leader_epoch: i32,
    topic_id: Uuid,
}

#[derive(Debug)]
struct InFlightFetch {
    /// Set by [`Fetcher::build_fetch`]; `None` while only claimed.
    version: Option<i16>,
    /// Every partition this fetch covers (sent or left in the session unchanged).
    partitions: SentList,
    session_sent: (i32, i32),
}

/// Whether a response belongs to a fetch the fetcher still expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchToken {
    node: NodeId,
    version: i16,
}

impl FetchToken {
    /// The version the request was built at (decode the response at this version).
    pub fn version(&self) -> i16 {
        self.version
    }

    /// The broker.
    pub fn node(&self) -> NodeId {
        self.node
    }
}

/// The fetcher. See the module docs.
#[derive(Debug)]
pub struct Fetcher {
    config: FetcherConfig,
    partitions: BTreeMap<TopicPartition, PartitionState>,
    sessions: HashMap<NodeId, Session>,
    fetching: HashMap<NodeId, InFlightFetch>,
    /// Brokers with a ListOffsets claimed or in flight.
    resetting: BTreeSet<NodeId>,
    node_retry_at: HashMap<NodeId, Instant>,
    /// Failed Fetch requests in a row, per broker (the backoff's step).
    node_failures: HashMap<NodeId, u32>,
    /// `retry.backoff.ms` doubling to `retry.backoff.max.ms`, jittered.
    backoff: Backoff,
    completed: VecDeque<Completed>,
    buffered_bytes: usize,
    /// Per response with data still buffered: `(bytes, partitions not yet drained)`.
    charges: HashMap<u64, (usize, usize)>,
    next_charge: u64,
    errors: VecDeque<FetchError>,
    events: VecDeque<FetcherEvent>,
    metadata_needed: bool,
    /// Counts the calls of [`Fetcher::mark_consumed`], from 1.
    round: u64,
    /// The earliest end of a deferred fetch (see [`Fetcher::deferred`]), as of the last
    /// [`Fetcher::claim_fetches`].
    deferred_until: Option<Instant>,
    /// Turns the order of partitions in each request (KIP-74: a broker fills partitions
    /// in request order, so a fixed order starves the last ones).
    rotation: usize,
    /// False only when no partition needs a reset: [`Fetcher::resets_due`], called on
    /// every turn of the driver, then skips its pass over every partition. Set
    /// wherever a position becomes `NeedsReset`, cleared by a pass that finds none.
    resets_maybe: bool,
    /// False only when no partition has a `retry_at`: [`Fetcher::poll_timeout`] then
    /// skips its pass. Set wherever a `retry_at` is, cleared by
    /// [`Fetcher::claim_fetches`]'s pass when it sees none.
    retries_maybe: bool,
}

impl Fetcher {
    /// A fetcher with no partitions.
    pub fn new(config: FetcherConfig) -> Self {
        let backoff = Backoff::new(config.retry_backoff, config.retry_backoff_max, config.seed);
        Self {
            config,
            partitions: BTreeMap::new(),
            sessions: HashMap::new(),
            fetching: HashMap::new(),
            resetting: BTreeSet::new(),
            node_retry_at: HashMap::new(),
            node_failures: HashMap::new(),
            backoff,
            completed: VecDeque::new(),
            buffered_bytes: 0,
            charges: HashMap::new(),
            next_charge: 0,
            errors: VecDeque::new(),
            events: VecDeque::new(),
            metadata_needed: false,
            round: 1,
            deferred_until: None,
            rotation: 0,
            resets_maybe: false,
            retries_maybe: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FetcherConfig {
        &self.config
    }

    // ----- assignment and positions -----

    /// Adds partitions. With `await_committed`, each waits for
    /// [`Fetcher::set_committed`]; otherwise it starts from `auto.offset.reset`.
    /// Partitions already assigned are left as they are.
    pub fn assign(&mut self, partitions: &[TopicPartition], await_committed: bool) {
        for tp in partitions {
            if self.partitions.contains_key(tp) {
                continue;
            }
            let position = if await_committed {
                Position::AwaitingCommitted
            } else {
                self.reset_position(tp, ResetReason::NoCommittedOffset)
            };
            self.partitions.insert(
                tp.clone(),
                PartitionState {
                    topic: Arc::from(tp.topic.as_str()),
                    topic_id: Uuid::nil(),
                    leader: None,
                    leader_epoch: -1,
                    position,
                    paused: None,
                    high_watermark: -1,
                    last_stable_offset: -1,
                    log_start_offset: -1,
                    retry_at: None,
                    failures: 0,
                    buffered: None,
                    consumed: None,
                    moved_round: 0,
                },
            );
        }
        // New partitions need their leaders, whatever was asked before.
        self.metadata_needed = false;
        self.need_metadata();
    }

    fn reset_position(&mut self, tp: &TopicPartition, reason: ResetReason) -> Position {
        if self.config.reset == OffsetReset::None {
            let error = match reason {
                ResetReason::OutOfRange { offset } => FetchError::OutOfRange {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    offset,
                },
                _ => FetchError::NoOffset {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                },
            };
            self.stop(error);
            let at = match reason {
                ResetReason::OutOfRange { offset } => Some((offset, -1)),
                _ => None,
            };
            Position::Stopped(at)
        } else {
            self.resets_maybe = true;
            Position::NeedsReset(reason)
        }
    }

    fn stop(&mut self, error: FetchError) {
        warn!(%error, "partition stopped");
        self.events
            .push_back(FetcherEvent::PartitionStopped(error.clone()));
        self.errors.push_back(error);
    }

    /// Removes partitions (revoked or lost) and drops their buffered data. Returns their
    /// positions: `(partition, offset, leader epoch)`.
    pub fn unassign(&mut self, partitions: &[TopicPartition]) -> Vec<(TopicPartition, i64, i32)> {
        let mut out = Vec::new();
        for tp in partitions {
            if let Some(state) = self.partitions.remove(tp) {
                if let Position::At { offset, epoch } | Position::Stopped(Some((offset, epoch))) =
                    state.position
                {
                    out.push((tp.clone(), offset, epoch));
                }
            }
        }
        let gone: BTreeSet<&TopicPartition> = partitions.iter().collect();
        self.drop_completed(|c| gone.contains(&c.tp));
        out
    }

    /// Sets the start position of a partition awaiting its committed offset
    /// (`offset < 0`: none committed, so `auto.offset.reset` applies).
    pub fn set_committed(&mut self, tp: &TopicPartition, offset: i64, leader_epoch: i32) {
        let awaiting = self
            .partitions
            .get(tp)
            .is_some_and(|s| s.position == Position::AwaitingCommitted);
        if !awaiting {
            return;
        }
        let position = if offset >= 0 {
            Position::At {
                offset,
                epoch: leader_epoch,
            }
        } else {
            self.reset_position(tp, ResetReason::NoCommittedOffset)
        };
        if let Some(s) = self.partitions.get_mut(tp) {
            s.set_position(self.round, position);
            // The committed offset is what was consumed, from now on.
            s.consumed = Some((offset, leader_epoch));
        }
    }

    /// Moves a partition to `offset` (also restarts a stopped partition).
    pub fn seek(&mut self, tp: &TopicPartition, offset: i64) {
        if let Some(s) = self.partitions.get_mut(tp) {
            s.set_position(self.round, Position::At { offset, epoch: -1 });
            s.retry_at = None;
            s.failures = 0;
        }
        self.drop_completed(|c| &c.tp == tp);
    }

    /// Resets a partition through `auto.offset.reset` (also restarts a stopped one).
    pub fn reset(&mut self, tp: &TopicPartition) {
        if self.partitions.contains_key(tp) {
            let position = self.reset_position(tp, ResetReason::Requested);
            if let Some(s) = self.partitions.get_mut(tp) {
                s.set_position(self.round, position);
            }
        }
        self.drop_completed(|c| &c.tp == tp);
    }

    /// Drops a partition's fetched, undelivered records; its position stays at the
    /// last record delivered.
    pub fn discard_buffered(&mut self, tp: &TopicPartition) {
        self.drop_completed(|c| &c.tp == tp);
    }

    /// Stops fetching a partition; its buffered records are held back until
    /// [`Fetcher::resume`]. `now` is when: a Fetch that would only long-poll waits up
    /// to `fetch.max.wait.ms` from then for a paused partition with data to get
    /// (see [`Fetcher::poll_timeout`]).
    pub fn pause(&mut self, now: Instant, tp: &TopicPartition) {
        if let Some(s) = self.partitions.get_mut(tp) {
            s.paused.get_or_insert(now);
        }
    }

    /// Resumes a paused partition.
    pub fn resume(&mut self, tp: &TopicPartition) {
        if let Some(s) = self.partitions.get_mut(tp) {
            s.paused = None;
        }
    }

    /// The paused partitions.
    pub fn paused(&self) -> Vec<TopicPartition> {
        self.partitions
            .iter()
            .filter(|(_, s)| s.paused.is_some())
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.partitions.keys().cloned().collect()
    }

    /// The next offset to deliver, with the leader epoch of the last record delivered
    /// (for a stopped partition: where it stopped).
    pub fn position(&self, tp: &TopicPartition) -> Option<(i64, i32)> {
        match self.partitions.get(tp)?.position {
            Position::At { offset, epoch } | Position::Stopped(Some((offset, epoch))) => {
                Some((offset, epoch))
            }
            _ => None,
        }
    }

    /// Whether a partition is stopped by an error (until a seek).
    pub fn is_stopped(&self, tp: &TopicPartition) -> bool {
        self.partitions
            .get(tp)
            .is_some_and(|s| matches!(s.position, Position::Stopped(_)))
    }

    /// Every known position (see [`Fetcher::position`]).
    pub fn positions(&self) -> Vec<(TopicPartition, i64, i32)> {
        self.partitions
            .keys()
            .filter_map(|tp| self.position(tp).map(|(o, e)| (tp.clone(), o, e)))
            .collect()
    }

    /// Records that the application finished everything delivered so far (it came back
    /// for more): those positions become the ones [`Fetcher::consumed`] reports.
    pub fn mark_consumed(&mut self) {
        self.round += 1;
    }

    /// Positions as of the last [`Fetcher::mark_consumed`], for partitions in `only`
    /// (all when `None`); partitions never delivered from are left out.
    pub fn consumed(&self, only: Option<&[TopicPartition]>) -> Vec<(TopicPartition, i64, i32)> {
        self.partitions
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, s)| {
                let (offset, epoch) = s.consumed_in(self.round)?;
                (offset >= 0).then(|| (tp.clone(), offset, epoch))
            })
            .collect()
    }

    /// The high watermark minus the position: records not yet delivered.
    pub fn lag(&self, tp: &TopicPartition) -> Option<i64> {
        let s = self.partitions.get(tp)?;
        match s.position {
            Position::At { offset, .. } if s.high_watermark >= 0 => {
                let end = match self.config.params.isolation {
                    IsolationLevel::ReadCommitted if s.last_stable_offset >= 0 => {
                        s.last_stable_offset
                    }
                    _ => s.high_watermark,
                };
                Some((end - offset).max(0))
            }
            _ => None,
        }
    }

    /// The last high watermark, last stable offset and log start offset seen.
    pub fn watermarks(&self, tp: &TopicPartition) -> Option<(i64, i64, i64)> {
        let s = self.partitions.get(tp)?;
        Some((s.high_watermark, s.last_stable_offset, s.log_start_offset))
    }

    /// Bytes fetched and not yet delivered.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered_bytes
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<FetcherEvent> {
        self.events.pop_front()
    }

    /// Leaders, leader epochs and topic ids from fresh metadata.
    pub fn update_metadata(&mut self, metadata: &ClusterMetadata) {
        self.metadata_needed = false;
        // The topic is looked up once per run of its partitions, and a partition by
        // binary search (metadata keeps them sorted): `ClusterMetadata::leader` scans
        // the topic's partitions, which made this quadratic in a topic's size.
        let mut topic: Option<&crate::proto::metadata::TopicMetadata> = None;
        for (tp, s) in &mut self.partitions {
            if topic.is_none_or(|t| t.name != tp.topic) {
                topic = metadata.topic(&tp.topic);
            }
            let Some(t) = topic else {
                continue;
            };
            s.topic_id = t.id;
            let found = t
                .partitions
                .binary_search_by_key(&tp.partition, |p| p.partition)
                .ok()
                // Metadata not sorted (built by hand): a scan.
                .or_else(|| {
                    t.partitions
                        .iter()
                        .position(|p| p.partition == tp.partition)
                })
                .and_then(|i| t.partitions.get(i))
                .and_then(|p| Some((p.leader?, p.leader_epoch)));
            match found {
                Some((leader, epoch)) if epoch.0 >= s.leader_epoch || s.leader.is_none() => {
                    if s.leader != Some(leader) {
                        debug!(%tp, leader = leader.0, epoch = epoch.0, "partition leader");
                    }
                    s.leader = Some(leader);
                    s.leader_epoch = epoch.0;
                }
                Some(_) => {}
                None => s.leader = None,
            }
        }
    }

    fn need_metadata(&mut self) {
        if !self.metadata_needed {
            self.metadata_needed = true;
            self.events.push_back(FetcherEvent::MetadataNeeded);
        }
    }

    // ----- fetching -----

    fn fetchable(&self, now: Instant, s: &PartitionState) -> bool {
        matches!(s.position, Position::At { .. })
            && s.paused.is_none()
            && s.buffered.is_none()
            && s.leader.is_some()
            && s.retry_at.is_none_or(|t| now >= t)
    }

    /// The earliest time a backoff or a deferred fetch ends, for the driver's timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let partitions = if self.retries_maybe {
            self.partitions.values().filter_map(|s| s.retry_at).min()
        } else {
            None
        };
        let nodes = self.node_retry_at.values().copied();
        partitions
            .into_iter()
            .chain(nodes)
            .chain(self.deferred_until)
            .min()
    }

    /// Whether a Fetch to `node` now would only long-poll: every partition it would
    /// carry has caught up with the log end seen last, while other partitions of the
    /// node still have data waiting in the buffer. The broker would hold such a Fetch
    /// for `fetch.max.wait.ms`, and the waiting partitions could not be fetched again
    /// until it returns, so the fetch waits (at most `fetch.max.wait.ms` after that data
    /// came) for them to drain and then goes out with them. Paused partitions' data
    /// counts too, and so does a partition paused (within that wait) with data still
    /// to get: the Processor pauses a full lane's partition after draining it and
    /// resumes it moments later, and a long poll sent meanwhile held it back for
    /// `fetch.max.wait.ms` (the 1 KiB stall in docs/benchmarks.md). `Some(deadline)`
    /// while deferred.
    fn deferred(&self, now: Instant, node: NodeId) -> Option<Instant> {
        let wait =
            Duration::from_millis(u64::try_from(self.config.params.max_wait_ms).unwrap_or(0));
        let committed = self.config.params.isolation == IsolationLevel::ReadCommitted;
        let caught_up = |s: &PartitionState| {
            let end = if committed && s.last_stable_offset >= 0 {
                s.last_stable_offset
            } else {
                s.high_watermark
            };
            matches!(s.position, Position::At { offset, .. } if end >= 0 && offset >= end)
        };
        let mut deadline: Option<Instant> = None;
        let mut hold_until = |until: Instant| {
            if now < until {
                deadline = Some(deadline.map_or(until, |d| d.min(until)));
            }
        };
        for s in self.partitions.values() {
            if s.leader != Some(node) {
                continue;
            }
            if let Some(since) = s.buffered {
                // Paused ones too: a pause to hold back delivery (the Processor's lanes
                // do it when full) usually ends within moments, and a long one costs the
                // other partitions at most this one wait.
                hold_until(since + wait);
            } else if let Some(since) = s.paused {
                // Likewise a pause of a partition that has more to fetch; a pause of a
                // caught-up one (or a long one, past the wait) holds nothing back.
                if !caught_up(s) && matches!(s.position, Position::At { .. }) {
                    hold_until(since + wait);
                }
            } else if self.fetchable(now, s) && !caught_up(s) {
                return None;
            }
        }
        deadline
    }

    /// Brokers that can be fetched from now. Each is marked in flight: follow with
    /// [`Fetcher::build_fetch`], then [`Fetcher::handle_fetch`] or
    /// [`Fetcher::handle_fetch_failure`].
    pub fn claim_fetches(&mut self, now: Instant) -> Vec<NodeId> {
        if self.buffered_bytes >= self.config.buffer_max_bytes {
            return Vec::new();
        }
        // One pass over the partitions; each broker is decided once (a few of them,
        // in small lists), not looked up in the maps once per partition.
        let mut nodes: Vec<NodeId> = Vec::new();
        let mut busy: Vec<NodeId> = Vec::new();
        let mut retries = false;
        for s in self.partitions.values() {
            retries |= s.retry_at.is_some();
            let Some(leader) = s.leader else {
                continue;
            };
            if nodes.contains(&leader) || busy.contains(&leader) || !self.fetchable(now, s) {
                continue;
            }
            if self.fetching.contains_key(&leader)
                || self.node_retry_at.get(&leader).is_some_and(|t| now < *t)
            {
                busy.push(leader);
            } else {
                nodes.push(leader);
            }
        }
        nodes.sort_unstable();
        self.retries_maybe = retries;
        self.deferred_until = None;
        nodes.retain(|node| match self.deferred(now, *node) {
            Some(until) => {
                self.deferred_until = Some(self.deferred_until.map_or(until, |d| d.min(until)));
                false
            }
            None => true,
        });
        for node in &nodes {
            self.fetching.insert(
                *node,
                InFlightFetch {
                    version: None,
                    partitions: Vec::new(),
                    session_sent: (0, -1),
                },
            );
        }
        nodes
    }

    /// Builds the Fetch for a claimed broker at the highest version up to
    /// `max_version` that can name its topics (v13+ needs topic ids). `None` releases
    /// the claim: nothing is left to fetch there.
    pub fn build_fetch(
        &mut self,
        now: Instant,
        node: NodeId,
        max_version: i16,
    ) -> Option<(FetchRequest, FetchToken)> {
        if !self.fetching.contains_key(&node) {
            return None;
        }
        let room = self
            .config
            .buffer_max_bytes
            .saturating_sub(self.buffered_bytes);
        let mut wanted: SentList = Vec::new();
        for (tp, s) in &self.partitions {
            if s.leader != Some(node) || !self.fetchable(now, s) {
                continue;
            }
            let Position::At { offset, .. } = s.position else {
                continue;
            };
            wanted.push((
                s.topic.clone(),
                tp.partition,
                SentPartition {
                    offset,
                    max_bytes: self.config.partition_max_bytes,
                    leader_epoch: s.leader_epoch,
                    topic_id: s.topic_id,
                },
            ));
        }
        if wanted.is_empty() || room == 0 {
            self.fetching.remove(&node);
            return None;
        }
        let version = if wanted.iter().any(|(_, _, p)| p.topic_id.is_nil()) {
            max_version.min(12)
        } else {
            max_version
        };
        let use_session = self.config.sessions && version >= 7;
        let session = self.sessions.entry(node).or_default();
        // A session's topic naming is fixed by its version: start a new one if a topic
        // lost its id.
        let target = target_ref;
        let (session_id, session_epoch, mut send, forgotten) = if use_session && session.id != 0 {
            let send: Vec<TargetRef<'_>> = wanted
                .iter()
                .filter(|(t, partition, p)| {
                    sent_find(&session.partitions, t, *partition) != Some(p)
                })
                .map(target)
                .collect();
            let forgotten: Vec<TargetRef<'_>> = session
                .partitions
                .iter()
                .filter(|(t, partition, _)| sent_find(&wanted, t, *partition).is_none())
                .map(target)
                .collect();
            (session.id, session.epoch, send, forgotten)
        } else {
            // A full fetch; epoch 0 asks the broker for a new session, -1 for none.
            let epoch = if use_session { 0 } else { -1 };
            (0, epoch, wanted.iter().map(target).collect(), Vec::new())
        };
        let params = FetchParams {
            max_bytes: self
                .config
                .params
                .max_bytes
                .min(i32::try_from(room).unwrap_or(i32::MAX)),
            ..self.config.params
        };
        if !send.is_empty() {
            let turn = self.rotation % send.len();
            send.rotate_left(turn);
            self.rotation = self.rotation.wrapping_add(1);
        }
        let built = fetch_request_refs(version, &params, &send).map(|mut request| {
            if version >= 7 {
                request.session_id = session_id;
                request.session_epoch = session_epoch;
                request.forgotten_topics_data = forgotten_topics_refs(version, &forgotten);
            }
            request
        });
        let Ok(request) = built else {
            self.fetching.remove(&node);
            return None;
        };
        if let Some(f) = self.fetching.get_mut(&node) {
            f.version = Some(version);
            f.partitions = wanted;
            f.session_sent = (session_id, session_epoch);
        }
        Some((request, FetchToken { node, version }))
    }

    /// A Fetch failed without a response (disconnect, timeout, undecodable answer):
    /// the session is dropped and the broker backs off.
    pub fn handle_fetch_failure(&mut self, now: Instant, node: NodeId) {
        self.fetching.remove(&node);
        self.sessions.remove(&node);
        let at = self.node_backoff(now, node);
        self.node_retry_at.insert(node, at);
        self.need_metadata();
    }

    /// When `node` may be fetched from again after one more failure in a row.
    fn node_backoff(&mut self, now: Instant, node: NodeId) -> Instant {
        let failures = self.node_failures.entry(node).or_insert(0);
        *failures += 1;
        now + self.backoff.delay(*failures)
    }

    /// Takes a Fetch response.
    pub fn handle_fetch(&mut self, now: Instant, token: FetchToken, response: FetchResponse) {
        let Some(inflight) = self.fetching.remove(&token.node) else {
            return;
        };
        if inflight.version != Some(token.version) {
            return;
        }
        self.node_retry_at.remove(&token.node);
        let node = token.node;
        let failures = self.node_failures.remove(&node);
        let error = response.error_code;
        if error != 0 {
            // FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR
            // and anything else at the top level: start over with a full fetch.
            debug!(node = node.0, error = %error_name(error), "fetch failed; the session is reset");
            self.sessions.remove(&node);
            let session_error = matches!(
                ResponseError::try_from_code(error),
                Some(
                    ResponseError::FetchSessionIdNotFound
                        | ResponseError::InvalidFetchSessionEpoch
                        | ResponseError::FetchSessionTopicIdError
                )
            );
            if !session_error {
                // Still failing: the step goes on from where it was.
                if let Some(failures) = failures {
                    self.node_failures.insert(node, failures);
                }
                let at = self.node_backoff(now, node);
                self.node_retry_at.insert(node, at);
            }
            return;
        }
        // Topic ids of the fetch, one entry per topic (its partitions are together).
        let mut names: Vec<(Uuid, &Arc<str>)> = Vec::new();
        if token.version >= 13 {
            for (topic, _, sent) in &inflight.partitions {
                if !sent.topic_id.is_nil()
                    && names.last().is_none_or(|(id, _)| *id != sent.topic_id)
                {
                    names.push((sent.topic_id, topic));
                }
            }
            names.sort_unstable_by_key(|(id, _)| *id);
        }
        // The whole response stays in memory while any of its partitions' data waits
        // (the records are slices of it), so it is charged to the buffer as one.
        let charge = self.next_charge;
        self.next_charge += 1;
        let before = self.completed.len();
        let mut bytes = 0;
        for topic in response.responses {
            let name: String = if token.version >= 13 {
                match names.binary_search_by_key(&topic.topic_id, |(id, _)| *id) {
                    Ok(i) => names
                        .get(i)
                        .map_or_else(String::new, |(_, n)| n.to_string()),
                    Err(_) => continue,
                }
            } else {
                topic.topic.0.to_string()
            };
            // The partitions this fetch sent of the topic: a partition is then found by
            // its index, without comparing names.
            let sent = sent_of_topic(&inflight.partitions, &name);
            let mut parts: Vec<Option<PartitionData>> =
                topic.partitions.into_iter().map(Some).collect();
            let slow = self.take_quiet_partitions(&name, sent, &parts);
            // One key per topic, its partition set per entry: no name is allocated per
            // partition.
            let mut key = TopicPartition {
                topic: name,
                partition: 0,
            };
            for i in slow {
                let Some(p) = parts.get_mut(i).and_then(Option::take) else {
                    continue;
                };
                let Some(sent) = sent_in(sent, p.partition_index) else {
                    continue;
                };
                key.partition = p.partition_index;
                bytes += self.on_partition(now, &key, sent.offset, p, charge);
            }
        }
        let parts = self.completed.len() - before;
        if parts > 0 {
            self.buffered_bytes += bytes;
            self.charges.insert(charge, (bytes, parts));
        }
        // The session moves on only when the request succeeded.
        if self.config.sessions && token.version >= 7 {
            let (sent_id, sent_epoch) = inflight.session_sent;
            let session = self.sessions.entry(node).or_default();
            if sent_id == 0 {
                session.id = response.session_id;
                session.epoch = 1;
            } else {
                session.epoch = if sent_epoch == i32::MAX {
                    1
                } else {
                    sent_epoch + 1
                };
            }
            session.partitions = if session.id != 0 {
                inflight.partitions
            } else {
                Vec::new()
            };
        }
    }

    /// Takes the partitions of one topic of a response that carry neither records nor
    /// an error (most of a large fetch: a broker returns data for some partitions
    /// and an empty entry for every other one), in one ordered walk over the topic's
    /// partitions instead of a lookup by name each. What they change is what
    /// [`Fetcher::on_partition`] would: the watermarks, and the retry cleared, where
    /// the position is still the one fetched from. Returns the indices of the others,
    /// in response order, for [`Fetcher::on_partition`].
    fn take_quiet_partitions(
        &mut self,
        topic: &str,
        sent: &[(Arc<str>, i32, SentPartition)],
        parts: &[Option<PartitionData>],
    ) -> Vec<usize> {
        let mut quiet: Vec<(i32, usize)> = Vec::new();
        let mut slow: Vec<usize> = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let Some(p) = p else {
                continue;
            };
            let empty = p.records.as_ref().is_none_or(|r| r.is_empty());
            if p.error_code == 0 && empty {
                quiet.push((p.partition_index, i));
            } else {
                slow.push(i);
            }
        }
        if quiet.is_empty() {
            return slow;
        }
        quiet.sort_unstable();
        let from = TopicPartition {
            topic: topic.to_string(),
            partition: i32::MIN,
        };
        let mut states = self
            .partitions
            .range_mut(from..)
            .take_while(|(tp, _)| tp.topic == topic)
            .peekable();
        for (partition, i) in quiet {
            while states.next_if(|(tp, _)| tp.partition < partition).is_some() {}
            let Some((tp, s)) = states.next_if(|(tp, _)| tp.partition == partition) else {
                continue;
            };
            let (Some(Some(p)), Some(sent)) = (parts.get(i), sent_in(sent, partition)) else {
                continue;
            };
            if !matches!(s.position, Position::At { offset, .. } if offset == sent.offset) {
                // The position moved (seek, reset) while the fetch was out.
                continue;
            }
            tracing::trace!(%tp, fetch_offset = sent.offset, high_watermark = p.high_watermark, log_start = p.log_start_offset, "fetched partition: no records");
            s.high_watermark = p.high_watermark;
            s.last_stable_offset = p.last_stable_offset;
            s.log_start_offset = p.log_start_offset;
            s.retry_at = None;
            s.failures = 0;
        }
        slow
    }

    /// Takes one partition of a response; returns the bytes it left in the buffer.
    fn on_partition(
        &mut self,
        now: Instant,
        tp: &TopicPartition,
        fetch_offset: i64,
        p: PartitionData,
        charge: u64,
    ) -> usize {
        let isolation = self.config.params.isolation;
        let options = self.config.batch;
        let Some(s) = self.partitions.get_mut(tp) else {
            return 0;
        };
        if !matches!(s.position, Position::At { offset, .. } if offset == fetch_offset) {
            // The position moved (seek, reset) while the fetch was out.
            return 0;
        }
        let code = p.error_code;
        tracing::trace!(%tp, fetch_offset, error = %error_name(code), high_watermark = p.high_watermark, log_start = p.log_start_offset, bytes = p.records.as_ref().map_or(0, |r| r.len()), "fetched partition");
        if code == 0 {
            s.high_watermark = p.high_watermark;
            s.last_stable_offset = p.last_stable_offset;
            s.log_start_offset = p.log_start_offset;
            s.retry_at = None;
            s.failures = 0;
            let records = p.records.unwrap_or_default();
            if records.is_empty() || s.buffered.is_some() {
                return 0;
            }
            s.buffered = Some(now);
            let filter = (isolation == IsolationLevel::ReadCommitted).then(|| {
                CommittedFilter::new(
                    p.aborted_transactions
                        .unwrap_or_default()
                        .into_iter()
                        .map(|a| (a.producer_id.0, a.first_offset))
                        .collect(),
                )
                .with_markers(control_markers(&records))
            });
            let counted = records.len();
            self.completed.push_back(Completed {
                tp: tp.clone(),
                topic: s.topic.clone(),
                batches: Batches::new(records, options),
                charge,
                filter,
                records: VecDeque::new(),
                pending_error: None,
                batch_epoch: -1,
                batch_end: fetch_offset,
            });
            return counted;
        }
        s.failures += 1;
        let retry_at = now + self.backoff.delay(s.failures);
        match ResponseError::try_from_code(code) {
            Some(ResponseError::OffsetOutOfRange) => {
                debug!(%tp, offset = fetch_offset, "offset out of range");
                let position = self.reset_position(
                    tp,
                    ResetReason::OutOfRange {
                        offset: fetch_offset,
                    },
                );
                if let Some(s) = self.partitions.get_mut(tp) {
                    s.set_position(self.round, position);
                }
            }
            _ if needs_metadata_refresh(code)
                || code == ResponseError::ReplicaNotAvailable.code()
                || code == ResponseError::OffsetNotAvailable.code() =>
            {
                debug!(%tp, error = %error_name(code), "fetch: leadership changed; refreshing metadata");
                s.leader = None;
                s.retry_at = Some(retry_at);
                self.retries_maybe = true;
                self.need_metadata();
            }
            Some(
                ResponseError::TopicAuthorizationFailed
                | ResponseError::CorruptMessage
                | ResponseError::UnsupportedCompressionType,
            ) => {
                s.set_position(self.round, Position::Stopped(Some((fetch_offset, -1))));
                self.stop(FetchError::Broker {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    api: "Fetch",
                    code,
                });
            }
            _ => {
                warn!(%tp, error = %error_name(code), "fetch error; retrying after a backoff");
                s.retry_at = Some(retry_at);
                self.retries_maybe = true;
            }
        }
        0
    }

    // ----- offset resets -----

    /// Brokers that have partitions to reset, claimed: follow with
    /// [`Fetcher::build_list_offsets`], then the response or the failure.
    pub fn resets_due(&mut self, now: Instant) -> Vec<NodeId> {
        if !self.resets_maybe {
            return Vec::new();
        }
        let mut nodes = BTreeSet::new();
        let mut unknown = false;
        let mut any = false;
        for s in self.partitions.values() {
            if let Position::NeedsReset(_) = s.position {
                any = true;
                if s.retry_at.is_some_and(|t| now < t) {
                    continue;
                }
                match s.leader {
                    Some(l) if !self.resetting.contains(&l) => {
                        nodes.insert(l);
                    }
                    Some(_) => {}
                    None => unknown = true,
                }
            }
        }
        self.resets_maybe = any;
        if unknown {
            self.need_metadata();
        }
        self.resetting.extend(nodes.iter().copied());
        nodes.into_iter().collect()
    }

    /// The ListOffsets for partitions led by `node` that need a reset, at `version`
    /// (1 or later). Marks them as resetting.
    pub fn build_list_offsets(
        &mut self,
        now: Instant,
        node: NodeId,
        version: i16,
    ) -> Option<ListOffsetsRequest> {
        let timestamp = match self.config.reset {
            OffsetReset::Earliest => -2,
            _ => -1,
        };
        let mut by_topic: BTreeMap<String, Vec<ListOffsetsPartition>> = BTreeMap::new();
        for (tp, s) in &mut self.partitions {
            let Position::NeedsReset(reason) = s.position else {
                continue;
            };
            if s.leader != Some(node) || s.retry_at.is_some_and(|t| now < t) {
                continue;
            }
            s.set_position(self.round, Position::Resetting(node, reason));
            let mut p = ListOffsetsPartition::default()
                .with_partition_index(tp.partition)
                .with_timestamp(timestamp);
            if version >= 4 {
                p.current_leader_epoch = s.leader_epoch;
            }
            by_topic.entry(tp.topic.clone()).or_default().push(p);
        }
        if by_topic.is_empty() {
            self.resetting.remove(&node);
            return None;
        }
        let mut request = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(
                by_topic
                    .into_iter()
                    .map(|(name, partitions)| {
                        ListOffsetsTopic::default()
                            .with_name(TopicName(StrBytes::from_string(name)))
                            .with_partitions(partitions)
                    })
                    .collect(),
            );
        if version >= 2 {
            request.isolation_level = match self.config.params.isolation {
                IsolationLevel::ReadUncommitted => 0,
                IsolationLevel::ReadCommitted => 1,
            };
        }
        Some(request)
    }

    /// A ListOffsets to `node` failed: its partitions retry after a backoff.
    pub fn handle_list_offsets_failure(&mut self, now: Instant, node: NodeId) {
        self.resetting.remove(&node);
        for s in self.partitions.values_mut() {
            if let Position::Resetting(n, reason) = s.position {
                if n == node {
                    s.set_position(self.round, Position::NeedsReset(reason));
                    s.failures += 1;
                    s.retry_at = Some(now + self.backoff.delay(s.failures));
                    self.resets_maybe = true;
                    self.retries_maybe = true;
                }
            }
        }
        self.need_metadata();
    }

    /// Takes a ListOffsets response from `node`.
    pub fn handle_list_offsets(
        &mut self,
        now: Instant,
        node: NodeId,
        response: ListOffsetsResponse,
    ) {
        self.resetting.remove(&node);
        let mut answered = BTreeSet::new();
        for topic in response.topics {
            let name = topic.name.0.to_string();
            for p in topic.partitions {
                let tp = TopicPartition {
                    topic: name.clone(),
                    partition: p.partition_index,
                };
                let Some(s) = self.partitions.get_mut(&tp) else {
                    continue;
                };
                let Position::Resetting(n, reason) = s.position else {
                    continue;
                };
                if n != node {
                    continue;
                }
                answered.insert(tp.clone());
                if p.error_code == 0 && p.offset >= 0 {
                    s.set_position(
                        self.round,
                        Position::At {
                            offset: p.offset,
                            epoch: p.leader_epoch,
                        },
                    );
                    s.retry_at = None;
                    s.failures = 0;
                    debug!(%tp, offset = p.offset, ?reason, "position reset");
                    self.events.push_back(FetcherEvent::OffsetReset {
                        partition: tp,
                        reason,
                        offset: p.offset,
                    });
                    continue;
                }
                s.set_position(self.round, Position::NeedsReset(reason));
                s.failures += 1;
                s.retry_at = Some(now + self.backoff.delay(s.failures));
                self.resets_maybe = true;
                self.retries_maybe = true;
                if needs_metadata_refresh(p.error_code) {
                    s.leader = None;
                    self.need_metadata();
                } else if p.error_code == ResponseError::TopicAuthorizationFailed.code() {
                    s.set_position(self.round, Position::Stopped(None));
                    self.stop(FetchError::Broker {
                        topic: tp.topic.clone(),
                        partition: tp.partition,
                        api: "ListOffsets",
                        code: p.error_code,
                    });
                }
            }
        }
        // Partitions the broker did not answer for retry.
        for (tp, s) in &mut self.partitions {
            if let Position::Resetting(n, reason) = s.position {
                if n == node && !answered.contains(tp) {
                    s.set_position(self.round, Position::NeedsReset(reason));
                    s.failures += 1;
                    s.retry_at = Some(now + self.backoff.delay(s.failures));
                    self.resets_maybe = true;
                    self.retries_maybe = true;
                }
            }
        }
    }

    // ----- draining -----

    /// The next record (or error) for the application, from partitions that are not
    /// paused. `None`: nothing buffered is deliverable now.
    pub fn next_record(&mut self) -> Option<Result<ConsumerRecord, FetchError>> {
        let mut one = None;
        match self.drain(|r| {
            one = Some(r);
            true
        }) {
            Some(e) => Some(Err(e)),
            None => one.map(Ok),
        }
    }

    /// Up to `max` records (stops early at an error, which is returned after them on the
    /// next call).
    pub fn next_records(
        &mut self,
        max: usize,
        out: &mut Vec<ConsumerRecord>,
    ) -> Option<FetchError> {
        if out.len() >= max {
            return None;
        }
        // Reserved once (up to 512): growing by doubling copied the records again.
        out.reserve((max - out.len()).min(512));
        let had = !out.is_empty();
        let mut added = false;
        let error = self.drain(|r| {
            out.push(r);
            added = true;
            out.len() >= max
        })?;
        if had || added {
            // Records first: the error comes on the next call.
            self.errors.push_front(error);
            return None;
        }
        Some(error)
    }

    /// Hands records of the partitions that are not paused to `take` until it returns
    /// true (full) or nothing deliverable is left; an error ends it. Each partition's
    /// state is looked up once per run of its records, not once per record.
    fn drain(&mut self, mut take: impl FnMut(ConsumerRecord) -> bool) -> Option<FetchError> {
        if let Some(e) = self.errors.pop_front() {
            return Some(e);
        }
        let mut i = 0;
        while i < self.completed.len() {
            match self.drain_run(i, &mut take) {
                Drain::Full => return None,
                Drain::Error(e) => return Some(e),
                Drain::Paused => i += 1,
                Drain::Exhausted => self.remove_completed(i),
            }
        }
        None
    }

    fn remove_completed(&mut self, i: usize) {
        if let Some(c) = self.completed.remove(i) {
            if let Some((bytes, parts)) = self.charges.get_mut(&c.charge) {
                *parts -= 1;
                if *parts == 0 {
                    self.buffered_bytes = self.buffered_bytes.saturating_sub(*bytes);
                    self.charges.remove(&c.charge);
                }
            }
            if let Some(s) = self.partitions.get_mut(&c.tp) {
                s.buffered = None;
            }
        }
    }

    fn drop_completed(&mut self, f: impl Fn(&Completed) -> bool) {
        let mut i = 0;
        while i < self.completed.len() {
            if self.completed.get(i).is_some_and(&f) {
                self.remove_completed(i);
            } else {
                i += 1;
            }
        }
    }

    /// Hands the records of `completed[i]` to `take`, decoding its batches as it goes.
    fn drain_run(&mut self, i: usize, take: &mut impl FnMut(ConsumerRecord) -> bool) -> Drain {
        let Some(c) = self.completed.get_mut(i) else {
            return Drain::Exhausted;
        };
        let Some(s) = self.partitions.get_mut(&c.tp) else {
            return Drain::Exhausted;
        };
        if s.paused.is_some() {
            return Drain::Paused;
        }
        loop {
            let Position::At { offset, .. } = s.position else {
                return Drain::Exhausted;
            };
            if let Some(record) = c.records.pop_front() {
                let mut next = record.offset() + 1;
                if c.records.is_empty() {
                    // Compaction may leave a gap at the end of a batch.
                    next = next.max(c.batch_end);
                }
                s.set_position(
                    self.round,
                    Position::At {
                        offset: next,
                        epoch: c.batch_epoch,
                    },
                );
                if take(record) {
                    return Drain::Full;
                }
                continue;
            }
            if let Some(error) = c.pending_error.take() {
                s.set_position(self.round, Position::Stopped(Some((offset, c.batch_epoch))));
                warn!(%error, "partition stopped");
                self.events
                    .push_back(FetcherEvent::PartitionStopped(error.clone()));
                return Drain::Error(error);
            }
            let batch = match c.batches.next() {
                None => return Drain::Exhausted,
                Some(Err(source)) => {
                    let error = FetchError::Corrupt {
                        topic: c.tp.topic.clone(),
                        partition: c.tp.partition,
                        offset: source.base_offset.max(offset),
                        source,
                    };
                    s.set_position(self.round, Position::Stopped(Some((offset, c.batch_epoch))));
                    warn!(%error, "partition stopped");
                    self.events
                        .push_back(FetcherEvent::PartitionStopped(error.clone()));
                    return Drain::Error(error);
                }
                Some(Ok(batch)) => batch,
            };
            let end = batch.next_offset();
            if end <= offset {
                continue;
            }
            let admitted = c.filter.as_mut().is_none_or(|f| f.admit(&batch)) && !batch.is_control();
            if !admitted {
                // Control batches and aborted transactions are skipped, position and all.
                s.set_position(
                    self.round,
                    Position::At {
                        offset: end,
                        epoch: batch.partition_leader_epoch,
                    },
                );
                continue;
            }
            c.batch_epoch = batch.partition_leader_epoch;
            c.batch_end = end;
            let timestamp_type = if batch.is_log_append_time() {
                TimestampType::LogAppendTime
            } else {
                TimestampType::CreateTime
            };
            // The batch's records share one reference to its bytes (and its topic,
            // partition and epoch): one reference count per record.
            let shared = Shared::new(
                c.topic.clone(),
                c.tp.partition,
                batch.partition_leader_epoch,
                timestamp_type,
                batch.data().clone(),
            );
            for record in batch.records() {
                match record {
                    Ok(r) if r.offset < offset => {}
                    Ok(r) => c.records.push_back(ConsumerRecord::new(shared.clone(), &r)),
                    Err(source) => {
                        // The records before the bad one are delivered; the partition
                        // stops right after them.
                        let at = c.records.back().map_or(offset, |r| r.offset() + 1);
                        c.pending_error = Some(FetchError::Corrupt {
                            topic: c.tp.topic.clone(),
                            partition: c.tp.partition,
                            offset: at,
                            source,
                        });
                        c.batch_end = at;
                        break;
                    }
                }
            }
            if c.records.is_empty() && c.pending_error.is_none() {
                // Every record was before the position (or the batch was empty).
                s.set_position(
                    self.round,
                    Position::At {
                        offset: end,
                        epoch: batch.partition_leader_epoch,
                    },
                );
            }
        }
    }
}

/// How a run of one partition's buffered records ended.
enum Drain {
    /// The taker is full.
    Full,
    /// The partition stopped here.
    Error(FetchError),
    /// The partition is paused: its records wait.
    Paused,
    /// Nothing left of this fetched data.
    Exhausted,
}

#[cfg(test)]
mod tests {
    //! Scenario tests of the fetcher against hand-built responses. The same paths run
    //! against the mock cluster and tansu in `protocol-tests/tests/consumer.rs`.

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    use kafka_protocol::records::{
        Compression, Record as KRecord, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType as KTimestampType,
    };

    use super::*;
    use crate::proto::metadata::{LeaderEpoch, PartitionMetadata, TopicMetadata};

    const T: &str = "t";

    fn tp(p: i32) -> TopicPartition {
        TopicPartition {
            topic: T.into(),
            partition: p,
        }
    }

    fn batch(first: i64, n: i64) -> Bytes {
        let records: Vec<KRecord> = (first..first + n)
            .map(|o| KRecord {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 4,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: KTimestampType::Creation,
                offset: o,
                sequence: o as i32,
                timestamp: 1000 + o,
                key: Some(Bytes::from(format!("k{o}"))),
                value: Some(Bytes::from(format!("v{o}"))),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .expect("encode");
        buf.freeze()
    }

    fn metadata(leaders: &[(i32, i32)]) -> ClusterMetadata {
        let mut m = ClusterMetadata::default();
        m.topics.insert(
            T.into(),
            TopicMetadata {
                name: T.into(),
                id: Uuid::from_u128(7),
                internal: false,
                partitions: leaders
                    .iter()
                    .enumerate()
                    .map(|(p, &(leader, epoch))| PartitionMetadata {
                        partition: p as i32,
                        leader: Some(NodeId(leader)),
                        leader_epoch: LeaderEpoch(epoch),
                        replicas: vec![],
                        isr: vec![],
                        error: 0,
                    })
                    .collect(),
                error: 0,
            },
        );
        m
    }

    fn response(session: i32, parts: Vec<(i32, i16, Option<Bytes>)>) -> FetchResponse {
        let mut topic = FetchableTopicResponse::default();
        topic.topic = TopicName(StrBytes::from_static_str(T));
        topic.topic_id = Uuid::from_u128(7);
        topic.partitions = parts
            .into_iter()
            .map(|(p, error, records)| {
                let mut d = PartitionData::default();
                d.partition_index = p;
                d.error_code = error;
                d.high_watermark = 100;
                d.last_stable_offset = 100;
                d.records = records;
                d
            })
            .collect();
        let mut r = FetchResponse::default();
        r.session_id = session;
        r.responses = vec![topic];
        r
    }

    /// `response` with each partition's high watermark set.
    fn response_hw(session: i32, parts: Vec<(i32, Option<Bytes>, i64)>) -> FetchResponse {
        let hws: Vec<i64> = parts.iter().map(|p| p.2).collect();
        let mut r = response(
            session,
            parts.into_iter().map(|(p, b, _)| (p, 0, b)).collect(),
        );
        for (d, hw) in r.responses[0].partitions.iter_mut().zip(hws) {
            d.high_watermark = hw;
            d.last_stable_offset = hw;
        }
        r
    }

    /// A fetcher with partitions 0 and 1 led by node 1, both at offset 0.
    fn started(config: FetcherConfig) -> (Fetcher, Instant) {
        let now = Instant::now();
        let mut f = Fetcher::new(config);
        f.assign(&[tp(0), tp(1)], true);
        f.set_committed(&tp(0), 0, -1);
        f.set_committed(&tp(1), 0, -1);
        f.update_metadata(&metadata(&[(1, 5), (1, 5)]));
        (f, now)
    }

    /// The partitions of a request in the order sent.
    fn sent_in_order(r: &FetchRequest) -> Vec<(i32, i64)> {
        r.topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (p.partition, p.fetch_offset)))
            .collect()
    }

    /// The partitions of a request, sorted (requests turn their order).
    fn sent(r: &FetchRequest) -> Vec<(i32, i64)> {
        let mut v = sent_in_order(r);
        v.sort_unstable();
        v
    }

    fn drain(f: &mut Fetcher) -> Vec<(i32, i64)> {
        std::iter::from_fn(|| f.next_record())
            .map(|r| {
                let r = r.expect("a record");
                (r.partition(), r.offset())
            })
            .collect()
    }

    /// A fetcher with partitions `0..n` of `T` led by node 1, each at offset 0.
    fn started_many(n: i32) -> (Fetcher, Instant) {
        let now = Instant::now();
        let mut f = Fetcher::new(FetcherConfig::default());
        let all: Vec<TopicPartition> = (0..n).map(tp).collect();
        f.assign(&all, true);
        for p in &all {
            f.set_committed(p, 0, -1);
        }
        f.update_metadata(&metadata(&vec![(1, 5); n as usize]));
        (f, now)
    }

    #[test]
    fn a_large_response_updates_quiet_partitions_and_buffers_the_others_in_response_order() {
        // Most entries of a large fetch carry no records; they are taken in one ordered
        // walk, the rest one by one, in the order the broker sent them.
        let (mut f, now) = started_many(300);
        assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
        let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!(sent(&req).len(), 300);
        // Partition 7 was sought while the fetch was out: its entry is stale.
        f.seek(&tp(7), 3);
        let mut parts: Vec<(i32, Option<Bytes>, i64)> = (0..300)
            .rev()
            .map(|p| (p, None, 10 + i64::from(p)))
            .collect();
        parts.push((250, Some(batch(0, 2)), 2));
        parts.insert(0, (40, Some(batch(0, 3)), 3));
        parts.retain(|(p, b, _)| !(b.is_none() && (*p == 250 || *p == 40)));
        let mut response = response_hw(0, parts);
        // An error on one entry goes the slow way too.
        if let Some(d) = response.responses[0]
            .partitions
            .iter_mut()
            .find(|d| d.partition_index == 9)
        {
            d.error_code = ResponseError::UnknownServerError.code();
        }
        f.handle_fetch(now, token, response);
        assert_eq!(
            drain(&mut f),
            vec![(40, 0), (40, 1), (40, 2), (250, 0), (250, 1)]
        );
        assert_eq!(f.lag(&tp(0)), Some(10));
        assert_eq!(f.lag(&tp(299)), Some(309));
        assert_eq!(
            f.watermarks(&tp(7)),
            Some((-1, -1, -1)),
            "stale entry ignored"
        );
        assert_eq!(f.lag(&tp(9)), None, "the error left it unknown");
        assert!(f.poll_timeout().is_some(), "the failed partition retries");
    }

    #[test]
    fn leaders_are_found_in_metadata_whatever_its_order() {
        let mut f = Fetcher::new(FetcherConfig::default());
        f.assign(&[tp(0), tp(1), tp(2)], true);
        let mut m = metadata(&[(1, 5), (2, 5), (3, 5)]);
        if let Some(t) = m.topics.get_mut(T) {
            t.partitions.reverse();
        }
        f.update_metadata(&m);
        for p in 0..3 {
            f.set_committed(&tp(p), 0, -1);
        }
        let now = Instant::now();
        assert_eq!(f.claim_fetches(now), vec![NodeId(1), NodeId(2), NodeId(3)]);
    }

    #[test]
    fn resets_and_retries_are_found_after_the_passes_skip() {
        // resets_due and poll_timeout skip their passes while nothing can be due; a
        // reset or a retry set later is still found.
        let (mut f, now) = started(FetcherConfig {
            reset: OffsetReset::Earliest,
            ..FetcherConfig::default()
        });
        assert_eq!(f.resets_due(now), vec![]);
        assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
        assert_eq!(f.poll_timeout(), None);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(
            now,
            token,
            response(
                0,
                vec![
                    (0, ResponseError::OffsetOutOfRange.code(), None),
                    (1, ResponseError::UnknownServerError.code(), None),
                ],
            ),
        );
        assert!(f.poll_timeout().is_some(), "partition 1 backs off");
        assert_eq!(f.resets_due(now), vec![NodeId(1)], "partition 0 resets");
    }

    #[test]
    fn incremental_sessions_send_only_what_changed_and_forget_what_stopped() {
        let (mut f, now) = started(FetcherConfig::default());
        assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
        assert_eq!(f.claim_fetches(now), vec![], "one fetch per broker");
        let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!(
            (req.session_id, req.session_epoch),
            (0, 0),
            "full, asks for a session"
        );
        assert_eq!(sent(&req), vec![(0, 0), (1, 0)]);
        assert_eq!(
            req.topics[0].topic_id,
            Uuid::from_u128(7),
            "v16 names topics by id"
        );
        assert_eq!(req.topics[0].partitions[0].current_leader_epoch, 5);
        f.handle_fetch(
            now,
            token,
            response(55, vec![(0, 0, Some(batch(0, 3))), (1, 0, None)]),
        );
        // Partition 0 has buffered data, so the next fetch has only partition 1, which
        // the session already holds at offset 0: nothing to send, partition 0 forgotten.
        f.claim_fetches(now);
        let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!((req.session_id, req.session_epoch), (55, 1));
        assert_eq!(sent(&req), vec![]);
        assert_eq!(req.forgotten_topics_data[0].partitions, vec![0]);
        f.handle_fetch(now, token, response(55, vec![]));
        assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
        assert_eq!(f.position(&tp(0)), Some((3, 4)));
        f.claim_fetches(now);
        let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!((req.session_id, req.session_epoch), (55, 2));
        assert_eq!(
            sent(&req),
            vec![(0, 3)],
            "partition 0 comes back at its new offset"
        );
        assert!(req.forgotten_topics_data.is_empty());
    }

    #[test]
    fn a_session_error_starts_over_with_a_full_fetch() {
        let (mut f, now) = started(FetcherConfig::default());
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(now, token, response(55, vec![]));
        f.claim_fetches(now);
        let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!(req.session_id, 55);
        let mut r = response(0, vec![]);
        r.error_code = ResponseError::InvalidFetchSessionEpoch.code();
        f.handle_fetch(now, token, r);
        assert_eq!(
            f.claim_fetches(now),
            vec![NodeId(1)],
            "no backoff for a session reset"
        );
        let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!((req.session_id, req.session_epoch), (0, 0));
        assert_eq!(sent(&req), vec![(0, 0), (1, 0)]);
    }

    #[test]
    fn a_broker_without_sessions_gets_full_fetches_and_old_versions_get_names() {
        let (mut f, now) = started(FetcherConfig::default());
        f.claim_fetches(now);
        let (req, token) = f.build_fetch(now, NodeId(1), 11).expect("a fetch");
        assert_eq!(req.topics[0].topic.0.as_str(), T);
        f.handle_fetch(now, token, response(0, vec![]));
        f.claim_fetches(now);
        let (req, _) = f.build_fetch(now, NodeId(1), 11).expect("a fetch");
        assert_eq!((req.session_id, req.session_epoch), (0, 0));
        assert_eq!(
            sent(&req),
            vec![(0, 0), (1, 0)],
            "every partition, every time"
        );
    }

    #[test]
    fn paused_partitions_are_not_fetched_and_their_records_wait() {
        let (mut f, now) = after_first_fetch(response(
            0,
            vec![(0, 0, Some(batch(0, 2))), (1, 0, Some(batch(0, 2)))],
        ));
        f.pause(now, &tp(0));
        assert_eq!(drain(&mut f), vec![(1, 0), (1, 1)]);
        f.claim_fetches(now);
        let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!(
            sent(&req),
            vec![(1, 2)],
            "the paused partition is not fetched"
        );
        f.resume(&tp(0));
        assert_eq!(drain(&mut f), vec![(0, 0), (0, 1)]);
    }

    #[test]
    fn a_full_buffer_stops_fetching_until_the_application_drains_it() {
        let config = FetcherConfig {
            buffer_max_bytes: 100,
            ..Default::default()
        };
        let (mut f, now) = started(config);
        f.claim_fetches(now);
        let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!(req.max_bytes, 100, "asks for no more than the room left");
        let data = batch(0, 10);
        assert!(data.len() > 100);
        f.handle_fetch(now, token, response(0, vec![(1, 0, Some(data))]));
        assert!(f.buffered_bytes() > 100);
        assert_eq!(f.claim_fetches(now), vec![], "over the cap: no fetch");
        assert_eq!(drain(&mut f).len(), 10);
        assert_eq!(f.buffered_bytes(), 0);
        assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
    }

    #[test]
    fn out_of_range_resets_through_list_offsets_with_an_event() {
        let config = FetcherConfig {
            reset: OffsetReset::Earliest,
            ..Default::default()
        };
        let (mut f, now) = started(config);
        while f.poll_event().is_some() {}
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(
            now,
            token,
            response(0, vec![(0, ResponseError::OffsetOutOfRange.code(), None)]),
        );
        assert_eq!(f.position(&tp(0)), None, "no position until the reset");
        assert_eq!(f.resets_due(now), vec![NodeId(1)]);
        let req = f
            .build_list_offsets(now, NodeId(1), 7)
            .expect("a ListOffsets");
        let p = &req.topics[0].partitions[0];
        assert_eq!((p.partition_index, p.timestamp), (0, -2), "earliest");
        assert_eq!(f.resets_due(now), vec![], "already resetting");
        let mut part = ListOffsetsPartitionResponse::default();
        part.partition_index = 0;
        part.offset = 40;
        part.leader_epoch = 5;
        let mut topic = ListOffsetsTopicResponse::default();
        topic.name = TopicName(StrBytes::from_static_str(T));
        topic.partitions = vec![part];
        let mut resp = ListOffsetsResponse::default();
        resp.topics = vec![topic];
        f.handle_list_offsets(now, NodeId(1), resp);
        assert_eq!(f.position(&tp(0)), Some((40, 5)));
        assert_eq!(
            f.poll_event(),
            Some(FetcherEvent::OffsetReset {
                partition: tp(0),
                reason: ResetReason::OutOfRange { offset: 0 },
                offset: 40
            })
        );
    }

    #[test]
    fn out_of_range_with_reset_none_stops_the_partition_with_an_error() {
        let config = FetcherConfig {
            reset: OffsetReset::None,
            ..Default::default()
        };
        let (mut f, now) = started(config);
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(
            now,
            token,
            response(
                0,
                vec![
                    (0, ResponseError::OffsetOutOfRange.code(), None),
                    (1, 0, Some(batch(0, 1))),
                ],
            ),
        );
        assert!(matches!(
            f.next_record(),
            Some(Err(FetchError::OutOfRange {
                partition: 0,
                offset: 0,
                ..
            }))
        ));
        assert_eq!(drain(&mut f), vec![(1, 0)], "other partitions go on");
        f.claim_fetches(now);
        let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        assert_eq!(
            sent(&req),
            vec![(1, 1)],
            "the stopped partition is not fetched"
        );
        f.seek(&tp(0), 0);
        assert_eq!(f.position(&tp(0)), Some((0, -1)), "a seek restarts it");
    }

    #[test]
    fn leadership_errors_refresh_metadata_and_fetch_from_the_new_leader() {
        let (mut f, now) = started(FetcherConfig::default());
        while f.poll_event().is_some() {}
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(
            now,
            token,
            response(
                0,
                vec![
                    (0, ResponseError::NotLeaderOrFollower.code(), None),
                    (1, 0, None),
                ],
            ),
        );
        assert_eq!(f.poll_event(), Some(FetcherEvent::MetadataNeeded));
        f.update_metadata(&metadata(&[(2, 6), (1, 5)]));
        let later = now + Duration::from_secs(1);
        assert_eq!(f.claim_fetches(later), vec![NodeId(1), NodeId(2)]);
        let (req, _) = f.build_fetch(later, NodeId(2), 16).expect("a fetch");
        assert_eq!(sent(&req), vec![(0, 0)]);
        assert_eq!(req.topics[0].partitions[0].current_leader_epoch, 6);
        // Stale metadata (an older epoch) does not move the leader back.
        f.update_metadata(&metadata(&[(1, 5), (1, 5)]));
        f.handle_fetch_failure(later, NodeId(2));
        let (req, _) = {
            f.fetching.remove(&NodeId(1));
            let later = later + Duration::from_secs(1);
            f.claim_fetches(later);
            f.build_fetch(later, NodeId(2), 16).expect("still node 2")
        };
        assert_eq!(sent(&req), vec![(0, 0)]);
    }

    #[test]
    fn a_broker_failing_again_and_again_is_fetched_from_after_a_doubling_backoff() {
        // A flat `retry.backoff.ms` after each failed Fetch; now it doubles with each
        // failure in a row up to `retry.backoff.max.ms` (KIP-580), and an answer resets
        // it.
        let (mut f, now) = started(FetcherConfig::default());
        let mut at = now;
        let mut waits = Vec::new();
        for _ in 0..5 {
            assert_eq!(f.claim_fetches(at), vec![NodeId(1)]);
            f.build_fetch(at, NodeId(1), 16).expect("a fetch");
            f.handle_fetch_failure(at, NodeId(1));
            let again = f.poll_timeout().expect("the broker's backoff is timed");
            assert_eq!(f.claim_fetches(again - Duration::from_millis(1)), vec![]);
            waits.push((again - at).as_millis() as u64);
            at = again;
        }
        for (w, nominal) in waits.iter().zip([100u64, 200, 400, 800, 1000]) {
            assert!(*w >= nominal * 8 / 10 && *w <= 1000, "{waits:?}");
        }
        assert!(waits[0] < waits[1] && waits[1] < waits[2], "{waits:?}");
        // An answer resets the step.
        assert_eq!(f.claim_fetches(at), vec![NodeId(1)]);
        let (_, token) = f.build_fetch(at, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(at, token, response(0, vec![(0, 0, None), (1, 0, None)]));
        assert_eq!(f.claim_fetches(at), vec![NodeId(1)]);
        f.build_fetch(at, NodeId(1), 16).expect("a fetch");
        f.handle_fetch_failure(at, NodeId(1));
        let again = f.poll_timeout().expect("timed");
        assert!(
            (again - at) < Duration::from_millis(121),
            "{:?}",
            again - at
        );
    }

    #[test]
    fn consumed_positions_are_those_of_the_last_poll() {
        // What a commit reads: everything delivered before the application came back
        // (mark_consumed), never the record it holds now.
        let (mut f, now) = after_first_fetch(response_hw(
            55,
            vec![(0, Some(batch(0, 3)), 3), (1, None, 0)],
        ));
        let at = |f: &Fetcher| f.consumed(Some(&[tp(0)]));
        assert_eq!(
            at(&f),
            vec![(tp(0), 0, -1)],
            "the committed offset, at once"
        );
        assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(0)));
        assert_eq!(
            at(&f),
            vec![(tp(0), 0, -1)],
            "record 0 is in the application's hands"
        );
        f.mark_consumed();
        assert_eq!(at(&f), vec![(tp(0), 1, 4)]);
        assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(1)));
        assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(2)));
        assert_eq!(at(&f), vec![(tp(0), 1, 4)], "two more in hand, one poll");
        f.mark_consumed();
        f.mark_consumed();
        assert_eq!(
            at(&f),
            vec![(tp(0), 3, 4)],
            "rounds without records keep it"
        );
        // A seek counts from the next poll, as a delivery does.
        f.seek(&tp(0), 1);
        assert_eq!(at(&f), vec![(tp(0), 3, 4)]);
        f.mark_consumed();
        assert_eq!(at(&f), vec![(tp(0), 1, -1)]);
        assert_eq!(
            f.consumed(None),
            vec![(tp(0), 1, -1), (tp(1), 0, -1)],
            "every partition with a position"
        );
        let _ = now;
    }

    #[test]
    fn a_batch_of_records_ends_before_the_error_which_comes_next() {
        // next_records hands out the good records and keeps the error for the next
        // call, also when `out` held records before the call.
        let corrupt_after_two = || {
            let (mut f, now) = started(FetcherConfig::default());
            f.claim_fetches(now);
            let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
            let mut bad = batch(2, 2).to_vec();
            let last = bad.len() - 1;
            bad[last] ^= 0x40;
            let mut both = batch(0, 2).to_vec();
            both.extend_from_slice(&bad);
            f.handle_fetch(
                now,
                token,
                response(0, vec![(0, 0, Some(Bytes::from(both)))]),
            );
            f
        };
        let mut f = corrupt_after_two();
        let mut out = Vec::new();
        assert_eq!(f.next_records(10, &mut out), None, "records first");
        assert_eq!(out.iter().map(|r| r.offset()).collect::<Vec<_>>(), [0, 1]);
        assert!(matches!(
            f.next_records(10, &mut Vec::new()),
            Some(FetchError::Corrupt { offset: 2, .. })
        ));
        // A caller's `out` that already holds a record: the error waits too.
        let mut f = corrupt_after_two();
        let mut out = Vec::new();
        assert_eq!(f.next_records(1, &mut out), None);
        assert_eq!(f.next_records(5, &mut out), None, "out is not empty");
        assert_eq!(out.len(), 2);
        let mut fresh = Vec::new();
        assert!(matches!(
            f.next_records(5, &mut fresh),
            Some(FetchError::Corrupt { .. })
        ));
        assert!(fresh.is_empty());
    }

    #[test]
    fn a_corrupt_batch_is_a_typed_error_and_the_position_stays() {
        let (mut f, now) = started(FetcherConfig::default());
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        let good = batch(0, 2);
        let mut bad = batch(2, 2).to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        let mut both = good.to_vec();
        both.extend_from_slice(&bad);
        f.handle_fetch(
            now,
            token,
            response(0, vec![(0, 0, Some(Bytes::from(both)))]),
        );
        assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(0)));
        assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(1)));
        match f.next_record() {
            Some(Err(FetchError::Corrupt {
                topic,
                partition,
                offset,
                ..
            })) => assert_eq!((topic.as_str(), partition, offset), (T, 0, 2)),
            other => panic!("{other:?}"),
        }
        assert_eq!(f.next_record(), None);
        assert!(f.is_stopped(&tp(0)));
        assert_eq!(
            f.position(&tp(0)),
            Some((2, 4)),
            "stopped, not moved past the batch"
        );
        f.mark_consumed();
        assert_eq!(
            f.consumed(Some(&[tp(0)])),
            vec![(tp(0), 2, 4)],
            "commits stop before it"
        );
    }

    #[test]
    fn data_fetched_before_a_seek_is_dropped() {
        let (mut f, now) = started(FetcherConfig::default());
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.seek(&tp(0), 50);
        f.handle_fetch(now, token, response(0, vec![(0, 0, Some(batch(0, 2)))]));
        assert_eq!(drain(&mut f), vec![]);
        assert_eq!(f.position(&tp(0)), Some((50, -1)));
        assert_eq!(f.buffered_bytes(), 0);
    }

    #[test]
    fn records_before_the_position_in_a_batch_are_skipped() {
        let (mut f, now) = started(FetcherConfig::default());
        f.seek(&tp(0), 3);
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(now, token, response(0, vec![(0, 0, Some(batch(0, 5)))]));
        assert_eq!(drain(&mut f), vec![(0, 3), (0, 4)]);
        assert_eq!(f.lag(&tp(0)), Some(95));
    }
    /// A fetcher in session 55 whose partition 0 has records 0 to 2 waiting in the
    /// buffer (high watermark 3) and whose partition 1 is at its log end (0).
    fn buffered_and_caught_up() -> (Fetcher, Instant) {
        after_first_fetch(response_hw(
            55,
            vec![(0, Some(batch(0, 3)), 3), (1, None, 0)],
        ))
    }

    /// A fetcher from [`started`] whose first Fetch (v16) was answered with `answer`.
    fn after_first_fetch(answer: FetchResponse) -> (Fetcher, Instant) {
        let (mut f, now) = started(FetcherConfig::default());
        assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(now, token, answer);
        (f, now)
    }

    #[test]
    fn a_fetch_that_would_only_long_poll_waits_for_the_buffered_data_to_drain() {
        // The 500 ms stall: partition 0's data waits in the buffer, partition 1 is at
        // the log end. A Fetch of partition 1 alone would sit at the broker for
        // fetch.max.wait.ms, and partition 0 could not be fetched again until it came
        // back. Instead the fetch waits for partition 0 to drain and carries both.
        let (mut f, now) = buffered_and_caught_up();
        assert_eq!(
            f.claim_fetches(now),
            vec![],
            "deferred: only a long poll is possible"
        );
        let wait = Duration::from_millis(500);
        assert_eq!(
            f.poll_timeout(),
            Some(now + wait),
            "the driver wakes when the deferral ends"
        );
        assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
        let later = now + Duration::from_millis(3);
        assert_eq!(f.claim_fetches(later), vec![NodeId(1)]);
        assert_eq!(f.poll_timeout(), None);
        let (req, _) = f.build_fetch(later, NodeId(1), 16).expect("a fetch");
        assert_eq!(
            sent(&req),
            vec![(0, 3)],
            "partition 0 goes out with partition 1 (in the session)"
        );
    }

    #[test]
    fn a_deferred_fetch_goes_out_after_fetch_max_wait_even_if_nothing_drains() {
        let (mut f, now) = buffered_and_caught_up();
        assert_eq!(f.claim_fetches(now + Duration::from_millis(499)), vec![]);
        // The application stopped reading: partition 1 must not starve.
        let late = now + Duration::from_millis(500);
        assert_eq!(f.claim_fetches(late), vec![NodeId(1)]);
        let (req, _) = f.build_fetch(late, NodeId(1), 16).expect("a fetch");
        assert_eq!(
            req.forgotten_topics_data[0].partitions,
            vec![0],
            "only partition 1 is fetched"
        );
    }

    #[test]
    fn a_fetch_is_not_deferred_when_a_partition_has_data_to_get() {
        // Partition 1 lags (high watermark 10 at offset 0): the fetch returns at once.
        let (mut f, now) = after_first_fetch(response_hw(
            55,
            vec![(0, Some(batch(0, 3)), 3), (1, None, 10)],
        ));
        assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
    }

    #[test]
    fn a_paused_partition_with_buffered_data_defers_the_others_at_most_fetch_max_wait() {
        // The Processor pauses a full lane's partition while its data is still in the
        // buffer and resumes it moments later: without holding back, the caught-up
        // partitions' Fetch long-polled and the resumed one waited behind it.
        let (mut f, now) = buffered_and_caught_up();
        f.pause(now, &tp(0));
        assert_eq!(f.claim_fetches(now), vec![]);
        // A pause that lasts: partition 1 is fetched once the wait is over, and every
        // time after.
        let late = now + Duration::from_millis(500);
        assert_eq!(f.claim_fetches(late), vec![NodeId(1)]);
        let (_, token) = f.build_fetch(late, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(late, token, response_hw(55, vec![(1, None, 0)]));
        assert_eq!(f.claim_fetches(late), vec![NodeId(1)]);
    }

    #[test]
    fn a_partition_paused_with_data_to_get_defers_a_fetch_that_would_only_long_poll() {
        // The 1 KiB stall: the Processor drained partition 0 into a lane, paused it
        // (the lane was full) and resumed it a moment later. Partition 1 is at the
        // log end, so a Fetch sent meanwhile long-polled for fetch.max.wait.ms and
        // partition 0, resumed, waited behind it.
        let (mut f, now) = after_first_fetch(response_hw(
            55,
            vec![(0, Some(batch(0, 3)), 10), (1, None, 0)],
        ));
        assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
        f.pause(now, &tp(0));
        assert_eq!(f.claim_fetches(now), vec![], "only a long poll is possible");
        let wait = Duration::from_millis(500);
        assert_eq!(f.poll_timeout(), Some(now + wait));
        let later = now + Duration::from_millis(5);
        f.resume(&tp(0));
        assert_eq!(f.claim_fetches(later), vec![NodeId(1)]);
        let (req, token) = f.build_fetch(later, NodeId(1), 16).expect("a fetch");
        assert_eq!(sent(&req), vec![(0, 3)], "partition 0 goes out at once");
        f.handle_fetch(later, token, response_hw(55, vec![(0, None, 10)]));
        // A pause that lasts holds the others back once, for the wait, no longer.
        f.pause(later, &tp(0));
        assert_eq!(f.claim_fetches(later), vec![]);
        assert_eq!(f.claim_fetches(later + wait), vec![NodeId(1)]);
    }

    #[test]
    fn a_paused_partition_at_the_log_end_holds_nothing_back() {
        let (mut f, now) = after_first_fetch(response_hw(
            55,
            vec![(0, Some(batch(0, 3)), 3), (1, None, 10)],
        ));
        assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
        f.pause(now, &tp(0));
        assert_eq!(
            f.claim_fetches(now),
            vec![NodeId(1)],
            "partition 1 has data to get"
        );
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        f.handle_fetch(now, token, response_hw(55, vec![(1, None, 0)]));
        let (mut g, now) = after_first_fetch(response_hw(
            55,
            vec![(0, Some(batch(0, 3)), 3), (1, None, 0)],
        ));
        assert_eq!(drain(&mut g), vec![(0, 0), (0, 1), (0, 2)]);
        g.pause(now, &tp(0));
        assert_eq!(g.claim_fetches(now), vec![NodeId(1)], "nothing to wait for");
    }

    #[test]
    fn each_full_fetch_starts_at_another_partition() {
        // Without a session every request names every partition; a broker fills the
        // response in request order, so the first partition must change.
        let config = FetcherConfig {
            sessions: false,
            ..FetcherConfig::default()
        };
        let now = Instant::now();
        let mut f = Fetcher::new(config);
        let all = [tp(0), tp(1), tp(2)];
        f.assign(&all, true);
        for p in &all {
            f.set_committed(p, 0, -1);
        }
        f.update_metadata(&metadata(&[(1, 5), (1, 5), (1, 5)]));
        let mut firsts = Vec::new();
        for _ in 0..4 {
            assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
            let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
            let order: Vec<i32> = sent_in_order(&req).into_iter().map(|(p, _)| p).collect();
            assert_eq!(order.len(), 3);
            firsts.push(order[0]);
            f.handle_fetch(now, token, response(0, vec![]));
        }
        assert_eq!(firsts, vec![0, 1, 2, 0]);
    }
}
