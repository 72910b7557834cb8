//! The orders other than by partition, on a virtual clock: by key, a key's records one
//! call at a time in offset order and other keys at once; unordered, any records at
//! once; under both, the commit is the finished prefix. [`Lanes::check`] runs after
//! every step (the harness's `actions`).

use super::script::T0_MS;
use super::tests::{Harness, commits, config, produce_of};
use super::*;
use crate::process::classify::{BatchError, ProcessError};

fn by(order: ProcessingOrder, concurrency: usize) -> LanesConfig {
    LanesConfig {
        ordering: order,
        concurrency,
        ..config()
    }
}

/// A record of partition 0 at `offset`, with `key` (none: no key).
fn keyed(offset: i64, key: Option<&str>) -> ConsumerRecord {
    let b = ConsumerRecord::builder("orders", 0, offset)
        .timestamp(T0_MS)
        .value("v");
    match key {
        Some(k) => b.key(k.to_string()),
        None => b,
    }
    .build()
}

impl Harness {
    /// No commit among `actions` passes `bound`; each is answered (accepted). A commit
    /// of the prefix again, carrying the records finished past it in its metadata,
    /// may be among them.
    fn none_past(&mut self, actions: &[Action], bound: i64) {
        for c in commits(actions) {
            assert!(
                c.iter().all(|(_, o)| *o <= bound),
                "a commit past {bound}: {c:?} in {actions:?}"
            );
            self.commit_ok(&c);
        }
    }

    /// Delivers records of partition 0 from offset `from`, keyed by `keys`.
    fn deliver_keys(&mut self, from: i64, keys: &[Option<&str>]) -> Vec<Action> {
        let records = keys.iter().zip(from..).map(|(k, o)| keyed(o, *k)).collect();
        self.lanes.deliver(records, self.now);
        self.actions()
    }
}

/// Every dispatch among `actions`: its ticket and offsets, in order.
fn dispatches(actions: &[Action]) -> Vec<(Ticket, Vec<i64>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch {
                ticket, records, ..
            } => Some((*ticket, records.iter().map(|r| r.offset()).collect())),
            _ => None,
        })
        .collect()
}

/// The ticket of the call on the record at `offset`.
fn ticket_of(calls: &[(Ticket, Vec<i64>)], offset: i64) -> Ticket {
    calls
        .iter()
        .find(|(_, o)| o.contains(&offset))
        .map(|(t, _)| *t)
        .unwrap_or_else(|| panic!("no call on {offset} in {calls:?}"))
}

fn paused(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::Pause(_)))
}

fn transient() -> Result<(), BatchError> {
    Err(BatchError::at(
        0,
        ProcessError::transient("Down", "db down"),
    ))
}

/// By key: the first record of each key starts at once; a key's second record waits
/// for its first; a key retrying holds only its own records while the other keys go
/// on; nothing is committed past the retrying record until it succeeds.
#[test]
fn by_key_a_retrying_key_holds_only_its_own_records_and_the_other_keys_flow() {
    let mut h = Harness::new(by(ProcessingOrder::Key, 8));
    let a = Some("a");
    let b = Some("b");
    let c = Some("c");
    // Offsets 0..5: a b a c b.
    let acts = h.deliver_keys(0, &[a, b, a, c, b]);
    let calls = dispatches(&acts);
    let started: Vec<_> = calls.iter().map(|(_, o)| o.clone()).collect();
    assert_eq!(
        started,
        vec![vec![0], vec![1], vec![3]],
        "one call per key, each key's first"
    );
    // Key a fails: it waits 100 ms for its retry, and the partition is not paused.
    let acts = h.handled(ticket_of(&calls, 0), transient());
    assert!(dispatches(&acts).is_empty(), "{acts:?}");
    assert!(
        !paused(&acts),
        "a retrying key pauses its partition: {acts:?}"
    );
    // Key b goes on with its second record while a waits; the commit stays at 0,
    // carrying record 1 in its metadata.
    let acts = h.handled(ticket_of(&calls, 1), Ok(()));
    h.none_past(&acts, 0);
    let at_zero = [(TopicPartition::new("orders", 0), 0)];
    assert_eq!(
        h.lanes.commit_metadata(&at_zero),
        vec![Some("ottla.f1:1,1".to_string())]
    );
    let next = dispatches(&acts);
    assert_eq!(
        next.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![4]]
    );
    let acts = h.handled(ticket_of(&next, 4), Ok(()));
    h.none_past(&acts, 0);
    let acts = h.handled(ticket_of(&calls, 3), Ok(()));
    h.none_past(&acts, 0);
    // The retry falls due: record 0 again, then a's second record, 2.
    let acts = h.advance(Duration::from_millis(100));
    let retry = dispatches(&acts);
    assert_eq!(
        retry.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![0]]
    );
    let acts = h.handled(ticket_of(&retry, 0), Ok(()));
    // 0 and 1 finished: the commit moves to 2, and a's second record starts.
    let first = vec![(TopicPartition::new("orders", 0), 2)];
    assert_eq!(commits(&acts), vec![first.clone()]);
    h.commit_ok(&first);
    let last = dispatches(&acts);
    assert_eq!(
        last.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![2]]
    );
    let acts = h.handled(ticket_of(&last, 2), Ok(()));
    assert_eq!(
        commits(&acts),
        vec![vec![(TopicPartition::new("orders", 0), 5)]]
    );
    assert_eq!(h.lanes.stats().succeeded, 5);
    assert_eq!(h.lanes.stats().retries, 1);
}

