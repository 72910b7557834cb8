//! Draining the buffer: records (or a partition's error) for the application, from
//! partitions that are not paused.

use tracing::warn;

use super::state::{Completed, Position};
use super::types::{FetchError, FetcherEvent};
use super::{ConsumerRecord, Fetcher, TimestampType};
use crate::fetch::record::Shared;

impl Fetcher {
    // ----- draining -----

    /// The next record (or error) for the application, from partitions that are not
    /// paused. `None`: nothing buffered is deliverable now.
    pub fn next_record(&mut self) -> Option<Result<ConsumerRecord, FetchError>> {
        let mut one = None;
        match self.drain(|r| {
            one = Some(r);
            true
        }) {
            Some(e) => Some(Err(e)),
            None => one.map(Ok),
        }
    }

    /// Up to `max` records (stops early at an error, which is returned after them on the
    /// next call).
    pub fn next_records(
        &mut self,
        max: usize,
        out: &mut Vec<ConsumerRecord>,
    ) -> Option<FetchError> {
        if out.len() >= max {
            return None;
        }
        // Reserved once (up to 512): growing by doubling copied the records again.
        out.reserve((max - out.len()).min(512));
        let had = !out.is_empty();
        let mut added = false;
        let error = self.drain(|r| {
            out.push(r);
            added = true;
            out.len() >= max
        })?;
        if had || added {
            // Records first: the error comes on the next call.
            self.errors.push_front(error);
            return None;
        }
        Some(error)
    }

    /// Hands records of the partitions that are not paused to `take` until it returns
    /// true (full) or nothing deliverable is left; an error ends it. Each partition's
    /// state is looked up once per run of its records, not once per record.
    fn drain(&mut self, mut take: impl FnMut(ConsumerRecord) -> bool) -> Option<FetchError> {
        if let Some(e) = self.errors.pop_front() {
            return Some(e);
        }
        let mut i = 0;
        while i < self.completed.len() {
            match self.drain_run(i, &mut take) {
                Drain::Full => return None,
                Drain::Error(e) => return Some(e),
                Drain::Paused => i += 1,
                Drain::Exhausted => self.remove_completed(i),
            }
        }
        None
    }

    fn remove_completed(&mut self, i: usize) {
        if let Some(c) = self.completed.remove(i) {
            if let Some((bytes, parts)) = self.charges.get_mut(&c.charge) {
                *parts -= 1;
                if *parts == 0 {
                    self.buffered_bytes = self.buffered_bytes.saturating_sub(*bytes);
                    self.charges.remove(&c.charge);
                }
            }
            if let Some(s) = self.partitions.get_mut(&c.tp) {
                s.buffered = None;
            }
        }
    }

    pub(super) fn drop_completed(&mut self, f: impl Fn(&Completed) -> bool) {
        let mut i = 0;
        while i < self.completed.len() {
            if self.completed.get(i).is_some_and(&f) {
                self.remove_completed(i);
            } else {
                i += 1;
            }
        }
    }

    /// Hands the records of `completed[i]` to `take`, decoding its batches as it goes.
    fn drain_run(&mut self, i: usize, take: &mut impl FnMut(ConsumerRecord) -> bool) -> Drain {
        let Some(c) = self.completed.get_mut(i) else {
            return Drain::Exhausted;
        };
        let Some(s) = self.partitions.get_mut(&c.tp) else {
            return Drain::Exhausted;
        };
        if s.paused.is_some() {
            return Drain::Paused;
        }
        loop {
            let Position::At { offset, .. } = s.position else {
                return Drain::Exhausted;
            };
            if let Some(record) = c.records.pop_front() {
                let mut next = record.offset() + 1;
                if c.records.is_empty() {
                    // Compaction may leave a gap at the end of a batch.
                    next = next.max(c.batch_end);
                }
                s.set_position(
                    self.round,
                    Position::At {
                        offset: next,
                        epoch: c.batch_epoch,
                    },
                );
                if take(record) {
                    return Drain::Full;
                }
                continue;
            }
            if let Some(error) = c.pending_error.take() {
                s.set_position(self.round, Position::Stopped(Some((offset, c.batch_epoch))));
                warn!(%error, "partition stopped");
                self.events
                    .push_back(FetcherEvent::PartitionStopped(error.clone()));
                return Drain::Error(error);
            }
            let batch = match c.batches.next() {
                None => return Drain::Exhausted,
                Some(Err(source)) => {
                    let error = FetchError::Corrupt {
                        topic: c.tp.topic.clone(),
                        partition: c.tp.partition,
                        offset: source.base_offset.max(offset),
                        source,
                    };
                    s.set_position(self.round, Position::Stopped(Some((offset, c.batch_epoch))));
                    warn!(%error, "partition stopped");
                    self.events
                        .push_back(FetcherEvent::PartitionStopped(error.clone()));
                    return Drain::Error(error);
                }
                Some(Ok(batch)) => batch,
            };
            let end = batch.next_offset();
            if end <= offset {
                continue;
            }
            let admitted = c.filter.as_mut().is_none_or(|f| f.admit(&batch)) && !batch.is_control();
            if !admitted {
                // Control batches and aborted transactions are skipped, position and all.
                s.set_position(
                    self.round,
                    Position::At {
                        offset: end,
                        epoch: batch.partition_leader_epoch,
                    },
                );
                continue;
            }
            c.batch_epoch = batch.partition_leader_epoch;
            c.batch_end = end;
            let timestamp_type = if batch.is_log_append_time() {
                TimestampType::LogAppendTime
            } else {
                TimestampType::CreateTime
            };
            // The batch's records share one reference to its bytes (and its topic,
            // partition and epoch): one reference count per record.
            let shared = Shared::new(
                c.topic.clone(),
                c.tp.partition,
                batch.partition_leader_epoch,
                timestamp_type,
                batch.data().clone(),
            );
            for record in batch.records() {
                match record {
                    Ok(r) if r.offset < offset => {}
                    Ok(r) => c.records.push_back(ConsumerRecord::new(shared.clone(), &r)),
                    Err(source) => {
                        // The records before the bad one are delivered; the partition
                        // stops right after them.
                        let at = c.records.back().map_or(offset, |r| r.offset() + 1);
                        c.pending_error = Some(FetchError::Corrupt {
                            topic: c.tp.topic.clone(),
                            partition: c.tp.partition,
                            offset: at,
                            source,
                        });
                        c.batch_end = at;
                        break;
                    }
                }
            }
            if c.records.is_empty() && c.pending_error.is_none() {
                // Every record was before the position (or the batch was empty).
                s.set_position(
                    self.round,
                    Position::At {
                        offset: end,
                        epoch: batch.partition_leader_epoch,
                    },
                );
            }
        }
    }
}

/// How a run of one partition's buffered records ended.
enum Drain {
    /// The taker is full.
    Full,
    /// The partition stopped here.
    Error(FetchError),
    /// The partition is paused: its records wait.
    Paused,
    /// Nothing left of this fetched data.
    Exhausted,
}
