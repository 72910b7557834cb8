//! The `group_ops` target: one [`GroupMember`] driven by a sequence of operations read
//! from the input, with the promises the member documents checked after every step.
//!
//! # Input
//!
//! A configuration header (assignors, subscribed topics, timeouts, static or dynamic),
//! then operations until the input ends. Each operation is one byte, `op % 16`, and
//! the bytes its arguments need:
//!
//! | op | what happens |
//! |---|---|
//! | 0..=3 | an outstanding request is answered with a response of its kind: arbitrary fields, an error code from [`CODES`] a quarter of the time, the generation bumped, repeated or arbitrary |
//! | 4 | an outstanding request fails (disconnected, timed out, undecodable) |
//! | 5 | an outstanding request is answered with a response of another kind |
//! | 6 | a response or failure for a request answered already or never sent, or a late one for a request the network lost |
//! | 7, 8 | the clock moves (milliseconds to hours), then `handle_timeout` |
//! | 9 | the clock moves to the next timer, then `handle_timeout` |
//! | 10 | the application commits some of what it owns, sometimes more |
//! | 11 | the application completes the pending revocation (or names another generation) |
//! | 12 | the application comes back for records (`note_progress`) |
//! | 13 | new partition counts (`set_topic_partitions`) |
//! | 14 | the application leaves (one time in eight; otherwise nothing) |
//! | 15 | an outstanding request is lost (maybe answered late by op 6) |
//!
//! # Promises checked
//!
//! They come from the member's docs (`src/proto/group/member.rs`) and the invariants of
//! `docs/architecture.md`; the check that fails names its source.
//!
//! - `poll_timeout` is `None` only when closed or suspended, and after `handle_timeout`
//!   nothing is still due: the driver sleeps until `poll_timeout`, so a timer left in
//!   the past would spin it.
//! - The application's view, rebuilt from the events alone (`Assigned`, `RevokeRequested`
//!   and `complete_revocation`, `Lost`, `leave`), equals `assignment()` after every step;
//!   `Assigned` never arrives while a revocation is pending, and `CommittedOffsets` only
//!   names owned partitions.
//! - Commits (invariant 12): `commit` succeeds only when stable or revoking with a
//!   known coordinator and every partition owned; the OffsetCommits go out one at a
//!   time, in the order the commits were made, each carrying the generation and member
//!   id it was made with; a queued commit goes out as soon as none is in flight (with
//!   the coordinator known, in the group); every commit answered or failed completes
//!   exactly once, and the queued ones complete when the member closes.
//! - Heartbeats (invariant 13) never go out between a JoinGroup and its successful
//!   answer, and carry the generation of that answer (or of the last `Joined`).
//! - Late answers (invariant 11): a response or failure for a request that is not
//!   outstanding, a Heartbeat or OffsetCommit of another generation, or a JoinGroup or
//!   SyncGroup the member no longer awaits changes nothing (no state, generation,
//!   assignment, member id, coordinator or timer change, no request, no event other
//!   than the commit's completion).
//! - Closed is sticky: no request after it, the same error, every commit refused; a
//!   closed member has no live generation.
//! - Request ids increase; FindCoordinator goes to any broker, the rest to the
//!   coordinator.
//! - The same input gives the same outputs (the whole run is replayed and compared).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ottla_proto::group::assignor::{Assignor, builtin};
use ottla_proto::group::consumer_protocol::{
    Assignment, Subscription, TopicPartition, encode_assignment, encode_subscription,
};
use ottla_proto::group::member::{
    CommitError, Event, Failure, GroupConfig, GroupError, GroupMember, Outgoing, RequestId,
    StateKind, Target,
};
use ottla_proto::group::messages::{CommitOffset, GroupRequest, GroupResponse, JoinedMember};
use ottla_proto::metadata::NodeId;

use crate::input::Input;
use crate::response::base;

/// The built-in assignors, in the order the configuration byte's bits name them.
pub const ASSIGNORS: [&str; 4] = ["range", "roundrobin", "sticky", "cooperative-sticky"];

/// Topics in play: the member subscribes to `t` (and `u` when the header says so);
/// other members may subscribe to any.
pub const TOPICS: [&str; 3] = ["t", "u", "x"];

/// Error codes responses carry: none, the retriable ones, every code the member's
/// error table names, and codes it does not know.
pub const CODES: [i16; 20] = [
    0, -1, 3, 7, 13, 14, 15, 16, 22, 23, 25, 26, 27, 30, 35, 42, 79, 82, 88, 12345,
];

/// The most operations one input runs.
pub const MAX_OPS: usize = 400;

/// Runs `data` twice on fresh members and checks the promises after every step, and
/// that both runs gave the same outputs. Panics with the broken promise.
pub fn run(data: &[u8]) {
    let first = Harness::run(data).unwrap_or_else(|violation| panic!("{violation}"));
    let second = Harness::run(data).unwrap_or_else(|violation| panic!("{violation}"));
    assert!(
        first == second,
        "the same input gave different outputs (determinism)\nfirst:\n{first}\nsecond:\n{second}"
    );
}

/// What the member exposes through its getters, compared around late answers.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    state: StateKind,
    generation: Option<i32>,
    assignment: Vec<TopicPartition>,
    member_id: String,
    coordinator: Option<NodeId>,
    /// `poll_timeout`, from the start of the run.
    timeout: Option<Duration>,
    error: Option<GroupError>,
}

