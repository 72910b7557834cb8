//! The consumer benchmark behind `cargo run --release -p ottla-bench --bin bench`:
//! ottla beside rust-rdkafka, rskafka, krafka and the confluent-kafka crate, each
//! consuming the same data from the same broker in its own process.
//!
//! The parent ([`run`]) starts the brokers, writes each cell's data once with
//! librdkafka's producer ([`produce`]), then re-executes its own binary with
//! `--child CLIENT ...` once per client and run, interleaving the clients. A child
//! ([`child`]) consumes exactly the cell's records from offset 0, checks every
//! partition's offsets are contiguous (no loss, no duplicate), prints one `result` line
//! and exits at once. The parent reaps it with `wait4`, so CPU time (user + system) is
//! the kernel's figure for that process alone; peak RSS is the child's own `VmHWM`. The
//! brokers (tansu, and the mock cluster, which lives in the parent) and the producer
//! never count. From the same rows, [`targets`] says where issue 21's targets stand (with
//! issue 36's bounds for `recv()`, `Processor::run` and `run_batch`).

pub mod child;
pub mod partitions;
pub mod produce;
pub mod rebalance;
pub mod run;
pub mod table;
pub mod targets;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `None` in the default build of ottla; with ottla's `metrics` feature compiled in,
/// the exit code a benchmark program stops with, after saying why. The benchmarks'
/// figures are those of ottla's default build, which is what `cargo run -p ottla-bench`
/// gives; a build together with other workspace members (`--workspace`) may unify the
/// feature in through protocol-tests' default (the demo's metrics summary).
pub fn refuse_metrics_build(program: &str) -> Option<std::process::ExitCode> {
    if !ottla::telemetry::ENABLED {
        return None;
    }
    eprintln!(
        "{program}: built with ottla's `metrics` feature (protocol-tests' default, for the \
         demo), whose figures are not the default build's; run it on its own as \
         `cargo run --release -p ottla-bench --bin {program} -- ...`"
    );
    Some(std::process::ExitCode::from(2))
}

/// Session timeout of every group client: tansu holds each JoinGroup for half the
/// group's session timeout, so 6 s costs 3 s per join (PEERS.md).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);
/// Heartbeat interval of every group client.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// Per-partition fetch limit of every client (the Java and librdkafka default).
pub const PARTITION_FETCH_BYTES: i32 = 1024 * 1024;
/// How long a broker may hold a Fetch (the Java and librdkafka default).
pub const FETCH_MAX_WAIT_MS: i32 = 500;
/// Records per `recv_batch` / `max.poll.records` where a client takes one.
pub const POLL_RECORDS: usize = 10_000;
/// Records per handler call of the batch processor.
pub const PROCESSOR_BATCH: usize = 1000;
/// Bytes of a record key: the record index, zero-padded.
pub const KEY_BYTES: usize = 16;

/// One consumer under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Client {
    /// ottla's `Consumer` in a group, read with `recv_batch`.
    Ottla,
    /// [`Client::Ottla`] with `fetch.max.wait.ms` at 50 ms instead of 500 (not run
    /// unless named with `--clients`): shows how much of ottla's time is a Fetch
    /// long-polling on caught-up partitions while others wait to be refilled.
    OttlaShortWait,
    /// ottla's `Consumer` in a group, read one record at a time (`recv`, the `Stream`
    /// path).
    OttlaRecv,
    /// ottla's `Processor::run` with a no-op handler.
    OttlaProc,
    /// ottla's `Processor::run_batch` with a no-op handler.
    OttlaProcBatch,
    /// rust-rdkafka's `BaseConsumer` with `fetch.queue.backoff.ms=20`: the reference.
    RdBase,
    /// rust-rdkafka's `BaseConsumer` with librdkafka's defaults.
    RdBaseDefault,
    /// rust-rdkafka's `StreamConsumer` with `fetch.queue.backoff.ms=20`.
    RdStream,
    /// rskafka: one `PartitionClient` per partition (it has no groups).
    Rskafka,
    /// krafka's consumer in a classic group.
    Krafka,
    /// The confluent-kafka crate's `KafkaConsumer`, manual assignment.
    Confluent,
}

