//! The processing loop against real peers: the seed 003 order scenario (ok, transient
//! that heals, permanent, malformed), with every permanent order in the dead-letter
//! topic and the committed offsets at each partition's end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ottla::Error;
use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use ottla::processor::{
    BatchError, ErrorClass, Metric, MetricsLog, ProcessError, Processor, ProcessorBuilder,
    ProcessorHandle, RetryBackoff, RetryPolicy, owned,
};
use ottla::producer::{Producer, ProducerRecord};
use protocol_tests::peer::Peer;

const ORDERS: u32 = 30;

/// Order `i`'s kind: 50% ok, 30% transient (heals after 2 failures), 20% permanent,
/// half of those malformed JSON.
fn kind(i: u32) -> &'static str {
    match i % 10 {
        0..=4 => "ok",
        5..=7 => "transient",
        8 => "rejected",
        _ => "malformed",
    }
}

fn payload(i: u32) -> String {
    match kind(i) {
        "malformed" => format!("{{\"id\":{i},\"kind\":"),
        k => format!("{{\"id\":{i},\"kind\":\"{k}\",\"qty\":{}}}", i % 4 + 1),
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        default: RetryBackoff {
            max_retries: 3,
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: true,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    }
}

/// How the seed 003 handler is called.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    /// `run`: one record per call.
    PerRecord,
    /// `run_batch`, naming the failing record.
    Batch,
    /// `run_batch`, failing the whole batch without naming a record.
    WholeBatch,
}

type Attempts = Arc<Mutex<HashMap<u32, u32>>>;
type Succeeded = Arc<Mutex<BTreeSet<u32>>>;

/// The seed's order service: parses the order, fails transient orders twice, rejects
/// the rejected ones.
fn handle_order(
    record: &ottla::ConsumerRecord,
    attempts: &Attempts,
    succeeded: &Succeeded,
) -> Result<(), ProcessError> {
    let value = record.value_bytes().unwrap_or_default();
    let text = std::str::from_utf8(&value).map_err(|e| ProcessError::malformed(e.to_string()))?;
    if !text.ends_with('}') {
        return Err(ProcessError::malformed(format!(
            "unexpected end of JSON: {text}"
        )));
    }
    let id: u32 = text
        .split("\"id\":")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ProcessError::malformed("no id"))?;
    let n = {
        let mut a = attempts.lock().unwrap();
        let n = a.entry(id).or_insert(0);
        *n += 1;
        *n
    };
    if text.contains("\"transient\"") && n <= 2 {
        return Err(ProcessError::transient(
            "Timeout",
            format!("inventory service timed out (attempt {n})"),
        ));
    }
    if text.contains("\"rejected\"") {
        return Err(ProcessError::permanent(
            "BusinessRuleRejection",
            "quantity exceeds the credit limit",
        ));
    }
    succeeded.lock().unwrap().insert(id);
    Ok(())
}