/// The application, as rebuilt from the member's events.
#[derive(Debug, Default)]
struct Model {
    owned: BTreeSet<TopicPartition>,
    /// A `RevokeRequested` not yet completed, lost or closed.
    revoking: Option<(i32, BTreeSet<TopicPartition>)>,
    /// The generation of the last `Joined`.
    joined: Option<i32>,
    /// A JoinGroup went out and has not been answered successfully.
    rebalancing: bool,
    /// The generation heartbeats must carry: of the last successful JoinGroup answer
    /// or `Joined`.
    heartbeat_generation: Option<i32>,
}

/// What the step's input expects of the outputs.
#[derive(Debug, Default)]
struct Expect {
    /// A late answer: nothing may change.
    unchanged: Option<Snapshot>,
    /// Commits answered or failed in this step: each completes exactly once.
    completions: BTreeSet<RequestId>,
    /// `handle_timeout` ran at this instant: nothing may still be due.
    fired: Option<Instant>,
}

struct Harness {
    m: GroupMember,
    now: Instant,
    instance_id: Option<String>,
    outstanding: Vec<Outgoing>,
    /// Requests the network dropped; one may still be answered, late.
    lost: Vec<Outgoing>,
    /// Requests answered already (the last few).
    answered: Vec<RequestId>,
    last_id: Option<RequestId>,
    last_join: Option<RequestId>,
    last_sync: Option<RequestId>,
    generation_hint: i32,
    model: Model,
    /// Commits made and not yet sent, oldest first, with what they must carry.
    queued: std::collections::VecDeque<(RequestId, i32, String, Vec<CommitOffset>)>,
    /// The OffsetCommit on the wire, until its `CommitCompleted`.
    commit_on_wire: Option<RequestId>,
    closed: Option<Option<GroupError>>,
    trace: String,
}

