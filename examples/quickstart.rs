//! Write records and read them back in a group, against any cluster: the smallest
//! end-to-end use of ottla's `Producer` and `Consumer`.
//!
//! ```sh
//! cargo run --example quickstart -- produce 127.0.0.1:9092 orders 1000
//! cargo run --example quickstart -- consume 127.0.0.1:9092 orders my-group 1000 [--timeout-secs 60]
//! ```
//!
//! `consume` joins the group, reads from the earliest offset until it has the number of
//! records asked for, commits, and exits 0; if they don't all arrive in time it says
//! what it saw (group events, brokers that keep hanging up) and exits 1.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ottla::consumer::{ConsumerEvent, OffsetReset};
use ottla::producer::ProducerRecord;
use ottla::{Consumer, Producer};

const USAGE: &str = "usage: quickstart produce BOOTSTRAP TOPIC COUNT\n       \
                     quickstart consume BOOTSTRAP TOPIC GROUP COUNT [--timeout-secs N]";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match words.as_slice() {
        ["produce", bootstrap, topic, count] => match count.parse() {
            Ok(n) => produce(bootstrap, topic, n).await,
            Err(_) => usage(),
        },
        ["consume", bootstrap, topic, group, count, rest @ ..] => {
            let timeout = match rest {
                [] => Some(60),
                ["--timeout-secs", secs] => secs.parse().ok(),
                _ => None,
            };
            match (count.parse(), timeout) {
                (Ok(n), Some(secs)) => {
                    consume(bootstrap, topic, group, n, Duration::from_secs(secs)).await
                }
                _ => usage(),
            }
        }
        _ => usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> Result<(), String> {
    Err(USAGE.to_string())
}

async fn produce(bootstrap: &str, topic: &str, count: u64) -> Result<(), String> {
    let producer = Producer::builder(bootstrap)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let mut deliveries = Vec::new();
    for i in 0..count {
        let record = ProducerRecord::new(topic)
            .key(format!("k{i}"))
            .value(format!("record {i}"));
        deliveries.push(producer.send(record).await.map_err(|e| e.to_string())?);
    }
    for delivery in deliveries {
        delivery.await.map_err(|e| e.to_string())?;
    }
    producer.close().await;
    println!("wrote {count} records to {topic}");
    Ok(())
}

async fn consume(
    bootstrap: &str,
    topic: &str,
    group: &str,
    count: u64,
    timeout: Duration,
) -> Result<(), String> {
    let mut consumer = Consumer::builder(bootstrap)
        .group_id(group)
        .topics([topic])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let mut events = consumer.take_events();
    let mut per_partition: BTreeMap<i32, u64> = BTreeMap::new();
    let mut read = 0;
    let deadline = Instant::now() + timeout;
    while read < count && Instant::now() < deadline {
        tokio::select! {
            Some(event) = events.recv() => match event {
                ConsumerEvent::BrokerHangUp(report) => eprintln!("warning: {report}"),
                event => eprintln!("group: {event:?}"),
            },
            record = tokio::time::timeout(Duration::from_millis(250), consumer.recv()) => {
                match record {
                    Ok(Some(Ok(r))) => {
                        *per_partition.entry(r.partition()).or_default() += 1;
                        read += 1;
                    }
                    Ok(Some(Err(e))) => eprintln!("error: {e}"),
                    Ok(None) => break,
                    Err(_) => {}
                }
            }
        }
    }
    let commit = consumer.commit().await;
    consumer.close().await.map_err(|e| e.to_string())?;
    let spread: Vec<String> = per_partition
        .iter()
        .map(|(p, n)| format!("p{p}: {n}"))
        .collect();
    if read < count {
        return Err(format!(
            "read {read} of {count} records from {topic} in {timeout:?} ({})",
            spread.join(", ")
        ));
    }
    commit.map_err(|e| format!("read {read} records, but the commit failed: {e}"))?;
    println!(
        "read {read} records from {topic} in group {group} ({}), committed",
        spread.join(", ")
    );
    Ok(())
}
