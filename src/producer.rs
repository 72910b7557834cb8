//! The public producer: idempotent by default, batching with `linger.ms` and
//! `batch.size`, pure-Rust compression, one future per record.
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::producer::{Producer, ProducerRecord};
//!
//! let producer = Producer::builder("127.0.0.1:9092").build().await?;
//! let delivery = producer
//!     .send(ProducerRecord::new("orders").key("order-1").value("{\"qty\": 3}"))
//!     .await?;
//! let written = delivery.await?;
//! println!("{}/{}@{}", written.topic, written.partition, written.offset);
//! producer.close().await;
//! # Ok(()) }
//! ```
//!
//! `send` waits only while `buffer.memory` is full; the returned [`DeliveryFuture`]
//! resolves once the broker acknowledged the record (or it failed for good). A retried
//! batch keeps its sequence numbers, so a write the broker already took is not taken
//! twice.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, MetadataRequest, ProduceRequest};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, debug, warn};

use crate::config::ClientConfig;
use crate::driver::{Cluster, TopicScope, lock, sleep_until};
use crate::error::{Error, Result};
pub use crate::proto::fetch::batch::Compression;
use crate::proto::metadata::{NodeId, RefreshPace};
use crate::proto::produce::accumulator::{Accumulator, AccumulatorEvent, AppendError, RecordId};
pub use crate::proto::produce::accumulator::{Acks, ProduceError, ProducerConfig};
use crate::proto::produce::encode::OutRecord;
pub use crate::proto::produce::record::ProducerRecord;
use crate::stats::{ProduceCounts, ProducerStats};

/// Where a record was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMetadata {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset (-1 when unknown: `acks = 0`, or a retry the broker had already
    /// taken).
    pub offset: i64,
}

/// Resolves when the record is acknowledged or has failed for good.
#[derive(Debug)]
pub struct DeliveryFuture {
    rx: oneshot::Receiver<Result<RecordMetadata, ProduceError>>,
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|r| match r {
            Ok(Ok(m)) => Ok(m),
            Ok(Err(ProduceError::Connection(e))) => Err(Error::Request(e)),
            Ok(Err(e)) => Err(Error::Produce(e)),
            Err(_) => Err(Error::Produce(ProduceError::Closed)),
        })
    }
}

/// Builds a [`Producer`].
#[derive(Debug, Clone)]
pub struct ProducerBuilder {
    client: ClientConfig,
    config: ProducerConfig,
    max_block: Duration,
}

crate::properties::by_name_entry_points!(
    ProducerBuilder,
    ProducerBuilder::new(""),
    "`bootstrap.servers` must be among them.",
    "`OTTLA_LINGER_MS` with prefix `OTTLA_` is `linger.ms`"
);

impl ProducerBuilder {
    /// A builder for the given bootstrap servers.
    pub fn new(bootstrap_servers: &str) -> Self {
        Self {
            client: ClientConfig::new(bootstrap_servers),
            config: ProducerConfig::default(),
            max_block: Duration::from_secs(60),
        }
    }

    /// The client configuration so far.
    #[cfg(test)]
    pub(crate) fn client(&self) -> &ClientConfig {
        &self.client
    }

