//! The Processor's exactly-once mode on tansu (which writes transaction markers and
//! filters aborted records for `read_committed`; the librdkafka mock does neither,
//! docs/peers.md): an input topic copied to an output topic through
//! [`Cancel::send`](ottla::processor::Cancel::send) is read once per input by
//! `read_committed` consumers of ottla and librdkafka; a transaction that cannot
//! commit is aborted, its outputs never show, and its records are handled again; and
//! the mode is refused without a `transactional.id`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ottla::consumer::{Consumer, IsolationLevel, OffsetReset, TopicPartition};
use ottla::processor::{ProcessingGuarantee, Processor, ProcessorBuilder};
use ottla::producer::{Producer, ProducerRecord};
use protocol_tests::peer::Peer;
use rdkafka::ClientConfig as RdConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer as _};

const PARTITIONS: i32 = 2;
const INPUTS: usize = 40;

async fn produce_inputs(peer: &Peer, topic: &str) {
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for i in 0..INPUTS {
        let r = ProducerRecord::new(topic)
            .partition(i as i32 % PARTITIONS)
            .key(format!("in-{i}"))
            .value(format!("in-{i}"));
        deliveries.push(producer.send(r).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }
    producer.close().await;
}

/// A tansu broker with `input` (holding the inputs), its dead-letter topic, and
/// `output`.
async fn tansu_with_inputs(input: &str, output: &str) -> Peer {
    with_inputs(Peer::tansu().expect("tansu"), input, output).await
}

/// `peer` with `input` (holding the inputs), its dead-letter topic, and `output`.
async fn with_inputs(peer: Peer, input: &str, output: &str) -> Peer {
    peer.create_topic(input, PARTITIONS).expect("topic");
    peer.create_topic(&format!("{input}.dlq"), 1).expect("dlq");
    peer.create_topic(output, PARTITIONS).expect("topic");
    produce_inputs(&peer, input).await;
    peer
}

fn builder(peer: &Peer, group: &str, input: &str) -> ProcessorBuilder {
    Processor::builder(&peer.bootstrap(), group, [input.to_string()])
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(20),
        )
        .processing_budget(Duration::from_secs(5))
        .commit_interval(Some(Duration::from_millis(200)))
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .producer(|p| p.linger(Duration::from_millis(1)))
}

/// Every value of `topic` read by ottla at `isolation` from the start: until `want`
/// are read, then for a second more (a duplicate would come after them).
async fn read_ottla(
    peer: &Peer,
    topic: &str,
    isolation: IsolationLevel,
    want: usize,
) -> Vec<String> {
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign((0..PARTITIONS).map(|p| TopicPartition::new(topic, p)))
        .offset_reset(OffsetReset::Earliest)
        .isolation(isolation)
        .build()
        .await
        .expect("consumer");
    let mut values = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let until = if values.len() < want {
            deadline
        } else {
            tokio::time::Instant::now() + Duration::from_secs(1)
        };
        let Ok(batch) = tokio::time::timeout_at(until, consumer.recv_batch(1000)).await else {
            break;
        };
        for r in &batch.expect("records") {
            values.push(String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned());
        }
    }
    consumer.close().await.expect("close");
    values
}

/// The same with librdkafka's `read_committed` consumer.
async fn read_librdkafka(bootstrap: String, topic: &str, want: usize) -> Vec<String> {
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = RdConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", format!("rd-{topic}"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("rdkafka consumer");
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(&topic, p, rdkafka::Offset::Beginning)
                .expect("tpl");
        }
        consumer.assign(&tpl).expect("assign");
        let mut values = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut quiet_since = None::<std::time::Instant>;
        while std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    values.push(
                        String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                    );
                    quiet_since = None;
                }
                _ if values.len() >= want => {
                    let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > Duration::from_secs(1) {
                        break;
                    }
                }
                _ => {}
            }
        }
        values
    })
    .await
    .expect("reader")
}

/// `output` read with `read_committed` by ottla and by librdkafka: each input's
/// output once.
async fn assert_each_once_by_both(peer: &Peer, output: &str) {
    let ottla = read_ottla(peer, output, IsolationLevel::ReadCommitted, INPUTS).await;
    assert_each_once("ottla read_committed", &ottla);
    let rd = read_librdkafka(peer.bootstrap(), output, INPUTS).await;
    assert_each_once("librdkafka read_committed", &rd);
}

