//! The lanes on a virtual clock, without a broker: each test feeds inputs and reads the
//! actions, as `ottla::processor`'s driver does. [`Lanes::check`] runs after every
//! step.

use proptest::prelude::*;

use super::script::{T0_MS, record, tp, two_retries};
use super::*;
use crate::process::classify::BatchError;
use crate::process::classify::{ErrorClass, ProcessError};
use crate::process::dlq::{DeadLetter, DlqFormat, DlqTimestamp};
use crate::process::retry::{RetryBackoff, RetryPolicy};
use crate::produce::record::ProducerRecord;

/// Two retries, 100 ms then 200 ms, no jitter; commits after every step.
pub(super) fn config() -> LanesConfig {
    LanesConfig {
        group: "g".into(),
        policy: two_retries(false),
        commit_interval: None,
        metrics: true,
        ..LanesConfig::default()
    }
}

pub(super) struct Harness {
    pub(super) lanes: Lanes,
    pub(super) now: Now,
    /// Every metric so far.
    pub(super) metrics: Vec<Metric>,
}

impl Harness {
    pub(super) fn new(config: LanesConfig) -> Self {
        let now = Now {
            at: Instant::now(),
            unix_ms: T0_MS,
        };
        Self {
            lanes: Lanes::new(config, now),
            now,
            metrics: Vec::new(),
        }
    }

    /// The actions since the last call; the invariants hold.
    pub(super) fn actions(&mut self) -> Vec<Action> {
        if let Err(e) = self.lanes.check() {
            panic!("invariant broken: {e}");
        }
        let mut out = Vec::new();
        while let Some(a) = self.lanes.poll_action() {
            out.push(a);
        }
        while let Some(m) = self.lanes.poll_metric() {
            self.metrics.push(m);
        }
        out
    }

    fn deliver(&mut self, p: i32, offsets: std::ops::Range<i64>) -> Vec<Action> {
        let records = offsets.map(|o| record(p, o)).collect();
        self.lanes.deliver(records, self.now);
        self.actions()
    }

    pub(super) fn advance(&mut self, d: Duration) -> Vec<Action> {
        self.now.at += d;
        self.now.unix_ms += i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.lanes.handle_timeout(self.now);
        self.actions()
    }

    pub(super) fn handled(
        &mut self,
        ticket: Ticket,
        result: Result<(), BatchError>,
    ) -> Vec<Action> {
        self.lanes.handled(
            ticket,
            Outcome::of(result),
            Duration::from_millis(1),
            self.now,
        );
        self.actions()
    }

    pub(super) fn produced(&mut self, ticket: Ticket, result: Result<(), &str>) -> Vec<Action> {
        self.lanes
            .produced(ticket, result.map_err(str::to_string), self.now);
        self.actions()
    }

    /// Answers a commit as the broker would (accepted).
    pub(super) fn commit_ok(&mut self, offsets: &[(TopicPartition, i64)]) -> Vec<Action> {
        self.lanes.committed(offsets, true, self.now);
        self.actions()
    }
}

/// The one dispatch among `actions`: its ticket and offsets.
fn dispatched(actions: &[Action]) -> (Ticket, Vec<i64>) {
    let found: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch {
                ticket, records, ..
            } => Some((*ticket, records.iter().map(|r| r.offset()).collect())),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "one dispatch in {actions:?}");
    found.into_iter().next().unwrap_or_else(|| unreachable!())
}

pub(super) fn produce_of(actions: &[Action]) -> (Ticket, ProducerRecord) {
    let found: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Produce { ticket, record, .. } => Some((*ticket, record.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "one write in {actions:?}");
    found.into_iter().next().unwrap_or_else(|| unreachable!())
}

pub(super) fn commits(actions: &[Action]) -> Vec<Vec<(TopicPartition, i64)>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Commit(o) => Some(o.clone()),
            _ => None,
        })
        .collect()
}

fn header<'a>(r: &'a ProducerRecord, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.as_deref())
}