    /// Replaces the connection settings.
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
    /// them): the producer's own (`acks`, `linger.ms`, `compression.type`, ...) and the
    /// connection settings of [`ClientConfig::set`]. A consumer or Processor setting,
    /// or a Java or librdkafka property that means nothing to ottla, is logged and
    /// recorded in [`ProducerBuilder::ignored_properties`]. An unknown key or a bad
    /// value is an error naming it.
    pub fn set(mut self, key: &str, value: &str) -> crate::Result<Self> {
        use crate::properties::{Route, Scope};
        match crate::properties::route(key, &[Scope::Client, Scope::Producer])? {
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

    /// Applies a producer property; `key` is the name as given (for errors).
    fn apply(
        &mut self,
        name: &'static str,
        key: &str,
        value: &str,
    ) -> std::result::Result<(), crate::properties::PropertyError> {
        use crate::properties::{flag, invalid, kibibytes, millis, number};
        let key = key.trim();
        let value = value.trim();
        match name {
            "acks" => {
                self.config.acks = match value.to_ascii_lowercase().as_str() {
                    "all" | "-1" => Acks::All,
                    "1" => Acks::Leader,
                    "0" => Acks::None,
                    _ => return Err(invalid(key, value, "all (-1), 1 or 0")),
                };
            }
            "linger.ms" => self.config.linger = millis(key, value)?,
            "batch.size" => self.config.batch_size = number(key, value, "a number of bytes")?,
            "compression.type" => {
                self.config.compression = match value.to_ascii_lowercase().as_str() {
                    "none" => Compression::None,
                    "gzip" => Compression::Gzip,
                    "snappy" => Compression::Snappy,
                    "lz4" => Compression::Lz4,
                    "zstd" => Compression::Zstd,
                    _ => return Err(invalid(key, value, "none, gzip, snappy, lz4 or zstd")),
                };
            }
            "enable.idempotence" => self.config.idempotence = flag(key, value)?,
            "buffer.memory" => {
                self.config.buffer_memory = number(key, value, "a number of bytes")?;
            }
            "queue.buffering.max.kbytes" => self.config.buffer_memory = kibibytes(key, value)?,
            "delivery.timeout.ms" => self.config.delivery_timeout = millis(key, value)?,
            "max.block.ms" => self.max_block = millis(key, value)?,
            "max.request.size" => {
                self.config.max_request_size = number(key, value, "a number of bytes")?;
            }
            _ => return Err(crate::properties::not_here(key)),
        }
        Ok(())
    }

    /// `client.id`.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client.client_id = id.into();
        self
    }

    /// `acks` (default all).
    pub fn acks(mut self, acks: Acks) -> Self {
        self.config.acks = acks;
        self
    }

    /// `linger.ms` (default 5 ms).
    pub fn linger(mut self, t: Duration) -> Self {
        self.config.linger = t;
        self
    }

    /// `batch.size` (default 16 KiB).
    pub fn batch_size(mut self, bytes: usize) -> Self {
        self.config.batch_size = bytes;
        self
    }

    /// `compression.type` (default none).
    pub fn compression(mut self, c: Compression) -> Self {
        self.config.compression = c;
        self
    }

    /// `enable.idempotence` (default on; only with `acks = all`).
    pub fn idempotence(mut self, on: bool) -> Self {
        self.config.idempotence = on;
        self
    }

    /// `buffer.memory` (default 32 MiB).
    pub fn buffer_memory(mut self, bytes: usize) -> Self {
        self.config.buffer_memory = bytes;
        self
    }

    /// `delivery.timeout.ms` (default 120 s).
    pub fn delivery_timeout(mut self, t: Duration) -> Self {
        self.config.delivery_timeout = t;
        self
    }

    /// `retry.backoff.ms` (default 100 ms): [`ClientConfig::retry_backoff`], which
    /// [`ProducerBuilder::client_config`] and `set("retry.backoff.ms", ..)` set too.
    pub fn retry_backoff(mut self, t: Duration) -> Self {
        self.client.retry_backoff = t;
        self
    }

    /// `max.block.ms`: how long `send` waits for metadata or buffer room (60 s).
    pub fn max_block(mut self, t: Duration) -> Self {
        self.max_block = t;
        self
    }

    /// Connects and starts the background task.
    pub async fn build(self) -> Result<Producer> {
        if self.config.batch_size == 0 || self.config.buffer_memory < self.config.batch_size {
            return Err(Error::Config {
                setting: "buffer.memory",
                message: "must be at least batch.size, which must be positive".into(),
            });
        }
        let mut config = self.config;
        config.request_timeout = self.client.request_timeout;
        config.retry_backoff = self.client.retry_backoff;
        config.retry_backoff_max = self.client.retry_backoff_max;
        let required = vec![ApiKey::Produce, ApiKey::Metadata];
        let cluster =
            Cluster::connect(&self.client, TopicScope::Topics(BTreeSet::new()), &required).await?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                acc: Accumulator::new(config),
                waiters: HashMap::new(),
                closed: false,
                unanswered: BTreeSet::new(),
                counts: ProduceCounts::default(),
                retries_told: 0,
            }),
            wake_driver: Notify::new(),
            room: Notify::new(),
        });
        let task = tokio::spawn(drive(cluster.clone(), shared.clone()));
        Ok(Producer {
            shared,
            cluster,
            max_block: self.max_block,
            task: Mutex::new(Some(task)),
        })
    }
}

