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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use super::encode::OutRecord;
use super::partitioner::{Placement, StickyPartitioner};
use crate::backoff::Backoff;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::{ClusterMetadata, NodeId};

mod fail;
mod producer_id;
mod response;
mod send;
mod state;
mod types;

use state::{Batch, PartitionState, ProducerIdState};
pub use types::{
    AccumulatorEvent, Acks, AppendError, ConnectionFailure, Delivery, ProduceError, ProduceToken,
    ProducerConfig, RecordId,
};

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
    /// `transactional.id` is set: the transaction manager owns the producer id.
    transactional: bool,
}

impl Accumulator {
    /// A producer with nothing buffered.
    pub fn new(config: ProducerConfig) -> Self {
        let transactional = config.transactional_id.is_some();
        let idempotent = transactional || (config.idempotence && config.acks == Acks::All);
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
            transactional,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// Whether the transaction manager owns the producer id (`transactional.id`).
    pub fn is_transactional(&self) -> bool {
        self.transactional
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

    /// Appends a record: to `partition` if given, else where the custom partitioner
    /// puts it, else where the built-in `partitioner` does (by default murmur2 of the
    /// key, as the Java client; without a key the topic's sticky partition). A refused
    /// record comes back with the reason.
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
        let key = record.key.as_deref().filter(|_| !self.config.ignore_keys);
        let partition = match partition {
            Some(p) => p,
            None => {
                let custom = (self.config.custom_partitioner.as_ref())
                    .and_then(|c| c.partition(topic, key, count));
                match custom {
                    Some(p) => p,
                    None => match self.config.partitioner.place(key, count) {
                        Placement::Partition(p) => p,
                        Placement::Sticky => self.sticky.partition(topic, count, size),
                        Placement::Random => self.sticky.random(count),
                    },
                }
            }
        };
        if partition < 0 || partition >= count {
            let error = AppendError::NoSuchPartition {
                topic: topic.to_string(),
                partition,
                partitions: count,
            };
            return Err((error, record));
        }
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

    /// When the next batch becomes due (linger, backoff, delivery timeout): the
    /// driver calls [`Accumulator::handle_timeout`] and claims ready batches then.
    ///
    /// An open batch's linger counts only while its partition could send: not while
    /// the partition or its leader has a Produce in flight. The answer to that Produce
    /// is what lets the batch go, and the driver acts on it; a linger already past
    /// would only wake the driver again and again until then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.partitions
            .iter()
            .flat_map(|(tp, p)| {
                let waits_for_answer = p.in_flight
                    || (self.leaders.get(tp)).is_some_and(|n| self.in_flight.contains_key(n));
                let linger = (p.open.as_ref())
                    .filter(|_| !waits_for_answer)
                    .map(|b| b.created + self.config.linger);
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

    /// Batches sent again after a failed or refused attempt, since the producer began
    /// (`retries` in the producer's metrics and statistics).
    pub fn retries(&self) -> u64 {
        self.retries
    }
}

#[cfg(test)]
mod tests;
