//! One group member: an `ottla::Processor` on its own thread and current-thread
//! runtime, so that it can be stopped three ways:
//!
//! - **leave**: its shutdown future resolves; it acquiesces, commits and leaves;
//! - **abort**: its `run` future is dropped mid-flight (a task abort); the consumer's
//!   drop lets its background task send LeaveGroup, and nothing is committed;
//! - **crash**: the runtime is dropped at once, with every task in it: no commit, no
//!   LeaveGroup, sockets closed, as when a process dies.
//!
//! The application under test ([`App`]) is the user's: a `Processor` configured by the
//! user's closure with the user's handler, or the user's own `Consumer` loop. The
//! synthetic application of the `chaos` program ([`App::synthetic`]) reports every
//! call to the journal and fails on purpose as the seed says.
//!
//! With `--stall`, a task on the member's runtime blocks its thread now and then
//! ([`stall_at`]): the runtime is starved as on a busy machine, and every timer in it
//! fires late.

use std::sync::Arc;
use std::time::Duration;

use ottla::ClientConfig;
use ottla::ConsumerRecord;
use ottla::consumer::{GroupProtocol, OffsetReset};
use ottla::processor::{
    Cancel, Metric, ProcessError, ProcessingOrder, Processor, RetryBackoff, RetryPolicy,
};
use tokio::sync::oneshot;

use super::app::{App, AppKind, Seat, Witness};
use super::capture;
use super::journal::Journal;
use super::schedule::{mix, unit};

/// How a member is told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Close cleanly.
    Leave,
    /// Drop the `run` future.
    Abort,
    /// Drop the runtime.
    Crash,
}

/// What every member shares.
#[derive(Debug, Clone)]
pub struct MemberContext {
    /// Bootstrap servers.
    pub bootstrap: String,
    /// The group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The group protocol.
    pub group_protocol: GroupProtocol,
    /// The assignor: the members' (classic), or the one named to the broker
    /// (consumer; `None`: the broker's default).
    pub assignor: Option<String>,
    /// The run's seed.
    pub seed: u64,
    /// Handler failure probabilities.
    pub fates: Fates,
    /// How often processors commit.
    pub commit_interval: Duration,
    /// The session timeout; heartbeats every sixth of it (classic; under the consumer
    /// protocol the broker sets both).
    pub session_timeout: Duration,
    /// `fetch.max.wait.ms`.
    pub fetch_max_wait: Duration,
    /// Member stalls: the longest block and the mean gap between blocks (`None`: none).
    pub stall: Option<(Duration, Duration)>,
    /// The Processor's order.
    pub ordering: ProcessingOrder,
    /// Exactly-once mode ([`super::Config::exactly_once`]).
    pub exactly_once: bool,
    /// The journal.
    pub journal: Arc<Journal>,
    /// The application under test.
    pub app: App,
}

/// Handler failures drawn from the seed, the sequence number and the attempt, so that
/// they do not depend on timing or on which member handles the record.
#[derive(Debug, Clone, Copy)]
pub struct Fates {
    /// Probability that an attempt fails with a transient error.
    pub transient: f64,
    /// Probability that a record always fails with a permanent error (dead-lettered).
    pub permanent: f64,
    /// Probability that an attempt takes 50-300 ms (stopping early when cancelled).
    pub slow: f64,
}

impl Fates {
    /// No handler failures: the user's handler decides.
    pub const NONE: Fates = Fates {
        transient: 0.0,
        permanent: 0.0,
        slow: 0.0,
    };

    fn permanent(&self, seed: u64, seq: u64) -> bool {
        unit(mix(mix(seed, 1), seq)) < self.permanent
    }

    fn transient(&self, seed: u64, seq: u64, attempt: u32) -> bool {
        unit(mix(mix(mix(seed, 2), seq), u64::from(attempt))) < self.transient
    }

    fn work(&self, seed: u64, seq: u64, attempt: u32) -> Option<Duration> {
        let h = mix(mix(mix(seed, 3), seq), u64::from(attempt));
        (unit(h) < self.slow).then(|| Duration::from_millis(50 + (h >> 7) % 250))
    }
}

/// A running member incarnation.
#[derive(Debug)]
pub struct Member {
    /// Its slot.
    pub slot: usize,
    /// Its incarnation number in the journal.
    pub inc: usize,
    stop: Option<oneshot::Sender<Stop>>,
    done: Option<oneshot::Receiver<()>>,
}

