//! Snapshots of a client's counters, for an application without a metrics backend:
//! [`Consumer::stats`](crate::Consumer::stats) and
//! [`Producer::stats`](crate::Producer::stats).
//!
//! They carry the figures of the consumer's and producer's named metrics
//! (docs/observability.md), from the same counting: with the `metrics` feature the
//! counters and the metrics are updated in one pass, and without it the counters are
//! still kept (a few additions per batch handed over, no lock and no allocation per
//! record). The snapshots themselves are built on demand and allocate.
//!
//! Counters start at zero when the client is built and only grow; gauges (lag,
//! partitions assigned, records pending) are as of the moment of the call.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::proto::group::consumer_protocol::TopicPartition;
use crate::proto::group::member::{CommitError, Event};
use crate::proto::group::messages::CommitOffset;
use crate::proto::produce::accumulator::ProduceError;
use crate::telemetry::{GroupMetrics, PartitionMetrics, TopicMetrics};

/// What a [`Processor`](crate::Processor) did in one run: records handled, retried,
/// dead-lettered, commits (`Processor::run`'s result, `ProcessorHandle::stats`).
pub use crate::proto::process::lanes::Stats as ProcessorStats;

/// What a [`Consumer`](crate::Consumer) has handed over and how its group has gone
/// ([`Consumer::stats`](crate::Consumer::stats)). The figures of the
/// `ottla.consumer.*` metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ConsumerStats {
    /// Records handed to the application (`recv`, `recv_batch`, the `Stream`, or a
    /// Processor's handler), over every partition.
    pub records: u64,
    /// Key plus value bytes of those records.
    pub bytes: u64,
    /// Every partition assigned now or handed over from before, by topic and
    /// partition.
    pub partitions: Vec<PartitionStats>,
    /// Partitions assigned to this member, as the group member last reported (with
    /// a manual assignment: the partitions assigned).
    pub partitions_assigned: u64,
    /// Generations joined (each JoinGroup and SyncGroup round that ended with an
    /// assignment). 0 without a group.
    pub rebalances: u64,
    /// Partitions taken away without a chance to commit (session lapsed, fenced).
    pub partitions_lost: u64,
    /// OffsetCommit outcomes, by result.
    pub commits: CommitStats,
    /// The node id of the group's coordinator as last found (`None` without a group,
    /// or before the first lookup).
    pub coordinator: Option<i32>,
    /// Successful coordinator lookups: 1 for a group that never moved, one more for
    /// each move, failover or reconnection that sent the member looking again.
    pub coordinator_lookups: u64,
}

impl ConsumerStats {
    /// The figures of one partition, if it is assigned or had records handed over.
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionStats> {
        self.partitions
            .iter()
            .find(|p| p.partition == partition && p.topic == topic)
    }

    /// The lag summed over the partitions whose lag is known.
    pub fn lag(&self) -> i64 {
        self.partitions.iter().filter_map(|p| p.lag).sum()
    }
}

/// One partition's figures in [`ConsumerStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct PartitionStats {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// Records of it handed to the application.
    pub records: u64,
    /// Key plus value bytes of those records.
    pub bytes: u64,
    /// The log end (the last stable offset under `read_committed`) minus the
    /// position, as of the last fetch, as [`Consumer::lag`](crate::Consumer::lag)
    /// gives it: 0 once a backlog has drained. `None` while no fetch of it has been
    /// answered, and for a partition no longer assigned.
    pub lag: Option<i64>,
}

/// OffsetCommit outcomes, by result: the `result` label of `ottla.consumer.commits`.
/// A commit of several partitions is one outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct CommitStats {
    /// Committed.
    pub ok: u64,
    /// No live generation to commit with (rebalancing, or not yet joined).
    pub no_generation: u64,
    /// The coordinator was not known.
    pub coordinator_unknown: u64,
    /// A partition in the commit was not owned by this member.
    pub not_owned: u64,
    /// The broker refused it.
    pub broker: u64,
    /// The request failed below the protocol (timeout, disconnect).
    pub request: u64,
    /// Answered after its generation ended.
    pub stale: u64,
    /// The member was closed.
    pub closed: u64,
}

impl CommitStats {
    /// Commits that failed, whatever the reason.
    pub fn failed(&self) -> u64 {
        self.no_generation
            + self.coordinator_unknown
            + self.not_owned
            + self.broker
            + self.request
            + self.stale
            + self.closed
    }
}

