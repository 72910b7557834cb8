//! The many-partition benchmark behind `bench-partitions` (issue 36, part 2): one
//! member that owns 24, 1,000 or 10,000 partitions (one topic, or many topics), ottla
//! beside rust-rdkafka on the same broker and the same data in one run.
//!
//! The parent ([`run`]) starts the broker, writes each shape's records once with
//! librdkafka's producer, then runs every client in its own child process
//! (`--child CLIENT ...`, the same program), interleaved, `runs` rounds, and reaps each
//! with `wait4` for its CPU time ([`super::run::run_child`]). A child joins a fresh
//! group, consumes every record from offset 0 (checking each partition's offsets for
//! loss and duplicates), prints one `result` line with the time of its assignment and
//! exits without closing. The commit variants commit every position after each batch
//! of up to [`POLL_RECORDS`] records: ottla with `commit_async` after each
//! `recv_batch`, librdkafka with an asynchronous `commit_consumer_state` every
//! [`POLL_RECORDS`] records, so both commit every owned partition as often.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rdkafka::producer::FutureProducer;

use super::child::{hard_exit, start_child, vm_hwm_kib};
use super::run::{run_child, start_peer};
use super::table::Sample;
use super::{HEARTBEAT_INTERVAL, POLL_RECORDS, SESSION_TIMEOUT, Tally, opt, size_label};

/// One consumer under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PClient {
    /// ottla's `Consumer`, `recv_batch`, no commits.
    Ottla,
    /// ottla's `Consumer`, `recv_batch`, `commit_async` after each batch.
    OttlaCommit,
    /// rust-rdkafka's `BaseConsumer`, no commits.
    Rdkafka,
    /// rust-rdkafka's `BaseConsumer`, an asynchronous commit of the consumer's state
    /// every [`POLL_RECORDS`] records.
    RdkafkaCommit,
}

impl PClient {
    /// Every client, in the order they run within a round.
    pub const ALL: [PClient; 4] = [
        PClient::Rdkafka,
        PClient::Ottla,
        PClient::RdkafkaCommit,
        PClient::OttlaCommit,
    ];

    /// Its name on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            PClient::Ottla => "ottla",
            PClient::OttlaCommit => "ottla-commit",
            PClient::Rdkafka => "rdkafka",
            PClient::RdkafkaCommit => "rdkafka-commit",
        }
    }

    /// The client named `name`.
    pub fn parse(name: &str) -> Option<PClient> {
        PClient::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The rust-rdkafka client an ottla client is compared with (itself for those).
    pub fn reference(self) -> PClient {
        match self {
            PClient::Ottla | PClient::Rdkafka => PClient::Rdkafka,
            PClient::OttlaCommit | PClient::RdkafkaCommit => PClient::RdkafkaCommit,
        }
    }

    /// How it consumes, and every setting that differs from its defaults.
    pub fn mode(self) -> String {
        let group = format!(
            "group (subscribe, session {} s, heartbeat {} s)",
            SESSION_TIMEOUT.as_secs(),
            HEARTBEAT_INTERVAL.as_secs()
        );
        match self {
            PClient::Ottla => {
                format!("ottla Consumer, {group}, recv_batch({POLL_RECORDS}), no commits")
            }
            PClient::OttlaCommit => format!(
                "ottla Consumer, {group}, recv_batch({POLL_RECORDS}), commit_async() of every position after each batch"
            ),
            PClient::Rdkafka => format!(
                "rust-rdkafka BaseConsumer, {group}, poll loop, fetch.queue.backoff.ms=20, no commits"
            ),
            PClient::RdkafkaCommit => format!(
                "rust-rdkafka BaseConsumer, {group}, poll loop, fetch.queue.backoff.ms=20, commit_consumer_state(Async) every {POLL_RECORDS} records"
            ),
        }
    }
}

/// One data set: how many partitions, over how many topics, how many records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Partitions in all, over every topic.
    pub partitions: i32,
    /// Topics, each with `partitions / topics` partitions.
    pub topics: i32,
    /// Records in all; record `i` is in global partition `i % partitions`.
    pub records: u64,
    /// Bytes of each value.
    pub value_size: usize,
}

impl Shape {
    /// `24p`, `10000p`, `100x100p`.
    pub fn label(&self) -> String {
        if self.topics == 1 {
            format!("{}p", self.partitions)
        } else {
            format!("{}x{}p", self.topics, self.per_topic())
        }
    }

