//! The lanes' public types: the time they are given, their configuration, the tickets
//! of their work, a handler call's outcome, the actions they ask for, their counters and
//! their metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Run;
use crate::group::consumer_protocol::TopicPartition;
use crate::process::classify::{AsGiven, BatchError, Classifier, ErrorClass, ProcessError};
use crate::process::dlq::{DlqFormat, DlqTimestamp};
use crate::process::retry::RetryPolicy;
use crate::produce::record::ProducerRecord;
use crate::trace::TraceContext;

/// The time as the driver read it: the monotonic clock for waits and deadlines, and
/// the wall clock (ms since the epoch) for what records and dead letters carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The monotonic clock.
    pub at: Instant,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: i64,
}

/// Names the dead-letter topic of an original topic.
pub type DlqName = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// What the lanes need to know (set by `ProcessorBuilder`).
#[derive(Clone)]
pub struct LanesConfig {
    /// The consumer group (logged, and written into dead letters).
    pub group: String,
    /// How failed attempts are retried.
    pub policy: RetryPolicy,
    /// Applied to every handler error.
    pub classifier: Arc<dyn Classifier>,
    /// The dead-letter header format.
    pub dlq_format: DlqFormat,
    /// The timestamp dead letters carry.
    pub dlq_timestamp: DlqTimestamp,
    /// The dead-letter topic's suffix, unless `dlq_name` names it.
    pub dlq_suffix: String,
    /// Names the dead-letter topic.
    pub dlq_name: Option<DlqName>,
    /// The retry topics' delays, in hop order.
    pub retry_delays: Vec<Duration>,
    /// Which records of a partition may be handled at once.
    pub ordering: ProcessingOrder,
    /// Handler calls running at once, across every partition.
    pub concurrency: usize,
    /// Records queued per partition before it is paused.
    pub lane_buffer: usize,
    /// Records per handler call.
    pub max_batch: usize,
    /// Commit on this interval, or after every step (`None`).
    pub commit_interval: Option<Duration>,
    /// The seed of the retry delays' jitter.
    pub jitter_seed: u64,
    /// Whether metrics are kept for [`Lanes::poll_metric`](super::Lanes::poll_metric)
    /// (nobody reads them otherwise, so they are not queued).
    pub metrics: bool,
    /// With `metrics`: whether [`Metric::Processed`], one per finished record, is
    /// queued too. The `metrics` feature alone counts finished records from
    /// [`Lanes::stats`](super::Lanes::stats) instead, which costs nothing per record.
    pub processed_metrics: bool,
    /// Exactly-once: every commit is a transaction that carries the outputs of every
    /// lane's finished records, so a handover commits every lane's finished prefix
    /// with the partitions it releases (committing only theirs would make the other
    /// lanes' outputs visible without their offsets).
    pub transactional: bool,
}

impl Default for LanesConfig {
    fn default() -> Self {
        Self {
            group: String::new(),
            policy: RetryPolicy::default(),
            classifier: Arc::new(AsGiven),
            dlq_format: DlqFormat::Apache,
            dlq_timestamp: DlqTimestamp::default(),
            dlq_suffix: ".dlq".into(),
            dlq_name: None,
            retry_delays: Vec::new(),
            ordering: ProcessingOrder::Partition,
            concurrency: 16,
            lane_buffer: 1000,
            max_batch: 1,
            commit_interval: Some(Duration::from_secs(1)),
            jitter_seed: 1,
            metrics: false,
            processed_metrics: true,
            transactional: false,
        }
    }
}

impl std::fmt::Debug for LanesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LanesConfig")
            .field("group", &self.group)
            .field("policy", &self.policy)
            .field("ordering", &self.ordering)
            .field("concurrency", &self.concurrency)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl LanesConfig {
    /// The dead-letter topic of `topic`.
    pub fn dlq_of(&self, topic: &str) -> String {
        match &self.dlq_name {
            Some(f) => f(topic),
            None => format!("{topic}{}", self.dlq_suffix),
        }
    }
}

/// Which records of one partition the Processor may handle at once. Whatever the order,
/// a partition's commit is the prefix of its records that finished, so no commit
/// passes a record that did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProcessingOrder {
    /// One call at a time per partition, in offset order: a record waiting for its
    /// retry holds the records behind it (the default, and Kafka's own promise).
    #[default]
    Partition,
    /// The records of one key in offset order, one call at a time per key; records of
    /// other keys of the same partition at once. A record waiting for its retry holds
    /// only its own key. Records without a key keep no order among themselves (the
    /// producer spreads them over partitions anyway).
    Key,
    /// Any records at once, in no order: each delivery is spread over as many calls as
    /// may run at once (`concurrency`), each taking up to a batch of records that
    /// arrived together; a retry holds only the rest of its call's records.
    Unordered,
}

