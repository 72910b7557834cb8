//! Deterministic simulation of a consumer group: a simulated group coordinator, a
//! simulated network and a virtual clock, driving real [`GroupMember`] state machines.
//!
//! The coordinator follows the classic broker-side group state machine (Empty,
//! PreparingRebalance, CompletingRebalance, Stable) closely enough to exercise every
//! member transition. It complements the real peers; it never replaces them.
//!
//! Everything derives from a seed: the same seed and schedule replay to the same
//! requests, byte for byte.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ottla_proto::group::assignor::{Assignor, builtin};
use ottla_proto::group::consumer_protocol::{TopicPartition, decode_assignment};
use ottla_proto::group::member::{
    AssignmentJob, Event, Failure, GroupConfig, GroupMember, Outgoing, RequestId, StateKind, Target,
};
use ottla_proto::group::messages::{GroupRequest, GroupResponse, JoinedMember};

/// Error codes used by the simulated coordinator.
pub mod codes {
    /// REBALANCE_IN_PROGRESS
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    /// UNKNOWN_MEMBER_ID
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    /// ILLEGAL_GENERATION
    pub const ILLEGAL_GENERATION: i16 = 22;
    /// NOT_COORDINATOR
    pub const NOT_COORDINATOR: i16 = 16;
    /// COORDINATOR_NOT_AVAILABLE
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    /// COORDINATOR_LOAD_IN_PROGRESS
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    /// MEMBER_ID_REQUIRED
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    /// INVALID_REQUEST
    pub const INVALID_REQUEST: i16 = 42;
    /// REQUEST_TIMED_OUT
    pub const REQUEST_TIMED_OUT: i16 = 7;
}

pub use crate::rng::Rng;

/// A fault or action the schedule can inject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Let time pass.
    Wait(Duration),
    /// Move the coordinator to another node.
    MoveCoordinator,
    /// The next response to requests of this kind carries this error code.
    InjectError(&'static str, i16),
    /// The next request in flight is dropped (the member sees a timeout).
    Drop,
    /// The connection to the coordinator breaks: everything in flight fails.
    Disconnect,
    /// A member joins the group.
    AddMember,
    /// Member `i` (modulo the count) leaves cleanly.
    RemoveMember(usize),
    /// Member `i` stops answering (crash), so its session lapses at the coordinator.
    CrashMember(usize),
    /// Member `i` closes and a new process with the same configuration (and
    /// `group.instance.id`, for static members) starts at once.
    RestartMember(usize),
    /// Member `i` acknowledges its pending revocation now.
    AckRevocation(usize),
    /// Network delay changes.
    SetDelay(Duration),
}

/// How the simulation went, for assertions.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// A line per request sent, for replay checks.
    pub trace: String,
    /// Generations formed.
    pub generations: i32,
    /// Times the group was observed stable with every partition owned.
    pub stable_checks: u32,
    /// Commits the coordinator accepted.
    pub commits_accepted: u32,
    /// RevokeRequested and Lost events seen by members.
    pub revocations: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GState {
    Empty,
    /// Waiting for members to (re)join: completes once all known members joined and
    /// `not_before` passed (the initial rebalance delay), or at `deadline`.
    PreparingRebalance {
        deadline: Instant,
        not_before: Instant,
    },
    CompletingRebalance,
    Stable,
}

#[derive(Debug, Clone)]
struct CMember {
    instance_id: Option<String>,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    last_seen: Instant,
    join: Option<(usize, RequestId)>,
    sync: Option<(usize, RequestId)>,
    assignment: Bytes,
}

/// The simulated group coordinator.
#[derive(Debug)]
struct Coordinator {
    node: i32,
    state: GState,
    generation: i32,
    members: BTreeMap<String, CMember>,
    leader: Option<String>,
    protocol: Option<String>,
    statics: BTreeMap<String, String>,
    /// Ids handed out with MEMBER_ID_REQUIRED, not yet joined (KIP-394).
    pending: BTreeSet<String>,
    next_member: u64,
    initial_delay: Duration,
    /// Owner of each partition per generation, as assigned.
    owners: BTreeMap<i32, BTreeMap<String, BTreeSet<TopicPartition>>>,
    offsets: BTreeMap<TopicPartition, i64>,
}

struct Delivery {
    at: Instant,
    member: usize,
    id: RequestId,
    outcome: Result<GroupResponse, Failure>,
}

struct InFlight {
    at: Instant,
    member: usize,
    out: Outgoing,
}

struct SimMember {
    m: GroupMember,
    alive: bool,
    /// Generation and partitions of a revocation the app has not acknowledged.
    pending_revoke: Option<i32>,
    /// Acknowledge revocations automatically after this delay (the app's work).
    ack_delay: Duration,
    revoke_since: Option<Instant>,
}

