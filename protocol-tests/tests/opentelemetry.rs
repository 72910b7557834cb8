//! The `opentelemetry` feature against the OpenTelemetry SDK: with a
//! `tracing-opentelemetry` layer installed, the handler's span is exported as a child
//! of the record's remote parent, with the SDK's own span id, and the dead letter and
//! what the handler produces name that exported span as their parent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use ottla::consumer::OffsetReset;
use ottla::processor::{ProcessError, Processor};
use ottla::producer::{Producer, ProducerRecord};
use ottla::trace::TraceContext;
use protocol_tests::peer::Peer;
use protocol_tests::traced::{
    SENDER_SPAN, TRACE_ID, produce_traced, read, trace_of, until_dead_lettered,
};
use tracing_subscriber::layer::SubscriberExt;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_the_handlers_exported_span_is_the_dead_letters_parent() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("ottla-test"));
    // Only ottla's per-record spans go to OpenTelemetry here.
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target("ottla::record", tracing::Level::DEBUG);
    let subscriber =
        tracing_subscriber::registry().with(tracing_subscriber::Layer::with_filter(layer, filter));
    tracing::subscriber::set_global_default(subscriber).expect("the test's subscriber");

    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    for t in ["otel", "otel.dlq", "otel.out"] {
        peer.create_topic(t, 1).expect("topic");
    }
    produce_traced(&peer, "otel", "poison").await;
    let processor = Processor::builder(&peer.bootstrap(), "otel-group", ["otel"])
        .consumer(|c| c.offset_reset(OffsetReset::Earliest))
        .build()
        .await
        .expect("processor");
    let side = Arc::new(
        Producer::builder(&peer.bootstrap())
            .build()
            .await
            .expect("producer"),
    );
    let seen: Arc<Mutex<Vec<Option<TraceContext>>>> = Arc::default();
    let done = until_dead_lettered(processor.handle(), 1);
    let (s, p) = (seen.clone(), side.clone());
    let stats = processor
        .run(
            move |_record, _| {
                let (s, p) = (s.clone(), p.clone());
                async move {
                    s.lock().unwrap().push(ottla::trace::current());
                    p.send(ProducerRecord::new("otel.out").value("side effect"))
                        .await
                        .expect("send")
                        .await
                        .expect("written");
                    Err(ProcessError::permanent("Rejected", "not this one"))
                }
            },
            done,
        )
        .await
        .expect("run");
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");
    drop(side);

    let spans = exporter.get_finished_spans().expect("spans");
    let handler: Vec<_> = spans.iter().filter(|s| s.name == "ottla.process").collect();
    assert_eq!(handler.len(), 1, "{spans:#?}");
    let h = handler[0];
    assert_eq!(hex(&h.span_context.trace_id().to_bytes()), TRACE_ID);
    assert_eq!(
        hex(&h.parent_span_id.to_bytes()),
        SENDER_SPAN,
        "the sender's child"
    );
    assert!(h.parent_span_is_remote);
    assert_eq!(h.span_kind, SpanKind::Consumer);
    let own = hex(&h.span_context.span_id().to_bytes());
    // The fields carry the ids OpenTelemetry gave the span.
    let attribute = |key: &str| {
        h.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attribute("span_id").as_deref(), Some(own.as_str()));
    assert_eq!(attribute("topic").as_deref(), Some("otel"));

    let inside = seen
        .lock()
        .unwrap()
        .first()
        .copied()
        .flatten()
        .expect("current()");
    assert_eq!(inside.span_id_hex(), own);
    let letter = trace_of(&read(&peer, "otel.dlq", 1).await[0].headers_owned());
    assert_eq!(
        (letter.trace_id_hex(), letter.span_id_hex()),
        (TRACE_ID.to_string(), own.clone()),
        "the dead letter's parent is the exported span"
    );
    let produced = trace_of(&read(&peer, "otel.out", 1).await[0].headers_owned());
    assert_eq!(
        (produced.trace_id_hex(), produced.span_id_hex()),
        (TRACE_ID.to_string(), own),
        "and so is the record the handler produced"
    );
    let _ = provider.shutdown();
}
