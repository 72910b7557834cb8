//! What a chaos run saw, and the checks made on it as it happens.
//!
//! Every record carries a sequence number that does not depend on its partition. The
//! producer reports what it sent and where each record landed; the members' handlers
//! report every call and every success; the processors' metrics hooks report every
//! commit and every acknowledged dead-letter write; the tracing capture reports each
//! member's generation. From these the journal checks, online:
//!
//! - **commits never regress**: a partition's committed offset never goes down;
//! - **commits never pass an unfinished record**: every offset below a committed one
//!   was handled successfully or dead-lettered by someone;
//! - **one owner per generation**: no two member incarnations start handlers on one
//!   partition while tagged with the same generation (a member handles only what it
//!   owns, so this is the observable form of "no partition owned by two members in the
//!   same generation");
//! - **duplicates only above the committed offset**: a record handled again lies at
//!   or above the committed offset of the moment, that is inside the window of
//!   finished-but-uncommitted records that a new owner is allowed to redo;
//!
//! and, at the end, loss (every acknowledged sequence number handled successfully or
//! found in the dead-letter topic), the duplicates against the in-flight bound, and
//! the longest consumption gap of each partition.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Violation messages kept (all are counted).
const KEPT: usize = 200;

/// The invariants checked; each failure is counted under one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// A partition's committed offset went down (metrics hook or broker read).
    Regression,
    /// A commit passed a record that no one had finished.
    UnfinishedCommit,
    /// Two members handled one partition in the same generation.
    DoubleOwner,
    /// A finished record was handled again below the committed offset of the moment.
    BelowCommit,
    /// A record did not hold what was written at its offset.
    Content,
    /// A dead-letter write was reported acknowledged, but the record is not in the
    /// dead-letter topic.
    DlqMissing,
    /// A member stopped without being asked, or did not stop when asked.
    Member,
    /// The committed offsets did not reach the log end in time after the faults.
    Drain,
    /// A finished record waited longer than [`COMMIT_WAIT_BOUND`] after its last
    /// finish for a commit past it: commits stalled while records were finished.
    CommitWait,
    /// Under key ordering, a member ran two calls of one key at once, or started a
    /// key's record before an earlier one it had started (both within one hold of the
    /// partition: a new assignment starts over from the committed offset).
    KeyOrder,
    /// A member began work on a partition it did not hold: after it had given the
    /// partition back (revoked or lost), or before it was assigned it. The application
    /// keeps handling after losing its partitions.
    AfterRelease,
}

/// How long a record may wait, from the last time it was finished, for a commit past
/// it. Healthy 10-minute runs wait up to 29 s (consumer protocol, seed 103637054) and
/// 42 s (classic, seed 807315977): faults hold a coordinator away for 10-15 s, a
/// rebalance follows, and a partition whose owner lost it is finished again by the
/// next one. A Processor that stopped committing (issue 32: 140 s, the lanes waiting
/// for an answer they never got) is far above it.
pub const COMMIT_WAIT_BOUND: f64 = 90.0;

impl Check {
    /// Every check, in report order.
    pub const ALL: [Check; 11] = [
        Check::Regression,
        Check::UnfinishedCommit,
        Check::DoubleOwner,
        Check::BelowCommit,
        Check::Content,
        Check::DlqMissing,
        Check::Member,
        Check::Drain,
        Check::CommitWait,
        Check::KeyOrder,
        Check::AfterRelease,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Check::Regression => "regressions",
            Check::UnfinishedCommit => "unfinished_commits",
            Check::DoubleOwner => "double_owners",
            Check::BelowCommit => "redone_below_commit",
            Check::Content => "content",
            Check::DlqMissing => "dlq_missing",
            Check::Member => "member_failures",
            Check::Drain => "drain",
            Check::CommitWait => "commit_waits",
            Check::KeyOrder => "key_order",
            Check::AfterRelease => "handled_after_release",
        }
    }
}

/// The run's record of events. Shared by the producer, the members, the capture layer
/// and the scheduler.
#[derive(Debug)]
pub struct Journal {
    start: Instant,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sent: u64,
    acked: HashMap<u64, Ack>,
    produce_failures: u64,
    produce_errors: BTreeMap<String, u64>,
    offsets: HashMap<(i32, i64), OffsetRecord>,
    attempts: HashMap<u64, u32>,
    partitions: BTreeMap<i32, Partition>,
    incarnations: Vec<Incarnation>,
    generations: BTreeSet<i32>,
    /// `(partition, generation)` -> the first handler start tagged with it.
    owners: HashMap<(i32, i32), Start>,
    counts: Counts,
    member_log: BTreeMap<String, u64>,
    faults: Vec<(f64, String)>,
    notes: Vec<String>,
    violations: Vec<String>,
    checks: BTreeMap<Check, u64>,
    /// Partition -> the incarnations its last assignments went to and have not taken
    /// back (from the metrics hooks), with when and in which generation.
    holders: BTreeMap<i32, BTreeMap<usize, (f64, i32)>>,
    /// The broker assigns (the consumer protocol, KIP-848): a partition granted to one
    /// member while another still holds it is the broker's doing ([`EarlyGrant`]).
    broker_assigns: bool,
    /// `(partition, incarnation)` -> when the group last asked it for the partition back.
    revoke_asked: HashMap<(i32, usize), f64>,
    /// Grants of a partition to one incarnation while another still held it and had not
    /// been asked for it.
    early_grants: Vec<EarlyGrant>,
    /// Finished records handled again below a commit of an incarnation that held the
    /// partition when this one was granted it: decided in [`Journal::analyse`], when
    /// it is known whether the broker asked the holder for it only afterwards.
    deferred: Vec<Deferred>,
    /// Deferred redos the broker's early grant explained.
    redone_after_early_grant: u64,
    /// [`COMMIT_WAIT_BOUND`] unless a test sets another.
    commit_wait_bound: Option<f64>,
    /// Under key ordering, `(incarnation, partition, key)` -> whether a call on the key
    /// runs, and the highest offset of the key started since the partition was assigned.
    keys: HashMap<(usize, i32, Vec<u8>), (bool, i64)>,
    /// Incarnations that reported an assignment: from then on, work begun on a
    /// partition they do not hold is a [`Check::AfterRelease`].
    ever_assigned: BTreeSet<usize>,
    /// Partition -> when it was last given back by each incarnation.
    released_at: HashMap<(i32, usize), f64>,
    /// `(partition, incarnation)` whose last release was a loss (not a revocation).
    lost: BTreeSet<(i32, usize)>,
    /// Handler starts on a partition after its member reported it lost.
    after_loss: u64,
    /// `(partition, incarnation)` -> since when another live incarnation began work on
    /// the partition while this one still ran some: the handover's overlap, measured
    /// until this one's work there ends.
    overlap_since: HashMap<(i32, usize), f64>,
    /// The longest such overlap: partition, seconds.
    longest_overlap: Option<(i32, f64)>,
    /// `(partition, offset)` -> who finished it and when (for [`Journal::history`]).
    finishers: HashMap<(i32, i64), Vec<(usize, f64)>>,
    /// Commits read back from the broker are checked against the finished records too
    /// (a `Consumer` loop's commits reach the journal only that way, or when the loop
    /// shows its commit events).
    check_broker_commits: bool,
}

/// A partition granted to `new` at `at` while `old` still held it, `old` not asked to
/// give it back since it got it. `confirmed`: the group asked `old` for it afterwards,
/// so the broker still counted `old` as its owner when it granted it to `new`; two
/// members owned it at once by the broker's own record. The librdkafka mock does this
/// in a consumer-protocol group: it forgets a member's partitions when that member's
/// connection closes (`rd_kafka_mock_cgrps_consumer_connection_closed` clears its
/// current and returned assignment), and gives them to whoever heartbeats first.
#[derive(Debug, Clone)]
struct EarlyGrant {
    partition: i32,
    new: usize,
    old: usize,
    at: f64,
    confirmed: Option<f64>,
}

