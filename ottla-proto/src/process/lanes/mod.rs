//! The processor's rules as a sans-IO machine: one lane per partition, handling its
//! records in lines, one call at a time per line, in offset order: one line per
//! partition, or one per key ([`ProcessingOrder`]); retries that wait without holding up the
//! other lanes; dead-letter and retry-topic writes; halts while the dead-letter topic
//! cannot be written; commits of each lane's finished prefix; revocations and loss.
//!
//! [`Lanes`] takes its inputs as calls (records delivered, a handler's outcome, a write
//! acknowledged, a commit answered, partitions revoked or lost, the time) and gives
//! its outputs through [`Lanes::poll_action`]: start a handler, stop one, write a
//! record, commit, pause or resume a partition, hand partitions over. It reads no
//! clock and starts no task: `ottla::processor` does both and is only a driver.
//!
//! Invariants, checked after every step by the tests and the `lanes_ops` fuzz target
//! ([`Lanes::check`]):
//! 1. A commit never passes a record that was delivered and has not finished
//!    (succeeded, skipped, or its dead-letter or retry-topic write acknowledged).
//! 2. At most one handler call or write is in flight per line: per partition under
//!    [`ProcessingOrder::Partition`], per key under `Key`; a line's records go to
//!    calls in offset order.
//! 3. Retry state dies with the assignment that made it: a revoked or lost partition
//!    keeps no lane, and an answer for work of an older assignment changes nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::finished;
use super::run::offset_runs;
use super::tracker::OffsetTracker;
use crate::backoff::Backoff;
use crate::fetch::fetcher::ConsumerRecord;
use crate::group::consumer_protocol::TopicPartition;

mod forward;
mod handover;
mod outcome;
mod state;
mod types;

pub use super::run::Run;
use forward::hop_of;
pub use forward::producer_headers;
pub use forward::{HALT_BACKOFF, RETRY_HOP, dead_letter_record, retry_topic};
use state::{Attempt, Lane, Releasing, Slot, Work};
pub use types::{
    Action, DlqName, Handover, LanesConfig, Metric, Now, Outcome, ProcessingOrder, Stats, Ticket,
};

/// The target of the lanes' log lines: the processor's, as before the rules moved here,
/// so `RUST_LOG=ottla::processor=...` filters them as it always did.
const LOG_TARGET: &str = "ottla::processor";

/// The lanes of one processor run. See the module docs.
#[derive(Debug)]
pub struct Lanes {
    config: LanesConfig,
    lanes: BTreeMap<TopicPartition, Lane>,
    /// The lane and line of each ticket in flight.
    tickets: HashMap<Ticket, (TopicPartition, Slot)>,
    next_ticket: u64,
    /// xorshift state (never zero).
    jitter: u64,
    /// The pace of a halted lane's write: [`HALT_BACKOFF`], jittered.
    halt_backoff: Backoff,
    next_commit: Option<Instant>,
    commit_in_flight: bool,
    releases: Vec<Releasing>,
    /// Finished ranges from a commit's metadata, for partitions whose lane is not made
    /// yet ([`Lanes::resume_from`]).
    skips: HashMap<TopicPartition, Vec<std::ops::Range<i64>>>,
    halted: usize,
    /// Partitions the application paused ([`Lanes::pause`]); `held_all`: every one.
    held: BTreeSet<TopicPartition>,
    held_all: bool,
    actions: VecDeque<Action>,
    metrics: VecDeque<Metric>,
    stats: Stats,
    /// [`Lanes::report`] is applying answers: nothing steps (no commit, release or
    /// call is made) until all are in.
    reporting: bool,
}

