//! What both group protocols' members need, written once: [`Core`], the state every
//! member holds (configuration, member id, the outbox that numbers requests and
//! remembers why each was sent, coordinator discovery and its backoff, the commit
//! queue, the pending OffsetFetch of newly assigned partitions, the owned partitions
//! with the way they are lost, the events, the progress clock) and what both do with
//! it; and [`member_surface!`], the public getters and outputs both expose alike.
//!
//! Each piece is plain state with methods that take `now` (and the member's
//! [`Backoff`] where a retry waits); none reads a clock or emits anything but what its
//! caller pushes on.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::consumer_protocol::TopicPartition;
use super::member::{
    CommitError, Event, Failure, GroupConfig, GroupError, LostReason, Outgoing, RequestId, Target,
    Timer,
};
use super::messages::{CommitOffset, GroupRequest, GroupResponse, OffsetFetchAnswer};
use crate::backoff::Backoff;
use crate::metadata::NodeId;

/// The state both members hold, and what they do with it alike. `S` is what a request
/// was sent for (each member's own `Sent`), `C` what a queued commit keeps.
#[derive(Debug)]
pub(crate) struct Core<S, C> {
    pub(crate) config: GroupConfig,
    /// The member id: the broker's (classic) or the client's own (consumer protocol).
    pub(crate) member_id: String,
    pub(crate) coordinator: CoordinatorLookup,
    pub(crate) outbox: Outbox<S>,
    pub(crate) commits: CommitQueue<C>,
    /// The OffsetFetch of newly assigned partitions, while one is owed.
    pub(crate) fetch: Option<PendingFetch>,
    /// What the application holds right now.
    pub(crate) owned: BTreeSet<TopicPartition>,
    pub(crate) backoff: Backoff,
    pub(crate) events: VecDeque<Event>,
    /// When the application last came back for records (`max.poll.interval.ms`).
    pub(crate) last_progress: Instant,
}

impl<S, C> Core<S, C> {
    /// A member's core that will look for the coordinator at once.
    pub(crate) fn new(config: GroupConfig, member_id: String, now: Instant) -> Self {
        let backoff = Backoff::new(config.retry_backoff, config.retry_backoff_max, config.seed);
        Core {
            config,
            member_id,
            coordinator: CoordinatorLookup::new(now),
            outbox: Outbox::new(),
            commits: CommitQueue::new(),
            fetch: None,
            owned: BTreeSet::new(),
            backoff,
            events: VecDeque::new(),
            last_progress: now,
        }
    }

    /// Queues `request` for the driver; a request to the coordinator records which one.
    pub(crate) fn send(&mut self, target: Target, request: GroupRequest, sent: S) -> RequestId {
        let epoch = self.coordinator.epoch();
        self.outbox.send(target, request, sent, epoch)
    }

    /// Queues `request` for the coordinator like [`Core::send`], to be waited for up to
    /// `wait` rather than `request.timeout.ms` (a JoinGroup the broker holds).
    pub(crate) fn send_waiting(
        &mut self,
        target: Target,
        request: GroupRequest,
        sent: S,
        wait: Duration,
    ) -> RequestId {
        let id = self.send(target, request, sent);
        if let Some(out) = self.outbox.requests.back_mut().filter(|o| o.id == id) {
            out.wait = Some(wait);
        }
        id
    }

    /// Sends a FindCoordinator to any broker if one is due: the coordinator unknown, no
    /// lookup in flight, the backoff over. It waits `session.timeout.ms` (at least 10 s)
    /// for the answer.
    pub(crate) fn find_coordinator_if_due(&mut self, now: Instant, sent: impl FnOnce() -> S) {
        let timeout = self.config.session_timeout.max(Duration::from_secs(10));
        let (outbox, group) = (&mut self.outbox, &self.config.group_id);
        self.coordinator.lookup_due(now, timeout, || {
            let request = GroupRequest::FindCoordinator {
                group: group.clone(),
            };
            // Any broker answers it: no coordinator epoch.
            outbox.send(Target::AnyBroker, request, sent(), 0)
        });
    }