/// The simulated world.
pub struct Sim {
    now: Instant,
    rng: Rng,
    coord: Coordinator,
    members: Vec<SimMember>,
    to_coordinator: Vec<InFlight>,
    to_members: Vec<Delivery>,
    delay: Duration,
    injected: VecDeque<(&'static str, i16)>,
    topics: BTreeMap<String, i32>,
    assignor: &'static str,
    report: Report,
    base: Instant,
    violations: Vec<String>,
    steps: u64,
    verbose: bool,
    assign_time: Duration,
    /// Assignments being computed: when each is done, and for which member.
    assigning: Vec<(Instant, usize, AssignmentJob)>,
}

/// Settings of one simulation.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The assignor every member uses.
    pub assignor: &'static str,
    /// Initial members.
    pub members: usize,
    /// Partitions of the one topic.
    pub partitions: i32,
    /// Whether members are static (KIP-345).
    pub static_members: bool,
    /// How long the leader's assignor runs (off the member's task, as the driver runs
    /// it): zero runs it at once; longer than the session shows the leader heartbeats
    /// meanwhile.
    pub assign_time: Duration,
}

const TOPIC: &str = "sim";

impl Sim {
    /// A world with `config.members` members, from `seed`.
    pub fn new(seed: u64, config: &SimConfig) -> Self {
        let base = Instant::now();
        let mut sim = Sim {
            now: base,
            rng: Rng::new(seed),
            coord: Coordinator {
                node: 1,
                state: GState::Empty,
                generation: 0,
                members: BTreeMap::new(),
                leader: None,
                protocol: None,
                statics: BTreeMap::new(),
                pending: BTreeSet::new(),
                next_member: 0,
                initial_delay: Duration::from_millis(300),
                owners: BTreeMap::new(),
                offsets: BTreeMap::new(),
            },
            members: Vec::new(),
            to_coordinator: Vec::new(),
            to_members: Vec::new(),
            delay: Duration::from_millis(2),
            injected: VecDeque::new(),
            topics: BTreeMap::from([(TOPIC.to_string(), config.partitions)]),
            assignor: config.assignor,
            report: Report::default(),
            base,
            violations: Vec::new(),
            steps: 0,
            verbose: false,
            assign_time: config.assign_time,
            assigning: Vec::new(),
        };
        for i in 0..config.members {
            sim.add_member(config.static_members.then(|| format!("static-{i}")));
        }
        sim
    }

    fn add_member(&mut self, instance_id: Option<String>) {
        let a: Arc<dyn Assignor> = match builtin(self.assignor) {
            Some(a) => Arc::from(a),
            None => return,
        };
        let mut c = GroupConfig::new("sim-group", vec![TOPIC.into()], vec![a]);
        c.session_timeout = Duration::from_secs(6);
        c.heartbeat_interval = Duration::from_secs(1);
        c.max_poll_interval = Duration::from_secs(20);
        c.request_slack = Duration::from_secs(5);
        c.instance_id = instance_id;
        c.seed = self.rng.next_u64();
        let mut m = GroupMember::new(c, self.now);
        m.set_topic_partitions(self.now, self.topics.clone());
        let ack_delay = Duration::from_millis(self.rng.below(1500));
        self.members.push(SimMember {
            m,
            alive: true,
            pending_revoke: None,
            ack_delay,
            revoke_since: None,
        });
        // Its first FindCoordinator goes out now, not at the next step.
        let _ = self.drain(self.members.len() - 1);
    }

    /// Runs `schedule`, checking every invariant after every step. Returns the report or
    /// the first violated invariant.
    pub fn run(self, schedule: &[Action]) -> Result<Report, String> {
        let verbose = std::env::var("OTTLA_SIM_TRACE").is_ok();
        let mut sim = self;
        sim.verbose = verbose;
        // With the trace asked for, a failure ends with it.
        sim.run_inner(schedule).map_err(|e| {
            if verbose {
                format!("{e}\ntrace:\n{}", sim.report.trace)
            } else {
                e
            }
        })
    }

    fn run_inner(&mut self, schedule: &[Action]) -> Result<Report, String> {
        for action in schedule {
            if self.verbose {
                let _ = writeln!(
                    self.report.trace,
                    "{:?} ACTION {action:?}",
                    self.now - self.base
                );
            }
            self.apply(action)?;
            self.check()?;
        }
        // Settle: no faults for a while; the group must converge. A group whose
        // members all left gets a new one, so there is something to converge.
        self.injected.clear();
        if !self
            .members
            .iter()
            .any(|s| s.alive && !matches!(s.m.state(), StateKind::Closed | StateKind::Leaving))
        {
            self.add_member(None);
        }
        self.delay = Duration::from_millis(2);
        // Up to two minutes of virtual time: several session and rebalance timeouts.
        let settle_until = self.now + Duration::from_secs(120);
        while self.now < settle_until {
            self.step()?;
            self.check()?;
            if self.converged() {
                self.report.stable_checks += 1;
                break;
            }
        }
        if !self.converged() {
            return Err(format!(
                "no convergence after the schedule: coordinator {:?} gen {}, members {:?}",
                self.coord.state,
                self.coord.generation,
                self.members
                    .iter()
                    .map(|s| (
                        s.alive,
                        s.m.state(),
                        s.m.generation(),
                        s.m.assignment().len()
                    ))
                    .collect::<Vec<_>>()
            ));
        }
        self.report.generations = self.coord.generation;
        Ok(self.report.clone())
    }

