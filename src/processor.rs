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
//!         |record, _cancel| {
//!             // The record is lent: the future takes what it needs (a shared slice).
//!             let value = record.value_bytes().unwrap_or_default();
//!             async move {
//!                 let text = std::str::from_utf8(&value).map_err(|e| ProcessError::malformed(e.to_string()))?;
//!                 println!("{text}");
//!                 Ok(())
//!             }
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
//! only then is the revocation acknowledged. The other partitions go on meanwhile.
//! Lost partitions are dropped without a commit.
//!
//! **Pauses and lag.** [`Processor::handle`] gives a [`ProcessorHandle`]: pause and
//! resume partitions (a circuit breaker, from a handler or another task) and read each
//! partition's lag.
//!
//! **Where the rules are.** Every rule above lives in the sans-IO
//! [`crate::proto::process::lanes::Lanes`] machine, tested on a virtual clock;
//! this module drives it: it runs handlers and writes as tasks, commits, and passes
//! the results, the group's events and the time back.
//!
//! **Shutdown.** When `shutdown` resolves, fetching stops, running handlers are
//! signalled and awaited, the finished prefix is committed and the member leaves the
//! group, all within [`ProcessorBuilder::shutdown_timeout`] (default 25 s).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::admin::{AdminClient, NewTopic};
use crate::config::ClientConfig;
use crate::consumer::{
    Consumer, ConsumerBuilder, ConsumerEvent, ConsumerRecord, ConsumerView, TopicPartition,
};
use crate::driver::{lock, sleep_until};
use crate::error::{Error, Result};
use crate::producer::{Producer, ProducerBuilder};
use crate::proto::group::member::check_heartbeat;
pub use crate::proto::process::classify::{
    AsGiven, BatchError, Classifier, Disposition, ErrorCause, ErrorClass, HttpClassifier,
    ProcessError,
};
pub use crate::proto::process::dlq::{DlqFormat, DlqTimestamp};
use crate::proto::process::lanes::{
    Action, Handover, Lanes, LanesConfig, Now, Outcome, Run, Ticket,
};
pub use crate::proto::process::retry::ConfigError;
pub use crate::proto::process::retry::{RetryBackoff, RetryPolicy};
use crate::telemetry::ProcessorMetrics;
use crate::trace::TraceContext;

/// The old name of [`RetryBackoff`], the processor's retry settings (renamed apart
/// from the client's own request backoff, `retry.backoff.ms`).
#[deprecated(since = "0.1.0", note = "renamed RetryBackoff")]
pub type Backoff = RetryBackoff;

/// Tells a running handler that its partition is being taken away (or the processor
/// shuts down): finish quickly and return `Ok(())` (the record is done and committed),
/// or stop and return `Err(ProcessError::cancelled())` (the record is not committed,
/// and the partition's next owner handles it again). Returning `Ok(())` without
/// finishing commits a record nobody processed.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<CancelState>);

/// A [`Cancel`]'s flag and its waiters, in one allocation: a handler call takes a
/// clone, one reference count.
#[derive(Debug, Default)]
struct CancelState {
    flag: AtomicBool,
    notify: Notify,
}

impl Cancel {
    /// Whether cancellation was requested.
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst)
    }

    /// Resolves when cancellation is requested.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.0.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    fn cancel(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }
}

pub use crate::proto::process::lanes::{Metric, Stats};

type MetricsHook = Arc<dyn Fn(Metric) + Send + Sync>;

/// Builds a [`Processor`].
pub struct ProcessorBuilder {
    consumer: ConsumerBuilder,
    producer: ProducerBuilder,
    /// The group, the retry policy, dead letters, retry topics, concurrency and
    /// commits: what the lanes take as they are (their defaults are
    /// [`LanesConfig::default`]'s).
    lanes: LanesConfig,
    topics: Vec<String>,
    acquiesce_share: f64,
    shutdown_timeout: Duration,
    processing_budget: Duration,
    metrics: Option<MetricsHook>,
    metrics_prefix: String,
    check_topics: bool,
    create_topics: Option<TopicCreation>,
}

/// How [`ProcessorBuilder::create_missing_topics`] creates the dead-letter and retry
/// topics it finds missing.
///
/// The defaults follow Spring Kafka's `@RetryableTopic` auto-creation (its
/// `TopicCreation`): one partition, and the broker's default replication factor (`-1`,
/// `default.replication.factor`; Spring's default since 3.0). One partition is enough:
/// ottla writes dead letters and retries by key through the producer's partitioner,
/// not to the source record's partition number, so any count works. Raise
/// `partitions` when a retry topic must be processed in parallel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicCreation {
    /// Partitions of each created topic (default 1).
    pub partitions: i32,
    /// Replicas of each partition; `-1` for the broker's default (the default).
    pub replication_factor: i16,
    /// Topic configs given to each created topic (`retention.ms`, ...; none by
    /// default).
    pub configs: BTreeMap<String, String>,
}

impl Default for TopicCreation {
    fn default() -> Self {
        TopicCreation {
            partitions: 1,
            replication_factor: -1,
            configs: BTreeMap::new(),
        }
    }
}

impl std::fmt::Debug for ProcessorBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessorBuilder")
            .field("lanes", &self.lanes)
            .finish_non_exhaustive()
    }
}

