//! The processing loop: a handler per record, retries with backoff that never stall
//! other partitions, a dead-letter topic for what cannot succeed, and commits that
//! never pass an unfinished record.
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::processor::{Processor, ProcessError};
//!
//! let processor = Processor::builder("127.0.0.1:9092", "billing", ["orders"]).build().await?;
//! let stats = processor
//!     .run(
//!         |record, _cancel| async move {
//!             let value = record.value.unwrap_or_default();
//!             let text = std::str::from_utf8(&value).map_err(|e| ProcessError::malformed(e.to_string()))?;
//!             println!("{text}");
//!             Ok(())
//!         },
//!         tokio::time::sleep(std::time::Duration::from_secs(3600)), // or a shutdown signal
//!     )
//!     .await?;
//! println!("{stats:?}");
//! # Ok(()) }
//! ```
//!
//! **Lanes.** Each partition is a lane: its records are handled one at a time (or one
//! batch at a time with [`Processor::run_batch`]), in order. Up to `concurrency` lanes run at once. A lane whose record waits for a retry
//! is paused (its partition is not fetched) while the others keep flowing; heartbeats
//! are sent by the group task whatever handlers do.
//!
//! **Commit rule.** An offset becomes committable only when its record succeeded or its
//! dead-letter write was acknowledged; commits carry each partition's finished prefix.
//! A dead-letter write that fails halts its lane (paused, nothing committed past it)
//! and is retried with backoff until it succeeds.
//!
//! **Rebalances.** When partitions are revoked, their backoff waits are cancelled, their
//! running handlers are signalled through [`Cancel`] and awaited for up to
//! `acquiesce_share` of the rebalance timeout, the finished prefix is committed, and
//! only then is the revocation acknowledged. Lost partitions are dropped without a
//! commit.
//!
//! **Shutdown.** When `shutdown` resolves, fetching stops, running handlers are
//! signalled and awaited, the finished prefix is committed and the member leaves the
//! group, all within [`ProcessorBuilder::shutdown_timeout`] (default 25 s).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::config::ClientConfig;
use crate::consumer::{Consumer, ConsumerBuilder, ConsumerEvent, ConsumerRecord, TopicPartition};
use crate::driver::sleep_until;
use crate::error::{Error, Result};
use crate::producer::{Producer, ProducerBuilder, ProducerRecord};
use crate::proto::group::member::Event;
pub use crate::proto::process::classify::{
    AsGiven, BatchError, Classifier, Disposition, ErrorClass, HttpClassifier, ProcessError,
};
use crate::proto::process::dlq::DeadLetter;
pub use crate::proto::process::dlq::{DlqFormat, DlqTimestamp};
pub use crate::proto::process::retry::{Backoff, RetryPolicy};
use crate::proto::process::tracker::OffsetTracker;

/// Tells a running handler that its partition is being taken away (or the processor
/// shuts down): finish quickly and return `Ok(())` (the record is done and committed),
/// or stop and return `Err(ProcessError::cancelled())` (the record is not committed,
/// and the partition's next owner handles it again). Returning `Ok(())` without
/// finishing commits a record nobody processed.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
    notify: Arc<Notify>,
}

impl Cancel {
    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Resolves when cancellation is requested.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    fn cancel(&self) {
        self.flag.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }
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
    /// Records a handler stopped on cancellation ([`ProcessError::cancelled`]), left
    /// for the partition's next owner.
    pub cancelled: u64,
    /// Records skipped ([`ProcessError::skip`]): committed without being processed.
    pub skipped: u64,
}

/// One metric observation, for [`ProcessorBuilder::metrics`].
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
    /// A record was skipped ([`ProcessError::skip`]): committed, not processed.
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
    /// Partitions halted because the dead-letter topic cannot be written.
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
}

type MetricsHook = Arc<dyn Fn(Metric) + Send + Sync>;
type DlqName = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Builds a [`Processor`].
pub struct ProcessorBuilder {
    consumer: ConsumerBuilder,
    producer: ProducerBuilder,
    group: String,
    policy: RetryPolicy,
    classifier: Arc<dyn Classifier>,
    dlq_format: DlqFormat,
    dlq_timestamp: DlqTimestamp,
    dlq_suffix: String,
    dlq_name: Option<DlqName>,
    topics: Vec<String>,
    retry_delays: Vec<Duration>,
    concurrency: usize,
    lane_buffer: usize,
    commit_interval: Option<Duration>,
    acquiesce_share: f64,
    shutdown_timeout: Duration,
    max_poll_interval: Duration,
    session_timeout: Duration,
    heartbeat_interval: Duration,
    processing_budget: Duration,
    metrics: Option<MetricsHook>,
}

impl std::fmt::Debug for ProcessorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessorBuilder")
            .field("group", &self.group)
            .field("policy", &self.policy)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

impl ProcessorBuilder {
    /// A processor for `group` on `topics`. The retry policy starts from the
    /// environment variables `max_retries`, `initial_retry_delay_ms`,
    /// `max_retry_delay_ms`, `retry_backoff_multiplier`, `retry_jitter` and
    /// `retry_min_delay_ms` where set.
    pub fn new<I, S>(bootstrap: &str, group: &str, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let topics: Vec<String> = topics.into_iter().map(Into::into).collect();
        Self {
            consumer: Consumer::builder(bootstrap).group_id(group),
            topics,
            retry_delays: Vec::new(),
            producer: Producer::builder(bootstrap),
            group: group.to_string(),
            policy: RetryPolicy::default(),
            classifier: Arc::new(AsGiven),
            dlq_format: DlqFormat::Apache,
            dlq_timestamp: DlqTimestamp::default(),
            dlq_suffix: ".dlq".into(),
            dlq_name: None,
            concurrency: 16,
            lane_buffer: 1000,
            commit_interval: Some(Duration::from_secs(1)),
            acquiesce_share: 0.5,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            max_poll_interval: Duration::from_secs(300),
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(3),
            processing_budget: Duration::from_secs(30),
            metrics: None,
        }
    }

    /// Adjusts the consumer (offset reset, fetch sizes, assignors, ...). Group id,
    /// topics and the timeouts below are set by this builder.
    pub fn consumer(mut self, f: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder) -> Self {
        self.consumer = f(self.consumer);
        self
    }

    /// Adjusts the dead-letter producer.
    pub fn producer(mut self, f: impl FnOnce(ProducerBuilder) -> ProducerBuilder) -> Self {
        self.producer = f(self.producer);
        self
    }

    /// The connection settings of both the consumer and the dead-letter producer
    /// (bootstrap servers, `security.protocol`, TLS, SASL, ...).
    pub fn client_config(mut self, config: ClientConfig) -> Self {
        self.consumer = self.consumer.client_config(config.clone());
        self.producer = self.producer.client_config(config);
        self
    }