async fn seed_003(peer: Peer, form: Form) {
    protocol_tests::init_tracing();
    let topic = format!("orders-{}-{form:?}", peer.name()).to_lowercase();
    let partitions = 3;
    peer.create_topic(&topic, partitions).expect("topic");
    peer.create_topic(&format!("{topic}.dlq"), 1)
        .expect("dlq topic");
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    // Sent in one burst, so that a partition's orders share record batches and
    // arrive together (the mock answers a Fetch with one record batch).
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    let mut deliveries = Vec::new();
    for i in 0..ORDERS {
        let r = ProducerRecord::new(&topic)
            .key(format!("order-{i}"))
            .value(payload(i))
            .header("trace-id", Some(Bytes::from(format!("t{i}"))));
        deliveries.push(producer.send(r).await.expect("send"));
    }
    for d in deliveries {
        let m = d.await.expect("written");
        let end = ends.entry(m.partition).or_default();
        *end = (*end).max(m.offset + 1);
    }
    producer.close().await;

    let attempts: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let succeeded: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
    let log = MetricsLog::default();
    let group = format!("billing-{}-{form:?}", peer.name());
    if let Peer::Mock(m) = &peer {
        m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    }
    let builder = test_builder(&peer, &group, &topic, policy())
        .commit_interval(Some(Duration::from_millis(200)))
        .metrics(log.hook());
    let processor = builder.build().await.expect("processor");
    let (s, l) = (succeeded.clone(), log.clone());
    let done = async move {
        let started = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let dlq = l
                .snapshot()
                .iter()
                .filter(|m| matches!(m, Metric::DeadLettered { .. }))
                .count();
            if s.lock().unwrap().len() + dlq >= ORDERS as usize
                || started.elapsed() > Duration::from_secs(60)
            {
                // Let the last commit go out.
                tokio::time::sleep(Duration::from_millis(500)).await;
                return;
            }
        }
    };
    let (a, s) = (attempts.clone(), succeeded.clone());
    let largest_batch = Arc::new(AtomicUsize::new(0));
    let largest = largest_batch.clone();
    // Transient failures of whole batches of more than one record: each starts a
    // replay instead of a retry.
    let replays = Arc::new(AtomicUsize::new(0));
    let r = replays.clone();
    let stats = match form {
        Form::PerRecord => processor
            .run(
                move |record, _cancel| {
                    let outcome = handle_order(record, &a, &s);
                    async move { outcome }
                },
                done,
            )
            .await
            .expect("run"),
        Form::Batch | Form::WholeBatch => processor
            .run_batch(
                8,
                move |records, _cancel| {
                    largest.fetch_max(records.len(), Ordering::Relaxed);
                    let outcome = records.iter().enumerate().try_for_each(|(i, rec)| {
                        handle_order(rec, &a, &s).map_err(|e| match form {
                            Form::Batch => BatchError::at(i, e),
                            _ => {
                                if records.len() > 1 && e.kind == "Timeout" {
                                    r.fetch_add(1, Ordering::Relaxed);
                                }
                                BatchError::whole(e)
                            }
                        })
                    });
                    async move { outcome }
                },
                done,
            )
            .await
            .expect("run"),
    };
    println!("{} {form:?}: {stats:?}", peer.name());
    if form != Form::PerRecord {
        assert!(
            largest_batch.load(Ordering::Relaxed) > 1,
            "the handler was given batches"
        );
    }

    // Every ok and healed order succeeded; every transient one took 3 attempts.
    let ok: BTreeSet<u32> = (0..ORDERS)
        .filter(|i| matches!(kind(*i), "ok" | "transient"))
        .collect();
    assert_eq!(*succeeded.lock().unwrap(), ok);
    for i in (0..ORDERS).filter(|i| kind(*i) == "transient") {
        assert_eq!(attempts.lock().unwrap().get(&i), Some(&3), "order {i}");
    }
    // Counters match.
    assert_eq!(stats.succeeded, 24);
    assert_eq!(stats.dead_lettered, 6);
    // Two retries per transient order, except where a batch failed as a whole: that
    // failure starts a record-by-record replay instead of a retry.
    let replays = replays.load(Ordering::Relaxed) as u64;
    assert_eq!(stats.retries + replays, 9 * 2);
    if form == Form::WholeBatch {
        assert!(replays > 0, "some batch failed as a whole");
    }
    assert_eq!(stats.dlq_failures, 0);

    // Every permanent order is in the DLQ, byte for byte, with diagnostic headers.
    let mut dlq = Consumer::builder(&peer.bootstrap())
        .assign([TopicPartition::new(format!("{topic}.dlq"), 0)])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("dlq reader");
    let mut letters = BTreeMap::new();
    while letters.len() < 6 {
        let r = tokio::time::timeout(Duration::from_secs(20), dlq.recv())
            .await
            .expect("dlq records")
            .expect("open")
            .expect("ok");
        let h = |k: &str| {
            r.headers_owned()
                .iter()
                .find(|(n, _)| &n[..] == k.as_bytes())
                .and_then(|(_, v)| v.as_ref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let key = String::from_utf8_lossy(r.key().unwrap_or_default()).into_owned();
        let i: u32 = key.trim_start_matches("order-").parse().expect("order key");
        assert_eq!(r.value(), Some(payload(i).as_bytes()), "value copied");
        assert_eq!(h("trace-id"), Some(format!("t{i}")), "original header kept");
        assert_eq!(h("__dlq.errors.topic"), Some(topic.clone()));
        assert_eq!(h("__dlq.errors.group"), Some(group.clone()));
        assert_eq!(
            h("__dlq.errors.delivery.count"),
            Some("1".into()),
            "permanent: one attempt"
        );
        assert_eq!(h("ottla.dlq.class"), Some("non-retryable".into()));
        let expected_type = if kind(i) == "malformed" {
            "DeserializationError"
        } else {
            "BusinessRuleRejection"
        };
        assert_eq!(h("ottla.dlq.error.type"), Some(expected_type.into()));
        let offset: i64 = h("__dlq.errors.offset")
            .and_then(|o| o.parse().ok())
            .expect("offset");
        let partition: i32 = h("__dlq.errors.partition")
            .and_then(|p| p.parse().ok())
            .expect("partition");
        assert_eq!(
            h("ottla.dlq.dedup.id"),
            Some(format!("{group}/{topic}/{partition}/{offset}"))
        );
        letters.insert(i, expected_type);
    }
    let permanent: BTreeSet<u32> = (0..ORDERS)
        .filter(|i| matches!(kind(*i), "rejected" | "malformed"))
        .collect();
    assert_eq!(letters.keys().copied().collect::<BTreeSet<_>>(), permanent);

    // The committed offsets equal each partition's end.
    let mut check = Consumer::builder(&peer.bootstrap())
        .group_id(&group)
        .topics([topic.clone()])
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
        .build()
        .await
        .expect("checker");
    let started = Instant::now();
    loop {
        let committed: BTreeMap<i32, i64> = (0..partitions)
            .filter_map(|p| {
                check
                    .committed(&TopicPartition::new(&topic, p))
                    .map(|o| (p, o))
            })
            .collect();
        let ends_known: BTreeMap<i32, i64> = ends.clone();
        if committed == ends_known {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "committed {committed:?}, ends {ends_known:?}"
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), check.recv()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_seed_003_orders_end_handled_or_dead_lettered_and_committed() {
    seed_003(Peer::mock(3).expect("mock"), Form::PerRecord).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_seed_003_in_batches_naming_the_failing_record() {
    seed_003(Peer::mock(3).expect("mock"), Form::Batch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_seed_003_in_batches_failing_whole_replays_record_by_record() {
    seed_003(Peer::mock(3).expect("mock"), Form::WholeBatch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_seed_003_in_batches_naming_the_failing_record() {
    seed_003(Peer::tansu().expect("tansu"), Form::Batch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_seed_003_orders_end_handled_or_dead_lettered_and_committed() {
    seed_003(Peer::tansu().expect("tansu"), Form::PerRecord).await;
}

#[tokio::test]
async fn invalid_configuration_is_refused_with_the_setting_named() {
    let b = Processor::builder("127.0.0.1:1", "g", ["t"]);
    let e = b
        .timeouts(
            Duration::from_secs(10),
            Duration::from_secs(10),
            Duration::from_secs(300),
        )
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("heartbeat.interval.ms"), "{e}");
    // Half the session is allowed (with a warning), as by the Java client and by
    // `Consumer`'s builder: one check serves both. The processor refused it before.
    Processor::builder("127.0.0.1:1", "g", ["t"])
        .timeouts(
            Duration::from_secs(10),
            Duration::from_secs(5),
            Duration::from_secs(300),
        )
        .validate()
        .expect("a heartbeat of half the session");
    let e = Processor::builder("127.0.0.1:1", "g", ["t"])
        // 3 retries of up to 1.1 + 2.2 + 4.4 s, plus a 30 s budget, do not fit in 20 s.
        .timeouts(
            Duration::from_secs(45),
            Duration::from_secs(3),
            Duration::from_secs(20),
        )
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("max.poll.interval.ms"), "{e}");
    let mut p = policy();
    p.default.multiplier = 0.0;
    let e = Processor::builder("127.0.0.1:1", "g", ["t"])
        .retry_policy(p)
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("retry_backoff_multiplier"), "{e}");
    let e = Processor::builder("127.0.0.1:1", "g", ["t"])
        .concurrency(0)
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("concurrency"), "{e}");
    // A dead-letter topic that is one of the topics read would loop.
    let e = Processor::builder("127.0.0.1:1", "g", ["orders", "orders.bad"])
        .dlq_topic(|t| format!("{}.bad", t.trim_end_matches(".bad")))
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("dlq_topic"), "{e}");
    Processor::builder("127.0.0.1:1", "g", ["brew.orders.v1"])
        .dlq_topic(|t| t.replace(".v1", ".dlq"))
        .validate()
        .expect("a named dead-letter topic is valid");
    Processor::builder("127.0.0.1:1", "g", ["t"])
        .validate()
        .expect("the defaults are valid");
}

/// The settings every suite here shares: short group timeouts (tansu holds joins
/// for half the session timeout), reading from the start, and the mock's SyncGroup
/// tie-break (harmless on tansu).
fn test_builder(peer: &Peer, group: &str, topic: &str, policy: RetryPolicy) -> ProcessorBuilder {
    Processor::builder(&peer.bootstrap(), group, [topic.to_string()])
        .retry_policy(policy)
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(20),
        )
        .processing_budget(Duration::from_secs(5))
        .consumer(|c| {
            c.offset_reset(OffsetReset::Earliest)
                .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
        })
}

/// A processor on `topic` in `group` with short timeouts.
async fn processor_for(
    peer: &Peer,
    group: &str,
    topic: &str,
    policy: RetryPolicy,
    log: &MetricsLog,
    assignor: &str,
) -> Processor {
    let assignor = assignor.to_string();
    test_builder(peer, group, topic, policy)
        .commit_interval(Some(Duration::from_millis(100)))
        .metrics(log.hook())
        .consumer(move |c| c.assignors([assignor]).expect("assignor"))
        .producer(|p| p.retry_backoff(Duration::from_millis(20)))
        .build()
        .await
        .expect("processor")
}

async fn produce_values(peer: &Peer, topic: &str, values: &[(i32, String)]) {
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    // One burst: a partition's values share record batches where the producer can.
    let mut deliveries = Vec::new();
    for (p, v) in values {
        let r = ProducerRecord::new(topic)
            .partition(*p)
            .key(v.clone())
            .value(v.clone());
        deliveries.push(producer.send(r).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }
    producer.close().await;
}

/// The dead-letter topic cannot be written for a while (injected TOPIC_AUTHORIZATION_FAILED
/// on Produce): the partition halts, nothing is committed past the record, and it all
/// recovers once the errors stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_dlq_outage_halts_the_partition_and_recovers() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    let topic = "outage";
    peer.create_topic(topic, 1).expect("topic");
    peer.create_topic("outage.dlq", 1).expect("dlq");
    let values: Vec<(i32, String)> = (0..10)
        .map(|i| {
            (
                0,
                if i == 3 {
                    "poison".into()
                } else {
                    format!("v{i}")
                },
            )
        })
        .collect();
    produce_values(&peer, topic, &values).await;
    // The next three Produce requests (the dead-letter writes) fail.
    m.push_request_errors(0, &[29, 29, 29]);
    let log = MetricsLog::default();
    let processor =
        processor_for(&peer, "outage", topic, policy(), &log, "cooperative-sticky").await;
    let l = log.clone();
    let done = async move {
        let started = Instant::now();
        while !l
            .snapshot()
            .iter()
            .any(|m| matches!(m, Metric::Committed { offset: 10, .. }))
            && started.elapsed() < Duration::from_secs(60)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let stats = processor
        .run(
            owned(|r: ottla::ConsumerRecord, _| async move {
                if r.value() == Some(&b"poison"[..]) {
                    Err(ProcessError::malformed("poison pill"))
                } else {
                    Ok(())
                }
            }),
            done,
        )
        .await
        .expect("run");
    println!("{stats:?}");
    let metrics = log.snapshot();
    assert!(
        metrics.iter().any(|m| matches!(m, Metric::Halted { .. })),
        "the partition halted"
    );
    assert_eq!(stats.dlq_failures, 3, "three failed dead-letter writes");
    assert_eq!((stats.dead_lettered, stats.succeeded), (1, 9));
    // No commit passed the poison record before its dead-letter write succeeded.
    let dead_at = metrics
        .iter()
        .position(|m| matches!(m, Metric::DeadLettered { .. }))
        .expect("dead-lettered");
    for m in &metrics[..dead_at] {
        if let Metric::Committed { offset, .. } = m {
            assert!(
                *offset <= 3,
                "committed {offset} before the poison record was dead-lettered"
            );
        }
    }
    assert!(
        metrics
            .iter()
            .any(|m| matches!(m, Metric::Committed { offset: 10, .. }))
    );
}

/// Handlers that panic, in the call itself or in the future it returns, and a batch
/// handler that panics: each panic is caught, counts as a permanent error of type
/// `Panic`, and only the record that panics goes to the dead-letter topic; the loop
/// keeps going and commits every partition to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_handler_panics_are_dead_lettered_and_never_stop_the_loop() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    for batch in [false, true] {
        let topic = format!("panics-{batch}");
        peer.create_topic(&topic, 2).expect("topic");
        peer.create_topic(&format!("{topic}.dlq"), 1).expect("dlq");
        let values: Vec<(i32, String)> = (0..20)
            .map(|i| {
                let v = match i {
                    4 => "panic-now".to_string(),
                    13 => "panic-later".to_string(),
                    _ => format!("v{i}"),
                };
                (i % 2, v)
            })
            .collect();
        produce_values(&peer, &topic, &values).await;
        let log = MetricsLog::default();
        let processor = processor_for(&peer, &topic, &topic, policy(), &log, "range").await;
        let l = log.clone();
        let done = async move {
            let started = Instant::now();
            let at_end = |m: &Metric| matches!(m, Metric::Committed { offset: 10, .. });
            while l.snapshot().iter().filter(|m| at_end(m)).count() < 2
                && started.elapsed() < Duration::from_secs(60)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let handled: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let h = handled.clone();
        let stats = if batch {
            processor
                .run_batch(
                    5,
                    move |records: &[ottla::ConsumerRecord], _| {
                        let h = h.clone();
                        let values: Vec<String> = records
                            .iter()
                            .map(|r| {
                                String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned()
                            })
                            .collect();
                        async move {
                            if values.iter().any(|v| v.starts_with("panic")) {
                                panic!("a batch with a bad record");
                            }
                            h.lock().unwrap().extend(values);
                            Ok(())
                        }
                    },
                    done,
                )
                .await
        } else {
            processor
                .run(
                    owned(move |r: ottla::ConsumerRecord, _| {
                        let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
                        if v == "panic-now" {
                            panic!("the handler panics before returning its future");
                        }
                        let h = h.clone();
                        async move {
                            if v == "panic-later" {
                                panic!("the handler's future panics");
                            }
                            h.lock().unwrap().insert(v);
                            Ok(())
                        }
                    }),
                    done,
                )
                .await
        }
        .expect("run");
        println!("batch {batch}: {stats:?}");
        // In batches, a bad record may panic once more: with others around it, then
        // when its batch is replayed one record at a time.
        if batch {
            assert!((2..=4).contains(&stats.panics), "{stats:?}");
        } else {
            assert_eq!(stats.panics, 2);
        }
        assert_eq!((stats.succeeded, stats.dead_lettered), (18, 2), "{stats:?}");
        let want: BTreeSet<String> = values
            .iter()
            .map(|(_, v)| v.clone())
            .filter(|v| !v.starts_with("panic"))
            .collect();
        assert_eq!(*handled.lock().unwrap(), want);
        let metrics = log.snapshot();
        let dead: Vec<(i64, String)> = metrics
            .iter()
            .filter_map(|m| match m {
                Metric::DeadLettered {
                    offset, error_type, ..
                } => Some((*offset, error_type.clone())),
                _ => None,
            })
            .collect();
        // Record 4 is offset 2 of partition 0; record 13 is offset 6 of partition 1.
        let mut offsets: Vec<i64> = dead.iter().map(|d| d.0).collect();
        offsets.sort_unstable();
        assert_eq!(offsets, [2, 6]);
        assert!(dead.iter().all(|d| d.1 == "Panic"), "{dead:?}");
        assert_eq!(
            metrics
                .iter()
                .filter(|m| matches!(m, Metric::Committed { offset: 10, .. }))
                .count(),
            2,
            "both partitions committed to their end"
        );
    }
}

/// A record is in backoff when its partition is revoked (eager rebalance: a second
/// member joins). The first member cancels the wait, commits the finished prefix and
/// acknowledges within the rebalance timeout; the next owner continues from the
/// committed offset and nothing is lost. On tansu: the mock refuses commits once a
/// rebalance has started (docs/rebalance.md), so an eager member's prefix commit
/// cannot land there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_rebalance_during_backoff_hands_over_at_the_committed_offset() {
    protocol_tests::init_tracing();
    let peer = Peer::tansu().expect("tansu");
    let topic = "backoff";
    peer.create_topic(topic, 2).expect("topic");
    peer.create_topic("backoff.dlq", 1).expect("dlq");
    let values: Vec<(i32, String)> = (0..20)
        .map(|i| (i % 2, format!("p{}-{}", i % 2, i / 2)))
        .collect();
    produce_values(&peer, topic, &values).await;
    // The first attempt at p0-2 fails; the retry waits 10 s, longer than the second
    // member takes to join (tansu holds a JoinGroup for 3 s).
    let slow = RetryPolicy {
        default: RetryBackoff {
            max_retries: 1,
            initial: Duration::from_secs(10),
            max: Duration::from_secs(10),
            multiplier: 1.0,
            jitter: false,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    };
    let handled: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let succeeded: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let handler = {
        let (h, s) = (handled.clone(), succeeded.clone());
        move |r: ottla::ConsumerRecord, _| {
            let (h, s) = (h.clone(), s.clone());
            async move {
                let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
                let n = {
                    let mut h = h.lock().unwrap();
                    let n = h.entry(v.clone()).or_insert(0);
                    *n += 1;
                    *n
                };
                if v == "p0-2" && n == 1 {
                    return Err(ProcessError::transient("Timeout", "downstream slow"));
                }
                s.lock().unwrap().insert(v);
                Ok(())
            }
        }
    };
    let (log_a, log_b) = (MetricsLog::default(), MetricsLog::default());
    let first = processor_for(&peer, "handover", topic, slow.clone(), &log_a, "range").await;
    let all_done = {
        let s = succeeded.clone();
        move || {
            let s = s.clone();
            async move {
                let started = Instant::now();
                while s.lock().unwrap().len() < 20 && started.elapsed() < Duration::from_secs(60) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    let a = tokio::spawn(first.run(owned(handler.clone()), all_done()));
    // Wait until p0-2 is in backoff, then start a second member.
    let started = Instant::now();
    while !log_a
        .snapshot()
        .iter()
        .any(|m| matches!(m, Metric::Retry { .. }))
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no retry scheduled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let joined_at = Instant::now();
    let second = processor_for(&peer, "handover", topic, slow, &log_b, "range").await;
    let b = tokio::spawn(second.run(owned(handler), all_done()));
    let (a, b) = (
        a.await.expect("a").expect("a ran"),
        b.await.expect("b").expect("b ran"),
    );
    println!(
        "first {a:?}\nsecond {b:?}\nhandover to the end took {:?}",
        joined_at.elapsed()
    );
    // Nothing lost: every record succeeded; p0-2 took exactly two attempts.
    assert_eq!(succeeded.lock().unwrap().len(), 20);
    assert_eq!(handled.lock().unwrap().get("p0-2"), Some(&2));
    // The first member committed p0's prefix (up to the record in backoff) when it
    // gave the partition up, before the 10 s backoff ran out.
    let committed_at_2 = log_a.snapshot().iter().any(
        |m| matches!(m, Metric::Committed { partition, offset: 2 } if partition.partition == 0),
    );
    assert!(committed_at_2, "{:?}", log_a.snapshot());
    assert!(
        joined_at.elapsed() < Duration::from_secs(20),
        "within the rebalance timeout"
    );
    // Records before the backoff were not handled twice.
    for (v, n) in handled.lock().unwrap().iter() {
        if v != "p0-2" {
            assert_eq!(*n, 1, "{v} handled {n} times");
        }
    }
}

/// `OTTLA_PROCESSOR_SEEDS` (default 3): how many seeds the crash test runs.
fn crash_seeds() -> u64 {
    protocol_tests::env_number("OTTLA_PROCESSOR_SEEDS", 3)
}

/// Handler outcomes drawn from a seed, processors killed (their task aborted, no
/// close) at random points and restarted. Every record ends handled or dead-lettered,
/// and no commit ever passes a record that was not finished (checked at each commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_killed_processors_lose_nothing_and_never_commit_past_unfinished_records() {
    protocol_tests::init_tracing();
    for seed in 1..=crash_seeds() {
        crash_one(seed).await;
    }
}

/// Runs `p` with a per-record `handler`, as is (`Form::PerRecord`) or adapted to the
/// batch form (batches of up to 16, stopping at the first failure).
async fn run_as<H, F, S>(
    p: Processor,
    form: Form,
    handler: H,
    shutdown: S,
) -> ottla::Result<ottla::stats::ProcessorStats>
where
    H: Fn(ottla::ConsumerRecord, ottla::processor::Cancel) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<(), ProcessError>> + Send + 'static,
    S: std::future::Future + Send,
{
    if form == Form::PerRecord {
        return p.run(owned(handler), shutdown).await;
    }
    let handler = Arc::new(handler);
    let batched = move |records: &[ottla::ConsumerRecord], cancel: ottla::processor::Cancel| {
        let handler = handler.clone();
        let records = records.to_vec();
        async move {
            for (i, r) in records.into_iter().enumerate() {
                handler(r, cancel.clone()).await.map_err(|e| match form {
                    Form::Batch => BatchError::at(i, e),
                    _ => BatchError::whole(e),
                })?;
            }
            Ok(())
        }
    };
    p.run_batch(16, batched, shutdown).await
}

async fn crash_one(seed: u64) {
    // The handler's form rotates with the seed.
    let form = [Form::PerRecord, Form::Batch, Form::WholeBatch][(seed % 3) as usize];
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    let topic = "crashy";
    let partitions = 3;
    let count = 300u64;
    peer.create_topic(topic, partitions).expect("topic");
    peer.create_topic("crashy.dlq", 1).expect("dlq");
    let mut rng = protocol_tests::rng::Rng::new(seed);
    // Outcome per record: 0 ok, 1 transient healing after 1-3 failures, 2 permanent.
    let plan: Vec<(u64, u32)> = (0..count)
        .map(|_| match rng.below(10) {
            0..=6 => (0, 0),
            7 | 8 => (1, 1 + rng.below(3) as u32),
            _ => (2, 0),
        })
        .collect();
    let values: Vec<(i32, String)> = (0..count)
        .map(|i| ((i % partitions as u64) as i32, format!("r{i}")))
        .collect();
    produce_values(&peer, topic, &values).await;
    let index = |r: &ottla::ConsumerRecord| -> u64 {
        String::from_utf8_lossy(r.value().unwrap_or_default())
            .trim_start_matches('r')
            .parse()
            .unwrap_or(u64::MAX)
    };
    // Finished records by (partition, offset): succeeded, or dead-lettered and acked.
    let finished: Arc<Mutex<BTreeSet<(i32, i64)>>> = Arc::default();
    let succeeded: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let attempts: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let quick = RetryPolicy {
        default: RetryBackoff {
            max_retries: 2,
            initial: Duration::from_millis(10),
            max: Duration::from_millis(40),
            multiplier: 2.0,
            jitter: true,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    };
    let make_handler = || {
        let (s, a, f, plan) = (
            succeeded.clone(),
            attempts.clone(),
            finished.clone(),
            plan.clone(),
        );
        move |r: ottla::ConsumerRecord, _| {
            let (s, a, f, plan) = (s.clone(), a.clone(), f.clone(), plan.clone());
            let i = index(&r);
            async move {
                let (kind, heal_after) = plan.get(i as usize).copied().unwrap_or((2, 0));
                let n = {
                    let mut a = a.lock().unwrap();
                    let n = a.entry(i).or_insert(0);
                    *n += 1;
                    *n
                };
                match kind {
                    2 => Err(ProcessError::permanent("Rejected", format!("record {i}"))),
                    1 if n <= heal_after => Err(ProcessError::transient(
                        "Flaky",
                        format!("record {i} attempt {n}"),
                    )),
                    _ => {
                        s.lock().unwrap().insert(i);
                        f.lock().unwrap().insert((r.partition(), r.offset()));
                        Ok(())
                    }
                }
            }
        }
    };
    let hook = {
        let (f, v) = (finished.clone(), violations.clone());
        move |m: Metric| match m {
            Metric::DeadLettered {
                partition, offset, ..
            } => {
                f.lock().unwrap().insert((partition.partition, offset));
            }
            Metric::Committed { partition, offset } => {
                let f = f.lock().unwrap();
                // Offsets of a partition are 0.. in production order here.
                if let Some(o) = (0..offset).find(|o| !f.contains(&(partition.partition, *o))) {
                    v.lock().unwrap().push(format!(
                        "committed {partition}@{offset} while {o} was unfinished"
                    ));
                }
            }
            _ => {}
        }
    };
    let build = || async {
        test_builder(&peer, "crashy", topic, quick.clone())
            .commit_interval(Some(Duration::from_millis(50)))
            .metrics(hook.clone())
            .consumer(|c| c.max_partition_fetch_bytes(512))
            .build()
            .await
            .expect("processor")
    };
    let kills = 1 + rng.below(3);
    for _ in 0..kills {
        let p = build().await;
        let task = tokio::spawn(run_as(
            p,
            form,
            make_handler(),
            std::future::pending::<()>(),
        ));
        tokio::time::sleep(Duration::from_millis(300 + rng.below(900))).await;
        task.abort();
        let _ = task.await;
    }
    let done = {
        let f = finished.clone();
        async move {
            let started = Instant::now();
            while f.lock().unwrap().len() < count as usize
                && started.elapsed() < Duration::from_secs(60)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let p = build().await;
    let stats = run_as(p, form, make_handler(), done)
        .await
        .expect("final run");
    let violations = violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "seed {seed}: {violations:?}");
    // Every record ended handled successfully or dead-lettered (a transient record can
    // exhaust its retries); permanent ones never succeeded.
    assert_eq!(
        finished.lock().unwrap().len(),
        count as usize,
        "seed {seed}: finished"
    );
    let succeeded = succeeded.lock().unwrap().clone();
    assert!(
        succeeded.iter().all(|i| plan[*i as usize].0 != 2),
        "seed {seed}: a permanent record succeeded"
    );
    let must_be_lettered: BTreeSet<u64> = (0..count).filter(|i| !succeeded.contains(i)).collect();
    let mut dlq = Consumer::builder(&peer.bootstrap())
        .assign([TopicPartition::new("crashy.dlq", 0)])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("dlq reader");
    let mut lettered = BTreeSet::new();
    let started = Instant::now();
    while !must_be_lettered.is_subset(&lettered) && started.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(Ok(r))) = tokio::time::timeout(Duration::from_secs(2), dlq.recv()).await {
            lettered.insert(index(&r));
        }
    }
    assert!(
        must_be_lettered.is_subset(&lettered),
        "seed {seed}: not dead-lettered: {:?}",
        must_be_lettered.difference(&lettered).collect::<Vec<_>>()
    );
    println!(
        "seed {seed} ({form:?}): {kills} kills; {} handled, {} dead-lettered ({} copies in the DLQ); last run {stats:?}",
        succeeded.len(),
        must_be_lettered.len(),
        lettered.len()
    );
}

/// The DLQ tools read back what the processor dead-lettered, and replay it to the
/// original topic once per original record, without diagnostic headers, counting
/// replays and refusing loops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_dlq_tools_inspect_and_replay() {
    use ottla::dlq::{REPLAY_COUNT, inspect, replay, summary};
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    let topic = "tools";
    peer.create_topic(topic, 2).expect("topic");
    peer.create_topic("tools.dlq", 1).expect("dlq");
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    for i in 0..6 {
        let value = if i % 2 == 0 {
            format!("bad-{i}")
        } else {
            format!("good-{i}")
        };
        producer
            .send(
                ProducerRecord::new(topic)
                    .partition(i % 2)
                    .key(format!("k{i}"))
                    .value(value)
                    .header("trace-id", Some(Bytes::from(format!("t{i}")))),
            )
            .await
            .expect("send")
            .await
            .expect("written");
    }
    producer.close().await;
    let log = MetricsLog::default();
    let processor =
        processor_for(&peer, "tools", topic, policy(), &log, "cooperative-sticky").await;
    let l = log.clone();
    let done = async move {
        dead_lettered(&l, 3).await;
    };
    processor
        .run(
            owned(|r: ottla::ConsumerRecord, _| async move {
                if r.value().is_some_and(|v| v.starts_with(b"bad")) {
                    Err(ProcessError::permanent("Rejected", "bad order"))
                } else {
                    Ok(())
                }
            }),
            done,
        )
        .await
        .expect("run");
    let config = ottla::ClientConfig::new(&peer.bootstrap());
    let entries = inspect(&config, "tools.dlq").await.expect("inspect");
    assert_eq!(entries.len(), 3);
    for e in &entries {
        let (t, p, o) = e.origin.clone().expect("origin");
        assert_eq!(t, topic);
        assert_eq!(p, 0, "the bad records were all on partition 0");
        assert!(o <= 2);
        assert_eq!(e.class, "non-retryable");
        assert_eq!(e.error_type.as_deref(), Some("Rejected"));
    }
    let counts = summary(&entries);
    assert_eq!(
        counts.get(&("non-retryable".into(), "Rejected".into())),
        Some(&3)
    );
    // Each original record once, even if asked twice.
    let mut twice = entries.clone();
    twice.extend(entries.clone());
    let report = replay(&config, &twice, 3).await.expect("replay");
    assert_eq!((report.replayed, report.duplicates), (3, 3));
    // Already replayed enough: refused.
    let mut looping = entries.clone();
    for e in &mut looping {
        e.replays = 3;
    }
    let report = replay(&config, &looping, 3).await.expect("replay");
    assert_eq!((report.replayed, report.looping), (0, 3));
    // The replayed records are back on partition 0, byte for byte, with a replay count.
    let mut back = Consumer::builder(&peer.bootstrap())
        .assign([TopicPartition::new(topic, 0)])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("reader");
    let mut replayed = Vec::new();
    let started = Instant::now();
    while replayed.len() < 3 && started.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(Ok(r))) = tokio::time::timeout(Duration::from_secs(2), back.recv()).await
            && r.offset() >= 3
        {
            replayed.push(r);
        }
    }
    assert_eq!(replayed.len(), 3);
    for r in &replayed {
        let names: Vec<String> = r
            .headers_owned()
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert_eq!(
            names,
            vec!["trace-id".to_string(), REPLAY_COUNT.to_string()],
            "diagnostics stripped"
        );
        assert!(r.value().is_some_and(|v| v.starts_with(b"bad-")));
        assert_eq!(r.headers_owned()[1].1.as_deref(), Some(&b"1"[..]));
    }
}

/// In-place retries, then retry topics with their delays, then the dead-letter topic:
/// a record that heals on its first retry-topic hop succeeds there, one that never
/// heals goes through both hops to the DLQ, which names where it first came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_retry_topics_wait_their_delay_then_dead_letter() {
    use ottla::processor::{RETRY_HOP, retry_topic};
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    let topic = "rt";
    let delays = vec![Duration::from_millis(300), Duration::from_millis(600)];
    peer.create_topic(topic, 1).expect("topic");
    for d in &delays {
        peer.create_topic(&retry_topic(topic, *d), 1)
            .expect("retry topic");
    }
    peer.create_topic("rt.dlq", 1).expect("dlq");
    assert_eq!(retry_topic(topic, delays[0]), "rt.retry.300ms");
    assert_eq!(retry_topic(topic, Duration::from_secs(300)), "rt.retry.5m");
    produce_values(
        &peer,
        topic,
        &[(0, "ok".into()), (0, "heals".into()), (0, "never".into())],
    )
    .await;
    let early: Arc<Mutex<Vec<String>>> = Arc::default();
    let attempts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let (early, attempts) = (early.clone(), attempts.clone());
        owned(move |r: ottla::ConsumerRecord, _| {
            let (early, attempts) = (early.clone(), attempts.clone());
            async move {
                let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
                let hop = r
                    .headers_owned()
                    .iter()
                    .find(|(k, _)| &k[..] == RETRY_HOP.as_bytes())
                    .and_then(|(_, v)| v.as_deref())
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                if let Some(h) = &hop {
                    let wait = if h == "1" { 300 } else { 600 };
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_millis() as i64;
                    if now < r.timestamp() + wait {
                        early
                            .lock()
                            .unwrap()
                            .push(format!("{v} on hop {h} after {} ms", now - r.timestamp()));
                    }
                }
                let n = {
                    let mut a = attempts.lock().unwrap();
                    let n = a.entry(v.clone()).or_insert(0);
                    *n += 1;
                    *n
                };
                match v.as_str() {
                    "heals" if n <= 2 => Err(ProcessError::transient("Busy", "try later")),
                    "never" => Err(ProcessError::transient("Busy", "still down")),
                    _ => Ok(()),
                }
            }
        })
    };
    let log = MetricsLog::default();
    let quick = protocol_tests::quick_retries(1);
    let processor = test_builder(&peer, "rt", topic, quick)
        .retry_topics(delays)
        .commit_interval(Some(Duration::from_millis(100)))
        .metrics(log.hook())
        .build()
        .await
        .expect("processor");
    let l = log.clone();
    let done = async move {
        dead_lettered(&l, 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let stats = processor.run(handler, done).await.expect("run");
    println!("{stats:?}");
    assert!(
        early.lock().unwrap().is_empty(),
        "handled before the delay: {:?}",
        early.lock().unwrap()
    );
    assert_eq!(
        (stats.succeeded, stats.forwarded, stats.dead_lettered),
        (2, 3, 1)
    );
    // heals: 2 in place, 1 on hop 1; never: 2 in place, 2 per hop.
    assert_eq!(attempts.lock().unwrap().get("heals"), Some(&3));
    assert_eq!(attempts.lock().unwrap().get("never"), Some(&6));
    let config = ottla::ClientConfig::new(&peer.bootstrap());
    let entries = ottla::dlq::inspect(&config, "rt.dlq")
        .await
        .expect("inspect");
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!(
        e.origin,
        Some(("rt".to_string(), 0, 2)),
        "the DLQ names the first origin"
    );
    let hop = e
        .record
        .headers_owned()
        .iter()
        .find(|(k, _)| &k[..] == RETRY_HOP.as_bytes())
        .and_then(|(_, v)| v.clone());
    assert_eq!(hop.as_deref(), Some(&b"2"[..]));
}

/// What one member saw, in the order it saw it: its metrics and its handler calls.
#[derive(Debug, Clone)]
enum Seen {
    Metric(Metric),
    Handled(TopicPartition),
}

/// The metrics hook reports the group's events: `Joined` before the `Assigned` of its
/// generation, `Assigned` before any record of those partitions reaches the handler,
/// `Revoked` (with the generation the partitions belonged to) once their work stopped,
/// and no handler call for a partition after its `Revoked` until it is assigned again.
/// Two processors on four partitions: the second one's join moves partitions, under an
/// eager and a cooperative assignor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_group_events_reach_the_metrics_hook_in_order_with_the_records() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    for assignor in ["range", "cooperative-sticky"] {
        group_events(&peer, assignor).await;
    }
}

async fn group_events(peer: &Peer, assignor: &'static str) {
    let topic: &'static str = if assignor == "range" {
        "events-eager"
    } else {
        "events-coop"
    };
    peer.create_topic(topic, 4).expect("topic");
    peer.create_topic(&format!("{topic}.dlq"), 1).expect("dlq");
    let first: Vec<(i32, String)> = (0..40).map(|i| (i % 4, format!("a{i}"))).collect();
    produce_values(peer, topic, &first).await;

    let handled = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let start = |name: &'static str| {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (peer, handled, stop, s) = (
            peer.bootstrap(),
            handled.clone(),
            stop.clone(),
            seen.clone(),
        );
        let hook_seen = seen.clone();
        let task = tokio::spawn(async move {
            let processor =
                Processor::builder(&peer, &format!("{topic}-group"), [topic.to_string()])
                    .retry_policy(policy())
                    .timeouts(
                        Duration::from_secs(6),
                        Duration::from_millis(500),
                        Duration::from_secs(20),
                    )
                    .processing_budget(Duration::from_secs(5))
                    .commit_interval(Some(Duration::from_millis(100)))
                    .metrics(move |m| hook_seen.lock().unwrap().push(Seen::Metric(m)))
                    .consumer(|c| {
                        c.offset_reset(OffsetReset::Earliest)
                            .client_id(name)
                            .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
                            .assignors([assignor])
                            .expect("assignor")
                    })
                    .build()
                    .await
                    .expect("processor");
            processor
                .run(
                    owned(move |r: ottla::ConsumerRecord, _| {
                        s.lock().unwrap().push(Seen::Handled(r.topic_partition()));
                        handled.fetch_add(1, Ordering::SeqCst);
                        async { Ok(()) }
                    }),
                    async move { stop.notified().await },
                )
                .await
                .expect("run")
        });
        (seen, task)
    };
    let wait_for = |n: usize| {
        let handled = handled.clone();
        async move {
            let started = Instant::now();
            while handled.load(Ordering::SeqCst) < n {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "only {} of {n} handled",
                    handled.load(Ordering::SeqCst)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let (seen_a, a) = start("events-a");
    wait_for(40).await;
    let (seen_b, b) = start("events-b");
    // Wait for B to own something, then write more so both handle after the move.
    let started = Instant::now();
    while !seen_b
        .lock()
        .unwrap()
        .iter()
        .any(|s| matches!(s, Seen::Metric(Metric::Assigned { .. })))
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "B was never assigned anything"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second: Vec<(i32, String)> = (0..40).map(|i| (i % 4, format!("b{i}"))).collect();
    produce_values(peer, topic, &second).await;
    wait_for(80).await;
    stop.notify_waiters();
    let (_, _) = (a.await.expect("a"), b.await.expect("b"));

    let all: BTreeSet<TopicPartition> = (0..4)
        .map(|p| TopicPartition {
            topic: topic.into(),
            partition: p,
        })
        .collect();
    let mut finals = Vec::new();
    for (name, seen) in [("A", &seen_a), ("B", &seen_b)] {
        let seen = seen.lock().unwrap().clone();
        let mut joined: Option<i32> = None;
        let mut owned: BTreeSet<TopicPartition> = BTreeSet::new();
        let mut owned_in: Option<i32> = None;
        // Asked back (RevokeRequested) and not yet given back (Revoked).
        let mut asked: BTreeSet<TopicPartition> = BTreeSet::new();
        for s in &seen {
            match s {
                Seen::Metric(Metric::Joined { generation, .. }) => joined = Some(*generation),
                Seen::Metric(Metric::Assigned {
                    generation,
                    partitions,
                }) => {
                    assert_eq!(
                        joined,
                        Some(*generation),
                        "{name}: Assigned without its Joined first: {seen:?}"
                    );
                    owned.extend(partitions.iter().cloned());
                    owned_in = Some(*generation);
                }
                Seen::Metric(Metric::Revoked {
                    generation,
                    partitions,
                }) => {
                    // Eager: the generation ending; cooperative: the new one, which no
                    // longer gives them to this member.
                    assert!(
                        owned_in.is_some_and(|g| g <= *generation) && joined == Some(*generation),
                        "{name}: Revoked names the generation it was asked in: {seen:?}"
                    );
                    for tp in partitions {
                        assert!(
                            owned.remove(tp),
                            "{name}: {tp} revoked but not owned: {seen:?}"
                        );
                        assert!(
                            asked.remove(tp),
                            "{name}: {tp} given back without RevokeRequested first: {seen:?}"
                        );
                    }
                }
                Seen::Metric(Metric::RevokeRequested { partitions, .. }) => {
                    for tp in partitions {
                        assert!(
                            owned.contains(tp),
                            "{name}: {tp} asked back but not owned: {seen:?}"
                        );
                        asked.insert(tp.clone());
                    }
                }
                Seen::Metric(Metric::Lost { partitions }) => {
                    for tp in partitions {
                        owned.remove(tp);
                    }
                }
                Seen::Handled(tp) => {
                    assert!(
                        owned.contains(tp),
                        "{name}: handled {tp} while not owning it: {seen:?}"
                    );
                }
                Seen::Metric(_) => {}
            }
        }
        finals.push(owned);
    }
    let a_revoked = seen_a
        .lock()
        .unwrap()
        .iter()
        .any(|s| matches!(s, Seen::Metric(Metric::Revoked { .. })));
    assert!(
        a_revoked,
        "{assignor}: A gave partitions back when B joined"
    );
    assert!(
        finals[0].is_disjoint(&finals[1]),
        "no partition owned by both: {finals:?}"
    );
    let union: BTreeSet<TopicPartition> = finals[0].union(&finals[1]).cloned().collect();
    assert_eq!(union, all, "the last generation covers every partition");
    assert!(
        !finals[1].is_empty() && !finals[0].is_empty(),
        "both own some: {finals:?}"
    );
}

/// A handler that never finishes (it ignores its `Cancel`) does not hold a shutdown
/// past `shutdown_timeout`: `run` returns within it, with the records finished before
/// the stuck one committed and the stuck one not. The default used to wait for half
/// the rebalance timeout (150 s), past the 30 s an orchestrator grants before killing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_shutdown_ends_within_its_timeout_committing_the_finished_prefix() {
    let topic = "stuck";
    let peer = one_partition(topic);
    // Two records first; the stuck one and two more once both are handled, so that
    // the stuck record starts a task of its own (`run` hands a task the records
    // queued at that moment, and reports them when the task ends).
    produce_values(&peer, topic, &[(0, "r0".into()), (0, "r1".into())]).await;
    let processor = test_builder(&peer, "stuck", topic, policy())
        // A rebalance timeout long enough that the acquiesce window (half of it)
        // would hold the shutdown for 60 s.
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(120),
        )
        .commit_interval(Some(Duration::from_millis(100)))
        .shutdown_timeout(Duration::from_secs(3))
        .build()
        .await
        .expect("processor");
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let (stuck_tx, stuck_rx) = tokio::sync::oneshot::channel::<()>();
    let signals = Arc::new(Mutex::new((Some(first_tx), Some(stuck_tx))));
    let handler = owned(move |r: ottla::ConsumerRecord, _cancel| {
        let signals = signals.clone();
        async move {
            let signal = {
                let mut s = signals.lock().expect("lock");
                match r.offset() {
                    1 => s.0.take(),
                    2 => s.1.take(),
                    _ => None,
                }
            };
            if let Some(tx) = signal {
                let _ = tx.send(());
            }
            if r.offset() == 2 {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok(())
        }
    });
    let bootstrap = peer.bootstrap();
    let shutdown = async move {
        let _ = first_rx.await;
        let producer = Producer::builder(&bootstrap)
            .build()
            .await
            .expect("producer");
        for i in 2..5 {
            let r = ProducerRecord::new(topic)
                .partition(0)
                .value(format!("r{i}"));
            producer
                .send(r)
                .await
                .expect("send")
                .await
                .expect("written");
        }
        producer.close().await;
        let _ = stuck_rx.await;
        // Records 0 and 1 are finished; let a commit interval pass.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let run = tokio::time::timeout(Duration::from_secs(20), processor.run(handler, shutdown));
    run.await
        .expect("run returned within 20 s (its shutdown timeout is 3 s)")
        .expect("run");
    let committed = committed_offset(&peer, "stuck", topic).await;
    assert_eq!(
        committed, 2,
        "the finished prefix, and not the stuck record"
    );
}

/// An attempt that runs past `processing_budget` is cancelled and counts as a
/// transient `Timeout`: retried per the policy, then dead-lettered, while the records
/// around it are handled and the loop goes on. The budget used to be checked against
/// the configuration only, and such a handler held its partition for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_an_attempt_past_the_processing_budget_is_a_transient_timeout() {
    let topic = "slow";
    let peer = one_partition(topic);
    produce_to_0(&peer, topic, &["ok", "hangs", "ok"]).await;
    let log = MetricsLog::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let processor = test_builder(&peer, "slow", topic, policy())
        .processing_budget(Duration::from_millis(300))
        .commit_interval(Some(Duration::from_millis(100)))
        .metrics(log.hook())
        .build()
        .await
        .expect("processor");
    let counted = calls.clone();
    let handler = owned(move |r: ottla::ConsumerRecord, _cancel| {
        let counted = counted.clone();
        async move {
            if r.value() == Some(&b"hangs"[..]) {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok(())
        }
    });
    let l = log.clone();
    let done = async move {
        dead_lettered(&l, 1).await;
    };
    tokio::time::timeout(Duration::from_secs(60), processor.run(handler, done))
        .await
        .expect("run ends")
        .expect("run");
    let lettered: Vec<(i64, String, ErrorClass)> = log
        .snapshot()
        .into_iter()
        .filter_map(|m| match m {
            Metric::DeadLettered {
                offset,
                error_type,
                class,
                ..
            } => Some((offset, error_type, class)),
            _ => None,
        })
        .collect();
    assert_eq!(
        lettered,
        vec![(1, "Timeout".to_string(), ErrorClass::Transient)],
        "the hanging record, as a transient timeout"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "the first attempt and policy().max_retries (3) retries"
    );
}

/// A handler cancelled by a shutdown (or a revocation) that stops without finishing
/// says so with `ProcessError::cancelled()`: its record is neither committed nor
/// retried nor dead-lettered, and the records before it are committed. Returning
/// `Ok(())` was the only way to stop, and committed the unprocessed record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_handler_stopped_on_cancellation_leaves_its_record_uncommitted() {
    let topic = "cancelled";
    let peer = one_partition(topic);
    produce_to_0(&peer, topic, &["r0", "r1", "r2"]).await;
    let log = MetricsLog::default();
    let processor = test_builder(&peer, "cancelled", topic, policy())
        .commit_interval(Some(Duration::from_millis(100)))
        .metrics(log.hook())
        .build()
        .await
        .expect("processor");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Arc::new(Mutex::new(Some(started_tx)));
    let handler = owned(
        move |r: ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            let started_tx = started_tx.clone();
            async move {
                if r.offset() == 1 {
                    let tx = started_tx.lock().expect("lock").take();
                    if let Some(tx) = tx {
                        let _ = tx.send(());
                    }
                    cancel.cancelled().await;
                    return Err(ProcessError::cancelled());
                }
                Ok(())
            }
        },
    );
    let shutdown = async move {
        let _ = started_rx.await;
    };
    let stats = tokio::time::timeout(Duration::from_secs(60), processor.run(handler, shutdown))
        .await
        .expect("run ends")
        .expect("run");
    assert_eq!(stats.cancelled, 1, "{stats:?}");
    assert_eq!((stats.retries, stats.dead_lettered), (0, 0), "{stats:?}");
    let errors: Vec<Metric> = log
        .snapshot()
        .into_iter()
        .filter(|m| matches!(m, Metric::Error { .. } | Metric::DeadLettered { .. }))
        .collect();
    assert!(
        errors.is_empty(),
        "a cancellation is not an error: {errors:?}"
    );
    let committed = committed_offset(&peer, "cancelled", topic).await;
    assert_eq!(
        committed, 1,
        "record 0 committed; the cancelled record 1 not"
    );
}