/// By key, the calls of one partition stay within the concurrency, and a key's records
/// of one delivery go to one call, in order, up to a batch.
#[test]
fn by_key_calls_stay_within_the_concurrency_and_batch_a_keys_records() {
    let mut h = Harness::new(LanesConfig {
        max_batch: 3,
        ..by(ProcessingOrder::Key, 2)
    });
    let (a, b, c) = (Some("a"), Some("b"), Some("c"));
    let acts = h.deliver_keys(0, &[a, a, b, a, c, a, a]);
    let calls = dispatches(&acts);
    // Two at once: a's first run (0, 1: a run of one key, not copied to make a batch of
    // three), then b.
    assert_eq!(
        calls.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![0, 1], vec![2]],
        "a run of one key is a call's records; the first delivery's runs are split at key changes"
    );
    // b finishes: c starts (a is still running).
    let acts = h.handled(ticket_of(&calls, 2), Ok(()));
    let next = dispatches(&acts);
    assert_eq!(
        next.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![4]]
    );
    // a finishes: its next records, 3, 5 and 6 (one batch of three).
    let acts = h.handled(ticket_of(&calls, 0), Ok(()));
    let more = dispatches(&acts);
    assert_eq!(
        more.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![3, 5, 6]]
    );
}

/// Records without a key keep no order under key ordering: each starts at once.
#[test]
fn by_key_records_without_a_key_run_at_once() {
    let mut h = Harness::new(by(ProcessingOrder::Key, 8));
    let acts = h.deliver_keys(0, &[None, None, None]);
    assert_eq!(dispatches(&acts).len(), 3, "{acts:?}");
}

/// Unordered: every record at once, within the concurrency; the commit waits for the
/// first record however many after it finished.
#[test]
fn unordered_records_run_at_once_and_the_commit_is_the_finished_prefix() {
    let mut h = Harness::new(by(ProcessingOrder::Unordered, 3));
    let acts = h.deliver_keys(0, &[Some("a"), Some("a"), Some("a"), Some("a")]);
    let calls = dispatches(&acts);
    assert_eq!(
        calls.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![0], vec![1], vec![2]],
        "records of one key at once, three by the concurrency"
    );
    let acts = h.handled(ticket_of(&calls, 2), Ok(()));
    h.none_past(&acts, 0);
    let four = dispatches(&acts);
    let acts = h.handled(ticket_of(&calls, 1), Ok(()));
    h.none_past(&acts, 0);
    let acts = h.handled(ticket_of(&four, 3), Ok(()));
    h.none_past(&acts, 0);
    let acts = h.handled(ticket_of(&calls, 0), Ok(()));
    assert_eq!(
        commits(&acts),
        vec![vec![(TopicPartition::new("orders", 0), 4)]]
    );
}