#[derive(Debug)]
struct State {
    acc: Accumulator,
    waiters: HashMap<
        RecordId,
        (
            String,
            oneshot::Sender<Result<RecordMetadata, ProduceError>>,
        ),
    >,
    closed: bool,
    /// Brokers sent `acks = 0` records since the last flush (see
    /// [`Producer::confirm_unanswered`]).
    unanswered: BTreeSet<NodeId>,
    /// Records delivered and failed, per topic ([`Producer::stats`]).
    counts: ProduceCounts,
    /// The accumulator's retries the metrics have been told.
    retries_told: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake_driver: Notify,
    /// Deliveries freed buffer room, or metadata arrived.
    room: Notify,
}

impl Shared {
    /// Hands finished records to their futures, counting them (per topic, for
    /// [`Producer::stats`] and the `metrics` feature) on the way.
    fn dispatch(&self) {
        let mut freed = false;
        {
            let mut s = lock(&self.state);
            let State {
                acc,
                waiters,
                counts,
                ..
            } = &mut *s;
            while let Some(d) = acc.poll_delivery() {
                freed = true;
                if let Some((topic, tx)) = waiters.remove(&d.id) {
                    match &d.result {
                        Ok(_) => counts.acknowledged(&topic, d.bytes),
                        Err(e) => counts.failed(&topic, e),
                    }
                    let _ = tx.send(d.result.map(|offset| RecordMetadata {
                        topic,
                        partition: d.partition.partition,
                        offset,
                    }));
                }
            }
            if freed {
                counts.publish();
            }
        }
        if freed {
            self.room.notify_waiters();
        }
    }
}

