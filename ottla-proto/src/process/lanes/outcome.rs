//! A handler call's answers: its progress, its outcome or its crash; and what a failed
//! record does next (a retry that waits, a replay one record at a time, a write on).

use std::time::Duration;

use tracing::{error, info, warn};

use super::forward::hop_of;
use super::state::{Attempt, Destination, Lane, Ran, Slot, Work};
use super::types::{Metric, Now, Outcome, Ticket};
use super::{LOG_TARGET, Lanes, Run, finish, requeue};
use crate::fetch::fetcher::ConsumerRecord;
use crate::group::consumer_protocol::TopicPartition;
use crate::process::classify::{BatchError, Disposition, ErrorClass, ProcessError};

impl Lanes {
    /// The answers the driver has gathered, applied together: the progress of calls
    /// still running (as [`Lanes::progress`]), the calls that ended (as
    /// [`Lanes::handled`]), and the writes done (as [`Lanes::produced`]). A commit or
    /// a handover they make due is decided once all are in.
    ///
    /// The driver writes the outputs of all these records before it reports them.
    /// Reported one by one, the first answer could make a commit due whose offsets
    /// lack the records of the next: exactly once, that transaction then carried
    /// their outputs (or their dead letters) without their offsets, and the records
    /// were handled, and written, again after an abort or by the partition's next
    /// owner.
    pub fn report(
        &mut self,
        progress: impl IntoIterator<Item = (Ticket, usize)>,
        handled: impl IntoIterator<Item = (Ticket, Outcome, Duration)>,
        produced: impl IntoIterator<Item = (Ticket, Result<(), String>)>,
        now: Now,
    ) {
        self.reporting = true;
        for (ticket, done) in progress {
            self.progress(ticket, done, now);
        }
        for (ticket, outcome, took) in handled {
            self.handled(ticket, outcome, took, now);
        }
        for (ticket, result) in produced {
            self.produced(ticket, result, now);
        }
        self.reporting = false;
        self.step(now);
    }

    /// The call under `ticket` finished the first `done` records of its batch (it
    /// goes on with the rest): they become committable now, not when the call ends.
    pub fn progress(&mut self, ticket: Ticket, done: usize, now: Now) {
        let Some((lane, slot)) = self.lane_of(ticket) else {
            return;
        };
        let Lane { lines, tracker, .. } = lane;
        let Some(Work::Running { run, reported, .. }) =
            lines.get_mut(&slot).and_then(|l| l.running_mut())
        else {
            return;
        };
        let done = done.min(run.len());
        if done <= *reported {
            return;
        }
        finish(tracker, run.get(*reported..done).unwrap_or_default());
        let newly = (done - *reported) as u64;
        *reported = done;
        self.stats.succeeded += newly;
        self.step(now);
    }

    /// The handler call under `ticket` ended its task without an outcome (its task
    /// panicked outside the handler, or was cancelled): a failed attempt of its
    /// records, as a panic is. A write's task that ended so is a failed write.
    pub fn crashed(&mut self, ticket: Ticket, message: String, now: Now) {
        let running = self.lane_of(ticket).is_some_and(|(l, slot)| {
            matches!(l.line(slot).map(|l| l.work()), Some(Work::Running { .. }))
        });
        if running {
            self.handled(ticket, Outcome::panic(message, None), Duration::ZERO, now);
        } else {
            self.produced(ticket, Err(message), now);
        }
    }

    /// The handler call under `ticket` returned `outcome` after `took`.
    pub fn handled(&mut self, ticket: Ticket, outcome: Outcome, took: Duration, now: Now) {
        // `None`: revoked, lost or handed over meanwhile.
        let Some((
            tp,
            slot,
            Work::Running {
                run,
                retry,
                reported,
                cancelled,
                ..
            },
        )) = self.take_work(ticket)
        else {
            return;
        };
        let call = Ran {
            run,
            retry,
            reported,
            cancelled,
        };
        self.on_handled(&tp, slot, call, outcome, took, now);
        self.step(now);
    }

