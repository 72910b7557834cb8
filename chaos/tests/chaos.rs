//! The chaos runner's core, briefly, on the mock cluster with a fixed seed: every fault
//! kind is injected, nothing is lost, and every invariant holds, once with the classic
//! group protocol and once with the consumer protocol (KIP-848). The `chaos` binary
//! runs the same core for longer (`--duration 10m`, `--group-protocol consumer`);
//! `OTTLA_CHAOS_SEED` replays another seed here, and `OTTLA_CHAOS_CONTENTION` and
//! `OTTLA_CHAOS_STALL` add the runner's load (`--contention`, `--stall`). A failing run
//! prints its replay command first and again right before its summary, and every
//! assertion message carries it.

use std::collections::BTreeSet;
use std::time::Duration;

use ottla::consumer::GroupProtocol;
use ottla_chaos::schedule::{self, Action, FaultKind};
use ottla_chaos::{Config, Report, parse_duration, run};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// The kit's generator is ottla-core-tests' (the published kit cannot depend on it): a
/// seed names the same draws in the chaos runs and in the broker-free harnesses.
#[test]
fn the_kits_generator_is_the_core_tests_generator() {
    use ottla_core_tests::rng as core;
    use ottla_testkit::chaos::rng as kit;
    for seed in [0, 1, 11, 20261124, u64::MAX] {
        let (mut a, mut b) = (core::Rng::new(seed), kit::Rng::new(seed));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_eq!(core::mix(seed, 7), kit::mix(seed, 7));
        assert_eq!(core::unit(seed), kit::unit(seed));
    }
}

/// Every fault kind at a rate that makes it happen within a short run.
fn short_config(group_protocol: GroupProtocol, seed: u64) -> Config {
    let mut config = Config {
        duration: Duration::from_secs(25),
        seed: env_number("OTTLA_CHAOS_SEED", seed),
        group_protocol,
        progress: None,
        contention: env_number("OTTLA_CHAOS_CONTENTION", 0) as usize,
        stall: std::env::var("OTTLA_CHAOS_STALL")
            .ok()
            .map(|v| parse_duration(&v).expect("OTTLA_CHAOS_STALL: a duration"))
            .filter(|d| !d.is_zero()),
        ..Config::default()
    };
    for (kind, rate) in [
        (FaultKind::Move, 12.0),
        (FaultKind::Down, 6.0),
        (FaultKind::Rtt, 6.0),
        (FaultKind::Error, 12.0),
        (FaultKind::Kill, 6.0),
        (FaultKind::Crash, 4.0),
        (FaultKind::Join, 4.0),
        (FaultKind::Leave, 4.0),
        (FaultKind::Silent, 6.0),
    ] {
        config.rates.insert(kind, rate);
    }
    config
}

/// Runs `config` after checking that its plan has every fault kind; asserts nothing
/// was lost and every invariant held.
async fn run_briefly(config: Config) -> Report {
    let brokers: Vec<i32> = (1..=config.brokers).collect();
    let plan = schedule::plan(&config.plan_input(brokers));
    let planned: BTreeSet<FaultKind> = plan.iter().filter_map(|(_, a)| a.kind()).collect();
    assert_eq!(
        planned.len(),
        FaultKind::ALL.len(),
        "the seed's plan lacks a fault kind: {planned:?}"
    );
    let apis: BTreeSet<&str> = plan
        .iter()
        .filter_map(|(_, a)| match a {
            Action::InjectErrors { api, .. } => Some(api.name),
            _ => None,
        })
        .collect();
    let group_api = match config.group_protocol {
        GroupProtocol::Classic => ["JoinGroup", "SyncGroup", "Heartbeat"].as_slice(),
        _ => ["ConsumerGroupHeartbeat"].as_slice(),
    };
    assert!(
        group_api.iter().any(|a| apis.contains(a)),
        "the seed's plan injects no error on a group request of its protocol: {apis:?}"
    );
    let replay = config.replay_command();
    let report = run(config)
        .await
        .unwrap_or_else(|e| panic!("the chaos run could not be set up: {e:#}\nreplay: {replay}"));
    println!("{report}");
    if let Some(line) = report.replay_line() {
        println!("{line}");
    }
    println!("{}", report.summary());
    let a = &report.analysis;
    assert!(
        a.produced > 1000,
        "too little was produced: {}\nreplay: {replay}",
        a.produced
    );
    assert_eq!(
        a.lost, 0,
        "lost records: {:#?}\nreplay: {replay}",
        a.lost_examples
    );
    assert_eq!(
        a.violation_count, 0,
        "violations: {:#?}\nreplay: {replay}",
        a.violations
    );
    assert!(
        report.ownership_checked,
        "no generation was learnt\nreplay: {replay}"
    );
    assert!(
        report.drained,
        "the committed offsets did not reach the log end\nreplay: {replay}"
    );
    assert!(
        a.generations >= 2,
        "no rebalance happened\nreplay: {replay}"
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_chaos_loses_nothing_and_keeps_the_invariants() {
    run_briefly(short_config(GroupProtocol::Classic, 11)).await;
}

/// The same faults with KIP-848 members: coordinator moves and silences, brokers down,
/// delays, errors on ConsumerGroupHeartbeat (fencing codes among them) and
/// OffsetCommit, kills, crashes, joins and leaves.
///
/// At the default 3 s sessions (the runner gives the mock the session and the members
/// the same `session.timeout.ms`), shorter than the longest silence (12 s): a member
/// that hears nothing from its coordinator for a session gives its partitions up and
/// rejoins, so the broker handing them on meanwhile makes no zombie (the window of
/// `docs/rebalance.md`, "The consumer protocol under chaos", that a 13 s session kept
/// this test out of before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_chaos_consumer_protocol_loses_nothing_and_keeps_the_invariants() {
    let config = short_config(GroupProtocol::Consumer, 11);
    let report = run_briefly(config).await;
    let log = &report.analysis.member_log;
    // The members spoke KIP-848: the classic member's SyncGroup never happened.
    assert!(
        !log.contains_key("synced"),
        "a member synced a classic generation: {log:?}"
    );
}
