//! Peak memory while consuming a large topic with a bounded buffer.
//!
//! `cargo run --release -p protocol-tests --no-default-features --bin bench-memory [-- --mb 1024 --cap-mb 64 --runs 3 --app-mib-per-s 40]`
//!
//! Starts tansu (the mock cluster keeps only 5 MiB per partition), writes `--mb` MiB of
//! 1 KiB records with librdkafka's producer, then, for each run, starts a fresh child
//! process that consumes everything with ottla (manual assignment, `buffer_max_bytes`
//! = `--cap-mb`) and reports its own peak RSS (`VmHWM`) before and after. The child
//! processes at most `--app-mib-per-s` (0: as fast as it can), slower than the broker
//! delivers, so the buffer fills to its cap and the cap is what is measured (with
//! `max.partition.fetch.bytes` at 16 MiB, the partitions alone could hold twice the
//! default cap). glibc's malloc raises its mmap threshold as large blocks are freed and
//! then keeps freed heap pages; run with `MALLOC_MMAP_THRESHOLD_=131072` to see the
//! figure without that (the children inherit the environment). The producer
//! lives in the parent, so its buffers do not count. Prints one line per run and the
//! median.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use protocol_tests::peer::Peer;

const TOPIC: &str = "memory";
const PARTITIONS: i32 = 8;
const RECORD: usize = 1024;

use ottla_bench::arg;

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-memory") {
        return refused;
    }
    if std::env::args().nth(1).as_deref() == Some("consume") {
        return consume();
    }
    let mb = arg("--mb", 1024);
    let cap_mb = arg("--cap-mb", 64);
    let runs = arg("--runs", 3);
    let rate = arg("--app-mib-per-s", 40);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench-memory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let peer = match Peer::tansu() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench-memory: tansu: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = peer.create_topic(TOPIC, PARTITIONS) {
        eprintln!("bench-memory: {e:#}");
        return ExitCode::FAILURE;
    }
    let records = mb * 1024 * 1024 / RECORD as u64;
    let started = Instant::now();
    if let Err(e) = runtime.block_on(produce(&peer.bootstrap(), records)) {
        eprintln!("bench-memory: produce: {e:#}");
        return ExitCode::FAILURE;
    }
    println!(
        "wrote {records} records of {RECORD} B ({mb} MiB) to tansu in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("bench-memory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut peaks = Vec::new();
    for run in 1..=runs {
        let out = Command::new(&exe)
            .args([
                "consume",
                &peer.bootstrap(),
                &records.to_string(),
                &cap_mb.to_string(),
                &rate.to_string(),
            ])
            .output();
        match out {
            Ok(out) if out.status.success() => {
                let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
                println!("run {run}: {line}");
                if let Some(peak) = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("peak_rss_mib="))
                    .and_then(|v| v.parse::<f64>().ok())
                {
                    peaks.push(peak);
                }
            }
            Ok(out) => {
                eprintln!(
                    "run {run} failed: {}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("run {run}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    peaks.sort_by(f64::total_cmp);
    if let Some(median) = peaks.get(peaks.len() / 2) {
        println!(
            "median peak RSS {median:.1} MiB consuming {mb} MiB with a {cap_mb} MiB buffer cap ({:.2}x the cap; application at {} MiB/s)",
            median / cap_mb as f64,
            if rate == 0 {
                "full speed".to_string()
            } else {
                rate.to_string()
            }
        );
    }
    ExitCode::SUCCESS
}

async fn produce(bootstrap: &str, records: u64) -> anyhow::Result<()> {
    use rdkafka::producer::{FutureRecord, Producer};
    let producer = protocol_tests::data::producer(
        bootstrap,
        "none",
        &[("linger.ms", "50"), ("batch.size", "1000000")],
    )?;
    let value = vec![b'x'; RECORD - 16];
    let mut pending = std::collections::VecDeque::new();
    for i in 0..records {
        let key = format!("{i:016}");
        let p = (i % PARTITIONS as u64) as i32;
        let mut record = FutureRecord::to(TOPIC)
            .partition(p)
            .key(key.as_bytes())
            .payload(&value[..]);
        loop {
            match producer.send_result(record) {
                Ok(d) => {
                    pending.push_back(d);
                    break;
                }
                Err((_, r)) => {
                    record = r;
                    if let Some(d) = pending.pop_front() {
                        let _ = d.await;
                    } else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        }
        while pending.len() > 200_000 {
            if let Some(d) = pending.pop_front() {
                d.await?
                    .map_err(|(e, _)| anyhow::anyhow!("delivery: {e}"))?;
            }
        }
    }
    for d in pending {
        d.await?
            .map_err(|(e, _)| anyhow::anyhow!("delivery: {e}"))?;
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

fn consume() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(bootstrap), Some(records), Some(cap_mb), Some(rate)) = (
        args.get(2),
        args.get(3).and_then(|v| v.parse::<u64>().ok()),
        args.get(4).and_then(|v| v.parse::<usize>().ok()),
        args.get(5).and_then(|v| v.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: bench-memory consume BOOTSTRAP RECORDS CAP_MB APP_MIB_PER_S");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let mut consumer = Consumer::builder(bootstrap)
            .assign((0..PARTITIONS).map(|p| TopicPartition::new(TOPIC, p)))
            .offset_reset(OffsetReset::Earliest)
            .buffer_max_bytes(cap_mb * 1024 * 1024)
            // 8 partitions x 16 MiB could hold 128 MiB: the cap is what binds.
            .max_partition_fetch_bytes(16 * 1024 * 1024)
            .build()
            .await?;
        let baseline = status_kb("VmRSS:");
        let started = Instant::now();
        let (mut n, mut bytes, mut max_buffered) = (0u64, 0u64, 0usize);
        while n < records {
            let batch = consumer.recv_batch(1000).await?;
            max_buffered = max_buffered.max(consumer.buffered_bytes());
            for r in &batch {
                bytes += r.value_bytes().as_ref().map_or(0, |v| v.len() as u64);
            }
            n += batch.len() as u64;
            drop(batch);
            if rate > 0 {
                // Pace the application: never ahead of `rate` MiB/s.
                let due = Duration::from_secs_f64(bytes as f64 / (rate as f64 * 1048576.0));
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }
        let secs = started.elapsed().as_secs_f64();
        anyhow::Ok((baseline, n, bytes, secs, max_buffered))
    });
    match result {
        Ok((baseline, n, bytes, secs, max_buffered)) => {
            let mib = |kb: u64| kb as f64 / 1024.0;
            println!(
                "records={n} value_mib={:.0} secs={secs:.2} mib_per_s={:.0} baseline_rss_mib={:.1} peak_rss_mib={:.1} max_buffered_mib={:.1}",
                bytes as f64 / 1048576.0,
                bytes as f64 / 1048576.0 / secs,
                mib(baseline),
                mib(status_kb("VmHWM:")),
                max_buffered as f64 / 1048576.0
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("consume: {e:#}");
            ExitCode::FAILURE
        }
    }
}
