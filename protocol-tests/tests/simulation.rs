//! Deterministic simulation of the group protocol (see `protocol_tests::sim`): generated
//! fault schedules with the invariants checked after every step, and replay.
//!
//! `OTTLA_SIM_SCHEDULES` sets how many schedules run (CI: 10,000).

use protocol_tests::sim::{Rng, Sim, SimConfig, random_schedule};

fn schedules() -> u64 {
    protocol_tests::env_number("OTTLA_SIM_SCHEDULES", 10_000)
}

const ASSIGNORS: [&str; 4] = ["range", "roundrobin", "sticky", "cooperative-sticky"];

fn config(rng: &mut Rng) -> SimConfig {
    SimConfig {
        assignor: ASSIGNORS[rng.below(4) as usize],
        members: 1 + rng.below(4) as usize,
        partitions: 1 + rng.below(12) as i32,
        static_members: rng.chance(25),
    }
}

#[test]
fn generated_fault_schedules_keep_every_invariant() {
    let total = schedules();
    let mut generations = 0i64;
    let mut commits = 0u64;
    for seed in 0..total {
        let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9));
        let cfg = config(&mut rng);
        let len = 5 + rng.below(25) as usize;
        let schedule = random_schedule(&mut rng, len);
        match Sim::new(seed, &cfg).run(&schedule) {
            Ok(report) => {
                generations += i64::from(report.generations);
                commits += u64::from(report.commits_accepted);
            }
            Err(violation) => panic!(
                "seed {seed} ({cfg:?}) violated an invariant: {violation}\nschedule: {schedule:?}\n\
                 replay with OTTLA_SIM_SEED={seed}"
            ),
        }
    }
    println!("{total} schedules, {generations} generations formed, {commits} commits accepted");
    assert!(
        generations >= total as i64,
        "every schedule forms at least one generation"
    );
    assert!(commits > 0, "the simulated applications committed");
}

#[test]
fn the_same_seed_replays_to_identical_requests() {
    for seed in [1u64, 7, 42, 1234] {
        let mut rng = Rng::new(seed);
        let cfg = config(&mut rng);
        let schedule = random_schedule(&mut rng, 20);
        let a = Sim::new(seed, &cfg).run(&schedule).expect("run a");
        let b = Sim::new(seed, &cfg).run(&schedule).expect("run b");
        assert!(!a.trace.is_empty());
        assert_eq!(a.trace, b.trace, "seed {seed} did not replay identically");
    }
}

/// Replays one seed from `OTTLA_SIM_SEED`, printing its trace.
#[test]
fn replay_one_seed_from_the_environment() {
    let Some(seed) = std::env::var("OTTLA_SIM_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9));
    let cfg = config(&mut rng);
    let len = 5 + rng.below(25) as usize;
    let schedule = random_schedule(&mut rng, len);
    let result = Sim::new(seed, &cfg).run(&schedule);
    eprintln!("config {cfg:?}");
    if let Ok(r) = &result {
        println!("{}", r.trace);
    }
    result.expect("replayed seed");
}

/// KIP-345 against the simulated coordinator (the librdkafka mock and tansu both
/// rebalance on a static rejoin, so no real peer here can show it): a static member
/// restarted within the session timeout gets its partitions back, and nobody else sees
/// a rebalance.
#[test]
fn a_static_member_restarted_within_the_session_timeout_causes_no_rebalance() {
    use protocol_tests::sim::Action;
    use std::time::Duration;
    let cfg = SimConfig {
        assignor: "range",
        members: 3,
        partitions: 6,
        static_members: true,
    };
    let quiet = Sim::new(3, &cfg)
        .run(&[Action::Wait(Duration::from_secs(5))])
        .expect("quiet run");
    let restarted = Sim::new(3, &cfg)
        .run(&[
            Action::Wait(Duration::from_secs(5)),
            Action::RestartMember(2),
            Action::Wait(Duration::from_secs(5)),
        ])
        .expect("restart run");
    assert_eq!(
        restarted.generations, quiet.generations,
        "the restart formed a new generation"
    );
    assert_eq!(
        restarted.revocations, quiet.revocations,
        "someone saw a revocation"
    );
    // The same restart of a dynamic member does rebalance.
    let dynamic = SimConfig {
        static_members: false,
        ..cfg
    };
    let quiet = Sim::new(3, &dynamic)
        .run(&[Action::Wait(Duration::from_secs(5))])
        .expect("quiet");
    let restarted = Sim::new(3, &dynamic)
        .run(&[
            Action::Wait(Duration::from_secs(5)),
            Action::RestartMember(2),
            Action::Wait(Duration::from_secs(5)),
        ])
        .expect("restart");
    assert!(
        restarted.revocations > quiet.revocations,
        "a dynamic restart must rebalance: {quiet:?} vs {restarted:?}"
    );
}
