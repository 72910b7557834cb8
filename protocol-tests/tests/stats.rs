//! `Consumer::stats()` and `Producer::stats()` against real peers: a known workload
//! gives exact figures (records and bytes per partition and per topic, the lag draining
//! to 0, one rebalance, commits and produce errors counted by result).
//! tests/metrics.rs checks that the snapshots and the named metrics agree.

use std::collections::BTreeMap;
use std::time::Duration;

use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use ottla::producer::{Producer, ProducerRecord};
use ottla::stats::ProducerStats;
use protocol_tests::mock::api_key;
use protocol_tests::peer::Peer;

const PARTITIONS: i32 = 2;
const COUNT: u32 = 600;

/// Record `i`: key `k{i}`, a value of `i % 50 + 1` bytes, on partition `i % 2`.
fn record(topic: &str, i: u32) -> ProducerRecord {
    ProducerRecord::new(topic)
        .partition((i % PARTITIONS as u32) as i32)
        .key(format!("k{i}"))
        .value(vec![b'x'; (i % 50 + 1) as usize])
}

/// Key plus value bytes of the records `0..count` on `partition`.
fn bytes_of(count: u32, partition: i32) -> u64 {
    (0..count)
        .filter(|i| (i % PARTITIONS as u32) as i32 == partition)
        .map(|i| format!("k{i}").len() as u64 + u64::from(i % 50 + 1))
        .sum()
}