/// Names one handler call or one write, so its answer finds its lane (and an answer
/// for a lane revoked, lost or handed over meanwhile finds none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub(super) u64);

/// What one handler call reports about the records it was given.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `Ok`: every record not left (see `stopped_after`) was handled; `Err` as from a
    /// batch handler.
    pub result: Result<(), BatchError>,
    /// The call stopped early, without an error, after this many records (cancelled,
    /// or its time slice ran out): the others come again.
    pub stopped_after: Option<usize>,
    /// The failure is a panic of the handler.
    pub panicked: bool,
    /// How long each record's call took, for the records handled and the failing one;
    /// empty: the whole call's time for each.
    pub durations: Vec<Duration>,
    /// The trace context of the failing record's attempt (its span's, or the record's
    /// own): written into its retry-topic hop or dead letter, so that the trace goes on
    /// from that attempt.
    pub trace: Option<TraceContext>,
}

impl Outcome {
    /// The outcome `result`, nothing else to say.
    pub fn of(result: Result<(), BatchError>) -> Self {
        Self {
            result,
            stopped_after: None,
            panicked: false,
            durations: Vec::new(),
            trace: None,
        }
    }

    /// The handler panicked (on record `index`, if known).
    pub fn panic(message: String, index: Option<usize>) -> Self {
        let error = ProcessError::permanent("Panic", message);
        Self {
            result: Err(BatchError { index, error }),
            stopped_after: None,
            panicked: true,
            durations: Vec::new(),
            trace: None,
        }
    }
}

/// Why partitions are handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The group revoked them in this generation.
    Revoked {
        /// The generation the revocation was asked in.
        generation: i32,
    },
    /// The processor shuts down.
    Shutdown,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Call the handler on these records (one partition's, in offset order); answer with
    /// [`Lanes::handled`](super::Lanes::handled),
    /// [`Lanes::progress`](super::Lanes::progress) on the way, or
    /// [`Lanes::crashed`](super::Lanes::crashed).
    Dispatch {
        /// The call's ticket.
        ticket: Ticket,
        /// The records' partition.
        partition: TopicPartition,
        /// The records, shared with the lane (which keeps them for what the call does
        /// not finish): lend them, do not copy them.
        records: Run,
        /// The attempt the first record is on (1 for the first); the others are on
        /// their first.
        attempt: u32,
    },
    /// Tell the handler call under this ticket to stop (its partition is going).
    Cancel(Ticket),
    /// Ask the call under this ticket to stop between records, without telling the
    /// handler (its partition was paused): the records it does not reach come again.
    Yield(Ticket),
    /// Write this record (to a dead-letter or retry topic) and answer with
    /// [`Lanes::produced`](super::Lanes::produced) once it is acknowledged or has failed.
    Produce {
        /// The write's ticket.
        ticket: Ticket,
        /// The partition whose record this is.
        partition: TopicPartition,
        /// The record.
        record: ProducerRecord,
    },
    /// Commit these offsets and answer with [`Lanes::committed`](super::Lanes::committed).
    Commit(Vec<(TopicPartition, i64)>),
    /// Stop fetching this partition (its lane is full, waiting or halted).
    Pause(TopicPartition),
    /// Fetch this partition again.
    Resume(TopicPartition),
    /// The work on `partitions` stopped (finished, or cancelled past the deadline) and
    /// their lanes are gone: commit `offsets` (answer with
    /// [`Lanes::committed`](super::Lanes::committed)), then hand the partitions over.
    Release {
        /// Why.
        handover: Handover,
        /// The partitions.
        partitions: Vec<TopicPartition>,
        /// Their finished prefixes not yet committed.
        offsets: Vec<(TopicPartition, i64)>,
        /// Each offset's commit metadata: the records past it that finished
        /// ([`Lanes::commit_metadata`](super::Lanes::commit_metadata)).
        metadata: Vec<Option<String>>,
    },
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records handled successfully (on any attempt).
    pub succeeded: u64,
    /// Retries scheduled.
    pub retries: u64,
    /// Records written to the dead-letter topic.
    pub dead_lettered: u64,
    /// Dead-letter writes that failed (and were retried).
    pub dlq_failures: u64,
    /// Handler panics (treated as permanent errors).
    pub panics: u64,
    /// Records sent on to a retry topic.
    pub forwarded: u64,
    /// Successful commits.
    pub commits: u64,
    /// Records a handler stopped on cancellation (`ProcessError::cancelled`), left
    /// for the partition's next owner.
    pub cancelled: u64,
    /// Records skipped (`ProcessError::skip`): committed without being processed.
    pub skipped: u64,
    /// Records not handled because the previous owner's commit said they finished
    /// (past its committed offset, in the commit's metadata).
    pub already_finished: u64,
}

