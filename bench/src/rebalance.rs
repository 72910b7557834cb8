//! Rebalance timings: how long a group takes to start, and how long records stop
//! coming when the coordinator moves or a member joins, for ottla's `Consumer` and for
//! librdkafka's consumer (rust-rdkafka `BaseConsumer`) on the same kind of mock cluster.
//!
//! Every run gets a fresh 3-broker librdkafka mock cluster (group APIs capped, see
//! `PEERS.md`), a fresh topic and a fresh group. Members run in this process: ottla's
//! as tokio tasks, librdkafka's each on its own thread. A librdkafka producer on a thread
//! of its own writes one record to every partition every `tick`. Each member notes the
//! time ([`Instant::now`]) at which each record reaches its loop. A partition makes
//! progress when a record arrives at an offset above every offset it delivered before
//! (records read again after a rebalance do not count); a gap is the time between two
//! such arrivals.
//!
//! Scenarios:
//! - **cold start**: records pre-produced; the time from starting 3 members until
//!   every partition has delivered a record.
//! - **coordinator move**: 3 members, steady production; the group's coordinator moves
//!   from broker 1 to broker 2. The longest gap of any partition, and the longest time
//!   with no progress on any partition, from 1 s before the move to `window` after.
//! - **scale-out**: 2 members, steady production; a third starts. Per partition, the
//!   longest gap from its last progress before the start to the end of the run, which
//!   ends `tail` after the third member's first record. A partition *stayed* if the
//!   member that delivered it last before the start also delivered it last at the end.
//! - **KIP-848 scale-out with coordinator moves**: both clients on the consumer group
//!   protocol (`group.protocol=consumer`, the broker assigns). 1 member, steady
//!   production; a second starts, and the coordinator moves three times while the
//!   partitions change hands (broker 1 to 2 to 3 to 1, every `move_every` from the
//!   start). Partitions that stay must not pause: their longest gap, against the
//!   steady one before the start. For each moved partition, the time from its
//!   revocation reaching the old owner's application (ottla's `RevokeRequested`
//!   event, librdkafka's revoke callback) to its first record at the new owner: the
//!   old owner acknowledges on its next heartbeat and the new owner learns of the
//!   partition on its own next one, so about two heartbeat intervals at most.
//!
//! The mock's group state machine sets most of these figures (librdkafka
//! `rdkafka_mock_cgrp.c`): a group's first rebalance waits
//! `group.initial.rebalance.delay.ms`; every later one holds each JoinGroup for the
//! session timeout less 1 s, whether or not every member has already rejoined. And it
//! holds a Fetch that finds no data for the whole `fetch.max.wait.ms`, new records or
//! not (`rdkafka_mock_handlers.c`), so that setting is the resolution of every gap.
//! On the consumer protocol the mock sets the heartbeat interval and the session
//! timeout itself (here to the same `heartbeat_interval` and `session_timeout`), and
//! gives a partition to its new owner only after the old owner acknowledged its
//! revocation (`rdkafka_mock_cgrp.c`, as a real broker does).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::watch;

use ottla::consumer::GroupProtocol;

use protocol_tests::mock::MockCluster;

/// JoinGroup's API key.
const JOIN_GROUP: i16 = 11;
/// Heartbeat's API key.
const HEARTBEAT: i16 = 12;
/// ConsumerGroupHeartbeat's API key (KIP-848).
const CONSUMER_GROUP_HEARTBEAT: i16 = 68;
/// Records per partition written before a cold start.
const PRE_PRODUCED: u64 = 100;
/// How long to wait for any step of a scenario before giving the run up.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// The broker that coordinates every group at first.
const FIRST_COORDINATOR: i32 = 1;
/// Where the coordinator moves to.
const SECOND_COORDINATOR: i32 = 2;
/// Where the coordinator goes in the KIP-848 scenario, one move after another.
const KIP848_MOVES: [i32; 3] = [2, 3, 1];

/// Every setting of a run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Partitions of the topic.
    pub partitions: i32,
    /// `session.timeout.ms` of every member.
    pub session_timeout: Duration,
    /// `heartbeat.interval.ms` of every member.
    pub heartbeat_interval: Duration,
    /// `max.poll.interval.ms` (the rebalance timeout) of every member.
    pub max_poll_interval: Duration,
    /// Commit interval of every member (automatic commits).
    pub auto_commit: Duration,
    /// The mock's `group.initial.rebalance.delay.ms`.
    pub initial_delay: Duration,
    /// The producer writes one record to every partition this often.
    pub tick: Duration,
    /// Steady state before the coordinator moves or the third member starts.
    pub settle: Duration,
    /// How long after the coordinator move the run goes on.
    pub window: Duration,
    /// How long a scale-out run goes on after the third member's first record.
    pub tail: Duration,
    /// `fetch.max.wait.ms` of every member. The mock holds a Fetch that finds no data
    /// for this long and is not woken by new records, so it bounds how finely a gap
    /// can be seen.
    pub fetch_max_wait: Duration,
    /// ottla's `leader_sync_delay` (the mock's SyncGroup race, `PEERS.md`).
    pub leader_sync_delay: Duration,
    /// KIP-848 scenario: the coordinator moves this long after the second member
    /// starts, and twice more at the same spacing.
    pub move_every: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            partitions: 6,
            session_timeout: Duration::from_secs(4),
            heartbeat_interval: Duration::from_millis(500),
            max_poll_interval: Duration::from_secs(20),
            auto_commit: Duration::from_millis(500),
            initial_delay: Duration::from_millis(300),
            tick: Duration::from_millis(10),
            settle: Duration::from_millis(1500),
            window: Duration::from_secs(3),
            tail: Duration::from_millis(1500),
            fetch_max_wait: Duration::from_millis(20),
            leader_sync_delay: Duration::from_millis(50),
            move_every: Duration::from_millis(400),
        }
    }
}

