//! The processing loop: a handler per record, retries with backoff that never stall
//! other partitions, a dead-letter topic for what cannot succeed, and commits that
//! never pass an unfinished record.
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::processor::{Processor, ProcessError};
//!
//! let processor = Processor::builder("127.0.0.1:9092", "billing", ["orders"]).build().await?;
//! let stats = processor
//!     .run(
//!         |record, _cancel| {
//!             // The record is lent: the future takes what it needs (a shared slice).
//!             let value = record.value_bytes().unwrap_or_default();
//!             async move {
//!                 let text = std::str::from_utf8(&value).map_err(|e| ProcessError::malformed(e.to_string()))?;
//!                 println!("{text}");
//!                 Ok(())
//!             }
//!         },
//!         tokio::time::sleep(std::time::Duration::from_secs(3600)), // or a shutdown signal
//!     )
//!     .await?;
//! println!("{stats:?}");
//! # Ok(()) }
//! ```
//!
//! **Lanes.** Each partition is a lane: its records are handled one at a time (or one
//! batch at a time with [`Processor::run_batch`]), in order. Up to `concurrency` handler
//! calls run at once. A lane whose record waits for a retry is paused (its partition
//! is not fetched) while the others keep flowing; heartbeats are sent by the group task
//! whatever handlers do.
//!
//! **Orders.** [`ProcessorBuilder::ordering`] (`ottla.processing.order`) chooses what
//! of one partition may run at once ([`ProcessingOrder`]):
//!
//! | order | at once | a retrying record holds | batches (`run_batch`) |
//! |---|---|---|---|
//! | `Partition` (default) | one call per partition | its whole partition (paused) | consecutive records of the partition |
//! | `Key` | one call per key; different keys of a partition at once | the later records of its key | consecutive records of one key |
//! | `Unordered` | any records: a delivery is spread over `concurrency` calls | the rest of its own call's records | records that arrived together |
//!
//! Records without a key keep no order under `Key` (each runs alone, as under
//! `Unordered`; Parallel Consumer serialises them as one key, which its users asked it
//! not to). Under every order the commit is each partition's finished prefix, so a slow
//! or retrying key holds the partition's commit back, not its other keys' work (the
//! records finished past the commit go in its metadata, and the partition's next owner
//! skips them: [`ProcessorStats::already_finished`]); its
//! records wait in the partition's buffer, and a partition whose buffer is full is
//! paused (`Metric::KeyWait` reports how long records wait behind their key). A halted
//! dead-letter write halts its key, not its partition. Retry topics, the dead-letter
//! topic, revocations and shutdown behave as under `Partition`, per key: a revocation
//! stops every call of its partitions and releases them once all have stopped.
//!
//! **Commit rule.** An offset becomes committable only when its record succeeded or its
//! dead-letter write was acknowledged; commits carry each partition's finished prefix.
//! A dead-letter write that fails halts its lane (paused, nothing committed past it)
//! and is retried with backoff until it succeeds.
//!
//! **Rebalances.** When partitions are revoked, their backoff waits are cancelled, their
//! running handlers are signalled through [`Cancel`] and awaited for up to
//! `acquiesce_share` of the rebalance timeout, the finished prefix is committed, and
//! only then is the revocation acknowledged. The other partitions go on meanwhile.
//! Lost partitions are dropped without a commit.
//!
//! **Outputs and exactly once.** A handler sends records through its call's
//! context, [`Cancel::send`]; they are written only if their record succeeds. With
//! [`ProcessorBuilder::exactly_once`] (`processing.guarantee = exactly_once` and a
//! `transactional.id`), each commit is one transaction of the outputs, retry-topic
//! and dead-letter writes, and offsets of the records it commits; an abort rewinds
//! every partition to its last commit; a revocation commits the transaction before
//! its partitions go. docs/exactly-once.md says what it guarantees and what not (the
//! handler's own side effects happen once per attempt).
//!
//! **Pauses and lag.** [`Processor::handle`] gives a [`ProcessorHandle`]: pause and
//! resume partitions (a circuit breaker, from a handler or another task) and read each
//! partition's lag.
//!
//! **Where the rules are.** Every rule above lives in the sans-IO
//! [`ottla_proto::process::lanes::Lanes`] machine, tested on a virtual clock;
//! this module drives it: it runs handlers and writes as tasks, commits, and passes
//! the results, the group's events and the time back.
//!
//! **Shutdown.** When `shutdown` resolves, fetching stops, running handlers are
//! signalled and awaited, the finished prefix is committed and the member leaves the
//! group, all within [`ProcessorBuilder::shutdown_timeout`] (default 25 s).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::admin::{AdminClient, NewTopic};
use crate::config::ClientConfig;
use crate::consumer::{
    Consumer, ConsumerBuilder, ConsumerEvent, ConsumerRecord, ConsumerView, Events, TopicPartition,
};
use crate::driver::{lock, sleep_until};
use crate::error::{Error, Result};
use crate::producer::{
    ConsumerGroupMetadata, Producer, ProducerBuilder, ProducerRecord, TransactionError, TxnOffset,
};
use crate::proto::group::member::check_heartbeat;
pub use crate::proto::process::classify::{
    AsGiven, BatchError, Classifier, Disposition, ErrorCause, ErrorClass, HttpClassifier,
    ProcessError,
};
pub use crate::proto::process::dlq::{DlqFormat, DlqTimestamp};
use crate::proto::process::lanes::{
    Action, Handover, Lanes, LanesConfig, Now, Outcome, Run, Ticket,
};
pub use crate::proto::process::retry::ConfigError;
pub use crate::proto::process::retry::{RetryBackoff, RetryPolicy};
use crate::telemetry::ProcessorMetrics;
use crate::trace::TraceContext;

mod builder;
mod chunk;
mod handle;

use builder::MetricsHook;
pub use builder::{ProcessorBuilder, TopicCreation};
use chunk::*;
pub use handle::ProcessorHandle;
use handle::{Control, Holds};

/// Tells a running handler that its partition is being taken away (or the processor
/// shuts down): finish quickly and return `Ok(())` (the record is done and committed),
/// or stop and return `Err(ProcessError::cancelled())` (the record is not committed,
/// and the partition's next owner handles it again). Returning `Ok(())` without
/// finishing commits a record nobody processed.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<CancelState>);

/// A [`Cancel`]'s flag and its waiters, in one allocation: a handler call takes a
/// clone, one reference count.
#[derive(Debug, Default)]
struct CancelState {
    flag: AtomicBool,
    notify: Notify,
    /// Whether [`Cancel::send`] was called: without outputs, finishing a record
    /// costs one load, no lock.
    sent: AtomicBool,
    outputs: Mutex<Outputs>,
}

/// The records a call's handler sent ([`Cancel::send`]).
#[derive(Debug, Default)]
struct Outputs {
    /// Sent by the record in hand: kept only if it succeeds.
    attempt: Vec<ProducerRecord>,
    /// Sent by records that succeeded, for the driver to write, each with how many
    /// records of the call had finished with its own (its `Progress`).
    finished: Vec<(usize, ProducerRecord)>,
}

