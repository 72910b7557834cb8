//! Where a failed record is written: a retry topic's hop or the dead-letter topic; the
//! records written, the answer to a write, and the halt while one fails.

use std::time::Duration;

use bytes::Bytes;
use tracing::{error, info, warn};

use super::state::{Attempt, Destination, Slot, Work};
use super::types::{Action, Metric, Now, Ticket};
use super::{LOG_TARGET, Lanes};
use crate::fetch::fetcher::ConsumerRecord;
use crate::group::consumer_protocol::TopicPartition;
use crate::process::classify::{ErrorClass, ProcessError};
use crate::process::dlq::{DeadLetter, DlqFormat, DlqTimestamp};
use crate::produce::record::ProducerRecord;

/// How a halted lane tries its dead-letter or retry-topic write again: from 200 ms,
/// doubling to 6.4 s (the producer has already retried that write for its delivery
/// timeout; this is the pace of trying a topic that is missing or refused).
pub const HALT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_millis(6400));

/// `<topic>.retry.<delay>`, the delay as `500ms`, `30s`, `5m` or `1h`.
pub fn retry_topic(topic: &str, delay: Duration) -> String {
    let ms = delay.as_millis();
    let label = if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 && ms > 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    };
    format!("{topic}.retry.{label}")
}

/// Header of the retry-topic hop a record is on (1 for the first retry topic).
pub const RETRY_HOP: &str = "ottla.retry.hop";
const RETRY_TOPIC: &str = "ottla.retry.topic";
const RETRY_PARTITION: &str = "ottla.retry.partition";
const RETRY_OFFSET: &str = "ottla.retry.offset";

