//! Smoke tests of the Python client peers ([`protocol_tests::pyclient`]): two members
//! of one client share a 6-partition topic, on the librdkafka mock cluster (group APIs
//! capped, as in ottla's mixed groups) and on tansu, under range, roundrobin and
//! cooperative-sticky (which hands partitions over incrementally). Each must end up
//! owning a disjoint half, all six together.
//!
//! Needs `bash scripts/install-peers.sh` (confluent-kafka, kafka-python, tansu).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use protocol_tests::mock::MockCluster;
use protocol_tests::pyclient::{PyClient, PyMember};
use protocol_tests::tansu::Tansu;

const PARTITIONS: i32 = 6;
const SESSION_TIMEOUT: Duration = Duration::from_millis(6000);
const HEARTBEAT: Duration = Duration::from_millis(500);
/// kafka-python's pause as leader on the mock (its SyncGroup race).
const ASSIGN_DELAY: Duration = Duration::from_millis(150);
const READY_TIMEOUT: Duration = Duration::from_secs(10);
const BALANCE_TIMEOUT: Duration = Duration::from_secs(30);

/// A group id no other test (or earlier run against the same broker) has used.
fn fresh(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

fn mock() -> anyhow::Result<MockCluster> {
    let mock = MockCluster::new(3)?;
    mock.cap_group_apis()?;
    // Long enough for two members started together to join the first generation: a
    // join to a group that is already up makes the mock wait session timeout - 1 s
    // (5 s here) before it elects a leader, even when every member has rejoined.
    mock.set_group_initial_rebalance_delay(Duration::from_millis(1500));
    Ok(mock)
}

fn show(set: &BTreeSet<(String, i32)>) -> String {
    let parts: Vec<_> = set.iter().map(|(t, p)| format!("{t}:{p}")).collect();
    format!("[{}]", parts.join(","))
}

/// Two `client` members under `strategy`; waits until they split the topic's six
/// partitions 3 + 3, disjoint, then closes both (leaving the group). Under
/// `cooperative-sticky` the second joins only once the first owns everything.
fn two_members(
    client: PyClient,
    bootstrap: &str,
    topic: &str,
    strategy: &str,
    api_version: Option<&str>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let group = fresh(&format!("py-{client}-{strategy}"));
    let spawn = |name: &str| {
        let mut builder = PyMember::builder(client, bootstrap, &group, &[topic], strategy)
            .session_timeout(SESSION_TIMEOUT)
            .heartbeat(HEARTBEAT)
            .client_id(name);
        if let Some(v) = api_version {
            // kafka-python on the mock: see `PyMemberBuilder::assign_delay`.
            builder = builder.api_version(v).assign_delay(ASSIGN_DELAY);
        }
        builder.spawn()
    };
    let cooperative = strategy == "cooperative-sticky";
    let all: BTreeSet<(String, i32)> = (0..PARTITIONS).map(|p| (topic.to_string(), p)).collect();
    let a = spawn("member-a")?;
    if cooperative {
        // b joins a group where a owns everything, so a must hand over three
        // partitions incrementally, keeping the other three throughout.
        a.wait_ready(READY_TIMEOUT)?;
        a.wait_for(BALANCE_TIMEOUT, |set| *set == all)?;
    }
    // Otherwise both start at once, so that both usually make the group's first
    // generation (see `mock()`), which saves a rebalance.
    let b = spawn("member-b")?;
    a.wait_ready(READY_TIMEOUT)?;
    b.wait_ready(READY_TIMEOUT)?;

    let deadline = Instant::now() + BALANCE_TIMEOUT;
    loop {
        let (sa, sb) = (a.assignment(), b.assignment());
        let union: BTreeSet<_> = sa.union(&sb).cloned().collect();
        if sa.is_disjoint(&sb) && union == all && sa.len() == 3 && sb.len() == 3 {
            eprintln!(
                "{client} {strategy}: balanced after {:?}: a {} b {}",
                started.elapsed(),
                show(&sa),
                show(&sb)
            );
            break;
        }
        if Instant::now() >= deadline {
            bail!(
                "{client} {strategy}: no 3 + 3 split of {topic} within {BALANCE_TIMEOUT:?}: \
                 a {} b {}\na: {:#?}\nb: {:#?}",
                show(&sa),
                show(&sb),
                a.lines(),
                b.lines()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if cooperative {
        // Incremental: a never gave up everything, so never reported an empty set.
        let lines = a.lines();
        assert!(
            !lines.iter().any(|l| l == "assigned"),
            "a's assignment went empty under {strategy}: {lines:#?}"
        );
        assert!(
            lines.iter().any(|l| l.starts_with("revoked ")),
            "a never revoked anything: {lines:#?}"
        );
    }
    if strategy == "range" {
        // Range hands each member a contiguous run of partitions.
        for set in [a.assignment(), b.assignment()] {
            let ps: Vec<i32> = set.iter().map(|(_, p)| *p).collect();
            assert!(ps.windows(2).all(|w| w[1] == w[0] + 1), "range gave {ps:?}");
        }
    }
    // Both leave at once: closed one after the other, the second would see the
    // rebalance the first one's leaving starts (kafka-python then waits out the join,
    // 5 s on the mock, before it closes).
    let (mut a, mut b) = (a, b);
    let closing = Instant::now();
    a.request_close();
    b.request_close();
    let (la, lb) = (a.lines(), b.lines());
    // Shown with --nocapture or on a failure below.
    eprintln!("a: {la:#?}\nb: {lb:#?}");
    a.close()
        .with_context(|| format!("closing a; b's output: {lb:#?}"))?;
    b.close()
        .with_context(|| format!("closing b; a's output: {la:#?}"))?;
    eprintln!(
        "{client} {strategy}: both closed in {:?}; total {:?}",
        closing.elapsed(),
        started.elapsed()
    );
    Ok(())
}

#[test]
fn confluent_range_on_mock() -> anyhow::Result<()> {
    let mock = mock()?;
    mock.create_topic("py-range", PARTITIONS, 1)?;
    two_members(
        PyClient::Confluent,
        &mock.bootstrap(),
        "py-range",
        "range",
        None,
    )
}

#[test]
fn confluent_roundrobin_on_mock() -> anyhow::Result<()> {
    let mock = mock()?;
    mock.create_topic("py-rr", PARTITIONS, 1)?;
    two_members(
        PyClient::Confluent,
        &mock.bootstrap(),
        "py-rr",
        "roundrobin",
        None,
    )
}

#[test]
fn kafka_python_range_on_mock() -> anyhow::Result<()> {
    let mock = mock()?;
    mock.create_topic("py-range", PARTITIONS, 1)?;
    let bootstrap = mock.bootstrap();
    two_members(
        PyClient::KafkaPython,
        &bootstrap,
        "py-range",
        "range",
        Some("2.0.0"),
    )
}

#[test]
fn kafka_python_roundrobin_on_mock() -> anyhow::Result<()> {
    let mock = mock()?;
    mock.create_topic("py-rr", PARTITIONS, 1)?;
    let bootstrap = mock.bootstrap();
    two_members(
        PyClient::KafkaPython,
        &bootstrap,
        "py-rr",
        "roundrobin",
        Some("2.0.0"),
    )
}

#[test]
fn confluent_range_on_tansu() -> anyhow::Result<()> {
    let tansu = Tansu::start()?;
    tansu.create_topic("py-range", PARTITIONS)?;
    two_members(
        PyClient::Confluent,
        &tansu.bootstrap(),
        "py-range",
        "range",
        None,
    )
}

#[test]
fn confluent_cooperative_sticky_on_mock() -> anyhow::Result<()> {
    let mock = mock()?;
    mock.create_topic("py-coop", PARTITIONS, 1)?;
    let bootstrap = mock.bootstrap();
    two_members(
        PyClient::Confluent,
        &bootstrap,
        "py-coop",
        "cooperative-sticky",
        None,
    )
}

#[test]
fn kafka_python_cooperative_sticky_on_mock() -> anyhow::Result<()> {
    let mock = mock()?;
    mock.create_topic("py-coop", PARTITIONS, 1)?;
    let bootstrap = mock.bootstrap();
    two_members(
        PyClient::KafkaPython,
        &bootstrap,
        "py-coop",
        "cooperative-sticky",
        Some("2.0.0"),
    )
}

#[test]
fn kafka_python_range_on_tansu() -> anyhow::Result<()> {
    let tansu = Tansu::start()?;
    tansu.create_topic("py-range", PARTITIONS)?;
    two_members(
        PyClient::KafkaPython,
        &tansu.bootstrap(),
        "py-range",
        "range",
        None,
    )
}
