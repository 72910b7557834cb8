//! The fault schedule: a pure function of the seed and the configuration.
//!
//! Every fault kind arrives as a Poisson process with its own rate and its own random
//! stream (changing one rate does not move the others). The arrivals are then walked
//! in time order against a model of the run (which member slots are alive, which
//! brokers are down, which have a delay spike), so every action is valid when it is
//! planned, and the follow-ups (broker back up, delay back to normal, member
//! restarted) are planned with it. The runner only executes the plan: the same seed
//! always gives the same faults at the same times, whatever ottla does meanwhile.
//!
//! The plan also chooses the group's first coordinator ([`initial_coordinator`]), which
//! the runner pins before the members start: the model always knows which broker is
//! the coordinator, so a silent fault silences exactly that one.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::time::Duration;

use ottla::consumer::GroupProtocol;

/// A fault kind, with a rate per minute in [`super::Config::rates`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// The group coordinator moves to another broker (mock only).
    Move,
    /// A broker goes down for 1 to 6 s (mock only; never more than one at a time).
    Down,
    /// A broker's responses are delayed by 100 to 1500 ms for 1 to 5 s (mock only).
    Rtt,
    /// 1 to 3 retriable error codes pushed on one API (mock only).
    Error,
    /// A member's task is aborted without close (its consumer is dropped, which sends
    /// LeaveGroup), then restarted after 0.5 to 5 s.
    Kill,
    /// A member's runtime is dropped: no close, no LeaveGroup, sockets closed, as when
    /// a process dies; the coordinator notices after the session timeout. Restarted
    /// after 0.5 to 5 s.
    Crash,
    /// A new member joins.
    Join,
    /// A member leaves cleanly (stops, commits, sends LeaveGroup).
    Leave,
    /// The coordinator's broker stops answering for 3 to 12 s (every response held back
    /// until the silence ends; the connections stay open), and at the same moment the
    /// coordinator moves to another live broker: a host that died silently and a
    /// cluster that elected a new coordinator (mock only). Declared last so the kinds
    /// before it keep their random streams.
    Silent,
}

impl FaultKind {
    /// Every kind, in the order of the report.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Move,
        FaultKind::Silent,
        FaultKind::Down,
        FaultKind::Rtt,
        FaultKind::Error,
        FaultKind::Kill,
        FaultKind::Crash,
        FaultKind::Join,
        FaultKind::Leave,
    ];

    /// The name used on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Move => "move",
            FaultKind::Down => "down",
            FaultKind::Rtt => "rtt",
            FaultKind::Error => "error",
            FaultKind::Kill => "kill",
            FaultKind::Crash => "crash",
            FaultKind::Join => "join",
            FaultKind::Leave => "leave",
            FaultKind::Silent => "silent",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kind needs the mock cluster's fault injection.
    pub fn needs_mock(self) -> bool {
        matches!(
            self,
            FaultKind::Move
                | FaultKind::Silent
                | FaultKind::Down
                | FaultKind::Rtt
                | FaultKind::Error
        )
    }

    /// The default rate per minute.
    pub fn default_rate(self) -> f64 {
        match self {
            FaultKind::Move => 12.0,
            FaultKind::Down => 2.0,
            FaultKind::Rtt => 4.0,
            FaultKind::Error => 8.0,
            FaultKind::Kill => 2.0,
            FaultKind::Crash => 1.0,
            FaultKind::Join => 1.0,
            FaultKind::Leave => 1.0,
            FaultKind::Silent => 2.0,
        }
    }
}

/// An API that errors are injected on, with the retriable codes used for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedApi {
    /// The API's name.
    pub name: &'static str,
    /// Its key.
    pub key: i16,
    /// The codes drawn from.
    pub codes: &'static [i16],
}

/// NOT_LEADER_OR_FOLLOWER.
const NOT_LEADER: i16 = 6;
/// REQUEST_TIMED_OUT.
const TIMED_OUT: i16 = 7;
/// COORDINATOR_LOAD_IN_PROGRESS.
const LOADING: i16 = 14;
/// COORDINATOR_NOT_AVAILABLE.
const NOT_AVAILABLE: i16 = 15;
/// NOT_COORDINATOR.
const NOT_COORDINATOR: i16 = 16;
/// REBALANCE_IN_PROGRESS.
const REBALANCING: i16 = 27;
/// UNKNOWN_MEMBER_ID.
const UNKNOWN_MEMBER: i16 = 25;
/// FENCED_MEMBER_EPOCH.
const FENCED_EPOCH: i16 = 110;
/// STALE_MEMBER_EPOCH.
const STALE_EPOCH: i16 = 113;

