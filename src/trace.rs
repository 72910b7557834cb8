//! Traces that follow a record: `tracing` spans, and the W3C trace context
//! (`traceparent`) a record carries from its producer to its handler, and on into the
//! records produced on its behalf.
//!
//! # Spans
//!
//! | span | level, target | opened around | fields |
//! |---|---|---|---|
//! | `ottla.process` | debug, `ottla::record` | one handler call on one record ([`Processor::run`](crate::processor::Processor::run)) | group, topic, partition, offset, attempt, and with a trace context trace_id, span_id, parent_span_id |
//! | `ottla.process_batch` | debug, `ottla::record` | one [`Processor::run_batch`](crate::processor::Processor::run_batch) call | group, topic, partition, first_offset, records |
//! | `ottla.rebalance` | info, `ottla::rebalance` | from the first JoinGroup of a rebalance to its assignment | group, and at the end generation, member_id, leader, assigned |
//! | `ottla.join`, `ottla.sync` | info, `ottla::rebalance` | one JoinGroup, one SyncGroup (children of `ottla.rebalance`) | group |
//! | `ottla.assign` | info, `ottla::rebalance` | the leader's assignor run | group, members |
//! | `ottla.revoke` | info, `ottla::rebalance` | from a revocation's request to the application's answer | group, generation, partitions |
//! | `ottla.commit` | debug, `ottla::commit` | one OffsetCommit | group, generation, partitions |
//! | `ottla.fetch` | debug, `ottla::fetch` | one Fetch round to one broker | broker |
//! | `ottla.produce` | debug, `ottla::produce` | one Produce round to one broker | broker |
//!
//! The per-record, fetch and produce spans are at debug level: a subscriber at info
//! (the usual setting) never builds them, so they cost one check per record. Turn them
//! on by target, for example `RUST_LOG=info,ottla::record=debug`.
//!
//! # Trace context
//!
//! A record whose headers carry a valid `traceparent` continues that trace:
//! - its `ottla.process` span records the trace id, its own span id and the sender's
//!   span id as its parent (`trace_id`, `span_id`, `parent_span_id`);
//! - inside the handler, [`current`] returns that span's context, and
//!   [`Producer::send`](crate::producer::Producer::send) writes it into every record
//!   that has no `traceparent` of its own;
//! - a retry-topic hop and a dead letter of the record carry the context of the
//!   attempt that sent them there, so the next hop's span (and a DLQ consumer's) is its
//!   child: one trace shows the record's whole path.
//!
//! Span ids are derived from the trace and what the span is about (group, topic,
//! partition, offset, attempt): the same attempt always has the same id, and no random
//! source is needed. When the `ottla.process` span is not enabled, the record's context
//! is passed on unchanged, as the specification asks of a participant that records
//! nothing.
//!
//! With the `opentelemetry` feature and a `tracing-opentelemetry` layer, the
//! `ottla.process` span is exported with the record's sender as its remote parent and
//! OpenTelemetry's own span id, that id is what goes into the records, and
//! [`Producer::send`](crate::producer::Producer::send) writes the current OpenTelemetry
//! context. A record without a `traceparent` then starts a new trace.

use std::future::Future;

use tracing::Instrument;
use tracing::field::Empty;

use crate::proto::fetch::fetcher::ConsumerRecord;
pub use crate::proto::trace::{TRACEPARENT, TraceContext};

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// The trace context of the record whose handler is running on this task (its
/// `ottla.process` span's, or the record's own when that span is not enabled); `None`
/// outside a handler, or for a record without a `traceparent`.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(|c| *c).ok()
}

/// Runs `f` with `context` as [`current`].
pub async fn scope<F: Future>(context: TraceContext, f: F) -> F::Output {
    CURRENT.scope(context, f).await
}

