//! The producer, sans-IO: records are appended to per-partition batches, batches are
//! sent one at a time per partition (so retries keep their order), every batch carries
//! the idempotent producer's id, epoch and sequence numbers, and each record ends in
//! exactly one [`Delivery`].
//!
//! The driver asks which brokers have batches ready ([`Accumulator::claim_ready`]), has
//! the accumulator build the Produce request at the negotiated version, and hands back
//! the response or the failure. Nothing here reads the clock.
//!
//! Rules kept here:
//! - At most one batch in flight per partition and one Produce in flight per broker. A
//!   retried batch is sent again byte for byte, with the same sequence numbers, so the
//!   broker drops it if the first attempt was written after all (no duplicates).
//! - Sequence numbers are assigned when a batch is first sent and never reused for
//!   other records. When a batch that used sequence numbers fails for good, the
//!   producer id is renewed before anything else is sent (a gap would make every later
//!   batch OUT_OF_ORDER_SEQUENCE_NUMBER).
//! - Buffered record bytes are capped (`buffer.memory`); [`Accumulator::append`] says
//!   when the caller must wait.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};

use super::encode::{EncodeError, OutRecord, ProducerFields, encode_batch};
use super::partitioner::{StickyPartitioner, partition_for_key};
use crate::proto::backoff::Backoff;
use crate::proto::error_name;
use crate::proto::fetch::batch::Compression;
use crate::proto::group::consumer_protocol::TopicPartition;
use crate::proto::metadata::{ClusterMetadata, NodeId};
use crate::proto::needs_metadata_refresh;

/// `acks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acks {
    /// Every in-sync replica (`all`, -1): the default.
    #[default]
    All,
    /// The leader only (1).
    Leader,
    /// No acknowledgement (0): offsets are unknown and nothing is retried. A delivery
    /// means the request was written; `Producer::flush` and `close` also wait until
    /// each broker has read what it was sent.
    None,
}

impl Acks {
    fn code(self) -> i16 {
        match self {
            Acks::All => -1,
            Acks::Leader => 1,
            Acks::None => 0,
        }
    }
}

/// Producer configuration (the Java client's names).
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// `acks` (default all).
    pub acks: Acks,
    /// `linger.ms` (default 5 ms, as in Kafka 4.0).
    pub linger: Duration,
    /// `batch.size` (default 16 KiB).
    pub batch_size: usize,
    /// `compression.type` (default none).
    pub compression: Compression,
    /// `enable.idempotence` (default on; needs `acks = all`).
    pub idempotence: bool,
    /// `buffer.memory` (default 32 MiB).
    pub buffer_memory: usize,
    /// `delivery.timeout.ms` (default 120 s).
    pub delivery_timeout: Duration,
    /// `request.timeout.ms`, sent as the Produce timeout (default 30 s).
    pub request_timeout: Duration,
    /// `retry.backoff.ms` (default 100 ms): the pause before a batch's first retry
    /// and after a first failed InitProducerId, doubling with each attempt (KIP-580).
    pub retry_backoff: Duration,
    /// `retry.backoff.max.ms` (default 1 s): the cap of that pause.
    pub retry_backoff_max: Duration,
    /// `max.request.size` (default 1 MiB): the largest record accepted.
    pub max_request_size: usize,
    /// Seed of the sticky partitioner.
    pub seed: u64,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            acks: Acks::All,
            linger: Duration::from_millis(5),
            batch_size: 16 * 1024,
            compression: Compression::None,
            idempotence: true,
            buffer_memory: 32 * 1024 * 1024,
            delivery_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(30),
            retry_backoff: crate::proto::backoff::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: crate::proto::backoff::DEFAULT_RETRY_BACKOFF_MAX,
            max_request_size: 1024 * 1024,
            seed: 0x5eed_0771a,
        }
    }
}

/// Identifies one appended record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId(pub u64);

/// Why a record was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProduceError {
    /// The broker refused the batch for good.
    #[error("{topic}/{partition}: Produce failed with {}", error_name(*code))]
    Broker {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The error code.
        code: i16,
    },
    /// `delivery.timeout.ms` passed before the record was acknowledged.
    #[error("{topic}/{partition}: not acknowledged within delivery.timeout.ms ({timeout:?})")]
    Timeout {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The record could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The producer was closed before the record was sent.
    #[error("the producer was closed before the record was sent")]
    Closed,
    /// The connection to the partition's leader fails in a way no retry fixes: TLS
    /// or SASL authentication.
    #[error(transparent)]
    Connection(crate::error::RequestError),
}

/// Why a record was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// Metadata does not know the topic (yet).
    #[error("topic {0} is not in the metadata")]
    UnknownTopic(String),
    /// The explicit partition does not exist.
    #[error("{topic} has {partitions} partitions; {partition} does not exist")]
    NoSuchPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: i32,
        /// How many there are.
        partitions: i32,
    },
    /// `buffer.memory` is full: wait for deliveries, then append again.
    #[error("buffer.memory is full")]
    BufferFull,
    /// The record is larger than `max.request.size`.
    #[error("a record of {size} bytes exceeds max.request.size ({max})")]
    RecordTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
}