/// A handler's call on `r`: counted in `calls`, and its copy sent to `output` (same
/// partition, the input's value as key). Its value and how many calls it has had.
fn count_and_copy(
    r: &ottla::ConsumerRecord,
    cancel: &ottla::processor::Cancel,
    output: &str,
    calls: &Mutex<BTreeMap<String, usize>>,
) -> (String, usize) {
    let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
    let n = {
        let mut c = calls.lock().unwrap();
        let n = c.entry(v.clone()).or_insert(0);
        *n += 1;
        *n
    };
    cancel.send(
        ProducerRecord::new(output)
            .partition(r.partition())
            .key(v.clone())
            .value(format!("out-{v}")),
    );
    (v, n)
}

/// How many times each value occurs.
fn tally(values: &[String]) -> BTreeMap<String, usize> {
    let mut t = BTreeMap::new();
    for v in values {
        *t.entry(v.clone()).or_insert(0) += 1;
    }
    t
}

/// Each input's output, once: `out-in-0` .. `out-in-39`.
fn assert_each_once(reader: &str, values: &[String]) {
    assert_each_once_but(reader, values, None);
}

/// The same, but for the input `but` (dead-lettered), which has none.
fn assert_each_once_but(reader: &str, values: &[String], but: Option<&str>) {
    let t = tally(values);
    let expected: BTreeMap<String, usize> = (0..INPUTS)
        .filter(|i| but != Some(format!("in-{i}").as_str()))
        .map(|i| (format!("out-in-{i}"), 1))
        .collect();
    assert_eq!(t, expected, "{reader}: each input's output exactly once");
}

/// Runs `processor` with a handler that sends `out-<value>` for each record to
/// `output` (and, where `poison` says so for a value's first attempt, an output too
/// large to write), until every input was handled; the handler calls per value.
async fn copy(
    peer: &Peer,
    processor: Processor,
    output: &str,
    poison: Option<&'static str>,
) -> (ottla::processor::ProcessorStats, BTreeMap<String, usize>) {
    copy_failing(peer, processor, output, poison, None).await
}

/// Resolves once `want` distinct values of `topic` are visible to `read_committed`
/// (or after 90 s).
async fn visible(peer: &Peer, topic: &str, want: usize) {
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign((0..PARTITIONS).map(|p| TopicPartition::new(topic, p)))
        .offset_reset(OffsetReset::Earliest)
        .isolation(IsolationLevel::ReadCommitted)
        .build()
        .await
        .expect("consumer");
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while seen.len() < want {
        let Ok(batch) = tokio::time::timeout_at(deadline, consumer.recv_batch(1000)).await else {
            break;
        };
        for r in &batch.expect("records") {
            seen.insert(String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned());
        }
    }
    consumer.close().await.expect("close");
}