    fn apply(&mut self, action: &Action) -> Result<(), String> {
        match action {
            Action::Wait(d) => {
                let until = self.now + *d;
                while self.now < until {
                    self.step_until(until)?;
                    self.check()?;
                }
            }
            Action::MoveCoordinator => {
                self.coord.node = 1 + (self.coord.node % 3);
            }
            Action::InjectError(api, code) => self.injected.push_back((api, *code)),
            Action::Drop => {
                if !self.to_coordinator.is_empty() {
                    let i = self.rng.below(self.to_coordinator.len() as u64) as usize;
                    let f = self.to_coordinator.remove(i);
                    // The driver's request timeout fires later.
                    self.to_members.push(Delivery {
                        at: self.now + Duration::from_secs(3),
                        member: f.member,
                        id: f.out.id,
                        outcome: Err(Failure::Timeout),
                    });
                }
            }
            Action::Disconnect => {
                let pending = std::mem::take(&mut self.to_coordinator);
                for f in pending {
                    self.to_members.push(Delivery {
                        at: self.now + self.delay,
                        member: f.member,
                        id: f.out.id,
                        outcome: Err(Failure::Disconnected),
                    });
                }
            }
            Action::AddMember => {
                if self.members.len() < 8 {
                    self.add_member(None);
                }
            }
            Action::RemoveMember(i) => {
                let n = self.members.len();
                if let Some(s) = self.members.get_mut(i % n.max(1))
                    && s.alive
                {
                    s.m.leave(self.now);
                    self.drain(i % n)?;
                }
            }
            Action::CrashMember(i) => {
                let n = self.members.len();
                if let Some(s) = self.members.get_mut(i % n.max(1)) {
                    s.alive = false;
                }
            }
            Action::RestartMember(i) => {
                let n = self.members.len();
                let idx = i % n.max(1);
                let alive = self.members.get(idx).is_some_and(|s| s.alive);
                if alive {
                    let instance = self
                        .members
                        .get(idx)
                        .and_then(|s| s.m.config().instance_id.clone());
                    if let Some(s) = self.members.get_mut(idx) {
                        s.m.leave(self.now);
                    }
                    self.drain(idx)?;
                    if let Some(s) = self.members.get_mut(idx) {
                        s.alive = false;
                    }
                    self.add_member(instance);
                }
            }
            Action::AckRevocation(i) => {
                let n = self.members.len();
                let idx = i % n.max(1);
                if let Some(s) = self.members.get_mut(idx)
                    && let Some(g) = s.pending_revoke.take()
                {
                    s.m.complete_revocation(self.now, g);
                    s.revoke_since = None;
                    self.drain(idx)?;
                }
            }
            Action::SetDelay(d) => self.delay = *d,
        }
        Ok(())
    }

    /// Advances to the next thing that happens (bounded by 1 s).
    fn step(&mut self) -> Result<(), String> {
        let until = self.now + Duration::from_secs(1);
        self.step_until(until)
    }