    /// A response to `id` arrived: what it was sent for, or `None` for one the member
    /// no longer waits for. An answer from the coordinator that does not refuse
    /// coordination starts the rediscovery pace over (KIP-580).
    pub(crate) fn answered(&mut self, id: RequestId, response: &GroupResponse) -> Option<S> {
        self.commits.settled(id);
        let Some((sent, _)) = self.outbox.answered(id, self.coordinator.epoch()) else {
            debug!(group = %self.config.group_id, ?id, "response to an unknown request dropped");
            return None;
        };
        if !matches!(response, GroupResponse::FindCoordinator { .. })
            && !refuses_coordination(response)
        {
            self.coordinator.note_served();
        }
        Some(sent)
    }

    /// Request `id` failed without a response: what it was sent for and whether it
    /// went to the coordinator known now (not one given up on since), or `None` for
    /// one the member no longer waits for.
    pub(crate) fn failed(&mut self, id: RequestId, failure: &Failure) -> Option<(S, bool)>
    where
        S: std::fmt::Debug,
    {
        self.commits.settled(id);
        let (sent, same_coordinator) = self.outbox.answered(id, self.coordinator.epoch())?;
        debug!(group = %self.config.group_id, ?id, ?sent, ?failure, "group request failed");
        Some((sent, same_coordinator))
    }

    /// A response that does not answer what `id` was sent for: logged, and taken back
    /// so that the member treats it as the failure returned.
    pub(crate) fn wrong_kind(&mut self, id: RequestId, sent: S, response: &GroupResponse) -> Failure
    where
        S: std::fmt::Debug,
    {
        warn!(group = %self.config.group_id, ?sent, ?response, "response of the wrong kind; treated as a failure");
        self.outbox.restore(id, sent);
        Failure::Protocol("response of the wrong kind".into())
    }

    /// The FindCoordinator `id` failed without an answer; the next waits for the backoff.
    pub(crate) fn lookup_failed(&mut self, now: Instant, id: RequestId) {
        self.coordinator.on_failure(now, id, &mut self.backoff);
    }

    /// The OffsetCommit `id` failed without an answer: reported to the application.
    pub(crate) fn commit_failed(&mut self, id: RequestId, failure: Failure) {
        self.events.push_back(Event::CommitCompleted {
            id,
            result: Err(CommitError::Request(failure)),
        });
    }

    /// The OffsetFetch `id` failed without an answer: it goes again after the backoff.
    /// `true` if it was the fetch in flight (not one given up on since).
    pub(crate) fn offsets_failed(&mut self, now: Instant, id: RequestId) -> bool {
        let backoff = &mut self.backoff;
        self.fetch
            .as_mut()
            .is_some_and(|f| f.on_failure(now, id, backoff))
    }

    /// Whether `offsets` may be committed now, and with which generation or epoch:
    /// the member not closed (`closed` holds its close error if it is), in a group at
    /// `live`, the coordinator known, and every partition owned, so a commit for a
    /// revoked or lost partition is impossible.
    pub(crate) fn may_commit(
        &self,
        closed: Option<&Option<GroupError>>,
        live: Option<i32>,
        offsets: &[CommitOffset],
    ) -> Result<i32, CommitError> {
        if let Some(e) = closed {
            return Err(CommitError::Closed(e.clone().unwrap_or(
                GroupError::Closed {
                    group: self.config.group_id.clone(),
                },
            )));
        }
        let live = live.ok_or(CommitError::NoGeneration)?;
        if self.coordinator.known().is_none() {
            return Err(CommitError::CoordinatorUnknown);
        }
        if let Some(bad) = offsets.iter().find(|o| !self.owned.contains(&o.partition)) {
            return Err(CommitError::NotOwned(bad.partition.clone()));
        }
        Ok(live)
    }

    /// A FindCoordinator answer: the lookup moves on, and a coordinator found is logged
    /// and reported ([`Event::CoordinatorFound`]). The caller decides whether a refusal
    /// is fatal and what a new coordinator means to its heartbeats.
    pub(crate) fn coordinator_answer(
        &mut self,
        now: Instant,
        id: RequestId,
        error: i16,
        (node_id, host, port): (i32, String, i32),
    ) -> Lookup {
        let answer = self
            .coordinator
            .on_answer(now, id, error, node_id, &mut self.backoff);
        if let Lookup::Found(node) = answer {
            info!(group = %self.config.group_id, coordinator = node_id, %host, port, "coordinator found");
            self.events.push_back(Event::CoordinatorFound {
                node,
                address: format!("{host}:{port}"),
            });
        }
        answer
    }

