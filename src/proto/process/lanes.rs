//! The processor's rules as a sans-IO machine: one lane per partition, each handling
//! its records one call at a time, in order; retries that wait without holding up the
//! other lanes; dead-letter and retry-topic writes; halts while the dead-letter topic
//! cannot be written; commits of each lane's finished prefix; revocations and loss.
//!
//! [`Lanes`] takes its inputs as calls (records delivered, a handler's outcome, a write
//! acknowledged, a commit answered, partitions revoked or lost, the time) and gives
//! its outputs through [`Lanes::poll_action`]: start a handler, stop one, write a
//! record, commit, pause or resume a partition, hand partitions over. It reads no
//! clock and starts no task: `crate::processor` does both and is only a driver.
//!
//! Invariants, checked after every step by the tests and the `lanes_ops` fuzz target
//! ([`Lanes::check`]):
//! 1. A commit never passes a record that was delivered and has not finished
//!    (succeeded, skipped, or its dead-letter or retry-topic write acknowledged).
//! 2. At most one handler call or write is in flight per partition.
//! 3. Retry state dies with the assignment that made it: a revoked or lost partition
//!    keeps no lane, and an answer for work of an older assignment changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{error, info, warn};

use super::classify::{AsGiven, BatchError, Classifier, Disposition, ErrorClass, ProcessError};
use super::dlq::{DeadLetter, DlqFormat, DlqTimestamp};
use super::retry::RetryPolicy;
pub use super::run::Run;
use super::run::offset_runs;
use super::tracker::OffsetTracker;
use crate::proto::backoff::Backoff;
use crate::proto::fetch::fetcher::ConsumerRecord;
use crate::proto::group::consumer_protocol::TopicPartition;
use crate::proto::produce::record::ProducerRecord;
use crate::proto::trace::TraceContext;

/// The time as the driver read it: the monotonic clock for waits and deadlines, and
/// the wall clock (ms since the epoch) for what records and dead letters carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The monotonic clock.
    pub at: Instant,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: i64,
}

/// How a halted lane tries its dead-letter or retry-topic write again: from 200 ms,
/// doubling to 6.4 s (the producer has already retried that write for its delivery
/// timeout; this is the pace of trying a topic that is missing or refused).
pub const HALT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(200), Duration::from_millis(6400));

/// The target of the lanes' log lines: the processor's, as before the rules moved here,
/// so `RUST_LOG=ottla::processor=...` filters them as it always did.
const LOG_TARGET: &str = "ottla::processor";

/// Names the dead-letter topic of an original topic.
pub type DlqName = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// What the lanes need to know (set by `ProcessorBuilder`).
#[derive(Clone)]
pub struct LanesConfig {
    /// The consumer group (logged, and written into dead letters).
    pub group: String,
    /// How failed attempts are retried.
    pub policy: RetryPolicy,
    /// Applied to every handler error.
    pub classifier: Arc<dyn Classifier>,
    /// The dead-letter header format.
    pub dlq_format: DlqFormat,
    /// The timestamp dead letters carry.
    pub dlq_timestamp: DlqTimestamp,
    /// The dead-letter topic's suffix, unless `dlq_name` names it.
    pub dlq_suffix: String,
    /// Names the dead-letter topic.
    pub dlq_name: Option<DlqName>,
    /// The retry topics' delays, in hop order.
    pub retry_delays: Vec<Duration>,
    /// Lanes running at once.
    pub concurrency: usize,
    /// Records queued per lane before its partition is paused.
    pub lane_buffer: usize,
    /// Records per handler call.
    pub max_batch: usize,
    /// Commit on this interval, or after every step (`None`).
    pub commit_interval: Option<Duration>,
    /// The seed of the retry delays' jitter.
    pub jitter_seed: u64,
    /// Whether metrics are kept for [`Lanes::poll_metric`] (nobody reads them
    /// otherwise, so they are not queued).
    pub metrics: bool,
    /// With `metrics`: whether [`Metric::Processed`], one per finished record, is
    /// queued too. The `metrics` feature alone counts finished records from
    /// [`Lanes::stats`] instead, which costs nothing per record.
    pub processed_metrics: bool,
}

impl Default for LanesConfig {
    fn default() -> Self {
        Self {
            group: String::new(),
            policy: RetryPolicy::default(),
            classifier: Arc::new(AsGiven),
            dlq_format: DlqFormat::Apache,
            dlq_timestamp: DlqTimestamp::default(),
            dlq_suffix: ".dlq".into(),
            dlq_name: None,
            retry_delays: Vec::new(),
            concurrency: 16,
            lane_buffer: 1000,
            max_batch: 1,
            commit_interval: Some(Duration::from_secs(1)),
            jitter_seed: 1,
            metrics: false,
            processed_metrics: true,
        }
    }
}

impl std::fmt::Debug for LanesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanesConfig")
            .field("group", &self.group)
            .field("policy", &self.policy)
            .field("concurrency", &self.concurrency)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl LanesConfig {
    /// The dead-letter topic of `topic`.
    pub fn dlq_of(&self, topic: &str) -> String {
        match &self.dlq_name {
            Some(f) => f(topic),
            None => format!("{topic}{}", self.dlq_suffix),
        }
    }
}

/// Names one handler call or one write, so its answer finds its lane (and an answer
/// for a lane revoked, lost or handed over meanwhile finds none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(u64);

/// What one handler call reports about the records it was given.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `Ok`: every record not left (see `stopped_after`) was handled; `Err` as from a
    /// batch handler.
    pub result: Result<(), BatchError>,
    /// The call stopped early, without an error, after this many records (cancelled,
    /// or its time slice ran out): the others come again.
    pub stopped_after: Option<usize>,
    /// The failure is a panic of the handler.
    pub panicked: bool,
    /// How long each record's call took, for the records handled and the failing one;
    /// empty: the whole call's time for each.
    pub durations: Vec<Duration>,
    /// The trace context of the failing record's attempt (its span's, or the record's
    /// own): written into its retry-topic hop or dead letter, so that the trace goes on
    /// from that attempt.
    pub trace: Option<TraceContext>,
}

impl Outcome {
    /// The outcome `result`, nothing else to say.
    pub fn of(result: Result<(), BatchError>) -> Self {
        Self {
            result,
            stopped_after: None,
            panicked: false,
            durations: Vec::new(),
            trace: None,
        }
    }

    /// The handler panicked (on record `index`, if known).
    pub fn panic(message: String, index: Option<usize>) -> Self {
        let error = ProcessError::permanent("Panic", message);
        Self {
            result: Err(BatchError { index, error }),
            stopped_after: None,
            panicked: true,
            durations: Vec::new(),
            trace: None,
        }
    }
}

