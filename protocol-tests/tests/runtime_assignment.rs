//! A consumer without a group changes its assignment while it runs (librdkafka's
//! `assign`, `incremental_assign`, `incremental_unassign`), on the mock and on tansu:
//! partitions added are read from `auto.offset.reset`, partitions that stay keep their
//! positions (nothing read twice), partitions removed are read no more, and a topic
//! the consumer had not heard of joins its metadata.

use std::collections::BTreeMap;
use std::time::Duration;

use ottla::Error;
use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use protocol_tests::data::{index_of, produce};
use protocol_tests::peer::Peer;

/// Reads for `within`, or until `want` records came: records by (topic, index).
async fn read(
    consumer: &mut Consumer,
    seen: &mut BTreeMap<(String, u64), u32>,
    want: usize,
    within: Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    while seen.len() < want && tokio::time::Instant::now() < deadline {
        if let Ok(batch) =
            tokio::time::timeout(Duration::from_millis(300), consumer.recv_batch(500)).await
        {
            for r in batch.expect("records") {
                *seen
                    .entry((
                        r.topic().to_string(),
                        index_of(r.partition(), r.offset(), 1),
                    ))
                    .or_default() += 1;
            }
        }
    }
}

fn count(seen: &BTreeMap<(String, u64), u32>, topic: &str) -> usize {
    seen.keys().filter(|(t, _)| t == topic).count()
}

async fn assignment_changes_at_run_time(peer: Peer) {
    protocol_tests::init_tracing();
    let bootstrap = peer.bootstrap();
    for t in ["ra-a", "ra-b"] {
        peer.create_topic(t, 1).expect("topic");
    }
    produce(&bootstrap, "ra-a", 1, 0, 300, "none")
        .await
        .expect("produce");
    produce(&bootstrap, "ra-b", 1, 0, 200, "none")
        .await
        .expect("produce");
    let a = TopicPartition::new("ra-a", 0);
    let b = TopicPartition::new("ra-b", 0);
    // Nothing assigned at first: the consumer reads nothing.
    let mut consumer = Consumer::builder(&bootstrap)
        .assign([])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("consumer");
    let mut seen = BTreeMap::new();
    read(&mut consumer, &mut seen, 1, Duration::from_millis(500)).await;
    assert!(seen.is_empty());

    consumer
        .incremental_assign(std::slice::from_ref(&a))
        .expect("assign a");
    read(&mut consumer, &mut seen, 300, Duration::from_secs(30)).await;
    assert_eq!(
        count(&seen, "ra-a"),
        300,
        "{}: a, from the start",
        peer.name()
    );

    // b was never in the consumer's metadata.
    consumer
        .incremental_assign(std::slice::from_ref(&b))
        .expect("assign b");
    read(&mut consumer, &mut seen, 500, Duration::from_secs(30)).await;
    assert_eq!(
        count(&seen, "ra-b"),
        200,
        "{}: b, from the start",
        peer.name()
    );
    assert_eq!(consumer.assignment(), vec![a.clone(), b.clone()]);

    // a goes: its new records are not read; b stays and keeps its position.
    consumer
        .incremental_unassign(std::slice::from_ref(&a))
        .expect("unassign a");
    produce(&bootstrap, "ra-a", 1, 300, 100, "none")
        .await
        .expect("produce");
    produce(&bootstrap, "ra-b", 1, 200, 100, "none")
        .await
        .expect("produce");
    read(&mut consumer, &mut seen, 600, Duration::from_secs(30)).await;
    read(&mut consumer, &mut seen, 601, Duration::from_secs(1)).await;
    assert_eq!(count(&seen, "ra-a"), 300, "{}: a read no more", peer.name());
    assert_eq!(
        count(&seen, "ra-b"),
        300,
        "{}: b's new records",
        peer.name()
    );

    // assign replaces: b stays where it is, a comes back from auto.offset.reset
    // (earliest: a's 400 records, its first 300 for the second time).
    consumer.assign(&[b.clone(), a.clone()]).expect("assign");
    produce(&bootstrap, "ra-b", 1, 300, 50, "none")
        .await
        .expect("produce");
    let mut again = BTreeMap::new();
    read(&mut consumer, &mut again, 450, Duration::from_secs(30)).await;
    read(&mut consumer, &mut again, 451, Duration::from_secs(1)).await;
    assert_eq!(
        count(&again, "ra-a"),
        400,
        "{}: a from the start again",
        peer.name()
    );
    assert_eq!(
        count(&again, "ra-b"),
        50,
        "{}: b only its new records",
        peer.name()
    );
    assert!(seen.values().chain(again.values()).all(|n| *n == 1));
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_manual_assignment_changes_while_the_consumer_runs() {
    assignment_changes_at_run_time(Peer::mock(1).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_a_manual_assignment_changes_while_the_consumer_runs() {
    assignment_changes_at_run_time(Peer::tansu().expect("tansu")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_group_member_refuses_a_manual_assignment() {
    let peer = Peer::mock(1).expect("mock");
    peer.create_topic("ra-g", 1).expect("topic");
    let consumer = Consumer::builder(&peer.bootstrap())
        .group_id("ra-g")
        .topics(["ra-g"])
        .build()
        .await
        .expect("consumer");
    let err = consumer
        .incremental_assign(&[TopicPartition::new("ra-g", 0)])
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Config {
                setting: "group.id",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("without a group"), "{err}");
    consumer.close().await.expect("close");
}

#[tokio::test]
async fn a_consumer_without_a_group_or_an_assignment_is_still_refused() {
    // Refused before connecting: nothing listens there.
    let err = Consumer::builder("127.0.0.1:1").build().await.unwrap_err();
    assert!(err.to_string().contains("assign([])"), "{err}");
}