#[test]
fn a_transient_failure_waits_its_backoff_and_nothing_is_committed_until_it_succeeds() {
    let mut h = Harness::new(config());
    let a = h.deliver(0, 0..2);
    let (t1, offsets) = dispatched(&a);
    assert_eq!(offsets, [0]);
    let a = h.handled(
        t1,
        Err(BatchError::at(
            0,
            ProcessError::transient("Http503", "down"),
        )),
    );
    assert!(
        a.contains(&Action::Pause(tp(0))),
        "the waiting lane is paused: {a:?}"
    );
    assert!(commits(&a).is_empty(), "nothing finished: {a:?}");
    assert!(
        h.advance(Duration::from_millis(99)).is_empty(),
        "the backoff is 100 ms"
    );
    let a = h.advance(Duration::from_millis(1));
    let (t2, offsets) = dispatched(&a);
    assert_eq!(offsets, [0], "the same record again, before record 1");
    assert!(a.contains(&Action::Resume(tp(0))));
    let a = h.handled(t2, Ok(()));
    assert_eq!(commits(&a), [vec![(tp(0), 1)]]);
    assert_eq!(dispatched(&a).1, [1]);
    assert_eq!((h.lanes.stats().retries, h.lanes.stats().succeeded), (1, 1));
    assert!(h.metrics.contains(&Metric::Retry {
        attempt: 1,
        delay: Duration::from_millis(100)
    }));
}

#[test]
fn retries_run_out_into_the_dead_letter_topic_and_the_record_finishes_when_it_is_written() {
    let mut h = Harness::new(config());
    let (mut t, _) = dispatched(&h.deliver(0, 0..1));
    for delay in [100, 200] {
        h.handled(
            t,
            Err(BatchError::at(
                0,
                ProcessError::transient("Http503", "down"),
            )),
        );
        t = dispatched(&h.advance(Duration::from_millis(delay))).0;
    }
    let a = h.handled(
        t,
        Err(BatchError::at(
            0,
            ProcessError::transient("Http503", "down"),
        )),
    );
    let (w, letter) = produce_of(&a);
    assert_eq!(letter.topic, "orders.dlq");
    assert_eq!(header(&letter, "__dlq.errors.offset"), Some(&b"0"[..]));
    assert!(
        commits(&a).is_empty(),
        "not finished until the write is acknowledged"
    );
    let a = h.produced(w, Ok(()));
    assert_eq!(commits(&a), [vec![(tp(0), 1)]]);
    assert_eq!(h.lanes.stats().dead_lettered, 1);
}

#[test]
fn a_failing_dead_letter_write_halts_its_lane_until_the_write_succeeds() {
    let mut h = Harness::new(config());
    let (t, _) = dispatched(&h.deliver(0, 0..2));
    let (w, _) = produce_of(&h.handled(t, Err(BatchError::at(0, ProcessError::malformed("bad")))));
    let a = h.produced(w, Err("topic not found"));
    assert!(a.contains(&Action::Pause(tp(0))), "halted: {a:?}");
    assert!(commits(&a).is_empty());
    // 200 ms, jittered by ±20%.
    let wait = h
        .lanes
        .poll_timeout()
        .map(|t| t - h.now.at)
        .unwrap_or_default();
    assert!(
        wait >= Duration::from_millis(160) && wait < Duration::from_millis(240),
        "{wait:?}"
    );
    assert!(
        h.advance(wait - Duration::from_millis(1)).is_empty(),
        "record 1 waits behind the halted record"
    );
    let (w, _) = produce_of(&h.advance(Duration::from_millis(1)));
    let a = h.produced(w, Ok(()));
    assert_eq!(commits(&a), [vec![(tp(0), 1)]]);
    assert_eq!(dispatched(&a).1, [1]);
    assert!(a.contains(&Action::Resume(tp(0))));
    let s = h.lanes.stats();
    assert_eq!((s.dlq_failures, s.dead_lettered), (1, 1));
    let halted: Vec<_> = h
        .metrics
        .iter()
        .filter_map(|m| match m {
            Metric::Halted { partitions } => Some(*partitions),
            _ => None,
        })
        .collect();
    assert_eq!(
        halted,
        [1, 0],
        "reported when it halts and when it recovers"
    );
}

#[test]
fn a_batch_failing_without_naming_a_record_is_replayed_one_record_at_a_time() {
    let mut h = Harness::new(LanesConfig {
        max_batch: 3,
        ..config()
    });
    let (t, offsets) = dispatched(&h.deliver(0, 0..3));
    assert_eq!(offsets, [0, 1, 2]);
    let a = h.handled(
        t,
        Err(BatchError::whole(ProcessError::transient("Db", "lost"))),
    );
    let (t, offsets) = dispatched(&a);
    assert_eq!(offsets, [0], "alone");
    h.deliver(0, 3..5);
    let (t, offsets) = dispatched(&h.handled(t, Ok(())));
    assert_eq!(offsets, [1]);
    let (t, offsets) = dispatched(&h.handled(t, Ok(())));
    assert_eq!(
        offsets,
        [2],
        "the last record of the failed batch, still alone"
    );
    let (_, offsets) = dispatched(&h.handled(t, Ok(())));
    assert_eq!(offsets, [3, 4], "batches again after it");
    assert_eq!(h.lanes.stats().retries, 0, "nothing failed on its own");
}

