//! The public consumer: a group member and a fetcher on one cluster, read as an async
//! stream of records.
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::consumer::{Consumer, OffsetReset};
//!
//! let mut consumer = Consumer::builder("127.0.0.1:9092")
//!     .group_id("orders-service")
//!     .topics(["orders"])
//!     .offset_reset(OffsetReset::Earliest)
//!     .build()
//!     .await?;
//! while let Some(record) = consumer.recv().await {
//!     let record = record?;
//!     println!("{}/{}@{}", record.topic(), record.partition(), record.offset());
//!     consumer.commit().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! ## How the pieces meet
//!
//! A background task owns the group member's handle and drives the fetcher: it sends one
//! Fetch per broker, resets positions through ListOffsets, and refreshes metadata when
//! leaders move. The application drains records straight from the fetcher's buffer, so
//! parsing happens on the application's task and no record crosses a channel.
//!
//! **Revocations.** When the group takes partitions away in an orderly way, fetching
//! them stops at once and their undelivered records are dropped. The revocation
//! completes the next time the application asks for a record: by then it has finished
//! what it was given (a consumer is read in a loop). With automatic commits on, the
//! positions of the revoked partitions are committed first. An application that stays
//! away longer than `max.poll.interval.ms` loses the partitions instead.

use std::collections::{BTreeMap, BTreeSet};
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, FetchRequest, ListOffsetsRequest};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, debug, warn};

mod events;

pub use events::ConsumerEvent;

use crate::config::ClientConfig;
pub use crate::driver::BrokerHangUp;
use crate::driver::{Cluster, GroupCommander, GroupHandle, TopicScope, lock, sleep_until};
use crate::error::{Error, Result};
pub use crate::event_queue::{CAPACITY as EVENTS_CAPACITY, Events};
use crate::proto::admin::OffsetSpec;
use crate::proto::fetch::fetcher::FetcherEvent;
pub use crate::proto::fetch::fetcher::{
    ConsumerRecord, ConsumerRecordBuilder, FetchError, Header, Headers, OffsetReset, ResetReason,
    TimestampType,
};
use crate::proto::fetch::fetcher::{Fetcher, FetcherConfig};
pub use crate::proto::fetch::request::IsolationLevel;
use crate::proto::group::assignor::{Assignor, builtin};
use crate::proto::group::codec::GROUP_APIS;
pub use crate::proto::group::consumer_protocol::TopicPartition;
pub use crate::proto::group::member::{
    CommitError, Failure, GroupConfig, GroupError, GroupProtocol, LostReason, Membership, StateKind,
};
use crate::proto::group::member::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_POLL_INTERVAL, DEFAULT_SESSION_TIMEOUT, Event,
    PendingRevocation, RevocationCommit, RevocationStep, check_heartbeat,
};
pub use crate::proto::group::messages::CommitOffset;
pub use crate::proto::metadata::NodeId;
use crate::proto::session::{
    CloseCommit, CloseStep, ConsumerSession, DEFAULT_CLOSE_TIMEOUT, SessionAction, SessionConfig,
};
use crate::stats::{ConsumerStats, DeliveryCounts, GroupCounters};

/// The partition assignors, and the trait to write one's own
/// ([`ConsumerBuilder::custom_assignors`]).
pub mod assignor {
    pub use crate::proto::group::assignor::{
        AssignError, Assignor, CooperativeStickyAssignor, MemberSubscription, PartitionRacks,
        RangeAssignor, RebalanceProtocol, RoundRobinAssignor, StickyAssignor,
    };
    pub use crate::proto::group::consumer_protocol::{Assignment, Subscription};
}

/// `auto.commit.interval.ms` when only `enable.auto.commit=true` is given (5 s, as in
/// Java and librdkafka).
const DEFAULT_AUTO_COMMIT_INTERVAL: Duration = Duration::from_secs(5);

type GroupTweak = Arc<dyn Fn(&mut GroupConfig) + Send + Sync>;

/// Builds a [`Consumer`]. Settings carry the Java client's names and defaults.
#[derive(Clone)]
pub struct ConsumerBuilder {
    client: ClientConfig,
    group_id: Option<String>,
    topics: Vec<String>,
    assign: Vec<TopicPartition>,
    fetcher: FetcherConfig,
    session_timeout: Duration,
    heartbeat_interval: Duration,
    max_poll_interval: Duration,
    assignors: Vec<Arc<dyn Assignor>>,
    instance_id: Option<String>,
    group_protocol: GroupProtocol,
    remote_assignor: Option<String>,
    topic_regex: Option<String>,
    auto_commit: Option<Duration>,
    manual_revocation: bool,
    tweak_group: Option<GroupTweak>,
    /// `auto.commit.interval.ms`, kept apart so that it survives
    /// `enable.auto.commit=false` and applies whatever order the two come in.
    auto_commit_interval: Duration,
}

impl std::fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("client", &self.client)
            .field("group_id", &self.group_id)
            .field("topics", &self.topics)
            .field("assign", &self.assign)
            .field("fetcher", &self.fetcher)
            .finish_non_exhaustive()
    }
}

crate::properties::by_name_entry_points!(
    ConsumerBuilder,
    ConsumerBuilder::new(""),
    "`bootstrap.servers` must be among them, and `group.id` with `ottla.topics` for a group consumer.",
    "`OTTLA_SESSION_TIMEOUT_MS` with prefix `OTTLA_` is `session.timeout.ms`"
);

