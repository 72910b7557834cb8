//! The chaos harness (feature `chaos`): a group of members running an ottla
//! application (yours: [`App`]; see [`Chaos`] for the builder a test uses) consumes
//! sequence-numbered records while a seeded scheduler moves the group coordinator,
//! silences the coordinator's broker while moving it, takes brokers down, delays
//! responses, injects retriable error codes, kills, crashes, adds and removes members.
//! At the end it checks that nothing was lost and that the group's invariants held,
//! and prints the figures.
//!
//! It is also ottla's own chaos runner: the `chaos` program (the unpublished
//! `ottla-chaos` crate) runs [`App::synthetic`], a Processor whose handler fails on
//! purpose as the seed says, with the flags below.
//!
//! ```text
//! cargo run --release -p ottla-chaos --bin chaos -- --duration 60s [--seed N] [--broker mock|tansu] [--group-protocol classic|consumer] [--contention N] [--stall D]
//! ```
//!
//! With `--group-protocol consumer` the members speak KIP-848 (mock only); every fault
//! kind applies, errors going on ConsumerGroupHeartbeat instead of the classic group
//! requests ([`schedule::injected_apis`]).
//!
//! **Load.** A run on a busy machine meets ottla with its timers firing late. Two flags
//! make that load part of the run, and both are replayed by [`Config::replay_command`]:
//!
//! - `--contention N` spins N busy threads beside the members for the whole run (until
//!   every member has left), so the members' threads, the mock's and the producer's
//!   compete for the cores;
//! - `--stall D` starves each member's own runtime (a current-thread runtime, so one
//!   blocked task stops everything in it: timers, heartbeats, handlers, I/O): a task on
//!   it blocks the thread for up to `D` about every `--stall-every` (default 1 s), both
//!   drawn from the seed and the incarnation ([`member::stall_at`]). Keep `D` well below
//!   the session timeout: a member blocked for longer is expelled as a zombie would be.
//!
//! [`run_app`] is the whole run ([`run`] with the synthetic application); the `chaos`
//! binary parses its command line with [`Config::from_args`] and prints the
//! [`Report`]; ottla-chaos's `tests/chaos.rs` runs it briefly.
//!
//! **What is checked** (see [`journal`] for how):
//!
//! - lost = 0: every record the producer had acknowledged was handled successfully at
//!   least once, or is in the dead-letter topic;
//! - committed offsets never regress (from the processors' metrics hooks, and read
//!   back from the broker every second);
//! - no commit passes a record that was not finished;
//! - no partition is handled by two members in the same generation (generations from
//!   the Processor's metrics hook, `Metric::Joined`), nor by a member that gave it back
//!   (`handled_after_release`); how long one partition's work ran in two live members
//!   at once is measured (the report's `handover` line);
//! - a record handled again lies at or above the committed offset of that moment:
//!   duplicates come only from the in-flight window of a handover; their number is
//!   printed next to that window's size summed over the handovers. Under the consumer
//!   protocol, a redo below a commit that the previous owner made after the broker had
//!   granted the partition anew, and that the broker asked that owner for only
//!   afterwards, is the broker's double grant (`broker_double_grants`, the librdkafka
//!   mock's quirk), not a failure;
//! - no finished record waits more than [`journal::COMMIT_WAIT_BOUND`] (90 s) after its
//!   last finish for a commit past it (`commit_waits`);
//! - every member stops only when asked; the committed offsets reach the log end
//!   within the drain timeout once the faults stop.
//!
//! **Replay.** The fault plan is a pure function of the seed and the configuration
//! ([`schedule::plan`]), and so are the handler failures (drawn from the seed, the
//! sequence number and the attempt). ottla's own timing is not replayed: the same
//! seed injects the same faults at the same times, and ottla meets them in whatever
//! state it is in.

pub mod app;
mod builder;
pub mod capture;
pub mod journal;
pub mod member;
pub mod rng;
pub mod schedule;

pub use app::{App, Effect, Seat, Witness};
pub use builder::{Chaos, Faults};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::mock::MockCluster;
use crate::tansu::Tansu;
use anyhow::{Context, bail};
use ottla::consumer::{Consumer, GroupProtocol, IsolationLevel, OffsetReset, TopicPartition};
pub use ottla::processor::ProcessingOrder;
use rdkafka::ClientConfig as RdConfig;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use journal::{Analysis, Journal};
use member::{Fates, Member, MemberContext, Stop};
use schedule::{Action, FaultKind, PlanInput};

/// The topic the records go to.
pub const TOPIC: &str = "chaos";

/// The topic an exactly-once run's members copy each input to ([`copy_of`]).
pub const OUTPUT_TOPIC: &str = "chaos.out";

/// The output record of `input` in an exactly-once run: its key and value (so that
/// [`member::seq_of`] reads its sequence number back) to [`OUTPUT_TOPIC`]. A handler
/// of yours sends it with `Cancel::send`; the run then checks that a `read_committed`
/// reader sees each input in the output (or in the dead-letter topic) exactly once.
pub fn copy_of(input: &ottla::ConsumerRecord) -> ottla::producer::ProducerRecord {
    let mut out = ottla::producer::ProducerRecord::new(OUTPUT_TOPIC);
    if let Some(k) = input.key() {
        out = out.key(k.to_vec());
    }
    if let Some(v) = input.value() {
        out = out.value(v.to_vec());
    }
    out
}

/// Which broker the run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// librdkafka's in-process mock cluster: every fault kind.
    Mock,
    /// A tansu child process: member faults and handler failures only.
    Tansu,
}

/// A run's settings. [`Config::default`] is the binary's default; every field has a
/// flag (see [`USAGE`]).
#[derive(Debug, Clone)]
pub struct Config {
    /// How long records are produced and faults injected.
    pub duration: Duration,
    /// The seed everything is drawn from.
    pub seed: u64,
    /// The broker.
    pub broker: BrokerKind,
    /// Members at the start.
    pub members: usize,
    /// Brokers of the mock cluster.
    pub brokers: i32,
    /// Partitions of the topic.
    pub partitions: i32,
    /// Records per second.
    pub produce_rate: f64,
    /// Fault rates per minute.
    pub rates: BTreeMap<FaultKind, f64>,
    /// Handler failure probabilities.
    pub fates: Fates,
    /// The members' group protocol. Under [`GroupProtocol::Consumer`] (KIP-848, mock
    /// only) the broker assigns and sets the session timeout and heartbeat interval:
    /// the runner gives the mock `session_timeout` and a sixth of it.
    pub group_protocol: GroupProtocol,
    /// The assignor; `None`: drawn from the seed (classic), the broker's default
    /// (consumer: the name goes to the broker as `group.remote.assignor`).
    pub assignor: Option<String>,
    /// How often the processors commit.
    pub commit_interval: Duration,
    /// The members' session timeout (heartbeats every sixth of it). The mock holds a
    /// rebalance's JoinGroups for the session timeout less 1 s, tansu for half of it.
    pub session_timeout: Duration,
    /// The producer's `linger.ms`, and the members' `fetch.max.wait.ms`. The mock
    /// returns one record batch per partition per Fetch, and a member fetches a
    /// partition again only once its last fetch is consumed, with one Fetch per broker
    /// in flight: a partition with a backlog, sharing a broker with a caught-up
    /// partition of the same member, gets one batch per `fetch.max.wait`. With 5 ms
    /// batches (one record) and 500 ms waits that is 2 records a second, slower than
    /// they are produced (try `--linger 5ms --fetch-max-wait 500ms`). Larger batches and
    /// shorter waits keep the drain within its timeout.
    pub linger: Duration,
    /// See `linger`.
    pub fetch_max_wait: Duration,
    /// How long the members may take to commit everything once the faults stop.
    pub drain_timeout: Duration,
    /// Print every fault as it is applied.
    pub verbose: bool,
    /// Print a progress line this often (`None`: never).
    pub progress: Option<Duration>,
    /// Busy threads spinning beside the members for the whole run (`--contention`).
    pub contention: usize,
    /// The longest a member's runtime is blocked at a time (`--stall`; `None`: never).
    pub stall: Option<Duration>,
    /// About how often a member's runtime is blocked when `stall` is set: the gaps are
    /// drawn between half and one and a half of it.
    pub stall_every: Duration,
    /// The members' processing order. Under [`ProcessingOrder::Key`] each partition's
    /// records carry one of [`KEYS_PER_PARTITION`] keys, and the journal checks that a
    /// member runs one call per key at a time, in offset order (`key_order`).
    pub ordering: ProcessingOrder,
    /// The replay command to print instead of the `chaos` program's
    /// ([`Config::replay_command`]); the harness's builder sets the test's own.
    pub replay: Option<String>,
    /// Exactly-once mode (`--exactly-once`): each member's Processor runs
    /// `exactly_once` with a `transactional.id` of its slot (kept across its
    /// restarts, so that an incarnation fences the one before), the synthetic
    /// handler copies each input to [`OUTPUT_TOPIC`] ([`copy_of`]), and the run
    /// reads the output and dead-letter topics with `read_committed` at the end:
    /// every input must be there exactly once.
    pub exactly_once: bool,
}

