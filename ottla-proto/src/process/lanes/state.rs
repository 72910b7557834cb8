//! What a lane holds: its records, its tracker, and the work it is doing (a call, a wait,
//! a write, a halt); a record's state between attempts; a handover under way.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::Run;
use super::types::{Handover, Ticket};
use crate::fetch::fetcher::ConsumerRecord;
use crate::group::consumer_protocol::TopicPartition;
use crate::process::classify::{ErrorClass, ProcessError};
use crate::process::tracker::OffsetTracker;
use crate::trace::TraceContext;

/// The state of one record between attempts.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    pub(super) record: ConsumerRecord,
    /// Attempts made so far.
    pub(super) attempts: u32,
    pub(super) first_failure_ms: Option<i64>,
    pub(super) last_error: Option<ProcessError>,
    /// How long the last attempt took.
    pub(super) took: Duration,
    /// The trace context of the last attempt, for the record's hop or dead letter.
    pub(super) trace: Option<TraceContext>,
}

impl Attempt {
    pub(super) fn first(record: ConsumerRecord) -> Self {
        Self {
            record,
            attempts: 0,
            first_failure_ms: None,
            last_error: None,
            took: Duration::ZERO,
            trace: None,
        }
    }
}

/// Where a failed record goes: a retry topic's hop, or the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Destination {
    Hop(u32),
    DeadLetters,
}

/// What one lane is doing.
#[derive(Debug, Default)]
pub(super) enum Work {
    /// Nothing: the next records start when a slot is free.
    #[default]
    Idle,
    /// A handler call runs on `run`; the first `reported` of its records finished already
    /// ([`Lanes::progress`](super::Lanes::progress)). `retry`: the first record is on a
    /// retry, and this is its state (the others are on their first attempt).
    Running {
        ticket: Ticket,
        run: Run,
        retry: Option<Box<Attempt>>,
        reported: usize,
        cancelled: bool,
    },
    /// A record waits for its retry (or a retry-topic record for its time).
    Waiting { attempt: Attempt, until: Instant },
    /// A record is being written to `to`.
    Forwarding {
        ticket: Ticket,
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        failures: u32,
    },
    /// The write of a record failed `failures` times; it is tried again at `retry_at`,
    /// and nothing after it is handled or committed meanwhile.
    Halted {
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        retry_at: Instant,
        failures: u32,
    },
}

impl Work {
    pub(super) fn ticket(&self) -> Option<Ticket> {
        match self {
            Work::Running { ticket, .. } | Work::Forwarding { ticket, .. } => Some(*ticket),
            _ => None,
        }
    }
}

/// A handler call that ended, as its lane held it.
pub(super) struct Ran {
    pub(super) run: Run,
    pub(super) retry: Option<Box<Attempt>>,
    pub(super) reported: usize,
    pub(super) cancelled: bool,
}

/// Which line of its partition's lane a record joins: every record the same one under
/// [`Ordering::Partition`](super::Ordering::Partition), one per key under `Key`, one per
/// run of up to a batch of records under `Unordered` (and for records with no key under
/// `Key`).
pub(super) type Slot = u64;

/// The records of one line, in offset order, and the one piece of work on them: a
/// handler call, a wait, a write or a halt. Under partition ordering a lane has one
/// line; under key ordering one per key with records or work.
#[derive(Debug, Default)]
pub(super) struct Line {
    /// The records delivered and not yet handed to a call, in runs as they came.
    pub(super) queue: VecDeque<Run>,
    /// How many records `queue` holds.
    pub(super) queued: usize,
    /// What the line is doing: changed only through [`Lane::set_work`], which keeps
    /// the lane's counts and indexes.
    work: Work,
    /// Records up to this offset are handled one at a time: their batch failed
    /// without naming a record.
    pub(super) solo_through: Option<i64>,
    /// On the lane's `ready` queue.
    ready: bool,
    /// When a record arrived while the line was busy, until a call starts.
    blocked_since: Option<Instant>,
}

