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

mod builder;
mod events;
mod queue;
mod task;

pub use builder::ConsumerBuilder;
use task::{Driver, drive};

pub use events::ConsumerEvent;

use crate::config::ClientConfig;
pub use crate::driver::BrokerHangUp;
use crate::driver::{Cluster, GroupCommander, GroupHandle, TopicScope, lock, sleep_until};
use crate::error::{Error, Result};
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
    CommitError, DEFAULT_COOPERATIVE_UPGRADE, Failure, GroupConfig, GroupError, GroupProtocol,
    LostReason, Membership, StateKind,
};
use crate::proto::group::member::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_MAX_POLL_INTERVAL, DEFAULT_SESSION_TIMEOUT, Event,
    PendingRevocation, RevocationCommit, RevocationStep, check_heartbeat,
};
pub use crate::proto::group::messages::CommitOffset;
use crate::proto::group::subscription::{TopicPattern, split_patterns};
pub use crate::proto::metadata::NodeId;
use crate::proto::session::{
    CloseCommit, CloseStep, ConsumerSession, DEFAULT_CLOSE_TIMEOUT, SessionAction, SessionConfig,
};
use crate::stats::{ConsumerStats, DeliveryCounts, GroupCounters};
pub use queue::{CAPACITY as EVENTS_CAPACITY, Events};

/// ottla's default `partition.assignment.strategy`, in preference order: it shares an
/// assignor with every common client's default (see [`ConsumerBuilder::assignors`]).
pub const DEFAULT_ASSIGNORS: [&str; 3] = ["cooperative-sticky", "range", "roundrobin"];

/// The partition assignors, and the trait to write one's own
/// ([`ConsumerBuilder::custom_assignors`]).
pub mod assignor {
    pub use crate::proto::group::assignor::{
        AssignError, Assignor, CooperativeStickyAssignor, MemberSubscription, PartitionRacks,
        RangeAssignor, RebalanceProtocol, RoundRobinAssignor, StickyAssignor,
    };
    pub use crate::proto::group::consumer_protocol::{Assignment, Subscription};
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
    /// The offsets fetched at assignment whose metadata is not empty, with it.
    committed_metadata: BTreeMap<TopicPartition, (i64, String)>,
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

    /// Commits explicit offsets, each with its metadata (Java's `OffsetAndMetadata`):
    /// the partition's next owner reads it back with
    /// [`Consumer::committed_metadata`]. Brokers keep up to `offset.metadata.max.bytes`
    /// (4 KiB by default) and refuse the commit past it.
    pub async fn commit_offsets_with_metadata(
        &self,
        offsets: &[(TopicPartition, i64, Option<String>)],
    ) -> Result<()> {
        let commits = offsets
            .iter()
            .map(|(tp, o, m)| CommitOffset {
                partition: tp.clone(),
                offset: *o,
                leader_epoch: -1,
                metadata: m.clone(),
            })
            .collect();
        self.commit_list(commits).await
    }

    /// The offset committed for `partition` and the metadata committed with it, as
    /// fetched when the partition was assigned (`None`: no metadata, or empty).
    pub fn committed_metadata(&self, partition: &TopicPartition) -> Option<(i64, String)> {
        lock(&self.shared.app)
            .committed_metadata
            .get(partition)
            .cloned()
    }

    async fn commit_positions(&self, positions: Vec<(TopicPartition, i64, i32)>) -> Result<()> {
        self.commit_list(to_commit(positions)).await
    }