impl Settings {
    /// The settings, one per line, for the report.
    pub fn describe(&self) -> Vec<String> {
        let ms = |d: Duration| d.as_millis();
        vec![
            format!(
                "mock cluster: librdkafka 2.12.1 mock, 3 brokers, group APIs capped (JoinGroup<=5, SyncGroup<=3, Heartbeat<=3, LeaveGroup<=2), group.initial.rebalance.delay.ms={}; a fresh cluster, topic and group per run",
                ms(self.initial_delay)
            ),
            format!(
                "topic: {} partitions, replication 1; producer (librdkafka, linger.ms=2) writes one 16-byte record to every partition every {} ms; cold start reads {PRE_PRODUCED} pre-produced records per partition",
                self.partitions,
                ms(self.tick)
            ),
            format!(
                "every member: session.timeout.ms={}, heartbeat.interval.ms={}, max.poll.interval.ms={}, auto.offset.reset=earliest, automatic commits every {} ms, fetch.max.wait.ms={} (the mock holds an empty Fetch that long, new records or not)",
                ms(self.session_timeout),
                ms(self.heartbeat_interval),
                ms(self.max_poll_interval),
                ms(self.auto_commit),
                ms(self.fetch_max_wait)
            ),
            format!(
                "ottla: Consumer, recv_batch(1000) loop, leader_sync_delay={} ms; librdkafka: rust-rdkafka BaseConsumer, poll(50 ms) loop, one thread per member, other settings default",
                ms(self.leader_sync_delay)
            ),
            format!(
                "assignor: range for cold start and coordinator move; range or cooperative-sticky for scale-out. Steady state {} ms before each event; coordinator move from broker {FIRST_COORDINATOR} to {SECOND_COORDINATOR}, watched from 1 s before to {} ms after; scale-out runs end {} ms after the third member's first record",
                ms(self.settle),
                ms(self.window),
                ms(self.tail)
            ),
            format!(
                "KIP-848 scale-out: both clients with group.protocol=consumer (librdkafka: session.timeout.ms, heartbeat.interval.ms and partition.assignment.strategy not set, as the broker decides them on this protocol; ottla: GroupProtocol::Consumer); the mock's consumer-group heartbeat interval {} ms and session timeout {} ms; 1 member, then a second; the coordinator moves {FIRST_COORDINATOR}->{}->{}->{} at {} ms, {} ms and {} ms after the second starts; the run ends {} ms after the second member's first record",
                ms(self.heartbeat_interval),
                ms(self.session_timeout),
                KIP848_MOVES[0],
                KIP848_MOVES[1],
                KIP848_MOVES[2],
                ms(self.move_every),
                ms(self.move_every * 2),
                ms(self.move_every * 3),
                ms(self.tail)
            ),
        ]
    }
}

/// A client under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Client {
    /// librdkafka's consumer through rust-rdkafka's `BaseConsumer`: the reference.
    Librdkafka,
    /// ottla's `Consumer`.
    Ottla,
}

impl Client {
    /// Both, in the order they run within a round.
    pub const ALL: [Client; 2] = [Client::Librdkafka, Client::Ottla];

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Client::Librdkafka => "librdkafka",
            Client::Ottla => "ottla",
        }
    }
}

/// One scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// 3 members from nothing to every partition delivering.
    ColdStart,
    /// The coordinator moves under 3 members.
    CoordinatorMove,
    /// A third member joins two, under `range`.
    ScaleOutEager,
    /// A third member joins two, under `cooperative-sticky`.
    ScaleOutCooperative,
    /// KIP-848: a second member joins one while the coordinator moves three times.
    Kip848MovesScaleOut,
}

impl Scenario {
    /// Every scenario, in the order they run within a round.
    pub const ALL: [Scenario; 5] = [
        Scenario::ColdStart,
        Scenario::CoordinatorMove,
        Scenario::ScaleOutEager,
        Scenario::ScaleOutCooperative,
        Scenario::Kip848MovesScaleOut,
    ];