impl ConsumerBuilder {
    /// A builder for the given bootstrap servers (comma-separated `host:port`).
    pub fn new(bootstrap_servers: &str) -> Self {
        let assignors: Vec<Arc<dyn Assignor>> = builtin("cooperative-sticky")
            .map(Arc::from)
            .into_iter()
            .collect();
        Self {
            client: ClientConfig::new(bootstrap_servers),
            group_id: None,
            topics: Vec::new(),
            assign: Vec::new(),
            fetcher: FetcherConfig::default(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            max_poll_interval: DEFAULT_MAX_POLL_INTERVAL,
            assignors,
            instance_id: None,
            group_protocol: GroupProtocol::Classic,
            remote_assignor: None,
            topic_regex: None,
            auto_commit: None,
            manual_revocation: false,
            tweak_group: None,
            auto_commit_interval: DEFAULT_AUTO_COMMIT_INTERVAL,
        }
    }

    /// The client configuration so far.
    pub(crate) fn client(&self) -> &ClientConfig {
        &self.client
    }

    /// Replaces the connection settings (bootstrap servers included).
    pub fn client_config(mut self, config: ClientConfig) -> Self {
        self.client = config;
        self
    }

    /// `security.protocol`: TLS, SASL or both on every connection.
    pub fn security_protocol(mut self, protocol: crate::security::SecurityProtocol) -> Self {
        self.client.security_protocol = protocol;
        self
    }

    /// The TLS settings (with `SSL` and `SASL_SSL`).
    pub fn tls(mut self, tls: crate::security::TlsConfig) -> Self {
        self.client.tls = tls;
        self
    }

    /// The SASL settings (with `SASL_PLAINTEXT` and `SASL_SSL`).
    pub fn sasl(mut self, sasl: crate::security::SaslConfig) -> Self {
        self.client.sasl = Some(sasl);
        self
    }

    /// A setting by its Java or librdkafka property name ([`crate::properties`] lists
    /// them): the consumer's own (`group.id`, `session.timeout.ms`,
    /// `partition.assignment.strategy`, ...) and the connection settings of
    /// [`ClientConfig::set`]. A producer or Processor setting, or a Java or librdkafka
    /// property that means nothing to ottla, is logged and recorded in
    /// [`ConsumerBuilder::ignored_properties`]. An unknown key or a bad value is an
    /// error naming it.
    pub fn set(mut self, key: &str, value: &str) -> crate::Result<Self> {
        use crate::properties::{Route, Scope};
        match crate::properties::route(key, &[Scope::Client, Scope::Consumer])? {
            Route::Apply(p) if p.scope == Scope::Client => self.client.apply(p, key, value)?,
            Route::Apply(p) => self.apply(p.name, key, value)?,
            Route::Ignore(reason) => self.client.ignore(key, reason),
        }
        Ok(self)
    }

    /// The properties given to `set` that were ignored, with the reason, in the order
    /// first given.
    pub fn ignored_properties(&self) -> &[crate::properties::IgnoredProperty] {
        self.client.ignored_properties()
    }

    /// Records `key` as ignored (the Processor's own overrides).
    pub(crate) fn ignore_property(mut self, key: &str, reason: &'static str) -> Self {
        self.client.ignore(key, reason);
        self
    }

    /// Applies a consumer property; `key` is the name as given (for errors).
    fn apply(
        &mut self,
        name: &'static str,
        key: &str,
        value: &str,
    ) -> std::result::Result<(), crate::properties::PropertyError> {
        use crate::properties::{fetch_bytes, flag, invalid, kibibytes, list, millis};
        let key = key.trim();
        let value = value.trim();
        let text = || (!value.is_empty()).then(|| value.to_string());
        match name {
            "group.id" => self.group_id = text(),
            "group.instance.id" => self.instance_id = text(),
            "group.protocol" => {
                self.group_protocol = value.parse().map_err(|m: String| invalid(key, value, m))?;
            }
            "group.remote.assignor" => self.remote_assignor = text(),
            "session.timeout.ms" => self.session_timeout = millis(key, value)?,
            "heartbeat.interval.ms" => self.heartbeat_interval = millis(key, value)?,
            "max.poll.interval.ms" => self.max_poll_interval = millis(key, value)?,
            "auto.offset.reset" => {
                self.fetcher.reset = match value.to_ascii_lowercase().as_str() {
                    "earliest" | "smallest" | "beginning" => OffsetReset::Earliest,
                    "latest" | "largest" | "end" => OffsetReset::Latest,
                    "none" | "error" => OffsetReset::None,
                    _ => {
                        return Err(invalid(
                            key,
                            value,
                            "earliest (smallest, beginning), latest (largest, end) or none (error)",
                        ));
                    }
                };
            }
            "enable.auto.commit" => {
                let interval = self.auto_commit.unwrap_or(self.auto_commit_interval);
                self.auto_commit = flag(key, value)?.then_some(interval);
            }
            "auto.commit.interval.ms" => {
                self.auto_commit_interval = millis(key, value)?;
                if self.auto_commit.is_some() {
                    self.auto_commit = Some(self.auto_commit_interval);
                }
            }
            "partition.assignment.strategy" => {
                let mut assignors: Vec<Arc<dyn Assignor>> = Vec::new();
                for word in list(value) {
                    let short = word.rsplit('.').next().unwrap_or(word);
                    let name = match short {
                        "RangeAssignor" => "range",
                        "RoundRobinAssignor" => "roundrobin",
                        "StickyAssignor" => "sticky",
                        "CooperativeStickyAssignor" => "cooperative-sticky",
                        other => other,
                    };
                    let Some(assignor) = builtin(name) else {
                        return Err(invalid(
                            key,
                            value,
                            format!(
                                "{word:?} is not a built-in assignor: range, roundrobin, sticky, cooperative-sticky, or their Java classes (org.apache.kafka.clients.consumer.CooperativeStickyAssignor, ...)"
                            ),
                        ));
                    };
                    assignors.push(Arc::from(assignor));
                }
                if assignors.is_empty() {
                    return Err(invalid(key, value, "at least one assignor"));
                }
                self.assignors = assignors;
            }
            "isolation.level" => {
                self.fetcher.params.isolation = match value.to_ascii_lowercase().as_str() {
                    "read_uncommitted" => IsolationLevel::ReadUncommitted,
                    "read_committed" => IsolationLevel::ReadCommitted,
                    _ => return Err(invalid(key, value, "read_uncommitted or read_committed")),
                };
            }
            "fetch.min.bytes" => self.fetcher.params.min_bytes = fetch_bytes(key, value)?,
            "fetch.max.wait.ms" => {
                self.fetcher.params.max_wait_ms = i32::try_from(millis(key, value)?.as_millis())
                    .map_err(|_| invalid(key, value, "at most 2147483647 milliseconds"))?;
            }
            "fetch.max.bytes" => self.fetcher.params.max_bytes = fetch_bytes(key, value)?,
            "max.partition.fetch.bytes" => {
                self.fetcher.partition_max_bytes = fetch_bytes(key, value)?;
            }
            "queued.max.messages.kbytes" => {
                self.fetcher.buffer_max_bytes = kibibytes(key, value)?;
            }
            "check.crcs" => self.fetcher.batch.check_crcs = flag(key, value)?,
            "ottla.topics" => self.topics = list(value).map(String::from).collect(),
            "ottla.topic.regex" => self.topic_regex = text(),
            "ottla.fetch.sessions" => self.fetcher.sessions = flag(key, value)?,
            _ => return Err(crate::properties::not_here(key)),
        }
        Ok(())
    }

    /// `group.protocol` (default `classic`): [`GroupProtocol::Consumer`] speaks KIP-848's
    /// consumer group protocol (Kafka 4.0+), where the broker assigns and a rebalance
    /// moves only the partitions that change owner. On a broker without it the consumer
    /// fails with an error naming this setting. The assignors
    /// ([`ConsumerBuilder::assignors`]) and `heartbeat.interval.ms` are the classic
    /// protocol's; the broker sets them for the consumer protocol. `session.timeout.ms`
    /// is not sent either, but the member reads it as the broker's
    /// `group.consumer.session.timeout.ms`: after that long with no heartbeat accepted
    /// it gives its partitions up and rejoins (no zombie behind a silent coordinator).
    pub fn group_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.group_protocol = protocol;
        self
    }

    /// Subscribes to every topic whose name the broker matches against `pattern`
    /// (consumer protocol only: KIP-848's `SubscribedTopicRegex`, evaluated by the
    /// broker, RE2J syntax on Kafka), now and as topics are created; with
    /// [`ConsumerBuilder::topics`], to those as well. Java's `subscribe(SubscriptionPattern)`.
    pub fn topic_regex(mut self, pattern: impl Into<String>) -> Self {
        self.topic_regex = Some(pattern.into());
        self
    }

    /// `group.remote.assignor` (consumer protocol): the broker-side assignor, `uniform`
    /// or `range` on Kafka; unset, the broker's default.
    pub fn group_remote_assignor(mut self, name: impl Into<String>) -> Self {
        self.remote_assignor = Some(name.into());
        self
    }

