//! What each broker error means to a transaction, API by API: the Java client's
//! `TransactionManager` handlers (and its `Sender` for Produce), as one table.
//!
//! Four outcomes: try the same request again after a backoff; look the coordinator up
//! again and then try again; the transaction can only be aborted (the producer stays
//! usable); or the producer is finished (fenced, or not allowed). An error no row
//! names is fatal, as in Java's handlers' last branch.

use kafka_protocol::error::ResponseError as E;

/// The transactional APIs, and Produce inside a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TxnApi {
    /// FindCoordinator with key type TRANSACTION or GROUP.
    FindCoordinator,
    /// InitProducerId with a `transactional.id`.
    InitProducerId,
    /// AddPartitionsToTxn.
    AddPartitionsToTxn,
    /// AddOffsetsToTxn.
    AddOffsetsToTxn,
    /// TxnOffsetCommit (to the group's coordinator).
    TxnOffsetCommit,
    /// EndTxn (commit or abort).
    EndTxn,
    /// A Produce batch of the transaction.
    Produce,
}

/// Which coordinator an error sends the manager back to look up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoordinatorKind {
    /// The transaction coordinator (key type 1, the `transactional.id`).
    Transaction,
    /// The group coordinator (key type 0, the consumer's group), for TxnOffsetCommit.
    Group,
}

/// What an error does to the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Disposition {
    /// Nothing failed.
    Done,
    /// The same request again, after the backoff.
    Retry,
    /// Look the coordinator up again, then the same request.
    FindCoordinator(CoordinatorKind),
    /// The transaction can only be aborted; the producer stays usable.
    Abortable,
    /// As `Abortable`, and the abort ends with InitProducerId on the current producer
    /// id and epoch (KIP-360: the epoch is bumped, the sequence numbers restart).
    AbortableBumpEpoch,
    /// The producer is finished: fenced by a newer instance, or refused for good.
    Fatal,
}

/// One row of the table: these errors, answered to these APIs, have this outcome.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The APIs.
    pub apis: &'static [TxnApi],
    /// The errors.
    pub errors: &'static [E],
    /// What they do.
    pub outcome: Disposition,
    /// Why, in a few words.
    pub why: &'static str,
}

const COORDINATOR_APIS: &[TxnApi] = &[
    TxnApi::InitProducerId,
    TxnApi::AddPartitionsToTxn,
    TxnApi::AddOffsetsToTxn,
    TxnApi::EndTxn,
];

const FENCED_APIS: &[TxnApi] = &[
    TxnApi::InitProducerId,
    TxnApi::AddPartitionsToTxn,
    TxnApi::AddOffsetsToTxn,
    TxnApi::TxnOffsetCommit,
    TxnApi::EndTxn,
];