/// A [`Check::BelowCommit`] candidate waiting for [`Journal::analyse`].
#[derive(Debug, Clone)]
struct Deferred {
    partition: i32,
    inc: usize,
    by: usize,
    message: String,
}

#[derive(Debug, Clone, Copy)]
struct Ack {
    partition: i32,
    offset: i64,
    at: f64,
}

#[derive(Debug, Default)]
struct OffsetRecord {
    seq: Option<u64>,
    ok: u32,
    dead_lettered: u32,
    /// When it was first finished (handled or dead-lettered).
    done_at: Option<f64>,
    /// When it was last finished.
    last_done_at: Option<f64>,
}

impl OffsetRecord {
    fn finished(&self) -> bool {
        self.ok + self.dead_lettered > 0
    }
}

#[derive(Debug, Default)]
struct Partition {
    /// The last handler start here: incarnation, offset, when.
    last_handled: Option<(usize, i64, f64)>,
    /// Handler starts per second of the run.
    starts_per_second: Vec<u32>,
    /// The highest committed offset reported by a metrics hook, by whom, when.
    committed: Option<(i64, usize, f64)>,
    /// The generation (or epoch) its committer was in when the hook reported it: a
    /// regression across generations may be the hooks' order, not the broker's.
    committed_generation: Option<i32>,
    commits: u64,
    /// Every offset below this one is finished.
    finished_below: i64,
    max_finished: i64,
    /// Handler calls running, by incarnation.
    running: BTreeMap<usize, u32>,
    /// Each incarnation's last handler start here: offset, and whether it redid a
    /// finished record.
    last_start: HashMap<usize, (i64, bool)>,
    /// Every commit the hooks reported: when, the offset, and by which incarnation.
    commit_log: Vec<(f64, i64, usize)>,
    /// The last committed offset read back from the broker.
    polled: Option<i64>,
    polls: u64,
}

#[derive(Debug, Clone, Copy)]
struct Start {
    incarnation: usize,
    offset: i64,
    at: f64,
}

#[derive(Debug, Clone)]
struct Incarnation {
    name: String,
    generation: Option<i32>,
    /// Asked to stop without closing (kill or crash): its late handler results do not
    /// count as live ownership.
    stopping: bool,
    ended: Option<(f64, String)>,
}

#[derive(Debug, Default, Clone)]
struct Counts {
    handler_calls: u64,
    transient: u64,
    permanent: u64,
    cancelled: u64,
    retries: u64,
    halted: u64,
    duplicates: u64,
    episodes: u64,
    in_flight_bound: u64,
    overlaps: u64,
    untagged: u64,
    poll_failures: u64,
    unexpected_ends: u64,
}

/// A snapshot for progress lines and the drain.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Sequence numbers sent.
    pub sent: u64,
    /// Acknowledged by the broker.
    pub acked: u64,
    /// Distinct offsets finished.
    pub finished: u64,
    /// Records acknowledged but not yet below a committed offset.
    pub uncommitted: i64,
    /// Whether every partition's committed offset reached its last acknowledged
    /// record.
    pub drained: bool,
    /// Distinct generations seen.
    pub generations: usize,
}

/// The checks' results at the end of a run.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    /// Sequence numbers sent.
    pub sent: u64,
    /// Acknowledged by the broker.
    pub produced: u64,
    /// Sends that failed (the record may or may not be in the log).
    pub produce_failures: u64,
    /// Why they failed, by error.
    pub produce_errors: BTreeMap<String, u64>,
    /// Distinct sequence numbers handled successfully.
    pub handled: u64,
    /// Distinct sequence numbers dead-lettered (acknowledged write).
    pub dead_lettered: u64,
    /// Acknowledged sequence numbers neither handled nor in the dead-letter topic.
    pub lost: u64,
    /// Up to 20 of them, described.
    pub lost_examples: Vec<String>,
    /// Finishes (success or dead letter) of an offset beyond its first.
    pub duplicates: u64,
    /// Handover episodes (a member redoing finished records).
    pub episodes: u64,
    /// Records finished but not committed when each episode began, summed.
    pub in_flight_bound: u64,
    /// Handler calls.
    pub handler_calls: u64,
    /// Injected handler failures: transient, permanent; and calls that stopped on
    /// cancellation.
    pub transient: u64,
    /// See `transient`.
    pub permanent: u64,
    /// See `transient`.
    pub cancelled: u64,
    /// Retries the processors scheduled.
    pub retries: u64,
    /// Commits reported by the metrics hooks (one per partition and commit).
    pub commits: u64,
    /// Committed offsets read back from the broker, and failed reads.
    pub polls: u64,
    /// See `polls`.
    pub poll_failures: u64,
    /// Distinct generations seen; 0 when the capture saw none.
    pub generations: usize,
    /// Handler starts with no generation known (the capture saw no sync yet).
    pub untagged: u64,
    /// Handler calls of one partition running in two live incarnations at once.
    pub overlaps: u64,
    /// Incarnations started.
    pub incarnations: usize,
    /// Incarnations that ended without being asked to.
    pub unexpected_ends: u64,
    /// Longest consumption gap per partition, and when it began (seconds into the run).
    pub gaps: BTreeMap<i32, (Duration, f64)>,
    /// Counts of interesting member log events.
    pub member_log: BTreeMap<String, u64>,
    /// Faults applied, with their times.
    pub faults: Vec<(f64, String)>,
    /// Observations that are not failures.
    pub notes: Vec<String>,
    /// Failed checks (up to 200 kept).
    pub violations: Vec<String>,
    /// How many failures, by check (every check listed).
    pub checks: BTreeMap<Check, u64>,
    /// All failures.
    pub violation_count: u64,
    /// Partitions the broker granted to one member while it still counted another as
    /// their owner (it asked that one for them only afterwards): the librdkafka mock
    /// does this when a connection closes.
    pub early_grants: u64,
    /// Finished records handled again below a commit that the previous owner made
    /// after the broker had granted the partition anew: the broker's double grant, not
    /// a client's error.
    pub redone_after_early_grant: u64,
    /// The longest wait from a record's last finish to a commit past it: the
    /// partition, and the seconds ([`Check::CommitWait`]).
    pub longest_commit_wait: Option<(i32, f64)>,
    /// Handler starts on a partition after its member reported it lost (noted, not a
    /// violation; see [`Journal::lost`]).
    pub after_loss: u64,
    /// The handover window, measured: the longest time one partition's work ran in two
    /// live members at once (partition, seconds); `None` when it never did.
    pub longest_overlap: Option<(i32, f64)>,
}

impl Journal {
    /// An empty journal; times are counted from now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The broker assigns the partitions (the consumer protocol): a record redone below
    /// a commit its previous owner made after the broker had already granted the
    /// partition to the redoing member, and asked the previous owner for it only then,
    /// is counted as the broker's double grant ([`Analysis::redone_after_early_grant`])
    /// rather than as a [`Check::BelowCommit`]. Under the classic protocol a member
    /// (ottla's own leader) assigns, and every such redo stays a violation.
    pub fn set_broker_assigns(&self, yes: bool) {
        self.lock().broker_assigns = yes;
    }

    /// Checks the committed offsets read back from the broker against the finished
    /// records as well ([`Check::UnfinishedCommit`]).
    pub fn set_check_broker_commits(&self, yes: bool) {
        self.lock().check_broker_commits = yes;
    }

    /// `inc`'s whole assignment is now `partitions`: it no longer holds any other.
    pub fn retain_held(&self, inc: usize, partitions: &[i32]) {
        let at = self.now();
        let mut j = self.lock();
        let mut gone = Vec::new();
        for (p, h) in j.holders.iter_mut() {
            if !partitions.contains(p) && h.remove(&inc).is_some() {
                gone.push(*p);
            }
        }
        for p in gone {
            j.released_at.insert((p, inc), at);
        }
    }

