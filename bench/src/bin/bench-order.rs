//! Orders: the records/s of a Processor whose handler waits on a downstream call,
//! by partition (one call per partition at a time) beside by key (one call per key,
//! different keys at once), in one run on tansu.
//!
//! `cargo run --release -p ottla-bench --bin bench-order [-- --secs 15 --runs 3
//! --partitions 6 --keys 10000 --concurrency 256 --handler-ms 20]`
//!
//! For each run and order (interleaved), a fresh topic of `--partitions` partitions gets
//! records over `--keys` keys (the producer's murmur2 partitioner spreads them), enough
//! for the window; a Processor with that order and `--concurrency` runs a handler that
//! sleeps `--handler-ms` per record (a downstream call) and checks that no two calls of
//! one key overlap under key ordering. After a 2 s warm-up it counts the records
//! finished over `--secs`. Prints each run, the medians and their ratio (key ÷
//! partition); issue 35 asks for at least 30×.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::consumer::OffsetReset;
use ottla::processor::{ProcessError, ProcessingOrder, Processor, owned};
use ottla::producer::{Producer, ProducerRecord};
use protocol_tests::peer::Peer;

use ottla_bench::arg;

const WARM_UP: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-order") {
        return refused;
    }
    let plan = Plan {
        secs: arg("--secs", 15),
        runs: arg("--runs", 3),
        partitions: arg("--partitions", 6),
        keys: arg("--keys", 10_000),
        concurrency: arg("--concurrency", 256),
        handler_ms: arg("--handler-ms", 20),
    };
    match run(&plan).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-order: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Plan {
    secs: u64,
    runs: u64,
    partitions: u64,
    keys: u64,
    concurrency: u64,
    handler_ms: u64,
}

async fn run(plan: &Plan) -> anyhow::Result<()> {
    let peer = Peer::tansu()?;
    println!(
        "bench-order: tansu, {} partitions, {} keys, handler {} ms a record, concurrency {}, {} s window after {} s, {} runs",
        plan.partitions,
        plan.keys,
        plan.handler_ms,
        plan.concurrency,
        plan.secs,
        WARM_UP.as_secs(),
        plan.runs
    );
    let mut results: Vec<(ProcessingOrder, f64)> = Vec::new();
    for run in 1..=plan.runs {
        for order in [ProcessingOrder::Partition, ProcessingOrder::Key] {
            let rate = one(&peer, plan, run, order).await?;
            println!("run {run} {:<9} {rate:>9.0} records/s", label(order));
            results.push((order, rate));
        }
    }
    let median = |o: ProcessingOrder| {
        let mut v: Vec<f64> = results.iter().filter(|r| r.0 == o).map(|r| r.1).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (partition, key) = (
        median(ProcessingOrder::Partition),
        median(ProcessingOrder::Key),
    );
    // The bound: every partition's call back to back (partition), or every slot of
    // the concurrency busy (key).
    let per_call = 1000.0 / plan.handler_ms.max(1) as f64;
    println!("| order | records/s (median of {}) | bound |", plan.runs);
    println!("|---|---|---|");
    println!(
        "| partition | {partition:.0} | {:.0} |",
        per_call * plan.partitions as f64
    );
    println!(
        "| key | {key:.0} | {:.0} |",
        per_call * plan.concurrency as f64
    );
    println!("key ÷ partition: {:.1}×", key / partition);
    Ok(())
}

fn label(order: ProcessingOrder) -> &'static str {
    match order {
        ProcessingOrder::Partition => "partition",
        ProcessingOrder::Key => "key",
        _ => "unordered",
    }
}

/// One run: the records/s finished over the window.
async fn one(peer: &Peer, plan: &Plan, run: u64, order: ProcessingOrder) -> anyhow::Result<f64> {
    let topic = format!("order-{run}-{}", label(order));
    peer.create_topic(&topic, plan.partitions as i32)?;
    peer.create_topic(&format!("{topic}.dlq"), 1)?;
    // Enough for the window and the warm-up at the bound, and a fifth more.
    let calls_at_once = match order {
        ProcessingOrder::Partition => plan.partitions,
        _ => plan.concurrency,
    };
    let bound = calls_at_once as f64 * 1000.0 / plan.handler_ms.max(1) as f64;
    let records = (bound * (plan.secs + WARM_UP.as_secs() + 2) as f64 * 1.2) as u64;
    let producer = Producer::builder(&peer.bootstrap()).build().await?;
    let mut pending = Vec::new();
    for i in 0..records {
        let r = ProducerRecord::new(&topic)
            .key(format!("key-{}", i % plan.keys.max(1)))
            .value(format!("{i}"));
        pending.push(producer.send(r).await?);
    }
    for p in pending {
        p.await?;
    }
    producer.close().await;

    let processor = Processor::builder(&peer.bootstrap(), &format!("g-{topic}"), [topic.clone()])
        .ordering(order)
        .concurrency(plan.concurrency as usize)
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(60),
        )
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .build()
        .await?;
    let done = Arc::new(AtomicU64::new(0));
    let busy: Arc<Mutex<HashSet<Vec<u8>>>> = Arc::default();
    let overlaps = Arc::new(AtomicU64::new(0));
    let started = Arc::new(Mutex::new(None::<Instant>));
    let window = Duration::from_secs(plan.secs);
    let wait = Duration::from_millis(plan.handler_ms);
    let (d, b, o, s) = (
        done.clone(),
        busy.clone(),
        overlaps.clone(),
        started.clone(),
    );
    let handler = owned(move |r: ottla::ConsumerRecord, _| {
        let (d, b, o, s) = (d.clone(), b.clone(), o.clone(), s.clone());
        async move {
            let t0 = *s
                .lock()
                .map_err(|_| ProcessError::transient("Lock", "poisoned"))?
                .get_or_insert_with(Instant::now);
            let key = r.key().unwrap_or_default().to_vec();
            let fresh = b.lock().is_ok_and(|mut set| set.insert(key.clone()));
            if !fresh {
                o.fetch_add(1, AtomicOrdering::Relaxed);
            }
            tokio::time::sleep(wait).await;
            if fresh && let Ok(mut set) = b.lock() {
                set.remove(&key);
            }
            let at = t0.elapsed();
            if at >= WARM_UP && at < WARM_UP + window {
                d.fetch_add(1, AtomicOrdering::Relaxed);
            }
            Ok(())
        }
    });
    let stop = async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started
                .lock()
                .map(|t| t.is_some_and(|t| t.elapsed() >= WARM_UP + window))
                .unwrap_or(true)
            {
                return;
            }
        }
    };
    processor.run(handler, stop).await?;
    let overlaps = overlaps.load(AtomicOrdering::Relaxed);
    if order != ProcessingOrder::Unordered && overlaps > 0 {
        anyhow::bail!("{overlaps} calls started on a key while another call of it ran");
    }
    Ok(done.load(AtomicOrdering::Relaxed) as f64 / window.as_secs_f64())
}