/// Keys per partition under `--ordering key`: few, so that a key's records are close
/// together and its order is tested often.
pub const KEYS_PER_PARTITION: u64 = 8;

/// The key of record `seq` on a topic of `partitions` partitions under key ordering
/// (`None`: by partition, where the key is the sequence number).
pub fn order_key(seq: u64, partitions: i32, ordering: ProcessingOrder) -> Option<String> {
    (ordering == ProcessingOrder::Key).then(|| {
        let p = u64::try_from(partitions.max(1)).unwrap_or(1);
        format!("p{}k{}", seq % p, (seq / p) % KEYS_PER_PARTITION)
    })
}

impl Default for Config {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(60),
            seed: seed_from_time(),
            broker: BrokerKind::Mock,
            members: 3,
            brokers: 3,
            partitions: 6,
            produce_rate: 200.0,
            rates: FaultKind::ALL
                .into_iter()
                .map(|k| (k, k.default_rate()))
                .collect(),
            fates: Fates {
                transient: 0.03,
                permanent: 0.002,
                slow: 0.005,
            },
            group_protocol: GroupProtocol::Classic,
            assignor: None,
            commit_interval: Duration::from_millis(200),
            session_timeout: Duration::from_secs(3),
            linger: Duration::from_millis(100),
            fetch_max_wait: Duration::from_millis(100),
            drain_timeout: Duration::from_secs(90),
            verbose: false,
            progress: Some(Duration::from_secs(10)),
            contention: 0,
            stall: None,
            stall_every: Duration::from_secs(1),
            replay: None,
            ordering: ProcessingOrder::Partition,
            exactly_once: false,
        }
    }
}

/// The assignors a seed draws from.
pub const ASSIGNORS: [&str; 4] = ["cooperative-sticky", "range", "roundrobin", "sticky"];

/// The broker-side assignors `--assignor` may name under the consumer protocol
/// (Kafka's; the librdkafka mock ignores the name and always assigns by range).
pub const REMOTE_ASSIGNORS: [&str; 2] = ["uniform", "range"];

/// The command line.
pub const USAGE: &str = "\
chaos: an ottla consumer group under injected faults; checks that nothing is lost.

  --duration D          how long to produce and inject faults: 60s, 2m, 10m, 1h (env OTTLA_CHAOS_DURATION; default 60s)
  --seed N              the seed (env OTTLA_CHAOS_SEED; default: from the clock, printed)
  --broker mock|tansu   the broker (env OTTLA_CHAOS_BROKER; default mock)
  --group-protocol P    classic or consumer (KIP-848; mock only: tansu lacks it) (env
                        OTTLA_CHAOS_GROUP_PROTOCOL; default classic). Under consumer the mock is
                        given --session-timeout and a sixth of it as the heartbeat interval,
                        and errors go on ConsumerGroupHeartbeat instead of JoinGroup, SyncGroup
                        and Heartbeat
  --members N           members at the start (env OTTLA_CHAOS_MEMBERS; default 3)
  --ordering O          the Processor's order: partition or key (env OTTLA_CHAOS_ORDERING; default
                        partition). Under key each partition's records carry one of 8 keys, and
                        key_order checks one call per key at a time, in offset order
  --brokers N           mock brokers (default 3)
  --partitions N        topic partitions (default 6)
  --produce-rate R      records per second (default 200)
  --rate KIND=PER_MIN   a fault rate per minute, repeatable or comma-separated; KIND is one of
                        move, silent, down, rtt, error, kill, crash, join, leave, or all (env OTTLA_CHAOS_RATES)
                        defaults: move=12 silent=2 down=2 rtt=4 error=8 kill=2 crash=1 join=1 leave=1
                        (silent: the coordinator's broker stops answering for 3-12 s, connections
                        open, while the coordinator moves to another broker)
  --transient P         probability that a handler attempt fails transiently (default 0.03)
  --permanent P         probability that a record always fails, so is dead-lettered (default 0.002)
  --slow P              probability that an attempt takes 50-300 ms (default 0.005)
  --assignor NAME       cooperative-sticky, range, roundrobin or sticky (default: drawn from the seed);
                        under the consumer protocol uniform or range, sent as group.remote.assignor
                        (default: none, the broker's)
  --commit-interval D   how often the processors commit (default 200ms)
  --session-timeout D   the members' session timeout, heartbeats at a sixth of it (default 3s)
  --linger D            the producer's linger.ms (default 100ms)
  --fetch-max-wait D    the members' fetch.max.wait.ms (default 100ms; the mock returns one batch per
                        partition per Fetch, so small batches and long waits drain a backlog slowly)
  --drain-timeout D     how long members may take to commit everything at the end (default 90s)
  --progress D          a progress line this often, 0 for none (default 10s)
  --contention N        N busy threads spin beside the members for the whole run, so that timers
                        fire late as on a loaded machine (env OTTLA_CHAOS_CONTENTION; default 0)
  --stall D             starve each member's runtime: block its thread for up to D (drawn from the
                        seed) about every --stall-every; keep D well below the session timeout
                        (env OTTLA_CHAOS_STALL; default none)
  --stall-every D       the mean gap between a member's stalls (default 1s; gaps drawn from half to
                        one and a half of it)
  --exactly-once        members run the Processor exactly once (a transactional.id per member slot)
                        and copy each input to the topic chaos.out; at the end a read_committed
                        reader must find every input there (or dead-lettered) exactly once:
                        duplicates= then counts copies, not handler calls (env
                        OTTLA_CHAOS_EXACTLY_ONCE=1)
  -v, --verbose         print every fault as it is applied
  RUST_LOG              ottla's logs on stderr (default: none), with member thread names

The last line is the summary; the exit status is non-zero when a record was lost or a check failed.";

