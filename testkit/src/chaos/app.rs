//! The application under test: what each member of a chaos run runs.
//!
//! - [`App::processor`]: an ottla `Processor` that your closure configures (retry
//!   policy, dead letters, concurrency, ordering, ...) running your handler. A record
//!   counts as finished when your handler returns `Ok` (the Processor's own contract);
//! - [`App::processor_witnessed`]: the same, but your handler tells the harness when
//!   a record's work begins and ends ([`Witness::begin`], [`Effect::done`]), for a
//!   handler whose work is not over when it returns (spawned work, a queue);
//! - [`App::consumer`]: your own `Consumer` loop, given a [`Seat`]: a consumer builder
//!   set up for the run, a [`Witness`], the events to show it ([`Seat::observe`]) and
//!   the signal to leave ([`Seat::left`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ottla::ConsumerRecord;
use ottla::consumer::{ConsumerBuilder, ConsumerEvent, TopicPartition};
use ottla::processor::{Cancel, ProcessError, ProcessingOrder, ProcessorBuilder};

use super::journal::{Check, Journal};
use super::member::{self, Fates, MemberContext};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type BoxHandler =
    Box<dyn Fn(&ConsumerRecord, Cancel) -> BoxFuture<Result<(), ProcessError>> + Send + Sync>;
pub(crate) type Configure = Arc<dyn Fn(ProcessorBuilder) -> ProcessorBuilder + Send + Sync>;
pub(crate) type MakeHandler = Arc<dyn Fn(Witness) -> BoxHandler + Send + Sync>;
pub(crate) type ConsumerBody = Arc<dyn Fn(Seat) -> BoxFuture<anyhow::Result<()>> + Send + Sync>;

/// The application each member runs: build one with [`App::processor`],
/// [`App::processor_witnessed`] or [`App::consumer`].
#[derive(Clone)]
pub struct App {
    pub(crate) kind: AppKind,
}

#[derive(Clone)]
pub(crate) enum AppKind {
    Processor {
        configure: Configure,
        handler: MakeHandler,
    },
    Consumer(ConsumerBody),
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.kind {
            AppKind::Processor { .. } => "App::processor",
            AppKind::Consumer(_) => "App::consumer",
        })
    }
}