impl Cancel {
    /// Whether cancellation was requested.
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst)
    }

    /// Resolves when cancellation is requested.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.0.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }

    /// Sends `record` as an output of the record (or batch) being handled. It is
    /// written only if that record succeeds: the outputs of an attempt that fails,
    /// panics or runs past its budget are dropped, and its retry sends its own.
    ///
    /// At least once (the default), the outputs are written as their record
    /// finishes, and delivered before the commit that passes it. A write that fails
    /// stops that commit: the records since the last commit are handled again, and
    /// their outputs written again (so a reader may see an output twice, as with any
    /// at-least-once retry). Exactly once
    /// ([`ProcessorBuilder::exactly_once`]), they go into the transaction that
    /// commits their record's offset: `read_committed` consumers see them once that
    /// transaction commits, and never if it aborts (the record is then handled
    /// again). With [`Processor::run_batch`], a batch's outputs are written only if
    /// the whole batch succeeds.
    pub fn send(&self, record: ProducerRecord) {
        if let Ok(mut outputs) = self.0.outputs.lock() {
            outputs.attempt.push(record);
            self.0.sent.store(true, Ordering::Release);
        }
    }

    fn cancel(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    /// The record in hand succeeded: its outputs are to be written. Called before its
    /// `Progress` says it finished, so the driver, reading the progress first, never
    /// commits a record whose outputs it has not taken.
    /// `done`: how many records of the call have finished with this one.
    #[inline]
    fn record_done(&self, done: usize) {
        if !self.0.sent.load(Ordering::Acquire) {
            return;
        }
        if let Ok(mut outputs) = self.0.outputs.lock() {
            let Outputs { attempt, finished } = &mut *outputs;
            finished.extend(attempt.drain(..).map(|r| (done, r)));
        }
    }

    /// The outputs of the records that succeeded, taken: of the first `upto` records
    /// of the call (`None`: all, once it ended). Not those of a record the driver
    /// has not yet seen finish: a commit carries a record's outputs and its offset
    /// together.
    fn take_finished(&self, upto: Option<usize>) -> Vec<ProducerRecord> {
        if !self.0.sent.load(Ordering::Acquire) {
            return Vec::new();
        }
        let Ok(mut outputs) = self.0.outputs.lock() else {
            return Vec::new();
        };
        let upto = upto.unwrap_or(usize::MAX);
        let (taken, kept) = std::mem::take(&mut outputs.finished)
            .into_iter()
            .partition(|(done, _)| *done <= upto);
        outputs.finished = kept;
        taken.into_iter().map(|(_, r)| r).collect()
    }
}

/// What the Processor promises about a record's effects
/// ([`ProcessorBuilder::processing_guarantee`], `processing.guarantee`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProcessingGuarantee {
    /// A record's offset is committed after it finished: after a crash or a
    /// rebalance, records finished since the last commit are handled again, and
    /// their outputs written again.
    #[default]
    AtLeastOnce,
    /// Each commit is a transaction of the outputs ([`Cancel::send`]), retry-topic
    /// and dead-letter writes, and offsets of the records it commits (KIP-98,
    /// KIP-447): a `read_committed` reader sees each input's outputs once. The
    /// handler's other side effects still happen once per attempt. Needs a
    /// `transactional.id`; see docs/exactly-once.md.
    ExactlyOnce,
}

pub use crate::proto::process::lanes::{Metric, ProcessingOrder};
pub use crate::stats::ProcessorStats;

/// The processing loop. See the module docs.
pub struct Processor {
    consumer: Consumer,
    producer: Arc<Producer>,
    /// What the lanes need (the group, the retry policy, dead letters, ...).
    lanes: LanesConfig,
    acquiesce: Duration,
    metrics: Option<MetricsHook>,
    telemetry: ProcessorMetrics,
    shutdown_timeout: Duration,
    processing_budget: Duration,
    /// What [`ProcessorHandle`]s send; `run` takes the receiving end.
    control: mpsc::UnboundedSender<Control>,
    controls: mpsc::UnboundedReceiver<Control>,
    holds: Arc<Holds>,
    /// The run's counters as of its last turn, for [`ProcessorHandle::stats`].
    live: Arc<Mutex<ProcessorStats>>,
    guarantee: ProcessingGuarantee,
    /// Exactly once: partitions were lost while a transaction was open; it must be
    /// aborted (it may hold their outputs) before anything else is committed.
    abort_wanted: AtomicBool,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("group", &self.lanes.group)
            .finish_non_exhaustive()
    }
}

/// How many times the Processor waits `max.block.ms` for a transaction's commit or
/// abort before it stops the run ([`Processor::resumed`]).
const END_TXN_TRIES: u32 = 3;

/// [`ProcessorBuilder::shutdown_timeout`]'s default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(25);

pub use crate::proto::process::lanes::{RETRY_HOP, retry_topic};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A record handler whose future may borrow the record it is lent, for
/// [`Processor::run_handler`]. A closure's future cannot borrow its argument (on stable
/// Rust, with `Send`); a `Handler`'s can:
///
/// ```no_run
/// use ottla::ConsumerRecord;
/// use ottla::processor::{Cancel, Handler, ProcessError};
///
/// struct Billing;
///
/// impl Handler for Billing {
///     async fn handle(&self, record: &ConsumerRecord, _cancel: Cancel) -> Result<(), ProcessError> {
///         let text = std::str::from_utf8(record.value().unwrap_or_default())
///             .map_err(|e| ProcessError::malformed(e.to_string()))?;
///         tokio::task::yield_now().await; // `text` borrows the record across the await
///         println!("{text}");
///         Ok(())
///     }
/// }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Handles one record; the record stays lent until the future finishes.
    fn handle(
        &self,
        record: &ConsumerRecord,
        cancel: Cancel,
    ) -> impl Future<Output = std::result::Result<(), ProcessError>> + Send;
}