impl Lanes {
    /// Lanes for one run, starting at `now`.
    pub fn new(config: LanesConfig, now: Now) -> Self {
        Self {
            next_commit: config.commit_interval.map(|i| now.at + i),
            jitter: config.jitter_seed.max(1),
            halt_backoff: Backoff::new(HALT_BACKOFF.0, HALT_BACKOFF.1, config.jitter_seed),
            config,
            lanes: BTreeMap::new(),
            tickets: HashMap::new(),
            next_ticket: 0,
            commit_in_flight: false,
            releases: Vec::new(),
            skips: HashMap::new(),
            halted: 0,
            held: BTreeSet::new(),
            held_all: false,
            actions: VecDeque::new(),
            metrics: VecDeque::new(),
            stats: Stats::default(),
            reporting: false,
        }
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next metric observation (only with [`LanesConfig::metrics`]).
    pub fn poll_metric(&mut self) -> Option<Metric> {
        self.metrics.pop_front()
    }

    /// When [`Lanes::handle_timeout`] is next due: a retry's wait, a halted write's
    /// next try, the commit interval, a handover's deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let saturated = self.saturated();
        // A retry whose time has come waits for a free slot, which only a handler's
        // answer frees, or for the application's resume: no timer then.
        let lanes = self
            .lanes
            .iter()
            .filter_map(|(tp, l)| l.next_timer(!saturated && !self.is_held(tp)));
        let commit = self.next_commit.filter(|_| !self.commit_in_flight);
        lanes
            .chain(commit)
            .chain(self.releases.iter().map(|r| r.deadline))
            .min()
    }

    /// The counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Records fetched and waiting in the lanes for their handler call (not counting
    /// those in a call, or waiting for a retry).
    pub fn queued(&self) -> usize {
        self.lanes.values().map(|l| l.queued).sum()
    }

    /// Whether `ticket`'s work is still the lanes' (not answered, nor dropped by a
    /// revocation, a loss or a rewind): what its call finished may still commit.
    pub fn in_flight(&self, ticket: Ticket) -> bool {
        self.tickets.contains_key(&ticket)
    }

    /// Whether `tp` has a lane (it has had records since it was assigned).
    pub fn has_lane(&self, tp: &TopicPartition) -> bool {
        self.lanes.contains_key(tp)
    }