/// What a [`Producer`](crate::Producer) has written ([`Producer::stats`](crate::Producer::stats)).
/// The figures of the `ottla.producer.*` metrics, with the bytes and what is waiting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ProducerStats {
    /// Records acknowledged by the broker (with `acks = 0`: written), every topic.
    pub records: u64,
    /// Key plus value bytes of those records.
    pub bytes: u64,
    /// Records that failed for good, every topic and error.
    pub errors: u64,
    /// Per topic, in the order the topics were first delivered to.
    pub topics: Vec<TopicStats>,
    /// Records sent and not yet delivered (buffered, or in a request awaiting its
    /// answer), now.
    pub pending_records: u64,
    /// The `buffer.memory` in use now: bytes of records not yet delivered.
    pub buffered_bytes: u64,
    /// Record batches sent again after a failed or refused attempt.
    pub retries: u64,
}

impl ProducerStats {
    /// The figures of one topic, if a record of it was delivered or failed.
    pub fn topic(&self, topic: &str) -> Option<&TopicStats> {
        self.topics.iter().find(|t| t.topic == topic)
    }
}

/// One topic's figures in [`ProducerStats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct TopicStats {
    /// The topic.
    pub topic: String,
    /// Records acknowledged.
    pub records: u64,
    /// Key plus value bytes of those records.
    pub bytes: u64,
    /// Records that failed for good, by the `error` label of `ottla.producer.errors`:
    /// the broker's error name (`MessageTooLarge`, ...), or `delivery_timeout`,
    /// `encode`, `closed`, `connection`. In the order first seen.
    pub errors: Vec<(String, u64)>,
}

impl TopicStats {
    /// Records that failed for good, whatever the error.
    pub fn failed(&self) -> u64 {
        self.errors.iter().map(|(_, n)| n).sum()
    }
}

// ----- the consumer's delivery counts -----

/// One partition's delivery counts and metric handles.
#[derive(Debug)]
struct PartitionCount {
    topic: Arc<str>,
    partition: i32,
    records: u64,
    bytes: u64,
    metrics: PartitionMetrics,
}

/// What a consumer hands to the application, per partition: kept by the
/// application's side of the consumer, which counts each batch it hands over (not
/// each record) and feeds the `metrics` feature's handles in the same pass.
#[derive(Debug)]
pub(crate) struct DeliveryCounts {
    group: String,
    /// In the order first handed over from; the last one found is tried first.
    partitions: Vec<PartitionCount>,
    last: usize,
    /// Where each partition is in `partitions`, by topic and partition: found without
    /// allocating, and without the scan that made a consumer of 10,000 partitions pay
    /// for all of them on every run of records it handed over.
    index: HashMap<Arc<str>, HashMap<i32, usize>>,
}

impl DeliveryCounts {
    pub(crate) fn new(group: Option<&str>) -> Self {
        Self {
            group: group.unwrap_or("").to_string(),
            partitions: Vec::new(),
            last: 0,
            index: HashMap::new(),
        }
    }

    fn partition(&mut self, topic: &Arc<str>, partition: i32) -> Option<&mut PartitionCount> {
        let is = |p: &PartitionCount| {
            p.partition == partition && (Arc::ptr_eq(&p.topic, topic) || *p.topic == **topic)
        };
        let at = match self.partitions.get(self.last) {
            Some(p) if is(p) => self.last,
            _ => match self.index.get(&**topic).and_then(|t| t.get(&partition)) {
                Some(&i) => i,
                None => {
                    let i = self.partitions.len();
                    self.partitions.push(PartitionCount {
                        topic: topic.clone(),
                        partition,
                        records: 0,
                        bytes: 0,
                        metrics: PartitionMetrics::new(&self.group, topic, partition),
                    });
                    self.index
                        .entry(topic.clone())
                        .or_default()
                        .insert(partition, i);
                    i
                }
            },
        };
        self.last = at;
        self.partitions.get_mut(at)
    }

    /// `records` records of `bytes` bytes of a partition were handed over; `lag`
    /// gives the partition's lag after them, for the lag gauge (asked only with the
    /// `metrics` feature: the snapshot reads the lag when it is taken).
    pub(crate) fn delivered(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        records: u64,
        bytes: u64,
        lag: impl FnOnce(&TopicPartition) -> Option<i64>,
    ) {
        if let Some(p) = self.partition(topic, partition) {
            p.records += records;
            p.bytes += bytes;
            p.metrics.delivered(records, bytes, lag);
        }
    }