#[test]
fn records_a_call_did_not_reach_come_back_before_later_deliveries_and_small_runs_join_up() {
    let mut h = Harness::new(LanesConfig {
        max_batch: 4,
        ..config()
    });
    // A short delivery grows in place while no call has it: 0..1 is dispatched at
    // once, 1..2 and 2..3 join into one run behind the call.
    let (t, offsets) = dispatched(&h.deliver(0, 0..1));
    assert_eq!(offsets, [0]);
    assert!(h.deliver(0, 1..2).is_empty());
    assert!(h.deliver(0, 2..3).is_empty());
    let a = h.handled(t, Ok(()));
    let (t, offsets) = dispatched(&a);
    assert_eq!(offsets, [1, 2], "one run of two deliveries");
    assert_eq!(commits(&a), [vec![(tp(0), 1)]]);
    h.commit_ok(&[(tp(0), 1)]);
    // The call stops after one record (paused, its slice over): the record it did not
    // reach comes first, before what was delivered meanwhile, and with it in one call
    // (the remnant holds less than half a batch).
    assert!(h.deliver(0, 3..6).is_empty());
    h.lanes.handled(
        t,
        Outcome {
            stopped_after: Some(1),
            ..Outcome::of(Ok(()))
        },
        Duration::from_millis(1),
        h.now,
    );
    let a = h.actions();
    assert_eq!(commits(&a), [vec![(tp(0), 2)]], "1 is done, 2 is not");
    h.commit_ok(&[(tp(0), 2)]);
    let (t, offsets) = dispatched(&a);
    assert_eq!(offsets, [2, 3, 4, 5], "2 first, then the delivery after it");
    let a = h.handled(t, Ok(()));
    assert_eq!(commits(&a), [vec![(tp(0), 6)]]);
    assert_eq!(h.lanes.queued(), 0);
}

#[test]
fn a_record_named_by_a_batch_error_fails_alone_and_the_records_after_it_come_again() {
    let mut h = Harness::new(LanesConfig {
        max_batch: 3,
        ..config()
    });
    let (t, _) = dispatched(&h.deliver(0, 0..3));
    let a = h.handled(
        t,
        Err(BatchError::at(1, ProcessError::transient("Db", "lost"))),
    );
    assert_eq!(commits(&a), [vec![(tp(0), 1)]], "record 0 is done");
    let (_, offsets) = dispatched(&h.advance(Duration::from_millis(100)));
    assert_eq!(offsets, [1], "the failed record retries alone");
}

#[test]
fn a_skipped_record_is_committed_counted_and_the_records_after_it_come_again() {
    let mut h = Harness::new(LanesConfig {
        max_batch: 3,
        ..config()
    });
    let (t, _) = dispatched(&h.deliver(0, 0..3));
    let a = h.handled(
        t,
        Err(BatchError::at(1, ProcessError::skip("Old", "schema v1"))),
    );
    assert_eq!(commits(&a), [vec![(tp(0), 2)]]);
    assert_eq!(dispatched(&a).1, [2]);
    let s = h.lanes.stats();
    assert_eq!((s.succeeded, s.skipped, s.retries), (1, 1, 0));
}

#[test]
fn a_cancellation_nobody_asked_for_is_a_transient_failure() {
    let mut h = Harness::new(config());
    let (t, _) = dispatched(&h.deliver(0, 0..1));
    let a = h.handled(t, Err(BatchError::at(0, ProcessError::cancelled())));
    assert!(commits(&a).is_empty());
    assert_eq!(h.lanes.stats().retries, 1, "retried, not taken as done");
}

#[test]
fn a_retry_topic_record_waits_for_its_time_pausing_only_its_partition() {
    let mut h = Harness::new(LanesConfig {
        retry_delays: vec![Duration::from_secs(30)],
        ..config()
    });
    // Written to the retry topic 10 s ago: 20 s to wait.
    let waiting = ConsumerRecord::builder("orders.retry.30s", 0, 7)
        .timestamp(T0_MS - 10_000)
        .value("v")
        .header("ottla.retry.hop", Some("1"))
        .header("ottla.retry.topic", Some("orders"))
        .header("ottla.retry.partition", Some("2"))
        .header("ottla.retry.offset", Some("41"))
        .build();
    let retry_tp = waiting.topic_partition();
    h.lanes.deliver(vec![waiting, record(1, 0)], h.now);
    let a = h.actions();
    assert_eq!(dispatched(&a).1, [0], "the other partition goes on");
    assert!(a.contains(&Action::Pause(retry_tp.clone())));
    assert!(h.advance(Duration::from_millis(19_999)).is_empty());
    let a = h.advance(Duration::from_millis(1));
    let (t, offsets) = dispatched(&a);
    assert_eq!(offsets, [7]);
    // It fails for good: the last hop is followed by the dead-letter topic, which names
    // where the record first came from.
    let (w, letter) =
        produce_of(&h.handled(t, Err(BatchError::at(0, ProcessError::malformed("x")))));
    assert_eq!(letter.topic, "orders.dlq");
    assert_eq!(header(&letter, "__dlq.errors.offset"), Some(&b"41"[..]));
    let a = h.produced(w, Ok(()));
    assert_eq!(commits(&a), [vec![(retry_tp, 8)]]);
}