    /// Partitions of each topic.
    pub fn per_topic(&self) -> i32 {
        self.partitions / self.topics.max(1)
    }

    /// What every topic name of the shape starts with.
    pub fn base(&self) -> String {
        format!(
            "bp-{}-{}t-{}p-{}",
            self.value_size, self.topics, self.partitions, self.records
        )
    }

    /// The topics' names.
    pub fn topic_names(&self) -> Vec<String> {
        topic_names(&self.base(), self.topics)
    }

    /// Records in each global partition (`topic * per_topic + partition`).
    pub fn counts(&self) -> Vec<i64> {
        let p = self.partitions as u64;
        (0..p)
            .map(|i| (self.records / p + u64::from(i < self.records % p)) as i64)
            .collect()
    }
}

fn topic_names(base: &str, topics: i32) -> Vec<String> {
    if topics == 1 {
        return vec![base.to_string()];
    }
    (0..topics).map(|t| format!("{base}-t{t}")).collect()
}

/// The global index of a partition: `topic * per_topic + partition`, the topic's
/// index read from its name's `-tN` suffix (0 for a one-topic shape).
fn global(topics: i32, per_topic: i32, topic: &str, partition: i32) -> i32 {
    if topics == 1 {
        return partition;
    }
    let t = topic
        .rsplit_once("-t")
        .and_then(|(_, n)| n.parse::<i32>().ok())
        .unwrap_or(-1);
    if t < 0 {
        return -1;
    }
    t * per_topic + partition
}

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `mock`, `tansu`, or both.
    pub brokers: Vec<String>,
    /// The shapes, in order; the first is the base of the growth ratios.
    pub shapes: Vec<Shape>,
    /// Clients, in round order.
    pub clients: Vec<PClient>,
    /// Rounds (each client once per round).
    pub runs: u64,
    /// Per-child time limit; `None`: from the record count.
    pub timeout: Option<u64>,
    /// Brokers of the mock cluster.
    pub mock_brokers: i32,
    /// Where to keep each child's stderr, if anywhere.
    pub child_logs: Option<PathBuf>,
}

/// One client on one shape of one broker.
#[derive(Debug, Clone)]
pub struct PRow {
    /// `mock` or `tansu`.
    pub broker: &'static str,
    /// The data.
    pub shape: Shape,
    /// The client.
    pub client: PClient,
    /// Why it has no figures, if so.
    pub failure: Option<String>,
    /// One per successful run.
    pub samples: Vec<Sample>,
}

