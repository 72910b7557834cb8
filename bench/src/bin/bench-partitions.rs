//! A consumer that owns thousands of partitions (issue 36, part 2): ottla beside
//! rust-rdkafka on the same broker and the same data, in one run.
//!
//! `cargo run --release -p protocol-tests --no-default-features --bin bench-partitions -- [--records N]
//! [--runs N] [--partitions 24,1000,10000] [--many-topics] [--broker mock|tansu|both]
//! [--clients a,b,...] [--value-size B] [--timeout SECS] [--mock-brokers N]
//! [--child-logs DIR]`
//!
//! Every shape (one topic of 24, 1,000 and 10,000 partitions by default; with
//! `--many-topics` also 100 topics × 100 partitions) holds the same records, so CPU per
//! record compares the cost of partitions and nothing else. Per shape it prints
//! records/s, CPU s per million records (the child's rusage: join, offsets and all),
//! peak RSS, the time of the assignment and the time from it to the first record, and
//! ottla ÷ rust-rdkafka CPU per record; at the end, each client's CPU per record on
//! every shape over its figure on the first shape. Medians of `--runs` (default 3),
//! clients interleaved.
//!
//! Defaults: 750,000 records of 100 B (the mock keeps 5 MiB per partition, so 24
//! partitions hold at most about 775,000 of them), the mock cluster with 3 brokers,
//! 3 runs: about 1.5 minutes on 2 cores (2.5 with `--many-topics`). `OTTLA_BENCH_CHILD_WRAP` runs each child under
//! a tool (see `bench`).

use std::process::ExitCode;

use ottla_bench::partitions::{PClient, Plan, Shape, child_main, legend, run};
use ottla_bench::{flag, opt};

fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench-partitions") {
        return refused;
    }
    if flag("--child") {
        return child_main();
    }
    let plan = match plan() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench-partitions: {e:#}");
            return ExitCode::from(2);
        }
    };
    println!(
        "bench-partitions: {} shape(s) × {} client(s) × {} run(s) on {}; {} cores",
        plan.shapes.len(),
        plan.clients.len(),
        plan.runs,
        plan.brokers.join(" and "),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    legend(&plan.clients);
    match run(&plan) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-partitions: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn number(name: &str) -> anyhow::Result<Option<u64>> {
    opt(name)
        .map(|v| {
            v.replace('_', "")
                .parse()
                .map_err(|_| anyhow::anyhow!("{name}: {v:?} is not a number"))
        })
        .transpose()
}

fn plan() -> anyhow::Result<Plan> {
    let records = number("--records")?.unwrap_or(750_000);
    let value_size = number("--value-size")?.unwrap_or(100) as usize;
    let runs = number("--runs")?.unwrap_or(3).max(1);
    let broker = opt("--broker").unwrap_or_else(|| "mock".into());
    let brokers = match broker.as_str() {
        "both" => vec!["mock".to_string(), "tansu".to_string()],
        "mock" | "tansu" => vec![broker],
        other => anyhow::bail!("--broker: {other} (mock, tansu or both)"),
    };
    let mut shapes = Vec::new();
    for p in opt("--partitions")
        .unwrap_or_else(|| "24,1000,10000".into())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let partitions: i32 = p
            .replace('_', "")
            .parse()
            .ok()
            .filter(|&p: &i32| p > 0)
            .ok_or_else(|| anyhow::anyhow!("--partitions: cannot read {p:?}"))?;
        shapes.push(Shape {
            partitions,
            topics: 1,
            records,
            value_size,
        });
    }
    if flag("--many-topics") {
        shapes.push(Shape {
            partitions: 10_000,
            topics: 100,
            records,
            value_size,
        });
    }
    let clients = match opt("--clients") {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| PClient::parse(s).ok_or_else(|| anyhow::anyhow!("--clients: unknown {s}")))
            .collect::<anyhow::Result<Vec<_>>>()?,
        None => PClient::ALL.to_vec(),
    };
    Ok(Plan {
        brokers,
        shapes,
        clients,
        runs,
        timeout: number("--timeout")?,
        mock_brokers: number("--mock-brokers")?.unwrap_or(3) as i32,
        child_logs: match opt("--child-logs") {
            Some(dir) => {
                std::fs::create_dir_all(&dir)?;
                Some(dir.into())
            }
            None => None,
        },
    })
}