impl Harness {
    fn run(data: &[u8]) -> Result<String, String> {
        let mut input = Input::new(data);
        let config = config(&mut input);
        let now = base();
        let mut h = Harness {
            instance_id: config.instance_id.clone(),
            m: GroupMember::new(config, now),
            now,
            outstanding: Vec::new(),
            lost: Vec::new(),
            answered: Vec::new(),
            last_id: None,
            queued: Default::default(),
            commit_on_wire: None,
            last_join: None,
            last_sync: None,
            generation_hint: 0,
            model: Model::default(),
            closed: None,
            trace: String::new(),
        };
        h.drain("new", Expect::default())?;
        for step in 0..MAX_OPS {
            if input.is_empty() {
                break;
            }
            h.step(&mut input)
                .map_err(|v| format!("step {step}: {v}\ntrace:\n{}", h.trace))?;
        }
        Ok(h.trace)
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            state: self.m.state(),
            generation: self.m.generation(),
            assignment: self.m.assignment(),
            member_id: self.m.member_id().to_string(),
            coordinator: self.m.coordinator(),
            timeout: self.m.poll_timeout().map(|t| t.duration_since(base())),
            error: self.m.error().cloned(),
        }
    }

    fn step(&mut self, input: &mut Input) -> Result<(), String> {
        let op = input.u8() % 16;
        let mut expect = Expect::default();
        let label: String = match op {
            0..=3 => {
                let Some(out) = self.take_outstanding(input) else {
                    return Ok(());
                };
                let byte = input.u8();
                let error = if byte >= 192 {
                    CODES[usize::from(byte) % CODES.len()]
                } else {
                    0
                };
                let response = self.response(input, &out.request, error);
                self.expect_answer(&out, &mut expect);
                self.m.handle_response(self.now, out.id, response.clone());
                self.m.assign_inline(self.now);
                if let GroupResponse::JoinGroup {
                    error: 0,
                    generation,
                    ..
                } = &response
                    && self.last_join == Some(out.id)
                    && self.m.state() == StateKind::Syncing
                {
                    self.model.rebalancing = false;
                    self.model.heartbeat_generation = Some(*generation);
                }
                format!("respond {:?} {response:?}", out.id)
            }
            4 => {
                let Some(out) = self.take_outstanding(input) else {
                    return Ok(());
                };
                let failure = match input.u8() % 3 {
                    0 => Failure::Disconnected,
                    1 => Failure::Timeout,
                    _ => Failure::Protocol("undecodable".into()),
                };
                self.expect_answer(&out, &mut expect);
                self.m.handle_failure(self.now, out.id, failure.clone());
                format!("fail {:?} {failure:?}", out.id)
            }
            5 => {
                let Some(out) = self.take_outstanding(input) else {
                    return Ok(());
                };
                // Any kind but the request's own.
                let kind = (kind(&out.request) + 1 + input.below(6)) % 7;
                let response = self.any_response(input, kind);
                self.expect_answer(&out, &mut expect);
                self.m.handle_response(self.now, out.id, response.clone());
                self.m.assign_inline(self.now);
                format!("wrong kind {:?} {response:?}", out.id)
            }
            6 => match input.u8() % 3 {
                2 if !self.lost.is_empty() => {
                    // A request thought lost is answered after all, late.
                    let out = self.lost.remove(input.below(self.lost.len()));
                    self.answered.push(out.id);
                    self.expect_answer(&out, &mut expect);
                    if input.bool() {
                        let response = self.response(input, &out.request, 0);
                        self.m.handle_response(self.now, out.id, response.clone());
                        self.m.assign_inline(self.now);
                        format!("delayed {:?} {response:?}", out.id)
                    } else {
                        self.m.handle_failure(self.now, out.id, Failure::Timeout);
                        format!("delayed failure {:?}", out.id)
                    }
                }
                n => {
                    // An answer to a request already answered, or never sent.
                    let id = match (n, self.answered.is_empty()) {
                        (0, false) => self.answered[input.below(self.answered.len())],
                        _ => RequestId(u64::MAX - u64::from(input.u8())),
                    };
                    expect.unchanged = Some(self.snapshot());
                    if input.bool() {
                        let kind = input.below(7);
                        let response = self.any_response(input, kind);
                        self.m.handle_response(self.now, id, response.clone());
                        self.m.assign_inline(self.now);
                        format!("late {id:?} {response:?}")
                    } else {
                        self.m.handle_failure(self.now, id, Failure::Disconnected);
                        format!("late failure {id:?}")
                    }
                }
            },
            7 | 8 => {
                let d = match input.u8() % 4 {
                    0 => Duration::from_millis(u64::from(input.u8())),
                    1 => Duration::from_millis(u64::from(input.u16())),
                    2 => Duration::from_secs(u64::from(input.u8())),
                    _ => Duration::from_secs(u64::from(input.u16())),
                };
                self.now += d;
                self.m.handle_timeout(self.now);
                expect.fired = Some(self.now);
                format!("advance {d:?}")
            }
            9 => {
                if let Some(at) = self.m.poll_timeout() {
                    self.now = self.now.max(at);
                }
                self.m.handle_timeout(self.now);
                expect.fired = Some(self.now);
                format!("timeout {:?}", self.now - base())
            }
            10 => self.commit(input)?,
            11 => {
                let generation = match (&self.model.revoking, input.u8() % 4) {
                    (Some((g, _)), 0..=2) => *g,
                    (Some((g, _)), _) => g.wrapping_add(1),
                    (None, _) => self.model.joined.unwrap_or(0),
                };
                self.m.complete_revocation(self.now, generation);
                if let Some((g, partitions)) = &self.model.revoking
                    && *g == generation
                {
                    for p in partitions {
                        self.model.owned.remove(p);
                    }
                    self.model.revoking = None;
                }
                format!("complete revocation of generation {generation}")
            }
            12 => {
                self.m.note_progress(self.now);
                "progress".into()
            }
            13 => {
                let mut counts = BTreeMap::new();
                for t in TOPICS {
                    if !input.u8().is_multiple_of(4) {
                        counts.insert(t.to_string(), i32::from(input.u8() % 9));
                    }
                }
                self.m.set_topic_partitions(self.now, counts.clone());
                format!("partition counts {counts:?}")
            }
            14 => {
                if !input.u8().is_multiple_of(8) {
                    return Ok(());
                }
                self.m.leave(self.now);
                // "The application must have finished with its partitions."
                self.model.owned.clear();
                self.model.revoking = None;
                "leave".into()
            }
            _ => {
                if self.outstanding.is_empty() {
                    return Ok(());
                }
                let out = self.outstanding.remove(input.below(self.outstanding.len()));
                let id = out.id;
                self.lost.push(out);
                if self.lost.len() > 16 {
                    self.lost.remove(0);
                }
                format!("lost {id:?}")
            }
        };
        self.drain(&label, expect)
    }

    /// Removes and returns the outstanding request the input names.
    fn take_outstanding(&mut self, input: &mut Input) -> Option<Outgoing> {
        if self.outstanding.is_empty() {
            return None;
        }
        let i = input.below(self.outstanding.len());
        let out = self.outstanding.remove(i);
        self.answered.push(out.id);
        if self.answered.len() > 32 {
            self.answered.remove(0);
        }
        Some(out)
    }

    /// What answering `out` must do: complete a commit; change nothing if late.
    fn expect_answer(&self, out: &Outgoing, expect: &mut Expect) {
        if let GroupRequest::OffsetCommit { .. } = out.request {
            expect.completions.insert(out.id);
        }
        let late = match &out.request {
            GroupRequest::Heartbeat { generation, .. } => {
                self.model.heartbeat_generation != Some(*generation)
                    || !matches!(
                        self.m.state(),
                        StateKind::Syncing | StateKind::Stable | StateKind::Revoking
                    )
            }
            GroupRequest::OffsetCommit { generation, .. } => {
                self.m.generation() != Some(*generation)
            }
            GroupRequest::JoinGroup { .. } => {
                self.m.state() != StateKind::Joining || self.last_join != Some(out.id)
            }
            GroupRequest::SyncGroup { .. } => {
                self.m.state() != StateKind::Syncing || self.last_sync != Some(out.id)
            }
            _ => false,
        };
        if late {
            expect.unchanged = Some(self.snapshot());
        }
    }

    fn commit(&mut self, input: &mut Input) -> Result<String, String> {
        let mask = input.u8();
        let mut offsets: Vec<CommitOffset> = self
            .model
            .owned
            .iter()
            .enumerate()
            .filter(|(i, _)| mask >> (i % 7) & 1 == 1)
            .map(|(_, p)| CommitOffset {
                partition: p.clone(),
                offset: i64::from(input.u16()),
                leader_epoch: -1,
                metadata: None,
            })
            .collect();
        if mask & 0x80 != 0 {
            // A partition the application may not own.
            offsets.push(CommitOffset {
                partition: TopicPartition::new(TOPICS[input.below(3)], i32::from(input.u8() % 4)),
                offset: 1,
                leader_epoch: -1,
                metadata: None,
            });
        }
        let before = self.snapshot();
        let result = self.m.commit(self.now, offsets.clone());
        let unowned = offsets
            .iter()
            .find(|o| !self.model.owned.contains(&o.partition));
        match &result {
            Ok(id) => {
                if !matches!(before.state, StateKind::Stable | StateKind::Revoking) {
                    return Err(format!(
                        "commit accepted in {:?} (invariant 12)",
                        before.state
                    ));
                }
                let Some(generation) = before.generation else {
                    return Err("commit accepted without a generation (invariant 12)".into());
                };
                if before.coordinator.is_none() {
                    return Err("commit accepted with the coordinator unknown".into());
                }
                if let Some(o) = unowned {
                    return Err(format!(
                        "commit accepted for {}, which the application does not own (invariant 12)",
                        o.partition
                    ));
                }
                self.queued
                    .push_back((*id, generation, before.member_id.clone(), offsets.clone()));
            }
            Err(CommitError::Closed(_)) if before.state == StateKind::Closed => {}
            Err(e) if before.state == StateKind::Closed => {
                return Err(format!("a closed member refused a commit with {e:?}"));
            }
            Err(CommitError::NotOwned(p)) => {
                if self.model.owned.contains(p) {
                    return Err(format!("commit refused {p} as not owned, but it is"));
                }
            }
            Err(CommitError::NoGeneration) => {
                if before.generation.is_some()
                    && matches!(before.state, StateKind::Stable | StateKind::Revoking)
                {
                    return Err("commit refused for no generation while stable".into());
                }
            }
            Err(CommitError::CoordinatorUnknown) => {
                if before.coordinator.is_some() {
                    return Err("commit refused for an unknown coordinator that is known".into());
                }
            }
            Err(e) => return Err(format!("commit refused with {e:?}")),
        }
        Ok(format!("commit {offsets:?} -> {result:?}"))
    }

    /// Takes the member's requests and events, updates the application model and checks
    /// every promise.
    fn drain(&mut self, label: &str, mut expect: Expect) -> Result<(), String> {
        let requests: Vec<Outgoing> = std::iter::from_fn(|| self.m.poll_request()).collect();
        let events: Vec<Event> = std::iter::from_fn(|| self.m.poll_event()).collect();
        let after = self.snapshot();
        let _ = writeln!(
            self.trace,
            "{label}\n  requests {requests:?}\n  events {events:?}\n  {after:?}"
        );

        if let Some(before) = &expect.unchanged {
            if *before != after {
                return Err(format!(
                    "a late answer changed the member (invariant 11): {before:?} -> {after:?}"
                ));
            }
            // Answering the commit in flight, even late, lets the next one go out.
            if requests
                .iter()
                .any(|r| !matches!(r.request, GroupRequest::OffsetCommit { .. }))
            {
                return Err(format!("a late answer sent {requests:?} (invariant 11)"));
            }
            if let Some(e) = events
                .iter()
                .find(|e| !matches!(e, Event::CommitCompleted { .. }))
            {
                return Err(format!("a late answer emitted {e:?} (invariant 11)"));
            }
        }

        // Events, in order, against the application's view.
        for event in &events {
            self.apply_event(event, &mut expect)?;
        }
        if !expect.completions.is_empty() {
            return Err(format!(
                "commits {:?} were answered but never completed",
                expect.completions
            ));
        }

        // Requests, in order.
        let was_closed = self.closed.is_some();
        for out in &requests {
            if was_closed {
                return Err(format!("a closed member sent {out:?}"));
            }
            if self.last_id.is_some_and(|last| out.id <= last) {
                return Err(format!("request id {:?} after {:?}", out.id, self.last_id));
            }
            self.last_id = Some(out.id);
            let to_any = matches!(out.target, Target::AnyBroker);
            let finds = matches!(out.request, GroupRequest::FindCoordinator { .. });
            if to_any != finds {
                return Err(format!("{out:?} goes to the wrong broker"));
            }
            match &out.request {
                GroupRequest::OffsetCommit {
                    generation,
                    member_id,
                    offsets,
                    ..
                } => {
                    if let Some(on_wire) = self.commit_on_wire {
                        return Err(format!(
                            "{out:?} while the OffsetCommit {on_wire:?} is in flight (invariant 12)"
                        ));
                    }
                    let Some((id, g, m, o)) = self.queued.pop_front() else {
                        return Err(format!("an OffsetCommit nobody asked for: {out:?}"));
                    };
                    if out.id != id || *generation != g || *member_id != m || *offsets != o {
                        return Err(format!(
                            "the OffsetCommit {out:?} is not the oldest commit made: {id:?} generation {g} member {m} {o:?} (invariant 12)"
                        ));
                    }
                    self.commit_on_wire = Some(out.id);
                }
                GroupRequest::Heartbeat { generation, .. } => {
                    if self.model.rebalancing {
                        return Err(format!(
                            "a heartbeat between a JoinGroup and the next Joined (invariant 13): {out:?}"
                        ));
                    }
                    if self.model.heartbeat_generation != Some(*generation) {
                        return Err(format!(
                            "a heartbeat for generation {generation}, joined {:?}, heartbeats carry {:?}",
                            self.model.joined, self.model.heartbeat_generation
                        ));
                    }
                }
                GroupRequest::JoinGroup { .. } => {
                    self.model.rebalancing = true;
                    self.last_join = Some(out.id);
                }
                GroupRequest::SyncGroup { .. } => self.last_sync = Some(out.id),
                _ => {}
            }
            self.outstanding.push(out.clone());
        }
        if let Some((id, ..)) = self.queued.front()
            && self.commit_on_wire.is_none()
            && after.coordinator.is_some()
            && matches!(
                after.state,
                StateKind::Unjoined
                    | StateKind::Joining
                    | StateKind::Syncing
                    | StateKind::Stable
                    | StateKind::Revoking
            )
        {
            return Err(format!(
                "commit {id:?} waits with none in flight (invariant 12)"
            ));
        }
        // The oldest requests are lost when too many wait.
        if self.outstanding.len() > 48 {
            self.lost.extend(self.outstanding.drain(..16));
            let excess = self.lost.len().saturating_sub(16);
            self.lost.drain(..excess);
        }

        // The application's view is the member's.
        let assignment: BTreeSet<TopicPartition> = after.assignment.iter().cloned().collect();
        if assignment != self.model.owned {
            return Err(format!(
                "assignment() is {assignment:?}; the events say {:?}",
                self.model.owned
            ));
        }

        // Timers.
        if after.timeout.is_none()
            && !matches!(after.state, StateKind::Closed | StateKind::Suspended)
        {
            return Err(format!("no timer armed in {:?}", after.state));
        }
        if let (Some(now), Some(at)) = (expect.fired, self.m.poll_timeout())
            && at <= now
        {
            return Err(format!(
                "{:?} is still due after handle_timeout: the driver would spin ({:?} in {:?})",
                self.m.next_timer().map(|(t, _)| t),
                now - at,
                after.state
            ));
        }

        // Closed is sticky.
        match &self.closed {
            Some(error) if after.state != StateKind::Closed || after.error != *error => {
                return Err(format!(
                    "closed with {error:?}, now {:?} with {:?}",
                    after.state, after.error
                ));
            }
            Some(_) => {}
            None if after.state == StateKind::Closed => {
                if after.generation.is_some() {
                    return Err(format!(
                        "closed with a live generation {:?}",
                        after.generation
                    ));
                }
                self.closed = Some(after.error.clone());
                self.model.revoking = None;
            }
            None => {}
        }
        Ok(())
    }

    fn apply_event(&mut self, event: &Event, expect: &mut Expect) -> Result<(), String> {
        if let Event::CommitCompleted { id, .. } = event {
            if self.commit_on_wire == Some(*id) {
                self.commit_on_wire = None;
            }
            if expect.completions.remove(id) {
                return Ok(());
            }
            if let Some(i) = self.queued.iter().position(|(q, ..)| q == id)
                && self.m.state() == StateKind::Closed
            {
                self.queued.remove(i);
                return Ok(());
            }
            return Err(format!("{event:?} for a commit not answered now"));
        }
        let model = &mut self.model;
        match event {
            Event::Assigned {
                added, assignment, ..
            } => {
                if model.revoking.is_some() {
                    return Err(format!(
                        "Assigned while a revocation is pending: {event:?} (assigned and revoked never overlap)"
                    ));
                }
                if let Some(p) = added.iter().find(|p| model.owned.contains(*p)) {
                    return Err(format!("{p} assigned again while owned"));
                }
                model.owned.extend(added.iter().cloned());
                let all: BTreeSet<TopicPartition> = assignment.iter().cloned().collect();
                if all != model.owned {
                    return Err(format!(
                        "Assigned says {all:?} is owned; the events say {:?}",
                        model.owned
                    ));
                }
            }
            Event::RevokeRequested {
                generation,
                partitions,
            } => {
                if model.revoking.is_some() {
                    return Err(format!(
                        "a second revocation while one is pending: {event:?}"
                    ));
                }
                if partitions.is_empty() {
                    return Err("an empty revocation".into());
                }
                if let Some(p) = partitions.iter().find(|p| !model.owned.contains(*p)) {
                    return Err(format!("revocation of {p}, which is not owned"));
                }
                model.revoking = Some((*generation, partitions.iter().cloned().collect()));
            }
            Event::Lost { partitions, .. } => {
                if let Some(p) = partitions.iter().find(|p| !model.owned.contains(*p)) {
                    return Err(format!("{p} lost but not owned"));
                }
                for p in partitions {
                    model.owned.remove(p);
                }
                if let Some((_, pending)) = &mut model.revoking {
                    pending.retain(|p| model.owned.contains(p));
                    if pending.is_empty() {
                        model.revoking = None;
                    }
                }
            }
            Event::CommittedOffsets { offsets, .. } => {
                if let Some((p, ..)) = offsets.iter().find(|(p, ..)| !model.owned.contains(p)) {
                    return Err(format!("committed offset of {p}, which is not owned"));
                }
            }
            Event::CommitCompleted { .. } => {}
            Event::Joined { generation, .. } => {
                model.joined = Some(*generation);
                model.heartbeat_generation = Some(*generation);
                model.rebalancing = false;
            }
            Event::Fatal(_) | Event::Left => model.revoking = None,
            // A refusal the member outlives (Event::Error) changes nothing owned.
            Event::CoordinatorFound { .. }
            | Event::ProgressTimeout { .. }
            | Event::MetadataNeeded { .. }
            | Event::Error(_) => {}
            // The consumer protocol's epoch news; this target drives the classic
            // member, which never sends it.
            Event::MemberEpoch { .. } => {
                return Err(format!("{event:?} from the classic member"));
            }
        }
        Ok(())
    }

    /// A response of `request`'s kind, its fields from the input.
    fn response(&mut self, input: &mut Input, request: &GroupRequest, error: i16) -> GroupResponse {
        match request {
            GroupRequest::FindCoordinator { .. } => GroupResponse::FindCoordinator {
                error,
                node_id: if input.u8() % 8 == 7 {
                    -1
                } else {
                    i32::from(input.u8() % 3)
                },
                host: "h".into(),
                port: 9092,
            },
            GroupRequest::JoinGroup {
                member_id,
                protocols,
                ..
            } => {
                let generation = self.generation(input);
                let me = match (member_id.is_empty(), input.u8() % 8) {
                    (true, n) => format!("m{}", n % 3),
                    (false, 7) => "someone-else".into(),
                    (false, _) => member_id.clone(),
                };
                let protocol_name = match input.u8() % 8 {
                    0 => None,
                    1 => Some("unknown".into()),
                    n if !protocols.is_empty() => {
                        Some(protocols[usize::from(n) % protocols.len()].0.clone())
                    }
                    _ => Some(ASSIGNORS[0].into()),
                };
                let leader = if input.u8().is_multiple_of(3) {
                    "other".into()
                } else {
                    me.clone()
                };
                let members = if leader == me {
                    self.members(input, &me, protocols, protocol_name.as_deref())
                } else {
                    Vec::new()
                };
                GroupResponse::JoinGroup {
                    error,
                    generation,
                    protocol_name,
                    leader,
                    member_id: me,
                    members,
                    skip_assignment: input.u8() % 16 == 15,
                }
            }
            GroupRequest::SyncGroup { .. } => GroupResponse::SyncGroup {
                error,
                protocol_name: None,
                assignment: assignment(input),
            },
            GroupRequest::Heartbeat { .. } => GroupResponse::Heartbeat { error },
            GroupRequest::LeaveGroup { .. } => GroupResponse::LeaveGroup { error },
            GroupRequest::OffsetCommit { offsets, .. } => {
                let mut partitions: Vec<(TopicPartition, i16)> = offsets
                    .iter()
                    .map(|o| {
                        let code = if error != 0 && input.u8().is_multiple_of(2) {
                            error
                        } else {
                            0
                        };
                        (o.partition.clone(), code)
                    })
                    .collect();
                if let (true, Some(first)) = (error != 0, partitions.first_mut()) {
                    first.1 = error;
                }
                if input.u8() % 8 == 7 {
                    partitions.pop();
                }
                GroupResponse::OffsetCommit { partitions }
            }
            GroupRequest::OffsetFetch { partitions, .. } => {
                let top = if input.bool() { error } else { 0 };
                let mut answers: Vec<(TopicPartition, i64, i32, i16)> = Vec::new();
                for p in partitions {
                    if input.u8() % 8 == 7 {
                        continue;
                    }
                    let offset = match input.u8() % 4 {
                        0 => -1,
                        1 => input.i64(),
                        _ => i64::from(input.u16()),
                    };
                    let code = if top == 0 && error != 0 && input.bool() {
                        error
                    } else {
                        0
                    };
                    answers.push((p.clone(), offset, i32::from(input.u8()) - 1, code));
                }
                if input.u8() % 8 == 7 {
                    // A partition nobody asked for.
                    answers.push((TopicPartition::new("x", 3), 5, -1, 0));
                }
                GroupResponse::OffsetFetch {
                    error: top,
                    partitions: answers,
                    metadata: vec![],
                }
            }
            GroupRequest::ConsumerGroupHeartbeat { .. } => {
                panic!("the classic member sent a ConsumerGroupHeartbeat: {request:?}")
            }
        }
    }

    /// A response of `kind` (see [`kind`]), for a request that is not outstanding or of
    /// another kind.
    fn any_response(&mut self, input: &mut Input, kind: usize) -> GroupResponse {
        let error = CODES[input.below(CODES.len())];
        match kind {
            0 => GroupResponse::FindCoordinator {
                error,
                node_id: 1,
                host: "h".into(),
                port: 9092,
            },
            1 => GroupResponse::JoinGroup {
                error,
                generation: self.generation(input),
                protocol_name: Some(ASSIGNORS[0].into()),
                leader: "m0".into(),
                member_id: "m0".into(),
                members: Vec::new(),
                skip_assignment: false,
            },
            2 => GroupResponse::SyncGroup {
                error,
                protocol_name: None,
                assignment: assignment(input),
            },
            3 => GroupResponse::Heartbeat { error },
            4 => GroupResponse::LeaveGroup { error },
            5 => GroupResponse::OffsetCommit {
                partitions: vec![(TopicPartition::new("t", 0), error)],
            },
            _ => GroupResponse::OffsetFetch {
                error,
                partitions: vec![(TopicPartition::new("t", 0), 7, -1, 0)],
                metadata: vec![],
            },
        }
    }

    /// The generation a JoinGroup answer carries: usually the next, sometimes the same,
    /// an older one or anything.
    fn generation(&mut self, input: &mut Input) -> i32 {
        let g = match input.u8() % 8 {
            0 => self.generation_hint,
            1 => self.generation_hint.wrapping_sub(1),
            2 => i32::from(input.u16() as i16),
            _ => self.generation_hint.wrapping_add(1),
        };
        self.generation_hint = self.generation_hint.max(g);
        g
    }

    /// The members a leader is told about: usually itself with its own subscription,
    /// then others with generated subscriptions or arbitrary bytes.
    fn members(
        &self,
        input: &mut Input,
        me: &str,
        protocols: &[(String, Bytes)],
        chosen: Option<&str>,
    ) -> Vec<JoinedMember> {
        let mut members = Vec::new();
        if input.u8() % 8 != 7 {
            let own = protocols
                .iter()
                .find(|(name, _)| Some(name.as_str()) == chosen)
                .map(|(_, bytes)| bytes.clone())
                .unwrap_or_default();
            members.push(JoinedMember {
                member_id: me.to_string(),
                instance_id: self.instance_id.clone(),
                metadata: own,
            });
        }
        for i in 0..input.below(4) {
            let metadata = if input.u8().is_multiple_of(4) {
                Bytes::copy_from_slice(input.bytes(24))
            } else {
                let mask = input.u8();
                let subscription = Subscription {
                    topics: TOPICS
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mask >> i & 1 == 1)
                        .map(|(_, t)| t.to_string())
                        .collect(),
                    user_data: (mask & 0x08 != 0).then(|| Bytes::copy_from_slice(input.bytes(16))),
                    owned_partitions: partitions(input.u16()),
                    generation_id: self.generation_hint,
                    rack_id: None,
                };
                encode_subscription(&subscription, i16::from(mask >> 4) % 4).unwrap_or_default()
            };
            let member_id = if input.u8() % 16 == 15 {
                me.to_string()
            } else {
                format!("o{i}")
            };
            members.push(JoinedMember {
                member_id,
                instance_id: None,
                metadata,
            });
        }
        members
    }
}