impl PRow {
    /// The median of `f` over the samples that have it.
    pub fn median(&self, f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        let mut v: Vec<f64> = self.samples.iter().filter_map(f).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    fn cpu(&self) -> Option<f64> {
        self.usable()
            .then(|| self.median(|s| Some(s.cpu_per_million())))
            .flatten()
    }

    fn usable(&self) -> bool {
        self.failure.is_none() && !self.samples.is_empty()
    }
}

/// Seconds from the assignment to the first record.
fn first_after_assignment(s: &Sample) -> Option<f64> {
    s.assigned.map(|a| s.first - a)
}

/// Runs the plan, printing a table per shape as it completes, then the summary.
pub fn run(plan: &Plan) -> anyhow::Result<Vec<PRow>> {
    let exe = std::env::current_exe().context("finding this program")?;
    let runtime = tokio::runtime::Runtime::new().context("building a runtime")?;
    let mut rows = Vec::new();
    for broker in &plan.brokers {
        let peer = start_peer(broker, plan.mock_brokers)?;
        let bootstrap = peer.bootstrap();
        let mut broker_rows = Vec::new();
        for &shape in &plan.shapes {
            eprintln!(
                "[{}] {}: writing {} records",
                peer.name(),
                shape.label(),
                shape.records
            );
            let started = Instant::now();
            let prepared = shape
                .topic_names()
                .iter()
                .try_for_each(|t| peer.create_topic(t, shape.per_topic()))
                .and_then(|()| runtime.block_on(produce(&bootstrap, &shape)))
                .and_then(|()| verify(&bootstrap, &shape, peer.name() == "mock"));
            let cell_rows = match prepared {
                Err(e) => {
                    eprintln!("[{}] {}: {e:#}", peer.name(), shape.label());
                    plan.clients
                        .iter()
                        .map(|&client| PRow {
                            broker: peer.name(),
                            shape,
                            client,
                            failure: Some(format!("n/a: data not written: {e:#}")),
                            samples: Vec::new(),
                        })
                        .collect()
                }
                Ok(()) => {
                    eprintln!(
                        "[{}] {}: written in {:.1} s",
                        peer.name(),
                        shape.label(),
                        started.elapsed().as_secs_f64()
                    );
                    consume_shape(&exe, plan, peer.name(), &bootstrap, shape)
                }
            };
            print_shape(&cell_rows);
            broker_rows.extend(cell_rows);
        }
        print_summary(&broker_rows);
        rows.extend(broker_rows);
    }
    Ok(rows)
}

/// Every client on one shape, `runs` rounds, interleaved.
fn consume_shape(
    exe: &Path,
    plan: &Plan,
    broker: &'static str,
    bootstrap: &str,
    shape: Shape,
) -> Vec<PRow> {
    let mut rows: Vec<PRow> = plan
        .clients
        .iter()
        .map(|&client| PRow {
            broker,
            shape,
            client,
            failure: None,
            samples: Vec::new(),
        })
        .collect();
    let timeout = plan.timeout.unwrap_or(90 + shape.records / 10_000);
    for run in 1..=plan.runs {
        for row in rows.iter_mut() {
            if row.failure.is_some() {
                continue;
            }
            let group = format!(
                "bp-{}-{}-{run}-{}",
                row.client.name(),
                shape.base(),
                std::process::id()
            );
            let args = [
                "--child".to_string(),
                row.client.name().to_string(),
                "--bootstrap".into(),
                bootstrap.to_string(),
                "--base".into(),
                shape.base(),
                "--topics".into(),
                shape.topics.to_string(),
                "--partitions".into(),
                shape.partitions.to_string(),
                "--records".into(),
                shape.records.to_string(),
                "--group".into(),
                group,
                "--timeout".into(),
                timeout.to_string(),
            ];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let log = plan.child_logs.as_ref().map(|dir| {
                dir.join(format!(
                    "{broker}-{}-{}-{run}.log",
                    shape.base(),
                    row.client.name()
                ))
            });
            match run_child(
                exe,
                &args,
                Duration::from_secs(timeout + 30),
                log.as_deref(),
            ) {
                Ok(sample) => {
                    eprintln!(
                        "[{broker}] {} run {run} {:<15} {:>10.0} rec/s {:>7.3} CPU s/M {:>7.1} MiB  assigned at {:.2} s, first record {:.3} s after{}",
                        shape.label(),
                        row.client.name(),
                        sample.records_per_sec(),
                        sample.cpu_per_million(),
                        sample.rss_mib,
                        sample.assigned.unwrap_or(f64::NAN),
                        first_after_assignment(&sample).unwrap_or(f64::NAN),
                        if sample.bad > 0 {
                            format!("  {} BAD (duplicates, gaps or extra)", sample.bad)
                        } else {
                            String::new()
                        }
                    );
                    if sample.records != shape.records || sample.bad > 0 {
                        row.failure = Some(format!(
                            "n/a: counted {} of {} records, {} duplicated/missing",
                            sample.records, shape.records, sample.bad
                        ));
                    }
                    row.samples.push(sample);
                }
                Err(e) => {
                    eprintln!(
                        "[{broker}] {} run {run} {:<15} failed: {e:#}",
                        shape.label(),
                        row.client.name()
                    );
                    row.failure = Some(format!("n/a: {e:#}"));
                }
            }
        }
    }
    rows
}

fn print_shape(rows: &[PRow]) {
    let Some(head) = rows.first() else {
        return;
    };
    let shape = head.shape;
    let runs = rows.iter().map(|r| r.samples.len()).max().unwrap_or(0);
    println!();
    println!(
        "== {} · {} · {} partitions in {} topic{} · {} records of {} · median of {} run{}",
        head.broker,
        shape.label(),
        shape.partitions,
        shape.topics,
        if shape.topics == 1 { "" } else { "s" },
        shape.records,
        size_label(shape.value_size),
        runs,
        if runs == 1 { "" } else { "s" },
    );
    println!(
        "| {:<15} | {:>10} | {:>8} | {:>8} | {:>10} | {:>13} | {:>8} |",
        "client", "records/s", "CPU s/M", "RSS MiB", "assigned s", "1st rec after", "÷rd CPU"
    );
    println!(
        "|{:-<17}|{:->12}|{:->10}|{:->10}|{:->12}|{:->15}|{:->10}|",
        "", ":", ":", ":", ":", ":", ":"
    );
    for row in rows {
        if !row.usable() {
            println!(
                "| {:<15} | {} |",
                row.client.name(),
                row.failure.as_deref().unwrap_or("n/a: no run")
            );
            continue;
        }
        let reference = rows
            .iter()
            .find(|r| r.client == row.client.reference())
            .and_then(PRow::cpu);
        let cpu = row.cpu().unwrap_or(f64::NAN);
        println!(
            "| {:<15} | {:>10.0} | {:>8.3} | {:>8.1} | {:>10.2} | {:>12.3}s | {:>8} |",
            row.client.name(),
            row.median(|s| Some(s.records_per_sec()))
                .unwrap_or(f64::NAN),
            cpu,
            row.median(|s| Some(s.rss_mib)).unwrap_or(f64::NAN),
            row.median(|s| s.assigned).unwrap_or(f64::NAN),
            row.median(first_after_assignment).unwrap_or(f64::NAN),
            ratio(cpu, reference),
        );
    }
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 && a.is_finite() => format!("{:.2}", a / b),
        _ => "-".to_string(),
    }
}

