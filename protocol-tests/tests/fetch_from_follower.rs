//! Fetching from the replica the leader names (KIP-392), on the librdkafka mock cluster,
//! which can make a broker a partition's follower and set its watermarks: with
//! `client.rack` set the records come from the follower (Fetch requests counted per
//! broker), and a follower that goes down or lags costs no record and repeats none.
//!
//! The mock's leader names its follower to every Fetch v11+, whatever the rack and
//! however far behind the follower is; a Kafka leader names only a replica in the
//! consumer's rack that has the offset (`replica.selector.class`). So where a Kafka
//! leader would stop naming a dead or lagging replica, these tests do it by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::ApiKey;
use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use protocol_tests::data::{index_of, produce};
use protocol_tests::mock::MockCluster;

const TOPIC: &str = "near";
const PARTITIONS: i32 = 2;

/// A 3-broker mock with `near` (2 partitions, 3 replicas) led by broker 1 and followed
/// by broker 2, racks `rack-1` to `rack-3`.
fn cluster() -> MockCluster {
    let mock = MockCluster::builder(3)
        .replicated_topic(TOPIC, PARTITIONS, 3)
        .start()
        .expect("mock");
    for b in 1..=3 {
        mock.set_broker_rack(b, &format!("rack-{b}")).expect("rack");
    }
    for p in 0..PARTITIONS {
        mock.partition_set_leader(TOPIC, p, 1).expect("leader");
        mock.partition_set_follower(TOPIC, p, 2).expect("follower");
    }
    mock
}

async fn consumer(mock: &MockCluster) -> Consumer {
    Consumer::builder(&mock.bootstrap())
        .assign((0..PARTITIONS).map(|p| TopicPartition::new(TOPIC, p)))
        .offset_reset(OffsetReset::Earliest)
        .client_rack("rack-2")
        .build()
        .await
        .expect("consumer")
}

/// Reads until `seen` holds `want` records, or `within` passes; each record's index
/// counted.
async fn read(
    consumer: &mut Consumer,
    seen: &mut BTreeMap<u64, u32>,
    want: usize,
    within: Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    while seen.len() < want && tokio::time::Instant::now() < deadline {
        if let Ok(batch) =
            tokio::time::timeout(Duration::from_millis(500), consumer.recv_batch(500)).await
        {
            for r in batch.expect("records") {
                *seen
                    .entry(index_of(r.partition(), r.offset(), PARTITIONS))
                    .or_default() += 1;
            }
        }
    }
}

fn fetches_by_broker(mock: &MockCluster) -> BTreeMap<i32, usize> {
    let mut out = BTreeMap::new();
    for r in mock.requests() {
        if r.api_key == ApiKey::Fetch as i16 {
            *out.entry(r.broker).or_default() += 1;
        }
    }
    out
}

