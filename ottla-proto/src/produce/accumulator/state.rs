//! What the accumulator keeps: batches, per partition their queue and sequence, and
//! the producer id's state.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use super::types::RecordId;
use crate::produce::encode::OutRecord;

#[derive(Debug)]
pub(super) struct Batch {
    pub(super) records: Vec<OutRecord>,
    pub(super) ids: Vec<RecordId>,
    pub(super) bytes: usize,
    pub(super) created: Instant,
    /// Set when first sent.
    pub(super) base_sequence: Option<i32>,
    /// The bytes sent, kept for retries.
    pub(super) encoded: Option<Bytes>,
    pub(super) attempts: u32,
}

#[derive(Debug, Default)]
pub(super) struct PartitionState {
    /// The batch records are appended to.
    pub(super) open: Option<Batch>,
    /// Closed batches, oldest first; the head may be in flight.
    pub(super) queue: VecDeque<Batch>,
    pub(super) in_flight: bool,
    pub(super) next_sequence: i32,
    pub(super) retry_at: Option<Instant>,
}

/// The producer id and epoch (KIP-98).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProducerIdState {
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