    /// `client.id`.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client.client_id = id.into();
        self
    }

    /// `metadata.max.age.ms` (default 5 min): a group leader refreshes metadata at
    /// least this often, and rebalances when a subscribed topic gained partitions or
    /// was deleted since it assigned.
    pub fn metadata_max_age(mut self, age: Duration) -> Self {
        self.client.metadata_max_age = age;
        self
    }

    /// `client.rack`: the rack this consumer runs in. Rack-aware assignors (`range`,
    /// `sticky`, `cooperative-sticky`; KIP-881) then give it partitions with a replica
    /// in its rack when balance allows.
    pub fn client_rack(mut self, rack: impl Into<String>) -> Self {
        self.client.client_rack = Some(rack.into());
        self
    }

    /// `group.id`: consume as a member of this group.
    pub fn group_id(mut self, id: impl Into<String>) -> Self {
        self.group_id = Some(id.into());
        self
    }

    /// The topics to subscribe to (with a group).
    pub fn topics<I, S>(mut self, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.topics = topics.into_iter().map(Into::into).collect();
        self
    }

    /// Manual assignment: read these partitions without a group, starting from
    /// `auto.offset.reset` (or a [`Consumer::seek`]).
    pub fn assign(mut self, partitions: impl IntoIterator<Item = TopicPartition>) -> Self {
        self.assign = partitions.into_iter().collect();
        self
    }

    /// `auto.offset.reset` (default latest).
    pub fn offset_reset(mut self, reset: OffsetReset) -> Self {
        self.fetcher.reset = reset;
        self
    }

    /// `session.timeout.ms` (default 45 s). Under `group.protocol=consumer` it is not
    /// sent: set it to the broker's `group.consumer.session.timeout.ms`, which bounds
    /// how long the member keeps its partitions without a heartbeat accepted.
    pub fn session_timeout(mut self, t: Duration) -> Self {
        self.session_timeout = t;
        self
    }

    /// `session.timeout.ms`, `heartbeat.interval.ms` and `max.poll.interval.ms` as set.
    pub(crate) fn group_timeouts(&self) -> (Duration, Duration, Duration) {
        (
            self.session_timeout,
            self.heartbeat_interval,
            self.max_poll_interval,
        )
    }

    /// `heartbeat.interval.ms` (default 3 s).
    pub fn heartbeat_interval(mut self, t: Duration) -> Self {
        self.heartbeat_interval = t;
        self
    }

    /// `max.poll.interval.ms`, also the rebalance timeout (default 300 s).
    pub fn max_poll_interval(mut self, t: Duration) -> Self {
        self.max_poll_interval = t;
        self
    }

    /// `partition.assignment.strategy` by name, in preference order: `range`,
    /// `roundrobin`, `sticky`, `cooperative-sticky` (the default).
    pub fn assignors<I, S>(mut self, names: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out: Vec<Arc<dyn Assignor>> = Vec::new();
        for name in names {
            let name = name.as_ref();
            match builtin(name) {
                Some(a) => out.push(Arc::from(a)),
                None => {
                    return Err(Error::Config {
                        setting: "partition.assignment.strategy",
                        message: format!(
                            "unknown assignor {name:?} (range, roundrobin, sticky, cooperative-sticky)"
                        ),
                    });
                }
            }
        }
        self.assignors = out;
        Ok(self)
    }

    /// Custom assignors, in preference order.
    pub fn custom_assignors(mut self, assignors: Vec<Arc<dyn Assignor>>) -> Self {
        self.assignors = assignors;
        self
    }

    /// `group.instance.id`: static membership (KIP-345).
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// `isolation.level` (default read_uncommitted).
    pub fn isolation(mut self, isolation: IsolationLevel) -> Self {
        self.fetcher.params.isolation = isolation;
        self
    }

    /// `fetch.min.bytes` (default 1).
    pub fn fetch_min_bytes(mut self, bytes: i32) -> Self {
        self.fetcher.params.min_bytes = bytes;
        self
    }

    /// `fetch.max.wait.ms` (default 500 ms).
    pub fn fetch_max_wait(mut self, t: Duration) -> Self {
        self.fetcher.params.max_wait_ms = i32::try_from(t.as_millis()).unwrap_or(i32::MAX);
        self
    }

    /// `fetch.max.bytes` (default 50 MiB).
    pub fn fetch_max_bytes(mut self, bytes: i32) -> Self {
        self.fetcher.params.max_bytes = bytes;
        self
    }

    /// `max.partition.fetch.bytes` (default 1 MiB).
    pub fn max_partition_fetch_bytes(mut self, bytes: i32) -> Self {
        self.fetcher.partition_max_bytes = bytes;
        self
    }

    /// The cap on fetched bytes not yet delivered, across partitions (default 64 MiB).
    pub fn buffer_max_bytes(mut self, bytes: usize) -> Self {
        self.fetcher.buffer_max_bytes = bytes;
        self
    }

    /// `check.crcs` (default on).
    pub fn check_crcs(mut self, on: bool) -> Self {
        self.fetcher.batch.check_crcs = on;
        self
    }

    /// Incremental fetch sessions (KIP-227) where the broker offers them (default on).
    pub fn fetch_sessions(mut self, on: bool) -> Self {
        self.fetcher.sessions = on;
        self
    }

    /// `enable.auto.commit` with `auto.commit.interval.ms` (default off). Commits the
    /// positions the application has come back from, on the interval, before a
    /// revocation completes, and on close.
    pub fn auto_commit(mut self, interval: Option<Duration>) -> Self {
        self.auto_commit = interval;
        self
    }

    /// Revocations complete only through [`Consumer::complete_revocation`], not on the
    /// next `recv`: for applications that process records concurrently and must finish
    /// or stop that work first (the `Processor` does).
    pub fn manual_revocation(mut self) -> Self {
        self.manual_revocation = true;
        self
    }

    /// Adjusts the group member's remaining settings (backoffs, jitter seed,
    /// `leader_sync_delay`) after the builder has filled in its own.
    pub fn tweak_group(mut self, f: impl Fn(&mut GroupConfig) + Send + Sync + 'static) -> Self {
        self.tweak_group = Some(Arc::new(f));
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |setting, message: &str| {
            Err(Error::Config {
                setting,
                message: message.to_string(),
            })
        };
        match (&self.group_id, self.assign.is_empty()) {
            (Some(_), true) if self.topics.is_empty() && self.topic_regex.is_none() => {
                return bad("topics", "a group consumer needs at least one topic");
            }
            (Some(_), false) => {
                return bad(
                    "assign",
                    "use either a group with topics or a manual assignment",
                );
            }
            (None, true) => return bad("group.id", "give a group id, or assign partitions"),
            _ => {}
        }
        if self.topic_regex.is_some() && self.group_protocol != GroupProtocol::Consumer {
            return bad(
                "group.protocol",
                "a topic regex is evaluated by the broker: it needs group.protocol=consumer",
            );
        }
        if self.group_id.is_none() && self.auto_commit.is_some() {
            return bad("enable.auto.commit", "needs a group id");
        }
        if let Err(message) = check_heartbeat(self.session_timeout, self.heartbeat_interval) {
            return Err(Error::Config {
                setting: "heartbeat.interval.ms",
                message,
            });
        }
        if self.assignors.is_empty() {
            return bad(
                "partition.assignment.strategy",
                "give at least one assignor",
            );
        }
        if self.fetcher.buffer_max_bytes == 0 {
            return bad("buffer_max_bytes", "must be positive");
        }
        if self.fetcher.partition_max_bytes <= 0 || self.fetcher.params.max_bytes <= 0 {
            return bad("max.partition.fetch.bytes", "fetch sizes must be positive");
        }
        Ok(())
    }

    /// Connects, starts the group member (or the manual assignment) and the fetch task.
    pub async fn build(self) -> Result<Consumer> {
        self.validate()?;
        let mut required = vec![ApiKey::Fetch, ApiKey::ListOffsets, ApiKey::Metadata];
        if self.group_id.is_some() {
            required.extend_from_slice(GROUP_APIS);
        }
        let mut topics: BTreeSet<String> = self.topics.iter().cloned().collect();
        topics.extend(self.assign.iter().map(|tp| tp.topic.clone()));
        // The broker matches the regex against every topic; the member names what it
        // assigns from metadata of them all.
        let scope = match self.topic_regex {
            Some(_) => TopicScope::All,
            None => TopicScope::Topics(topics),
        };
        let cluster = Cluster::connect(&self.client, scope, &required).await?;
        let mut fetcher = Fetcher::new(FetcherConfig {
            retry_backoff: self.client.retry_backoff,
            retry_backoff_max: self.client.retry_backoff_max,
            seed: self.client.jitter_seed ^ 0x0fe7_c4e5,
            ..self.fetcher.clone()
        });
        let mut group_config = None;
        let group = match &self.group_id {
            Some(id) => {
                let mut config =
                    GroupConfig::new(id.clone(), self.topics.clone(), self.assignors.clone());
                config.session_timeout = self.session_timeout;
                config.heartbeat_interval = self.heartbeat_interval;
                config.max_poll_interval = self.max_poll_interval;
                config.request_timeout = self.client.request_timeout;
                config.metadata_max_age = self.client.metadata_max_age;
                config.rack = self.client.client_rack.clone();
                config.instance_id = self.instance_id.clone();
                config.seed = self.client.jitter_seed;
                config.retry_backoff = self.client.retry_backoff;
                config.retry_backoff_max = self.client.retry_backoff_max;
                config.protocol = self.group_protocol;
                config.remote_assignor = self.remote_assignor.clone();
                config.topic_regex = self.topic_regex.clone();
                if let Some(f) = &self.tweak_group {
                    f(&mut config);
                }
                group_config = Some(Arc::new(config.clone()));
                Some(GroupHandle::spawn(cluster.clone(), config))
            }
            None => {
                fetcher.assign(&self.assign, false);
                None
            }
        };
        let shared = Arc::new(Shared {
            fetcher: Mutex::new(fetcher),
            waker: Mutex::new(None),
            wake_driver: Notify::new(),
            app: Mutex::new(AppState::default()),
            revoke_pending: AtomicBool::new(false),
        });
        let (commands, rx) = mpsc::unbounded_channel();
        let (events_tx, events) = crate::event_queue::channel();
        let commander = group.as_ref().map(GroupHandle::commander);
        let group_counters = group.as_ref().map(GroupHandle::counters);
        let lookup = OffsetLookup {
            cluster: cluster.clone(),
            isolation: self.fetcher.params.isolation,
            timeout: self.client.request_timeout,
            backoff: self.client.retry_backoff,
        };
        let session = SessionConfig {
            auto_commit: self.auto_commit,
            retry_backoff: self.client.retry_backoff,
            retry_backoff_max: self.client.retry_backoff_max,
            seed: self.client.jitter_seed,
            close_timeout: group_config
                .as_ref()
                .map_or(DEFAULT_CLOSE_TIMEOUT, |c| c.close_timeout),
        };
        let task = tokio::spawn(drive(Driver {
            cluster,
            shared: shared.clone(),
            group,
            commander: commander.clone(),
            commands: rx,
            events: events_tx,
            session: ConsumerSession::new(&session, Instant::now().into_std()),
            group_config,
            revoke_requested_at: None,
            revocation: PendingRevocation::default(),
        }));
        Ok(Consumer {
            shared,
            commands,
            events,
            group: commander,
            auto_commit: self.auto_commit.is_some(),
            manual_revocation: self.manual_revocation,
            next_progress: Instant::now(),
            session,
            lookup,
            delivered: DeliveryCounts::new(self.group_id.as_deref()),
            group_counters,
            task: Some(task),
        })
    }
}