    /// Gives up on the coordinator, if one is known (Java's `markCoordinatorUnknown`).
    pub(crate) fn mark_coordinator_unknown(&mut self, now: Instant) {
        let first = self.config.retry_backoff;
        if let Some((node, rediscoveries, wait)) =
            self.coordinator.mark_unknown(now, first, &mut self.backoff)
        {
            info!(group = %self.config.group_id, coordinator = node.0, rediscoveries, ?wait, "coordinator unknown; rediscovering");
        }
    }

    /// Takes `partitions` out of those owned and reports them lost (nothing of them may
    /// be committed any more).
    pub(crate) fn lose(&mut self, partitions: Vec<TopicPartition>, reason: LostReason) {
        for p in &partitions {
            self.owned.remove(p);
        }
        if !partitions.is_empty() {
            self.events.push_back(Event::Lost { partitions, reason });
        }
    }

    /// The application gave `partitions` back after a revocation.
    pub(crate) fn give_back(&mut self, partitions: &[TopicPartition]) {
        for p in partitions {
            self.owned.remove(p);
        }
    }

    /// Every owned partition lost.
    pub(crate) fn lose_all(&mut self, reason: LostReason) {
        let all: Vec<TopicPartition> = self.owned.iter().cloned().collect();
        self.lose(all, reason);
    }

    /// A broker's fatal answer: every owned partition is lost, and the error, with the
    /// setting to change where known (`hint`), is reported and returned for the member
    /// to close with.
    pub(crate) fn fatal(
        &mut self,
        api: &'static str,
        code: i16,
        hint: Option<&'static str>,
    ) -> GroupError {
        let error = self.broker_error(api, code, hint);
        self.fail(error)
    }

    /// A refusal the application must hear of while the member keeps going
    /// ([`Event::Error`]): logged and reported, nothing lost.
    pub(crate) fn refused_not_fatal(
        &mut self,
        api: &'static str,
        code: i16,
        hint: Option<&'static str>,
    ) {
        let error = self.broker_error(api, code, hint);
        warn!(group = %self.config.group_id, %error, "refused; retrying after the backoff");
        self.events.push_back(Event::Error(error));
    }

    /// The group's error for `code` answered to `api`.
    fn broker_error(&self, api: &'static str, code: i16, hint: Option<&'static str>) -> GroupError {
        GroupError::Broker {
            group: self.config.group_id.clone(),
            api,
            code,
            name: crate::error_name(code),
            hint,
        }
    }

    /// A fatal error: every owned partition is lost, and the error is reported and
    /// returned for the member to close with.
    pub(crate) fn fail(&mut self, error: GroupError) -> GroupError {
        warn!(group = %self.config.group_id, %error, "fatal group error");
        self.lose_all(LostReason::Fatal);
        self.events.push_back(Event::Fatal(error.clone()));
        error
    }

    /// The member closes, with `error` or cleanly: the commits still queued fail.
    pub(crate) fn fail_queued(&mut self, error: &Option<GroupError>) {
        let closed = error.clone().unwrap_or(GroupError::Closed {
            group: self.config.group_id.clone(),
        });
        for (id, _) in self.commits.drain() {
            self.events.push_back(Event::CommitCompleted {
                id,
                result: Err(CommitError::Closed(closed.clone())),
            });
        }
    }

    /// An OffsetFetch answer: offsets are reported ([`Event::CommittedOffsets`]) and the
    /// fetch ends when nothing is left. A refusal that `is_fatal` (the member's own
    /// table) is returned for the member to close with; NOT_COORDINATOR and
    /// COORDINATOR_NOT_AVAILABLE make the fetch go again as soon as the coordinator is
    /// found, which the member looks up; any other refusal waits for the backoff.
    pub(crate) fn offsets_answer(
        &mut self,
        now: Instant,
        id: RequestId,
        asked: &BTreeSet<TopicPartition>,
        (error, partitions, metadata): OffsetFetchAnswer,
        is_fatal: fn(i16) -> bool,
    ) -> Offsets {
        let Some(f) = self.fetch.as_mut() else {
            return Offsets::Taken;
        };
        let code = match f.on_answer(id, asked, error, partitions, &self.owned) {
            Fetched::Stale => return Offsets::Taken,
            Fetched::Refused(code) => code,
            Fetched::Offsets {
                generation,
                offsets,
                done,
            } => {
                if done {
                    self.fetch = None;
                }
                let metadata = metadata
                    .into_iter()
                    .filter(|(tp, _)| offsets.iter().any(|(o, _, _)| o == tp))
                    .collect();
                self.events.push_back(Event::CommittedOffsets {
                    generation,
                    offsets,
                    metadata,
                });
                return Offsets::Taken;
            }
        };
        use kafka_protocol::ResponseError as E;
        if is_fatal(code) {
            Offsets::Fatal(code)
        } else if matches!(
            E::try_from_code(code),
            Some(E::NotCoordinator | E::CoordinatorNotAvailable)
        ) {
            f.retry_at = now;
            Offsets::Rediscover
        } else {
            f.back_off(now, &mut self.backoff);
            Offsets::Taken
        }
    }