/// What the accumulator asks of its driver, as the fetcher and the group member do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AccumulatorEvent {
    /// Leaders are unknown or moved: refresh metadata.
    MetadataNeeded,
}

/// The outcome of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The record.
    pub id: RecordId,
    /// Its partition.
    pub partition: TopicPartition,
    /// Its offset (-1 when unknown: `acks = 0`, or a duplicate the broker dropped), or
    /// why it was not written.
    pub result: Result<i64, ProduceError>,
    /// Its key plus value bytes.
    pub bytes: u64,
}

#[derive(Debug)]
struct Batch {
    records: Vec<OutRecord>,
    ids: Vec<RecordId>,
    bytes: usize,
    created: Instant,
    /// Set when first sent.
    base_sequence: Option<i32>,
    /// The bytes sent, kept for retries.
    encoded: Option<Bytes>,
    attempts: u32,
}

#[derive(Debug, Default)]
struct PartitionState {
    /// The batch records are appended to.
    open: Option<Batch>,
    /// Closed batches, oldest first; the head may be in flight.
    queue: VecDeque<Batch>,
    in_flight: bool,
    next_sequence: i32,
    retry_at: Option<Instant>,
}

/// The producer id and epoch (KIP-98).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProducerIdState {
    /// Idempotence is off.
    Off,
    /// An InitProducerId must be sent (once nothing is in flight), not before
    /// `retry_at` after `failures` failed ones in a row.
    Needed {
        failures: u32,
        retry_at: Option<Instant>,
    },
    /// One is in flight.
    Requested,
    /// Ready.
    Ready { id: i64, epoch: i16 },
}

/// Which request a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceToken {
    node: NodeId,
    serial: u64,
}

impl ProduceToken {
    /// The broker.
    pub fn node(&self) -> NodeId {
        self.node
    }
}

/// The producer's state. See the module docs.
#[derive(Debug)]
pub struct Accumulator {
    config: ProducerConfig,
    partitions: BTreeMap<TopicPartition, PartitionState>,
    counts: HashMap<String, i32>,
    leaders: HashMap<TopicPartition, NodeId>,
    in_flight: HashMap<NodeId, (u64, Vec<TopicPartition>)>,
    serial: u64,
    producer_id: ProducerIdState,
    sticky: StickyPartitioner,
    buffered: usize,
    next_id: u64,
    deliveries: VecDeque<Delivery>,
    metadata_needed: bool,
    events: VecDeque<AccumulatorEvent>,
    flush_requested: bool,
    /// Batches sent again (after a failed or refused attempt), ever.
    retries: u64,
    /// `retry.backoff.ms` doubling to `retry.backoff.max.ms`, jittered.
    backoff: Backoff,
    /// Failed InitProducerIds in a row before the one in flight.
    pid_failures: u32,
}