/// The kind of a request, as [`Harness::any_response`] numbers them.
fn kind(request: &GroupRequest) -> usize {
    match request {
        GroupRequest::FindCoordinator { .. } => 0,
        GroupRequest::JoinGroup { .. } => 1,
        GroupRequest::SyncGroup { .. } => 2,
        GroupRequest::Heartbeat { .. } => 3,
        GroupRequest::LeaveGroup { .. } => 4,
        GroupRequest::OffsetCommit { .. } => 5,
        GroupRequest::OffsetFetch { .. } => 6,
        GroupRequest::ConsumerGroupHeartbeat { .. } => {
            panic!("the classic member sent a ConsumerGroupHeartbeat: {request:?}")
        }
    }
}

/// The member's configuration from the input header.
fn config(input: &mut Input) -> GroupConfig {
    let mask = input.u8();
    let mut names: Vec<&str> = ASSIGNORS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask >> i & 1 == 1)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        names.push(ASSIGNORS[0]);
    }
    let rotate = usize::from(mask >> 4) % names.len();
    names.rotate_left(rotate);
    let assignors: Vec<Arc<dyn Assignor>> = names
        .iter()
        .map(|n| Arc::from(builtin(n).expect("a built-in assignor")))
        .collect();
    let topics = if mask & 0x40 != 0 {
        vec!["t".to_string(), "u".to_string()]
    } else {
        vec!["t".to_string()]
    };
    let ms = |n: u64| Duration::from_millis(n);
    let mut c = GroupConfig::new("g", topics, assignors);
    // The consumer builder requires heartbeat.interval.ms < session.timeout.ms.
    let session = 1 + u64::from(input.u16());
    c.session_timeout = ms(session);
    c.heartbeat_interval = ms(u64::from(input.u16()) % session);
    c.max_poll_interval = ms(1 + 8 * u64::from(input.u16()));
    c.retry_backoff = ms(8 * u64::from(input.u8()));
    c.retry_backoff_max = c.retry_backoff + ms(32 * u64::from(input.u8()));
    c.request_slack = ms(40 * u64::from(input.u8()));
    let delay = input.u8();
    c.leader_sync_delay = if delay.is_multiple_of(2) {
        Duration::ZERO
    } else {
        ms(u64::from(delay))
    };
    c.instance_id = (mask & 0x80 != 0).then(|| "i".into());
    c.seed = u64::from(input.u8());
    c
}

