//! The child side: one client consumes one cell and reports.
//!
//! `bench --child CLIENT --bootstrap HOST:PORT --topic T --counts N0,N1,... --group G
//! --timeout SECS`
//!
//! It prints `result records=N bytes=B first=S last=S bad=K hwm_kib=M` (times in
//! seconds since the process started, `VmHWM` at the end) and exits without closing the client: what closing costs
//! (LeaveGroup, final commits) is not what is measured, and each run uses a fresh group.

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::Notify;

use super::{
    Client, HEARTBEAT_INTERVAL, POLL_RECORDS, PROCESSOR_BATCH, PartTally, REMAINING,
    SESSION_TIMEOUT, Tally, opt,
};

/// What the child was asked to do.
#[derive(Debug, Clone)]
struct Job {
    client: Client,
    bootstrap: String,
    topic: String,
    counts: Vec<i64>,
    group: String,
}

/// The result of one child, as counted.
#[derive(Debug)]
struct Outcome {
    records: u64,
    bytes: u64,
    bad: u64,
    first: Instant,
    last: Instant,
}

impl Outcome {
    fn of(tally: &Tally) -> anyhow::Result<Outcome> {
        let (Some(first), Some(last)) = (tally.first, tally.last) else {
            bail!("the client stopped before every record came");
        };
        Ok(Outcome {
            records: tally.records(),
            bytes: tally.bytes(),
            bad: tally.bad(),
            first,
            last,
        })
    }
}

/// Entry point of `bench --child ...`.
pub fn main() -> ExitCode {
    let started = Instant::now();
    let job = match parse() {
        Ok(j) => j,
        Err(e) => {
            eprintln!("bench child: {e:#}");
            return ExitCode::from(2);
        }
    };
    start_child(&job.counts);
    let outcome = if job.client.is_async() {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("building the tokio runtime")
            .and_then(|rt| rt.block_on(consume_async(&job)))
    } else {
        consume_sync(&job)
    };
    match outcome {
        Ok(o) => {
            let secs = |t: Instant| t.duration_since(started).as_secs_f64();
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "result records={} bytes={} first={:.6} last={:.6} bad={} hwm_kib={}",
                o.records,
                o.bytes,
                secs(o.first),
                secs(o.last),
                o.bad,
                vm_hwm_kib()
            );
            let _ = out.flush();
            hard_exit(0)
        }
        Err(e) => {
            eprintln!("{e:#}");
            let _ = std::io::stderr().flush();
            hard_exit(1)
        }
    }
}

/// What every bench child does first: logs to stderr when `RUST_LOG` is set, and a
/// watchdog that ends the process (code 3) after `--timeout` seconds (120 by default),
/// saying how many of the records in `counts` it read.
pub fn start_child(counts: &[i64]) {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let timeout = opt("--timeout")
        .and_then(|v| v.parse().ok())
        .unwrap_or(120u64);
    let target: u64 = counts.iter().map(|&c| c as u64).sum();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(timeout));
        let left = REMAINING.load(Ordering::Relaxed).min(target);
        eprintln!(
            "timed out after {timeout} s with {} of {target} records",
            target - left
        );
        let _ = std::io::stderr().flush();
        hard_exit(3);
    });
}

/// Ends the process at once, without atexit handlers or destructors: a client's
/// threads may hold locks those would wait for (a child once hung in `exit` for good),
/// and closing a client is not what is measured. Flush what must be seen first.
pub fn hard_exit(code: i32) -> ! {
    // SAFETY: `_exit` only ends the process; nothing runs after it.
    unsafe { libc::_exit(code) }
}

