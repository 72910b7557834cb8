//! Dead-letter topic tools: read a DLQ back ([`inspect`]) and send chosen records to
//! their original topic again ([`replay`]). `examples/dlq.rs` wraps both as a command.
//!
//! Every format the processor writes is understood: the diagnostic headers (Apache
//! `__dlq.errors.*`, `ottla.dlq.*`, Spring `kafka_dlt-*`, Connect `__connect.errors.*`)
//! and the JSON envelope, whose value holds the original record. A replay sends the
//! original key, value and headers byte for byte, without the diagnostic headers and
//! without the `ottla.retry.*` routing of a retry topic the record died in (a replayed
//! record would otherwise wait out that hop's delay on its main partition, pausing
//! it); it counts replays in `ottla.replay.count`, so a record that keeps failing
//! stops after `max_replays` instead of looping.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;

use crate::config::ClientConfig;
use crate::consumer::{Consumer, ConsumerRecord, OffsetReset, TopicPartition};
use crate::driver::{Cluster, TopicScope};
use crate::error::{Error, Result};
use crate::producer::{Producer, ProducerRecord};
pub use crate::proto::process::dlq::Enveloped;
use crate::proto::process::dlq::parse_envelope;

/// The header that counts replays.
pub const REPLAY_COUNT: &str = "ottla.replay.count";

/// One dead-lettered record with what its headers say.
#[derive(Debug, Clone)]
pub struct DlqEntry {
    /// The DLQ record itself.
    pub record: ConsumerRecord,
    /// Where it came from: topic, partition, offset (if the headers say).
    pub origin: Option<(String, i32, i64)>,
    /// `retryable` / `non-retryable` (or `unknown`).
    pub class: String,
    /// The error type, if known.
    pub error_type: Option<String>,
    /// The error message, if known.
    pub message: Option<String>,
    /// Replays so far.
    pub replays: u32,
    /// The original record, when the dead letter is a JSON envelope
    /// (`DlqFormat::JsonEnvelope`): a replay sends this, not the envelope.
    pub enveloped: Option<Enveloped>,
}

fn header<'a>(r: &'a ConsumerRecord, name: &str) -> Option<&'a [u8]> {
    r.header(name).and_then(|h| h.value())
}

fn text(r: &ConsumerRecord, name: &str) -> Option<String> {
    header(r, name).map(|v| String::from_utf8_lossy(v).into_owned())
}

fn parse<T: std::str::FromStr>(r: &ConsumerRecord, name: &str) -> Option<T> {
    text(r, name).and_then(|v| v.trim().parse().ok())
}

/// Whether a replay leaves header `name` out: a diagnostic header, the replay count
/// (written anew), or a retry topic's routing (`ottla.retry.*`).
fn stripped_on_replay(name: &[u8]) -> bool {
    is_diagnostic(name) || name == REPLAY_COUNT.as_bytes() || name.starts_with(b"ottla.retry.")
}

