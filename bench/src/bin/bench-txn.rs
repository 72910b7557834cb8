//! Transactional produce (issue 31), ottla beside librdkafka (rust-rdkafka), on one
//! tansu broker in one run.
//!
//! `cargo run --release -p ottla-bench --bin bench-txn [-- --records 200000 --sizes 100,1024 --txn-sizes 100,10000 --runs 3 --rdkafka c-commit]`
//!
//! For each cell (record size × records per transaction), each client runs in its own
//! child process, interleaved (ottla, rdkafka, ottla, ...). A child makes one
//! transactional producer, calls `init_transactions` once, then begin → send N records
//! → commit until it has written `--records`, to a fresh 8-partition topic, record `i`
//! to partition `i % 8` on both sides (so every transaction of 8 records or more adds
//! the same 8 partitions). Same settings both sides: acks=all, idempotence (implied by
//! the transactional id), linger 5 ms, batch.size 1 MiB, 64 MiB of buffer, no
//! compression. A child reports the wall time and its own CPU time (user + system,
//! from /proc/self/stat) from just after `init_transactions` to the last commit; the
//! producer's creation and `init_transactions` do not count. The broker shares the 2
//! cores, so CPU per record is the figure to compare; records/s is partly the
//! broker's. Prints every run, then per cell the medians and ottla ÷ librdkafka ratios.
//!
//! The librdkafka child is a `BaseProducer`; `--rdkafka` says how it serves its
//! delivery reports and commits ([`RdMode`]). The default, `c-commit`, calls
//! librdkafka's own `rd_kafka_commit_transaction` while a second thread of the child
//! polls: rust-rdkafka 0.39's `commit_transaction` first runs a flush loop whose
//! `poll(100 ms)` always lasts its full 100 ms, which put about 100 ms into every
//! transaction (docs/benchmarks.md).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use protocol_tests::peer::Peer;

use ottla_bench::{arg, cpu_seconds};

const PARTITIONS: i32 = 8;
const CLIENTS: [&str; 2] = ["ottla", "rdkafka"];

/// A comma-separated list of numbers after `name`, or `default`.
fn list(name: &str, default: &[u64]) -> Vec<u64> {
    ottla_bench::opt(name).map_or_else(
        || default.to_vec(),
        |v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
    )
}

/// One child's figures: records/s, CPU µs per record, ms per transaction.
#[derive(Clone, Copy)]
struct Run {
    rate: f64,
    cpu_us: f64,
    txn_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-txn") {
        return refused;
    }
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args);
    }
    let records: u64 = arg("--records", 200_000);
    let sizes = list("--sizes", &[100, 1024]);
    let txn_sizes = list("--txn-sizes", &[100, 10_000]);
    let runs: u64 = arg("--runs", 3);
    let rd_mode = ottla_bench::opt("--rdkafka").unwrap_or_else(|| "c-commit".to_string());
    if RdMode::parse(&rd_mode).is_none() {
        eprintln!("bench-txn: --rdkafka polled|c-commit|threaded, not {rd_mode}");
        return ExitCode::from(2);
    }
    let peer = match Peer::tansu() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench-txn: tansu: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{records} records per run and client, {runs} runs, 8 partitions (record i to i % 8), \
         transactional (acks=all, idempotent), linger 5 ms, batch.size 1 MiB, no compression, tansu; \
         librdkafka mode {rd_mode}"
    );
    // (size, txn, client) -> runs
    let mut cells: Vec<(u64, u64, &str, Vec<Run>)> = Vec::new();
    for &size in &sizes {
        for &txn in &txn_sizes {
            let mut per_client: Vec<Vec<Run>> = vec![Vec::new(); CLIENTS.len()];
            for run in 1..=runs {
                for (c, client) in CLIENTS.iter().enumerate() {
                    let topic = format!("txn-{client}-{size}-{txn}-{run}");
                    if let Err(e) = peer.create_topic(&topic, PARTITIONS) {
                        eprintln!("bench-txn: {e:#}");
                        return ExitCode::FAILURE;
                    }
                    let figures = ottla_bench::run_child(&[
                        client.to_string(),
                        peer.bootstrap(),
                        topic,
                        records.to_string(),
                        size.to_string(),
                        txn.to_string(),
                        rd_mode.clone(),
                    ]);
                    let (secs, cpu) = match figures {
                        Ok(f) => (f.secs, f.cpu_secs),
                        Err(e) => {
                            eprintln!("{size} B, txn {txn}, run {run} {client}: {e}");
                            return ExitCode::FAILURE;
                        }
                    };
                    let txns = records.div_ceil(txn) as f64;
                    let r = Run {
                        rate: records as f64 / secs,
                        cpu_us: cpu * 1e6 / records as f64,
                        txn_ms: secs * 1e3 / txns,
                    };
                    println!(
                        "{size:>5} B  txn {txn:>6}  run {run} {client:>7}: {:>9.0} records/s  {:>6.2} us CPU/record  {:>8.2} ms/txn  ({secs:.2} s wall, {cpu:.2} s CPU)",
                        r.rate, r.cpu_us, r.txn_ms
                    );
                    per_client[c].push(r);
                }
            }
            for (c, client) in CLIENTS.iter().enumerate() {
                cells.push((size, txn, client, std::mem::take(&mut per_client[c])));
            }
        }
    }
    println!();
    println!(
        "| record | records/txn | ottla records/s | librdkafka records/s | ratio | ottla CPU µs/record | librdkafka CPU µs/record | ratio | ottla ms/txn | librdkafka ms/txn |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &size in &sizes {
        for &txn in &txn_sizes {
            let m = |client: &str, pick: fn(&Run) -> f64| {
                cells
                    .iter()
                    .find(|c| c.0 == size && c.1 == txn && c.2 == client)
                    .map_or(f64::NAN, |c| median(c.3.iter().map(pick).collect()))
            };
            let (ot, rt) = (m("ottla", |r| r.rate), m("rdkafka", |r| r.rate));
            let (oc, rc) = (m("ottla", |r| r.cpu_us), m("rdkafka", |r| r.cpu_us));
            let (om, rm) = (m("ottla", |r| r.txn_ms), m("rdkafka", |r| r.txn_ms));
            println!(
                "| {size} B | {txn} | {ot:.0} | {rt:.0} | {:.2}× | {oc:.2} | {rc:.2} | {:.2}× | {om:.2} | {rm:.2} |",
                ot / rt,
                oc / rc
            );
        }
    }
    ExitCode::SUCCESS
}