/// Partitions of [`TOPICS`] `0..4` chosen by the bits of `mask`.
fn partitions(mask: u16) -> Vec<TopicPartition> {
    (0..12)
        .filter(|i| mask >> i & 1 == 1)
        .map(|i| TopicPartition::new(TOPICS[i / 4], (i % 4) as i32))
        .collect()
}

/// A SyncGroup assignment: usually a valid one of any ConsumerProtocol version, else
/// empty or arbitrary bytes.
fn assignment(input: &mut Input) -> Bytes {
    match input.u8() % 8 {
        0 => Bytes::new(),
        1 => Bytes::copy_from_slice(input.bytes(24)),
        n => {
            let a = Assignment {
                partitions: partitions(input.u16()),
                user_data: (n == 7).then(|| Bytes::copy_from_slice(input.bytes(16))),
            };
            encode_assignment(&a, i16::from(n) % 4).unwrap_or_default()
        }
    }
}

/// The trace of one run of `data` (what every step sent, emitted and left behind), or
/// the promise it broke. The seed writer checks that each seed gets where it was
/// written to go.
pub fn trace(data: &[u8]) -> Result<String, String> {
    Harness::run(data)
}

/// Writes `group_ops` inputs step by step, byte for byte what [`run`] reads: the seeds.
///
/// `k` always names an outstanding request by its position among those not yet
/// answered, oldest first.
#[derive(Debug, Clone)]
pub struct Script(Vec<u8>);

