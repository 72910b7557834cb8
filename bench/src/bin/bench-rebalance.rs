//! Rebalance timings, ottla beside librdkafka, on the librdkafka mock cluster.
//!
//! `cargo run --release -p protocol-tests --no-default-features --bin bench-rebalance [-- --runs 3 --partitions 6
//! --session-ms 4000 --heartbeat-ms 500 --delay-ms 300 --tick-ms 10 --fetch-wait-ms 20
//! --move-every-ms 400 --scenarios cold,move,eager,coop,848]`
//!
//! Five scenarios, each run `--runs` times per client, the clients interleaved:
//! - `cold`: 3 members start at once on a topic with records in every partition; the time
//!   until every partition has delivered a record.
//! - `move`: 3 members under steady production; the group's coordinator moves to another
//!   broker. The longest gap in progress of any partition, and with no progress at all,
//!   from 1 s before the move to 3 s after (and the longest partition gap in the second
//!   before the move, for scale).
//! - `eager`, `coop`: 2 members under steady production, then a third joins, with the
//!   `range` or the `cooperative-sticky` assignor. The longest gap of the partitions that
//!   stayed with their member, and of those that moved; under `range`, also when the
//!   staying partitions delivered again, counted from the third member's start (the
//!   gap alone depends on where in its heartbeat interval each member learns of the
//!   rebalance).
//! - `848`: both clients on KIP-848's consumer group protocol. 1 member under steady
//!   production, then a second, while the coordinator moves three times (every
//!   `--move-every-ms` from the second's start). The longest gap of the partitions that
//!   stay (against the steady one before), and for the moved ones the time from the
//!   revocation reaching the old owner's application to the first record at the new
//!   owner, to compare with two heartbeat intervals (`--heartbeat-ms`, which the mock
//!   gives the consumer-protocol members).
//!
//! Times are taken in the consumer loops as records arrive; only records past every
//! offset the partition delivered before count. Prints every run, then medians, minima
//! and maxima, and the ratio ottla/librdkafka of the medians. Every setting is printed
//! first. See `ottla_bench::rebalance` for the details, and
//! `docs/benchmarks.md` for what the mock's group state machine adds.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use ottla_bench::arg;
use ottla_bench::opt;
use ottla_bench::rebalance::{self, Client, METRICS, Scenario, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-rebalance") {
        return refused;
    }
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-rebalance: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run() -> anyhow::Result<()> {
    // RUST_LOG (default warn): ottla's own view of a run, e.g. `ottla::driver::group=debug`.
    protocol_tests::init_tracing();
    let defaults = Settings::default();
    let millis = |name: &str, d: Duration| Duration::from_millis(arg(name, d.as_millis() as u64));
    let settings = Settings {
        partitions: i32::try_from(arg("--partitions", defaults.partitions as u64))?,
        session_timeout: millis("--session-ms", defaults.session_timeout),
        heartbeat_interval: millis("--heartbeat-ms", defaults.heartbeat_interval),
        initial_delay: millis("--delay-ms", defaults.initial_delay),
        tick: millis("--tick-ms", defaults.tick),
        fetch_max_wait: millis("--fetch-wait-ms", defaults.fetch_max_wait),
        move_every: millis("--move-every-ms", defaults.move_every),
        ..defaults
    };
    let runs = arg("--runs", 3);
    let scenarios: Vec<Scenario> = match opt("--scenarios") {
        None => Scenario::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|n| {
                Scenario::ALL
                    .into_iter()
                    .find(|s| s.name() == n)
                    .ok_or_else(|| {
                        anyhow::anyhow!("unknown scenario {n} (cold, move, eager, coop, 848)")
                    })
            })
            .collect::<anyhow::Result<_>>()?,
    };
    anyhow::ensure!(
        settings.heartbeat_interval < settings.session_timeout,
        "--heartbeat-ms must be below --session-ms"
    );
    println!("bench-rebalance: {runs} runs");
    for line in settings.describe() {
        println!("  {line}");
    }
    let started = std::time::Instant::now();
    // (metric, client) -> values; (scenario, client) -> JoinGroup counts; failures.
    let mut values: BTreeMap<(&str, Client), Vec<Duration>> = BTreeMap::new();
    let mut joins: BTreeMap<(&str, Client), Vec<usize>> = BTreeMap::new();
    let mut failed: BTreeMap<(&str, Client), u64> = BTreeMap::new();
    for run in 1..=runs {
        for &scenario in &scenarios {
            for client in Client::ALL {
                let id = format!("{run}");
                match rebalance::run(scenario, client, &settings, &id).await {
                    Ok(r) => {
                        let figures: Vec<String> = r
                            .samples
                            .iter()
                            .map(|s| format!("{:.0} ms", ms(s.value)))
                            .collect();
                        println!(
                            "run {run} {:<5} {:<10} {} | {} JoinGroups | {}",
                            scenario.name(),
                            client.name(),
                            figures.join(", "),
                            r.joins,
                            r.note.trim_start_matches("; ")
                        );
                        for s in r.samples {
                            values.entry((s.metric, client)).or_default().push(s.value);
                        }
                        joins
                            .entry((scenario.name(), client))
                            .or_default()
                            .push(r.joins);
                    }
                    Err(e) => {
                        println!(
                            "run {run} {:<5} {:<10} FAILED: {e:#}",
                            scenario.name(),
                            client.name()
                        );
                        *failed.entry((scenario.name(), client)).or_default() += 1;
                    }
                }
            }
        }
    }
    println!();
    println!("| scenario | client | median | min | max | runs | JoinGroups per run (median) |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    for (metric, scenario) in METRICS {
        if !scenarios.contains(&scenario) {
            continue;
        }
        let mut medians = BTreeMap::new();
        for client in Client::ALL {
            let mut v = values.get(&(metric, client)).cloned().unwrap_or_default();
            v.sort();
            let mut j = joins
                .get(&(scenario.name(), client))
                .cloned()
                .unwrap_or_default();
            j.sort_unstable();
            let fails = failed.get(&(scenario.name(), client)).copied().unwrap_or(0);
            let runs = if fails > 0 {
                format!("{} ({fails} failed)", v.len())
            } else {
                v.len().to_string()
            };
            let Some(&median) = v.get(v.len() / 2) else {
                println!("| {metric} | {} | - | - | - | {runs} | - |", client.name());
                continue;
            };
            medians.insert(client, median);
            println!(
                "| {metric} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {runs} | {} |",
                client.name(),
                ms(median),
                ms(v[0]),
                ms(v[v.len() - 1]),
                j.get(j.len() / 2).copied().unwrap_or(0)
            );
        }
        if let (Some(o), Some(r)) = (
            medians.get(&Client::Ottla),
            medians.get(&Client::Librdkafka),
        ) {
            ratios.push((metric, ms(*o), ms(*r)));
        }
    }
    println!();
    println!("| scenario | ottla/librdkafka (medians) |");
    println!("|---|---:|");
    for (metric, o, r) in ratios {
        if r > 0.0 {
            println!("| {metric} | {:.2} |", o / r);
        } else {
            println!("| {metric} | - ({o:.0} ms / {r:.0} ms) |");
        }
    }
    println!();
    println!("total {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}
