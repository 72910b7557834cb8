//! How `run` and `run_handler` call handlers: records lent in chunks, each call
//! within its processing budget and caught if it panics.

use super::*;

/// One [`Processor::run`] task: the handler called on its records one after the other.
pub(super) struct Chunk<'a, H> {
    pub(super) handler: &'a H,
    pub(super) records: &'a [ConsumerRecord],
    pub(super) cancel: &'a Cancel,
    pub(super) progress: &'a Progress,
    pub(super) holds: &'a Holds,
    pub(super) group: &'a str,
    /// The attempt the first record is on (the others are on their first).
    pub(super) attempt: u32,
    pub(super) budget: Duration,
    /// Whether each record's call is timed (for the hook's `Metric::Processed`).
    pub(super) timed: bool,
}

/// Where [`Chunk::run`]'s quick pass stopped.
pub(super) enum Pass {
    /// Every record was handled.
    Done,
    /// It stops before record `i` (cancelled, paused, or its time slice is over).
    Stopped,
    /// Record `i` is traced (or spans are on): its call goes the long way.
    Traced,
    /// Record `i`'s future is pending (it was started at this time, if timed).
    Pending(Option<std::time::Instant>),
    /// Record `i` failed, or panicked.
    Failed(std::result::Result<ProcessError, String>),
}

impl<H: Handler> Chunk<'_, H> {
    /// Calls the handler on each record in order, for up to [`RUN_SLICE`], and says how
    /// far it got. Each record finished is committable at once (`progress`).
    ///
    /// A record whose call is ready at once (a fast handler's) costs no future of its
    /// own, no timer and no span: the quick pass calls and polls the handler's futures
    /// one after the other inside one poll. The first that is pending, traced, or not
    /// done is finished the long way, with the budget's timer, its span and its trace
    /// context, and the quick pass goes on after it.
    pub(super) async fn run(self) -> Outcome {
        let slice = std::time::Instant::now();
        let mut durations = Vec::new();
        // The handler's future of the record in hand, pinned here so that a pending
        // one goes on where the quick pass left it.
        let mut call = std::pin::pin!(None);
        let mut i = 0;
        loop {
            let pass = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(loop {
                    let Some(record) = self.records.get(i) else {
                        break Pass::Done;
                    };
                    // The first record goes ahead of a pause or the time slice (a
                    // call makes progress), but not of a cancellation: a call queued
                    // before its partition was revoked, lost or rewound, and started
                    // after, handles nothing (its lane is gone, or going).
                    if (i > 0 && self.stops(i, record, slice)) || self.cancel.is_cancelled() {
                        break Pass::Stopped;
                    }
                    if !crate::trace::untraced(record) {
                        break Pass::Traced;
                    }
                    let started = self.timed.then(std::time::Instant::now);
                    let result = match std::panic::catch_unwind(AssertUnwindSafe(|| {
                        self.handler.handle(record, self.cancel.clone())
                    })) {
                        Ok(future) => {
                            call.set(Some(future));
                            match poll_caught(call.as_mut(), cx) {
                                std::task::Poll::Pending => break Pass::Pending(started),
                                std::task::Poll::Ready(result) => result,
                            }
                        }
                        Err(payload) => Err(panic_message(payload)),
                    };
                    call.set(None);
                    if let Some(started) = started {
                        durations.push(started.elapsed());
                    }
                    match result {
                        // Finished: committable now, even if a later record hangs.
                        Ok(Ok(())) => {
                            i += 1;
                            self.cancel.record_done(i);
                            self.progress.set(i);
                        }
                        Ok(Err(e)) => break Pass::Failed(Ok(e)),
                        Err(message) => break Pass::Failed(Err(message)),
                    }
                })
            })
            .await;
            let (result, trace) = match pass {
                Pass::Done => {
                    return Outcome {
                        durations,
                        ..Outcome::of(Ok(()))
                    };
                }
                Pass::Stopped => {
                    return Outcome {
                        stopped_after: Some(i),
                        durations,
                        ..Outcome::of(Ok(()))
                    };
                }
                Pass::Failed(result) => (result.map(Err), None),
                Pass::Pending(started) => {
                    let polled = std::future::poll_fn(|cx| poll_caught(call.as_mut(), cx));
                    let result = tokio::time::timeout(self.budget, polled)
                        .await
                        .unwrap_or_else(|_| Ok(Err(over_budget(self.budget))));
                    call.set(None);
                    if let Some(started) = started {
                        durations.push(started.elapsed());
                    }
                    (result, None)
                }
                Pass::Traced => self.traced(i, &mut durations).await,
            };
            match result {
                Ok(Ok(())) => {
                    i += 1;
                    self.cancel.record_done(i);
                    self.progress.set(i);
                }
                Ok(Err(e)) => {
                    return Outcome {
                        durations,
                        trace,
                        ..Outcome::of(Err(BatchError::at(i, e)))
                    };
                }
                Err(message) => {
                    return Outcome {
                        durations,
                        trace,
                        ..Outcome::panic(message, Some(i))
                    };
                }
            }
        }
    }

    /// Whether to stop before record `i` (not the first): the call was cancelled, the
    /// partition paused, or the time slice is over. The clock is read after each of
    /// the first 8 records, then after every 8th: reading it costs more than a handler
    /// that only counts, and a slow handler still stops after its first record.
    #[inline]
    fn stops(&self, i: usize, record: &ConsumerRecord, slice: std::time::Instant) -> bool {
        self.cancel.is_cancelled()
            || self.progress.stopping()
            || self.holds.holds(record.topic(), record.partition())
            || ((i < 8 || i % 8 == 0) && slice.elapsed() >= RUN_SLICE)
    }

    /// Record `i`'s call in its span, with its trace context: the result, and the
    /// context its retry or dead letter carries on.
    async fn traced(
        &self,
        i: usize,
        durations: &mut Vec<Duration>,
    ) -> (
        std::result::Result<std::result::Result<(), ProcessError>, String>,
        Option<TraceContext>,
    ) {
        let Some(record) = self.records.get(i) else {
            return (Ok(Ok(())), None);
        };
        let started = self.timed.then(std::time::Instant::now);
        // The first record may be a retry; the others are first attempts.
        let attempt = if i == 0 { self.attempt } else { 1 };
        let (span, trace) = crate::trace::record_span(self.group, record, attempt);
        let result = if trace.is_none() && span.is_disabled() {
            within(
                self.budget,
                catch_call(|| self.handler.handle(record, self.cancel.clone())),
            )
            .await
        } else {
            let call = catch_call(|| {
                crate::trace::traced(
                    self.handler.handle(record, self.cancel.clone()),
                    span,
                    trace,
                )
            });
            within(self.budget, call).await
        }
        .unwrap_or_else(|| Ok(Err(over_budget(self.budget))));
        if let Some(started) = started {
            durations.push(started.elapsed());
        }
        (result, trace)
    }
}