    /// The partitions that have a lane.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        self.lanes.keys().cloned().collect()
    }

    /// Whether more records are welcome (fewer than four lane buffers are queued).
    pub fn wants_records(&self) -> bool {
        self.queued() < self.config.lane_buffer.saturating_mul(4)
    }

    /// The application pauses `partitions` (`None`: every partition, those assigned
    /// later included), for a circuit breaker: no handler call starts on them, a due
    /// retry waits too, and they are not fetched, until [`Lanes::resume`]. Calls
    /// running finish; dead-letter writes go on.
    pub fn pause(&mut self, partitions: Option<&[TopicPartition]>, now: Now) {
        match partitions {
            Some(ps) => {
                for tp in ps {
                    // A partition without a lane is paused here; a lane's pause
                    // follows from its state (`update_pauses`).
                    if !self.lanes.contains_key(tp) && self.held.insert(tp.clone()) {
                        self.actions.push_back(Action::Pause(tp.clone()));
                    }
                    self.held.insert(tp.clone());
                }
            }
            None => self.held_all = true,
        }
        // Calls running on many records stop after the one in hand.
        for (tp, lane) in &self.lanes {
            if self.held_all || self.held.contains(tp) {
                for line in lane.lines.values() {
                    if let Work::Running { ticket, .. } = line.work() {
                        self.actions.push_back(Action::Yield(*ticket));
                    }
                }
            }
        }
        self.step(now);
    }

    /// Lifts [`Lanes::pause`] of `partitions` (`None`: every pause, the one of every
    /// partition and each partition's own).
    pub fn resume(&mut self, partitions: Option<&[TopicPartition]>, now: Now) {
        let lifted: Vec<TopicPartition> = match partitions {
            Some(ps) => ps
                .iter()
                .filter(|tp| self.held.remove(*tp))
                .cloned()
                .collect(),
            None => {
                self.held_all = false;
                std::mem::take(&mut self.held).into_iter().collect()
            }
        };
        for tp in lifted {
            if !self.lanes.contains_key(&tp) {
                self.actions.push_back(Action::Resume(tp));
            }
        }
        self.step(now);
    }

    /// Whether the application holds any partition paused.
    pub fn holding(&self) -> bool {
        self.held_all || !self.held.is_empty()
    }

    fn is_held(&self, tp: &TopicPartition) -> bool {
        self.held_all || self.held.contains(tp)
    }

    /// Whether a handover is under way.
    pub fn releasing(&self) -> bool {
        !self.releases.is_empty()
    }

    /// Whether [`Metric::Processed`] is read (see [`LanesConfig::processed_metrics`]).
    fn wants_processed(&self) -> bool {
        self.config.metrics && self.config.processed_metrics
    }

    /// [`Metric::Processed`], built only when someone reads it.
    fn processed(&mut self, success: bool, duration: Duration) {
        if self.wants_processed() {
            self.metrics
                .push_back(Metric::Processed { success, duration });
        }
    }

    /// Any other metric: every `Processed` goes through [`Lanes::processed`].
    fn metric(&mut self, m: Metric) {
        if self.config.metrics {
            self.metrics.push_back(m);
        }
    }

    fn ticket(&mut self, tp: &TopicPartition, slot: Slot) -> Ticket {
        self.next_ticket += 1;
        let t = Ticket(self.next_ticket);
        self.tickets.insert(t, (tp.clone(), slot));
        t
    }

    fn next_jitter(&mut self) -> f64 {
        let s = &mut self.jitter;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }

    fn running(&self) -> usize {
        self.lanes.values().map(|l| l.busy.running).sum()
    }

    fn saturated(&self) -> bool {
        self.running() >= self.config.concurrency
    }

    fn remove_lane(&mut self, tp: &TopicPartition) -> Option<Lane> {
        let lane = self.lanes.remove(tp)?;
        for t in lane.tickets() {
            self.tickets.remove(&t);
        }
        Some(lane)
    }

    /// Records fetched, in offset order per partition.
    pub fn deliver(&mut self, mut records: Vec<ConsumerRecord>, now: Now) {
        // Records come in runs of one partition, usually one run a delivery: each run
        // goes to its lane whole, with one lookup, without a copy when it is the only one.
        let mut starts = Vec::new();
        let mut at = 0;
        while let Some(first) = records.get(at) {
            starts.push(at);
            let (topic, partition) = (first.topic_arc(), first.partition());
            at += records
                .get(at..)
                .unwrap_or_default()
                .iter()
                .take_while(|r| r.is_in(topic, partition))
                .count();
        }
        // The later runs are split off; the first keeps the delivery's vector.
        let mut runs = Vec::with_capacity(starts.len());
        for &start in starts.iter().skip(1).rev() {
            runs.push(records.split_off(start));
        }
        runs.push(records);
        for run in runs.into_iter().rev() {
            self.deliver_run(run, now.at);
        }
        self.step(now);
    }

    /// Records of one partition, in offset order, to its lane: to its one line, or to
    /// their keys' lines.
    fn deliver_run(&mut self, records: Vec<ConsumerRecord>, at: Instant) {
        let Some(first) = records.first() else {
            return;
        };
        let skip = self
            .skips
            .remove(&first.topic_partition())
            .unwrap_or_default();
        // A new lane owns nothing before its first record: committing from there.
        let lane = self
            .lanes
            .entry(first.topic_partition())
            .or_insert_with(|| {
                Lane::starting_at(
                    first.offset(),
                    self.config.ordering != ProcessingOrder::Partition,
                )
            });
        if !skip.is_empty() {
            lane.skip = skip;
        }
        if lane.releasing {
            // Fetched before the pause took hold: the next owner reads them.
            return;
        }
        for run in offset_runs(&records) {
            lane.tracker.deliver_run(run);
        }
        // Those the previous owner finished (its commit's metadata) finish now.
        let records = if lane.skip.is_empty() {
            records
        } else {
            let last = records.last().map_or(0, ConsumerRecord::offset);
            let (done, records): (Vec<_>, Vec<_>) = records
                .into_iter()
                .partition(|r| lane.skip.iter().any(|s| s.contains(&r.offset())));
            finish(&mut lane.tracker, &done);
            self.stats.already_finished += done.len() as u64;
            lane.skip.retain(|s| s.end > last + 1);
            if records.is_empty() {
                return;
            }
            records
        };
        let want = self.config.max_batch.max(1);
        if self.config.ordering != ProcessingOrder::Partition {
            // Unordered, a delivery is spread over as many calls as may run at once,
            // in runs of at most a batch.
            let chunk = records
                .len()
                .div_ceil(self.config.concurrency.max(1))
                .clamp(1, want);
            for (slot, records) in split_by_line(self.config.ordering, records, chunk) {
                lane.push_back(slot, Run::new(records), at);
            }
            return;
        }
        // Onto the last run while it is short of half a batch and no call has had any
        // of it yet: a call then takes what came in small deliveries (many partitions)
        // at once, without a copy. A longer run is left as it is, so records are
        // copied only while runs are short.
        let n = records.len();
        let records = match lane.line_mut(0).and_then(|l| l.queue.back_mut()) {
            Some(last) if last.len() * 2 < want => match last.append(records, want) {
                Ok(()) => {
                    lane.added(0, n);
                    return;
                }
                Err(records) => records,
            },
            _ => records,
        };
        lane.push_back(0, Run::new(records), at);
    }

    /// The work `ticket` names, taken out of its lane (which is `Idle` then), and the
    /// ticket retired; `None` when the lane no longer holds that work (it was revoked,
    /// lost or handed over). A ticket names one kind of work: a handler call's is only
    /// answered by [`Lanes::handled`], a write's by [`Lanes::produced`].
    fn take_work(&mut self, ticket: Ticket) -> Option<(TopicPartition, Slot, Work)> {
        let (tp, slot) = self.tickets.remove(&ticket)?;
        let lane = self.lanes.get_mut(&tp)?;
        let line = lane.line(slot)?;
        (line.work().ticket() == Some(ticket)).then(|| {
            let work = lane.take_work(slot);
            (tp, slot, work)
        })
    }

    /// The lane and line whose work `ticket` is.
    fn lane_of(&mut self, ticket: Ticket) -> Option<(&mut Lane, Slot)> {
        let (tp, slot) = self.tickets.get(&ticket)?;
        let slot = *slot;
        self.lanes
            .get_mut(tp)
            .filter(|l| {
                l.line(slot)
                    .is_some_and(|l| l.work().ticket() == Some(ticket))
            })
            .map(|l| (l, slot))
    }

    /// The commit of `offsets` succeeded (`true`) or failed.
    pub fn committed(&mut self, offsets: &[(TopicPartition, i64)], ok: bool, now: Now) {
        self.commit_in_flight = false;
        if !ok {
            // What it carried goes again.
            for (tp, _) in offsets {
                if let Some(l) = self.lanes.get_mut(tp) {
                    l.sent_finishes = None;
                }
            }
        }
        if ok && !offsets.is_empty() {
            self.stats.commits += 1;
            for (tp, o) in offsets {
                if let Some(l) = self.lanes.get_mut(tp) {
                    l.tracker.committed(*o);
                }
                self.metric(Metric::Committed {
                    partition: tp.clone(),
                    offset: *o,
                });
            }
        }
        self.step(now);
    }

    /// The time passed [`Lanes::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Now) {
        let due: Vec<(TopicPartition, Slot)> = self
            .lanes
            .iter()
            .flat_map(|(tp, l)| l.due_halts(now.at).into_iter().map(|s| (tp.clone(), s)))
            .collect();
        for (tp, slot) in due {
            let Some(lane) = self.lanes.get_mut(&tp) else {
                continue;
            };
            match lane.take_work(slot) {
                Work::Halted {
                    attempt,
                    class,
                    to,
                    failures,
                    ..
                } => self.forward(&tp, slot, attempt, class, to, failures, now),
                other => {
                    lane.set_work(slot, other);
                }
            }
        }
        self.step(now);
    }

    /// Starts what can start, finishes handovers, sets pauses and commits.
    fn step(&mut self, now: Now) {
        if self.reporting {
            return;
        }
        self.finish_releases(now);
        self.dispatch(now);
        self.update_pauses();
        self.commit_if_due(now);
        if self.config.ordering != ProcessingOrder::Partition {
            for lane in self.lanes.values_mut() {
                lane.tidy();
            }
        }
    }

    /// Starts handlers on lines that are idle and have records, or whose retry is
    /// due, up to `concurrency`: a line of each partition in turn.
    fn dispatch(&mut self, now: Now) {
        let limit = self.config.concurrency;
        let mut running = self.running();
        let mut next_ticket = self.next_ticket;
        let mut starts = Vec::new();
        let mut waits = Vec::new();
        let keyed = self.config.ordering == ProcessingOrder::Key;
        let (held, held_all) = (&self.held, self.held_all);
        loop {
            let before = starts.len();
            for (tp, lane) in self.lanes.iter_mut() {
                if running >= limit {
                    break;
                }
                if lane.releasing || held_all || held.contains(tp) {
                    continue;
                }
                let (run, retry, slot) = loop {
                    let Some(slot) = lane.next_start(now.at) else {
                        break (None, None, 0);
                    };
                    match lane.take_work(slot) {
                        Work::Waiting { attempt, .. } => {
                            break (
                                Some(Run::new(vec![attempt.record.clone()])),
                                Some(Box::new(attempt)),
                                slot,
                            );
                        }
                        Work::Idle => {
                            let blocked = lane.take_blocked(slot);
                            if let Some(run) = next_batch(&self.config, lane, slot, now) {
                                if let (true, Some(since)) = (keyed, blocked) {
                                    waits.push(now.at.saturating_duration_since(since));
                                }
                                break (Some(run), None, slot);
                            }
                        }
                        other => {
                            lane.set_work(slot, other);
                        }
                    }
                };
                let Some(run) = run else {
                    continue;
                };
                next_ticket += 1;
                let ticket = Ticket(next_ticket);
                let attempt = retry.as_ref().map_or(1, |a| a.attempts.saturating_add(1));
                lane.set_work(
                    slot,
                    Work::Running {
                        ticket,
                        run: run.clone(),
                        retry,
                        reported: 0,
                        cancelled: false,
                    },
                );
                running += 1;
                starts.push((ticket, tp.clone(), slot, run, attempt));
            }
            // One line of a partition a turn; another turn while some started.
            if self.config.ordering == ProcessingOrder::Partition
                || starts.len() == before
                || running >= limit
            {
                break;
            }
        }
        self.next_ticket = next_ticket;
        for (ticket, tp, slot, records, attempt) in starts {
            self.tickets.insert(ticket, (tp.clone(), slot));
            self.actions.push_back(Action::Dispatch {
                ticket,
                partition: tp,
                records,
                attempt,
            });
        }
        for waited in waits {
            self.metric(Metric::KeyWait { waited });
        }
    }

    fn update_pauses(&mut self) {
        let mut halted = 0;
        let (held, held_all) = (&self.held, self.held_all);
        let one_line = self.config.ordering == ProcessingOrder::Partition;
        for (tp, lane) in self.lanes.iter_mut() {
            // A write tried again after it failed still halts its lane.
            let halt = lane.busy.halting();
            let waiting = halt || lane.busy.waiting > 0;
            halted += usize::from(halt);
            // A wait holds the whole partition only when it has one line; otherwise
            // the other lines go on, and the buffer's bound pauses it.
            let should = lane.releasing
                || (one_line && waiting)
                || held_all
                || held.contains(tp)
                || lane.queued >= self.config.lane_buffer;
            if should && !lane.paused {
                self.actions.push_back(Action::Pause(tp.clone()));
                lane.paused = true;
            } else if !should && lane.paused {
                self.actions.push_back(Action::Resume(tp.clone()));
                lane.paused = false;
            }
        }
        if halted != self.halted {
            self.halted = halted;
            self.metric(Metric::Halted { partitions: halted });
        }
    }

    /// Each lane's finished prefix not yet committed, or its committed one again when
    /// records past it finished since its last commit (for the commit's metadata,
    /// [`Lanes::commit_metadata`]); marked sent.
    fn pending(&mut self, only: Option<&[TopicPartition]>) -> Vec<(TopicPartition, i64)> {
        self.lanes
            .iter_mut()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, l)| {
                let finishes = l.tracker.finishes();
                let offset = l.tracker.pending_commit().or_else(|| {
                    let past = l.sent_finishes != Some(finishes)
                        && !l.tracker.finished_past_prefix().is_empty();
                    past.then(|| l.tracker.committable()).flatten()
                })?;
                l.sent_finishes = Some(finishes);
                Some((tp.clone(), offset))
            })
            .collect()
    }

    /// The metadata of a commit of `offsets` (as [`Action::Commit`] or
    /// [`Action::Release`] gave them): for each, the records past it that finished
    /// ([`crate::process::finished`]), so that the partition's next owner skips them.
    pub fn commit_metadata(&self, offsets: &[(TopicPartition, i64)]) -> Vec<Option<String>> {
        offsets
            .iter()
            .map(|(tp, o)| {
                let lane = self.lanes.get(tp)?;
                finished::encode(*o, &lane.tracker.finished_past_prefix(), finished::MAX_LEN)
            })
            .collect()
    }

    /// The partition `tp`'s commit at `committed` carried `metadata`: the records it
    /// names finished are not handled again when they are delivered (its previous
    /// owner finished them; [`Stats::already_finished`] counts them).
    pub fn resume_from(&mut self, tp: TopicPartition, committed: i64, metadata: &str) {
        let ranges = finished::decode(committed, metadata);
        if ranges.is_empty() {
            return;
        }
        match self.lanes.get_mut(&tp) {
            Some(lane) => lane.skip = ranges,
            None => {
                self.skips.insert(tp, ranges);
            }
        }
    }

    fn commit_if_due(&mut self, now: Now) {
        if self.commit_in_flight {
            return;
        }
        if let Some(interval) = self.config.commit_interval {
            if self.next_commit.is_some_and(|t| now.at < t) {
                return;
            }
            self.next_commit = Some(now.at + interval);
        }
        let offsets = self.pending(None);
        if !offsets.is_empty() {
            self.commit_in_flight = true;
            self.actions.push_back(Action::Commit(offsets));
        }
    }

    /// Checks the invariants of the module docs against what the lanes hold; the
    /// first broken one, named. For tests and the fuzz target.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = HashMap::new();
        for (tp, lane) in &self.lanes {
            lane.check_books().map_err(|e| format!("{tp:?}: {e}"))?;
            let mut held = lane.queued;
            let mut unfinished = None::<i64>;
            for (slot, line) in &lane.lines {
                if let Some(t) = line.work().ticket() {
                    if self.tickets.get(&t) != Some(&(tp.clone(), *slot)) {
                        return Err(format!("{tp:?}: its work's ticket is not in flight"));
                    }
                    if seen.insert(t, tp).is_some() {
                        return Err(format!("{tp:?}: a ticket shared by two lines"));
                    }
                }
                // A line's records, from its work through its queue, in offset order,
                // and (by key) all of its key.
                let offsets = line_records(line).map(ConsumerRecord::offset);
                let mut last = None;
                for o in offsets {
                    if last.is_some_and(|l| l >= o) {
                        return Err(format!("{tp:?}: line {slot} out of order at {o}"));
                    }
                    last = Some(o);
                }
                if self.config.ordering == ProcessingOrder::Key {
                    if let Some(r) =
                        line_records(line).find(|r| r.key().is_some_and(|k| key_slot(k) != *slot))
                    {
                        return Err(format!(
                            "{tp:?}: record {} in another key's line",
                            r.offset()
                        ));
                    }
                }
                held += match line.work() {
                    Work::Idle => 0,
                    Work::Running { run, reported, .. } => run.len().saturating_sub(*reported),
                    _ => 1,
                };
                if let Some(first) = unfinished_of(line) {
                    unfinished = Some(unfinished.map_or(first, |u| u.min(first)));
                }
            }
            // What a commit would carry never passes an unfinished record.
            if let (Some(commit), Some(first)) = (lane.tracker.pending_commit(), unfinished) {
                if commit > first {
                    return Err(format!(
                        "{tp:?}: commit {commit} passes unfinished record {first}"
                    ));
                }
            }
            if lane.releasing && lane.queued > 0 {
                return Err(format!(
                    "{tp:?}: records queued on a lane being handed over"
                ));
            }
            // Every record delivered and not finished is queued or in a line's work:
            // none is stranded (a lane being handed over drops what it will not do).
            if !lane.releasing && held != lane.tracker.in_progress() {
                return Err(format!(
                    "{tp:?}: {} records unfinished, {held} queued or in work",
                    lane.tracker.in_progress()
                ));
            }
        }
        Ok(())
    }
}