/// Fetch and Produce errors, injected under either group protocol.
const FETCH_ERRORS: InjectedApi = InjectedApi {
    name: "Fetch",
    key: 1,
    codes: &[NOT_LEADER, TIMED_OUT],
};
const PRODUCE_ERRORS: InjectedApi = InjectedApi {
    name: "Produce",
    key: 0,
    codes: &[NOT_LEADER, TIMED_OUT],
};

/// The APIs errors are injected on under the classic protocol.
pub const INJECTED_APIS: [InjectedApi; 6] = [
    InjectedApi {
        name: "Heartbeat",
        key: 12,
        codes: &[NOT_COORDINATOR, LOADING, REBALANCING],
    },
    InjectedApi {
        name: "JoinGroup",
        key: 11,
        codes: &[NOT_COORDINATOR, LOADING, NOT_AVAILABLE],
    },
    InjectedApi {
        name: "SyncGroup",
        key: 14,
        codes: &[NOT_COORDINATOR, LOADING, REBALANCING],
    },
    InjectedApi {
        name: "OffsetCommit",
        key: 8,
        codes: &[NOT_COORDINATOR, LOADING, REBALANCING, TIMED_OUT],
    },
    FETCH_ERRORS,
    PRODUCE_ERRORS,
];

/// The APIs errors are injected on under the consumer protocol (KIP-848): its one
/// group request, ConsumerGroupHeartbeat, in place of JoinGroup, SyncGroup and
/// Heartbeat. Besides the coordinator codes it gets the two fencing codes: the mock
/// then also removes the member (`rdkafka_mock_handlers.c`, injected
/// UNKNOWN_MEMBER_ID/FENCED_MEMBER_EPOCH), which hands its partitions to the others
/// while it still holds them, as a broker does when it fences a member. OffsetCommit
/// gets STALE_MEMBER_EPOCH where the classic list has REBALANCE_IN_PROGRESS, which a
/// KIP-848 broker does not answer a commit with.
pub const INJECTED_APIS_CONSUMER: [InjectedApi; 4] = [
    InjectedApi {
        name: "ConsumerGroupHeartbeat",
        key: 68,
        codes: &[
            NOT_COORDINATOR,
            LOADING,
            NOT_AVAILABLE,
            UNKNOWN_MEMBER,
            FENCED_EPOCH,
        ],
    },
    InjectedApi {
        name: "OffsetCommit",
        key: 8,
        codes: &[NOT_COORDINATOR, LOADING, TIMED_OUT, STALE_EPOCH],
    },
    FETCH_ERRORS,
    PRODUCE_ERRORS,
];

/// The APIs errors are injected on for members speaking `protocol`.
pub fn injected_apis(protocol: GroupProtocol) -> &'static [InjectedApi] {
    match protocol {
        GroupProtocol::Classic => &INJECTED_APIS,
        // The consumer protocol, and any later one heartbeating the same way.
        _ => &INJECTED_APIS_CONSUMER,
    }
}

