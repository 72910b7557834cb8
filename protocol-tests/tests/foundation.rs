//! The foundation against real peers: version negotiation, metadata, pipelining,
//! broker restarts and coalesced refreshes, on the librdkafka mock cluster (3 brokers)
//! and on tansu. With `OTTLA_BOOTSTRAP` set, the peer-agnostic tests also run against
//! that external broker.

use std::collections::BTreeSet;
use std::time::Duration;

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ApiKey, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use ottla::driver::{Cluster, TopicScope};
use ottla::{ClientConfig, RequestError};
use ottla_proto::metadata::NodeId;
use protocol_tests::mock::MockCluster;
use protocol_tests::peer::Peer;

const TOPIC: &str = "foundation-six";

fn config(bootstrap: &str) -> ClientConfig {
    ClientConfig::new(bootstrap)
        .with_client_id("ottla-foundation")
        .with_request_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(2))
        .with_reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
}

fn scope(topic: &str) -> TopicScope {
    TopicScope::Topics(BTreeSet::from([topic.to_string()]))
}

/// Negotiates with the peer and checks the table: every API ottla implements that the
/// peer offers gets the highest common version.
async fn check_negotiation(peer: &Peer) {
    let cluster = Cluster::connect(
        &config(&peer.bootstrap()),
        TopicScope::Topics(BTreeSet::new()),
        &[],
    )
    .await
    .unwrap();
    let first = peer.bootstrap().split(',').next().unwrap().to_string();
    let table = cluster.connection(&first).versions().await.unwrap();
    println!("negotiated with {}:\n{table}", peer.name());
    for row in table.rows() {
        let Some(broker) = row.broker else {
            assert_eq!(row.chosen, None);
            continue;
        };
        let expected = broker.max.min(row.ours.max);
        let expected = (expected >= broker.min.max(row.ours.min)).then_some(expected);
        assert_eq!(row.chosen, expected, "{:?}", row.api);
    }
    assert!(table.version(ApiKey::Metadata).is_some());
    assert!(table.version(ApiKey::ApiVersions).is_some());
}

/// Metadata for a 6-partition topic: every partition has a live leader that is one of
/// the cluster's brokers, and a leader epoch.
async fn check_metadata(peer: &Peer, expected_brokers: usize) {
    let cluster = Cluster::connect(&config(&peer.bootstrap()), scope(TOPIC), &[])
        .await
        .unwrap();
    let md = cluster.metadata();
    assert_eq!(md.brokers.len(), expected_brokers, "{:?}", md.brokers);
    let topic = md
        .topic(TOPIC)
        .unwrap_or_else(|| panic!("{TOPIC} missing from {:?}", md.topics.keys()));
    assert_eq!(topic.error, 0);
    let partitions: Vec<i32> = topic.partitions.iter().map(|p| p.partition).collect();
    assert_eq!(partitions, (0..6).collect::<Vec<_>>());
    for p in &topic.partitions {
        let leader = p
            .leader
            .unwrap_or_else(|| panic!("partition {} has no leader", p.partition));
        assert!(
            md.broker(leader).is_some(),
            "leader {leader} is not a known broker"
        );
        assert!(
            p.leader_epoch.0 >= 0,
            "partition {} leader epoch {:?}",
            p.partition,
            p.leader_epoch
        );
    }
    // Leaders come from the same snapshot.
    assert_eq!(
        md.leader(TOPIC, 0).map(|(n, _)| n),
        topic.partitions[0].leader
    );
}

/// 1,000 requests pipelined on one connection, each answered to its own caller: each
/// asks about a distinct unknown topic and must get that name back.
async fn check_pipelining(peer: &Peer) {
    let cluster = Cluster::connect(
        &config(&peer.bootstrap()),
        TopicScope::Topics(BTreeSet::new()),
        &[],
    )
    .await
    .unwrap();
    let md = cluster.metadata();
    let node = *md.brokers.keys().next().unwrap();
    let conn = cluster.broker(node).unwrap();
    let version = conn
        .versions()
        .await
        .unwrap()
        .version(ApiKey::Metadata)
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let conn = conn.clone();
        tasks.spawn(async move {
            let name = format!("no-such-topic-{i}");
            let mut request = MetadataRequest::default().with_topics(Some(vec![
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(name.clone())))),
            ]));
            if version >= 4 {
                request.allow_auto_topic_creation = false;
            }
            let response = conn.send_version(&request, version).await.unwrap();
            let names: Vec<String> = response
                .topics
                .iter()
                .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
                .collect();
            assert_eq!(names, vec![name]);
        });
    }
    let mut done = 0;
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
        done += 1;
    }
    assert_eq!(done, 1000);
}