#[test]
fn retries_run_out_into_the_first_retry_topic_with_the_origin_in_its_headers() {
    let mut h = Harness::new(LanesConfig {
        retry_delays: vec![Duration::from_secs(30), Duration::from_secs(300)],
        policy: RetryPolicy {
            default: RetryBackoff {
                max_retries: 0,
                ..config().policy.default
            },
            ..RetryPolicy::default()
        },
        ..config()
    });
    let (t, _) = dispatched(&h.deliver(0, 0..1));
    let (w, out) = produce_of(&h.handled(
        t,
        Err(BatchError::at(
            0,
            ProcessError::transient("Http503", "down"),
        )),
    ));
    assert_eq!(out.topic, "orders.retry.30s");
    assert_eq!(header(&out, "ottla.retry.hop"), Some(&b"1"[..]));
    assert_eq!(header(&out, "ottla.retry.offset"), Some(&b"0"[..]));
    let a = h.produced(w, Ok(()));
    assert_eq!(commits(&a), [vec![(tp(0), 1)]]);
    assert_eq!(h.lanes.stats().forwarded, 1);
}

#[test]
fn a_revocation_stops_running_work_then_releases_the_finished_prefix() {
    let mut h = Harness::new(config());
    let (t0, _) = dispatched(&h.deliver(0, 0..3));
    let (t1, _) = dispatched(&h.deliver(1, 0..3));
    let a = h.handled(t0, Ok(()));
    let (t0, _) = dispatched(&a);
    h.commit_ok(&commits(&a)[0]);
    let revoked = Handover::Revoked { generation: 5 };
    h.lanes
        .release(vec![tp(0)], revoked, Duration::from_secs(10), h.now);
    let a = h.actions();
    assert!(
        a.contains(&Action::Cancel(t0)),
        "the running handler is told: {a:?}"
    );
    assert!(a.contains(&Action::Pause(tp(0))));
    assert!(
        !a.iter().any(|a| matches!(a, Action::Release { .. })),
        "not before the handler stops"
    );
    // It stops on the cancellation: record 1 is left for the next owner.
    let a = h.handled(t0, Err(BatchError::at(0, ProcessError::cancelled())));
    assert_eq!(
        a,
        [Action::Release {
            handover: revoked,
            partitions: vec![tp(0)],
            offsets: vec![],
            metadata: vec![],
        }],
        "record 0 was committed already, record 1 is not done"
    );
    assert_eq!(h.lanes.stats().cancelled, 1);
    assert_eq!(h.lanes.partitions(), [tp(1)], "the lane is gone");
    // The other partition was never held up.
    let a = h.handled(t1, Ok(()));
    assert_eq!(dispatched(&a).1, [1]);
}

#[test]
fn a_handler_past_the_acquiesce_window_is_left_and_what_it_finished_is_released() {
    let mut h = Harness::new(LanesConfig {
        max_batch: 3,
        commit_interval: Some(Duration::from_secs(5)),
        ..config()
    });
    let (t, _) = dispatched(&h.deliver(0, 0..3));
    // The call finished records 0 and 1 and hangs on 2.
    h.lanes.progress(t, 2, h.now);
    assert!(h.actions().is_empty(), "committed on the interval");
    h.lanes.release(
        vec![tp(0)],
        Handover::Shutdown,
        Duration::from_secs(1),
        h.now,
    );
    h.actions();
    let a = h.advance(Duration::from_secs(1));
    assert_eq!(
        a,
        [Action::Release {
            handover: Handover::Shutdown,
            partitions: vec![tp(0)],
            offsets: vec![(tp(0), 2)],
            metadata: vec![None],
        }],
        "the finished prefix is committed even though the call never returned"
    );
    assert!(
        h.handled(t, Ok(())).is_empty(),
        "its late answer changes nothing"
    );
    assert_eq!(h.lanes.stats().succeeded, 2);
}