/// One planned step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Make `to` the group coordinator.
    MoveCoordinator {
        /// The broker.
        to: i32,
    },
    /// Take a broker down.
    BrokerDown {
        /// The broker.
        broker: i32,
    },
    /// Bring it back.
    BrokerUp {
        /// The broker.
        broker: i32,
    },
    /// Delay every response of a broker.
    RttSpike {
        /// The broker.
        broker: i32,
        /// The delay.
        rtt_ms: u64,
    },
    /// Back to no delay.
    RttNormal {
        /// The broker.
        broker: i32,
    },
    /// `broker`, the coordinator, stops answering for `ms` milliseconds, and the
    /// coordinator moves to `to`. The runner sets the broker's delay to the silence's
    /// length, so nothing answered during it comes out before it ends, and back to 0
    /// at [`Action::Speak`], which releases what was held. (Not a longer delay: the
    /// mock arms one write timer per connection for the first held response and does
    /// not move it forward when the delay drops, so after a 10-minute delay a response
    /// the mock holds on purpose, such as an empty Fetch waiting `fetch.max.wait.ms`,
    /// stays stuck, with everything behind it on that connection, until the client's
    /// request timeout.)
    Silence {
        /// The broker that goes silent.
        broker: i32,
        /// The new coordinator.
        to: i32,
        /// How long the silence lasts.
        ms: u64,
    },
    /// The silent broker answers again: the held responses go out.
    Speak {
        /// The broker.
        broker: i32,
    },
    /// Push error codes on an API (cluster-wide: the next requests of that API get
    /// them, whoever sends them).
    InjectErrors {
        /// The API.
        api: InjectedApi,
        /// The codes, in order.
        codes: Vec<i16>,
    },
    /// Stop a member without closing it.
    Kill {
        /// The member slot.
        slot: usize,
        /// `true`: drop its runtime (no LeaveGroup); `false`: abort its task.
        crash: bool,
    },
    /// Start a new incarnation of a killed slot.
    Restart {
        /// The member slot.
        slot: usize,
    },
    /// Start a new member in a new slot.
    Join {
        /// The new slot.
        slot: usize,
    },
    /// Close a member cleanly.
    Leave {
        /// The member slot.
        slot: usize,
    },
}

impl Action {
    /// The fault kind this action counts as; `None` for follow-ups.
    pub fn kind(&self) -> Option<FaultKind> {
        match self {
            Action::MoveCoordinator { .. } => Some(FaultKind::Move),
            Action::BrokerDown { .. } => Some(FaultKind::Down),
            Action::RttSpike { .. } => Some(FaultKind::Rtt),
            Action::Silence { .. } => Some(FaultKind::Silent),
            Action::InjectErrors { .. } => Some(FaultKind::Error),
            Action::Kill { crash: false, .. } => Some(FaultKind::Kill),
            Action::Kill { crash: true, .. } => Some(FaultKind::Crash),
            Action::Join { .. } => Some(FaultKind::Join),
            Action::Leave { .. } => Some(FaultKind::Leave),
            Action::BrokerUp { .. }
            | Action::RttNormal { .. }
            | Action::Speak { .. }
            | Action::Restart { .. } => None,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::MoveCoordinator { to } => write!(f, "coordinator -> broker {to}"),
            Action::BrokerDown { broker } => write!(f, "broker {broker} down"),
            Action::BrokerUp { broker } => write!(f, "broker {broker} up"),
            Action::RttSpike { broker, rtt_ms } => write!(f, "broker {broker} rtt {rtt_ms} ms"),
            Action::RttNormal { broker } => write!(f, "broker {broker} rtt 0"),
            Action::Silence { broker, to, ms } => write!(
                f,
                "broker {broker} silent for {ms} ms, coordinator -> broker {to}"
            ),
            Action::Speak { broker } => write!(f, "broker {broker} answers again"),
            Action::InjectErrors { api, codes } => write!(f, "{} errors {codes:?}", api.name),
            Action::Kill { slot, crash: false } => write!(f, "member slot {slot} aborted"),
            Action::Kill { slot, crash: true } => write!(f, "member slot {slot} crashed"),
            Action::Restart { slot } => write!(f, "member slot {slot} restarted"),
            Action::Join { slot } => write!(f, "member slot {slot} joins"),
            Action::Leave { slot } => write!(f, "member slot {slot} leaves"),
        }
    }
}

/// What the plan is made for.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// The run's seed.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// Rates per minute; kinds not listed do not happen.
    pub rates: BTreeMap<FaultKind, f64>,
    /// Broker ids (empty: no broker faults).
    pub brokers: Vec<i32>,
    /// Members at the start (slots `0..members`).
    pub members: usize,
    /// The most members alive at once (joins beyond it are skipped).
    pub max_members: usize,
    /// The members' group protocol, which decides the APIs errors are injected on.
    pub group_protocol: GroupProtocol,
}

/// The broker the runner makes the group's coordinator before the members start
/// (`None` without brokers): drawn from the seed.
pub fn initial_coordinator(input: &PlanInput) -> Option<i32> {
    let mut rng = Rng::new(mix(input.seed, 98));
    rng.pick(&input.brokers).copied()
}