/// Whether a record's handler call needs no span and no trace context: `DEBUG` is off
/// for every subscriber (so [`record_span`]'s span would be disabled) and the record
/// has no header (so no `traceparent`). Such a call is made as it is, without
/// [`record_span`] or [`traced`].
#[inline]
pub(crate) fn untraced(record: &ConsumerRecord) -> bool {
    !tracing::level_enabled!(tracing::Level::DEBUG) && !record.has_headers()
}

/// The span of one handler call on `record` (attempt `attempt`, 1 for the first) and
/// the trace context the call runs in: the span's own when the span is enabled and the
/// record carries a trace, the record's when the span is not enabled.
pub(crate) fn record_span(
    group: &str,
    record: &ConsumerRecord,
    attempt: u32,
) -> (tracing::Span, Option<TraceContext>) {
    let span = tracing::debug_span!(
        target: "ottla::record",
        "ottla.process",
        otel.kind = "consumer",
        group,
        topic = record.topic(),
        partition = record.partition(),
        offset = record.offset(),
        attempt,
        trace_id = Empty,
        span_id = Empty,
        parent_span_id = Empty,
    );
    let parent = crate::proto::trace::of_record(record);
    if span.is_disabled() {
        return (span, parent);
    }
    #[cfg(feature = "opentelemetry")]
    if let Some(own) = otel::continue_in(&span, parent.as_ref()) {
        record_ids(&span, &own, parent.as_ref());
        return (span, Some(own));
    }
    let Some(parent) = parent else {
        return (span, None);
    };
    let own = parent.child(&[
        group.as_bytes(),
        record.topic().as_bytes(),
        &record.partition().to_be_bytes(),
        &record.offset().to_be_bytes(),
        &attempt.to_be_bytes(),
    ]);
    record_ids(&span, &own, Some(&parent));
    (span, Some(own))
}

fn record_ids(span: &tracing::Span, own: &TraceContext, parent: Option<&TraceContext>) {
    span.record("trace_id", own.trace_id_hex());
    span.record("span_id", own.span_id_hex());
    if let Some(parent) = parent {
        span.record("parent_span_id", parent.span_id_hex());
    }
}

/// The context to write into a record sent now: the current OpenTelemetry span's
/// (with the `opentelemetry` feature and a `tracing-opentelemetry` layer), else
/// [`current`].
pub(crate) fn for_send() -> Option<TraceContext> {
    #[cfg(feature = "opentelemetry")]
    if let Some(c) = otel::of_span(&tracing::Span::current()) {
        return Some(c);
    }
    current()
}

/// The bridge to OpenTelemetry: its span ids instead of derived ones.
#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    /// Makes `span` continue `parent` (a remote parent) and returns the span's own
    /// context; `None` when no OpenTelemetry layer handles the span.
    pub(super) fn continue_in(
        span: &tracing::Span,
        parent: Option<&TraceContext>,
    ) -> Option<TraceContext> {
        if let Some(p) = parent {
            let flags = if p.sampled {
                TraceFlags::SAMPLED
            } else {
                TraceFlags::default()
            };
            let remote = SpanContext::new(
                TraceId::from_bytes(p.trace_id),
                SpanId::from_bytes(p.span_id),
                flags,
                true,
                TraceState::default(),
            );
            let cx = opentelemetry::Context::new().with_remote_span_context(remote);
            // Fails only without an OpenTelemetry layer: then `of_span` says so too.
            let _ = span.set_parent(cx);
        }
        of_span(span)
    }

    /// `span`'s OpenTelemetry context, if it has a valid one.
    pub(super) fn of_span(span: &tracing::Span) -> Option<TraceContext> {
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| TraceContext {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            sampled: sc.is_sampled(),
        })
    }
}

/// `f` inside `span`, with `context` as [`current`]; `f` itself when there is neither.
pub(crate) async fn traced<F: Future>(
    f: F,
    span: tracing::Span,
    context: Option<TraceContext>,
) -> F::Output {
    match context {
        Some(c) => CURRENT.scope(c, f.instrument(span)).await,
        None if span.is_disabled() => f.await,
        None => f.instrument(span).await,
    }
}