impl Line {
    pub(super) fn work(&self) -> &Work {
        &self.work
    }

    /// The running call's state, to change in place (its progress, its cancellation).
    pub(super) fn running_mut(&mut self) -> Option<&mut Work> {
        matches!(self.work, Work::Running { .. }).then_some(&mut self.work)
    }
}

/// How many lines of a lane are doing each kind of work.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Busy {
    pub(super) running: usize,
    pub(super) forwarding: usize,
    pub(super) waiting: usize,
    pub(super) halted: usize,
    /// Writes being tried again after a failure (counted in `forwarding` too).
    pub(super) failing: usize,
}

impl Busy {
    fn count(&mut self, work: &Work, add: bool) {
        let n = match work {
            Work::Idle => return,
            Work::Running { .. } => &mut self.running,
            Work::Forwarding { failures, .. } => {
                if *failures > 0 {
                    self.failing = step(self.failing, add);
                }
                &mut self.forwarding
            }
            Work::Waiting { .. } => &mut self.waiting,
            Work::Halted { .. } => &mut self.halted,
        };
        *n = step(*n, add);
    }

    /// Whether any line has work.
    pub(super) fn any(&self) -> bool {
        self.running + self.forwarding + self.waiting + self.halted > 0
    }

    /// Whether a write of the lane is halted, or being tried again after it failed.
    pub(super) fn halting(&self) -> bool {
        self.halted + self.failing > 0
    }
}

fn step(n: usize, add: bool) -> usize {
    if add { n + 1 } else { n.saturating_sub(1) }
}

/// Hashes a [`Slot`], which is a key's hash or an offset already: one multiply, not
/// SipHash (a line is looked up several times a record).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct SlotHasher(u64);

impl std::hash::Hasher for SlotHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Lines = HashMap<Slot, Line, std::hash::BuildHasherDefault<SlotHasher>>;

/// One partition's lane: its lines, what commits it, and its handover.
#[derive(Debug, Default)]
pub(super) struct Lane {
    pub(super) lines: Lines,
    /// Lines idle with records, in the order they became so (an entry whose line is no
    /// longer so is dropped when it comes up).
    ready: VecDeque<Slot>,
    /// Lines waiting for a retry, or halted, by when they are due (an entry whose line
    /// no longer waits until then is dropped when it comes up).
    timers: BTreeSet<(Instant, Slot)>,
    /// Lines that became idle and may have nothing left: removed by [`Lane::tidy`]
    /// (only with `many` lines: the one line of a lane by partition lives as long as
    /// the lane).
    emptied: Vec<Slot>,
    many: bool,
    /// How many records the lines' queues hold.
    pub(super) queued: usize,
    pub(super) busy: Busy,
    pub(super) tracker: OffsetTracker,
    pub(super) paused: bool,
    /// Being handed over: nothing new starts, failures are not retried.
    pub(super) releasing: bool,
    /// The tracker's finishes when the last commit carrying this lane's finished
    /// records went out (`None`: none did, or it failed).
    pub(super) sent_finishes: Option<u64>,
    /// Records the commit's metadata of the previous owner says finished: delivered,
    /// they are finished at once, not handled again.
    pub(super) skip: Vec<std::ops::Range<i64>>,
}

impl Lane {
    /// A lane whose first record is at `start`; with `many` lines (by key, unordered)
    /// or one.
    pub(super) fn starting_at(start: i64, many: bool) -> Self {
        Self {
            tracker: OffsetTracker::starting_at(start),
            many,
            ..Self::default()
        }
    }

    pub(super) fn line(&self, slot: Slot) -> Option<&Line> {
        self.lines.get(&slot)
    }

    pub(super) fn line_mut(&mut self, slot: Slot) -> Option<&mut Line> {
        self.lines.get_mut(&slot)
    }