    async fn commit_list(&self, commits: Vec<CommitOffset>) -> Result<()> {
        let Some(group) = &self.group else {
            return Err(Error::Config {
                setting: "group.id",
                message: "commits need a group".into(),
            });
        };
        if commits.is_empty() {
            return Ok(());
        }
        let ticket = commit_ticket(&self.shared);
        let done = group.start_commit(commits).await?;
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

    /// Replaces a consumer's manual assignment (librdkafka's `assign`): partitions
    /// that stay keep their positions, partitions that go are dropped with their
    /// fetched records, new ones start from `auto.offset.reset` (then
    /// [`Consumer::seek`] them). Only for a consumer built with
    /// [`ConsumerBuilder::assign`]: a group's members get their partitions from the
    /// group.
    pub fn assign(&self, partitions: &[TopicPartition]) -> Result<()> {
        self.manual_only("assign")?;
        let current = self.assignment();
        let gone: Vec<TopicPartition> = current
            .iter()
            .filter(|tp| !partitions.contains(tp))
            .cloned()
            .collect();
        lock(&self.shared.fetcher).unassign(&gone);
        self.incremental_assign(partitions)
    }

    /// Adds partitions to a consumer's manual assignment (librdkafka's
    /// `incremental_assign`); those already assigned keep their positions, new ones
    /// start from `auto.offset.reset`. New topics join the metadata the consumer keeps.
    pub fn incremental_assign(&self, partitions: &[TopicPartition]) -> Result<()> {
        self.manual_only("incremental_assign")?;
        self.lookup
            .cluster
            .add_topics(partitions.iter().map(|tp| tp.topic.clone()));
        lock(&self.shared.fetcher).assign(partitions, false);
        self.shared.wake_driver.notify_one();
        Ok(())
    }

    /// Removes partitions from a consumer's manual assignment (librdkafka's
    /// `incremental_unassign`), with their fetched, undelivered records.
    pub fn incremental_unassign(&self, partitions: &[TopicPartition]) -> Result<()> {
        self.manual_only("incremental_unassign")?;
        lock(&self.shared.fetcher).unassign(partitions);
        self.shared.wake_driver.notify_one();
        Ok(())
    }

    /// Replaces the group subscription with `topics`, on a running consumer (the Java
    /// client's and librdkafka's `subscribe`). As in librdkafka, an entry starting with
    /// `^` is a pattern ([`Consumer::subscribe_pattern`]). The member rejoins the group
    /// with the new subscription: under `cooperative-sticky` only the partitions of
    /// topics that left or joined the subscription move; an eager member gives
    /// everything back first. Partitions of topics that left are revoked, their
    /// records committed as in any revocation. Only for a group consumer.
    pub fn subscribe<I, S>(&self, topics: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let topics: Vec<String> = topics.into_iter().map(|t| t.as_ref().to_string()).collect();
        let (names, pattern) = split_patterns(&topics);
        self.resubscribe(names, pattern, "subscribe")
    }

    /// Subscribes to every topic whose whole name `pattern` matches (the Java client's
    /// `subscribe(Pattern)`), replacing the subscription. Under the classic protocol
    /// the consumer matches, on each metadata refresh (`metadata.max.age.ms`, 5 min by
    /// default): a topic created later that matches joins the subscription and the
    /// group rebalances; a deleted one leaves it. Under the consumer protocol (KIP-848)
    /// the broker matches (RE2J syntax on Kafka). Internal topics (`__...`) are never
    /// matched by the consumer. An invalid pattern is an error naming it.
    pub fn subscribe_pattern(&self, pattern: &str) -> Result<()> {
        self.resubscribe(Vec::new(), Some(pattern.to_string()), "subscribe_pattern")
    }

    /// Subscribes to nothing: every partition is revoked (and committed as in any
    /// revocation), and the member stays in the group with an empty subscription until
    /// the next [`Consumer::subscribe`]. The Java client leaves the group instead; ottla
    /// keeps the membership so that a static member's id and a later `subscribe` need
    /// no new join from scratch.
    pub fn unsubscribe(&self) -> Result<()> {
        self.resubscribe(Vec::new(), None, "unsubscribe")
    }

    fn resubscribe(
        &self,
        topics: Vec<String>,
        pattern: Option<String>,
        call: &'static str,
    ) -> Result<()> {
        let Some(group) = &self.group else {
            return Err(Error::Config {
                setting: "group.id",
                message: format!(
                    "{call} is for a group consumer; a consumer without a group uses assign"
                ),
            });
        };
        if let Some(p) = &pattern {
            TopicPattern::new(p).map_err(|message| Error::Config {
                setting: "ottla.topic.regex",
                message,
            })?;
        }
        self.lookup.cluster.add_topics(topics.iter().cloned());
        group.subscribe(topics, pattern);
        Ok(())
    }

    fn manual_only(&self, call: &'static str) -> Result<()> {
        if self.group.is_some() {
            return Err(Error::Config {
                setting: "group.id",
                message: format!(
                    "{call} is for a consumer without a group (ConsumerBuilder::assign); a group's members get their partitions from the group"
                ),
            });
        }
        Ok(())
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

    /// What a transactional producer's
    /// [`send_offsets_to_transaction`](crate::Producer::send_offsets_to_transaction)
    /// needs (KIP-447): the group id, the member's generation and member id as its
    /// last join left them, and `group.instance.id`. The group coordinator refuses
    /// the transaction's offsets once the generation moved on, so a member that lost
    /// its partitions cannot commit a zombie's offsets. `None` without a `group.id`.
    pub fn group_metadata(&self) -> Option<crate::producer::ConsumerGroupMetadata> {
        self.group_counters.as_ref()?.member()
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

impl Consumer {
    /// Offsets a transaction committed for this consumer's group
    /// (`send_offsets_to_transaction`, then the commit): the consumer did not commit
    /// them itself, but its view of the committed offsets (the lag, `committed`)
    /// follows them as it follows its own commits.
    pub(crate) fn committed_in_transaction(&self, offsets: &[(TopicPartition, i64)]) {
        let ticket = commit_ticket(&self.shared);
        remember_offsets(&self.shared, offsets.iter().map(|(tp, o)| (tp, *o)), ticket);
    }
}

fn remember_committed(shared: &Shared, done: &[CommitOffset], ticket: u64) {
    remember_offsets(
        shared,
        done.iter().map(|c| (&c.partition, c.offset)),
        ticket,
    );
}

/// The committed offsets the consumer reports: each partition's from the newest commit
/// (by `ticket`) that answered.
fn remember_offsets<'a>(
    shared: &Shared,
    offsets: impl IntoIterator<Item = (&'a TopicPartition, i64)>,
    ticket: u64,
) {
    let mut app = lock(&shared.app);
    for (tp, offset) in offsets {
        let newer = app.committed.get(tp).is_none_or(|(_, t)| *t <= ticket);
        if newer {
            app.committed.insert(tp.clone(), (offset, ticket));
        }
    }
}
