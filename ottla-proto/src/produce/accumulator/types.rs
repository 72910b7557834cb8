//! The accumulator's public types: its configuration, record ids, what a record's
//! delivery or refusal says, its events, and the token of a Produce in flight.

use std::sync::Arc;
use std::time::Duration;

use crate::error_name;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;
use crate::produce::encode::EncodeError;
use crate::produce::partitioner::{BuiltInPartitioner, Partitioner};
use crate::record_format::Compression;

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
    pub(super) fn code(self) -> i16 {
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
    /// `partitioner` (default `murmur2_random`, the Java client's): where a record
    /// sent without a partition goes.
    pub partitioner: BuiltInPartitioner,
    /// `partitioner.ignore.keys` (default off): every record sent without a
    /// partition goes to the sticky partition, whatever its key.
    pub ignore_keys: bool,
    /// A partitioner of your own, asked before `partitioner`.
    pub custom_partitioner: Option<Arc<dyn Partitioner>>,
    /// Seed of the sticky and random partitioners.
    pub seed: u64,
    /// `transactional.id`: batches carry the transactional bit and Produce requests
    /// the id; the producer id comes from the transaction manager
    /// ([`Accumulator::set_producer_id`](super::Accumulator::set_producer_id)), never
    /// from an InitProducerId of the accumulator's own.
    pub transactional_id: Option<String>,
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
            retry_backoff: crate::backoff::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: crate::backoff::DEFAULT_RETRY_BACKOFF_MAX,
            max_request_size: 1024 * 1024,
            partitioner: BuiltInPartitioner::default(),
            ignore_keys: false,
            custom_partitioner: None,
            seed: 0x5eed_0771a,
            transactional_id: None,
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
    /// The record's transaction was aborted (or must be) before it was sent.
    #[error("the transaction was aborted before the record was sent")]
    Aborted,
    /// The connection to the partition's leader fails in a way no retry fixes: TLS
    /// or SASL authentication.
    #[error(transparent)]
    Connection(ConnectionFailure),
}

/// Why no connection can carry a partition's records: a failure of the IO layer (a TLS
/// handshake or a SASL authentication refused), which the driver hands in and the core
/// keeps opaque. `Producer`'s delivery futures give it back typed, as
/// `ottla::Error::Request`.
#[derive(Debug, Clone)]
pub struct ConnectionFailure(std::sync::Arc<dyn std::error::Error + Send + Sync>);

impl ConnectionFailure {
    /// Wraps the driver's error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(error))
    }

    /// The driver's error, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

impl std::fmt::Display for ConnectionFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ConnectionFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// The same failure (one connection's error fails many records), or one that reads
/// the same.
impl PartialEq for ConnectionFailure {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for ConnectionFailure {}

/// Why a record was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// Metadata does not know the topic (yet).
    #[error("topic {0} is not in the metadata")]
    UnknownTopic(String),
    /// The partition given, or chosen by a custom partitioner, does not exist.
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
/// Exhaustive on purpose: a driver must act on every one (a new one is a compile error
/// in each driver, not a silent `_`).
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Which request a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProduceToken {
    pub(super) node: NodeId,
    pub(super) serial: u64,
}

impl ProduceToken {
    /// The broker.
    pub fn node(&self) -> NodeId {
        self.node
    }
}