impl Config {
    /// The configuration from command-line arguments (without the program name) and
    /// the `OTTLA_CHAOS_*` environment variables; flags win.
    pub fn from_args(
        args: &[String],
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Config> {
        let mut c = Config::default();
        if let Some(v) = env("OTTLA_CHAOS_DURATION") {
            c.duration = parse_duration(&v).context("OTTLA_CHAOS_DURATION")?;
        }
        if let Some(v) = env("OTTLA_CHAOS_SEED") {
            c.seed = v.trim().parse().context("OTTLA_CHAOS_SEED")?;
        }
        if let Some(v) = env("OTTLA_CHAOS_BROKER") {
            c.broker = parse_broker(&v)?;
        }
        if let Some(v) = env("OTTLA_CHAOS_GROUP_PROTOCOL") {
            c.group_protocol = parse_protocol(&v)?;
        }
        if let Some(v) = env("OTTLA_CHAOS_MEMBERS") {
            c.members = v.trim().parse().context("OTTLA_CHAOS_MEMBERS")?;
        }
        if let Some(v) = env("OTTLA_CHAOS_CONTENTION") {
            c.contention = v.trim().parse().context("OTTLA_CHAOS_CONTENTION")?;
        }
        if let Some(v) = env("OTTLA_CHAOS_STALL") {
            c.stall = parse_stall(&v).context("OTTLA_CHAOS_STALL")?;
        }
        if let Some(v) = env("OTTLA_CHAOS_ORDERING") {
            c.ordering = parse_ordering(&v)?;
        }
        if let Some(v) = env("OTTLA_CHAOS_EXACTLY_ONCE") {
            c.exactly_once = matches!(v.trim(), "1" | "true" | "yes");
        }
        let mut rates: Vec<String> = env("OTTLA_CHAOS_RATES").into_iter().collect();
        let mut i = 0;
        while i < args.len() {
            let flag = args[i].as_str();
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (flag, None),
            };
            if matches!(name, "-v" | "--verbose") {
                c.verbose = true;
                i += 1;
                continue;
            }
            if name == "--exactly-once" {
                c.exactly_once = true;
                i += 1;
                continue;
            }
            if matches!(name, "-h" | "--help") {
                bail!("{USAGE}");
            }
            let value = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .with_context(|| format!("{name} needs a value"))?
                }
            };
            let bad = || format!("{name} {value}");
            match name {
                "--duration" => c.duration = parse_duration(&value).with_context(bad)?,
                "--seed" => c.seed = value.parse().with_context(bad)?,
                "--broker" => c.broker = parse_broker(&value)?,
                "--group-protocol" => c.group_protocol = parse_protocol(&value)?,
                "--ordering" => c.ordering = parse_ordering(&value)?,
                "--members" => c.members = value.parse().with_context(bad)?,
                "--brokers" => c.brokers = value.parse().with_context(bad)?,
                "--partitions" => c.partitions = value.parse().with_context(bad)?,
                "--produce-rate" => c.produce_rate = value.parse().with_context(bad)?,
                "--rate" => rates.push(value),
                "--transient" => c.fates.transient = value.parse().with_context(bad)?,
                "--permanent" => c.fates.permanent = value.parse().with_context(bad)?,
                "--slow" => c.fates.slow = value.parse().with_context(bad)?,
                "--assignor" => c.assignor = Some(value),
                "--commit-interval" => {
                    c.commit_interval = parse_duration(&value).with_context(bad)?
                }
                "--session-timeout" => {
                    c.session_timeout = parse_duration(&value).with_context(bad)?
                }
                "--linger" => c.linger = parse_duration(&value).with_context(bad)?,
                "--fetch-max-wait" => {
                    c.fetch_max_wait = parse_duration(&value).with_context(bad)?
                }
                "--drain-timeout" => c.drain_timeout = parse_duration(&value).with_context(bad)?,
                "--contention" => c.contention = value.parse().with_context(bad)?,
                "--stall" => c.stall = parse_stall(&value).with_context(bad)?,
                "--stall-every" => c.stall_every = parse_duration(&value).with_context(bad)?,
                "--progress" => {
                    let d = parse_duration(&value).with_context(bad)?;
                    c.progress = (!d.is_zero()).then_some(d);
                }
                _ => bail!("unknown flag {name}\n\n{USAGE}"),
            }
            i += 1;
        }
        for list in rates {
            for item in list.split([',', ' ']).filter(|s| !s.is_empty()) {
                let (kind, rate) = item
                    .split_once('=')
                    .with_context(|| format!("rate {item:?}: expected KIND=PER_MIN"))?;
                let rate: f64 = rate
                    .parse()
                    .with_context(|| format!("rate {item:?}: not a number"))?;
                if kind == "all" {
                    c.rates.values_mut().for_each(|r| *r = rate);
                } else {
                    let k = FaultKind::parse(kind)
                        .with_context(|| format!("rate {item:?}: unknown fault kind {kind}"))?;
                    c.rates.insert(k, rate);
                }
            }
        }
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.members == 0 {
            bail!("--members must be at least 1");
        }
        if self.partitions < 1 || self.brokers < 1 {
            bail!("--partitions and --brokers must be at least 1");
        }
        if self.produce_rate <= 0.0 {
            bail!("--produce-rate must be positive");
        }
        let known: &[&str] = match self.group_protocol {
            GroupProtocol::Classic => &ASSIGNORS,
            _ => &REMOTE_ASSIGNORS,
        };
        if let Some(a) = &self.assignor
            && !known.contains(&a.as_str())
        {
            bail!(
                "unknown assignor {a:?} for the {} protocol: one of {known:?}",
                self.group_protocol.name()
            );
        }
        if self.group_protocol == GroupProtocol::Consumer && self.broker == BrokerKind::Tansu {
            bail!("--group-protocol consumer needs the mock: tansu has no ConsumerGroupHeartbeat");
        }
        if self.session_timeout < Duration::from_millis(600) {
            bail!("--session-timeout must be at least 600ms");
        }
        if self.stall.is_some() && self.stall_every < Duration::from_millis(10) {
            bail!("--stall-every must be at least 10ms");
        }
        if self.stall.is_some_and(|s| s >= self.session_timeout) {
            bail!("--stall must be shorter than the session timeout");
        }
        for p in [self.fates.transient, self.fates.permanent, self.fates.slow] {
            if !(0.0..1.0).contains(&p) {
                bail!("probabilities must be in [0, 1)");
            }
        }
        Ok(())
    }

    /// The assignor of this run: under the classic protocol the members', under the
    /// consumer protocol the one named to the broker (`None`: its default).
    pub fn assignor(&self) -> Option<String> {
        match self.group_protocol {
            GroupProtocol::Classic => Some(self.assignor.clone().unwrap_or_else(|| {
                ASSIGNORS[(schedule::mix(self.seed, 7) % ASSIGNORS.len() as u64) as usize].into()
            })),
            _ => self.assignor.clone(),
        }
    }

    /// The plan's input for a cluster of `brokers`.
    pub fn plan_input(&self, brokers: Vec<i32>) -> PlanInput {
        PlanInput {
            seed: self.seed,
            duration: self.duration,
            rates: self.effective_rates(),
            brokers,
            members: self.members,
            max_members: self.members + 2,
            group_protocol: self.group_protocol,
        }
    }

    /// The rates in effect: kinds the broker cannot inject are off on tansu.
    pub fn effective_rates(&self) -> BTreeMap<FaultKind, f64> {
        self.rates
            .iter()
            .map(|(k, r)| {
                let off = self.broker == BrokerKind::Tansu && k.needs_mock();
                (*k, if off { 0.0 } else { *r })
            })
            .collect()
    }

    /// The command line that replays this run.
    pub fn replay_command(&self) -> String {
        let broker = match self.broker {
            BrokerKind::Mock => "mock",
            BrokerKind::Tansu => "tansu",
        };
        let mut cmd = format!(
            "cargo run --release -p ottla-chaos --bin chaos -- --duration {} --seed {} --broker {broker} --members {}",
            format_duration(self.duration),
            self.seed,
            self.members
        );
        if self.group_protocol != GroupProtocol::Classic {
            cmd.push_str(&format!(" --group-protocol {}", self.group_protocol.name()));
        }
        if self.exactly_once {
            cmd.push_str(" --exactly-once");
        }
        if self.ordering == ProcessingOrder::Key {
            cmd.push_str(" --ordering key");
        }
        let defaults = Config::default();
        let changed: Vec<String> = self
            .rates
            .iter()
            .filter(|(k, r)| defaults.rates.get(k) != Some(r))
            .map(|(k, r)| format!("{}={r}", k.name()))
            .collect();
        if !changed.is_empty() {
            cmd.push_str(&format!(" --rate {}", changed.join(",")));
        }
        for (flag, value, default) in [
            (
                "--transient",
                self.fates.transient,
                defaults.fates.transient,
            ),
            (
                "--permanent",
                self.fates.permanent,
                defaults.fates.permanent,
            ),
            ("--slow", self.fates.slow, defaults.fates.slow),
            ("--produce-rate", self.produce_rate, defaults.produce_rate),
        ] {
            if value != default {
                cmd.push_str(&format!(" {flag} {value}"));
            }
        }
        if self.partitions != defaults.partitions {
            cmd.push_str(&format!(" --partitions {}", self.partitions));
        }
        if self.brokers != defaults.brokers {
            cmd.push_str(&format!(" --brokers {}", self.brokers));
        }
        if let Some(a) = &self.assignor {
            cmd.push_str(&format!(" --assignor {a}"));
        }
        for (flag, value, default) in [
            ("--linger", self.linger, defaults.linger),
            (
                "--fetch-max-wait",
                self.fetch_max_wait,
                defaults.fetch_max_wait,
            ),
        ] {
            if value != default {
                cmd.push_str(&format!(" {flag} {}", format_duration(value)));
            }
        }
        if self.session_timeout != defaults.session_timeout {
            cmd.push_str(&format!(
                " --session-timeout {}",
                format_duration(self.session_timeout)
            ));
        }
        if self.contention != defaults.contention {
            cmd.push_str(&format!(" --contention {}", self.contention));
        }
        if let Some(stall) = self.stall {
            cmd.push_str(&format!(" --stall {}", format_duration(stall)));
            if self.stall_every != defaults.stall_every {
                cmd.push_str(&format!(
                    " --stall-every {}",
                    format_duration(self.stall_every)
                ));
            }
        }
        cmd
    }
}

/// `--stall`: a duration, `0` for none.
fn parse_stall(v: &str) -> anyhow::Result<Option<Duration>> {
    let d = parse_duration(v)?;
    Ok((!d.is_zero()).then_some(d))
}

fn parse_ordering(v: &str) -> anyhow::Result<ProcessingOrder> {
    match v.trim() {
        "partition" => Ok(ProcessingOrder::Partition),
        "key" => Ok(ProcessingOrder::Key),
        other => bail!("--ordering {other}: partition or key"),
    }
}

fn parse_protocol(v: &str) -> anyhow::Result<GroupProtocol> {
    v.parse::<GroupProtocol>()
        .map_err(|e| anyhow::anyhow!("--group-protocol: {e}"))
}

fn parse_broker(v: &str) -> anyhow::Result<BrokerKind> {
    match v.trim() {
        "mock" => Ok(BrokerKind::Mock),
        "tansu" => Ok(BrokerKind::Tansu),
        other => bail!("unknown broker {other:?}: mock or tansu"),
    }
}

/// `500ms`, `60s`, `2m`, `1h`, or a number of seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .with_context(|| format!("duration {s:?}: expected a number and ms, s, m or h"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        u => bail!("duration {s:?}: unknown unit {u:?} (ms, s, m, h)"),
    };
    if !secs.is_finite() || secs < 0.0 {
        bail!("duration {s:?} is not a positive length of time");
    }
    Ok(Duration::from_secs_f64(secs))
}

fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 {
        format!("{}ms", d.as_millis())
    } else if s % 60 == 0 && s > 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

fn seed_from_time() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // Short enough to type.
    nanos % 1_000_000_000
}

/// The figures and findings of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The members' group protocol.
    pub group_protocol: GroupProtocol,
    /// The assignor used (under the consumer protocol, the one named to the broker).
    pub assignor: String,
    /// The checks' results.
    pub analysis: Analysis,
    /// Coordinator moves applied (`move` faults, and the move of each `silent` one).
    pub moves: u64,
    /// Faults applied by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Whether generations were learnt (from `Metric::Joined`), so that the ownership
    /// check ran.
    pub ownership_checked: bool,
    /// Whether the committed offsets reached the log end within the drain timeout.
    pub drained: bool,
    /// How long the drain took.
    pub drain_time: Duration,
    /// Copies found in the dead-letter topic.
    pub dlq_records: u64,
    /// Exactly-once runs: what a `read_committed` reader found in the output and
    /// dead-letter topics.
    pub exactly_once: Option<ExactlyOnce>,
    /// The command line that replays this run ([`Config::replay_command`]).
    pub replay: String,
}

