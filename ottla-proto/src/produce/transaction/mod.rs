//! The transaction manager, sans-IO: a transactional producer's side of the
//! transaction protocol (KIP-98), beside the [`accumulator`](super::accumulator) that
//! writes its records.
//!
//! The application's calls (`init`, `begin`, `send_offsets`, `commit`, `abort`) queue
//! steps; the driver takes one request at a time with
//! [`TransactionManager::poll_request`], sends it where
//! [`Destination`] says, and hands back the answer
//! ([`TransactionManager::handle_response`]) or the failure
//! ([`TransactionManager::handle_failure`]). Outcomes come out of
//! [`TransactionManager::poll_event`]. Nothing here reads a clock.
//!
//! The rules are the Java client's `TransactionManager`:
//! - one request at a time, FindCoordinator first, then InitProducerId, then
//!   AddPartitionsToTxn and the offsets, EndTxn last;
//! - a partition's records are sent only after AddPartitionsToTxn added it
//!   ([`TransactionManager::may_send`]); partitions are added in batches, as records go
//!   to new ones;
//! - EndTxn waits until every batch of the transaction is answered
//!   ([`TransactionManager::set_batches_pending`]); a transaction that never reached the
//!   coordinator ends without one;
//! - errors follow the table in [`errors`]: retried, sent back to find the coordinator,
//!   abortable (only `abort` is allowed, the producer stays usable; queued steps other
//!   than the abort fail), or fatal (every call fails from then on);
//! - an abort after an error that needs a new epoch ends with InitProducerId on the
//!   current producer id and epoch (KIP-360), and skips EndTxn when the producer id's
//!   mapping is gone (INVALID_PRODUCER_ID_MAPPING), as Java does.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, EndTxnRequest,
    GroupId, InitProducerIdRequest, ProducerId, TopicName, TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, warn};

use crate::Failure;
use crate::backoff::Backoff;
use crate::error_name;
use crate::group::consumer_protocol::TopicPartition;
use crate::metadata::NodeId;
use crate::produce::accumulator::ProduceError;
use kafka_protocol::error::ResponseError;

/// The states `abort_transaction` ends ([`TransactionManager::check`]'s names).
const ABORTABLE: &[&str] = &["in-transaction", "abortable"];

pub mod errors;
#[cfg(test)]
mod tests;

pub use errors::{CoordinatorKind, Disposition, TxnApi};

/// `transactional.id` and what goes with it.
#[derive(Debug, Clone)]
pub struct TransactionConfig {
    /// `transactional.id`.
    pub transactional_id: String,
    /// `transaction.timeout.ms` (default 60 s): the coordinator aborts a transaction
    /// open longer.
    pub transaction_timeout: Duration,
    /// `retry.backoff.ms`, doubling to `retry.backoff.max.ms` on each retry in a row.
    pub retry_backoff: Duration,
    /// `retry.backoff.max.ms`.
    pub retry_backoff_max: Duration,
    /// Seeds the backoff's jitter.
    pub seed: u64,
}

impl TransactionConfig {
    /// Defaults for `transactional_id`.
    pub fn new(transactional_id: impl Into<String>) -> Self {
        Self {
            transactional_id: transactional_id.into(),
            transaction_timeout: Duration::from_secs(60),
            retry_backoff: crate::backoff::DEFAULT_RETRY_BACKOFF,
            retry_backoff_max: crate::backoff::DEFAULT_RETRY_BACKOFF_MAX,
            seed: 0x7a_c7,
        }
    }
}

/// The consumer's group metadata a transaction's offsets carry (KIP-447): the
/// coordinator refuses them from a member whose generation moved on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadata {
    /// `group.id`.
    pub group_id: String,
    /// The member's generation (-1: none, as for a consumer without a group member).
    pub generation_id: i32,
    /// The member id ("" with none).
    pub member_id: String,
    /// `group.instance.id`.
    pub group_instance_id: Option<String>,
}

/// An offset to commit with the transaction: the next record to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffset {
    /// The partition.
    pub partition: TopicPartition,
    /// The offset.
    pub offset: i64,
    /// The leader epoch of the last record read (-1: unknown).
    pub leader_epoch: i32,
    /// Commit metadata.
    pub metadata: Option<String>,
}

/// Where the manager is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxnState {
    /// Before `init`.
    Uninitialized,
    /// `init` is under way.
    Initializing,
    /// No transaction open.
    Ready,
    /// A transaction is open.
    InTransaction,
    /// `commit` is under way.
    Committing,
    /// `abort` is under way.
    Aborting,
    /// The transaction can only be aborted.
    Abortable(TxnError),
    /// The producer is finished.
    Fatal(TxnError),
}

/// Whether a failed transaction leaves the producer usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnErrorKind {
    /// Abort the transaction; the next one can commit.
    Abortable,
    /// The producer can do nothing more (fenced, or not allowed): close it.
    Fatal,
}

