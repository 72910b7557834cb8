//! The fetcher's public types: its configuration, the reset policy, why a partition
//! stopped or was reset, its events, and the token of a fetch in flight.

use std::time::Duration;

use crate::error_name;
use crate::fetch::batch::{BatchError, BatchOptions};
use crate::fetch::request::FetchParams;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;

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
    /// `client.rack`, sent with every Fetch (v11+): a broker with a rack-aware
    /// `replica.selector.class` then names a replica in this rack to fetch from
    /// (KIP-392), and the fetcher follows it.
    pub rack: Option<String>,
    /// How long a partition keeps fetching from the replica its leader named before
    /// asking the leader again: `metadata.max.age.ms`, as in the Java client.
    pub read_replica_expiry: Duration,
}

impl Default for FetcherConfig {
    fn default() -> Self {
        Self {
            params: FetchParams::default(),
            partition_max_bytes: 1024 * 1024,
            buffer_max_bytes: 64 * 1024 * 1024,
            reset: OffsetReset::Latest,
            batch: BatchOptions::default(),
            retry_backoff: crate::backoff::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: crate::backoff::DEFAULT_RETRY_BACKOFF_MAX,
            seed: 0x0fe7_c4e5,
            sessions: true,
            rack: None,
            read_replica_expiry: Duration::from_secs(300),
        }
    }
}

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
    /// The application asked for it ([`Fetcher::reset`](super::Fetcher::reset)).
    Requested,
}

/// What the fetcher tells the driver and the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetcherEvent {
    /// Leaders are unknown or moved: refresh metadata, then call
    /// [`Fetcher::update_metadata`](super::Fetcher::update_metadata).
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
    /// [`Fetcher::next_record`](super::Fetcher::next_record).
    PartitionStopped(FetchError),
}

/// A request of the fetcher's, as [`super::Fetcher::handle_failure`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetcherRequest {
    /// The Fetch to this broker.
    Fetch(NodeId),
    /// The ListOffsets (offset resets) to this broker.
    ListOffsets(NodeId),
}

/// Whether a response belongs to a fetch the fetcher still expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchToken {
    pub(super) node: NodeId,
    pub(super) version: i16,
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