    /// Another bound for [`Check::CommitWait`], in seconds (tests).
    pub fn set_commit_wait_bound(&self, seconds: f64) {
        self.lock().commit_wait_bound = Some(seconds);
    }

    /// Seconds since the start.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- producer ----

    /// Sequence number `seq` was handed to the producer.
    pub fn sent(&self, _seq: u64) {
        self.lock().sent += 1;
    }

    /// `seq` was acknowledged at `partition`/`offset`.
    pub fn acked(&self, seq: u64, partition: i32, offset: i64) {
        let at = self.now();
        self.lock().acked.insert(
            seq,
            Ack {
                partition,
                offset,
                at,
            },
        );
    }

    /// The send of `seq` failed.
    pub fn produce_failed(&self, _seq: u64, error: String) {
        let mut j = self.lock();
        j.produce_failures += 1;
        *j.produce_errors.entry(error).or_default() += 1;
    }

    // ---- members ----

    /// A new incarnation of a member slot; returns its number.
    pub fn incarnation_started(&self, name: String) -> usize {
        let mut j = self.lock();
        j.incarnations.push(Incarnation {
            name,
            generation: None,
            stopping: false,
            ended: None,
        });
        j.incarnations.len() - 1
    }

    /// `inc` was told to stop without closing.
    pub fn incarnation_stopping(&self, inc: usize) {
        if let Some(i) = self.lock().incarnations.get_mut(inc) {
            i.stopping = true;
        }
    }

    /// `inc` ended; `expected` is false when nobody asked it to.
    pub fn incarnation_ended(&self, inc: usize, how: String, expected: bool) {
        let at = self.now();
        let mut j = self.lock();
        let name = j.name(inc);
        if !expected {
            j.counts.unexpected_ends += 1;
            j.violation(
                Check::Member,
                format!("t={at:.1}s: member {name} stopped without being asked to: {how}"),
            );
        }
        if let Some(i) = j.incarnations.get_mut(inc) {
            i.ended = Some((at, how));
        }
    }

    /// Whether `inc` has ended.
    pub fn has_ended(&self, inc: usize) -> bool {
        self.lock()
            .incarnations
            .get(inc)
            .is_some_and(|i| i.ended.is_some())
    }

    /// How `inc` ended, if it did.
    pub fn end_of(&self, inc: usize) -> Option<String> {
        self.lock()
            .incarnations
            .get(inc)
            .and_then(|i| i.ended.as_ref().map(|e| e.1.clone()))
    }

    /// The member thread of `inc` logged `message` (the capture layer's report);
    /// `generation` when it was a sync.
    pub fn member_log(&self, inc: usize, message: String, generation: Option<i32>) {
        let mut j = self.lock();
        *j.member_log.entry(message).or_default() += 1;
        if let Some(g) = generation {
            j.generations.insert(g);
            if let Some(i) = j.incarnations.get_mut(inc) {
                i.generation = Some(g);
            }
        }
    }

    /// The metrics hook of `inc` reported `partitions` assigned in `generation`.
    pub fn assigned(&self, inc: usize, partitions: &[i32], generation: i32) {
        let at = self.now();
        let mut j = self.lock();
        j.ever_assigned.insert(inc);
        for p in partitions {
            // Another live incarnation still holds it and was not asked for it since it
            // got it: granted early, unless that one is asked for it later
            // (`revoke_requested`) it was a loss the hooks report late.
            let held: Vec<usize> = j
                .holders
                .get(p)
                .into_iter()
                .flatten()
                .filter(|(h, (since, _))| {
                    **h != inc
                        && j.incarnations.get(**h).is_some_and(|i| i.ended.is_none())
                        && j.revoke_asked
                            .get(&(*p, **h))
                            .is_none_or(|asked| asked < since)
                })
                .map(|(h, _)| *h)
                .collect();
            for old in held {
                j.early_grants.push(EarlyGrant {
                    partition: *p,
                    new: inc,
                    old,
                    at,
                    confirmed: None,
                });
            }
            // Under the classic protocol the group gives a partition on only once its
            // holder has revoked it: a holder that was asked for it has given it back,
            // whether or not the revocation reached the journal (a closing Processor
            // reports no `Metric::Revoked`; a `Consumer` loop may not show it). One that
            // was not asked (expelled unawares) keeps its claim, as before.
            if !j.broker_assigns {
                let given_back: Vec<usize> = j
                    .holders
                    .get(p)
                    .into_iter()
                    .flatten()
                    .filter(|(h, (since, _))| {
                        **h != inc
                            && j.revoke_asked
                                .get(&(*p, **h))
                                .is_some_and(|asked| asked >= since)
                    })
                    .map(|(h, _)| *h)
                    .collect();
                for h in given_back {
                    if let Some(held) = j.holders.get_mut(p) {
                        held.remove(&h);
                    }
                    j.lost.remove(&(*p, h));
                    j.released_at.insert((*p, h), at);
                }
            }
            j.holders
                .entry(*p)
                .or_default()
                .insert(inc, (at, generation));
            // A new hold reads from the committed offset: a key's records start over.
            j.keys.retain(|(i, part, _), _| !(*i == inc && part == p));
        }
    }

    /// Under key ordering, `inc` starts a call on `partition`@`offset` of `key`.
    pub fn key_started(&self, inc: usize, partition: i32, offset: i64, key: &[u8]) {
        let at = self.now();
        let mut j = self.lock();
        let (running, last) = j
            .keys
            .insert((inc, partition, key.to_vec()), (true, offset))
            .unwrap_or((false, offset));
        let shown = String::from_utf8_lossy(key).into_owned();
        let name = j.name(inc);
        if running {
            j.violation(
                Check::KeyOrder,
                format!("t={at:.1}s: {name} started {partition}@{offset} while a call on its key {shown} ran"),
            );
        }
        if offset < last {
            j.violation(
                Check::KeyOrder,
                format!("t={at:.1}s: {name} started {partition}@{offset} of key {shown} after {partition}@{last}"),
            );
            if let Some(k) = j.keys.get_mut(&(inc, partition, key.to_vec())) {
                k.1 = last;
            }
        }
    }

    /// Under key ordering, `inc`'s call on `key` of `partition` ended (any way).
    pub fn key_finished(&self, inc: usize, partition: i32, key: &[u8]) {
        let mut j = self.lock();
        if let Some(k) = j.keys.get_mut(&(inc, partition, key.to_vec())) {
            k.0 = false;
        }
    }

    /// The group asked `inc` for `partitions` back (the Processor's
    /// `Metric::RevokeRequested`).
    pub fn revoke_requested(&self, inc: usize, partitions: &[i32]) {
        let at = self.now();
        let mut j = self.lock();
        for p in partitions {
            j.revoke_asked.insert((*p, inc), at);
            for g in j.early_grants.iter_mut() {
                if g.partition == *p && g.old == inc && g.confirmed.is_none() {
                    g.confirmed = Some(at);
                }
            }
        }
    }

    /// The metrics hook of `inc` reported `partitions` lost (the member learnt that
    /// the group had taken them; no revocation). Work begun on one afterwards is counted
    /// and noted ([`Analysis::after_loss`]), not a [`Check::AfterRelease`]: a Processor
    /// may still start a record it had taken for a lane before it learnt of the loss.
    pub fn lost(&self, inc: usize, partitions: &[i32]) {
        self.released(inc, partitions);
        let mut j = self.lock();
        for p in partitions {
            j.lost.insert((*p, inc));
        }
    }

    /// The metrics hook of `inc` reported `partitions` revoked.
    pub fn released(&self, inc: usize, partitions: &[i32]) {
        let at = self.now();
        let mut j = self.lock();
        for p in partitions {
            j.lost.remove(&(*p, inc));
            j.released_at.insert((*p, inc), at);
            if let Some(h) = j.holders.get_mut(p) {
                h.remove(&inc);
            }
        }
    }