/// Why partitions are handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The group revoked them in this generation.
    Revoked {
        /// The generation the revocation was asked in.
        generation: i32,
    },
    /// The processor shuts down.
    Shutdown,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Call the handler on these records (one partition's, in offset order); answer
    /// with [`Lanes::handled`], [`Lanes::progress`] on the way, or [`Lanes::crashed`].
    Dispatch {
        /// The call's ticket.
        ticket: Ticket,
        /// The records' partition.
        partition: TopicPartition,
        /// The records, shared with the lane (which keeps them for what the call does
        /// not finish): lend them, do not copy them.
        records: Run,
        /// The attempt the first record is on (1 for the first); the others are on
        /// their first.
        attempt: u32,
    },
    /// Tell the handler call under this ticket to stop (its partition is going).
    Cancel(Ticket),
    /// Ask the call under this ticket to stop between records, without telling the
    /// handler (its partition was paused): the records it does not reach come again.
    Yield(Ticket),
    /// Write this record (to a dead-letter or retry topic) and answer with
    /// [`Lanes::produced`] once it is acknowledged or has failed.
    Produce {
        /// The write's ticket.
        ticket: Ticket,
        /// The partition whose record this is.
        partition: TopicPartition,
        /// The record.
        record: ProducerRecord,
    },
    /// Commit these offsets and answer with [`Lanes::committed`].
    Commit(Vec<(TopicPartition, i64)>),
    /// Stop fetching this partition (its lane is full, waiting or halted).
    Pause(TopicPartition),
    /// Fetch this partition again.
    Resume(TopicPartition),
    /// The work on `partitions` stopped (finished, or cancelled past the deadline)
    /// and their lanes are gone: commit `offsets` (answer with [`Lanes::committed`]),
    /// then hand the partitions over.
    Release {
        /// Why.
        handover: Handover,
        /// The partitions.
        partitions: Vec<TopicPartition>,
        /// Their finished prefixes not yet committed.
        offsets: Vec<(TopicPartition, i64)>,
    },
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records handled successfully (on any attempt).
    pub succeeded: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Records written to the dead-letter topic.
    pub dead_lettered: u64,
    /// Dead-letter writes that failed (and were retried).
    pub dlq_failures: u64,
    /// Handler panics (treated as permanent errors).
    pub panics: u64,
    /// Records sent on to a retry topic.
    pub forwarded: u64,
    /// Successful commits.
    pub commits: u64,
    /// Records a handler stopped on cancellation (`ProcessError::cancelled`), left
    /// for the partition's next owner.
    pub cancelled: u64,
    /// Records skipped (`ProcessError::skip`): committed without being processed.
    pub skipped: u64,
}

/// One metric observation, for `ProcessorBuilder::metrics`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Metric {
    /// A record finished (`success` false: dead-lettered).
    Processed {
        /// Whether the handler succeeded.
        success: bool,
        /// How long the last attempt took (for a batch, the whole call).
        duration: Duration,
    },
    /// A retry was scheduled.
    Retry {
        /// 1 for the first retry.
        attempt: u32,
        /// The delay.
        delay: Duration,
    },
    /// A record was skipped (`ProcessError::skip`): committed, not processed.
    Skipped {
        /// The error type the handler gave.
        error_type: String,
    },
    /// A handler failed.
    Error {
        /// The error type.
        error_type: String,
        /// Its class.
        class: ErrorClass,
    },
    /// A record went to the dead-letter topic (the write was acknowledged).
    DeadLettered {
        /// The record's partition.
        partition: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// The error type.
        error_type: String,
        /// Its class.
        class: ErrorClass,
    },
    /// A record was sent on to a retry topic.
    RetryTopic {
        /// The record's partition.
        partition: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// The retry topic's hop (1 for the first).
        hop: u32,
    },
    /// A partition's finished prefix was committed.
    Committed {
        /// The partition.
        partition: TopicPartition,
        /// The offset committed (the next record to handle).
        offset: i64,
    },
    /// The number of partitions halted because the dead-letter topic cannot be
    /// written changed (reported on each change, down to 0).
    Halted {
        /// How many.
        partitions: usize,
    },
    /// This member joined a generation of the group (SyncGroup answered). Reported
    /// before any record of that generation's new partitions is handled.
    Joined {
        /// The generation.
        generation: i32,
        /// This member's id in it.
        member_id: String,
        /// Whether this member computed the assignment.
        leader: bool,
    },
    /// Partitions were added to this member in a generation.
    Assigned {
        /// The generation.
        generation: i32,
        /// The partitions added.
        partitions: Vec<TopicPartition>,
    },
    /// Partitions were given back in a rebalance, after their work stopped (finished,
    /// or cancelled past the acquiescence budget) and their finished offsets were
    /// committed; reported just before the revocation is acknowledged.
    Revoked {
        /// The generation the revocation was asked in: under an eager protocol the one
        /// ending, under a cooperative one the new one, which no longer gives them to
        /// this member.
        generation: i32,
        /// The partitions.
        partitions: Vec<TopicPartition>,
    },
    /// Partitions were taken away without a chance to commit (session lost, fenced):
    /// their in-flight results were dropped.
    Lost {
        /// The partitions.
        partitions: Vec<TopicPartition>,
    },
    /// The group member was refused something it keeps asking for (a missing topic or
    /// group ACL): the Processor goes on, and so does the member, which recovers by
    /// itself once the ACL is granted. Reported at each refusal.
    GroupRetrying {
        /// What the broker refused, naming the setting or ACL to change.
        error: crate::proto::group::member::GroupError,
    },
}

/// `<topic>.retry.<delay>`, the delay as `500ms`, `30s`, `5m` or `1h`.
pub fn retry_topic(topic: &str, delay: Duration) -> String {
    let ms = delay.as_millis();
    let label = if ms % 3_600_000 == 0 && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms % 60_000 == 0 && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 && ms > 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    };
    format!("{topic}.retry.{label}")
}

/// Header of the retry-topic hop a record is on (1 for the first retry topic).
pub const RETRY_HOP: &str = "ottla.retry.hop";
const RETRY_TOPIC: &str = "ottla.retry.topic";
const RETRY_PARTITION: &str = "ottla.retry.partition";
const RETRY_OFFSET: &str = "ottla.retry.offset";