    /// Sets the work of line `slot` (made if missing) and gives the work it had,
    /// keeping the counts and the indexes.
    pub(super) fn set_work(&mut self, slot: Slot, work: Work) -> Work {
        let line = self.lines.entry(slot).or_default();
        self.busy.count(&line.work, false);
        self.busy.count(&work, true);
        match &work {
            Work::Waiting { until, .. } => {
                self.timers.insert((*until, slot));
            }
            Work::Halted { retry_at, .. } => {
                self.timers.insert((*retry_at, slot));
            }
            _ => {}
        }
        let old = std::mem::replace(&mut line.work, work);
        if matches!(line.work, Work::Idle) {
            if line.queued > 0 {
                if !line.ready {
                    line.ready = true;
                    self.ready.push_back(slot);
                }
            } else if self.many {
                self.emptied.push(slot);
            }
        }
        old
    }

    /// Takes line `slot`'s work, leaving it idle.
    pub(super) fn take_work(&mut self, slot: Slot) -> Work {
        if self.lines.contains_key(&slot) {
            self.set_work(slot, Work::Idle)
        } else {
            Work::Idle
        }
    }

    /// Queues `records`, arrived at `at`, at the back of line `slot` (made if missing).
    pub(super) fn push_back(&mut self, slot: Slot, records: Run, at: Instant) {
        if let Some(line) = self.lines.get_mut(&slot) {
            let busy = !matches!(line.work, Work::Idle) || line.queued > 0;
            if busy && line.blocked_since.is_none() {
                line.blocked_since = Some(at);
            }
        }
        self.queue_run(slot, records, false);
    }

    /// When a record of line `slot` that arrived while it was busy came, once.
    pub(super) fn take_blocked(&mut self, slot: Slot) -> Option<Instant> {
        self.lines.get_mut(&slot)?.blocked_since.take()
    }

    /// Puts `records` back at the front of line `slot` (made if missing).
    pub(super) fn push_front(&mut self, slot: Slot, records: Run) {
        self.queue_run(slot, records, true);
    }

    fn queue_run(&mut self, slot: Slot, records: Run, front: bool) {
        if records.is_empty() {
            return;
        }
        let line = self.lines.entry(slot).or_default();
        line.queued += records.len();
        self.queued += records.len();
        if front {
            line.queue.push_front(records);
        } else {
            line.queue.push_back(records);
        }
        if matches!(line.work, Work::Idle) && !line.ready {
            line.ready = true;
            self.ready.push_back(slot);
        }
    }

    /// `n` records were added to line `slot`'s queue in place (onto its last run).
    pub(super) fn added(&mut self, slot: Slot, n: usize) {
        if let Some(line) = self.lines.get_mut(&slot) {
            line.queued += n;
        }
        self.queued += n;
    }

    /// `n` records were taken off line `slot`'s queue.
    pub(super) fn took(&mut self, slot: Slot, n: usize) {
        if let Some(line) = self.lines.get_mut(&slot) {
            line.queued = line.queued.saturating_sub(n);
        }
        self.queued = self.queued.saturating_sub(n);
    }

    /// Drops every queued record (the lane is being handed over).
    pub(super) fn clear_queues(&mut self) {
        for (slot, line) in &mut self.lines {
            line.queue.clear();
            line.queued = 0;
            line.ready = false;
            if self.many {
                self.emptied.push(*slot);
            }
        }
        self.ready.clear();
        self.queued = 0;
    }

    /// The next line to start, and whether it is a retry that fell due: one waiting
    /// for a retry whose time has come first, then the one ready longest. `None`:
    /// nothing can start now.
    pub(super) fn next_start(&mut self, now: Instant) -> Option<Slot> {
        while let Some(&(at, slot)) = self.timers.first() {
            if at > now {
                break;
            }
            match self.lines.get(&slot).map(|l| &l.work) {
                Some(Work::Waiting { until, .. }) if *until == at => {
                    self.timers.pop_first();
                    return Some(slot);
                }
                // A halted line is tried again by `handle_timeout`, not started.
                Some(Work::Halted { retry_at, .. }) if *retry_at == at => break,
                _ => {
                    self.timers.pop_first();
                }
            }
        }
        while let Some(slot) = self.ready.pop_front() {
            let Some(line) = self.lines.get_mut(&slot) else {
                continue;
            };
            line.ready = false;
            if matches!(line.work, Work::Idle) && line.queued > 0 {
                return Some(slot);
            }
        }
        None
    }