/// Whether a header is one of the diagnostic headers (of any format).
pub fn is_diagnostic(name: &[u8]) -> bool {
    [
        &b"__dlq.errors."[..],
        b"ottla.dlq.",
        b"kafka_dlt-",
        b"__connect.errors.",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

impl DlqEntry {
    /// Reads the diagnostic headers of `record`.
    pub fn from_record(record: ConsumerRecord) -> Self {
        let r = &record;
        let origin = match (
            text(r, "__dlq.errors.topic"),
            parse(r, "__dlq.errors.partition"),
            parse(r, "__dlq.errors.offset"),
        ) {
            (Some(t), Some(p), Some(o)) => Some((t, p, o)),
            _ => match (
                text(r, "kafka_dlt-original-topic"),
                header(r, "kafka_dlt-original-partition").and_then(|b| <[u8; 4]>::try_from(b).ok()),
                header(r, "kafka_dlt-original-offset").and_then(|b| <[u8; 8]>::try_from(b).ok()),
            ) {
                (Some(t), Some(p), Some(o)) => {
                    Some((t, i32::from_be_bytes(p), i64::from_be_bytes(o)))
                }
                _ => match (
                    text(r, "__connect.errors.topic"),
                    parse(r, "__connect.errors.partition"),
                    parse(r, "__connect.errors.offset"),
                ) {
                    (Some(t), Some(p), Some(o)) => Some((t, p, o)),
                    _ => None,
                },
            },
        };
        // No origin in the headers: the JSON envelope's value holds it.
        let enveloped = match origin {
            Some(_) => None,
            None => r.value().and_then(parse_envelope),
        };
        let origin = origin.or_else(|| {
            let e = enveloped.as_ref()?;
            Some((e.topic.clone(), e.partition, e.offset))
        });
        let from_envelope =
            |f: fn(&Enveloped) -> &Option<String>| enveloped.as_ref().and_then(|e| f(e).clone());
        let class = text(r, "ottla.dlq.class")
            .or_else(|| from_envelope(|e| &e.classification))
            .unwrap_or_else(|| "unknown".into());
        let error_type = text(r, "ottla.dlq.error.type")
            .or_else(|| text(r, "kafka_dlt-exception-fqcn"))
            .or_else(|| text(r, "__connect.errors.exception.class.name"))
            .or_else(|| from_envelope(|e| &e.error_type));
        let message = text(r, "__dlq.errors.message")
            .or_else(|| text(r, "kafka_dlt-exception-message"))
            .or_else(|| text(r, "__connect.errors.exception.message"))
            .or_else(|| from_envelope(|e| &e.error_message));
        let replays = parse(r, REPLAY_COUNT).unwrap_or(0);
        Self {
            record,
            origin,
            class,
            error_type,
            message,
            replays,
            enveloped,
        }
    }

    /// The record a replay sends: the original key, value and headers (from the
    /// envelope, for a JSON-envelope dead letter) to the original topic and partition,
    /// without what [`replay`] strips, with the replay count incremented. `None` when
    /// the origin is unknown.
    pub fn replay_record(&self) -> Option<ProducerRecord> {
        let (topic, partition, _) = self.origin.as_ref()?;
        let (key, value, headers) = match &self.enveloped {
            Some(e) => (e.key.clone(), e.value.clone(), e.headers.clone()),
            None => (
                self.record.key_bytes(),
                self.record.value_bytes(),
                self.record.headers_owned(),
            ),
        };
        let mut r = ProducerRecord::new(topic.clone()).partition(*partition);
        r.key = key;
        r.value = value;
        r.headers =
            crate::proto::process::lanes::producer_headers(&headers, |k| !stripped_on_replay(k));
        r.headers.push((
            REPLAY_COUNT.to_string(),
            Some(Bytes::from((self.replays + 1).to_string())),
        ));
        Some(r)
    }

    /// `topic/partition/offset` of the original record: what replays dedup by.
    pub fn origin_id(&self) -> Option<String> {
        self.origin.as_ref().map(|(t, p, o)| format!("{t}/{p}/{o}"))
    }
}

/// Reads every record of `topic` (all partitions, from the start to the current end).
pub async fn inspect(config: &ClientConfig, topic: &str) -> Result<Vec<DlqEntry>> {
    let cluster =
        Cluster::connect(config, TopicScope::Topics([topic.to_string()].into()), &[]).await?;
    let metadata = cluster.metadata();
    let Some(t) = metadata.topic(topic) else {
        return Err(Error::Config {
            setting: "topic",
            message: format!("{topic} does not exist"),
        });
    };
    let partitions: Vec<TopicPartition> = t
        .partitions
        .iter()
        .map(|p| TopicPartition::new(topic, p.partition))
        .collect();
    let mut consumer = Consumer::builder(&config.bootstrap_servers.join(","))
        .client_config(config.clone())
        .assign(partitions.clone())
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await?;
    let mut out = Vec::new();
    // Read until every partition's lag is known and zero, with nothing new for a while.
    loop {
        match tokio::time::timeout(Duration::from_millis(500), consumer.recv_batch(1000)).await {
            Ok(batch) => out.extend(batch?.into_iter().map(DlqEntry::from_record)),
            Err(_) => {
                let caught_up = partitions.iter().all(|tp| consumer.lag(tp) == Some(0));
                if caught_up {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// Counts of entries by class and error type, for a summary.
pub fn summary(entries: &[DlqEntry]) -> BTreeMap<(String, String), usize> {
    let mut out = BTreeMap::new();
    for e in entries {
        let key = (
            e.class.clone(),
            e.error_type.clone().unwrap_or_else(|| "unknown".into()),
        );
        *out.entry(key).or_insert(0) += 1;
    }
    out
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Records sent to their original topic.
    pub replayed: usize,
    /// Skipped: the same original record was already replayed in this run.
    pub duplicates: usize,
    /// Skipped: replayed `max_replays` times already (a loop).
    pub looping: usize,
    /// Skipped: no original topic in the headers.
    pub unknown_origin: usize,
}

/// Re-sends the chosen entries to their original topic (and partition):
/// [`DlqEntry::replay_record`] of each. The same original record is sent once per run;
/// one replayed `max_replays` times already is skipped.
pub async fn replay(
    config: &ClientConfig,
    entries: &[DlqEntry],
    max_replays: u32,
) -> Result<ReplayReport> {
    let producer = Producer::builder(&config.bootstrap_servers.join(","))
        .client_config(config.clone())
        .build()
        .await?;
    let mut report = ReplayReport::default();
    let mut seen = BTreeSet::new();
    let mut pending = Vec::new();
    for e in entries {
        let (Some(r), Some(id)) = (e.replay_record(), e.origin_id()) else {
            report.unknown_origin += 1;
            continue;
        };
        if !seen.insert(id) {
            report.duplicates += 1;
            continue;
        }
        if e.replays >= max_replays {
            report.looping += 1;
            continue;
        }
        pending.push(producer.send(r).await?);
        report.replayed += 1;
    }
    for p in pending {
        p.await?;
    }
    producer.close().await;
    Ok(report)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::proto::fetch::fetcher::TimestampType;
    use crate::proto::process::classify::{ErrorClass, ProcessError};
    use crate::proto::process::dlq::{DeadLetter, DlqFormat};

    fn dead_letter(value: Option<Bytes>, headers: Vec<(&str, &[u8])>) -> ConsumerRecord {
        let mut r = ConsumerRecord::builder("orders.dlq", 0, 7)
            .timestamp(1_700_000_000_000)
            .key("k");
        if let Some(value) = value {
            r = r.value(value);
        }
        for (k, v) in headers {
            r = r.header(k.to_string(), Some(Bytes::copy_from_slice(v)));
        }
        r.build()
    }

    fn names(r: &ProducerRecord) -> Vec<&str> {
        r.headers.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn a_replay_drops_the_routing_of_the_retry_topic_the_record_died_in() {
        // A record that failed its last hop in `orders.retry.60000` carries that hop's
        // routing; replayed with it, the main topic's processor would treat it as a
        // hop and wait a minute on its partition.
        let record = dead_letter(
            Some(Bytes::from_static(b"v")),
            vec![
                ("trace", b"abc"),
                ("ottla.retry.hop", b"2"),
                ("ottla.retry.topic", b"orders"),
                ("ottla.retry.partition", b"3"),
                ("ottla.retry.offset", b"41"),
                ("__dlq.errors.topic", b"orders"),
                ("__dlq.errors.partition", b"3"),
                ("__dlq.errors.offset", b"41"),
                ("ottla.dlq.class", b"retryable"),
            ],
        );
        let entry = DlqEntry::from_record(record);
        let r = entry.replay_record().expect("origin known");
        assert_eq!((r.topic.as_str(), r.partition), ("orders", Some(3)));
        assert_eq!(names(&r), vec!["trace", REPLAY_COUNT]);
        assert_eq!(r.value.as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn a_json_envelope_replays_the_original_record_it_holds() {
        let error = ProcessError::permanent("ValueError", "bad");
        let letter = DeadLetter {
            topic: "orders",
            partition: 3,
            offset: 41,
            timestamp: 1_700_000_000_000,
            timestamp_type: TimestampType::CreateTime,
            group: "billing",
            error: &error,
            class: ErrorClass::Permanent,
            attempts: 1,
            first_failure_ms: 1,
            dead_lettered_ms: 2,
        };
        let original_headers = vec![
            (
                Bytes::from_static(b"trace"),
                Some(Bytes::from_static(b"abc")),
            ),
            (
                Bytes::from_static(b"ottla.retry.hop"),
                Some(Bytes::from_static(b"1")),
            ),
        ];
        let value = letter.envelope(Some(b"k"), Some(&[0xff, 0x01]), &original_headers);
        // As the processor writes it: the original headers, then `ottla.dlq.*`.
        let mut headers: Vec<(&str, &[u8])> = vec![("trace", b"abc"), ("ottla.retry.hop", b"1")];
        let ours = letter.headers(DlqFormat::JsonEnvelope);
        headers.extend(
            ours.iter()
                .map(|(k, v)| (k.as_str(), v.as_deref().unwrap_or(b""))),
        );
        let entry = DlqEntry::from_record(dead_letter(Some(Bytes::from(value)), headers));
        assert_eq!(entry.origin, Some(("orders".into(), 3, 41)));
        assert_eq!(entry.error_type.as_deref(), Some("ValueError"));
        let r = entry.replay_record().expect("origin known");
        assert_eq!((r.topic.as_str(), r.partition), ("orders", Some(3)));
        assert_eq!(
            r.value.as_deref(),
            Some(&[0xff, 0x01][..]),
            "the original value, not the envelope"
        );
        assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(names(&r), vec!["trace", REPLAY_COUNT]);
    }
}
