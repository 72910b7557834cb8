//! `ProducerBuilder::set` by Java and librdkafka names.

use std::time::Duration;

use super::*;

#[test]
fn java_and_librdkafka_names_set_the_same_fields() {
    let java = ProducerBuilder::from_properties([
        ("bootstrap.servers", "h:1"),
        ("acks", "1"),
        ("linger.ms", "20"),
        ("batch.size", "65536"),
        ("compression.type", "zstd"),
        ("enable.idempotence", "false"),
        ("buffer.memory", "8388608"),
        ("delivery.timeout.ms", "60000"),
        ("max.block.ms", "1000"),
        ("max.request.size", "2097152"),
    ])
    .unwrap();
    let librdkafka = ProducerBuilder::from_properties([
        ("metadata.broker.list", "h:1"),
        ("request.required.acks", "1"),
        ("queue.buffering.max.ms", "20"),
        ("batch.size", "65536"),
        ("compression.codec", "zstd"),
        ("enable.idempotence", "false"),
        ("queue.buffering.max.kbytes", "8192"),
        ("message.timeout.ms", "60000"),
        ("max.block.ms", "1000"),
        ("message.max.bytes", "2097152"),
    ])
    .unwrap();
    for b in [java, librdkafka] {
        assert_eq!(b.client.bootstrap_servers, ["h:1"]);
        assert_eq!(b.config.acks, Acks::Leader);
        assert_eq!(b.config.linger, Duration::from_millis(20));
        assert_eq!(b.config.batch_size, 65_536);
        assert_eq!(b.config.compression, Compression::Zstd);
        assert!(!b.config.idempotence);
        assert_eq!(b.config.buffer_memory, 8 * 1024 * 1024);
        assert_eq!(b.config.delivery_timeout, Duration::from_secs(60));
        assert_eq!(b.max_block, Duration::from_secs(1));
        assert_eq!(b.config.max_request_size, 2 * 1024 * 1024);
        assert!(b.ignored_properties().is_empty());
    }
    for (value, acks) in [("all", Acks::All), ("-1", Acks::All), ("0", Acks::None)] {
        let b = ProducerBuilder::new("h:1").set("acks", value).unwrap();
        assert_eq!(b.config.acks, acks);
    }
}

#[test]
fn transactional_id_and_timeout_by_name() {
    let b = ProducerBuilder::from_properties([
        ("bootstrap.servers", "h:1"),
        ("transactional.id", "tx-7"),
        ("transaction.timeout.ms", "15000"),
    ])
    .unwrap();
    assert_eq!(b.config.transactional_id.as_deref(), Some("tx-7"));
    assert_eq!(b.transaction_timeout, Duration::from_secs(15));
    assert!(b.ignored_properties().is_empty());
    let typed = ProducerBuilder::new("h:1")
        .transactional_id("tx-7")
        .transaction_timeout(Duration::from_secs(15));
    assert_eq!(typed.config.transactional_id.as_deref(), Some("tx-7"));
    assert_eq!(typed.transaction_timeout, Duration::from_secs(15));
}