/// Why a transactional call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// A broker's answer.
    #[error("{api:?} failed with {} ({kind:?})", error_name(*code))]
    Broker {
        /// Abortable or fatal.
        kind: TxnErrorKind,
        /// The API that answered.
        api: TxnApi,
        /// The error code.
        code: i16,
    },
    /// The call did not finish within `max.block.ms` (Java's `TimeoutException`): the
    /// operation goes on in the background; the state says where it is.
    #[error("{call} did not finish within max.block.ms ({after:?})")]
    Timeout {
        /// The call.
        call: &'static str,
        /// `max.block.ms`.
        after: Duration,
    },
    /// The broker does not offer a transaction API at any version ottla speaks: it
    /// does not support transactions (Kafka before 0.11, or a Kafka-compatible broker
    /// without them). Fatal, as Java's `UnsupportedVersionException` here.
    #[error("the broker does not support transactions: {api:?} is not offered ({detail})")]
    Unsupported {
        /// The API the broker lacks.
        api: TxnApi,
        /// What the driver saw (the broker and the versions).
        detail: String,
    },
    /// A call the state does not allow (`commit` outside a transaction, say).
    #[error("{call} is not allowed while {state}")]
    State {
        /// The call.
        call: &'static str,
        /// The state, named.
        state: &'static str,
    },
}

impl TxnError {
    /// Abortable or fatal (a call out of turn is neither: the state did not change).
    pub fn kind(&self) -> Option<TxnErrorKind> {
        match self {
            TxnError::Broker { kind, .. } => Some(*kind),
            TxnError::Unsupported { .. } => Some(TxnErrorKind::Fatal),
            TxnError::Timeout { .. } | TxnError::State { .. } => None,
        }
    }

    /// The transaction must be aborted; the producer stays usable (rust-rdkafka's
    /// `txn_requires_abort`, Java's exceptions other than the fatal ones).
    pub fn txn_requires_abort(&self) -> bool {
        self.kind() == Some(TxnErrorKind::Abortable)
    }

    /// The group coordinator refused the transaction's offsets because the consumer
    /// metadata they carried is not the group's any more (KIP-447: ILLEGAL_GENERATION,
    /// UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID on TxnOffsetCommit; Java's
    /// `CommitFailedException`). Abortable; offsets can commit again once the member
    /// has rejoined, with its new metadata.
    pub fn is_stale_member(&self) -> bool {
        matches!(self, TxnError::Broker { api: TxnApi::TxnOffsetCommit, code, .. }
            if errors::STALE_MEMBER.iter().any(|e| e.code() == *code))
    }

    /// The producer can do nothing more: close it (rust-rdkafka's `is_fatal`; Java's
    /// `ProducerFencedException` and the authorization errors).
    pub fn is_fatal(&self) -> bool {
        self.kind() == Some(TxnErrorKind::Fatal)
    }
}

/// Names an operation the application started; its outcome comes as
/// [`TxnEvent::Done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// What the manager tells the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnEvent {
    /// An operation finished.
    Done {
        /// Which.
        op: OpId,
        /// How.
        result: Result<(), TxnError>,
    },
    /// The producer id and epoch to write with from now on (the accumulator's).
    ProducerId {
        /// The producer id.
        id: i64,
        /// The epoch.
        epoch: i16,
    },
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Any broker (FindCoordinator).
    AnyBroker,
    /// The transaction coordinator.
    TransactionCoordinator(NodeId),
    /// The group's coordinator (TxnOffsetCommit).
    GroupCoordinator(NodeId),
}

/// A request to send. Build the wire request with the `*_request` methods at the
/// version the broker negotiated.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum TxnBody {
    /// FindCoordinator for `key` (the transactional id, or the group id).
    FindCoordinator {
        /// The key.
        key: String,
        /// Which coordinator.
        kind: CoordinatorKind,
    },
    /// InitProducerId.
    InitProducerId(InitProducerIdRequest),
    /// AddPartitionsToTxn of these partitions: [`TxnBody::add_partitions_request`].
    AddPartitionsToTxn {
        /// The transactional id.
        transactional_id: String,
        /// The producer id.
        producer_id: i64,
        /// The epoch.
        epoch: i16,
        /// The partitions.
        partitions: Vec<TopicPartition>,
    },
    /// AddOffsetsToTxn.
    AddOffsetsToTxn(AddOffsetsToTxnRequest),
    /// TxnOffsetCommit.
    TxnOffsetCommit(TxnOffsetCommitRequest),
    /// EndTxn.
    EndTxn(EndTxnRequest),
}