#[inline]
fn header_str(r: &ConsumerRecord, name: &str) -> Option<String> {
    r.header(name)
        .and_then(|h| h.value())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The retry hop of a record (0: not from a retry topic).
#[inline]
fn hop_of(r: &ConsumerRecord) -> u32 {
    header_str(r, RETRY_HOP)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Where a record first came from: its retry headers, or its own coordinates.
fn origin_of(r: &ConsumerRecord) -> (String, i32, i64) {
    match (
        header_str(r, RETRY_TOPIC),
        header_str(r, RETRY_PARTITION).and_then(|v| v.parse().ok()),
        header_str(r, RETRY_OFFSET).and_then(|v| v.parse().ok()),
    ) {
        (Some(t), Some(p), Some(o)) => (t, p, o),
        _ => (r.topic().to_string(), r.partition(), r.offset()),
    }
}

/// A consumed record's headers, those `keep` keeps, as a produced record's (the
/// values are shared, not copied).
pub(crate) fn producer_headers(
    headers: &[(Bytes, Option<Bytes>)],
    keep: impl Fn(&[u8]) -> bool,
) -> Vec<(String, Option<Bytes>)> {
    headers
        .iter()
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
        .collect()
}

/// The dead-letter record of `record` for `topic`: its key and headers, its value (or
/// the JSON envelope holding it), the diagnostic headers of `format`, and the
/// timestamp `stamp` chooses.
pub fn dead_letter_record(
    topic: String,
    record: &ConsumerRecord,
    letter: &DeadLetter<'_>,
    format: DlqFormat,
    stamp: DlqTimestamp,
) -> ProducerRecord {
    let mut out = ProducerRecord::new(topic);
    out.key = record.key_bytes();
    out.timestamp = Some(match stamp {
        DlqTimestamp::DeadLettered => letter.dead_lettered_ms,
        DlqTimestamp::Original => record.timestamp(),
    });
    let headers = record.headers_owned();
    out.headers = producer_headers(&headers, |_| true);
    out.value = if format == DlqFormat::JsonEnvelope {
        let (key, value) = (record.key(), record.value());
        Some(Bytes::from(letter.envelope(key, value, &headers)))
    } else {
        record.value_bytes()
    };
    out.headers.extend(letter.headers(format));
    out
}

/// The state of one record between attempts.
#[derive(Debug, Clone)]
struct Attempt {
    record: ConsumerRecord,
    /// Attempts made so far.
    attempts: u32,
    first_failure_ms: Option<i64>,
    last_error: Option<ProcessError>,
    /// How long the last attempt took.
    took: Duration,
    /// The trace context of the last attempt, for the record's hop or dead letter.
    trace: Option<TraceContext>,
}

impl Attempt {
    fn first(record: ConsumerRecord) -> Self {
        Self {
            record,
            attempts: 0,
            first_failure_ms: None,
            last_error: None,
            took: Duration::ZERO,
            trace: None,
        }
    }
}

/// Where a failed record goes: a retry topic's hop, or the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Destination {
    Hop(u32),
    DeadLetters,
}

/// What one lane is doing.
#[derive(Debug, Default)]
enum Work {
    /// Nothing: the next records start when a slot is free.
    #[default]
    Idle,
    /// A handler call runs on `run`; the first `reported` of its records finished
    /// already ([`Lanes::progress`]). `retry`: the first record is on a retry, and
    /// this is its state (the others are on their first attempt).
    Running {
        ticket: Ticket,
        run: Run,
        retry: Option<Box<Attempt>>,
        reported: usize,
        cancelled: bool,
    },
    /// A record waits for its retry (or a retry-topic record for its time).
    Waiting { attempt: Attempt, until: Instant },
    /// A record is being written to `to`.
    Forwarding {
        ticket: Ticket,
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        failures: u32,
    },
    /// The write of a record failed `failures` times; it is tried again at `retry_at`,
    /// and nothing after it is handled or committed meanwhile.
    Halted {
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        retry_at: Instant,
        failures: u32,
    },
}

impl Work {
    fn ticket(&self) -> Option<Ticket> {
        match self {
            Work::Running { ticket, .. } | Work::Forwarding { ticket, .. } => Some(*ticket),
            _ => None,
        }
    }
}

/// A handler call that ended, as its lane held it.
struct Ran {
    run: Run,
    retry: Option<Box<Attempt>>,
    reported: usize,
    cancelled: bool,
}

#[derive(Debug, Default)]
struct Lane {
    /// The records delivered and not yet handed to a call, in runs as they came.
    queue: VecDeque<Run>,
    /// How many records `queue` holds.
    queued: usize,
    tracker: OffsetTracker,
    work: Work,
    paused: bool,
    /// Records up to this offset are handled one at a time: their batch failed
    /// without naming a record.
    solo_through: Option<i64>,
    /// Being handed over: nothing new starts, failures are not retried.
    releasing: bool,
}

#[derive(Debug)]
struct Releasing {
    handover: Handover,
    partitions: Vec<TopicPartition>,
    deadline: Instant,
}

/// The lanes of one processor run. See the module docs.
#[derive(Debug)]
pub struct Lanes {
    config: LanesConfig,
    lanes: BTreeMap<TopicPartition, Lane>,
    /// The lane of each ticket in flight.
    tickets: HashMap<Ticket, TopicPartition>,
    next_ticket: u64,
    /// xorshift state (never zero).
    jitter: u64,
    /// The pace of a halted lane's write: [`HALT_BACKOFF`], jittered.
    halt_backoff: Backoff,
    next_commit: Option<Instant>,
    commit_in_flight: bool,
    releases: Vec<Releasing>,
    halted: usize,
    /// Partitions the application paused ([`Lanes::pause`]); `held_all`: every one.
    held: BTreeSet<TopicPartition>,
    held_all: bool,
    actions: VecDeque<Action>,
    metrics: VecDeque<Metric>,
    stats: Stats,
}

impl Lanes {
    /// Lanes for one run, starting at `now`.
    pub fn new(config: LanesConfig, now: Now) -> Self {
        Self {
            next_commit: config.commit_interval.map(|i| now.at + i),
            jitter: config.jitter_seed.max(1),
            halt_backoff: Backoff::new(HALT_BACKOFF.0, HALT_BACKOFF.1, config.jitter_seed),
            config,
            lanes: BTreeMap::new(),
            tickets: HashMap::new(),
            next_ticket: 0,
            commit_in_flight: false,
            releases: Vec::new(),
            halted: 0,
            held: BTreeSet::new(),
            held_all: false,
            actions: VecDeque::new(),
            metrics: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next metric observation (only with [`LanesConfig::metrics`]).
    pub fn poll_metric(&mut self) -> Option<Metric> {
        self.metrics.pop_front()
    }

    /// When [`Lanes::handle_timeout`] is next due: a retry's wait, a halted write's
    /// next try, the commit interval, a handover's deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let saturated = self.saturated();
        let lanes = self.lanes.iter().filter_map(|(tp, l)| match &l.work {
            // A retry whose time has come waits for a free slot, which only a
            // handler's answer frees, or for the application's resume: no timer.
            Work::Waiting { until, .. } if !saturated && !self.is_held(tp) => Some(*until),
            Work::Halted { retry_at, .. } => Some(*retry_at),
            _ => None,
        });
        let commit = self.next_commit.filter(|_| !self.commit_in_flight);
        lanes
            .chain(commit)
            .chain(self.releases.iter().map(|r| r.deadline))
            .min()
    }

    /// The counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Records fetched and waiting in the lanes for their handler call (not counting
    /// those in a call, or waiting for a retry).
    pub fn queued(&self) -> usize {
        self.lanes.values().map(|l| l.queued).sum()
    }

    /// The partitions that have a lane.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        self.lanes.keys().cloned().collect()
    }

    /// Whether more records are welcome (fewer than four lane buffers are queued).
    pub fn wants_records(&self) -> bool {
        self.queued() < self.config.lane_buffer.saturating_mul(4)
    }

    /// The application pauses `partitions` (`None`: every partition, those assigned
    /// later included), for a circuit breaker: no handler call starts on them, a due
    /// retry waits too, and they are not fetched, until [`Lanes::resume`]. Calls
    /// running finish; dead-letter writes go on.
    pub fn pause(&mut self, partitions: Option<&[TopicPartition]>, now: Now) {
        match partitions {
            Some(ps) => {
                for tp in ps {
                    // A partition without a lane is paused here; a lane's pause
                    // follows from its state (`update_pauses`).
                    if !self.lanes.contains_key(tp) && self.held.insert(tp.clone()) {
                        self.actions.push_back(Action::Pause(tp.clone()));
                    }
                    self.held.insert(tp.clone());
                }
            }
            None => self.held_all = true,
        }
        // Calls running on many records stop after the one in hand.
        for (tp, lane) in &self.lanes {
            if let Work::Running { ticket, .. } = lane.work {
                if self.held_all || self.held.contains(tp) {
                    self.actions.push_back(Action::Yield(ticket));
                }
            }
        }
        self.step(now);
    }

    /// Lifts [`Lanes::pause`] of `partitions` (`None`: every pause, the one of every
    /// partition and each partition's own).
    pub fn resume(&mut self, partitions: Option<&[TopicPartition]>, now: Now) {
        let lifted: Vec<TopicPartition> = match partitions {
            Some(ps) => ps
                .iter()
                .filter(|tp| self.held.remove(*tp))
                .cloned()
                .collect(),
            None => {
                self.held_all = false;
                std::mem::take(&mut self.held).into_iter().collect()
            }
        };
        for tp in lifted {
            if !self.lanes.contains_key(&tp) {
                self.actions.push_back(Action::Resume(tp));
            }
        }
        self.step(now);
    }

    /// Whether the application holds any partition paused.
    pub fn holding(&self) -> bool {
        self.held_all || !self.held.is_empty()
    }

    fn is_held(&self, tp: &TopicPartition) -> bool {
        self.held_all || self.held.contains(tp)
    }

    /// Whether a handover is under way.
    pub fn releasing(&self) -> bool {
        !self.releases.is_empty()
    }

    /// Whether [`Metric::Processed`] is read (see [`LanesConfig::processed_metrics`]).
    fn wants_processed(&self) -> bool {
        self.config.metrics && self.config.processed_metrics
    }

    /// [`Metric::Processed`], built only when someone reads it.
    fn processed(&mut self, success: bool, duration: Duration) {
        if self.wants_processed() {
            self.metrics
                .push_back(Metric::Processed { success, duration });
        }
    }

    /// Any other metric: every `Processed` goes through [`Lanes::processed`].
    fn metric(&mut self, m: Metric) {
        if self.config.metrics {
            self.metrics.push_back(m);
        }
    }

    fn ticket(&mut self, tp: &TopicPartition) -> Ticket {
        self.next_ticket += 1;
        let t = Ticket(self.next_ticket);
        self.tickets.insert(t, tp.clone());
        t
    }

    fn next_jitter(&mut self) -> f64 {
        let s = &mut self.jitter;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }

    fn running(&self) -> usize {
        self.lanes
            .values()
            .filter(|l| matches!(l.work, Work::Running { .. }))
            .count()
    }

    fn saturated(&self) -> bool {
        self.running() >= self.config.concurrency
    }

    fn remove_lane(&mut self, tp: &TopicPartition) -> Option<Lane> {
        let lane = self.lanes.remove(tp)?;
        if let Some(t) = lane.work.ticket() {
            self.tickets.remove(&t);
        }
        Some(lane)
    }

    /// Records fetched, in offset order per partition.
    pub fn deliver(&mut self, mut records: Vec<ConsumerRecord>, now: Now) {
        // Records come in runs of one partition, usually one run a delivery: each run
        // goes to its lane whole, with one lookup, without a copy when it is the only one.
        let mut starts = Vec::new();
        let mut at = 0;
        while let Some(first) = records.get(at) {
            starts.push(at);
            let (topic, partition) = (first.topic_arc(), first.partition());
            at += records
                .get(at..)
                .unwrap_or_default()
                .iter()
                .take_while(|r| r.is_in(topic, partition))
                .count();
        }
        // The later runs are split off; the first keeps the delivery's vector.
        let mut runs = Vec::with_capacity(starts.len());
        for &start in starts.iter().skip(1).rev() {
            runs.push(records.split_off(start));
        }
        runs.push(records);
        for run in runs.into_iter().rev() {
            self.deliver_run(run);
        }
        self.step(now);
    }

    /// Records of one partition, in offset order, to its lane.
    fn deliver_run(&mut self, records: Vec<ConsumerRecord>) {
        let Some(first) = records.first() else {
            return;
        };
        // A new lane owns nothing before its first record: committing from there.
        let start = first.offset();
        let lane = self
            .lanes
            .entry(first.topic_partition())
            .or_insert_with(|| Lane {
                tracker: OffsetTracker::starting_at(start),
                ..Lane::default()
            });
        if lane.releasing {
            // Fetched before the pause took hold: the next owner reads them.
            return;
        }
        for run in offset_runs(&records) {
            lane.tracker.deliver_run(run);
        }
        lane.queued += records.len();
        // Onto the last run while it is short of half a batch and no call has had any
        // of it yet: a call then takes what came in small deliveries (many partitions)
        // at once, without a copy. A longer run is left as it is, so records are
        // copied only while runs are short.
        let want = self.config.max_batch.max(1);
        let records = match lane.queue.back_mut() {
            Some(last) if last.len() * 2 < want => match last.append(records, want) {
                Ok(()) => return,
                Err(records) => records,
            },
            _ => records,
        };
        lane.queue.push_back(Run::new(records));
    }

    /// The call under `ticket` finished the first `done` records of its batch (it
    /// goes on with the rest): they become committable now, not when the call ends.
    pub fn progress(&mut self, ticket: Ticket, done: usize, now: Now) {
        let Some(lane) = self.lane_of(ticket) else {
            return;
        };
        let Work::Running { run, reported, .. } = &mut lane.work else {
            return;
        };
        let done = done.min(run.len());
        if done <= *reported {
            return;
        }
        finish(
            &mut lane.tracker,
            run.get(*reported..done).unwrap_or_default(),
        );
        let newly = (done - *reported) as u64;
        *reported = done;
        self.stats.succeeded += newly;
        self.step(now);
    }

    /// The work `ticket` names, taken out of its lane (which is `Idle` then), and the
    /// ticket retired; `None` when the lane no longer holds that work (it was revoked,
    /// lost or handed over). A ticket names one kind of work: a handler call's is only
    /// answered by [`Lanes::handled`], a write's by [`Lanes::produced`].
    fn take_work(&mut self, ticket: Ticket) -> Option<(TopicPartition, Work)> {
        let tp = self.tickets.remove(&ticket)?;
        let lane = self.lanes.get_mut(&tp)?;
        (lane.work.ticket() == Some(ticket)).then(|| (tp, std::mem::take(&mut lane.work)))
    }

    fn lane_of(&mut self, ticket: Ticket) -> Option<&mut Lane> {
        let tp = self.tickets.get(&ticket)?;
        self.lanes
            .get_mut(tp)
            .filter(|l| l.work.ticket() == Some(ticket))
    }

    /// The handler call under `ticket` ended its task without an outcome (its task
    /// panicked outside the handler, or was cancelled): a failed attempt of its
    /// records, as a panic is. A write's task that ended so is a failed write.
    pub fn crashed(&mut self, ticket: Ticket, message: String, now: Now) {
        let running = self
            .lane_of(ticket)
            .is_some_and(|l| matches!(l.work, Work::Running { .. }));
        if running {
            self.handled(ticket, Outcome::panic(message, None), Duration::ZERO, now);
        } else {
            self.produced(ticket, Err(message), now);
        }
    }

    /// The handler call under `ticket` returned `outcome` after `took`.
    pub fn handled(&mut self, ticket: Ticket, outcome: Outcome, took: Duration, now: Now) {
        // `None`: revoked, lost or handed over meanwhile.
        let Some((
            tp,
            Work::Running {
                run,
                retry,
                reported,
                cancelled,
                ..
            },
        )) = self.take_work(ticket)
        else {
            return;
        };
        let call = Ran {
            run,
            retry,
            reported,
            cancelled,
        };
        self.on_handled(&tp, call, outcome, took, now);
        self.step(now);
    }

    fn on_handled(
        &mut self,
        tp: &TopicPartition,
        call: Ran,
        outcome: Outcome,
        took: Duration,
        now: Now,
    ) {
        let Ran {
            run,
            retry,
            reported,
            cancelled,
        } = call;
        let Outcome {
            result,
            stopped_after,
            panicked,
            durations,
            trace,
        } = outcome;
        self.stats.panics += u64::from(panicked);
        let took_of = |i: usize| durations.get(i).copied().unwrap_or(took);
        // The records reported finished on the way: their metrics now, with their
        // durations.
        let reported = reported.min(run.len());
        for i in 0..reported {
            self.processed(true, took_of(i));
        }
        // The records past those reported finished on the way.
        let n = run.len() - reported;
        let (handled, error) = match result {
            Ok(()) => (
                stopped_after
                    .map_or(n, |s| s.saturating_sub(reported))
                    .min(n),
                None,
            ),
            Err(BatchError {
                index: Some(i),
                error,
            }) if i >= reported && i - reported < n => (i - reported, Some(error)),
            Err(BatchError { error, .. }) if n == 1 => (0, Some(error)),
            Err(BatchError { .. }) if n == 0 => (0, None),
            Err(BatchError { error, .. }) => {
                self.replay_solo(tp, run.tail(reported), &error);
                return;
            }
        };
        // Stopped on cancellation: the record is neither done nor failed, and comes
        // again (for the next owner, as the lane is being given up).
        let error = match error {
            Some(e) if e.disposition == Disposition::Cancelled && cancelled => {
                self.stats.cancelled += 1;
                None
            }
            Some(e) if e.disposition == Disposition::Cancelled => Some(ProcessError::transient(
                "Cancelled",
                "the handler reported a cancellation nobody asked for",
            )),
            e => e,
        };
        let Some(lane) = self.lanes.get_mut(tp) else {
            return;
        };
        // Skipped: done, as far as commits go; counted apart.
        let (error, finished) = match error {
            Some(e) if e.disposition == Disposition::Skipped => {
                if let Some(r) = run.get(reported + handled) {
                    info!(
                        target: LOG_TARGET,
                        consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
                        offset = r.offset(), error_type = %e.kind, error = %e.message,
                        "record skipped"
                    );
                }
                (None, Some(e.kind))
            }
            e => (e, None),
        };
        let skipped = finished.is_some() && handled < n;
        let done = handled + usize::from(skipped);
        finish(
            &mut lane.tracker,
            run.get(reported..reported + done).unwrap_or_default(),
        );
        let processed = handled.min(done);
        if skipped {
            self.stats.skipped += 1;
            if let Some(kind) = finished {
                self.metric(Metric::Skipped { error_type: kind });
            }
        }
        self.stats.succeeded += processed as u64;
        if self.wants_processed() {
            for i in 0..processed {
                self.processed(true, took_of(reported + i));
            }
        }
        let Some(lane) = self.lanes.get_mut(tp) else {
            return;
        };
        let failing = match error {
            Some(e) if done < n => Some((reported + done, e)),
            _ => None,
        };
        // The records not reached (after the failing one) come again, after it.
        let rest = reported + done + usize::from(failing.is_some());
        requeue(lane, run.tail(rest));
        if let Some((i, error)) = failing {
            // The first record of a call may be on a retry: it goes on counting.
            let mut attempt = match (i, retry) {
                (0, Some(retry)) => *retry,
                _ => match run.get(i) {
                    Some(r) => Attempt::first(r.clone()),
                    None => return,
                },
            };
            attempt.attempts += 1;
            attempt.took = took_of(reported + handled);
            attempt.trace = trace;
            self.on_failure(tp, attempt, error, now);
        }
    }

    /// A batch failed without naming a record: it goes again one record at a time.
    fn replay_solo(&mut self, tp: &TopicPartition, records: Run, error: &ProcessError) {
        let class = self
            .config
            .classifier
            .classify(error)
            .unwrap_or(ErrorClass::Transient);
        self.metric(Metric::Error {
            error_type: error.kind.clone(),
            class,
        });
        let Some(lane) = self.lanes.get_mut(tp) else {
            return;
        };
        let (first, last) = (
            records.first().map(ConsumerRecord::offset),
            records.last().map(ConsumerRecord::offset),
        );
        warn!(
            target: LOG_TARGET,
            consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
            first_offset = first, last_offset = last, error_type = %error.kind,
            error = %error.message, "batch failed without naming a record; replaying it one record at a time"
        );
        lane.solo_through = last;
        requeue(lane, records);
    }

    /// A record's attempt failed: retry it, send it on to a retry topic, or
    /// dead-letter it, by its class and the policy.
    fn on_failure(
        &mut self,
        tp: &TopicPartition,
        mut attempt: Attempt,
        error: ProcessError,
        now: Now,
    ) {
        let offset = attempt.record.offset();
        let class = self.config.classifier.classify(&error);
        let shown = class.unwrap_or(ErrorClass::Transient);
        self.metric(Metric::Error {
            error_type: error.kind.clone(),
            class: shown,
        });
        attempt.first_failure_ms.get_or_insert(now.unix_ms);
        attempt.last_error = Some(error.clone());
        let retry = attempt.attempts.saturating_sub(1);
        let releasing = self.lanes.get(tp).is_some_and(|l| l.releasing);
        let backoff = self.config.policy.backoff_for_error(&error, class).cloned();
        match backoff {
            Some(b) if retry < b.max_retries => {
                if releasing {
                    // The partition is going: its next owner tries the record again.
                    return;
                }
                let delay = b.delay(retry, self.next_jitter());
                warn!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition, offset,
                    retry_count = retry + 1, error_type = %error.kind, error_classification = shown.label(),
                    backoff_delay_ms = delay.as_millis() as u64, error = %error.message,
                    "handler failed; retrying"
                );
                self.stats.retries += 1;
                self.metric(Metric::Retry {
                    attempt: retry + 1,
                    delay,
                });
                if let Some(lane) = self.lanes.get_mut(tp) {
                    lane.work = Work::Waiting {
                        attempt,
                        until: now.at + delay,
                    };
                }
            }
            Some(_) => {
                error!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition, offset,
                    retry_count = retry, error_type = %error.kind, error_classification = shown.label(),
                    "retries exhausted; forwarding"
                );
                let hop = hop_of(&attempt.record);
                let to = if (hop as usize) < self.config.retry_delays.len() {
                    Destination::Hop(hop + 1)
                } else {
                    Destination::DeadLetters
                };
                self.forward(tp, attempt, ErrorClass::Transient, to, 0, now);
            }
            None => {
                warn!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition, offset,
                    error_type = %error.kind, error_classification = "non-retryable", error = %error.message,
                    "permanent error; dead-lettering at once"
                );
                self.forward(
                    tp,
                    attempt,
                    ErrorClass::Permanent,
                    Destination::DeadLetters,
                    0,
                    now,
                );
            }
        }
    }

    /// Writes a record on: to a retry topic's hop, or to the dead-letter topic.
    fn forward(
        &mut self,
        tp: &TopicPartition,
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        failures: u32,
        now: Now,
    ) {
        let record = self.outgoing(&attempt, class, to, now);
        let ticket = self.ticket(tp);
        let Some(lane) = self.lanes.get_mut(tp) else {
            self.tickets.remove(&ticket);
            return;
        };
        lane.work = Work::Forwarding {
            ticket,
            attempt,
            class,
            to,
            failures,
        };
        self.actions.push_back(Action::Produce {
            ticket,
            partition: tp.clone(),
            record,
        });
    }

    fn outgoing(
        &self,
        attempt: &Attempt,
        class: ErrorClass,
        to: Destination,
        now: Now,
    ) -> ProducerRecord {
        let mut out = match to {
            Destination::Hop(hop) => self.hop_record(attempt, hop),
            Destination::DeadLetters => self.letter_record(attempt, class, now),
        };
        // The trace goes on from the last attempt (a JSON envelope's copy of the
        // original headers keeps the record's own).
        if let Some(trace) = &attempt.trace {
            crate::proto::trace::set_header(&mut out.headers, trace);
        }
        out
    }

    /// The record's copy for retry topic `hop`, with its origin in the headers.
    fn hop_record(&self, attempt: &Attempt, hop: u32) -> ProducerRecord {
        let record = &attempt.record;
        let (origin_topic, origin_partition, origin_offset) = origin_of(record);
        let delay = hop
            .checked_sub(1)
            .and_then(|i| self.config.retry_delays.get(i as usize))
            .copied()
            .unwrap_or_default();
        let mut out = ProducerRecord::new(retry_topic(&origin_topic, delay));
        out.key = record.key_bytes();
        out.value = record.value_bytes();
        out.headers =
            producer_headers(&record.headers_owned(), |k| !k.starts_with(b"ottla.retry."));
        for (k, v) in [
            (RETRY_HOP, hop.to_string()),
            (RETRY_TOPIC, origin_topic),
            (RETRY_PARTITION, origin_partition.to_string()),
            (RETRY_OFFSET, origin_offset.to_string()),
        ] {
            out.headers.push((k.to_string(), Some(Bytes::from(v))));
        }
        out
    }

    /// The record's dead letter.
    fn letter_record(&self, attempt: &Attempt, class: ErrorClass, now: Now) -> ProducerRecord {
        let record = &attempt.record;
        let (origin_topic, origin_partition, origin_offset) = origin_of(record);
        let error = attempt
            .last_error
            .clone()
            .unwrap_or_else(|| ProcessError::unclassified("Unknown", ""));
        let letter = DeadLetter {
            topic: &origin_topic,
            partition: origin_partition,
            offset: origin_offset,
            timestamp: record.timestamp(),
            timestamp_type: record.timestamp_type(),
            group: &self.config.group,
            error: &error,
            class,
            attempts: attempt.attempts,
            first_failure_ms: attempt.first_failure_ms.unwrap_or(now.unix_ms),
            dead_lettered_ms: now.unix_ms,
        };
        let topic = self.config.dlq_of(&origin_topic);
        dead_letter_record(
            topic,
            record,
            &letter,
            self.config.dlq_format,
            self.config.dlq_timestamp,
        )
    }

    /// The write under `ticket` was acknowledged (`Ok`) or failed for good.
    pub fn produced(&mut self, ticket: Ticket, result: Result<(), String>, now: Now) {
        let Some((
            tp,
            Work::Forwarding {
                attempt,
                class,
                to,
                failures,
                ..
            },
        )) = self.take_work(ticket)
        else {
            return;
        };
        let Some(lane) = self.lanes.get_mut(&tp) else {
            return;
        };
        let offset = attempt.record.offset();
        match (result, to) {
            (Ok(()), Destination::Hop(hop)) => {
                info!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
                    offset, hop, "record sent to a retry topic"
                );
                lane.tracker.finish(offset);
                self.stats.forwarded += 1;
                self.metric(Metric::RetryTopic {
                    partition: tp.clone(),
                    offset,
                    hop,
                });
            }
            (Ok(()), Destination::DeadLetters) => {
                let error_type = attempt
                    .last_error
                    .as_ref()
                    .map(|e| e.kind.clone())
                    .unwrap_or_default();
                info!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
                    offset, error_type = %error_type, error_classification = class.label(),
                    "record dead-lettered"
                );
                lane.tracker.finish(offset);
                self.stats.dead_lettered += 1;
                self.metric(Metric::DeadLettered {
                    partition: tp.clone(),
                    offset,
                    error_type,
                    class,
                });
                self.processed(false, attempt.took);
            }
            (Err(e), _) => {
                self.stats.dlq_failures += 1;
                if lane.releasing {
                    warn!(
                        target: LOG_TARGET,
                        topic = %tp.topic, partition = tp.partition, offset, error = %e,
                        "dead-letter write failed while the partition is handed over; its next owner handles the record again"
                    );
                } else {
                    let failures = failures + 1;
                    let delay = self.halt_backoff.delay(failures);
                    error!(
                        target: LOG_TARGET,
                        topic = %tp.topic, partition = tp.partition, offset, error = %e,
                        retry_in_ms = delay.as_millis() as u64,
                        "dead-letter write failed; the partition is halted and nothing is committed past this record"
                    );
                    lane.work = Work::Halted {
                        attempt,
                        class,
                        to,
                        retry_at: now.at + delay,
                        failures,
                    };
                }
            }
        }
        self.step(now);
    }

    /// The commit of `offsets` succeeded (`true`) or failed.
    pub fn committed(&mut self, offsets: &[(TopicPartition, i64)], ok: bool, now: Now) {
        self.commit_in_flight = false;
        if ok && !offsets.is_empty() {
            self.stats.commits += 1;
            for (tp, o) in offsets {
                if let Some(l) = self.lanes.get_mut(tp) {
                    l.tracker.committed(*o);
                }
                self.metric(Metric::Committed {
                    partition: tp.clone(),
                    offset: *o,
                });
            }
        }
        self.step(now);
    }

    /// Hands `partitions` over (revoked, or the processor shuts down): their waits
    /// and queued records are dropped, their running handlers are told to stop, and
    /// once their work has stopped (or at `now + wait`) [`Action::Release`] gives
    /// their finished prefix to commit.
    pub fn release(
        &mut self,
        partitions: Vec<TopicPartition>,
        handover: Handover,
        wait: Duration,
        now: Now,
    ) {
        for tp in &partitions {
            self.actions.push_back(Action::Pause(tp.clone()));
            let Some(lane) = self.lanes.get_mut(tp) else {
                continue;
            };
            lane.releasing = true;
            lane.paused = true;
            lane.queue.clear();
            lane.queued = 0;
            match &mut lane.work {
                Work::Waiting { .. } | Work::Halted { .. } => lane.work = Work::Idle,
                Work::Running {
                    ticket, cancelled, ..
                } => {
                    *cancelled = true;
                    self.actions.push_back(Action::Cancel(*ticket));
                }
                Work::Idle | Work::Forwarding { .. } => {}
            }
        }
        self.releases.push(Releasing {
            handover,
            partitions,
            deadline: now.at + wait,
        });
        self.step(now);
    }

    /// The processor shuts down within `timeout`: every lane is handed over, its
    /// handlers getting four fifths of the timeout (at most the acquiesce window), so
    /// the commit of the finished prefix and leaving the group have the rest.
    pub fn shutdown(&mut self, timeout: Duration, acquiesce: Duration, now: Now) {
        let wait = timeout.mul_f64(0.8).min(acquiesce);
        self.release(self.partitions(), Handover::Shutdown, wait, now);
    }

    /// `partitions` were taken away without a chance to commit: their lanes go, and
    /// their running handlers are told to stop (what they report is dropped).
    pub fn lose(&mut self, partitions: &[TopicPartition], now: Now) {
        for tp in partitions {
            if let Some(lane) = self.remove_lane(tp) {
                if let Work::Running { ticket, .. } = lane.work {
                    self.actions.push_back(Action::Cancel(ticket));
                }
            }
        }
        for r in &mut self.releases {
            r.partitions.retain(|tp| !partitions.contains(tp));
        }
        warn!(
            target: LOG_TARGET,
            ?partitions,
            "partitions lost: in-flight results are dropped, nothing is committed for them"
        );
        self.metric(Metric::Lost {
            partitions: partitions.to_vec(),
        });
        self.step(now);
    }

    /// The time passed [`Lanes::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Now) {
        let due: Vec<TopicPartition> = self
            .lanes
            .iter()
            .filter(|(_, l)| matches!(l.work, Work::Halted { retry_at, .. } if now.at >= retry_at))
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in due {
            let Some(lane) = self.lanes.get_mut(&tp) else {
                continue;
            };
            if let Work::Halted {
                attempt,
                class,
                to,
                failures,
                ..
            } = std::mem::take(&mut lane.work)
            {
                self.forward(&tp, attempt, class, to, failures, now);
            }
        }
        self.step(now);
    }

    /// Starts what can start, finishes handovers, sets pauses and commits.
    fn step(&mut self, now: Now) {
        self.finish_releases(now);
        self.dispatch(now);
        self.update_pauses();
        self.commit_if_due(now);
    }

    /// Starts handlers for lanes that are idle and have records, up to `concurrency`.
    fn dispatch(&mut self, now: Now) {
        let mut running = self.running();
        let mut starts = Vec::new();
        let (held, held_all) = (&self.held, self.held_all);
        for (tp, lane) in self.lanes.iter_mut() {
            if running >= self.config.concurrency {
                break;
            }
            if lane.releasing || held_all || held.contains(tp) {
                continue;
            }
            let (run, retry) = match std::mem::take(&mut lane.work) {
                Work::Waiting { attempt, until } if now.at >= until => (
                    Run::new(vec![attempt.record.clone()]),
                    Some(Box::new(attempt)),
                ),
                Work::Idle => match next_batch(&self.config, lane, now) {
                    Some(run) => (run, None),
                    None => continue,
                },
                other => {
                    lane.work = other;
                    continue;
                }
            };
            running += 1;
            starts.push((tp.clone(), run, retry));
        }
        for (tp, run, retry) in starts {
            let ticket = self.ticket(&tp);
            let attempt = retry.as_ref().map_or(1, |a| a.attempts.saturating_add(1));
            let records = run.clone();
            if let Some(lane) = self.lanes.get_mut(&tp) {
                lane.work = Work::Running {
                    ticket,
                    run,
                    retry,
                    reported: 0,
                    cancelled: false,
                };
            }
            self.actions.push_back(Action::Dispatch {
                ticket,
                partition: tp,
                records,
                attempt,
            });
        }
    }

    fn update_pauses(&mut self) {
        let mut halted = 0;
        let (held, held_all) = (&self.held, self.held_all);
        for (tp, lane) in self.lanes.iter_mut() {
            // A write tried again after it failed still halts its lane.
            let halt = matches!(lane.work, Work::Halted { .. })
                || matches!(lane.work, Work::Forwarding { failures, .. } if failures > 0);
            let waiting = halt || matches!(lane.work, Work::Waiting { .. });
            halted += usize::from(halt);
            let should = lane.releasing
                || waiting
                || held_all
                || held.contains(tp)
                || lane.queued >= self.config.lane_buffer;
            if should && !lane.paused {
                self.actions.push_back(Action::Pause(tp.clone()));
                lane.paused = true;
            } else if !should && lane.paused {
                self.actions.push_back(Action::Resume(tp.clone()));
                lane.paused = false;
            }
        }
        if halted != self.halted {
            self.halted = halted;
            self.metric(Metric::Halted { partitions: halted });
        }
    }

    /// Each lane's finished prefix not yet committed.
    fn pending(&self, only: Option<&[TopicPartition]>) -> Vec<(TopicPartition, i64)> {
        self.lanes
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, l)| l.tracker.pending_commit().map(|o| (tp.clone(), o)))
            .collect()
    }

    fn commit_if_due(&mut self, now: Now) {
        if self.commit_in_flight {
            return;
        }
        if let Some(interval) = self.config.commit_interval {
            if self.next_commit.is_some_and(|t| now.at < t) {
                return;
            }
            self.next_commit = Some(now.at + interval);
        }
        let offsets = self.pending(None);
        if !offsets.is_empty() {
            self.commit_in_flight = true;
            self.actions.push_back(Action::Commit(offsets));
        }
    }

    /// Handovers whose work has stopped, or whose deadline passed, release their
    /// partitions.
    fn finish_releases(&mut self, now: Now) {
        let mut i = 0;
        while i < self.releases.len() {
            let Some(r) = self.releases.get(i) else {
                break;
            };
            let busy = r.partitions.iter().any(|tp| {
                self.lanes
                    .get(tp)
                    .is_some_and(|l| !matches!(l.work, Work::Idle))
            });
            if busy && now.at < r.deadline {
                i += 1;
                continue;
            }
            let r = self.releases.remove(i);
            if busy {
                warn!(
                    target: LOG_TARGET,
                    partitions = ?r.partitions,
                    "handlers did not finish within the acquiesce window; their records are not committed"
                );
            }
            let offsets = self.pending(Some(&r.partitions));
            for tp in &r.partitions {
                if let Some(lane) = self.remove_lane(tp) {
                    if let Work::Running {
                        ticket,
                        cancelled: false,
                        ..
                    } = lane.work
                    {
                        self.actions.push_back(Action::Cancel(ticket));
                    }
                }
            }
            self.actions.push_back(Action::Release {
                handover: r.handover,
                partitions: r.partitions,
                offsets,
            });
        }
    }

    /// Checks the invariants of the module docs against what the lanes hold; the
    /// first broken one, named. For tests and the fuzz target.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = HashMap::new();
        for (tp, lane) in &self.lanes {
            if let Some(t) = lane.work.ticket() {
                if self.tickets.get(&t) != Some(tp) {
                    return Err(format!("{tp:?}: its work's ticket is not in flight"));
                }
                if seen.insert(t, tp).is_some() {
                    return Err(format!("{tp:?}: a ticket shared by two lanes"));
                }
            }
            // What a commit would carry never passes an unfinished record.
            let unfinished = self.unfinished_of(lane);
            if let (Some(commit), Some(first)) = (lane.tracker.pending_commit(), unfinished) {
                if commit > first {
                    return Err(format!(
                        "{tp:?}: commit {commit} passes unfinished record {first}"
                    ));
                }
            }
            if lane.releasing && lane.queued > 0 {
                return Err(format!(
                    "{tp:?}: records queued on a lane being handed over"
                ));
            }
            let runs: usize = lane.queue.iter().map(|r| r.len()).sum();
            if runs != lane.queued || lane.queue.iter().any(|r| r.is_empty()) {
                return Err(format!(
                    "{tp:?}: {runs} records in runs, {} counted, or an empty run",
                    lane.queued
                ));
            }
            // Every record delivered and not finished is queued or in the lane's work:
            // none is stranded (a lane being handed over drops what it will not do).
            let held = lane.queued
                + match &lane.work {
                    Work::Idle => 0,
                    Work::Running { run, reported, .. } => run.len().saturating_sub(*reported),
                    _ => 1,
                };
            if !lane.releasing && held != lane.tracker.in_progress() {
                return Err(format!(
                    "{tp:?}: {} records unfinished, {held} queued or in work",
                    lane.tracker.in_progress()
                ));
            }
        }
        Ok(())
    }

    /// The lowest offset a lane holds that has not finished.
    fn unfinished_of(&self, lane: &Lane) -> Option<i64> {
        let work = match &lane.work {
            Work::Idle => None,
            Work::Running { run, reported, .. } => run.get(*reported).map(ConsumerRecord::offset),
            Work::Waiting { attempt, .. }
            | Work::Forwarding { attempt, .. }
            | Work::Halted { attempt, .. } => Some(attempt.record.offset()),
        };
        work.into_iter()
            .chain(
                lane.queue
                    .front()
                    .and_then(|r| r.first())
                    .map(ConsumerRecord::offset),
            )
            .min()
    }
}