/// Adapts a handler that takes its record by value to [`Processor::run`], which lends
/// it: each record is cloned for the handler (one reference count). For code written
/// before `run` lent the record, and for handlers that keep every record anyway.
///
/// ```no_run
/// # async fn demo(processor: ottla::processor::Processor) -> ottla::Result<()> {
/// use ottla::processor::owned;
///
/// processor
///     .run(
///         owned(|record, _cancel| async move {
///             println!("{:?}", record.value());
///             Ok(())
///         }),
///         tokio::time::sleep(std::time::Duration::from_secs(3600)),
///     )
///     .await?;
/// # Ok(()) }
/// ```
pub fn owned<H, F>(handler: H) -> impl Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static
where
    H: Fn(ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
{
    move |record, cancel| handler(record.clone(), cancel)
}

/// [`Processor::run`]'s closure as a [`Handler`].
struct Lent<H>(H);

impl<H, F> Handler for Lent<H>
where
    H: Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
    F: Future<Output = std::result::Result<(), ProcessError>> + Send + 'static,
{
    fn handle(
        &self,
        record: &ConsumerRecord,
        cancel: Cancel,
    ) -> impl Future<Output = std::result::Result<(), ProcessError>> + Send {
        (self.0)(record, cancel)
    }
}

impl Processor {
    /// A builder.
    pub fn builder<I, S>(bootstrap: &str, group: &str, topics: I) -> ProcessorBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProcessorBuilder::new(bootstrap, group, topics)
    }

    /// A handle to pause and resume partitions and read the lag, from another task or
    /// a handler, while [`Processor::run`] runs.
    pub fn handle(&self) -> ProcessorHandle {
        ProcessorHandle {
            control: self.control.clone(),
            holds: self.holds.clone(),
            live: self.live.clone(),
            view: self.consumer.view(),
        }
    }

    /// Hands the lanes' metrics to the hook and the `metrics` facade, and their
    /// counters to [`ProcessorHandle::stats`].
    fn report(&self, lanes: &mut Lanes) {
        while let Some(m) = lanes.poll_metric() {
            self.metric(m);
        }
        self.telemetry.publish(lanes.stats(), lanes.queued());
        lanes.stats().clone_into(&mut lock(&self.live));
    }

    fn metric(&self, m: Metric) {
        self.telemetry.observe(&m);
        if let Some(h) = &self.metrics {
            h(m);
        }
    }

    /// Runs `handler` on every record until `shutdown` resolves, then stops fetching,
    /// lets running handlers finish (within the acquiesce window), commits the finished
    /// prefix and leaves the group.
    ///
    /// The handler is lent each record (`&ConsumerRecord`) and returns a future that
    /// owns what it needs: `record.value_bytes()` (a shared slice, no copy) or
    /// `record.clone()` (one reference count) taken before `async move`. A future that
    /// borrows the record across its awaits is a [`Handler`] ([`Processor::run_handler`]).
    pub async fn run<H, F, S>(self, handler: H, shutdown: S) -> Result<ProcessorStats>
    where
        H: Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<(), ProcessError>> + Send + 'static,
        S: Future + Send,
    {
        self.run_handler(Lent(handler), shutdown).await
    }

    /// [`Processor::run`] with a [`Handler`], whose future may borrow the record for as
    /// long as it runs (an `async fn handle(&self, record: &ConsumerRecord, ..)`).
    pub async fn run_handler<H, S>(self, handler: H, shutdown: S) -> Result<ProcessorStats>
    where
        H: Handler,
        S: Future + Send,
    {
        // A task takes up to RUN_CHUNK records of its lane and calls the handler on
        // them one after the other, for up to RUN_SLICE: the cost of a task is shared
        // by the records of a fast handler, and a slow one still gets a task per record.
        let handler = Arc::new(handler);
        // Each record's own time, for the hook's `Metric::Processed`. The `metrics`
        // feature times whole calls instead (`ProcessorMetrics::handled`): two clock
        // reads per record cost more than the budget of the metrics.
        let timed = self.metrics.is_some();
        let budget = self.processing_budget;
        let holds = self.holds.clone();
        let group: Arc<str> = Arc::from(self.lanes.group.as_str());
        let call = move |records: Run, cancel: Cancel, progress: Progress, attempt: u32| {
            let handler = handler.clone();
            let holds = holds.clone();
            let group = group.clone();
            async move {
                let chunk = Chunk {
                    handler: &*handler,
                    records: &records,
                    cancel: &cancel,
                    progress: &progress,
                    holds: &holds,
                    group: &group,
                    attempt,
                    budget,
                    timed,
                };
                chunk.run().await
            }
        };
        self.run_inner(RUN_CHUNK, call, shutdown).await
    }

    /// Like [`Processor::run`], but `handler` gets up to `max_records` records of one
    /// partition at a time, in offset order (whatever is buffered; it never waits to
    /// fill a batch). A batch is handled by one call, so one partition still has one
    /// call at a time.
    ///
    /// On error, [`BatchError::at`] names the failing record: the records before it
    /// count as handled, it goes through the retry policy (retried alone) and the
    /// dead-letter topic like a record of [`Processor::run`], and the records after it
    /// come again in later batches. [`BatchError::whole`] (or `?` on a
    /// [`ProcessError`]) replays the batch one record at a time, so that only the
    /// records that fail on their own are retried or dead-lettered. A panic counts as
    /// a batch error without an index.
    ///
    /// ```no_run
    /// # async fn demo() -> ottla::Result<()> {
    /// use ottla::processor::{BatchError, ProcessError, Processor};
    ///
    /// let processor = Processor::builder("127.0.0.1:9092", "audit", ["events"]).build().await?;
    /// processor
    ///     .run_batch(
    ///         200,
    ///         |records, _cancel| {
    ///             // Checked while the batch is lent; the future owns what it keeps.
    ///             let bad = records.iter().position(|r| r.value().is_none());
    ///             let rows = records.len();
    ///             async move {
    ///                 if let Some(i) = bad {
    ///                     return Err(BatchError::at(i, ProcessError::malformed("no value")));
    ///                 }
    ///                 // ... one bulk insert of the `rows` records ...
    ///                 let _ = rows;
    ///                 Ok(())
    ///             }
    ///         },
    ///         tokio::time::sleep(std::time::Duration::from_secs(3600)),
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run_batch<H, F, S>(
        mut self,
        max_records: usize,
        handler: H,
        shutdown: S,
    ) -> Result<ProcessorStats>
    where
        H: Fn(&[ConsumerRecord], Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<(), BatchError>> + Send + 'static,
        S: Future + Send,
    {
        if max_records == 0 {
            return Err(Error::Config {
                setting: "max_records",
                message: "a batch must allow at least 1 record".into(),
            });
        }
        self.lanes.lane_buffer = self.lanes.lane_buffer.max(max_records);
        let handler = Arc::new(handler);
        let budget = self.processing_budget;
        let group: Arc<str> = Arc::from(self.lanes.group.as_str());
        let call = move |records: Run, cancel: Cancel, _: Progress, attempt: u32| {
            let handler = handler.clone();
            let group = group.clone();
            async move {
                // A record retried (or replayed) alone gets the record's span, and its
                // retries and dead letter continue its trace; a batch gets one span,
                // and a record failing in it passes its own context on.
                let (span, trace) = match &records[..] {
                    [one] => crate::trace::record_span(&group, one, attempt),
                    _ => (batch_span(&group, &records), None),
                };
                // Read only for a failing record, after the call: the records are
                // still here.
                let context_of = |index: Option<usize>| match (trace, index) {
                    (Some(t), _) => Some(t),
                    (None, Some(i)) => records.get(i).and_then(crate::proto::trace::of_record),
                    (None, None) => None,
                };
                // Queued before its partition was revoked, lost or rewound, and
                // started after: nothing is handled.
                if cancel.is_cancelled() {
                    return Outcome {
                        stopped_after: Some(0),
                        ..Outcome::of(Ok(()))
                    };
                }
                let call = catch_call(|| {
                    crate::trace::traced(handler(&records, cancel.clone()), span, trace)
                });
                match within(budget, call).await {
                    Some(Ok(Ok(()))) => {
                        // A batch's outputs are the batch's: sent only when all of it
                        // succeeded.
                        // Taken when the call ends, not on the way.
                        cancel.record_done(usize::MAX);
                        Outcome::of(Ok(()))
                    }
                    Some(Ok(Err(e))) => Outcome {
                        trace: context_of(e.index),
                        ..Outcome::of(Err(e))
                    },
                    Some(Err(message)) => Outcome {
                        trace: context_of(None),
                        ..Outcome::panic(message, None)
                    },
                    // Which record held it up is unknown: the batch goes again one
                    // record at a time, each with the budget.
                    None => Outcome::of(Err(BatchError {
                        index: None,
                        error: over_budget(budget),
                    })),
                }
            }
        };
        self.run_inner(max_records, call, shutdown).await
    }

    async fn run_inner<H, F, S>(
        mut self,
        max_batch: usize,
        handler: H,
        shutdown: S,
    ) -> Result<ProcessorStats>
    where
        H: Fn(Run, Cancel, Progress, u32) -> F + Send + Sync + 'static,
        F: Future<Output = Outcome> + Send + 'static,
        S: Future + Send,
    {
        self.lanes.max_batch = max_batch;
        self.lanes.metrics = self.metrics.is_some() || crate::telemetry::ENABLED;
        self.lanes.processed_metrics = self.metrics.is_some();
        let mut lanes = Lanes::new(self.lanes.clone(), now());
        // Records asked for at once: a call's worth (a delivery goes to its lane as one
        // run, which a call then takes whole), and not fewer than 500.
        let poll_records = max_batch.max(500);
        let mut tasks: JoinSet<Finished> = JoinSet::new();
        // The ticket of each task, for a task that ends without a result.
        let mut tickets: HashMap<tokio::task::Id, Ticket> = HashMap::new();
        let mut calls: HashMap<Ticket, Call> = HashMap::new();
        let mut events = self.consumer.take_events();
        // A stop asked for by a group event read before a commit (`events_before_commit`).
        let mut held_stop: Option<Result<()>> = None;
        // Set once the run stops (shutdown, or an error): the lanes hand everything
        // over, then the member leaves by `until`.
        let mut stopped: Option<(Result<()>, Instant)> = None;
        let mut txn = Txn::default();
        // Outputs of finished records, each with its call's ticket, to write before
        // anything is committed.
        let mut outputs: Vec<(Ticket, ProducerRecord)> = Vec::new();
        // Calls that ended, reported to the lanes once their outputs are written.
        let mut handled: Vec<(Ticket, Outcome, Duration)> = Vec::new();
        // Exactly once: retry-topic and dead-letter writes, put in the transaction
        // once the actions queued with them have run.
        let mut deferred: Vec<(Ticket, ProducerRecord)> = Vec::new();
        tokio::pin!(shutdown);
        'run: loop {
            // Two passes. First the actions already queued: a commit among them was
            // made before the outputs not yet written, and must not carry them (exactly
            // once, a transaction holds the outputs of the offsets it commits, no
            // more). Then the outputs of the records finished since, written, and only
            // then those records reported to the lanes, whose commit carries them.
            for reporting in [false, true] {
                if reporting {
                    // Records finished by calls still running become committable now: the
                    // outputs of those the progress counts (the handler's context sets
                    // them aside before the progress says so), then the progress.
                    let mut reports = Vec::new();
                    for (ticket, call) in calls.iter_mut() {
                        let done = call.progress.done();
                        let finished = call.cancel.take_finished(Some(done));
                        outputs.extend(finished.into_iter().map(|r| (*ticket, r)));
                        if done > call.seen {
                            call.seen = done;
                            reports.push((*ticket, done));
                        }
                    }
                    if self.abort_wanted.swap(false, Ordering::AcqRel) && txn.open {
                        // Partitions were lost: the open transaction may hold their outputs.
                        self.abort_txn(&mut txn).await;
                        self.rewind(&mut lanes);
                        outputs.clear();
                    }
                    // Only those of calls whose lanes are still here: an abort (or a
                    // loss) since a call ended dropped its lane, and its records come
                    // again; their outputs, written now, would go into the next
                    // transaction without their offsets, and then once more with
                    // the records' next attempt.
                    let live: Vec<ProducerRecord> = std::mem::take(&mut outputs)
                        .into_iter()
                        .filter(|(ticket, _)| lanes.in_flight(*ticket))
                        .map(|(_, record)| record)
                        .collect();
                    self.write_outputs(&mut txn, live).await;
                    // Together: a commit one of them makes due carries the offsets of
                    // all whose outputs were just written (`Lanes::report`).
                    lanes.report(reports, handled.drain(..), [], now());
                }
                loop {
                    while let Some(action) = lanes.poll_action() {
                        match action {
                            // Queued before a rewind or a loss dropped its lane (the lanes
                            // would ignore its answer): not started.
                            Action::Dispatch { ticket, .. } if !lanes.in_flight(ticket) => {}
                            Action::Dispatch {
                                ticket,
                                records,
                                attempt,
                                ..
                            } => {
                                let call = Call {
                                    records: records.len(),
                                    ..Call::default()
                                };
                                let work = handler(
                                    records,
                                    call.cancel.clone(),
                                    call.progress.clone(),
                                    attempt,
                                );
                                let task = tasks.spawn(async move {
                                    let started = Instant::now();
                                    let outcome = work.await;
                                    Finished::Handled(ticket, outcome, started.elapsed())
                                });
                                tickets.insert(task.id(), ticket);
                                calls.insert(ticket, call);
                            }
                            Action::Cancel(ticket) => {
                                if let Some(call) = calls.get(&ticket) {
                                    call.cancel.cancel();
                                }
                            }
                            Action::Yield(ticket) => {
                                if let Some(call) = calls.get(&ticket) {
                                    call.progress.stop();
                                }
                            }
                            // Exactly once, a write whose lane a rewind dropped would go into
                            // the next transaction without its record: not written.
                            Action::Produce { ticket, .. }
                                if self.exactly_once() && !lanes.in_flight(ticket) => {}
                            // Written once the actions queued with it have run: a commit among
                            // them was made before the write, and must not carry it.
                            Action::Produce { ticket, record, .. } if self.exactly_once() => {
                                deferred.push((ticket, record));
                            }
                            Action::Produce { ticket, record, .. } => {
                                let producer = self.producer.clone();
                                let task = tasks.spawn(async move {
                                    let result = match producer.send(record).await {
                                        Ok(delivery) => delivery.await.map(|_| ()),
                                        Err(e) => Err(e),
                                    };
                                    Finished::Produced(ticket, result.map_err(|e| e.to_string()))
                                });
                                tickets.insert(task.id(), ticket);
                            }
                            Action::Commit(offsets) => {
                                // What finished past each offset, read before a loss drops it.
                                let metadata = lanes.commit_metadata(&offsets);
                                let metadata = with_metadata(&offsets, metadata);
                                let (offsets, group) = self.events_before_commit(
                                    &mut lanes,
                                    &mut events,
                                    &mut held_stop,
                                    offsets,
                                );
                                // The lanes hear back whatever happened, even when the loss left
                                // nothing to commit: until they do, they count this commit as out
                                // and make no other.
                                let commit = Commit {
                                    point: Point::Interval,
                                    offsets,
                                    metadata,
                                    group,
                                };
                                let ok = self
                                    .commit_point(&commit, &mut txn, &mut lanes, &mut held_stop)
                                    .await;
                                lanes.committed(&commit.offsets, ok, now());
                            }
                            Action::Pause(tp) => self.consumer.pause(std::slice::from_ref(&tp)),
                            Action::Resume(tp) => self.consumer.resume(std::slice::from_ref(&tp)),
                            Action::Release {
                                handover,
                                partitions,
                                offsets,
                                metadata,
                            } => {
                                let metadata = with_metadata(&offsets, metadata);
                                let (offsets, group) = self.events_before_commit(
                                    &mut lanes,
                                    &mut events,
                                    &mut held_stop,
                                    offsets,
                                );
                                if !offsets.is_empty() || txn.open {
                                    let commit = Commit {
                                        point: Point::Handover,
                                        offsets,
                                        metadata,
                                        group,
                                    };
                                    let ok = self
                                        .commit_point(&commit, &mut txn, &mut lanes, &mut held_stop)
                                        .await;
                                    if !ok {
                                        warn!(
                                            ?partitions,
                                            "the finished prefix of these partitions was not committed; their next owner starts from the last committed offset and handles those records again"
                                        );
                                    }
                                    lanes.committed(&commit.offsets, ok, now());
                                }
                                while let Some(m) = lanes.poll_metric() {
                                    self.metric(m);
                                }
                                match handover {
                                    Handover::Revoked { generation } => {
                                        self.metric(Metric::Revoked {
                                            generation,
                                            partitions: partitions.clone(),
                                        });
                                        self.consumer.complete_revocation(generation, partitions);
                                    }
                                    Handover::Shutdown => break 'run,
                                }
                            }
                        }
                    }
                    if deferred.is_empty() {
                        break;
                    }
                    // Exactly once, a retry-topic or dead-letter record goes into the
                    // transaction that commits its source record's offset: done once it is
                    // in (a write that then fails aborts that transaction, and the record is
                    // handled again). All are written before any is reported: a commit
                    // the first makes due carries the others' offsets too (`Lanes::report`).
                    let mut written = Vec::new();
                    for (ticket, record) in std::mem::take(&mut deferred) {
                        if !lanes.in_flight(ticket) {
                            continue;
                        }
                        let result = self.write_in_txn(&mut txn, record).await;
                        written.push((ticket, result));
                    }
                    lanes.report([], [], written, now());
                }
            }
            self.report(&mut lanes);
            let mut deadline = lanes.poll_timeout().map(Instant::from_std);
            if lanes.holding() {
                // Paused by the application: no records are asked for, so the member
                // hears that the processor is alive from here, every second.
                self.consumer.note_alive();
                let tick = Instant::now() + Duration::from_secs(1);
                deadline = Some(deadline.map_or(tick, |d| d.min(tick)));
            }
            let want_records = stopped.is_none() && lanes.wants_records();
            // Biased: group events before records, so that a generation's events are
            // seen (and reported) before any record of its new partitions; finished
            // work and due timers before more records, so a steady stream of records
            // cannot hold back commits and retries.
            let stop = if let Some(result) = held_stop.take() {
                Some(result)
            } else {
                tokio::select! {
                    biased;
                    _ = &mut shutdown, if stopped.is_none() => Some(Ok(())),
                    Some(event) = events.recv() => self.on_group_event(&mut lanes, event),
                    Some(control) = self.controls.recv() => {
                        match control {
                            Control::Pause(partitions) => lanes.pause(partitions.as_deref(), now()),
                            Control::Resume(partitions) => lanes.resume(partitions.as_deref(), now()),
                        }
                        None
                    }
                    Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                        match done {
                            Ok((id, Finished::Handled(ticket, outcome, took))) => {
                                tickets.remove(&id);
                                if let Some(call) = calls.remove(&ticket) {
                                    self.telemetry.handled(attempted(call.records, &outcome), took);
                                    let finished = call.cancel.take_finished(None);
                                    outputs.extend(finished.into_iter().map(|r| (ticket, r)));
                                }
                                handled.push((ticket, outcome, took));
                            }
                            Ok((id, Finished::Produced(ticket, result))) => {
                                tickets.remove(&id);
                                lanes.produced(ticket, result, now());
                            }
                            Err(e) => {
                                // The task panicked outside the handler (a panicking Drop,
                                // the producer) or the runtime cancelled it: the lanes count
                                // a failed attempt, so its partition does not stay busy.
                                warn!(error = %e, "a processing task ended without a result");
                                if let Some(ticket) = tickets.remove(&e.id()) {
                                    calls.remove(&ticket);
                                    lanes.crashed(ticket, format!("the task ended without a result: {e}"), now());
                                }
                            }
                        }
                        None
                    }
                    _ = sleep_until(deadline), if deadline.is_some() => {
                        lanes.handle_timeout(now());
                        None
                    }
                    batch = self.consumer.recv_batch(poll_records), if want_records => match batch {
                        Ok(records) => {
                            self.resume_partitions(&mut lanes, &records, &txn.committed);
                            lanes.deliver(records, now());
                            None
                        }
                        Err(Error::Fetch(e)) => {
                            // A partition stopped (corrupt batch): nothing is committed past it.
                            error!(error = %e, "partition stopped; its records are not committed past this point");
                            None
                        }
                        // Reported through the group's event (`Metric::GroupRetrying`); the
                        // member keeps going.
                        Err(Error::GroupRetrying(_)) => None,
                        Err(e) => Some(Err(e)),
                    },
                }
            };
            if let (Some(result), None) = (stop, &stopped) {
                // Shut down within `shutdown_timeout`: the lanes hand everything over,
                // then the member leaves by `until`.
                stopped = Some((result, Instant::now() + self.shutdown_timeout));
                lanes.shutdown(self.shutdown_timeout, self.acquiesce, now());
            }
        }
        // A transaction still open (the run stopped on an error, or its last commit
        // point did not end it) is aborted now: left open, it would hold back every
        // `read_committed` reader of its partitions until the coordinator's timeout.
        if txn.open && txn.fatal.is_none() {
            self.abort_txn(&mut txn).await;
        }
        self.report(&mut lanes);
        let (result, until) =
            stopped.unwrap_or_else(|| (Ok(()), Instant::now() + self.shutdown_timeout));
        let close = match tokio::time::timeout_at(until, self.consumer.close()).await {
            Ok(close) => close,
            Err(_) => {
                warn!(timeout = ?self.shutdown_timeout, "leaving the group did not finish within the shutdown timeout");
                Ok(())
            }
        };
        result.and(close).map(|()| lanes.stats().clone())
    }

    /// A group event, applied to the lanes; `Some`: the run stops with this result.
    fn on_group_event(&self, lanes: &mut Lanes, event: ConsumerEvent) -> Option<Result<()>> {
        match event {
            ConsumerEvent::Joined {
                generation,
                member_id,
                leader,
                ..
            } => {
                self.metric(Metric::Joined {
                    generation,
                    member_id,
                    leader,
                });
                None
            }
            ConsumerEvent::Assigned {
                generation, added, ..
            } => {
                self.metric(Metric::Assigned {
                    generation,
                    partitions: added,
                });
                None
            }
            ConsumerEvent::RevokeRequested {
                generation,
                partitions,
                ..
            } => {
                self.metric(Metric::RevokeRequested {
                    generation,
                    partitions: partitions.clone(),
                });
                lanes.release(
                    partitions,
                    Handover::Revoked { generation },
                    self.acquiesce,
                    now(),
                );
                None
            }
            ConsumerEvent::Lost { partitions, .. } => {
                if self.exactly_once() {
                    self.abort_wanted.store(true, Ordering::Release);
                }
                lanes.lose(&partitions, now());
                None
            }
            ConsumerEvent::Fatal(e) => Some(Err(Error::Group(e))),
            ConsumerEvent::GroupRetrying(error) => {
                warn!(%error, "the group member was refused; it keeps retrying");
                self.metric(Metric::GroupRetrying { error });
                None
            }
            _ => None,
        }
    }

    /// Before a commit: the group events that arrived meanwhile, applied in order (a
    /// stop they ask for kept in `stop`), and `offsets` without the partitions they
    /// say were lost. A commit waits for its answer, and events queue meanwhile: a
    /// commit that failed because the member was fenced is retried by the lanes, and
    /// without this it went out before the loss was read. The member, in the group
    /// again and granted the same partition, took it, after the new assignment's
    /// OffsetFetch had read the older offset: the new lane handled those records again
    /// (chaos, consumer protocol, seed 76387901).
    ///
    /// With them, the group metadata a transaction's offsets carry (KIP-447), read
    /// before the events: the consumer's task moves it to a new generation only after
    /// it queued the earlier generations' events, so every loss before it is applied
    /// here (and aborts the transaction). Read after the commit's other awaits, it
    /// could name a generation the member joined meanwhile, after a loss the lanes
    /// had not seen: the coordinator took the lost partitions' offsets from a member
    /// of the current generation, their new owner (this member, with a position read
    /// before that commit) handled the records again (exactly-once chaos, classic
    /// protocol, seed 900321719: 24 to 37 records handled again below the member's
    /// own commit, none since).
    fn events_before_commit(
        &self,
        lanes: &mut Lanes,
        events: &mut Events,
        stop: &mut Option<Result<()>>,
        mut offsets: Vec<(TopicPartition, i64)>,
    ) -> (Vec<(TopicPartition, i64)>, Option<ConsumerGroupMetadata>) {
        loop {
            // Only a transaction's offsets carry it.
            let group = if self.exactly_once() {
                self.consumer.group_metadata()
            } else {
                None
            };
            let mut drained = false;
            while let Ok(event) = events.try_recv() {
                drained = true;
                if let ConsumerEvent::Lost { partitions, .. } = &event {
                    offsets.retain(|(tp, _)| !partitions.contains(tp));
                }
                if let Some(result) = self.on_group_event(lanes, event) {
                    stop.get_or_insert(result);
                }
            }
            if !drained {
                return (offsets, group);
            }
        }
    }

    /// For each partition of `records` the lanes have no lane for yet (just
    /// assigned), the records its previous owner finished past the committed offset
    /// (the commit's metadata), so they are not handled again.
    fn resume_partitions(
        &self,
        lanes: &mut Lanes,
        records: &[ConsumerRecord],
        own: &HashMap<TopicPartition, (i64, Option<String>)>,
    ) {
        let mut last: Option<&ConsumerRecord> = None;
        for r in records {
            if last.is_some_and(|l| l.is_in(r.topic_arc(), r.partition())) {
                continue;
            }
            last = Some(r);
            let tp = r.topic_partition();
            if lanes.has_lane(&tp) {
                continue;
            }
            // This run's own transactional commit is newer than what the consumer
            // fetched at the assignment.
            if let Some((offset, metadata)) = own.get(&tp) {
                if let Some(metadata) = metadata {
                    lanes.resume_from(tp, *offset, metadata);
                }
                continue;
            }
            if let Some((offset, metadata)) = self.consumer.committed_metadata(&tp) {
                lanes.resume_from(tp, offset, &metadata);
            }
        }
    }

    /// Commits `offsets`, each with its metadata in `metadata`; `false`: the commit
    /// failed (the lanes keep them pending).
    async fn commit(
        &self,
        offsets: &[(TopicPartition, i64)],
        metadata: &HashMap<TopicPartition, String>,
    ) -> bool {
        let offsets: Vec<(TopicPartition, i64, Option<String>)> = offsets
            .iter()
            .map(|(tp, o)| (tp.clone(), *o, metadata.get(tp).cloned()))
            .collect();
        match self.consumer.commit_offsets_with_metadata(&offsets).await {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, ?offsets, "commit failed");
                false
            }
        }
    }
}