/// State shared by the application side and the background task.
#[derive(Debug)]
struct Shared {
    fetcher: Mutex<Fetcher>,
    /// The application task waiting for records.
    waker: Mutex<Option<Waker>>,
    /// Buffer room freed, or a pause lifted: the task may fetch again.
    wake_driver: Notify,
    app: Mutex<AppState>,
    /// Set after `AppState::revoking` is: a poll reads the flag, not the lock.
    revoke_pending: AtomicBool,
}

#[derive(Debug, Default)]
struct AppState {
    /// A revocation waiting for the application to come back for records.
    revoking: Option<(i32, Vec<TopicPartition>)>,
    /// The group failed for good.
    fatal: Option<Error>,
    /// A TLS or authentication failure not yet reported to the application.
    security: Option<Error>,
    /// A group error the member keeps retrying through ([`Error::GroupRetrying`]), not
    /// yet reported to the application; a newer one replaces it.
    group_retrying: Option<Error>,
    /// The task has stopped.
    stopped: bool,
    /// Last known committed offsets.
    committed: BTreeMap<TopicPartition, (i64, u64)>,
    /// Commits are numbered when started; the cache keeps the latest started one
    /// that succeeded, whatever order the results are read in.
    commit_ticket: u64,
}

impl Shared {
    fn wake_app(&self) {
        if let Some(w) = lock(&self.waker).take() {
            w.wake();
        }
    }
}

enum Command {
    /// The application came back: the revocation of these partitions can complete.
    RevocationReady {
        generation: i32,
        partitions: Vec<TopicPartition>,
    },
    /// Leave the group (or not) and stop.
    Close(Membership, oneshot::Sender<()>),
}

/// A Kafka consumer. Read it with [`Consumer::recv`], [`Consumer::recv_batch`] or as a
/// [`futures_core::Stream`]. Dropping it stops the background task and leaves the
/// group without waiting; [`Consumer::close`] commits first (with automatic commits on)
/// and waits for the LeaveGroup.
#[derive(Debug)]
pub struct Consumer {
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    events: Events,
    group: Option<GroupCommander>,
    auto_commit: bool,
    manual_revocation: bool,
    /// When a poll next tells the group member the application is alive.
    next_progress: Instant,
    /// `retry.backoff.ms`, `retry.backoff.max.ms`, the jitter seed and the close
    /// timeout: the pace and bound of the commit at close ([`CloseCommit`]).
    session: SessionConfig,
    /// What the seeks by position and time ask ListOffsets with.
    lookup: OffsetLookup,
    /// Records and bytes of what this side hands over, per partition (and the
    /// `metrics` feature's records, bytes and lag).
    delivered: DeliveryCounts,
    /// The group member's figures (rebalances, assignment, losses, commits).
    group_counters: Option<Arc<GroupCounters>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// The cluster and settings [`Consumer::seek_to_beginning`], [`Consumer::seek_to_end`]
/// and [`Consumer::offsets_for_times`] resolve offsets with.
#[derive(Debug, Clone)]
struct OffsetLookup {
    cluster: Cluster,
    isolation: IsolationLevel,
    timeout: Duration,
    backoff: Duration,
}

/// The first offset at or after a time, with its record's timestamp
/// ([`Consumer::offsets_for_times`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetAndTimestamp {
    /// The offset.
    pub offset: i64,
    /// The timestamp of the record at `offset` (ms since the epoch), as the broker
    /// reports it.
    pub timestamp: i64,
    /// The leader epoch the broker reported (`-1` if none).
    pub leader_epoch: i32,
}

impl Consumer {
    /// A builder for the given bootstrap servers.
    pub fn builder(bootstrap_servers: &str) -> ConsumerBuilder {
        ConsumerBuilder::new(bootstrap_servers)
    }

    /// The next record; `None` once the consumer has stopped. An `Err` reports a
    /// partition that stopped (the others go on) or a group failure.
    pub async fn recv(&mut self) -> Option<Result<ConsumerRecord>> {
        poll_fn(|cx| self.poll_record(cx)).await
    }

    /// Up to `max` records, waiting for at least one.
    pub async fn recv_batch(&mut self, max: usize) -> Result<Vec<ConsumerRecord>> {
        let mut out = Vec::new();
        poll_fn(|cx| self.poll_batch(cx, max.max(1), &mut out)).await?;
        Ok(out)
    }

    /// Tells the group member the application is alive (at most every 500 ms), as a
    /// poll does: the Processor calls it while the application holds its partitions
    /// paused and asks for no records, so the progress guard does not end its
    /// membership (the Java client's paused consumer keeps polling).
    pub(crate) fn note_alive(&mut self) {
        // A comparison with the next time, not a difference from the last: `recv`
        // pays this per record.
        let now = Instant::now();
        if now >= self.next_progress {
            self.next_progress = now + Duration::from_millis(500);
            if let Some(g) = &self.group {
                g.try_progress();
            }
        }
    }

