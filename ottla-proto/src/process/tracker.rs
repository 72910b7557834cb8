//! The commit rule for one partition: an offset is committable only when every record
//! before it that was delivered has finished (succeeded, or its dead-letter write was
//! acknowledged). Gaps in offsets (compaction, transaction markers) are not records and
//! never hold the prefix back.

use std::collections::VecDeque;
use std::ops::Range;

/// Finished-prefix tracking for one partition.
///
/// It keeps the set of records delivered and not finished as ranges of offsets, in
/// order, apart and not touching. Records are delivered in offset order and, within a
/// lane, finish in it, mostly in runs of consecutive offsets: a run then costs O(1)
/// ([`OffsetTracker::deliver_run`], [`OffsetTracker::finish_run`]), whatever its length.
/// Anything else (a record delivered again, one finished out of order) is a binary
/// search and, at worst, a range split in two.
#[derive(Debug, Clone, Default)]
pub struct OffsetTracker {
    /// The offsets delivered and not finished: sorted, disjoint, never adjacent, never
    /// empty ranges. The front's start is the first unfinished record.
    unfinished: VecDeque<Range<i64>>,
    /// How many offsets `unfinished` holds.
    count: usize,
    /// The offset after the highest record delivered.
    high: Option<i64>,
    /// The last offset committed (or found committed).
    committed: Option<i64>,
    /// Finishes so far (runs), to tell whether what finished changed.
    finishes: u64,
}

impl OffsetTracker {
    /// A tracker starting at `position` (the committed offset, or where reading starts).
    pub fn starting_at(position: i64) -> Self {
        Self {
            unfinished: VecDeque::new(),
            count: 0,
            high: Some(position),
            committed: Some(position),
            finishes: 0,
        }
    }

    /// A record was handed to the handler.
    pub fn deliver(&mut self, offset: i64) {
        self.deliver_run(offset..offset.saturating_add(1));
    }

    /// The records at every offset of `run` were handed to the handler (a run of
    /// consecutive offsets, each a record). Delivering a record that is already
    /// unfinished changes nothing; one that finished is unfinished again.
    pub fn deliver_run(&mut self, run: Range<i64>) {
        if run.is_empty() {
            return;
        }
        self.high = Some(self.high.map_or(run.end, |h| h.max(run.end)));
        // In order, the usual case: after everything held, or right on from it.
        match self.unfinished.back_mut() {
            None => {}
            Some(last) if last.end == run.start => {
                last.end = run.end;
                self.count += len(&run);
                return;
            }
            Some(last) if last.end < run.start => {}
            Some(_) => return self.insert(run),
        }
        self.count += len(&run);
        self.unfinished.push_back(run);
    }

    /// A record finished.
    pub fn finish(&mut self, offset: i64) {
        self.finish_run(offset..offset.saturating_add(1));
    }

    /// The records at every offset of `run` finished (a run of consecutive offsets,
    /// each a record). Offsets not delivered, or finished already, are left as they are.
    pub fn finish_run(&mut self, run: Range<i64>) {
        if run.is_empty() {
            return;
        }
        self.finishes += 1;
        // In order, the usual case: the run starts the first unfinished range.
        if let Some(first) = self.unfinished.front_mut() {
            if first.start == run.start && run.end <= first.end {
                first.start = run.end;
                self.count -= len(&run);
                if first.is_empty() {
                    self.unfinished.pop_front();
                }
                return;
            }
        }
        self.remove(run);
    }

    /// The offset to commit: the first unfinished record, or the end of what was
    /// delivered. `None` before anything is known.
    pub fn committable(&self) -> Option<i64> {
        self.unfinished.front().map(|r| r.start).or(self.high)
    }

    /// The committable offset if it is ahead of the last commit.
    pub fn pending_commit(&self) -> Option<i64> {
        let c = self.committable()?;
        (self.committed.is_none_or(|done| c > done)).then_some(c)
    }

    /// A commit of `offset` succeeded.
    pub fn committed(&mut self, offset: i64) {
        self.committed = Some(self.committed.map_or(offset, |c| c.max(offset)));
    }

