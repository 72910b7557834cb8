//! Scripts of operations on [`Lanes`], checked against a model of what the driver
//! knows, for the proptest in `lanes/tests.rs` and the `lanes_ops` fuzz target (with
//! the `testing` feature).
//!
//! # Input
//!
//! One configuration byte (`max_batch` 1-3 from bits 0-1, a 700 ms commit interval
//! from bit 2, `concurrency` 1-3 from bits 3-4, the [`ProcessingOrder`] from bits 5-6:
//! partition, key, unordered), then operations until the input ends:
//! one byte, `op % 11`, and the bytes its arguments need (a missing byte reads 0).
//!
//! | op | what happens |
//! |---|---|
//! | 0 | records delivered to one of three partitions (1-5 of them; record `o` has key `o % 4`, none for 3) |
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
//!   finish (its handler's success or skip, its progress, or its write acknowledged),
//!   and its metadata names none as finished past it.
//! - No more handler calls in flight than `concurrency`.
//! - By partition: at most one handler call or write in flight per partition. By key:
//!   per key, and a call's records are of one key, its first the key's first record
//!   not finished (so a key's records are handled in offset order).
//! - A released partition keeps no lane.
//! - In the end, every record of a partition still held has finished: none is stranded
//!   behind work that never ends.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::{Action, Handover, Lanes, LanesConfig, Now, Outcome, ProcessingOrder, Ticket};
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
#[cfg(test)]
pub(super) fn record(p: i32, offset: i64) -> ConsumerRecord {
    ConsumerRecord::builder("orders", p, offset)
        .timestamp(T0_MS)
        .value("v")
        .build()
}

/// The key of a script's record at `offset`: `offset % 4`, none for 3.
fn key_of(offset: i64) -> Option<u8> {
    u8::try_from(offset % 4).ok().filter(|k| *k < 3)
}

