//! Writes a cell's records once, with librdkafka's producer in the parent process, and
//! checks they all landed.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context, bail};
use rdkafka::ClientConfig as RdConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::{Cell, KEY_BYTES};

/// Text that makes up most of a value, so that lz4 has something to find.
const TEMPLATE: &[u8] = b"{\"event\":\"order-created\",\"currency\":\"EUR\",\"country\":\"DE\",\
\"channel\":\"web\",\"status\":\"pending\",\"items\":[{\"sku\":\"A-1\",\"qty\":1}],\"note\":\"\"}";
const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// The value of record `i`: `size` bytes, two fifths pseudo-random letters and digits in
/// runs of 8, the rest template text (lz4 halves it, roughly). The same for every
/// codec, so the compressed cell holds the same values as the plain one.
pub fn value(i: u64, size: usize) -> Vec<u8> {
    let mut state = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..size)
        .map(|j| {
            if (j / 8) % 5 < 2 {
                // xorshift64*
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 58;
                ALNUM[r as usize % ALNUM.len()]
            } else {
                TEMPLATE[j % TEMPLATE.len()]
            }
        })
        .collect()
}

/// The key of record `i`.
pub fn key(i: u64) -> [u8; KEY_BYTES] {
    let mut key = [0u8; KEY_BYTES];
    key.copy_from_slice(format!("{i:016}").as_bytes());
    key
}

/// Writes `cell` to its topic (which must exist and be empty): record `i` to partition
/// `i % partitions`, linger 50 ms, `batch.size` 1 MB, the cell's codec, waiting for every
/// delivery.
pub async fn produce(bootstrap: &str, cell: &Cell) -> anyhow::Result<()> {
    let producer: FutureProducer = protocol_tests::data::producer(
        bootstrap,
        cell.codec(),
        &[("linger.ms", "50"), ("batch.size", "1000000")],
    )?;
    let topic = cell.topic();
    let parts = cell.partitions as u64;
    send_records(&producer, cell.records, cell.value_size, |i| {
        Ok((topic.as_str(), (i % parts) as i32))
    })
    .await
}

/// Sends `records` records through `producer`, record `i` to `place(i)` (topic and
/// partition) with key [`key`]`(i)`, waiting on the oldest delivery when the queue is
/// full and keeping at most 200,000 in flight; then waits for every delivery.
pub async fn send_records<'t>(
    producer: &FutureProducer,
    records: u64,
    value_size: usize,
    mut place: impl FnMut(u64) -> anyhow::Result<(&'t str, i32)>,
) -> anyhow::Result<()> {
    // A few distinct values reused round-robin: generating a fresh one per record
    // would make producing slower than consuming.
    let values: Vec<Vec<u8>> = (0..1021).map(|i| value(i, value_size)).collect();
    let mut pending = VecDeque::new();
    for i in 0..records {
        let key = key(i);
        let (topic, partition) = place(i)?;
        let mut record = FutureRecord::to(topic)
            .partition(partition)
            .key(&key[..])
            .payload(&values[(i % values.len() as u64) as usize][..]);
        loop {
            match producer.send_result(record) {
                Ok(d) => {
                    pending.push_back(d);
                    break;
                }
                Err((_, r)) => {
                    // Queue full: wait for the oldest delivery, then retry.
                    record = r;
                    match pending.pop_front() {
                        Some(d) => delivered(d.await, i)?,
                        None => tokio::time::sleep(Duration::from_millis(5)).await,
                    }
                }
            }
        }
        while pending.len() > 200_000 {
            if let Some(d) = pending.pop_front() {
                delivered(d.await, i)?;
            }
        }
    }
    for d in pending {
        delivered(d.await, records)?;
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

fn delivered<E>(
    result: Result<rdkafka::producer::future_producer::OwnedDeliveryResult, E>,
    near: u64,
) -> anyhow::Result<()> {
    match result {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => bail!("delivery failed near record {near}: {e}"),
        Err(_) => bail!("delivery cancelled near record {near}"),
    }
}

/// Checks that every partition starts at offset 0 and, where `check_end` (not on
/// tansu, whose ListOffsets "latest" is too small), ends at its record count: the mock
/// cluster silently drops old batches past 5 MiB per partition.
pub fn verify(bootstrap: &str, cell: &Cell, check_end: bool) -> anyhow::Result<()> {
    let consumer: BaseConsumer = RdConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating an rdkafka client for watermarks")?;
    let topic = cell.topic();
    for (p, &count) in cell.per_partition().iter().enumerate() {
        let (low, high) = consumer
            .fetch_watermarks(&topic, p as i32, Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
        if low != 0 {
            bail!(
                "{topic}/{p} starts at offset {low}, not 0: the broker dropped records (the mock keeps 5 MiB per partition)"
            );
        }
        if check_end && high != count {
            bail!("{topic}/{p} ends at offset {high}, not {count}");
        }
    }
    Ok(())
}