fn assert_once(seen: &BTreeMap<u64, u32>, total: u64, what: &str) {
    let missing: Vec<u64> = (0..total)
        .filter(|i| !seen.contains_key(i))
        .take(10)
        .collect();
    let twice: Vec<(&u64, &u32)> = seen.iter().filter(|(_, n)| **n > 1).take(10).collect();
    assert!(
        missing.is_empty(),
        "{what}: missing {missing:?} (of {total})"
    );
    assert!(twice.is_empty(), "{what}: read more than once {twice:?}");
    assert_eq!(seen.len() as u64, total, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_records_come_from_the_follower_and_a_follower_going_down_loses_and_repeats_nothing() {
    protocol_tests::init_tracing();
    let mock = cluster();
    produce(&mock.bootstrap(), TOPIC, PARTITIONS, 0, 2000, "none")
        .await
        .expect("produce");
    mock.start_request_tracking();
    let mut consumer = consumer(&mock).await;
    let mut seen = BTreeMap::new();
    read(&mut consumer, &mut seen, 2000, Duration::from_secs(60)).await;
    assert_once(&seen, 2000, "from the follower");
    let fetches = fetches_by_broker(&mock);
    let at = |b: i32| fetches.get(&b).copied().unwrap_or(0);
    // The leader answers the first Fetch of each partition with the follower's id and
    // no records; the follower serves the rest.
    assert!(at(2) >= 1, "the follower was fetched from: {fetches:?}");
    assert!(
        at(1) <= 2,
        "the leader only named the follower: {fetches:?}"
    );
    assert_eq!(at(3), 0, "{fetches:?}");

    // The follower goes down while records keep coming. Its fetches fail, the
    // partitions go back to the leader, which (on the mock) names the dead follower
    // again: nothing is read meanwhile, and nothing is reset, skipped or repeated.
    mock.broker_down(2).expect("down");
    produce(&mock.bootstrap(), TOPIC, PARTITIONS, 2000, 2000, "none")
        .await
        .expect("produce");
    read(&mut consumer, &mut seen, 4000, Duration::from_secs(3)).await;
    // What a Kafka leader does with a replica out of the ISR: it stops naming it. The
    // mock is told to name broker 3 instead.
    mock.clear_requests();
    for p in 0..PARTITIONS {
        mock.partition_set_follower(TOPIC, p, 3).expect("follower");
    }
    read(&mut consumer, &mut seen, 4000, Duration::from_secs(60)).await;
    assert_once(&seen, 4000, "across the follower going down");
    let fetches = fetches_by_broker(&mock);
    assert!(
        fetches.get(&3).copied().unwrap_or(0) >= 1,
        "the new follower was fetched from: {fetches:?}"
    );
    mock.broker_up(2).expect("up");
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_lagging_follower_sends_the_consumer_back_to_the_leader_without_a_reset() {
    protocol_tests::init_tracing();
    let mock = cluster();
    // Batches of 50 records per partition (the mock serves one batch per Fetch and
    // checks only the fetch offset against the follower's watermarks).
    let producer =
        protocol_tests::data::producer(&mock.bootstrap(), "none", &[]).expect("producer");
    for round in 0..20 {
        protocol_tests::data::produce_with(&producer, TOPIC, PARTITIONS, round * 100, 100)
            .await
            .expect("produce");
    }
    // The follower has the first 300 of each partition's 1,000 records (the mock's
    // high watermark is the last offset it serves): a Fetch past them is out of range
    // there. With auto.offset.reset=earliest, a reset would read the partition again
    // from 0 (duplicates); without one, nothing is repeated.
    for p in 0..PARTITIONS {
        mock.partition_set_follower_watermarks(TOPIC, p, 0, 299)
            .expect("watermarks");
    }
    let mut consumer = consumer(&mock).await;
    let mut seen = BTreeMap::new();
    read(&mut consumer, &mut seen, 600, Duration::from_secs(60)).await;
    // A while of fetches out of range on the follower, each sent back to the leader,
    // which names the follower again.
    read(&mut consumer, &mut seen, 2000, Duration::from_secs(2)).await;
    assert_eq!(seen.len(), 600, "the follower's 300 of each, and no more");
    assert!(
        seen.values().all(|n| *n == 1),
        "nothing repeated while out of range"
    );
    // The follower catches up.
    for p in 0..PARTITIONS {
        mock.partition_set_follower_watermarks(TOPIC, p, -1, -1)
            .expect("watermarks");
    }
    read(&mut consumer, &mut seen, 2000, Duration::from_secs(60)).await;
    assert_once(&seen, 2000, "across a lagging follower");
    consumer.close().await.expect("close");
}

/// Without `client.rack` nothing changes on the wire, and on the mock (which names its
/// follower to any Fetch v11+) the consumer follows too: the rule is the leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_consumer_without_a_rack_follows_the_leaders_choice_too() {
    protocol_tests::init_tracing();
    let mock = cluster();
    produce(&mock.bootstrap(), TOPIC, PARTITIONS, 0, 500, "none")
        .await
        .expect("produce");
    mock.start_request_tracking();
    let mut consumer = Consumer::builder(&mock.bootstrap())
        .assign((0..PARTITIONS).map(|p| TopicPartition::new(TOPIC, p)))
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("consumer");
    let mut seen = BTreeMap::new();
    read(&mut consumer, &mut seen, 500, Duration::from_secs(60)).await;
    assert_once(&seen, 500, "without a rack");
    assert!(fetches_by_broker(&mock).get(&2).copied().unwrap_or(0) >= 1);
    consumer.close().await.expect("close");
}