impl Report {
    /// Nothing lost and every check passed.
    pub fn passed(&self) -> bool {
        self.analysis.lost == 0
            && self.analysis.violation_count == 0
            && self.exactly_once.as_ref().is_none_or(ExactlyOnce::holds)
    }

    /// The line to print right before the [`summary`](Self::summary): the replay
    /// command when the run failed, so that it is the first thing read after the
    /// summary scrolls by; `None` when it passed.
    pub fn replay_line(&self) -> Option<String> {
        (!self.passed()).then(|| format!("chaos: replay with: {}", self.replay))
    }

    /// Faults applied, all kinds.
    pub fn fault_total(&self) -> u64 {
        self.faults.values().sum()
    }

    /// The one-line summary.
    pub fn summary(&self) -> String {
        let a = &self.analysis;
        let failed: Vec<String> = a
            .checks
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(c, n)| format!(" {}={n}", c.name()))
            .collect();
        // Exactly once, `duplicates` counts the copies a read_committed reader found
        // twice; the records handled again (their transaction aborted) are
        // `handled_again`.
        let (duplicates, exactly_once) = match &self.exactly_once {
            Some(e) => (
                e.duplicates,
                format!(
                    " handled_again={} missing={} strays={} exactly_once={}",
                    a.duplicates,
                    e.missing,
                    e.strays,
                    if e.holds() { "held" } else { "BROKEN" }
                ),
            ),
            None => (a.duplicates, String::new()),
        };
        format!(
            "lost={} duplicates={duplicates} moves={} rebalances={} faults={} produced={} handled={} dead_lettered={} in_flight_bound={} violations={}{}{exactly_once} broker_double_grants={} ownership={} drained={} protocol={} seed={} result={}",
            a.lost,
            self.moves,
            a.generations,
            self.fault_total(),
            a.produced,
            a.handled,
            a.dead_lettered,
            a.in_flight_bound,
            a.violation_count,
            failed.concat(),
            a.early_grants,
            if self.ownership_checked {
                "checked"
            } else {
                "unchecked"
            },
            self.drained,
            self.group_protocol.name(),
            self.seed,
            if self.passed() { "pass" } else { "FAIL" },
        )
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = &self.analysis;
        let verdict = |ok: bool| if ok { "ok" } else { "FAILED" };
        writeln!(f, "== chaos results (seed {}) ==", self.seed)?;
        writeln!(
            f,
            "records:     produced {} (sent {}, {} sends failed), handled {} distinct, dead-lettered {} ({} copies in the DLQ topic), lost {}  [{}]",
            a.produced,
            a.sent,
            a.produce_failures,
            a.handled,
            a.dead_lettered,
            self.dlq_records,
            a.lost,
            verdict(a.lost == 0)
        )?;
        for (e, n) in &a.produce_errors {
            writeln!(f, "             send failure x{n}: {e}")?;
        }
        for l in &a.lost_examples {
            writeln!(f, "             LOST {l}")?;
        }
        writeln!(
            f,
            "duplicates:  {} finished again, over {} handovers whose finished-but-uncommitted window summed to {} (in-flight bound){}",
            a.duplicates,
            a.episodes,
            a.in_flight_bound,
            if a.duplicates <= a.in_flight_bound {
                ": within it"
            } else {
                ": ABOVE it (records finished again that were not in a handover window; see overlaps)"
            }
        )?;
        if let Some(e) = &self.exactly_once {
            writeln!(
                f,
                "exactly once: a read_committed reader found {} copies in {OUTPUT_TOPIC} and the dead-letter topic: {} inputs copied more often than the input topic holds them ({} extra copies), {} missing, {} strays  [{}]",
                e.read,
                e.inputs_twice,
                e.duplicates,
                e.missing,
                e.strays,
                verdict(e.holds())
            )?;
            for x in &e.examples {
                writeln!(f, "             {x}")?;
            }
        }
        writeln!(
            f,
            "handlers:    {} calls, {} transient failures, {} permanent, {} cancelled, {} retries scheduled",
            a.handler_calls, a.transient, a.permanent, a.cancelled, a.retries
        )?;
        writeln!(
            f,
            "commits:     {} partition commits reported by the metrics hooks; {} broker reads of the committed offsets ({} failed); longest wait from a record's last finish to a commit past it: {}",
            a.commits,
            a.polls,
            a.poll_failures,
            a.longest_commit_wait
                .map_or("none".to_string(), |(p, w)| format!("{w:.1}s (p{p})"))
        )?;
        writeln!(
            f,
            "handover:    longest time one partition's work ran in two live members at once: {}; {} handler starts on a partition after its member reported it lost",
            a.longest_overlap
                .map_or("never".to_string(), |(p, d)| format!("{d:.2}s (p{p})")),
            a.after_loss
        )?;
        writeln!(
            f,
            "ownership:   {} generations seen; {} handler starts before a generation was known; {} times a handler started while another live member still ran one of that partition{}",
            a.generations,
            a.untagged,
            a.overlaps,
            if self.ownership_checked {
                ""
            } else {
                "; UNCHECKED: no generation was reported by the metrics hooks"
            }
        )?;
        if a.early_grants > 0 {
            writeln!(
                f,
                "broker:      {} times the broker granted a partition to one member while it still counted another as its owner (it asked that one for it only afterwards); {} finished records were redone below the previous owner's later commit because of it (the broker's double grant, not counted as redone_below_commit; see the notes)",
                a.early_grants, a.redone_after_early_grant
            )?;
        }
        let checks: Vec<String> = a
            .checks
            .iter()
            .map(|(c, n)| format!("{}={n}", c.name()))
            .collect();
        writeln!(
            f,
            "invariants:  {}  [{}]",
            checks.join(" "),
            verdict(a.violation_count == 0)
        )?;
        writeln!(
            f,
            "members:     {} incarnations, {} ended without being asked",
            a.incarnations, a.unexpected_ends
        )?;
        writeln!(
            f,
            "drain:       {} in {:.1}s",
            if self.drained {
                "committed offsets reached the log end"
            } else {
                "TIMED OUT before the committed offsets reached the log end"
            },
            self.drain_time.as_secs_f64()
        )?;
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        writeln!(
            f,
            "faults:      {} ({}), {} protocol, assignor {}",
            self.fault_total(),
            faults.join(" "),
            self.group_protocol.name(),
            self.assignor
        )?;
        let gaps: Vec<String> = a
            .gaps
            .iter()
            .map(|(p, (g, at))| format!("p{p} {:.2}s@{at:.0}s", g.as_secs_f64()))
            .collect();
        writeln!(
            f,
            "gaps:        longest per partition (length@start): {}",
            gaps.join(", ")
        )?;
        if let Some((p, (g, at))) = a.gaps.iter().max_by_key(|(_, (g, _))| *g) {
            let during: Vec<String> = a
                .faults
                .iter()
                .filter(|(t, _)| *t >= at - 7.0 && *t <= at + g.as_secs_f64())
                .map(|(t, w)| format!("{t:.1}s {w}"))
                .collect();
            writeln!(
                f,
                "             faults around the longest (p{p}): {}",
                if during.is_empty() {
                    "none".to_string()
                } else {
                    during.join("; ")
                }
            )?;
        }
        let mut log: Vec<(&String, &u64)> = a.member_log.iter().collect();
        log.sort_by(|x, y| y.1.cmp(x.1).then(x.0.cmp(y.0)));
        writeln!(
            f,
            "member log:  (ottla's messages on member threads, by count)"
        )?;
        for (message, n) in log {
            writeln!(f, "  {n:>6} x {message}")?;
        }
        for n in &a.notes {
            writeln!(f, "note:        {n}")?;
        }
        if a.violation_count == 0 {
            writeln!(f, "violations:  none")?;
        } else {
            writeln!(
                f,
                "violations:  {} (first {} shown)",
                a.violation_count,
                a.violations.len()
            )?;
            for v in &a.violations {
                writeln!(f, "  VIOLATION {v}")?;
            }
        }
        Ok(())
    }
}

/// The run's broker.
enum Peer {
    Mock(MockCluster),
    Tansu(Tansu),
}

impl Peer {
    fn mock(brokers: i32) -> anyhow::Result<Peer> {
        let mock = MockCluster::new(brokers)?;
        mock.cap_group_apis()?;
        Ok(Peer::Mock(mock))
    }

    fn bootstrap(&self) -> String {
        match self {
            Peer::Mock(m) => m.bootstrap(),
            Peer::Tansu(t) => t.bootstrap(),
        }
    }

    fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        match self {
            Peer::Mock(m) => m.create_topic(name, partitions, 1),
            Peer::Tansu(t) => t.create_topic(name, partitions),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Peer::Mock(_) => "mock",
            Peer::Tansu(_) => "tansu",
        }
    }
}