/// CPU per record of every client on every shape, each shape's growth over the first
/// one, and ottla ÷ rust-rdkafka.
fn print_summary(rows: &[PRow]) {
    let Some(head) = rows.first() else {
        return;
    };
    let mut shapes: Vec<Shape> = Vec::new();
    for r in rows {
        if !shapes.contains(&r.shape) {
            shapes.push(r.shape);
        }
    }
    let mut clients: Vec<PClient> = Vec::new();
    for r in rows {
        if !clients.contains(&r.client) {
            clients.push(r.client);
        }
    }
    let Some(&base) = shapes.first() else {
        return;
    };
    let cpu = |shape: Shape, client: PClient| {
        rows.iter()
            .find(|r| r.shape == shape && r.client == client)
            .and_then(PRow::cpu)
    };
    println!();
    println!(
        "== {}: CPU s per million records (medians); ×{} is the growth over the {} shape, ÷rd is ottla ÷ rust-rdkafka",
        head.broker,
        base.label(),
        base.label()
    );
    let mut header = format!("| {:<10} |", "shape");
    let mut rule = format!("|{:-<12}|", "");
    for c in &clients {
        header += &format!(" {:>14} | {:>6} |", c.name(), format!("×{}", base.label()));
        rule += &format!("{:->16}|{:->8}|", ":", ":");
        if c.reference() != *c {
            header += &format!(" {:>6} |", "÷rd");
            rule += &format!("{:->8}|", ":");
        }
    }
    println!("{header}");
    println!("{rule}");
    for &shape in &shapes {
        let mut line = format!("| {:<10} |", shape.label());
        for &c in &clients {
            let v = cpu(shape, c);
            line += &format!(
                " {:>14} | {:>6} |",
                v.map_or("-".to_string(), |v| format!("{v:.3}")),
                v.map_or("-".to_string(), |v| ratio(v, cpu(base, c)))
            );
            if c.reference() != c {
                line += &format!(
                    " {:>6} |",
                    v.map_or("-".to_string(), |v| ratio(v, cpu(shape, c.reference())))
                );
            }
        }
        println!("{line}");
    }
}

/// What the columns mean and how each client is set up.
pub fn legend(clients: &[PClient]) {
    println!("columns:");
    println!("  records/s     from the child's first record to its last");
    println!(
        "  CPU s/M       user + system CPU seconds of the whole child process (rusage, wait4) per million records: join, offsets and all"
    );
    println!("  RSS MiB       the child's peak resident set (VmHWM)");
    println!(
        "  assigned s    seconds from the child's start to its assignment (ottla: the Assigned event; librdkafka: the rebalance callback)"
    );
    println!(
        "  1st rec after seconds from the assignment to the first record (committed offsets, ListOffsets, first Fetch)"
    );
    println!(
        "  ÷rd CPU       CPU per record over the paired rust-rdkafka client's in the same run (lower is better)"
    );
    println!("clients (each in its own process, run in this order in every round):");
    for c in clients {
        println!("  {:<15} {}", c.name(), c.mode());
    }
}

