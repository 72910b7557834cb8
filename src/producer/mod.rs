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
//! A record without an explicit partition goes where the partitioner puts it: by
//! default the Java client's (murmur2 of the key; unkeyed records stick to one partition
//! per batch), or any of librdkafka's by name ([`BuiltInPartitioner`]: a producer moved
//! from librdkafka keeps each key on its partition with librdkafka's `partitioner`
//! value, `consistent_random` by default), or a [`Partitioner`] of your own:
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::producer::{BuiltInPartitioner, Partitioner, Producer};
//!
//! /// Orders of one region together; everything else as librdkafka would.
//! #[derive(Debug)]
//! struct ByRegion;
//!
//! impl Partitioner for ByRegion {
//!     fn partition(&self, _topic: &str, key: Option<&[u8]>, partitions: i32) -> Option<i32> {
//!         let region = key?.strip_prefix(b"eu:")?;
//!         Some(i32::from(*region.first()?) % partitions)
//!     }
//! }
//!
//! let producer = Producer::builder("127.0.0.1:9092")
//!     .partitioner(BuiltInPartitioner::ConsistentRandom)
//!     .custom_partitioner(ByRegion)
//!     .build()
//!     .await?;
//! # producer.close().await;
//! # Ok(()) }
//! ```
//!
//! With a `transactional.id` the producer writes atomically: records (and a consumer
//! group's offsets) sent between [`Producer::begin_transaction`] and
//! [`Producer::commit_transaction`] become visible to `read_committed` consumers
//! together, or, after [`Producer::abort_transaction`], never. Errors say whether the
//! transaction must be aborted or the producer is finished (docs/exactly-once.md):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ottla::producer::{Producer, ProducerRecord};
//!
//! let producer = Producer::builder("127.0.0.1:9092")
//!     .transactional_id("orders-writer-1")
//!     .build()
//!     .await?;
//! producer.init_transactions().await?;
//! producer.begin_transaction()?;
//! producer.send(ProducerRecord::new("orders").value("a")).await?;
//! producer.send(ProducerRecord::new("audit").value("a")).await?;
//! match producer.commit_transaction().await {
//!     Ok(()) => {}
//!     Err(e) if e.txn_requires_abort() => producer.abort_transaction().await?,
//!     Err(e) => return Err(e.into()), // fatal (fenced): close the producer
//! }
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
use crate::error::{Error, RequestError, Result};
pub use crate::proto::fetch::batch::Compression;
use crate::proto::metadata::{NodeId, RefreshPace};
use crate::proto::produce::accumulator::{Accumulator, AccumulatorEvent, AppendError, RecordId};
pub use crate::proto::produce::accumulator::{
    Acks, ConnectionFailure, ProduceError, ProducerConfig,
};
use crate::proto::produce::encode::OutRecord;
pub use crate::proto::produce::partitioner::{
    BuiltInPartitioner, Partitioner, Placement, UnknownPartitioner,
};
pub use crate::proto::produce::record::ProducerRecord;

mod builder;
mod task;
mod txn;

use crate::stats::{ProduceCounts, ProducerStats};
pub use builder::ProducerBuilder;
use task::drive;
pub use txn::{
    ConsumerGroupMetadata, TransactionApi, TransactionError, TransactionErrorKind, TxnOffset,
};

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
            Ok(Err(ProduceError::Connection(e))) => match e.downcast_ref::<RequestError>() {
                Some(e) => Err(Error::Request(e.clone())),
                None => Err(Error::Produce(ProduceError::Connection(e))),
            },
            Ok(Err(e)) => Err(Error::Produce(e)),
            Err(_) => Err(Error::Produce(ProduceError::Closed)),
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
    /// The transaction manager, with a `transactional.id`.
    txn: Option<crate::proto::produce::transaction::TransactionManager>,
    /// Its IO: waiting callers, coordinators' addresses.
    txn_io: txn::TxnIo,
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
                txn,
                ..
            } = &mut *s;
            while let Some(d) = acc.poll_delivery() {
                freed = true;
                // A record of the transaction failed: the transaction must be aborted
                // (or the producer was fenced); the manager decides which.
                if let (Some(txn), Err(e)) = (txn.as_mut(), &d.result) {
                    txn.handle_produce_failure(e);
                }
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
                if let Some(txn) = &s.txn {
                    if let Err(e) = txn.check_send() {
                        return Err(Error::Transaction(e));
                    }
                }
                match s.acc.append(now, &record.topic, record.partition, r) {
                    Ok((id, tp)) => {
                        if let Some(txn) = s.txn.as_mut() {
                            // Checked above, under the same lock: cannot fail.
                            let _ = txn.add_partition(&tp);
                        }
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

    /// Aborts a transaction still open (as the Java producer's `close` does), flushes,
    /// then stops the background task.
    pub async fn close(self) {
        // A transaction still open is aborted first, as the Java producer's close does
        // ("Aborting incomplete transaction due to shutdown"): left open, it would
        // hold back every `read_committed` reader of its partitions (the last stable
        // offset) until the coordinator's `transaction.timeout.ms`.
        if self.transaction_open() {
            if let Err(error) = self.abort_transaction().await {
                warn!(%error, "the open transaction could not be aborted at close; the coordinator aborts it at its timeout");
            }
        }
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

impl Producer {
    /// Whether a transaction is open (begun and not ended, or only abortable).
    fn transaction_open(&self) -> bool {
        let s = lock(&self.shared.state);
        s.txn.as_ref().is_some_and(|t| t.is_open())
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