impl Accumulator {
    /// A producer with nothing buffered.
    pub fn new(config: ProducerConfig) -> Self {
        let idempotent = config.idempotence && config.acks == Acks::All;
        let backoff = Backoff::new(
            config.retry_backoff,
            config.retry_backoff_max,
            config.seed.rotate_left(17),
        );
        Self {
            backoff,
            sticky: StickyPartitioner::new(config.batch_size, config.seed),
            config,
            partitions: BTreeMap::new(),
            counts: HashMap::new(),
            leaders: HashMap::new(),
            in_flight: HashMap::new(),
            serial: 0,
            producer_id: if idempotent {
                ProducerIdState::Needed {
                    failures: 0,
                    retry_at: None,
                }
            } else {
                ProducerIdState::Off
            },
            buffered: 0,
            next_id: 0,
            deliveries: VecDeque::new(),
            metadata_needed: false,
            events: VecDeque::new(),
            flush_requested: false,
            retries: 0,
            pid_failures: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// Bytes of records not yet delivered.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered
    }

    /// Whether every appended record has its delivery.
    pub fn is_idle(&self) -> bool {
        self.partitions
            .values()
            .all(|p| p.open.is_none() && p.queue.is_empty())
    }

    /// The next delivery.
    pub fn poll_delivery(&mut self) -> Option<Delivery> {
        self.deliveries.pop_front()
    }

    /// What the driver must act on: [`AccumulatorEvent::MetadataNeeded`] (refresh, then
    /// [`Accumulator::update_metadata`], or [`Accumulator::metadata_failed`]).
    pub fn poll_event(&mut self) -> Option<AccumulatorEvent> {
        self.events.pop_front()
    }

    /// Leaders are unknown or moved: asked once until metadata comes.
    fn need_metadata(&mut self) {
        if !self.metadata_needed {
            self.metadata_needed = true;
            self.events.push_back(AccumulatorEvent::MetadataNeeded);
        }
    }

    /// The refresh asked for failed: it is asked for again.
    pub fn metadata_failed(&mut self) {
        self.metadata_needed = false;
        self.need_metadata();
    }

    /// Partition counts and leaders from fresh metadata.
    pub fn update_metadata(&mut self, metadata: &ClusterMetadata) {
        self.metadata_needed = false;
        for t in metadata.topics.values() {
            if t.error != 0 || t.partitions.is_empty() {
                continue;
            }
            self.counts.insert(
                t.name.clone(),
                i32::try_from(t.partitions.len()).unwrap_or(0),
            );
            for p in &t.partitions {
                let tp = TopicPartition::new(t.name.clone(), p.partition);
                match p.leader {
                    Some(l) => {
                        self.leaders.insert(tp, l);
                    }
                    None => {
                        self.leaders.remove(&tp);
                    }
                }
            }
        }
    }

    /// Appends a record: to `partition` if given, else by key (murmur2, as the Java
    /// client), else to the topic's sticky partition. A refused record comes back with
    /// the reason.
    // The refused record is returned by value so `send` need not clone every record
    // in case of a refusal; refusals are rare, so the large `Err` costs nothing.
    #[allow(clippy::result_large_err)]
    pub fn append(
        &mut self,
        now: Instant,
        topic: &str,
        partition: Option<i32>,
        record: OutRecord,
    ) -> Result<(RecordId, TopicPartition), (AppendError, OutRecord)> {
        let size = record.size_estimate();
        if size > self.config.max_request_size {
            let max = self.config.max_request_size;
            return Err((AppendError::RecordTooLarge { size, max }, record));
        }
        let Some(&count) = self.counts.get(topic) else {
            self.need_metadata();
            return Err((AppendError::UnknownTopic(topic.to_string()), record));
        };
        let partition = match (partition, &record.key) {
            (Some(p), _) if p < 0 || p >= count => {
                let error = AppendError::NoSuchPartition {
                    topic: topic.to_string(),
                    partition: p,
                    partitions: count,
                };
                return Err((error, record));
            }
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, count),
            (None, None) => self.sticky.partition(topic, count, size),
        };
        if self.buffered > 0 && self.buffered + size > self.config.buffer_memory {
            return Err((AppendError::BufferFull, record));
        }
        let tp = TopicPartition::new(topic, partition);
        let id = RecordId(self.next_id);
        self.next_id += 1;
        self.buffered += size;
        let batch_size = self.config.batch_size;
        let state = self.partitions.entry(tp.clone()).or_default();
        let full = state
            .open
            .as_ref()
            .is_some_and(|b| b.bytes + size > batch_size && !b.records.is_empty());
        if full {
            if let Some(b) = state.open.take() {
                state.queue.push_back(b);
            }
        }
        let batch = state.open.get_or_insert_with(|| Batch {
            records: Vec::new(),
            ids: Vec::new(),
            bytes: 0,
            created: now,
            base_sequence: None,
            encoded: None,
            attempts: 0,
        });
        batch.records.push(record);
        batch.ids.push(id);
        batch.bytes += size;
        if batch.bytes >= batch_size {
            if let Some(b) = state.open.take() {
                state.queue.push_back(b);
            }
        }
        Ok((id, tp))
    }

    /// Sends everything buffered without waiting for `linger.ms`.
    pub fn flush(&mut self) {
        self.flush_requested = true;
    }

    /// Whether an InitProducerId should be sent now (idempotence on, no id, nothing in
    /// flight, the backoff after a failed one over). Marks it requested.
    pub fn claim_producer_id(&mut self, now: Instant) -> bool {
        let ProducerIdState::Needed { failures, retry_at } = self.producer_id else {
            return false;
        };
        if !self.in_flight.is_empty() || retry_at.is_some_and(|t| now < t) {
            return false;
        }
        self.pid_failures = failures;
        self.producer_id = ProducerIdState::Requested;
        true
    }

    /// The InitProducerId answer. `Err`: asked again after `retry.backoff.ms`,
    /// doubling with each failure in a row up to `retry.backoff.max.ms` (the Java
    /// client's pace; it used to be a flat pause in the driver).
    pub fn set_producer_id(&mut self, now: Instant, result: Result<(i64, i16), ()>) {
        match result {
            Ok((id, epoch)) => {
                debug!(producer_id = id, epoch, "producer id");
                self.producer_id = ProducerIdState::Ready { id, epoch };
                // A new id starts every partition's sequence at 0; batches not yet
                // acknowledged are renumbered.
                for p in self.partitions.values_mut() {
                    p.next_sequence = 0;
                    for b in &mut p.queue {
                        b.base_sequence = None;
                        b.encoded = None;
                    }
                }
            }
            Err(()) => {
                let failures = self.pid_failures + 1;
                self.producer_id = ProducerIdState::Needed {
                    failures,
                    retry_at: Some(now + self.backoff.delay(failures)),
                };
            }
        }
    }

    fn renew_producer_id(&mut self) {
        if self.producer_id != ProducerIdState::Off {
            self.pid_failures = 0;
            warn!("a batch failed after using sequence numbers; renewing the producer id");
            self.producer_id = ProducerIdState::Needed {
                failures: 0,
                retry_at: None,
            };
        }
    }

    fn sendable(&self, now: Instant, p: &PartitionState) -> bool {
        !p.in_flight
            && p.retry_at.is_none_or(|t| now >= t)
            && (p.queue.front().is_some()
                || p.open
                    .as_ref()
                    .is_some_and(|b| self.flush_requested || now >= b.created + self.config.linger))
    }