    fn on_handled(
        &mut self,
        tp: &TopicPartition,
        slot: Slot,
        call: Ran,
        outcome: Outcome,
        took: Duration,
        now: Now,
    ) {
        let Ran {
            run,
            retry,
            reported,
            cancelled,
        } = call;
        let Outcome {
            result,
            stopped_after,
            panicked,
            durations,
            trace,
        } = outcome;
        self.stats.panics += u64::from(panicked);
        let took_of = |i: usize| durations.get(i).copied().unwrap_or(took);
        // The records reported finished on the way: their metrics now, with their
        // durations.
        let reported = reported.min(run.len());
        for i in 0..reported {
            self.processed(true, took_of(i));
        }
        // The records past those reported finished on the way.
        let n = run.len() - reported;
        let (handled, error) = match result {
            Ok(()) => (
                stopped_after
                    .map_or(n, |s| s.saturating_sub(reported))
                    .min(n),
                None,
            ),
            Err(BatchError {
                index: Some(i),
                error,
            }) if i >= reported && i - reported < n => (i - reported, Some(error)),
            Err(BatchError { error, .. }) if n == 1 => (0, Some(error)),
            Err(BatchError { .. }) if n == 0 => (0, None),
            Err(BatchError { error, .. }) => {
                self.replay_solo(tp, slot, run.tail(reported), &error);
                return;
            }
        };
        // Stopped on cancellation: the record is neither done nor failed, and comes
        // again (for the next owner, as the lane is being given up).
        let error = match error {
            Some(e) if e.disposition == Disposition::Cancelled && cancelled => {
                self.stats.cancelled += 1;
                None
            }
            Some(e) if e.disposition == Disposition::Cancelled => Some(ProcessError::transient(
                "Cancelled",
                "the handler reported a cancellation nobody asked for",
            )),
            e => e,
        };
        let Some(lane) = self.lanes.get_mut(tp) else {
            return;
        };
        // Skipped: done, as far as commits go; counted apart.
        let (error, finished) = match error {
            Some(e) if e.disposition == Disposition::Skipped => {
                if let Some(r) = run.get(reported + handled) {
                    info!(
                        target: LOG_TARGET,
                        consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
                        offset = r.offset(), error_type = %e.kind, error = %e.message,
                        "record skipped"
                    );
                }
                (None, Some(e.kind))
            }
            e => (e, None),
        };
        let skipped = finished.is_some() && handled < n;
        let done = handled + usize::from(skipped);
        finish(
            &mut lane.tracker,
            run.get(reported..reported + done).unwrap_or_default(),
        );
        let processed = handled.min(done);
        if skipped {
            self.stats.skipped += 1;
            if let Some(kind) = finished {
                self.metric(Metric::Skipped { error_type: kind });
            }
        }
        self.stats.succeeded += processed as u64;
        if self.wants_processed() {
            for i in 0..processed {
                self.processed(true, took_of(reported + i));
            }
        }
        let Some(lane) = self.lanes.get_mut(tp) else {
            return;
        };
        let failing = match error {
            Some(e) if done < n => Some((reported + done, e)),
            _ => None,
        };
        // The records not reached (after the failing one) come again, after it.
        let rest = reported + done + usize::from(failing.is_some());
        requeue(lane, slot, run.tail(rest));
        if let Some((i, error)) = failing {
            // The first record of a call may be on a retry: it goes on counting.
            let mut attempt = match (i, retry) {
                (0, Some(retry)) => *retry,
                _ => match run.get(i) {
                    Some(r) => Attempt::first(r.clone()),
                    None => return,
                },
            };
            attempt.attempts += 1;
            attempt.took = took_of(reported + handled);
            attempt.trace = trace;
            self.on_failure(tp, slot, attempt, error, now);
        }
    }

    /// A batch failed without naming a record: it goes again one record at a time.
    fn replay_solo(&mut self, tp: &TopicPartition, slot: Slot, records: Run, error: &ProcessError) {
        let class = self
            .config
            .classifier
            .classify(error)
            .unwrap_or(ErrorClass::Transient);
        self.metric(Metric::Error {
            error_type: error.kind.clone(),
            class,
        });
        let Some(lane) = self.lanes.get_mut(tp) else {
            return;
        };
        let (first, last) = (
            records.first().map(ConsumerRecord::offset),
            records.last().map(ConsumerRecord::offset),
        );
        warn!(
            target: LOG_TARGET,
            consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition,
            first_offset = first, last_offset = last, error_type = %error.kind,
            error = %error.message, "batch failed without naming a record; replaying it one record at a time"
        );
        requeue(lane, slot, records);
        if let Some(line) = lane.line_mut(slot) {
            line.solo_through = last;
        }
    }

    /// A record's attempt failed: retry it, send it on to a retry topic, or
    /// dead-letter it, by its class and the policy.
    fn on_failure(
        &mut self,
        tp: &TopicPartition,
        slot: Slot,
        mut attempt: Attempt,
        error: ProcessError,
        now: Now,
    ) {
        let offset = attempt.record.offset();
        let class = self.config.classifier.classify(&error);
        let shown = class.unwrap_or(ErrorClass::Transient);
        self.metric(Metric::Error {
            error_type: error.kind.clone(),
            class: shown,
        });
        attempt.first_failure_ms.get_or_insert(now.unix_ms);
        attempt.last_error = Some(error.clone());
        let retry = attempt.attempts.saturating_sub(1);
        let releasing = self.lanes.get(tp).is_some_and(|l| l.releasing);
        let backoff = self.config.policy.backoff_for_error(&error, class).cloned();
        match backoff {
            Some(b) if retry < b.max_retries => {
                if releasing {
                    // The partition is going: its next owner tries the record again.
                    return;
                }
                let delay = b.delay(retry, self.next_jitter());
                warn!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition, offset,
                    retry_count = retry + 1, error_type = %error.kind, error_classification = shown.label(),
                    backoff_delay_ms = delay.as_millis() as u64, error = %error.message,
                    "handler failed; retrying"
                );
                self.stats.retries += 1;
                self.metric(Metric::Retry {
                    attempt: retry + 1,
                    delay,
                });
                if let Some(lane) = self.lanes.get_mut(tp) {
                    lane.set_work(
                        slot,
                        Work::Waiting {
                            attempt,
                            until: now.at + delay,
                        },
                    );
                }
            }
            Some(_) => {
                error!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition, offset,
                    retry_count = retry, error_type = %error.kind, error_classification = shown.label(),
                    "retries exhausted; forwarding"
                );
                let hop = hop_of(&attempt.record);
                let to = if (hop as usize) < self.config.retry_delays.len() {
                    Destination::Hop(hop + 1)
                } else {
                    Destination::DeadLetters
                };
                self.forward(tp, slot, attempt, ErrorClass::Transient, to, 0, now);
            }
            None => {
                warn!(
                    target: LOG_TARGET,
                    consumer_group = %self.config.group, topic = %tp.topic, partition = tp.partition, offset,
                    error_type = %error.kind, error_classification = "non-retryable", error = %error.message,
                    "permanent error; dead-lettering at once"
                );
                self.forward(
                    tp,
                    slot,
                    attempt,
                    ErrorClass::Permanent,
                    Destination::DeadLetters,
                    0,
                    now,
                );
            }
        }
    }
}
