//! The idempotent producer's id (KIP-98): when an InitProducerId is due, its answer,
//! and its renewal after a batch that used sequence numbers failed for good.

use std::time::Instant;

use tracing::{debug, warn};

use super::Accumulator;
use super::state::ProducerIdState;

impl Accumulator {
    /// Whether an InitProducerId should be sent now (idempotence on, no id, nothing in
    /// flight, the backoff after a failed one over). Marks it requested.
    /// Never with a `transactional.id`: the transaction manager's InitProducerId
    /// carries it, and its answer comes through [`Accumulator::set_producer_id`].
    pub fn claim_producer_id(&mut self, now: Instant) -> bool {
        if self.transactional {
            return false;
        }
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

    pub(super) fn renew_producer_id(&mut self) {
        // A transactional producer's epoch moves only through the transaction
        // manager: the failed batch makes the transaction abortable, and the abort
        // bumps the epoch (KIP-360).
        if self.producer_id != ProducerIdState::Off && !self.transactional {
            self.pid_failures = 0;
            warn!("a batch failed after using sequence numbers; renewing the producer id");
            self.producer_id = ProducerIdState::Needed {
                failures: 0,
                retry_at: None,
            };
        }
    }
}