/// Runs the whole chaos run with the `chaos` program's synthetic application
/// ([`App::synthetic`], handler failures from `config.fates`).
pub async fn run(config: Config) -> anyhow::Result<Report> {
    let app = if config.exactly_once {
        App::synthetic_copying(config.seed, config.fates)
    } else {
        App::synthetic(config.seed, config.fates)
    };
    run_app(config, app).await
}

/// Runs the whole chaos run of `app`: start the broker and the members, produce and
/// inject faults for `config.duration`, drain, stop, check. `Err` only when the run
/// could not be set up; findings are in the [`Report`].
pub async fn run_app(config: Config, app: App) -> anyhow::Result<Report> {
    // First, so that a run that hangs or is killed can still be replayed.
    let replay = config
        .replay
        .clone()
        .unwrap_or_else(|| config.replay_command());
    println!("chaos: replay with: {replay}");
    let capture = capture::install();
    let assignor = config.assignor();
    let shown_assignor = assignor
        .clone()
        .unwrap_or_else(|| "the broker's default".into());
    let rates = config.effective_rates();
    let peer = match config.broker {
        BrokerKind::Mock => Peer::mock(config.brokers)?,
        BrokerKind::Tansu => Peer::Tansu(Tansu::start()?),
    };
    let mock: Option<&MockCluster> = match &peer {
        Peer::Mock(m) => {
            m.set_group_initial_rebalance_delay(Duration::from_millis(200));
            // Consumer-protocol groups take their session and heartbeat interval from
            // the broker (KIP-848); the mock's defaults are 30 s and 3 s.
            m.set_group_consumer_session_timeout(config.session_timeout)?;
            m.set_group_consumer_heartbeat_interval(config.session_timeout / 6)?;
            Some(m)
        }
        _ => None,
    };
    let dlq_topic = format!("{TOPIC}.dlq");
    peer.create_topic(TOPIC, config.partitions)?;
    peer.create_topic(&dlq_topic, 1)?;
    if config.exactly_once {
        peer.create_topic(OUTPUT_TOPIC, config.partitions)?;
    }
    let bootstrap = peer.bootstrap();
    let group = format!("chaos-{}", config.seed);
    let brokers = mock.map(|m| m.broker_ids()).unwrap_or_default();

    let input = config.plan_input(brokers.clone());
    let plan = schedule::plan(&input);
    // The plan's model starts from this coordinator; pin it before anyone asks.
    if let (Some(m), Some(c)) = (mock, schedule::initial_coordinator(&input)) {
        m.set_group_coordinator(&group, c)
            .context("pinning the first coordinator")?;
    }
    println!(
        "chaos: seed={} broker={} protocol={} members={} duration={} assignor={shown_assignor} partitions={} produce_rate={}/s planned_actions={}",
        config.seed,
        peer.name(),
        config.group_protocol.name(),
        config.members,
        format_duration(config.duration),
        config.partitions,
        config.produce_rate,
        plan.len()
    );
    let shown: Vec<String> = rates
        .iter()
        .map(|(k, r)| format!("{}={r}", k.name()))
        .collect();
    println!(
        "chaos: faults per minute: {}; handler transient={} permanent={} slow={}",
        shown.join(" "),
        config.fates.transient,
        config.fates.permanent,
        config.fates.slow
    );
    if !capture {
        println!(
            "chaos: another tracing subscriber is installed; ottla's warnings are not counted"
        );
    }

    let journal = Arc::new(Journal::new());
    // Under the consumer protocol the broker assigns: its double grants are its own.
    journal.set_broker_assigns(matches!(config.group_protocol, GroupProtocol::Consumer));
    journal.set_check_broker_commits(app.is_consumer());
    let ctx = Arc::new(MemberContext {
        bootstrap: bootstrap.clone(),
        group: group.clone(),
        topic: TOPIC.into(),
        group_protocol: config.group_protocol,
        assignor,
        seed: config.seed,
        fates: config.fates,
        commit_interval: config.commit_interval,
        session_timeout: config.session_timeout,
        fetch_max_wait: config.fetch_max_wait,
        stall: config.stall.map(|max| (max, config.stall_every)),
        ordering: config.ordering,
        exactly_once: config.exactly_once,
        journal: journal.clone(),
        app,
    });
    let contention = Contention::start(config.contention);
    if config.contention > 0 || config.stall.is_some() {
        println!(
            "chaos: load: {} busy threads; member stalls {}",
            config.contention,
            match config.stall {
                Some(d) => format!(
                    "up to {} about every {}",
                    format_duration(d),
                    format_duration(config.stall_every)
                ),
                None => "off".into(),
            }
        );
    }

    // Committed offsets read back from the broker.
    let polling = Arc::new(AtomicBool::new(true));
    let poller = {
        let (bootstrap, group, journal, polling) = (
            bootstrap.clone(),
            group.clone(),
            journal.clone(),
            polling.clone(),
        );
        let partitions = config.partitions;
        std::thread::Builder::new()
            .name("chaos-poller".into())
            .spawn(move || poll_committed(&bootstrap, &group, partitions, &journal, &polling))
            .context("spawning the committed-offset poller")?
    };

    let mut runner = Runner {
        ctx: ctx.clone(),
        mock,
        group: group.clone(),
        slots: Vec::new(),
        stopped: Vec::new(),
        faults: BTreeMap::new(),
        verbose: config.verbose,
    };
    for slot in 0..config.members {
        runner.start_slot(slot);
    }

    // The producer.
    let producing = Arc::new(AtomicBool::new(true));
    let producer = tokio::spawn(produce(
        bootstrap.clone(),
        config.linger,
        (config.partitions, config.ordering),
        config.produce_rate,
        journal.clone(),
        producing.clone(),
    ));

    // Faults.
    let start = Instant::now();
    let mut next_progress = config.progress.map(|p| start + p);
    let mut steps = plan.into_iter().peekable();
    loop {
        let now = Instant::now();
        if now >= start + config.duration {
            break;
        }
        while let Some((at, _)) = steps.peek() {
            if start + *at > now {
                break;
            }
            if let Some((_, action)) = steps.next() {
                runner.apply(&action);
            }
        }
        runner.supervise();
        if next_progress.is_some_and(|p| now >= p) {
            next_progress = config.progress.map(|d| now + d);
            print_progress(&journal, &runner, start.elapsed(), None);
        }
        let next_step = steps.peek().map(|(at, _)| start + *at);
        let wake = [
            Some(now + Duration::from_millis(250)),
            next_step,
            Some(start + config.duration),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now);
        tokio::time::sleep_until(wake.into()).await;
    }

    // Restore the cluster and bring every killed member back, then stop producing
    // and wait for the last deliveries.
    if let Some(m) = mock {
        for b in &brokers {
            let _ = m.broker_up(*b);
            let _ = m.set_rtt(*b, Duration::ZERO);
        }
        for api in schedule::injected_apis(config.group_protocol) {
            m.clear_request_errors(api.key);
        }
    }
    runner.restart_all_killed();
    producing.store(false, Ordering::SeqCst);
    match producer.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => journal.note(format!("the producer stopped: {e:#}")),
        Err(e) => journal.note(format!("the producer task failed: {e}")),
    }
    println!(
        "chaos: t={:.0}s faults stopped; draining",
        start.elapsed().as_secs_f64()
    );

    // Drain: until every partition's committed offset reaches its last record.
    let targets = journal.targets();
    let drain_start = Instant::now();
    let mut drained = false;
    while drain_start.elapsed() < config.drain_timeout {
        runner.supervise();
        if journal.progress(Some(&targets)).drained {
            drained = true;
            break;
        }
        let now = Instant::now();
        if next_progress.is_some_and(|p| now >= p) {
            next_progress = config.progress.map(|d| now + d);
            print_progress(&journal, &runner, start.elapsed(), Some(&targets));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drain_time = drain_start.elapsed();
    if !drained {
        for line in journal.behind(&targets) {
            journal.note(format!("stalled: {line}"));
        }
        let p = journal.progress(Some(&targets));
        journal.violation(
            journal::Check::Drain,
            format!(
            "the committed offsets did not reach the log end within {:?} after the faults stopped ({} records behind)",
            config.drain_timeout, p.uncommitted
        ),
        );
    }
    runner.leave_all().await;
    drop(contention);
    polling.store(false, Ordering::SeqCst);
    let _ = tokio::task::spawn_blocking(move || poller.join()).await;

    let isolation = if config.exactly_once {
        IsolationLevel::ReadCommitted
    } else {
        IsolationLevel::ReadUncommitted
    };
    let dlq = read_copies(&bootstrap, &dlq_topic, 1, isolation).await;
    let in_dlq: BTreeSet<u64> = dlq.iter().copied().collect();
    let analysis = journal.analyse(&in_dlq);
    let exactly_once = if config.exactly_once {
        let copies = read_copies_at(&bootstrap, OUTPUT_TOPIC, config.partitions, isolation).await;
        let output: Vec<u64> = copies.iter().map(|(seq, _, _)| *seq).collect();
        // The input topic as written (its producer's retries may have written a
        // record twice: two inputs, two outputs).
        let inputs = read_copies(
            &bootstrap,
            TOPIC,
            config.partitions,
            IsolationLevel::ReadUncommitted,
        )
        .await;
        let mut found = ExactlyOnce::count(&journal.produced_seqs(), &inputs, &output, &dlq);
        // Where each of the first inputs found twice was, who finished it, and the
        // commits around: what a reader of the report needs to find the cause.
        let copied = found.examples.iter_mut().filter(|e| e.ends_with(" inputs"));
        // What librdkafka's read_committed reader finds at the same places.
        let referee = if found.twice.is_empty() {
            BTreeMap::new()
        } else {
            let (bootstrap, partitions) = (bootstrap.clone(), config.partitions);
            tokio::task::spawn_blocking(move || {
                read_copies_librdkafka(&bootstrap, OUTPUT_TOPIC, partitions)
            })
            .await
            .unwrap_or_default()
        };
        for (example, seq) in copied.zip(&found.twice) {
            let at: Vec<String> = copies
                .iter()
                .filter(|(s, _, _)| s == seq)
                .map(|(_, p, o)| {
                    let librdkafka = match referee.get(&(*p, *o)) {
                        Some(s) if s == seq => "librdkafka reads it too",
                        Some(_) => "librdkafka reads another record there",
                        None => "librdkafka does not read it",
                    };
                    format!("{p}@{o} ({librdkafka})")
                })
                .collect();
            example.push_str(&format!(
                " at {} of {OUTPUT_TOPIC} (input {})",
                at.join(" and "),
                journal.history(*seq)
            ));
        }
        if found.missing > 0 {
            // Inputs without a visible copy: is the copy in the log, hidden from
            // read_committed (an open or aborted transaction), or not written at all?
            let uncommitted = read_copies_at(
                &bootstrap,
                OUTPUT_TOPIC,
                config.partitions,
                IsolationLevel::ReadUncommitted,
            )
            .await;
            let mut ends: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
            for (_, p, o) in &copies {
                let e = ends.entry(*p).or_insert((-1, -1));
                e.0 = e.0.max(*o);
            }
            for (_, p, o) in &uncommitted {
                let e = ends.entry(*p).or_insert((-1, -1));
                e.1 = e.1.max(*o);
            }
            let by_partition: Vec<String> = ends
                .iter()
                .map(|(p, (read, log))| {
                    format!("partition {p}: read_committed to {read}, the log to {log}")
                })
                .collect();
            let missing = found
                .examples
                .iter_mut()
                .filter(|e| e.ends_with("(not in the output)"));
            for (example, seq) in missing.zip(&found.absent) {
                let at: Vec<String> = uncommitted
                    .iter()
                    .filter(|(s, _, _)| s == seq)
                    .map(|(_, p, o)| format!("{p}@{o}"))
                    .collect();
                if at.is_empty() {
                    example.push_str("; not in the log at all");
                } else {
                    example.push_str(&format!("; in the log uncommitted at {}", at.join(", ")));
                }
            }
            // A partition read_committed stops far short of its log's end is held
            // back by a transaction nobody ended (its last stable offset).
            found
                .examples
                .push(format!("{OUTPUT_TOPIC}: {}", by_partition.join("; ")));
        }
        Some(found)
    } else {
        None
    };
    let ownership_checked = analysis.generations > 0;
    let mut faults: BTreeMap<&'static str, u64> = rates
        .iter()
        .filter(|(_, r)| **r > 0.0)
        .map(|(k, _)| (k.name(), 0))
        .collect();
    for (k, n) in &runner.faults {
        faults.insert(k.name(), *n);
    }
    let moves = [FaultKind::Move, FaultKind::Silent]
        .iter()
        .map(|k| runner.faults.get(k).copied().unwrap_or(0))
        .sum();
    drop(runner);
    drop(peer);
    Ok(Report {
        seed: config.seed,
        group_protocol: config.group_protocol,
        assignor: shown_assignor,
        moves,
        faults,
        analysis,
        ownership_checked,
        drained,
        drain_time,
        dlq_records: dlq.len() as u64,
        exactly_once,
        replay,
    })
}

/// What a `read_committed` reader found in an exactly-once run's output and
/// dead-letter topics, per input acknowledged by the broker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExactlyOnce {
    /// Copies read (output and dead-letter topics).
    pub read: u64,
    /// Inputs found more than once: the copies beyond the first.
    pub duplicates: u64,
    /// How many inputs were found more than once.
    pub inputs_twice: u64,
    /// Inputs found nowhere.
    pub missing: u64,
    /// Copies of no input the producer wrote.
    pub strays: u64,
    /// Some inputs found twice or missing, for the report.
    pub examples: Vec<String>,
    /// The first inputs found twice (sequence numbers), whose history the report
    /// gives.
    pub twice: Vec<u64>,
    /// The first inputs found too few times (sequence numbers), whose place in the
    /// log the report gives.
    pub absent: Vec<u64>,
}

