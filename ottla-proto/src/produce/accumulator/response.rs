//! A Produce answered, failed or unacknowledged: batches delivered, retried after
//! the backoff, or failed; deliveries.

use std::collections::HashMap;
use std::time::Instant;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ProduceResponse;
use tracing::{debug, warn};

use super::Accumulator;
use super::state::Batch;
use super::types::{Delivery, ProduceError, ProduceToken};
use crate::Failure;
use crate::error_name;
use crate::group::consumer_protocol::TopicPartition;
use crate::needs_metadata_refresh;
use crate::produce::encode::OutRecord;

impl Accumulator {
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
    pub fn handle_failure(&mut self, now: Instant, token: ProduceToken, failure: Failure) {
        debug!(
            node = token.node.0,
            ?failure,
            "produce failed without an answer"
        );
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
                    if self.transactional {
                        // The transaction manager decides (abort, then a new epoch);
                        // the batch fails with the code it reads.
                        warn!(%tp, error = %error_name(code), "produce: transactional batch refused");
                        if let Some(b) = self.pop_head(&tp) {
                            let error = ProduceError::Broker {
                                topic: tp.topic.clone(),
                                partition: tp.partition,
                                code,
                            };
                            self.finish(&tp, b, Err(error));
                        }
                        continue;
                    }
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

    pub(super) fn finish(
        &mut self,
        tp: &TopicPartition,
        b: Batch,
        result: Result<i64, ProduceError>,
    ) {
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
}