impl App {
    /// A `Processor` per member, configured by `configure` and running `handler`.
    ///
    /// The harness makes the builder (bootstrap, group, topic, the run's session
    /// timeout, a commit interval of 200 ms, short retries, the group protocol) and
    /// `configure` adjusts it: your retry policy, dead-letter topic, concurrency,
    /// ordering. It then sets its own metrics hook (how the checks see commits, dead
    /// letters and assignments): a hook of yours is replaced.
    ///
    /// A record is finished when `handler` returns `Ok` for it, and dead-lettered when
    /// the Processor reports its dead-letter write acknowledged.
    pub fn processor<C, H, F>(configure: C, handler: H) -> App
    where
        C: Fn(ProcessorBuilder) -> ProcessorBuilder + Send + Sync + 'static,
        H: Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), ProcessError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        App {
            kind: AppKind::Processor {
                configure: Arc::new(configure),
                handler: Arc::new(move |witness: Witness| {
                    let handler = handler.clone();
                    Box::new(move |record: &ConsumerRecord, cancel: Cancel| {
                        let effect = witness.begin(record);
                        let call = handler(record, cancel);
                        Box::pin(async move {
                            let result = call.await;
                            if let (Ok(()), Some(effect)) = (&result, effect) {
                                effect.done();
                            }
                            result
                        }) as BoxFuture<_>
                    }) as BoxHandler
                }),
            },
        }
    }

    /// A `Processor` per member whose handler reports its own work: `make` is called
    /// once per member incarnation with its [`Witness`] and returns the handler. The
    /// handler calls [`Witness::begin`] when a record's work starts and
    /// [`Effect::done`] when it is complete; returning `Ok` finishes nothing by itself.
    /// This is how a handler that spawns its work, or queues it, is checked: the
    /// Processor may commit once the handler returns, and the harness sees whether the
    /// work was done by then.
    pub fn processor_witnessed<C, M, H, F>(configure: C, make: M) -> App
    where
        C: Fn(ProcessorBuilder) -> ProcessorBuilder + Send + Sync + 'static,
        M: Fn(Witness) -> H + Send + Sync + 'static,
        H: Fn(&ConsumerRecord, Cancel) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), ProcessError>> + Send + 'static,
    {
        App {
            kind: AppKind::Processor {
                configure: Arc::new(configure),
                handler: Arc::new(move |witness: Witness| {
                    let handler = make(witness);
                    Box::new(move |record: &ConsumerRecord, cancel: Cancel| {
                        Box::pin(handler(record, cancel)) as BoxFuture<_>
                    }) as BoxHandler
                }),
            },
        }
    }

    /// Your own `Consumer` loop: `body` runs once per member incarnation with its
    /// [`Seat`], and returns when the seat's [`Seat::left`] resolves (after closing
    /// its consumer). Returning earlier, or with an error, is a member failure.
    ///
    /// The loop reports its work with the seat's [`Witness`] and passes every
    /// [`ConsumerEvent`] to [`Seat::observe`] (assignments, revocations, commits), and
    /// calls [`Seat::released`] when it completes a revocation. Commits are also read
    /// back from the broker every second and checked against the finished records.
    pub fn consumer<B, F>(body: B) -> App
    where
        B: Fn(Seat) -> F + Send + Sync + 'static,
        F: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        App {
            kind: AppKind::Consumer(Arc::new(move |seat| Box::pin(body(seat)))),
        }
    }

    /// The `chaos` program's application: a Processor whose handler fails on purpose
    /// as `seed` and `fates` say (transient failures, records that always fail and are
    /// dead-lettered, slow calls that stop when cancelled).
    pub fn synthetic(seed: u64, fates: Fates) -> App {
        App::synthetic_with(seed, fates, false)
    }

    /// [`App::synthetic`] that also copies each record it finishes to the output
    /// topic ([`super::copy_of`]): the application of `--exactly-once` runs.
    pub fn synthetic_copying(seed: u64, fates: Fates) -> App {
        App::synthetic_with(seed, fates, true)
    }

    fn synthetic_with(seed: u64, fates: Fates, copy: bool) -> App {
        App {
            kind: AppKind::Processor {
                configure: Arc::new(|b| b),
                handler: Arc::new(move |witness: Witness| {
                    let handler = member::synthetic_handler(witness, seed, fates, copy);
                    Box::new(move |record: &ConsumerRecord, cancel: Cancel| handler(record, cancel))
                        as BoxHandler
                }),
            },
        }
    }

    pub(crate) fn is_consumer(&self) -> bool {
        matches!(self.kind, AppKind::Consumer(_))
    }
}

/// What a member tells the checks about its work: one per member incarnation.
#[derive(Clone)]
pub struct Witness {
    journal: Arc<Journal>,
    inc: usize,
    ordering: ProcessingOrder,
}

impl std::fmt::Debug for Witness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Witness")
            .field("member", &self.inc)
            .finish()
    }
}

impl Witness {
    pub(crate) fn new(journal: Arc<Journal>, inc: usize, ordering: ProcessingOrder) -> Self {
        Witness {
            journal,
            inc,
            ordering,
        }
    }

    pub(crate) fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The work on `record` begins: the checks see this member handling its partition
    /// (two members at once, a partition this member no longer holds, a finished
    /// record redone below the committed offset, key order) until the [`Effect`] is
    /// dropped. `None` when the record is not one the run's producer wrote (a content
    /// violation is counted).
    pub fn begin(&self, record: &ConsumerRecord) -> Option<Effect> {
        let (partition, offset) = (record.partition(), record.offset());
        let Some(seq) = member::seq_of(record) else {
            self.journal.violation(
                Check::Content,
                format!(
                    "record {partition}@{offset} has no sequence number or a value that does not match it"
                ),
            );
            return None;
        };
        let attempt = self
            .journal
            .handler_started(self.inc, partition, offset, seq);
        let key = (self.ordering == ProcessingOrder::Key).then(|| {
            let key = record.key().unwrap_or_default().to_vec();
            self.journal.key_started(self.inc, partition, offset, &key);
            key
        });
        Some(Effect {
            journal: self.journal.clone(),
            inc: self.inc,
            partition,
            offset,
            seq,
            attempt,
            key,
        })
    }
}

