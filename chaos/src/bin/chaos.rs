//! The chaos runner: an ottla consumer group under injected faults.
//!
//! `cargo run --release -p ottla-chaos --bin chaos -- --duration 60s [--seed N] [--broker mock|tansu] [--group-protocol classic|consumer] [--contention N] [--stall D]`
//!
//! See the `ottla_chaos` library for what it does and checks, and `--help` for every
//! flag. The first line printed is the command that replays the run; the last is a
//! one-line summary, and when the run failed the replay command comes again right
//! before it. The exit status is non-zero when a record was lost or a check failed.

use std::process::ExitCode;

use ottla_chaos::{Config, USAGE, run};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_args(&args, |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(2);
        }
    };
    let seed = config.seed;
    let replay = config.replay_command();
    match run(config).await {
        Ok(report) => {
            println!("{report}");
            // A failing run's replay command comes right before its summary.
            if let Some(line) = report.replay_line() {
                println!("{line}");
            }
            println!("{}", report.summary());
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("chaos: the run could not be set up: {e:#}");
            println!("chaos: replay with: {replay}");
            println!("lost=? duplicates=? moves=? rebalances=? faults=? seed={seed} result=ERROR");
            ExitCode::from(2)
        }
    }
}
