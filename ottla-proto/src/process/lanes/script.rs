//! Scripts of operations on [`Lanes`], checked against a model of what the driver
//! knows, for the proptest in `lanes/tests.rs` and the `lanes_ops` fuzz target (with
//! the `testing` feature).
//!
//! # Input
//!
//! One configuration byte (`max_batch` 1-3 from bits 0-1, a 700 ms commit interval
//! from bit 2, `concurrency` 1-3 from bits 3-4), then operations until the input ends:
//! one byte, `op % 11`, and the bytes its arguments need (a missing byte reads 0).
//!
//! | op | what happens |
//! |---|---|
//! | 0 | records delivered to one of three partitions (1-5 of them) |
//! | 1, 2 | a handler call in flight answers: done, a transient, permanent, skip or cancelled error at some record, an error naming no record, stopped early, or its task crashed |
//! | 3 | a handler call in flight reports records finished on the way |
//! | 4 | a write in flight is acknowledged or fails |
//! | 5 | the clock moves (0-3 s), then `handle_timeout` |
//! | 6 | a partition is revoked, with 0-2 s to stop |
//! | 7 | a partition is lost |
//! | 8 | the next commit fails |
//! | 9 | an answer for a call or write that is not in flight |
//! | 10 | the application pauses or resumes one partition or all of them |
//!
//! Then every pause is lifted, and every call and write succeeds and time passes,
//! 40 rounds.
//!
//! # Promises checked
//!
//! - [`Lanes::check`] after every step.
//! - A commit, or a handover's offsets, never passes a record the model has not seen
//!   finish (its handler's success or skip, its progress, or its write acknowledged).
//! - At most one handler call or write in flight per partition.
//! - A released partition keeps no lane.
//! - In the end, every record of a partition still held has finished: none is stranded
//!   behind work that never ends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{Action, Handover, Lanes, LanesConfig, Now, Outcome, Ticket};
use crate::fetch::fetcher::ConsumerRecord;
use crate::group::consumer_protocol::TopicPartition;
use crate::process::classify::BatchError;
use crate::process::classify::ProcessError;
use crate::process::retry::{RetryBackoff, RetryPolicy};

/// The wall clock at a script's start (ms); the scenario tests start there too.
pub(super) const T0_MS: i64 = 1_800_000_000_000;

/// Partition `p` of the topic every script and scenario test uses.
pub(super) fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("orders", p)
}

/// A record of partition `p` at `offset`, written at [`T0_MS`].
pub(super) fn record(p: i32, offset: i64) -> ConsumerRecord {
    ConsumerRecord::builder("orders", p, offset)
        .timestamp(T0_MS)
        .value("v")
        .build()
}

/// The bytes of a script, read front to back; past the end, zeros.
struct Bytes8<'a>(&'a [u8]);

impl Bytes8<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
}

#[derive(Debug, Clone, Copy)]
enum How {
    Ok,
    Transient(u8),
    Permanent(u8),
    Skip(u8),
    Cancelled(u8),
    Whole,
    Stopped(u8),
    Crash,
}

/// One step of a script.
#[derive(Debug, Clone)]
enum Op {
    Deliver {
        p: i32,
        n: u8,
    },
    Answer {
        i: u8,
        how: How,
    },
    Progress {
        i: u8,
        done: u8,
    },
    Write {
        i: u8,
        ok: bool,
    },
    Advance {
        ms: u16,
    },
    Revoke {
        p: i32,
        wait_ms: u16,
    },
    Lose {
        p: i32,
    },
    CommitFails,
    Stray {
        ticket: u8,
        write: bool,
    },
    /// `p` 3: every partition.
    Hold {
        p: i32,
        on: bool,
    },
}