    fn on_poll_entry(&mut self) {
        self.note_alive();
        lock(&self.shared.fetcher).mark_consumed();
        if self.revocation_pending() {
            self.revocation_ready();
        }
    }

    /// Whether a revocation waits for the application to come back for more.
    #[inline]
    fn revocation_pending(&self) -> bool {
        // A flag first: a lock per poll cost `recv` more than the record it returned.
        !self.manual_revocation && self.shared.revoke_pending.swap(false, Ordering::AcqRel)
    }

    /// The application came back for more after a revocation was asked: its records
    /// are done, and the partitions can go (after `mark_consumed`).
    fn revocation_ready(&mut self) {
        let revoking = lock(&self.shared.app).revoking.take();
        if let Some((generation, partitions)) = revoking {
            let _ = self.commands.send(Command::RevocationReady {
                generation,
                partitions,
            });
        }
    }

    fn poll_batch(
        &mut self,
        cx: &mut Context<'_>,
        max: usize,
        out: &mut Vec<ConsumerRecord>,
    ) -> Poll<Result<()>> {
        self.on_poll_entry();
        for attempt in 0..2 {
            let freed = {
                let mut f = lock(&self.shared.fetcher);
                let before = f.buffered_bytes();
                let start = out.len();
                let error = f.next_records(max, out);
                count_delivered(&mut self.delivered, &f, out.get(start..).unwrap_or(&[]));
                let freed = f.buffered_bytes() < before;
                if let Some(e) = error {
                    return Poll::Ready(Err(e.into()));
                }
                freed
            };
            if freed {
                self.shared.wake_driver.notify_one();
            }
            if !out.is_empty() {
                return Poll::Ready(Ok(()));
            }
            {
                let mut app = lock(&self.shared.app);
                if let Some(e) = &app.fatal {
                    return Poll::Ready(Err(e.clone()));
                }
                if let Some(e) = app.security.take() {
                    return Poll::Ready(Err(e));
                }
                if let Some(e) = app.group_retrying.take() {
                    return Poll::Ready(Err(e));
                }
                if app.stopped {
                    return Poll::Ready(Err(Error::Closed));
                }
            }
            if attempt == 0 {
                // Register, then look again: data may have landed in between.
                *lock(&self.shared.waker) = Some(cx.waker().clone());
            }
        }
        Poll::Pending
    }

    fn poll_record(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<ConsumerRecord>>> {
        // `on_poll_entry`, with `mark_consumed` under the lock that takes the record
        // (one lock a record instead of two) unless a revocation waits for it.
        self.note_alive();
        let mut consumed = false;
        if self.revocation_pending() {
            lock(&self.shared.fetcher).mark_consumed();
            consumed = true;
            self.revocation_ready();
        }
        for attempt in 0..2 {
            let (next, freed) = {
                let mut f = lock(&self.shared.fetcher);
                if !consumed {
                    f.mark_consumed();
                    consumed = true;
                }
                let before = f.buffered_bytes();
                let next = f.next_record();
                if let Some(Ok(r)) = &next {
                    let bytes = record_bytes(r);
                    self.delivered
                        .delivered_one(r.topic_arc(), r.partition(), bytes, |tp| f.lag(tp));
                }
                (next, f.buffered_bytes() < before)
            };
            if freed {
                self.shared.wake_driver.notify_one();
            }
            match next {
                Some(Ok(r)) => return Poll::Ready(Some(Ok(r))),
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {}
            }
            {
                let mut app = lock(&self.shared.app);
                if let Some(e) = app.fatal.take() {
                    app.stopped = true;
                    return Poll::Ready(Some(Err(e)));
                }
                if let Some(e) = app.security.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                if let Some(e) = app.group_retrying.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                if app.stopped {
                    return Poll::Ready(None);
                }
            }
            if attempt == 0 {
                *lock(&self.shared.waker) = Some(cx.waker().clone());
            }
        }
        Poll::Pending
    }

    /// With [`ConsumerBuilder::manual_revocation`]: the revocation of `partitions` in
    /// `generation` is complete (their work is finished or stopped, and committed).
    pub fn complete_revocation(&self, generation: i32, partitions: Vec<TopicPartition>) {
        let mut app = lock(&self.shared.app);
        if app.revoking.as_ref().is_some_and(|(g, _)| *g == generation) {
            app.revoking = None;
        }
        drop(app);
        let _ = self.commands.send(Command::RevocationReady {
            generation,
            partitions,
        });
    }

    /// The next event, waiting for one; `None` once the consumer has stopped.
    pub async fn next_event(&mut self) -> Option<ConsumerEvent> {
        self.events.recv().await
    }

    /// Takes the event stream out of the consumer, for an application that reads
    /// events in its own task or `select!` (after this, `next_event` returns `None`).
    /// The stream is bounded ([`EVENTS_CAPACITY`] events): unread, the oldest
    /// informational events make room, and events that change what the application
    /// owns are kept longest.
    pub fn take_events(&mut self) -> Events {
        std::mem::replace(&mut self.events, Events::ended())
    }

    /// An event if one is ready.
    pub fn try_event(&mut self) -> Option<ConsumerEvent> {
        self.events.try_recv().ok()
    }

    /// Commits the positions of every assigned partition (everything delivered so
    /// far) and waits for the result.
    pub async fn commit(&self) -> Result<()> {
        let positions = lock(&self.shared.fetcher).positions();
        self.commit_positions(positions).await
    }

    /// Commits the positions of every assigned partition without waiting. The commit
    /// is queued before this returns, and commits reach the coordinator in the order
    /// they were made; await the returned future for the result, or drop it (the
    /// result also arrives as [`Event::CommitCompleted`]).
    pub fn commit_async(&self) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let positions = lock(&self.shared.fetcher).positions();
        let ticket = commit_ticket(&self.shared);
        let pending = self
            .group
            .as_ref()
            .map(|g| g.start_commit(to_commit(positions)));
        let shared = self.shared.clone();
        async move {
            let Some(pending) = pending else {
                return Err(Error::Config {
                    setting: "group.id",
                    message: "commits need a group".into(),
                });
            };
            let done = pending.await?;
            remember_committed(&shared, &done, ticket);
            Ok(())
        }
    }

    /// Commits explicit offsets (`offset`: the next record to read, last processed + 1).
    pub async fn commit_offsets(&self, offsets: &[(TopicPartition, i64)]) -> Result<()> {
        self.commit_positions(offsets.iter().map(|(tp, o)| (tp.clone(), *o, -1)).collect())
            .await
    }

    async fn commit_positions(&self, positions: Vec<(TopicPartition, i64, i32)>) -> Result<()> {
        let Some(group) = &self.group else {
            return Err(Error::Config {
                setting: "group.id",
                message: "commits need a group".into(),
            });
        };
        if positions.is_empty() {
            return Ok(());
        }
        let ticket = commit_ticket(&self.shared);
        let done = group.start_commit(to_commit(positions)).await?;
        remember_committed(&self.shared, &done, ticket);
        Ok(())
    }

    /// Stops fetching these partitions and holds back their buffered records until
    /// [`Consumer::resume`]. They stay assigned and the member keeps heartbeating.
    pub fn pause(&self, partitions: &[TopicPartition]) {
        let mut f = lock(&self.shared.fetcher);
        let now = Instant::now().into_std();
        for tp in partitions {
            f.pause(now, tp);
        }
    }

    /// Resumes paused partitions.
    pub fn resume(&self, partitions: &[TopicPartition]) {
        {
            let mut f = lock(&self.shared.fetcher);
            for tp in partitions {
                f.resume(tp);
            }
        }
        self.shared.wake_driver.notify_one();
        self.shared.wake_app();
    }

    /// The paused partitions.
    pub fn paused(&self) -> Vec<TopicPartition> {
        lock(&self.shared.fetcher).paused()
    }

