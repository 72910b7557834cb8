//! What the `metrics` feature costs: `scripts/bench-metrics.sh` builds this program
//! twice, without the feature and with it, and runs the two builds in turn against one
//! backlog. Both install a Prometheus exporter (on a free port, unscraped); only the
//! second has anything to report to it.
//!
//! ```sh
//! metrics_cost produce BOOTSTRAP TOPIC COUNT          # fills TOPIC with 100-byte records
//! metrics_cost consume BOOTSTRAP TOPIC COUNT GROUP    # Processor::run, no-op handler
//! ```
//!
//! `consume` prints `result records=N cpu_s=C wall_s=W metrics=on|off`: CPU seconds of
//! the whole process (user plus system, from /proc/self/stat) from the start of the
//! run to the last record. It exits without closing the processor, so what closing
//! costs is not counted.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use ottla::consumer::OffsetReset;
use ottla::processor::Processor;
use ottla::producer::{Producer, ProducerRecord};

/// User plus system CPU seconds of this process, from /proc/self/stat (clock ticks
/// of 10 ms).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // The fields after the command name (in parentheses, which may hold spaces).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after ')'.
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (tick(11) + tick(12)) / 100.0
}

async fn produce(bootstrap: &str, topic: &str, count: u64) -> ottla::Result<()> {
    let producer = Producer::builder(bootstrap)
        .linger(Duration::from_millis(5))
        .build()
        .await?;
    let value = vec![b'x'; 100];
    let mut pending = std::collections::VecDeque::new();
    for i in 0..count {
        let record = ProducerRecord::new(topic)
            .key(format!("{i:08}"))
            .value(value.clone());
        pending.push_back(producer.send(record).await?);
        if pending.len() >= 50_000 {
            if let Some(d) = pending.pop_front() {
                d.await?;
            }
        }
    }
    for d in pending {
        d.await?;
    }
    producer.close().await;
    Ok(())
}

async fn consume(bootstrap: &str, topic: &str, count: u64, group: &str) -> ottla::Result<()> {
    let started = (Instant::now(), cpu_seconds());
    let processor = Processor::builder(bootstrap, group, [topic.to_string()])
        .check_topics(false)
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .timeouts(
            Duration::from_secs(10),
            Duration::from_secs(1),
            Duration::from_secs(300),
        )
        .build()
        .await?;
    let seen = Arc::new(AtomicU64::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (s, d) = (seen.clone(), done.clone());
    let run = tokio::spawn(processor.run(
        move |_record, _cancel| {
            if s.fetch_add(1, Ordering::Relaxed) + 1 == count {
                d.notify_one();
            }
            async { Ok(()) }
        },
        std::future::pending::<()>(),
    ));
    tokio::select! {
        () = done.notified() => {}
        r = run => {
            eprintln!("the processor stopped early: {r:?}");
            std::process::exit(1);
        }
    }
    let (wall, cpu) = (started.0.elapsed(), cpu_seconds() - started.1);
    println!(
        "result records={} cpu_s={cpu:.3} wall_s={:.3} metrics={}",
        seen.load(Ordering::Relaxed),
        wall.as_secs_f64(),
        if cfg!(feature = "metrics") {
            "on"
        } else {
            "off"
        }
    );
    // Not closed: the measurement ends at the last record.
    std::process::exit(0);
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let count = arg(3).and_then(|c| c.parse::<u64>().ok());
    let result = match (arg(0), arg(1), arg(2), count) {
        (Some("produce"), Some(bootstrap), Some(topic), Some(count)) => {
            produce(bootstrap, topic, count).await
        }
        (Some("consume"), Some(bootstrap), Some(topic), Some(count)) => {
            // Served on a free port, as a service would, so the exporter's upkeep
            // (draining histograms) runs too; nothing scrapes it here.
            if let Err(e) = PrometheusBuilder::new()
                .with_http_listener(([127, 0, 0, 1], 0))
                .install()
            {
                eprintln!("installing the recorder: {e}");
                return ExitCode::FAILURE;
            }
            consume(bootstrap, topic, count, arg(4).unwrap_or("metrics-cost")).await
        }
        _ => {
            eprintln!("usage: metrics_cost produce|consume BOOTSTRAP TOPIC COUNT [GROUP]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("metrics_cost: {e}");
            ExitCode::FAILURE
        }
    }
}
