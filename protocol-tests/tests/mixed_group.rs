//! Mixed groups: ottla members share a group with members of other clients (the Python
//! `confluent-kafka` package, i.e. librdkafka, and `kafka-python`), under `range`,
//! `roundrobin` and `cooperative-sticky`, on the librdkafka mock cluster and on tansu.
//! Every partition must end up owned exactly once across all the clients.
//!
//! Needs `bash scripts/install-peers.sh`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use protocol_tests::group_app::{MemberOptions, TestMember};
use protocol_tests::mock::MockCluster;
use protocol_tests::pyclient::{PyClient, PyMember};
use protocol_tests::tansu::Tansu;

const TOPIC: &str = "mixed";
const PARTITIONS: i32 = 12;

async fn mixed(
    bootstrap: &str,
    client: PyClient,
    strategy: &'static str,
    api_version: Option<&str>,
) {
    let group = format!("mixed-{client}-{strategy}-{}", std::process::id());
    let spawn = |name: &str| {
        let mut b = PyMember::builder(client, bootstrap, &group, &[TOPIC], strategy)
            .session_timeout(Duration::from_secs(6))
            .heartbeat(Duration::from_millis(500))
            .client_id(name);
        if let Some(v) = api_version {
            b = b.api_version(v).assign_delay(Duration::from_millis(150));
        }
        b.spawn().expect("python member")
    };
    let options = MemberOptions {
        assignor: strategy,
        ..MemberOptions::default()
    };
    let o1 = TestMember::start(bootstrap, &group, &[TOPIC], options.clone())
        .await
        .unwrap();
    let p1 = spawn("py-1");
    let o2 = TestMember::start(bootstrap, &group, &[TOPIC], options)
        .await
        .unwrap();
    let p2 = spawn("py-2");

    let all: BTreeSet<(String, i32)> = (0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    loop {
        let ottla: Vec<BTreeSet<(String, i32)>> = [&o1, &o2]
            .iter()
            .map(|m| {
                m.owned()
                    .into_iter()
                    .map(|tp| (tp.topic, tp.partition))
                    .collect()
            })
            .collect();
        let python = [p1.assignment(), p2.assignment()];
        let sets: Vec<&BTreeSet<(String, i32)>> = ottla.iter().chain(python.iter()).collect();
        let total: usize = sets.iter().map(|s| s.len()).sum();
        let union: BTreeSet<(String, i32)> = sets.iter().flat_map(|s| s.iter().cloned()).collect();
        let sizes: Vec<usize> = sets.iter().map(|s| s.len()).collect();
        if union == all && total == all.len() && sizes.iter().all(|n| *n == 3) {
            eprintln!(
                "{client} {strategy}: every partition owned once, 3 each, after {:?}",
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{client} {strategy}: not converged: sizes {sizes:?}, union {} of {}, total {total}\npy-1: {:#?}\npy-2: {:#?}",
            union.len(),
            all.len(),
            p1.lines(),
            p2.lines()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = p1.close();
    let _ = p2.close();
    o1.stop().await;
    o2.stop().await;
}

fn mock() -> MockCluster {
    let m = MockCluster::new(3).expect("mock");
    m.cap_group_apis().expect("caps");
    m.set_group_initial_rebalance_delay(Duration::from_millis(1500));
    m.create_topic(TOPIC, PARTITIONS, 1).expect("topic");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_confluent_range() {
    let m = mock();
    mixed(&m.bootstrap(), PyClient::Confluent, "range", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_confluent_roundrobin() {
    let m = mock();
    mixed(&m.bootstrap(), PyClient::Confluent, "roundrobin", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_confluent_cooperative_sticky() {
    let m = mock();
    mixed(
        &m.bootstrap(),
        PyClient::Confluent,
        "cooperative-sticky",
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_kafka_python_range() {
    let m = mock();
    mixed(
        &m.bootstrap(),
        PyClient::KafkaPython,
        "range",
        Some("2.0.0"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_kafka_python_roundrobin() {
    let m = mock();
    mixed(
        &m.bootstrap(),
        PyClient::KafkaPython,
        "roundrobin",
        Some("2.0.0"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_ottla_and_confluent_range() {
    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, PARTITIONS).unwrap();
    mixed(&t.bootstrap(), PyClient::Confluent, "range", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_ottla_and_confluent_roundrobin() {
    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, PARTITIONS).unwrap();
    mixed(&t.bootstrap(), PyClient::Confluent, "roundrobin", None).await;
}