    /// A handler call of `inc` begins on `partition`/`offset`, holding `seq`. Returns
    /// the attempt number of `seq` (1 for its first call anywhere).
    pub fn handler_started(&self, inc: usize, partition: i32, offset: i64, seq: u64) -> u32 {
        let at = self.now();
        let mut j = self.lock();
        j.counts.handler_calls += 1;
        let attempt = {
            let a = j.attempts.entry(seq).or_default();
            *a += 1;
            *a
        };
        let (known_seq, finished) = {
            let r = j.offsets.entry((partition, offset)).or_default();
            (r.seq.replace(seq), r.finished())
        };
        if let Some(k) = known_seq.filter(|k| *k != seq) {
            let name = j.name(inc);
            j.violation(Check::Content, format!(
                "t={at:.1}s: {name} read seq {seq} at {partition}@{offset}, where seq {k} was read before"
            ));
        }
        // One owner per generation.
        let generation = j.incarnations.get(inc).and_then(|i| i.generation);
        match generation {
            None => j.counts.untagged += 1,
            Some(g) => {
                let first = *j.owners.entry((partition, g)).or_insert(Start {
                    incarnation: inc,
                    offset,
                    at,
                });
                if first.incarnation != inc {
                    let (a, b) = (j.name(first.incarnation), j.name(inc));
                    j.violation(Check::DoubleOwner, format!(
                        "partition {partition} handled by two members in generation {g}: {a} at offset {} (t={:.1}s) and {b} at offset {offset} (t={at:.1}s)",
                        first.offset, first.at
                    ));
                }
            }
        }
        // Two live incarnations running handlers of one partition at once.
        let others: Vec<usize> = j
            .partitions
            .get(&partition)
            .map(|p| {
                p.running
                    .iter()
                    .filter(|(i, n)| **i != inc && **n > 0)
                    .map(|(i, _)| *i)
                    .collect()
            })
            .unwrap_or_default();
        let live_others: Vec<usize> = others
            .into_iter()
            .filter(|o| {
                j.incarnations
                    .get(*o)
                    .is_some_and(|i| !i.stopping && i.ended.is_none())
            })
            .collect();
        for o in &live_others {
            j.overlap_since.entry((partition, *o)).or_insert(at);
        }
        // Work on a partition this member does not hold (it reported assignments, so
        // it would have reported this one).
        let live = j
            .incarnations
            .get(inc)
            .is_some_and(|i| !i.stopping && i.ended.is_none());
        let holds = j
            .holders
            .get(&partition)
            .is_some_and(|h| h.contains_key(&inc));
        if live && j.ever_assigned.contains(&inc) && !holds {
            let name = j.name(inc);
            if j.lost.contains(&(partition, inc)) {
                j.after_loss += 1;
                let since = j.released_at.get(&(partition, inc)).copied().unwrap_or(0.0);
                if j.notes.len() < 50 {
                    j.notes.push(format!(
                        "t={at:.1}s: {name} began {partition}@{offset} after it reported the partition lost at t={since:.1}s"
                    ));
                }
            } else {
                let since = match j.released_at.get(&(partition, inc)) {
                    Some(t) => format!("it gave the partition back at t={t:.1}s"),
                    None => "it was never assigned the partition".into(),
                };
                j.violation(
                    Check::AfterRelease,
                    format!("t={at:.1}s: {name} began {partition}@{offset}, but {since}"),
                );
            }
        }
        if !live_others.is_empty() {
            j.counts.overlaps += 1;
            if j.notes.len() < 50 {
                let names: Vec<String> = live_others
                    .iter()
                    .map(|o| {
                        let g = j.incarnations.get(*o).and_then(|i| i.generation);
                        format!("{} (generation {g:?})", j.name(*o))
                    })
                    .collect();
                let name = j.name(inc);
                j.notes.push(format!(
                    "t={at:.1}s: {name} (generation {generation:?}) started {partition}@{offset} while {} still ran a handler of that partition",
                    names.join(", ")
                ));
            }
        }
        let name = j.name(inc);
        let p = j.partitions.entry(partition).or_default();
        *p.running.entry(inc).or_default() += 1;
        let committed = p.committed;
        let max_finished = p.max_finished;
        let previous = p.last_start.insert(inc, (offset, finished));
        p.last_handled = Some((inc, offset, at));
        let second = at as usize;
        if p.starts_per_second.len() <= second {
            p.starts_per_second.resize(second + 1, 0);
        }
        p.starts_per_second[second] += 1;
        let mut violation = None;
        if finished {
            // A finished record is handled again: a new episode begins when this
            // incarnation was not already redoing records further back.
            let new_episode = match previous {
                None => true,
                Some((before, redoing)) => !redoing || before >= offset,
            };
            let base = committed.map_or(0, |c| c.0);
            if new_episode {
                j.counts.episodes += 1;
                j.counts.in_flight_bound += (max_finished + 1 - base).max(0) as u64;
            }
            if let Some((c, by, when)) = committed.filter(|c| offset < c.0) {
                let by_name = j.name(by);
                let message = format!(
                    "t={at:.1}s: {name} handled {partition}@{offset} again, below the committed offset {c} ({by_name} committed it at t={when:.1}s)"
                );
                // Below a commit of the member that held the partition when the broker
                // granted it to this one: decided at the end, once it is known whether
                // the broker asked that member for it only afterwards.
                let early = j.broker_assigns
                    && by != inc
                    && j.early_grants
                        .iter()
                        .any(|g| g.partition == partition && g.new == inc && g.old == by);
                if early {
                    j.deferred.push(Deferred {
                        partition,
                        inc,
                        by,
                        message,
                    });
                } else {
                    violation = Some(message);
                }
            }
        }
        if let Some(v) = violation {
            j.violation(Check::BelowCommit, v);
        }
        attempt
    }