/// A Kafka producer. Cheap to share behind an `Arc`; `send` takes `&self`.
#[derive(Debug)]
pub struct Producer {
    shared: Arc<Shared>,
    cluster: Cluster,
    max_block: Duration,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Producer {
    /// Of `topics`, those the cluster does not describe to this client, each with the
    /// error code it gave (UNKNOWN_TOPIC_OR_PARTITION, TOPIC_AUTHORIZATION_FAILED,
    /// ...). Asks without creating anything: Metadata v4 and later carry
    /// `allow_auto_topic_creation = false`.
    pub(crate) async fn absent_topics(&self, topics: &[String]) -> Result<Vec<(String, i16)>> {
        self.cluster.add_topics(topics.iter().cloned());
        let m = self.cluster.refresh_metadata().await?;
        let unknown = kafka_protocol::ResponseError::UnknownTopicOrPartition.code();
        Ok(topics
            .iter()
            .filter_map(|t| match m.topics.get(t) {
                Some(tm) if tm.error == 0 && !tm.partitions.is_empty() => None,
                Some(tm) if tm.error != 0 => Some((t.clone(), tm.error)),
                _ => Some((t.clone(), unknown)),
            })
            .collect())
    }

    /// A builder for the given bootstrap servers.
    pub fn builder(bootstrap_servers: &str) -> ProducerBuilder {
        ProducerBuilder::new(bootstrap_servers)
    }

    /// Queues a record. Waits (up to `max.block.ms`) only for the topic's metadata or
    /// for room in `buffer.memory`; the returned future resolves with the record's
    /// offset once the broker acknowledged it.
    ///
    /// Called inside a [`Processor`](crate::processor::Processor) handler whose record
    /// carries a trace, it writes that trace's context ([`crate::trace::current`]) into
    /// a record without a `traceparent` header of its own.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        let deadline = Instant::now() + self.max_block;
        let timestamp = record.timestamp.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        });
        let mut headers = record.headers;
        // Inside a handler of a traced record: the record goes on with its trace,
        // unless it names its own.
        if let Some(context) = crate::trace::for_send() {
            if !crate::proto::trace::has_header(&headers) {
                headers.push((
                    crate::trace::TRACEPARENT.to_string(),
                    Some(bytes::Bytes::from(context.header())),
                ));
            }
        }
        let out = OutRecord {
            timestamp,
            key: record.key,
            value: record.value,
            headers,
        };
        let mut out = Some(out);
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            let attempt = {
                let mut s = lock(&self.shared.state);
                if s.closed {
                    return Err(Error::Produce(ProduceError::Closed));
                }
                let now = Instant::now().into_std();
                let Some(r) = out.take() else {
                    return Err(Error::Produce(ProduceError::Closed));
                };
                match s.acc.append(now, &record.topic, record.partition, r) {
                    Ok((id, _)) => {
                        let (tx, rx) = oneshot::channel();
                        s.waiters.insert(id, (record.topic.clone(), tx));
                        Ok(rx)
                    }
                    Err((e, r)) => {
                        out = Some(r);
                        Err(e)
                    }
                }
            };
            match attempt {
                Ok(rx) => {
                    self.shared.wake_driver.notify_one();
                    return Ok(DeliveryFuture { rx });
                }
                Err(AppendError::UnknownTopic(topic)) => {
                    // Metadata cannot come while the brokers refuse TLS or SASL: say so
                    // now rather than at max.block.ms.
                    if let Some(e) = self.cluster.security_failure() {
                        return Err(e.into());
                    }
                    self.cluster.add_topics([topic]);
                    self.shared.wake_driver.notify_one();
                }
                Err(AppendError::BufferFull) => {}
                Err(e) => {
                    return Err(Error::Config {
                        setting: "record",
                        message: e.to_string(),
                    });
                }
            }
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return Err(Error::Config {
                    setting: "max.block.ms",
                    message: format!(
                        "no room or no metadata for topic {} within {:?}",
                        record.topic, self.max_block
                    ),
                });
            }
        }
    }

    /// Sends everything queued without waiting for `linger.ms`, and waits until every
    /// record queued so far has its delivery.
    ///
    /// With `acks = 0` a delivery only means "written to the connection". `flush` (and
    /// so `close`) then also waits for one answered request on every connection that
    /// carried such records, which proves the broker has read them: a broker handles a
    /// connection's requests in order. The Java client returns without it.
    pub async fn flush(&self) {
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut s = lock(&self.shared.state);
                if s.acc.is_idle() || s.closed {
                    break;
                }
                s.acc.flush();
            }
            self.shared.wake_driver.notify_one();
            let _ = tokio::time::timeout(Duration::from_millis(100), room).await;
        }
        self.confirm_unanswered().await;
    }

    /// Sends a Metadata request for no topics to every broker that was sent `acks = 0`
    /// records since the last call, and waits for the answers. Closing the connection
    /// right after writing them could lose the ones the broker had not read yet (tansu
    /// stops reading a connection once it cannot write to it).
    async fn confirm_unanswered(&self) {
        let nodes = std::mem::take(&mut lock(&self.shared.state).unanswered);
        for node in nodes {
            let Ok(conn) = self.cluster.broker(node) else {
                continue;
            };
            let request = MetadataRequest::default().with_topics(Some(Vec::new()));
            if let Err(e) = conn.send(&request).await {
                debug!(node = node.0, error = %e, "acks=0 records could not be confirmed read");
            }
        }
    }

    /// A snapshot of this producer's counters, the figures of the `ottla.producer.*`
    /// metrics without the `metrics` feature: records and bytes acknowledged and
    /// errors by name, per topic; and what waits now (records not yet delivered,
    /// `buffer.memory` in use). Counters start at 0 when the producer is built.
    pub fn stats(&self) -> ProducerStats {
        let mut stats = ProducerStats::default();
        let s = lock(&self.shared.state);
        s.counts.snapshot(&mut stats);
        stats.pending_records = s.waiters.len() as u64;
        stats.buffered_bytes = s.acc.buffered_bytes() as u64;
        stats.retries = s.acc.retries();
        stats
    }

    /// Flushes, then stops the background task.
    pub async fn close(self) {
        self.flush().await;
        {
            let mut s = lock(&self.shared.state);
            s.closed = true;
            s.acc.abort_unsent();
        }
        self.shared.dispatch();
        self.shared.wake_driver.notify_one();
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        // Records not yet sent fail with `Closed`; the task stops without waiting.
        {
            let mut s = lock(&self.shared.state);
            s.closed = true;
            s.acc.abort_unsent();
        }
        self.shared.dispatch();
        self.shared.wake_driver.notify_one();
    }
}