// ----- data -----

/// Writes `shape`'s records: record `i` to global partition `i % partitions`, linger
/// 50 ms, `batch.size` 1 MB, uncompressed, waiting for every delivery.
async fn produce(bootstrap: &str, shape: &Shape) -> anyhow::Result<()> {
    let producer: FutureProducer = protocol_tests::data::producer(
        bootstrap,
        "none",
        &[("linger.ms", "50"), ("batch.size", "1000000")],
    )?;
    let topics = shape.topic_names();
    let parts = shape.partitions as u64;
    let per_topic = shape.per_topic() as u64;
    super::produce::send_records(&producer, shape.records, shape.value_size, |i| {
        let g = i % parts;
        let topic = topics
            .get((g / per_topic) as usize)
            .context("topic index")?;
        Ok((topic.as_str(), (g % per_topic) as i32))
    })
    .await
}

/// Checks the watermarks of up to 200 partitions spread over the shape: each starts at
/// offset 0 and, where `check_end` (not on tansu), ends at its record count.
fn verify(bootstrap: &str, shape: &Shape, check_end: bool) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating an rdkafka client for watermarks")?;
    let topics = shape.topic_names();
    let counts = shape.counts();
    let step = (counts.len() / 200).max(1);
    for (g, &count) in counts.iter().enumerate().step_by(step) {
        let per_topic = shape.per_topic() as usize;
        let topic = topics.get(g / per_topic).context("topic index")?;
        let p = (g % per_topic) as i32;
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
        if low != 0 {
            bail!("{topic}/{p} starts at offset {low}, not 0: the broker dropped records");
        }
        if check_end && high != count {
            bail!("{topic}/{p} ends at offset {high}, not {count}");
        }
    }
    Ok(())
}

// ----- the child -----

#[derive(Debug, Clone)]
struct Job {
    client: PClient,
    bootstrap: String,
    topics: Vec<String>,
    topic_count: i32,
    per_topic: i32,
    counts: Vec<i64>,
    group: String,
}

impl Job {
    fn global(&self, topic: &str, partition: i32) -> i32 {
        global(self.topic_count, self.per_topic, topic, partition)
    }
}

struct Outcome {
    tally: Tally,
    assigned: Option<Instant>,
}

/// Entry point of `bench-partitions --child ...`.
pub fn child_main() -> ExitCode {
    let started = Instant::now();
    let job = match parse_job() {
        Ok(j) => j,
        Err(e) => {
            eprintln!("bench-partitions child: {e:#}");
            return ExitCode::from(2);
        }
    };
    start_child(&job.counts);
    let outcome = match job.client {
        PClient::Rdkafka => rdkafka(&job, false),
        PClient::RdkafkaCommit => rdkafka(&job, true),
        PClient::Ottla | PClient::OttlaCommit => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("building the tokio runtime")
            .and_then(|rt| rt.block_on(ottla(&job, job.client == PClient::OttlaCommit))),
    };
    let secs = |t: Instant| t.duration_since(started).as_secs_f64();
    match outcome {
        Ok(Outcome { tally, assigned }) => {
            let (Some(first), Some(last)) = (tally.first, tally.last) else {
                eprintln!("the client stopped before every record came");
                hard_exit(1)
            };
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "result records={} bytes={} first={:.6} last={:.6} bad={} hwm_kib={}{}",
                tally.records(),
                tally.bytes(),
                secs(first),
                secs(last),
                tally.bad(),
                vm_hwm_kib(),
                assigned.map_or(String::new(), |a| format!(" assigned={:.6}", secs(a)))
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

fn parse_job() -> anyhow::Result<Job> {
    let need = |name: &str| opt(name).with_context(|| format!("missing {name}"));
    let number = |name: &str| -> anyhow::Result<u64> {
        need(name)?
            .parse()
            .with_context(|| format!("{name} is not a number"))
    };
    let client = need("--child")?;
    let client = PClient::parse(&client).with_context(|| format!("unknown client {client}"))?;
    let topics = number("--topics")? as i32;
    let shape = Shape {
        partitions: number("--partitions")? as i32,
        topics,
        records: number("--records")?,
        value_size: 0,
    };
    Ok(Job {
        client,
        bootstrap: need("--bootstrap")?,
        topics: topic_names(&need("--base")?, topics),
        topic_count: topics,
        per_topic: shape.per_topic(),
        counts: shape.counts(),
        group: need("--group")?,
    })
}

fn len(b: Option<&[u8]>) -> usize {
    b.map_or(0, <[u8]>::len)
}

async fn ottla(job: &Job, commit: bool) -> anyhow::Result<Outcome> {
    use ottla::consumer::{Consumer, ConsumerEvent, OffsetReset};
    let mut consumer = Consumer::builder(&job.bootstrap)
        .group_id(job.group.clone())
        .topics(job.topics.clone())
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(SESSION_TIMEOUT)
        .heartbeat_interval(HEARTBEAT_INTERVAL)
        .build()
        .await
        .context("building the ottla consumer")?;
    let assigned: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let mut events = consumer.take_events();
    let noted = assigned.clone();
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            if let ConsumerEvent::Assigned { added, .. } = event
                && !added.is_empty()
            {
                noted.get_or_init(Instant::now);
            }
        }
    });
    let mut tally = Tally::new(&job.counts);
    while !tally.done() {
        let batch = consumer
            .recv_batch(POLL_RECORDS)
            .await
            .context("recv_batch")?;
        for r in &batch {
            tally.see(
                job.global(r.topic(), r.partition()),
                r.offset(),
                len(r.key()) + len(r.value()),
            );
        }
        tally.progress();
        if commit {
            // Queued before it returns; the result is not awaited.
            drop(consumer.commit_async());
        }
    }
    Ok(Outcome {
        tally,
        assigned: assigned.get().copied(),
    })
}

