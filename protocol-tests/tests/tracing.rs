//! Traces through the Processor against the mock: a record produced with a W3C
//! `traceparent` is handled in a span that continues its trace, and what the handler
//! produces, the record's retry-topic hop and its dead letter go on from that span.
//! The spans are read by a `tracing` layer installed in the test.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, OffsetReset};
use ottla::processor::{ProcessError, Processor, owned, retry_topic};
use ottla::producer::{Producer, ProducerRecord};
use ottla::trace::TraceContext;
use protocol_tests::peer::Peer;
use protocol_tests::traced::{
    SENDER, SENDER_SPAN, TRACE_ID, produce_traced, read, trace_of, until_dead_lettered,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as the layer saw it: its name, its fields (as recorded), and the name of
/// its `tracing` parent.
#[derive(Debug, Clone, Default)]
struct SpanSeen {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<&'static str>,
    /// The span was closed (every handle to it dropped).
    closed: bool,
}

#[derive(Default)]
struct Fields<'a>(Option<&'a mut BTreeMap<String, String>>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if let Some(f) = self.0.as_mut() {
            f.insert(field.name().to_string(), format!("{value:?}"));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if let Some(f) = self.0.as_mut() {
            f.insert(field.name().to_string(), value.to_string());
        }
    }
}

/// Keeps every span of the process (debug level included), by id.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<BTreeMap<u64, SpanSeen>>>);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = SpanSeen {
            name: attrs.metadata().name(),
            parent: ctx
                .span(id)
                .and_then(|s| s.parent())
                .map(|p| p.metadata().name()),
            ..SpanSeen::default()
        };
        attrs.record(&mut Fields(Some(&mut seen.fields)));
        self.0.lock().unwrap().insert(id.into_u64(), seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(seen) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(Some(&mut seen.fields)));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        // Ids are reused once closed: keep the closed span under a fresh key.
        let mut spans = self.0.lock().unwrap();
        if let Some(mut seen) = spans.remove(&id.into_u64()) {
            seen.closed = true;
            let key = CLOSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            spans.insert(key, seen);
        }
    }
}

/// Keys for closed spans, above any live span's id.
static CLOSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 62);

/// The process's layer, installed by the first test that asks (nextest runs each test
/// in a process of its own; under `cargo test` they share it and read their own topics).
fn capture() -> Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let capture = Capture::default();
            // The usual test output too (`RUST_LOG`, `warn` unless set).
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
            let output = tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(filter);
            let subscriber = tracing_subscriber::registry()
                .with(capture.clone())
                .with(output);
            tracing::subscriber::set_global_default(subscriber).expect("the test's subscriber");
            capture
        })
        .clone()
}

/// The `ottla.process` spans of `topic`, in the order they were opened.
fn process_spans(capture: &Capture, topic: &str) -> Vec<SpanSeen> {
    capture
        .0
        .lock()
        .unwrap()
        .values()
        .filter(|s| {
            s.name == "ottla.process" && s.fields.get("topic").map(String::as_str) == Some(topic)
        })
        .cloned()
        .collect()
}

fn field<'a>(span: &'a SpanSeen, name: &str) -> &'a str {
    span.fields
        .get(name)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("{name} missing in {span:?}"))
}

/// Runs `processor` with `handler` until `want` records were dead-lettered (or 60 s).
async fn run_until_dead_lettered<H, F>(processor: Processor, want: u64, handler: H)
where
    H: Fn(ottla::ConsumerRecord, ottla::processor::Cancel) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = Result<(), ProcessError>> + Send + 'static,
{
    let done = until_dead_lettered(processor.handle(), want);
    let stats = processor.run(owned(handler), done).await.expect("run");
    assert_eq!(stats.dead_lettered, want, "{stats:?}");
}