#[inline]
fn header_str(r: &ConsumerRecord, name: &str) -> Option<String> {
    r.header(name)
        .and_then(|h| h.value())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The retry hop of a record (0: not from a retry topic).
#[inline]
pub(super) fn hop_of(r: &ConsumerRecord) -> u32 {
    header_str(r, RETRY_HOP)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Where a record first came from: its retry headers, or its own coordinates.
fn origin_of(r: &ConsumerRecord) -> (String, i32, i64) {
    match (
        header_str(r, RETRY_TOPIC),
        header_str(r, RETRY_PARTITION).and_then(|v| v.parse().ok()),
        header_str(r, RETRY_OFFSET).and_then(|v| v.parse().ok()),
    ) {
        (Some(t), Some(p), Some(o)) => (t, p, o),
        _ => (r.topic().to_string(), r.partition(), r.offset()),
    }
}

/// A consumed record's headers, those `keep` keeps, as a produced record's (the
/// values are shared, not copied).
pub fn producer_headers(
    headers: &[(Bytes, Option<Bytes>)],
    keep: impl Fn(&[u8]) -> bool,
) -> Vec<(String, Option<Bytes>)> {
    headers
        .iter()
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
        .collect()
}

/// The dead-letter record of `record` for `topic`: its key and headers, its value (or
/// the JSON envelope holding it), the diagnostic headers of `format`, and the
/// timestamp `stamp` chooses.
pub fn dead_letter_record(
    topic: String,
    record: &ConsumerRecord,
    letter: &DeadLetter<'_>,
    format: DlqFormat,
    stamp: DlqTimestamp,
) -> ProducerRecord {
    let mut out = ProducerRecord::new(topic);
    out.key = record.key_bytes();
    out.timestamp = Some(match stamp {
        DlqTimestamp::DeadLettered => letter.dead_lettered_ms,
        DlqTimestamp::Original => record.timestamp(),
    });
    let headers = record.headers_owned();
    out.headers = producer_headers(&headers, |_| true);
    out.value = if format == DlqFormat::JsonEnvelope {
        let (key, value) = (record.key(), record.value());
        Some(Bytes::from(letter.envelope(key, value, &headers)))
    } else {
        record.value_bytes()
    };
    out.headers.extend(letter.headers(format));
    out
}

impl Lanes {
    /// The write under `ticket` was acknowledged (`Ok`) or failed for good.
    pub fn produced(&mut self, ticket: Ticket, result: Result<(), String>, now: Now) {
        let Some((
            tp,
            slot,
            Work::Forwarding {
                attempt,
                class,
                to,
                failures,
                ..
            },
        )) = self.take_work(ticket)
        else {
            return;
        };
        let Some(lane) = self.lanes.get_mut(&tp) else {
            return;
        };
        let offset = attempt.record.offset();
        match (result, to) {
            (Ok(()), Destination::Hop(hop)) => {
                info!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
                    offset, hop, "record sent to a retry topic"
                );
                lane.tracker.finish(offset);
                self.stats.forwarded += 1;
                self.metric(Metric::RetryTopic {
                    partition: tp.clone(),
                    offset,
                    hop,
                });
            }
            (Ok(()), Destination::DeadLetters) => {
                let error_type = attempt
                    .last_error
                    .as_ref()
                    .map(|e| e.kind.clone())
                    .unwrap_or_default();
                info!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
                    offset, error_type = %error_type, error_classification = class.label(),
                    "record dead-lettered"
                );
                lane.tracker.finish(offset);
                self.stats.dead_lettered += 1;
                self.metric(Metric::DeadLettered {
                    partition: tp.clone(),
                    offset,
                    error_type,
                    class,
                });
                self.processed(false, attempt.took);
            }
            (Err(e), _) => {
                self.stats.dlq_failures += 1;
                if lane.releasing {
                    warn!(
                        target: LOG_TARGET,
                        topic = %tp.topic, partition = tp.partition, offset, error = %e,
                        "dead-letter write failed while the partition is handed over; its next owner handles the record again"
                    );
                } else {
                    let failures = failures + 1;
                    let delay = self.halt_backoff.delay(failures);
                    error!(
                        target: LOG_TARGET,
                        topic = %tp.topic, partition = tp.partition, offset, error = %e,
                        retry_in_ms = delay.as_millis() as u64,
                        "dead-letter write failed; the partition is halted and nothing is committed past this record"
                    );
                    lane.set_work(
                        slot,
                        Work::Halted {
                            attempt,
                            class,
                            to,
                            retry_at: now.at + delay,
                            failures,
                        },
                    );
                }
            }
        }
        self.step(now);
    }

    /// Writes a record on: to a retry topic's hop, or to the dead-letter topic.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &mut self,
        tp: &TopicPartition,
        slot: Slot,
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        failures: u32,
        now: Now,
    ) {
        let record = self.outgoing(&attempt, class, to, now);
        let ticket = self.ticket(tp, slot);
        let Some(lane) = self.lanes.get_mut(tp) else {
            self.tickets.remove(&ticket);
            return;
        };
        lane.set_work(
            slot,
            Work::Forwarding {
                ticket,
                attempt,
                class,
                to,
                failures,
            },
        );
        self.actions.push_back(Action::Produce {
            ticket,
            partition: tp.clone(),
            record,
        });
    }

    fn outgoing(
        &self,
        attempt: &Attempt,
        class: ErrorClass,
        to: Destination,
        now: Now,
    ) -> ProducerRecord {
        let mut out = match to {
            Destination::Hop(hop) => self.hop_record(attempt, hop),
            Destination::DeadLetters => self.letter_record(attempt, class, now),
        };
        // The trace goes on from the last attempt (a JSON envelope's copy of the
        // original headers keeps the record's own).
        if let Some(trace) = &attempt.trace {
            crate::trace::set_header(&mut out.headers, trace);
        }
        out
    }

    /// The record's copy for retry topic `hop`, with its origin in the headers.
    fn hop_record(&self, attempt: &Attempt, hop: u32) -> ProducerRecord {
        let record = &attempt.record;
        let (origin_topic, origin_partition, origin_offset) = origin_of(record);
        let delay = hop
            .checked_sub(1)
            .and_then(|i| self.config.retry_delays.get(i as usize))
            .copied()
            .unwrap_or_default();
        let mut out = ProducerRecord::new(retry_topic(&origin_topic, delay));
        out.key = record.key_bytes();
        out.value = record.value_bytes();
        out.headers =
            producer_headers(&record.headers_owned(), |k| !k.starts_with(b"ottla.retry."));
        for (k, v) in [
            (RETRY_HOP, hop.to_string()),
            (RETRY_TOPIC, origin_topic),
            (RETRY_PARTITION, origin_partition.to_string()),
            (RETRY_OFFSET, origin_offset.to_string()),
        ] {
            out.headers.push((k.to_string(), Some(Bytes::from(v))));
        }
        out
    }

    /// The record's dead letter.
    fn letter_record(&self, attempt: &Attempt, class: ErrorClass, now: Now) -> ProducerRecord {
        let record = &attempt.record;
        let (origin_topic, origin_partition, origin_offset) = origin_of(record);
        let error = attempt
            .last_error
            .clone()
            .unwrap_or_else(|| ProcessError::unclassified("Unknown", ""));
        let letter = DeadLetter {
            topic: &origin_topic,
            partition: origin_partition,
            offset: origin_offset,
            timestamp: record.timestamp(),
            timestamp_type: record.timestamp_type(),
            group: &self.config.group,
            error: &error,
            class,
            attempts: attempt.attempts,
            first_failure_ms: attempt.first_failure_ms.unwrap_or(now.unix_ms),
            dead_lettered_ms: now.unix_ms,
        };
        let topic = self.config.dlq_of(&origin_topic);
        dead_letter_record(
            topic,
            record,
            &letter,
            self.config.dlq_format,
            self.config.dlq_timestamp,
        )
    }
}