    /// The handler call of `inc` on `partition` ended (any way).
    pub fn handler_finished(&self, inc: usize, partition: i32) {
        let now = self.now();
        let mut j = self.lock();
        let mut ended = false;
        // No let chains: the kit builds with Rust 1.85.
        if let Some(p) = j.partitions.get_mut(&partition) {
            if let Some(n) = p.running.get_mut(&inc) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    p.running.remove(&inc);
                    ended = true;
                }
            }
        }
        let overlap = if ended {
            j.overlap_since.remove(&(partition, inc))
        } else {
            None
        };
        if let Some(since) = overlap {
            let d = now - since;
            if j.longest_overlap.is_none_or(|(_, l)| d > l) {
                j.longest_overlap = Some((partition, d));
            }
        }
    }

    /// The handler of `inc` succeeded on `partition`/`offset`.
    pub fn handled(&self, inc: usize, partition: i32, offset: i64) {
        let at = self.now();
        let mut j = self.lock();
        j.finish(partition, offset, at, false);
        j.finishers
            .entry((partition, offset))
            .or_default()
            .push((inc, at));
    }

    /// What happened to input `seq`, for a report that found it twice (or not at
    /// all): where it was written, who finished it when, and the commits of its
    /// partition around those times, with who made them.
    pub fn history(&self, seq: u64) -> String {
        let j = self.lock();
        let Some(ack) = j.acked.get(&seq) else {
            return "never acknowledged".into();
        };
        let (partition, offset) = (ack.partition, ack.offset);
        let finishers = j.finishers.get(&(partition, offset));
        let finished: Vec<String> = finishers
            .into_iter()
            .flatten()
            .map(|(inc, at)| format!("{} at t={at:.2}s", j.name(*inc)))
            .collect();
        // The commits from just before its first finish through a while after its last.
        let from = finishers
            .and_then(|f| f.first())
            .map_or(0.0, |(_, at)| at - 1.0);
        let to = finishers
            .and_then(|f| f.last())
            .map_or(f64::MAX, |(_, at)| at + 5.0);
        let commits: Vec<String> = j
            .partitions
            .get(&partition)
            .into_iter()
            .flat_map(|p| &p.commit_log)
            .filter(|(at, _, _)| (from..=to).contains(at))
            .map(|(at, o, inc)| format!("{o} by {} at t={at:.2}s", j.name(*inc)))
            .take(12)
            .collect();
        let faults: Vec<String> = j
            .faults
            .iter()
            .filter(|(at, _)| (from - 4.0..=to).contains(at))
            .map(|(at, what)| format!("{at:.1}s {what}"))
            .collect();
        format!(
            "{partition}@{offset}; finished by {}; commits of {partition}: {}; faults: {}",
            if finished.is_empty() {
                "nobody".into()
            } else {
                finished.join(", ")
            },
            if commits.is_empty() {
                "none".into()
            } else {
                commits.join(", ")
            },
            if faults.is_empty() {
                "none".into()
            } else {
                faults.join("; ")
            },
        )
    }

    /// The handler failed on purpose: `permanent` or transient.
    pub fn handler_failed(&self, permanent: bool) {
        let mut j = self.lock();
        if permanent {
            j.counts.permanent += 1;
        } else {
            j.counts.transient += 1;
        }
    }

    /// A slow handler stopped because its partition was being revoked.
    pub fn handler_cancelled(&self) {
        self.lock().counts.cancelled += 1;
    }

    /// A processor scheduled a retry.
    pub fn retried(&self) {
        self.lock().counts.retries += 1;
    }

    /// A processor reported halted partitions (dead-letter writes failing).
    pub fn halted(&self) {
        self.lock().counts.halted += 1;
    }

    /// The metrics hook of `inc` reported the dead-letter write of
    /// `partition`/`offset` acknowledged.
    pub fn dead_lettered(&self, _inc: usize, partition: i32, offset: i64) {
        let at = self.now();
        let mut j = self.lock();
        j.finish(partition, offset, at, true);
    }

    /// The metrics hook of `inc` reported `offset` committed for `partition`.
    pub fn committed(&self, inc: usize, partition: i32, offset: i64) {
        let at = self.now();
        let mut j = self.lock();
        let name = j.name(inc);
        let generation = j.incarnations.get(inc).and_then(|i| i.generation);
        let mut found = Vec::new();
        {
            let Inner {
                partitions,
                offsets,
                ..
            } = &mut *j;
            let p = partitions.entry(partition).or_default();
            p.commits += 1;
            p.commit_log.push((at, offset, inc));
            if let Some((last, by, when)) = p.committed
                && offset < last
            {
                let then = p.committed_generation;
                let message = format!(
                    "t={at:.1}s: committed offset of partition {partition} went back from {last} to {offset} ({name} in generation {generation:?}; {last} was committed at t={when:.1}s in generation {then:?} by "
                );
                // The hooks report a commit when its answer is read, not when the broker
                // took it. A commit made in an older generation (or member epoch) than
                // the one that committed higher was taken while its committer still
                // held that generation: the broker refuses a commit from a generation
                // (epoch) that is no longer the member's, and the partition moves on
                // only with a new one. So it was taken before the higher commit, and
                // its answer came late (a silent broker holds answers back, not
                // requests: seed 487768142). The broker reads check the order the
                // broker saw. The same generation, or a newer one, is a regression.
                let late = matches!((generation, then), (Some(g), Some(t)) if g < t);
                let check = (!late).then_some(Check::Regression);
                found.push((check, message, Some(by)));
            }
            while p.finished_below < offset
                && offsets
                    .get(&(partition, p.finished_below))
                    .is_some_and(OffsetRecord::finished)
            {
                p.finished_below += 1;
            }
            if p.finished_below < offset {
                found.push((
                    Some(Check::UnfinishedCommit),
                    format!(
                        "t={at:.1}s: {name} committed {partition}@{offset} while offset {} was not finished",
                        p.finished_below
                    ),
                    None,
                ));
            }
            if p.committed.is_none_or(|c| offset >= c.0) {
                p.committed = Some((offset, inc, at));
                p.committed_generation = generation;
            }
        }
        for (check, message, by) in found {
            let message = match by {
                Some(by) => format!("{message}{})", j.name(by)),
                None => message,
            };
            match check {
                Some(check) => j.violation(check, message),
                None => j
                    .notes
                    .push(format!("late commit answer, not a regression: {message}")),
            }
        }
    }

    /// The committed offset of `partition` read back from the broker.
    pub fn polled(&self, partition: i32, offset: i64) {
        let at = self.now();
        let mut j = self.lock();
        let p = j.partitions.entry(partition).or_default();
        p.polls += 1;
        let before = p.polled.replace(offset.max(p.polled.unwrap_or(offset)));
        if let Some(b) = before.filter(|b| offset < *b) {
            j.violation(Check::Regression, format!(
                "t={at:.1}s: the broker's committed offset of partition {partition} went back from {b} to {offset}"
            ));
        }
        if j.check_broker_commits && before.is_none_or(|b| offset > b) {
            let Inner {
                partitions,
                offsets,
                ..
            } = &mut *j;
            let p = partitions.entry(partition).or_default();
            while p.finished_below < offset
                && offsets
                    .get(&(partition, p.finished_below))
                    .is_some_and(OffsetRecord::finished)
            {
                p.finished_below += 1;
            }
            if p.finished_below < offset {
                let unfinished = p.finished_below;
                j.violation(
                    Check::UnfinishedCommit,
                    format!(
                        "t={at:.1}s: the broker's committed offset of partition {partition} is {offset} while offset {unfinished} was not finished"
                    ),
                );
            }
        }
    }

    /// A read of the committed offsets failed.
    pub fn poll_failed(&self) {
        self.lock().counts.poll_failures += 1;
    }

    /// A fault was applied.
    pub fn fault(&self, what: String) {
        let at = self.now();
        self.lock().faults.push((at, what));
    }

    /// A check failed outside the journal's own checks.
    pub fn violation(&self, check: Check, message: String) {
        self.lock().violation(check, message);
    }

    /// An observation worth printing that is not a failure.
    pub fn note(&self, message: String) {
        let mut j = self.lock();
        if j.notes.len() < 100 {
            j.notes.push(message);
        }
    }

    /// Per partition, the offset after the last acknowledged record: what the
    /// committed offsets must reach.
    /// The sequence numbers the broker acknowledged.
    pub fn produced_seqs(&self) -> BTreeSet<u64> {
        self.lock().acked.keys().copied().collect()
    }

    /// The last offset + 1 the broker acknowledged on each partition.
    pub fn targets(&self) -> BTreeMap<i32, i64> {
        let j = self.lock();
        let mut out = BTreeMap::new();
        for a in j.acked.values() {
            let t = out.entry(a.partition).or_insert(0);
            *t = (*t).max(a.offset + 1);
        }
        out
    }

    /// The partitions whose committed offset is short of `targets`, described.
    pub fn behind(&self, targets: &BTreeMap<i32, i64>) -> Vec<String> {
        let j = self.lock();
        let mut out = Vec::new();
        for (p, t) in targets {
            let state = j.partitions.get(p);
            let c = state.and_then(|s| s.committed);
            if c.is_some_and(|c| c.0 >= *t) {
                continue;
            }
            let committed = c.map_or_else(
                || "nothing committed".to_string(),
                |(o, by, at)| format!("committed {o} by {} at t={at:.1}s", j.name(by)),
            );
            let last = state.and_then(|s| s.last_handled).map_or_else(
                || "no handler call".to_string(),
                |(inc, o, at)| {
                    let i = j.incarnations.get(inc);
                    format!(
                        "last handler call {p}@{o} by {} (generation {:?}, {}) at t={at:.1}s",
                        j.name(inc),
                        i.and_then(|i| i.generation),
                        i.and_then(|i| i.ended.as_ref()).map_or(
                            "running".to_string(),
                            |e| format!("ended t={:.1}s: {}", e.0, e.1)
                        )
                    )
                },
            );
            // Handler starts in each 10 s of the last 100 s.
            let per_second = state.map(|s| s.starts_per_second.as_slice()).unwrap_or(&[]);
            let end = per_second.len();
            let recent: Vec<String> = (0..10)
                .rev()
                .filter_map(|k| {
                    let hi = end.checked_sub(k * 10)?;
                    let lo = hi.saturating_sub(10);
                    Some(per_second[lo..hi].iter().sum::<u32>().to_string())
                })
                .collect();
            // Who holds it now, as the members' own reports say.
            let holders: Vec<String> = j
                .holders
                .get(p)
                .into_iter()
                .flatten()
                .filter(|(inc, _)| j.incarnations.get(**inc).is_some_and(|i| i.ended.is_none()))
                .map(|(inc, (at, g))| format!("{} since t={at:.1}s (generation {g})", j.name(*inc)))
                .collect();
            let held = if holders.is_empty() {
                "held by no live member".to_string()
            } else {
                format!("held by {}", holders.join(", "))
            };
            out.push(format!(
                "partition {p}: log end {t}, {committed}; {last}; {held}; handler starts per 10 s up to t={end}s: [{}]",
                recent.join(" ")
            ));
        }
        out
    }

    /// Where the run stands.
    pub fn progress(&self, targets: Option<&BTreeMap<i32, i64>>) -> Progress {
        let j = self.lock();
        let computed;
        let targets = match targets {
            Some(t) => t,
            None => {
                let mut out = BTreeMap::new();
                for a in j.acked.values() {
                    let t = out.entry(a.partition).or_insert(0);
                    *t = (*t).max(a.offset + 1);
                }
                computed = out;
                &computed
            }
        };
        let mut uncommitted = 0;
        let mut drained = true;
        for (p, t) in targets {
            let c = j
                .partitions
                .get(p)
                .and_then(|s| s.committed)
                .map_or(0, |c| c.0);
            uncommitted += (t - c).max(0);
            drained &= c >= *t;
        }
        Progress {
            sent: j.sent,
            acked: j.acked.len() as u64,
            finished: j.offsets.values().filter(|r| r.finished()).count() as u64,
            uncommitted,
            drained,
            generations: j.generations.len(),
        }
    }

    /// The end-of-run checks. `in_dlq`: sequence numbers found in the dead-letter
    /// topic.
    pub fn analyse(&self, in_dlq: &BTreeSet<u64>) -> Analysis {
        let mut j = self.lock();
        // Redos below a previous owner's commit: the broker's double grant when it asked
        // that owner for the partition only after granting it to the redoing member.
        let deferred = std::mem::take(&mut j.deferred);
        for d in deferred {
            let grant = j
                .early_grants
                .iter()
                .find(|g| {
                    g.partition == d.partition
                        && g.new == d.inc
                        && g.old == d.by
                        && g.confirmed.is_some()
                })
                .cloned();
            match grant {
                Some(g) => {
                    j.redone_after_early_grant += 1;
                    if j.notes.len() < 50 {
                        let (new, old) = (j.name(g.new), j.name(g.old));
                        let asked = g.confirmed.unwrap_or(g.at);
                        j.notes.push(format!(
                            "broker double grant, not a client error: {}; the broker granted partition {} to {new} at t={:.1}s while {old} still held it, and asked {old} for it only at t={asked:.1}s",
                            d.message, g.partition, g.at
                        ));
                    }
                }
                None => j.violation(Check::BelowCommit, d.message),
            }
        }
        let mut handled = BTreeSet::new();
        let mut lettered = BTreeSet::new();
        for r in j.offsets.values() {
            let Some(seq) = r.seq else { continue };
            if r.ok > 0 {
                handled.insert(seq);
            }
            if r.dead_lettered > 0 {
                lettered.insert(seq);
            }
        }
        // Dead-lettered by the metrics, but not in the topic: lost.
        let missing: Vec<u64> = lettered
            .iter()
            .filter(|s| !handled.contains(s) && !in_dlq.contains(s))
            .copied()
            .collect();
        for s in &missing {
            j.violation(
                Check::DlqMissing,
                format!("seq {s} was reported dead-lettered but is not in the dead-letter topic"),
            );
        }
        let mut lost = 0;
        let mut lost_examples = Vec::new();
        let mut acked: Vec<(u64, Ack)> = j.acked.iter().map(|(s, a)| (*s, *a)).collect();
        acked.sort_by_key(|(s, _)| *s);
        for (seq, a) in &acked {
            if handled.contains(seq) || (lettered.contains(seq) && in_dlq.contains(seq)) {
                continue;
            }
            lost += 1;
            if lost_examples.len() < 20 {
                let r = j.offsets.get(&(a.partition, a.offset));
                let committed = j
                    .partitions
                    .get(&a.partition)
                    .and_then(|p| p.committed)
                    .map(|c| c.0);
                lost_examples.push(format!(
                    "seq {seq} at {}@{} (acked t={:.1}s): attempts {}, handled {}, dead-lettered {}, partition committed at {committed:?}",
                    a.partition,
                    a.offset,
                    a.at,
                    j.attempts.get(seq).copied().unwrap_or(0),
                    r.map_or(0, |r| r.ok),
                    r.map_or(0, |r| r.dead_lettered),
                ));
            }
        }
        // Longest gap per partition: the time between consecutive first finishes,
        // counted from the later of the previous finish and the acknowledgement of the
        // record finished (before it was acknowledged it may not have been readable).
        let mut per_partition: BTreeMap<i32, Vec<(f64, Option<f64>)>> = BTreeMap::new();
        for ((p, _), r) in &j.offsets {
            if let Some(done) = r.done_at {
                let ack = r.seq.and_then(|s| j.acked.get(&s)).map(|a| a.at);
                per_partition.entry(*p).or_default().push((done, ack));
            }
        }
        let mut gaps = BTreeMap::new();
        for (p, mut v) in per_partition {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut worst = (Duration::ZERO, 0.0);
            for w in v.windows(2) {
                // Records never acknowledged cannot tell when they became available.
                let (prev, (done, Some(ack))) = (w[0].0, w[1]) else {
                    continue;
                };
                let from = ack.max(prev);
                let gap = done - from;
                if gap > worst.0.as_secs_f64() {
                    worst = (Duration::from_secs_f64(gap), from);
                }
            }
            gaps.insert(p, worst);
        }
        // The longest wait, per partition, from a record's last finish to a commit past
        // it; a partition over the bound fails once, with its worst record.
        let mut longest_commit_wait: Option<(i32, f64)> = None;
        let bound = j.commit_wait_bound.unwrap_or(COMMIT_WAIT_BOUND);
        let mut waits: Vec<(i32, i64, f64, f64)> = Vec::new();
        for (p, part) in &j.partitions {
            let log = &part.commit_log;
            // The highest offset committed up to each report, in time order.
            let mut best = Vec::with_capacity(log.len());
            let mut max = i64::MIN;
            for (_, o, _) in log {
                max = max.max(*o);
                best.push(max);
            }
            let mut worst: Option<(i64, f64, f64)> = None;
            for ((rp, offset), r) in &j.offsets {
                let (true, Some(done)) = (rp == p, r.last_done_at) else {
                    continue;
                };
                // Reports from the last finish on; one before it already past the record
                // means it was finished again below a commit (another check's).
                let from = log.partition_point(|(t, _, _)| *t < done);
                if from > 0 && best.get(from - 1).is_some_and(|b| *b > *offset) {
                    continue;
                }
                let Some(tail) = best.get(from..) else {
                    continue;
                };
                let k = tail.partition_point(|b| *b <= *offset);
                let Some((at, _, _)) = log.get(from + k) else {
                    // Never committed: the drain check's.
                    continue;
                };
                let wait = at - done;
                if worst.is_none_or(|(_, w, _)| wait > w) {
                    worst = Some((*offset, wait, done));
                }
            }
            if let Some((offset, wait, done)) = worst {
                if longest_commit_wait.is_none_or(|(_, w)| wait > w) {
                    longest_commit_wait = Some((*p, wait));
                }
                if wait > bound {
                    waits.push((*p, offset, done, wait));
                }
            }
        }
        for (p, offset, done, wait) in waits {
            j.violation(
                Check::CommitWait,
                format!(
                    "partition {p}: {p}@{offset}, finished at t={done:.1}s, waited {wait:.1}s for a commit past it (bound {bound:.0}s)"
                ),
            );
        }
        let c = j.counts.clone();
        Analysis {
            longest_commit_wait,
            longest_overlap: j.longest_overlap,
            after_loss: j.after_loss,
            sent: j.sent,
            produced: j.acked.len() as u64,
            produce_failures: j.produce_failures,
            produce_errors: j.produce_errors.clone(),
            handled: handled.len() as u64,
            dead_lettered: lettered.difference(&handled).count() as u64,
            lost,
            lost_examples,
            duplicates: c.duplicates,
            episodes: c.episodes,
            in_flight_bound: c.in_flight_bound,
            handler_calls: c.handler_calls,
            transient: c.transient,
            permanent: c.permanent,
            cancelled: c.cancelled,
            retries: c.retries,
            commits: j.partitions.values().map(|p| p.commits).sum(),
            polls: j.partitions.values().map(|p| p.polls).sum(),
            poll_failures: c.poll_failures,
            generations: j.generations.len(),
            untagged: c.untagged,
            overlaps: c.overlaps,
            incarnations: j.incarnations.len(),
            unexpected_ends: c.unexpected_ends,
            gaps,
            member_log: j.member_log.clone(),
            faults: j.faults.clone(),
            notes: j.notes.clone(),
            violations: j.violations.clone(),
            checks: Check::ALL
                .into_iter()
                .map(|c| (c, j.checks.get(&c).copied().unwrap_or(0)))
                .collect(),
            violation_count: j.checks.values().sum(),
            early_grants: j
                .early_grants
                .iter()
                .filter(|g| g.confirmed.is_some())
                .count() as u64,
            redone_after_early_grant: j.redone_after_early_grant,
        }
    }
}