/// A line's records not finished, in the order its calls get them: its work's, then
/// its queue's.
fn line_records(line: &state::Line) -> impl Iterator<Item = &ConsumerRecord> {
    let work: &[ConsumerRecord] = match line.work() {
        Work::Idle => &[],
        Work::Running { run, reported, .. } => run.get(*reported..).unwrap_or_default(),
        Work::Waiting { attempt, .. }
        | Work::Forwarding { attempt, .. }
        | Work::Halted { attempt, .. } => std::slice::from_ref(&attempt.record),
    };
    work.iter().chain(line.queue.iter().flat_map(|r| r.iter()))
}

/// The lowest offset a line holds that has not finished.
fn unfinished_of(line: &state::Line) -> Option<i64> {
    line_records(line).next().map(ConsumerRecord::offset)
}

/// The line of a keyed record under key ordering: its key's hash, the top bit clear.
fn key_slot(key: &[u8]) -> Slot {
    // FNV-1a: the slot only needs to be the same for the same key; two keys sharing a
    // slot are handled one after the other, as one key would be.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h & !(1 << 63)
}

/// A line of its own, for a record (or run) with no order to keep: its offset, the top
/// bit set, so no key's line is the same.
fn own_slot(offset: i64) -> Slot {
    (offset as u64) | (1 << 63)
}