impl Script {
    /// A member with the assignors whose bits are set in `assignors` (bit `i` is
    /// [`ASSIGNORS`]`[i]`), subscribed to `t` (and `u`), static or dynamic: session 10 s,
    /// heartbeat 1 s, max.poll.interval 30 s, backoff 96 ms up to about 1 s, request
    /// slack 5 s, and `leader_sync_delay` in ms when odd (none when even).
    pub fn new(
        assignors: u8,
        two_topics: bool,
        static_member: bool,
        leader_sync_delay: u8,
    ) -> Self {
        let mut mask = assignors & 0x0f;
        if two_topics {
            mask |= 0x40;
        }
        if static_member {
            mask |= 0x80;
        }
        let mut b = vec![mask];
        b.extend_from_slice(&10_000u16.to_be_bytes());
        b.extend_from_slice(&1_000u16.to_be_bytes());
        b.extend_from_slice(&3_750u16.to_be_bytes());
        b.extend_from_slice(&[12, 31, 125, leader_sync_delay, 7]);
        Script(b)
    }

    /// The input.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    fn push(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }

    fn error_byte(code: i16) -> u8 {
        if code == 0 {
            return 0;
        }
        (192..=255u8)
            .find(|b| CODES[usize::from(*b) % CODES.len()] == code)
            .expect("a code in CODES")
    }

