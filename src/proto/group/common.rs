//! What both group protocols' members need, written once: the outbox that numbers
//! requests and remembers why each was sent, coordinator discovery and its backoff,
//! the commit queue, the pending OffsetFetch of newly assigned partitions, and the
//! owned partitions with the way they are lost.
//!
//! Each piece is plain state with methods that take `now` (and the member's
//! [`Backoff`] where a retry waits); none reads a clock or emits anything but what its
//! caller pushes on.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::consumer_protocol::TopicPartition;
use super::member::{
    CommitError, Event, GroupError, LostReason, Outgoing, RequestId, Target, Timer,
};
use super::messages::GroupRequest;
use crate::proto::backoff::Backoff;
use crate::proto::metadata::NodeId;

/// Requests waiting for the driver, each with a [`RequestId`], what it was sent for
/// (`S`) and, for a request to the coordinator, which coordinator it went to.
#[derive(Debug)]
pub(crate) struct Outbox<S> {
    next: u64,
    requests: VecDeque<Outgoing>,
    sent: BTreeMap<RequestId, S>,
    /// The coordinator epoch ([`CoordinatorLookup::epoch`]) each request to the
    /// coordinator went out under.
    coordinator: BTreeMap<RequestId, u64>,
}

impl<S> Outbox<S> {
    pub(crate) fn new() -> Self {
        Self {
            next: 0,
            requests: VecDeque::new(),
            sent: BTreeMap::new(),
            coordinator: BTreeMap::new(),
        }
    }

    /// A fresh id, for a request queued elsewhere before it is sent (a commit).
    pub(crate) fn reserve(&mut self) -> RequestId {
        let id = RequestId(self.next);
        self.next += 1;
        id
    }

    /// Queues `request` for `target` under a fresh id.
    pub(crate) fn send(
        &mut self,
        target: Target,
        request: GroupRequest,
        sent: S,
        coordinator_epoch: u64,
    ) -> RequestId {
        let id = self.reserve();
        self.send_as(id, target, request, sent, coordinator_epoch);
        id
    }

    /// Queues `request` under `id` (from [`Outbox::reserve`]).
    pub(crate) fn send_as(
        &mut self,
        id: RequestId,
        target: Target,
        request: GroupRequest,
        sent: S,
        coordinator_epoch: u64,
    ) {
        self.sent.insert(id, sent);
        if matches!(target, Target::Coordinator(_)) {
            self.coordinator.insert(id, coordinator_epoch);
        }
        self.requests.push_back(Outgoing {
            id,
            target,
            request,
        });
    }

    /// The next request for the driver.
    pub(crate) fn poll(&mut self) -> Option<Outgoing> {
        self.requests.pop_front()
    }

    /// What request `id` was sent for, and whether it went to the coordinator known
    /// under `coordinator_epoch` (requests to any broker count as such); `None` for an
    /// id this outbox no longer waits for.
    pub(crate) fn answered(&mut self, id: RequestId, coordinator_epoch: u64) -> Option<(S, bool)> {
        let same = self
            .coordinator
            .remove(&id)
            .is_none_or(|epoch| epoch == coordinator_epoch);
        self.sent.remove(&id).map(|s| (s, same))
    }

    /// Puts back what [`Outbox::answered`] took, so a failure handler can see it.
    pub(crate) fn restore(&mut self, id: RequestId, sent: S) {
        self.sent.insert(id, sent);
    }
}

/// Where the coordinator is: looked up through any broker, given up on after an
/// error or a silence, and looked up again at a pace that backs off while coordinators
/// keep refusing (KIP-580).
#[derive(Debug, Clone)]
pub(crate) struct CoordinatorLookup {
    state: Coordinator,
    /// Bumped each time a coordinator is found; requests to the coordinator record it,
    /// so a failure from one given up on says nothing about the one found since.
    epoch: u64,
    /// Lookups failed in a row.
    failures: u32,
    /// Coordinators given up on since one last answered a request without refusing:
    /// the pace of rediscovery backs off with it.
    rediscoveries: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Coordinator {
    Unknown {
        lookup: Option<(RequestId, Instant)>,
        retry_at: Instant,
    },
    Known(NodeId),
}

/// What a FindCoordinator answer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// Not the lookup in flight: ignored.
    Stale,
    /// Refused with `code`; the next lookup waits for the backoff.
    Refused(i16),
    /// Found.
    Found(NodeId),
}