/// A mock cluster of one broker with `topic` of one partition and its dead-letter
/// topic, for the single-partition Processor tests.
fn one_partition(topic: &str) -> Peer {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    peer.create_topic(topic, 1).expect("topic");
    peer.create_topic(&format!("{topic}.dlq"), 1).expect("dlq");
    peer
}

/// `group`'s committed offset of partition 0 of `topic`, read by a consumer of its own
/// that joins the group (and commits nothing).
async fn committed_offset(peer: &Peer, group: &str, topic: &str) -> i64 {
    let mut check = Consumer::builder(&peer.bootstrap())
        .group_id(group)
        .topics([topic])
        .auto_commit(None)
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .build()
        .await
        .expect("checker");
    let started = Instant::now();
    loop {
        if let Some(o) = check.committed(&TopicPartition::new(topic, 0)) {
            return o;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no committed offset"
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), check.recv()).await;
    }
}

/// Resolves once `log` holds `n` dead letters, or after 30 s (the test's own
/// assertions then say what is missing).
async fn dead_lettered(log: &MetricsLog, n: usize) {
    logged(log, n, |m| matches!(m, Metric::DeadLettered { .. })).await;
}

/// Resolves once `log` holds `n` metrics that `which` picks, or after 30 s.
async fn logged(log: &MetricsLog, n: usize, which: impl Fn(&Metric) -> bool) {
    let started = Instant::now();
    while log.snapshot().iter().filter(|m| which(m)).count() < n
        && started.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Produces `values` to partition 0 of `topic`, in order.
async fn produce_to_0(peer: &Peer, topic: &str, values: &[&str]) {
    let values: Vec<(i32, String)> = values.iter().map(|v| (0, v.to_string())).collect();
    produce_values(peer, topic, &values).await;
}

/// Seed 003's "skip": a handler that gives up on a record whose loss is acceptable
/// returns `ProcessError::skip`: the record is committed without a retry or a dead
/// letter, counted by type, and the records after it are handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_skipped_record_is_committed_counted_and_not_dead_lettered() {
    let topic = "clicks";
    let peer = one_partition(topic);
    produce_to_0(&peer, topic, &["a", "garbled", "c"]).await;
    let log = MetricsLog::default();
    let processor = test_builder(&peer, "clicks", topic, policy())
        .commit_interval(Some(Duration::from_millis(100)))
        .metrics(log.hook())
        .build()
        .await
        .expect("processor");
    let handler = owned(|r: ottla::ConsumerRecord, _cancel| async move {
        if r.value() == Some(&b"garbled"[..]) {
            return Err(ProcessError::skip("ClickParse", "not a click event"));
        }
        Ok(())
    });
    let l = log.clone();
    let done = async move {
        let finished = |m: &Metric| matches!(m, Metric::Processed { .. } | Metric::Skipped { .. });
        logged(&l, 3, finished).await;
        // A commit interval.
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let stats = tokio::time::timeout(Duration::from_secs(60), processor.run(handler, done))
        .await
        .expect("run ends")
        .expect("run");
    assert_eq!(
        (
            stats.succeeded,
            stats.skipped,
            stats.retries,
            stats.dead_lettered
        ),
        (2, 1, 0, 0),
        "{stats:?}"
    );
    let skipped: Vec<Metric> = log
        .snapshot()
        .into_iter()
        .filter(|m| matches!(m, Metric::Skipped { .. } | Metric::Error { .. }))
        .collect();
    assert!(
        matches!(&skipped[..], [Metric::Skipped { error_type }] if error_type == "ClickParse"),
        "{skipped:?}"
    );
    assert_eq!(committed_offset(&peer, "clicks", topic).await, 3);
}

/// The topics a processor writes are checked when it is built, before it joins the
/// group: a missing dead-letter or retry topic is an error naming it and its setting,
/// where it used to surface as a halted partition at the first failure. Nothing is
/// created. `check_topics(false)` builds anyway.
async fn missing_written_topics_are_named_at_startup(peer: Peer) {
    protocol_tests::init_tracing();
    let topic = format!("unchecked-{}", peer.name()).to_lowercase();
    peer.create_topic(&topic, 1).expect("topic");
    let builder = || test_builder(&peer, "unchecked", &topic, policy());
    let dlq = format!("{topic}.dlq");
    match builder().build().await {
        Err(Error::Config { setting, message }) => {
            assert_eq!(setting, "dlq_topic");
            assert!(
                message.starts_with(&format!("{dlq}: it does not exist")),
                "{message}"
            );
        }
        other => panic!("a missing dead-letter topic must fail the build: {other:?}"),
    }
    let retry = ottla::processor::retry_topic(&topic, Duration::from_secs(30));
    peer.create_topic(&dlq, 1).expect("dlq");
    let with_retries = || builder().retry_topics(vec![Duration::from_secs(30)]);
    match with_retries().build().await {
        Err(Error::Config { setting, message }) => {
            assert_eq!(setting, "retry_topics");
            assert!(message.contains(&retry), "{message}");
        }
        other => panic!("a missing retry topic must fail the build: {other:?}"),
    }
    let unchecked = with_retries()
        .check_topics(false)
        .build()
        .await
        .expect("unchecked");
    drop(unchecked);
    peer.create_topic(&retry, 1).expect("retry topic");
    with_retries().build().await.expect("every topic exists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_missing_written_topics_are_named_at_startup() {
    missing_written_topics_are_named_at_startup(Peer::mock(1).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_missing_written_topics_are_named_at_startup() {
    missing_written_topics_are_named_at_startup(Peer::tansu().expect("tansu")).await;
}

/// Seed 003's circuit breaker: a handler that finds its downstream failing pauses the
/// processor through its handle. No further call starts (not even the rest of its own
/// task's records), while the group membership and the commits go on; the lag, read
/// from outside through another handle, stays at what was left. Resumed, the
/// processor drains the partition and the lag reaches 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_handler_trips_a_breaker_through_the_handle_and_the_lag_is_read_from_outside() {
    let topic = "breaker";
    let peer = one_partition(topic);
    let values = ["a", "b", "trip", "c", "d", "e"];
    produce_to_0(&peer, topic, &values).await;
    let processor = test_builder(&peer, "breaker", topic, policy())
        .commit_interval(Some(Duration::from_millis(100)))
        .build()
        .await
        .expect("processor");
    let watch = processor.handle();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let handler = tripping("trip", processor.handle(), seen.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(processor.run(handler, stopped));
    let tp = TopicPartition::new(topic, 0);
    until("the breaker trips", || seen.lock().unwrap().len() >= 3).await;
    // Paused: the three records before it are committed and the other three wait.
    until("lag 3", || watch.lag().get(&tp) == Some(&3)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        *seen.lock().unwrap(),
        ["a", "b", "trip"],
        "nothing after the trip"
    );
    assert_eq!(watch.lag().get(&tp), Some(&3));
    watch.resume_all();
    until("all six", || seen.lock().unwrap().len() == 6).await;
    until("lag 0", || watch.lag().get(&tp) == Some(&0)).await;
    let _ = stop.send(());
    let stats = run.await.expect("task").expect("run");
    assert_eq!(stats.succeeded, 6);
    assert_eq!(*seen.lock().unwrap(), values, "each once, in order");
}

/// A handler that keeps each record's value in `seen`, and on the value `trip` pauses
/// every partition through `breaker` (a circuit breaker tripping) before it returns.
fn tripping(
    trip: &'static str,
    breaker: ProcessorHandle,
    seen: Arc<Mutex<Vec<String>>>,
) -> impl Fn(
    &ottla::ConsumerRecord,
    ottla::processor::Cancel,
) -> std::future::Ready<Result<(), ProcessError>>
+ Send
+ Sync
+ 'static {
    move |r: &ottla::ConsumerRecord, _cancel| {
        let value = String::from_utf8_lossy(r.value().unwrap_or_default()).to_string();
        if value == trip {
            breaker.pause_all();
        }
        seen.lock().unwrap().push(value);
        std::future::ready(Ok(()))
    }
}

/// Waits for `ok`, for up to 30 s.
async fn until(what: &str, ok: impl Fn() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < Duration::from_secs(30), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A processor paused by its application asks for no records, yet stays in its group
/// past `max.poll.interval.ms`: the Java client's paused consumer keeps polling, and
/// ottla's processor tells the member it is alive while it holds partitions. Before,
/// with nothing else to wake its loop (commits after each record, no interval), the
/// progress guard ended the membership at `max.poll.interval.ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_paused_processor_stays_in_its_group_past_max_poll_interval() {
    let topic = "held";
    let peer = one_partition(topic);
    produce_to_0(&peer, topic, &["a", "b"]).await;
    let log = MetricsLog::default();
    let processor = test_builder(&peer, "held", topic, policy())
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(4),
        )
        .processing_budget(Duration::from_secs(1))
        .commit_interval(None)
        .metrics(log.hook())
        .build()
        .await
        .expect("processor");
    let outside = processor.handle();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let handler = tripping("a", processor.handle(), seen.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(processor.run(handler, stopped));
    until("a", || seen.lock().unwrap().len() == 1).await;
    // Twice max.poll.interval.ms, paused.
    tokio::time::sleep(Duration::from_secs(8)).await;
    outside.resume_all();
    until("b", || seen.lock().unwrap().len() == 2).await;
    let _ = stop.send(());
    run.await.expect("task").expect("run");
    let group: Vec<Metric> = log
        .snapshot()
        .into_iter()
        .filter(|m| {
            matches!(
                m,
                Metric::Joined { .. } | Metric::Lost { .. } | Metric::Revoked { .. }
            )
        })
        .collect();
    assert!(
        matches!(&group[..], [Metric::Joined { .. }]),
        "one generation, never left: {group:?}"
    );
}

/// A [`Handler`] whose future borrows the record across its awaits: every record is
/// handled with its own bytes, a record that fails once is retried (the lane kept it
/// while the handler borrowed its copy), and the partition is committed to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_handler_whose_future_borrows_the_record_handles_every_record() {
    struct Borrowing {
        seen: Arc<Mutex<Vec<(i64, String)>>>,
        failed: Arc<Mutex<BTreeSet<i64>>>,
    }
    impl ottla::processor::Handler for Borrowing {
        async fn handle(
            &self,
            record: &ottla::ConsumerRecord,
            _cancel: ottla::processor::Cancel,
        ) -> Result<(), ProcessError> {
            // Borrowed from the record, held across an await.
            let value = std::str::from_utf8(record.value().unwrap_or_default())
                .map_err(|e| ProcessError::malformed(e.to_string()))?;
            tokio::task::yield_now().await;
            if value == "flaky" && self.failed.lock().unwrap().insert(record.offset()) {
                return Err(ProcessError::transient("Busy", "once"));
            }
            self.seen
                .lock()
                .unwrap()
                .push((record.offset(), value.to_string()));
            Ok(())
        }
    }
    let topic = "borrowed";
    let peer = one_partition(topic);
    let values = ["a", "b", "flaky", "c", "d"];
    produce_to_0(&peer, topic, &values).await;
    let seen: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
    let handler = Borrowing {
        seen: seen.clone(),
        failed: Arc::default(),
    };
    let log = MetricsLog::default();
    let quick = protocol_tests::quick_retries(3);
    let processor = processor_for(&peer, "borrowing", topic, quick, &log, "range").await;
    let s = seen.clone();
    let done = async move {
        until("every record", || s.lock().unwrap().len() >= 5).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let stats = processor.run_handler(handler, done).await.expect("run");
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<(i64, String)> = values
        .iter()
        .enumerate()
        .map(|(i, v)| (i as i64, v.to_string()))
        .collect();
    assert_eq!(seen, expected, "in order, each with its own bytes");
    assert_eq!((stats.succeeded, stats.retries), (5, 1), "{stats:?}");
    assert_eq!(committed_offset(&peer, "borrowing", topic).await, 5);
}