/// The acceptance: a record with a `traceparent`, a handler that fails
/// permanently. The handler's span has the record's trace id and the sender as its
/// parent; the dead letter's `traceparent` is of the same trace with the handler's span
/// as its parent; a record the handler produces is that span's child too, and
/// `ottla::trace::current()` names that span inside the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_dead_lettered_record_continues_its_trace_through_the_handler() {
    let capture = capture();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    for t in ["traced", "traced.dlq", "traced.out"] {
        peer.create_topic(t, 1).expect("topic");
    }
    produce_traced(&peer, "traced", "poison").await;

    let processor = Processor::builder(&peer.bootstrap(), "traced-group", ["traced"])
        .retry_policy(protocol_tests::quick_retries(2))
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .build()
        .await
        .expect("processor");
    let out = Arc::new(
        Producer::builder(&peer.bootstrap())
            .build()
            .await
            .expect("producer"),
    );
    let current: Arc<Mutex<Vec<Option<TraceContext>>>> = Arc::default();
    let (seen, side) = (current.clone(), out.clone());
    run_until_dead_lettered(processor, 1, move |_record, _| {
        let (seen, side) = (seen.clone(), side.clone());
        async move {
            seen.lock().unwrap().push(ottla::trace::current());
            side.send(ProducerRecord::new("traced.out").value("side effect"))
                .await
                .expect("send")
                .await
                .expect("written");
            Err(ProcessError::permanent("Rejected", "not this one"))
        }
    })
    .await;
    drop(out);

    // One attempt (a permanent error is not retried), in one span of the sender's trace.
    let spans = process_spans(&capture, "traced");
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let span = &spans[0];
    assert_eq!(field(span, "trace_id"), TRACE_ID);
    assert_eq!(
        field(span, "parent_span_id"),
        SENDER_SPAN,
        "the sender's child"
    );
    assert_eq!(field(span, "group"), "traced-group");
    assert_eq!(field(span, "attempt"), "1");
    assert_eq!(field(span, "offset"), "0");
    let own = field(span, "span_id").to_string();
    assert!(own.len() == 16 && own != SENDER_SPAN, "its own id: {own}");

    let current = current.lock().unwrap().clone();
    let inside = current
        .first()
        .copied()
        .flatten()
        .expect("current() inside the handler");
    assert_eq!(
        (inside.trace_id_hex(), inside.span_id_hex()),
        (TRACE_ID.to_string(), own.clone())
    );

    let letters = read(&peer, "traced.dlq", 1).await;
    let letter = trace_of(&letters[0].headers_owned());
    assert_eq!(
        letter.trace_id_hex(),
        TRACE_ID,
        "the dead letter is of the same trace"
    );
    assert_eq!(
        letter.span_id_hex(),
        own,
        "and the handler's span is its parent"
    );
    assert!(letter.sampled);
    assert_eq!(letters[0].value(), Some(&b"poison"[..]));

    let produced = read(&peer, "traced.out", 1).await;
    let child = trace_of(&produced[0].headers_owned());
    assert_eq!(
        (child.trace_id_hex(), child.span_id_hex()),
        (TRACE_ID.to_string(), own),
        "what the handler produces goes on from its span"
    );
}

