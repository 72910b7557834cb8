//! Produce throughput, ottla beside librdkafka (rust-rdkafka), on one tansu broker in
//! one run.
//!
//! `cargo run --release -p protocol-tests --no-default-features --bin bench-produce [-- --records 500000 --size 100 --runs 3]`
//!
//! Each client runs in its own child process, interleaved (ottla, rdkafka, ottla, ...),
//! each writing `--records` unkeyed records of `--size` bytes to a fresh 8-partition
//! topic with the same settings: acks=all, idempotence on, linger 5 ms, batch.size
//! 1 MiB, no compression. A child reports wall time and its own CPU time (user + system,
//! from /proc/self/stat). The broker shares the 2 cores, so CPU per record is the
//! figure to compare; records/s is partly the broker's. Prints medians and ratios.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use protocol_tests::peer::Peer;

const PARTITIONS: i32 = 8;

use ottla_bench::{arg, cpu_seconds};

fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-produce") {
        return refused;
    }
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args);
    }
    let records = arg("--records", 500_000);
    let size = arg("--size", 100);
    let runs = arg("--runs", 3);
    let peer = match Peer::tansu() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench-produce: tansu: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut results: Vec<(&str, f64, f64)> = Vec::new();
    println!(
        "{records} records of {size} B per run, 8 partitions, acks=all, idempotent, linger 5 ms, batch.size 1 MiB, no compression, tansu"
    );
    for run in 1..=runs {
        for client in ["ottla", "rdkafka"] {
            let topic = format!("bench-{client}-{run}");
            if let Err(e) = peer.create_topic(&topic, PARTITIONS) {
                eprintln!("bench-produce: {e:#}");
                return ExitCode::FAILURE;
            }
            let figures = ottla_bench::run_child(&[
                client.to_string(),
                peer.bootstrap(),
                topic,
                records.to_string(),
                size.to_string(),
            ]);
            match figures {
                Ok(f) => {
                    let (secs, cpu) = (f.secs, f.cpu_secs);
                    println!(
                        "run {run} {client:>7}: {:>9.0} records/s  {:>6.2} us CPU/record  ({secs:.2} s wall, {cpu:.2} s CPU)",
                        records as f64 / secs,
                        cpu * 1e6 / records as f64
                    );
                    results.push((client, records as f64 / secs, cpu * 1e6 / records as f64));
                }
                Err(e) => {
                    eprintln!("run {run} {client}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    let median = |client: &str, pick: fn(&(&str, f64, f64)) -> f64| {
        let mut v: Vec<f64> = results.iter().filter(|r| r.0 == client).map(pick).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (ot, rt) = (median("ottla", |r| r.1), median("rdkafka", |r| r.1));
    let (oc, rc) = (median("ottla", |r| r.2), median("rdkafka", |r| r.2));
    println!(
        "median: ottla {ot:.0} records/s, {oc:.2} us CPU/record; rdkafka {rt:.0} records/s, {rc:.2} us CPU/record"
    );
    println!(
        "ratio ottla/rdkafka: throughput {:.2}x, CPU per record {:.2}x",
        ot / rt,
        oc / rc
    );
    ExitCode::SUCCESS
}

fn child(args: &[String]) -> ExitCode {
    let (Some(client), Some(bootstrap), Some(topic), Some(records), Some(size)) = (
        args.get(2),
        args.get(3),
        args.get(4),
        args.get(5).and_then(|v| v.parse::<u64>().ok()),
        args.get(6).and_then(|v| v.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: bench-produce child ottla|rdkafka BOOTSTRAP TOPIC RECORDS SIZE");
        return ExitCode::from(2);
    };
    let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    let value = vec![b'x'; size];
    let result = runtime.block_on(async {
        let cpu0 = cpu_seconds();
        let started = Instant::now();
        match client.as_str() {
            "ottla" => ottla_produce(bootstrap, topic, records, &value).await?,
            _ => rdkafka_produce(bootstrap, topic, records, &value).await?,
        }
        anyhow::Ok((started.elapsed().as_secs_f64(), cpu_seconds() - cpu0))
    });
    match result {
        Ok((secs, cpu)) => {
            println!("secs={secs:.3} cpu_secs={cpu:.3}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{client}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn ottla_produce(
    bootstrap: &str,
    topic: &str,
    records: u64,
    value: &[u8],
) -> anyhow::Result<()> {
    use ottla::producer::{Producer, ProducerRecord};
    let producer = Producer::builder(bootstrap)
        .linger(Duration::from_millis(5))
        .batch_size(1024 * 1024)
        .buffer_memory(64 * 1024 * 1024)
        .build()
        .await?;
    let value = bytes::Bytes::copy_from_slice(value);
    let mut pending = VecDeque::new();
    for _ in 0..records {
        let mut r = ProducerRecord::new(topic);
        r.value = Some(value.clone());
        pending.push_back(producer.send(r).await?);
        if pending.len() > 200_000
            && let Some(f) = pending.pop_front()
        {
            f.await?;
        }
    }
    for f in pending {
        f.await?;
    }
    producer.close().await;
    Ok(())
}

async fn rdkafka_produce(
    bootstrap: &str,
    topic: &str,
    records: u64,
    value: &[u8],
) -> anyhow::Result<()> {
    use rdkafka::producer::{FutureRecord, Producer};
    let producer = protocol_tests::data::producer(
        bootstrap,
        "none",
        &[
            ("linger.ms", "5"),
            ("batch.size", "1048576"),
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("queue.buffering.max.kbytes", "65536"),
        ],
    )?;
    let mut pending = VecDeque::new();
    for _ in 0..records {
        let mut record = FutureRecord::<(), [u8]>::to(topic).payload(value);
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
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
        }
        if pending.len() > 200_000
            && let Some(d) = pending.pop_front()
        {
            d.await?.map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
        }
    }
    for d in pending {
        d.await?.map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(())
}