    /// The last offset committed (or where the tracker started, before any commit).
    pub fn last_committed(&self) -> Option<i64> {
        self.committed
    }

    /// Records delivered and not finished.
    pub fn in_progress(&self) -> usize {
        self.count
    }

    /// How many runs have finished so far: it changes when anything finishes.
    pub fn finishes(&self) -> u64 {
        self.finishes
    }

    /// The offsets past the committable one that finished (sorted, disjoint ranges;
    /// offsets that hold no record count as finished): what the commit's metadata can
    /// tell the next owner to skip ([`super::finished`]).
    pub fn finished_past_prefix(&self) -> Vec<Range<i64>> {
        let (Some(high), Some(first)) = (self.high, self.unfinished.front()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut at = first.end;
        for r in self.unfinished.iter().skip(1) {
            if r.start > at {
                out.push(at..r.start);
            }
            at = r.end;
        }
        if high > at {
            out.push(at..high);
        }
        out
    }

    /// Adds `run` to the unfinished set anywhere: the ranges it overlaps or touches
    /// become one.
    fn insert(&mut self, run: Range<i64>) {
        // The ranges `from..to` overlap or touch `run`.
        let from = self.unfinished.partition_point(|r| r.end < run.start);
        let to = self.unfinished.partition_point(|r| r.start <= run.end);
        let mut merged = run.clone();
        let mut held = 0;
        for r in self.unfinished.range(from..to) {
            held += len(&overlap(r, &run));
            merged.start = merged.start.min(r.start);
            merged.end = merged.end.max(r.end);
        }
        self.count += len(&run) - held;
        self.unfinished.drain(from..to);
        self.unfinished.insert(from, merged);
    }

    /// Takes `run` out of the unfinished set anywhere: a range it cuts through leaves
    /// the pieces on either side.
    fn remove(&mut self, run: Range<i64>) {
        // The ranges `from..to` overlap `run`.
        let from = self.unfinished.partition_point(|r| r.end <= run.start);
        let to = self.unfinished.partition_point(|r| r.start < run.end);
        if from >= to {
            return;
        }
        let (Some(first), Some(last)) = (self.unfinished.get(from), self.unfinished.get(to - 1))
        else {
            return;
        };
        let before = first.start..run.start;
        let after = run.end..last.end;
        let removed: usize = self
            .unfinished
            .range(from..to)
            .map(|r| len(&overlap(r, &run)))
            .sum();
        self.count -= removed;
        self.unfinished.drain(from..to);
        // `after` first, so that `before` lands in front of it.
        if !after.is_empty() {
            self.unfinished.insert(from, after);
        }
        if !before.is_empty() {
            self.unfinished.insert(from, before);
        }
    }
}

/// The offsets `a` and `b` share.
fn overlap(a: &Range<i64>, b: &Range<i64>) -> Range<i64> {
    a.start.max(b.start)..a.end.min(b.end)
}

/// How many offsets `r` holds.
fn len(r: &Range<i64>) -> usize {
    usize::try_from(r.end.saturating_sub(r.start)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_stops_at_the_first_unfinished_record() {
        let mut t = OffsetTracker::starting_at(10);
        assert_eq!(t.pending_commit(), None, "nothing new");
        for o in [10, 11, 12, 15] {
            t.deliver(o); // 13 and 14 are a compaction gap
        }
        t.finish(11);
        t.finish(12);
        assert_eq!(t.committable(), Some(10), "10 is still running");
        t.finish(10);
        assert_eq!(t.committable(), Some(15), "the gap does not hold it back");
        t.finish(15);
        assert_eq!(t.pending_commit(), Some(16));
        t.committed(16);
        assert_eq!(t.pending_commit(), None);
        assert_eq!(t.in_progress(), 0);
    }

    #[test]
    fn a_run_finished_at_once_moves_the_prefix_past_it_only() {
        let mut t = OffsetTracker::starting_at(0);
        t.deliver_run(0..100);
        t.deliver_run(100..150);
        t.deliver_run(160..170); // 150..160: a gap
        assert_eq!(t.in_progress(), 160);
        t.finish_run(0..64);
        assert_eq!(t.committable(), Some(64));
        t.finish_run(100..150); // out of order: 64..100 still run
        assert_eq!(t.committable(), Some(64));
        assert_eq!(t.in_progress(), 46);
        t.finish_run(64..100);
        assert_eq!(t.committable(), Some(160), "the gap does not hold it back");
        t.finish_run(160..165);
        t.finish_run(160..165); // finished already: nothing changes
        assert_eq!(t.committable(), Some(165));
        assert_eq!(t.in_progress(), 5);
        t.finish_run(165..170);
        assert_eq!(t.committable(), Some(170));
        assert_eq!(t.in_progress(), 0);
    }

    #[test]
    fn a_run_finished_inside_a_range_leaves_both_sides_unfinished() {
        let mut t = OffsetTracker::starting_at(0);
        t.deliver_run(0..10);
        t.finish_run(3..6);
        assert_eq!(t.committable(), Some(0));
        assert_eq!(t.in_progress(), 7);
        t.finish_run(0..3);
        assert_eq!(t.committable(), Some(6), "3..6 finished before");
        // Delivered again after a seek back: unfinished again, counted once.
        t.deliver_run(2..8);
        assert_eq!(t.committable(), Some(2));
        assert_eq!(t.in_progress(), 8);
        t.finish_run(0..10);
        assert_eq!(t.committable(), Some(10));
        assert_eq!(t.in_progress(), 0);
    }

    /// The tracker against the obvious model (a set of unfinished offsets) over random
    /// deliveries and finishes, of single records and runs, in order and out of it,
    /// with repeats.
    #[test]
    fn it_agrees_with_a_set_of_unfinished_offsets() {
        use std::collections::BTreeSet;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..300 {
            let start = next(50) as i64;
            let mut t = OffsetTracker::starting_at(start);
            let mut model: BTreeSet<i64> = BTreeSet::new();
            let mut high = start;
            let mut cursor = start;
            for _ in 0..300 {
                // One record, or a run of up to 12.
                let n = if next(2) == 0 { 1 } else { 1 + next(12) as i64 };
                match next(6) {
                    0..=2 => {
                        // Mostly in order, sometimes a gap, sometimes old offsets again.
                        let o = if next(10) == 0 {
                            start + next(((cursor - start) as u64).max(1)) as i64
                        } else {
                            cursor += next(3) as i64 / 2;
                            let o = cursor;
                            cursor += n;
                            o
                        };
                        if n == 1 {
                            t.deliver(o);
                        } else {
                            t.deliver_run(o..o + n);
                        }
                        model.extend(o..o + n);
                        high = high.max(o + n);
                    }
                    _ => {
                        // Mostly from the first unfinished, sometimes anywhere.
                        let o = match (next(4), model.first()) {
                            (0, _) | (_, None) => {
                                start + next(((cursor - start) as u64).max(1)) as i64
                            }
                            (_, Some(&f)) => f,
                        };
                        if n == 1 {
                            t.finish(o);
                        } else {
                            t.finish_run(o..o + n);
                        }
                        for x in o..o + n {
                            model.remove(&x);
                        }
                    }
                }
                assert_eq!(
                    t.committable(),
                    Some(model.first().copied().unwrap_or(high))
                );
                assert_eq!(t.in_progress(), model.len());
                // Past the first unfinished: every offset up to the end not unfinished.
                let past: Vec<i64> = t.finished_past_prefix().into_iter().flatten().collect();
                let expected: Vec<i64> = match model.first() {
                    Some(&f) => (f..high).filter(|o| !model.contains(o)).collect(),
                    None => Vec::new(),
                };
                assert_eq!(past, expected);
                // The ranges stay sorted, apart and not empty.
                let r: Vec<_> = t.unfinished.iter().cloned().collect();
                assert!(r.iter().all(|r| !r.is_empty()), "{r:?}");
                assert!(r.windows(2).all(|w| w[0].end < w[1].start), "{r:?}");
            }
        }
    }
}