    /// Moves a partition's position (also restarts a partition stopped by an error).
    pub fn seek(&self, partition: &TopicPartition, offset: i64) {
        lock(&self.shared.fetcher).seek(partition, offset);
        self.shared.wake_driver.notify_one();
    }

    /// Moves each partition to its log start offset, asked of its leader now with
    /// ListOffsets (Java's `seekToBeginning` resolves it lazily, at the next poll; the
    /// outcome is the same). Every partition must be assigned. A partition whose offset
    /// could not be read keeps its position, and the first such error is returned
    /// once the others have moved.
    pub async fn seek_to_beginning(&self, partitions: &[TopicPartition]) -> Result<()> {
        self.seek_to(partitions, OffsetSpec::Earliest).await
    }

    /// Moves each partition to its log end offset (the last stable offset under
    /// `read_committed`), as [`Consumer::seek_to_beginning`] does to the start.
    pub async fn seek_to_end(&self, partitions: &[TopicPartition]) -> Result<()> {
        self.seek_to(partitions, OffsetSpec::Latest).await
    }

    /// For each partition, the first offset whose record timestamp is at or after the
    /// given time (ms since the epoch), with that record's timestamp; `None` when every
    /// record of the partition is older (Java's `offsetsForTimes`). Needs no
    /// assignment and moves nothing: [`Consumer::seek`] to the answer to start there.
    /// Fails with the first partition's error (UNKNOWN_TOPIC_OR_PARTITION, ...).
    pub async fn offsets_for_times(
        &self,
        times: &[(TopicPartition, i64)],
    ) -> Result<BTreeMap<TopicPartition, Option<OffsetAndTimestamp>>> {
        let specs: Vec<(TopicPartition, OffsetSpec)> = times
            .iter()
            .map(|(tp, t)| (tp.clone(), OffsetSpec::Timestamp(*t)))
            .collect();
        let mut out = BTreeMap::new();
        for (tp, result) in self.list_offsets(&specs).await? {
            let listed = result?;
            let found = listed.offset.map(|offset| OffsetAndTimestamp {
                offset,
                timestamp: listed.timestamp,
                leader_epoch: listed.leader_epoch,
            });
            out.insert(tp, found);
        }
        Ok(out)
    }

    async fn list_offsets(
        &self,
        specs: &[(TopicPartition, OffsetSpec)],
    ) -> Result<crate::admin::ItemResults<TopicPartition, crate::admin::ListedOffset>> {
        let l = &self.lookup;
        crate::admin::list_offsets(&l.cluster, specs, l.isolation, l.timeout, l.backoff).await
    }

