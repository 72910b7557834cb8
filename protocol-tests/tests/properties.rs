//! A consumer configured only by property names (librdkafka's and Java's, as people
//! keep them in a properties file) joins a group and reads every record librdkafka
//! wrote, once, byte-identical. On the librdkafka mock cluster and on tansu.

use std::collections::BTreeSet;
use std::time::Duration;

use ottla::ConsumerBuilder;
use ottla::consumer::TopicPartition;
use protocol_tests::data::{index_of, matches, produce};
use protocol_tests::peer::Peer;

async fn consume_from_properties(peer: Peer, group: &str) {
    protocol_tests::init_tracing();
    let topic = "configured-by-name";
    let partitions = 3;
    let total: u64 = 3_000;
    peer.create_topic(topic, partitions).expect("topic");
    produce(&peer.bootstrap(), topic, partitions, 0, total, "lz4")
        .await
        .expect("produce");

    let bootstrap = peer.bootstrap();
    let consumer = ConsumerBuilder::from_properties([
        // librdkafka spellings ...
        ("metadata.broker.list", bootstrap.as_str()),
        ("auto.offset.reset", "smallest"),
        ("fetch.wait.max.ms", "100"),
        ("partition.assignment.strategy", "cooperative-sticky"),
        // ... Java spellings ...
        ("group.id", group),
        ("client.id", "configured-by-name"),
        ("session.timeout.ms", "6000"),
        ("heartbeat.interval.ms", "500"),
        ("max.poll.interval.ms", "20000"),
        ("enable.auto.commit", "false"),
        ("max.partition.fetch.bytes", "16384"),
        (
            "key.deserializer",
            "org.apache.kafka.common.serialization.ByteArrayDeserializer",
        ),
        // ... a librdkafka key that means nothing to ottla, and ottla's own name for
        // the subscription, which neither client has a property for.
        ("statistics.interval.ms", "1000"),
        ("ottla.topics", topic),
    ])
    .expect("properties");
    let ignored: Vec<&str> = consumer
        .ignored_properties()
        .iter()
        .map(|i| i.key.as_str())
        .collect();
    assert_eq!(ignored, ["key.deserializer", "statistics.interval.ms"]);

    let mut consumer = consumer.build().await.expect("consumer");
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while (seen.len() as u64) < total {
        let record = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .expect("every record within 60 s")
            .expect("stream open")
            .expect("record");
        let i = index_of(record.partition(), record.offset(), partitions);
        assert!(
            i < total && matches(i, record.key(), record.value(), &record.headers_owned()),
            "{record:?}"
        );
        assert!(seen.insert(i), "record {i} delivered twice");
    }
    consumer.commit().await.expect("commit");
    for p in 0..partitions {
        let tp = TopicPartition::new(topic, p);
        assert_eq!(
            consumer.committed(&tp),
            Some(total as i64 / i64::from(partitions)),
            "{tp:?}"
        );
    }
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_consumer_built_from_properties_alone_reads_every_record() {
    let peer = Peer::mock(3).expect("mock cluster");
    if let Peer::Mock(m) = &peer {
        m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    }
    consume_from_properties(peer, "by-name-mock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_consumer_built_from_properties_alone_reads_every_record() {
    consume_from_properties(Peer::tansu().expect("tansu"), "by-name-tansu").await;
}
