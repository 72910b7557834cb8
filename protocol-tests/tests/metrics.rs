//! The `metrics` feature against the mock: a known workload through a Processor, read
//! back from a recorder installed in the test, counter by counter. (The recorder is
//! the harness's, behind protocol-tests' `metrics` feature, which is on by default.)
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use ottla::processor::{Metric, MetricsLog, ProcessError, Processor, RetryBackoff, RetryPolicy};
use ottla::producer::{Producer, ProducerRecord};
use ottla::telemetry::names;
use protocol_tests::kept::{Kept, Values};
use protocol_tests::peer::Peer;

/// The value under `name` whose labels include every pair of `labels`, summed over the
/// other labels.
fn sum(values: &Values, name: &str, labels: &[(&str, &str)]) -> f64 {
    values
        .iter()
        .filter(|((n, ls), _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| ls.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, v)| *v)
        .sum()
}

/// The process's recorder, installed by the first test that asks (nextest runs each
/// test in a process of its own; under `cargo test` the tests share it, and each
/// reads only its own topic's and group's labels).
fn recorder() -> &'static Kept {
    Kept::install().expect("the test's recorder")
}

const RECORDS: u32 = 40;

/// Record `i`: every 10th from 3 fails transiently on every attempt (2 retries, then
/// the dead-letter topic), every 10th from 7 is rejected at once; the rest succeed.
fn outcome(i: u32) -> Result<(), ProcessError> {
    match i % 10 {
        3 => Err(ProcessError::transient("Timeout", "the service timed out")),
        7 => Err(ProcessError::permanent("Rejected", "over the credit limit")),
        _ => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_known_workload_gives_exact_counters() {
    protocol_tests::init_tracing();
    let kept = recorder();

    let peer = Peer::mock(1).expect("mock");
    let (topic, group) = ("metered", "metered-group");
    peer.create_topic(topic, 2).expect("topic");
    peer.create_topic(&format!("{topic}.dlq"), 1).expect("dlq");
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for i in 0..RECORDS {
        let r = ProducerRecord::new(topic)
            .key(format!("k{i}"))
            .value(i.to_string());
        deliveries.push(producer.send(r).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }
    let produced = producer.stats();
    producer.close().await;

    if let Peer::Mock(m) = &peer {
        m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    }
    let log = MetricsLog::default();
    let policy = RetryPolicy {
        default: RetryBackoff {
            max_retries: 2,
            initial: Duration::from_millis(20),
            max: Duration::from_millis(40),
            multiplier: 2.0,
            jitter: false,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    };
    let processor = Processor::builder(&peer.bootstrap(), group, [topic.to_string()])
        .retry_policy(policy)
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(20),
        )
        .processing_budget(Duration::from_secs(5))
        // Only the commit at shutdown: one per partition.
        .commit_interval(Some(Duration::from_secs(3600)))
        .metrics(log.hook())
        .metrics_prefix("shop.billing")
        .consumer(|c| {
            c.offset_reset(OffsetReset::Earliest)
                .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
        })
        .build()
        .await
        .expect("processor");
    let succeeded = Arc::new(AtomicUsize::new(0));
    let s = succeeded.clone();
    let l = log.clone();
    // The handle's live counters, read while the processor runs: they reach the
    // workload's figures before it is stopped.
    let handle = processor.handle();
    assert_eq!(handle.stats(), Default::default(), "zero before run");
    let (h, live) = (handle.clone(), Arc::new(std::sync::Mutex::new(None)));
    let seen_live = live.clone();
    let done = async move {
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let dlq = l
                .snapshot()
                .iter()
                .filter(|m| matches!(m, Metric::DeadLettered { .. }))
                .count();
            let stats = h.stats();
            if stats.succeeded + stats.dead_lettered >= u64::from(RECORDS) {
                *seen_live.lock().unwrap() = Some(stats);
            }
            if (s.load(Ordering::Relaxed) + dlq >= RECORDS as usize
                && seen_live.lock().unwrap().is_some())
                || started.elapsed() > Duration::from_secs(60)
            {
                return;
            }
        }
    };
    let stats = processor
        .run(
            move |record, _cancel| {
                let i: u32 = std::str::from_utf8(record.value().unwrap_or_default())
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let result = outcome(i);
                if result.is_ok() {
                    s_inc(&succeeded);
                }
                async move { result }
            },
            done,
        )
        .await
        .expect("run");
    assert_eq!((stats.succeeded, stats.dead_lettered), (32, 8), "{stats:?}");
    let live = live
        .lock()
        .unwrap()
        .clone()
        .expect("the live counters reached 40");
    assert_eq!(
        (live.succeeded, live.dead_lettered, live.retries),
        (32, 8, 8),
        "read through the handle while running"
    );
    assert_eq!(
        handle.stats(),
        stats,
        "the handle ends with what run returned"
    );

    let v = kept.values();
    let shown = format!("{v:#?}");
    let p = |suffix: &str| format!("shop.billing.{suffix}");
    let g = ("group", group);
    let check = |name: &str, labels: &[(&str, &str)], want: f64| {
        assert_eq!(sum(&v, name, labels), want, "{name} {labels:?} in\n{shown}");
    };
    check(&p(names::PROCESSED), &[g, ("status", "success")], 32.0);
    check(&p(names::PROCESSED), &[g, ("status", "failure")], 8.0);
    // One observation per handler call: at least one, at most one per attempt (32
    // successes, 3 attempts of each of the 4 that time out, 1 of each of the 4
    // rejected); how records share a call depends on how they arrive.
    let calls = sum(&v, &p(names::PROCESSING_DURATION), &[g]);
    assert!((1.0..=48.0).contains(&calls), "{calls} handler calls timed");
    check(&p(names::RETRY_COUNT), &[g, ("retry_attempt", "1")], 4.0);
    check(&p(names::RETRY_COUNT), &[g, ("retry_attempt", "2")], 4.0);
    check(&p(names::RETRY_DELAY), &[g, ("retry_attempt", "2")], 4.0);
    let timeout = [
        g,
        ("error_type", "Timeout"),
        ("error_classification", "retryable"),
    ];
    let rejected = [
        g,
        ("error_type", "Rejected"),
        ("error_classification", "non-retryable"),
    ];
    check(&p(names::ERROR_COUNT), &timeout, 12.0);
    check(&p(names::ERROR_COUNT), &rejected, 4.0);
    check(&p(names::DLQ_COUNT), &timeout, 4.0);
    check(&p(names::DLQ_COUNT), &rejected, 4.0);
    // One commit at shutdown, of both partitions' offsets (`Stats::commits` counts
    // the request; the metric counts partitions).
    assert_eq!(stats.commits, 1, "{stats:?}");
    check(&p(names::COMMITS), &[g], 2.0);
    check(&p(names::PARTITIONS_HALTED), &[g], 0.0);

    // The consumer under it: every record handed over once, one generation, the
    // backlog drained, both partitions committed.
    check(
        names::CONSUMER_RECORDS,
        &[g, ("topic", topic)],
        RECORDS as f64,
    );
    check(names::CONSUMER_REBALANCES, &[g], 1.0);
    check(names::CONSUMER_LAG, &[g, ("topic", topic)], 0.0);
    check(names::CONSUMER_PARTITIONS_LOST, &[g], 0.0);
    // Counted before the commit's caller hears of it, so the shutdown commit is in.
    check(names::CONSUMER_COMMITS, &[g, ("result", "ok")], 1.0);
    // The test's producer wrote the topic; the Processor's wrote the dead letters.
    check(names::PRODUCER_RECORDS, &[("topic", topic)], RECORDS as f64);
    check(
        names::PRODUCER_RECORDS,
        &[("topic", &format!("{topic}.dlq"))],
        8.0,
    );
    // `Producer::stats()` carries the same figure.
    assert_eq!(
        produced.topic(topic).map(|t| t.records as f64),
        Some(sum(&v, names::PRODUCER_RECORDS, &[("topic", topic)]))
    );
    assert_eq!(produced.errors, 0, "{produced:?}");
    // One rebalance timed; the lanes empty at the end; every batch written measured,
    // and every Fetch and Produce answer's throttle time.
    check(names::CONSUMER_REBALANCE_DURATION, &[g], 1.0);
    check(&p(names::QUEUE_DEPTH), &[g], 0.0);
    assert!(
        v.keys().any(|(n, _)| n == &p(names::QUEUE_DEPTH)),
        "the queue depth is registered"
    );
    assert!(sum(&v, names::PRODUCER_BATCH_SIZE, &[]) >= 2.0, "{shown}");
    assert!(
        v.keys().any(|(n, _)| n == names::PRODUCER_RETRIES),
        "the producer retries counter is registered"
    );
    assert_eq!(
        sum(&v, names::REQUEST_THROTTLE, &[("api", "Fetch")]),
        sum(&v, names::REQUESTS, &[("api", "Fetch")]),
        "a throttle time from every Fetch answer"
    );
    assert!(sum(&v, names::REQUEST_THROTTLE, &[("api", "Produce")]) >= 1.0);
    assert!(sum(&v, names::REQUESTS, &[("api", "Fetch")]) >= 1.0);
    assert!(sum(&v, names::REQUEST_DURATION, &[("api", "JoinGroup")]) >= 1.0);
    assert!(sum(&v, names::CONNECTIONS, &[]) >= 1.0);
}

fn s_inc(n: &AtomicUsize) {
    n.fetch_add(1, Ordering::Relaxed);
}

/// A backlog drained 200 records at a time: the lag gauge of each partition is known
/// from the first batch on, equals `Consumer::lag` after every batch, never rises
/// (nothing is produced meanwhile), and ends at 0.
async fn lag_drains(peer: Peer) {
    protocol_tests::init_tracing();
    let kept = recorder();
    let topic = format!("lagging-{}", peer.name());
    let group = format!("lag-watcher-{}", peer.name());
    let partitions = 2;
    let count = 2000u32;
    peer.create_topic(&topic, partitions).expect("topic");
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for i in 0..count {
        let r = ProducerRecord::new(&topic)
            .key(format!("k{i}"))
            .value(vec![b'x'; 100]);
        deliveries.push(producer.send(r).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }
    producer.close().await;

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
    let gauge = |p: i32| {
        let v = kept.values();
        let key = (
            names::CONSUMER_LAG.to_string(),
            vec![
                ("group".to_string(), group.clone()),
                ("partition".to_string(), p.to_string()),
                ("topic".to_string(), topic.clone()),
            ],
        );
        v.get(&key).copied()
    };
    let mut read = 0;
    let mut last: BTreeMap<i32, f64> = BTreeMap::new();
    let mut first: BTreeMap<i32, f64> = BTreeMap::new();
    let mut samples = 0;
    while read < count as usize {
        let batch = tokio::time::timeout(Duration::from_secs(30), consumer.recv_batch(200))
            .await
            .expect("records in time")
            .expect("records");
        read += batch.len();
        for p in 0..partitions {
            let (Some(shown), Some(known)) =
                (gauge(p), consumer.lag(&TopicPartition::new(&topic, p)))
            else {
                continue;
            };
            assert_eq!(
                shown, known as f64,
                "partition {p}: the gauge is the consumer's lag"
            );
            first.entry(p).or_insert(shown);
            if let Some(before) = last.insert(p, shown) {
                assert!(
                    shown <= before,
                    "partition {p}: lag rose from {before} to {shown}"
                );
            }
            samples += 1;
        }
    }
    assert_eq!(read, count as usize, "every record once");
    assert!(
        samples >= 4,
        "the lag was seen while draining ({samples} samples)"
    );
    assert!(
        first.values().any(|lag| *lag > 0.0),
        "a backlog was seen at the start: {first:?}"
    );
    for p in 0..partitions {
        assert_eq!(gauge(p), Some(0.0), "partition {p} drained: {last:?}");
    }
    let v = kept.values();
    assert_eq!(
        sum(
            &v,
            names::CONSUMER_RECORDS,
            &[("group", &group), ("topic", &topic)]
        ),
        count as f64
    );
    assert_eq!(
        sum(
            &v,
            names::CONSUMER_BYTES,
            &[("group", &group), ("topic", &topic)]
        ),
        // Key "k{i}" plus a 100-byte value.
        (0..count)
            .map(|i| format!("k{i}").len() as f64 + 100.0)
            .sum::<f64>()
    );
    // `Consumer::stats()` carries the metrics' figures, partition by partition.
    let stats = consumer.stats();
    for p in 0..partitions {
        let partition = p.to_string();
        let l = [
            ("group", group.as_str()),
            ("topic", topic.as_str()),
            ("partition", partition.as_str()),
        ];
        let s = stats.partition(&topic, p).expect("partition");
        assert_eq!(
            s.records as f64,
            sum(&v, names::CONSUMER_RECORDS, &l),
            "partition {p}"
        );
        assert_eq!(
            s.bytes as f64,
            sum(&v, names::CONSUMER_BYTES, &l),
            "partition {p}"
        );
        assert_eq!(s.lag.map(|l| l as f64), gauge(p), "partition {p}");
    }
    let g = [("group", group.as_str())];
    assert_eq!(
        stats.rebalances as f64,
        sum(&v, names::CONSUMER_REBALANCES, &g)
    );
    assert_eq!(
        stats.partitions_assigned as f64,
        sum(&v, names::CONSUMER_ASSIGNED, &g)
    );
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_lag_per_partition_drains_to_zero() {
    lag_drains(Peer::mock(1).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_lag_per_partition_drains_to_zero() {
    lag_drains(Peer::tansu().expect("tansu")).await;
}