#[tokio::test]
async fn mock_negotiation() {
    let peer = Peer::mock(3).unwrap();
    check_negotiation(&peer).await;
}

#[tokio::test]
async fn mock_metadata_for_a_six_partition_topic() {
    let peer = Peer::mock(3).unwrap();
    peer.create_topic(TOPIC, 6).unwrap();
    check_metadata(&peer, 3).await;
}

#[tokio::test]
async fn mock_thousand_pipelined_requests_on_one_connection() {
    let peer = Peer::mock(3).unwrap();
    check_pipelining(&peer).await;
}

#[tokio::test]
async fn mock_broker_down_then_up_requests_succeed_again() {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic(TOPIC, 6, 1).unwrap();
    let cluster = Cluster::connect(&config(&mock.bootstrap()), scope(TOPIC), &[])
        .await
        .unwrap();
    let conn = cluster.broker(NodeId(2)).unwrap();
    let request = MetadataRequest::default().with_topics(Some(vec![]));
    conn.send(&request).await.unwrap();

    mock.broker_down(2).unwrap();
    let started = std::time::Instant::now();
    let err = loop {
        // The mock may let one more request through before the socket closes.
        match conn.send(&request).await {
            Ok(_) if started.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(_) => panic!("broker 2 still answers 5 s after going down"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            err,
            RequestError::Disconnected { .. }
                | RequestError::Connect { .. }
                | RequestError::Timeout { .. }
        ),
        "{err:?}"
    );
    assert!(err.is_retriable());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "failing took {:?}",
        started.elapsed()
    );

    mock.broker_up(2).unwrap();
    let started = std::time::Instant::now();
    loop {
        match conn.send(&request).await {
            Ok(_) => break,
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                assert!(e.is_retriable(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("broker 2 still failing 10 s after coming back: {e:?}"),
        }
    }
}

/// A 3-broker mock with the test topic, and a cluster that has talked to every broker.
async fn every_broker_connected() -> (MockCluster, Cluster) {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic(TOPIC, 6, 1).unwrap();
    let cluster = Cluster::connect(&config(&mock.bootstrap()), scope(TOPIC), &[])
        .await
        .unwrap();
    for b in mock.broker_ids() {
        cluster
            .broker(NodeId(b))
            .unwrap()
            .send(&MetadataRequest::default())
            .await
            .unwrap();
    }
    (mock, cluster)
}

/// Requests any broker can answer (FindCoordinator, metadata) go to the least-loaded
/// live broker, as the Java client's `leastLoadedNode`. They rotated over every known
/// broker, dead or alive, so a lookup on a dead broker cost a failed attempt (up to the
/// connect timeout, or the request timeout on a half-open connection) every few tries.
#[tokio::test]
async fn mock_requests_for_any_broker_avoid_a_dead_one() {
    let (mock, cluster) = every_broker_connected().await;
    let dead = mock.broker_ids()[1];
    let dead_address = cluster.metadata().broker(NodeId(dead)).unwrap().address();
    mock.broker_down(dead).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut failures = Vec::new();
    let mut used = BTreeSet::new();
    for _ in 0..12 {
        let conn = cluster.any_connection();
        used.insert(conn.address().to_string());
        if let Err(e) = conn.send(&MetadataRequest::default()).await {
            failures.push((conn.address().to_string(), e.to_string()));
        }
    }
    assert!(
        failures.len() <= 1,
        "12 requests for any broker failed {} times on the dead broker {dead_address}: {failures:?}",
        failures.len()
    );
    assert!(
        !used.contains(&dead_address) || failures.len() == 1,
        "{used:?}"
    );
}

/// A broker gone silent takes requests and answers none; its connection stays "ready"
/// with as many requests in flight as the others. Requests for any broker must not go
/// there: a FindCoordinator on it waited out its whole timeout in a chaos run, while
/// the member, expelled meanwhile, kept processing partitions given to another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_requests_for_any_broker_avoid_a_silent_one() {
    let (mock, cluster) = every_broker_connected().await;
    let ids = mock.broker_ids();
    let silent = ids[2];
    let silent_address = cluster.metadata().broker(NodeId(silent)).unwrap().address();
    mock.set_rtt(silent, Duration::from_secs(20)).unwrap();
    let stuck = cluster.broker(NodeId(silent)).unwrap();
    let _stuck = tokio::spawn(async move { stuck.send(&MetadataRequest::default()).await });
    // The live brokers are busy too: one request in flight nearly all the time.
    let mut busy = Vec::new();
    for b in &ids[..2] {
        mock.set_rtt(*b, Duration::from_millis(300)).unwrap();
        let conn = cluster.broker(NodeId(*b)).unwrap();
        busy.push(tokio::spawn(async move {
            loop {
                let _ = conn.send(&MetadataRequest::default()).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut picked = Vec::new();
    for _ in 0..12 {
        picked.push(cluster.any_connection().address().to_string());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for b in busy {
        b.abort();
    }
    assert!(
        !picked.contains(&silent_address),
        "the silent broker {silent_address} was picked: {picked:?}"
    );
}

#[tokio::test]
async fn mock_concurrent_refreshes_coalesce_into_one_request() {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic(TOPIC, 6, 1).unwrap();
    let cluster = Cluster::connect(&config(&mock.bootstrap()), scope(TOPIC), &[])
        .await
        .unwrap();
    // Slow every broker down so all refreshes overlap the first one.
    for b in mock.broker_ids() {
        mock.set_rtt(b, Duration::from_millis(300)).unwrap();
    }
    let before = cluster.refresh_count();
    mock.start_request_tracking();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let c = cluster.clone();
        tasks.spawn(async move {
            c.refresh_metadata()
                .await
                .map(|m| m.topic(TOPIC).map(|t| t.partitions.len()))
        });
    }
    while let Some(r) = tasks.join_next().await {
        assert_eq!(r.unwrap().unwrap(), Some(6));
    }
    let metadata_requests = mock
        .requests()
        .iter()
        .filter(|r| r.api_key == ApiKey::Metadata as i16)
        .count();
    assert_eq!(
        metadata_requests, 1,
        "10 concurrent refreshes sent {metadata_requests} Metadata requests"
    );
    assert_eq!(cluster.refresh_count(), before + 1);
}

#[tokio::test]
async fn mock_leadership_errors_trigger_a_refresh_and_others_do_not() {
    let mock = MockCluster::new(3).unwrap();
    mock.create_topic(TOPIC, 6, 1).unwrap();
    let cluster = Cluster::connect(&config(&mock.bootstrap()), scope(TOPIC), &[])
        .await
        .unwrap();
    let (old_leader, _) = cluster.metadata().leader(TOPIC, 0).unwrap();
    let new_leader = mock
        .broker_ids()
        .into_iter()
        .find(|b| *b != old_leader.0)
        .unwrap();
    mock.partition_set_leader(TOPIC, 0, new_leader).unwrap();

    let before = cluster.refresh_count();
    // OFFSET_OUT_OF_RANGE (1) says nothing about leadership.
    assert!(!cluster.refresh_on_error(1).await.unwrap());
    assert_eq!(cluster.refresh_count(), before);
    // NOT_LEADER_OR_FOLLOWER (6) does.
    assert!(cluster.refresh_on_error(6).await.unwrap());
    assert_eq!(cluster.refresh_count(), before + 1);
    assert_eq!(
        cluster.metadata().leader(TOPIC, 0).map(|(n, _)| n.0),
        Some(new_leader)
    );
}

#[tokio::test]
async fn tansu_negotiation() {
    let peer = Peer::tansu().unwrap();
    check_negotiation(&peer).await;
}

#[tokio::test]
async fn tansu_metadata_for_a_six_partition_topic() {
    let peer = Peer::tansu().unwrap();
    peer.create_topic(TOPIC, 6).unwrap();
    check_metadata(&peer, 1).await;
}

#[tokio::test]
async fn tansu_thousand_pipelined_requests_on_one_connection() {
    let peer = Peer::tansu().unwrap();
    check_pipelining(&peer).await;
}

/// The same checks against an external broker named by `OTTLA_BOOTSTRAP` (a real Kafka
/// or Redpanda). Without the variable there is nothing to run against, and it says so.
#[tokio::test]
async fn external_broker_when_configured() {
    let Some(peer) = Peer::external_from_env() else {
        eprintln!("OTTLA_BOOTSTRAP not set: no external broker to check");
        return;
    };
    check_negotiation(&peer).await;
    peer.create_topic(TOPIC, 6).unwrap();
    let cluster = Cluster::connect(&config(&peer.bootstrap()), scope(TOPIC), &[])
        .await
        .unwrap();
    let brokers = cluster.metadata().brokers.len();
    check_metadata(&peer, brokers).await;
    check_pipelining(&peer).await;
}