    /// When the application must next come back for records.
    pub(crate) fn progress_deadline(&self) -> Instant {
        self.last_progress + self.config.max_poll_interval
    }

    /// The application did not come back in time: logged and reported
    /// ([`Event::ProgressTimeout`]); the member leaves as its protocol says.
    pub(crate) fn progress_timed_out(&mut self) {
        let interval = self.config.max_poll_interval;
        warn!(group = %self.config.group_id, ?interval, "the application did not come back within max.poll.interval.ms; leaving the group");
        self.events.push_back(Event::ProgressTimeout {
            max_poll_interval: interval,
        });
    }
}

impl<S, C: Commits> Core<S, C> {
    /// Sends the OffsetFetch of the partitions due (if any) to the coordinator `node`:
    /// `member` is what the request carries of the member (OffsetFetch v9's id and
    /// epoch), `sent` what the member records of it.
    pub(crate) fn fetch_offsets_if_due(
        &mut self,
        now: Instant,
        node: NodeId,
        member: Option<(String, i32)>,
        sent: impl FnOnce(BTreeSet<TopicPartition>) -> S,
    ) {
        let Some(asked) = self.offsets_due(now) else {
            return;
        };
        let request = GroupRequest::OffsetFetch {
            group: self.config.group_id.clone(),
            partitions: asked.iter().cloned().collect(),
            // As the Java client: a new owner never resumes before a pending
            // transactional commit of its partitions settles (dropped below
            // OffsetFetch v7, which lacks the flag).
            require_stable: true,
            member,
        };
        let id = self.send(Target::Coordinator(node), request, sent(asked));
        if let Some(f) = &mut self.fetch {
            f.sent(id);
        }
    }

    /// The partitions whose committed offsets are due to be asked for now (forgetting
    /// those no longer owned).
    ///
    /// A partition this member still has a commit of, on the wire or queued, waits for
    /// it to settle: an answer read before that commit lands would send the member back
    /// below its own commit. The Java client sends its commits and OffsetFetches on one
    /// connection in the order made, so the broker reads an earlier commit first; here
    /// commits go one at a time (a queued one has not reached the broker), and a commit
    /// made before a loss may still be on the wire to another coordinator (chaos,
    /// consumer protocol, seed 76387901: handled again below its own commit).
    pub(crate) fn offsets_due(&mut self, now: Instant) -> Option<BTreeSet<TopicPartition>> {
        let pending = self.commits.pending();
        let f = self.fetch.as_mut()?;
        f.retain(&self.owned);
        f.due(now, &pending)
    }

    /// When the next OffsetFetch is due: as [`PendingFetch::due_at`], none while every
    /// partition left waits for a commit of its own ([`Core::offsets_due`]; its answer
    /// is what moves the member on).
    pub(crate) fn offsets_due_at(&self) -> Option<Instant> {
        self.fetch
            .as_ref()
            .and_then(|f| f.due_at(&self.commits.pending()))
    }
}

/// What an OffsetFetch answer leaves the member to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offsets {
    /// Nothing: the answer was taken (offsets reported, or a retry scheduled).
    Taken,
    /// The coordinator moved: the member gives it up (the fetch goes again once found).
    Rediscover,
    /// A fatal refusal, with its code.
    Fatal(i16),
}

/// Whether an answer from the coordinator says it is not (or not yet) the coordinator.
pub(crate) fn refuses_coordination(response: &GroupResponse) -> bool {
    let refused = |code: i16| {
        code == kafka_protocol::ResponseError::NotCoordinator.code()
            || code == kafka_protocol::ResponseError::CoordinatorNotAvailable.code()
            || code == kafka_protocol::ResponseError::CoordinatorLoadInProgress.code()
    };
    match response {
        GroupResponse::FindCoordinator { .. } => false,
        GroupResponse::JoinGroup { error, .. }
        | GroupResponse::SyncGroup { error, .. }
        | GroupResponse::Heartbeat { error, .. }
        | GroupResponse::LeaveGroup { error, .. }
        | GroupResponse::ConsumerGroupHeartbeat { error, .. } => refused(*error),
        GroupResponse::OffsetCommit { partitions } => partitions.iter().any(|(_, e)| refused(*e)),
        GroupResponse::OffsetFetch {
            error, partitions, ..
        } => refused(*error) || partitions.iter().any(|(_, _, _, e)| refused(*e)),
    }
}