crate::properties::by_name_entry_points!(
    ProcessorBuilder,
    ProcessorBuilder::new("", "", Vec::<String>::new()),
    "`bootstrap.servers`, `group.id` and `ottla.topics` must be among them.",
    "`OTTLA_GROUP_ID` with prefix `OTTLA_` is `group.id`, and `OTTLA_OTTLA_CONCURRENCY` is `ottla.concurrency`"
);

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
            producer: Producer::builder(bootstrap),
            lanes: LanesConfig {
                group: group.to_string(),
                ..LanesConfig::default()
            },
            acquiesce_share: 0.5,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            processing_budget: Duration::from_secs(30),
            metrics: None,
            metrics_prefix: crate::telemetry::DEFAULT_PROCESSOR_PREFIX.to_string(),
            check_topics: true,
            create_topics: None,
        }
    }

    /// Adjusts the consumer (offset reset, fetch sizes, assignors, the group timeouts,
    /// ...). The group id and the topics are this builder's; automatic commits stay
    /// off (the Processor commits finished records itself). The group timeouts have
    /// one home, the consumer's builder: [`ProcessorBuilder::timeouts`] and
    /// `session.timeout.ms` & co. set them there, and whichever is called last wins.
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

    /// A setting by its Java or librdkafka property name, or by its `ottla.` name
    /// ([`crate::properties`] lists them all): connection settings go to the consumer
    /// and the dead-letter producer alike, consumer settings to the consumer, producer
    /// settings to the dead-letter producer. `group.id`, `ottla.topics` and the three
    /// group timeouts are the Processor's own; `enable.auto.commit` and
    /// `auto.commit.interval.ms` are ignored (the Processor commits finished records
    /// itself, see `ottla.commit.interval.ms`). Ignored keys are logged and recorded
    /// in [`ProcessorBuilder::ignored_properties`]; an unknown key or a bad value is
    /// an error naming it.
    pub fn set(mut self, key: &str, value: &str) -> Result<Self> {
        use crate::properties::{Route, Scope};
        let all = [
            Scope::Client,
            Scope::Consumer,
            Scope::Producer,
            Scope::Processor,
        ];
        match crate::properties::route(key, &all)? {
            Route::Apply(p) => match p.scope {
                Scope::Client => {
                    self.consumer = self.consumer.set(key, value)?;
                    self.producer = self.producer.set(key, value)?;
                }
                Scope::Producer => self.producer = self.producer.set(key, value)?,
                Scope::Consumer => match p.name {
                    "enable.auto.commit" | "auto.commit.interval.ms" => {
                        self.consumer = self.consumer.ignore_property(
                            key,
                            "the Processor commits finished records itself (ottla.commit.interval.ms)",
                        );
                    }
                    "group.id"
                    | "ottla.topics"
                    | "session.timeout.ms"
                    | "heartbeat.interval.ms"
                    | "max.poll.interval.ms" => {
                        self.apply(p.name, key, value)?;
                    }
                    _ => self.consumer = self.consumer.set(key, value)?,
                },
                _ => self.apply(p.name, key, value)?,
            },
            Route::Ignore(reason) => self.consumer = self.consumer.ignore_property(key, reason),
        }
        Ok(self)
    }

    /// The properties given to `set` that were ignored, with the reason, in the order
    /// first given.
    pub fn ignored_properties(&self) -> &[crate::properties::IgnoredProperty] {
        self.consumer.ignored_properties()
    }

    /// Applies a Processor property, or a consumer property the Processor keeps;
    /// `key` is the name as given (for errors).
    fn apply(
        &mut self,
        name: &'static str,
        key: &str,
        value: &str,
    ) -> std::result::Result<(), crate::properties::PropertyError> {
        use crate::properties::{flag, invalid, list, millis, number};
        let key = key.trim();
        let value = value.trim();
        let backoff = &mut self.lanes.policy.default;
        match name {
            "group.id" => {
                self.lanes.group = value.to_string();
                self.consumer = self.consumer.clone().group_id(value);
            }
            "ottla.topics" => self.topics = list(value).map(String::from).collect(),
            // The consumer's own settings (one home); checked against the retry policy
            // at build.
            "session.timeout.ms" => {
                self.consumer = self.consumer.clone().session_timeout(millis(key, value)?);
            }
            "heartbeat.interval.ms" => {
                self.consumer = self
                    .consumer
                    .clone()
                    .heartbeat_interval(millis(key, value)?);
            }
            "max.poll.interval.ms" => {
                self.consumer = self.consumer.clone().max_poll_interval(millis(key, value)?);
            }
            "ottla.concurrency" => self.lanes.concurrency = number(key, value, "a count")?,
            "ottla.commit.interval.ms" => {
                let every = millis(key, value)?;
                self.lanes.commit_interval = (!every.is_zero()).then_some(every);
            }
            "ottla.processing.budget.ms" => self.processing_budget = millis(key, value)?,
            "ottla.shutdown.timeout.ms" => self.shutdown_timeout = millis(key, value)?,
            "ottla.acquiesce.share" => {
                self.acquiesce_share = number(key, value, "a share in (0, 1]")?;
            }
            "ottla.check.topics" => self.check_topics = flag(key, value)?,
            "ottla.dlq.suffix" => self.lanes.dlq_suffix = value.to_string(),
            "ottla.retry.topics" => {
                let delays: std::result::Result<Vec<Duration>, _> =
                    list(value).map(|d| millis(key, d)).collect();
                self.lanes.retry_delays =
                    delays.map_err(|_| invalid(key, value, "comma-separated milliseconds"))?;
            }
            "ottla.max.retries" => backoff.max_retries = number(key, value, "a count")?,
            "ottla.initial.retry.delay.ms" => backoff.initial = millis(key, value)?,
            "ottla.max.retry.delay.ms" => backoff.max = millis(key, value)?,
            "ottla.retry.backoff.multiplier" => {
                backoff.multiplier = number(key, value, "a number")?;
            }
            "ottla.retry.jitter" => backoff.jitter = flag(key, value)?,
            "ottla.retry.min.delay.ms" => backoff.min_delay = millis(key, value)?,
            _ => return Err(crate::properties::not_here(key)),
        }
        Ok(())
    }

    /// The retry policy.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.lanes.policy = policy;
        self
    }

    /// Reads the retry policy from the environment variables named in
    /// [`ProcessorBuilder::new`].
    pub fn retry_policy_from_env(mut self) -> Result<Self> {
        self.lanes.policy = RetryPolicy::from_vars(|k| std::env::var(k).ok()).map_err(config)?;
        Ok(self)
    }

    /// A classifier applied to every handler error.
    pub fn classifier(mut self, c: Arc<dyn Classifier>) -> Self {
        self.lanes.classifier = c;
        self
    }

    /// The dead-letter header format (default [`DlqFormat::Apache`]).
    pub fn dlq_format(mut self, f: DlqFormat) -> Self {
        self.lanes.dlq_format = f;
        self
    }

    /// The timestamp dead-letter records carry (default [`DlqTimestamp::DeadLettered`]:
    /// when they were written, so the DLQ's retention counts from then).
    pub fn dlq_timestamp(mut self, t: DlqTimestamp) -> Self {
        self.lanes.dlq_timestamp = t;
        self
    }

    /// The dead-letter topic is the original topic plus this suffix (default `.dlq`).
    pub fn dlq_suffix(mut self, s: impl Into<String>) -> Self {
        self.lanes.dlq_suffix = s.into();
        self
    }

    /// Names the dead-letter topic of each original topic (instead of the suffix), for
    /// example `|t| t.replace(".v1", ".dlq")` for `brew.orders.v1` → `brew.orders.dlq`.
    /// The topics must exist: until they do, dead-letter writes fail and their lanes
    /// halt.
    pub fn dlq_topic(mut self, name: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        self.lanes.dlq_name = Some(Arc::new(name));
        self
    }

    /// Non-blocking retry topics, after the in-place retries: a record whose retries
    /// ran out goes to `<topic>.retry.<delay>` for each delay in turn (for example
    /// `orders.retry.30s`, then `orders.retry.5m`), and only then to the dead-letter
    /// topic. A retry topic's lane waits until the record's timestamp plus the delay,
    /// pausing only that partition. The hop and the original coordinates travel in the
    /// `ottla.retry.*` headers. The topics must exist.
    pub fn retry_topics(mut self, delays: Vec<Duration>) -> Self {
        self.lanes.retry_delays = delays;
        self
    }

    /// Lanes running at once (default 16).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.lanes.concurrency = n;
        self
    }

    /// Commit after every finished record (`None`) or on an interval (default 1 s).
    pub fn commit_interval(mut self, every: Option<Duration>) -> Self {
        self.lanes.commit_interval = every;
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
        self.consumer = self
            .consumer
            .session_timeout(session)
            .heartbeat_interval(heartbeat)
            .max_poll_interval(max_poll);
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

    /// Whether [`ProcessorBuilder::build`] checks that the dead-letter and retry topics
    /// exist (default on): a missing one is an error naming it, at startup, not a
    /// halted partition at the first failure. Off, for a dead-letter topic created
    /// later (until it exists, its writes fail and the lanes that need it halt).
    pub fn check_topics(mut self, on: bool) -> Self {
        self.check_topics = on;
        self
    }

    /// Creates the dead-letter and retry topics that the start-up check
    /// ([`ProcessorBuilder::check_topics`]) finds missing, with CreateTopics, instead of
    /// failing; see [`TopicCreation`] for the defaults (one partition, the broker's
    /// replication factor). Off by default. A topic another client created meanwhile
    /// (TOPIC_ALREADY_EXISTS) counts as created; any other refusal of the broker fails
    /// the build with that topic's [`Error::Broker`]. Turns the check on.
    pub fn create_missing_topics(mut self, creation: TopicCreation) -> Self {
        self.check_topics = true;
        self.create_topics = Some(creation);
        self
    }

    /// A hook that receives every metric observation. With the `metrics` feature the
    /// same observations also reach the `metrics` facade, named under
    /// [`ProcessorBuilder::metrics_prefix`]; the hook is for raw events.
    pub fn metrics(mut self, hook: impl Fn(Metric) + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(hook));
        self
    }

    /// The first part of the Processor's metric names (the `metrics` feature), seed
    /// 004's `{domain}.{entity}`: `orders.billing` gives `orders.billing.processed`,
    /// `orders.billing.retry.count`, ... Default `ottla.processor`. The names are in
    /// [`crate::telemetry::names`].
    pub fn metrics_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.metrics_prefix = prefix.into();
        self
    }

    /// Checks the whole configuration; the error names the setting to change.
    pub fn validate(&self) -> Result<()> {
        self.lanes.policy.validate().map_err(config)?;
        let bad = |setting: &'static str, message: String| Err(Error::Config { setting, message });
        if self.lanes.group.is_empty() {
            return bad("group.id", "give the processor's group".into());
        }
        let (session, heartbeat, max_poll) = self.consumer.group_timeouts();
        if let Err(message) = check_heartbeat(session, heartbeat) {
            return bad("heartbeat.interval.ms", message);
        }
        let window = self.lanes.policy.worst_case_total() + self.processing_budget;
        if max_poll < window {
            return bad(
                "max.poll.interval.ms",
                format!(
                    "{max_poll:?} is shorter than max_retries x max_retry_delay plus the processing budget ({window:?}); raise it to at least that",
                ),
            );
        }
        if self.lanes.concurrency == 0 {
            return bad("concurrency", "must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.acquiesce_share) || self.acquiesce_share == 0.0 {
            return bad("acquiesce_share", "must be in (0, 1]".into());
        }
        for t in &self.topics {
            let dlq = self.lanes.dlq_of(t);
            if dlq == *t || self.topics.contains(&dlq) {
                return bad(
                    "dlq_topic",
                    format!(
                        "the dead-letter topic of {t} is {dlq}, a topic this processor reads; name it apart"
                    ),
                );
            }
        }
        if self.lanes.dlq_suffix.is_empty() {
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
            topics.extend(self.lanes.retry_delays.iter().map(|d| retry_topic(t, *d)));
        }
        // The retry delays' jitter follows the client's seed (random unless set), so
        // processors that fail together do not retry together.
        let jitter_seed = self.consumer.client().jitter_seed ^ 0x9e37_79b9_7f4a_7c15;
        // The topics it writes are checked before the member joins the group: a
        // missing one fails here, without a rebalance.
        let written = self.check_topics.then(|| self.written_topics());
        let producer = self.producer.build().await?;
        if let (Some(written), Some(creation)) = (&written, &self.create_topics) {
            let client = self.consumer.client().clone();
            create_absent_topics(&producer, client, written, creation).await?;
        }
        if let Some(written) = written {
            check_topics_exist(&producer, &written).await?;
        }
        let (_, _, max_poll_interval) = self.consumer.group_timeouts();
        let consumer = self
            .consumer
            .group_id(self.lanes.group.clone())
            .topics(topics)
            .auto_commit(None)
            .manual_revocation()
            .build()
            .await?;
        let (control, controls) = mpsc::unbounded_channel();
        let telemetry = ProcessorMetrics::new(&self.metrics_prefix, &self.lanes.group);
        Ok(Processor {
            consumer,
            producer: Arc::new(producer),
            lanes: LanesConfig {
                jitter_seed,
                ..self.lanes
            },
            acquiesce: max_poll_interval.mul_f64(self.acquiesce_share),
            shutdown_timeout: self.shutdown_timeout,
            processing_budget: self.processing_budget,
            telemetry,
            metrics: self.metrics,
            control,
            controls,
            holds: Arc::default(),
            live: Arc::default(),
        })
    }
}