/// Notes when librdkafka assigned partitions.
struct AssignedAt(Arc<OnceLock<Instant>>);

impl rdkafka::ClientContext for AssignedAt {}

impl rdkafka::consumer::ConsumerContext for AssignedAt {
    fn post_rebalance(
        &self,
        _: &rdkafka::consumer::BaseConsumer<Self>,
        rebalance: &rdkafka::consumer::Rebalance<'_>,
    ) {
        if let rdkafka::consumer::Rebalance::Assign(list) = rebalance
            && list.count() > 0
        {
            self.0.get_or_init(Instant::now);
        }
    }
}

fn rdkafka(job: &Job, commit: bool) -> anyhow::Result<Outcome> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
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
        )
        .set("fetch.queue.backoff.ms", "20");
    let assigned = Arc::new(OnceLock::new());
    let consumer: BaseConsumer<AssignedAt> = config
        .create_with_context(AssignedAt(assigned.clone()))
        .context("creating the BaseConsumer")?;
    let topics: Vec<&str> = job.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics).context("subscribe")?;
    let mut tally = Tally::new(&job.counts);
    let mut errors = 0;
    let mut since_commit = 0;
    while !tally.done() {
        match consumer.poll(Duration::from_millis(100)) {
            None => tally.progress(),
            Some(Ok(m)) => {
                tally.see(
                    job.global(m.topic(), m.partition()),
                    m.offset(),
                    len(m.key()) + len(m.payload()),
                );
                since_commit += 1;
                if since_commit >= POLL_RECORDS {
                    since_commit = 0;
                    tally.progress();
                    if commit && let Err(e) = consumer.commit_consumer_state(CommitMode::Async) {
                        errors += 1;
                        if errors <= 5 {
                            eprintln!("commit: {e}");
                        }
                    }
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
    Ok(Outcome {
        tally,
        assigned: assigned.get().copied(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_index_of_one_topic_and_of_many() {
        assert_eq!(global(1, 24, "x", 7), 7);
        assert_eq!(global(100, 100, "bp-100-100t-10000p-5-t3", 7), 307);
        assert_eq!(global(100, 100, "no-suffix", 7), -1);
    }

    #[test]
    fn counts_add_up() {
        let shape = Shape {
            partitions: 10_000,
            topics: 100,
            records: 750_001,
            value_size: 100,
        };
        let counts = shape.counts();
        assert_eq!(counts.len(), 10_000);
        assert_eq!(counts.iter().sum::<i64>(), 750_001);
        assert_eq!(shape.topic_names().len(), 100);
        assert_eq!(shape.per_topic(), 100);
    }
}