/// Polls the future in `call`, catching a panic: `Err` carries its message. The
/// future is not polled again after it finished or panicked (the caller empties the
/// slot).
pub(super) fn poll_caught<F: Future>(
    call: std::pin::Pin<&mut Option<F>>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<std::result::Result<F::Output, String>> {
    let Some(future) = call.as_pin_mut() else {
        return std::task::Poll::Ready(Err("the handler's call was polled after it ended".into()));
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
        Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
        Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
        Err(payload) => std::task::Poll::Ready(Err(panic_message(payload))),
    }
}

/// Records one [`Processor::run`] task takes from its lane at most.
pub(super) const RUN_CHUNK: usize = 1024;
/// How long one [`Processor::run`] task keeps calling the handler before it reports
/// back. Each record it finishes is committable at once (its `Progress`), so a record
/// that hangs does not hold back the ones the task finished before it.
pub(super) const RUN_SLICE: Duration = Duration::from_millis(10);

/// `call`'s output, or `None` if it runs past `budget` (it is then dropped). A call
/// that is ready on its first poll, as a fast handler's is, costs no timer: arming one
/// reads the clock and touches the runtime's timer, per record on `run`'s hot path.
pub(super) async fn within<F: Future>(budget: Duration, call: F) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
    match first {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => tokio::time::timeout(budget, call).await.ok(),
    }
}

/// The error of an attempt cancelled for running past `processing_budget`: transient,
/// so it is retried, then dead-lettered once retries run out.
pub(super) fn over_budget(budget: Duration) -> ProcessError {
    ProcessError::transient(
        "Timeout",
        format!("the handler ran past processing_budget ({budget:?}) and was cancelled"),
    )
}

/// Calls `f` and awaits its future, catching a panic in either: `Err` carries the
/// panic's message. Instead of a task per call, which costs far more than a handler
/// that only counts.
pub(super) async fn catch_call<F: Future>(
    f: impl FnOnce() -> F,
) -> std::result::Result<F::Output, String> {
    let future = std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(panic_message)?;
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(payload) => std::task::Poll::Ready(Err(panic_message(payload))),
        }
    })
    .await
}

pub(super) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let detail = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned());
    match detail {
        Some(d) => format!("the handler panicked: {d}"),
        None => "the handler panicked".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends one output per record (its value), and fails on the record `fail`.
    struct Echo;

    impl Handler for Echo {
        async fn handle(
            &self,
            record: &ConsumerRecord,
            cancel: Cancel,
        ) -> std::result::Result<(), ProcessError> {
            let value = record.value().unwrap_or_default().to_vec();
            cancel.send(ProducerRecord::new("out").value(value.clone()));
            if value == b"fail" {
                return Err(ProcessError::transient("T", "after sending"));
            }
            tokio::task::yield_now().await;
            Ok(())
        }
    }

    fn values(records: Vec<ProducerRecord>) -> Vec<String> {
        records
            .into_iter()
            .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
            .collect()
    }

    #[tokio::test]
    async fn a_chunk_keeps_the_outputs_of_the_records_that_succeeded_only() {
        let records: Vec<ConsumerRecord> = ["a", "b", "fail", "c"]
            .iter()
            .enumerate()
            .map(|(i, v)| ConsumerRecord::builder("in", 0, i as i64).value(*v).build())
            .collect();
        let (cancel, progress, holds) = (Cancel::default(), Progress::default(), Holds::default());
        let outcome = Chunk {
            handler: &Echo,
            records: &records,
            cancel: &cancel,
            progress: &progress,
            holds: &holds,
            group: "g",
            attempt: 1,
            budget: Duration::from_secs(5),
            timed: false,
        }
        .run()
        .await;
        assert_eq!(outcome.result.as_ref().err().and_then(|e| e.index), Some(2));
        assert_eq!(progress.done(), 2);
        assert_eq!(
            values(cancel.take_finished(Some(1))),
            ["a"],
            "only the records the driver saw finish"
        );
        assert_eq!(
            values(cancel.take_finished(None)),
            ["b"],
            "the failed attempt's output is dropped, and nothing after it was handled"
        );
        assert!(cancel.take_finished(None).is_empty(), "taken once");
    }
}
