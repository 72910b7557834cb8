//! What a lane holds: its records, its tracker, and the work it is doing (a call, a wait,
//! a write, a halt); a record's state between attempts; a handover under way.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::Run;
use super::types::{Handover, Ticket};
use crate::fetch::fetcher::ConsumerRecord;
use crate::group::consumer_protocol::TopicPartition;
use crate::process::classify::{ErrorClass, ProcessError};
use crate::process::tracker::OffsetTracker;
use crate::trace::TraceContext;

/// The state of one record between attempts.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    pub(super) record: ConsumerRecord,
    /// Attempts made so far.
    pub(super) attempts: u32,
    pub(super) first_failure_ms: Option<i64>,
    pub(super) last_error: Option<ProcessError>,
    /// How long the last attempt took.
    pub(super) took: Duration,
    /// The trace context of the last attempt, for the record's hop or dead letter.
    pub(super) trace: Option<TraceContext>,
}

impl Attempt {
    pub(super) fn first(record: ConsumerRecord) -> Self {
        Self {
            record,
            attempts: 0,
            first_failure_ms: None,
            last_error: None,
            took: Duration::ZERO,
            trace: None,
        }
    }
}

/// Where a failed record goes: a retry topic's hop, or the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Destination {
    Hop(u32),
    DeadLetters,
}

/// What one lane is doing.
#[derive(Debug, Default)]
pub(super) enum Work {
    /// Nothing: the next records start when a slot is free.
    #[default]
    Idle,
    /// A handler call runs on `run`; the first `reported` of its records finished already
    /// ([`Lanes::progress`](super::Lanes::progress)). `retry`: the first record is on a
    /// retry, and this is its state (the others are on their first attempt).
    Running {
        ticket: Ticket,
        run: Run,
        retry: Option<Box<Attempt>>,
        reported: usize,
        cancelled: bool,
    },
    /// A record waits for its retry (or a retry-topic record for its time).
    Waiting { attempt: Attempt, until: Instant },
    /// A record is being written to `to`.
    Forwarding {
        ticket: Ticket,
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        failures: u32,
    },
    /// The write of a record failed `failures` times; it is tried again at `retry_at`,
    /// and nothing after it is handled or committed meanwhile.
    Halted {
        attempt: Attempt,
        class: ErrorClass,
        to: Destination,
        retry_at: Instant,
        failures: u32,
    },
}

impl Work {
    pub(super) fn ticket(&self) -> Option<Ticket> {
        match self {
            Work::Running { ticket, .. } | Work::Forwarding { ticket, .. } => Some(*ticket),
            _ => None,
        }
    }
}

/// A handler call that ended, as its lane held it.
pub(super) struct Ran {
    pub(super) run: Run,
    pub(super) retry: Option<Box<Attempt>>,
    pub(super) reported: usize,
    pub(super) cancelled: bool,
}

#[derive(Debug, Default)]
pub(super) struct Lane {
    /// The records delivered and not yet handed to a call, in runs as they came.
    pub(super) queue: VecDeque<Run>,
    /// How many records `queue` holds.
    pub(super) queued: usize,
    pub(super) tracker: OffsetTracker,
    pub(super) work: Work,
    pub(super) paused: bool,
    /// Records up to this offset are handled one at a time: their batch failed
    /// without naming a record.
    pub(super) solo_through: Option<i64>,
    /// Being handed over: nothing new starts, failures are not retried.
    pub(super) releasing: bool,
}

#[derive(Debug)]
pub(super) struct Releasing {
    pub(super) handover: Handover,
    pub(super) partitions: Vec<TopicPartition>,
    pub(super) deadline: Instant,
}