/// The planned actions, in time order, at offsets from the start of the run.
pub fn plan(input: &PlanInput) -> Vec<(Duration, Action)> {
    let horizon = input.duration.as_secs_f64();
    let mut arrivals: Vec<(f64, FaultKind)> = Vec::new();
    for (i, (&kind, &per_minute)) in input.rates.iter().enumerate() {
        if per_minute <= 0.0 {
            continue;
        }
        let mut rng = Rng::new(mix(input.seed, 100 + i as u64));
        let mut t = 0.0;
        loop {
            t += rng.exponential(per_minute / 60.0);
            if t >= horizon {
                break;
            }
            arrivals.push((t, kind));
        }
    }
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));

    let mut model = Model::new(input);
    let mut choose = Rng::new(mix(input.seed, 99));
    let mut out = Vec::new();
    for (t, kind) in arrivals {
        model.follow_ups_until(t, &mut out);
        model.arrive(t, kind, &mut choose, &mut out);
    }
    model.follow_ups_until(horizon, &mut out);
    out.into_iter()
        .map(|(t, a)| (Duration::from_secs_f64(t), a))
        .collect()
}

/// The plan's model of the run.
struct Model {
    brokers: Vec<i32>,
    down: BTreeSet<i32>,
    /// Brokers with a delay: a spike, or a silence.
    slow: BTreeSet<i32>,
    /// Brokers that are silent (also in `slow`).
    silent: BTreeSet<i32>,
    coordinator: Option<i32>,
    slots: Vec<Slot>,
    max_members: usize,
    apis: &'static [InjectedApi],
    /// Follow-ups by time (milliseconds, then insertion order).
    pending: BinaryHeap<Reverse<(u64, u64, FollowUp)>>,
    sequence: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Alive,
    Dead,
    Gone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FollowUp {
    Up(i32),
    Normal(i32),
    Speak(i32),
    Restart(usize),
}

impl Model {
    fn new(input: &PlanInput) -> Self {
        Self {
            brokers: input.brokers.clone(),
            down: BTreeSet::new(),
            slow: BTreeSet::new(),
            silent: BTreeSet::new(),
            coordinator: initial_coordinator(input),
            slots: vec![Slot::Alive; input.members],
            max_members: input.max_members.max(input.members),
            apis: injected_apis(input.group_protocol),
            pending: BinaryHeap::new(),
            sequence: 0,
        }
    }

    fn later(&mut self, t: f64, follow: FollowUp) {
        self.sequence += 1;
        self.pending
            .push(Reverse(((t * 1000.0) as u64, self.sequence, follow)));
    }

    fn follow_ups_until(&mut self, t: f64, out: &mut Vec<(f64, Action)>) {
        while let Some(Reverse((at, _, _))) = self.pending.peek() {
            let at = *at as f64 / 1000.0;
            if at > t {
                break;
            }
            let Some(Reverse((_, _, follow))) = self.pending.pop() else {
                break;
            };
            match follow {
                FollowUp::Up(b) => {
                    self.down.remove(&b);
                    out.push((at, Action::BrokerUp { broker: b }));
                }
                FollowUp::Normal(b) => {
                    self.slow.remove(&b);
                    out.push((at, Action::RttNormal { broker: b }));
                }
                FollowUp::Speak(b) => {
                    self.slow.remove(&b);
                    self.silent.remove(&b);
                    out.push((at, Action::Speak { broker: b }));
                }
                FollowUp::Restart(slot) => {
                    self.slots[slot] = Slot::Alive;
                    out.push((at, Action::Restart { slot }));
                }
            }
        }
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&s| self.slots[s] == Slot::Alive)
            .collect()
    }