    /// A connection setting by its Java or librdkafka property name
    /// ([`ClientConfig::set`]), for the consumer and the dead-letter producer alike.
    pub fn set(mut self, key: &str, value: &str) -> Result<Self> {
        self.consumer = self.consumer.set(key, value)?;
        self.producer = self.producer.set(key, value)?;
        Ok(self)
    }

    /// The retry policy.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Reads the retry policy from the environment variables named in
    /// [`ProcessorBuilder::new`].
    pub fn retry_policy_from_env(mut self) -> Result<Self> {
        self.policy = RetryPolicy::from_vars(|k| std::env::var(k).ok()).map_err(config)?;
        Ok(self)
    }

    /// A classifier applied to every handler error.
    pub fn classifier(mut self, c: Arc<dyn Classifier>) -> Self {
        self.classifier = c;
        self
    }

    /// The dead-letter header format (default [`DlqFormat::Apache`]).
    pub fn dlq_format(mut self, f: DlqFormat) -> Self {
        self.dlq_format = f;
        self
    }

    /// The timestamp dead-letter records carry (default [`DlqTimestamp::DeadLettered`]:
    /// when they were written, so the DLQ's retention counts from then).
    pub fn dlq_timestamp(mut self, t: DlqTimestamp) -> Self {
        self.dlq_timestamp = t;
        self
    }

    /// The dead-letter topic is the original topic plus this suffix (default `.dlq`).
    pub fn dlq_suffix(mut self, s: impl Into<String>) -> Self {
        self.dlq_suffix = s.into();
        self
    }

    /// Names the dead-letter topic of each original topic (instead of the suffix), for
    /// example `|t| t.replace(".v1", ".dlq")` for `brew.orders.v1` → `brew.orders.dlq`.
    /// The topics must exist: until they do, dead-letter writes fail and their lanes
    /// halt.
    pub fn dlq_topic(mut self, name: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        self.dlq_name = Some(Arc::new(name));
        self
    }

    fn dlq_of(&self, topic: &str) -> String {
        dlq_of(self.dlq_name.as_ref(), &self.dlq_suffix, topic)
    }

    /// Non-blocking retry topics, after the in-place retries: a record whose retries
    /// ran out goes to `<topic>.retry.<delay>` for each delay in turn (for example
    /// `orders.retry.30s`, then `orders.retry.5m`), and only then to the dead-letter
    /// topic. A retry topic's lane waits until the record's timestamp plus the delay,
    /// pausing only that partition. The hop and the original coordinates travel in the
    /// `ottla.retry.*` headers. The topics must exist.
    pub fn retry_topics(mut self, delays: Vec<Duration>) -> Self {
        self.retry_delays = delays;
        self
    }

    /// Lanes running at once (default 16).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Commit after every finished record (`None`) or on an interval (default 1 s).
    pub fn commit_interval(mut self, every: Option<Duration>) -> Self {
        self.commit_interval = every;
        self
    }

    /// The share of the rebalance timeout that revoked handlers may take to finish
    /// (default 0.5).
    pub fn acquiesce_share(mut self, share: f64) -> Self {
        self.acquiesce_share = share;
        self
    }

    /// How long a shutdown may take, from the `shutdown` future resolving to `run`
    /// returning (default 25 s, inside the 30 s that Kubernetes and systemd grant a
    /// process before killing it). Running handlers get four fifths of it (at most the
    /// acquiesce window); the commit of the finished prefix and leaving the group get
    /// the rest.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// `session.timeout.ms`, `heartbeat.interval.ms` and `max.poll.interval.ms` (the
    /// rebalance timeout).
    pub fn timeouts(mut self, session: Duration, heartbeat: Duration, max_poll: Duration) -> Self {
        self.session_timeout = session;
        self.heartbeat_interval = heartbeat;
        self.max_poll_interval = max_poll;
        self
    }

    /// The longest one handler call may take (default 30 s): an attempt still running
    /// after it is cancelled (its future dropped) and counts as a transient failure of
    /// type `Timeout`, so it is retried, and dead-lettered once retries run out. With
    /// [`Processor::run_batch`] the budget is the whole batch's; a batch that exceeds it
    /// is replayed one record at a time. Also used for the progress-window check.
    pub fn processing_budget(mut self, t: Duration) -> Self {
        self.processing_budget = t;
        self
    }

    /// A hook that receives every metric observation.
    pub fn metrics(mut self, hook: impl Fn(Metric) + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(hook));
        self
    }

    /// Checks the whole configuration; the error names the setting to change.
    pub fn validate(&self) -> Result<()> {
        self.policy.validate().map_err(config)?;
        let bad = |setting: &'static str, message: String| Err(Error::Config { setting, message });
        if self.heartbeat_interval * 3 > self.session_timeout {
            return bad(
                "heartbeat.interval.ms",
                format!(
                    "{:?} is more than a third of session.timeout.ms ({:?}); lower it",
                    self.heartbeat_interval, self.session_timeout
                ),
            );
        }
        let window = self.policy.worst_case_total() + self.processing_budget;
        if self.max_poll_interval < window {
            return bad(
                "max.poll.interval.ms",
                format!(
                    "{:?} is shorter than max_retries x max_retry_delay plus the processing budget ({window:?}); raise it to at least that",
                    self.max_poll_interval
                ),
            );
        }
        if self.concurrency == 0 {
            return bad("concurrency", "must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.acquiesce_share) || self.acquiesce_share == 0.0 {
            return bad("acquiesce_share", "must be in (0, 1]".into());
        }
        for t in &self.topics {
            let dlq = self.dlq_of(t);
            if dlq == *t || self.topics.contains(&dlq) {
                return bad(
                    "dlq_topic",
                    format!(
                        "the dead-letter topic of {t} is {dlq}, a topic this processor reads; name it apart"
                    ),
                );
            }
        }
        if self.dlq_suffix.is_empty() {
            return bad(
                "dlq_suffix",
                "must not be empty: the DLQ would be the topic itself".into(),
            );
        }
        Ok(())
    }

    /// Validates, then connects the consumer and the dead-letter producer.
    pub async fn build(self) -> Result<Processor> {
        self.validate()?;
        let mut topics = self.topics.clone();
        for t in &self.topics {
            topics.extend(self.retry_delays.iter().map(|d| retry_topic(t, *d)));
        }
        // The retry delays' jitter follows the client's seed (random unless set), so
        // processors that fail together do not retry together.
        let jitter_seed = self.consumer.client().jitter_seed ^ 0x9e37_79b9_7f4a_7c15;
        let consumer = self
            .consumer
            .group_id(self.group.clone())
            .topics(topics)
            .session_timeout(self.session_timeout)
            .heartbeat_interval(self.heartbeat_interval)
            .max_poll_interval(self.max_poll_interval)
            .auto_commit(None)
            .manual_revocation()
            .build()
            .await?;
        let producer = self.producer.build().await?;
        Ok(Processor {
            consumer,
            producer: Arc::new(producer),
            group: self.group,
            policy: self.policy,
            classifier: self.classifier,
            dlq_format: self.dlq_format,
            dlq_timestamp: self.dlq_timestamp,
            dlq_suffix: self.dlq_suffix,
            dlq_name: self.dlq_name,
            retry_delays: self.retry_delays,
            concurrency: self.concurrency,
            lane_buffer: self.lane_buffer,
            max_batch: 1,
            commit_interval: self.commit_interval,
            acquiesce: self.max_poll_interval.mul_f64(self.acquiesce_share),
            shutdown_timeout: self.shutdown_timeout,
            processing_budget: self.processing_budget,
            metrics: self.metrics,
            jitter_seed,
        })
    }
}