/// One trace over a record's whole path: attempt 1 on the topic fails (no retries in
/// place), the hop to the retry topic carries that attempt's span, the attempt on the
/// retry topic is its child, and the dead letter is the child of that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_record_keeps_one_trace_through_a_retry_topic_to_its_dead_letter() {
    let capture = capture();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    let topic = "hopping";
    let delay = Duration::from_millis(200);
    let hop_topic = retry_topic(topic, delay);
    for t in [topic, hop_topic.as_str(), "hopping.dlq"] {
        peer.create_topic(t, 1).expect("topic");
    }
    produce_traced(&peer, topic, "always fails").await;
    let processor = Processor::builder(&peer.bootstrap(), "hopping-group", [topic])
        .retry_policy(protocol_tests::quick_retries(0))
        .retry_topics(vec![delay])
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .build()
        .await
        .expect("processor");
    run_until_dead_lettered(processor, 1, |_record, _| async {
        Err(ProcessError::transient("Busy", "still down"))
    })
    .await;

    let first = process_spans(&capture, topic);
    let on_hop = process_spans(&capture, &hop_topic);
    assert_eq!(
        (first.len(), on_hop.len()),
        (1, 1),
        "{first:#?}\n{on_hop:#?}"
    );
    let (first, on_hop) = (&first[0], &on_hop[0]);
    for span in [first, on_hop] {
        assert_eq!(field(span, "trace_id"), TRACE_ID, "{span:?}");
    }
    assert_eq!(field(first, "parent_span_id"), SENDER_SPAN);
    assert_eq!(
        field(on_hop, "parent_span_id"),
        field(first, "span_id"),
        "the attempt on the retry topic is the first attempt's child"
    );
    let letters = read(&peer, "hopping.dlq", 1).await;
    let letter = trace_of(&letters[0].headers_owned());
    assert_eq!(letter.trace_id_hex(), TRACE_ID);
    assert_eq!(
        letter.span_id_hex(),
        field(on_hop, "span_id"),
        "the dead letter is the last attempt's child"
    );
}

/// The spans of every (named) span of `group`.
fn group_spans(capture: &Capture, group: &str) -> Vec<SpanSeen> {
    capture
        .0
        .lock()
        .unwrap()
        .values()
        .filter(|s| s.fields.get("group").map(String::as_str) == Some(group))
        .cloned()
        .collect()
}