impl Default for Journal {
    fn default() -> Self {
        Self::new()
    }
}

impl Inner {
    fn name(&self, inc: usize) -> String {
        self.incarnations
            .get(inc)
            .map_or_else(|| format!("#{inc}"), |i| i.name.clone())
    }

    fn violation(&mut self, check: Check, message: String) {
        *self.checks.entry(check).or_default() += 1;
        if self.violations.len() < KEPT {
            self.violations
                .push(format!("[{}] {message}", check.name()));
        }
    }

    fn finish(&mut self, partition: i32, offset: i64, at: f64, dead_letter: bool) {
        let r = self.offsets.entry((partition, offset)).or_default();
        if r.finished() {
            self.counts.duplicates += 1;
        }
        if dead_letter {
            r.dead_lettered += 1;
        } else {
            r.ok += 1;
        }
        r.done_at.get_or_insert(at);
        r.last_done_at = Some(at);
        let p = self.partitions.entry(partition).or_default();
        p.max_finished = p.max_finished.max(offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal_with_member() -> (Journal, usize) {
        let j = Journal::new();
        let inc = j.incarnation_started("m0.0".into());
        j.member_log(inc, "synced".into(), Some(1));
        (j, inc)
    }

    #[test]
    fn a_commit_past_an_unfinished_record_is_a_violation() {
        let (j, m) = journal_with_member();
        for o in 0..3 {
            j.acked(o as u64, 0, o);
            j.handler_started(m, 0, o, o as u64);
        }
        j.handled(m, 0, 0);
        j.handled(m, 0, 2);
        j.committed(m, 0, 1);
        assert_eq!(j.analyse(&BTreeSet::new()).violation_count, 0);
        j.committed(m, 0, 3);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(a.violation_count, 1, "{:?}", a.violations);
        assert_eq!(a.lost, 1);
    }

    /// Work begun on a partition after its member gave it back, or on one it was never
    /// assigned once it reports assignments, is a violation; while it holds it, none.
    #[test]
    fn work_on_a_partition_the_member_no_longer_holds_is_a_violation() {
        let j = Journal::new();
        let (a, b) = (
            j.incarnation_started("m0.0".into()),
            j.incarnation_started("m1.0".into()),
        );
        j.assigned(a, &[0, 1], 1);
        j.assigned(b, &[2], 1);
        handle(&j, a, 0..2);
        assert_eq!(j.analyse(&BTreeSet::new()).violation_count, 0);
        // Revoked: b gets partition 0 while a still runs work of it, which ends later.
        j.acked(2, 0, 2);
        j.handler_started(a, 0, 2, 2);
        j.released(a, &[0]);
        j.assigned(b, &[0], 2);
        handle(&j, b, 3..4);
        j.handler_finished(a, 0);
        j.handler_started(a, 0, 2, 2);
        j.handler_finished(a, 0);
        // And on partition 2, never its own.
        j.acked(9, 2, 0);
        j.handler_started(a, 2, 0, 9);
        let an = j.analyse(&BTreeSet::new());
        assert_eq!(
            an.checks.get(&Check::AfterRelease),
            Some(&2),
            "{:?}",
            an.violations
        );
        assert!(an.longest_overlap.is_some_and(|(p, _)| p == 0));
        // A whole assignment that leaves a partition out gives it back too.
        j.retain_held(b, &[2]);
        j.handler_started(b, 0, 3, 3);
        let an = j.analyse(&BTreeSet::new());
        assert_eq!(an.checks.get(&Check::AfterRelease), Some(&3));
    }

    /// Under the classic protocol a partition given to another member was given back by
    /// its holder if the group had asked that holder for it (the revocation itself may
    /// not reach the journal); a holder never asked (expelled unawares) keeps its claim.
    #[test]
    fn a_partition_assigned_on_was_given_back_by_a_holder_that_was_asked_for_it() {
        let j = Journal::new();
        let (a, b, c) = (
            j.incarnation_started("m0.0".into()),
            j.incarnation_started("m1.0".into()),
            j.incarnation_started("m2.0".into()),
        );
        j.assigned(a, &[0], 1);
        j.assigned(b, &[1], 1);
        j.revoke_requested(a, &[0]);
        j.assigned(c, &[0, 1], 2);
        j.acked(0, 0, 0);
        j.handler_started(a, 0, 0, 0);
        j.handler_finished(a, 0);
        j.acked(1, 1, 0);
        j.handler_started(b, 1, 0, 1);
        let an = j.analyse(&BTreeSet::new());
        assert_eq!(
            an.checks.get(&Check::AfterRelease),
            Some(&1),
            "{:?}",
            an.violations
        );
        assert!(an.violations.iter().any(|v| v.contains("m0.0 began 0@0")));
    }

    /// Work begun on a partition its member reported lost is counted and noted, not a
    /// violation; a revocation after a new assignment makes it one again.
    #[test]
    fn work_after_a_loss_is_noted_not_a_violation() {
        let (j, m) = journal_with_member();
        j.assigned(m, &[0], 1);
        j.lost(m, &[0]);
        j.acked(0, 0, 0);
        j.handler_started(m, 0, 0, 0);
        j.handler_finished(m, 0);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(
            (a.after_loss, a.violation_count),
            (1, 0),
            "{:?}",
            a.violations
        );
        j.assigned(m, &[0], 2);
        j.released(m, &[0]);
        j.handler_started(m, 0, 0, 0);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(a.checks.get(&Check::AfterRelease), Some(&1));
    }

    /// With broker commits checked, a committed offset read back past an unfinished
    /// record is a violation, once per higher offset read.
    #[test]
    fn a_broker_commit_past_an_unfinished_record_is_a_violation_when_checked() {
        let (j, m) = journal_with_member();
        handle(&j, m, 0..2);
        j.acked(2, 0, 2);
        j.handler_started(m, 0, 2, 2);
        j.polled(0, 1);
        j.polled(0, 3);
        assert_eq!(j.analyse(&BTreeSet::new()).violation_count, 0);
        j.set_check_broker_commits(true);
        j.polled(0, 3);
        j.polled(0, 4);
        j.polled(0, 4);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(
            a.checks.get(&Check::UnfinishedCommit),
            Some(&1),
            "{:?}",
            a.violations
        );
        assert_eq!(a.violation_count, 1);
    }

    /// `inc` handles partition 0's `offsets` (sequence numbers equal to the offsets),
    /// each acknowledged by the broker first.
    fn handle(j: &Journal, inc: usize, offsets: std::ops::Range<i64>) {
        for o in offsets {
            j.acked(o as u64, 0, o);
            j.handler_started(inc, 0, o, o as u64);
            j.handled(inc, 0, o);
            j.handler_finished(inc, 0);
        }
    }

    /// Under key ordering: two calls of one key at once, and a key's record started
    /// after a later one, are violations; a new assignment starts a key over.
    #[test]
    fn a_key_run_twice_at_once_or_out_of_order_is_a_violation() {
        let (j, m) = journal_with_member();
        j.assigned(m, &[0], 1);
        j.key_started(m, 0, 0, b"k1");
        j.key_finished(m, 0, b"k1");
        j.key_started(m, 0, 0, b"k1"); // a retry of the same record
        j.key_finished(m, 0, b"k1");
        j.key_started(m, 0, 3, b"k1");
        j.key_started(m, 0, 1, b"k2"); // another key at once
        j.key_finished(m, 0, b"k2");
        j.key_finished(m, 0, b"k1");
        assert_eq!(j.analyse(&BTreeSet::new()).violation_count, 0);
        // Assigned again: it reads from the committed offset.
        j.assigned(m, &[0], 2);
        j.key_started(m, 0, 0, b"k1");
        j.key_finished(m, 0, b"k1");
        assert_eq!(j.analyse(&BTreeSet::new()).violation_count, 0);
        j.key_started(m, 0, 5, b"k1");
        j.key_started(m, 0, 6, b"k1");
        j.key_finished(m, 0, b"k1");
        j.key_started(m, 0, 4, b"k1");
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(a.violation_count, 2, "{:?}", a.violations);
        assert_eq!(a.checks.get(&Check::KeyOrder), Some(&2));
    }

    #[test]
    fn regressions_and_double_owners_are_violations() {
        let (j, m) = journal_with_member();
        let n = j.incarnation_started("m1.0".into());
        j.member_log(n, "synced".into(), Some(1));
        j.handler_started(m, 0, 0, 0);
        j.handled(m, 0, 0);
        j.handler_finished(m, 0);
        j.committed(m, 0, 1);
        j.committed(m, 0, 0);
        j.handler_started(n, 0, 1, 1);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(a.violation_count, 2, "{:?}", a.violations);
    }

    #[test]
    fn a_lower_commit_answered_late_from_an_older_generation_is_a_note_not_a_regression() {
        let (j, m) = journal_with_member();
        j.member_log(m, "joined".into(), Some(5));
        let n = j.incarnation_started("m1.0".into());
        j.member_log(n, "joined".into(), Some(6));
        let o = j.incarnation_started("m2.0".into());
        j.member_log(o, "joined".into(), Some(6));
        handle(&j, n, 0..20);
        j.committed(n, 0, 20);
        // m0.0's commit of 15, taken in generation 5 before the partition moved, is
        // reported after m1.0's of 20 in generation 6: the broker took it first.
        j.committed(m, 0, 15);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(a.violation_count, 0, "{:?}", a.violations);
        assert!(
            a.notes.iter().any(|n| n.contains("late commit answer")),
            "{:?}",
            a.notes
        );
        // The same generation going back is a regression.
        j.committed(o, 0, 12);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(
            a.checks.get(&Check::Regression),
            Some(&1),
            "{:?}",
            a.violations
        );
    }

    /// Partition 0: `old` handles 0..10 and commits 5; the broker grants it to `new`
    /// (which reads 5); `old` commits 10 after that; `new` redoes 5..10. `asked`:
    /// whether (and when) the group then asks `old` for the partition back.
    fn granted_while_held(broker_assigns: bool, asked: bool, redo_by_old: bool) -> Analysis {
        let (j, old) = journal_with_member();
        j.set_broker_assigns(broker_assigns);
        j.assigned(old, &[0], 1);
        handle(&j, old, 0..10);
        j.committed(old, 0, 5);
        let new = j.incarnation_started("m1.0".into());
        j.member_log(new, "synced".into(), Some(2));
        j.assigned(new, &[0], 2);
        if asked {
            j.revoke_requested(old, &[0]);
        }
        j.committed(old, 0, 10);
        j.released(old, &[0]);
        let redo = if redo_by_old { old } else { new };
        for o in 5..10 {
            j.handler_started(redo, 0, o, o as u64);
            j.handled(redo, 0, o);
            j.handler_finished(redo, 0);
        }
        j.analyse(&BTreeSet::new())
    }

    #[test]
    fn a_redo_after_the_broker_granted_a_partition_its_holder_still_had_is_the_brokers() {
        let a = granted_while_held(true, true, false);
        assert_eq!(a.violation_count, 0, "{:?}", a.violations);
        assert_eq!((a.early_grants, a.redone_after_early_grant), (1, 5));
        assert!(
            a.notes.iter().any(|n| n.contains("broker double grant")),
            "{:?}",
            a.notes
        );
    }

    #[test]
    fn a_redo_below_a_commit_stays_a_violation_unless_the_broker_asked_the_holder_afterwards() {
        // Never asked: the holder lost it (a zombie still committing), the client's
        // window, not the broker's grant.
        let a = granted_while_held(true, false, false);
        assert_eq!(
            a.checks.get(&Check::BelowCommit),
            Some(&5),
            "{:?}",
            a.violations
        );
        assert_eq!(a.early_grants, 0);
        // The classic protocol: a member assigned it.
        let a = granted_while_held(false, true, false);
        assert_eq!(
            a.checks.get(&Check::BelowCommit),
            Some(&5),
            "{:?}",
            a.violations
        );
        // The holder redoes below its own commit.
        let a = granted_while_held(true, true, true);
        assert_eq!(
            a.checks.get(&Check::BelowCommit),
            Some(&5),
            "{:?}",
            a.violations
        );
    }

    #[test]
    fn records_finished_and_not_committed_for_longer_than_the_bound_fail_once_per_partition() {
        let (j, m) = journal_with_member();
        j.set_commit_wait_bound(0.05);
        handle(&j, m, 0..3);
        j.committed(m, 0, 3);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(
            a.checks.get(&Check::CommitWait),
            Some(&0),
            "{:?}",
            a.violations
        );
        // Finished now, committed only after the bound: the lanes stopped committing.
        handle(&j, m, 3..6);
        std::thread::sleep(Duration::from_millis(120));
        j.committed(m, 0, 6);
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(
            a.checks.get(&Check::CommitWait),
            Some(&1),
            "{:?}",
            a.violations
        );
        assert!(
            a.longest_commit_wait
                .is_some_and(|(p, w)| p == 0 && w >= 0.1)
        );
    }

    #[test]
    fn redone_records_above_the_commit_are_duplicates_within_the_bound() {
        let (j, m) = journal_with_member();
        handle(&j, m, 0..5);
        j.committed(m, 0, 2);
        let n = j.incarnation_started("m1.0".into());
        j.member_log(n, "synced".into(), Some(2));
        for o in 2..5 {
            j.handler_started(n, 0, o, o as u64);
            j.handled(n, 0, o);
            j.handler_finished(n, 0);
        }
        let a = j.analyse(&BTreeSet::new());
        assert_eq!(a.violation_count, 0, "{:?}", a.violations);
        assert_eq!((a.duplicates, a.episodes, a.in_flight_bound), (3, 1, 3));
        assert_eq!((a.lost, a.handled), (0, 5));
    }
}
