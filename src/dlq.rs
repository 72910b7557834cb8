//! Dead-letter topic tools: read a DLQ back ([`inspect`]) and send chosen records to
//! their original topic again ([`replay`]). `examples/dlq.rs` wraps both as a command.
//!
//! The diagnostic headers of every format the processor writes are understood (Apache
//! `__dlq.errors.*`, `ottla.dlq.*`, Spring `kafka_dlt-*`, Connect `__connect.errors.*`).
//! A replay strips them, keeps the record's own headers, key and value byte for byte,
//! and counts replays in `ottla.replay.count`, so a record that keeps failing stops
//! after `max_replays` instead of looping.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;

use crate::config::ClientConfig;
use crate::consumer::{Consumer, ConsumerRecord, OffsetReset, TopicPartition};
use crate::driver::{Cluster, TopicScope};
use crate::error::{Error, Result};
use crate::producer::{Producer, ProducerRecord};

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
}

fn header<'a>(r: &'a ConsumerRecord, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(k, _)| &k[..] == name.as_bytes())
        .and_then(|(_, v)| v.as_deref())
}

fn text(r: &ConsumerRecord, name: &str) -> Option<String> {
    header(r, name).map(|v| String::from_utf8_lossy(v).into_owned())
}

fn parse<T: std::str::FromStr>(r: &ConsumerRecord, name: &str) -> Option<T> {
    text(r, name).and_then(|v| v.trim().parse().ok())
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
        let class = text(r, "ottla.dlq.class").unwrap_or_else(|| "unknown".into());
        let error_type = text(r, "ottla.dlq.error.type")
            .or_else(|| text(r, "kafka_dlt-exception-fqcn"))
            .or_else(|| text(r, "__connect.errors.exception.class.name"));
        let message = text(r, "__dlq.errors.message")
            .or_else(|| text(r, "kafka_dlt-exception-message"))
            .or_else(|| text(r, "__connect.errors.exception.message"));
        let replays = parse(r, REPLAY_COUNT).unwrap_or(0);
        Self {
            record,
            origin,
            class,
            error_type,
            message,
            replays,
        }
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

/// Re-sends the chosen entries to their original topic (and partition): key, value and
/// the record's own headers byte for byte, diagnostic headers removed, `ottla.replay.count`
/// incremented. The same original record is sent once per run; one replayed
/// `max_replays` times already is skipped.
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
        let (Some((topic, partition, _)), Some(id)) = (&e.origin, e.origin_id()) else {
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
        let mut r = ProducerRecord::new(topic.clone()).partition(*partition);
        r.key = e.record.key.clone();
        r.value = e.record.value.clone();
        r.headers = e
            .record
            .headers
            .iter()
            .filter(|(k, _)| !is_diagnostic(k) && &k[..] != REPLAY_COUNT.as_bytes())
            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
            .collect();
        r.headers.push((
            REPLAY_COUNT.to_string(),
            Some(Bytes::from((e.replays + 1).to_string())),
        ));
        pending.push(producer.send(r).await?);
        report.replayed += 1;
    }
    for p in pending {
        p.await?;
    }
    producer.close().await;
    Ok(report)
}