/// This process's peak RSS (`VmHWM`), KiB. Unlike rusage's `ru_maxrss`, which Linux
/// carries across `execve` (so a child starts at its parent's size, the parent here
/// holds the mock cluster and the producer's buffers), it counts only this program's
/// own memory.
pub fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn parse() -> anyhow::Result<Job> {
    let need = |name: &str| opt(name).with_context(|| format!("missing {name}"));
    let client = need("--child")?;
    let client = Client::parse(&client).with_context(|| format!("unknown client {client}"))?;
    let counts = need("--counts")?
        .split(',')
        .map(|c| c.parse::<i64>().context("--counts"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Job {
        client,
        bootstrap: need("--bootstrap")?,
        topic: need("--topic")?,
        counts,
        group: need("--group")?,
    })
}

fn consume_sync(job: &Job) -> anyhow::Result<Outcome> {
    match job.client {
        Client::RdBase => rdkafka_base(job, Some("20")),
        Client::RdBaseDefault => rdkafka_base(job, None),
        other => bail!("{} is not a synchronous client", other.name()),
    }
}

async fn consume_async(job: &Job) -> anyhow::Result<Outcome> {
    match job.client {
        Client::Ottla => ottla(job, false, None).await,
        Client::OttlaShortWait => ottla(job, false, Some(Duration::from_millis(50))).await,
        Client::OttlaRecv => ottla(job, true, None).await,
        Client::OttlaProc => processor(job, false).await,
        Client::OttlaProcBatch => processor(job, true).await,
        Client::RdStream => rdkafka_stream(job).await,
        Client::Rskafka | Client::Krafka | Client::Confluent => other_client(job).await,
        other => bail!("{} is not an async client", other.name()),
    }
}

/// rskafka, krafka or the confluent-kafka crate, compiled in with the `other-clients`
/// feature (a default: scripts/test.sh builds this crate's unit tests without it, so
/// that the test build compiles no other client).
#[cfg(feature = "other-clients")]
async fn other_client(job: &Job) -> anyhow::Result<Outcome> {
    match job.client {
        Client::Rskafka => rskafka(job).await,
        Client::Krafka => krafka(job).await,
        Client::Confluent => confluent(job).await,
        other => bail!("{} is not one of the other clients", other.name()),
    }
}

#[cfg(not(feature = "other-clients"))]
async fn other_client(job: &Job) -> anyhow::Result<Outcome> {
    bail!(
        "{} is not compiled in: ottla-bench was built without its default `other-clients` feature",
        job.client.name()
    )
}

fn len(b: Option<&[u8]>) -> usize {
    b.map_or(0, <[u8]>::len)
}

// ---- ottla ------------------------------------------------------------------------

async fn ottla(job: &Job, per_record: bool, max_wait: Option<Duration>) -> anyhow::Result<Outcome> {
    use ottla::consumer::{Consumer, OffsetReset};
    let mut builder = Consumer::builder(&job.bootstrap);
    if let Some(wait) = max_wait {
        builder = builder.fetch_max_wait(wait);
    }
    let mut consumer = builder
        .group_id(job.group.clone())
        .topics([job.topic.clone()])
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(SESSION_TIMEOUT)
        .heartbeat_interval(HEARTBEAT_INTERVAL)
        .build()
        .await
        .context("building the ottla consumer")?;
    let mut tally = Tally::new(&job.counts);
    if per_record {
        while !tally.done() {
            let r = consumer
                .recv()
                .await
                .context("the consumer stopped")?
                .context("recv")?;
            tally.see(r.partition(), r.offset(), len(r.key()) + len(r.value()));
            if r.offset() % 4096 == 0 {
                tally.progress();
            }
        }
    } else {
        while !tally.done() {
            let batch = consumer
                .recv_batch(POLL_RECORDS)
                .await
                .context("recv_batch")?;
            for r in &batch {
                tally.see(r.partition(), r.offset(), len(r.key()) + len(r.value()));
            }
            tally.progress();
        }
    }
    Outcome::of(&tally)
}

/// A tally shared by the processor's lanes: one lock per partition (a lane handles one
/// partition at a time, so the locks are uncontended). The count of records still to
/// come is published every 4,096 records of a partition and at its end, and the time of
/// the first record is set once, so that a record costs the handler about what it
/// costs the raw clients' loops (a lock besides).
struct SharedTally {
    parts: Vec<Mutex<SharedPart>>,
    remaining: AtomicU64,
    first: std::sync::OnceLock<Instant>,
    last: Mutex<Option<Instant>>,
    done: Notify,
}

/// One partition of a [`SharedTally`].
#[derive(Clone)]
struct SharedPart {
    tally: PartTally,
    /// Records counted and not yet taken off `SharedTally::remaining`.
    unpublished: u64,
}

impl SharedTally {
    fn see(&self, partition: i32, records: &[ottla::consumer::ConsumerRecord]) {
        let Some(part) = usize::try_from(partition)
            .ok()
            .and_then(|p| self.parts.get(p))
        else {
            return;
        };
        let mut part = part.lock().unwrap_or_else(|e| e.into_inner());
        let mut new = 0;
        for r in records {
            new += u64::from(part.tally.see(r.offset(), len(r.key()) + len(r.value())));
        }
        if new == 0 {
            return;
        }
        part.unpublished += new;
        let new = if part.unpublished >= 4096 || part.tally.next >= part.tally.end {
            std::mem::take(&mut part.unpublished)
        } else {
            0
        };
        drop(part);
        self.first.get_or_init(Instant::now);
        if new == 0 {
            return;
        }
        let left = self.remaining.fetch_sub(new, Ordering::Relaxed) - new;
        REMAINING.store(left, Ordering::Relaxed);
        if left == 0 {
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            self.done.notify_one();
        }
    }
}

async fn processor(job: &Job, batch: bool) -> anyhow::Result<Outcome> {
    use ottla::consumer::OffsetReset;
    use ottla::processor::Processor;
    let shared = Arc::new(SharedTally {
        parts: job
            .counts
            .iter()
            .map(|&c| {
                Mutex::new(SharedPart {
                    tally: PartTally::new(c),
                    unpublished: 0,
                })
            })
            .collect(),
        remaining: AtomicU64::new(job.counts.iter().map(|&c| c as u64).sum()),
        first: std::sync::OnceLock::new(),
        last: Mutex::new(None),
        done: Notify::new(),
    });
    // The handler never fails, so nothing is dead-lettered: no dead-letter topic, and
    // no startup check for one (the bench's topics are created by the parent).
    let processor = Processor::builder(&job.bootstrap, &job.group, [job.topic.clone()])
        .check_topics(false)
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .timeouts(
            SESSION_TIMEOUT,
            HEARTBEAT_INTERVAL,
            Duration::from_secs(300),
        )
        .build()
        .await
        .context("building the ottla processor")?;
    let tally = shared.clone();
    // Never shut down: the child exits once every record is in.
    let forever = std::future::pending::<()>();
    let run = if batch {
        tokio::spawn(processor.run_batch(
            PROCESSOR_BATCH,
            move |records, _cancel| {
                if let Some(r) = records.first() {
                    tally.see(r.partition(), records);
                }
                async { Ok(()) }
            },
            forever,
        ))
    } else {
        tokio::spawn(processor.run(
            move |record, _cancel| {
                tally.see(record.partition(), std::slice::from_ref(record));
                async { Ok(()) }
            },
            forever,
        ))
    };
    tokio::select! {
        () = shared.done.notified() => {}
        r = run => bail!("the processor stopped early: {r:?}"),
    }
    let first = shared.first.get().copied();
    let last = *shared.last.lock().unwrap_or_else(|e| e.into_inner());
    let parts: Vec<PartTally> = shared
        .parts
        .iter()
        .map(|p| p.lock().unwrap_or_else(|e| e.into_inner()).tally.clone())
        .collect();
    let (Some(first), Some(last)) = (first, last) else {
        bail!("no records");
    };
    Ok(Outcome {
        records: parts.iter().map(|p| p.records).sum(),
        bytes: parts.iter().map(|p| p.bytes).sum(),
        bad: parts.iter().map(PartTally::bad).sum(),
        first,
        last,
    })
}

// ---- rust-rdkafka -----------------------------------------------------------------

fn rdkafka_config(job: &Job, fetch_queue_backoff_ms: Option<&str>) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", &job.bootstrap)
        .set("group.id", &job.group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set(
            "session.timeout.ms",
            SESSION_TIMEOUT.as_millis().to_string(),
        )
        .set(
            "heartbeat.interval.ms",
            HEARTBEAT_INTERVAL.as_millis().to_string(),
        );
    if let Some(ms) = fetch_queue_backoff_ms {
        config.set("fetch.queue.backoff.ms", ms);
    }
    config
}

fn rdkafka_base(job: &Job, fetch_queue_backoff_ms: Option<&str>) -> anyhow::Result<Outcome> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka_config(job, fetch_queue_backoff_ms)
        .create()
        .context("creating the BaseConsumer")?;
    consumer.subscribe(&[&job.topic]).context("subscribe")?;
    let mut tally = Tally::new(&job.counts);
    let mut errors = 0;
    while !tally.done() {
        match consumer.poll(Duration::from_millis(100)) {
            None => tally.progress(),
            Some(Ok(m)) => {
                tally.see(m.partition(), m.offset(), len(m.key()) + len(m.payload()));
                if m.offset() % 4096 == 0 {
                    tally.progress();
                }
            }
            Some(Err(e)) => {
                errors += 1;
                if errors <= 5 {
                    eprintln!("poll: {e}");
                }
            }
        }
    }
    Outcome::of(&tally)
}