fn dlq_of(name: Option<&DlqName>, suffix: &str, topic: &str) -> String {
    match name {
        Some(f) => f(topic),
        None => format!("{topic}{suffix}"),
    }
}

/// The dead-letter record of `record` for `topic`: its key and headers, its value (or
/// the JSON envelope holding it), the diagnostic headers of `format`, and the
/// timestamp `stamp` chooses.
fn dead_letter_record(
    topic: String,
    record: &ConsumerRecord,
    letter: &DeadLetter<'_>,
    format: DlqFormat,
    stamp: DlqTimestamp,
) -> ProducerRecord {
    let mut out = ProducerRecord::new(topic);
    out.key = record.key.clone();
    out.timestamp = Some(match stamp {
        DlqTimestamp::DeadLettered => letter.dead_lettered_ms,
        DlqTimestamp::Original => record.timestamp,
    });
    out.headers = record
        .headers
        .iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
        .collect();
    out.value = if format == DlqFormat::JsonEnvelope {
        let (key, value) = (record.key.as_deref(), record.value.as_deref());
        Some(Bytes::from(letter.envelope(key, value, &record.headers)))
    } else {
        record.value.clone()
    };
    out.headers.extend(letter.headers(format));
    out
}

fn config(e: crate::proto::process::retry::ConfigError) -> Error {
    Error::Config {
        setting: e.setting,
        message: e.message,
    }
}

/// The processing loop. See the module docs.
pub struct Processor {
    consumer: Consumer,
    producer: Arc<Producer>,
    group: String,
    policy: RetryPolicy,
    classifier: Arc<dyn Classifier>,
    dlq_format: DlqFormat,
    dlq_timestamp: DlqTimestamp,
    dlq_suffix: String,
    dlq_name: Option<DlqName>,
    retry_delays: Vec<Duration>,
    concurrency: usize,
    lane_buffer: usize,
    /// Records per handler call: 1 for [`Processor::run`].
    max_batch: usize,
    commit_interval: Option<Duration>,
    acquiesce: Duration,
    metrics: Option<MetricsHook>,
    /// The seed of the retry delays' jitter (from the client's `jitter_seed`).
    jitter_seed: u64,
    shutdown_timeout: Duration,
    processing_budget: Duration,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
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
}

#[derive(Debug, Default)]
struct Lane {
    queue: VecDeque<ConsumerRecord>,
    tracker: OffsetTracker,
    running: Option<Cancel>,
    /// A record waiting for its retry.
    retry: Option<(Attempt, Instant)>,
    /// A record waiting for its dead-letter write to be retried.
    halted: Option<(Attempt, ErrorClass, Instant, u32)>,
    /// Where the halted record is going: a retry-topic hop, or the DLQ (`None`).
    halted_hop: Option<u32>,
    dlq_in_flight: bool,
    paused: bool,
    /// Records up to this offset are handled one at a time: their batch failed
    /// without naming a record.
    solo_through: Option<i64>,
    /// Bumped when the lane is revoked or lost: results of an older epoch are ignored.
    epoch: u64,
}

enum Done {
    Handled {
        tp: TopicPartition,
        epoch: u64,
        /// The batch, in offset order (one record for [`Processor::run`] and retries).
        attempts: Vec<Attempt>,
        outcome: Outcome,
        took: Duration,
    },
    DeadLettered {
        tp: TopicPartition,
        epoch: u64,
        attempt: Box<Attempt>,
        class: ErrorClass,
        /// `Some(hop)`: forwarded to that retry topic, not dead-lettered.
        to: Option<u32>,
        result: Result<()>,
    },
}

/// What one lane task reports about the records it was given.
struct Outcome {
    /// `Ok`: every record not left (see `stopped_after`) was handled; `Err` as from a
    /// batch handler.
    result: std::result::Result<(), BatchError>,
    /// The task stopped early, without an error, after this many records (cancelled,
    /// or its time slice ran out): the others come again.
    stopped_after: Option<usize>,
    /// The failure is a panic of the handler.
    panicked: bool,
    /// How long each record's call took, for the records handled and the failing one
    /// ([`Processor::run`] with a metrics hook); empty: the whole call's time for each.
    durations: Vec<Duration>,
}

impl Outcome {
    fn of(result: std::result::Result<(), BatchError>) -> Self {
        Self {
            result,
            stopped_after: None,
            panicked: false,
            durations: Vec::new(),
        }
    }

    fn panic(message: String, index: Option<usize>) -> Self {
        let error = ProcessError::permanent("Panic", message);
        Self {
            result: Err(BatchError { index, error }),
            stopped_after: None,
            panicked: true,
            durations: Vec::new(),
        }
    }
}

/// Records one [`Processor::run`] task takes from its lane at most.
const RUN_CHUNK: usize = 256;
/// How long one [`Processor::run`] task keeps calling the handler before it reports
/// back (finished offsets become committable only then).
const RUN_SLICE: Duration = Duration::from_millis(10);

/// `call`'s output, or `None` if it runs past `budget` (it is then dropped). A call
/// that is ready on its first poll, as a fast handler's is, costs no timer: arming one
/// reads the clock and touches the runtime's timer, per record on `run`'s hot path.
async fn within<F: Future>(budget: Duration, call: F) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
    match first {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => tokio::time::timeout(budget, call).await.ok(),
    }
}

/// The error of an attempt cancelled for running past `processing_budget`: transient,
/// so it is retried, then dead-lettered once retries run out.
fn over_budget(budget: Duration) -> ProcessError {
    ProcessError::transient(
        "Timeout",
        format!("the handler ran past processing_budget ({budget:?}) and was cancelled"),
    )
}

