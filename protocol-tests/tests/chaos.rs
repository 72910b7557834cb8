//! The chaos runner's core, briefly, on the mock cluster with a fixed seed: every fault
//! kind is injected, nothing is lost, and every invariant holds. The `chaos` binary
//! runs the same core for longer (`--duration 10m`); `OTTLA_CHAOS_SEED` replays
//! another seed here.

use std::collections::BTreeSet;
use std::time::Duration;

use protocol_tests::chaos::schedule::{self, FaultKind, PlanInput};
use protocol_tests::chaos::{Config, run};

/// Every fault kind at a rate that makes it happen within a short run.
fn short_config() -> Config {
    let mut config = Config {
        duration: Duration::from_secs(25),
        seed: protocol_tests::env_number("OTTLA_CHAOS_SEED", 11),
        progress: None,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_chaos_loses_nothing_and_keeps_the_invariants() {
    let config = short_config();
    let planned: BTreeSet<FaultKind> = schedule::plan(&PlanInput {
        seed: config.seed,
        duration: config.duration,
        rates: config.effective_rates(),
        brokers: (1..=config.brokers).collect(),
        members: config.members,
        max_members: config.members + 2,
    })
    .iter()
    .filter_map(|(_, a)| a.kind())
    .collect();
    let replay = config.replay_command();
    let report = run(config)
        .await
        .expect("the chaos run could not be set up");
    println!("{report}\n{}", report.summary());
    let a = &report.analysis;
    assert_eq!(
        planned.len(),
        FaultKind::ALL.len(),
        "the seed's plan lacks a fault kind: {planned:?}"
    );
    assert!(a.produced > 1000, "too little was produced: {}", a.produced);
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
    assert!(report.ownership_checked, "no generation was learnt");
    assert!(report.drained);
    assert!(a.generations >= 2, "no rebalance happened");
}