/// [`copy`], and the value `fail` fails for good (it is dead-lettered).
async fn copy_failing(
    peer: &Peer,
    processor: Processor,
    output: &str,
    poison: Option<&'static str>,
    fail: Option<&'static str>,
) -> (ottla::processor::ProcessorStats, BTreeMap<String, usize>) {
    let calls: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let done = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (calls, done, output) = (calls.clone(), done.clone(), output.to_string());
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
            let n = {
                let mut c = calls.lock().unwrap();
                let n = c.entry(v.clone()).or_insert(0);
                *n += 1;
                *n
            };
            if poison == Some(v.as_str()) && n == 1 {
                // Larger than max.request.size: the transaction cannot carry it.
                cancel.send(ProducerRecord::new(&output).value(vec![0u8; 2 * 1024 * 1024]));
            } else {
                cancel.send(
                    ProducerRecord::new(&output)
                        .partition(r.partition())
                        .key(v.clone())
                        .value(format!("out-{v}")),
                );
            }
            let done = done.clone();
            async move {
                done.fetch_add(1, Ordering::SeqCst);
                if fail == Some(v.as_str()) {
                    return Err(ottla::processor::ProcessError::permanent(
                        "Rejected", "for good",
                    ));
                }
                Ok(())
            }
        }
    };
    // Until every expected output is committed (records handled again after an
    // abort may take a while under load; stopping before they finish would leave
    // them, rightly, uncommitted and unwritten, for the next run).
    let want = INPUTS - usize::from(fail.is_some());
    let shutdown = async move {
        visible(peer, output, want).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let stats = processor.run(handler, shutdown).await.expect("run");
    let calls = calls.lock().unwrap().clone();
    (stats, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_exactly_once_copies_each_input_once_for_read_committed_readers() {
    protocol_tests::init_tracing();
    let (input, output) = ("eos-copy-in", "eos-copy-out");
    let peer = tansu_with_inputs(input, output).await;
    let processor = builder(&peer, "eos-copy", input)
        .exactly_once("eos-copy-1")
        .build()
        .await
        .expect("processor");
    let (stats, calls) = copy(&peer, processor, output, None).await;
    assert_eq!(calls.len(), INPUTS, "every input handled");
    assert!(stats.commits > 0, "{stats:?}");
    assert_each_once_by_both(&peer, output).await;
    // The offsets went with the transactions: a second run of the group has nothing
    // left to handle, and writes nothing more.
    let again = builder(&peer, "eos-copy", input)
        .exactly_once("eos-copy-1")
        .build()
        .await
        .expect("processor");
    let (_, calls) = copy_for(again, output, Duration::from_secs(8)).await;
    assert!(
        calls.is_empty(),
        "handled again after the commits: {calls:?}"
    );
}

/// Runs `processor` copying for `dur`; the values handled.
async fn copy_for(
    processor: Processor,
    output: &str,
    dur: Duration,
) -> (ottla::processor::ProcessorStats, BTreeMap<String, usize>) {
    let calls: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let handler = {
        let (calls, output) = (calls.clone(), output.to_string());
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
            *calls.lock().unwrap().entry(v.clone()).or_insert(0) += 1;
            cancel.send(ProducerRecord::new(&output).value(format!("out-{v}")));
            async { Ok(()) }
        }
    };
    let stats = processor
        .run(handler, tokio::time::sleep(dur))
        .await
        .expect("run");
    let calls = calls.lock().unwrap().clone();
    (stats, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_exactly_once_an_output_that_cannot_be_written_aborts_and_the_records_come_again() {
    protocol_tests::init_tracing();
    let (input, output) = ("eos-abort-in", "eos-abort-out");
    let peer = tansu_with_inputs(input, output).await;
    let processor = builder(&peer, "eos-abort", input)
        .exactly_once("eos-abort-1")
        .build()
        .await
        .expect("processor");
    let (_, calls) = copy(&peer, processor, output, Some("in-7")).await;
    assert_eq!(calls.len(), INPUTS, "every input handled: {calls:?}");
    assert!(
        calls.get("in-7").is_some_and(|n| *n >= 2),
        "the poisoned record is handled again after the abort: {calls:?}"
    );
    // The first attempts' outputs were in the aborted transaction: none shows.
    let ottla = read_ottla(&peer, output, IsolationLevel::ReadCommitted, INPUTS).await;
    assert_each_once("ottla read_committed", &ottla);
}

#[test]
fn exactly_once_is_refused_without_a_transactional_id() {
    let b = Processor::builder("127.0.0.1:9092", "g", ["t"])
        .processing_guarantee(ProcessingGuarantee::ExactlyOnce);
    let err = b.validate().expect_err("no transactional.id");
    assert!(
        matches!(
            &err,
            ottla::Error::Config {
                setting: "transactional.id",
                ..
            }
        ),
        "{err:?}"
    );
    let by_property = Processor::builder("127.0.0.1:9092", "g", ["t"])
        .set("processing.guarantee", "exactly_once")
        .expect("a known value");
    assert!(by_property.validate().is_err(), "by property too");
    let with_id = by_property
        .set("transactional.id", "g-1")
        .expect("transactional.id");
    with_id.validate().expect("exactly once with an id");
    let plain_with_id = Processor::builder("127.0.0.1:9092", "g", ["t"])
        .set("transactional.id", "g-1")
        .expect("id");
    assert!(
        plain_with_id.validate().is_err(),
        "a transactional producer without the mode is refused too"
    );
    assert!(
        Processor::builder("127.0.0.1:9092", "g", ["t"])
            .set("processing.guarantee", "twice")
            .is_err()
    );
}

/// A second member joins while the first copies: the first's revocation commits its
/// open transaction before the partitions go, and the second starts from those
/// offsets. `read_committed` readers see each input's output once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_exactly_once_a_revocation_commits_the_transaction_before_the_handover() {
    protocol_tests::init_tracing();
    let (input, output) = ("eos-reb-in", "eos-reb-out");
    let peer = tansu_with_inputs(input, output).await;
    let calls: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (calls, finished, output) = (calls.clone(), finished.clone(), output.to_string());
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
            *calls.lock().unwrap().entry(v.clone()).or_insert(0) += 1;
            cancel.send(ProducerRecord::new(&output).value(format!("out-{v}")));
            let finished = finished.clone();
            // Slow enough that the second member joins mid-stream.
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let log = ottla::processor::MetricsLog::default();
    // The first commits only when its partitions go (or at its end), so what it
    // finished before the revocation is committed by the revocation's transaction.
    let first = builder(&peer, "eos-reb", input)
        .exactly_once("eos-reb-1")
        .commit_interval(Some(Duration::from_secs(600)))
        .metrics(log.hook())
        .build()
        .await
        .expect("first");
    let a = tokio::spawn(first.run(handler.clone(), stop(stop_rx.clone())));
    let started = std::time::Instant::now();
    while calls.lock().unwrap().len() < 6 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first member handles nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = builder(&peer, "eos-reb", input)
        .exactly_once("eos-reb-2")
        .build()
        .await
        .expect("second");
    let b = tokio::spawn(second.run(handler, stop(stop_rx)));
    while finished.load(Ordering::SeqCst) < INPUTS && started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_tx.send(true).expect("stop");
    let (a, b) = (a.await.expect("a"), b.await.expect("b"));
    let (a, b) = (a.expect("first ran"), b.expect("second ran"));
    assert!(
        log.snapshot()
            .iter()
            .any(|m| matches!(m, ottla::processor::Metric::Revoked { .. })),
        "the first member gave partitions back"
    );
    assert!(
        b.commits > 0,
        "the second member committed: {b:?} (first: {a:?})"
    );
    let ottla = read_ottla(&peer, output, IsolationLevel::ReadCommitted, INPUTS).await;
    assert_each_once("ottla read_committed", &ottla);
}

/// At least once, an output that cannot be written (larger than `max.request.size`)
/// stops the commit that would pass its record: the records since the last commit
/// are handled again, and the poisoned record's retry writes its output. Before,
/// the failed write was logged and the record committed without its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_at_least_once_an_output_that_cannot_be_written_is_not_committed_past() {
    protocol_tests::init_tracing();
    let (input, output) = ("alo-poison-in", "alo-poison-out");
    let peer = tansu_with_inputs(input, output).await;
    let processor = builder(&peer, "alo-poison", input)
        .build()
        .await
        .expect("processor");
    let (_, calls) = copy(&peer, processor, output, Some("in-7")).await;
    assert_eq!(calls.len(), INPUTS, "every input handled: {calls:?}");
    assert!(
        calls.get("in-7").is_some_and(|n| *n >= 2),
        "the record whose output failed is handled again: {calls:?}"
    );
    let written = read_ottla(&peer, output, IsolationLevel::ReadUncommitted, INPUTS).await;
    for i in 0..INPUTS {
        let want = format!("out-in-{i}");
        assert!(
            written.contains(&want),
            "{want} written at least once: {written:?}"
        );
    }
}

/// At least once, outputs are written plainly, and only for attempts that succeed:
/// an attempt that fails after sending drops its output, and its retry sends its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_at_least_once_outputs_of_a_failed_attempt_are_dropped() {
    protocol_tests::init_tracing();
    let (input, output) = ("alo-out-in", "alo-out-out");
    let peer = tansu_with_inputs(input, output).await;
    let policy = ottla::processor::RetryPolicy {
        default: ottla::processor::RetryBackoff {
            max_retries: 3,
            initial: Duration::from_millis(50),
            max: Duration::from_millis(50),
            multiplier: 1.0,
            jitter: false,
            min_delay: Duration::ZERO,
        },
        ..ottla::processor::RetryPolicy::default()
    };
    let processor = builder(&peer, "alo-out", input)
        .retry_policy(policy)
        .build()
        .await
        .expect("processor");
    let calls: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (calls, finished, output) = (calls.clone(), finished.clone(), output.to_string());
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            let v = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
            let n = {
                let mut c = calls.lock().unwrap();
                let n = c.entry(v.clone()).or_insert(0);
                *n += 1;
                *n
            };
            cancel.send(ProducerRecord::new(&output).value(format!("out-{v}")));
            let finished = finished.clone();
            async move {
                if v == "in-3" && n == 1 {
                    return Err(ottla::processor::ProcessError::transient(
                        "Busy",
                        "after sending",
                    ));
                }
                finished.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    };
    let shutdown = {
        let finished = finished.clone();
        async move {
            let started = std::time::Instant::now();
            while finished.load(Ordering::SeqCst) < INPUTS
                && started.elapsed() < Duration::from_secs(60)
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    let stats = processor.run(handler, shutdown).await.expect("run");
    assert_eq!(stats.retries, 1, "{stats:?}");
    assert_eq!(calls.lock().unwrap().get("in-3"), Some(&2));
    let values = read_ottla(&peer, output, IsolationLevel::ReadUncommitted, INPUTS).await;
    assert_each_once("ottla read_uncommitted", &values);
}

/// A fenced producer (PRODUCER_FENCED on EndTxn, injected on the librdkafka mock: a
/// newer instance took the transactional.id) stops the run with the fatal
/// transaction error; nothing more is committed by this instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_exactly_once_a_fenced_producer_stops_the_run() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(mock) = &peer else {
        unreachable!()
    };
    let (input, output) = ("eos-fence-in", "eos-fence-out");
    peer.create_topic(input, PARTITIONS).expect("topic");
    peer.create_topic("eos-fence-in.dlq", 1).expect("dlq");
    peer.create_topic(output, PARTITIONS).expect("topic");
    produce_inputs(&peer, input).await;
    let processor = builder(&peer, "eos-fence", input)
        .exactly_once("eos-fence-1")
        .consumer(|c| c.tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50)))
        .build()
        .await
        .expect("processor");
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (calls, output) = (calls.clone(), output.to_string());
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            calls.fetch_add(1, Ordering::SeqCst);
            cancel.send(ProducerRecord::new(&output).value(r.value_bytes().unwrap_or_default()));
            async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(())
            }
        }
    };
    let run = tokio::spawn(processor.run(handler, tokio::time::sleep(Duration::from_secs(60))));
    let started = std::time::Instant::now();
    while calls.load(Ordering::SeqCst) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "nothing handled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // EndTxn is API key 26; PRODUCER_FENCED is 90.
    mock.push_request_errors(26, &[90]);
    let result = run.await.expect("run");
    match result {
        Err(ottla::Error::Transaction(e)) => assert!(e.is_fatal(), "{e:?}"),
        other => panic!("the run goes on after its producer was fenced: {other:?}"),
    }
}