impl TxnBody {
    /// The AddPartitionsToTxn request at `version` (v4+ batches transactions; this is
    /// one, with `verify_only` off).
    pub fn add_partitions_request(&self, version: i16) -> Option<AddPartitionsToTxnRequest> {
        let TxnBody::AddPartitionsToTxn {
            transactional_id,
            producer_id,
            epoch,
            partitions,
        } = self
        else {
            return None;
        };
        let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
        for tp in partitions {
            match topics.last_mut() {
                Some(t) if t.name.0.as_str() == tp.topic => t.partitions.push(tp.partition),
                _ => topics.push(
                    AddPartitionsToTxnTopic::default()
                        .with_name(TopicName(StrBytes::from_string(tp.topic.clone())))
                        .with_partitions(vec![tp.partition]),
                ),
            }
        }
        let id = TransactionalId(StrBytes::from_string(transactional_id.clone()));
        let request = if version >= 4 {
            AddPartitionsToTxnRequest::default().with_transactions(vec![
                AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(id)
                    .with_producer_id(ProducerId(*producer_id))
                    .with_producer_epoch(*epoch)
                    .with_verify_only(false)
                    .with_topics(topics),
            ])
        } else {
            AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(id)
                .with_v3_and_below_producer_id(ProducerId(*producer_id))
                .with_v3_and_below_producer_epoch(*epoch)
                .with_v3_and_below_topics(topics)
        };
        Some(request)
    }
}

/// An answer, as the driver decoded it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxnResponse {
    /// FindCoordinator: the node, or the error.
    FindCoordinator {
        /// The error code (0: found).
        error: i16,
        /// The coordinator.
        node: Option<NodeId>,
    },
    /// InitProducerId.
    InitProducerId {
        /// The error code.
        error: i16,
        /// The producer id.
        producer_id: i64,
        /// The epoch.
        epoch: i16,
    },
    /// AddPartitionsToTxn: the top-level error (v4+) and each partition's.
    AddPartitionsToTxn {
        /// The top-level error code.
        error: i16,
        /// Each partition's error code.
        partitions: Vec<(TopicPartition, i16)>,
    },
    /// AddOffsetsToTxn.
    AddOffsetsToTxn {
        /// The error code.
        error: i16,
    },
    /// TxnOffsetCommit: each partition's error code.
    TxnOffsetCommit {
        /// Each partition's error code.
        partitions: Vec<(TopicPartition, i16)>,
    },
    /// EndTxn.
    EndTxn {
        /// The error code.
        error: i16,
    },
}

impl TxnResponse {
    /// An AddPartitionsToTxn answer of either layout.
    pub fn from_add_partitions(response: &AddPartitionsToTxnResponse) -> Self {
        let mut partitions = Vec::new();
        let topics = response.results_by_topic_v3_and_below.iter().chain(
            response
                .results_by_transaction
                .iter()
                .flat_map(|t| &t.topic_results),
        );
        for t in topics {
            for p in &t.results_by_partition {
                partitions.push((
                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                    p.partition_error_code,
                ));
            }
        }
        TxnResponse::AddPartitionsToTxn {
            error: response.error_code,
            partitions,
        }
    }
}

/// Whether a response belongs to the request in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnToken(u64);

/// One queued piece of work.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    FindCoordinator(CoordinatorKind),
    InitProducerId {
        op: Option<OpId>,
        bump: bool,
    },
    AddPartitions,
    AddOffsets {
        op: OpId,
    },
    TxnOffsetCommit {
        op: OpId,
    },
    EndTxn {
        op: OpId,
        commit: bool,
        then_bump: bool,
    },
}

impl Step {
    /// Java's priorities: the coordinator, the producer id, the partitions and
    /// offsets, the end.
    fn priority(&self) -> u8 {
        match self {
            Step::FindCoordinator(_) => 0,
            Step::InitProducerId { .. } => 1,
            Step::AddPartitions => 2,
            Step::AddOffsets { .. } | Step::TxnOffsetCommit { .. } => 3,
            Step::EndTxn { .. } => 4,
        }
    }

    fn op(&self) -> Option<OpId> {
        match self {
            Step::InitProducerId { op, .. } => *op,
            Step::AddOffsets { op } | Step::TxnOffsetCommit { op } | Step::EndTxn { op, .. } => {
                Some(*op)
            }
            _ => None,
        }
    }

    fn api(&self) -> TxnApi {
        match self {
            Step::FindCoordinator(_) => TxnApi::FindCoordinator,
            Step::InitProducerId { .. } => TxnApi::InitProducerId,
            Step::AddPartitions => TxnApi::AddPartitionsToTxn,
            Step::AddOffsets { .. } => TxnApi::AddOffsetsToTxn,
            Step::TxnOffsetCommit { .. } => TxnApi::TxnOffsetCommit,
            Step::EndTxn { .. } => TxnApi::EndTxn,
        }
    }
}

#[derive(Debug)]
struct InFlight {
    token: u64,
    step: Step,
    /// AddPartitionsToTxn: the partitions it carries.
    partitions: Vec<TopicPartition>,
}

