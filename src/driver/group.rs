//! The group member's task: one tokio task owns a [`GroupMember`] and one timer, sends
//! its requests through the cluster's connections, and forwards its events.
//!
//! The task never runs user code: the application reads [`Event`]s from the handle and
//! answers with commands (`commit`, `complete_revocation`, `progress`). Heartbeats are
//! sent by the task whatever the application is doing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::field::Empty;
use tracing::{Instrument, Span, debug, warn};

use super::cluster::{Cluster, TopicScope};
use super::connection::BrokerConnection;
use super::failure;
use super::sleep_until;
use crate::proto::group::Member;
use crate::proto::group::assignor::PartitionRacks;
use crate::proto::group::codec::{self, EncodedGroupRequest};
use crate::proto::group::consumer_protocol::TopicPartition;
use crate::proto::group::member::{
    AssignmentDone, CommitError, Event, Failure, GroupConfig, GroupProtocol, Membership, Outgoing,
    RequestId, StateKind, Target,
};
use crate::proto::group::messages::{CommitOffset, GroupRequest, GroupResponse};
use crate::proto::group::subscription::TopicPattern;
use crate::proto::metadata::{ClusterMetadata, NodeId, RefreshPace};
use crate::stats::{GroupCounters, GroupCounts};

/// A handle to a running group member. Dropping it makes the member leave the group.
#[derive(Debug)]
pub struct GroupHandle {
    tx: mpsc::Sender<Command>,
    events: mpsc::UnboundedReceiver<Event>,
    counters: Arc<GroupCounters>,
}

/// The command half of a [`GroupHandle`], cheap to clone: commits, revocations and
/// progress from any task. The member keeps running while a handle or commander lives.
#[derive(Debug, Clone)]
pub struct GroupCommander {
    tx: mpsc::Sender<Command>,
}

impl GroupCommander {
    /// Commits `offsets` with the live generation and waits for the result.
    pub async fn commit(
        &self,
        offsets: Vec<CommitOffset>,
    ) -> Result<Vec<CommitOffset>, CommitError> {
        commit(&self.tx, offsets).await
    }

    /// Starts a commit now and returns its result as a future. The commit is queued
    /// before this returns, so commits reach the coordinator in the order they were
    /// started whether or not the future is awaited.
    pub fn start_commit(
        &self,
        offsets: Vec<CommitOffset>,
    ) -> impl std::future::Future<Output = Result<Vec<CommitOffset>, CommitError>> + Send + 'static
    {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(Command::Commit(offsets, reply)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(command)) => {
                // The member is 64 commands behind; keep the command, keep waiting.
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(command).await;
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
        async move {
            rx.await
                .unwrap_or(Err(CommitError::Request(Failure::Disconnected)))
        }
    }

    /// Reports that the revocation of `generation`'s partitions is complete.
    pub async fn complete_revocation(&self, generation: i32) {
        let _ = self.tx.send(Command::CompleteRevocation(generation)).await;
    }

    /// The application is closing: a generation lost from now on is not joined again
    /// ([`GroupMember::prepare_to_close`](crate::proto::group::member::GroupMember::prepare_to_close)).
    pub async fn closing(&self) {
        let _ = self.tx.send(Command::Closing).await;
    }

    /// Replaces the subscription: `topics`, and the topics `pattern` matches (already
    /// checked with [`TopicPattern::new`]). Queued before this returns.
    pub fn subscribe(&self, topics: Vec<String>, pattern: Option<String>) {
        match self.tx.try_send(Command::Subscribe(topics, pattern)) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(command)) => {
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(command).await;
                });
            }
        }
    }

    /// Reports application progress without waiting; dropped if the queue is full
    /// (another report is then already queued).
    pub fn try_progress(&self) {
        let _ = self.tx.try_send(Command::Progress);
    }
}

async fn commit(
    tx: &mpsc::Sender<Command>,
    offsets: Vec<CommitOffset>,
) -> Result<Vec<CommitOffset>, CommitError> {
    let (reply, rx) = oneshot::channel();
    if tx.send(Command::Commit(offsets, reply)).await.is_err() {
        return Err(CommitError::Request(Failure::Disconnected));
    }
    rx.await
        .unwrap_or(Err(CommitError::Request(Failure::Disconnected)))
}