/// Calls `f` and awaits its future, catching a panic in either: `Err` carries the
/// panic's message. Instead of a task per call, which costs far more than a handler
/// that only counts.
async fn catch_call<F: Future>(f: impl FnOnce() -> F) -> std::result::Result<F::Output, String> {
    let future = std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(panic_message)?;
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(payload) => std::task::Poll::Ready(Err(panic_message(payload))),
        }
    })
    .await
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let detail = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned());
    match detail {
        Some(d) => format!("the handler panicked: {d}"),
        None => "the handler panicked".into(),
    }
}

/// [`ProcessorBuilder::shutdown_timeout`]'s default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);

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

fn header_str(r: &ConsumerRecord, name: &str) -> Option<String> {
    r.headers
        .iter()
        .find(|(k, _)| &k[..] == name.as_bytes())
        .and_then(|(_, v)| v.as_deref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The retry hop of a record (0: not from a retry topic).
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
        _ => (r.topic.to_string(), r.partition, r.offset),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Processor {
    /// A builder.
    pub fn builder<I, S>(bootstrap: &str, group: &str, topics: I) -> ProcessorBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProcessorBuilder::new(bootstrap, group, topics)
    }

    fn metric(&self, m: Metric) {
        if let Some(h) = &self.metrics {
            h(m);
        }
    }

    /// Runs `handler` on every record until `shutdown` resolves, then stops fetching,
    /// lets running handlers finish (within the acquiesce window), commits the finished
    /// prefix and leaves the group.
    pub async fn run<H, F, S>(self, handler: H, shutdown: S) -> Result<Stats>
    where
        H: Fn(ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<(), ProcessError>> + Send + 'static,
        S: Future + Send,
    {
        // A task takes up to RUN_CHUNK records of its lane and calls the handler on
        // them one after the other, for up to RUN_SLICE: the cost of a task is shared
        // by the records of a fast handler, and a slow one still gets a task per record.
        let handler = Arc::new(handler);
        let timed = self.metrics.is_some();
        let budget = self.processing_budget;
        let call = move |records: Vec<ConsumerRecord>, cancel: Cancel| {
            let handler = handler.clone();
            async move {
                let slice = std::time::Instant::now();
                let mut durations = Vec::new();
                for (i, record) in records.into_iter().enumerate() {
                    // The clock after each of the first 8 records, then after every
                    // 8th: reading it costs more than a handler that only counts, and a
                    // slow handler still stops after its first record.
                    let check = i < 8 || i % 8 == 0;
                    if i > 0 && (cancel.is_cancelled() || (check && slice.elapsed() >= RUN_SLICE)) {
                        return Outcome {
                            stopped_after: Some(i),
                            durations,
                            ..Outcome::of(Ok(()))
                        };
                    }
                    let started = timed.then(std::time::Instant::now);
                    let call = catch_call(|| handler(record, cancel.clone()));
                    let result = within(budget, call)
                        .await
                        .unwrap_or_else(|| Ok(Err(over_budget(budget))));
                    if let Some(started) = started {
                        durations.push(started.elapsed());
                    }
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            return Outcome {
                                durations,
                                ..Outcome::of(Err(BatchError::at(i, e)))
                            };
                        }
                        Err(message) => {
                            return Outcome {
                                durations,
                                ..Outcome::panic(message, Some(i))
                            };
                        }
                    }
                }
                Outcome {
                    durations,
                    ..Outcome::of(Ok(()))
                }
            }
        };
        self.run_inner(RUN_CHUNK, call, shutdown).await
    }

    /// Like [`Processor::run`], but `handler` gets up to `max_records` records of one
    /// partition at a time, in offset order (whatever is buffered; it never waits to
    /// fill a batch). A batch is handled by one call, so one partition still has one
    /// call at a time.
    ///
    /// On error, [`BatchError::at`] names the failing record: the records before it
    /// count as handled, it goes through the retry policy (retried alone) and the
    /// dead-letter topic like a record of [`Processor::run`], and the records after it
    /// come again in later batches. [`BatchError::whole`] (or `?` on a
    /// [`ProcessError`]) replays the batch one record at a time, so that only the
    /// records that fail on their own are retried or dead-lettered. A panic counts as
    /// a batch error without an index.
    ///
    /// ```no_run
    /// # async fn demo() -> ottla::Result<()> {
    /// use ottla::processor::{BatchError, ProcessError, Processor};
    ///
    /// let processor = Processor::builder("127.0.0.1:9092", "audit", ["events"]).build().await?;
    /// processor
    ///     .run_batch(
    ///         200,
    ///         |records, _cancel| async move {
    ///             for (i, record) in records.iter().enumerate() {
    ///                 if record.value.is_none() {
    ///                     return Err(BatchError::at(i, ProcessError::malformed("no value")));
    ///                 }
    ///             }
    ///             // ... one bulk insert of the whole batch ...
    ///             Ok(())
    ///         },
    ///         tokio::time::sleep(std::time::Duration::from_secs(3600)),
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_batch<H, F, S>(
        mut self,
        max_records: usize,
        handler: H,
        shutdown: S,
    ) -> Result<Stats>
    where
        H: Fn(Vec<ConsumerRecord>, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<(), BatchError>> + Send + 'static,
        S: Future + Send,
    {
        if max_records == 0 {
            return Err(Error::Config {
                setting: "max_records",
                message: "a batch must allow at least 1 record".into(),
            });
        }
        self.lane_buffer = self.lane_buffer.max(max_records);
        let handler = Arc::new(handler);
        let budget = self.processing_budget;
        let call = move |records: Vec<ConsumerRecord>, cancel: Cancel| {
            let handler = handler.clone();
            async move {
                let call = catch_call(|| handler(records, cancel));
                match within(budget, call).await {
                    Some(Ok(result)) => Outcome::of(result),
                    Some(Err(message)) => Outcome::panic(message, None),
                    // Which record held it up is unknown: the batch goes again one
                    // record at a time, each with the budget.
                    None => Outcome::of(Err(BatchError {
                        index: None,
                        error: over_budget(budget),
                    })),
                }
            }
        };
        self.run_inner(max_records, call, shutdown).await
    }

    async fn run_inner<H, F, S>(
        mut self,
        max_batch: usize,
        handler: H,
        shutdown: S,
    ) -> Result<Stats>
    where
        H: Fn(Vec<ConsumerRecord>, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
        S: Future + Send,
    {
        self.max_batch = max_batch;
        let handler = Arc::new(handler);
        let mut lanes: BTreeMap<TopicPartition, Lane> = BTreeMap::new();
        let mut tasks: JoinSet<Done> = JoinSet::new();
        let mut stats = Stats::default();
        // xorshift's state must not be zero.
        let mut jitter = self.jitter_seed.max(1);
        let mut next_commit = self.commit_interval.map(|i| Instant::now() + i);
        let mut epochs: HashMap<TopicPartition, u64> = HashMap::new();
        let mut epoch_counter = 0u64;
        let mut events = self.consumer.take_events();
        tokio::pin!(shutdown);
        let result: Result<()> = loop {
            // Start what can start.
            self.dispatch(&mut lanes, &mut tasks, &handler);
            self.update_pauses(&mut lanes);
            if self.commit_interval.is_none() {
                self.commit(&mut lanes, &mut stats).await;
            }
            let buffered: usize = lanes.values().map(|l| l.queue.len()).sum();
            let want_records = buffered < self.lane_buffer * 4;
            let deadline = lanes
                .values()
                .flat_map(|l| {
                    [
                        l.retry.as_ref().map(|r| r.1),
                        l.halted.as_ref().map(|h| h.2),
                    ]
                })
                .flatten()
                .chain(next_commit)
                .min();
            // Biased: group events before records, so that a generation's events are
            // seen (and reported) before any record of its new partitions; finished
            // work and due timers before more records, so a steady stream of records
            // cannot hold back commits and retries.
            tokio::select! {
                biased;
                _ = &mut shutdown => break Ok(()),
                Some(event) = events.recv() => {
                    if let ConsumerEvent::Group(event) = event {
                        match event {
                            Event::Joined { generation, member_id, leader, .. } => {
                                self.metric(Metric::Joined { generation, member_id, leader });
                            }
                            Event::Assigned { generation, added, .. } => {
                                self.metric(Metric::Assigned { generation, partitions: added });
                            }
                            Event::RevokeRequested { generation, partitions } => {
                                self.acquiesce(&mut lanes, &mut tasks, &mut stats, &partitions, &mut jitter, self.acquiesce).await;
                                for tp in &partitions {
                                    lanes.remove(tp);
                                    epochs.remove(tp);
                                }
                                self.metric(Metric::Revoked { generation, partitions: partitions.clone() });
                                self.consumer.complete_revocation(generation, partitions);
                            }
                            Event::Lost { partitions, .. } => {
                                for tp in &partitions {
                                    if let Some(l) = lanes.remove(tp) {
                                        if let Some(c) = l.running {
                                            c.cancel();
                                        }
                                    }
                                    epochs.remove(tp);
                                }
                                warn!(?partitions, "partitions lost: in-flight results are dropped, nothing is committed for them");
                                self.metric(Metric::Lost { partitions });
                            }
                            Event::Fatal(e) => break Err(Error::Group(e)),
                            _ => {}
                        }
                    }
                }
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    match done {
                        Ok(done) => self.on_done(done, &mut lanes, &mut tasks, &mut stats, &mut jitter),
                        Err(e) => warn!(error = %e, "a processing task failed"),
                    }
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    let now = Instant::now();
                    if next_commit.is_some_and(|t| now >= t) {
                        next_commit = self.commit_interval.map(|i| now + i);
                        self.commit(&mut lanes, &mut stats).await;
                    }
                    self.retry_dlq(&mut lanes, &mut tasks, now);
                }
                batch = self.consumer.recv_batch(500), if want_records => {
                    match batch {
                        Ok(records) => {
                            // Records come in runs of one partition: one lane lookup per run.
                            let mut records = records.into_iter().peekable();
                            while let Some(first) = records.next() {
                                let (topic, partition) = (first.topic.clone(), first.partition);
                                let tp = first.topic_partition();
                                let epoch = *epochs.entry(tp.clone()).or_insert_with(|| { epoch_counter += 1; epoch_counter });
                                let lane = lanes.entry(tp).or_default();
                                lane.epoch = epoch;
                                lane.tracker.deliver(first.offset);
                                lane.queue.push_back(first);
                                while let Some(r) = records.next_if(|r| r.partition == partition && r.topic == topic) {
                                    lane.tracker.deliver(r.offset);
                                    lane.queue.push_back(r);
                                }
                            }
                        }
                        Err(Error::Fetch(e)) => {
                            // A partition stopped (corrupt batch): nothing is committed past it.
                            error!(error = %e, "partition stopped; its records are not committed past this point");
                        }
                        Err(e) => break Err(e),
                    }
                }
            }
        };
        // Shut down within `shutdown_timeout`: handlers get four fifths of it (at most
        // the acquiesce window), then the finished prefix is committed and the member
        // leaves in what remains.
        let all: Vec<TopicPartition> = lanes.keys().cloned().collect();
        let until = Instant::now() + self.shutdown_timeout;
        let wait = self.shutdown_timeout.mul_f64(0.8).min(self.acquiesce);
        self.acquiesce(&mut lanes, &mut tasks, &mut stats, &all, &mut jitter, wait)
            .await;
        let close = match tokio::time::timeout_at(until, self.consumer.close()).await {
            Ok(close) => close,
            Err(_) => {
                warn!(timeout = ?self.shutdown_timeout, "leaving the group did not finish within the shutdown timeout");
                Ok(())
            }
        };
        result.and(close).map(|()| stats)
    }

    fn next_jitter(state: &mut u64) -> f64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Starts handlers for lanes that are idle and have records, up to `concurrency`.
    fn dispatch<H, F>(
        &self,
        lanes: &mut BTreeMap<TopicPartition, Lane>,
        tasks: &mut JoinSet<Done>,
        handler: &Arc<H>,
    ) where
        H: Fn(Vec<ConsumerRecord>, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
    {
        let now = Instant::now();
        let mut running = lanes.values().filter(|l| l.running.is_some()).count();
        for (tp, lane) in lanes.iter_mut() {
            if running >= self.concurrency {
                break;
            }
            if lane.running.is_some() || lane.halted.is_some() || lane.dlq_in_flight {
                continue;
            }
            let attempts = match lane.retry.take() {
                Some((a, due)) if now >= due => vec![a],
                Some(waiting) => {
                    lane.retry = Some(waiting);
                    continue;
                }
                None => self.next_batch(lane, now),
            };
            if attempts.is_empty() {
                continue;
            }
            let cancel = Cancel::default();
            lane.running = Some(cancel.clone());
            running += 1;
            let (handler, tp, epoch) = (handler.clone(), tp.clone(), lane.epoch);
            let records: Vec<ConsumerRecord> = attempts.iter().map(|a| a.record.clone()).collect();
            tasks.spawn(async move {
                let started = std::time::Instant::now();
                let outcome = handler(records, cancel).await;
                Done::Handled {
                    tp,
                    epoch,
                    attempts,
                    outcome,
                    took: started.elapsed(),
                }
            });
        }
    }

    /// The next records of an idle lane: up to `max_batch` (one while replaying a
    /// failed batch), stopping before a retry-topic record that must still wait.
    fn next_batch(&self, lane: &mut Lane, now: Instant) -> Vec<Attempt> {
        let mut batch: Vec<Attempt> = Vec::new();
        while batch.len() < self.max_batch {
            let Some(record) = lane.queue.front() else {
                break;
            };
            let solo = lane.solo_through.is_some_and(|o| record.offset <= o);
            if !solo {
                lane.solo_through = None;
            }
            if solo && !batch.is_empty() {
                break;
            }
            // A retry-topic record waits for its timestamp plus the delay.
            let delay = if self.retry_delays.is_empty() {
                None
            } else {
                hop_of(record)
                    .checked_sub(1)
                    .and_then(|i| self.retry_delays.get(i as usize))
            };
            let wait = delay.map_or(0, |d| {
                record.timestamp + i64::try_from(d.as_millis()).unwrap_or(i64::MAX) - now_ms()
            });
            if wait > 0 && !batch.is_empty() {
                break;
            }
            let Some(record) = lane.queue.pop_front() else {
                break;
            };
            let attempt = Attempt {
                record,
                attempts: 0,
                first_failure_ms: None,
                last_error: None,
                took: Duration::ZERO,
            };
            if wait > 0 {
                let wait = Duration::from_millis(wait.unsigned_abs());
                lane.retry = Some((attempt, now + wait));
                break;
            }
            batch.push(attempt);
            if solo {
                break;
            }
        }
        batch
    }

    fn update_pauses(&mut self, lanes: &mut BTreeMap<TopicPartition, Lane>) {
        let mut halted = 0;
        for (tp, lane) in lanes.iter_mut() {
            let should = lane.retry.is_some()
                || lane.halted.is_some()
                || lane.queue.len() >= self.lane_buffer;
            halted += usize::from(lane.halted.is_some());
            if should && !lane.paused {
                self.consumer.pause(std::slice::from_ref(tp));
                lane.paused = true;
            } else if !should && lane.paused {
                self.consumer.resume(std::slice::from_ref(tp));
                lane.paused = false;
            }
        }
        if halted > 0 {
            self.metric(Metric::Halted { partitions: halted });
        }
    }

    fn on_done(
        &mut self,
        done: Done,
        lanes: &mut BTreeMap<TopicPartition, Lane>,
        tasks: &mut JoinSet<Done>,
        stats: &mut Stats,
        jitter: &mut u64,
    ) {
        match done {
            Done::Handled {
                tp,
                epoch,
                mut attempts,
                outcome,
                took,
            } => {
                let Some(lane) = lanes.get_mut(&tp).filter(|l| l.epoch == epoch) else {
                    return; // revoked or lost meanwhile
                };
                let was_cancelled = lane.running.take().is_some_and(|c| c.is_cancelled());
                let Outcome {
                    result,
                    stopped_after,
                    panicked,
                    durations,
                } = outcome;
                stats.panics += u64::from(panicked);
                let n = attempts.len();
                let (handled, error) = match result {
                    Ok(()) => (stopped_after.unwrap_or(n).min(n), None),
                    Err(BatchError {
                        index: Some(i),
                        error,
                    }) if i < n => (i, Some(error)),
                    Err(BatchError { error, .. }) if n == 1 => (0, Some(error)),
                    Err(BatchError { error, .. }) => {
                        // No record named: replay the batch one record at a time.
                        let class = self
                            .classifier
                            .classify(&error)
                            .unwrap_or(ErrorClass::Transient);
                        self.metric(Metric::Error {
                            error_type: error.kind.clone(),
                            class,
                        });
                        let (first, last) = (
                            attempts.first().map(|a| a.record.offset),
                            attempts.last().map(|a| a.record.offset),
                        );
                        warn!(
                            consumer_group = %self.group, topic = %tp.topic, partition = tp.partition,
                            first_offset = first, last_offset = last, error_type = %error.kind,
                            error = %error.message, "batch failed without naming a record; replaying it one record at a time"
                        );
                        lane.solo_through = last;
                        for a in attempts.into_iter().rev() {
                            lane.queue.push_front(a.record);
                        }
                        return;
                    }
                };
                // Stopped on cancellation: the record is neither done nor failed, and
                // comes again (for the next owner, as the lane is being given up).
                let (error, stopped) = match error {
                    Some(e) if e.disposition == Disposition::Cancelled && was_cancelled => {
                        (None, true)
                    }
                    Some(e) if e.disposition == Disposition::Cancelled => {
                        let e = ProcessError::transient(
                            "Cancelled",
                            "the handler reported a cancellation nobody asked for",
                        );
                        (Some(e), false)
                    }
                    e => (e, false),
                };
                if stopped {
                    stats.cancelled += 1;
                }
                // Skipped: done, as far as commits go; counted apart.
                let (error, handled) = match error {
                    Some(e) if e.disposition == Disposition::Skipped && handled < n => {
                        if let Some(a) = attempts.get(handled) {
                            lane.tracker.finish(a.record.offset);
                            info!(
                                consumer_group = %self.group, topic = %tp.topic, partition = tp.partition,
                                offset = a.record.offset, error_type = %e.kind, error = %e.message,
                                "record skipped"
                            );
                        }
                        stats.skipped += 1;
                        self.metric(Metric::Skipped {
                            error_type: e.kind.clone(),
                        });
                        // The record is finished: only those after it come again.
                        let mut after = attempts.split_off(handled + 1);
                        attempts.truncate(handled);
                        for a in after.drain(..).rev() {
                            lane.queue.push_front(a.record);
                        }
                        (None, handled)
                    }
                    e => (e, handled),
                };
                let rest = attempts.split_off(handled);
                let took_of = |i: usize| durations.get(i).copied().unwrap_or(took);
                for (i, a) in attempts.into_iter().enumerate() {
                    lane.tracker.finish(a.record.offset);
                    stats.succeeded += 1;
                    self.metric(Metric::Processed {
                        success: true,
                        duration: took_of(i),
                    });
                }
                let mut rest = rest.into_iter();
                let Some(error) = error else {
                    // Stopped early: the records not reached come again.
                    for a in rest.rev() {
                        lane.queue.push_front(a.record);
                    }
                    return;
                };
                let Some(mut attempt) = rest.next() else {
                    return;
                };
                // The records after the failing one come again, after it.
                for a in rest.rev() {
                    lane.queue.push_front(a.record);
                }
                attempt.attempts += 1;
                attempt.took = took_of(handled);
                self.on_failure(&tp, lane, attempt, error, tasks, stats, jitter);
            }
            Done::DeadLettered {
                tp,
                epoch,
                attempt,
                class,
                to,
                result,
            } => {
                let Some(lane) = lanes.get_mut(&tp).filter(|l| l.epoch == epoch) else {
                    return;
                };
                lane.dlq_in_flight = false;
                if let (Some(hop), Ok(())) = (to, &result) {
                    info!(
                        consumer_group = %self.group, topic = %tp.topic, partition = tp.partition,
                        offset = attempt.record.offset, hop, "record sent to a retry topic"
                    );
                    lane.tracker.finish(attempt.record.offset);
                    lane.halted = None;
                    stats.forwarded += 1;
                    self.metric(Metric::RetryTopic {
                        partition: tp.clone(),
                        offset: attempt.record.offset,
                        hop,
                    });
                    return;
                }
                lane.halted_hop = to;
                let error_type = attempt
                    .last_error
                    .as_ref()
                    .map(|e| e.kind.clone())
                    .unwrap_or_default();
                match result {
                    Ok(()) => {
                        info!(
                            consumer_group = %self.group, topic = %tp.topic, partition = tp.partition,
                            offset = attempt.record.offset, error_type = %error_type, error_classification = class.label(),
                            "record dead-lettered"
                        );
                        lane.tracker.finish(attempt.record.offset);
                        lane.halted = None;
                        stats.dead_lettered += 1;
                        self.metric(Metric::DeadLettered {
                            partition: tp.clone(),
                            offset: attempt.record.offset,
                            error_type,
                            class,
                        });
                        self.metric(Metric::Processed {
                            success: false,
                            duration: attempt.took,
                        });
                    }
                    Err(e) => {
                        stats.dlq_failures += 1;
                        let failures = lane.halted.as_ref().map_or(0, |h| h.3) + 1;
                        let delay = Duration::from_millis(100 * 2u64.pow(failures.min(6)));
                        error!(
                            topic = %tp.topic, partition = tp.partition, offset = attempt.record.offset, error = %e,
                            retry_in_ms = delay.as_millis() as u64,
                            "dead-letter write failed; the partition is halted and nothing is committed past this record"
                        );
                        lane.halted = Some((*attempt, class, Instant::now() + delay, failures));
                    }
                }
            }
        }
    }

    /// A record's attempt failed: retry it, send it on to a retry topic, or
    /// dead-letter it, by its class and the policy.
    #[allow(clippy::too_many_arguments)]
    fn on_failure(
        &self,
        tp: &TopicPartition,
        lane: &mut Lane,
        mut attempt: Attempt,
        error: ProcessError,
        tasks: &mut JoinSet<Done>,
        stats: &mut Stats,
        jitter: &mut u64,
    ) {
        let offset = attempt.record.offset;
        let class = self.classifier.classify(&error);
        let shown = class.unwrap_or(ErrorClass::Transient);
        self.metric(Metric::Error {
            error_type: error.kind.clone(),
            class: shown,
        });
        attempt.first_failure_ms.get_or_insert_with(now_ms);
        attempt.last_error = Some(error.clone());
        let retry = attempt.attempts - 1;
        match self.policy.backoff_for_error(&error, class) {
            Some(b) if retry < b.max_retries => {
                let delay = b.delay(retry, Self::next_jitter(jitter));
                warn!(
                    consumer_group = %self.group, topic = %tp.topic, partition = tp.partition, offset,
                    retry_count = retry + 1, error_type = %error.kind, error_classification = shown.label(),
                    backoff_delay_ms = delay.as_millis() as u64, error = %error.message,
                    "handler failed; retrying"
                );
                stats.retries += 1;
                self.metric(Metric::Retry {
                    attempt: retry + 1,
                    delay,
                });
                lane.retry = Some((attempt, Instant::now() + delay));
            }
            Some(_) => {
                error!(
                    consumer_group = %self.group, topic = %tp.topic, partition = tp.partition, offset,
                    retry_count = retry, error_type = %error.kind, error_classification = shown.label(),
                    "retries exhausted; forwarding"
                );
                let hop = hop_of(&attempt.record);
                let next = (hop as usize) < self.retry_delays.len();
                let to = next.then_some(hop + 1);
                self.dead_letter(tp, lane, attempt, ErrorClass::Transient, to, tasks);
            }
            None => {
                warn!(
                    consumer_group = %self.group, topic = %tp.topic, partition = tp.partition, offset,
                    error_type = %error.kind, error_classification = "non-retryable", error = %error.message,
                    "permanent error; dead-lettering at once"
                );
                self.dead_letter(tp, lane, attempt, ErrorClass::Permanent, None, tasks);
            }
        }
    }

    fn retry_dlq(
        &self,
        lanes: &mut BTreeMap<TopicPartition, Lane>,
        tasks: &mut JoinSet<Done>,
        now: Instant,
    ) {
        for (tp, lane) in lanes.iter_mut() {
            let due = lane.halted.as_ref().is_some_and(|h| now >= h.2) && !lane.dlq_in_flight;
            if due {
                if let Some((attempt, class, _, failures)) = lane.halted.clone() {
                    lane.halted = Some((
                        attempt.clone(),
                        class,
                        now + Duration::from_secs(3600),
                        failures,
                    ));
                    let to = lane.halted_hop;
                    self.dead_letter(tp, lane, attempt, class, to, tasks);
                }
            }
        }
    }

    /// Sends a record on: to retry topic `to` (a hop), or to the dead-letter topic.
    fn dead_letter(
        &self,
        tp: &TopicPartition,
        lane: &mut Lane,
        attempt: Attempt,
        class: ErrorClass,
        to: Option<u32>,
        tasks: &mut JoinSet<Done>,
    ) {
        let record = &attempt.record;
        let (origin_topic, origin_partition, origin_offset) = origin_of(record);
        if let Some(delay) = to.and_then(|h| self.retry_delays.get(h as usize - 1)) {
            let mut out = ProducerRecord::new(retry_topic(&origin_topic, *delay));
            out.key = record.key.clone();
            out.value = record.value.clone();
            out.headers = record
                .headers
                .iter()
                .filter(|(k, _)| !k.starts_with(b"ottla.retry."))
                .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone()))
                .collect();
            for (k, v) in [
                (RETRY_HOP, to.unwrap_or(1).to_string()),
                (RETRY_TOPIC, origin_topic.clone()),
                (RETRY_PARTITION, origin_partition.to_string()),
                (RETRY_OFFSET, origin_offset.to_string()),
            ] {
                out.headers.push((k.to_string(), Some(Bytes::from(v))));
            }
            self.send_on(tp, lane, attempt, class, to, out, tasks);
            return;
        }
        let error = attempt
            .last_error
            .clone()
            .unwrap_or_else(|| ProcessError::unclassified("Unknown", ""));
        let letter = DeadLetter {
            topic: &origin_topic,
            partition: origin_partition,
            offset: origin_offset,
            timestamp: record.timestamp,
            timestamp_type: record.timestamp_type,
            group: &self.group,
            error: &error,
            class,
            attempts: attempt.attempts,
            first_failure_ms: attempt.first_failure_ms.unwrap_or_else(now_ms),
            dead_lettered_ms: now_ms(),
        };
        let topic = dlq_of(self.dlq_name.as_ref(), &self.dlq_suffix, &origin_topic);
        let out = dead_letter_record(topic, record, &letter, self.dlq_format, self.dlq_timestamp);
        self.send_on(tp, lane, attempt, class, None, out, tasks);
    }

    #[allow(clippy::too_many_arguments)]
    fn send_on(
        &self,
        tp: &TopicPartition,
        lane: &mut Lane,
        attempt: Attempt,
        class: ErrorClass,
        to: Option<u32>,
        out: ProducerRecord,
        tasks: &mut JoinSet<Done>,
    ) {
        lane.dlq_in_flight = true;
        let (producer, tp, epoch) = (self.producer.clone(), tp.clone(), lane.epoch);
        tasks.spawn(async move {
            let result = match producer.send(out).await {
                Ok(delivery) => delivery.await.map(|_| ()),
                Err(e) => Err(e),
            };
            Done::DeadLettered {
                tp,
                epoch,
                attempt: Box::new(attempt),
                class,
                to,
                result,
            }
        });
    }

    /// Commits every lane's finished prefix that moved. `false`: the commit failed.
    async fn commit(&self, lanes: &mut BTreeMap<TopicPartition, Lane>, stats: &mut Stats) -> bool {
        let offsets: Vec<(TopicPartition, i64)> = lanes
            .iter()
            .filter_map(|(tp, l)| l.tracker.pending_commit().map(|o| (tp.clone(), o)))
            .collect();
        if offsets.is_empty() {
            return true;
        }
        match self.consumer.commit_offsets(&offsets).await {
            Ok(()) => {
                stats.commits += 1;
                for (tp, o) in offsets {
                    if let Some(l) = lanes.get_mut(&tp) {
                        l.tracker.committed(o);
                    }
                    self.metric(Metric::Committed {
                        partition: tp,
                        offset: o,
                    });
                }
                true
            }
            Err(e) => {
                warn!(error = %e, ?offsets, "commit failed");
                false
            }
        }
    }

    /// Revocation (or shutdown) of `partitions`: cancel their backoff waits, signal and
    /// await their running handlers (bounded), then commit their finished prefix.
    async fn acquiesce(
        &mut self,
        lanes: &mut BTreeMap<TopicPartition, Lane>,
        tasks: &mut JoinSet<Done>,
        stats: &mut Stats,
        partitions: &[TopicPartition],
        jitter: &mut u64,
        wait: Duration,
    ) {
        self.consumer.pause(partitions);
        for tp in partitions {
            if let Some(l) = lanes.get_mut(tp) {
                l.retry = None;
                l.queue.clear();
                if let Some(c) = &l.running {
                    c.cancel();
                }
            }
        }
        let deadline = Instant::now() + wait;
        let busy = |lanes: &BTreeMap<TopicPartition, Lane>| {
            partitions.iter().any(|tp| {
                lanes
                    .get(tp)
                    .is_some_and(|l| l.running.is_some() || l.dlq_in_flight)
            })
        };
        while busy(lanes) {
            match tokio::time::timeout_at(deadline, tasks.join_next()).await {
                Ok(Some(Ok(done))) => self.on_done(done, lanes, tasks, stats, jitter),
                Ok(Some(Err(e))) => warn!(error = %e, "a processing task failed"),
                Ok(None) => break,
                Err(_) => {
                    warn!(
                        ?partitions,
                        "handlers did not finish within the acquiesce window; their records are not committed"
                    );
                    break;
                }
            }
            // A retry scheduled meanwhile is dropped: the next owner starts there.
            for tp in partitions {
                if let Some(l) = lanes.get_mut(tp) {
                    l.retry = None;
                    l.halted = None;
                }
            }
        }
        let mut only: BTreeMap<TopicPartition, Lane> = BTreeMap::new();
        for tp in partitions {
            if let Some(l) = lanes.remove(tp) {
                only.insert(tp.clone(), l);
            }
        }
        if !self.commit(&mut only, stats).await {
            warn!(
                ?partitions,
                "the finished prefix of these partitions was not committed; their next owner starts from the last committed offset and handles those records again"
            );
        }
        lanes.append(&mut only);
    }
}

