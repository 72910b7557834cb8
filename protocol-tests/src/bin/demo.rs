//! The README's main job: start an embedded 3-broker mock cluster, create topics,
//! connect with ottla, and print what it negotiated and sees.
//!
//! `cargo run --release -p protocol-tests --bin demo [-- --brokers N --partitions N]`
//!
//! It grows with ottla: once the processor exists it will produce an order mix, run
//! it, and list the dead-lettered records.

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

/// Three ottla members form a consumer group on `orders` and split its partitions.
async fn group_demo(config: &ClientConfig, partitions: i32) -> anyhow::Result<()> {
    use ottla::driver::GroupHandle;
    use ottla::proto::group::assignor::{Assignor, builtin};
    use ottla::proto::group::member::{Event, GroupConfig};
    use std::sync::Arc;

    println!("\nconsumer group demo-group: 3 ottla members, cooperative-sticky, on orders");
    let mut members = Vec::new();
    for _ in 0..3 {
        let cluster = Cluster::connect(
            config,
            TopicScope::Topics(["orders".to_string()].into()),
            &[],
        )
        .await?;
        let assignor: Arc<dyn Assignor> = Arc::from(
            builtin("cooperative-sticky")
                .ok_or_else(|| anyhow::anyhow!("no cooperative-sticky assignor"))?,
        );
        let mut gc = GroupConfig::new("demo-group", vec!["orders".into()], vec![assignor]);
        gc.session_timeout = Duration::from_secs(6);
        gc.heartbeat_interval = Duration::from_millis(500);
        // The mock refuses followers' SyncGroups that arrive after the leader's.
        gc.leader_sync_delay = Duration::from_millis(50);
        members.push(GroupHandle::spawn(cluster, gc));
    }
    let mut owned: Vec<std::collections::BTreeSet<i32>> = vec![Default::default(); 3];
    let mut generation = [None; 3];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while owned.iter().map(|o| o.len()).sum::<usize>() != partitions as usize
        || owned.iter().any(|o| o.is_empty())
        || generation.iter().any(|g| *g != generation[0])
    {
        let tick =
            tokio::time::timeout_at(deadline, tokio::time::sleep(Duration::from_millis(20))).await;
        anyhow::ensure!(tick.is_ok(), "the group did not form within 30 s");
        for (i, m) in members.iter_mut().enumerate() {
            m.progress().await;
            while let Some(event) = m.try_event() {
                match event {
                    Event::Joined {
                        generation: g,
                        member_id,
                        leader,
                        ..
                    } => {
                        generation[i] = Some(g);
                        println!(
                            "  member {i} joined generation {g} as {member_id}{}",
                            if leader { " (leader)" } else { "" }
                        );
                    }
                    Event::Assigned { added, .. } => {
                        owned[i].extend(added.iter().map(|p| p.partition))
                    }
                    Event::RevokeRequested {
                        generation: g,
                        partitions,
                    } => {
                        for p in &partitions {
                            owned[i].remove(&p.partition);
                        }
                        m.complete_revocation(g).await;
                    }
                    Event::Lost { partitions, .. } => {
                        for p in &partitions {
                            owned[i].remove(&p.partition);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    for (i, o) in owned.iter().enumerate() {
        println!(
            "  member {i} owns orders partitions {:?}",
            o.iter().collect::<Vec<_>>()
        );
    }
    for m in members {
        m.leave().await;
    }
    Ok(())
}
