//! Isolation: while one partition's record is in retry backoff, do the other partitions
//! keep their throughput?
//!
//! `cargo run --release -p ottla-bench --bin bench-isolation [-- --retry-secs 30 --runs 3
//! --order partition|key --keys 1000]`
//!
//! Four partitions on tansu, each with more records than can be handled in the window.
//! The handler costs 1 ms per record (a sleep: a downstream call). In the "failing" run,
//! the first record of partition 0 fails transiently for `--retry-secs` (retries every
//! second); in the "clean" run nothing fails. For each run it prints the records/s over
//! the window of the others, and the ratio failing/clean (interleaved runs, medians).
//! By partition (4 calls at once), the others are partitions 1-3. By key, one partition
//! (16 calls at once; records keyed `k{i % keys}`, 8,000 a second of the window, more
//! than 16 calls of 1 ms can take), the others are the partition's other keys: the
//! records its retrying key, `k0`, does not hold.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::consumer::OffsetReset;
use ottla::processor::{
    ProcessError, ProcessingOrder, Processor, RetryBackoff, RetryPolicy, owned,
};
use ottla::producer::{Producer, ProducerRecord};
use protocol_tests::peer::Peer;

use ottla_bench::arg;

#[tokio::main]
async fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-isolation") {
        return refused;
    }
    let secs = arg("--retry-secs", 30);
    let runs = arg("--runs", 3);
    let by_key = match ottla_bench::opt("--order").as_deref() {
        None | Some("partition") => None,
        Some("key") => Some(arg("--keys", 1000).max(4)),
        Some(other) => {
            eprintln!("bench-isolation: --order {other}: partition or key");
            return ExitCode::from(2);
        }
    };
    match run(secs, runs, by_key).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-isolation: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(secs: u64, runs: u64, by_key: Option<u64>) -> anyhow::Result<()> {
    let peer = Peer::tansu()?;
    let window = Duration::from_secs(secs);
    // 1 ms per record over 4 lanes: at most ~4,000/s; give each partition more than
    // the window can use.
    let per_partition = 1200 * secs.max(1);
    let (partitions, records) = match by_key {
        None => (4, per_partition * 4),
        Some(_) => (1, 8000 * secs.max(1)),
    };
    let mut results: Vec<(bool, f64)> = Vec::new();
    for run in 1..=runs {
        for failing in [false, true] {
            let topic = format!("iso-{run}-{failing}-{}", by_key.map_or(0, |k| k));
            peer.create_topic(&topic, partitions)?;
            // Never written (the failing record heals within its retries), but the
            // processor checks at startup that it exists.
            peer.create_topic(&format!("{topic}.dlq"), 1)?;
            let producer = Producer::builder(&peer.bootstrap()).build().await?;
            let mut pending = Vec::new();
            for i in 0..records {
                let mut r = ProducerRecord::new(&topic)
                    .partition((i % partitions as u64) as i32)
                    .value(format!("{i}"));
                if let Some(keys) = by_key {
                    r = r.key(format!("k{}", i % keys));
                }
                pending.push(producer.send(r).await?);
            }
            for p in pending {
                p.await?;
            }
            producer.close().await;
            let counts: Arc<Mutex<BTreeMap<i32, u64>>> = Arc::default();
            let processor =
                Processor::builder(&peer.bootstrap(), &format!("g-{topic}"), [topic.clone()])
                    .retry_policy(RetryPolicy {
                        default: RetryBackoff {
                            max_retries: 1000,
                            initial: Duration::from_secs(1),
                            max: Duration::from_secs(1),
                            multiplier: 1.0,
                            jitter: false,
                            min_delay: Duration::ZERO,
                        },
                        ..RetryPolicy::default()
                    })
                    .timeouts(
                        Duration::from_secs(6),
                        Duration::from_millis(500),
                        Duration::from_secs(2000),
                    )
                    .concurrency(if by_key.is_some() { 16 } else { 4 })
                    .ordering(if by_key.is_some() {
                        ProcessingOrder::Key
                    } else {
                        ProcessingOrder::Partition
                    })
                    .consumer(|c| c.offset_reset(OffsetReset::Earliest))
                    .build()
                    .await?;
            let c = counts.clone();
            let started = Arc::new(Mutex::new(None::<Instant>));
            let s = started.clone();
            let handler = owned(move |r: ottla::ConsumerRecord, _| {
                let (c, s) = (c.clone(), s.clone());
                async move {
                    let t0 = *s.lock().unwrap().get_or_insert_with(Instant::now);
                    if failing && r.partition() == 0 && r.offset() == 0 && t0.elapsed() < window {
                        return Err(ProcessError::transient("Unavailable", "downstream down"));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    // Partition 0's records of the failing record's key (k0) as -1.
                    let of_k0 = r.key() == Some(b"k0".as_slice());
                    if t0.elapsed() < window {
                        let p = if of_k0 { -1 } else { r.partition() };
                        *c.lock().unwrap().entry(p).or_default() += 1;
                    }
                    Ok(())
                }
            });
            let stop = async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if started
                        .lock()
                        .unwrap()
                        .is_some_and(|t| t.elapsed() >= window)
                    {
                        return;
                    }
                }
            };
            processor.run(handler, stop).await?;
            let counts = counts.lock().unwrap().clone();
            let count = |p: i32| counts.get(&p).copied().unwrap_or(0);
            let (others, what) = match by_key {
                None => ((1..4).map(count).sum::<u64>(), "partitions 1-3"),
                Some(_) => (count(0), "partition 0's other keys"),
            };
            let rate = others as f64 / window.as_secs_f64();
            println!(
                "run {run} {:>7}: {what} handled {rate:>7.0} records/s; partition 0 handled {}, of them key k0 {}",
                if failing { "failing" } else { "clean" },
                count(0) + count(-1),
                count(-1)
            );
            results.push((failing, rate));
        }
    }
    let median = |f: bool| {
        let mut v: Vec<f64> = results.iter().filter(|r| r.0 == f).map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (clean, failing) = (median(false), median(true));
    let (what, retrying) = match by_key {
        None => ("partitions 1-3", "partition 0"),
        Some(_) => ("partition 0's other keys", "key k0 of partition 0"),
    };
    println!(
        "median {what}: clean {clean:.0} records/s, with {retrying} retrying for {secs} s {failing:.0} records/s: ratio {:.3}",
        failing / clean
    );
    Ok(())
}
