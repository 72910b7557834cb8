//! Test data written by another client (librdkafka through rdkafka, test code only):
//! record `i` goes to partition `i % partitions`, so partition `p`'s offset `k` (from a
//! fresh topic) is record `k * partitions + p`. Keys, null keys, null values and headers
//! follow from `i`, so a reader can check every byte without keeping a copy.

use std::time::Duration;

use anyhow::Context;
use rdkafka::ClientConfig as RdConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

/// Key, value and headers of one record.
pub type Written = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(String, Option<Vec<u8>>)>,
);

/// What record `i` holds: every 7th key and every 11th value is null, and 0 to 2
/// headers, one with a null value.
pub fn expected(i: u64) -> Written {
    let key = (!i.is_multiple_of(7)).then(|| format!("key-{i}").into_bytes());
    let value = (!i.is_multiple_of(11))
        .then(|| format!("value-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes());
    let headers = (0..i % 3)
        .map(|h| (format!("h{h}"), (h != 1).then(|| vec![h as u8; 3])))
        .collect();
    (key, value, headers)
}

/// The record index at `offset` of `partition` in a fresh topic.
pub fn index_of(partition: i32, offset: i64, partitions: i32) -> u64 {
    (offset as u64) * (partitions as u64) + partition as u64
}

/// Whether a record read back holds exactly what record `i` was written with.
pub fn matches(
    i: u64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(bytes::Bytes, Option<bytes::Bytes>)],
) -> bool {
    let (k, v, h) = expected(i);
    k.as_deref() == key
        && v.as_deref() == value
        && h.len() == headers.len()
        && h.iter()
            .zip(headers)
            .all(|((hk, hv), (rk, rv))| hk.as_bytes() == &rk[..] && hv.as_deref() == rv.as_deref())
}

/// A producer for `bootstrap` with `codec` and the given extra settings.
pub fn producer(
    bootstrap: &str,
    codec: &str,
    extra: &[(&str, &str)],
) -> anyhow::Result<FutureProducer> {
    let mut config = RdConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", codec)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "60000");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config.create().context("creating an rdkafka producer")
}

/// Produces records `first..first + count` with `codec`, each to partition
/// `i % partitions`, and waits for every delivery.
pub async fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    first: u64,
    count: u64,
    codec: &str,
) -> anyhow::Result<()> {
    let producer = producer(bootstrap, codec, &[])?;
    produce_with(&producer, topic, partitions, first, count).await?;
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}

/// [`produce`] on an existing producer.
pub async fn produce_with(
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
    first: u64,
    count: u64,
) -> anyhow::Result<()> {
    let mut pending = Vec::with_capacity(count as usize);
    for i in first..first + count {
        let (key, value, headers) = expected(i);
        let mut h = OwnedHeaders::new();
        for (k, v) in &headers {
            h = h.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic)
            .partition((i % partitions as u64) as i32)
            .headers(h);
        if let Some(k) = &key {
            record = record.key(k);
        }
        if let Some(v) = &value {
            record = record.payload(v);
        }
        loop {
            match producer.send_result(record) {
                Ok(delivery) => {
                    pending.push(delivery);
                    break;
                }
                Err((e, r)) => {
                    // Queue full: let deliveries drain, then retry.
                    record = r;
                    if !e.to_string().contains("Queue full") {
                        anyhow::bail!("produce record {i}: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
    for (n, delivery) in pending.into_iter().enumerate() {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => anyhow::bail!("record {}: delivery failed: {e}", first + n as u64),
            Err(_) => anyhow::bail!("record {}: delivery cancelled", first + n as u64),
        }
    }
    Ok(())
}