/// By key, a key halted by a failing dead-letter write holds only its records: the
/// others are handled, and nothing is committed past the halted record.
#[test]
fn by_key_a_halted_dead_letter_write_holds_only_its_key() {
    let mut h = Harness::new(by(ProcessingOrder::Key, 8));
    let (a, b) = (Some("a"), Some("b"));
    let acts = h.deliver_keys(0, &[a, b, a, b]);
    let calls = dispatches(&acts);
    let acts = h.handled(
        ticket_of(&calls, 0),
        Err(BatchError::at(0, ProcessError::permanent("Bad", "poison"))),
    );
    let (write, _) = produce_of(&acts);
    let acts = h.produced(write, Err("dlq down"));
    assert!(
        !paused(&acts),
        "a halted key pauses its partition: {acts:?}"
    );
    let acts = h.handled(ticket_of(&calls, 1), Ok(()));
    h.none_past(&acts, 0);
    let next = dispatches(&acts);
    assert_eq!(
        next.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![3]]
    );
    let acts = h.handled(ticket_of(&next, 3), Ok(()));
    h.none_past(&acts, 0);
    assert!(
        h.metrics
            .iter()
            .any(|m| matches!(m, Metric::Halted { partitions: 1 })),
        "{:?}",
        h.metrics
    );
    // The write goes through on its next try: record 0 finished, then a's 2.
    let acts = h.advance(HALT_BACKOFF.1);
    let (write, _) = produce_of(&acts);
    let acts = h.produced(write, Ok(()));
    let last = dispatches(&acts);
    assert_eq!(
        last.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![2]]
    );
    assert_eq!(
        commits(&acts),
        vec![vec![(TopicPartition::new("orders", 0), 2)]]
    );
}

/// By key, the partition is paused only when its buffer is full: a hot key retrying
/// fills it; its waiting records count.
#[test]
fn by_key_the_partition_pauses_when_its_buffer_is_full() {
    let mut h = Harness::new(LanesConfig {
        lane_buffer: 3,
        ..by(ProcessingOrder::Key, 8)
    });
    let a = Some("a");
    let acts = h.deliver_keys(0, &[a, a, a]);
    assert!(!paused(&acts), "two queued behind the first: {acts:?}");
    let acts = h.deliver_keys(3, &[a]);
    assert!(paused(&acts), "three queued: {acts:?}");
}

/// By key, a record that came while its key was busy reports how long it waited.
#[test]
fn by_key_a_record_behind_its_key_reports_its_wait() {
    let mut h = Harness::new(by(ProcessingOrder::Key, 8));
    let a = Some("a");
    let acts = h.deliver_keys(0, &[a]);
    let first = dispatches(&acts);
    h.deliver_keys(1, &[a]);
    h.now.at += Duration::from_millis(250);
    let acts = h.handled(ticket_of(&first, 0), Ok(()));
    assert_eq!(dispatches(&acts).len(), 1);
    let waits: Vec<_> = h
        .metrics
        .iter()
        .filter_map(|m| match m {
            Metric::KeyWait { waited } => Some(*waited),
            _ => None,
        })
        .collect();
    assert_eq!(waits, vec![Duration::from_millis(250)]);
}

/// By key, a revocation stops every key's call and releases the partition once all
/// have stopped, with the finished prefix.
#[test]
fn by_key_a_revocation_waits_for_every_keys_call() {
    let mut h = Harness::new(by(ProcessingOrder::Key, 8));
    let acts = h.deliver_keys(0, &[Some("a"), Some("b"), Some("c")]);
    let calls = dispatches(&acts);
    h.lanes.release(
        vec![TopicPartition::new("orders", 0)],
        Handover::Revoked { generation: 2 },
        Duration::from_secs(5),
        h.now,
    );
    let acts = h.actions();
    let cancels = acts
        .iter()
        .filter(|a| matches!(a, Action::Cancel(_)))
        .count();
    assert_eq!(cancels, 3, "{acts:?}");
    let acts = h.handled(ticket_of(&calls, 0), Ok(()));
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Release { .. })),
        "{acts:?}"
    );
    let acts = h.handled(ticket_of(&calls, 2), Ok(()));
    assert!(
        !acts.iter().any(|a| matches!(a, Action::Release { .. })),
        "{acts:?}"
    );
    let acts = h.handled(
        ticket_of(&calls, 1),
        Err(BatchError::at(0, ProcessError::cancelled())),
    );
    let released: Vec<_> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Release { offsets, .. } => Some(offsets.clone()),
            _ => None,
        })
        .collect();
    // 0 finished, 1 cancelled (its next owner handles it), 2 finished: commit 1.
    assert_eq!(released, vec![vec![(TopicPartition::new("orders", 0), 1)]]);
}