    fn step_until(&mut self, until: Instant) -> Result<(), String> {
        let mut next = until;
        for f in &self.to_coordinator {
            next = next.min(f.at);
        }
        for d in &self.to_members {
            next = next.min(d.at);
        }
        for (at, _, _) in &self.assigning {
            next = next.min(*at);
        }
        for s in self.members.iter().filter(|s| s.alive) {
            if let Some(t) = s.m.poll_timeout() {
                next = next.min(t);
            }
            if let Some(since) = s.revoke_since {
                next = next.min(since + s.ack_delay);
            }
        }
        if let GState::PreparingRebalance {
            deadline,
            not_before,
        } = self.coord.state
        {
            next = next.min(deadline);
            if not_before > self.now {
                next = next.min(not_before);
            }
        }
        if matches!(
            self.coord.state,
            GState::Stable | GState::CompletingRebalance
        ) {
            for m in self.coord.members.values() {
                next = next.min(m.last_seen + m.session_timeout);
            }
        }
        // Time always moves, so a deadline that stays in the past cannot spin the loop.
        self.now = next.max(self.now + Duration::from_millis(1));
        self.steps += 1;
        if self.steps > 2_000_000 {
            return Err("simulation did not finish within 2,000,000 steps".into());
        }

        // Network: requests reach the coordinator.
        let (due, rest): (Vec<InFlight>, Vec<InFlight>) = std::mem::take(&mut self.to_coordinator)
            .into_iter()
            .partition(|f| f.at <= self.now);
        self.to_coordinator = rest;
        for f in due {
            self.coordinator_receive(f);
        }
        self.coordinator_tick();

        // Network: responses reach members.
        let (due, rest): (Vec<Delivery>, Vec<Delivery>) = std::mem::take(&mut self.to_members)
            .into_iter()
            .partition(|d| d.at <= self.now);
        self.to_members = rest;
        for d in due {
            let Some(s) = self.members.get_mut(d.member) else {
                continue;
            };
            if !s.alive {
                continue;
            }
            match d.outcome {
                Ok(r) => s.m.handle_response(self.now, d.id, r),
                Err(f) => s.m.handle_failure(self.now, d.id, f),
            }
            self.drain(d.member)?;
        }
        // Assignments computed.
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.assigning)
            .into_iter()
            .partition(|(at, _, _)| *at <= self.now);
        self.assigning = rest;
        for (_, i, job) in due {
            let Some(s) = self.members.get_mut(i) else {
                continue;
            };
            if s.alive {
                s.m.assignment_done(self.now, job.run());
                self.drain(i)?;
            }
        }
        for i in 0..self.members.len() {
            let s = &mut self.members[i];
            if !s.alive {
                continue;
            }
            if let (Some(since), Some(g)) = (s.revoke_since, s.pending_revoke)
                && self.now >= since + s.ack_delay
            {
                s.m.complete_revocation(self.now, g);
                s.pending_revoke = None;
                s.revoke_since = None;
            }
            s.m.note_progress(self.now);
            s.m.handle_timeout(self.now);
            self.drain(i)?;
        }
        Ok(())
    }

    /// Takes a member's requests onto the network and its events into the app model.
    fn drain(&mut self, i: usize) -> Result<(), String> {
        let now = self.now;
        let delay = self.delay;
        let Some(s) = self.members.get_mut(i) else {
            return Ok(());
        };
        if self.assign_time.is_zero() {
            s.m.assign_inline(now);
        } else if let Some(job) = s.m.poll_assignment() {
            self.assigning.push((now + self.assign_time, i, job));
        }
        while let Some(out) = s.m.poll_request() {
            let _ = writeln!(
                self.report.trace,
                "{:?} m{i} {:?} {:?}",
                now - self.base,
                out.target,
                out.request
            );
            self.to_coordinator.push(InFlight {
                at: now + delay,
                member: i,
                out,
            });
        }
        while let Some(ev) = s.m.poll_event() {
            if self.verbose {
                let _ = writeln!(self.report.trace, "{:?} m{i} EVENT {ev:?}", now - self.base);
            }
            match ev {
                Event::RevokeRequested { generation, .. } => {
                    self.report.revocations += 1;
                    s.pending_revoke = Some(generation);
                    s.revoke_since = Some(now);
                }
                Event::Lost { .. } => {
                    self.report.revocations += 1;
                    s.pending_revoke = None;
                    s.revoke_since = None;
                }
                Event::Left | Event::Fatal(_) => {
                    s.pending_revoke = None;
                    s.revoke_since = None;
                }
                Event::Assigned {
                    generation,
                    ref assignment,
                    ..
                } => {
                    // The app commits something for what it owns, now and then.
                    if generation % 2 == 0
                        && let Some(p) = assignment.first().cloned()
                    {
                        let offset = ottla_proto::group::messages::CommitOffset {
                            partition: p,
                            offset: i64::from(generation),
                            leader_epoch: -1,
                            metadata: None,
                        };
                        let _ = s.m.commit(now, vec![offset]);
                    }
                }
                _ => {}
            }
        }
        // Commits just issued.
        while let Some(out) = s.m.poll_request() {
            let _ = writeln!(
                self.report.trace,
                "{:?} m{i} {:?} {:?}",
                now - self.base,
                out.target,
                out.request
            );
            self.to_coordinator.push(InFlight {
                at: now + delay,
                member: i,
                out,
            });
        }
        Ok(())
    }

    fn respond(&mut self, member: usize, id: RequestId, response: GroupResponse) {
        self.to_members.push(Delivery {
            at: self.now + self.delay,
            member,
            id,
            outcome: Ok(response),
        });
    }

    fn injected_for(&mut self, api: &str) -> Option<i16> {
        let pos = self.injected.iter().position(|(a, _)| *a == api)?;
        self.injected.remove(pos).map(|(_, c)| c)
    }

    fn coordinator_receive(&mut self, f: InFlight) {
        let (member, id) = (f.member, f.out.id);
        if let Target::Coordinator(node) = f.out.target
            && node.0 != self.coord.node
        {
            let r = not_coordinator(&f.out.request);
            return self.respond(member, id, r);
        }
        let api = format!("{:?}", f.out.request.api());
        if let Some(code) = self.injected_for(&api) {
            let r = with_error(&f.out.request, code);
            return self.respond(member, id, r);
        }
        match f.out.request {
            GroupRequest::FindCoordinator { .. } => {
                let node = self.coord.node;
                self.respond(
                    member,
                    id,
                    GroupResponse::FindCoordinator {
                        error: 0,
                        node_id: node,
                        host: format!("node{node}"),
                        port: 9092,
                    },
                );
            }
            GroupRequest::JoinGroup {
                member_id,
                instance_id,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocols,
                ..
            } => self.join(
                member,
                id,
                member_id,
                instance_id,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocols,
            ),
            GroupRequest::SyncGroup {
                generation,
                member_id,
                assignments,
                ..
            } => self.sync(member, id, generation, member_id, assignments),
            GroupRequest::Heartbeat {
                generation,
                member_id,
                ..
            } => {
                let error = self.check_member(&member_id, generation, true);
                if error == 0
                    && let Some(m) = self.coord.members.get_mut(&member_id)
                {
                    m.last_seen = self.now;
                }
                self.respond(member, id, GroupResponse::Heartbeat { error });
            }
            GroupRequest::LeaveGroup { member_id, .. } => {
                let error = if self.coord.members.remove(&member_id).is_some() {
                    self.coord.statics.retain(|_, m| *m != member_id);
                    self.rebalance();
                    0
                } else {
                    codes::UNKNOWN_MEMBER_ID
                };
                self.respond(member, id, GroupResponse::LeaveGroup { error });
            }
            GroupRequest::OffsetCommit {
                generation,
                member_id,
                offsets,
                ..
            } => {
                let error = self.check_member(&member_id, generation, false);
                if error == 0 {
                    for o in &offsets {
                        if !self.owned_recently(&member_id, generation, &o.partition) {
                            self.violations.push(format!(
                                "commit of {} accepted from {member_id} in generation {generation}, which does not own it",
                                o.partition
                            ));
                        }
                    }
                    self.report.commits_accepted += 1;
                    for o in &offsets {
                        self.coord.offsets.insert(o.partition.clone(), o.offset);
                    }
                }
                let partitions = offsets.into_iter().map(|o| (o.partition, error)).collect();
                self.respond(member, id, GroupResponse::OffsetCommit { partitions });
            }
            GroupRequest::OffsetFetch { partitions, .. } => {
                let partitions = partitions
                    .into_iter()
                    .map(|p| {
                        let o = self.coord.offsets.get(&p).copied().unwrap_or(-1);
                        (p, o, -1, 0)
                    })
                    .collect();
                self.respond(
                    member,
                    id,
                    GroupResponse::OffsetFetch {
                        error: 0,
                        partitions,
                        metadata: vec![],
                    },
                );
            }
            // The simulated coordinator is the classic protocol's; the consumer
            // protocol's members are tested against the librdkafka mock.
            GroupRequest::ConsumerGroupHeartbeat { .. } => {
                let r = with_error(
                    &f.out.request,
                    kafka_protocol::ResponseError::UnsupportedVersion.code(),
                );
                self.respond(member, id, r);
            }
        }
    }

    /// Whether `member` was assigned `p` in `generation`, or in its own most recent
    /// earlier generation (a cooperative member commits partitions it is revoking).
    fn owned_recently(&self, member: &str, generation: i32, p: &TopicPartition) -> bool {
        let mut gens = self.coord.owners.range(..=generation).rev();
        let Some((_, current)) = gens.next() else {
            return false;
        };
        if current.get(member).is_some_and(|s| s.contains(p)) {
            return true;
        }
        gens.find_map(|(_, owners)| owners.get(member))
            .is_some_and(|s| s.contains(p))
    }

    /// Error for a heartbeat or commit from `member_id` in `generation`.
    fn check_member(&self, member_id: &str, generation: i32, heartbeat: bool) -> i16 {
        if !self.coord.members.contains_key(member_id) {
            return codes::UNKNOWN_MEMBER_ID;
        }
        match self.coord.state {
            GState::PreparingRebalance { .. } if heartbeat => codes::REBALANCE_IN_PROGRESS,
            // As Kafka: a heartbeat after the JoinGroup answer, of the generation it
            // gave, is a normal one and renews the session (the leader heartbeats while
            // it assigns).
            GState::CompletingRebalance if heartbeat && generation == self.coord.generation => 0,
            GState::CompletingRebalance => codes::REBALANCE_IN_PROGRESS,
            _ if generation != self.coord.generation => codes::ILLEGAL_GENERATION,
            _ => 0,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn join(
        &mut self,
        member: usize,
        id: RequestId,
        member_id: String,
        instance_id: Option<String>,
        session_timeout_ms: i32,
        rebalance_timeout_ms: i32,
        protocols: Vec<(String, Bytes)>,
    ) {
        let session_timeout = Duration::from_millis(session_timeout_ms.max(0) as u64);
        let rebalance_timeout = Duration::from_millis(rebalance_timeout_ms.max(0) as u64);
        let member_id = if member_id.is_empty() {
            // Static members get their old id back (KIP-345); new dynamic members must
            // come back with a fresh one (KIP-394).
            if let Some(existing) = instance_id
                .as_ref()
                .and_then(|i| self.coord.statics.get(i))
                .cloned()
            {
                existing
            } else {
                self.coord.next_member += 1;
                let fresh = format!("member-{}", self.coord.next_member);
                if let Some(i) = &instance_id {
                    self.coord.statics.insert(i.clone(), fresh.clone());
                } else {
                    self.coord.pending.insert(fresh.clone());
                    let r = GroupResponse::JoinGroup {
                        error: codes::MEMBER_ID_REQUIRED,
                        generation: -1,
                        protocol_name: None,
                        leader: String::new(),
                        member_id: fresh,
                        members: vec![],
                        skip_assignment: false,
                    };
                    return self.respond(member, id, r);
                }
                fresh
            }
        } else if !self.coord.members.contains_key(&member_id)
            && !self.coord.pending.remove(&member_id)
        {
            // An id the coordinator never issued, or one it removed (a member that
            // missed a rebalance or whose session expired), as Kafka answers.
            if instance_id.as_ref().and_then(|i| self.coord.statics.get(i)) != Some(&member_id) {
                return self.respond(member, id, join_error(codes::UNKNOWN_MEMBER_ID));
            }
            member_id
        } else {
            member_id
        };
        // KIP-345: a known static member (not the leader) rejoining a stable group
        // gets the current generation back with no rebalance.
        let is_leader = self.coord.leader.as_deref() == Some(member_id.as_str());
        let stable = self.coord.state == GState::Stable;
        if let Some(existing) = self.coord.members.get_mut(&member_id)
            && existing.instance_id.is_some()
            && stable
            && !is_leader
        {
            existing.last_seen = self.now;
            let r = GroupResponse::JoinGroup {
                error: 0,
                generation: self.coord.generation,
                protocol_name: self.coord.protocol.clone(),
                leader: self.coord.leader.clone().unwrap_or_default(),
                member_id: member_id.clone(),
                members: vec![],
                skip_assignment: false,
            };
            return self.respond(member, id, r);
        }
        let entry = self
            .coord
            .members
            .entry(member_id.clone())
            .or_insert(CMember {
                instance_id,
                session_timeout,
                rebalance_timeout,
                protocols: protocols.clone(),
                last_seen: self.now,
                join: None,
                sync: None,
                assignment: Bytes::new(),
            });
        entry.protocols = protocols;
        entry.last_seen = self.now;
        entry.join = Some((member, id));
        match self.coord.state {
            GState::Stable | GState::CompletingRebalance | GState::Empty => self.rebalance(),
            GState::PreparingRebalance { .. } => {}
        }
        self.maybe_complete_join();
    }

    fn rebalance(&mut self) {
        if let GState::PreparingRebalance { .. } = self.coord.state {
            return;
        }
        let timeout = self
            .coord
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        // Java's group.initial.rebalance.delay.ms: a new group waits a little for more
        // members before forming its first generation.
        let delay = if self.coord.state == GState::Empty {
            self.coord.initial_delay
        } else {
            Duration::ZERO
        };
        self.coord.state = GState::PreparingRebalance {
            deadline: self.now + timeout.max(delay),
            not_before: self.now + delay,
        };
        // Members waiting at the sync barrier learn of the new round.
        let waiting: Vec<(usize, RequestId)> = self
            .coord
            .members
            .values_mut()
            .filter_map(|m| m.sync.take())
            .collect();
        for (member, id) in waiting {
            self.respond(member, id, sync_error(codes::REBALANCE_IN_PROGRESS));
        }
    }

    fn maybe_complete_join(&mut self) {
        let GState::PreparingRebalance {
            deadline,
            not_before,
        } = self.coord.state
        else {
            return;
        };
        let all_joined = self.coord.members.values().all(|m| m.join.is_some());
        let ready = (all_joined && self.now >= not_before) || self.now >= deadline;
        if !ready {
            return;
        }
        // Members that did not rejoin in time are removed.
        self.coord.members.retain(|_, m| m.join.is_some());
        let members = &self.coord.members;
        self.coord.statics.retain(|_, id| members.contains_key(id));
        if self.coord.members.is_empty() {
            self.coord.state = GState::Empty;
            return;
        }
        self.coord.generation += 1;
        self.report.generations = self.coord.generation;
        // Pick the first protocol every member supports (all use one assignor here).
        let protocol = self
            .coord
            .members
            .values()
            .next()
            .and_then(|m| m.protocols.first().map(|p| p.0.clone()));
        self.coord.protocol = protocol.clone();
        let leader = self
            .coord
            .leader
            .clone()
            .filter(|l| self.coord.members.contains_key(l))
            .or_else(|| self.coord.members.keys().next().cloned());
        self.coord.leader = leader.clone();
        let leader = leader.unwrap_or_default();
        let members: Vec<JoinedMember> = self
            .coord
            .members
            .iter()
            .map(|(id, m)| JoinedMember {
                member_id: id.clone(),
                instance_id: m.instance_id.clone(),
                metadata: m
                    .protocols
                    .iter()
                    .find(|p| Some(&p.0) == protocol.as_ref())
                    .map(|p| p.1.clone())
                    .unwrap_or_default(),
            })
            .collect();
        let generation = self.coord.generation;
        // As Kafka's `onCompleteJoin`: every member's session starts again from the
        // JoinGroup answer (a member waiting in JoinGroup is never expired).
        let now = self.now;
        let joins: Vec<(String, usize, RequestId)> = self
            .coord
            .members
            .iter_mut()
            .filter_map(|(id, m)| {
                m.last_seen = now;
                m.join.take().map(|(i, r)| (id.clone(), i, r))
            })
            .collect();
        for (id, member, request) in joins {
            let r = GroupResponse::JoinGroup {
                error: 0,
                generation,
                protocol_name: protocol.clone(),
                leader: leader.clone(),
                member_id: id.clone(),
                members: if id == leader {
                    members.clone()
                } else {
                    vec![]
                },
                skip_assignment: false,
            };
            self.respond(member, request, r);
        }
        self.coord.state = GState::CompletingRebalance;
    }

    fn sync(
        &mut self,
        member: usize,
        id: RequestId,
        generation: i32,
        member_id: String,
        assignments: Vec<(String, Bytes)>,
    ) {
        if !self.coord.members.contains_key(&member_id) {
            return self.respond(member, id, sync_error(codes::UNKNOWN_MEMBER_ID));
        }
        if generation != self.coord.generation {
            return self.respond(member, id, sync_error(codes::ILLEGAL_GENERATION));
        }
        match self.coord.state {
            GState::CompletingRebalance => {}
            GState::Stable => {
                let a = self
                    .coord
                    .members
                    .get(&member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                return self.respond(
                    member,
                    id,
                    GroupResponse::SyncGroup {
                        error: 0,
                        protocol_name: self.coord.protocol.clone(),
                        assignment: a,
                    },
                );
            }
            _ => return self.respond(member, id, sync_error(codes::REBALANCE_IN_PROGRESS)),
        }
        if let Some(m) = self.coord.members.get_mut(&member_id) {
            m.sync = Some((member, id));
            m.last_seen = self.now;
        }
        if Some(&member_id) == self.coord.leader.as_ref() {
            let mut owners: BTreeMap<String, BTreeSet<TopicPartition>> = BTreeMap::new();
            for (mid, bytes) in assignments {
                if let Ok(a) = decode_assignment(bytes.clone()) {
                    owners.insert(mid.clone(), a.partitions.into_iter().collect());
                }
                if let Some(m) = self.coord.members.get_mut(&mid) {
                    m.assignment = bytes;
                }
            }
            self.coord.owners.insert(generation, owners);
            self.coord.state = GState::Stable;
            let waiting: Vec<(String, usize, RequestId)> = self
                .coord
                .members
                .iter_mut()
                .filter_map(|(mid, m)| m.sync.take().map(|(i, r)| (mid.clone(), i, r)))
                .collect();
            for (mid, member, request) in waiting {
                let a = self
                    .coord
                    .members
                    .get(&mid)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                self.respond(
                    member,
                    request,
                    GroupResponse::SyncGroup {
                        error: 0,
                        protocol_name: self.coord.protocol.clone(),
                        assignment: a,
                    },
                );
            }
        }
    }

    fn coordinator_tick(&mut self) {
        // Session expiry (only outside a rebalance, as brokers do for joined members).
        if matches!(
            self.coord.state,
            GState::Stable | GState::CompletingRebalance
        ) {
            let now = self.now;
            let expired: Vec<String> = self
                .coord
                .members
                .iter()
                .filter(|(_, m)| now >= m.last_seen + m.session_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            if !expired.is_empty() {
                for id in &expired {
                    self.coord.members.remove(id);
                }
                self.rebalance();
            }
        }
        if let GState::PreparingRebalance { .. } = self.coord.state {
            self.maybe_complete_join();
        }
    }

    /// The invariants, checked after every step.
    fn check(&mut self) -> Result<(), String> {
        let r = self.check_inner();
        if r.is_err() && self.verbose {
            eprintln!("{}", self.report.trace);
        }
        r
    }

    fn check_inner(&mut self) -> Result<(), String> {
        if let Some(v) = self.violations.first() {
            return Err(v.clone());
        }
        // 1. No partition owned by two members in one generation.
        let mut by_gen: BTreeMap<i32, BTreeMap<TopicPartition, usize>> = BTreeMap::new();
        for (i, s) in self.members.iter().enumerate() {
            if !s.alive {
                continue;
            }
            let Some(g) = s.m.generation() else { continue };
            for p in s.m.assignment() {
                if let Some(other) = by_gen.entry(g).or_default().insert(p.clone(), i) {
                    return Err(format!(
                        "partition {p} owned by members {other} and {i} in generation {g}"
                    ));
                }
            }
        }
        // 2. A timer is always armed unless the member is closed or waiting for the app.
        for (i, s) in self.members.iter().enumerate() {
            if s.alive
                && s.m.poll_timeout().is_none()
                && !matches!(s.m.state(), StateKind::Closed | StateKind::Suspended)
            {
                return Err(format!(
                    "member {i} in {:?} has no timer armed",
                    s.m.state()
                ));
            }
        }
        // 3. Once stable, every partition has an owner.
        if self.converged() {
            self.report.stable_checks += 1;
        }
        Ok(())
    }

    /// The group is stable with every live member stable in the coordinator's
    /// generation, so every subscribed partition must be owned.
    fn converged(&self) -> bool {
        if self.coord.state != GState::Stable {
            return false;
        }
        let live: Vec<&SimMember> = self
            .members
            .iter()
            .filter(|s| s.alive && s.m.state() != StateKind::Closed)
            .collect();
        if live.is_empty() || live.len() != self.coord.members.len() {
            return false;
        }
        if !live.iter().all(|s| {
            s.m.state() == StateKind::Stable && s.m.generation() == Some(self.coord.generation)
        }) {
            return false;
        }
        let owned: usize = live.iter().map(|s| s.m.assignment().len()).sum();
        let total: i32 = self.topics.values().sum();
        owned == total as usize
    }

    /// Whether the last convergence left every partition owned exactly once.
    pub fn fully_assigned(&self) -> bool {
        self.converged()
    }
}

fn not_coordinator(request: &GroupRequest) -> GroupResponse {
    with_error(request, codes::NOT_COORDINATOR)
}

fn join_error(code: i16) -> GroupResponse {
    GroupResponse::JoinGroup {
        error: code,
        generation: -1,
        protocol_name: None,
        leader: String::new(),
        member_id: String::new(),
        members: vec![],
        skip_assignment: false,
    }
}

fn sync_error(code: i16) -> GroupResponse {
    GroupResponse::SyncGroup {
        error: code,
        protocol_name: None,
        assignment: Bytes::new(),
    }
}

/// The response to `request` carrying `code` and nothing else.
pub fn with_error(request: &GroupRequest, code: i16) -> GroupResponse {
    match request {
        GroupRequest::FindCoordinator { .. } => GroupResponse::FindCoordinator {
            error: code,
            node_id: -1,
            host: String::new(),
            port: -1,
        },
        GroupRequest::JoinGroup { .. } => join_error(code),
        GroupRequest::SyncGroup { .. } => sync_error(code),
        GroupRequest::Heartbeat { .. } => GroupResponse::Heartbeat { error: code },
        GroupRequest::LeaveGroup { .. } => GroupResponse::LeaveGroup { error: code },
        GroupRequest::OffsetCommit { offsets, .. } => GroupResponse::OffsetCommit {
            partitions: offsets
                .iter()
                .map(|o| (o.partition.clone(), code))
                .collect(),
        },
        GroupRequest::OffsetFetch { .. } => GroupResponse::OffsetFetch {
            error: code,
            partitions: vec![],
            metadata: vec![],
        },
        GroupRequest::ConsumerGroupHeartbeat { .. } => GroupResponse::ConsumerGroupHeartbeat {
            error: code,
            error_message: None,
            member_id: None,
            member_epoch: -1,
            heartbeat_interval_ms: 0,
            assignment: None,
        },
    }
}

/// A random schedule of `len` actions from `rng`.
pub fn random_schedule(rng: &mut Rng, len: usize) -> Vec<Action> {
    const APIS: [&str; 5] = [
        "JoinGroup",
        "SyncGroup",
        "Heartbeat",
        "OffsetCommit",
        "FindCoordinator",
    ];
    const CODES: [i16; 9] = [
        codes::REBALANCE_IN_PROGRESS,
        codes::UNKNOWN_MEMBER_ID,
        codes::ILLEGAL_GENERATION,
        codes::NOT_COORDINATOR,
        codes::COORDINATOR_NOT_AVAILABLE,
        codes::COORDINATOR_LOAD_IN_PROGRESS,
        codes::INVALID_REQUEST,
        codes::REQUEST_TIMED_OUT,
        codes::REBALANCE_IN_PROGRESS,
    ];
    (0..len)
        .map(|_| match rng.below(14) {
            0..=4 => Action::Wait(Duration::from_millis(rng.below(3000))),
            5 => Action::MoveCoordinator,
            6 | 7 => Action::InjectError(APIS[rng.below(5) as usize], CODES[rng.below(9) as usize]),
            8 => Action::Drop,
            9 => Action::Disconnect,
            10 if rng.chance(20) => Action::CrashMember(rng.below(8) as usize),
            10 => Action::AddMember,
            11 => Action::RemoveMember(rng.below(8) as usize),
            12 if rng.chance(30) => Action::RestartMember(rng.below(8) as usize),
            12 => Action::AckRevocation(rng.below(8) as usize),
            _ => Action::SetDelay(Duration::from_millis(rng.below(200))),
        })
        .collect()
}