/// A script's record of partition `p` at `offset`: keyed by [`key_of`], its offset as
/// its value (so its dead letter names it).
fn script_record(p: i32, offset: i64) -> ConsumerRecord {
    let b = ConsumerRecord::builder("orders", p, offset)
        .timestamp(T0_MS)
        .value(offset.to_string());
    match key_of(offset) {
        Some(k) => b.key(vec![k]),
        None => b,
    }
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
    /// Records whose handler failed, by partition: a write is for one of them.
    failed: BTreeMap<i32, BTreeSet<i64>>,
    order: ProcessingOrder,
    concurrency: usize,
    /// Records delivered while their partition was being handed over: dropped.
    dropped: BTreeMap<i32, BTreeSet<i64>>,
    /// Partitions revoked and not yet released.
    releasing: BTreeSet<i32>,
    fail_next_commit: bool,
    /// Exactly once: a commit that fails is an aborted transaction, and the driver
    /// rewinds the lanes.
    transactional: bool,
    /// The last offset committed for each partition since its lane was made, and the
    /// first offset delivered to it: where a rewind must restart it.
    committed: BTreeMap<i32, i64>,
    first: BTreeMap<i32, i64>,
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

    /// A call on `offsets` of partition `p` may start: within `concurrency`; by
    /// partition, alone on it; by key, alone on its key, all of one key, and that
    /// key's first record not finished.
    fn check_dispatch(&self, p: i32, offsets: &[i64]) -> Result<(), String> {
        if self.calls.len() >= self.concurrency {
            return Err(format!(
                "a call past the concurrency of {}",
                self.concurrency
            ));
        }
        let busy = |o: &i64| {
            self.calls
                .iter()
                .filter(|c| c.p == p)
                .flat_map(|c| c.offsets.iter().skip(c.reported))
                .chain(self.writes.iter().filter(|w| w.1 == p).map(|w| &w.2))
                .any(|b| b == o)
        };
        match self.order {
            ProcessingOrder::Partition
                if self.calls.iter().any(|c| c.p == p) || self.writes.iter().any(|w| w.1 == p) =>
            {
                return Err(format!("two things in flight on partition {p}"));
            }
            ProcessingOrder::Key => {
                let first = offsets.first().copied().ok_or("an empty call")?;
                let key = key_of(first);
                if key.is_none() && offsets.len() > 1 {
                    return Err(format!("records without a key in one call: {offsets:?}"));
                }
                if offsets.iter().any(|o| key_of(*o) != key) {
                    return Err(format!("one call on records of two keys: {offsets:?}"));
                }
                if let Some(k) = key {
                    let unfinished = self.unfinished.get(&p);
                    let earlier = unfinished
                        .into_iter()
                        .flatten()
                        .filter(|o| **o < first && key_of(**o) == Some(k))
                        .copied()
                        .collect::<Vec<_>>();
                    if !earlier.is_empty() {
                        return Err(format!(
                            "record {first} of key {k} handed out before {earlier:?} finished"
                        ));
                    }
                    let other = unfinished
                        .into_iter()
                        .flatten()
                        .filter(|o| key_of(**o) == Some(k) && !offsets.contains(o))
                        .any(busy);
                    if other {
                        return Err(format!("two things in flight on key {k} of partition {p}"));
                    }
                }
            }
            _ => {}
        }
        if offsets.iter().any(busy) {
            return Err(format!("records {offsets:?} handed out while in flight"));
        }
        Ok(())
    }

    /// A commit's metadata names only records the model saw finish.
    fn claims(
        &self,
        offsets: &[(TopicPartition, i64)],
        metadata: &[Option<String>],
    ) -> Result<(), String> {
        if metadata.len() != offsets.len() {
            return Err(format!(
                "{} offsets, {} metadata",
                offsets.len(),
                metadata.len()
            ));
        }
        for ((tp, o), m) in offsets.iter().zip(metadata) {
            let Some(m) = m else { continue };
            let p = tp.partition;
            let next = self.next.get(&p).copied().unwrap_or(0);
            for f in crate::process::finished::decode(*o, m)
                .into_iter()
                .flatten()
            {
                let unfinished = self.unfinished.get(&p).is_some_and(|u| u.contains(&f));
                if unfinished || f >= next || self.dropped.get(&p).is_some_and(|d| d.contains(&f)) {
                    return Err(format!(
                        "commit metadata {m} of {tp:?} at {o} names {f}, not finished"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Committed, as the broker answered.
    fn commit(&mut self, offsets: &[(TopicPartition, i64)]) {
        for (tp, o) in offsets {
            let c = self.committed.entry(tp.partition).or_insert(*o);
            *c = (*c).max(*o);
        }
    }

    /// A rewind restarts `p` at `offset`: its last commit, or where its lane started;
    /// everything after was in the aborted transaction.
    fn restart(&mut self, p: i32, offset: i64) -> Result<(), String> {
        let expected = self.committed.get(&p).or(self.first.get(&p)).copied();
        if expected != Some(offset) {
            return Err(format!(
                "partition {p} rewound to {offset}, not its last commit {expected:?}"
            ));
        }
        self.forget(p);
        self.next.insert(p, offset);
        Ok(())
    }

    fn forget(&mut self, p: i32) {
        self.committed.remove(&p);
        self.first.remove(&p);
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
        ordering: match (header >> 5) % 4 {
            1 => ProcessingOrder::Key,
            2 => ProcessingOrder::Unordered,
            _ => ProcessingOrder::Partition,
        },
        metrics: true,
        transactional: header & 0x80 != 0,
        ..LanesConfig::default()
    };
    // A script's virtual clock starts at the real time once (`testing` only).
    #[allow(clippy::disallowed_methods)]
    let start = Instant::now();
    let mut now = Now {
        at: start,
        unix_ms: T0_MS,
    };
    let mut model = Model {
        order: config.ordering,
        concurrency: config.concurrency,
        transactional: config.transactional,
        ..Model::default()
    };
    let mut lanes = Lanes::new(config, now);
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
            // Queued before a rewind dropped its lane: the driver starts nothing.
            Action::Dispatch { ticket, .. } | Action::Produce { ticket, .. }
                if !lanes.in_flight(ticket) => {}
            Action::Dispatch {
                ticket,
                partition,
                records,
                ..
            } => {
                let p = partition.partition;
                model.check_dispatch(p, &records.iter().map(|r| r.offset()).collect::<Vec<_>>())?;
                model.calls.push(Call {
                    ticket,
                    p,
                    offsets: records.iter().map(|r| r.offset()).collect(),
                    reported: 0,
                });
            }
            Action::Produce {
                ticket,
                partition,
                record,
            } => {
                let p = partition.partition;
                let offset = record
                    .value
                    .as_ref()
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                    .filter(|o| model.failed.get(&p).is_some_and(|f| f.contains(o)))
                    .ok_or("a write for a record that never failed")?;
                if model.order == ProcessingOrder::Partition
                    && (model.calls.iter().any(|c| c.p == p)
                        || model.writes.iter().any(|w| w.1 == p))
                {
                    return Err(format!("two things in flight on {partition:?}"));
                }
                model.writes.push((ticket, p, offset));
            }
            Action::Commit(offsets) => {
                for (tp, o) in &offsets {
                    model.bound(tp, *o)?;
                }
                model.claims(&offsets, &lanes.commit_metadata(&offsets))?;
                let ok = !std::mem::take(&mut model.fail_next_commit);
                lanes.committed(&offsets, ok, now);
                if ok {
                    model.commit(&offsets);
                }
                if !ok && model.transactional {
                    // The transaction aborted: each partition is read again from its
                    // last commit, by a new lane.
                    for (tp, offset) in lanes.rewind(now) {
                        model.restart(tp.partition, offset)?;
                    }
                    if !lanes.partitions().is_empty() {
                        return Err("a lane outlived the rewind".into());
                    }
                }
            }
            Action::Release {
                partitions,
                offsets,
                metadata,
                ..
            } => {
                for (tp, o) in &offsets {
                    model.bound(tp, *o)?;
                }
                model.claims(&offsets, &metadata)?;
                lanes.committed(&offsets, true, now);
                model.commit(&offsets);
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
            let records: Vec<_> = (0..i64::from(n))
                .map(|i| script_record(p, *next + i))
                .collect();
            *next += i64::from(n);
            let set = if model.releasing.contains(&p) {
                model.dropped.entry(p).or_default()
            } else {
                if let Some(first) = records.first() {
                    model.first.entry(p).or_insert(first.offset());
                }
                model.unfinished.entry(p).or_default()
            };
            set.extend(records.iter().map(|r| r.offset()));
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
                        model.failed.entry(p).or_default().insert(*o);
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
                            model.failed.entry(p).or_default().insert(*o);
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