    /// Its name on the command line (`--scenarios cold,move,eager,coop,848`).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::ColdStart => "cold",
            Scenario::CoordinatorMove => "move",
            Scenario::ScaleOutEager => "eager",
            Scenario::ScaleOutCooperative => "coop",
            Scenario::Kip848MovesScaleOut => "848",
        }
    }

    /// The group protocol its members speak.
    pub fn protocol(self) -> GroupProtocol {
        match self {
            Scenario::Kip848MovesScaleOut => GroupProtocol::Consumer,
            _ => GroupProtocol::Classic,
        }
    }
}

/// One figure of one run.
#[derive(Debug, Clone)]
pub struct Sample {
    /// What was measured (a row of the table).
    pub metric: &'static str,
    /// The figure.
    pub value: Duration,
}

/// What one run of one scenario gave.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The figures.
    pub samples: Vec<Sample>,
    /// JoinGroup requests the brokers received during the measured part.
    pub joins: usize,
    /// Anything else worth a line.
    pub note: String,
}

/// The rows of the table, in order, with the scenario each belongs to.
pub const METRICS: [(&str, Scenario); 14] = [
    (
        "cold start: 3 members to all partitions delivering",
        Scenario::ColdStart,
    ),
    (
        "steady state: longest partition gap (before the move)",
        Scenario::CoordinatorMove,
    ),
    (
        "coordinator move: longest partition gap",
        Scenario::CoordinatorMove,
    ),
    (
        "coordinator move: longest gap, all partitions",
        Scenario::CoordinatorMove,
    ),
    (
        "scale-out 2->3 range: staying partitions' longest gap",
        Scenario::ScaleOutEager,
    ),
    (
        "scale-out 2->3 range: staying partitions back, after the join",
        Scenario::ScaleOutEager,
    ),
    (
        "scale-out 2->3 range: moved partitions' longest gap",
        Scenario::ScaleOutEager,
    ),
    (
        "scale-out 2->3 coop-sticky: staying partitions' longest gap",
        Scenario::ScaleOutCooperative,
    ),
    (
        "scale-out 2->3 coop-sticky: moved partitions' longest gap",
        Scenario::ScaleOutCooperative,
    ),
    (
        "KIP-848 1->2, 3 coordinator moves: steady state, longest partition gap (before the start)",
        Scenario::Kip848MovesScaleOut,
    ),
    (
        "KIP-848 1->2, 3 coordinator moves: staying partitions' longest gap",
        Scenario::Kip848MovesScaleOut,
    ),
    (
        "KIP-848 1->2, 3 coordinator moves: moved partitions, revocation to first record at the new owner (longest)",
        Scenario::Kip848MovesScaleOut,
    ),
    (
        "KIP-848 1->2, 3 coordinator moves: second member's first record, from its start",
        Scenario::Kip848MovesScaleOut,
    ),
    (
        "KIP-848 1->2, 3 coordinator moves: moved partitions read by both members at once (longest overlap; mock quirk)",
        Scenario::Kip848MovesScaleOut,
    ),
];

// ---- what the members saw -----------------------------------------------------------

/// One record as it reached a member's loop.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    at: Instant,
    member: usize,
    partition: i32,
    offset: i64,
}

/// Every record every member saw, and the first arrival per partition and per member;
/// every revocation that reached a member's application.
#[derive(Debug, Default)]
struct Log {
    deliveries: Vec<Delivery>,
    first_by_partition: BTreeMap<i32, Instant>,
    first_by_member: BTreeMap<usize, Instant>,
    /// `(when, member, partition)`.
    revocations: Vec<(Instant, usize, i32)>,
}

impl Log {
    fn push(&mut self, d: Delivery) {
        self.first_by_partition.entry(d.partition).or_insert(d.at);
        self.first_by_member.entry(d.member).or_insert(d.at);
        self.deliveries.push(d);
    }
}

type SharedLog = Arc<Mutex<Log>>;

fn lock(log: &SharedLog) -> MutexGuard<'_, Log> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}

/// A partition's progress: each time it delivered an offset above all it had
/// delivered before, and which member delivered it.
type Progress = Vec<(Instant, usize)>;

fn progress(log: &Log, partitions: i32) -> Vec<Progress> {
    let mut sorted = log.deliveries.clone();
    sorted.sort_by_key(|d| d.at);
    let mut highest = vec![-1i64; partitions as usize];
    let mut out = vec![Vec::new(); partitions as usize];
    for d in sorted {
        let Some(p) = usize::try_from(d.partition).ok().filter(|&p| p < out.len()) else {
            continue;
        };
        if d.offset > highest[p] {
            highest[p] = d.offset;
            out[p].push((d.at, d.member));
        }
    }
    out
}

/// The longest time between two points of `points` (sorted) within `[from, to]`,
/// counting from the last point before `from` (or `from` itself if there is none), and
/// from the last point to `to`.
fn longest_gap(points: &[(Instant, usize)], from: Instant, to: Instant) -> Duration {
    longest_gap_from(points, from, to).0
}