/// A dead letter goes in the transaction of its source record's offset: with an
/// abort on the way (the poisoned output), `read_committed` sees the dead letter once
/// and every other input's output once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_exactly_once_a_dead_letter_is_written_once_with_its_offset() {
    protocol_tests::init_tracing();
    let peer = Peer::tansu().expect("tansu");
    let (input, output, dlq) = ("eos-dlq-in", "eos-dlq-out", "eos-dlq-in.dlq");
    peer.create_topic(input, PARTITIONS).expect("topic");
    peer.create_topic(dlq, 1).expect("dlq");
    peer.create_topic(output, PARTITIONS).expect("topic");
    produce_inputs(&peer, input).await;
    let processor = builder(&peer, "eos-dlq", input)
        .exactly_once("eos-dlq-1")
        .build()
        .await
        .expect("processor");
    let (stats, calls) = copy_failing(&peer, processor, output, Some("in-7"), Some("in-5")).await;
    assert!(
        calls.get("in-7").is_some_and(|n| *n >= 2),
        "the poisoned record came again: {calls:?}"
    );
    assert!(stats.dead_lettered >= 1, "{stats:?}");
    let outputs = read_ottla(&peer, output, IsolationLevel::ReadCommitted, INPUTS - 1).await;
    assert_each_once_but("ottla read_committed", &outputs, Some("in-5"));
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign([TopicPartition::new(dlq, 0)])
        .offset_reset(OffsetReset::Earliest)
        .isolation(IsolationLevel::ReadCommitted)
        .build()
        .await
        .expect("consumer");
    let mut dead = Vec::new();
    loop {
        let wait = if dead.is_empty() { 30 } else { 1 };
        let Ok(batch) =
            tokio::time::timeout(Duration::from_secs(wait), consumer.recv_batch(100)).await
        else {
            break;
        };
        for r in &batch.expect("records") {
            dead.push(String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned());
        }
    }
    consumer.close().await.expect("close");
    assert_eq!(dead, ["in-5"], "the dead letter, once");
}