/// The driver's side of the writes and, exactly once, of the open transaction.
#[derive(Debug, Default)]
struct Txn {
    /// Exactly once: a transaction is open.
    open: bool,
    /// Exactly once: a write could not be put in the open transaction; it aborts.
    /// At least once: an output could not be sent; the next commit is not made.
    failed: bool,
    /// Exactly once: the producer was fenced (or failed for good); nothing more is
    /// committed, and the run stops.
    fatal: Option<TransactionError>,
    /// Exactly once: the deliveries of the open transaction's writes; any that
    /// fails aborts it. At least once: those of the outputs written since the last
    /// commit; any that fails stops the next commit.
    deliveries: Vec<crate::producer::DeliveryFuture>,
    /// At least once: outputs written since the last commit, flushed before it.
    unflushed: bool,
    /// Exactly once: each partition's last offset committed in a transaction by
    /// this run, with its metadata.
    committed: HashMap<TopicPartition, (i64, Option<String>)>,
    /// Exactly once: the member whose offsets the group coordinator refused last
    /// (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID: the group moved on
    /// without this member knowing yet). The commit interval's commits wait while
    /// the member is still this one ([`Processor::end_txn`]).
    refused: Option<Refused>,
}

/// What a commit point commits: its offsets, what finished past each (the offsets'
/// metadata), and the group metadata a transaction's offsets carry (KIP-447).
struct Commit {
    point: Point,
    offsets: Vec<(TopicPartition, i64)>,
    metadata: HashMap<TopicPartition, String>,
    group: Option<ConsumerGroupMetadata>,
}