    async fn seek_to(&self, partitions: &[TopicPartition], spec: OffsetSpec) -> Result<()> {
        let assigned = self.assignment();
        if let Some(tp) = partitions.iter().find(|tp| !assigned.contains(tp)) {
            return Err(Error::Config {
                setting: "assignment",
                message: format!("{tp} is not assigned to this consumer; it cannot seek there"),
            });
        }
        let specs: Vec<(TopicPartition, OffsetSpec)> =
            partitions.iter().map(|tp| (tp.clone(), spec)).collect();
        let mut first_error = None;
        for (tp, result) in self.list_offsets(&specs).await? {
            match result {
                Ok(listed) => match listed.offset {
                    Some(offset) => self.seek(&tp, offset),
                    None => {
                        first_error.get_or_insert(Error::broker(
                            kafka_protocol::messages::ApiKey::ListOffsets,
                            kafka_protocol::ResponseError::OffsetNotAvailable.code(),
                            Some(tp.to_string()),
                        ));
                    }
                },
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        lock(&self.shared.fetcher).assignment()
    }

    /// The next offset to be delivered for a partition, once known.
    pub fn position(&self, partition: &TopicPartition) -> Option<i64> {
        lock(&self.shared.fetcher).position(partition).map(|p| p.0)
    }

    /// The last committed offset known for a partition (fetched at assignment, or
    /// committed since).
    pub fn committed(&self, partition: &TopicPartition) -> Option<i64> {
        lock(&self.shared.app)
            .committed
            .get(partition)
            .map(|(offset, _)| *offset)
    }

    /// The high watermark (the last stable offset under read_committed) minus the
    /// position, as of the last fetch.
    pub fn lag(&self, partition: &TopicPartition) -> Option<i64> {
        lock(&self.shared.fetcher).lag(partition)
    }

    /// Bytes fetched and not yet delivered.
    pub fn buffered_bytes(&self) -> usize {
        lock(&self.shared.fetcher).buffered_bytes()
    }

    /// A snapshot of this consumer's counters, the figures of the `ottla.consumer.*`
    /// metrics without the `metrics` feature: records and bytes handed over and the
    /// lag, per partition; partitions assigned, rebalances, partitions lost and
    /// commits by result. Counters start at 0 when the consumer is built.
    pub fn stats(&self) -> ConsumerStats {
        let mut stats = ConsumerStats::default();
        {
            let f = lock(&self.shared.fetcher);
            let assigned = f.assignment();
            self.delivered
                .snapshot(&assigned, |tp| f.lag(tp), &mut stats);
            stats.partitions_assigned = assigned.len() as u64;
        }
        if let Some(g) = &self.group_counters {
            g.read(&mut stats);
        }
        stats
    }

    /// A view of this consumer's positions that another task can keep (the
    /// Processor's handle reads lag through it).
    pub(crate) fn view(&self) -> ConsumerView {
        ConsumerView {
            shared: self.shared.clone(),
        }
    }

    /// Commits what was delivered (with automatic commits on), leaves the group and
    /// stops. A rebalance in progress is waited out, for up to 30 s, so the commit
    /// lands; a revocation pending at that moment completes at once. A commit refused
    /// because the member's generation ended meanwhile (ILLEGAL_GENERATION,
    /// UNKNOWN_MEMBER_ID) is logged as a warning and the close still succeeds, as in
    /// the Java client: those records are read again by the partitions' next owner.
    /// Any other refusal (authorization, a fatal group error) is returned.
    pub async fn close(self) -> Result<()> {
        self.close_with(Membership::Default).await
    }

    /// [`Consumer::close`], saying whether the member leaves the group (the Java
    /// client's `CloseOptions`): [`Membership::Leave`] makes a static member leave at
    /// once (a scale-in: its partitions move now, not after its session timeout);
    /// [`Membership::Remain`] keeps a dynamic member in the group until its session
    /// expires.
    pub async fn close_with(mut self, membership: Membership) -> Result<()> {
        let mut result = Ok(());
        if let Some(g) = &self.group {
            g.closing().await;
        }
        if self.auto_commit {
            let mut retry = CloseCommit::new(&self.session, Instant::now().into_std());
            loop {
                // The application is done: everything delivered counts as consumed,
                // and a pending revocation may complete (committing its partitions).
                self.on_poll_entry();
                let consumed = {
                    let mut f = lock(&self.shared.fetcher);
                    f.mark_consumed();
                    let owned = f.assignment();
                    f.consumed(Some(&owned))
                };
                let e = match self.commit_positions(consumed).await {
                    Ok(()) => break,
                    Err(Error::Commit(e)) => e,
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                };
                // Which refusals are tried again, and for how long: `CloseCommit`.
                match retry.handle_failure(Instant::now().into_std(), &e) {
                    CloseStep::Retry { after } => {
                        debug!(error = %e, attempts = retry.attempts(), "commit on close: retrying");
                        tokio::time::sleep(after).await;
                    }
                    CloseStep::Abandon => {
                        warn!(error = %e, "commit on close refused: this member's generation ended; the next owner starts at the last committed offset");
                        break;
                    }
                    CloseStep::Fail => {
                        result = Err(Error::Commit(e));
                        break;
                    }
                }
            }
        }
        let (done, rx) = oneshot::channel();
        if self.commands.send(Command::Close(membership, done)).is_ok() {
            let _ = rx.await;
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        result
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // The task sees the command channel close, drops the group handle (a dynamic
        // member sends LeaveGroup) and ends; nothing here waits.
        lock(&self.shared.app).stopped = true;
    }
}

impl futures_core::Stream for Consumer {
    type Item = Result<ConsumerRecord>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_record(cx)
    }
}

fn to_commit(positions: Vec<(TopicPartition, i64, i32)>) -> Vec<CommitOffset> {
    positions
        .into_iter()
        .map(|(partition, offset, leader_epoch)| CommitOffset {
            partition,
            offset,
            leader_epoch,
            metadata: None,
        })
        .collect()
}

/// A number for a commit being started (see [`AppState::commit_ticket`]).
fn commit_ticket(shared: &Shared) -> u64 {
    let mut app = lock(&shared.app);
    app.commit_ticket += 1;
    app.commit_ticket
}

/// What another task may read of a consumer ([`Consumer::view`]).
#[derive(Clone)]
pub(crate) struct ConsumerView {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ConsumerView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerView").finish_non_exhaustive()
    }
}

impl ConsumerView {
    /// Per assigned partition: the log end (the last stable offset under
    /// `read_committed`) minus the last committed offset, what `kafka-consumer-groups`
    /// reports; before any commit is known, the end minus the fetch position.
    /// Partitions whose end is not known yet (no fetch answered) are left out.
    pub(crate) fn lag(&self) -> BTreeMap<TopicPartition, i64> {
        let f = lock(&self.shared.fetcher);
        let app = lock(&self.shared.app);
        let mut out = BTreeMap::new();
        for tp in f.assignment() {
            let Some(fetched) = f.lag(&tp) else {
                continue;
            };
            let lag = match (app.committed.get(&tp), f.position(&tp)) {
                // The end is the position plus what it has not fetched.
                (Some((committed, _)), Some((position, _))) if *committed >= 0 => {
                    (position + fetched - committed).max(0)
                }
                _ => fetched,
            };
            out.insert(tp, lag);
        }
        out
    }
}

/// Counts `records` (just handed over) per partition run, with each partition's lag
/// after them: a comparison and two lengths per record, the rest per run.
fn count_delivered(counts: &mut DeliveryCounts, f: &Fetcher, records: &[ConsumerRecord]) {
    let mut rest = records;
    while let Some(first) = rest.first() {
        let run = rest
            .iter()
            .take_while(|r| r.is_in(first.topic_arc(), first.partition()))
            .count();
        let (this, next) = rest.split_at(run);
        let bytes: u64 = this.iter().map(record_bytes).sum();
        counts.delivered(
            first.topic_arc(),
            first.partition(),
            run as u64,
            bytes,
            |tp| f.lag(tp),
        );
        rest = next;
    }
}

/// Key plus value bytes of a record handed over.
#[inline]
fn record_bytes(r: &ConsumerRecord) -> u64 {
    (r.key().map_or(0, <[u8]>::len) + r.value().map_or(0, <[u8]>::len)) as u64
}

fn remember_committed(shared: &Shared, done: &[CommitOffset], ticket: u64) {
    let mut app = lock(&shared.app);
    for c in done {
        let newer = app
            .committed
            .get(&c.partition)
            .is_none_or(|(_, t)| *t <= ticket);
        if newer {
            app.committed
                .insert(c.partition.clone(), (c.offset, ticket));
        }
    }
}

// ----- the background task -----

struct Driver {
    cluster: Cluster,
    shared: Arc<Shared>,
    group: Option<GroupHandle>,
    commander: Option<GroupCommander>,
    commands: mpsc::UnboundedReceiver<Command>,
    events: crate::event_queue::EventSender,
    /// When to commit automatically and refresh metadata (sans-IO).
    session: ConsumerSession,
    /// With a group: its configuration, from which the commit at a revocation takes
    /// its bound ([`RevocationCommit`]).
    group_config: Option<Arc<GroupConfig>>,
    /// When the member last asked for partitions back (the revocation commit's clock
    /// starts there).
    revoke_requested_at: Option<Instant>,
    /// Which of the partitions asked back are still the revocation's when the
    /// application finishes it.
    revocation: PendingRevocation,
}

/// The commit of the partitions being revoked, retried as [`RevocationCommit`] says
/// (the rule and its bound live there, sans-IO). Tried once, a revocation overlapping a
/// coordinator move handed partitions over at an older offset, and up to a commit
/// interval of records was processed twice.
async fn commit_before_revocation(
    group: &GroupCommander,
    shared: &Shared,
    positions: Vec<(TopicPartition, i64, i32)>,
    mut retry: RevocationCommit,
) {
    loop {
        let ticket = commit_ticket(shared);
        let err = match group.start_commit(to_commit(positions.clone())).await {
            Ok(done) => return remember_committed(shared, &done, ticket),
            Err(e) => e,
        };
        match retry.handle_failure(Instant::now().into_std(), &err) {
            RevocationStep::GiveUp { attempts } => {
                warn!(error = %err, attempts, "commit before revocation failed; the next owner starts at the last committed offset");
                return;
            }
            RevocationStep::Retry { after } => {
                debug!(error = %err, ?after, "commit before revocation failed; retrying");
                tokio::time::sleep(after).await;
            }
        }
    }
}

enum Done {
    Io,
    /// An automatic commit finished (either way).
    AutoCommitted,
    Metadata(bool),
    Revoked,
}

async fn drive(mut d: Driver) {
    let mut tasks: JoinSet<Done> = JoinSet::new();
    let mut security = d.cluster.security_failures();
    let mut hang_ups = d.cluster.hang_up_reports();
    let mut hang_ups_seen = 0;
    loop {
        let now = Instant::now();
        let wakeup = {
            let mut f = lock(&d.shared.fetcher);
            let std_now = now.into_std();
            for node in f.claim_fetches(std_now) {
                let span = tracing::debug_span!(target: "ottla::fetch", parent: None, "ottla.fetch", broker = node.0);
                tasks
                    .spawn(fetch_round(d.cluster.clone(), d.shared.clone(), node).instrument(span));
            }
            for node in f.resets_due(std_now) {
                tasks.spawn(reset_round(d.cluster.clone(), d.shared.clone(), node));
            }
            // One pass, after everything this turn did: the claims above can raise
            // events too (a partition without a leader asks for metadata), and each
            // one is either acted on or reported, none dropped.
            while let Some(event) = f.poll_event() {
                match event {
                    FetcherEvent::MetadataNeeded => d.session.metadata_needed(),
                    other => {
                        if let Some(event) = ConsumerEvent::from_fetch(other) {
                            d.events.send(event);
                        }
                    }
                }
            }
            f.poll_timeout().map(Instant::from_std)
        };
        d.session.handle_timeout(now.into_std());
        while let Some(action) = d.session.poll_action() {
            match action {
                SessionAction::RefreshMetadata => {
                    let (cluster, shared) = (d.cluster.clone(), d.shared.clone());
                    tasks.spawn(async move {
                        match cluster.refresh_metadata().await {
                            Ok(m) => {
                                lock(&shared.fetcher).update_metadata(&m);
                                Done::Metadata(true)
                            }
                            Err(e) => {
                                warn!(error = %e, "metadata refresh failed");
                                Done::Metadata(false)
                            }
                        }
                    });
                }
                SessionAction::AutoCommit => {
                    let positions = lock(&d.shared.fetcher).consumed(None);
                    let Some(group) = d.commander.clone().filter(|_| !positions.is_empty()) else {
                        d.session.auto_commit_done();
                        continue;
                    };
                    // Queued now, so it keeps its place among the commits.
                    let ticket = commit_ticket(&d.shared);
                    let pending = group.start_commit(to_commit(positions));
                    let shared = d.shared.clone();
                    tasks.spawn(async move {
                        if let Ok(done) = pending.await {
                            remember_committed(&shared, &done, ticket);
                        }
                        Done::AutoCommitted
                    });
                }
            }
        }
        let deadline = [wakeup, d.session.poll_timeout().map(Instant::from_std)]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            event = next_group_event(&mut d.group) => match event {
                Some(event) => on_group_event(&mut d, &mut tasks, event),
                // The member stopped (it failed, and said so in its last event).
                None => d.group = None,
            },
            _ = d.shared.wake_driver.notified() => {}
            // A connection refused TLS or SASL: tell the application through recv(),
            // as the Java client throws from poll(); the connections keep trying.
            Ok(()) = security.changed() => {
                if let Some(e) = d.cluster.security_failure() {
                    lock(&d.shared.app).security = Some(e.into());
                    d.shared.wake_app();
                }
            }
            // A broker keeps hanging up on one request: say why nothing arrives.
            Ok(()) = hang_ups.changed() => {
                for report in d.cluster.hang_ups_since(&mut hang_ups_seen) {
                    d.events.send(ConsumerEvent::BrokerHangUp(report));
                }
            }
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                match done {
                    Ok(Done::Metadata(ok)) => {
                        d.session.metadata_refreshed(Instant::now().into_std(), ok);
                    }
                    Ok(Done::Io) | Ok(Done::Revoked) => {}
                    Ok(Done::AutoCommitted) => d.session.auto_commit_done(),
                    Err(e) => warn!(error = %e, "consumer task failed"),
                }
                d.shared.wake_app();
            }
            command = d.commands.recv() => match command {
                Some(Command::RevocationReady { generation, partitions }) => {
                    // Only what is still this revocation's: a partition lost and assigned
                    // again meanwhile is the new assignment's.
                    let partitions = d.revocation.ready(generation, &partitions);
                    let (shared, commander, auto) = (d.shared.clone(), d.commander.clone(), d.session.auto_commits());
                    let asked_at = d.revoke_requested_at.take().unwrap_or_else(Instant::now);
                    let retry = d.group_config.as_ref().map(|c| RevocationCommit::new(c, asked_at.into_std()));
                    tasks.spawn(async move {
                        let positions = {
                            let mut f = lock(&shared.fetcher);
                            f.mark_consumed();
                            f.consumed(Some(&partitions))
                        };
                        if let Some(group) = commander {
                            if let Some(retry) = retry.filter(|_| auto && !positions.is_empty()) {
                                commit_before_revocation(&group, &shared, positions, retry).await;
                            }
                            lock(&shared.fetcher).unassign(&partitions);
                            group.complete_revocation(generation).await;
                        }
                        Done::Revoked
                    });
                }
                Some(Command::Close(membership, done)) => {
                    if let Some(group) = d.group.take() {
                        group.leave_with(membership).await;
                    }
                    let _ = done.send(());
                    break;
                }
                None => break,
            },
            // The session's timers are looked at on the next turn.
            _ = sleep_until(deadline), if deadline.is_some() => {}
        }
    }
    lock(&d.shared.app).stopped = true;
    d.shared.wake_app();
    debug!("consumer task stopped");
}