/// Unordered, a delivery is spread over as many calls as may run at once, however
/// large a batch may be (`run` hands a call up to 1,024 records in a row).
#[test]
fn unordered_spreads_a_delivery_over_the_concurrency() {
    let mut h = Harness::new(LanesConfig {
        max_batch: 1024,
        ..by(ProcessingOrder::Unordered, 4)
    });
    let acts = h.deliver_keys(0, &[None; 8]);
    let calls: Vec<_> = dispatches(&acts).into_iter().map(|(_, o)| o).collect();
    assert_eq!(calls, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]);
}

/// By key, record 0 retrying while 1,000 records after it finish: the commit stays at 0
/// and its metadata names the 1,000; the partition's next owner, given that metadata,
/// handles record 0 alone and commits past all of them once it finishes.
#[test]
fn the_records_finished_past_the_commit_are_not_handled_again_by_the_next_owner() {
    let mut keys: Vec<String> = vec!["slow".into()];
    keys.extend((1..=1000).map(|i| format!("k{}", i % 50)));
    let keys: Vec<Option<&str>> = keys.iter().map(|k| Some(k.as_str())).collect();
    let mut first = Harness::new(by(ProcessingOrder::Key, 64));
    let mut acts = first.deliver_keys(0, &keys);
    let mut committed = Vec::new();
    // Every call answers: record 0 fails (its retry waits 100 ms), the others succeed.
    loop {
        let calls = dispatches(&acts);
        for c in commits(&acts) {
            committed.extend(c.clone());
            first.commit_ok(&c);
        }
        if calls.is_empty() {
            break;
        }
        acts = Vec::new();
        for (t, offsets) in calls {
            let result = if offsets == [0] { transient() } else { Ok(()) };
            acts.extend(first.handled(t, result));
        }
    }
    assert_eq!(first.lanes.stats().succeeded, 1000);
    assert!(committed.iter().all(|(_, o)| *o == 0), "{committed:?}");
    // The member dies: its last commit is what the next owner reads.
    let last = committed.last().map(|(tp, o)| (tp.clone(), *o));
    let (tp, offset) = last.expect("a commit of 0 carrying the finished records");
    let metadata = first.lanes.commit_metadata(&[(tp.clone(), offset)]);
    let metadata = metadata.first().cloned().flatten().expect("metadata");
    assert!(metadata.len() < 4000, "{}", metadata.len());

    let mut next = Harness::new(by(ProcessingOrder::Key, 64));
    next.lanes.resume_from(tp.clone(), offset, &metadata);
    let acts = next.deliver_keys(0, &keys);
    next.none_past(&acts, 0);
    let calls = dispatches(&acts);
    assert_eq!(
        calls.iter().map(|(_, o)| o.clone()).collect::<Vec<_>>(),
        vec![vec![0]],
        "only the record its previous owner did not finish"
    );
    assert_eq!(next.lanes.stats().already_finished, 1000);
    let acts = next.handled(ticket_of(&calls, 0), Ok(()));
    assert_eq!(commits(&acts), vec![vec![(tp, 1001)]]);
    assert_eq!(next.lanes.stats().succeeded, 1);
}

/// Metadata that is not ours, or names nothing, skips nothing.
#[test]
fn foreign_metadata_skips_nothing() {
    let mut h = Harness::new(by(ProcessingOrder::Key, 8));
    h.lanes
        .resume_from(TopicPartition::new("orders", 0), 0, "app-checkpoint-7");
    let acts = h.deliver_keys(0, &[Some("a"), Some("b")]);
    assert_eq!(dispatches(&acts).len(), 2);
    assert_eq!(h.lanes.stats().already_finished, 0);
}