/// Exactly once, partitions lost while a transaction holds their outputs: the member's
/// heartbeat is refused with UNKNOWN_MEMBER_ID (injected on the patched mock, which
/// keeps transactions as Kafka does), so it loses its partitions without a chance to
/// commit and rejoins. The open transaction is aborted (`Metric::Transaction`,
/// `committed: false`), the records since the last commit are handled again, and
/// `read_committed` readers of ottla and librdkafka see each input's output once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_exactly_once_lost_partitions_abort_the_open_transaction() {
    protocol_tests::init_tracing();
    let (input, output) = ("eos-lost-in", "eos-lost-out");
    let peer = Arc::new(with_inputs(Peer::mock(1).expect("mock"), input, output).await);
    let metrics = ottla::processor::MetricsLog::default();
    let processor = builder(&peer, "eos-lost", input)
        .exactly_once("eos-lost-1")
        // Long enough that the loss comes while the first transaction is open.
        .commit_interval(Some(Duration::from_secs(3)))
        .consumer(|c| c.tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50)))
        .metrics(metrics.hook())
        .build()
        .await
        .expect("processor");
    let calls: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let injected = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler = {
        let (calls, output, injected) = (calls.clone(), output.to_string(), injected.clone());
        let peer = peer.clone();
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            let (v, n) = count_and_copy(r, &cancel, &output, &calls);
            // The sixth input's first attempt: the next heartbeats are refused
            // (Heartbeat is API key 12; UNKNOWN_MEMBER_ID is 25), and the call waits
            // until the loss cancels it.
            let wait = v == "in-5" && n == 1 && !injected.swap(true, Ordering::SeqCst);
            if let (true, Peer::Mock(mock)) = (wait, &*peer) {
                mock.push_request_errors(12, &[25, 25, 25]);
            }
            async move {
                if wait {
                    let _ = tokio::time::timeout(Duration::from_secs(20), cancel.cancelled()).await;
                }
                Ok(())
            }
        }
    };
    processor
        .run(handler, visible(&peer, output, INPUTS))
        .await
        .expect("run");
    let seen = metrics.snapshot();
    assert!(
        seen.iter()
            .any(|m| matches!(m, ottla::processor::Metric::Lost { .. })),
        "the member lost its partitions: {seen:?}"
    );
    assert!(
        seen.iter().any(|m| matches!(
            m,
            ottla::processor::Metric::Transaction {
                committed: false,
                ..
            }
        )),
        "the open transaction was aborted: {seen:?}"
    );
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), INPUTS, "every input handled: {calls:?}");
    assert!(
        calls.values().any(|n| *n >= 2),
        "records of the aborted transaction are handled again: {calls:?}"
    );
    assert_each_once_by_both(&peer, output).await;
}