    /// Answers FindCoordinator `k` with node `node`.
    pub fn find_coordinator(self, k: u8, error: i16, node: u8) -> Self {
        self.push(&[0, k, Self::error_byte(error), 0, node])
    }

    /// Answers JoinGroup `k` with the next generation and the member's protocol at
    /// `protocol` of `protocols`. As the leader, it hears of itself and of `others`, each
    /// `(subscribed topics mask | ConsumerProtocol version << 4, owned partitions mask)`
    /// (bits as in [`TOPICS`], partitions 0..4 per topic); else it follows.
    pub fn join(
        self,
        k: u8,
        error: i16,
        (protocol, protocols): (u8, u8),
        leader: bool,
        others: &[(u8, u16)],
    ) -> Self {
        let pick = (2..=7u8)
            .find(|n| n % protocols == protocol)
            .expect("an index below the count");
        let mut b = vec![0, k, Self::error_byte(error), 3, 0, pick, u8::from(leader)];
        if leader {
            b.push(0);
            b.push(u8::try_from(others.len()).expect("few members"));
            for (topics, owned) in others {
                assert_eq!(topics & 0x08, 0, "no user data");
                b.extend_from_slice(&[1, *topics]);
                b.extend_from_slice(&owned.to_be_bytes());
                b.push(0);
            }
        }
        b.push(0);
        self.push(&b)
    }