impl Member {
    /// Starts incarnation `k` of `slot`.
    pub fn start(ctx: Arc<MemberContext>, slot: usize, k: usize) -> Member {
        let name = format!("m{slot}.{k}");
        let inc = ctx.journal.incarnation_started(name.clone());
        let (stop_tx, stop_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("chaos-{name}"))
            .spawn(move || {
                capture::enter_member(ctx.journal.clone(), inc);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        ctx.journal
                            .incarnation_ended(inc, format!("no runtime: {e}"), false);
                        return;
                    }
                };
                if let Some((max, every)) = ctx.stall {
                    runtime.spawn(stall(ctx.seed, inc, max, every));
                }
                let (how, expected) = runtime.block_on(life(&ctx, slot, inc, stop_rx));
                // A crash drops every task here, unpolled: nothing more is sent.
                drop(runtime);
                ctx.journal.incarnation_ended(inc, how, expected);
                let _ = done_tx.send(());
            });
        if let Err(e) = spawned {
            panic!("cannot spawn a member thread: {e}");
        }
        Member {
            slot,
            inc,
            stop: Some(stop_tx),
            done: Some(done_rx),
        }
    }

    /// Tells it to stop; returns false if it had already stopped.
    pub fn stop(&mut self, how: Stop) -> bool {
        self.stop.take().is_some_and(|s| s.send(how).is_ok())
    }

    /// Waits until its thread is done, up to `limit`; true if it is.
    pub async fn wait(&mut self, limit: Duration) -> bool {
        let Some(done) = self.done.as_mut() else {
            return true;
        };
        match tokio::time::timeout(limit, done).await {
            Ok(_) => {
                self.done = None;
                true
            }
            Err(_) => false,
        }
    }
}

/// The `k`th stall of incarnation `inc`: how long after the previous one it comes
/// (between half and one and a half of `every`) and how long it blocks (up to `max`),
/// drawn from the seed, so that a replay stalls the same members alike.
pub fn stall_at(
    seed: u64,
    inc: usize,
    k: u64,
    max: Duration,
    every: Duration,
) -> (Duration, Duration) {
    let h = mix(mix(mix(seed, 4), inc as u64), k);
    let gap = every.mul_f64(0.5 + unit(h));
    let block = max.mul_f64(unit(mix(h, 1)));
    (gap, block)
}

/// Blocks the member's (current-thread) runtime now and then for ever: nothing else
/// in it runs meanwhile, and its timers fire late.
async fn stall(seed: u64, inc: usize, max: Duration, every: Duration) {
    for k in 0.. {
        let (gap, block) = stall_at(seed, inc, k, max, every);
        tokio::time::sleep(gap).await;
        // On purpose: a blocking call on the runtime's only thread.
        std::thread::sleep(block);
    }
}

/// The member's life; returns how it ended and whether it was asked to.
async fn life(
    ctx: &Arc<MemberContext>,
    slot: usize,
    inc: usize,
    stop: oneshot::Receiver<Stop>,
) -> (String, bool) {
    match &ctx.app.kind {
        AppKind::Processor { configure, handler } => {
            processor_life(ctx, slot, inc, stop, configure, handler).await
        }
        AppKind::Consumer(body) => consumer_life(ctx, slot, inc, stop, body).await,
    }
}

/// A `Consumer` loop's life: the user's future runs until it returns (unasked: a
/// member failure) or the harness stops it (leave: its seat's `left` future resolves
/// and it has 45 s to close; abort and crash: the future is dropped).
async fn consumer_life(
    ctx: &Arc<MemberContext>,
    slot: usize,
    inc: usize,
    mut stop: oneshot::Receiver<Stop>,
    body: &super::app::ConsumerBody,
) -> (String, bool) {
    let (leave_tx, leave_rx) = tokio::sync::watch::channel(false);
    let seat = Seat {
        ctx: ctx.clone(),
        slot,
        inc,
        leave: leave_rx,
        witness: Witness::new(ctx.journal.clone(), inc, ctx.ordering),
    };
    let mut run = body(seat);
    tokio::select! {
        result = &mut run => (format!("the consumer loop returned on its own: {result:?}"), false),
        how = &mut stop => match how.unwrap_or(Stop::Crash) {
            Stop::Leave => {
                let _ = leave_tx.send(true);
                match tokio::time::timeout(Duration::from_secs(45), run).await {
                    Ok(Ok(())) => ("left".into(), true),
                    Ok(Err(e)) => (format!("the consumer loop failed while leaving: {e:#}"), false),
                    Err(_) => ("the consumer loop took more than 45 s to leave".into(), false),
                }
            }
            Stop::Abort => {
                drop(run);
                tokio::time::sleep(Duration::from_secs(1)).await;
                ("aborted".into(), true)
            }
            Stop::Crash => ("crashed".into(), true),
        },
    }
}

