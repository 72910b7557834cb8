//! [`Run`]: records of one partition, in offset order, in one shared allocation. A
//! lane queues the runs it is delivered and hands a handler call a part of one; the
//! call and the lane share it, so a record is neither copied nor counted again on its
//! way to the handler, and what a call does not reach goes back to the lane as it is.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use crate::fetch::fetcher::ConsumerRecord;

/// Records of one partition in offset order: a range of a shared vector. Cloning one
/// or taking a part of it copies no record.
#[derive(Clone, Default)]
pub struct Run {
    records: Arc<Vec<ConsumerRecord>>,
    /// The part of `records` this run is.
    range: Range<usize>,
}

impl Run {
    /// A run of `records` (one partition's, in offset order).
    pub fn new(records: Vec<ConsumerRecord>) -> Self {
        let range = 0..records.len();
        Self {
            records: Arc::new(records),
            range,
        }
    }

    /// Takes the first `n` records off the front (all of them if there are fewer):
    /// the part taken and this run share the records.
    pub fn take_front(&mut self, n: usize) -> Run {
        let at = self.range.start + n.min(self.len());
        let front = Run {
            records: self.records.clone(),
            range: self.range.start..at,
        };
        self.range.start = at;
        front
    }

    /// The records from `from` on, sharing this run's.
    pub fn tail(&self, from: usize) -> Run {
        Run {
            records: self.records.clone(),
            range: (self.range.start + from.min(self.len()))..self.range.end,
        }
    }

    /// Appends `more` (records of the same partition, after these) in place, when no
    /// call was handed any of this run's records (so none of them is done and held
    /// here for nothing) and the run stays within `cap` records; otherwise gives them
    /// back.
    pub fn append(
        &mut self,
        more: Vec<ConsumerRecord>,
        cap: usize,
    ) -> Result<(), Vec<ConsumerRecord>> {
        let Range { start, end } = self.range;
        if start != 0 || end + more.len() > cap {
            return Err(more);
        }
        match Arc::get_mut(&mut self.records) {
            Some(records) if records.len() == end => {
                records.extend(more);
                self.range.end = records.len();
                Ok(())
            }
            _ => Err(more),
        }
    }

    /// Whether nobody else holds these records.
    pub fn unshared(&self) -> bool {
        Arc::strong_count(&self.records) == 1
    }
}

impl Deref for Run {
    type Target = [ConsumerRecord];

    fn deref(&self) -> &[ConsumerRecord] {
        self.records.get(self.range.clone()).unwrap_or_default()
    }
}

impl PartialEq for Run {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The maximal runs of consecutive offsets in `records`, as ranges of offsets, for the
/// offset tracker: one range for records in order without a gap.
pub fn offset_runs(records: &[ConsumerRecord]) -> impl Iterator<Item = Range<i64>> + '_ {
    let mut rest = records;
    std::iter::from_fn(move || {
        let first = rest.first()?.offset();
        let mut end = first + 1;
        let mut n = 1;
        for r in rest.get(1..).unwrap_or_default() {
            if r.offset() != end {
                break;
            }
            end += 1;
            n += 1;
        }
        rest = rest.get(n..).unwrap_or_default();
        Some(first..end)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(p: i32, offset: i64) -> ConsumerRecord {
        ConsumerRecord::builder("orders", p, offset)
            .value("v")
            .build()
    }

    fn offsets(run: &[ConsumerRecord]) -> Vec<i64> {
        run.iter().map(ConsumerRecord::offset).collect()
    }

    #[test]
    fn parts_share_the_records_and_only_an_unshared_run_grows_in_place() {
        let mut run = Run::new((0..5).map(|o| record(0, o)).collect());
        assert!(run.unshared());
        let more: Vec<_> = (5..7).map(|o| record(0, o)).collect();
        assert_eq!(
            run.append(more.clone(), 6).map_err(|v| v.len()),
            Err(2),
            "past the cap"
        );
        assert_eq!(run.append(more, 7), Ok(()));
        let front = run.take_front(3);
        assert_eq!(offsets(&front), [0, 1, 2]);
        assert_eq!(offsets(&run), [3, 4, 5, 6]);
        assert!(!run.unshared(), "the front shares them");
        let refused = run.append(vec![record(0, 7)], 100);
        assert_eq!(
            refused.map_err(|v| v.len()),
            Err(1),
            "a part was handed out"
        );
        drop(front);
        let refused = run.append(vec![record(0, 7)], 100);
        assert_eq!(
            refused.map_err(|v| v.len()),
            Err(1),
            "and its records are still held"
        );
        assert_eq!(offsets(&run.tail(2)), [5, 6]);
        assert_eq!(offsets(&run.tail(9)), Vec::<i64>::new());
        assert_eq!(offsets(&run.take_front(9)), [3, 4, 5, 6]);
        assert!(run.is_empty());
    }

    #[test]
    fn offset_runs_break_at_gaps_and_at_offsets_out_of_order() {
        let records: Vec<_> = [3, 4, 5, 9, 10, 2, 2, 3]
            .into_iter()
            .map(|o| record(0, o))
            .collect();
        let runs: Vec<_> = offset_runs(&records).collect();
        assert_eq!(runs, [3..6, 9..11, 2..3, 2..4]);
        assert_eq!(offset_runs(&[]).count(), 0);
    }
}