/// Exactly once, the member's generation moves on under it while it rejoins: a
/// rebalance (a Heartbeat refused with REBALANCE_IN_PROGRESS, injected) makes it join
/// again, and as leader it holds its SyncGroup for 2 s (`leader_sync_delay`). From
/// its JoinGroup's answer on, the group is at the next generation while the member's
/// metadata still names the last one, and it goes on handling the partitions it
/// keeps (cooperative). The group coordinator refuses its transaction's offsets
/// (ILLEGAL_GENERATION). The Processor tried again each commit interval and aborted
/// each time, handing every record since the last commit back to the handler, more
/// of them each time (exactly-once chaos, classic protocol, seed 44090011: 30 refusals
/// in 6 s). It now aborts once and keeps the commits back until the member's metadata
/// changes: one aborted transaction, and each input's output read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_exactly_once_a_refused_generation_waits_for_the_next_instead_of_aborting_each_interval()
 {
    protocol_tests::init_tracing();
    let (input, output) = ("eos-stale-in", "eos-stale-out");
    let peer = Arc::new(with_inputs(Peer::mock(1).expect("mock"), input, output).await);
    let metrics = ottla::processor::MetricsLog::default();
    let processor = builder(&peer, "eos-stale", input)
        .exactly_once("eos-stale-1")
        .consumer(|c| {
            c.assignors(["cooperative-sticky"])
                .expect("a built-in assignor")
                .tweak_group(|g| g.leader_sync_delay = Duration::from_secs(2))
        })
        .metrics(metrics.hook())
        .build()
        .await
        .expect("processor");
    let calls: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let injected = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler = {
        let (calls, output, injected) = (calls.clone(), output.to_string(), injected.clone());
        let peer = peer.clone();
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            count_and_copy(r, &cancel, &output, &calls);
            // The first call: the next Heartbeat is refused with
            // REBALANCE_IN_PROGRESS (API key 12, error 27). Each call takes 300 ms,
            // so that records finish, and commits fall due, all through the rejoin
            // (the 20 inputs of each partition take 6 s).
            if let Peer::Mock(mock) = &*peer
                && !injected.swap(true, Ordering::SeqCst)
            {
                mock.push_request_errors(12, &[27]);
            }
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(())
            }
        }
    };
    processor
        .run(handler, visible(&peer, output, INPUTS))
        .await
        .expect("run");
    let seen = metrics.snapshot();
    let aborted = seen
        .iter()
        .filter(|m| {
            matches!(
                m,
                ottla::processor::Metric::Transaction {
                    committed: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        aborted, 1,
        "one transaction aborted for the stale generation, not one per commit interval: {seen:?}"
    );
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), INPUTS, "every input handled: {calls:?}");
    assert_each_once_by_both(&peer, output).await;
}