    /// Answers SyncGroup `k` with the partitions in `partitions` (ConsumerProtocol v3).
    pub fn sync(self, k: u8, error: i16, partitions: u16) -> Self {
        let mut b = vec![0, k, Self::error_byte(error), 3];
        b.extend_from_slice(&partitions.to_be_bytes());
        self.push(&b)
    }

    /// Answers Heartbeat or LeaveGroup `k`.
    pub fn answer(self, k: u8, error: i16) -> Self {
        self.push(&[0, k, Self::error_byte(error)])
    }

    /// Answers OffsetCommit `k` of `offsets` partitions.
    pub fn commit_answer(self, k: u8, error: i16, offsets: usize) -> Self {
        let mut b = vec![0, k, Self::error_byte(error)];
        if error != 0 {
            b.extend(std::iter::repeat_n(0, offsets));
        }
        b.push(0);
        self.push(&b)
    }

    /// Answers OffsetFetch `k` of `partitions` partitions: offset 5 for each.
    pub fn offset_fetch(self, k: u8, partitions: usize) -> Self {
        let mut b = vec![0, k, 0, 0];
        for _ in 0..partitions {
            b.extend_from_slice(&[0, 2, 0, 5, 0]);
        }
        b.push(0);
        self.push(&b)
    }

    /// Request `k` fails: 0 disconnected, 1 timed out, 2 undecodable.
    pub fn fail(self, k: u8, how: u8) -> Self {
        self.push(&[4, k, how])
    }

    /// A failure for a request never sent.
    pub fn late(self) -> Self {
        self.push(&[6, 1, 5, 0])
    }

    /// The clock moves `ms` milliseconds.
    pub fn advance_ms(self, ms: u16) -> Self {
        let [a, b] = ms.to_be_bytes();
        self.push(&[7, 1, a, b])
    }

    /// The clock moves `s` seconds.
    pub fn advance_secs(self, s: u16) -> Self {
        let [a, b] = s.to_be_bytes();
        self.push(&[7, 3, a, b])
    }

    /// The clock moves to the next timer.
    pub fn fire(self) -> Self {
        self.push(&[9])
    }

    /// Commits the owned partitions whose bits (of the first seven, in order) are set in
    /// `mask` at `offsets`; bit 7 adds partition 3 of `x`.
    pub fn commit(self, mask: u8, offsets: &[u16]) -> Self {
        let mut b = vec![10, mask];
        for o in offsets {
            b.extend_from_slice(&o.to_be_bytes());
        }
        if mask & 0x80 != 0 {
            b.extend_from_slice(&[2, 3]);
        }
        self.push(&b)
    }

    /// Completes the pending revocation.
    pub fn complete_revocation(self) -> Self {
        self.push(&[11, 0])
    }

    /// The application comes back for records.
    pub fn progress(self) -> Self {
        self.push(&[12])
    }

    /// Partition counts of `t`, `u` and `x`.
    pub fn counts(self, t: u8, u: u8, x: u8) -> Self {
        self.push(&[13, 1, t, 1, u, 1, x])
    }

    /// The application leaves.
    pub fn leave(self) -> Self {
        self.push(&[14, 0])
    }

    /// Request `k` is never answered.
    pub fn lose(self, k: u8) -> Self {
        self.push(&[15, k])
    }
}
