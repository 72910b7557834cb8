//! The commit rule for one partition: an offset is committable only when every record
//! before it that was delivered has finished (succeeded, or its dead-letter write was
//! acknowledged). Gaps in offsets (compaction, transaction markers) are not records and
//! never hold the prefix back.

use std::collections::BTreeSet;

/// Finished-prefix tracking for one partition.
#[derive(Debug, Clone, Default)]
pub struct OffsetTracker {
    /// Delivered and not finished.
    outstanding: BTreeSet<i64>,
    /// The offset after the highest record delivered.
    high: Option<i64>,
    /// The last offset committed (or found committed).
    committed: Option<i64>,
}

impl OffsetTracker {
    /// A tracker starting at `position` (the committed offset, or where reading starts).
    pub fn starting_at(position: i64) -> Self {
        Self {
            outstanding: BTreeSet::new(),
            high: Some(position),
            committed: Some(position),
        }
    }

    /// A record was handed to the handler.
    pub fn deliver(&mut self, offset: i64) {
        self.outstanding.insert(offset);
        self.high = Some(self.high.map_or(offset + 1, |h| h.max(offset + 1)));
    }

    /// A record finished.
    pub fn finish(&mut self, offset: i64) {
        self.outstanding.remove(&offset);
    }

    /// The offset to commit: the first unfinished record, or the end of what was
    /// delivered. `None` before anything is known.
    pub fn committable(&self) -> Option<i64> {
        self.outstanding.first().copied().or(self.high)
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
        self.outstanding.len()
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
}