/// Exactly once, the lag (`ProcessorHandle::lag`) counts from the offsets the
/// transactions committed. The group's second run starts from offsets committed by
/// its first, handles 40 more inputs and commits them in transactions; the consumer
/// under it commits nothing itself, and its view of the committed offsets stayed at
/// those read at the assignment: the lag never fell below the 20 records per
/// partition handled since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_exactly_once_lag_counts_from_the_transactions_offsets() {
    protocol_tests::init_tracing();
    let (input, output) = ("eos-lag-in", "eos-lag-out");
    let peer = tansu_with_inputs(input, output).await;
    let first = builder(&peer, "eos-lag", input)
        .exactly_once("eos-lag-1")
        .build()
        .await
        .expect("processor");
    copy(&peer, first, output, None).await;
    produce_inputs(&peer, input).await;
    let second = builder(&peer, "eos-lag", input)
        .exactly_once("eos-lag-1")
        .build()
        .await
        .expect("processor");
    let watch = second.handle();
    let calls = Arc::new(AtomicUsize::new(0));
    let lag = Arc::new(Mutex::new(BTreeMap::new()));
    let handler = {
        let (calls, output) = (calls.clone(), output.to_string());
        move |r: &ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            calls.fetch_add(1, Ordering::SeqCst);
            cancel.send(ProducerRecord::new(&output).value(r.value_bytes().unwrap_or_default()));
            async { Ok(()) }
        }
    };
    let shutdown = {
        let (calls, lag) = (calls.clone(), lag.clone());
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let now = watch.lag();
                let settled = calls.load(Ordering::SeqCst) >= INPUTS
                    && now.len() == PARTITIONS as usize
                    && now.values().all(|l| *l == 0);
                *lag.lock().unwrap() = now;
                if settled || tokio::time::Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    second.run(handler, shutdown).await.expect("run");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        INPUTS,
        "the second batch of inputs"
    );
    let lag = lag.lock().unwrap().clone();
    assert!(
        lag.len() == PARTITIONS as usize && lag.values().all(|l| *l == 0),
        "the lag once every input is committed: {lag:?}"
    );
}