fn child(args: &[String]) -> ExitCode {
    let (Some(client), Some(bootstrap), Some(topic), Some(records), Some(size), Some(txn)) = (
        args.get(2),
        args.get(3),
        args.get(4),
        args.get(5).and_then(|v| v.parse::<u64>().ok()),
        args.get(6).and_then(|v| v.parse::<usize>().ok()),
        args.get(7)
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&n| n > 0),
    ) else {
        eprintln!("usage: bench-txn child ottla|rdkafka BOOTSTRAP TOPIC RECORDS SIZE TXN [MODE]");
        return ExitCode::from(2);
    };
    let value = vec![b'x'; size];
    let id = format!("bench-txn-{topic}");
    let result = match client.as_str() {
        "ottla" => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(ottla_txn(bootstrap, &id, topic, records, &value, txn))),
        _ => match args.get(8).map(String::as_str).map(RdMode::parse) {
            Some(Some(mode)) => rdkafka_txn(bootstrap, &id, topic, records, &value, txn, mode),
            _ => Err(anyhow::anyhow!(
                "rdkafka: no mode (polled, c-commit, threaded)"
            )),
        },
    };
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

/// ottla: `init_transactions`, then begin → `send` N → `commit_transaction`. The
/// delivery futures are dropped: `commit_transaction` waits for every batch of the
/// transaction and fails if one failed. Returns (wall seconds, CPU seconds) of the
/// transactions alone.
async fn ottla_txn(
    bootstrap: &str,
    id: &str,
    topic: &str,
    records: u64,
    value: &[u8],
    txn: u64,
) -> anyhow::Result<(f64, f64)> {
    use ottla::producer::{Producer, ProducerRecord};
    let producer = Producer::builder(bootstrap)
        .transactional_id(id)
        .linger(Duration::from_millis(5))
        .batch_size(1024 * 1024)
        .buffer_memory(64 * 1024 * 1024)
        .build()
        .await?;
    producer.init_transactions().await?;
    let value = bytes::Bytes::copy_from_slice(value);
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let mut i = 0u64;
    while i < records {
        producer.begin_transaction()?;
        let end = (i + txn).min(records);
        for j in i..end {
            let mut r = ProducerRecord::new(topic).partition((j % PARTITIONS as u64) as i32);
            r.value = Some(value.clone());
            drop(producer.send(r).await?);
        }
        producer.commit_transaction().await?;
        i = end;
    }
    let measured = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    producer.close().await;
    Ok(measured)
}

/// How the librdkafka child waits for its deliveries before the commit (`--rdkafka`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum RdMode {
    /// `polled`: a `BaseProducer` polled by the sending thread alone. `poll(0)` after
    /// every send; before the commit, `flush(0)` (which wakes the broker threads to
    /// send) and `poll(1 ms)` until `in_flight_count()` is 0; then rust-rdkafka's
    /// `commit_transaction`, whose own flush then finds nothing to wait for, so its
    /// `poll(100 ms)` never runs. Costs more CPU than `c-commit`: rust-rdkafka's
    /// `poll(1 ms)` spins through its last millisecond (it passes the time left,
    /// rounded down to whole milliseconds, to librdkafka: 0, which does not block).
    Polled,
    /// `c-commit` (the default): a `BaseProducer` whose delivery reports a second
    /// thread of the child serves (`poll(100 ms)` in a loop; each event is handled as
    /// it comes), and librdkafka's own `rd_kafka_commit_transaction` called directly,
    /// without the binding's flush loop in front. Its flush sends at once (linger
    /// skipped while it runs) and waits for the other thread to serve the reports:
    /// librdkafka's documented way for an application that takes delivery reports as
    /// events.
    CCommit,
    /// `threaded`: the previous harness, rust-rdkafka's `ThreadedProducer` and its
    /// `commit_transaction` (about 100 ms per transaction spent in the binding's flush).
    Threaded,
}