/// [`longest_gap`], and when that gap began.
fn longest_gap_from(
    points: &[(Instant, usize)],
    from: Instant,
    to: Instant,
) -> (Duration, Instant) {
    let mut prev = points
        .iter()
        .rev()
        .find(|(t, _)| *t <= from)
        .map_or(from, |(t, _)| *t);
    let mut longest = (Duration::ZERO, prev);
    for (t, _) in points.iter().filter(|(t, _)| *t > from && *t <= to) {
        if t.duration_since(prev) > longest.0 {
            longest = (t.duration_since(prev), prev);
        }
        prev = *t;
    }
    if to.saturating_duration_since(prev) > longest.0 {
        longest = (to.saturating_duration_since(prev), prev);
    }
    longest
}

/// The member that delivered the partition last at or before `at`.
fn owner(points: &[(Instant, usize)], at: Instant) -> Option<usize> {
    points.iter().rev().find(|(t, _)| *t <= at).map(|(_, m)| *m)
}

// ---- members ------------------------------------------------------------------------

/// What every member of a run shares.
#[derive(Clone)]
struct Ctx {
    bootstrap: String,
    group: String,
    topic: String,
    assignor: &'static str,
    protocol: GroupProtocol,
    settings: Settings,
    log: SharedLog,
    stop: watch::Receiver<bool>,
}

enum Member {
    Ottla(tokio::task::JoinHandle<()>),
    Librdkafka(std::thread::JoinHandle<()>),
}

fn start_member(client: Client, ctx: &Ctx, index: usize) -> Member {
    let ctx = ctx.clone();
    match client {
        Client::Ottla => Member::Ottla(tokio::spawn(async move {
            if let Err(e) = ottla_member(&ctx, index).await {
                eprintln!("ottla member {index}: {e:#}");
            }
        })),
        Client::Librdkafka => Member::Librdkafka(std::thread::spawn(move || {
            if let Err(e) = rdkafka_member(&ctx, index) {
                eprintln!("librdkafka member {index}: {e:#}");
            }
        })),
    }
}