/// The transaction manager. See the module docs.
#[derive(Debug)]
pub struct TransactionManager {
    config: TransactionConfig,
    state: TxnState,
    producer: Option<(i64, i16)>,
    transaction_coordinator: Option<NodeId>,
    group_coordinator: Option<NodeId>,
    /// Partitions the coordinator has in the open transaction.
    added: BTreeSet<TopicPartition>,
    /// Partitions with records waiting to be added.
    to_add: BTreeSet<TopicPartition>,
    /// The coordinator knows of the open transaction (a partition or the offsets were
    /// added): its end needs an EndTxn.
    started: bool,
    /// The offsets of the pending `send_offsets`.
    offsets: Option<(GroupMetadata, Vec<TxnOffset>)>,
    /// The last abortable error needs a new epoch after the abort.
    bump_after_abort: bool,
    /// ... and EndTxn must be skipped (the producer id's mapping is gone).
    skip_end_txn: bool,
    batches_pending: bool,
    /// The `init`, `commit` or `abort` under way: the same call again (after the
    /// caller gave up waiting, Java's `TimeoutException`) resumes it.
    under_way: Option<OpId>,
    steps: VecDeque<Step>,
    in_flight: Option<InFlight>,
    next_token: u64,
    next_op: u64,
    retry_at: Option<Instant>,
    failures: u32,
    backoff: Backoff,
    events: VecDeque<TxnEvent>,
}

impl TransactionManager {
    /// A manager for `config`, before `init`.
    pub fn new(config: TransactionConfig) -> Self {
        let backoff = Backoff::new(config.retry_backoff, config.retry_backoff_max, config.seed);
        Self {
            config,
            state: TxnState::Uninitialized,
            producer: None,
            transaction_coordinator: None,
            group_coordinator: None,
            added: BTreeSet::new(),
            to_add: BTreeSet::new(),
            started: false,
            offsets: None,
            bump_after_abort: false,
            skip_end_txn: false,
            batches_pending: false,
            under_way: None,
            steps: VecDeque::new(),
            in_flight: None,
            next_token: 0,
            next_op: 0,
            retry_at: None,
            failures: 0,
            backoff,
            events: VecDeque::new(),
        }
    }

    /// The state.
    pub fn state(&self) -> &TxnState {
        &self.state
    }

    /// The producer id and epoch, once initialized.
    pub fn producer(&self) -> Option<(i64, i16)> {
        self.producer
    }

    fn op(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    fn state_name(&self) -> &'static str {
        match self.state {
            TxnState::Uninitialized => "uninitialized",
            TxnState::Initializing => "initializing",
            TxnState::Ready => "ready (no transaction open)",
            TxnState::InTransaction => "in a transaction",
            TxnState::Committing => "committing",
            TxnState::Aborting => "aborting",
            TxnState::Abortable(_) => "the transaction must be aborted",
            TxnState::Fatal(_) => "the producer has failed",
        }
    }

    /// Refuses `call` outside `allowed`; an abortable or fatal state answers with its
    /// error, as Java's `maybeFailWithError`.
    fn check(&self, call: &'static str, allowed: &[&str]) -> Result<(), TxnError> {
        match &self.state {
            TxnState::Fatal(e) => return Err(e.clone()),
            TxnState::Abortable(e) if !allowed.contains(&"abortable") => return Err(e.clone()),
            _ => {}
        }
        let name = match self.state {
            TxnState::Uninitialized => "uninitialized",
            TxnState::Initializing => "initializing",
            TxnState::Ready => "ready",
            TxnState::InTransaction => "in-transaction",
            TxnState::Committing => "committing",
            TxnState::Aborting => "aborting",
            TxnState::Abortable(_) => "abortable",
            TxnState::Fatal(_) => "fatal",
        };
        if allowed.contains(&name) {
            Ok(())
        } else {
            Err(TxnError::State {
                call,
                state: self.state_name(),
            })
        }
    }

    // ----- the application's calls -----

    /// `initTransactions`: finds the coordinator and takes the producer id, fencing
    /// any earlier instance with the same `transactional.id`.
    pub fn init(&mut self) -> Result<OpId, TxnError> {
        if let Some(op) = self.resume(TxnState::Initializing) {
            return Ok(op);
        }
        self.check("init_transactions", &["uninitialized"])?;
        self.state = TxnState::Initializing;
        let op = self.op();
        self.under_way = Some(op);
        self.push(Step::InitProducerId {
            op: Some(op),
            bump: false,
        });
        Ok(op)
    }

    /// `beginTransaction`: nothing goes to the broker until records or offsets do.
    pub fn begin(&mut self) -> Result<(), TxnError> {
        self.check("begin_transaction", &["ready"])?;
        self.state = TxnState::InTransaction;
        self.added.clear();
        self.to_add.clear();
        self.started = false;
        Ok(())
    }

    /// A record of the open transaction goes to `tp`: it is added to the transaction
    /// (in the next AddPartitionsToTxn) unless it is already.
    pub fn add_partition(&mut self, tp: &TopicPartition) -> Result<(), TxnError> {
        self.check("send", &["in-transaction"])?;
        if !self.added.contains(tp) && !self.to_add.contains(tp) {
            self.to_add.insert(tp.clone());
            if !self.steps.contains(&Step::AddPartitions) {
                self.push(Step::AddPartitions);
            }
        }
        Ok(())
    }