/// A rebalance, its JoinGroup, SyncGroup and assignment, a revocation, a commit, the
/// fetch rounds and the produce rounds each have their span, as the table in
/// `ottla::trace` says: a first member joins alone (it leads and assigns), a second
/// joins and the first gives its partitions back (eager `range`), then it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_rebalances_commits_fetches_and_produces_have_spans() {
    let capture = capture();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(100));
    let (topic, group) = ("spanned", "spanned-group");
    peer.create_topic(topic, 2).expect("topic");
    produce_traced(&peer, topic, "one").await;
    let member = || {
        Consumer::builder(&peer.bootstrap())
            .group_id(group)
            .topics([topic])
            .offset_reset(OffsetReset::Earliest)
            .assignors(["range"])
            .expect("range")
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(300))
            .max_poll_interval(Duration::from_secs(20))
            // The mock's SyncGroup race (PEERS.md): followers' SyncGroups go first.
            .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
            .build()
    };
    let mut first = member().await.expect("first");
    let record = tokio::time::timeout(Duration::from_secs(20), first.recv())
        .await
        .expect("a record within 20 s")
        .expect("open")
        .expect("record");
    assert_eq!(record.value(), Some(&b"one"[..]));
    let mut second = member().await.expect("second");
    // The first member gives its partitions back and joins the second generation.
    let started = Instant::now();
    let settled = |spans: &[SpanSeen]| {
        spans
            .iter()
            .filter(|s| {
                s.name == "ottla.rebalance" && s.closed && s.fields.contains_key("assigned")
            })
            .count()
    };
    while settled(&group_spans(&capture, group)) < 3 && started.elapsed() < Duration::from_secs(30)
    {
        tokio::select! {
            _ = first.recv() => {}
            _ = second.recv() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    first.commit().await.expect("commit");
    first.close().await.expect("close");
    second.close().await.expect("close");

    let spans = group_spans(&capture, group);
    let named = |name: &str| spans.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    let rebalances = named("ottla.rebalance");
    // The first member's two generations and the second member's first.
    assert!(settled(&spans) >= 3, "{spans:#?}");
    let led = rebalances
        .iter()
        .filter(|s| s.fields.get("leader").map(String::as_str) == Some("true"))
        .count();
    assert!(led >= 2, "the leader's rebalances say so: {rebalances:#?}");
    for r in rebalances
        .iter()
        .filter(|r| r.fields.contains_key("assigned"))
    {
        for f in ["generation", "member_id", "leader"] {
            assert!(
                r.fields.contains_key(f),
                "{f} of a finished rebalance: {r:?}"
            );
        }
    }
    for (child, parent) in [
        ("ottla.join", "ottla.rebalance"),
        ("ottla.sync", "ottla.rebalance"),
        ("ottla.assign", "ottla.rebalance"),
        ("ottla.revoke", "ottla.rebalance"),
    ] {
        let found = named(child);
        assert!(!found.is_empty(), "no {child} in {spans:#?}");
        for s in found {
            assert_eq!(s.parent, Some(parent), "{s:?}");
        }
    }
    let revoke = named("ottla.revoke");
    assert!(
        revoke
            .iter()
            .any(|s| s.closed && field(s, "partitions") == "2"),
        "the first member gave back both partitions: {revoke:#?}"
    );
    let commits = named("ottla.commit");
    assert!(
        // Range gave each member one of the two partitions.
        commits
            .iter()
            .any(|s| field(s, "partitions") == "1" && s.closed),
        "{commits:#?}"
    );

    let all = capture.0.lock().unwrap().clone();
    assert!(
        all.values()
            .any(|s| s.name == "ottla.fetch" && s.fields.contains_key("broker")),
        "fetch rounds"
    );
    assert!(
        all.values().any(|s| s.name == "ottla.produce" && s.closed),
        "produce rounds"
    );
}

/// `run_batch`: three records, the second traced, rejected by index. The batch's span
/// carries no trace; the failing record's dead letter passes its own context on (its
/// sender's span as parent), and the records around it are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_batch_handlers_dead_letter_passes_the_records_own_trace_on() {
    let capture = capture();
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    for t in ["batched", "batched.dlq"] {
        peer.create_topic(t, 1).expect("topic");
    }
    // One Produce, one record batch: the three come to the handler in one call.
    let producer = Producer::builder(&peer.bootstrap())
        .linger(Duration::from_millis(200))
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for v in ["before", "traced", "after"] {
        let mut record = ProducerRecord::new("batched").value(v);
        if v == "traced" {
            record
                .headers
                .push((ottla::trace::TRACEPARENT.to_string(), Some(SENDER.into())));
        }
        deliveries.push(producer.send(record).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }
    producer.close().await;
    let processor = Processor::builder(&peer.bootstrap(), "batched-group", ["batched"])
        .retry_policy(protocol_tests::quick_retries(0))
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .build()
        .await
        .expect("processor");
    let done = until_dead_lettered(processor.handle(), 1);
    let stats = processor
        .run_batch(
            10,
            |records: &[ottla::ConsumerRecord], _| {
                let traced = records
                    .iter()
                    .position(|r| r.value() == Some(&b"traced"[..]));
                async move {
                    match traced {
                        Some(i) => Err(ottla::processor::BatchError::at(
                            i,
                            ProcessError::permanent("Rejected", "not this one"),
                        )),
                        None => Ok(()),
                    }
                }
            },
            done,
        )
        .await
        .expect("run");
    assert_eq!((stats.dead_lettered, stats.succeeded), (1, 2), "{stats:?}");
    let letter = trace_of(&read(&peer, "batched.dlq", 1).await[0].headers_owned());
    assert_eq!(
        (letter.trace_id_hex(), letter.span_id_hex()),
        (TRACE_ID.to_string(), SENDER_SPAN.to_string())
    );
    let batches: Vec<_> = capture
        .0
        .lock()
        .unwrap()
        .values()
        .filter(|s| {
            s.name == "ottla.process_batch"
                && s.fields.get("group").map(String::as_str) == Some("batched-group")
        })
        .cloned()
        .collect();
    assert_eq!(batches.len(), 1, "one call on the three: {batches:?}");
    assert_eq!(
        batches[0].fields.get("records").map(String::as_str),
        Some("3")
    );
    assert!(batches.iter().all(|s| !s.fields.contains_key("trace_id")));
}
