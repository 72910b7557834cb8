//! The README's main job: start an embedded 3-broker mock cluster, create topics,
//! connect with ottla, and print what it negotiated and sees.
//!
//! `cargo run --release -p protocol-tests --bin demo [-- --brokers N --partitions N]`
//!
//! Then librdkafka's producer writes 6,000 orders and three ottla consumers in one
//! group read each exactly once. It grows with ottla: once the processor exists it
//! will run it on an order mix and list the dead-lettered records.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ottla::ClientConfig;
use ottla::driver::{Cluster, TopicScope};
use protocol_tests::mock::MockCluster;

struct Args {
    brokers: i32,
    partitions: i32,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        brokers: 3,
        partitions: 6,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<i32, String> {
            it.next()
                .ok_or(format!("{name} needs a value"))?
                .parse()
                .map_err(|e| format!("{name}: {e}"))
        };
        match flag.as_str() {
            "--brokers" => args.brokers = value("--brokers")?,
            "--partitions" => args.partitions = value("--partitions")?,
            "-h" | "--help" => {
                println!("usage: demo [--brokers N] [--partitions N]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.brokers < 1 || args.partitions < 1 {
        return Err("--brokers and --partitions must be at least 1".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> ExitCode {
    protocol_tests::init_tracing();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    println!(
        "ottla demo: starting an embedded librdkafka mock cluster with {} brokers",
        args.brokers
    );
    let mock = MockCluster::new(args.brokers)?;
    mock.cap_group_apis()?;
    // The broker default (3 s) only delays the first join.
    mock.set_group_initial_rebalance_delay(Duration::from_millis(500));
    let topics = ["orders", "orders.dlq"];
    for t in topics {
        mock.create_topic(t, args.partitions, 1)?;
    }
    println!("  bootstrap: {}", mock.bootstrap());
    println!(
        "  topics:    {} ({} partitions each)\n",
        topics.join(", "),
        args.partitions
    );

    let config = ClientConfig::new(&mock.bootstrap())
        .with_client_id("ottla-demo")
        .with_request_timeout(Duration::from_secs(5));
    let scope = TopicScope::Topics(
        topics
            .iter()
            .map(|t| t.to_string())
            .collect::<BTreeSet<_>>(),
    );
    let cluster = Cluster::connect(&config, scope, &[]).await?;
    let md = cluster.metadata();

    println!("cluster {}", md.cluster_id.as_deref().unwrap_or("(no id)"));
    for b in md.brokers.values() {
        let controller = if md.controller == Some(b.node) {
            "  (controller)"
        } else {
            ""
        };
        println!("  broker {:>3}  {}{}", b.node, b.address(), controller);
    }
    for t in md.topics.values() {
        println!("\ntopic {}  id {}", t.name, t.id);
        println!(
            "  {:>9}  {:>6}  {:>5}  replicas",
            "partition", "leader", "epoch"
        );
        for p in &t.partitions {
            let leader = p
                .leader
                .map(|l| l.to_string())
                .unwrap_or_else(|| "-".into());
            let replicas: Vec<String> = p.replicas.iter().map(|r| r.to_string()).collect();
            println!(
                "  {:>9}  {:>6}  {:>5}  [{}]",
                p.partition,
                leader,
                p.leader_epoch.0,
                replicas.join(",")
            );
        }
    }

    for b in md.brokers.values() {
        let table = cluster.broker(b.node)?.versions().await?;
        println!("\nnegotiated with broker {} ({}):", b.node, b.address());
        print!("{table}");
    }

    // Sanity of the end state: every topic was seen with every partition led.
    for t in topics {
        let topic = md
            .topic(t)
            .ok_or_else(|| anyhow::anyhow!("topic {t} missing from metadata"))?;
        anyhow::ensure!(
            topic.partitions.len() == args.partitions as usize,
            "topic {t} has {} partitions",
            topic.partitions.len()
        );
        anyhow::ensure!(
            topic.partitions.iter().all(|p| p.leader.is_some()),
            "topic {t} has leaderless partitions"
        );
    }
    group_demo(&config, args.partitions).await?;
    println!("\ndone in {:.1?}", started.elapsed());
    Ok(())
}

/// librdkafka writes 6,000 orders; three ottla consumers in one group split the
/// partitions and read every order exactly once.
async fn group_demo(config: &ClientConfig, partitions: i32) -> anyhow::Result<()> {
    use std::collections::{BTreeMap, HashSet};

    use ottla::consumer::{Consumer, OffsetReset};

    const ORDERS: u64 = 6000;
    let bootstrap = config.bootstrap_servers.join(",");
    protocol_tests::data::produce(&bootstrap, "orders", partitions, 0, ORDERS, "lz4").await?;
    println!(
        "
wrote {ORDERS} orders (lz4) with librdkafka's producer"
    );
    println!("consumer group demo-group: 3 ottla consumers, cooperative-sticky, auto-commit");
    let mut seen: HashSet<(i32, i64)> = HashSet::new();
    let mut consumers = Vec::new();
    for i in 0..3 {
        let consumer = Consumer::builder(&bootstrap)
            .client_id(format!("ottla-demo-{i}"))
            .group_id("demo-group")
            .topics(["orders"])
            .offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(500))
            .auto_commit(Some(Duration::from_secs(1)))
            // The mock refuses followers' SyncGroups that arrive after the leader's.
            .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
            .build()
            .await?;
        consumers.push(consumer);
    }
    let mut counts = vec![BTreeMap::<i32, u64>::new(); 3];
    let mut repeated = 0u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < ORDERS {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the orders were not all read within 60 s"
        );
        for (i, c) in consumers.iter_mut().enumerate() {
            let Ok(batch) =
                tokio::time::timeout(Duration::from_millis(20), c.recv_batch(1000)).await
            else {
                continue;
            };
            for r in batch? {
                *counts[i].entry(r.partition).or_default() += 1;
                if !seen.insert((r.partition, r.offset)) {
                    repeated += 1;
                }
            }
        }
    }
    for (i, c) in counts.iter().enumerate() {
        let total: u64 = c.values().sum();
        println!(
            "  consumer {i} read {total:>5} orders from partitions {:?}",
            c.keys().collect::<Vec<_>>()
        );
    }
    println!("  {ORDERS} distinct orders read, {repeated} read twice");
    anyhow::ensure!(repeated == 0, "orders were read twice");
    // Close together: one at a time, each LeaveGroup would start a rebalance the
    // next close has to wait out.
    let closes: Vec<_> = consumers
        .into_iter()
        .map(|c| tokio::spawn(c.close()))
        .collect();
    for c in closes {
        c.await??;
    }
    println!("  all three consumers committed and left the group");
    Ok(())
}