/// One partition's records, in offset order, split into their lines' runs: by key
/// (records without a key each alone), or, unordered, into runs of up to `batch`
/// (each its own line).
fn split_by_line(
    order: ProcessingOrder,
    records: Vec<ConsumerRecord>,
    batch: usize,
) -> Vec<(Slot, Vec<ConsumerRecord>)> {
    let mut out: Vec<(Slot, Vec<ConsumerRecord>)> = Vec::new();
    for record in records {
        let slot = match order {
            ProcessingOrder::Key => match record.key() {
                Some(k) => key_slot(k),
                None => own_slot(record.offset()),
            },
            _ => match out.last() {
                Some((slot, run)) if run.len() < batch => *slot,
                _ => own_slot(record.offset()),
            },
        };
        match out.last_mut() {
            Some((s, run)) if *s == slot => run.push(record),
            _ => out.push((slot, vec![record])),
        }
    }
    out
}

/// Puts records not handled back at the front of their line, in order; a lane being
/// handed over keeps none (its next owner reads them).
fn requeue(lane: &mut Lane, slot: Slot, records: Run) {
    if lane.releasing || records.is_empty() {
        return;
    }
    lane.push_front(slot, records);
}

/// The records of `records`, finished, to the tracker: a range of offsets at a time.
fn finish(tracker: &mut OffsetTracker, records: &[ConsumerRecord]) {
    for run in offset_runs(records) {
        tracker.finish_run(run);
    }
}