/// One metric observation, for `ProcessorBuilder::metrics`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Metric {
    /// A record finished (`success` false: dead-lettered).
    Processed {
        /// Whether the handler succeeded.
        success: bool,
        /// How long the last attempt took (for a batch, the whole call).
        duration: Duration,
    },
    /// A retry was scheduled.
    Retry {
        /// 1 for the first retry.
        attempt: u32,
        /// The delay.
        delay: Duration,
    },
    /// A record was skipped (`ProcessError::skip`): committed, not processed.
    Skipped {
        /// The error type the handler gave.
        error_type: String,
    },
    /// A handler failed.
    Error {
        /// The error type.
        error_type: String,
        /// Its class.
        class: ErrorClass,
    },
    /// A record went to the dead-letter topic (the write was acknowledged).
    DeadLettered {
        /// The record's partition.
        partition: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// The error type.
        error_type: String,
        /// Its class.
        class: ErrorClass,
    },
    /// A record was sent on to a retry topic.
    RetryTopic {
        /// The record's partition.
        partition: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// The retry topic's hop (1 for the first).
        hop: u32,
    },
    /// A partition's finished prefix was committed.
    Committed {
        /// The partition.
        partition: TopicPartition,
        /// The offset committed (the next record to handle).
        offset: i64,
    },
    /// A record waited behind an earlier record of its own key (key ordering): the
    /// time from its arrival to its handler call, for a record that arrived while its
    /// key was busy.
    KeyWait {
        /// How long it waited.
        waited: Duration,
    },
    /// The number of partitions halted because the dead-letter topic cannot be
    /// written changed (reported on each change, down to 0).
    Halted {
        /// How many.
        partitions: usize,
    },
    /// This member joined a generation of the group (SyncGroup answered). Reported
    /// before any record of that generation's new partitions is handled.
    Joined {
        /// The generation.
        generation: i32,
        /// This member's id in it.
        member_id: String,
        /// Whether this member computed the assignment.
        leader: bool,
    },
    /// Partitions were added to this member in a generation.
    Assigned {
        /// The generation.
        generation: i32,
        /// The partitions added.
        partitions: Vec<TopicPartition>,
    },
    /// The group asked for partitions back: their handlers are being stopped and their
    /// finished prefix committed; [`Metric::Revoked`] follows when they are given back
    /// (the time between the two is what the revocation cost this member).
    RevokeRequested {
        /// The generation the revocation was asked in.
        generation: i32,
        /// The partitions.
        partitions: Vec<TopicPartition>,
    },
    /// Partitions were given back in a rebalance, after their work stopped (finished,
    /// or cancelled past the acquiescence budget) and their finished offsets were
    /// committed; reported just before the revocation is acknowledged.
    Revoked {
        /// The generation the revocation was asked in: under an eager protocol the one
        /// ending, under a cooperative one the new one, which no longer gives them to
        /// this member.
        generation: i32,
        /// The partitions.
        partitions: Vec<TopicPartition>,
    },
    /// Exactly once: a transaction ended. Committed, its outputs, dead letters and
    /// `offsets` partition offsets became visible together; aborted (a loss, a
    /// refused offset or a failed write), none did, and the records since the last
    /// commit are handled again.
    Transaction {
        /// Whether it committed.
        committed: bool,
        /// The partition offsets it carried (0 when it aborted).
        offsets: usize,
        /// From the commit (or abort) call to its answer.
        took: Duration,
    },
    /// Partitions were taken away without a chance to commit (session lost, fenced):
    /// their in-flight results were dropped.
    Lost {
        /// The partitions.
        partitions: Vec<TopicPartition>,
    },
    /// The group member was refused something it keeps asking for (a missing topic or
    /// group ACL): the Processor goes on, and so does the member, which recovers by
    /// itself once the ACL is granted. Reported at each refusal.
    GroupRetrying {
        /// What the broker refused, naming the setting or ACL to change.
        error: crate::group::member::GroupError,
    },
}