/// A commit point: the commit interval's, or a handover's (a revocation, the
/// shutdown), which must end the open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Interval,
    Handover,
}

/// The longest an interval's commit waits after the group refused the member's
/// offsets ([`Txn::refused`]). Long enough for a classic member to finish the
/// rejoin it is in or to learn at a heartbeat that it must rejoin (the wait ends
/// then, with the new metadata); far shorter than the default transaction timeout
/// (60 s), so the open transaction is not timed out meanwhile. It ends at most this
/// late when the refusal was not the group moving on (an injected error): the
/// commit is then tried again with the same metadata.
const REFUSED_WAIT: Duration = Duration::from_secs(10);

/// The member (generation and member id) whose transaction's offsets the group
/// refused, and until when the interval's commits wait for it to change.
#[derive(Debug)]
struct Refused {
    generation: i32,
    member_id: String,
    until: Instant,
}

impl Refused {
    /// A commit with `group`'s metadata, at `now`, waits.
    fn holds(&self, group: Option<&ConsumerGroupMetadata>, now: Instant) -> bool {
        now < self.until
            && group.is_some_and(|g| {
                g.generation_id == self.generation && g.member_id == self.member_id
            })
    }
}

/// How an exactly-once commit ended.
enum TxnEnd {
    Committed,
    Aborted,
    Fatal,
    /// Not tried: the group refused these offsets' generation already. The
    /// transaction stays open and its offsets go with the next commit.
    Held,
}