/// The table, first matching row wins. An error no row names is fatal, except for
/// Produce, where it is abortable (the accumulator retries what can be retried; what it
/// gives up on aborts the transaction).
pub const RULES: &[Rule] = &[
    Rule {
        apis: COORDINATOR_APIS,
        errors: &[E::NotCoordinator, E::CoordinatorNotAvailable],
        outcome: Disposition::FindCoordinator(CoordinatorKind::Transaction),
        why: "the transaction coordinator moved or is not up yet",
    },
    Rule {
        apis: &[TxnApi::TxnOffsetCommit],
        errors: &[
            E::NotCoordinator,
            E::CoordinatorNotAvailable,
            E::RequestTimedOut,
        ],
        outcome: Disposition::FindCoordinator(CoordinatorKind::Group),
        why: "the group coordinator moved or is not up yet",
    },
    Rule {
        apis: &[TxnApi::FindCoordinator],
        errors: &[E::CoordinatorNotAvailable, E::NotCoordinator],
        outcome: Disposition::Retry,
        why: "no coordinator is ready for the key yet",
    },
    Rule {
        apis: &[
            TxnApi::FindCoordinator,
            TxnApi::InitProducerId,
            TxnApi::AddPartitionsToTxn,
            TxnApi::AddOffsetsToTxn,
            TxnApi::TxnOffsetCommit,
            TxnApi::EndTxn,
        ],
        errors: &[E::CoordinatorLoadInProgress],
        outcome: Disposition::Retry,
        why: "the coordinator is loading its state",
    },
    Rule {
        apis: COORDINATOR_APIS,
        errors: &[E::ConcurrentTransactions],
        outcome: Disposition::Retry,
        why: "the previous transaction is still being completed",
    },
    Rule {
        apis: &[TxnApi::AddPartitionsToTxn, TxnApi::TxnOffsetCommit],
        errors: &[E::UnknownTopicOrPartition],
        outcome: Disposition::Retry,
        why: "metadata of a new topic has not reached the coordinator",
    },
    Rule {
        apis: &[TxnApi::AddPartitionsToTxn],
        errors: &[E::OperationNotAttempted],
        outcome: Disposition::Retry,
        why: "the partitions that were fine while another failed",
    },
    Rule {
        apis: FENCED_APIS,
        errors: &[E::ProducerFenced, E::InvalidProducerEpoch],
        outcome: Disposition::Fatal,
        why: "a newer instance with this transactional.id fenced this one",
    },
    Rule {
        apis: &[TxnApi::Produce],
        errors: &[E::ProducerFenced],
        outcome: Disposition::Fatal,
        why: "a newer instance with this transactional.id fenced this one",
    },
    Rule {
        apis: &[TxnApi::Produce],
        errors: &[E::InvalidProducerEpoch],
        outcome: Disposition::AbortableBumpEpoch,
        why: "the coordinator aborted the transaction on its timeout and bumped the epoch (KIP-588)",
    },
    Rule {
        apis: &[
            TxnApi::FindCoordinator,
            TxnApi::InitProducerId,
            TxnApi::AddPartitionsToTxn,
            TxnApi::AddOffsetsToTxn,
            TxnApi::TxnOffsetCommit,
            TxnApi::EndTxn,
            TxnApi::Produce,
        ],
        errors: &[E::TransactionalIdAuthorizationFailed],
        outcome: Disposition::Fatal,
        why: "this principal may not use the transactional.id",
    },
    Rule {
        apis: &[TxnApi::AddPartitionsToTxn, TxnApi::EndTxn],
        errors: &[E::InvalidTxnState],
        outcome: Disposition::Fatal,
        why: "the coordinator's state of the transaction disagrees with the producer's",
    },
    Rule {
        apis: &[TxnApi::TxnOffsetCommit],
        errors: &[E::UnsupportedForMessageFormat],
        outcome: Disposition::Fatal,
        why: "the offsets topic cannot store transactional commits",
    },
    Rule {
        apis: &[TxnApi::AddPartitionsToTxn, TxnApi::Produce],
        errors: &[E::TopicAuthorizationFailed],
        outcome: Disposition::Abortable,
        why: "a topic of this transaction may not be written",
    },
    Rule {
        apis: &[TxnApi::AddOffsetsToTxn, TxnApi::TxnOffsetCommit],
        errors: &[E::GroupAuthorizationFailed],
        outcome: Disposition::Abortable,
        why: "the group's offsets may not be committed",
    },
    Rule {
        apis: &[TxnApi::TxnOffsetCommit],
        errors: STALE_MEMBER,
        outcome: Disposition::Abortable,
        why: "the consumer's generation moved on (KIP-447): its offsets would be a zombie's",
    },
    Rule {
        apis: &[
            TxnApi::AddPartitionsToTxn,
            TxnApi::AddOffsetsToTxn,
            TxnApi::EndTxn,
            TxnApi::Produce,
        ],
        errors: &[E::UnknownProducerId, E::InvalidProducerIdMapping],
        outcome: Disposition::AbortableBumpEpoch,
        why: "the producer id expired at the broker; abort, then a new epoch (KIP-360)",
    },
    Rule {
        apis: &[TxnApi::Produce],
        errors: &[E::OutOfOrderSequenceNumber],
        outcome: Disposition::AbortableBumpEpoch,
        why: "a gap in the sequence: abort, then a new epoch restarts the sequences",
    },
    Rule {
        apis: &[TxnApi::Produce, TxnApi::AddPartitionsToTxn],
        errors: &[E::TransactionAbortable],
        outcome: Disposition::Abortable,
        why: "the broker's verification found no open transaction (KIP-890)",
    },
];

/// TxnOffsetCommit's refusals of a consumer whose generation or member id the group
/// no longer has ([`TxnError::is_stale_member`](super::TxnError::is_stale_member)).
pub(super) const STALE_MEMBER: &[E] = &[
    E::UnknownMemberId,
    E::IllegalGeneration,
    E::FencedInstanceId,
];

/// The outcome of `code` answered to `api`: the first row of [`RULES`] that names
/// both, else fatal (abortable for Produce).
pub fn disposition(api: TxnApi, code: i16) -> Disposition {
    if code == 0 {
        return Disposition::Done;
    }
    let rule = E::try_from_code(code).and_then(|error| {
        RULES
            .iter()
            .find(|r| r.apis.contains(&api) && r.errors.contains(&error))
    });
    match (rule, api) {
        (Some(r), _) => r.outcome,
        (None, TxnApi::Produce) => Disposition::Abortable,
        (None, _) => Disposition::Fatal,
    }
}