impl Client {
    /// Every client that runs by default, in the order they run within a round.
    pub const ALL: [Client; 10] = [
        Client::RdBase,
        Client::Ottla,
        Client::OttlaRecv,
        Client::OttlaProc,
        Client::OttlaProcBatch,
        Client::RdBaseDefault,
        Client::RdStream,
        Client::Rskafka,
        Client::Krafka,
        Client::Confluent,
    ];

    /// The client every ratio is taken against.
    pub const REFERENCE: Client = Client::RdBase;

    /// Its name on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Client::Ottla => "ottla",
            Client::OttlaShortWait => "ottla-wait50",
            Client::OttlaRecv => "ottla-recv",
            Client::OttlaProc => "ottla-proc",
            Client::OttlaProcBatch => "ottla-proc-batch",
            Client::RdBase => "rdkafka-base",
            Client::RdBaseDefault => "rdkafka-base-dflt",
            Client::RdStream => "rdkafka-stream",
            Client::Rskafka => "rskafka",
            Client::Krafka => "krafka",
            Client::Confluent => "confluent-kafka",
        }
    }

    /// The client named `name`.
    pub fn parse(name: &str) -> Option<Client> {
        Client::ALL
            .into_iter()
            .chain([Client::OttlaShortWait])
            .find(|c| c.name() == name)
    }

    /// How it consumes, and every setting that differs from its defaults.
    pub fn mode(self) -> String {
        let group = format!(
            "group (subscribe, session {} s, heartbeat {} s, no commits)",
            SESSION_TIMEOUT.as_secs(),
            HEARTBEAT_INTERVAL.as_secs()
        );
        match self {
            Client::Ottla => format!("ottla Consumer, {group}, recv_batch({POLL_RECORDS})"),
            Client::OttlaShortWait => {
                format!("ottla Consumer, {group}, recv_batch({POLL_RECORDS}), fetch_max_wait 50 ms")
            }
            Client::OttlaRecv => format!("ottla Consumer, {group}, recv() per record"),
            Client::OttlaProc => {
                "ottla Processor::run, no-op handler, group, commits every 1 s (default)".into()
            }
            Client::OttlaProcBatch => format!(
                "ottla Processor::run_batch({PROCESSOR_BATCH}), no-op handler, group, commits every 1 s"
            ),
            Client::RdBase => {
                format!("rust-rdkafka BaseConsumer, {group}, poll loop, fetch.queue.backoff.ms=20")
            }
            Client::RdBaseDefault => format!(
                "rust-rdkafka BaseConsumer, {group}, poll loop, fetch.queue.backoff.ms=1000 (default)"
            ),
            Client::RdStream => format!(
                "rust-rdkafka StreamConsumer, {group}, recv().await loop, fetch.queue.backoff.ms=20"
            ),
            Client::Rskafka => format!(
                "rskafka 0.6, no group: one PartitionClient per partition, fetch_records(offset, 1..{PARTITION_FETCH_BYTES}, {FETCH_MAX_WAIT_MS} ms), one task each"
            ),
            Client::Krafka => format!(
                "krafka 0.28 classic {group}, poll(500 ms), max_poll_records({POLL_RECORDS}), max_buffered_records(0)"
            ),
            Client::Confluent => format!(
                "confluent-kafka 1.0 KafkaConsumer<Bytes, Bytes>, no group (assign; its groups are KIP-848 only), poll(500 ms), max.poll.records={POLL_RECORDS}"
            ),
        }
    }

    /// Why this client cannot consume from `broker` ("mock" or "tansu"), where that was
    /// diagnosed by hand (see the bench's report). Such rows are skipped unless
    /// `--try-all` is given, since each costs the child's whole time limit.
    pub fn known_blocker(self, broker: &str) -> Option<&'static str> {
        match (self, broker) {
            (Client::Confluent, "tansu") => Some(
                "tansu drops the connection: the crate always sends ApiVersions v5 (KIP-1242 adds ClusterId/NodeId), tansu decodes it as v4 and, once the ClusterId is set (every connection after bootstrap), reads it as a tagged-field count",
            ),
            (Client::Confluent, "mock") => Some(
                "the mock answers ApiVersions v5 with its malformed UNSUPPORTED_VERSION reply (PEERS.md) and the crate honours the garbage throttle time in it (~20 min)",
            ),
            (Client::Krafka, "mock") => Some(
                "the mock answers ApiVersions v4 with its malformed UNSUPPORTED_VERSION reply (PEERS.md); krafka decodes the mandated v0 body and rejects the garbage array length",
            ),
            _ => None,
        }
    }

    /// Whether the child needs a tokio runtime.
    pub fn is_async(self) -> bool {
        !matches!(self, Client::RdBase | Client::RdBaseDefault)
    }
}