async fn processor_life(
    ctx: &Arc<MemberContext>,
    slot: usize,
    inc: usize,
    mut stop: oneshot::Receiver<Stop>,
    configure: &super::app::Configure,
    handler: &super::app::MakeHandler,
) -> (String, bool) {
    let processor = loop {
        tokio::select! {
            built = build(ctx, slot, inc, configure) => match built {
                Ok(p) => break p,
                Err(e) => ctx.journal.note(format!("m{slot} (#{inc}) could not start: {e}; retrying")),
            },
            _ = &mut stop => return ("stopped before it started".into(), true),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
            _ = &mut stop => return ("stopped before it started".into(), true),
        }
    };
    let (leave_tx, leave_rx) = oneshot::channel::<()>();
    let handler = handler(Witness::new(ctx.journal.clone(), inc, ctx.ordering));
    let mut run = Box::pin(processor.run(
        move |record: &ConsumerRecord, cancel: Cancel| handler(record, cancel),
        leave_rx,
    ));
    tokio::select! {
        result = &mut run => (format!("run returned on its own: {result:?}"), false),
        how = &mut stop => match how.unwrap_or(Stop::Crash) {
            Stop::Leave => {
                let _ = leave_tx.send(());
                match tokio::time::timeout(Duration::from_secs(45), run).await {
                    Ok(Ok(stats)) => (format!("left: {stats:?}"), true),
                    Ok(Err(e)) => (format!("close failed: {e}"), false),
                    Err(_) => ("close took more than 45 s".into(), false),
                }
            }
            Stop::Abort => {
                drop(run);
                // Let the consumer's background task see the drop and leave.
                tokio::time::sleep(Duration::from_secs(1)).await;
                ("aborted".into(), true)
            }
            Stop::Crash => ("crashed".into(), true),
        },
    }
}

async fn build(
    ctx: &Arc<MemberContext>,
    slot: usize,
    inc: usize,
    configure: &super::app::Configure,
) -> ottla::Result<Processor> {
    let client = client_config(ctx, slot, inc);
    let producer_client = client.clone();
    let assignor = ctx.assignor.clone();
    let protocol = ctx.group_protocol;
    let fetch_max_wait = ctx.fetch_max_wait;
    let hook = metrics_hook(ctx.journal.clone(), inc);
    let builder = Processor::builder(&ctx.bootstrap, &ctx.group, [ctx.topic.clone()])
        .retry_policy(policy())
        .timeouts(
            ctx.session_timeout,
            ctx.session_timeout / 6,
            Duration::from_secs(20),
        )
        .processing_budget(Duration::from_secs(5))
        .ordering(ctx.ordering)
        .commit_interval(Some(ctx.commit_interval))
        .consumer(move |c| consumer_settings(c, client, protocol, assignor, fetch_max_wait))
        .producer(move |p| {
            p.client_config(producer_client)
                .retry_backoff(Duration::from_millis(20))
        });
    // Exactly once: one transactional.id per slot, the same for each incarnation, so
    // that a restarted member fences the one before it (and aborts what it left open).
    let builder = if ctx.exactly_once {
        builder.exactly_once(format!("{}-m{slot}", ctx.group))
    } else {
        builder
    };
    // The user's settings (retry policy, dead letters, concurrency, ...), then the
    // harness's hook: it is how the checks see commits, dead letters and assignments.
    configure(builder).metrics(hook).build().await
}

/// The harness's settings of a member's consumer: its client id and jitter seed, the
/// earliest offsets, the fetch wait, the group protocol and assignor.
pub(crate) fn consumer_settings(
    c: ottla::consumer::ConsumerBuilder,
    client: ClientConfig,
    protocol: GroupProtocol,
    assignor: Option<String>,
    fetch_max_wait: Duration,
) -> ottla::consumer::ConsumerBuilder {
    let c = c
        .client_config(client)
        .offset_reset(OffsetReset::Earliest)
        .fetch_max_wait(fetch_max_wait)
        // The mock refuses a follower's SyncGroup that arrives after the
        // leader's (PEERS.md); harmless elsewhere.
        .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50));
    match (protocol, assignor) {
        (GroupProtocol::Classic, Some(a)) => match c.clone().assignors([a.as_str()]) {
            Ok(c) => c,
            Err(_) => c,
        },
        (GroupProtocol::Classic, None) => c,
        // The consumer protocol (and any later one: the broker assigns).
        (protocol, a) => {
            let c = c.group_protocol(protocol);
            match a {
                Some(a) => c.group_remote_assignor(a),
                None => c,
            }
        }
    }
}

/// The client settings of member incarnation `inc` of `slot`.
pub(crate) fn client_config(ctx: &MemberContext, slot: usize, inc: usize) -> ClientConfig {
    let mut client =
        ClientConfig::new(&ctx.bootstrap).with_client_id(format!("chaos-m{slot}-{inc}"));
    client.jitter_seed = mix(ctx.seed, 1000 + inc as u64);
    client
}