/// Shared counters for tests and tools that read metrics from another task.
#[derive(Debug, Default, Clone)]
pub struct MetricsLog(Arc<Mutex<Vec<Metric>>>);

impl MetricsLog {
    /// A hook that appends to this log.
    pub fn hook(&self) -> impl Fn(Metric) + Send + Sync + 'static {
        let log = self.0.clone();
        move |m| {
            if let Ok(mut l) = log.lock() {
                l.push(m);
            }
        }
    }

    /// Everything observed so far.
    pub fn snapshot(&self) -> Vec<Metric> {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::proto::fetch::fetcher::TimestampType;

    fn record() -> ConsumerRecord {
        ConsumerRecord {
            topic: Arc::from("orders"),
            partition: 3,
            offset: 41,
            timestamp: 1_000,
            timestamp_type: TimestampType::CreateTime,
            leader_epoch: None,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"v")),
            headers: vec![(Bytes::from_static(b"trace"), None)],
        }
    }

    #[test]
    fn a_dead_letter_is_stamped_when_written_unless_asked_for_the_original_time() {
        let r = record();
        let error = ProcessError::permanent("Rejected", "bad");
        let letter = DeadLetter {
            topic: "orders",
            partition: 3,
            offset: 41,
            timestamp: r.timestamp,
            timestamp_type: r.timestamp_type,
            group: "g",
            error: &error,
            class: ErrorClass::Permanent,
            attempts: 1,
            first_failure_ms: 90_000_000,
            dead_lettered_ms: 90_000_500,
        };
        let original = |out: &ProducerRecord| {
            out.headers
                .iter()
                .find(|(k, _)| k == "ottla.dlq.original.timestamp")
                .and_then(|(_, v)| v.clone())
        };
        let format = DlqFormat::Apache;
        let out = dead_letter_record(
            "orders.dlq".into(),
            &r,
            &letter,
            format,
            DlqTimestamp::default(),
        );
        assert_eq!(
            out.timestamp,
            Some(90_000_500),
            "written now, not 89,999 s ago"
        );
        assert_eq!(original(&out).as_deref(), Some(&b"1000"[..]));
        let out = dead_letter_record(
            "orders.dlq".into(),
            &r,
            &letter,
            format,
            DlqTimestamp::Original,
        );
        assert_eq!(out.timestamp, Some(1_000));
        assert_eq!((out.key, out.value), (r.key.clone(), r.value.clone()));
    }
}