#[test]
fn a_shutdown_gives_handlers_four_fifths_of_its_timeout_at_most_the_acquiesce_window() {
    for (timeout, acquiesce, wait) in [(10, 150, 8), (25, 5, 5)] {
        let mut h = Harness::new(config());
        let (t, _) = dispatched(&h.deliver(0, 0..2));
        h.lanes.shutdown(
            Duration::from_secs(timeout),
            Duration::from_secs(acquiesce),
            h.now,
        );
        let a = h.actions();
        assert!(a.contains(&Action::Cancel(t)), "{a:?}");
        let early = h.advance(Duration::from_secs(wait) - Duration::from_millis(1));
        assert!(early.is_empty(), "{timeout} s: still waiting: {early:?}");
        let a = h.advance(Duration::from_millis(1));
        assert_eq!(
            a,
            [Action::Release {
                handover: Handover::Shutdown,
                partitions: vec![tp(0)],
                offsets: vec![],
                metadata: vec![],
            }],
            "{timeout} s, acquiesce {acquiesce} s: handed over after {wait} s"
        );
    }
}

#[test]
fn lost_partitions_drop_their_work_and_commit_nothing() {
    let mut h = Harness::new(config());
    let (t, _) = dispatched(&h.deliver(0, 0..2));
    h.lanes.lose(&[tp(0)], h.now);
    let a = h.actions();
    assert_eq!(a, [Action::Cancel(t)]);
    assert!(h.lanes.partitions().is_empty());
    assert!(
        h.handled(t, Ok(())).is_empty(),
        "no commit for a lost partition"
    );
    assert!(h.metrics.contains(&Metric::Lost {
        partitions: vec![tp(0)]
    }));
    // Assigned again later: a new lane, from the records delivered then.
    let (_, offsets) = dispatched(&h.deliver(0, 1..2));
    assert_eq!(offsets, [1]);
}

#[test]
fn a_task_that_ends_without_a_result_is_a_failed_attempt_not_a_busy_lane_for_ever() {
    let mut h = Harness::new(config());
    let (t, _) = dispatched(&h.deliver(0, 0..2));
    h.lanes.crashed(t, "a Drop panicked".into(), h.now);
    let a = h.actions();
    let (w, letter) = produce_of(&a);
    assert_eq!(header(&letter, "ottla.dlq.error.type"), Some(&b"Panic"[..]));
    assert_eq!(h.lanes.stats().panics, 1);
    let (_, offsets) = dispatched(&h.produced(w, Ok(())));
    assert_eq!(offsets, [1], "the lane goes on");
    // A write's task that ends so is a failed write: the lane halts and tries again.
    let mut h = Harness::new(config());
    let (t, _) = dispatched(&h.deliver(0, 0..1));
    let (w, _) = produce_of(&h.handled(t, Err(BatchError::at(0, ProcessError::malformed("x")))));
    h.lanes
        .crashed(w, "the producer task panicked".into(), h.now);
    h.actions();
    assert_eq!(h.lanes.stats().dlq_failures, 1);
    let (_, again) = produce_of(&h.advance(Duration::from_millis(240)));
    assert_eq!(again.topic, "orders.dlq");
}

#[test]
fn a_failed_commit_is_tried_again_on_the_next_interval() {
    let mut h = Harness::new(LanesConfig {
        commit_interval: Some(Duration::from_secs(1)),
        ..config()
    });
    let (t, _) = dispatched(&h.deliver(0, 0..1));
    h.handled(t, Ok(()));
    let a = h.advance(Duration::from_secs(1));
    assert_eq!(commits(&a), [vec![(tp(0), 1)]]);
    h.lanes.committed(&[(tp(0), 1)], false, h.now);
    assert!(h.actions().is_empty());
    let a = h.advance(Duration::from_secs(1));
    assert_eq!(commits(&a), [vec![(tp(0), 1)]], "still pending");
    h.commit_ok(&[(tp(0), 1)]);
    assert!(commits(&h.advance(Duration::from_secs(1))).is_empty());
}

#[test]
fn no_more_lanes_run_than_the_concurrency_and_a_due_retry_waits_for_a_slot() {
    let mut h = Harness::new(LanesConfig {
        concurrency: 1,
        ..config()
    });
    h.lanes.deliver(vec![record(0, 0), record(1, 0)], h.now);
    let (t, _) = dispatched(&h.actions());
    let a = h.handled(t, Err(BatchError::at(0, ProcessError::transient("x", "y"))));
    let (t1, _) = dispatched(&a);
    // Partition 0's retry is due while partition 1 runs: no timer spins meanwhile.
    h.now.at += Duration::from_millis(500);
    assert_eq!(
        h.lanes.poll_timeout(),
        None,
        "nothing to wake for until a slot frees"
    );
    let (_, offsets) = dispatched(&h.handled(t1, Ok(())));
    assert_eq!(offsets, [0]);
}