impl CoordinatorLookup {
    /// Unknown, to be looked up at once.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            state: Coordinator::Unknown {
                lookup: None,
                retry_at: now,
            },
            epoch: 0,
            failures: 0,
            rediscoveries: 0,
        }
    }

    /// The coordinator, if known.
    pub(crate) fn known(&self) -> Option<NodeId> {
        match self.state {
            Coordinator::Known(n) => Some(n),
            Coordinator::Unknown { .. } => None,
        }
    }

    /// The epoch requests to the coordinator are sent under.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The lookup to send now, if one is due: the caller sends a FindCoordinator with
    /// the id from `send` and the lookup waits for it until `now + timeout`.
    pub(crate) fn lookup_due(
        &mut self,
        now: Instant,
        timeout: Duration,
        send: impl FnOnce() -> RequestId,
    ) {
        if let Coordinator::Unknown {
            lookup: None,
            retry_at,
        } = self.state
            && now >= retry_at
        {
            let id = send();
            self.state = Coordinator::Unknown {
                lookup: Some((id, now + timeout)),
                retry_at,
            };
        }
    }

    /// The lookup's timer, while the member is active: the next lookup (after its
    /// backoff) or the one in flight's deadline.
    pub(crate) fn timer(&self) -> Option<(Timer, Instant)> {
        match &self.state {
            Coordinator::Unknown {
                lookup: None,
                retry_at,
            } => Some((Timer::Coordinator, *retry_at)),
            Coordinator::Unknown {
                lookup: Some((_, deadline)),
                ..
            } => Some((Timer::Request, *deadline)),
            Coordinator::Known(_) => None,
        }
    }

    /// The lookup in flight, if it is overdue at `now`.
    pub(crate) fn overdue(&self, now: Instant) -> Option<RequestId> {
        match self.state {
            Coordinator::Unknown {
                lookup: Some((id, deadline)),
                ..
            } if now >= deadline => Some(id),
            _ => None,
        }
    }

    /// A FindCoordinator answer. A refusal or a negative node id waits for the
    /// backoff; the caller decides whether the code is fatal.
    pub(crate) fn on_answer(
        &mut self,
        now: Instant,
        id: RequestId,
        error: i16,
        node_id: i32,
        backoff: &mut Backoff,
    ) -> Lookup {
        let Coordinator::Unknown { lookup, retry_at } = &mut self.state else {
            return Lookup::Stale;
        };
        if lookup.map(|(l, _)| l) != Some(id) {
            return Lookup::Stale;
        }
        *lookup = None;
        if error != 0 || node_id < 0 {
            self.failures += 1;
            *retry_at = now + backoff.delay(self.failures);
            return Lookup::Refused(error);
        }
        self.failures = 0;
        let node = NodeId(node_id);
        self.state = Coordinator::Known(node);
        self.epoch += 1;
        Lookup::Found(node)
    }

    /// The lookup `id` failed without an answer; the next waits for the backoff.
    pub(crate) fn on_failure(&mut self, now: Instant, id: RequestId, backoff: &mut Backoff) {
        if let Coordinator::Unknown { lookup, retry_at } = &mut self.state
            && lookup.map(|(l, _)| l) == Some(id)
        {
            *lookup = None;
            self.failures += 1;
            *retry_at = now + backoff.delay(self.failures);
        }
    }

    /// A request went through without the coordinator refusing: rediscoveries start
    /// over.
    pub(crate) fn note_served(&mut self) {
        self.rediscoveries = 0;
    }

    /// Gives up on the coordinator (Java's `markCoordinatorUnknown`). The first
    /// rediscovery waits `first` (`retry.backoff.ms`); a coordinator that keeps
    /// refusing after being found again is asked at a pace that backs off to
    /// `retry.backoff.max.ms`, until a request goes through. Returns the coordinator
    /// given up on and the wait, or `None` if none was known.
    pub(crate) fn mark_unknown(
        &mut self,
        now: Instant,
        first: Duration,
        backoff: &mut Backoff,
    ) -> Option<(NodeId, u32, Duration)> {
        let Coordinator::Known(node) = self.state else {
            return None;
        };
        self.rediscoveries = self.rediscoveries.saturating_add(1);
        let wait = if self.rediscoveries <= 1 {
            first
        } else {
            backoff.delay(self.rediscoveries)
        };
        self.state = Coordinator::Unknown {
            lookup: None,
            retry_at: now + wait,
        };
        Some((node, self.rediscoveries, wait))
    }
}