    /// One record of `bytes` bytes was handed over (`recv`, the `Stream`): the
    /// partition of the previous record is tried inline first, so a record costs a
    /// comparison and two additions.
    #[inline]
    pub(crate) fn delivered_one(
        &mut self,
        topic: &Arc<str>,
        partition: i32,
        bytes: u64,
        lag: impl FnOnce(&TopicPartition) -> Option<i64>,
    ) {
        if let Some(p) = self.partitions.get_mut(self.last) {
            if p.partition == partition && Arc::ptr_eq(&p.topic, topic) {
                p.records += 1;
                p.bytes += bytes;
                p.metrics.delivered(1, bytes, lag);
                return;
            }
        }
        self.delivered(topic, partition, 1, bytes, lag);
    }

    /// The snapshot's per-partition counts: one entry per partition handed over from,
    /// with its lag from `lag`, then the `assigned` partitions not handed over from
    /// yet; sorted by topic and partition.
    pub(crate) fn snapshot(
        &self,
        assigned: &[TopicPartition],
        lag: impl Fn(&TopicPartition) -> Option<i64>,
        into: &mut ConsumerStats,
    ) {
        // Sets, not scans: a snapshot of 10,000 partitions took 10^8 comparisons.
        let owned_set: HashSet<(&str, i32)> = assigned
            .iter()
            .map(|tp| (tp.topic.as_str(), tp.partition))
            .collect();
        let mut out: Vec<PartitionStats> =
            Vec::with_capacity(self.partitions.len().max(assigned.len()));
        for p in &self.partitions {
            let tp = TopicPartition {
                topic: p.topic.to_string(),
                partition: p.partition,
            };
            let owned = owned_set.contains(&(&*p.topic, p.partition));
            into.records += p.records;
            into.bytes += p.bytes;
            out.push(PartitionStats {
                lag: if owned { lag(&tp) } else { None },
                topic: tp.topic,
                partition: p.partition,
                records: p.records,
                bytes: p.bytes,
            });
        }
        let mut listed: HashSet<(&str, i32)> = HashSet::new();
        for tp in assigned {
            let seen = self
                .index
                .get(tp.topic.as_str())
                .is_some_and(|t| t.contains_key(&tp.partition));
            if !seen && listed.insert((tp.topic.as_str(), tp.partition)) {
                out.push(PartitionStats {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    records: 0,
                    bytes: 0,
                    lag: lag(tp),
                });
            }
        }
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        into.partitions = out;
    }
}

// ----- the consumer's group counts -----

/// An OffsetCommit's outcome: the `result` label, and a field of [`CommitStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitResult {
    Ok,
    NoGeneration,
    CoordinatorUnknown,
    NotOwned,
    Broker,
    Request,
    Stale,
    Closed,
}

impl CommitResult {
    const ALL: [CommitResult; 8] = [
        CommitResult::Ok,
        CommitResult::NoGeneration,
        CommitResult::CoordinatorUnknown,
        CommitResult::NotOwned,
        CommitResult::Broker,
        CommitResult::Request,
        CommitResult::Stale,
        CommitResult::Closed,
    ];

    pub(crate) fn of(result: &Result<Vec<CommitOffset>, CommitError>) -> Self {
        match result {
            Ok(_) => CommitResult::Ok,
            Err(e) => CommitResult::failed(e),
        }
    }

    fn failed(e: &CommitError) -> Self {
        match e {
            CommitError::NoGeneration => CommitResult::NoGeneration,
            CommitError::CoordinatorUnknown => CommitResult::CoordinatorUnknown,
            CommitError::NotOwned(_) => CommitResult::NotOwned,
            CommitError::Broker { .. } => CommitResult::Broker,
            CommitError::Request(_) => CommitResult::Request,
            CommitError::Stale { .. } => CommitResult::Stale,
            CommitError::Closed(_) => CommitResult::Closed,
            _ => CommitResult::Broker,
        }
    }