/// The next records of an idle line: up to `max_batch` (one while replaying a failed
/// batch), stopping before a retry-topic record that must still wait (which then
/// waits in the line).
fn next_batch(config: &LanesConfig, lane: &mut Lane, slot: Slot, now: Now) -> Option<Run> {
    let want = config.max_batch.max(1);
    let line = lane.line_mut(slot)?;
    let state::Line {
        queue,
        solo_through,
        ..
    } = line;
    // How many to take. Without a batch to replay one record at a time or retry
    // topics to wait for, that is all there are, up to a batch, unread.
    let mut take = want.min(queue.iter().map(|r| r.len()).sum());
    let mut wait_until = None;
    if solo_through.is_some() || !config.retry_delays.is_empty() {
        take = 0;
        'scan: for record in queue.iter().flat_map(|r| r.iter()) {
            if take == want {
                break;
            }
            let solo = solo_through.is_some_and(|o| record.offset() <= o);
            if !solo {
                *solo_through = None;
            }
            if solo && take > 0 {
                break;
            }
            // A retry-topic record waits for its timestamp plus the delay.
            let delay = hop_of(record)
                .checked_sub(1)
                .and_then(|i| config.retry_delays.get(i as usize));
            let wait = delay.map_or(0, |d| {
                record
                    .timestamp()
                    .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                    .saturating_sub(now.unix_ms)
            });
            if wait > 0 {
                if take == 0 {
                    take = 1;
                    wait_until = Some(now.at + Duration::from_millis(wait.unsigned_abs()));
                }
                break 'scan;
            }
            take += 1;
            if solo {
                break;
            }
        }
    }
    if take == 0 {
        return None;
    }
    let front = queue.front_mut()?;
    // From the first run alone, without a copy, when it has what to take or half a
    // batch; from several runs (one reference count a record) when it is a remnant.
    let run = if take <= front.len() || front.len() * 2 >= want {
        let run = front.take_front(take);
        if front.is_empty() {
            queue.pop_front();
        }
        run
    } else {
        let mut records = Vec::with_capacity(take);
        while records.len() < take {
            let Some(front) = queue.front_mut() else {
                break;
            };
            records.extend(front.take_front(take - records.len()).iter().cloned());
            if front.is_empty() {
                queue.pop_front();
            }
        }
        Run::new(records)
    };
    lane.took(slot, run.len());
    if let Some(until) = wait_until {
        let record = run.first()?.clone();
        lane.set_work(
            slot,
            Work::Waiting {
                attempt: Attempt::first(record),
                until,
            },
        );
        return None;
    }
    Some(run)
}

#[cfg(test)]
mod order_tests;
#[cfg(any(test, feature = "testing"))]
pub mod script;
#[cfg(test)]
mod tests;