impl Processor {
    fn exactly_once(&self) -> bool {
        self.guarantee == ProcessingGuarantee::ExactlyOnce
    }

    /// Opens a transaction unless one is open; `false`: none could be.
    fn ensure_txn(&self, txn: &mut Txn) -> bool {
        if txn.open {
            return true;
        }
        match self.producer.begin_transaction() {
            Ok(()) => {
                txn.open = true;
                true
            }
            Err(e) => {
                warn!(error = %e, "could not open a transaction");
                if e.is_fatal() {
                    txn.fatal.get_or_insert(e);
                }
                false
            }
        }
    }

    /// Exactly once: `record` into the open transaction (opened if need be); `Err`:
    /// it could not be put in.
    async fn write_in_txn(
        &self,
        txn: &mut Txn,
        record: ProducerRecord,
    ) -> std::result::Result<(), String> {
        if txn.fatal.is_some() || !self.ensure_txn(txn) {
            return Err("no transaction could be opened".into());
        }
        match self.producer.send(record).await {
            Ok(delivery) => {
                txn.deliveries.push(delivery);
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The outputs of finished records: into the open transaction (exactly once), or
    /// written at once (at least once; flushed before the next commit).
    async fn write_outputs(&self, txn: &mut Txn, outputs: Vec<ProducerRecord>) {
        for record in outputs {
            if self.exactly_once() {
                if let Err(error) = self.write_in_txn(txn, record).await {
                    // Its record finished: the transaction that would commit it
                    // must not commit without this output.
                    warn!(%error, "a handler's output could not join the transaction; it aborts");
                    txn.failed = true;
                }
                continue;
            }
            txn.unflushed = true;
            match self.producer.send(record).await {
                Ok(delivery) => txn.deliveries.push(delivery),
                Err(error) => {
                    warn!(%error, "a handler's output was not written; the records since the last commit are handled again");
                    txn.failed = true;
                }
            }
        }
    }

    /// At least once: outputs written since the last commit are delivered (or
    /// failed) before it.
    ///
    /// `false` if one failed: the commit is not made (its records did not finish,
    /// their outputs being part of them), and the caller rewinds the lanes to the
    /// last commit, so those records are handled again and their outputs written
    /// again (at least once, a write may then be seen twice).
    async fn flush_outputs(&self, txn: &mut Txn) -> bool {
        if std::mem::take(&mut txn.unflushed) {
            self.producer.flush().await;
        }
        let mut ok = !std::mem::take(&mut txn.failed);
        for delivery in std::mem::take(&mut txn.deliveries) {
            if let Err(error) = delivery.await {
                warn!(%error, "a handler's output was not written; the records since the last commit are handled again");
                ok = false;
            }
        }
        ok
    }

    /// A commit point (the commit interval's, or a handover's): exactly once, the
    /// open transaction commits with the offsets ([`Processor::commit_txn`]); at
    /// least once, the outputs are delivered, then the offsets committed, and an
    /// output that failed rewinds the lanes instead. `true` if it committed.
    async fn commit_point(
        &self,
        commit: &Commit,
        txn: &mut Txn,
        lanes: &mut Lanes,
        stop: &mut Option<Result<()>>,
    ) -> bool {
        if self.exactly_once() {
            self.commit_txn(commit, txn, lanes, stop).await
        } else if self.flush_outputs(txn).await {
            commit.offsets.is_empty() || self.commit(&commit.offsets, &commit.metadata).await
        } else {
            self.rewind(lanes);
            false
        }
    }

    /// Exactly once: commits the open transaction with `offsets`; `true` if it
    /// committed. A transaction that cannot commit is aborted and the lanes rewound
    /// to the last commit (the records are handled again); a fenced producer stops
    /// the run (through `stop`). An interval's commit may also be held
    /// ([`TxnEnd::Held`]): the transaction stays open.
    async fn commit_txn(
        &self,
        commit: &Commit,
        txn: &mut Txn,
        lanes: &mut Lanes,
        stop: &mut Option<Result<()>>,
    ) -> bool {
        let Commit {
            offsets, metadata, ..
        } = commit;
        match self.end_txn(commit, txn).await {
            TxnEnd::Committed => {
                txn.refused = None;
                for (tp, offset) in offsets {
                    txn.committed
                        .insert(tp.clone(), (*offset, metadata.get(tp).cloned()));
                }
                // The lag (`ProcessorHandle::lag`) counts from these, not from the
                // offsets read at the assignment.
                self.consumer.committed_in_transaction(offsets);
                true
            }
            TxnEnd::Aborted => {
                self.rewind(lanes);
                false
            }
            TxnEnd::Fatal => {
                if let Some(e) = &txn.fatal {
                    stop.get_or_insert(Err(Error::Transaction(e.clone())));
                }
                false
            }
            TxnEnd::Held => false,
        }
    }

    async fn end_txn(&self, commit: &Commit, txn: &mut Txn) -> TxnEnd {
        let Commit {
            point,
            offsets,
            metadata,
            group,
        } = commit;
        if txn.fatal.is_some() {
            return TxnEnd::Fatal;
        }
        if self.abort_wanted.swap(false, Ordering::AcqRel) || txn.failed {
            return self.abort_txn(txn).await;
        }
        if offsets.is_empty() && !txn.open {
            return TxnEnd::Committed;
        }
        // The group refused this generation's offsets a moment ago: the member is
        // behind a rebalance it has not finished (or has not heard of yet). Trying
        // again each interval was refused each time, and each abort handed every
        // record since the last commit back to the handler, more of them each time
        // (exactly-once chaos, classic protocol, seed 44090011: one member refused 30
        // times in 6 s while it rejoined). So the interval's commits wait, the
        // transaction open, until the member has new metadata, for at most
        // REFUSED_WAIT. A handover does not wait: the partitions it releases must
        // not leave outputs in a transaction that commits without their offsets.
        if *point == Point::Interval
            && !offsets.is_empty()
            && txn
                .refused
                .as_ref()
                .is_some_and(|r| r.holds(group.as_ref(), Instant::now()))
        {
            return TxnEnd::Held;
        }
        if !self.ensure_txn(txn) {
            return self.abort_txn(txn).await;
        }
        // Every write of the transaction delivered, or it aborts: a write that
        // failed must not be committed past.
        self.producer.flush().await;
        let mut failed = false;
        for delivery in std::mem::take(&mut txn.deliveries) {
            if let Err(error) = delivery.await {
                warn!(%error, "a write of the transaction failed; it aborts");
                failed = true;
            }
        }
        if failed {
            return self.abort_txn(txn).await;
        }
        if !offsets.is_empty() {
            let Some(group) = group else {
                return self.abort_txn(txn).await;
            };
            let offsets = offsets
                .iter()
                .map(|(tp, offset)| TxnOffset {
                    partition: tp.clone(),
                    offset: *offset,
                    leader_epoch: -1,
                    metadata: metadata.get(tp).cloned(),
                })
                .collect();
            if let Err(e) = self
                .producer
                .send_offsets_to_transaction(offsets, group.clone())
                .await
            {
                let refused = e.is_stale_member().then(|| Refused {
                    generation: group.generation_id,
                    member_id: group.member_id.clone(),
                    until: Instant::now() + REFUSED_WAIT,
                });
                let end = self.txn_failed(txn, e).await;
                txn.refused = refused;
                return end;
            }
        }
        let started = Instant::now();
        match self
            .resumed("commit", || self.producer.commit_transaction())
            .await
        {
            Ok(()) => {
                txn.open = false;
                self.metric(Metric::Transaction {
                    committed: true,
                    offsets: offsets.len(),
                    took: started.elapsed(),
                });
                TxnEnd::Committed
            }
            Err(e @ TransactionError::Timeout { .. }) => {
                txn.fatal.get_or_insert(e);
                TxnEnd::Fatal
            }
            Err(e) => self.txn_failed(txn, e).await,
        }
    }

    /// A commit or abort, called again while it times out (`max.block.ms`): the
    /// EndTxn goes on in the background, and the same call waits for it (Java: "the
    /// previous call timed out and must be retried"). Its outcome is unknown until it
    /// answers, so the lanes may neither rewind (the commit may have happened: the
    /// records would be handled twice) nor go on. After [`END_TXN_TRIES`] it is
    /// fatal: the run stops, and the next instance with the `transactional.id`
    /// fences this one once the coordinator has finished the transaction.
    async fn resumed<F, Fut>(
        &self,
        what: &'static str,
        call: F,
    ) -> std::result::Result<(), TransactionError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<(), TransactionError>>,
    {
        let mut tries = 1;
        loop {
            match call().await {
                Err(e @ TransactionError::Timeout { .. }) if tries >= END_TXN_TRIES => {
                    error!(error = %e, tries, "the transaction's {what} did not finish; its outcome is unknown, and the run stops");
                    return Err(e);
                }
                Err(e @ TransactionError::Timeout { .. }) => {
                    warn!(error = %e, "the transaction's {what} is slow; waiting for it again");
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    async fn txn_failed(&self, txn: &mut Txn, e: TransactionError) -> TxnEnd {
        warn!(error = %e, "the transaction did not commit");
        if e.is_fatal() {
            txn.fatal.get_or_insert(e);
            return TxnEnd::Fatal;
        }
        self.abort_txn(txn).await
    }

    /// Aborts the open transaction: `read_committed` readers never see its writes.
    async fn abort_txn(&self, txn: &mut Txn) -> TxnEnd {
        txn.failed = false;
        txn.refused = None;
        txn.deliveries.clear();
        if !std::mem::take(&mut txn.open) {
            return TxnEnd::Aborted;
        }
        let started = Instant::now();
        match self
            .resumed("abort", || self.producer.abort_transaction())
            .await
        {
            Ok(()) => {
                self.metric(Metric::Transaction {
                    committed: false,
                    offsets: 0,
                    took: started.elapsed(),
                });
                TxnEnd::Aborted
            }
            // Not ended: no transaction can begin, and what it holds is undecided.
            Err(e @ TransactionError::Timeout { .. }) => {
                txn.fatal.get_or_insert(e);
                TxnEnd::Fatal
            }
            Err(e) if e.is_fatal() => {
                warn!(error = %e, "the transaction could not be aborted");
                txn.fatal.get_or_insert(e);
                TxnEnd::Fatal
            }
            Err(e) => {
                warn!(error = %e, "the transaction could not be aborted");
                TxnEnd::Aborted
            }
        }
    }

    /// After an abort: every lane dropped, each partition read again from its last
    /// commit.
    fn rewind(&self, lanes: &mut Lanes) {
        let restart = lanes.rewind(now());
        warn!(
            partitions = ?restart,
            "the commit point failed (an aborted transaction, or an output not written): the records since the last commit are handled again"
        );
        for (tp, offset) in restart {
            self.consumer.seek(&tp, offset);
        }
    }
}

/// Each offset's metadata, by partition (those with some).
fn with_metadata(
    offsets: &[(TopicPartition, i64)],
    metadata: Vec<Option<String>>,
) -> HashMap<TopicPartition, String> {
    offsets
        .iter()
        .zip(metadata)
        .filter_map(|((tp, _), m)| Some((tp.clone(), m?)))
        .collect()
}

/// The span of one `run_batch` call.
fn batch_span(group: &str, records: &[ConsumerRecord]) -> tracing::Span {
    let first = records.first();
    tracing::debug_span!(
        target: "ottla::record",
        "ottla.process_batch",
        otel.kind = "consumer",
        group,
        topic = first.map(|r| r.topic()),
        partition = first.map(|r| r.partition()),
        first_offset = first.map(|r| r.offset()),
        records = records.len(),
    )
}

/// A handler call's cancellation and progress, held by the driver while it runs.
#[derive(Default)]
struct Call {
    cancel: Cancel,
    progress: Progress,
    /// The progress already given to the lanes.
    seen: usize,
    /// How many records it was given.
    records: usize,
}

/// How many of the `given` records a call's handler was called on (or, for a batch,
/// called with): all but those left after it stopped or failed.
fn attempted(given: usize, outcome: &Outcome) -> usize {
    match (&outcome.result, outcome.stopped_after) {
        (_, Some(stopped)) => stopped,
        (Err(e), None) => e.index.map_or(given, |i| i + 1),
        (Ok(()), None) => given,
    }
    .min(given)
}

/// How many records of its batch a [`Processor::run`] call has finished so far, and
/// whether it should stop between records (its partition was paused).
#[derive(Debug, Clone, Default)]
struct Progress(Arc<(AtomicUsize, AtomicBool)>);

impl Progress {
    fn done(&self) -> usize {
        self.0.0.load(Ordering::Acquire)
    }

    #[inline]
    fn set(&self, done: usize) {
        self.0.0.store(done, Ordering::Release);
    }

    fn stop(&self) {
        self.0.1.store(true, Ordering::Release);
    }

    #[inline]
    fn stopping(&self) -> bool {
        self.0.1.load(Ordering::Acquire)
    }
}

/// What a task reports when it ends.
enum Finished {
    Handled(Ticket, Outcome, Duration),
    Produced(Ticket, std::result::Result<(), String>),
}

/// The clock, read for the lanes.
fn now() -> Now {
    Now {
        at: Instant::now().into_std(),
        unix_ms: now_ms(),
    }
}

/// Shared counters for tests and tools that read metrics from another task.
#[derive(Debug, Default, Clone)]
pub struct MetricsLog(Arc<Mutex<Vec<Metric>>>);

impl MetricsLog {
    /// A hook that appends to this log.
    pub fn hook(&self) -> impl Fn(Metric) + Send + Sync + 'static {
        let log = self.0.clone();
        move |m| {
            if let Ok(mut l) = log.lock() {
                l.push(m);
            }
        }
    }

    /// Everything observed so far.
    pub fn snapshot(&self) -> Vec<Metric> {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }
}