async fn drive(cluster: Cluster, shared: Arc<Shared>) {
    let mut tasks: JoinSet<Done> = JoinSet::new();
    // The accumulator decides what to send and when to retry; this paces the metadata
    // refreshes it asks for (a record for a topic the cluster does not have keeps
    // asking until `max.block.ms`, and must not spin).
    let mut metadata = {
        let s = lock(&shared.state);
        let c = s.acc.config();
        RefreshPace::new(c.retry_backoff, c.retry_backoff_max, c.seed.rotate_left(29))
    };
    loop {
        let now = Instant::now();
        let (nodes, refresh, pid, wakeup, done) = {
            let mut s = lock(&shared.state);
            let std_now = now.into_std();
            s.acc.handle_timeout(std_now);
            let pid = s.acc.claim_producer_id(std_now);
            let nodes = s.acc.claim_ready(std_now);
            while let Some(event) = s.acc.poll_event() {
                match event {
                    AccumulatorEvent::MetadataNeeded => metadata.request(),
                }
            }
            let refresh = metadata.poll_start(std_now);
            let done = s.closed && s.acc.is_idle();
            let wakeup = [s.acc.poll_timeout(), metadata.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            (nodes, refresh, pid, wakeup, done)
        };
        shared.dispatch();
        if done && tasks.is_empty() {
            break;
        }
        if pid {
            let (cluster, shared) = (cluster.clone(), shared.clone());
            tasks.spawn(async move {
                let result = init_producer_id(&cluster).await;
                if let Err(Error::Request(e)) = &result {
                    if e.is_security() {
                        // Nothing can be sent without a producer id: fail the records
                        // now rather than at delivery.timeout.ms.
                        lock(&shared.state).acc.fail_all(e);
                    }
                }
                if let Err(e) = &result {
                    warn!(error = %e, "InitProducerId failed; retrying after a backoff");
                }
                // The accumulator paces the next attempt (`retry.backoff.ms`, doubling).
                lock(&shared.state)
                    .acc
                    .set_producer_id(Instant::now().into_std(), result.map_err(|_| ()));
                Done::Other
            });
        }
        if refresh {
            let (cluster, shared) = (cluster.clone(), shared.clone());
            tasks.spawn(async move {
                match cluster.refresh_metadata().await {
                    Ok(m) => {
                        lock(&shared.state).acc.update_metadata(&m);
                        shared.room.notify_waiters();
                        Done::Metadata(true)
                    }
                    Err(e) => {
                        debug!(error = %e, "metadata refresh failed");
                        lock(&shared.state).acc.metadata_failed();
                        Done::Metadata(false)
                    }
                }
            });
        }
        for node in nodes {
            let span = tracing::debug_span!(target: "ottla::produce", parent: None, "ottla.produce", broker = node.0);
            let (cluster, shared) = (cluster.clone(), shared.clone());
            tasks.spawn(
                async move {
                    produce_round(cluster, shared, node).await;
                    Done::Other
                }
                .instrument(span),
            );
        }
        let deadline = wakeup.map(Instant::from_std);
        tokio::select! {
            _ = shared.wake_driver.notified() => {}
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => match joined {
                Ok(Done::Metadata(ok)) => metadata.handle_done(Instant::now().into_std(), ok),
                Ok(Done::Other) => {}
                Err(e) => warn!(error = %e, "producer task failed"),
            },
            _ = sleep_until(deadline), if deadline.is_some() => {}
        }
    }
    debug!("producer task stopped");
}

/// What a task of the producer's driver did.
enum Done {
    /// A metadata refresh ended (whether it brought metadata).
    Metadata(bool),
    Other,
}

async fn init_producer_id(cluster: &Cluster) -> Result<(i64, i16)> {
    let conn = cluster.any_connection();
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000);
    let response = conn.send(&request).await?;
    if response.error_code != 0 {
        return Err(Error::broker(
            ApiKey::InitProducerId,
            response.error_code,
            None,
        ));
    }
    Ok((response.producer_id.0, response.producer_epoch))
}