    fn arrive(&mut self, t: f64, kind: FaultKind, rng: &mut Rng, out: &mut Vec<(f64, Action)>) {
        match kind {
            FaultKind::Move => {
                // Never onto a silent broker: a cluster does not elect a dead host.
                let others: Vec<i32> = self
                    .brokers
                    .iter()
                    .copied()
                    .filter(|b| Some(*b) != self.coordinator && !self.silent.contains(b))
                    .collect();
                if let Some(&to) = rng.pick(&others) {
                    self.coordinator = Some(to);
                    out.push((t, Action::MoveCoordinator { to }));
                }
            }
            FaultKind::Silent => {
                // The coordinator, when it is up and answering at its normal pace (a
                // pending RttNormal would end the silence early); the new coordinator
                // is up and not silent.
                let Some(broker) = self.coordinator else {
                    return;
                };
                if self.slow.contains(&broker) || self.down.contains(&broker) {
                    return;
                }
                let others: Vec<i32> = self
                    .brokers
                    .iter()
                    .copied()
                    .filter(|b| *b != broker && !self.silent.contains(b) && !self.down.contains(b))
                    .collect();
                if let Some(&to) = rng.pick(&others) {
                    self.slow.insert(broker);
                    self.silent.insert(broker);
                    self.coordinator = Some(to);
                    let length = rng.uniform(3.0, 12.0);
                    let ms = (length * 1000.0).ceil() as u64;
                    out.push((t, Action::Silence { broker, to, ms }));
                    self.later(t + length, FollowUp::Speak(broker));
                }
            }
            FaultKind::Down => {
                // One broker down at a time, and never the only one.
                if !self.down.is_empty() || self.brokers.len() < 2 {
                    return;
                }
                if let Some(&broker) = rng.pick(&self.brokers) {
                    self.down.insert(broker);
                    out.push((t, Action::BrokerDown { broker }));
                    self.later(t + rng.uniform(1.0, 6.0), FollowUp::Up(broker));
                }
            }
            FaultKind::Rtt => {
                let calm: Vec<i32> = self
                    .brokers
                    .iter()
                    .copied()
                    .filter(|b| !self.slow.contains(b))
                    .collect();
                if let Some(&broker) = rng.pick(&calm) {
                    self.slow.insert(broker);
                    let rtt_ms = rng.uniform(100.0, 1500.0) as u64;
                    out.push((t, Action::RttSpike { broker, rtt_ms }));
                    self.later(t + rng.uniform(1.0, 5.0), FollowUp::Normal(broker));
                }
            }
            FaultKind::Error => {
                if self.brokers.is_empty() {
                    return;
                }
                let api = self.apis[rng.below(self.apis.len() as u64) as usize];
                let n = 1 + rng.below(3) as usize;
                let codes = (0..n)
                    .map(|_| api.codes[rng.below(api.codes.len() as u64) as usize])
                    .collect();
                out.push((t, Action::InjectErrors { api, codes }));
            }
            FaultKind::Kill | FaultKind::Crash => {
                // Keep one member alive, so the run keeps making progress.
                let alive = self.alive();
                if alive.len() < 2 {
                    return;
                }
                if let Some(&slot) = rng.pick(&alive) {
                    self.slots[slot] = Slot::Dead;
                    out.push((
                        t,
                        Action::Kill {
                            slot,
                            crash: kind == FaultKind::Crash,
                        },
                    ));
                    self.later(t + rng.uniform(0.5, 5.0), FollowUp::Restart(slot));
                }
            }
            FaultKind::Join => {
                let members = self.slots.iter().filter(|s| **s != Slot::Gone).count();
                if members >= self.max_members {
                    return;
                }
                let slot = self.slots.len();
                self.slots.push(Slot::Alive);
                out.push((t, Action::Join { slot }));
            }
            FaultKind::Leave => {
                let alive = self.alive();
                if alive.len() < 2 {
                    return;
                }
                if let Some(&slot) = rng.pick(&alive) {
                    self.slots[slot] = Slot::Gone;
                    out.push((t, Action::Leave { slot }));
                }
            }
        }
    }
}

pub use super::rng::{Rng, mix, unit};

#[cfg(test)]
mod tests {
    use super::*;