async fn ottla_member(ctx: &Ctx, index: usize) -> anyhow::Result<()> {
    use ottla::consumer::{Consumer, OffsetReset};
    let s = &ctx.settings;
    let sync_delay = s.leader_sync_delay;
    // The assignors, session timeout and heartbeat interval are the classic
    // protocol's; the consumer protocol's broker sets them.
    let mut consumer = Consumer::builder(&ctx.bootstrap)
        .group_id(ctx.group.clone())
        .topics([ctx.topic.clone()])
        .group_protocol(ctx.protocol)
        .assignors([ctx.assignor])?
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(s.session_timeout)
        .heartbeat_interval(s.heartbeat_interval)
        .max_poll_interval(s.max_poll_interval)
        .auto_commit(Some(s.auto_commit))
        .fetch_max_wait(s.fetch_max_wait)
        .tweak_group(move |g| g.leader_sync_delay = sync_delay)
        .build()
        .await
        .context("building the consumer")?;
    let mut events = consumer.take_events();
    let mut stop = ctx.stop.clone();
    let mut errors = 0u32;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            Some(event) = events.recv() => {
                use ottla::consumer::ConsumerEvent;
                if let ConsumerEvent::RevokeRequested { partitions, .. } = event {
                    let at = Instant::now();
                    let mut log = lock(&ctx.log);
                    log.revocations.extend(partitions.iter().map(|tp| (at, index, tp.partition)));
                }
            }
            batch = consumer.recv_batch(1000) => {
                let at = Instant::now();
                match batch {
                    Ok(batch) => {
                        let mut log = lock(&ctx.log);
                        for r in &batch {
                            log.push(Delivery { at, member: index, partition: r.partition(), offset: r.offset() });
                        }
                    }
                    Err(ottla::Error::Closed) => bail!("the consumer closed"),
                    Err(e) => {
                        errors += 1;
                        if errors <= 3 {
                            eprintln!("ottla member {index}: {e}");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
    }
    // Dropping leaves the group without waiting: the run is over.
    drop(consumer);
    Ok(())
}

/// librdkafka's rebalance callbacks, noting revocations in the log.
struct RevocationLog {
    log: SharedLog,
    member: usize,
}

impl rdkafka::ClientContext for RevocationLog {}

impl rdkafka::consumer::ConsumerContext for RevocationLog {
    fn pre_rebalance(
        &self,
        _: &rdkafka::consumer::BaseConsumer<Self>,
        rebalance: &rdkafka::consumer::Rebalance<'_>,
    ) {
        if let rdkafka::consumer::Rebalance::Revoke(list) = rebalance {
            let at = Instant::now();
            let mut log = lock(&self.log);
            let partitions = list.elements().into_iter().map(|e| e.partition());
            log.revocations
                .extend(partitions.map(|p| (at, self.member, p)));
        }
    }
}

fn rdkafka_member(ctx: &Ctx, index: usize) -> anyhow::Result<()> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let s = &ctx.settings;
    let ms = |d: Duration| d.as_millis().to_string();
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", &ctx.bootstrap)
        .set("group.id", &ctx.group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", ms(s.auto_commit))
        .set("enable.partition.eof", "false")
        .set("max.poll.interval.ms", ms(s.max_poll_interval))
        .set("fetch.wait.max.ms", ms(s.fetch_max_wait));
    match ctx.protocol {
        // The broker decides these on the consumer protocol (librdkafka 2.16 refuses
        // them there).
        GroupProtocol::Consumer => {
            config.set("group.protocol", "consumer");
        }
        _ => {
            config
                .set("partition.assignment.strategy", ctx.assignor)
                .set("session.timeout.ms", ms(s.session_timeout))
                .set("heartbeat.interval.ms", ms(s.heartbeat_interval));
        }
    }
    let context = RevocationLog {
        log: ctx.log.clone(),
        member: index,
    };
    let consumer: BaseConsumer<RevocationLog> = config
        .create_with_context(context)
        .context("creating the BaseConsumer")?;
    consumer.subscribe(&[&ctx.topic]).context("subscribe")?;
    let mut errors = 0u32;
    while !*ctx.stop.borrow() {
        match consumer.poll(Duration::from_millis(50)) {
            None => {}
            Some(Ok(m)) => lock(&ctx.log).push(Delivery {
                at: Instant::now(),
                member: index,
                partition: m.partition(),
                offset: m.offset(),
            }),
            Some(Err(e)) => {
                errors += 1;
                if errors <= 3 {
                    eprintln!("librdkafka member {index}: {e}");
                }
            }
        }
    }
    Ok(())
}

/// The members of a run and the means to stop them.
struct Group {
    client: Client,
    ctx: Ctx,
    stop: watch::Sender<bool>,
    members: Vec<Member>,
}

impl Group {
    fn new(
        client: Client,
        bootstrap: String,
        group: String,
        topic: &str,
        assignor: &'static str,
        protocol: GroupProtocol,
        s: &Settings,
    ) -> Self {
        let (stop, rx) = watch::channel(false);
        Group {
            client,
            ctx: Ctx {
                bootstrap,
                group,
                topic: topic.to_string(),
                assignor,
                protocol,
                settings: s.clone(),
                log: SharedLog::default(),
                stop: rx,
            },
            stop,
            members: Vec::new(),
        }
    }

    fn start(&mut self) {
        let index = self.members.len();
        self.members
            .push(start_member(self.client, &self.ctx, index));
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        lock(&self.ctx.log)
    }

    /// Waits until `done` holds for the log, at most [`STEP_TIMEOUT`].
    async fn wait_for(&self, what: &str, done: impl Fn(&Log) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if done(&self.log()) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("timed out after {STEP_TIMEOUT:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for m in self.members {
            match m {
                Member::Ottla(h) => {
                    let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
                }
                Member::Librdkafka(h) => {
                    let _ = tokio::task::spawn_blocking(move || h.join()).await;
                }
            }
        }
    }
}

// ---- the producer -------------------------------------------------------------------

fn rd_producer(bootstrap: &str) -> anyhow::Result<rdkafka::producer::BaseProducer> {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "2")
        .set("message.timeout.ms", "30000")
        .create()
        .context("creating the producer")
}

fn send(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    partition: i32,
    i: u64,
) -> anyhow::Result<()> {
    use rdkafka::producer::BaseRecord;
    let value = format!("{i:016}");
    let mut record = BaseRecord::<(), _>::to(topic)
        .partition(partition)
        .payload(&value);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((e, r)) => {
                if !matches!(
                    e,
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull
                    )
                ) {
                    bail!("produce: {e}");
                }
                record = r;
                producer.poll(Duration::from_millis(10));
            }
        }
    }
}

/// Writes `per_partition` records to every partition and waits for them.
fn pre_produce(
    bootstrap: &str,
    topic: &str,
    s: &Settings,
    per_partition: u64,
) -> anyhow::Result<()> {
    use rdkafka::producer::Producer;
    let producer = rd_producer(bootstrap)?;
    for i in 0..per_partition {
        for p in 0..s.partitions {
            send(&producer, topic, p, i)?;
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .context("flushing the pre-produced records")
}

/// A thread writing one record to every partition every `tick`, on a fixed schedule.
struct SteadyProducer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<u64>>,
}

impl SteadyProducer {
    fn start(bootstrap: &str, topic: &str, s: &Settings) -> anyhow::Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let producer = rd_producer(bootstrap)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, topic, partitions, tick) =
            (stop.clone(), topic.to_string(), s.partitions, s.tick);
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now();
            let mut i = 0u64;
            while !flag.load(Ordering::Relaxed) {
                for p in 0..partitions {
                    send(&producer, &topic, p, i)?;
                }
                i += 1;
                next += tick;
                // Serve delivery reports until the next tick.
                loop {
                    let now = Instant::now();
                    if now >= next {
                        break;
                    }
                    producer.poll(next - now);
                }
            }
            Ok(i)
        });
        Ok(SteadyProducer { stop, thread })
    }

    async fn stop(self) -> anyhow::Result<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::task::spawn_blocking(move || self.thread.join())
            .await
            .context("joining the producer")?
            .map_err(|_| anyhow::anyhow!("the producer thread panicked"))?
    }
}