    /// Whether a record may be sent now: a transaction is open and not failed. Ask
    /// before appending, then [`TransactionManager::add_partition`] with the partition
    /// the record went to.
    pub fn check_send(&self) -> Result<(), TxnError> {
        self.check("send", &["in-transaction"])
    }

    /// Whether batches not yet sent must fail now (Java's `abortUndrainedBatches`):
    /// the transaction is aborting, can only be aborted, or the producer failed.
    pub fn aborts_undrained(&self) -> bool {
        // Fatal too: nothing of this producer can commit any more, and batches held
        // for an AddPartitionsToTxn that will never come would wait for ever.
        matches!(
            self.state,
            TxnState::Aborting | TxnState::Abortable(_) | TxnState::Fatal(_)
        )
    }

    /// Whether batches of `tp` may be sent: the coordinator added it to the
    /// transaction.
    pub fn may_send(&self, tp: &TopicPartition) -> bool {
        self.added.contains(tp)
    }

    /// `sendOffsetsToTransaction`: the consumer's offsets commit with the transaction.
    pub fn send_offsets(
        &mut self,
        group: GroupMetadata,
        offsets: Vec<TxnOffset>,
    ) -> Result<OpId, TxnError> {
        self.check("send_offsets_to_transaction", &["in-transaction"])?;
        let op = self.op();
        if self.offsets.is_some() {
            return Err(TxnError::State {
                call: "send_offsets_to_transaction",
                state: "another send_offsets_to_transaction is under way",
            });
        }
        self.offsets = Some((group, offsets));
        self.group_coordinator = None;
        self.push(Step::AddOffsets { op });
        Ok(op)
    }

    /// `commitTransaction`: once every batch is answered, EndTxn(commit).
    pub fn commit(&mut self) -> Result<OpId, TxnError> {
        if let Some(op) = self.resume(TxnState::Committing) {
            return Ok(op);
        }
        self.check("commit_transaction", &["in-transaction"])?;
        self.state = TxnState::Committing;
        let op = self.op();
        self.under_way = Some(op);
        self.push(Step::EndTxn {
            op,
            commit: true,
            then_bump: false,
        });
        Ok(op)
    }

    /// Whether a transaction is open for [`TransactionManager::abort`] to end: begun
    /// and not ending, or only abortable (what Java's `close` aborts).
    pub fn is_open(&self) -> bool {
        self.check("abort_transaction", ABORTABLE).is_ok()
    }

    /// `abortTransaction`: once every batch is answered, EndTxn(abort); after an
    /// error that needs it, a new epoch.
    pub fn abort(&mut self) -> Result<OpId, TxnError> {
        if let Some(op) = self.resume(TxnState::Aborting) {
            return Ok(op);
        }
        self.check("abort_transaction", ABORTABLE)?;
        self.state = TxnState::Aborting;
        self.to_add.clear();
        self.steps.retain(|s| *s != Step::AddPartitions);
        let op = self.op();
        self.under_way = Some(op);
        let bump = std::mem::take(&mut self.bump_after_abort);
        if std::mem::take(&mut self.skip_end_txn) {
            self.push(Step::InitProducerId {
                op: Some(op),
                bump: true,
            });
        } else {
            self.push(Step::EndTxn {
                op,
                commit: false,
                then_bump: bump,
            });
        }
        Ok(op)
    }

    /// Whether batches of the transaction are still unanswered (written or not):
    /// EndTxn waits until none are.
    pub fn set_batches_pending(&mut self, pending: bool) {
        self.batches_pending = pending;
    }

    /// A batch of the transaction failed for good with `code` (the accumulator gave
    /// up on it).
    pub fn handle_produce_error(&mut self, code: i16) {
        // Batches failing while the transaction aborts, or outside one, change nothing.
        if matches!(self.state, TxnState::InTransaction | TxnState::Committing) {
            self.apply_error(TxnApi::Produce, code, None);
        }
    }

    /// A record of the transaction failed for good (the accumulator's delivery):
    /// a broker's refusal counts by its code, the delivery timeout as
    /// REQUEST_TIMED_OUT, anything else as UNKNOWN_SERVER_ERROR (abortable, as Java's
    /// `Sender` fails the transaction on any failed batch). A record that failed
    /// because the transaction was aborting, or the producer closing, changes
    /// nothing.
    pub fn handle_produce_failure(&mut self, error: &ProduceError) {
        let code = match error {
            ProduceError::Aborted | ProduceError::Closed => return,
            ProduceError::Broker { code, .. } => *code,
            ProduceError::Timeout { .. } => ResponseError::RequestTimedOut.code(),
            _ => ResponseError::UnknownServerError.code(),
        };
        self.handle_produce_error(code);
    }

    // ----- the driver's side -----

    fn push(&mut self, step: Step) {
        let at = self
            .steps
            .iter()
            .position(|s| s.priority() > step.priority())
            .unwrap_or(self.steps.len());
        self.steps.insert(at, step);
    }