/// OffsetCommits, one on the wire at a time in the order they were made, so a later
/// commit can never be overtaken (and undone) by an earlier one. `T` is what waits:
/// the request itself (classic: built with the generation of the moment), or the
/// offsets (consumer protocol: sent with the epoch of the moment they go out).
#[derive(Debug)]
pub(crate) struct CommitQueue<T> {
    in_flight: Option<RequestId>,
    queue: VecDeque<(RequestId, T)>,
}

impl<T> CommitQueue<T> {
    pub(crate) fn new() -> Self {
        Self {
            in_flight: None,
            queue: VecDeque::new(),
        }
    }

    /// Queues a commit.
    pub(crate) fn push(&mut self, id: RequestId, commit: T) {
        self.queue.push_back((id, commit));
    }

    /// Puts a commit back at the head of the queue, to go again.
    pub(crate) fn retry(&mut self, id: RequestId, commit: T) {
        self.queue.push_front((id, commit));
    }

    /// The next commit to send, if none is on the wire; it is on the wire from now.
    pub(crate) fn next(&mut self) -> Option<(RequestId, T)> {
        if self.in_flight.is_some() {
            return None;
        }
        let (id, commit) = self.queue.pop_front()?;
        self.in_flight = Some(id);
        Some((id, commit))
    }

    /// Request `id` was answered or failed: if it was the commit on the wire, the next
    /// may go.
    pub(crate) fn settled(&mut self, id: RequestId) {
        if self.in_flight == Some(id) {
            self.in_flight = None;
        }
    }

    /// Every commit still waiting, taken out (the member is closing).
    pub(crate) fn drain(&mut self) -> Vec<(RequestId, T)> {
        self.queue.drain(..).collect()
    }
}

/// Committed offsets still to fetch for partitions just assigned. Committed offsets do
/// not depend on the generation, so a fetch outlives a rebalance: partitions granted
/// just before another round still get theirs.
#[derive(Debug, Clone)]
pub(crate) struct PendingFetch {
    /// The generation (or member epoch) the partitions were granted in.
    pub(crate) generation: i32,
    partitions: BTreeSet<TopicPartition>,
    in_flight: Option<RequestId>,
    retry_at: Instant,
    /// OffsetFetches failed in a row, for the KIP-580 backoff.
    failures: u32,
}

/// What an OffsetFetch answer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fetched {
    /// Not the fetch in flight.
    Stale,
    /// Refused with `code` (the first error, top-level or per partition): the caller
    /// decides, then calls [`PendingFetch::retry_at`] or gives up on the coordinator.
    Refused(i16),
    /// The offsets of the partitions asked for and still owned; `done`: nothing is
    /// left to fetch.
    Offsets {
        /// The generation the partitions were granted in.
        generation: i32,
        /// `(partition, offset, leader epoch)`.
        offsets: Vec<(TopicPartition, i64, i32)>,
        /// Nothing is left to fetch.
        done: bool,
    },
}

