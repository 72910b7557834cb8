//! Handing partitions over (revoked, or the processor shuts down) and losing them.

use std::time::Duration;

use tracing::warn;

use super::state::{Releasing, Work};
use super::types::{Action, Handover, Metric, Now};
use super::{LOG_TARGET, Lanes};
use crate::group::consumer_protocol::TopicPartition;

impl Lanes {
    /// Hands `partitions` over (revoked, or the processor shuts down): their waits
    /// and queued records are dropped, their running handlers are told to stop, and
    /// once their work has stopped (or at `now + wait`) [`Action::Release`] gives
    /// their finished prefix to commit.
    pub fn release(
        &mut self,
        partitions: Vec<TopicPartition>,
        handover: Handover,
        wait: Duration,
        now: Now,
    ) {
        for tp in &partitions {
            self.actions.push_back(Action::Pause(tp.clone()));
            let Some(lane) = self.lanes.get_mut(tp) else {
                continue;
            };
            lane.releasing = true;
            lane.paused = true;
            lane.clear_queues();
            let slots: Vec<_> = lane.lines.keys().copied().collect();
            for slot in slots {
                let Some(line) = lane.line_mut(slot) else {
                    continue;
                };
                match line.work() {
                    Work::Waiting { .. } | Work::Halted { .. } => {
                        lane.set_work(slot, Work::Idle);
                    }
                    Work::Running { .. } => {
                        if let Some(Work::Running {
                            ticket, cancelled, ..
                        }) = line.running_mut()
                        {
                            *cancelled = true;
                            self.actions.push_back(Action::Cancel(*ticket));
                        }
                    }
                    Work::Idle | Work::Forwarding { .. } => {}
                }
            }
        }
        self.releases.push(Releasing {
            handover,
            partitions,
            deadline: now.at + wait,
        });
        self.step(now);
    }

    /// The processor shuts down within `timeout`: every lane is handed over, its
    /// handlers getting four fifths of the timeout (at most the acquiesce window), so
    /// the commit of the finished prefix and leaving the group have the rest.
    pub fn shutdown(&mut self, timeout: Duration, acquiesce: Duration, now: Now) {
        let wait = timeout.mul_f64(0.8).min(acquiesce);
        self.release(self.partitions(), Handover::Shutdown, wait, now);
    }

    /// `partitions` were taken away without a chance to commit: their lanes go, and
    /// their running handlers are told to stop (what they report is dropped).
    pub fn lose(&mut self, partitions: &[TopicPartition], now: Now) {
        for tp in partitions {
            if let Some(lane) = self.remove_lane(tp) {
                for line in lane.lines.values() {
                    if let Work::Running { ticket, .. } = line.work() {
                        self.actions.push_back(Action::Cancel(*ticket));
                    }
                }
            }
        }
        for r in &mut self.releases {
            r.partitions.retain(|tp| !partitions.contains(tp));
        }
        for tp in partitions {
            self.skips.remove(tp);
        }
        warn!(
            target: LOG_TARGET,
            ?partitions,
            "partitions lost: in-flight results are dropped, nothing is committed for them"
        );
        self.metric(Metric::Lost {
            partitions: partitions.to_vec(),
        });
        self.step(now);
    }

    /// Exactly-once: the open transaction was aborted, so nothing finished since the
    /// last commit happened. Every lane goes (its running handlers are told to stop,
    /// and what they report is dropped); each partition not being handed over comes
    /// back, with where to read it again from: its last commit (or, before any,
    /// where its lane started). The driver seeks there, and the records come again
    /// to new lanes. A handover under way goes on, with nothing of its lanes to
    /// commit. The application's pauses stay; the lanes' own are lifted.
    pub fn rewind(&mut self, now: Now) -> Vec<(TopicPartition, i64)> {
        // Actions queued before the abort that the driver has not run: a commit's or a
        // handover's offsets are of work the abort undid (committing them would skip
        // those records), and calls and writes are of lanes about to go. A handover
        // still releases its partitions, with nothing to commit.
        self.actions.retain_mut(|a| match a {
            Action::Commit(_) | Action::Dispatch { .. } | Action::Produce { .. } => false,
            Action::Release {
                offsets, metadata, ..
            } => {
                offsets.clear();
                metadata.clear();
                true
            }
            Action::Cancel(_) | Action::Yield(_) | Action::Pause(_) | Action::Resume(_) => true,
        });
        let mut restart = Vec::new();
        for tp in self.partitions() {
            let Some(lane) = self.remove_lane(&tp) else {
                continue;
            };
            for line in lane.lines.values() {
                if let Work::Running {
                    ticket,
                    cancelled: false,
                    ..
                } = line.work()
                {
                    self.actions.push_back(Action::Cancel(*ticket));
                }
            }
            if lane.releasing {
                continue;
            }
            if lane.paused && !self.is_held(&tp) {
                self.actions.push_back(Action::Resume(tp.clone()));
            }
            if let Some(offset) = lane.tracker.last_committed() {
                restart.push((tp, offset));
            }
        }
        self.skips.clear();
        self.commit_in_flight = false;
        self.step(now);
        restart
    }

    /// Handovers whose work has stopped, or whose deadline passed, release their
    /// partitions.
    pub(super) fn finish_releases(&mut self, now: Now) {
        let mut i = 0;
        while i < self.releases.len() {
            let Some(r) = self.releases.get(i) else {
                break;
            };
            let busy = r
                .partitions
                .iter()
                .any(|tp| self.lanes.get(tp).is_some_and(|l| l.busy.any()));
            if busy && now.at < r.deadline {
                i += 1;
                continue;
            }
            let r = self.releases.remove(i);
            if busy {
                warn!(
                    target: LOG_TARGET,
                    partitions = ?r.partitions,
                    "handlers did not finish within the acquiesce window; their records are not committed"
                );
            }
            let offsets = if self.config.transactional {
                self.pending(None)
            } else {
                self.pending(Some(&r.partitions))
            };
            let metadata = self.commit_metadata(&offsets);
            for tp in &r.partitions {
                if let Some(lane) = self.remove_lane(tp) {
                    for line in lane.lines.values() {
                        if let Work::Running {
                            ticket,
                            cancelled: false,
                            ..
                        } = line.work()
                        {
                            self.actions.push_back(Action::Cancel(*ticket));
                        }
                    }
                }
            }
            for tp in &r.partitions {
                self.skips.remove(tp);
            }
            self.actions.push_back(Action::Release {
                handover: r.handover,
                partitions: r.partitions,
                offsets,
                metadata,
            });
        }
    }
}
