//! Dead-letter topic tools.
//!
//! ```sh
//! cargo run --example dlq -- inspect 127.0.0.1:9092 orders.dlq
//! cargo run --example dlq -- replay 127.0.0.1:9092 orders.dlq [--offsets 3,7] [--max-replays 3]
//! ```
//!
//! `inspect` prints every record with its origin, class, error and headers, then counts
//! by class and error type. `replay` sends the chosen records (all by default) back to
//! their original topic and partition, once per original record, and skips records
//! already replayed `--max-replays` times.

use std::process::ExitCode;

use ottla::ClientConfig;
use ottla::dlq::{inspect, replay, summary};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(command), Some(bootstrap), Some(topic)) = (args.first(), args.get(1), args.get(2))
    else {
        eprintln!(
            "usage: dlq inspect|replay BOOTSTRAP DLQ_TOPIC [--offsets a,b,..] [--max-replays N]"
        );
        return ExitCode::from(2);
    };
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    let config = ClientConfig::new(bootstrap);
    let entries = match inspect(&config, topic).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("dlq: {e}");
            return ExitCode::FAILURE;
        }
    };
    match command.as_str() {
        "inspect" => {
            for e in &entries {
                println!(
                    "{}/{}@{}  from {}  [{}] {}: {}  (replays {})",
                    e.record.topic(),
                    e.record.partition(),
                    e.record.offset(),
                    e.origin_id().unwrap_or_else(|| "?".into()),
                    e.class,
                    e.error_type.as_deref().unwrap_or("?"),
                    e.message.as_deref().unwrap_or(""),
                    e.replays
                );
                for h in e.record.headers() {
                    let v = h
                        .value()
                        .map(String::from_utf8_lossy)
                        .unwrap_or_else(|| "(null)".into());
                    println!("    {} = {v}", String::from_utf8_lossy(h.key()));
                }
            }
            println!("\n{} records", entries.len());
            for ((class, kind), n) in summary(&entries) {
                println!("  {n:>6}  {class:<14} {kind}");
            }
            ExitCode::SUCCESS
        }
        "replay" => {
            let chosen: Vec<_> = match flag("--offsets") {
                Some(list) => {
                    let offsets: Vec<i64> = list
                        .split(',')
                        .filter_map(|o| o.trim().parse().ok())
                        .collect();
                    entries
                        .into_iter()
                        .filter(|e| offsets.contains(&e.record.offset()))
                        .collect()
                }
                None => entries,
            };
            let max = flag("--max-replays")
                .and_then(|v| v.parse().ok())
                .unwrap_or(3);
            match replay(&config, &chosen, max).await {
                Ok(report) => {
                    println!("{report:?}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("dlq: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        other => {
            eprintln!("dlq: unknown command {other}");
            ExitCode::from(2)
        }
    }
}