/// The Processor's metrics hook of incarnation `inc`: commits, dead letters,
/// generations and assignments go to the journal.
fn metrics_hook(journal: Arc<Journal>, inc: usize) -> impl Fn(Metric) + Send + Sync + 'static {
    move |m: Metric| match m {
        Metric::Committed { partition, offset } => {
            journal.committed(inc, partition.partition, offset)
        }
        Metric::DeadLettered {
            partition, offset, ..
        } => journal.dead_lettered(inc, partition.partition, offset),
        Metric::Retry { .. } => journal.retried(),
        Metric::Halted { .. } => journal.halted(),
        // The generation every later handler start of this incarnation is tagged with:
        // the Processor reports it before any record of the generation's new partitions.
        Metric::Joined { generation, .. } => {
            journal.member_log(inc, "joined".into(), Some(generation))
        }
        // Under the consumer protocol the member's epoch moves on without a join: the
        // epoch of its latest assignment tags what it handles from then on (a partition
        // goes to a new owner at a later epoch than the one its old owner got it in).
        // Under the classic protocol it is the generation just joined.
        Metric::Assigned {
            generation,
            partitions,
        } => {
            let ps: Vec<i32> = partitions.iter().map(|tp| tp.partition).collect();
            journal.assigned(inc, &ps, generation);
            journal.member_log(inc, "assigned".into(), Some(generation))
        }
        Metric::RevokeRequested { partitions, .. } => {
            let ps: Vec<i32> = partitions.iter().map(|tp| tp.partition).collect();
            journal.revoke_requested(inc, &ps);
        }
        Metric::Revoked { partitions, .. } => {
            let ps: Vec<i32> = partitions.iter().map(|tp| tp.partition).collect();
            journal.released(inc, &ps);
        }
        Metric::Lost { partitions } => {
            let ps: Vec<i32> = partitions.iter().map(|tp| tp.partition).collect();
            journal.lost(inc, &ps);
        }
        _ => {}
    }
}

/// Short retries, so that a failing record does not hold its partition for long.
fn policy() -> RetryPolicy {
    RetryPolicy {
        default: RetryBackoff {
            max_retries: 4,
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: true,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    }
}

/// The sequence number a record carries in its key (`<seq>`), checked against its
/// value (`seq=<seq> ...`); under key ordering the key is the order key, which the
/// value repeats after the sequence number (`seq=<seq> <key> ...`).
pub fn seq_of(record: &ConsumerRecord) -> Option<u64> {
    seq_in(record.key()?, record.value()?)
}

/// [`seq_of`] from a record's key and value as any client reads them.
pub(crate) fn seq_in(key: &[u8], value: &[u8]) -> Option<u64> {
    let key = std::str::from_utf8(key).ok()?;
    let value = std::str::from_utf8(value).ok()?;
    let mut words = value.strip_prefix("seq=")?.split(' ');
    let seq: u64 = words.next()?.parse().ok()?;
    match key.parse::<u64>() {
        Ok(k) => (k == seq).then_some(seq),
        Err(_) => (words.next()? == key).then_some(seq),
    }
}

type HandlerFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ProcessError>> + Send>>;

/// The `chaos` program's handler: fails on purpose as the seed says (`fates`).
/// With `copy`, a record that succeeds is copied to the output topic
/// ([`super::copy_of`]), for exactly-once runs.
pub(crate) fn synthetic_handler(
    witness: Witness,
    seed: u64,
    fates: Fates,
    copy: bool,
) -> impl Fn(&ConsumerRecord, Cancel) -> HandlerFuture + Send + Sync + 'static {
    move |record: &ConsumerRecord, cancel: Cancel| {
        let witness = witness.clone();
        let record = record.clone();
        Box::pin(async move {
            let Some(effect) = witness.begin(&record) else {
                return Err(ProcessError::malformed("no sequence number"));
            };
            let (seq, attempt) = (effect.seq(), effect.attempt());
            let journal = witness.journal();
            if let Some(work) = fates.work(seed, seq, attempt) {
                tokio::select! {
                    _ = tokio::time::sleep(work) => {}
                    _ = cancel.cancelled() => {
                        journal.handler_cancelled();
                        return Err(ProcessError::transient("Cancelled", "the partition is being revoked"));
                    }
                }
            }
            if fates.permanent(seed, seq) {
                journal.handler_failed(true);
                return Err(ProcessError::permanent(
                    "ChaosPermanent",
                    format!("seq {seq} always fails"),
                ));
            }
            if fates.transient(seed, seq, attempt) {
                journal.handler_failed(false);
                return Err(ProcessError::transient(
                    "ChaosTransient",
                    format!("seq {seq} attempt {attempt}"),
                ));
            }
            if copy {
                cancel.send(super::copy_of(&record));
            }
            effect.done();
            Ok(())
        })
    }
}