enum Command {
    Commit(
        Vec<CommitOffset>,
        oneshot::Sender<Result<Vec<CommitOffset>, CommitError>>,
    ),
    CompleteRevocation(i32),
    /// A new subscription: topic names, and a pattern (matched here under the classic
    /// protocol, by the broker under the consumer protocol).
    Subscribe(Vec<String>, Option<String>),
    Progress,
    Closing,
    Leave(Membership, oneshot::Sender<()>),
}

impl GroupHandle {
    /// Starts a member of `config.group_id` on `cluster`.
    pub fn spawn(cluster: Cluster, config: GroupConfig) -> Self {
        let (tx, rx) = mpsc::channel(64);
        let (events_tx, events) = mpsc::unbounded_channel();
        let metrics = GroupCounts::new(&config.group_id);
        let counters = metrics.shared();
        counters.set_group(&config.group_id, config.instance_id.clone());
        tokio::spawn(run(cluster, config, metrics, rx, events_tx));
        Self {
            tx,
            events,
            counters,
        }
    }

    /// The member's figures (rebalances, assignment, losses, commits), as its task
    /// counts them.
    pub(crate) fn counters(&self) -> Arc<GroupCounters> {
        self.counters.clone()
    }

    /// The next event, or `None` once the member has stopped.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// An event if one is ready.
    pub fn try_event(&mut self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// Commits `offsets` with the live generation and waits for the result.
    pub async fn commit(
        &self,
        offsets: Vec<CommitOffset>,
    ) -> Result<Vec<CommitOffset>, CommitError> {
        commit(&self.tx, offsets).await
    }

    /// A clonable command handle.
    pub fn commander(&self) -> GroupCommander {
        GroupCommander {
            tx: self.tx.clone(),
        }
    }

    /// Reports that the revocation of `generation`'s partitions is complete.
    pub async fn complete_revocation(&self, generation: i32) {
        let _ = self.tx.send(Command::CompleteRevocation(generation)).await;
    }

    /// Reports application progress (the `max.poll.interval.ms` guard).
    pub async fn progress(&self) {
        let _ = self.tx.send(Command::Progress).await;
    }

    /// Leaves the group (static members just stop) and waits until done.
    pub async fn leave(self) {
        self.leave_with(Membership::Default).await
    }

    /// Stops, leaving the group or not as `membership` says, and waits until done.
    pub async fn leave_with(self, membership: Membership) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Leave(membership, tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

type Reply = (RequestId, Result<GroupResponse, Failure>);

async fn run(
    cluster: Cluster,
    config: GroupConfig,
    mut metrics: GroupCounts,
    mut rx: mpsc::Receiver<Command>,
    events: mpsc::UnboundedSender<Event>,
) {
    let group = config.group_id.clone();
    // The refreshes the member asks for (a topic it must assign from), paced as the
    // consumer's and the producer's are.
    let mut metadata = RefreshPace::new(
        config.retry_backoff,
        config.retry_backoff_max,
        config.seed.rotate_left(53),
    );
    let mut refreshing: JoinSet<bool> = JoinSet::new();
    cluster.add_topics(config.topics.iter().cloned());
    let now = tokio::time::Instant::now().into_std();
    let mut spans = RebalanceSpans::new(&group);
    // The subscription: names, and under the classic protocol the pattern this task
    // matches against every metadata refresh, refreshed every `metadata.max.age.ms`
    // (the Java client's `subscribe(Pattern)`); the consumer protocol's broker matches.
    let classic = config.protocol == GroupProtocol::Classic;
    let max_age = config.metadata_max_age;
    let mut explicit = config.topics.clone();
    let mut pattern = match (&config.topic_regex, classic) {
        (Some(p), true) => match TopicPattern::new(p) {
            Ok(p) => Some(p),
            Err(e) => {
                warn!(%group, error = %e, "ignoring the topic pattern");
                None
            }
        },
        _ => None,
    };
    let mut pattern_refresh = pattern.as_ref().map(|_| now + max_age);
    let mut member = Member::new(config, entropy(), now);
    if let Some(p) = &pattern {
        member.set_subscription(
            now,
            p.subscription(&explicit, names(&cluster.metadata())),
            None,
        );
        metadata.request();
    }
    apply_metadata(&mut member, &cluster.metadata(), now);
    let mut inflight: JoinSet<Reply> = JoinSet::new();
    let mut assigning: JoinSet<AssignmentDone> = JoinSet::new();
    let mut coordinators: HashMap<NodeId, String> = HashMap::new();
    let mut commits: HashMap<RequestId, oneshot::Sender<Result<Vec<CommitOffset>, CommitError>>> =
        HashMap::new();
    let mut leaving: Option<oneshot::Sender<()>> = None;
    // Every refresh, whoever asked for it (the fetcher after a leadership error, this
    // task for the leader's periodic check), brings the member the latest counts.
    let mut updates = cluster.metadata_updates();
    updates.mark_unchanged();

    // The member orders OffsetCommits (one in flight); the task sends what it is given.
    let mut coordinator: Option<NodeId> = None;
    loop {
        // A coordinator the classic member gave up on (an error, a timeout, a session
        // without a successful heartbeat) is disconnected from, as the Java client does:
        // what waits on a host gone silent fails now, and the next requests reconnect.
        // Not the consumer protocol's (`Member::disconnects_lost_coordinator`).
        let current = member.coordinator();
        if let Some(old) = coordinator
            .filter(|old| current != Some(*old))
            .filter(|_| member.disconnects_lost_coordinator())
        {
            let address = coordinators
                .get(&old)
                .cloned()
                .or_else(|| cluster.metadata().broker(old).map(|b| b.address()));
            if let Some(address) = address {
                debug!(%group, coordinator = old.0, %address, "disconnecting from the coordinator given up on");
                cluster.disconnect_coordinator(&address);
            }
        }
        coordinator = current;
        while let Some(out) = member.poll_request() {
            let conn = connection_for(&cluster, &coordinators, &out);
            let span = spans.request(&out.request);
            inflight.spawn(send(conn, out).instrument(span));
        }
        // The leader's assignment runs on a blocking thread, so that the member goes
        // on heartbeating while a large group's assignment takes its time.
        while let Some(job) = member.poll_assignment() {
            let span = spans.assign(job.size().0);
            assigning.spawn_blocking(move || {
                let _assign = span.map(|s| s.entered());
                job.run()
            });
        }
        while let Some(event) = member.poll_event() {
            metrics.observe(&event);
            if let Some(took) = spans.observe(&event) {
                metrics.rebalanced(took);
            }
            match &event {
                Event::CoordinatorFound { node, address } => {
                    coordinators.insert(*node, address.clone());
                }
                Event::CommitCompleted { id, result } => {
                    if let Some(waiter) = commits.remove(id) {
                        let _ = waiter.send(result.clone());
                    }
                }
                Event::MetadataNeeded { topics } => {
                    cluster.add_topics(topics.iter().cloned());
                    metadata.request();
                }
                _ => {}
            }
            let _ = events.send(event);
        }
        if member.state() == StateKind::Closed {
            if let Some(done) = leaving.take() {
                let _ = done.send(());
            }
            // Fail commits that can no longer be answered.
            for (_, waiter) in commits.drain() {
                let _ = waiter.send(Err(CommitError::Request(Failure::Disconnected)));
            }
            debug!(%group, "group member closed");
            return;
        }
        if metadata.poll_start(tokio::time::Instant::now().into_std()) {
            // The counts reach the member through `updates`, as every refresh's.
            let cluster = cluster.clone();
            refreshing.spawn(async move { cluster.refresh_metadata().await.is_ok() });
        }
        let deadline = [
            member.poll_timeout(),
            metadata.poll_timeout(),
            pattern_refresh,
        ]
        .into_iter()
        .flatten()
        .min()
        .map(tokio::time::Instant::from_std);
        tokio::select! {
            Some(done) = refreshing.join_next(), if !refreshing.is_empty() => {
                metadata.handle_done(tokio::time::Instant::now().into_std(), done.unwrap_or(false));
            }
            Some(joined) = inflight.join_next(), if !inflight.is_empty() => {
                let now = tokio::time::Instant::now().into_std();
                match joined {
                    Ok((id, Ok(response))) => member.handle_response(now, id, response),
                    Ok((id, Err(failure))) => member.handle_failure(now, id, failure),
                    Err(e) => warn!(%group, error = %e, "group request task failed"),
                }
            }
            Some(done) = assigning.join_next(), if !assigning.is_empty() => {
                let now = tokio::time::Instant::now().into_std();
                match done {
                    Ok(done) => member.assignment_done(now, done),
                    // `run` catches the assignor's panics; this is the runtime shutting
                    // down. The member rejoins at the rebalance timeout if it lives on.
                    Err(e) => warn!(%group, error = %e, "the assignment task failed"),
                }
            }
            command = rx.recv(), if leaving.is_none() => {
                let now = tokio::time::Instant::now().into_std();
                match command {
                    Some(Command::Commit(offsets, reply)) => match member.commit(now, offsets) {
                        Ok(id) => {
                            commits.insert(id, reply);
                        }
                        Err(e) => {
                            metrics.refused(&e);
                            let _ = reply.send(Err(e));
                        }
                    },
                    Some(Command::CompleteRevocation(generation)) => {
                        spans.revoked(generation);
                        member.complete_revocation(now, generation);
                    }
                    Some(Command::Subscribe(topics, regex)) => {
                        explicit = topics;
                        cluster.add_topics(explicit.iter().cloned());
                        if regex.is_some() {
                            cluster.set_scope(TopicScope::All);
                        }
                        if classic {
                            pattern = regex.as_deref().and_then(|r| TopicPattern::new(r).ok());
                            pattern_refresh = pattern.as_ref().map(|_| now + max_age);
                            let topics = match &pattern {
                                Some(p) => p.subscription(&explicit, names(&cluster.metadata())),
                                None => explicit.clone(),
                            };
                            member.set_subscription(now, topics, None);
                        } else {
                            member.set_subscription(now, explicit.clone(), regex);
                        }
                        apply_metadata(&mut member, &cluster.metadata(), now);
                        metadata.request();
                    }
                    Some(Command::Progress) => member.note_progress(now),
                    Some(Command::Closing) => member.prepare_to_close(),
                    Some(Command::Leave(membership, done)) => {
                        leaving = Some(done);
                        member.leave_with(now, membership);
                    }
                    None => {
                        let (done, _) = oneshot::channel();
                        leaving = Some(done);
                        member.leave_with(now, Membership::Default);
                    }
                }
            }
            Ok(()) = updates.changed() => {
                updates.mark_unchanged();
                let now = tokio::time::Instant::now().into_std();
                let current = cluster.metadata();
                if let Some(p) = &pattern {
                    member.set_subscription(now, p.subscription(&explicit, names(&current)), None);
                }
                apply_metadata(&mut member, &current, now);
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                let now = tokio::time::Instant::now().into_std();
                if pattern_refresh.is_some_and(|at| now >= at) {
                    pattern_refresh = Some(now + max_age);
                    metadata.request();
                }
                member.handle_timeout(now);
            }
        }
    }
}

/// The spans of a member's rebalances and commits (the table in [`crate::trace`]).
struct RebalanceSpans {
    group: String,
    /// From the first JoinGroup (or revocation) of a rebalance to its assignment, and
    /// when it began (for `ottla.consumer.rebalance.duration`).
    rebalance: Option<(Span, std::time::Instant)>,
    /// From a revocation's request to the application's answer, with its generation.
    revoke: Option<(i32, Span)>,
}

impl RebalanceSpans {
    fn new(group: &str) -> Self {
        Self {
            group: group.to_string(),
            rebalance: None,
            revoke: None,
        }
    }

    /// The rebalance under way, opened if there is none.
    fn rebalance(&mut self) -> &Span {
        let group = &self.group;
        let (span, _) = self.rebalance.get_or_insert_with(|| {
            let span = tracing::info_span!(
                target: "ottla::rebalance",
                parent: None,
                "ottla.rebalance",
                group = %group,
                generation = Empty,
                member_id = Empty,
                leader = Empty,
                assigned = Empty,
            );
            (span, std::time::Instant::now())
        });
        span
    }

    /// The span a request is sent in (disabled for heartbeats and lookups).
    fn request(&mut self, request: &GroupRequest) -> Span {
        match request {
            GroupRequest::JoinGroup { .. } => {
                let parent = self.rebalance().clone();
                tracing::info_span!(target: "ottla::rebalance", parent: &parent, "ottla.join", group = %self.group)
            }
            GroupRequest::SyncGroup { .. } => {
                let parent = self.rebalance().clone();
                tracing::info_span!(target: "ottla::rebalance", parent: &parent, "ottla.sync", group = %self.group)
            }
            GroupRequest::OffsetCommit {
                generation,
                offsets,
                ..
            } => tracing::debug_span!(
                target: "ottla::commit",
                parent: None,
                "ottla.commit",
                group = %self.group,
                generation,
                partitions = offsets.len(),
            ),
            _ => Span::none(),
        }
    }

    /// The leader's assignor run, for `members` members (on the assignment's thread).
    fn assign(&self, members: usize) -> Option<Span> {
        self.rebalance.as_ref().map(|(parent, _)| {
            tracing::info_span!(
                target: "ottla::rebalance",
                parent: parent,
                "ottla.assign",
                group = %self.group,
                members,
            )
        })
    }

    /// Follows the member's `event`; a rebalance that ends here returns how long it
    /// took.
    fn observe(&mut self, event: &Event) -> Option<std::time::Duration> {
        match event {
            Event::Joined {
                generation,
                member_id,
                leader,
                ..
            } => {
                // Opened by the JoinGroup (or the revocation) that started it.
                let Some((span, _)) = &self.rebalance else {
                    return None;
                };
                span.record("generation", generation);
                span.record("member_id", member_id.as_str());
                span.record("leader", leader);
            }
            Event::Assigned { assignment, .. } => {
                let (span, began) = self.rebalance.take()?;
                span.record("assigned", assignment.len());
                return Some(began.elapsed());
            }
            Event::RevokeRequested {
                generation,
                partitions,
            } => {
                let parent = self.rebalance().clone();
                let span = tracing::info_span!(
                    target: "ottla::rebalance",
                    parent: &parent,
                    "ottla.revoke",
                    group = %self.group,
                    generation,
                    partitions = partitions.len(),
                );
                self.revoke = Some((*generation, span));
            }
            Event::Left | Event::Fatal(_) => {
                self.rebalance = None;
                self.revoke = None;
            }
            _ => {}
        }
        None
    }

    /// The application answered the revocation of `generation`.
    fn revoked(&mut self, generation: i32) {
        if self.revoke.as_ref().is_some_and(|(g, _)| *g == generation) {
            self.revoke = None;
        }
    }
}

/// Gives the member the partition counts, replica racks and topic ids of one metadata
/// snapshot.
/// The names of the topics `metadata` describes without an error.
fn names(metadata: &ClusterMetadata) -> Vec<&str> {
    metadata
        .topics
        .values()
        .filter(|t| t.error == 0)
        .map(|t| t.name.as_str())
        .collect()
}

fn apply_metadata(member: &mut Member, metadata: &ClusterMetadata, now: std::time::Instant) {
    let names = metadata
        .topics
        .values()
        .filter(|t| t.error == 0 && !t.id.is_nil())
        .map(|t| (t.id, t.name.clone()))
        .collect();
    member.set_metadata(now, counts(metadata), racks(metadata), names);
}

/// 16 bytes no other process makes, for the member id of the consumer protocol
/// (KIP-1082 asks for a random UUID): std's per-process random hash keys, mixed with
/// the time and a counter.
fn entropy() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u64(count);
        h.write_usize(i);
        h.write_u32(std::process::id());
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Partition counts by topic from the latest metadata. A topic the broker says does
/// not exist counts 0 partitions (it was deleted, or is not created yet), so a leader
/// that assigned it notices; a topic with another error (a leader election) is left
/// out, which keeps the count the member had.
fn counts(metadata: &ClusterMetadata) -> BTreeMap<String, i32> {
    const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    metadata
        .topics
        .values()
        .filter_map(|t| match t.error {
            0 => Some((
                t.name.clone(),
                i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
            )),
            UNKNOWN_TOPIC_OR_PARTITION => Some((t.name.clone(), 0)),
            _ => None,
        })
        .collect()
}

/// The racks holding a replica of each partition (every replica, in sync or not, as
/// the Java client), for rack-aware assignment. Partitions with no rack known are left
/// out.
fn racks(metadata: &ClusterMetadata) -> PartitionRacks {
    let mut out = PartitionRacks::new();
    for topic in metadata.topics.values().filter(|t| t.error == 0) {
        for p in &topic.partitions {
            let racks: std::collections::BTreeSet<String> = p
                .replicas
                .iter()
                .filter_map(|node| metadata.broker(*node).and_then(|b| b.rack.clone()))
                .collect();
            if !racks.is_empty() {
                out.insert(TopicPartition::new(topic.name.as_str(), p.partition), racks);
            }
        }
    }
    out
}

fn connection_for(
    cluster: &Cluster,
    coordinators: &HashMap<NodeId, String>,
    out: &Outgoing,
) -> Result<BrokerConnection, Failure> {
    match out.target {
        Target::AnyBroker => Ok(cluster.any_connection()),
        Target::Coordinator(node) => match coordinators.get(&node) {
            Some(address) => Ok(cluster.coordinator_connection(address)),
            None => cluster
                .metadata()
                .broker(node)
                .map(|b| cluster.coordinator_connection(&b.address()))
                .ok_or_else(|| Failure::Protocol(format!("unknown coordinator node {}", node.0))),
        },
    }
}

async fn send(conn: Result<BrokerConnection, Failure>, out: Outgoing) -> Reply {
    let id = out.id;
    (id, send_inner(conn, out.request, out.wait).await)
}

/// Sends `request`; `wait` replaces `request.timeout.ms` when the member says the
/// broker may hold it longer ([`Outgoing::wait`]).
async fn send_inner(
    conn: Result<BrokerConnection, Failure>,
    request: GroupRequest,
    wait: Option<Duration>,
) -> Result<GroupResponse, Failure> {
    let conn = conn?;
    let api = request.api();
    let table = conn.versions().await.map_err(failure)?;
    let version = table.version(api).ok_or_else(|| {
        Failure::Unsupported(format!(
            "{} offers no usable {api:?} version",
            conn.address()
        ))
    })?;
    let encoded = codec::encode(&request, version).map_err(|e| Failure::Protocol(e.to_string()))?;
    let frame = match encoded {
        EncodedGroupRequest::FindCoordinator(r) => conn.send_raw(api, version, &r, true).await,
        EncodedGroupRequest::JoinGroup(r) => {
            conn.send_raw_timeout(api, version, &r, true, wait).await
        }
        EncodedGroupRequest::SyncGroup(r) => conn.send_raw(api, version, &r, true).await,
        EncodedGroupRequest::Heartbeat(r) => conn.send_raw(api, version, &r, true).await,
        EncodedGroupRequest::LeaveGroup(r) => conn.send_raw(api, version, &r, true).await,
        EncodedGroupRequest::OffsetCommit(r) => conn.send_raw(api, version, &r, true).await,
        EncodedGroupRequest::OffsetFetch(r) => conn.send_raw(api, version, &r, true).await,
        EncodedGroupRequest::ConsumerGroupHeartbeat(r) => {
            conn.send_raw(api, version, &r, true).await
        }
    }
    .map_err(failure)?;
    codec::decode_response(api, version, frame.body).map_err(|e| Failure::Protocol(e.to_string()))
}
