//! A Processor whose metrics Prometheus scrapes: copy this into a service.
//!
//! ```sh
//! cargo run --example prometheus --features metrics -- 127.0.0.1:9092 orders billing
//! curl -s localhost:9000/metrics | grep ottla
//! ```
//!
//! The recorder is installed first, before any client is built: ottla registers its
//! metric handles when a client is built. docs/observability.md lists every metric and
//! suggests alerts. Ctrl-C stops the Processor, which commits what it finished and
//! leaves the group.

use std::process::ExitCode;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use ottla::processor::{ProcessError, Processor};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(bootstrap), Some(topic), Some(group)) = (args.first(), args.get(1), args.get(2))
    else {
        eprintln!("usage: prometheus BOOTSTRAP TOPIC GROUP   (serves /metrics on :9000)");
        return ExitCode::from(2);
    };

    // Serves http://0.0.0.0:9000/metrics from this runtime.
    if let Err(e) = PrometheusBuilder::new()
        .with_http_listener(([0, 0, 0, 0], 9000))
        .set_buckets(&[
            0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0,
        ])
        .and_then(|b| b.install())
    {
        eprintln!("cannot serve /metrics: {e}");
        return ExitCode::FAILURE;
    }

    let processor = match Processor::builder(bootstrap, group, [topic.clone()])
        // Names become `orders_billing_processed`, `orders_billing_dlq_count`, ...
        .metrics_prefix(format!("{topic}.{group}"))
        .build()
        .await
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let result = processor
        .run(
            |record, _cancel| {
                // The record is lent; the future keeps its value (a shared slice).
                let value = record.value_bytes();
                async move {
                    // The service's work goes here. An empty value is rejected for good:
                    // it goes to the dead-letter topic and counts in `dlq.count`.
                    match value {
                        Some(v) if !v.is_empty() => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            Ok(())
                        }
                        _ => Err(ProcessError::permanent(
                            "EmptyValue",
                            "the record has no value",
                        )),
                    }
                }
            },
            shutdown,
        )
        .await;
    match result {
        Ok(stats) => {
            println!("stopped: {stats:?}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stopped: {e}");
            ExitCode::FAILURE
        }
    }
}