async fn next_group_event(group: &mut Option<GroupHandle>) -> Option<Event> {
    match group {
        Some(g) => g.next_event().await,
        None => std::future::pending().await,
    }
}

fn on_group_event(d: &mut Driver, _tasks: &mut JoinSet<Done>, event: Event) {
    match &event {
        Event::Assigned { added, .. } => {
            d.revocation.assigned(added);
            lock(&d.shared.fetcher).assign(added, true);
        }
        Event::CommittedOffsets { offsets, .. } => {
            let mut f = lock(&d.shared.fetcher);
            let mut app = lock(&d.shared.app);
            for (tp, offset, epoch) in offsets {
                f.set_committed(tp, *offset, *epoch);
                if *offset >= 0 {
                    let ticket = app.commit_ticket;
                    app.committed.insert(tp.clone(), (*offset, ticket));
                }
            }
        }
        Event::RevokeRequested {
            generation,
            partitions,
        } => {
            {
                let mut f = lock(&d.shared.fetcher);
                let now = Instant::now().into_std();
                for tp in partitions {
                    f.pause(now, tp);
                    f.discard_buffered(tp);
                }
            }
            d.revoke_requested_at = Some(Instant::now());
            d.revocation.asked(*generation, partitions);
            lock(&d.shared.app).revoking = Some((*generation, partitions.clone()));
            d.shared.revoke_pending.store(true, Ordering::Release);
            d.shared.wake_app();
        }
        Event::Lost { partitions, .. } => {
            d.revocation.lost(partitions);
            lock(&d.shared.fetcher).unassign(partitions);
        }
        Event::Fatal(e) => {
            lock(&d.shared.app).fatal = Some(Error::Group(e.clone()));
            d.shared.wake_app();
        }
        Event::Error(e) => {
            lock(&d.shared.app).group_retrying = Some(Error::GroupRetrying(e.clone()));
            d.shared.wake_app();
        }
        _ => {}
    }
    if let Some(event) = ConsumerEvent::from_group(event) {
        d.events.send(event);
    }
}

/// One Fetch to `node`: negotiate (once per connection), build, send, hand back.
async fn fetch_round(cluster: Cluster, shared: Arc<Shared>, node: NodeId) -> Done {
    let fail = |shared: &Shared| {
        lock(&shared.fetcher).handle_fetch_failure(Instant::now().into_std(), node);
    };
    let conn = match cluster.broker(node) {
        Ok(c) => c,
        Err(_) => {
            fail(&shared);
            return Done::Io;
        }
    };
    let version = match conn.versions().await {
        Ok(t) => t.version(ApiKey::Fetch),
        Err(_) => None,
    };
    let Some(version) = version else {
        fail(&shared);
        return Done::Io;
    };
    let built = lock(&shared.fetcher).build_fetch(Instant::now().into_std(), node, version);
    let Some((request, token)) = built else {
        return Done::Io;
    };
    match conn
        .send_version::<FetchRequest>(&request, token.version())
        .await
    {
        Ok(response) => {
            crate::telemetry::throttled(ApiKey::Fetch, response.throttle_time_ms);
            lock(&shared.fetcher).handle_fetch(Instant::now().into_std(), token, response);
        }
        Err(e) => {
            debug!(node = node.0, error = %e, "fetch failed");
            fail(&shared);
        }
    }
    shared.wake_app();
    Done::Io
}

/// One ListOffsets to `node` for the partitions it leads that need a reset.
async fn reset_round(cluster: Cluster, shared: Arc<Shared>, node: NodeId) -> Done {
    let fail = |shared: &Shared| {
        lock(&shared.fetcher).handle_list_offsets_failure(Instant::now().into_std(), node);
    };
    let Ok(conn) = cluster.broker(node) else {
        fail(&shared);
        return Done::Io;
    };
    let version = match conn.versions().await {
        Ok(t) => t.version(ApiKey::ListOffsets),
        Err(_) => None,
    };
    let Some(version) = version else {
        fail(&shared);
        return Done::Io;
    };
    let request: Option<ListOffsetsRequest> =
        lock(&shared.fetcher).build_list_offsets(Instant::now().into_std(), node, version);
    let Some(request) = request else {
        return Done::Io;
    };
    match conn.send_version(&request, version).await {
        Ok(response) => {
            lock(&shared.fetcher).handle_list_offsets(Instant::now().into_std(), node, response)
        }
        Err(e) => {
            debug!(node = node.0, error = %e, "ListOffsets failed");
            fail(&shared);
        }
    }
    Done::Io
}

#[cfg(test)]
mod tests;