    /// The `result` label of `ottla.consumer.commits`.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn label(self) -> &'static str {
        match self {
            CommitResult::Ok => "ok",
            CommitResult::NoGeneration => "no_generation",
            CommitResult::CoordinatorUnknown => "coordinator_unknown",
            CommitResult::NotOwned => "not_owned",
            CommitResult::Broker => "broker",
            CommitResult::Request => "request",
            CommitResult::Stale => "stale",
            CommitResult::Closed => "closed",
        }
    }

    fn field(self, stats: &mut CommitStats) -> &mut u64 {
        match self {
            CommitResult::Ok => &mut stats.ok,
            CommitResult::NoGeneration => &mut stats.no_generation,
            CommitResult::CoordinatorUnknown => &mut stats.coordinator_unknown,
            CommitResult::NotOwned => &mut stats.not_owned,
            CommitResult::Broker => &mut stats.broker,
            CommitResult::Request => &mut stats.request,
            CommitResult::Stale => &mut stats.stale,
            CommitResult::Closed => &mut stats.closed,
        }
    }
}

/// A consumer's group figures, written by the group member's task and read by
/// [`Consumer::stats`](crate::Consumer::stats) from the application's.
#[derive(Debug, Default)]
pub(crate) struct GroupCounters {
    assigned: AtomicU64,
    rebalances: AtomicU64,
    lost: AtomicU64,
    /// By [`CommitResult`], in the order of [`CommitResult::ALL`].
    commits: [AtomicU64; 8],
    /// The coordinator's node id plus one (0: none found yet).
    coordinator: AtomicU64,
    coordinator_lookups: AtomicU64,
    /// The member's group metadata (KIP-447), as the last join left it.
    member: std::sync::Mutex<Option<crate::producer::ConsumerGroupMetadata>>,
}

impl GroupCounters {
    /// The group metadata for a transaction's offsets
    /// ([`Consumer::group_metadata`](crate::Consumer::group_metadata)).
    pub(crate) fn member(&self) -> Option<crate::producer::ConsumerGroupMetadata> {
        crate::sync::lock(&self.member).clone()
    }

    /// The member joined `generation` (or, under the consumer protocol, its epoch
    /// moved on: `member_id` is `None`). Set by the consumer's task as it queues the
    /// application's events, not by the group's as it sees them: whoever reads the
    /// metadata and then the queued events reads every event of the generations
    /// before it (a loss among them), so it never commits a transaction's offsets
    /// with a generation whose losses it has not seen.
    pub(crate) fn set_member(&self, generation: i32, member_id: Option<&str>) {
        if let Some(m) = crate::sync::lock(&self.member).as_mut() {
            m.generation_id = generation;
            if let Some(id) = member_id {
                id.clone_into(&mut m.member_id);
            }
        }
    }

    /// The member's group and instance id, before it joins (generation -1, no
    /// member id).
    pub(crate) fn set_group(&self, group_id: &str, instance_id: Option<String>) {
        *crate::sync::lock(&self.member) = Some(crate::producer::ConsumerGroupMetadata {
            group_id: group_id.to_string(),
            generation_id: -1,
            member_id: String::new(),
            group_instance_id: instance_id,
        });
    }

    /// Adds these figures to `into`.
    pub(crate) fn read(&self, into: &mut ConsumerStats) {
        into.partitions_assigned = self.assigned.load(Ordering::Relaxed);
        into.rebalances = self.rebalances.load(Ordering::Relaxed);
        into.partitions_lost = self.lost.load(Ordering::Relaxed);
        into.coordinator = match self.coordinator.load(Ordering::Relaxed) {
            0 => None,
            n => i32::try_from(n - 1).ok(),
        };
        into.coordinator_lookups = self.coordinator_lookups.load(Ordering::Relaxed);
        for (result, n) in CommitResult::ALL.iter().zip(&self.commits) {
            *result.field(&mut into.commits) = n.load(Ordering::Relaxed);
        }
    }
}

/// A consumer's group figures, counted in the group member's task: it sees every
/// event before the consumer does, and answers a commit's caller only after the
/// commit is counted. Feeds the `metrics` feature's handles in the same pass.
#[derive(Debug)]
pub(crate) struct GroupCounts {
    shared: Arc<GroupCounters>,
    metrics: GroupMetrics,
    /// Partitions owned, as the events tell.
    owned: u64,
}

impl GroupCounts {
    pub(crate) fn new(group: &str) -> Self {
        Self {
            shared: Arc::default(),
            metrics: GroupMetrics::new(group),
            owned: 0,
        }
    }