#[test]
fn a_paused_partition_starts_nothing_until_resumed_and_the_others_go_on() {
    let mut h = Harness::new(config());
    let (t0, _) = dispatched(&h.deliver(0, 0..3));
    let (t1, _) = dispatched(&h.deliver(1, 0..3));
    h.lanes.pause(Some(&[tp(0)]), h.now);
    let a = h.actions();
    assert_eq!(
        a,
        [Action::Yield(t0), Action::Pause(tp(0))],
        "the call stops after the record in hand, and the lane stops fetching"
    );
    // The running call finishes and is committed; nothing new starts on partition 0.
    let a = h.handled(t0, Ok(()));
    assert_eq!(commits(&a), [vec![(tp(0), 1)]]);
    assert!(
        !a.iter().any(|a| matches!(a, Action::Dispatch { .. })),
        "{a:?}"
    );
    let a = h.handled(
        t1,
        Err(BatchError::at(0, ProcessError::transient("x", "y"))),
    );
    assert_eq!(a, [Action::Pause(tp(1))], "partition 1 waits for its retry");
    // Paused as a whole (a circuit breaker): partition 1's due retry waits, and no
    // timer spins for it meanwhile.
    h.lanes.pause(None, h.now);
    h.actions();
    h.now.at += Duration::from_millis(100);
    assert_eq!(h.lanes.poll_timeout(), None);
    assert!(
        h.advance(Duration::from_secs(5))
            .iter()
            .all(|a| !matches!(a, Action::Dispatch { .. }))
    );
    h.lanes.resume(None, h.now);
    let a = h.actions();
    let started: Vec<_> = a
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch {
                partition, records, ..
            } => Some((partition.partition, records[0].offset())),
            _ => None,
        })
        .collect();
    assert_eq!(
        started,
        [(0, 1), (1, 0)],
        "both lanes go on where they stopped"
    );
    assert!(a.contains(&Action::Resume(tp(0))));
}

#[test]
fn a_dead_letter_is_stamped_when_written_unless_asked_for_the_original_time() {
    let r = record(3, 41);
    let error = ProcessError::permanent("Rejected", "bad");
    let letter = DeadLetter {
        topic: "orders",
        partition: 3,
        offset: 41,
        timestamp: 1_000,
        timestamp_type: r.timestamp_type(),
        group: "g",
        error: &error,
        class: ErrorClass::Permanent,
        attempts: 1,
        first_failure_ms: 90_000_000,
        dead_lettered_ms: 90_000_500,
    };
    let r = ConsumerRecord::builder(r.topic(), r.partition(), r.offset())
        .timestamp(1_000)
        .value(r.value_bytes().unwrap_or_default())
        .build();
    let format = DlqFormat::Apache;
    let out = dead_letter_record(
        "orders.dlq".into(),
        &r,
        &letter,
        format,
        DlqTimestamp::default(),
    );
    assert_eq!(
        out.timestamp,
        Some(90_000_500),
        "written now, not 89,999 s ago"
    );
    assert_eq!(
        header(&out, "ottla.dlq.original.timestamp"),
        Some(&b"1000"[..])
    );
    let out = dead_letter_record(
        "orders.dlq".into(),
        &r,
        &letter,
        format,
        DlqTimestamp::Original,
    );
    assert_eq!(out.timestamp, Some(1_000));
}

// ----- random schedules against a model -----

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any schedule of deliveries, outcomes, writes, commits, revocations, losses and
    /// time keeps the promises [`script`] checks; the `lanes_ops` fuzz target runs
    /// the same scripts from coverage-guided bytes.
    #[test]
    fn random_schedules_keep_the_invariants(script in proptest::collection::vec(any::<u8>(), 1..400)) {
        if let Err(e) = super::script::run(&script) {
            prop_assert!(false, "{e}");
        }
    }
}