impl ExactlyOnce {
    /// Counts `output` and `dlq` (sequence numbers read) against `produced`, each
    /// sequence number expected as many times as `inputs` holds it (the input topic's
    /// copies: the run's producer is not idempotent, and a retry may write a record
    /// twice; each copy is an input of its own, handled and copied once). A sequence
    /// number the input read did not find counts once.
    pub fn count(
        produced: &BTreeSet<u64>,
        inputs: &[u64],
        output: &[u64],
        dlq: &[u64],
    ) -> ExactlyOnce {
        let mut copies: BTreeMap<u64, u64> = BTreeMap::new();
        for seq in output.iter().chain(dlq) {
            *copies.entry(*seq).or_insert(0) += 1;
        }
        let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
        for seq in inputs {
            *expected.entry(*seq).or_insert(0) += 1;
        }
        let mut found = ExactlyOnce {
            read: (output.len() + dlq.len()) as u64,
            ..ExactlyOnce::default()
        };
        for seq in produced {
            let want = expected.get(seq).copied().unwrap_or(1);
            let n = copies.get(seq).copied().unwrap_or(0);
            if n < want {
                found.missing += want - n;
                if found.examples.len() < 10 {
                    found.examples.push(format!(
                        "seq {seq}: {n} copies of {want} inputs (not in the output)"
                    ));
                    found.absent.push(*seq);
                }
            } else if n > want {
                found.duplicates += n - want;
                found.inputs_twice += 1;
                if found.examples.len() < 10 {
                    found
                        .examples
                        .push(format!("seq {seq}: {n} copies of {want} inputs"));
                    found.twice.push(*seq);
                }
            }
        }
        found.strays = copies
            .iter()
            .filter(|(seq, _)| !produced.contains(seq))
            .map(|(_, n)| n)
            .sum();
        found
    }

    /// Every input exactly once, and nothing else.
    pub fn holds(&self) -> bool {
        self.duplicates == 0 && self.missing == 0 && self.strays == 0
    }
}

/// Busy threads that spin until dropped (`--contention`).
struct Contention {
    spinning: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Contention {
    fn start(n: usize) -> Contention {
        let spinning = Arc::new(AtomicBool::new(true));
        let threads = (0..n)
            .filter_map(|i| {
                let spinning = spinning.clone();
                std::thread::Builder::new()
                    .name(format!("chaos-spin{i}"))
                    .spawn(move || {
                        let mut x: u64 = i as u64;
                        while spinning.load(Ordering::Relaxed) {
                            for _ in 0..100_000 {
                                x = std::hint::black_box(x.wrapping_mul(6364136223846793005) ^ 1);
                            }
                        }
                    })
                    .ok()
            })
            .collect();
        Contention { spinning, threads }
    }
}

impl Drop for Contention {
    fn drop(&mut self) {
        self.spinning.store(false, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn print_progress(
    journal: &Journal,
    runner: &Runner<'_>,
    elapsed: Duration,
    targets: Option<&BTreeMap<i32, i64>>,
) {
    let p = journal.progress(targets);
    println!(
        "chaos: t={:.0}s sent={} acked={} finished={} uncommitted={} generations={} members={} faults={}",
        elapsed.as_secs_f64(),
        p.sent,
        p.acked,
        p.finished,
        p.uncommitted,
        p.generations,
        runner.live(),
        runner.faults.values().sum::<u64>()
    );
}

/// Executes the plan against the broker and the members.
struct Runner<'a> {
    ctx: Arc<MemberContext>,
    mock: Option<&'a MockCluster>,
    group: String,
    slots: Vec<SlotState>,
    /// Members told to stop, kept until their threads end.
    stopped: Vec<Member>,
    faults: BTreeMap<FaultKind, u64>,
    verbose: bool,
}

#[derive(Debug, Default)]
struct SlotState {
    /// The running incarnation.
    member: Option<Member>,
    /// Incarnations started so far.
    incarnations: usize,
    /// It left cleanly and stays gone.
    left: bool,
}

impl Runner<'_> {
    fn start_slot(&mut self, slot: usize) {
        while self.slots.len() <= slot {
            self.slots.push(SlotState::default());
        }
        let s = &mut self.slots[slot];
        s.member = Some(Member::start(self.ctx.clone(), slot, s.incarnations));
        s.incarnations += 1;
        s.left = false;
    }

    fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.member.is_some()).count()
    }

    fn stop_slot(&mut self, slot: usize, how: Stop) {
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.left = how == Stop::Leave;
        let Some(mut m) = s.member.take() else {
            return;
        };
        if how != Stop::Leave {
            self.ctx.journal.incarnation_stopping(m.inc);
        }
        m.stop(how);
        self.stopped.push(m);
    }