    fn next_token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    /// The next request, if one can go now.
    pub fn poll_request(&mut self, now: Instant) -> Option<(Destination, TxnBody, TxnToken)> {
        if self.in_flight.is_some() || self.retry_at.is_some_and(|t| now < t) {
            return None;
        }
        self.retry_at = None;
        loop {
            let step = self.steps.front()?.clone();
            // Steps that need a coordinator look it up first.
            let needs = match &step {
                Step::FindCoordinator(_) => None,
                Step::TxnOffsetCommit { .. } => Some(CoordinatorKind::Group),
                _ => Some(CoordinatorKind::Transaction),
            };
            let known = match needs {
                Some(CoordinatorKind::Transaction) => self.transaction_coordinator.is_some(),
                Some(CoordinatorKind::Group) => self.group_coordinator.is_some(),
                None => true,
            };
            if let (Some(kind), false) = (needs, known) {
                self.steps.push_front(Step::FindCoordinator(kind));
                continue;
            }
            match &step {
                Step::EndTxn { .. } if !self.to_add.is_empty() || self.batches_pending => {
                    // Waits for the partitions and the batches.
                    return None;
                }
                Step::EndTxn {
                    op,
                    commit,
                    then_bump,
                } if !self.started => {
                    // The coordinator never heard of this transaction.
                    let (op, commit, then_bump) = (*op, *commit, *then_bump);
                    self.steps.pop_front();
                    self.end_done(op, commit, then_bump);
                    continue;
                }
                Step::AddPartitions if self.to_add.is_empty() => {
                    self.steps.pop_front();
                    continue;
                }
                _ => {}
            }
            self.steps.pop_front();
            let token = self.next_token();
            let (destination, body, partitions) = self.build(&step)?;
            self.in_flight = Some(InFlight {
                token,
                step,
                partitions,
            });
            return Some((destination, body, TxnToken(token)));
        }
    }

    fn build(&self, step: &Step) -> Option<(Destination, TxnBody, Vec<TopicPartition>)> {
        let txn_id = self.config.transactional_id.clone();
        let id = || TransactionalId(StrBytes::from_string(txn_id.clone()));
        let (pid, epoch) = self.producer.unwrap_or((-1, -1));
        let to_txn = self
            .transaction_coordinator
            .map(Destination::TransactionCoordinator);
        Some(match step {
            Step::FindCoordinator(kind) => {
                let key = match kind {
                    CoordinatorKind::Transaction => txn_id.clone(),
                    CoordinatorKind::Group => self.offsets.as_ref()?.0.group_id.clone(),
                };
                (
                    Destination::AnyBroker,
                    TxnBody::FindCoordinator { key, kind: *kind },
                    Vec::new(),
                )
            }
            Step::InitProducerId { bump, .. } => {
                let (p, e) = if *bump { (pid, epoch) } else { (-1, -1) };
                let timeout =
                    i32::try_from(self.config.transaction_timeout.as_millis()).unwrap_or(i32::MAX);
                let request = InitProducerIdRequest::default()
                    .with_transactional_id(Some(id()))
                    .with_transaction_timeout_ms(timeout)
                    .with_producer_id(ProducerId(p))
                    .with_producer_epoch(e);
                (to_txn?, TxnBody::InitProducerId(request), Vec::new())
            }
            Step::AddPartitions => {
                let partitions: Vec<TopicPartition> = self.to_add.iter().cloned().collect();
                (
                    to_txn?,
                    TxnBody::AddPartitionsToTxn {
                        transactional_id: txn_id.clone(),
                        producer_id: pid,
                        epoch,
                        partitions: partitions.clone(),
                    },
                    partitions,
                )
            }
            Step::AddOffsets { .. } => {
                let group = &self.offsets.as_ref()?.0;
                let request = AddOffsetsToTxnRequest::default()
                    .with_transactional_id(id())
                    .with_producer_id(ProducerId(pid))
                    .with_producer_epoch(epoch)
                    .with_group_id(GroupId(StrBytes::from_string(group.group_id.clone())));
                (to_txn?, TxnBody::AddOffsetsToTxn(request), Vec::new())
            }
            Step::TxnOffsetCommit { .. } => {
                let (group, offsets) = self.offsets.as_ref()?;
                let mut topics: Vec<TxnOffsetCommitRequestTopic> = Vec::new();
                for o in offsets {
                    let partition = TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(o.partition.partition)
                        .with_committed_offset(o.offset)
                        .with_committed_leader_epoch(o.leader_epoch)
                        .with_committed_metadata(o.metadata.clone().map(StrBytes::from_string));
                    match topics.last_mut() {
                        Some(t) if t.name.0.as_str() == o.partition.topic => {
                            t.partitions.push(partition)
                        }
                        _ => topics.push(
                            TxnOffsetCommitRequestTopic::default()
                                .with_name(TopicName(StrBytes::from_string(
                                    o.partition.topic.clone(),
                                )))
                                .with_partitions(vec![partition]),
                        ),
                    }
                }
                let request = TxnOffsetCommitRequest::default()
                    .with_transactional_id(id())
                    .with_group_id(GroupId(StrBytes::from_string(group.group_id.clone())))
                    .with_producer_id(ProducerId(pid))
                    .with_producer_epoch(epoch)
                    .with_generation_id(group.generation_id)
                    .with_member_id(StrBytes::from_string(group.member_id.clone()))
                    .with_group_instance_id(
                        group.group_instance_id.clone().map(StrBytes::from_string),
                    )
                    .with_topics(topics);
                (
                    Destination::GroupCoordinator(self.group_coordinator?),
                    TxnBody::TxnOffsetCommit(request),
                    Vec::new(),
                )
            }
            Step::EndTxn { commit, .. } => {
                let request = EndTxnRequest::default()
                    .with_transactional_id(id())
                    .with_producer_id(ProducerId(pid))
                    .with_producer_epoch(epoch)
                    .with_committed(*commit);
                (to_txn?, TxnBody::EndTxn(request), Vec::new())
            }
        })
    }

