//! What the trace-context suites share: a record written with a `traceparent`, a topic
//! read back without a group, and the one `traceparent` of a record.

use std::time::Duration;

use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use ottla::processor::ProcessorHandle;
use ottla::producer::{Producer, ProducerRecord};
use ottla::trace::{TRACEPARENT, TraceContext};

use crate::peer::Peer;

/// The producer's span, as a service upstream would have written it.
pub const SENDER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// [`SENDER`]'s trace id.
pub const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// [`SENDER`]'s span id.
pub const SENDER_SPAN: &str = "00f067aa0ba902b7";

/// Writes one record with `value` and the `traceparent` [`SENDER`] to `topic`.
pub async fn produce_traced(peer: &Peer, topic: &str, value: &str) {
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut record = ProducerRecord::new(topic).value(value.to_string());
    record
        .headers
        .push((TRACEPARENT.to_string(), Some(SENDER.into())));
    producer
        .send(record)
        .await
        .expect("send")
        .await
        .expect("written");
    producer.close().await;
}

/// The first `count` records of `topic`'s partition 0, read without a group.
pub async fn read(peer: &Peer, topic: &str, count: usize) -> Vec<ottla::ConsumerRecord> {
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign([TopicPartition::new(topic, 0)])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("consumer");
    let mut out = Vec::new();
    while out.len() < count {
        let next = tokio::time::timeout(Duration::from_secs(15), consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {count} records of {topic}", out.len()));
        out.push(next.expect("open").expect("record"));
    }
    out
}

/// The one valid `traceparent` among `headers`.
pub fn trace_of(headers: &[(bytes::Bytes, Option<bytes::Bytes>)]) -> TraceContext {
    let values: Vec<_> = headers
        .iter()
        .filter(|(k, _)| &k[..] == TRACEPARENT.as_bytes())
        .collect();
    assert_eq!(values.len(), 1, "one traceparent in {headers:?}");
    values[0]
        .1
        .as_deref()
        .and_then(TraceContext::parse)
        .unwrap_or_else(|| panic!("a valid traceparent in {headers:?}"))
}

/// A shutdown future for a Processor: ready once `want` records were dead-lettered (as
/// its handle's live counters say), or after 60 s.
pub async fn until_dead_lettered(handle: ProcessorHandle, want: u64) {
    let started = std::time::Instant::now();
    while handle.stats().dead_lettered < want && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
