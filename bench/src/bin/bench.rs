//! Consumer throughput and cost, ottla beside rust-rdkafka, rskafka, krafka and the
//! confluent-kafka crate, on the same brokers and the same data in one run.
//!
//! `cargo run --release -p protocol-tests --no-default-features --bin bench -- [--quick] [--records N]
//! [--runs N] [--broker mock|tansu|both] [--sizes 100,1024,1024-lz4]
//! [--partitions 1,6,24] [--clients a,b,...] [--timeout SECS] [--mock-cap N]
//! [--mock-brokers N] [--child-logs DIR] [--try-all]`
//!
//! For every broker and cell (value size and codec × partitions), it writes the cell's
//! records once with librdkafka, then runs each client in its own child process
//! (`--child CLIENT ...`, this same program), interleaved, `--runs` rounds. Each child
//! consumes exactly the cell's records from offset 0, checking every partition's
//! offsets (no loss, no duplicate), and exits. CPU seconds and peak RSS come from the
//! kernel (`wait4`'s rusage of that child). Prints medians and ratios to rust-rdkafka's
//! `BaseConsumer`, then, under "Targets", each of issue 21's consume targets (with issue
//! 36's bounds for `recv()`, `Processor::run` and `run_batch`) from the same medians
//! (`bench::targets`): its worst cell, how many cells meet it, and met, not met, or not
//! measured (none of its cells had the clients it needs).
//!
//! Defaults: 1,000,000 records per cell, values of 100 B, 1 KiB and 1 KiB lz4, 1, 6 and
//! 24 partitions, 3 runs, both brokers. The mock cluster keeps only 5 MiB per
//! partition, so its cells are capped (printed with each table; `--mock-cap` sets the
//! records per partition). `--quick`: 100,000 records of 100 B on 6 partitions, tansu,
//! still 3 runs (about 90 s; the flags above override any of it). `--child-logs DIR` keeps each child's
//! stderr there (its log, with `RUST_LOG` set). Clients known not to work on a broker
//! (`Client::known_blocker`) are listed as n/a without running, unless `--try-all`.
//! `OTTLA_BENCH_CHILD_WRAP` runs every child under a tool, for an instruction profile
//! of one client's whole consume:
//! `OTTLA_BENCH_CHILD_WRAP="valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p"`
//! with a long `--timeout` (docs/benchmarks.md, issue 21).

use std::process::ExitCode;

use ottla_bench::run::{Plan, run};
use ottla_bench::{Cell, Client, flag, opt, table, targets};

fn main() -> ExitCode {
    if let Some(refused) = ottla_bench::refuse_metrics_build("bench") {
        return refused;
    }
    if flag("--child") {
        return ottla_bench::child::main();
    }
    let plan = match plan() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    println!(
        "bench: {} cell(s) × {} client(s) × {} run(s) on {}; {} cores",
        plan.cells.len(),
        plan.clients.len(),
        plan.runs,
        plan.brokers.join(" and "),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    table::legend(&plan.clients);
    match run(&plan) {
        Ok(rows) => {
            if rows.len() > plan.clients.len() {
                println!("\n==== all cells ====");
                table::print(&rows);
            }
            targets::print(targets::CONSUME_HEADING, &targets::evaluate(&rows));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn list<T>(name: &str, default: &str, parse: impl Fn(&str) -> Option<T>) -> anyhow::Result<Vec<T>> {
    opt(name)
        .unwrap_or_else(|| default.to_string())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse(s).ok_or_else(|| anyhow::anyhow!("{name}: cannot read {s:?}")))
        .collect()
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
    let quick = flag("--quick");
    let records = number("--records")?.unwrap_or(if quick { 100_000 } else { 1_000_000 });
    let runs = number("--runs")?.unwrap_or(3).max(1);
    let broker = opt("--broker").unwrap_or_else(|| (if quick { "tansu" } else { "both" }).into());
    let brokers = match broker.as_str() {
        "both" => vec!["mock".to_string(), "tansu".to_string()],
        "mock" | "tansu" => vec![broker],
        other => anyhow::bail!("--broker: {other} (mock, tansu or both)"),
    };
    // `100`, `1024`, `1024-lz4`
    let sizes = list(
        "--sizes",
        if quick { "100" } else { "100,1024,1024-lz4" },
        |s| {
            let (size, lz4) = match s.strip_suffix("-lz4") {
                Some(size) => (size, true),
                None => (s, false),
            };
            let size = match size.to_ascii_lowercase().as_str() {
                "1k" | "1kib" => 1024,
                other => other.trim_end_matches('b').parse().ok()?,
            };
            Some((size, lz4))
        },
    )?;
    let partitions = list("--partitions", if quick { "6" } else { "1,6,24" }, |s| {
        s.parse::<i32>().ok().filter(|&p| p > 0)
    })?;
    let clients = match opt("--clients") {
        Some(_) => list("--clients", "", Client::parse)?,
        None => Client::ALL.to_vec(),
    };
    let mut cells = Vec::new();
    for &(value_size, lz4) in &sizes {
        for &p in &partitions {
            cells.push(Cell {
                value_size,
                lz4,
                partitions: p,
                records,
            });
        }
    }
    Ok(Plan {
        brokers,
        cells,
        clients,
        runs,
        timeout: number("--timeout")?,
        mock_cap: number("--mock-cap")?,
        mock_brokers: number("--mock-brokers")?.unwrap_or(3) as i32,
        try_all: flag("--try-all"),
        child_logs: match opt("--child-logs") {
            Some(dir) => {
                std::fs::create_dir_all(&dir)?;
                Some(dir.into())
            }
            None => None,
        },
    })
}
