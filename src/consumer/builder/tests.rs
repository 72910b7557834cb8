//! `ConsumerBuilder::set` by Java and librdkafka names: both spellings land on the
//! same fields.

use std::time::Duration;

use super::*;

fn java() -> ConsumerBuilder {
    ConsumerBuilder::from_properties([
        ("bootstrap.servers", "a:1,b:2"),
        ("group.id", "billing"),
        ("group.instance.id", "billing-0"),
        ("client.id", "svc"),
        ("session.timeout.ms", "45000"),
        ("heartbeat.interval.ms", "3000"),
        ("max.poll.interval.ms", "120000"),
        ("auto.offset.reset", "earliest"),
        ("enable.auto.commit", "true"),
        ("auto.commit.interval.ms", "2500"),
        (
            "partition.assignment.strategy",
            "org.apache.kafka.clients.consumer.CooperativeStickyAssignor, org.apache.kafka.clients.consumer.RangeAssignor",
        ),
        ("isolation.level", "read_committed"),
        ("fetch.min.bytes", "1024"),
        ("fetch.max.wait.ms", "250"),
        ("fetch.max.bytes", "1048576"),
        ("max.partition.fetch.bytes", "65536"),
        ("check.crcs", "false"),
        ("ottla.topics", "orders,refunds"),
    ])
    .unwrap()
}

fn librdkafka() -> ConsumerBuilder {
    ConsumerBuilder::from_properties([
        ("metadata.broker.list", "a:1,b:2"),
        ("group.id", "billing"),
        ("group.instance.id", "billing-0"),
        ("client.id", "svc"),
        ("session.timeout.ms", "45000"),
        ("heartbeat.interval.ms", "3000"),
        ("max.poll.interval.ms", "120000"),
        ("auto.offset.reset", "smallest"),
        // The interval before the switch: the order does not matter.
        ("auto.commit.interval.ms", "2500"),
        ("enable.auto.commit", "true"),
        ("partition.assignment.strategy", "cooperative-sticky,range"),
        ("isolation.level", "read_committed"),
        ("fetch.min.bytes", "1024"),
        ("fetch.wait.max.ms", "250"),
        ("fetch.max.bytes", "1048576"),
        ("fetch.message.max.bytes", "65536"),
        ("check.crcs", "false"),
        ("ottla.topics", "orders,refunds"),
    ])
    .unwrap()
}

#[test]
fn java_and_librdkafka_names_set_the_same_fields() {
    for b in [java(), librdkafka()] {
        assert_eq!(b.client.bootstrap_servers, ["a:1", "b:2"]);
        assert_eq!(b.client.client_id, "svc");
        assert_eq!(b.group_id.as_deref(), Some("billing"));
        assert_eq!(b.instance_id.as_deref(), Some("billing-0"));
        assert_eq!(b.topics, ["orders", "refunds"]);
        assert_eq!(b.session_timeout, Duration::from_secs(45));
        assert_eq!(b.heartbeat_interval, Duration::from_secs(3));
        assert_eq!(b.max_poll_interval, Duration::from_secs(120));
        assert_eq!(b.fetcher.reset, OffsetReset::Earliest);
        assert_eq!(b.auto_commit, Some(Duration::from_millis(2500)));
        let names: Vec<&str> = b.assignors.iter().map(|a| a.name()).collect();
        assert_eq!(names, ["cooperative-sticky", "range"]);
        assert_eq!(b.fetcher.params.isolation, IsolationLevel::ReadCommitted);
        assert_eq!(b.fetcher.params.min_bytes, 1024);
        assert_eq!(b.fetcher.params.max_wait_ms, 250);
        assert_eq!(b.fetcher.params.max_bytes, 1_048_576);
        assert_eq!(b.fetcher.partition_max_bytes, 65_536);
        assert!(!b.fetcher.batch.check_crcs);
        assert!(
            b.ignored_properties().is_empty(),
            "{:?}",
            b.ignored_properties()
        );
        b.validate().unwrap();
    }
}

#[test]
fn auto_commit_follows_the_switch_whatever_the_order() {
    let b = ConsumerBuilder::new("h:1")
        .set("enable.auto.commit", "true")
        .unwrap();
    assert_eq!(b.auto_commit, Some(Duration::from_secs(5)));
    let b = b.set("auto.commit.interval.ms", "100").unwrap();
    assert_eq!(b.auto_commit, Some(Duration::from_millis(100)));
    let b = b.set("enable.auto.commit", "false").unwrap();
    assert_eq!(b.auto_commit, None);
    // A typed interval survives the property switch.
    let b = ConsumerBuilder::new("h:1")
        .auto_commit(Some(Duration::from_secs(9)))
        .set("enable.auto.commit", "true")
        .unwrap();
    assert_eq!(b.auto_commit, Some(Duration::from_secs(9)));
}

#[test]
fn librdkafka_only_names_and_ottla_names() {
    let b = ConsumerBuilder::new("h:1")
        .set("queued.max.messages.kbytes", "2048")
        .unwrap()
        .set("auto.offset.reset", "error")
        .unwrap()
        .set("ottla.fetch.sessions", "false")
        .unwrap()
        .set("partition.assignment.strategy", "roundrobin")
        .unwrap()
        .set("group.protocol", "consumer")
        .unwrap()
        .set("socket.timeout.ms", "7000")
        .unwrap();
    assert_eq!(b.fetcher.buffer_max_bytes, 2048 * 1024);
    assert_eq!(b.fetcher.reset, OffsetReset::None);
    assert!(!b.fetcher.sessions);
    assert_eq!(b.assignors.len(), 1);
    assert_eq!(b.assignors[0].name(), "roundrobin");
    assert_eq!(b.group_protocol, GroupProtocol::Consumer);
    assert_eq!(b.client.request_timeout, Duration::from_secs(7));
}

#[test]
fn default_assignors_share_one_with_every_common_client_and_upgrade_after_the_hold() {
    let b = ConsumerBuilder::new("k:9092");
    let names: Vec<&str> = b.assignors.iter().map(|a| a.name()).collect();
    assert_eq!(names, ["cooperative-sticky", "range", "roundrobin"]);
    assert_eq!(
        b.cooperative_upgrade_hold(),
        Some(DEFAULT_COOPERATIVE_UPGRADE)
    );
    // A list the application chose keeps the Java client's rule...
    let chosen = ConsumerBuilder::new("k:9092")
        .assignors(["cooperative-sticky", "range"])
        .unwrap();
    assert_eq!(chosen.cooperative_upgrade_hold(), None);
    let by_name = ConsumerBuilder::new("k:9092")
        .set("partition.assignment.strategy", "range,cooperative-sticky")
        .unwrap();
    assert_eq!(by_name.cooperative_upgrade_hold(), None);
    // ... unless it asks for the second bounce; and the default can be turned off.
    let asked = ConsumerBuilder::new("k:9092")
        .set("partition.assignment.strategy", "cooperative-sticky,range")
        .unwrap()
        .set("ottla.cooperative.upgrade.ms", "5000")
        .unwrap();
    assert_eq!(
        asked.cooperative_upgrade_hold(),
        Some(Duration::from_secs(5))
    );
    let never = ConsumerBuilder::new("k:9092")
        .set("ottla.cooperative.upgrade.ms", "-1")
        .unwrap();
    assert_eq!(never.cooperative_upgrade_hold(), None);
    assert!(
        ConsumerBuilder::new("k:9092")
            .set("ottla.cooperative.upgrade.ms", "soon")
            .is_err()
    );
}