// ---- scenarios ----------------------------------------------------------------------

fn mock(s: &Settings, topic: &str, group: &str) -> anyhow::Result<MockCluster> {
    let m = MockCluster::new(3)?;
    m.cap_group_apis()?;
    m.set_group_initial_rebalance_delay(s.initial_delay);
    // The consumer protocol's broker-side settings, the same as the classic members'.
    m.set_group_consumer_heartbeat_interval(s.heartbeat_interval)?;
    m.set_group_consumer_session_timeout(s.session_timeout)?;
    m.set_group_coordinator(group, FIRST_COORDINATOR)?;
    m.create_topic(topic, s.partitions, 1)?;
    Ok(m)
}

fn count(mock: &MockCluster, api_key: i16, broker: Option<i32>) -> usize {
    mock.requests()
        .iter()
        .filter(|r| r.api_key == api_key && broker.is_none_or(|b| r.broker == b))
        .count()
}

fn all_partitions(s: &Settings) -> impl Fn(&Log) -> bool {
    let n = s.partitions as usize;
    move |log: &Log| log.first_by_partition.len() >= n
}

/// Runs one scenario for one client. `id` makes the topic and group names unique.
pub async fn run(
    scenario: Scenario,
    client: Client,
    s: &Settings,
    id: &str,
) -> anyhow::Result<RunResult> {
    let topic = format!("reb-{}-{}-{id}", scenario.name(), client.name());
    let assignor = match scenario {
        Scenario::ScaleOutCooperative => "cooperative-sticky",
        _ => "range",
    };
    let group_id = format!("g-{topic}");
    let m = mock(s, &topic, &group_id)?;
    let mut group = Group::new(
        client,
        m.bootstrap(),
        group_id,
        &topic,
        assignor,
        scenario.protocol(),
        s,
    );
    let result = match scenario {
        Scenario::ColdStart => cold_start(&m, &mut group, s).await,
        Scenario::CoordinatorMove => coordinator_move(&m, &mut group, s).await,
        Scenario::ScaleOutEager | Scenario::ScaleOutCooperative => {
            scale_out(&m, &mut group, s, scenario).await
        }
        Scenario::Kip848MovesScaleOut => {
            let topic = group.ctx.topic.clone();
            while_producing(&m, &topic, s, kip848_moves(&m, &mut group, s)).await
        }
    };
    group.stop().await;
    drop(m);
    result
}

async fn cold_start(m: &MockCluster, group: &mut Group, s: &Settings) -> anyhow::Result<RunResult> {
    pre_produce(&m.bootstrap(), &group.ctx.topic, s, PRE_PRODUCED)?;
    m.start_request_tracking();
    let t0 = Instant::now();
    for _ in 0..3 {
        group.start();
    }
    group
        .wait_for("every partition to deliver", all_partitions(s))
        .await?;
    let took = group
        .log()
        .first_by_partition
        .values()
        .max()
        .map_or(Duration::ZERO, |t| t.duration_since(t0));
    let joins = count(m, JOIN_GROUP, None);
    m.stop_request_tracking();
    Ok(RunResult {
        samples: vec![Sample {
            metric: METRICS[0].0,
            value: took,
        }],
        joins,
        note: String::new(),
    })
}

async fn coordinator_move(
    m: &MockCluster,
    group: &mut Group,
    s: &Settings,
) -> anyhow::Result<RunResult> {
    let topic = group.ctx.topic.clone();
    while_producing(m, &topic, s, coordinator_move_inner(m, group, s)).await
}

/// Runs `scenario` while a steady producer writes to `topic`, and adds what it wrote
/// to the result's note.
async fn while_producing(
    m: &MockCluster,
    topic: &str,
    s: &Settings,
    scenario: impl std::future::Future<Output = anyhow::Result<RunResult>>,
) -> anyhow::Result<RunResult> {
    let producer = SteadyProducer::start(&m.bootstrap(), topic, s)?;
    let result = scenario.await;
    let written = producer.stop().await;
    let mut result = result?;
    result.note = format!(
        "{}; {} records per partition written",
        result.note, written?
    );
    Ok(result)
}