    fn input(seed: u64) -> PlanInput {
        PlanInput {
            seed,
            duration: Duration::from_secs(120),
            rates: FaultKind::ALL
                .into_iter()
                .map(|k| (k, k.default_rate() * 3.0))
                .collect(),
            brokers: vec![1, 2, 3],
            members: 3,
            max_members: 5,
            group_protocol: GroupProtocol::Classic,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_plan() {
        assert_eq!(plan(&input(7)), plan(&input(7)));
        assert_ne!(plan(&input(7)), plan(&input(8)));
    }

    #[test]
    fn consumer_protocol_plans_inject_errors_on_its_own_group_request_only() {
        let mut seen = BTreeSet::new();
        for seed in 0..20 {
            let classic = plan(&input(seed));
            let consumer = plan(&PlanInput {
                group_protocol: GroupProtocol::Consumer,
                ..input(seed)
            });
            // Only the APIs differ: the same faults at the same times.
            assert_eq!(classic.len(), consumer.len(), "seed {seed}");
            for (_, a) in consumer {
                if let Action::InjectErrors { api, codes } = a {
                    assert!(
                        INJECTED_APIS_CONSUMER.contains(&api),
                        "seed {seed}: {}",
                        api.name
                    );
                    assert!(codes.iter().all(|c| api.codes.contains(c)));
                    seen.insert(api.name);
                }
            }
        }
        assert!(seen.contains("ConsumerGroupHeartbeat"), "{seen:?}");
        assert!(!seen.contains("JoinGroup") && !seen.contains("Heartbeat"));
    }

    #[test]
    fn plans_keep_a_member_alive_and_a_broker_up() {
        for seed in 0..50 {
            let steps = plan(&input(seed));
            let mut alive: BTreeSet<usize> = (0..3).collect();
            let mut down = BTreeSet::new();
            for (_, a) in &steps {
                match a {
                    Action::Kill { slot, .. } | Action::Leave { slot } => {
                        assert!(alive.remove(slot), "seed {seed}: {a} of a dead slot");
                    }
                    Action::Restart { slot } | Action::Join { slot } => {
                        assert!(alive.insert(*slot), "seed {seed}: {a} of a live slot");
                    }
                    Action::BrokerDown { broker } => {
                        assert!(down.insert(*broker));
                        assert!(down.len() < 3);
                    }
                    Action::BrokerUp { broker } => {
                        assert!(down.remove(broker));
                    }
                    _ => {}
                }
                assert!(!alive.is_empty(), "seed {seed}: no member left after {a}");
                assert!(alive.len() <= 5, "seed {seed}");
            }
        }
    }

    #[test]
    fn a_silent_broker_is_the_coordinator_it_replaces_and_speaks_again_within_12_s() {
        let mut silences = 0;
        for seed in 0..50 {
            let i = input(seed);
            let mut coordinator = initial_coordinator(&i).expect("a coordinator");
            let mut silent: BTreeMap<i32, (Duration, u64)> = BTreeMap::new();
            let mut slow = BTreeSet::new();
            for (at, a) in plan(&i) {
                match a {
                    Action::MoveCoordinator { to } => {
                        assert!(
                            !silent.contains_key(&to),
                            "seed {seed}: {a} onto a silent broker"
                        );
                        coordinator = to;
                    }
                    Action::Silence { broker, to, ms } => {
                        assert_eq!(
                            broker, coordinator,
                            "seed {seed}: {a} is not the coordinator"
                        );
                        assert_ne!(to, broker);
                        assert!(
                            !silent.contains_key(&to),
                            "seed {seed}: {a} onto a silent broker"
                        );
                        assert!(
                            !slow.contains(&broker),
                            "seed {seed}: {a} while its delay ends"
                        );
                        silent.insert(broker, (at, ms));
                        coordinator = to;
                        silences += 1;
                    }
                    Action::Speak { broker } => {
                        let (since, ms) = silent.remove(&broker).expect("silent");
                        let length = (at - since).as_secs_f64();
                        assert!(
                            (2.99..12.01).contains(&length),
                            "seed {seed}: silent {length} s"
                        );
                        // The broker's delay is the silence's length.
                        assert!(
                            (length * 1000.0 - ms as f64).abs() <= 2.0,
                            "seed {seed}: silent {length} s with a delay of {ms} ms"
                        );
                    }
                    Action::RttSpike { broker, .. } => {
                        assert!(
                            !silent.contains_key(&broker),
                            "seed {seed}: {a} while silent"
                        );
                        slow.insert(broker);
                    }
                    Action::RttNormal { broker } => {
                        assert!(
                            !silent.contains_key(&broker),
                            "seed {seed}: {a} while silent"
                        );
                        slow.remove(&broker);
                    }
                    _ => {}
                }
            }
        }
        assert!(silences > 50, "only {silences} silences in 50 plans");
    }
}