/// The attempt number each dispatch names, and the trace context of the failed attempt
/// written into the record's hop and then its dead letter, in place of the record's own
/// `traceparent` (the other headers copied as they were).
#[test]
fn hops_and_dead_letters_carry_the_failed_attempts_trace() {
    use crate::trace::{TRACEPARENT, TraceContext, of_headers};
    let sender = TraceContext::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .unwrap_or_else(|| unreachable!());
    let (first, second) = (sender.child(&[b"1"]), sender.child(&[b"2"]));
    let mut h = Harness::new(LanesConfig {
        retry_delays: vec![Duration::from_secs(30)],
        policy: RetryPolicy {
            default: RetryBackoff {
                max_retries: 1,
                ..config().policy.default
            },
            ..RetryPolicy::default()
        },
        ..config()
    });
    let traced = ConsumerRecord::builder("orders", 0, 0)
        .timestamp(T0_MS)
        .value("v")
        .header("a", Some("1"))
        .header(TRACEPARENT, Some(sender.header()))
        .build();
    h.lanes.deliver(vec![traced], h.now);
    let a = h.actions();
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::Dispatch { attempt: 1, .. })),
        "{a:?}"
    );
    let (t, _) = dispatched(&a);
    let failed = |trace| Outcome {
        trace: Some(trace),
        ..Outcome::of(Err(BatchError::at(
            0,
            ProcessError::transient("Http503", "down"),
        )))
    };
    h.lanes
        .handled(t, failed(first), Duration::from_millis(1), h.now);
    h.actions();
    let a = h.advance(Duration::from_secs(1));
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::Dispatch { attempt: 2, .. })),
        "the retry is attempt 2: {a:?}"
    );
    let (t, _) = dispatched(&a);
    h.lanes
        .handled(t, failed(second), Duration::from_millis(1), h.now);
    let (w, hop) = produce_of(&h.actions());
    assert_eq!(hop.topic, "orders.retry.30s");
    assert_eq!(of_headers(&hop.headers), Some(second), "the last attempt's");
    assert_eq!(hop.headers.first().map(|(k, _)| k.as_str()), Some("a"));
    assert_eq!(
        hop.headers.iter().filter(|(k, _)| k == TRACEPARENT).count(),
        1
    );
    h.produced(w, Ok(()));

    // The hop comes back on the retry topic and fails for good there: its dead letter
    // goes on from that attempt's context.
    let on_hop = sender.child(&[b"hop"]);
    let mut back = ConsumerRecord::builder(&hop.topic, 0, 7)
        .timestamp(T0_MS)
        .value("v");
    for (k, v) in &hop.headers {
        back = back.header(k.clone(), v.clone());
    }
    let back = back.build();
    h.lanes.deliver(vec![back], h.now);
    h.actions();
    // It waits for its timestamp plus the topic's delay.
    let (t, _) = dispatched(&h.advance(Duration::from_secs(30)));
    let dead = Outcome {
        trace: Some(on_hop),
        ..Outcome::of(Err(BatchError::at(0, ProcessError::malformed("x"))))
    };
    h.lanes.handled(t, dead, Duration::from_millis(1), h.now);
    let (_, letter) = produce_of(&h.actions());
    assert_eq!(letter.topic, "orders.dlq");
    assert_eq!(of_headers(&letter.headers), Some(on_hop));

    // Without a context from the driver, the record's own is copied as it was.
    let plain = ConsumerRecord::builder("orders", 1, 0)
        .timestamp(T0_MS)
        .value("v")
        .header(TRACEPARENT, Some(sender.header()))
        .build();
    h.lanes.deliver(vec![plain], h.now);
    let (t, _) = dispatched(&h.actions());
    let a = h.handled(t, Err(BatchError::at(0, ProcessError::malformed("x"))));
    let (_, letter) = produce_of(&a);
    assert_eq!(of_headers(&letter.headers), Some(sender));
}

#[test]
fn a_transactional_handover_commits_every_lanes_finished_prefix() {
    for transactional in [false, true] {
        let mut h = Harness::new(LanesConfig {
            transactional,
            commit_interval: Some(Duration::from_secs(5)),
            ..config()
        });
        let (t0, _) = dispatched(&h.deliver(0, 0..2));
        let (t1, _) = dispatched(&h.deliver(1, 0..2));
        // Partition 1's record 0 finishes (its outputs are in the open transaction).
        dispatched(&h.handled(t1, Ok(())));
        let revoked = Handover::Revoked { generation: 5 };
        h.lanes
            .release(vec![tp(0)], revoked, Duration::from_secs(10), h.now);
        h.actions();
        let a = h.handled(t0, Err(BatchError::at(0, ProcessError::cancelled())));
        let released: Vec<_> = a
            .iter()
            .filter_map(|a| match a {
                Action::Release { offsets, .. } => Some(offsets.clone()),
                _ => None,
            })
            .collect();
        let expected = if transactional {
            vec![(tp(1), 1)]
        } else {
            vec![]
        };
        assert_eq!(released, [expected], "transactional: {transactional}");
        assert_eq!(h.lanes.partitions(), [tp(1)]);
    }
}