/// The getters and outputs both members expose alike, and the way both close on a
/// fatal answer: over their [`Core`] (`core`), their `State` (with a `Closed`
/// variant), and their own `next_timer`, `close`, `coordinator_found`,
/// `on_offset_fetch`, `mark_coordinator_unknown`, `hint` and `reaction`.
macro_rules! member_surface {
    () => {
        /// The member id (empty for a classic member before its first JoinGroup).
        pub fn member_id(&self) -> &str {
            &self.core.member_id
        }

        /// The coordinator, if known.
        pub fn coordinator(&self) -> Option<NodeId> {
            self.core.coordinator.known()
        }

        /// The partitions the application owns.
        pub fn assignment(&self) -> Vec<TopicPartition> {
            self.core.owned.iter().cloned().collect()
        }

        /// Whether this member is a static member (`group.instance.id`).
        pub fn is_static(&self) -> bool {
            self.core.config.instance_id.is_some()
        }

        /// The configuration.
        pub fn config(&self) -> &GroupConfig {
            &self.core.config
        }

        /// The fatal error, if closed by one.
        pub fn error(&self) -> Option<&GroupError> {
            self.closed().and_then(Option::as_ref)
        }

        /// `Some` once closed, with the error it closed with, if any.
        fn closed(&self) -> Option<&Option<GroupError>> {
            match &self.state {
                State::Closed(e) => Some(e),
                _ => None,
            }
        }

        /// A response to request `id` arrived.
        pub fn handle_response(&mut self, now: Instant, id: RequestId, response: GroupResponse) {
            let Some(sent) = self.core.answered(id, &response) else {
                return;
            };
            let given_back = match (sent, response) {
                (
                    Sent::FindCoordinator,
                    GroupResponse::FindCoordinator {
                        error,
                        node_id,
                        host,
                        port,
                    },
                ) => {
                    self.on_find_coordinator(now, id, error, (node_id, host, port));
                    None
                }
                (
                    Sent::OffsetFetch { partitions: asked },
                    GroupResponse::OffsetFetch {
                        error,
                        partitions,
                        metadata,
                    },
                ) => {
                    self.on_offset_fetch(now, id, asked, (error, partitions, metadata));
                    None
                }
                (sent, response) => self.on_response(now, id, sent, response),
            };
            if let Some((sent, response)) = given_back {
                let failure = self.core.wrong_kind(id, sent, &response);
                return self.handle_failure(now, id, failure);
            }
            self.advance(now);
        }

        /// Request `id` failed without a response.
        pub fn handle_failure(&mut self, now: Instant, id: RequestId, failure: Failure) {
            let Some((sent, same_coordinator)) = self.core.failed(id, &failure) else {
                return;
            };
            match sent {
                Sent::FindCoordinator => self.core.lookup_failed(now, id),
                // A fetch given up on since (not the one in flight) says nothing.
                Sent::OffsetFetch { .. } => {
                    if self.core.offsets_failed(now, id) && same_coordinator {
                        self.mark_coordinator_unknown(now);
                    }
                }
                sent => self.on_failure(now, id, sent, same_coordinator, failure),
            }
            self.advance(now);
        }

        /// A FindCoordinator answer: GROUP_AUTHORIZATION_FAILED is reported
        /// ([`Event::Error`]) and the lookup goes on after the backoff, so a granted
        /// ACL is enough (Java throws it from `poll` and looks the coordinator up
        /// again on the next one); another refusal the member's `reaction` table calls
        /// fatal closes it; a coordinator found is the member's own to take up
        /// (`coordinator_found`).
        fn on_find_coordinator(
            &mut self,
            now: Instant,
            id: RequestId,
            error: i16,
            node: (i32, String, i32),
        ) {
            match self.core.coordinator_answer(now, id, error, node) {
                $crate::group::common::Lookup::Refused(code)
                    if code == kafka_protocol::ResponseError::GroupAuthorizationFailed.code() =>
                {
                    // A lookup answered after the member closed reports nothing.
                    if self.closed().is_none() {
                        self.core
                            .refused_not_fatal("FindCoordinator", code, hint(code))
                    }
                }
                $crate::group::common::Lookup::Refused(code)
                    if reaction(code) == Reaction::Fatal =>
                {
                    self.fatal("FindCoordinator", code)
                }
                $crate::group::common::Lookup::Found(_) => self.coordinator_found(now),
                $crate::group::common::Lookup::Stale
                | $crate::group::common::Lookup::Refused(_) => {}
            }
        }

        /// A broker's fatal answer to `api`: the member closes with it. Closed is
        /// sticky: a late answer (a FindCoordinator still in flight when the
        /// application left) must not turn a clean close into an error (found by
        /// fuzzing).
        fn fatal(&mut self, api: &'static str, code: i16) {
            if self.closed().is_some() {
                return;
            }
            let error = self.core.fatal(api, code, hint(code));
            self.close(Some(error));
        }

        /// The next request to send.
        #[must_use]
        pub fn poll_request(&mut self) -> Option<Outgoing> {
            self.core.outbox.poll()
        }

        /// The next event for the application.
        #[must_use]
        pub fn poll_event(&mut self) -> Option<Event> {
            self.core.events.pop_front()
        }

        /// When `handle_timeout` must next be called. `None` only when closed or
        /// suspended (then only the application can move the member).
        #[must_use]
        pub fn poll_timeout(&self) -> Option<Instant> {
            self.next_timer().map(|(_, at)| at)
        }
    };
}
pub(crate) use member_surface;

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
            wait: None,
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
        // Matched, not a let chain: the crate's MSRV (1.85) predates let chains.
        match self.state {
            Coordinator::Unknown {
                lookup: None,
                retry_at,
            } if now >= retry_at => {
                let id = send();
                self.state = Coordinator::Unknown {
                    lookup: Some((id, now + timeout)),
                    retry_at,
                };
            }
            _ => {}
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
        match &mut self.state {
            Coordinator::Unknown { lookup, retry_at } if lookup.map(|(l, _)| l) == Some(id) => {
                *lookup = None;
                self.failures += 1;
                *retry_at = now + backoff.delay(self.failures);
            }
            _ => {}
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

/// What a queued commit commits, whatever else it keeps.
pub(crate) trait Commits {
    /// Its offsets.
    fn offsets(&self) -> &[CommitOffset];
}

/// The partitions of `offsets`.
fn partitions(offsets: &[CommitOffset]) -> impl Iterator<Item = &TopicPartition> {
    offsets.iter().map(|o| &o.partition)
}

/// OffsetCommits, one on the wire at a time in the order they were made, so a later
/// commit can never be overtaken (and undone) by an earlier one. `T` is what waits:
/// the request itself (classic: built with the generation of the moment), or the
/// offsets (consumer protocol: sent with the epoch of the moment they go out). The
/// partitions of the commit on the wire are kept, so that an OffsetFetch waits for
/// them as for those queued ([`CommitQueue::pending`]).
#[derive(Debug)]
pub(crate) struct CommitQueue<T> {
    in_flight: Option<(RequestId, BTreeSet<TopicPartition>)>,
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

    /// Request `id` was answered or failed: if it was the commit on the wire, the next
    /// may go.
    pub(crate) fn settled(&mut self, id: RequestId) {
        if self.in_flight.as_ref().is_some_and(|(f, _)| *f == id) {
            self.in_flight = None;
        }
    }

    /// Every commit still waiting, taken out (the member is closing).
    pub(crate) fn drain(&mut self) -> Vec<(RequestId, T)> {
        self.queue.drain(..).collect()
    }
}

impl<T: Commits> CommitQueue<T> {
    /// The next commit to send, if none is on the wire; it is on the wire from now.
    pub(crate) fn next(&mut self) -> Option<(RequestId, T)> {
        if self.in_flight.is_some() {
            return None;
        }
        let (id, commit) = self.queue.pop_front()?;
        self.in_flight = Some((id, partitions(commit.offsets()).cloned().collect()));
        Some((id, commit))
    }

    /// The partitions of the commit on the wire and of those waiting: until each
    /// settles, the broker's committed offset of these may still move.
    pub(crate) fn pending(&self) -> BTreeSet<TopicPartition> {
        let waiting = self.queue.iter().flat_map(|(_, c)| partitions(c.offsets()));
        self.in_flight
            .iter()
            .flat_map(|(_, p)| p.iter())
            .chain(waiting)
            .cloned()
            .collect()
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
    /// Partitions granted (again) while the fetch in flight was out: its answer may
    /// predate their last owner's final commit, so they wait for the next fetch.
    regranted: BTreeSet<TopicPartition>,
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
            regranted: BTreeSet::new(),
            retry_at: now,
            failures: 0,
        });
        pending.generation = generation;
        let added: Vec<TopicPartition> = added.into_iter().collect();
        if pending.in_flight.is_some() {
            pending.regranted.extend(added.iter().cloned());
        }
        pending.partitions.extend(added);
        pending.partitions.retain(|p| owned.contains(p));
    }

    /// Forgets partitions no longer owned.
    pub(crate) fn retain(&mut self, owned: &BTreeSet<TopicPartition>) {
        self.partitions.retain(|p| owned.contains(p));
    }

    /// When the next OffsetFetch is due, if one is to be sent (none in flight, some
    /// partitions left that are not `held`: a commit of them is still pending).
    pub(crate) fn due_at(&self, held: &BTreeSet<TopicPartition>) -> Option<Instant> {
        (self.in_flight.is_none() && self.partitions.iter().any(|p| !held.contains(p)))
            .then_some(self.retry_at)
    }

    /// The partitions to ask for now, if due, leaving out those `held` (they stay
    /// pending for a later fetch); the caller sends them and reports the id with
    /// [`PendingFetch::sent`].
    pub(crate) fn due(
        &self,
        now: Instant,
        held: &BTreeSet<TopicPartition>,
    ) -> Option<BTreeSet<TopicPartition>> {
        self.due_at(held).filter(|at| now >= *at).map(|_| {
            self.partitions
                .iter()
                .filter(|p| !held.contains(*p))
                .cloned()
                .collect()
        })
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
        self.regranted.clear();
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
        // A partition granted again while this was out (revoked, its final commit
        // made, then given back) is asked for again: the broker may have answered
        // before that commit landed, and the answer came late (a held response).
        // Applied, it sent the member back below its own commit (chaos, consumer
        // protocol, seed 773873162).
        let regranted = std::mem::take(&mut self.regranted);
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
        self.partitions
            .retain(|p| !asked.contains(p) || regranted.contains(p));
        let offsets = partitions
            .into_iter()
            .filter(|p| asked.contains(&p.0) && owned.contains(&p.0) && !regranted.contains(&p.0))
            .map(|(tp, offset, epoch, _)| (tp, offset, epoch))
            .collect();
        Fetched::Offsets {
            generation: self.generation,
            offsets,
            done: self.partitions.is_empty(),
        }
    }
}