impl PendingFetch {
    /// Adds `added` (granted in `generation`) to `fetch`, keeping only owned partitions.
    pub(crate) fn grant(
        fetch: &mut Option<PendingFetch>,
        now: Instant,
        generation: i32,
        added: impl IntoIterator<Item = TopicPartition>,
        owned: &BTreeSet<TopicPartition>,
    ) {
        let pending = fetch.get_or_insert(PendingFetch {
            generation,
            partitions: BTreeSet::new(),
            in_flight: None,
            retry_at: now,
            failures: 0,
        });
        pending.generation = generation;
        pending.partitions.extend(added);
        pending.partitions.retain(|p| owned.contains(p));
    }

    /// Forgets partitions no longer owned.
    pub(crate) fn retain(&mut self, owned: &BTreeSet<TopicPartition>) {
        self.partitions.retain(|p| owned.contains(p));
    }

    /// When the next OffsetFetch is due, if one is to be sent (none in flight, some
    /// partitions left).
    pub(crate) fn due_at(&self) -> Option<Instant> {
        (self.in_flight.is_none() && !self.partitions.is_empty()).then_some(self.retry_at)
    }

    /// The partitions to ask for now, if due; the caller sends them and reports the id
    /// with [`PendingFetch::sent`].
    pub(crate) fn due(&self, now: Instant) -> Option<BTreeSet<TopicPartition>> {
        self.due_at()
            .filter(|at| now >= *at)
            .map(|_| self.partitions.clone())
    }

    /// The OffsetFetch `id` went out.
    pub(crate) fn sent(&mut self, id: RequestId) {
        self.in_flight = Some(id);
    }

    /// The fetch `id` failed without an answer: the next waits for the backoff.
    /// Returns whether it was the fetch in flight.
    pub(crate) fn on_failure(
        &mut self,
        now: Instant,
        id: RequestId,
        backoff: &mut Backoff,
    ) -> bool {
        if self.in_flight != Some(id) {
            return false;
        }
        self.in_flight = None;
        self.back_off(now, backoff);
        true
    }

    /// One more failure: the next fetch waits for the backoff.
    fn back_off(&mut self, now: Instant, backoff: &mut Backoff) {
        self.failures += 1;
        self.retry_at = now + backoff.delay(self.failures);
    }

    /// An OffsetFetch answer for `asked`.
    pub(crate) fn on_answer(
        &mut self,
        id: RequestId,
        asked: &BTreeSet<TopicPartition>,
        error: i16,
        partitions: Vec<(TopicPartition, i64, i32, i16)>,
        owned: &BTreeSet<TopicPartition>,
    ) -> Fetched {
        if self.in_flight != Some(id) {
            return Fetched::Stale;
        }
        self.in_flight = None;
        let code = if error != 0 {
            error
        } else {
            partitions
                .iter()
                .map(|p| p.3)
                .find(|e| *e != 0)
                .unwrap_or(0)
        };
        if code != 0 {
            return Fetched::Refused(code);
        }
        self.failures = 0;
        // Partitions granted after the request went out stay pending for the next one.
        self.partitions.retain(|p| !asked.contains(p));
        let offsets = partitions
            .into_iter()
            .filter(|p| asked.contains(&p.0) && owned.contains(&p.0))
            .map(|(tp, offset, epoch, _)| (tp, offset, epoch))
            .collect();
        Fetched::Offsets {
            generation: self.generation,
            offsets,
            done: self.partitions.is_empty(),
        }
    }
}

/// Takes `partitions` out of `owned` and reports them lost (nothing of them may be
/// committed any more).
pub(crate) fn lose(
    owned: &mut BTreeSet<TopicPartition>,
    events: &mut VecDeque<Event>,
    partitions: Vec<TopicPartition>,
    reason: LostReason,
) {
    for p in &partitions {
        owned.remove(p);
    }
    if !partitions.is_empty() {
        events.push_back(Event::Lost { partitions, reason });
    }
}

/// Every owned partition lost.
pub(crate) fn lose_all(
    owned: &mut BTreeSet<TopicPartition>,
    events: &mut VecDeque<Event>,
    reason: LostReason,
) {
    let all: Vec<TopicPartition> = owned.iter().cloned().collect();
    lose(owned, events, all, reason);
}

