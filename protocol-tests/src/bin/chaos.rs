//! The chaos runner: an ottla consumer group under injected faults.
//!
//! `cargo run --release -p protocol-tests --bin chaos -- --duration 60s [--seed N] [--broker mock|tansu] [--group-protocol classic|consumer]`
//!
//! See `protocol_tests::chaos` for what it does and checks, and `--help` for every
//! flag. The last line printed is a one-line summary; the exit status is non-zero
//! when a record was lost or a check failed.

use std::process::ExitCode;

use protocol_tests::chaos::{Config, USAGE, run};

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
    match run(config).await {
        Ok(report) => {
            println!("{report}");
            println!("{}", report.summary());
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("chaos: the run could not be set up: {e:#}");
            println!("lost=? duplicates=? moves=? rebalances=? faults=? seed={seed} result=ERROR");
            ExitCode::from(2)
        }
    }
}
