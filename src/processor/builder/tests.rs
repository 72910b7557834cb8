//! `ProcessorBuilder::set`: the Processor's own names, and the routing of the
//! others to its consumer and dead-letter producer.

use std::time::Duration;

use super::*;

#[test]
fn a_processor_is_built_from_properties_alone() {
    let b = ProcessorBuilder::from_properties([
        ("bootstrap.servers", "h:1"),
        ("group.id", "billing"),
        ("ottla.topics", "orders"),
        ("session.timeout.ms", "10000"),
        ("heartbeat.interval.ms", "1000"),
        ("max.poll.interval.ms", "600000"),
        ("client.id", "svc"),
        ("auto.offset.reset", "earliest"),
        ("acks", "1"),
        ("enable.auto.commit", "true"),
        ("ottla.concurrency", "4"),
        ("ottla.commit.interval.ms", "0"),
        ("ottla.processing.budget.ms", "5000"),
        ("ottla.shutdown.timeout.ms", "20000"),
        ("ottla.acquiesce.share", "0.25"),
        ("ottla.check.topics", "false"),
        ("ottla.dlq.suffix", ".dead"),
        ("ottla.retry.topics", "30000, 300000"),
        ("ottla.max.retries", "5"),
        ("ottla.initial.retry.delay.ms", "200"),
        ("ottla.max.retry.delay.ms", "10000"),
        ("ottla.retry.backoff.multiplier", "3"),
        ("ottla.retry.jitter", "false"),
        ("ottla.retry.min.delay.ms", "50"),
    ])
    .unwrap();
    assert_eq!(b.lanes.group, "billing");
    assert_eq!(b.topics, ["orders"]);
    assert_eq!(
        b.consumer.group_timeouts(),
        (
            Duration::from_secs(10),
            Duration::from_secs(1),
            Duration::from_secs(600)
        )
    );
    assert_eq!(b.consumer.client().client_id, "svc");
    assert_eq!(b.producer.client().client_id, "svc");
    assert_eq!(b.lanes.concurrency, 4);
    assert_eq!(b.lanes.commit_interval, None);
    assert_eq!(b.processing_budget, Duration::from_secs(5));
    assert_eq!(b.shutdown_timeout, Duration::from_secs(20));
    assert_eq!(b.acquiesce_share, 0.25);
    assert!(!b.check_topics);
    assert_eq!(b.lanes.dlq_suffix, ".dead");
    assert_eq!(
        b.lanes.retry_delays,
        [Duration::from_secs(30), Duration::from_secs(300)]
    );
    let backoff = &b.lanes.policy.default;
    assert_eq!(backoff.max_retries, 5);
    assert_eq!(backoff.initial, Duration::from_millis(200));
    assert_eq!(backoff.max, Duration::from_secs(10));
    assert_eq!(backoff.multiplier, 3.0);
    assert!(!backoff.jitter);
    assert_eq!(backoff.min_delay, Duration::from_millis(50));
    // The Processor commits itself: the consumer's auto-commit switch is reported.
    let ignored: Vec<&str> = b
        .ignored_properties()
        .iter()
        .map(|i| i.key.as_str())
        .collect();
    assert_eq!(ignored, ["enable.auto.commit"]);
    b.validate().unwrap();

    let err = ProcessorBuilder::from_properties([("ottla.concurency", "4")]).unwrap_err();
    assert!(
        err.to_string().contains("did you mean ottla.concurrency?"),
        "{err}"
    );
    let err = ProcessorBuilder::from_properties([("ottla.retry.topics", "30s")]).unwrap_err();
    assert!(
        err.to_string().contains("ottla.retry.topics: \"30s\""),
        "{err}"
    );
}

#[test]
fn the_group_timeouts_have_one_home_whichever_way_they_are_set() {
    // They lived twice: in the ProcessorBuilder and in its ConsumerBuilder, and
    // `build` overwrote what `.consumer(|c| ...)` had set with the Processor's copy,
    // silently. Now the consumer's builder holds them; the last call wins.
    let b = ProcessorBuilder::new("h:1", "g", ["t"]).consumer(|c| {
        c.session_timeout(Duration::from_secs(12))
            .heartbeat_interval(Duration::from_secs(2))
    });
    assert_eq!(
        b.consumer.group_timeouts(),
        (
            Duration::from_secs(12),
            Duration::from_secs(2),
            Duration::from_secs(300)
        )
    );
    b.validate().unwrap();
    // Through the consumer's builder, the Processor's check of the progress window
    // sees it (it used to check its own copy, still at the default 300 s).
    let b = ProcessorBuilder::new("h:1", "g", ["t"])
        .consumer(|c| c.max_poll_interval(Duration::from_secs(1)));
    let err = b.validate().unwrap_err().to_string();
    assert!(err.contains("max.poll.interval.ms"), "{err}");
    // And a heartbeat above the session is refused, whichever builder set it.
    let b = ProcessorBuilder::new("h:1", "g", ["t"])
        .consumer(|c| c.heartbeat_interval(Duration::from_secs(60)));
    let err = b.validate().unwrap_err().to_string();
    assert!(err.contains("heartbeat.interval.ms"), "{err}");
    // The Processor's own calls write to the same place.
    let b = ProcessorBuilder::new("h:1", "g", ["t"])
        .consumer(|c| c.session_timeout(Duration::from_secs(12)))
        .timeouts(
            Duration::from_secs(20),
            Duration::from_secs(3),
            Duration::from_secs(400),
        )
        .set("max.poll.interval.ms", "500000")
        .unwrap();
    assert_eq!(
        b.consumer.group_timeouts(),
        (
            Duration::from_secs(20),
            Duration::from_secs(3),
            Duration::from_secs(500)
        )
    );
}

#[test]
fn processor_from_env() {
    let b = ProcessorBuilder::from_env_vars(
        "APP_",
        [
            ("APP_BOOTSTRAP_SERVERS", "h:1"),
            ("APP_GROUP_ID", "g"),
            ("APP_OTTLA_TOPICS", "t"),
            ("APP_OTTLA_MAX_RETRIES", "1"),
        ],
    )
    .unwrap();
    assert_eq!(
        (b.lanes.group.as_str(), b.topics.as_slice()),
        ("g", &["t".to_string()][..])
    );
    assert_eq!(b.lanes.policy.default.max_retries, 1);
}