impl RdMode {
    fn parse(s: &str) -> Option<RdMode> {
        match s {
            "polled" => Some(RdMode::Polled),
            "c-commit" => Some(RdMode::CCommit),
            "threaded" => Some(RdMode::Threaded),
            _ => None,
        }
    }
}

/// librdkafka: `init_transactions`, then begin → `send` N → commit, the commit
/// waiting for every delivery report and failing if a delivery failed. How the
/// delivery reports are served and the commit called: [`RdMode`].
fn rdkafka_txn(
    bootstrap: &str,
    id: &str,
    topic: &str,
    records: u64,
    value: &[u8],
    txn: u64,
    mode: RdMode,
) -> anyhow::Result<(f64, f64)> {
    use rdkafka::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ThreadedProducer};
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.size", "1048576")
        .set("compression.type", "none")
        .set("queue.buffering.max.kbytes", "65536")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "60000");
    let timeout = Duration::from_secs(60);
    let record = |j: u64| {
        BaseRecord::<(), [u8]>::to(topic)
            .partition((j % PARTITIONS as u64) as i32)
            .payload(value)
    };
    if mode == RdMode::Threaded {
        let producer: ThreadedProducer<_> = config.create()?;
        producer.init_transactions(timeout)?;
        let measured = timed_txns(
            records,
            txn,
            || Ok(producer.begin_transaction()?),
            |j| {
                let mut r = record(j);
                while let Err((_, back)) = producer.send(r) {
                    // Queue full: the producer's thread drains it.
                    r = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            },
            || Ok(producer.commit_transaction(timeout)?),
        )?;
        drop(producer);
        return Ok(measured);
    }
    let producer: BaseProducer = config.create()?;
    producer.init_transactions(timeout)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let polled = mode == RdMode::Polled;
    std::thread::scope(|scope| {
        if !polled {
            // Serves the delivery reports while the main thread sends and commits.
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    producer.poll(Duration::from_millis(100));
                }
            });
        }
        let result = timed_txns(
            records,
            txn,
            || Ok(producer.begin_transaction()?),
            |j| {
                let mut r = record(j);
                loop {
                    match producer.send(r) {
                        Ok(()) => break,
                        Err((_, back)) => {
                            // Queue full: serve the reports (or let the other thread
                            // serve them), then again.
                            r = back;
                            if polled {
                                producer.poll(Duration::from_millis(1));
                            } else {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                        }
                    }
                }
                if polled {
                    producer.poll(Duration::ZERO);
                }
                Ok(())
            },
            || {
                if polled {
                    // Send at once (linger skipped while `flush` runs), serve the
                    // reports as they come, until none is outstanding.
                    while producer.in_flight_count() > 0 {
                        let _ = producer.flush(Duration::ZERO);
                        producer.poll(Duration::from_millis(1));
                    }
                    Ok(producer.commit_transaction(timeout)?)
                } else {
                    c_commit(&producer, timeout)
                }
            },
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        result
    })
}

/// `records` records in transactions of `txn`: `begin`, `send` of each record's index,
/// `commit`; the wall-clock and CPU seconds from the first begin to the last commit.
fn timed_txns(
    records: u64,
    txn: u64,
    mut begin: impl FnMut() -> anyhow::Result<()>,
    mut send: impl FnMut(u64) -> anyhow::Result<()>,
    mut commit: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64)> {
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let mut i = 0u64;
    while i < records {
        begin()?;
        let end = (i + txn).min(records);
        for j in i..end {
            send(j)?;
        }
        commit()?;
        i = end;
    }
    Ok((started.elapsed().as_secs_f64(), cpu_seconds() - cpu0))
}

/// librdkafka's own `rd_kafka_commit_transaction`, without rust-rdkafka's flush loop
/// in front of it. Another thread must serve the delivery reports.
fn c_commit(producer: &rdkafka::producer::BaseProducer, timeout: Duration) -> anyhow::Result<()> {
    use rdkafka::bindings as rd;
    use rdkafka::producer::Producer;
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: a live producer's handle; the returned error, if any, is ours to free.
    unsafe {
        let error = rd::rd_kafka_commit_transaction(producer.client().native_ptr(), ms);
        if error.is_null() {
            return Ok(());
        }
        let message = std::ffi::CStr::from_ptr(rd::rd_kafka_error_string(error))
            .to_string_lossy()
            .into_owned();
        rd::rd_kafka_error_destroy(error);
        anyhow::bail!("rd_kafka_commit_transaction: {message}")
    }
}