/// The work on one record, begun with [`Witness::begin`]; [`Effect::done`] when it is
/// complete. Dropped without `done`, the work stopped unfinished.
#[derive(Debug)]
pub struct Effect {
    journal: Arc<Journal>,
    inc: usize,
    partition: i32,
    offset: i64,
    seq: u64,
    attempt: u32,
    key: Option<Vec<u8>>,
}

impl Effect {
    /// The record's sequence number (the run's producer numbers every record).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Which attempt this is at the record, anywhere in the group (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The work is complete: the record is finished.
    pub fn done(self) {
        self.journal.handled(self.inc, self.partition, self.offset);
    }
}

impl Drop for Effect {
    fn drop(&mut self) {
        self.journal.handler_finished(self.inc, self.partition);
        if let Some(key) = &self.key {
            self.journal.key_finished(self.inc, self.partition, key);
        }
    }
}

/// A member's place in the run, for a [`App::consumer`] loop.
pub struct Seat {
    pub(crate) ctx: Arc<MemberContext>,
    pub(crate) slot: usize,
    pub(crate) inc: usize,
    pub(crate) leave: tokio::sync::watch::Receiver<bool>,
    pub(crate) witness: Witness,
}

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seat")
            .field("slot", &self.slot)
            .field("member", &self.inc)
            .finish()
    }
}

impl Seat {
    /// A consumer builder for this member: the run's bootstrap servers, group and
    /// topic, session timeout, group protocol, earliest offsets. Add your settings
    /// and build it.
    pub fn consumer(&self) -> ConsumerBuilder {
        let ctx = &self.ctx;
        let client = member::client_config(ctx, self.slot, self.inc);
        let c = ottla::consumer::Consumer::builder(&ctx.bootstrap)
            .group_id(ctx.group.clone())
            .topics([ctx.topic.clone()])
            .session_timeout(ctx.session_timeout)
            .heartbeat_interval(ctx.session_timeout / 6)
            .max_poll_interval(Duration::from_secs(20));
        member::consumer_settings(
            c,
            client,
            ctx.group_protocol,
            ctx.assignor.clone(),
            ctx.fetch_max_wait,
        )
    }

    /// The topic the run's records are in.
    pub fn topic(&self) -> &str {
        &self.ctx.topic
    }

    /// This member's witness.
    pub fn witness(&self) -> &Witness {
        &self.witness
    }

    /// Resolves when the harness asks this member to leave: close the consumer and
    /// return.
    pub async fn left(&self) {
        let mut leave = self.leave.clone();
        let _ = leave.wait_for(|l| *l).await;
    }

    /// Shows the harness a consumer event: joins and assignments (the generations
    /// the ownership checks tag work with), revocation requests, losses and commits.
    pub fn observe(&self, event: &ConsumerEvent) {
        let j = &self.ctx.journal;
        let inc = self.inc;
        let ps = |tps: &[TopicPartition]| -> Vec<i32> {
            tps.iter()
                .filter(|tp| tp.topic == self.ctx.topic)
                .map(|tp| tp.partition)
                .collect()
        };
        match event {
            ConsumerEvent::Joined { generation, .. } => {
                j.member_log(inc, "joined".into(), Some(*generation))
            }
            ConsumerEvent::Assigned {
                generation,
                added,
                assignment,
                ..
            } => {
                j.retain_held(inc, &ps(assignment));
                j.assigned(inc, &ps(added), *generation);
                j.member_log(inc, "assigned".into(), Some(*generation));
            }
            ConsumerEvent::RevokeRequested { partitions, .. } => {
                j.revoke_requested(inc, &ps(partitions))
            }
            ConsumerEvent::Lost { partitions, .. } => j.lost(inc, &ps(partitions)),
            ConsumerEvent::CommitCompleted {
                result: Ok(offsets),
                ..
            } => {
                for o in offsets {
                    if o.partition.topic == self.ctx.topic {
                        j.committed(inc, o.partition.partition, o.offset);
                    }
                }
            }
            _ => {}
        }
    }

    /// This member gave `partitions` back (call it when you complete a revocation).
    pub fn released(&self, partitions: &[TopicPartition]) {
        let ps: Vec<i32> = partitions
            .iter()
            .filter(|tp| tp.topic == self.ctx.topic)
            .map(|tp| tp.partition)
            .collect();
        self.ctx.journal.released(self.inc, &ps);
    }
}
