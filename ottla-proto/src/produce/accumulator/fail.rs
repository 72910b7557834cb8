//! Batches failed without an answer: past `delivery.timeout.ms`, behind a connection
//! no retry fixes, or left unsent at close.

use std::collections::{BTreeSet, VecDeque};

use super::Accumulator;
use super::state::Batch;
use super::types::{ConnectionFailure, ProduceError};
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;

impl Accumulator {
    /// The connection to `node` failed in a way no retry fixes (TLS, authentication):
    /// the waiting batches of the partitions it leads fail now with `error`, instead of
    /// at `delivery.timeout.ms`, as the Java client fails them. Batches in flight keep
    /// their fate.
    pub fn fail_node(&mut self, node: NodeId, error: &ConnectionFailure) {
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
    pub fn fail_all(&mut self, error: &ConnectionFailure) {
        self.fail_waiting(|_, _| true, |_| ProduceError::Connection(error.clone()));
    }

    /// Fails the batches `doomed` picks, except a head batch in flight.
    pub(super) fn fail_waiting(
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

    /// The transaction is aborting (or must be): batches never sent fail with
    /// [`ProduceError::Aborted`]; batches sent before keep their fate (a retry keeps
    /// its sequence numbers), as Java's `abortUndrainedBatches`.
    pub fn abort_undrained(&mut self) {
        let mut failed = Vec::new();
        for (tp, p) in &mut self.partitions {
            let mut keep = VecDeque::new();
            for b in std::mem::take(&mut p.queue) {
                if b.base_sequence.is_none() && b.encoded.is_none() && b.attempts == 0 {
                    failed.push((tp.clone(), b));
                } else {
                    keep.push_back(b);
                }
            }
            p.queue = keep;
            if let Some(b) = p.open.take() {
                failed.push((tp.clone(), b));
            }
        }
        for (tp, b) in failed {
            self.finish(&tp, b, Err(ProduceError::Aborted));
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