    /// When a retry is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<TxnEvent> {
        self.events.pop_front()
    }

    fn take_in_flight(&mut self, token: TxnToken) -> Option<InFlight> {
        if self.in_flight.as_ref().is_some_and(|f| f.token == token.0) {
            self.in_flight.take()
        } else {
            None
        }
    }

    /// The request went unanswered (disconnect, timeout): the coordinator is looked
    /// up again and the request goes again, as Java does.
    pub fn handle_failure(&mut self, now: Instant, token: TxnToken, failure: Failure) {
        let Some(flight) = self.take_in_flight(token) else {
            return;
        };
        if let Failure::Unsupported(detail) = failure {
            // No retry can help: the broker lacks the API.
            let error = TxnError::Unsupported {
                api: flight.step.api(),
                detail,
            };
            if !matches!(self.state, TxnState::Fatal(_)) {
                warn!(%error, "transactional producer failed");
                self.state = TxnState::Fatal(error.clone());
            }
            let op = flight.step.op();
            self.fail_queued(error, op);
            return;
        }
        debug!(step = ?flight.step, ?failure, "transactional request failed; retrying");
        let kind = match flight.step {
            Step::TxnOffsetCommit { .. } => CoordinatorKind::Group,
            _ => CoordinatorKind::Transaction,
        };
        self.retry(now, flight.step, Some(kind));
    }

    fn retry(&mut self, now: Instant, step: Step, rediscover: Option<CoordinatorKind>) {
        self.failures += 1;
        self.retry_at = Some(now + self.backoff.delay(self.failures));
        self.steps.push_front(step);
        match rediscover {
            Some(CoordinatorKind::Transaction) => {
                self.transaction_coordinator = None;
            }
            Some(CoordinatorKind::Group) => self.group_coordinator = None,
            None => {}
        }
    }

    /// An answer to the request in flight.
    pub fn handle_response(&mut self, now: Instant, token: TxnToken, response: TxnResponse) {
        let Some(flight) = self.take_in_flight(token) else {
            return;
        };
        let api = flight.step.api();
        // The worst error of the answer decides (a partition's error counts).
        let code = match &response {
            TxnResponse::FindCoordinator { error, .. }
            | TxnResponse::InitProducerId { error, .. }
            | TxnResponse::AddOffsetsToTxn { error }
            | TxnResponse::EndTxn { error } => *error,
            TxnResponse::AddPartitionsToTxn { error, partitions } => worst(
                api,
                std::iter::once(*error).chain(partitions.iter().map(|p| p.1)),
            ),
            TxnResponse::TxnOffsetCommit { partitions } => {
                worst(api, partitions.iter().map(|p| p.1))
            }
        };
        match errors::disposition(api, code) {
            Disposition::Done => {
                self.failures = 0;
                self.done(flight, response);
            }
            Disposition::Retry => self.retry(now, flight.step, None),
            Disposition::FindCoordinator(kind) => self.retry(now, flight.step, Some(kind)),
            Disposition::Abortable | Disposition::AbortableBumpEpoch | Disposition::Fatal => {
                let op = flight.step.op();
                self.apply_error(api, code, op);
            }
        }
    }

    fn done(&mut self, flight: InFlight, response: TxnResponse) {
        match (flight.step, response) {
            (Step::FindCoordinator(kind), TxnResponse::FindCoordinator { node, .. }) => {
                match kind {
                    CoordinatorKind::Transaction => self.transaction_coordinator = node,
                    CoordinatorKind::Group => self.group_coordinator = node,
                }
            }
            (
                Step::InitProducerId { op, .. },
                TxnResponse::InitProducerId {
                    producer_id, epoch, ..
                },
            ) => {
                self.producer = Some((producer_id, epoch));
                self.events.push_back(TxnEvent::ProducerId {
                    id: producer_id,
                    epoch,
                });
                self.state = TxnState::Ready;
                if let Some(op) = op {
                    self.finish(op, Ok(()));
                }
            }
            (Step::AddPartitions, _) => {
                for tp in flight.partitions {
                    self.to_add.remove(&tp);
                    self.added.insert(tp);
                }
                self.started = true;
                if !self.to_add.is_empty() && !self.steps.contains(&Step::AddPartitions) {
                    self.push(Step::AddPartitions);
                }
            }
            (Step::AddOffsets { op }, _) => {
                self.started = true;
                self.push(Step::TxnOffsetCommit { op });
            }
            (Step::TxnOffsetCommit { op }, _) => {
                self.offsets = None;
                self.finish(op, Ok(()));
            }
            (
                Step::EndTxn {
                    op,
                    commit,
                    then_bump,
                },
                _,
            ) => self.end_done(op, commit, then_bump),
            (step, response) => {
                warn!(
                    ?step,
                    ?response,
                    "a transactional answer of the wrong kind; ignored"
                );
            }
        }
    }

    fn end_done(&mut self, op: OpId, commit: bool, then_bump: bool) {
        self.added.clear();
        self.to_add.clear();
        self.started = false;
        self.offsets = None;
        if then_bump {
            self.push(Step::InitProducerId {
                op: Some(op),
                bump: true,
            });
            return;
        }
        debug!(commit, "transaction ended");
        self.state = TxnState::Ready;
        self.finish(op, Ok(()));
    }

    fn finish(&mut self, op: OpId, result: Result<(), TxnError>) {
        if self.under_way == Some(op) {
            self.under_way = None;
        }
        self.events.push_back(TxnEvent::Done { op, result });
    }

    /// The operation under way in `state`, when the manager is in it: the same call
    /// again waits for it instead of failing as a call out of turn.
    fn resume(&self, state: TxnState) -> Option<OpId> {
        (self.state == state).then_some(self.under_way).flatten()
    }

    /// An abortable or fatal error: the state moves, the operation in flight fails,
    /// and so do queued ones (in an abortable state all but the abort's own steps).
    fn apply_error(&mut self, api: TxnApi, code: i16, op: Option<OpId>) {
        let disposition = errors::disposition(api, code);
        let kind = match disposition {
            Disposition::Fatal => TxnErrorKind::Fatal,
            Disposition::Abortable | Disposition::AbortableBumpEpoch => TxnErrorKind::Abortable,
            _ => return,
        };
        let error = TxnError::Broker { kind, api, code };
        if matches!(self.state, TxnState::Fatal(_)) {
            return;
        }
        // An abort under way stays an abort; an error during it is fatal (Java).
        let aborting = self.state == TxnState::Aborting;
        let error = if aborting || kind == TxnErrorKind::Fatal {
            let fatal = TxnError::Broker {
                kind: TxnErrorKind::Fatal,
                api,
                code,
            };
            warn!(error = %fatal, "transactional producer failed");
            self.state = TxnState::Fatal(fatal.clone());
            fatal
        } else {
            warn!(%error, "transaction must be aborted");
            if disposition == Disposition::AbortableBumpEpoch {
                self.bump_after_abort = true;
                self.skip_end_txn =
                    code == kafka_protocol::error::ResponseError::InvalidProducerIdMapping.code();
            }
            if matches!(self.state, TxnState::Initializing | TxnState::Ready) {
                // Nothing to abort outside a transaction: the producer id is lost.
                self.state = TxnState::Fatal(error.clone());
            } else {
                self.state = TxnState::Abortable(error.clone());
            }
            error
        };
        self.fail_queued(error, op);
    }

    /// Fails `op` (the operation in flight) and the queued operations with `error`
    /// (in an abortable state, all but the abort's own coordinator lookups).
    fn fail_queued(&mut self, error: TxnError, op: Option<OpId>) {
        if let Some(op) = op {
            self.finish(op, Err(error.clone()));
        }
        let fatal = matches!(self.state, TxnState::Fatal(_));
        let failed: Vec<OpId> = self
            .steps
            .iter()
            .filter(|s| fatal || !matches!(s, Step::FindCoordinator(_)))
            .filter_map(Step::op)
            .filter(|o| Some(*o) != op)
            .collect();
        self.steps.clear();
        self.to_add.clear();
        self.offsets = None;
        for o in failed {
            self.finish(o, Err(error.clone()));
        }
    }
}

/// The code that decides an answer with several: the first abortable or fatal one,
/// else the first retried one (OPERATION_NOT_ATTEMPTED, which only says another
/// partition failed, last), else 0.
fn worst(api: TxnApi, codes: impl Iterator<Item = i16>) -> i16 {
    let not_attempted = kafka_protocol::error::ResponseError::OperationNotAttempted.code();
    let mut retry = 0;
    for code in codes {
        match errors::disposition(api, code) {
            Disposition::Done => {}
            Disposition::Retry | Disposition::FindCoordinator(_) => {
                if retry == 0 || retry == not_attempted {
                    retry = code;
                }
            }
            _ => return code,
        }
    }
    retry
}