    fn apply(&mut self, action: &Action) {
        let kind = action.kind();
        if let Some(k) = kind {
            *self.faults.entry(k).or_default() += 1;
        }
        let result = match (action, self.mock) {
            (Action::MoveCoordinator { to }, Some(m)) => m.set_group_coordinator(&self.group, *to),
            (Action::BrokerDown { broker }, Some(m)) => m.broker_down(*broker),
            (Action::BrokerUp { broker }, Some(m)) => m.broker_up(*broker),
            (Action::RttSpike { broker, rtt_ms }, Some(m)) => {
                m.set_rtt(*broker, Duration::from_millis(*rtt_ms))
            }
            (Action::RttNormal { broker }, Some(m)) => m.set_rtt(*broker, Duration::ZERO),
            // The mock still handles what reaches the silent broker and holds the answers
            // back until the silence ends (see `Action::Silence` for why the delay is the
            // silence's length); then they go out, on connections the members may have
            // dropped meanwhile.
            (Action::Silence { broker, to, ms }, Some(m)) => m
                .set_rtt(*broker, Duration::from_millis(*ms))
                .and_then(|()| m.set_group_coordinator(&self.group, *to)),
            (Action::Speak { broker }, Some(m)) => m.set_rtt(*broker, Duration::ZERO),
            (Action::InjectErrors { api, codes }, Some(m)) => {
                m.push_request_errors(api.key, codes);
                Ok(())
            }
            (Action::Kill { slot, crash }, _) => {
                let how = if *crash { Stop::Crash } else { Stop::Abort };
                self.stop_slot(*slot, how);
                Ok(())
            }
            (Action::Leave { slot }, _) => {
                self.stop_slot(*slot, Stop::Leave);
                Ok(())
            }
            (Action::Restart { slot } | Action::Join { slot }, _) => {
                if self.slots.get(*slot).is_none_or(|s| s.member.is_none()) {
                    self.start_slot(*slot);
                }
                Ok(())
            }
            (_, None) => Ok(()),
        };
        let what = match kind {
            Some(k) => format!("{}: {action}", k.name()),
            None => format!("then: {action}"),
        };
        if let Err(e) = result {
            self.ctx.journal.note(format!("{what} failed: {e:#}"));
        }
        if self.verbose {
            println!("chaos: t={:.1}s {what}", self.ctx.journal.now());
        }
        self.ctx.journal.fault(what);
    }

    /// Restarts members that ended without being asked (each such end is already a
    /// violation), so the run goes on; forgets stopped members whose threads ended.
    fn supervise(&mut self) {
        let journal = self.ctx.journal.clone();
        let dead: Vec<usize> = (0..self.slots.len())
            .filter(|s| {
                self.slots[*s]
                    .member
                    .as_ref()
                    .is_some_and(|m| journal.has_ended(m.inc))
            })
            .collect();
        for slot in dead {
            self.start_slot(slot);
        }
        self.stopped.retain(|m| !journal.has_ended(m.inc));
    }

    /// Brings back every slot that was killed or crashed (not those that left).
    fn restart_all_killed(&mut self) {
        let down: Vec<usize> = (0..self.slots.len())
            .filter(|s| self.slots[*s].member.is_none() && !self.slots[*s].left)
            .collect();
        for slot in down {
            self.start_slot(slot);
        }
    }

    /// Asks every member to leave and waits for them.
    async fn leave_all(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].member.is_some() {
                self.stop_slot(slot, Stop::Leave);
            }
        }
        // All were told at once; waiting in turn takes as long as the slowest.
        for m in &mut self.stopped {
            if !m.wait(Duration::from_secs(60)).await {
                self.ctx.journal.violation(
                    journal::Check::Member,
                    format!(
                        "member #{} did not stop within 60 s of being asked to",
                        m.inc
                    ),
                );
            }
        }
        self.stopped.clear();
    }
}

/// Writes records `0..` at `rate` per second until `producing` turns false, then
/// waits for every delivery. Record `seq` has key `<seq>` and value `seq=<seq> ...`
/// and goes to partition `seq % partitions`.
async fn produce(
    bootstrap: String,
    linger: Duration,
    (partitions, ordering): (i32, ProcessingOrder),
    rate: f64,
    journal: Arc<Journal>,
    producing: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let producer: FutureProducer = RdConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("client.id", "chaos-producer")
        .set("linger.ms", linger.as_millis().to_string())
        .set("acks", "all")
        // Retries may write a record twice; loss is counted by sequence number and
        // duplicates by offset, so the producer's copies do not count as the consumer's.
        .set("enable.idempotence", "false")
        .set("message.timeout.ms", "120000")
        .set("retry.backoff.ms", "50")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .context("creating the rdkafka producer")?;
    let mut deliveries = tokio::task::JoinSet::new();
    let tick = Duration::from_millis(10);
    let per_tick = rate * tick.as_secs_f64();
    let mut owed = 0.0;
    let mut seq: u64 = 0;
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while producing.load(Ordering::SeqCst) {
        interval.tick().await;
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            let (key, value) = match order_key(seq, partitions, ordering) {
                Some(k) => {
                    let value = format!("seq={seq} {k} {}", "x".repeat((seq % 64) as usize));
                    (k, value)
                }
                None => (
                    seq.to_string(),
                    format!("seq={seq} {}", "x".repeat((seq % 64) as usize)),
                ),
            };
            let partition = (seq % partitions as u64) as i32;
            let mut record = FutureRecord::to(TOPIC)
                .partition(partition)
                .key(&key)
                .payload(&value);
            let delivery = loop {
                match producer.send_result(record) {
                    Ok(d) => break d,
                    Err((e, r)) if e.to_string().contains("Queue full") => {
                        record = r;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => bail!("send of seq {seq} refused: {e}"),
                }
            };
            journal.sent(seq);
            let journal = journal.clone();
            let this = seq;
            deliveries.spawn(async move {
                match delivery.await {
                    Ok(Ok(d)) => journal.acked(this, d.partition, d.offset),
                    Ok(Err((e, _))) => journal.produce_failed(this, e.to_string()),
                    Err(_) => journal.produce_failed(this, "delivery cancelled".into()),
                }
            });
            seq += 1;
        }
        while deliveries.try_join_next().is_some() {}
    }
    while deliveries.join_next().await.is_some() {}
    Ok(())
}

/// Reads the group's committed offsets from the broker every second, with rdkafka
/// (OffsetFetch; the consumer never joins the group).
fn poll_committed(
    bootstrap: &str,
    group: &str,
    partitions: i32,
    journal: &Journal,
    polling: &AtomicBool,
) {
    let consumer: BaseConsumer = match RdConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("client.id", "chaos-poller")
        .set("enable.auto.commit", "false")
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            journal.note(format!("the committed-offset poller could not start: {e}"));
            return;
        }
    };
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(TOPIC, p);
    }
    while polling.load(Ordering::SeqCst) {
        match consumer.committed_offsets(list.clone(), Duration::from_secs(5)) {
            Ok(l) => {
                for e in l.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        journal.polled(e.partition(), o);
                    }
                }
            }
            Err(_) => journal.poll_failed(),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The sequence numbers in the dead-letter topic (one per copy).
/// The sequence numbers of every record of `topic` (its `partitions`), read with
/// `isolation` from the start.
async fn read_copies(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: IsolationLevel,
) -> Vec<u64> {
    read_copies_at(bootstrap, topic, partitions, isolation)
        .await
        .into_iter()
        .map(|(seq, _, _)| seq)
        .collect()
}

/// The sequence numbers of `topic`'s records as librdkafka reads them with
/// `read_committed`, by `(partition, offset)`: an independent reader, so that an
/// exactly-once verdict does not rest on ottla's own filtering of aborted
/// transactions.
fn read_copies_librdkafka(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<(i32, i64), u64> {
    let mut out = BTreeMap::new();
    let Ok(consumer) = RdConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "chaos-referee")
        .set("client.id", "chaos-referee")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create::<BaseConsumer>()
    else {
        return out;
    };
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        let _ = list.add_partition_offset(topic, p, Offset::Beginning);
    }
    if consumer.assign(&list).is_err() {
        return out;
    }
    let mut idle_since = Instant::now();
    let deadline = Instant::now() + READ_BOUND;
    while Instant::now() < deadline && idle_since.elapsed() < Duration::from_secs(3) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            idle_since = Instant::now();
            let seq = rdkafka::Message::key(&m)
                .zip(rdkafka::Message::payload(&m))
                .and_then(|(key, value)| member::seq_in(key, value));
            if let Some(seq) = seq {
                out.insert(
                    (
                        rdkafka::Message::partition(&m),
                        rdkafka::Message::offset(&m),
                    ),
                    seq,
                );
            }
        }
    }
    out
}

/// How long the final reads of a topic may take at most.
const READ_BOUND: Duration = Duration::from_secs(300);