fn op(b: &mut Bytes8<'_>) -> Op {
    match b.u8() % 11 {
        0 => Op::Deliver {
            p: i32::from(b.u8() % 3),
            n: 1 + b.u8() % 5,
        },
        1 | 2 => {
            let i = b.u8();
            let k = b.u8();
            let how = match b.u8() % 12 {
                0..=3 => How::Ok,
                4 | 5 => How::Transient(k),
                6 => How::Permanent(k),
                7 => How::Skip(k),
                8 => How::Cancelled(k),
                9 => How::Whole,
                10 => How::Stopped(k),
                _ => How::Crash,
            };
            Op::Answer { i, how }
        }
        3 => Op::Progress {
            i: b.u8(),
            done: b.u8(),
        },
        4 => Op::Write {
            i: b.u8(),
            ok: b.u8() % 3 != 0,
        },
        5 => Op::Advance { ms: b.u16() % 3000 },
        6 => Op::Revoke {
            p: i32::from(b.u8() % 3),
            wait_ms: b.u16() % 2000,
        },
        7 => Op::Lose {
            p: i32::from(b.u8() % 3),
        },
        8 => Op::CommitFails,
        10 => Op::Hold {
            p: i32::from(b.u8() % 4),
            on: b.u8() % 2 == 0,
        },
        _ => Op::Stray {
            ticket: b.u8(),
            write: b.u8() % 2 == 0,
        },
    }
}

/// A handler call in flight, as the model sees it.
struct Call {
    ticket: Ticket,
    p: i32,
    offsets: Vec<i64>,
    /// Records reported finished on the way.
    reported: usize,
}

/// What the driver knows, kept apart from the lanes: the records it delivered and has
/// not seen finish, per partition. A commit past one of them is the bug the lanes must
/// never have.
#[derive(Default)]
struct Model {
    next: BTreeMap<i32, i64>,
    unfinished: BTreeMap<i32, BTreeSet<i64>>,
    calls: Vec<Call>,
    /// Writes in flight: ticket, partition, the record's offset.
    writes: Vec<(Ticket, i32, i64)>,
    /// The last record each partition's handler failed on: the next write is its.
    failed: BTreeMap<i32, i64>,
    /// Partitions revoked and not yet released.
    releasing: BTreeSet<i32>,
    fail_next_commit: bool,
}

impl Model {
    fn bound(&self, tp: &TopicPartition, offset: i64) -> Result<(), String> {
        let first = self
            .unfinished
            .get(&tp.partition)
            .and_then(|s| s.first().copied());
        match first {
            Some(f) if offset > f => {
                Err(format!("commit {offset} of {tp:?} passes unfinished {f}"))
            }
            _ => Ok(()),
        }
    }

    fn forget(&mut self, p: i32) {
        self.unfinished.remove(&p);
        self.calls.retain(|c| c.p != p);
        self.writes.retain(|w| w.1 != p);
        self.releasing.remove(&p);
    }
}