/// A transactional producer closed with its transaction open aborts it, as Java's
/// `close` does ("Aborting incomplete transaction due to shutdown"). Left open, the
/// transaction held back the last stable offset of its partitions: a `read_committed`
/// reader saw nothing written after it until the coordinator's timeout
/// (`transaction.timeout.ms`, 60 s by default, far longer than this test reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_producer_closed_mid_transaction_aborts_it() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let topic = "eos-close";
    peer.create_topic(topic, 1).expect("topic");
    let producer = Producer::builder(&peer.bootstrap())
        .transactional_id("eos-close-1")
        .linger(Duration::from_millis(1))
        .build()
        .await
        .expect("producer");
    producer.init_transactions().await.expect("init");
    producer.begin_transaction().expect("begin");
    for i in 0..5 {
        producer
            .send(
                ProducerRecord::new(topic)
                    .partition(0)
                    .value(format!("open-{i}")),
            )
            .await
            .expect("send")
            .await
            .expect("written");
    }
    producer.close().await;
    let plain = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("plain");
    for i in 0..3 {
        plain
            .send(
                ProducerRecord::new(topic)
                    .partition(0)
                    .value(format!("after-{i}")),
            )
            .await
            .expect("send")
            .await
            .expect("written");
    }
    plain.close().await;
    let mut reader = Consumer::builder(&peer.bootstrap())
        .assign([TopicPartition::new(topic, 0)])
        .offset_reset(OffsetReset::Earliest)
        .isolation(IsolationLevel::ReadCommitted)
        .build()
        .await
        .expect("reader");
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < 3 {
        let Ok(batch) = tokio::time::timeout_at(deadline, reader.recv_batch(100)).await else {
            break;
        };
        for r in &batch.expect("records") {
            seen.push(String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned());
        }
    }
    reader.close().await.expect("close");
    assert_eq!(
        seen,
        vec!["after-0", "after-1", "after-2"],
        "the closed producer's transaction was aborted, and what came after it is readable"
    );
}

/// Exactly once, a commit slower than `max.block.ms` is waited for again (as Java asks
/// of a timed-out `commitTransaction`), not aborted: its EndTxn is answered 2.5 s late
/// (injected on the mock) while `max.block.ms` is 1 s. Before, the timeout aborted it,
/// which the producer refused (the commit was under way), and the lanes were rewound
/// while the commit landed: its records were handled and written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_exactly_once_a_slow_commit_is_waited_for_not_aborted() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(mock) = &peer else {
        unreachable!()
    };
    let (input, output) = ("eos-slow-in", "eos-slow-out");
    peer.create_topic(input, PARTITIONS).expect("topic");
    peer.create_topic("eos-slow-in.dlq", 1).expect("dlq");
    peer.create_topic(output, PARTITIONS).expect("topic");
    produce_inputs(&peer, input).await;
    let broker = mock.broker_ids().first().copied().expect("a broker");
    // EndTxn is API key 26: the first one is answered (with no error) 2.5 s late.
    mock.push_broker_request_errors(broker, 26, &[(0i16, Duration::from_millis(2500))])
        .expect("delay");
    let metrics = ottla::processor::MetricsLog::default();
    let processor = builder(&peer, "eos-slow", input)
        .exactly_once("eos-slow-1")
        .producer(|p| {
            p.linger(Duration::from_millis(1))
                .max_block(Duration::from_secs(1))
        })
        .consumer(|c| c.tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50)))
        .metrics(metrics.hook())
        .build()
        .await
        .expect("processor");
    // Long past the slow commit: a rewound lane would have handled its records again.
    let (_, calls) = copy_for(processor, output, Duration::from_secs(12)).await;
    assert_eq!(calls.len(), INPUTS, "every input handled: {calls:?}");
    assert!(
        calls.values().all(|n| *n == 1),
        "nothing handled twice (the slow commit landed): {calls:?}"
    );
    assert!(
        !metrics.snapshot().iter().any(|m| matches!(
            m,
            ottla::processor::Metric::Transaction {
                committed: false,
                ..
            }
        )),
        "no transaction aborted"
    );
    let ottla = read_ottla(&peer, output, IsolationLevel::ReadCommitted, INPUTS).await;
    assert_each_once("ottla read_committed", &ottla);
}