/// `d` in milliseconds for a request field, saturating.
pub(crate) fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// A FindCoordinator answer, as both members take it: the lookup moves on, and a
/// coordinator found is logged and reported ([`Event::CoordinatorFound`]). The caller
/// decides whether a refusal is fatal and what a new coordinator means to its
/// heartbeats.
#[allow(clippy::too_many_arguments)]
pub(crate) fn coordinator_answer(
    lookup: &mut CoordinatorLookup,
    backoff: &mut Backoff,
    events: &mut VecDeque<Event>,
    group: &str,
    now: Instant,
    id: RequestId,
    error: i16,
    (node_id, host, port): (i32, String, i32),
) -> Lookup {
    let answer = lookup.on_answer(now, id, error, node_id, backoff);
    if let Lookup::Found(node) = answer {
        tracing::info!(group, coordinator = node_id, %host, port, "coordinator found");
        events.push_back(Event::CoordinatorFound {
            node,
            address: format!("{host}:{port}"),
        });
    }
    answer
}

/// A broker's fatal answer: every owned partition is lost, and the error, with the
/// setting to change where known, is reported and returned for the member to close
/// with.
pub(crate) fn fatal(
    owned: &mut BTreeSet<TopicPartition>,
    events: &mut VecDeque<Event>,
    group: &str,
    api: &'static str,
    code: i16,
    hint: Option<&'static str>,
) -> GroupError {
    let error = GroupError::Broker {
        group: group.to_string(),
        api,
        code,
        name: crate::proto::error_name(code),
        hint,
    };
    tracing::warn!(group, %error, "fatal group error");
    lose_all(owned, events, LostReason::Fatal);
    events.push_back(Event::Fatal(error.clone()));
    error
}

/// The commits still queued when the member closes fail with `closed`.
pub(crate) fn fail_queued<T>(
    commits: &mut CommitQueue<T>,
    events: &mut VecDeque<Event>,
    closed: &GroupError,
) {
    for (id, _) in commits.drain() {
        events.push_back(Event::CommitCompleted {
            id,
            result: Err(CommitError::Closed(closed.clone())),
        });
    }
}

/// An OffsetFetch answer, as both members take it: offsets are reported
/// ([`Event::CommittedOffsets`]) and the fetch ends when nothing is left; a refusal's
/// code is returned for the member's own table.
pub(crate) fn offsets_answer(
    fetch: &mut Option<PendingFetch>,
    events: &mut VecDeque<Event>,
    owned: &BTreeSet<TopicPartition>,
    id: RequestId,
    asked: &BTreeSet<TopicPartition>,
    (error, partitions): (i16, Vec<(TopicPartition, i64, i32, i16)>),
) -> Option<i16> {
    let f = fetch.as_mut()?;
    match f.on_answer(id, asked, error, partitions, owned) {
        Fetched::Stale => None,
        Fetched::Refused(code) => Some(code),
        Fetched::Offsets {
            generation,
            offsets,
            done,
        } => {
            if done {
                *fetch = None;
            }
            events.push_back(Event::CommittedOffsets {
                generation,
                offsets,
            });
            None
        }
    }
}

/// An OffsetFetch refused: with `rediscover` (the coordinator moved) the fetch goes
/// again as soon as the coordinator is found, which the caller looks up; otherwise it
/// waits for the backoff.
pub(crate) fn offsets_refused(
    fetch: &mut Option<PendingFetch>,
    now: Instant,
    backoff: &mut Backoff,
    rediscover: bool,
) {
    let Some(f) = fetch else { return };
    if rediscover {
        f.retry_at = now;
    } else {
        f.back_off(now, backoff);
    }
}

/// The partitions whose committed offsets are due to be asked for now (forgetting
/// those no longer owned).
pub(crate) fn offsets_due(
    fetch: &mut Option<PendingFetch>,
    owned: &BTreeSet<TopicPartition>,
    now: Instant,
) -> Option<BTreeSet<TopicPartition>> {
    let f = fetch.as_mut()?;
    f.retain(owned);
    f.due(now)
}