    /// The counters, for the consumer's side to read.
    pub(crate) fn shared(&self) -> Arc<GroupCounters> {
        self.shared.clone()
    }

    /// One event of the group member.
    pub(crate) fn observe(&mut self, event: &Event) {
        let c = &self.shared;
        match event {
            Event::Joined { .. } => {
                c.rebalances.fetch_add(1, Ordering::Relaxed);
                self.metrics.joined();
            }
            Event::Assigned { assignment, .. } => {
                self.owned = assignment.len() as u64;
                c.assigned.store(self.owned, Ordering::Relaxed);
                self.metrics.assigned(self.owned);
            }
            Event::Lost { partitions, .. } => {
                let lost = partitions.len() as u64;
                self.owned = self.owned.saturating_sub(lost);
                c.assigned.store(self.owned, Ordering::Relaxed);
                c.lost.fetch_add(lost, Ordering::Relaxed);
                self.metrics.assigned(self.owned);
                self.metrics.lost(lost);
            }
            Event::CommitCompleted { result, .. } => self.committed(CommitResult::of(result)),
            Event::CoordinatorFound { node, .. } => {
                let plus_one = u64::try_from(node.0).map_or(0, |n| n + 1);
                c.coordinator.store(plus_one, Ordering::Relaxed);
                c.coordinator_lookups.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// A rebalance ended with an assignment, `took` after it began.
    pub(crate) fn rebalanced(&self, took: std::time::Duration) {
        self.metrics.rebalanced(took);
    }

    /// A commit the member refused before sending it (no live generation, the
    /// coordinator unknown, a partition not owned, closed): it emits no event for it.
    pub(crate) fn refused(&mut self, e: &CommitError) {
        self.committed(CommitResult::failed(e));
    }

    fn committed(&mut self, result: CommitResult) {
        let slot = CommitResult::ALL.iter().position(|r| *r == result);
        if let Some(n) = slot.and_then(|i| self.shared.commits.get(i)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.committed(result);
    }
}

// ----- the producer's counts -----

/// One topic's producer counts and metric handles.
#[derive(Debug)]
struct TopicCount {
    topic: String,
    records: u64,
    bytes: u64,
    /// Records counted by the metrics so far: they are told once per dispatch.
    published: u64,
    errors: Vec<(String, u64)>,
    metrics: TopicMetrics,
}

/// What a producer delivered, per topic: kept under the producer's state lock, which
/// its dispatch of deliveries already holds.
#[derive(Debug, Default)]
pub(crate) struct ProduceCounts {
    topics: Vec<TopicCount>,
    last: usize,
}

impl ProduceCounts {
    fn topic(&mut self, topic: &str) -> Option<&mut TopicCount> {
        let at = match self.topics.get(self.last) {
            Some(t) if t.topic == topic => self.last,
            _ => match self.topics.iter().position(|t| t.topic == topic) {
                Some(i) => i,
                None => {
                    self.topics.push(TopicCount {
                        topic: topic.to_string(),
                        records: 0,
                        bytes: 0,
                        published: 0,
                        errors: Vec::new(),
                        metrics: TopicMetrics::new(topic),
                    });
                    self.topics.len() - 1
                }
            },
        };
        self.last = at;
        self.topics.get_mut(at)
    }

    /// A record of `bytes` key and value bytes was acknowledged.
    pub(crate) fn acknowledged(&mut self, topic: &str, bytes: u64) {
        if let Some(t) = self.topic(topic) {
            t.records += 1;
            t.bytes += bytes;
        }
    }

    /// A record failed for good.
    pub(crate) fn failed(&mut self, topic: &str, error: &ProduceError) {
        let label = crate::telemetry::produce_error_label(error);
        let Some(t) = self.topic(topic) else {
            return;
        };
        t.metrics.failed(&label);
        match t.errors.iter_mut().find(|(e, _)| *e == label) {
            Some((_, n)) => *n += 1,
            None => t.errors.push((label, 1)),
        }
    }

    /// Tells the metrics what was acknowledged since the last call: once per
    /// dispatch, not per record.
    pub(crate) fn publish(&mut self) {
        for t in &mut self.topics {
            if t.records > t.published {
                t.metrics.acknowledged(t.records - t.published);
                t.published = t.records;
            }
        }
    }

    pub(crate) fn snapshot(&self, into: &mut ProducerStats) {
        into.topics = self
            .topics
            .iter()
            .map(|t| TopicStats {
                topic: t.topic.clone(),
                records: t.records,
                bytes: t.bytes,
                errors: t.errors.clone(),
            })
            .collect();
        into.records = self.topics.iter().map(|t| t.records).sum();
        into.bytes = self.topics.iter().map(|t| t.bytes).sum();
        into.errors = into.topics.iter().map(TopicStats::failed).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.to_string(),
            partition,
        }
    }

    #[test]
    fn a_snapshot_lists_delivered_and_assigned_partitions_in_order_with_their_lag() {
        let mut counts = DeliveryCounts::new(Some("g"));
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        counts.delivered(&b, 1, 3, 30, |_| Some(7));
        counts.delivered(&a, 0, 2, 20, |_| Some(5));
        // The same topic through another `Arc`: the same partition.
        counts.delivered(&"b".into(), 1, 1, 10, |_| Some(6));
        let assigned = [tp("a", 0), tp("a", 1)];
        let mut stats = ConsumerStats::default();
        counts.snapshot(
            &assigned,
            |tp| Some(i64::from(tp.partition) + 1),
            &mut stats,
        );
        let shown: Vec<_> = stats
            .partitions
            .iter()
            .map(|p| (p.topic.as_str(), p.partition, p.records, p.bytes, p.lag))
            .collect();
        assert_eq!(
            shown,
            [
                ("a", 0, 2, 20, Some(1)),
                ("a", 1, 0, 0, Some(2)),
                // Handed over from before, no longer assigned: no lag.
                ("b", 1, 4, 40, None),
            ]
        );
        assert_eq!((stats.records, stats.bytes, stats.lag()), (6, 60, 3));
        assert_eq!(stats.partition("b", 1).map(|p| p.records), Some(4));
    }

    #[test]
    fn counts_of_many_partitions_in_any_order_land_on_their_own_partition() {
        // Found through the index, not a scan: partitions of two topics, handed over
        // in an order that never repeats the last one.
        let mut counts = DeliveryCounts::new(None);
        let topics: [Arc<str>; 2] = ["a".into(), "b".into()];
        for round in 0..3u64 {
            for p in (0..500).rev() {
                for t in &topics {
                    counts.delivered(t, p, 1, round + 1, |_| None);
                }
            }
        }
        let assigned: Vec<TopicPartition> = (0..501).map(|p| tp("a", p)).collect();
        let mut stats = ConsumerStats::default();
        counts.snapshot(&assigned, |_| Some(0), &mut stats);
        assert_eq!(
            stats.partitions.len(),
            1001,
            "a/500 is assigned, not handed over"
        );
        assert_eq!((stats.records, stats.bytes), (3000, 6000));
        assert!(
            stats
                .partitions
                .iter()
                .all(|p| p.partition == 500 || p.records == 3)
        );
        assert_eq!(stats.partition("a", 500).map(|p| p.records), Some(0));
        assert_eq!(stats.partition("b", 7).map(|p| p.lag), Some(None));
        assert_eq!(stats.partition("a", 7).map(|p| p.lag), Some(Some(0)));
    }

    #[test]
    fn every_commit_result_has_its_own_field_and_label() {
        let mut stats = CommitStats::default();
        let mut labels = Vec::new();
        for (i, r) in CommitResult::ALL.iter().enumerate() {
            *r.field(&mut stats) += 1 << i;
            labels.push(r.label());
        }
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), CommitResult::ALL.len());
        assert_eq!(stats.ok, 1);
        assert_eq!(stats.failed(), (1 << CommitResult::ALL.len()) - 2);
    }

    #[test]
    fn producer_counts_sum_per_topic_and_name_errors() {
        let mut counts = ProduceCounts::default();
        counts.acknowledged("a", 10);
        counts.acknowledged("b", 5);
        counts.acknowledged("a", 10);
        counts.failed("b", &ProduceError::Closed);
        counts.failed("b", &ProduceError::Closed);
        counts.publish();
        let mut stats = ProducerStats::default();
        counts.snapshot(&mut stats);
        assert_eq!((stats.records, stats.bytes, stats.errors), (3, 25, 2));
        let b = stats.topic("b").expect("b");
        assert_eq!(b.errors, [("closed".to_string(), 2)]);
        assert_eq!(b.failed(), 2);
        assert_eq!(
            stats.topic("a").map(|a| (a.records, a.bytes)),
            Some((2, 20))
        );
    }
}