async fn rdkafka_stream(job: &Job) -> anyhow::Result<Outcome> {
    use rdkafka::Message;
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let consumer: StreamConsumer = rdkafka_config(job, Some("20"))
        .create()
        .context("creating the StreamConsumer")?;
    consumer.subscribe(&[&job.topic]).context("subscribe")?;
    let mut tally = Tally::new(&job.counts);
    let mut errors = 0;
    while !tally.done() {
        match consumer.recv().await {
            Ok(m) => {
                tally.see(m.partition(), m.offset(), len(m.key()) + len(m.payload()));
                if m.offset() % 4096 == 0 {
                    tally.progress();
                }
            }
            Err(e) => {
                errors += 1;
                if errors <= 5 {
                    eprintln!("recv: {e}");
                }
            }
        }
    }
    Outcome::of(&tally)
}

// ---- rskafka ----------------------------------------------------------------------

#[cfg(feature = "other-clients")]
async fn rskafka(job: &Job) -> anyhow::Result<Outcome> {
    use super::{FETCH_MAX_WAIT_MS, PARTITION_FETCH_BYTES};
    use rskafka::client::ClientBuilder;
    use rskafka::client::partition::UnknownTopicHandling;
    let brokers = job.bootstrap.split(',').map(str::to_string).collect();
    let client = ClientBuilder::new(brokers)
        .build()
        .await
        .context("connecting rskafka")?;
    let remaining = Arc::new(AtomicU64::new(job.counts.iter().map(|&c| c as u64).sum()));
    let mut tasks = tokio::task::JoinSet::new();
    for (p, &end) in job.counts.iter().enumerate() {
        let partition = client
            .partition_client(job.topic.clone(), p as i32, UnknownTopicHandling::Retry)
            .await
            .with_context(|| format!("rskafka partition client {p}"))?;
        let remaining = remaining.clone();
        tasks.spawn(async move {
            let mut tally = PartTally::new(end);
            let mut first = None;
            while !tally.complete() {
                let (records, _high) = partition
                    .fetch_records(tally.next, 1..PARTITION_FETCH_BYTES, FETCH_MAX_WAIT_MS)
                    .await
                    .with_context(|| format!("fetch_records partition {p} at {}", tally.next))?;
                let before = tally.records;
                for r in &records {
                    // A compressed batch comes whole: skip what precedes the position.
                    if r.offset < tally.next {
                        continue;
                    }
                    tally.see(
                        r.offset,
                        len(r.record.key.as_deref()) + len(r.record.value.as_deref()),
                    );
                }
                if tally.records > before {
                    first.get_or_insert_with(Instant::now);
                    let n = tally.records - before;
                    let left = remaining.fetch_sub(n, Ordering::Relaxed) - n;
                    REMAINING.store(left, Ordering::Relaxed);
                }
            }
            anyhow::Ok((tally, first, Instant::now()))
        });
    }
    let (mut records, mut bytes, mut bad) = (0, 0, 0);
    let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
    while let Some(done) = tasks.join_next().await {
        let (tally, f, l) = done.context("an rskafka task panicked")??;
        records += tally.records;
        bytes += tally.bytes;
        bad += tally.bad();
        first = match (first, f) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        last = Some(last.map_or(l, |x| x.max(l)));
    }
    let (Some(first), Some(last)) = (first, last) else {
        bail!("no records");
    };
    Ok(Outcome {
        records,
        bytes,
        bad,
        first,
        last,
    })
}