/// One data set: value size, codec, partition count and record count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// Bytes of each value.
    pub value_size: usize,
    /// Whether the producer compressed with lz4.
    pub lz4: bool,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Records in the topic (record `i` is in partition `i % partitions`).
    pub records: u64,
}

impl Cell {
    /// `100B/6p`, `1KiB-lz4/24p`.
    pub fn label(&self) -> String {
        format!(
            "{}{}/{}p",
            size_label(self.value_size),
            if self.lz4 { "-lz4" } else { "" },
            self.partitions
        )
    }

    /// The topic that holds it.
    pub fn topic(&self) -> String {
        format!(
            "bench-{}{}-{}p-{}",
            self.value_size,
            if self.lz4 { "-lz4" } else { "" },
            self.partitions,
            self.records
        )
    }

    /// librdkafka's `compression.type`.
    pub fn codec(&self) -> &'static str {
        if self.lz4 { "lz4" } else { "none" }
    }

    /// Records in each partition.
    pub fn per_partition(&self) -> Vec<i64> {
        let p = self.partitions as u64;
        (0..p)
            .map(|i| (self.records / p + u64::from(i < self.records % p)) as i64)
            .collect()
    }

    /// Bytes a record takes on the wire before compression, roughly: value, key and
    /// about 30 bytes of record framing.
    pub fn record_wire_bytes(&self) -> usize {
        self.value_size + KEY_BYTES + 30
    }
}

/// `100B`, `1KiB`.
pub fn size_label(bytes: usize) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}KiB", bytes / 1024)
    } else {
        format!("{bytes}B")
    }
}

/// Records still to come, for the child's watchdog to report.
pub static REMAINING: AtomicU64 = AtomicU64::new(u64::MAX);

/// What one partition has delivered so far.
#[derive(Debug, Clone)]
pub struct PartTally {
    /// The next offset expected.
    pub next: i64,
    /// The partition's end offset (its record count: the topic is fresh).
    pub end: i64,
    /// Records counted.
    pub records: u64,
    /// Key and value bytes counted.
    pub bytes: u64,
    /// Records at an offset already seen.
    pub dups: u64,
    /// Offsets skipped over.
    pub gaps: u64,
    /// Records past the end.
    pub extra: u64,
}

impl PartTally {
    /// A partition of `end` records, read from offset 0.
    pub fn new(end: i64) -> Self {
        Self {
            next: 0,
            end,
            records: 0,
            bytes: 0,
            dups: 0,
            gaps: 0,
            extra: 0,
        }
    }

    /// Counts the record at `offset`; true if it was new.
    #[inline]
    pub fn see(&mut self, offset: i64, bytes: usize) -> bool {
        if offset == self.next && offset < self.end {
            self.next += 1;
            self.records += 1;
            self.bytes += bytes as u64;
            return true;
        }
        self.unexpected(offset, bytes)
    }