/// `d` in milliseconds for a request field, saturating.
pub(crate) fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod pending_fetch_tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition::new("t", p)
    }

    #[test]
    fn an_answer_to_a_fetch_sent_before_a_partition_was_granted_again_is_not_applied_to_it() {
        // Chaos, consumer protocol, seed 773873162: p5's committed offset was asked
        // for, p5 was revoked (its final commit at 786) and granted again, and the
        // first answer (774, held back by the broker) arrived after: the member
        // started again at 774, below its own commit.
        let now = Instant::now();
        let owned: BTreeSet<TopicPartition> = [tp(0), tp(5)].into_iter().collect();
        let mut fetch = None;
        PendingFetch::grant(&mut fetch, now, 9, [tp(0), tp(5)], &owned);
        let f = fetch.as_mut().expect("pending");
        let asked = f.due(now, &BTreeSet::new()).expect("due");
        f.sent(RequestId(1));
        PendingFetch::grant(&mut fetch, now, 11, [tp(5)], &owned);
        let f = fetch.as_mut().expect("pending");
        let answer = f.on_answer(
            RequestId(1),
            &asked,
            0,
            vec![(tp(0), 100, -1, 0), (tp(5), 774, -1, 0)],
            &owned,
        );
        assert_eq!(
            answer,
            Fetched::Offsets {
                generation: 11,
                offsets: vec![(tp(0), 100, -1)],
                done: false,
            }
        );
        // p5 is asked for again.
        assert_eq!(
            f.due(now, &BTreeSet::new()),
            Some([tp(5)].into_iter().collect())
        );
    }
}