#[test]
fn a_rewind_drops_every_lane_and_restarts_each_from_its_last_commit() {
    let mut h = Harness::new(config());
    let (t0, _) = dispatched(&h.deliver(0, 5..8));
    let a = h.handled(t0, Ok(()));
    let (t0, _) = dispatched(&a);
    assert_eq!(commits(&a), [vec![(tp(0), 6)]]);
    h.commit_ok(&[(tp(0), 6)]);
    // Record 6 finishes; its commit (7) is out when the transaction aborts.
    let a = h.handled(t0, Ok(()));
    let (t0, _) = dispatched(&a);
    assert_eq!(commits(&a), [vec![(tp(0), 7)]]);
    // Partition 1 waits for a retry, paused.
    let (t1, _) = dispatched(&h.deliver(1, 0..1));
    let a = h.handled(
        t1,
        Err(BatchError::at(0, ProcessError::transient("Busy", "later"))),
    );
    assert!(a.contains(&Action::Pause(tp(1))), "{a:?}");
    let restart = h.lanes.rewind(h.now);
    let a = h.actions();
    assert_eq!(restart, [(tp(0), 6), (tp(1), 0)]);
    assert!(a.contains(&Action::Cancel(t0)), "{a:?}");
    assert!(a.contains(&Action::Resume(tp(1))), "{a:?}");
    assert!(h.lanes.partitions().is_empty());
    assert!(
        h.handled(t0, Ok(())).is_empty(),
        "a late answer of the aborted work changes nothing"
    );
    // Read again from the last commit: record 6 is handled again, and commits again.
    let (t, offsets) = dispatched(&h.deliver(0, 6..8));
    assert_eq!(offsets, [6]);
    let a = h.handled(t, Ok(()));
    assert_eq!(commits(&a), [vec![(tp(0), 7)]]);
}

#[test]
fn a_rewind_drops_the_commits_and_calls_queued_before_it() {
    let mut h = Harness::new(config());
    let (t0, _) = dispatched(&h.deliver(0, 0..2));
    // Record 0 finishes: a commit of 1 and the next call are queued, not yet run.
    h.lanes
        .handled(t0, Outcome::of(Ok(())), Duration::from_millis(1), h.now);
    let restart = h.lanes.rewind(h.now);
    assert_eq!(restart, [(tp(0), 0)], "record 0's outputs were aborted");
    let a = h.actions();
    assert!(
        commits(&a).is_empty(),
        "a commit of aborted work must not run: {a:?}"
    );
    assert!(
        !a.iter().any(|a| matches!(a, Action::Dispatch { .. })),
        "no call on a dropped lane: {a:?}"
    );
    // Read again from 0, by a new lane.
    let (_, offsets) = dispatched(&h.deliver(0, 0..2));
    assert_eq!(offsets, [0]);
}

/// Answers the driver gathered in one turn (the outputs of all their records already
/// in the open transaction) make one commit with every partition's offset. Reported
/// one at a time, the first made a commit due at once, and the commit in flight held
/// the others back: exactly once, that transaction carried partition 1's outputs
/// without its offset (tansu exactly-once tests under CPU load; the kit's exactly-once
/// chaos run, seed 45: two inputs copied twice).
#[test]
fn answers_reported_together_make_one_commit_with_all_their_offsets() {
    let batches = || LanesConfig {
        max_batch: 3,
        ..config()
    };
    let two_calls = |h: &mut Harness| {
        let (t0, _) = dispatched(&h.deliver(0, 0..3));
        let (t1, _) = dispatched(&h.deliver(1, 0..3));
        (t0, t1)
    };
    // One at a time: the first answer's commit lacks the second's records.
    let mut h = Harness::new(batches());
    let (t0, t1) = two_calls(&mut h);
    h.lanes.progress(t0, 2, h.now);
    h.lanes.progress(t1, 2, h.now);
    assert_eq!(commits(&h.actions()), [vec![(tp(0), 2)]]);

    // Together: progress of running calls, and calls that ended.
    let mut h = Harness::new(batches());
    let (t0, t1) = two_calls(&mut h);
    h.lanes.report(
        [(t0, 2)],
        [(t1, Outcome::of(Ok(())), Duration::from_millis(1))],
        [],
        h.now,
    );
    assert_eq!(commits(&h.actions()), [vec![(tp(0), 2), (tp(1), 3)]]);

    // Dead letters written together finish their records together.
    let mut h = Harness::new(batches());
    let (t0, t1) = two_calls(&mut h);
    let poison = || Err(BatchError::at(0, ProcessError::permanent("Poison", "no")));
    let (w0, _) = produce_of(&h.handled(t0, poison()));
    let (w1, _) = produce_of(&h.handled(t1, poison()));
    h.lanes.report([], [], [(w0, Ok(())), (w1, Ok(()))], h.now);
    let a = h.actions();
    assert_eq!(commits(&a), [vec![(tp(0), 1), (tp(1), 1)]]);
}