impl ProcessorBuilder {
    /// The dead-letter and retry topics this processor writes, with the setting that
    /// names each.
    fn written_topics(&self) -> Vec<(String, &'static str)> {
        let mut wanted: Vec<(String, &'static str)> = Vec::new();
        for t in &self.topics {
            wanted.push((self.lanes.dlq_of(t), "dlq_topic"));
            for d in &self.lanes.retry_delays {
                wanted.push((retry_topic(t, *d), "retry_topics"));
            }
        }
        wanted.sort();
        wanted.dedup();
        wanted
    }
}

/// Creates those of `wanted` the cluster does not have, then waits (up to
/// `request.timeout.ms`) until the producer's metadata shows them.
async fn create_absent_topics(
    producer: &Producer,
    client: ClientConfig,
    wanted: &[(String, &'static str)],
    creation: &TopicCreation,
) -> Result<()> {
    let names: Vec<String> = wanted.iter().map(|(t, _)| t.clone()).collect();
    let absent = producer.absent_topics(&names).await?;
    let unknown = kafka_protocol::ResponseError::UnknownTopicOrPartition.code();
    let missing: Vec<NewTopic> = absent
        .iter()
        .filter(|(_, code)| *code == unknown)
        .map(|(t, _)| NewTopic {
            name: t.clone(),
            partitions: creation.partitions,
            replication_factor: creation.replication_factor,
            configs: creation.configs.clone(),
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let timeout = client.request_timeout;
    let backoff = client.retry_backoff;
    let admin = AdminClient::new(client).await?;
    let exists = kafka_protocol::ResponseError::TopicAlreadyExists.code();
    for (topic, result) in admin.create_topics(&missing, false).await? {
        match result {
            Ok(()) => {
                info!(%topic, partitions = creation.partitions, "created a missing dead-letter or retry topic")
            }
            Err(Error::Broker { code, .. }) if code == exists => {}
            Err(e) => return Err(e),
        }
    }
    // A new topic's leaders may take a moment to show in metadata.
    let created: Vec<String> = missing.into_iter().map(|t| t.name).collect();
    let deadline = Instant::now() + timeout;
    while !producer.absent_topics(&created).await?.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(backoff).await;
    }
    Ok(())
}

/// Each of `wanted` the cluster does not have is named in an error (nothing is
/// created).
async fn check_topics_exist(producer: &Producer, wanted: &[(String, &'static str)]) -> Result<()> {
    let names: Vec<String> = wanted.iter().map(|(t, _)| t.clone()).collect();
    let absent = producer.absent_topics(&names).await?;
    let Some((topic, code)) = absent.first() else {
        return Ok(());
    };
    let setting = wanted
        .iter()
        .find(|(t, _)| t == topic)
        .map_or("dlq_topic", |(_, s)| s);
    let all: Vec<&str> = absent.iter().map(|(t, _)| t.as_str()).collect();
    let why = if *code == kafka_protocol::ResponseError::TopicAuthorizationFailed.code() {
        "this principal may not describe it (TOPIC_AUTHORIZATION_FAILED); grant DESCRIBE and WRITE on it"
    } else {
        "it does not exist; create it (one partition is enough for a dead-letter topic), let the processor create it with create_missing_topics, name another, or turn this check off with check_topics(false)"
    };
    Err(Error::Config {
        setting,
        message: format!("{topic}: {why} (missing: {})", all.join(", ")),
    })
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
    /// What the lanes need (the group, the retry policy, dead letters, ...).
    lanes: LanesConfig,
    acquiesce: Duration,
    metrics: Option<MetricsHook>,
    telemetry: ProcessorMetrics,
    shutdown_timeout: Duration,
    processing_budget: Duration,
    /// What [`ProcessorHandle`]s send; `run` takes the receiving end.
    control: mpsc::UnboundedSender<Control>,
    controls: mpsc::UnboundedReceiver<Control>,
    holds: Arc<Holds>,
    /// The run's counters as of its last turn, for [`ProcessorHandle::stats`].
    live: Arc<Mutex<Stats>>,
}

/// Controls a [`Processor`] from another task, or from inside a handler (clone it into
/// the closure): pause and resume partitions, for a circuit breaker in front of a
/// downstream that is failing, and read the lag.
///
/// ```no_run
/// # async fn demo() -> ottla::Result<()> {
/// use ottla::processor::{ProcessError, Processor};
///
/// let processor = Processor::builder("127.0.0.1:9092", "billing", ["orders"]).build().await?;
/// let breaker = processor.handle();
/// let watch = processor.handle();
/// tokio::spawn(async move {
///     loop {
///         tokio::time::sleep(std::time::Duration::from_secs(10)).await;
///         println!("lag: {:?}", watch.lag());
///     }
/// });
/// processor
///     .run(
///         move |_record, _cancel| {
///             let breaker = breaker.clone();
///             async move {
///                 let downstream_is_down = false; // ... your call here ...
///                 if downstream_is_down {
///                     // Stop calling it; something else resumes later.
///                     breaker.pause_all();
///                     return Err(ProcessError::transient("Unavailable", "downstream is down"));
///                 }
///                 Ok(())
///             }
///         },
///         tokio::time::sleep(std::time::Duration::from_secs(3600)),
///     )
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ProcessorHandle {
    control: mpsc::UnboundedSender<Control>,
    holds: Arc<Holds>,
    live: Arc<Mutex<Stats>>,
    view: ConsumerView,
}

/// The pauses asked through handles, read by [`Processor::run`]'s tasks between
/// records, so a handler that trips a breaker is the last call of its task: the
/// lanes learn of the pause through the control channel, a moment later.
#[derive(Debug, Default)]
struct Holds {
    all: AtomicBool,
    /// How many partitions are in `partitions`: the tasks' check costs one load while
    /// nothing is paused.
    some: AtomicUsize,
    partitions: Mutex<std::collections::BTreeSet<TopicPartition>>,
}

impl Holds {
    #[inline]
    fn holds(&self, topic: &str, partition: i32) -> bool {
        if self.all.load(Ordering::Acquire) {
            return true;
        }
        self.some.load(Ordering::Acquire) > 0 && self.holds_one(topic, partition)
    }

    fn holds_one(&self, topic: &str, partition: i32) -> bool {
        self.partitions.lock().is_ok_and(|p| {
            p.iter()
                .any(|tp| tp.partition == partition && tp.topic == topic)
        })
    }

    fn set(&self, partitions: Option<&[TopicPartition]>, on: bool) {
        match partitions {
            None if on => self.all.store(true, Ordering::Release),
            None => {
                self.all.store(false, Ordering::Release);
                if let Ok(mut p) = self.partitions.lock() {
                    p.clear();
                    self.some.store(0, Ordering::Release);
                }
            }
            Some(ps) => {
                if let Ok(mut p) = self.partitions.lock() {
                    for tp in ps {
                        if on {
                            p.insert(tp.clone());
                        } else {
                            p.remove(tp);
                        }
                    }
                    self.some.store(p.len(), Ordering::Release);
                }
            }
        }
    }
}

#[derive(Debug)]
enum Control {
    Pause(Option<Vec<TopicPartition>>),
    Resume(Option<Vec<TopicPartition>>),
}

impl ProcessorHandle {
    /// Pauses `partitions`: no handler call starts on them (a retry whose time comes
    /// waits too) and they are not fetched, until [`ProcessorHandle::resume`]. Calls
    /// running finish; the group membership and the commits of finished records go
    /// on. Does nothing once the processor has stopped.
    pub fn pause(&self, partitions: &[TopicPartition]) {
        self.holds.set(Some(partitions), true);
        let _ = self.control.send(Control::Pause(Some(partitions.to_vec())));
    }

    /// Pauses every partition, those assigned later included.
    pub fn pause_all(&self) {
        self.holds.set(None, true);
        let _ = self.control.send(Control::Pause(None));
    }

    /// Resumes `partitions`.
    pub fn resume(&self, partitions: &[TopicPartition]) {
        self.holds.set(Some(partitions), false);
        let _ = self
            .control
            .send(Control::Resume(Some(partitions.to_vec())));
    }

    /// Lifts every pause: [`ProcessorHandle::pause_all`]'s and each partition's.
    pub fn resume_all(&self) {
        self.holds.set(None, false);
        let _ = self.control.send(Control::Resume(None));
    }

    /// Per assigned partition, the records not yet committed: the log end (the last
    /// stable offset under `read_committed`) minus the committed offset, as
    /// `kafka-consumer-groups` reports it; before the first commit is known, the end
    /// minus the fetch position. A partition whose end is not known yet is left out.
    pub fn lag(&self) -> BTreeMap<TopicPartition, i64> {
        self.view.lag()
    }

    /// The running processor's counters (records succeeded, retried, dead-lettered,
    /// commits, ...), as of its last turn: what [`Processor::run`] returns at the end,
    /// readable while it runs, without a metrics backend. All zero before `run`
    /// starts. The `metrics` feature reports the same figures
    /// (docs/observability.md).
    pub fn stats(&self) -> Stats {
        lock(&self.live).clone()
    }
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("group", &self.lanes.group)
            .finish_non_exhaustive()
    }
}

/// One [`Processor::run`] task: the handler called on its records one after the other.
struct Chunk<'a, H> {
    handler: &'a H,
    records: &'a [ConsumerRecord],
    cancel: &'a Cancel,
    progress: &'a Progress,
    holds: &'a Holds,
    group: &'a str,
    /// The attempt the first record is on (the others are on their first).
    attempt: u32,
    budget: Duration,
    /// Whether each record's call is timed (for the hook's `Metric::Processed`).
    timed: bool,
}

/// Where [`Chunk::run`]'s quick pass stopped.
enum Pass {
    /// Every record was handled.
    Done,
    /// It stops before record `i` (cancelled, paused, or its time slice is over).
    Stopped,
    /// Record `i` is traced (or spans are on): its call goes the long way.
    Traced,
    /// Record `i`'s future is pending (it was started at this time, if timed).
    Pending(Option<std::time::Instant>),
    /// Record `i` failed, or panicked.
    Failed(std::result::Result<ProcessError, String>),
}

impl<H: Handler> Chunk<'_, H> {
    /// Calls the handler on each record in order, for up to [`RUN_SLICE`], and says how
    /// far it got. Each record finished is committable at once (`progress`).
    ///
    /// A record whose call is ready at once (a fast handler's) costs no future of its
    /// own, no timer and no span: the quick pass calls and polls the handler's futures
    /// one after the other inside one poll. The first that is pending, traced, or not
    /// done is finished the long way, with the budget's timer, its span and its trace
    /// context, and the quick pass goes on after it.
    async fn run(self) -> Outcome {
        let slice = std::time::Instant::now();
        let mut durations = Vec::new();
        // The handler's future of the record in hand, pinned here so that a pending
        // one goes on where the quick pass left it.
        let mut call = std::pin::pin!(None);
        let mut i = 0;
        loop {
            let pass = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(loop {
                    let Some(record) = self.records.get(i) else {
                        break Pass::Done;
                    };
                    if i > 0 && self.stops(i, record, slice) {
                        break Pass::Stopped;
                    }
                    if !crate::trace::untraced(record) {
                        break Pass::Traced;
                    }
                    let started = self.timed.then(std::time::Instant::now);
                    let result = match std::panic::catch_unwind(AssertUnwindSafe(|| {
                        self.handler.handle(record, self.cancel.clone())
                    })) {
                        Ok(future) => {
                            call.set(Some(future));
                            match poll_caught(call.as_mut(), cx) {
                                std::task::Poll::Pending => break Pass::Pending(started),
                                std::task::Poll::Ready(result) => result,
                            }
                        }
                        Err(payload) => Err(panic_message(payload)),
                    };
                    call.set(None);
                    if let Some(started) = started {
                        durations.push(started.elapsed());
                    }
                    match result {
                        // Finished: committable now, even if a later record hangs.
                        Ok(Ok(())) => {
                            i += 1;
                            self.progress.set(i);
                        }
                        Ok(Err(e)) => break Pass::Failed(Ok(e)),
                        Err(message) => break Pass::Failed(Err(message)),
                    }
                })
            })
            .await;
            let (result, trace) = match pass {
                Pass::Done => {
                    return Outcome {
                        durations,
                        ..Outcome::of(Ok(()))
                    };
                }
                Pass::Stopped => {
                    return Outcome {
                        stopped_after: Some(i),
                        durations,
                        ..Outcome::of(Ok(()))
                    };
                }
                Pass::Failed(result) => (result.map(Err), None),
                Pass::Pending(started) => {
                    let polled = std::future::poll_fn(|cx| poll_caught(call.as_mut(), cx));
                    let result = tokio::time::timeout(self.budget, polled)
                        .await
                        .unwrap_or_else(|_| Ok(Err(over_budget(self.budget))));
                    call.set(None);
                    if let Some(started) = started {
                        durations.push(started.elapsed());
                    }
                    (result, None)
                }
                Pass::Traced => self.traced(i, &mut durations).await,
            };
            match result {
                Ok(Ok(())) => {
                    i += 1;
                    self.progress.set(i);
                }
                Ok(Err(e)) => {
                    return Outcome {
                        durations,
                        trace,
                        ..Outcome::of(Err(BatchError::at(i, e)))
                    };
                }
                Err(message) => {
                    return Outcome {
                        durations,
                        trace,
                        ..Outcome::panic(message, Some(i))
                    };
                }
            }
        }
    }

    /// Whether to stop before record `i` (not the first): the call was cancelled, the
    /// partition paused, or the time slice is over. The clock is read after each of
    /// the first 8 records, then after every 8th: reading it costs more than a handler
    /// that only counts, and a slow handler still stops after its first record.
    #[inline]
    fn stops(&self, i: usize, record: &ConsumerRecord, slice: std::time::Instant) -> bool {
        self.cancel.is_cancelled()
            || self.progress.stopping()
            || self.holds.holds(record.topic(), record.partition())
            || ((i < 8 || i % 8 == 0) && slice.elapsed() >= RUN_SLICE)
    }

    /// Record `i`'s call in its span, with its trace context: the result, and the
    /// context its retry or dead letter carries on.
    async fn traced(
        &self,
        i: usize,
        durations: &mut Vec<Duration>,
    ) -> (
        std::result::Result<std::result::Result<(), ProcessError>, String>,
        Option<TraceContext>,
    ) {
        let Some(record) = self.records.get(i) else {
            return (Ok(Ok(())), None);
        };
        let started = self.timed.then(std::time::Instant::now);
        // The first record may be a retry; the others are first attempts.
        let attempt = if i == 0 { self.attempt } else { 1 };
        let (span, trace) = crate::trace::record_span(self.group, record, attempt);
        let result = if trace.is_none() && span.is_disabled() {
            within(
                self.budget,
                catch_call(|| self.handler.handle(record, self.cancel.clone())),
            )
            .await
        } else {
            let call = catch_call(|| {
                crate::trace::traced(
                    self.handler.handle(record, self.cancel.clone()),
                    span,
                    trace,
                )
            });
            within(self.budget, call).await
        }
        .unwrap_or_else(|| Ok(Err(over_budget(self.budget))));
        if let Some(started) = started {
            durations.push(started.elapsed());
        }
        (result, trace)
    }
}

/// Polls the future in `call`, catching a panic: `Err` carries its message. The
/// future is not polled again after it finished or panicked (the caller empties the
/// slot).
fn poll_caught<F: Future>(
    call: std::pin::Pin<&mut Option<F>>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<std::result::Result<F::Output, String>> {
    let Some(future) = call.as_pin_mut() else {
        return std::task::Poll::Ready(Err("the handler's call was polled after it ended".into()));
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
        Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
        Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
        Err(payload) => std::task::Poll::Ready(Err(panic_message(payload))),
    }
}

/// Records one [`Processor::run`] task takes from its lane at most.
const RUN_CHUNK: usize = 1024;
/// How long one [`Processor::run`] task keeps calling the handler before it reports
/// back. Each record it finishes is committable at once (its `Progress`), so a record
/// that hangs does not hold back the ones the task finished before it.
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

pub use crate::proto::process::lanes::{RETRY_HOP, retry_topic};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A record handler whose future may borrow the record it is lent, for
/// [`Processor::run_handler`]. A closure's future cannot borrow its argument (on stable
/// Rust, with `Send`); a `Handler`'s can:
///
/// ```no_run
/// use ottla::ConsumerRecord;
/// use ottla::processor::{Cancel, Handler, ProcessError};
///
/// struct Billing;
///
/// impl Handler for Billing {
///     async fn handle(&self, record: &ConsumerRecord, _cancel: Cancel) -> Result<(), ProcessError> {
///         let text = std::str::from_utf8(record.value().unwrap_or_default())
///             .map_err(|e| ProcessError::malformed(e.to_string()))?;
///         tokio::task::yield_now().await; // `text` borrows the record across the await
///         println!("{text}");
///         Ok(())
///     }
/// }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Handles one record; the record stays lent until the future finishes.
    fn handle(
        &self,
        record: &ConsumerRecord,
        cancel: Cancel,
    ) -> impl Future<Output = std::result::Result<(), ProcessError>> + Send;
}

/// Adapts a handler that takes its record by value to [`Processor::run`], which lends
/// it: each record is cloned for the handler (one reference count). For code written
/// before `run` lent the record, and for handlers that keep every record anyway.
///
/// ```no_run
/// # async fn demo(processor: ottla::processor::Processor) -> ottla::Result<()> {
/// use ottla::processor::owned;
///
/// processor
///     .run(
///         owned(|record, _cancel| async move {
///             println!("{:?}", record.value());
///             Ok(())
///         }),
///         tokio::time::sleep(std::time::Duration::from_secs(3600)),
///     )
///     .await?;
/// # Ok(()) }
/// ```
pub fn owned<H, F>(handler: H) -> impl Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static
where
    H: Fn(ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
{
    move |record, cancel| handler(record.clone(), cancel)
}

/// [`Processor::run`]'s closure as a [`Handler`].
struct Lent<H>(H);

impl<H, F> Handler for Lent<H>
where
    H: Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
    F: Future<Output = std::result::Result<(), ProcessError>> + Send + 'static,
{
    fn handle(
        &self,
        record: &ConsumerRecord,
        cancel: Cancel,
    ) -> impl Future<Output = std::result::Result<(), ProcessError>> + Send {
        (self.0)(record, cancel)
    }
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

    /// A handle to pause and resume partitions and read the lag, from another task or
    /// a handler, while [`Processor::run`] runs.
    pub fn handle(&self) -> ProcessorHandle {
        ProcessorHandle {
            control: self.control.clone(),
            holds: self.holds.clone(),
            live: self.live.clone(),
            view: self.consumer.view(),
        }
    }

    /// Hands the lanes' metrics to the hook and the `metrics` facade, and their
    /// counters to [`ProcessorHandle::stats`].
    fn report(&self, lanes: &mut Lanes) {
        while let Some(m) = lanes.poll_metric() {
            self.metric(m);
        }
        self.telemetry.publish(lanes.stats(), lanes.queued());
        lanes.stats().clone_into(&mut lock(&self.live));
    }

    fn metric(&self, m: Metric) {
        self.telemetry.observe(&m);
        if let Some(h) = &self.metrics {
            h(m);
        }
    }

    /// Runs `handler` on every record until `shutdown` resolves, then stops fetching,
    /// lets running handlers finish (within the acquiesce window), commits the finished
    /// prefix and leaves the group.
    ///
    /// The handler is lent each record (`&ConsumerRecord`) and returns a future that
    /// owns what it needs: `record.value_bytes()` (a shared slice, no copy) or
    /// `record.clone()` (one reference count) taken before `async move`. A future that
    /// borrows the record across its awaits is a [`Handler`] ([`Processor::run_handler`]).
    pub async fn run<H, F, S>(self, handler: H, shutdown: S) -> Result<Stats>
    where
        H: Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<(), ProcessError>> + Send + 'static,
        S: Future + Send,
    {
        self.run_handler(Lent(handler), shutdown).await
    }

    /// [`Processor::run`] with a [`Handler`], whose future may borrow the record for as
    /// long as it runs (an `async fn handle(&self, record: &ConsumerRecord, ..)`).
    pub async fn run_handler<H, S>(self, handler: H, shutdown: S) -> Result<Stats>
    where
        H: Handler,
        S: Future + Send,
    {
        // A task takes up to RUN_CHUNK records of its lane and calls the handler on
        // them one after the other, for up to RUN_SLICE: the cost of a task is shared
        // by the records of a fast handler, and a slow one still gets a task per record.
        let handler = Arc::new(handler);
        // Each record's own time, for the hook's `Metric::Processed`. The `metrics`
        // feature times whole calls instead (`ProcessorMetrics::handled`): two clock
        // reads per record cost more than the budget of the metrics.
        let timed = self.metrics.is_some();
        let budget = self.processing_budget;
        let holds = self.holds.clone();
        let group: Arc<str> = Arc::from(self.lanes.group.as_str());
        let call = move |records: Run, cancel: Cancel, progress: Progress, attempt: u32| {
            let handler = handler.clone();
            let holds = holds.clone();
            let group = group.clone();
            async move {
                let chunk = Chunk {
                    handler: &*handler,
                    records: &records,
                    cancel: &cancel,
                    progress: &progress,
                    holds: &holds,
                    group: &group,
                    attempt,
                    budget,
                    timed,
                };
                chunk.run().await
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
    ///         |records, _cancel| {
    ///             // Checked while the batch is lent; the future owns what it keeps.
    ///             let bad = records.iter().position(|r| r.value().is_none());
    ///             let rows = records.len();
    ///             async move {
    ///                 if let Some(i) = bad {
    ///                     return Err(BatchError::at(i, ProcessError::malformed("no value")));
    ///                 }
    ///                 // ... one bulk insert of the `rows` records ...
    ///                 let _ = rows;
    ///                 Ok(())
    ///             }
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
        H: Fn(&[ConsumerRecord], Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<(), BatchError>> + Send + 'static,
        S: Future + Send,
    {
        if max_records == 0 {
            return Err(Error::Config {
                setting: "max_records",
                message: "a batch must allow at least 1 record".into(),
            });
        }
        self.lanes.lane_buffer = self.lanes.lane_buffer.max(max_records);
        let handler = Arc::new(handler);
        let budget = self.processing_budget;
        let group: Arc<str> = Arc::from(self.lanes.group.as_str());
        let call = move |records: Run, cancel: Cancel, _: Progress, attempt: u32| {
            let handler = handler.clone();
            let group = group.clone();
            async move {
                // A record retried (or replayed) alone gets the record's span, and its
                // retries and dead letter continue its trace; a batch gets one span,
                // and a record failing in it passes its own context on.
                let (span, trace) = match &records[..] {
                    [one] => crate::trace::record_span(&group, one, attempt),
                    _ => (batch_span(&group, &records), None),
                };
                // Read only for a failing record, after the call: the records are
                // still here.
                let context_of = |index: Option<usize>| match (trace, index) {
                    (Some(t), _) => Some(t),
                    (None, Some(i)) => records.get(i).and_then(crate::proto::trace::of_record),
                    (None, None) => None,
                };
                let call =
                    catch_call(|| crate::trace::traced(handler(&records, cancel), span, trace));
                match within(budget, call).await {
                    Some(Ok(Ok(()))) => Outcome::of(Ok(())),
                    Some(Ok(Err(e))) => Outcome {
                        trace: context_of(e.index),
                        ..Outcome::of(Err(e))
                    },
                    Some(Err(message)) => Outcome {
                        trace: context_of(None),
                        ..Outcome::panic(message, None)
                    },
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
        H: Fn(Run, Cancel, Progress, u32) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
        S: Future + Send,
    {
        self.lanes.max_batch = max_batch;
        self.lanes.metrics = self.metrics.is_some() || crate::telemetry::ENABLED;
        self.lanes.processed_metrics = self.metrics.is_some();
        let mut lanes = Lanes::new(self.lanes.clone(), now());
        // Records asked for at once: a call's worth (a delivery goes to its lane as one
        // run, which a call then takes whole), and not fewer than 500.
        let poll_records = max_batch.max(500);
        let mut tasks: JoinSet<Finished> = JoinSet::new();
        // The ticket of each task, for a task that ends without a result.
        let mut tickets: HashMap<tokio::task::Id, Ticket> = HashMap::new();
        let mut calls: HashMap<Ticket, Call> = HashMap::new();
        let mut events = self.consumer.take_events();
        // Set once the run stops (shutdown, or an error): the lanes hand everything
        // over, then the member leaves by `until`.
        let mut stopped: Option<(Result<()>, Instant)> = None;
        tokio::pin!(shutdown);
        'run: loop {
            // Records finished by calls still running become committable now.
            for (ticket, call) in calls.iter_mut() {
                let done = call.progress.done();
                if done > call.seen {
                    call.seen = done;
                    lanes.progress(*ticket, done, now());
                }
            }
            while let Some(action) = lanes.poll_action() {
                match action {
                    Action::Dispatch {
                        ticket,
                        records,
                        attempt,
                        ..
                    } => {
                        let call = Call {
                            records: records.len(),
                            ..Call::default()
                        };
                        let work =
                            handler(records, call.cancel.clone(), call.progress.clone(), attempt);
                        let task = tasks.spawn(async move {
                            let started = Instant::now();
                            let outcome = work.await;
                            Finished::Handled(ticket, outcome, started.elapsed())
                        });
                        tickets.insert(task.id(), ticket);
                        calls.insert(ticket, call);
                    }
                    Action::Cancel(ticket) => {
                        if let Some(call) = calls.get(&ticket) {
                            call.cancel.cancel();
                        }
                    }
                    Action::Yield(ticket) => {
                        if let Some(call) = calls.get(&ticket) {
                            call.progress.stop();
                        }
                    }
                    Action::Produce { ticket, record, .. } => {
                        let producer = self.producer.clone();
                        let task = tasks.spawn(async move {
                            let result = match producer.send(record).await {
                                Ok(delivery) => delivery.await.map(|_| ()),
                                Err(e) => Err(e),
                            };
                            Finished::Produced(ticket, result.map_err(|e| e.to_string()))
                        });
                        tickets.insert(task.id(), ticket);
                    }
                    Action::Commit(offsets) => {
                        let ok = self.commit(&offsets).await;
                        lanes.committed(&offsets, ok, now());
                    }
                    Action::Pause(tp) => self.consumer.pause(std::slice::from_ref(&tp)),
                    Action::Resume(tp) => self.consumer.resume(std::slice::from_ref(&tp)),
                    Action::Release {
                        handover,
                        partitions,
                        offsets,
                    } => {
                        if !offsets.is_empty() {
                            let ok = self.commit(&offsets).await;
                            if !ok {
                                warn!(
                                    ?partitions,
                                    "the finished prefix of these partitions was not committed; their next owner starts from the last committed offset and handles those records again"
                                );
                            }
                            lanes.committed(&offsets, ok, now());
                        }
                        while let Some(m) = lanes.poll_metric() {
                            self.metric(m);
                        }
                        match handover {
                            Handover::Revoked { generation } => {
                                self.metric(Metric::Revoked {
                                    generation,
                                    partitions: partitions.clone(),
                                });
                                self.consumer.complete_revocation(generation, partitions);
                            }
                            Handover::Shutdown => break 'run,
                        }
                    }
                }
            }
            self.report(&mut lanes);
            let mut deadline = lanes.poll_timeout().map(Instant::from_std);
            if lanes.holding() {
                // Paused by the application: no records are asked for, so the member
                // hears that the processor is alive from here, every second.
                self.consumer.note_alive();
                let tick = Instant::now() + Duration::from_secs(1);
                deadline = Some(deadline.map_or(tick, |d| d.min(tick)));
            }
            let want_records = stopped.is_none() && lanes.wants_records();
            // Biased: group events before records, so that a generation's events are
            // seen (and reported) before any record of its new partitions; finished
            // work and due timers before more records, so a steady stream of records
            // cannot hold back commits and retries.
            let stop = tokio::select! {
                biased;
                _ = &mut shutdown, if stopped.is_none() => Some(Ok(())),
                Some(event) = events.recv() => match event {
                    ConsumerEvent::Joined { generation, member_id, leader, .. } => {
                        self.metric(Metric::Joined { generation, member_id, leader });
                        None
                    }
                    ConsumerEvent::Assigned { generation, added, .. } => {
                        self.metric(Metric::Assigned { generation, partitions: added });
                        None
                    }
                    ConsumerEvent::RevokeRequested { generation, partitions, .. } => {
                        lanes.release(partitions, Handover::Revoked { generation }, self.acquiesce, now());
                        None
                    }
                    ConsumerEvent::Lost { partitions, .. } => {
                        lanes.lose(&partitions, now());
                        None
                    }
                    ConsumerEvent::Fatal(e) => Some(Err(Error::Group(e))),
                    ConsumerEvent::GroupRetrying(error) => {
                        warn!(%error, "the group member was refused; it keeps retrying");
                        self.metric(Metric::GroupRetrying { error });
                        None
                    }
                    _ => None,
                },
                Some(control) = self.controls.recv() => {
                    match control {
                        Control::Pause(partitions) => lanes.pause(partitions.as_deref(), now()),
                        Control::Resume(partitions) => lanes.resume(partitions.as_deref(), now()),
                    }
                    None
                }
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    match done {
                        Ok((id, Finished::Handled(ticket, outcome, took))) => {
                            tickets.remove(&id);
                            if let Some(call) = calls.remove(&ticket) {
                                self.telemetry.handled(attempted(call.records, &outcome), took);
                            }
                            lanes.handled(ticket, outcome, took, now());
                        }
                        Ok((id, Finished::Produced(ticket, result))) => {
                            tickets.remove(&id);
                            lanes.produced(ticket, result, now());
                        }
                        Err(e) => {
                            // The task panicked outside the handler (a panicking Drop,
                            // the producer) or the runtime cancelled it: the lanes count
                            // a failed attempt, so its partition does not stay busy.
                            warn!(error = %e, "a processing task ended without a result");
                            if let Some(ticket) = tickets.remove(&e.id()) {
                                calls.remove(&ticket);
                                lanes.crashed(ticket, format!("the task ended without a result: {e}"), now());
                            }
                        }
                    }
                    None
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    lanes.handle_timeout(now());
                    None
                }
                batch = self.consumer.recv_batch(poll_records), if want_records => match batch {
                    Ok(records) => {
                        lanes.deliver(records, now());
                        None
                    }
                    Err(Error::Fetch(e)) => {
                        // A partition stopped (corrupt batch): nothing is committed past it.
                        error!(error = %e, "partition stopped; its records are not committed past this point");
                        None
                    }
                    // Reported through the group's event (`Metric::GroupRetrying`); the
                    // member keeps going.
                    Err(Error::GroupRetrying(_)) => None,
                    Err(e) => Some(Err(e)),
                },
            };
            if let (Some(result), None) = (stop, &stopped) {
                // Shut down within `shutdown_timeout`: the lanes hand everything over,
                // then the member leaves by `until`.
                stopped = Some((result, Instant::now() + self.shutdown_timeout));
                lanes.shutdown(self.shutdown_timeout, self.acquiesce, now());
            }
        }
        self.report(&mut lanes);
        let (result, until) =
            stopped.unwrap_or_else(|| (Ok(()), Instant::now() + self.shutdown_timeout));
        let close = match tokio::time::timeout_at(until, self.consumer.close()).await {
            Ok(close) => close,
            Err(_) => {
                warn!(timeout = ?self.shutdown_timeout, "leaving the group did not finish within the shutdown timeout");
                Ok(())
            }
        };
        result.and(close).map(|()| lanes.stats().clone())
    }

    /// Commits `offsets`; `false`: the commit failed (the lanes keep them pending).
    async fn commit(&self, offsets: &[(TopicPartition, i64)]) -> bool {
        match self.consumer.commit_offsets(offsets).await {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, ?offsets, "commit failed");
                false
            }
        }
    }
}

/// The span of one `run_batch` call.
fn batch_span(group: &str, records: &[ConsumerRecord]) -> tracing::Span {
    let first = records.first();
    tracing::debug_span!(
        target: "ottla::record",
        "ottla.process_batch",
        otel.kind = "consumer",
        group,
        topic = first.map(|r| r.topic()),
        partition = first.map(|r| r.partition()),
        first_offset = first.map(|r| r.offset()),
        records = records.len(),
    )
}

/// A handler call's cancellation and progress, held by the driver while it runs.
#[derive(Default)]
struct Call {
    cancel: Cancel,
    progress: Progress,
    /// The progress already given to the lanes.
    seen: usize,
    /// How many records it was given.
    records: usize,
}

/// How many of the `given` records a call's handler was called on (or, for a batch,
/// called with): all but those left after it stopped or failed.
fn attempted(given: usize, outcome: &Outcome) -> usize {
    match (&outcome.result, outcome.stopped_after) {
        (_, Some(stopped)) => stopped,
        (Err(e), None) => e.index.map_or(given, |i| i + 1),
        (Ok(()), None) => given,
    }
    .min(given)
}

/// How many records of its batch a [`Processor::run`] call has finished so far, and
/// whether it should stop between records (its partition was paused).
#[derive(Debug, Clone, Default)]
struct Progress(Arc<(AtomicUsize, AtomicBool)>);

impl Progress {
    fn done(&self) -> usize {
        self.0.0.load(Ordering::Acquire)
    }

    #[inline]
    fn set(&self, done: usize) {
        self.0.0.store(done, Ordering::Release);
    }

    fn stop(&self) {
        self.0.1.store(true, Ordering::Release);
    }

    #[inline]
    fn stopping(&self) -> bool {
        self.0.1.load(Ordering::Acquire)
    }
}

/// What a task reports when it ends.
enum Finished {
    Handled(Ticket, Outcome, Duration),
    Produced(Ticket, std::result::Result<(), String>),
}

/// The clock, read for the lanes.
fn now() -> Now {
    Now {
        at: Instant::now().into_std(),
        unix_ms: now_ms(),
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
#[path = "properties/processor_tests.rs"]
mod property_tests;
