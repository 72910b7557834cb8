//! [`ProcessorBuilder`]: the Processor's settings (its own, and its consumer's and
//! dead-letter producer's), the checks at build, and the creation of missing topics.

use super::*;

pub(super) type MetricsHook = Arc<dyn Fn(Metric) + Send + Sync>;

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
    guarantee: ProcessingGuarantee,
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
            guarantee: ProcessingGuarantee::AtLeastOnce,
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
            "ottla.processing.order" => {
                self.lanes.ordering = match value {
                    "partition" => ProcessingOrder::Partition,
                    "key" => ProcessingOrder::Key,
                    "unordered" => ProcessingOrder::Unordered,
                    _ => return Err(invalid(key, value, "partition, key or unordered")),
                };
            }
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
            "processing.guarantee" => {
                self.guarantee = match value {
                    "at_least_once" => ProcessingGuarantee::AtLeastOnce,
                    // Kafka Streams' names: `exactly_once_v2` is KIP-447's, which is
                    // the only one ottla has (`exactly_once` is its older name).
                    "exactly_once" | "exactly_once_v2" => ProcessingGuarantee::ExactlyOnce,
                    _ => return Err(invalid(key, value, "at_least_once or exactly_once")),
                };
            }
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

    /// What the Processor promises about a record's effects (default
    /// [`ProcessingGuarantee::AtLeastOnce`]; `processing.guarantee`). Exactly-once
    /// needs the producer's `transactional.id` ([`ProcessorBuilder::exactly_once`]
    /// sets both); the build refuses the mode without one.
    pub fn processing_guarantee(mut self, guarantee: ProcessingGuarantee) -> Self {
        self.guarantee = guarantee;
        self
    }

    /// Exactly-once processing ([`ProcessingGuarantee::ExactlyOnce`]) with the
    /// producer's `transactional.id`: each commit is a transaction that carries the
    /// outputs of the records it commits ([`Cancel::send`]), their retry-topic and
    /// dead-letter writes, and their offsets. One id per processor instance, stable
    /// across its restarts (the group's members must not share one); see
    /// docs/exactly-once.md.
    pub fn exactly_once(mut self, transactional_id: impl Into<String>) -> Self {
        self.producer = self.producer.transactional_id(transactional_id);
        self.guarantee = ProcessingGuarantee::ExactlyOnce;
        self
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

    /// Handler calls running at once, across every partition (default 16; Parallel
    /// Consumer's `maxConcurrency`). Under [`ProcessingOrder::Partition`] a partition
    /// has one call at a time, so more than the partitions assigned adds nothing.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.lanes.concurrency = n;
        self
    }

    /// Which records of one partition may be handled at once (default
    /// [`ProcessingOrder::Partition`]): by key, a key's records one call at a time in
    /// offset order and different keys at once; unordered, any. Whatever the order,
    /// a partition's commit is the prefix of its records that finished, and a retrying
    /// record holds only what the order puts behind it (the [module docs](crate::processor), "Orders").
    pub fn ordering(mut self, order: ProcessingOrder) -> Self {
        self.lanes.ordering = order;
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
        match (self.guarantee, self.producer.has_transactional_id()) {
            (ProcessingGuarantee::ExactlyOnce, false) => {
                return bad(
                    "transactional.id",
                    "processing.guarantee = exactly_once needs a transactional.id (ProcessorBuilder::exactly_once sets both): the outputs and offsets are committed in its transactions".into(),
                );
            }
            (ProcessingGuarantee::AtLeastOnce, true) => {
                return bad(
                    "transactional.id",
                    "a transactional.id is set but processing.guarantee is at_least_once: a transactional producer writes only inside transactions; set processing.guarantee = exactly_once, or remove the id".into(),
                );
            }
            _ => {}
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
        let exactly_once = self.guarantee == ProcessingGuarantee::ExactlyOnce;
        let producer = self.producer.build().await?;
        if exactly_once {
            // Fences an earlier instance with the same id and aborts what it left open.
            producer.init_transactions().await?;
        }
        if let (Some(written), Some(creation)) = (&written, &self.create_topics) {
            let client = self.consumer.client().clone();
            create_absent_topics(&producer, client, written, creation).await?;
        }
        if let Some(written) = written {
            check_topics_exist(&producer, &written).await?;
        }
        let (_, _, max_poll_interval) = self.consumer.group_timeouts();
        let mut consumer = self.consumer;
        if exactly_once {
            // Records of aborted transactions (an earlier attempt's outputs, when this
            // processor reads a topic another exactly-once processor writes) are not
            // input.
            consumer = consumer.isolation(crate::consumer::IsolationLevel::ReadCommitted);
        }
        let consumer = consumer
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
                transactional: exactly_once,
                ..self.lanes
            },
            guarantee: self.guarantee,
            acquiesce: max_poll_interval.mul_f64(self.acquiesce_share),
            shutdown_timeout: self.shutdown_timeout,
            processing_budget: self.processing_budget,
            telemetry,
            metrics: self.metrics,
            control,
            controls,
            holds: Arc::default(),
            live: Arc::default(),
            abort_wanted: AtomicBool::new(false),
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
pub(super) async fn create_absent_topics(
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
pub(super) async fn check_topics_exist(
    producer: &Producer,
    wanted: &[(String, &'static str)],
) -> Result<()> {
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

pub(super) fn config(e: crate::proto::process::retry::ConfigError) -> Error {
    Error::Config {
        setting: e.setting,
        message: e.message,
    }
}

#[cfg(test)]
mod tests;