/// One Produce to `node`.
async fn produce_round(cluster: Cluster, shared: Arc<Shared>, node: NodeId) {
    let release = |shared: &Shared| {
        lock(&shared.state).acc.release_claim(node);
        shared.wake_driver.notify_one();
    };
    let conn = match cluster.broker(node) {
        Ok(c) => c,
        Err(_) => {
            release(&shared);
            return;
        }
    };
    let version = match conn.versions().await {
        Ok(t) => t.version(ApiKey::Produce),
        Err(e) if e.is_security() => {
            // No retry will get through: fail the waiting records now.
            lock(&shared.state).acc.fail_node(node, &e);
            release(&shared);
            return;
        }
        Err(_) => None,
    };
    let Some(version) = version else {
        release(&shared);
        return;
    };
    let built = {
        let mut s = lock(&shared.state);
        let built = s
            .acc
            .build_produce(Instant::now().into_std(), node, version);
        if crate::telemetry::ENABLED {
            if let Some((request, _)) = &built {
                let retries = s.acc.retries();
                let sizes = request
                    .topic_data
                    .iter()
                    .flat_map(|t| t.partition_data.iter())
                    .map(|p| p.records.as_ref().map_or(0, |r| r.len()));
                crate::telemetry::produce_sent(sizes, retries.saturating_sub(s.retries_told));
                s.retries_told = retries;
            }
        }
        built
    };
    let Some((request, token)) = built else {
        shared.dispatch();
        shared.wake_driver.notify_one();
        return;
    };
    let acks_zero = request.acks == 0;
    let result = if acks_zero {
        conn.send_raw(ApiKey::Produce, version, &request, false)
            .await
            .map(|_| None)
    } else {
        conn.send_version::<ProduceRequest>(&request, version)
            .await
            .map(Some)
    };
    {
        let mut s = lock(&shared.state);
        let now = Instant::now().into_std();
        match result {
            Ok(Some(response)) => {
                crate::telemetry::throttled(ApiKey::Produce, response.throttle_time_ms);
                s.acc.handle_produce(now, token, response);
            }
            Ok(None) => {
                s.acc.handle_unacknowledged(token);
                s.unanswered.insert(node);
            }
            Err(e) => {
                debug!(node = node.0, error = %e, "produce failed; retrying");
                s.acc.handle_failure(now, token);
            }
        }
    }
    shared.dispatch();
    shared.wake_driver.notify_one();
}

#[cfg(test)]
#[path = "properties/producer_tests.rs"]
mod property_tests;