// ---- krafka -----------------------------------------------------------------------

#[cfg(feature = "other-clients")]
async fn krafka(job: &Job) -> anyhow::Result<Outcome> {
    use krafka::Kafka;
    use krafka::consumer::AutoOffsetReset;
    let kafka = Kafka::builder(job.bootstrap.clone())
        .client_id("bench-krafka")
        .connect()
        .await
        .context("connecting krafka")?;
    let consumer = kafka
        .consumer(job.group.clone())
        .auto_offset_reset(AutoOffsetReset::Earliest)
        .enable_auto_commit(false)
        .session_timeout(SESSION_TIMEOUT)
        .heartbeat_interval(HEARTBEAT_INTERVAL)
        .max_poll_records(POLL_RECORDS as i32)
        .max_buffered_records(0)
        .build()
        .await
        .context("building the krafka consumer")?;
    consumer
        .subscribe([job.topic.as_str()])
        .await
        .context("krafka subscribe")?;
    let mut tally = Tally::new(&job.counts);
    while !tally.done() {
        let records = consumer
            .poll(Duration::from_millis(500))
            .await
            .context("krafka poll")?;
        for r in &records {
            tally.see(
                r.partition,
                r.offset,
                len(r.key.as_deref()) + len(r.value.as_deref()),
            );
        }
        tally.progress();
    }
    Outcome::of(&tally)
}

