//! Deterministic simulation of the group protocol (see `ottla_core_tests::sim`): generated
//! fault schedules with the invariants checked after every step, and replay.
//!
//! `OTTLA_SIM_SCHEDULES` sets how many schedules run (CI: 10,000).

use std::time::Duration;

use ottla_core_tests::sim::{Rng, Sim, SimConfig, random_schedule};

fn schedules() -> u64 {
    ottla_core_tests::env_number("OTTLA_SIM_SCHEDULES", 10_000)
}

const ASSIGNORS: [&str; 4] = ["range", "roundrobin", "sticky", "cooperative-sticky"];

fn config(rng: &mut Rng) -> SimConfig {
    SimConfig {
        assignor: ASSIGNORS[rng.below(4) as usize],
        members: 1 + rng.below(4) as usize,
        partitions: 1 + rng.below(12) as i32,
        static_members: rng.chance(25),
        // One run in four, a leader whose assignor takes up to two sessions and a half
        // (the session is 6 s, the rebalance timeout 20 s).
        assign_time: if rng.chance(25) {
            Duration::from_millis(rng.below(15_000))
        } else {
            Duration::ZERO
        },
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
    use ottla_core_tests::sim::Action;
    let cfg = SimConfig {
        assignor: "range",
        members: 3,
        partitions: 6,
        static_members: true,
        assign_time: Duration::ZERO,
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

/// Issue 36: a leader whose assignor runs for two sessions heartbeats meanwhile, so the
/// group forms in the same generations as with an instant assignor; nobody's session
/// lapses and nobody sees an extra revocation.
#[test]
fn a_leader_assigning_for_two_sessions_still_forms_the_group() {
    use ottla_core_tests::sim::Action;
    for assignor in ASSIGNORS {
        let quick = SimConfig {
            assignor,
            members: 3,
            partitions: 6,
            static_members: false,
            assign_time: Duration::ZERO,
        };
        // The session is 6 s, the rebalance timeout 20 s.
        let slow = SimConfig {
            assign_time: Duration::from_secs(13),
            ..quick.clone()
        };
        let schedule = [Action::Wait(Duration::from_secs(40))];
        let quick = Sim::new(5, &quick).run(&schedule).expect("quick run");
        let slow = Sim::new(5, &slow)
            .run(&schedule)
            .unwrap_or_else(|e| panic!("{assignor}: {e}"));
        assert_eq!(
            slow.generations, quick.generations,
            "{assignor}: the slow assignment formed other generations"
        );
        assert_eq!(
            slow.revocations, quick.revocations,
            "{assignor}: someone saw a revocation"
        );
        assert!(slow.stable_checks > 0, "{assignor}: never stable");
    }
}