    /// When the next batch becomes due (linger, backoff, delivery timeout): the
    /// driver calls [`Accumulator::handle_timeout`] and claims ready batches then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.partitions
            .values()
            .flat_map(|p| {
                let linger = p.open.as_ref().map(|b| b.created + self.config.linger);
                let expiry = p
                    .queue
                    .front()
                    .or(p.open.as_ref())
                    .map(|b| b.created + self.config.delivery_timeout);
                [linger, p.retry_at, expiry]
            })
            .chain([match self.producer_id {
                ProducerIdState::Needed { retry_at, .. } => retry_at,
                _ => None,
            }])
            .flatten()
            .min()
    }

    /// The time passed: fails batches waiting longer than `delivery.timeout.ms` (not
    /// those in flight: their fate is still coming).
    pub fn handle_timeout(&mut self, now: Instant) {
        let timeout = self.config.delivery_timeout;
        self.fail_waiting(
            |_, b| now >= b.created + timeout,
            |tp| ProduceError::Timeout {
                topic: tp.topic.clone(),
                partition: tp.partition,
                timeout,
            },
        );
    }

    /// The connection to `node` failed in a way no retry fixes (TLS, authentication):
    /// the waiting batches of the partitions it leads fail now with `error`, instead of
    /// at `delivery.timeout.ms`, as the Java client fails them. Batches in flight keep
    /// their fate.
    pub fn fail_node(&mut self, node: NodeId, error: &crate::error::RequestError) {
        let led: BTreeSet<TopicPartition> = self
            .leaders
            .iter()
            .filter(|(_, l)| **l == node)
            .map(|(tp, _)| tp.clone())
            .collect();
        self.fail_waiting(
            |tp, _| led.contains(tp),
            |_| ProduceError::Connection(error.clone()),
        );
    }

    /// No producer id can be had because every connection fails TLS or SASL: the
    /// waiting batches of every partition fail now with `error`.
    pub fn fail_all(&mut self, error: &crate::error::RequestError) {
        self.fail_waiting(|_, _| true, |_| ProduceError::Connection(error.clone()));
    }

    /// Fails the batches `doomed` picks, except a head batch in flight.
    fn fail_waiting(
        &mut self,
        doomed: impl Fn(&TopicPartition, &Batch) -> bool,
        error: impl Fn(&TopicPartition) -> ProduceError,
    ) {
        let mut renew = false;
        let mut failed = Vec::new();
        for (tp, p) in &mut self.partitions {
            let mut keep = VecDeque::new();
            let in_flight = p.in_flight;
            for (i, b) in std::mem::take(&mut p.queue).into_iter().enumerate() {
                if (i > 0 || !in_flight) && doomed(tp, &b) {
                    renew |= b.base_sequence.is_some();
                    failed.push((tp.clone(), b));
                } else {
                    keep.push_back(b);
                }
            }
            p.queue = keep;
            if p.open.as_ref().is_some_and(|b| doomed(tp, b)) {
                if let Some(b) = p.open.take() {
                    failed.push((tp.clone(), b));
                }
            }
        }
        for (tp, b) in failed {
            let error = error(&tp);
            self.finish(&tp, b, Err(error));
        }
        if renew {
            self.renew_producer_id();
        }
    }

    /// Brokers with a batch ready and no Produce in flight, claimed: follow with
    /// [`Accumulator::build_produce`].
    pub fn claim_ready(&mut self, now: Instant) -> Vec<NodeId> {
        if matches!(
            self.producer_id,
            ProducerIdState::Needed { .. } | ProducerIdState::Requested
        ) {
            return Vec::new();
        }
        let mut nodes = BTreeSet::new();
        let mut unknown = false;
        for (tp, p) in &self.partitions {
            if !self.sendable(now, p) {
                continue;
            }
            match self.leaders.get(tp) {
                Some(n) if !self.in_flight.contains_key(n) => {
                    nodes.insert(*n);
                }
                Some(_) => {}
                None => unknown = true,
            }
        }
        if unknown {
            self.need_metadata();
        }
        for n in &nodes {
            self.in_flight.insert(*n, (0, Vec::new()));
        }
        nodes.into_iter().collect()
    }

    /// Batches sent again after a failed or refused attempt, since the producer began
    /// (`retries` in the producer's metrics and statistics).
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// The Produce request for a claimed broker: the head batch of each of its ready
    /// partitions, up to `max.request.size`. `None` releases the claim.
    pub fn build_produce(
        &mut self,
        now: Instant,
        node: NodeId,
        version: i16,
    ) -> Option<(ProduceRequest, ProduceToken)> {
        if !self.in_flight.contains_key(&node) {
            return None;
        }
        let fields = match self.producer_id {
            ProducerIdState::Ready { id, epoch } => Some((id, epoch)),
            _ => None,
        };
        let ready: Vec<TopicPartition> = self
            .partitions
            .iter()
            .filter(|(tp, p)| self.leaders.get(*tp) == Some(&node) && self.sendable(now, p))
            .map(|(tp, _)| tp.clone())
            .collect();
        let mut by_topic: BTreeMap<String, Vec<PartitionProduceData>> = BTreeMap::new();
        let mut sent = Vec::new();
        let mut size = 0;
        let compression = self.config.compression;
        for tp in ready {
            let Some(p) = self.partitions.get_mut(&tp) else {
                continue;
            };
            if p.queue.is_empty() {
                if let Some(b) = p.open.take() {
                    p.queue.push_back(b);
                }
            }
            let next_sequence = p.next_sequence;
            let Some(batch) = p.queue.front_mut() else {
                continue;
            };
            if size > 0 && size + batch.bytes > self.config.max_request_size {
                break;
            }
            if batch.encoded.is_none() {
                let producer = match fields {
                    Some((id, epoch)) => {
                        let base = *batch.base_sequence.get_or_insert(next_sequence);
                        ProducerFields {
                            producer_id: id,
                            producer_epoch: epoch,
                            base_sequence: base,
                        }
                    }
                    None => ProducerFields::NONE,
                };
                match encode_batch(&batch.records, compression, producer) {
                    Ok(bytes) => batch.encoded = Some(bytes),
                    Err(e) => {
                        // Nothing was sent: fail the batch, keep the sequence.
                        if let Some(b) = p.queue.pop_front() {
                            self.finish(&tp, b, Err(ProduceError::Encode(e)));
                        }
                        continue;
                    }
                }
                if fields.is_some() {
                    let count = i32::try_from(batch.records.len()).unwrap_or(i32::MAX);
                    p.next_sequence = next_sequence.wrapping_add(count) & i32::MAX;
                }
            }
            batch.attempts += 1;
            if batch.attempts > 1 {
                self.retries += 1;
            }
            let encoded = batch.encoded.clone().unwrap_or_default();
            size += encoded.len();
            p.in_flight = true;
            by_topic.entry(tp.topic.clone()).or_default().push(
                PartitionProduceData::default()
                    .with_index(tp.partition)
                    .with_records(Some(encoded)),
            );
            sent.push(tp);
        }
        self.flush_requested &= !self.is_idle();
        if sent.is_empty() {
            self.in_flight.remove(&node);
            return None;
        }
        self.serial += 1;
        let serial = self.serial;
        self.in_flight.insert(node, (serial, sent));
        // v3-v12 share these fields; v13 (topic ids) is not negotiated.
        let _ = version;
        let request = ProduceRequest::default()
            .with_acks(self.config.acks.code())
            .with_timeout_ms(
                i32::try_from(self.config.request_timeout.as_millis()).unwrap_or(i32::MAX),
            )
            .with_topic_data(
                by_topic
                    .into_iter()
                    .map(|(name, partitions)| {
                        TopicProduceData::default()
                            .with_name(TopicName(StrBytes::from_string(name)))
                            .with_partition_data(partitions)
                    })
                    .collect(),
            );
        Some((request, ProduceToken { node, serial }))
    }

    /// Drops a claim that will not be built (the broker is unreachable or offers no
    /// usable Produce version); its batches wait for the next round.
    pub fn release_claim(&mut self, node: NodeId) {
        if self
            .in_flight
            .get(&node)
            .is_some_and(|(serial, _)| *serial == 0)
        {
            self.in_flight.remove(&node);
            self.need_metadata();
        }
    }

    /// An `acks = 0` Produce was written: its records are done, offsets unknown.
    pub fn handle_unacknowledged(&mut self, token: ProduceToken) {
        let Some(sent) = self.take_in_flight(token) else {
            return;
        };
        for tp in sent {
            if let Some(b) = self.pop_head(&tp) {
                self.finish(&tp, b, Ok(-1));
            }
        }
    }

    fn take_in_flight(&mut self, token: ProduceToken) -> Option<Vec<TopicPartition>> {
        match self.in_flight.get(&token.node) {
            Some((serial, _)) if *serial == token.serial => {}
            _ => return None,
        }
        let (_, sent) = self.in_flight.remove(&token.node)?;
        for tp in &sent {
            if let Some(p) = self.partitions.get_mut(tp) {
                p.in_flight = false;
            }
        }
        Some(sent)
    }

    /// Holds `tp`'s head batch back after a failed attempt: `retry.backoff.ms` after
    /// its first, doubling with each one up to `retry.backoff.max.ms` (KIP-580; Java's
    /// `RecordAccumulator` paces a batch by its own attempts).
    fn retry_later(&mut self, now: Instant, tp: &TopicPartition) {
        let Some(p) = self.partitions.get_mut(tp) else {
            return;
        };
        let attempts = p.queue.front().map_or(1, |b| b.attempts.max(1));
        p.retry_at = Some(now + self.backoff.delay(attempts));
    }

    fn pop_head(&mut self, tp: &TopicPartition) -> Option<Batch> {
        self.partitions.get_mut(tp)?.queue.pop_front()
    }

    /// The Produce failed without an answer (disconnect, timeout): every batch in it
    /// is sent again, unchanged, after a backoff.
    pub fn handle_failure(&mut self, now: Instant, token: ProduceToken) {
        let Some(sent) = self.take_in_flight(token) else {
            return;
        };
        for tp in sent {
            self.retry_later(now, &tp);
        }
        self.need_metadata();
    }

    /// Takes a Produce response.
    pub fn handle_produce(&mut self, now: Instant, token: ProduceToken, response: ProduceResponse) {
        let Some(sent) = self.take_in_flight(token) else {
            return;
        };
        let mut answers: HashMap<TopicPartition, (i16, i64)> = HashMap::new();
        for t in response.responses {
            for p in t.partition_responses {
                answers.insert(
                    TopicPartition::new(t.name.0.to_string(), p.index),
                    (p.error_code, p.base_offset),
                );
            }
        }
        for tp in sent {
            // A partition missing from the answer is retried like a lost request.
            let (code, base) = answers
                .get(&tp)
                .copied()
                .unwrap_or((ResponseError::NetworkException.code(), -1));
            let error = ResponseError::try_from_code(code);
            match error {
                None => {
                    if let Some(b) = self.pop_head(&tp) {
                        self.finish_ok(&tp, b, base);
                    }
                }
                Some(ResponseError::DuplicateSequenceNumber) => {
                    // Written by an earlier attempt; the broker no longer knows where.
                    if let Some(b) = self.pop_head(&tp) {
                        self.finish(&tp, b, Ok(-1));
                    }
                }
                Some(
                    ResponseError::OutOfOrderSequenceNumber
                    | ResponseError::UnknownProducerId
                    | ResponseError::InvalidProducerEpoch,
                ) => {
                    // The broker lost or refused this producer's state: renumber the
                    // batch under a new producer id and send it again.
                    warn!(%tp, error = %error_name(code), "produce: sequence state lost; renewing the producer id");
                    self.renew_producer_id();
                    self.retry_later(now, &tp);
                }
                Some(e) if e.is_retriable() || needs_metadata_refresh(code) => {
                    debug!(%tp, error = %error_name(code), "produce: retrying");
                    if needs_metadata_refresh(code) {
                        self.need_metadata();
                    }
                    self.retry_later(now, &tp);
                }
                Some(_) => {
                    warn!(%tp, error = %error_name(code), "produce: batch refused");
                    if let Some(b) = self.pop_head(&tp) {
                        let used_sequences = b.base_sequence.is_some();
                        let error = ProduceError::Broker {
                            topic: tp.topic.clone(),
                            partition: tp.partition,
                            code,
                        };
                        self.finish(&tp, b, Err(error));
                        if used_sequences {
                            self.renew_producer_id();
                        }
                    }
                }
            }
        }
    }

    fn finish_ok(&mut self, tp: &TopicPartition, b: Batch, base: i64) {
        self.buffered = self.buffered.saturating_sub(b.bytes);
        for (i, id) in b.ids.into_iter().enumerate() {
            let bytes = b.records.get(i).map_or(0, OutRecord::payload_bytes);
            // A base offset the broker cannot have written (negative, or so large that
            // a later record would pass i64::MAX) is reported as unknown (-1).
            let offset = i64::try_from(i)
                .ok()
                .filter(|_| base >= 0)
                .and_then(|i| base.checked_add(i))
                .unwrap_or(-1);
            self.deliveries.push_back(Delivery {
                id,
                partition: tp.clone(),
                result: Ok(offset),
                bytes,
            });
        }
    }

    fn finish(&mut self, tp: &TopicPartition, b: Batch, result: Result<i64, ProduceError>) {
        self.buffered = self.buffered.saturating_sub(b.bytes);
        for (i, id) in b.ids.into_iter().enumerate() {
            self.deliveries.push_back(Delivery {
                id,
                partition: tp.clone(),
                result: result.clone(),
                bytes: b.records.get(i).map_or(0, OutRecord::payload_bytes),
            });
        }
    }

    /// Fails everything not yet sent (the producer is closing without a flush).
    pub fn abort_unsent(&mut self) {
        let mut failed = Vec::new();
        for (tp, p) in &mut self.partitions {
            let skip = usize::from(p.in_flight);
            let rest: Vec<Batch> = p.queue.drain(skip.min(p.queue.len())..).collect();
            failed.extend(rest.into_iter().map(|b| (tp.clone(), b)));
            if let Some(b) = p.open.take() {
                failed.push((tp.clone(), b));
            }
        }
        for (tp, b) in failed {
            self.finish(&tp, b, Err(ProduceError::Closed));
        }
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };

    use super::*;
    use crate::proto::fetch::batch::{BatchOptions, Batches};
    use crate::proto::metadata::{LeaderEpoch, PartitionMetadata, TopicMetadata};

    fn metadata(partitions: i32) -> ClusterMetadata {
        let mut m = ClusterMetadata::default();
        m.topics.insert(
            "t".into(),
            TopicMetadata {
                name: "t".into(),
                id: uuid::Uuid::nil(),
                internal: false,
                partitions: (0..partitions)
                    .map(|p| PartitionMetadata {
                        partition: p,
                        leader: Some(NodeId(1)),
                        leader_epoch: LeaderEpoch(0),
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

    fn record(v: &str) -> OutRecord {
        OutRecord {
            timestamp: 1,
            key: None,
            value: Some(Bytes::from(v.to_string())),
            headers: vec![],
        }
    }

    fn ready(config: ProducerConfig) -> (Accumulator, Instant) {
        let now = Instant::now();
        let mut a = Accumulator::new(config);
        a.update_metadata(&metadata(2));
        assert!(a.claim_producer_id(now));
        a.set_producer_id(now, Ok((42, 3)));
        (a, now)
    }

    fn answer(error: i16, base: i64) -> ProduceResponse {
        let mut p = PartitionProduceResponse::default();
        p.index = 0;
        p.error_code = error;
        p.base_offset = base;
        let mut t = TopicProduceResponse::default();
        t.name = TopicName(StrBytes::from_static_str("t"));
        t.partition_responses = vec![p];
        let mut r = ProduceResponse::default();
        r.responses = vec![t];
        r
    }

    fn sent_batch(r: &ProduceRequest) -> (i64, i16, i32, i32) {
        let records = r.topic_data[0].partition_data[0]
            .records
            .clone()
            .unwrap_or_default();
        let b = Batches::new(records, BatchOptions::default())
            .next()
            .expect("a batch")
            .expect("valid");
        (
            b.producer_id,
            b.producer_epoch,
            b.base_sequence,
            b.record_count,
        )
    }

    #[test]
    fn metadata_is_asked_for_once_by_event_until_it_comes_or_the_refresh_fails() {
        let mut a = Accumulator::new(ProducerConfig::default());
        let now = Instant::now();
        assert!(
            a.append(now, "t", None, record("a")).is_err(),
            "unknown topic"
        );
        assert!(a.append(now, "t", None, record("b")).is_err());
        assert_eq!(a.poll_event(), Some(AccumulatorEvent::MetadataNeeded));
        assert_eq!(a.poll_event(), None, "asked once, not per record");
        a.metadata_failed();
        assert_eq!(
            a.poll_event(),
            Some(AccumulatorEvent::MetadataNeeded),
            "a failed refresh is asked for again"
        );
        a.update_metadata(&metadata(2));
        assert!(a.append(now, "t", None, record("c")).is_ok());
        assert_eq!(a.poll_event(), None);
        assert!(a.append(now, "u", None, record("d")).is_err());
        assert_eq!(a.poll_event(), Some(AccumulatorEvent::MetadataNeeded));
    }

    #[test]
    fn a_batch_failing_again_and_again_backs_off_exponentially_to_the_cap() {
        // The pause before a retry was a flat `retry.backoff.ms`; Java doubles it with
        // each attempt of the batch up to `retry.backoff.max.ms` (KIP-580).
        let (mut a, now) = ready(ProducerConfig {
            linger: Duration::ZERO,
            ..ProducerConfig::default()
        });
        a.append(now, "t", Some(0), record("r")).unwrap();
        let mut at = now;
        let mut waits = Vec::new();
        for _ in 0..6 {
            assert_eq!(a.claim_ready(at), vec![NodeId(1)]);
            let (_, token) = a.build_produce(at, NodeId(1), 9).expect("an attempt");
            a.handle_failure(at, token);
            let retry = a.poll_timeout().expect("a retry is timed");
            assert_eq!(
                a.claim_ready(retry - Duration::from_millis(1)),
                vec![],
                "not before its time"
            );
            waits.push((retry - at).as_millis() as u64);
            at = retry;
        }
        for (w, nominal) in waits.iter().zip([100u64, 200, 400, 800, 1000, 1000]) {
            assert!(*w >= nominal * 8 / 10 && *w <= 1000, "{waits:?}");
        }
        assert!(
            waits[0] < waits[1] && waits[1] < waits[2] && waits[2] < waits[3],
            "{waits:?}"
        );
    }

    #[test]
    fn a_failed_init_producer_id_is_asked_again_after_a_growing_backoff() {
        // The driver used to sleep a flat `retry.backoff.ms`; the accumulator now
        // times the next InitProducerId itself.
        let mut a = Accumulator::new(ProducerConfig::default());
        let mut at = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..4 {
            assert!(a.claim_producer_id(at));
            assert!(!a.claim_producer_id(at), "one at a time");
            a.set_producer_id(at, Err(()));
            let again = a.poll_timeout().expect("the next attempt is timed");
            assert!(!a.claim_producer_id(again - Duration::from_millis(1)));
            waits.push((again - at).as_millis() as u64);
            at = again;
        }
        for (w, nominal) in waits.iter().zip([100u64, 200, 400, 800]) {
            assert!(
                *w >= nominal * 8 / 10 && *w < nominal * 12 / 10 + 1,
                "{waits:?}"
            );
        }
        assert!(a.claim_producer_id(at));
        a.set_producer_id(at, Ok((7, 0)));
        assert_eq!(a.poll_timeout(), None, "nothing waits once the id came");
    }

    #[test]
    fn a_retried_batch_is_sent_again_with_the_same_sequence_numbers() {
        let (mut a, now) = ready(ProducerConfig::default());
        for i in 0..3 {
            a.append(now, "t", Some(0), record(&format!("r{i}")))
                .unwrap();
        }
        assert_eq!(a.claim_ready(now), vec![], "lingering");
        let later = now + Duration::from_millis(10);
        assert_eq!(a.claim_ready(later), vec![NodeId(1)]);
        let (req, token) = a.build_produce(later, NodeId(1), 9).expect("a request");
        assert_eq!(sent_batch(&req), (42, 3, 0, 3));
        assert_eq!(a.retries(), 0, "a first attempt is no retry");
        let first = req.topic_data[0].partition_data[0].records.clone();
        // More records meanwhile go to a new batch, held back behind the first.
        a.append(later, "t", Some(0), record("r3")).unwrap();
        a.handle_failure(later, token);
        let retry = later + Duration::from_secs(1);
        a.claim_ready(retry);
        let (req, token) = a.build_produce(retry, NodeId(1), 9).expect("the retry");
        assert_eq!(
            req.topic_data[0].partition_data[0].records, first,
            "byte for byte"
        );
        assert_eq!(a.retries(), 1, "counted once, for the one batch sent again");
        a.handle_produce(retry, token, answer(0, 100));
        let offsets: Vec<i64> = std::iter::from_fn(|| a.poll_delivery())
            .map(|d| d.result.unwrap())
            .collect();
        assert_eq!(offsets, vec![100, 101, 102]);
        a.claim_ready(retry);
        let (req, _) = a
            .build_produce(retry, NodeId(1), 9)
            .expect("the next batch");
        assert_eq!(
            sent_batch(&req),
            (42, 3, 3, 1),
            "sequence continues after 3 records"
        );
    }

    #[test]
    fn a_duplicate_is_success_and_lost_state_renews_the_producer_id() {
        let (mut a, now) = ready(ProducerConfig {
            linger: Duration::ZERO,
            ..Default::default()
        });
        a.append(now, "t", Some(0), record("a")).unwrap();
        a.claim_ready(now);
        let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
        a.handle_produce(
            now,
            token,
            answer(ResponseError::DuplicateSequenceNumber.code(), -1),
        );
        assert_eq!(a.poll_delivery().map(|d| d.result), Some(Ok(-1)));
        a.append(now, "t", Some(0), record("b")).unwrap();
        a.claim_ready(now);
        let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
        a.handle_produce(
            now,
            token,
            answer(ResponseError::UnknownProducerId.code(), -1),
        );
        assert!(a.poll_delivery().is_none(), "not failed: sent again");
        let later = now + Duration::from_secs(1);
        assert_eq!(
            a.claim_ready(later),
            vec![],
            "nothing goes out without a new id"
        );
        assert!(a.claim_producer_id(now));
        a.set_producer_id(now, Ok((43, 0)));
        a.claim_ready(later);
        let (req, _) = a.build_produce(later, NodeId(1), 9).unwrap();
        assert_eq!(
            sent_batch(&req),
            (43, 0, 0, 1),
            "renumbered under the new id"
        );
    }

    #[test]
    fn a_base_offset_near_i64_max_gives_unknown_offsets_not_an_overflow() {
        // Found by the `response` fuzz target: `base + i` overflowed (a panic in debug
        // builds) for a Produce answer with a base offset near i64::MAX.
        let (mut a, now) = ready(ProducerConfig {
            linger: Duration::ZERO,
            ..Default::default()
        });
        for v in ["a", "b", "c"] {
            a.append(now, "t", Some(0), record(v)).unwrap();
        }
        a.claim_ready(now);
        let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
        a.handle_produce(now, token, answer(0, i64::MAX - 1));
        let offsets: Vec<i64> = std::iter::from_fn(|| a.poll_delivery())
            .map(|d| d.result.unwrap())
            .collect();
        assert_eq!(offsets, vec![i64::MAX - 1, i64::MAX, -1]);
    }

    #[test]
    fn buffer_memory_pushes_back_and_deliveries_free_it() {
        let (mut a, now) = ready(ProducerConfig {
            buffer_memory: 1000,
            linger: Duration::ZERO,
            ..Default::default()
        });
        let big = OutRecord {
            value: Some(Bytes::from(vec![0u8; 600])),
            ..record("")
        };
        a.append(now, "t", Some(0), big.clone()).unwrap();
        assert_eq!(
            a.append(now, "t", Some(0), big.clone()).map_err(|e| e.0),
            Err(AppendError::BufferFull)
        );
        a.claim_ready(now);
        let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
        a.handle_produce(now, token, answer(0, 0));
        assert_eq!(a.buffered_bytes(), 0);
        a.append(now, "t", Some(0), big).unwrap();
    }

    #[test]
    fn keyed_records_follow_murmur2_and_explicit_partitions_win() {
        let (mut a, now) = ready(ProducerConfig::default());
        let mut keyed = record("v");
        keyed.key = Some(Bytes::from_static(b"foobar"));
        let (_, tp) = a.append(now, "t", None, keyed.clone()).unwrap();
        assert_eq!(tp.partition, partition_for_key(b"foobar", 2));
        let (_, tp) = a.append(now, "t", Some(1), keyed).unwrap();
        assert_eq!(tp.partition, 1);
        assert!(matches!(
            a.append(now, "t", Some(5), record("x")),
            Err((AppendError::NoSuchPartition { .. }, _))
        ));
        assert!(matches!(
            a.append(now, "nope", None, record("x")),
            Err((AppendError::UnknownTopic(_), _))
        ));
    }

    #[test]
    fn an_expired_batch_fails_with_a_timeout() {
        let (mut a, now) = ready(ProducerConfig {
            delivery_timeout: Duration::from_secs(1),
            ..Default::default()
        });
        a.append(now, "t", Some(0), record("a")).unwrap();
        a.handle_timeout(now + Duration::from_secs(2));
        assert!(matches!(
            a.poll_delivery().map(|d| d.result),
            Some(Err(ProduceError::Timeout { .. }))
        ));
        assert!(a.is_idle());
    }
}