// ---- confluent-kafka (the Rust crate) ---------------------------------------------

#[cfg(feature = "other-clients")]
async fn confluent(job: &Job) -> anyhow::Result<Outcome> {
    use std::collections::HashMap;

    use bytes::Bytes;
    use confluent_kafka::common::TopicPartition;
    use confluent_kafka::common::serialization::BytesDeserializer;
    use confluent_kafka::consumer::{Consumer, ConsumerConfig, KafkaConsumer};
    let props: HashMap<String, String> = [
        ("bootstrap.servers", job.bootstrap.as_str()),
        // Its only group protocol; with no group.id it is never used.
        ("group.protocol", "consumer"),
        ("auto.offset.reset", "earliest"),
        ("enable.auto.commit", "false"),
        // Its default is read_committed; every other client reads uncommitted.
        ("isolation.level", "read_uncommitted"),
        ("max.poll.records", &POLL_RECORDS.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let config = ConsumerConfig::new(&props).map_err(|e| anyhow::anyhow!("config: {e:?}"))?;
    let mut consumer: KafkaConsumer<Bytes, Bytes> =
        KafkaConsumer::new(config, BytesDeserializer::new(), BytesDeserializer::new())
            .map_err(|e| anyhow::anyhow!("KafkaConsumer::new: {e:?}"))?;
    let partitions = (0..job.counts.len() as i32)
        .map(|p| TopicPartition::new(job.topic.as_str(), p))
        .collect();
    consumer
        .assign(partitions)
        .await
        .map_err(|e| anyhow::anyhow!("assign: {e:?}"))?;
    let mut tally = Tally::new(&job.counts);
    while !tally.done() {
        let records = consumer
            .poll(Duration::from_millis(500))
            .await
            .map_err(|e| anyhow::anyhow!("poll: {e:?}"))?;
        for r in &records {
            tally.see(
                r.partition(),
                r.offset(),
                len(r.key().map(|b| &b[..])) + len(r.value().map(|b| &b[..])),
            );
        }
        tally.progress();
    }
    Outcome::of(&tally)
}