    #[cold]
    fn unexpected(&mut self, offset: i64, bytes: usize) -> bool {
        if offset < self.next {
            self.dups += 1;
            return false;
        }
        if offset >= self.end {
            self.extra += 1;
            return false;
        }
        self.gaps += (offset - self.next) as u64;
        self.next = offset + 1;
        self.records += 1;
        self.bytes += bytes as u64;
        true
    }

    /// Whether every record has come.
    pub fn complete(&self) -> bool {
        self.next >= self.end
    }

    /// Duplicates, gaps and records past the end.
    pub fn bad(&self) -> u64 {
        self.dups + self.gaps + self.extra
    }
}

/// What a child has consumed, partition by partition, and when.
#[derive(Debug, Clone)]
pub struct Tally {
    /// One per partition.
    pub parts: Vec<PartTally>,
    /// Records still to come.
    pub remaining: u64,
    /// Records of a partition the topic does not have.
    pub stray: u64,
    /// When the first record came.
    pub first: Option<Instant>,
    /// When the last record came.
    pub last: Option<Instant>,
}

impl Tally {
    /// A tally expecting `counts[p]` records in partition `p`.
    pub fn new(counts: &[i64]) -> Self {
        let remaining = counts.iter().map(|&c| c as u64).sum();
        REMAINING.store(remaining, Ordering::Relaxed);
        Self {
            parts: counts.iter().map(|&c| PartTally::new(c)).collect(),
            remaining,
            stray: 0,
            first: None,
            last: None,
        }
    }

    /// Counts one record.
    #[inline]
    pub fn see(&mut self, partition: i32, offset: i64, bytes: usize) {
        let Some(part) = usize::try_from(partition)
            .ok()
            .and_then(|p| self.parts.get_mut(p))
        else {
            self.stray += 1;
            return;
        };
        if !part.see(offset, bytes) {
            return;
        }
        if self.first.is_none() {
            self.first = Some(Instant::now());
        }
        self.remaining -= 1;
        if self.remaining == 0 {
            self.last = Some(Instant::now());
        }
    }

    /// Publishes progress for the watchdog (call once per batch).
    pub fn progress(&self) {
        REMAINING.store(self.remaining, Ordering::Relaxed);
    }

    /// Whether every record has come.
    pub fn done(&self) -> bool {
        self.remaining == 0
    }

    /// Key and value bytes counted.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    /// Records counted.
    pub fn records(&self) -> u64 {
        self.parts.iter().map(|p| p.records).sum()
    }

    /// Duplicates, gaps, records past the end and stray records.
    pub fn bad(&self) -> u64 {
        self.stray + self.parts.iter().map(PartTally::bad).sum::<u64>()
    }
}

/// `--name VALUE` from the command line.
pub fn opt(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// `--name VALUE` from the command line as a number, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    opt(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Whether `--name` is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// What a produce benchmark's child reported: its wall and CPU seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChildFigures {
    /// Wall seconds of the measured part.
    pub secs: f64,
    /// CPU seconds (user + system) the child used.
    pub cpu_secs: f64,
}

/// Runs this benchmark's own executable as `child ARGS...` (one client, one cell, in a
/// process of its own, so that its CPU time is its own) and reads the `secs=` and
/// `cpu_secs=` of the line it prints. The error names what failed, with the child's
/// stderr.
pub fn run_child(args: &[String]) -> Result<ChildFigures, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let out = std::process::Command::new(&exe)
        .arg("child")
        .args(args)
        .output()
        .map_err(|e| format!("starting the child: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the child failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no {name} in the child's line {line:?}"))
    };
    Ok(ChildFigures {
        secs: field("secs=")?,
        cpu_secs: field("cpu_secs=")?,
    })
}

/// CPU seconds (user + system) of this process, from `/proc/self/stat` (10 ms
/// resolution): what the produce benchmarks charge a child with.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after ')'.
    (ticks(11) + ticks(12)) / 100.0
}
