//! The commit rule for one partition: an offset is committable only when every record
//! before it that was delivered has finished (succeeded, or its dead-letter write was
//! acknowledged). Gaps in offsets (compaction, transaction markers) are not records and
//! never hold the prefix back.

use std::collections::VecDeque;

/// Finished-prefix tracking for one partition.
#[derive(Debug, Clone, Default)]
pub struct OffsetTracker {
    /// Delivered records not yet known to be behind the finished prefix, in offset
    /// order: `(offset, finished)`. The front is always unfinished: finished records
    /// leave as soon as they reach it. Records are delivered in offset order and, within
    /// a lane, finish in it, so each costs O(1); anything else is a binary search.
    outstanding: VecDeque<(i64, bool)>,
    /// Entries of `outstanding` not finished.
    unfinished: usize,
    /// The offset after the highest record delivered.
    high: Option<i64>,
    /// The last offset committed (or found committed).
    committed: Option<i64>,
}

impl OffsetTracker {
    /// A tracker starting at `position` (the committed offset, or where reading starts).
    pub fn starting_at(position: i64) -> Self {
        Self {
            outstanding: VecDeque::new(),
            unfinished: 0,
            high: Some(position),
            committed: Some(position),
        }
    }

    /// A record was handed to the handler.
    pub fn deliver(&mut self, offset: i64) {
        match self.outstanding.back() {
            Some(&(last, _)) if offset <= last => {
                // Out of order (delivered again after a seek): keep the order, once.
                match self.outstanding.binary_search_by_key(&offset, |e| e.0) {
                    Ok(i) => {
                        if let Some(e) = self.outstanding.get_mut(i) {
                            if e.1 {
                                e.1 = false;
                                self.unfinished += 1;
                            }
                        }
                    }
                    Err(i) => {
                        self.outstanding.insert(i, (offset, false));
                        self.unfinished += 1;
                    }
                }
            }
            _ => {
                self.outstanding.push_back((offset, false));
                self.unfinished += 1;
            }
        }
        self.high = Some(self.high.map_or(offset + 1, |h| h.max(offset + 1)));
    }

    /// A record finished.
    pub fn finish(&mut self, offset: i64) {
        let at = match self.outstanding.front() {
            Some(&(first, _)) if first == offset => Some(0),
            _ => self.outstanding.binary_search_by_key(&offset, |e| e.0).ok(),
        };
        if let Some(e) = at.and_then(|i| self.outstanding.get_mut(i)) {
            if !e.1 {
                e.1 = true;
                self.unfinished -= 1;
            }
        }
        while self.outstanding.front().is_some_and(|e| e.1) {
            self.outstanding.pop_front();
        }
    }

    /// The offset to commit: the first unfinished record, or the end of what was
    /// delivered. `None` before anything is known.
    pub fn committable(&self) -> Option<i64> {
        self.outstanding.front().map(|e| e.0).or(self.high)
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

    /// Records delivered and not finished.
    pub fn in_progress(&self) -> usize {
        self.unfinished
    }
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

    /// The tracker against the obvious model (a set of unfinished offsets) over random
    /// deliveries and finishes, in order and out of it, with repeats.
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
        for _ in 0..200 {
            let start = next(50) as i64;
            let mut t = OffsetTracker::starting_at(start);
            let mut model: BTreeSet<i64> = BTreeSet::new();
            let mut high = start;
            let mut cursor = start;
            for _ in 0..300 {
                match next(6) {
                    0..=2 => {
                        // Mostly in order, sometimes a gap, sometimes an old offset again.
                        let o = if next(10) == 0 {
                            start + next(((cursor - start) as u64).max(1)) as i64
                        } else {
                            cursor += 1 + next(3) as i64 / 2;
                            cursor - 1
                        };
                        t.deliver(o);
                        model.insert(o);
                        high = high.max(o + 1);
                    }
                    _ => {
                        // Mostly the first unfinished, sometimes any delivered offset.
                        let o = match (next(4), model.first()) {
                            (0, _) | (_, None) => {
                                start + next(((cursor - start) as u64).max(1)) as i64
                            }
                            (_, Some(&f)) => f,
                        };
                        t.finish(o);
                        model.remove(&o);
                    }
                }
                assert_eq!(
                    t.committable(),
                    Some(model.first().copied().unwrap_or(high))
                );
                assert_eq!(t.in_progress(), model.len());
            }
        }
    }
}
