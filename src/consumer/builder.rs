//! [`ConsumerBuilder`]: the consumer's settings, by method or by Java and librdkafka
//! property names, and `build`, which connects and starts the background task.

use super::*;

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
    /// `assign` was called (with partitions or none): a consumer without a group.
    manual: bool,
    fetcher: FetcherConfig,
    session_timeout: Duration,
    heartbeat_interval: Duration,
    max_poll_interval: Duration,
    assignors: Vec<Arc<dyn Assignor>>,
    /// The assignor list is ottla's default (`cooperative_upgrade` then defaults on).
    default_assignors: bool,
    /// Set by `cooperative_upgrade`; unset, it follows `default_assignors`.
    cooperative_upgrade: Option<Option<Duration>>,
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
        let assignors: Vec<Arc<dyn Assignor>> = DEFAULT_ASSIGNORS
            .iter()
            .filter_map(|name| builtin(name))
            .map(Arc::from)
            .collect();
        Self {
            client: ClientConfig::new(bootstrap_servers),
            group_id: None,
            topics: Vec::new(),
            assign: Vec::new(),
            manual: false,
            fetcher: FetcherConfig::default(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            max_poll_interval: DEFAULT_MAX_POLL_INTERVAL,
            assignors,
            default_assignors: true,
            cooperative_upgrade: None,
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
                self.default_assignors = false;
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
            "ottla.cooperative.upgrade.ms" => {
                self.cooperative_upgrade = Some(if value.trim() == "-1" {
                    None
                } else {
                    Some(millis(key, value)?)
                });
            }
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

    /// Subscribes to every topic whose whole name matches `pattern`, now and as topics
    /// are created or deleted; with [`ConsumerBuilder::topics`], to those as well.
    /// Under the consumer protocol the broker matches (KIP-848's
    /// `SubscribedTopicRegex`, RE2J syntax on Kafka; Java's
    /// `subscribe(SubscriptionPattern)`); under the classic protocol the consumer
    /// matches on each metadata refresh, every `metadata.max.age.ms`, and rejoins when
    /// the matches change (Java's `subscribe(Pattern)`). Internal topics (`__...`) are
    /// never matched by the consumer. [`Consumer::subscribe_pattern`] changes it at run
    /// time.
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

    /// `client.rack`: the rack this consumer runs in. Every Fetch carries it, so a
    /// broker with a rack-aware `replica.selector.class` can name a replica in this rack
    /// to fetch from (KIP-392), which the consumer then does until
    /// `metadata.max.age.ms` passes or the replica fails. Rack-aware assignors (`range`,
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
    /// `auto.offset.reset` (or a [`Consumer::seek`]). An empty list builds a consumer
    /// that reads nothing until [`Consumer::assign`] or
    /// [`Consumer::incremental_assign`] gives it partitions, as a librdkafka consumer
    /// created without a subscription does.
    pub fn assign(mut self, partitions: impl IntoIterator<Item = TopicPartition>) -> Self {
        self.assign = partitions.into_iter().collect();
        self.manual = true;
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
    /// `roundrobin`, `sticky`, `cooperative-sticky`. The default is
    /// `cooperative-sticky, range, roundrobin`, which shares an assignor with every
    /// common client's default (librdkafka's and kafka-python's `range,roundrobin`,
    /// the Java client's `range,cooperative-sticky`, aiokafka's and kafkajs'
    /// `roundrobin`, franz-go's `cooperative-sticky`), so that a group can move to
    /// ottla one instance at a time; it rebalances eagerly until the automatic second
    /// bounce ([`ConsumerBuilder::cooperative_upgrade`]). A list set here keeps the
    /// Java client's rule: cooperative only when every assignor in it is.
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
        self.default_assignors = false;
        Ok(self)
    }

    /// The second bounce's hold the group member gets: as set, or by default on with
    /// the default list and off with a chosen one.
    fn cooperative_upgrade_hold(&self) -> Option<Duration> {
        match self.cooperative_upgrade {
            Some(hold) => hold,
            None if self.default_assignors => Some(DEFAULT_COOPERATIVE_UPGRADE),
            None => None,
        }
    }

    /// Custom assignors, in preference order.
    pub fn custom_assignors(mut self, assignors: Vec<Arc<dyn Assignor>>) -> Self {
        self.assignors = assignors;
        self.default_assignors = false;
        self
    }

    /// The automatic second bounce of a move from eager to cooperative rebalancing
    /// (`ottla.cooperative.upgrade.ms`, `-1` for never): once the group has chosen a
    /// cooperative assignor in every generation for `hold`, a member whose list also
    /// offers eager assignors stops offering them and rebalances cooperatively, as the
    /// Java client does after its manual second bounce. From then on a member
    /// without a cooperative assignor is refused by the broker; if one joins in the
    /// same round, this member offers its whole list again and rebalances eagerly.
    /// On by default with the default assignor list (10 minutes,
    /// [`DEFAULT_COOPERATIVE_UPGRADE`]),
    /// off for a list the application chose. docs/rebalance.md has the details.
    pub fn cooperative_upgrade(mut self, hold: Option<Duration>) -> Self {
        self.cooperative_upgrade = Some(hold);
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
            (Some(_), _) if self.manual => {
                return bad(
                    "assign",
                    "use either a group with topics or a manual assignment",
                );
            }
            (None, true) if !self.manual => {
                return bad(
                    "group.id",
                    "give a group id, or assign partitions (assign([]) to assign them later)",
                );
            }
            _ => {}
        }
        if let Some(pattern) = &self.topic_regex {
            if let Err(message) = TopicPattern::new(pattern) {
                return Err(Error::Config {
                    setting: "ottla.topic.regex",
                    message,
                });
            }
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
            rack: self.client.client_rack.clone(),
            read_replica_expiry: self.client.metadata_max_age,
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
                config.cooperative_upgrade = self.cooperative_upgrade_hold();
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
        let (events_tx, events) = super::queue::channel();
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

#[cfg(test)]
mod tests;