/// Puts records not handled back at the front of their lane, in order; a lane being
/// handed over keeps none (its next owner reads them).
fn requeue(lane: &mut Lane, records: Run) {
    if lane.releasing || records.is_empty() {
        return;
    }
    lane.queued += records.len();
    lane.queue.push_front(records);
}

/// The records of `records`, finished, to the tracker: a range of offsets at a time.
fn finish(tracker: &mut OffsetTracker, records: &[ConsumerRecord]) {
    for run in offset_runs(records) {
        tracker.finish_run(run);
    }
}

/// The next records of an idle lane: up to `max_batch` (one while replaying a failed
/// batch), stopping before a retry-topic record that must still wait (which then
/// waits in the lane).
fn next_batch(config: &LanesConfig, lane: &mut Lane, now: Now) -> Option<Run> {
    let want = config.max_batch.max(1);
    let Lane {
        queue,
        solo_through,
        work,
        ..
    } = lane;
    // How many to take. Without a batch to replay one record at a time or retry
    // topics to wait for, that is all there are, up to a batch, unread.
    let mut take = want.min(queue.iter().map(|r| r.len()).sum());
    let mut wait_until = None;
    if solo_through.is_some() || !config.retry_delays.is_empty() {
        take = 0;
        'scan: for record in queue.iter().flat_map(|r| r.iter()) {
            if take == want {
                break;
            }
            let solo = solo_through.is_some_and(|o| record.offset() <= o);
            if !solo {
                *solo_through = None;
            }
            if solo && take > 0 {
                break;
            }
            // A retry-topic record waits for its timestamp plus the delay.
            let delay = hop_of(record)
                .checked_sub(1)
                .and_then(|i| config.retry_delays.get(i as usize));
            let wait = delay.map_or(0, |d| {
                record
                    .timestamp()
                    .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                    .saturating_sub(now.unix_ms)
            });
            if wait > 0 {
                if take == 0 {
                    take = 1;
                    wait_until = Some(now.at + Duration::from_millis(wait.unsigned_abs()));
                }
                break 'scan;
            }
            take += 1;
            if solo {
                break;
            }
        }
    }
    if take == 0 {
        return None;
    }
    let front = queue.front_mut()?;
    // From the first run alone, without a copy, when it has what to take or half a
    // batch; from several runs (one reference count a record) when it is a remnant.
    let run = if take <= front.len() || front.len() * 2 >= want {
        let run = front.take_front(take);
        if front.is_empty() {
            queue.pop_front();
        }
        run
    } else {
        let mut records = Vec::with_capacity(take);
        while records.len() < take {
            let Some(front) = queue.front_mut() else {
                break;
            };
            records.extend(front.take_front(take - records.len()).iter().cloned());
            if front.is_empty() {
                queue.pop_front();
            }
        }
        Run::new(records)
    };
    lane.queued -= run.len();
    if let Some(until) = wait_until {
        let record = run.first()?.clone();
        *work = Work::Waiting {
            attempt: Attempt::first(record),
            until,
        };
        return None;
    }
    Some(run)
}

#[cfg(any(test, feature = "testing"))]
pub mod script;
#[cfg(test)]
mod tests;