async fn coordinator_move_inner(
    m: &MockCluster,
    group: &mut Group,
    s: &Settings,
) -> anyhow::Result<RunResult> {
    for _ in 0..3 {
        group.start();
    }
    group
        .wait_for("every partition to deliver", all_partitions(s))
        .await?;
    tokio::time::sleep(s.settle).await;
    m.start_request_tracking();
    let moved = Instant::now();
    m.set_group_coordinator(&group.ctx.group, SECOND_COORDINATOR)?;
    tokio::time::sleep(s.window).await;
    let end = Instant::now();
    let joins = count(m, JOIN_GROUP, None);
    let heartbeats_new = count(m, HEARTBEAT, Some(SECOND_COORDINATOR));
    m.stop_request_tracking();
    let log = group.log();
    let progress = progress(&log, s.partitions);
    drop(log);
    let before_from = moved - s.settle + Duration::from_millis(500);
    let from = moved - Duration::from_secs(1);
    let per_partition = |a: Instant, b: Instant| {
        progress
            .iter()
            .map(|p| longest_gap(p, a, b))
            .max()
            .unwrap_or_default()
    };
    let mut all: Progress = progress.iter().flatten().copied().collect();
    all.sort_by_key(|(t, _)| *t);
    Ok(RunResult {
        samples: vec![
            Sample {
                metric: METRICS[1].0,
                value: per_partition(before_from, moved),
            },
            Sample {
                metric: METRICS[2].0,
                value: per_partition(from, end),
            },
            Sample {
                metric: METRICS[3].0,
                value: longest_gap(&all, from, end),
            },
        ],
        joins,
        note: format!("{heartbeats_new} heartbeats on the new coordinator"),
    })
}

async fn scale_out(
    m: &MockCluster,
    group: &mut Group,
    s: &Settings,
    scenario: Scenario,
) -> anyhow::Result<RunResult> {
    let topic = group.ctx.topic.clone();
    while_producing(m, &topic, s, scale_out_inner(m, group, s, scenario)).await
}

async fn scale_out_inner(
    m: &MockCluster,
    group: &mut Group,
    s: &Settings,
    scenario: Scenario,
) -> anyhow::Result<RunResult> {
    for _ in 0..2 {
        group.start();
    }
    group
        .wait_for("every partition to deliver", all_partitions(s))
        .await?;
    tokio::time::sleep(s.settle).await;
    m.start_request_tracking();
    let joined = Instant::now();
    group.start();
    group
        .wait_for("the third member's first record", |log| {
            log.first_by_member.contains_key(&2)
        })
        .await?;
    let first_of_third = group.log().first_by_member[&2];
    tokio::time::sleep(s.tail).await;
    let end = Instant::now();
    let joins = count(m, JOIN_GROUP, None);
    m.stop_request_tracking();
    let log = group.log();
    let progress = progress(&log, s.partitions);
    drop(log);
    let (mut stayed, mut moved, mut back) = (Vec::new(), Vec::new(), Vec::new());
    let mut owners = Vec::new();
    for (p, points) in progress.iter().enumerate() {
        let (before, after) = (owner(points, joined), owner(points, end));
        let (gap, began) = longest_gap_from(points, joined, end);
        let since_join = if began >= joined {
            format!("+{:.0}", began.duration_since(joined).as_secs_f64() * 1e3)
        } else {
            format!("-{:.0}", joined.duration_since(began).as_secs_f64() * 1e3)
        };
        owners.push(format!(
            "p{p} {}->{} {:.0} ms from {since_join} ms",
            before.map_or("-".into(), |m| m.to_string()),
            after.map_or("-".into(), |m| m.to_string()),
            gap.as_secs_f64() * 1e3
        ));
        if before.is_some() && before == after {
            stayed.push(gap);
            // When the longest gap ended, counted from the join.
            back.push((began + gap).saturating_duration_since(joined));
        } else {
            moved.push(gap);
        }
    }
    let max = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
    let sample = |i: usize, v: &[Duration]| Sample {
        metric: METRICS[i].0,
        value: max(v),
    };
    let samples = if scenario == Scenario::ScaleOutEager {
        vec![sample(4, &stayed), sample(5, &back), sample(6, &moved)]
    } else {
        vec![sample(7, &stayed), sample(8, &moved)]
    };
    Ok(RunResult {
        samples,
        joins,
        note: format!(
            "third member's first record {:.0} ms after its start; {} stayed, {} moved; {}",
            first_of_third.duration_since(joined).as_secs_f64() * 1e3,
            stayed.len(),
            moved.len(),
            owners.join(", ")
        ),
    })
}