async fn produce(peer: &Peer, topic: &str, count: u32) -> ProducerStats {
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for i in 0..count {
        deliveries.push(producer.send(record(topic, i)).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }
    let stats = producer.stats();
    producer.close().await;
    stats
}

/// A backlog read by a group member, 50 records one at a time and the rest 100 at a
/// time: per partition, the records
/// and bytes handed over are exact, the lag is `Consumer::lag`'s, never rises and ends
/// at 0; one rebalance, both partitions assigned, nothing lost; one commit `ok`, one
/// refused (`not_owned`).
async fn consumer_stats_are_exact(peer: Peer) {
    protocol_tests::init_tracing();
    let topic = format!("counted-{}", peer.name());
    let group = format!("counter-{}", peer.name());
    peer.create_topic(&topic, PARTITIONS).expect("topic");
    let produced = produce(&peer, &topic, COUNT).await;
    assert_eq!(
        produced.topic(&topic).map(|t| t.records),
        Some(u64::from(COUNT))
    );

    let mut consumer = Consumer::builder(&peer.bootstrap())
        .group_id(&group)
        .topics([topic.clone()])
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
        .build()
        .await
        .expect("consumer");
    let before = consumer.stats();
    assert_eq!((before.records, before.bytes), (0, 0), "{before:?}");

    let mut read: BTreeMap<i32, u64> = BTreeMap::new();
    let mut last_lag: BTreeMap<i32, i64> = BTreeMap::new();
    let mut backlog_seen = false;
    let mut total = 0;
    while total < COUNT as usize {
        // The first 50 one at a time (`recv`, counted per record), then in batches.
        let batch = if total < 50 {
            let one = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
                .await
                .expect("a record in time")
                .expect("open")
                .expect("a record");
            vec![one]
        } else {
            tokio::time::timeout(Duration::from_secs(30), consumer.recv_batch(100))
                .await
                .expect("records in time")
                .expect("records")
        };
        total += batch.len();
        for r in &batch {
            *read.entry(r.partition()).or_default() += 1;
        }
        let stats = consumer.stats();
        assert_eq!(stats.records, total as u64, "{stats:?}");
        for p in 0..PARTITIONS {
            let tp = TopicPartition::new(&topic, p);
            let s = stats
                .partition(&topic, p)
                .expect("an assigned partition is listed");
            assert_eq!(
                s.records,
                read.get(&p).copied().unwrap_or(0),
                "partition {p}"
            );
            assert_eq!(
                s.lag,
                consumer.lag(&tp),
                "partition {p}: the consumer's lag"
            );
            let Some(lag) = s.lag else { continue };
            backlog_seen |= lag > 0;
            if let Some(before) = last_lag.insert(p, lag) {
                assert!(
                    lag <= before,
                    "partition {p}: lag rose from {before} to {lag}"
                );
            }
        }
    }
    assert_eq!(total, COUNT as usize, "every record once");
    assert!(
        backlog_seen,
        "a backlog was seen while reading: {last_lag:?}"
    );

    consumer.commit().await.expect("commit");
    let elsewhere = TopicPartition::new("not-assigned-here", 0);
    let refused = consumer.commit_offsets(&[(elsewhere, 1)]).await;
    assert!(refused.is_err(), "{refused:?}");

    let stats = consumer.stats();
    for p in 0..PARTITIONS {
        let s = stats.partition(&topic, p).expect("partition");
        assert_eq!(s.records, u64::from(COUNT) / 2, "partition {p}");
        assert_eq!(s.bytes, bytes_of(COUNT, p), "partition {p}");
        assert_eq!(s.lag, Some(0), "partition {p} drained");
    }
    assert_eq!(stats.records, u64::from(COUNT));
    assert_eq!(stats.bytes, bytes_of(COUNT, 0) + bytes_of(COUNT, 1));
    assert_eq!(stats.lag(), 0);
    assert_eq!(stats.partitions.len(), PARTITIONS as usize, "{stats:?}");
    assert_eq!(stats.partitions_assigned, PARTITIONS as u64);
    assert_eq!(stats.rebalances, 1, "{stats:?}");
    assert_eq!(stats.partitions_lost, 0);
    // Counted before the commit's caller hears of it.
    assert_eq!(stats.commits.ok, 1, "{:?}", stats.commits);
    assert_eq!(stats.commits.not_owned, 1, "{:?}", stats.commits);
    assert_eq!(stats.commits.failed(), 1, "{:?}", stats.commits);
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_consumer_stats_count_a_known_backlog_exactly() {
    consumer_stats_are_exact(Peer::mock(1).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_consumer_stats_count_a_known_backlog_exactly() {
    consumer_stats_are_exact(Peer::tansu().expect("tansu")).await;
}

/// Records acknowledged per topic, with their bytes; a batch the broker refuses for
/// good (MESSAGE_TOO_LARGE, injected into the mock's next Produce) is counted under its
/// error's name, and nothing is left pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_producer_stats_count_records_per_topic_and_errors_by_name() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    for topic in ["stats.a", "stats.b", "stats.refused", "stats.retried"] {
        peer.create_topic(topic, PARTITIONS).expect("topic");
    }
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    assert_eq!(producer.stats(), ProducerStats::default(), "nothing yet");

    // MESSAGE_TOO_LARGE (10) is not retriable: the record fails at once.
    m.push_request_errors(api_key::PRODUCE, &[10]);
    let refused = producer
        .send(record("stats.refused", 0))
        .await
        .expect("send")
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        producer.stats().retries,
        0,
        "a refused batch is not sent again"
    );

    // NOT_ENOUGH_REPLICAS (19) is retriable: the one batch goes again, and is written.
    m.push_request_errors(api_key::PRODUCE, &[19]);
    producer
        .send(record("stats.retried", 0))
        .await
        .expect("send")
        .await
        .expect("written on its second attempt");
    assert_eq!(producer.stats().retries, 1, "{:?}", producer.stats());

    let mut deliveries = Vec::new();
    for i in 0..30 {
        deliveries.push(producer.send(record("stats.a", i)).await.expect("send"));
    }
    for i in 0..20 {
        deliveries.push(producer.send(record("stats.b", i)).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }

    let stats = producer.stats();
    let a = stats.topic("stats.a").expect("stats.a");
    assert_eq!(
        (a.records, a.bytes),
        (30, bytes_of(30, 0) + bytes_of(30, 1))
    );
    assert!(a.errors.is_empty(), "{a:?}");
    let b = stats.topic("stats.b").expect("stats.b");
    assert_eq!(
        (b.records, b.bytes),
        (20, bytes_of(20, 0) + bytes_of(20, 1))
    );
    let r = stats.topic("stats.refused").expect("stats.refused");
    assert_eq!(r.records, 0);
    assert_eq!(r.errors, vec![("MessageTooLarge".to_string(), 1)], "{r:?}");
    assert_eq!((stats.records, stats.errors), (51, 1), "{stats:?}");
    let retried = stats.topic("stats.retried").expect("stats.retried");
    assert_eq!((retried.records, stats.retries), (1, 1), "{stats:?}");
    assert_eq!(stats.bytes, a.bytes + b.bytes + retried.bytes);
    assert_eq!(
        (stats.pending_records, stats.buffered_bytes),
        (0, 0),
        "{stats:?}"
    );
    producer.close().await;
}