    /// When the next wait of the lane ends: a retry's (only with `retries`) or a
    /// halted write's.
    pub(super) fn next_timer(&self, retries: bool) -> Option<Instant> {
        self.timers
            .iter()
            .find(|(at, slot)| match self.lines.get(slot).map(|l| &l.work) {
                Some(Work::Waiting { until, .. }) => retries && until == at,
                Some(Work::Halted { retry_at, .. }) => retry_at == at,
                _ => false,
            })
            .map(|(at, _)| *at)
    }

    /// The halted lines whose write is due again at `now`.
    pub(super) fn due_halts(&self, now: Instant) -> Vec<Slot> {
        self.timers
            .iter()
            .take_while(|(at, _)| *at <= now)
            .filter(|(at, slot)| {
                matches!(self.lines.get(slot).map(|l| &l.work), Some(Work::Halted { retry_at, .. }) if retry_at == at)
            })
            .map(|(_, slot)| *slot)
            .collect()
    }

    /// Removes the lines that are idle with nothing queued (with `many` lines only).
    pub(super) fn tidy(&mut self) {
        if self.emptied.is_empty() {
            return;
        }
        for slot in std::mem::take(&mut self.emptied) {
            if self
                .lines
                .get(&slot)
                .is_some_and(|l| matches!(l.work, Work::Idle) && l.queued == 0)
            {
                self.lines.remove(&slot);
            }
        }
        if self.timers.len() > 2 * self.lines.len() + 16 {
            let lines = &self.lines;
            self.timers.retain(|(at, slot)| {
                matches!(lines.get(slot).map(|l| &l.work),
                    Some(Work::Waiting { until: t, .. } | Work::Halted { retry_at: t, .. }) if t == at)
            });
        }
    }

    /// The tickets of the lines' work.
    pub(super) fn tickets(&self) -> impl Iterator<Item = Ticket> + '_ {
        self.lines.values().filter_map(|l| l.work.ticket())
    }

    /// Checks the counts and the indexes against the lines; the first difference.
    pub(super) fn check_books(&self) -> Result<(), String> {
        let mut busy = Busy::default();
        let mut queued = 0;
        for (slot, line) in &self.lines {
            busy.count(&line.work, true);
            queued += line.queued;
            let runs: usize = line.queue.iter().map(|r| r.len()).sum();
            if runs != line.queued || line.queue.iter().any(|r| r.is_empty()) {
                return Err(format!(
                    "line {slot}: {runs} records in runs, {} counted, or an empty run",
                    line.queued
                ));
            }
            if matches!(line.work, Work::Idle) && line.queued > 0 && !line.ready {
                return Err(format!("line {slot}: idle with records, not ready"));
            }
            if line.ready && !self.ready.contains(slot) {
                return Err(format!("line {slot}: marked ready, not queued so"));
            }
            let due = match &line.work {
                Work::Waiting { until, .. } => Some(*until),
                Work::Halted { retry_at, .. } => Some(*retry_at),
                _ => None,
            };
            if let Some(at) = due {
                if !self.timers.contains(&(at, *slot)) {
                    return Err(format!("line {slot}: waits with no timer"));
                }
            }
        }
        if busy != self.busy {
            return Err(format!("counts {:?}, lines {busy:?}", self.busy));
        }
        if queued != self.queued {
            return Err(format!("{} queued counted, {queued} in lines", self.queued));
        }
        Ok(())
    }
}

#[derive(Debug)]
pub(super) struct Releasing {
    pub(super) handover: Handover,
    pub(super) partitions: Vec<TopicPartition>,
    pub(super) deadline: Instant,
}