/// The KIP-848 scenario: 1 member, then a second while the coordinator moves three
/// times.
async fn kip848_moves(
    m: &MockCluster,
    group: &mut Group,
    s: &Settings,
) -> anyhow::Result<RunResult> {
    group.start();
    group
        .wait_for("every partition to deliver", all_partitions(s))
        .await?;
    tokio::time::sleep(s.settle).await;
    m.start_request_tracking();
    let started = Instant::now();
    group.start();
    for (k, broker) in KIP848_MOVES.into_iter().enumerate() {
        tokio::time::sleep_until((started + s.move_every * (k as u32 + 1)).into()).await;
        m.set_group_coordinator(&group.ctx.group, broker)?;
    }
    group
        .wait_for("the second member's first record", |log| {
            log.first_by_member.contains_key(&1)
        })
        .await?;
    let first_of_second = group.log().first_by_member[&1];
    // The tail counts from the later of the last move and the first record.
    let last_move = started + s.move_every * KIP848_MOVES.len() as u32;
    tokio::time::sleep_until((first_of_second.max(last_move) + s.tail).into()).await;
    let end = Instant::now();
    let requests = m.requests();
    m.stop_request_tracking();
    let joins = requests.iter().filter(|r| r.api_key == JOIN_GROUP).count();
    let heartbeats: Vec<String> = m
        .broker_ids()
        .into_iter()
        .map(|b| {
            let n = requests
                .iter()
                .filter(|r| r.api_key == CONSUMER_GROUP_HEARTBEAT && r.broker == b)
                .count();
            format!("{n} on broker {b}")
        })
        .collect();
    let log = group.log();
    let progress = progress(&log, s.partitions);
    let steady = progress
        .iter()
        .map(|p| longest_gap(p, started - s.settle + Duration::from_millis(500), started))
        .max()
        .unwrap_or_default();
    let (mut stayed, mut handovers, mut owners) = (Vec::new(), Vec::new(), Vec::new());
    // A moved partition whose new owner delivered it before its old owner let it go.
    let mut overlaps = Vec::new();
    for (p, points) in progress.iter().enumerate() {
        let partition = p as i32;
        let (before, after) = (owner(points, started), owner(points, end));
        if before.is_some() && before == after {
            let gap = longest_gap(points, started, end);
            owners.push(format!(
                "p{p} stayed, gap {:.0} ms",
                gap.as_secs_f64() * 1e3
            ));
            stayed.push(gap);
            continue;
        }
        let (Some(old), Some(new)) = (before, after) else {
            owners.push(format!("p{p} never delivered"));
            continue;
        };
        // When the old owner's application saw the revocation, and when the new owner
        // delivered its first record of the partition (a record read again counts).
        let revoked = log
            .revocations
            .iter()
            .find(|(at, member, q)| *at >= started && *member == old && *q == partition)
            .map(|(at, _, _)| *at);
        let first = log
            .deliveries
            .iter()
            .filter(|d| d.at >= started && d.member == new && d.partition == partition)
            .map(|d| d.at)
            .min();
        // The old owner's last record of it: after the new owner's first, both read it.
        let last_old = log
            .deliveries
            .iter()
            .filter(|d| d.member == old && d.partition == partition)
            .map(|d| d.at)
            .max()
            .unwrap_or(started);
        let since = |t: Instant| {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            match t.checked_duration_since(started) {
                Some(d) => format!("+{:.0}", ms(d)),
                None => format!("-{:.0}", ms(started.duration_since(t))),
            }
        };
        match (revoked, first) {
            (Some(revoked), Some(first)) => {
                owners.push(format!(
                    "p{p} {old}->{new}: old owner's last record {} ms, revoked {} ms, new owner's first record {} ms",
                    since(last_old),
                    since(revoked),
                    since(first)
                ));
                // Both owned it for a while: the mock forgets what a member owns when
                // its coordinator connection closes (see benchmarks.md), and gave the
                // partition away before the old owner was told to revoke it.
                if first < revoked.max(last_old) {
                    overlaps.push(revoked.max(last_old).duration_since(first));
                } else {
                    handovers.push(first.duration_since(revoked));
                }
            }
            _ => owners.push(format!("p{p} {old}->{new}: no revocation seen")),
        }
    }
    drop(log);
    let max = |v: &[Duration]| v.iter().max().copied().unwrap_or_default();
    if handovers.is_empty() && overlaps.is_empty() {
        bail!(
            "no partition moved with a revocation: {}",
            owners.join(", ")
        );
    }
    let mut samples = vec![
        Sample {
            metric: METRICS[9].0,
            value: steady,
        },
        Sample {
            metric: METRICS[10].0,
            value: max(&stayed),
        },
        Sample {
            metric: METRICS[12].0,
            value: first_of_second.duration_since(started),
        },
        Sample {
            metric: METRICS[13].0,
            value: max(&overlaps),
        },
    ];
    // Only from partitions handed over cleanly; a run where every one overlapped has
    // no figure.
    if !handovers.is_empty() {
        samples.push(Sample {
            metric: METRICS[11].0,
            value: max(&handovers),
        });
    }
    Ok(RunResult {
        samples,
        joins,
        note: format!(
            "{} stayed, {} moved cleanly, {} read by both at once; ConsumerGroupHeartbeats {}; {}",
            stayed.len(),
            handovers.len(),
            overlaps.len(),
            heartbeats.join(", "),
            owners.join(", ")
        ),
    })
}