/// Two retries, 100 ms then 200 ms (each plus up to 10% with `jitter`), the policy
/// of every script and scenario test.
pub(super) fn two_retries(jitter: bool) -> RetryPolicy {
    RetryPolicy {
        default: RetryBackoff {
            max_retries: 2,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            multiplier: 2.0,
            jitter,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    }
}

/// Runs `script`; the first broken promise, with the operation that broke it.
pub fn run(script: &[u8]) -> Result<(), String> {
    let mut b = Bytes8(script);
    let header = b.u8();
    let config = LanesConfig {
        group: "g".into(),
        policy: two_retries(true),
        max_batch: 1 + usize::from(header % 4).min(2),
        commit_interval: (header & 4 != 0).then_some(Duration::from_millis(700)),
        concurrency: 1 + usize::from((header >> 3) % 3),
        metrics: true,
        ..LanesConfig::default()
    };
    // A script's virtual clock starts at the real time once (`testing` only).
    #[allow(clippy::disallowed_methods)]
    let start = Instant::now();
    let mut now = Now {
        at: start,
        unix_ms: T0_MS,
    };
    let mut lanes = Lanes::new(config, now);
    let mut model = Model::default();
    while !b.0.is_empty() {
        let op = op(&mut b);
        let step = format!("{op:?}");
        apply(&mut lanes, &mut model, &mut now, op).map_err(|e| format!("after {step}: {e}"))?;
    }
    // Then every pause is lifted, and every call and write succeeds and time passes.
    apply(
        &mut lanes,
        &mut model,
        &mut now,
        Op::Hold { p: 3, on: false },
    )?;
    for _ in 0..40 {
        while !model.calls.is_empty() {
            let how = How::Ok;
            apply(&mut lanes, &mut model, &mut now, Op::Answer { i: 0, how })?;
        }
        while !model.writes.is_empty() {
            apply(
                &mut lanes,
                &mut model,
                &mut now,
                Op::Write { i: 0, ok: true },
            )?;
        }
        apply(&mut lanes, &mut model, &mut now, Op::Advance { ms: 3000 })?;
    }
    let held = lanes.partitions();
    let stranded: Vec<_> = model
        .unfinished
        .iter()
        .filter(|(p, left)| !left.is_empty() && held.contains(&tp(**p)))
        .collect();
    if stranded.is_empty() {
        Ok(())
    } else {
        Err(format!("never finished: {stranded:?}"))
    }
}

/// Runs the actions, checking each against the model, until none is left.
fn drain(lanes: &mut Lanes, model: &mut Model, now: Now) -> Result<(), String> {
    lanes.check()?;
    while let Some(action) = lanes.poll_action() {
        match action {
            Action::Dispatch {
                ticket,
                partition,
                records,
                ..
            } => {
                let p = partition.partition;
                if model.calls.iter().any(|c| c.p == p) || model.writes.iter().any(|w| w.1 == p) {
                    return Err(format!("two things in flight on {partition:?}"));
                }
                model.calls.push(Call {
                    ticket,
                    p,
                    offsets: records.iter().map(|r| r.offset()).collect(),
                    reported: 0,
                });
            }
            Action::Produce {
                ticket, partition, ..
            } => {
                let p = partition.partition;
                let offset = model
                    .failed
                    .get(&p)
                    .copied()
                    .ok_or("a write for a record that never failed")?;
                model.writes.push((ticket, p, offset));
            }
            Action::Commit(offsets) => {
                for (tp, o) in &offsets {
                    model.bound(tp, *o)?;
                }
                let ok = !std::mem::take(&mut model.fail_next_commit);
                lanes.committed(&offsets, ok, now);
            }
            Action::Release {
                partitions,
                offsets,
                ..
            } => {
                for (tp, o) in &offsets {
                    model.bound(tp, *o)?;
                }
                lanes.committed(&offsets, true, now);
                for tp in &partitions {
                    if lanes.partitions().contains(tp) {
                        return Err(format!("{tp:?} released but its lane lives on"));
                    }
                    model.forget(tp.partition);
                }
            }
            Action::Cancel(_) | Action::Yield(_) | Action::Pause(_) | Action::Resume(_) => {}
        }
        lanes.check()?;
    }
    Ok(())
}

fn apply(lanes: &mut Lanes, model: &mut Model, now: &mut Now, op: Op) -> Result<(), String> {
    match op {
        Op::Deliver { p, n } => {
            let next = model.next.entry(p).or_insert(0);
            let records: Vec<_> = (0..i64::from(n)).map(|i| record(p, *next + i)).collect();
            *next += i64::from(n);
            if !model.releasing.contains(&p) {
                model
                    .unfinished
                    .entry(p)
                    .or_default()
                    .extend(records.iter().map(|r| r.offset()));
            }
            lanes.deliver(records, *now);
        }
        Op::Answer { i, how } => {
            if model.calls.is_empty() {
                return Ok(());
            }
            let Call {
                ticket,
                p,
                offsets,
                reported,
            } = model.calls.remove(usize::from(i) % model.calls.len());
            let n = offsets.len();
            // Indexes name records of the whole batch, past those reported finished.
            let pending = n - reported;
            let at = |k: u8| reported + usize::from(k) % pending.max(1);
            let set = model.unfinished.entry(p).or_default();
            let mut finish = |upto: usize| {
                for o in offsets.iter().take(upto) {
                    set.remove(o);
                }
            };
            let outcome = match how {
                _ if pending == 0 => {
                    finish(n);
                    Outcome::of(Ok(()))
                }
                How::Ok => {
                    finish(n);
                    Outcome::of(Ok(()))
                }
                How::Transient(k) | How::Permanent(k) | How::Cancelled(k) => {
                    finish(at(k));
                    let error = match how {
                        How::Transient(_) => ProcessError::transient("T", "t"),
                        How::Permanent(_) => ProcessError::permanent("P", "p"),
                        _ => ProcessError::cancelled(),
                    };
                    if let Some(o) = offsets.get(at(k)) {
                        model.failed.insert(p, *o);
                    }
                    Outcome::of(Err(BatchError::at(at(k), error)))
                }
                How::Skip(k) => {
                    finish(at(k) + 1);
                    Outcome::of(Err(BatchError::at(at(k), ProcessError::skip("S", "s"))))
                }
                How::Whole | How::Crash => {
                    finish(reported);
                    if pending == 1 {
                        if let Some(o) = offsets.last() {
                            model.failed.insert(p, *o);
                        }
                    }
                    if matches!(how, How::Crash) {
                        lanes.crashed(ticket, "crash".into(), *now);
                        return drain(lanes, model, *now);
                    }
                    Outcome::of(Err(BatchError::whole(ProcessError::transient("W", "w"))))
                }
                How::Stopped(k) => {
                    finish(at(k));
                    Outcome {
                        stopped_after: Some(at(k)),
                        ..Outcome::of(Ok(()))
                    }
                }
            };
            lanes.handled(ticket, outcome, Duration::ZERO, *now);
        }
        Op::Progress { i, done } => {
            if model.calls.is_empty() {
                return Ok(());
            }
            let k = usize::from(i) % model.calls.len();
            let Some(call) = model.calls.get_mut(k) else {
                return Ok(());
            };
            let n = call.offsets.len();
            let done = call.reported + usize::from(done) % (n - call.reported + 1);
            let set = model.unfinished.entry(call.p).or_default();
            for o in call.offsets.iter().take(done) {
                set.remove(o);
            }
            call.reported = done;
            lanes.progress(call.ticket, done, *now);
        }
        Op::Write { i, ok } => {
            if model.writes.is_empty() {
                return Ok(());
            }
            let (ticket, p, offset) = model.writes.remove(usize::from(i) % model.writes.len());
            if ok {
                if let Some(s) = model.unfinished.get_mut(&p) {
                    s.remove(&offset);
                }
            }
            let result = if ok { Ok(()) } else { Err("down".into()) };
            lanes.produced(ticket, result, *now);
        }
        Op::Advance { ms } => {
            now.at += Duration::from_millis(u64::from(ms));
            now.unix_ms += i64::from(ms);
            lanes.handle_timeout(*now);
        }
        Op::Revoke { p, wait_ms } => {
            model.releasing.insert(p);
            lanes.release(
                vec![tp(p)],
                Handover::Revoked { generation: 1 },
                Duration::from_millis(u64::from(wait_ms)),
                *now,
            );
        }
        Op::Lose { p } => {
            model.forget(p);
            lanes.lose(&[tp(p)], *now);
        }
        Op::CommitFails => model.fail_next_commit = true,
        Op::Hold { p, on } => {
            let one = [tp(p)];
            let which = (p < 3).then_some(&one[..]);
            if on {
                lanes.pause(which, *now);
            } else {
                lanes.resume(which, *now);
            }
        }
        Op::Stray { ticket, write } => {
            // A ticket far from any in flight: the lanes must ignore it.
            let ticket = Ticket(1_000_000 + u64::from(ticket));
            if write {
                lanes.produced(ticket, Ok(()), *now);
            } else {
                lanes.handled(ticket, Outcome::of(Ok(())), Duration::ZERO, *now);
            }
        }
    }
    drain(lanes, model, *now)
}