/// [`read_copies`], with where each copy is (partition, offset).
async fn read_copies_at(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: IsolationLevel,
) -> Vec<(u64, i32, i64)> {
    let mut out = Vec::new();
    let Ok(mut consumer) = Consumer::builder(bootstrap)
        .assign((0..partitions).map(|p| TopicPartition::new(topic, p)))
        .offset_reset(OffsetReset::Earliest)
        .isolation(isolation)
        .build()
        .await
    else {
        return out;
    };
    // Until 3 s pass with nothing new (the topic is complete: its writers stopped), or
    // READ_BOUND. A 10-minute exactly-once run leaves some 130,000 records and
    // markers in the output: 30 s read only part of them under the consumer protocol,
    // and the tail counted as missing.
    let deadline = Instant::now() + READ_BOUND;
    loop {
        if Instant::now() >= deadline {
            eprintln!(
                "chaos: the read of {topic} stopped at its {} s bound after {} records; the counts are incomplete",
                READ_BOUND.as_secs(),
                out.len()
            );
            break;
        }
        match tokio::time::timeout(Duration::from_secs(3), consumer.recv()).await {
            // A dead letter keeps the record's key and value: its sequence number is
            // read as the members read it (the key is the order key under
            // `--ordering key`).
            Ok(Some(Ok(r))) => {
                if let Some(seq) = member::seq_of(&r) {
                    out.push((seq, r.partition(), r.offset()));
                }
            }
            Ok(Some(Err(_))) => {}
            Ok(None) | Err(_) => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_once_expects_one_copy_per_input_record_not_per_sequence_number() {
        let produced: BTreeSet<u64> = [1, 2, 3].into_iter().collect();
        // The producer's retry wrote seq 2 twice: two inputs, two copies expected.
        let inputs = [1, 2, 2, 3];
        let held = ExactlyOnce::count(&produced, &inputs, &[1, 2, 2], &[3]);
        assert!(held.holds(), "{held:?}");
        assert_eq!((held.duplicates, held.missing, held.read), (0, 0, 4));
        // A third copy of 2 is one too many; 3 found nowhere is missing.
        let broken = ExactlyOnce::count(&produced, &inputs, &[1, 2, 2, 2], &[]);
        assert_eq!(
            (broken.duplicates, broken.inputs_twice, broken.missing),
            (1, 1, 1)
        );
        assert_eq!(
            (broken.twice.clone(), broken.absent.clone()),
            (vec![2], vec![3])
        );
        assert!(!broken.holds());
        // Only one copy of the doubly written 2: one missing.
        let short = ExactlyOnce::count(&produced, &inputs, &[1, 2, 3], &[]);
        assert_eq!((short.duplicates, short.missing), (0, 1));
        assert_eq!(short.absent, vec![2]);
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("60s").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn the_ordering_is_a_flag_replayed_and_keys_each_partition_with_eight_keys() {
        let args: Vec<String> = ["--ordering", "key"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let c = Config::from_args(&args, |_| None).unwrap();
        assert_eq!(c.ordering, ProcessingOrder::Key);
        assert!(
            c.replay_command().contains("--ordering key"),
            "{}",
            c.replay_command()
        );
        assert!(Config::from_args(&["--ordering".into(), "random".into()], |_| None).is_err());
        let by_default = Config::from_args(&[], |_| None).unwrap();
        assert!(!by_default.replay_command().contains("--ordering"));
        // Records 0..48 of 6 partitions: partition p gets keys p{p}k0..k7, each twice.
        let keys: BTreeSet<String> = (0..96)
            .filter_map(|seq| order_key(seq, 6, ProcessingOrder::Key))
            .collect();
        assert_eq!(keys.len(), 6 * KEYS_PER_PARTITION as usize);
        assert_eq!(
            order_key(7, 6, ProcessingOrder::Key).as_deref(),
            Some("p1k1")
        );
        assert_eq!(order_key(7, 6, ProcessingOrder::Partition), None);
    }

    #[test]
    fn flags_win_over_the_environment() {
        let args: Vec<String> = ["--duration", "2m", "--rate", "move=30,kill=0", "--seed=5"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let env = |k: &str| match k {
            "OTTLA_CHAOS_DURATION" => Some("10m".to_string()),
            "OTTLA_CHAOS_BROKER" => Some("tansu".to_string()),
            _ => None,
        };
        let c = Config::from_args(&args, env).unwrap();
        assert_eq!(c.duration, Duration::from_secs(120));
        assert_eq!(c.seed, 5);
        assert_eq!(c.broker, BrokerKind::Tansu);
        assert_eq!(c.rates[&FaultKind::Move], 30.0);
        assert_eq!(c.rates[&FaultKind::Kill], 0.0);
        assert_eq!(c.effective_rates()[&FaultKind::Move], 0.0);
        assert!(c.replay_command().contains("--seed 5"));
        assert!(Config::from_args(&["--bogus".into(), "1".into()], |_| None).is_err());
    }

    #[test]
    fn the_group_protocol_is_a_flag_replayed_and_mock_only() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = Config::from_args(&args(&["--seed", "3"]), |_| None).unwrap();
        assert_eq!(c.group_protocol, GroupProtocol::Classic);
        assert!(!c.replay_command().contains("--group-protocol"));
        let c = Config::from_args(&args(&["--group-protocol", "consumer"]), |_| None).unwrap();
        assert_eq!(c.group_protocol, GroupProtocol::Consumer);
        assert!(c.replay_command().contains("--group-protocol consumer"));
        assert_eq!(c.assignor(), None);
        let env = |k: &str| (k == "OTTLA_CHAOS_GROUP_PROTOCOL").then(|| "consumer".to_string());
        let c = Config::from_args(&args(&["--assignor", "uniform"]), env).unwrap();
        assert_eq!(c.assignor().as_deref(), Some("uniform"));
        // Classic assignors are the members'; the consumer protocol names the broker's.
        assert!(Config::from_args(&args(&["--assignor", "sticky"]), env).is_err());
        assert!(Config::from_args(&args(&["--broker", "tansu"]), env).is_err());
        assert!(Config::from_args(&args(&["--group-protocol", "eager"]), |_| None).is_err());
    }

    #[test]
    fn contention_and_stalls_are_flags_replayed_and_bounded_by_the_session() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = Config::from_args(&args(&["--seed", "3"]), |_| None).unwrap();
        assert_eq!((c.contention, c.stall), (0, None));
        assert!(!c.replay_command().contains("--contention"));
        assert!(!c.replay_command().contains("--stall"));
        let c = Config::from_args(
            &args(&[
                "--contention",
                "2",
                "--stall",
                "300ms",
                "--stall-every",
                "2s",
            ]),
            |_| None,
        )
        .unwrap();
        assert_eq!(c.contention, 2);
        assert_eq!(c.stall, Some(Duration::from_millis(300)));
        let replay = c.replay_command();
        assert!(replay.contains("--contention 2"), "{replay}");
        assert!(
            replay.contains("--stall 300ms --stall-every 2s"),
            "{replay}"
        );
        // The replay command parses back to the same load.
        let words: Vec<String> = replay
            .split(' ')
            .skip_while(|w| *w != "--")
            .skip(1)
            .map(String::from)
            .collect();
        let again = Config::from_args(&words, |_| None).unwrap();
        assert_eq!(
            (again.contention, again.stall, again.stall_every),
            (2, Some(Duration::from_millis(300)), Duration::from_secs(2))
        );
        let env = |k: &str| match k {
            "OTTLA_CHAOS_CONTENTION" => Some("3".to_string()),
            "OTTLA_CHAOS_STALL" => Some("0".to_string()),
            _ => None,
        };
        let c = Config::from_args(&[], env).unwrap();
        assert_eq!((c.contention, c.stall), (3, None));
        // A stall as long as the session would expel the member, not merely starve it.
        assert!(Config::from_args(&args(&["--stall", "3s"]), |_| None).is_err());
        assert!(
            Config::from_args(&args(&["--stall", "3s", "--session-timeout", "6s"]), |_| {
                None
            })
            .is_ok()
        );
    }

    #[test]
    fn stalls_are_drawn_from_the_seed_within_their_bounds() {
        let (max, every) = (Duration::from_millis(400), Duration::from_secs(1));
        for k in 0..1000 {
            let (gap, block) = member::stall_at(9, 2, k, max, every);
            assert_eq!((gap, block), member::stall_at(9, 2, k, max, every));
            assert!(gap >= every / 2 && gap <= every * 3 / 2, "{gap:?}");
            assert!(block <= max, "{block:?}");
        }
        assert_ne!(
            member::stall_at(9, 2, 0, max, every),
            member::stall_at(9, 3, 0, max, every)
        );
    }

    #[test]
    fn a_failing_report_gives_its_replay_line() {
        let report = |violations: u64| Report {
            seed: 1,
            group_protocol: GroupProtocol::Classic,
            assignor: "range".into(),
            analysis: Analysis {
                violation_count: violations,
                ..Analysis::default()
            },
            moves: 0,
            faults: BTreeMap::new(),
            ownership_checked: true,
            drained: true,
            drain_time: Duration::ZERO,
            dlq_records: 0,
            exactly_once: None,
            replay: "cargo run --release -p ottla-chaos --bin chaos -- --seed 1".into(),
        };
        assert_eq!(report(0).replay_line(), None);
        assert_eq!(
            report(2).replay_line().as_deref(),
            Some("chaos: replay with: cargo run --release -p ottla-chaos --bin chaos -- --seed 1")
        );
    }
}
