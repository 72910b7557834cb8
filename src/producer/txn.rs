//! The transactional producer's IO: the public calls (`init_transactions`,
//! `begin_transaction`, ...) hand operations to the sans-IO
//! [`TransactionManager`](crate::proto::produce::transaction::TransactionManager) and
//! wait for their outcome; the background task sends the requests it asks for, to
//! the broker it names, and hands back the answers. Every rule (which error aborts,
//! which fences, when EndTxn may go) lives in the manager.

use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, EndTxnRequest, FindCoordinatorRequest,
    InitProducerIdRequest, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;

use super::*;
use crate::proto::produce::transaction::{
    CoordinatorKind, Destination, OpId, TxnBody, TxnEvent, TxnResponse, TxnToken,
};
pub use crate::proto::produce::transaction::{
    GroupMetadata as ConsumerGroupMetadata, TxnApi as TransactionApi, TxnError as TransactionError,
    TxnErrorKind as TransactionErrorKind, TxnOffset,
};

/// The driver's side of the transaction manager, kept in the producer's state.
#[derive(Debug, Default)]
pub(super) struct TxnIo {
    /// Callers waiting for an operation's outcome (more than one when a call is
    /// made again while its operation is under way).
    pub(super) waiters:
        HashMap<OpId, Vec<oneshot::Sender<std::result::Result<(), TransactionError>>>>,
    /// Coordinators' addresses, as FindCoordinator named them (a coordinator need not
    /// be in the metadata yet).
    pub(super) coordinators: HashMap<NodeId, String>,
}

fn closed(call: &'static str) -> TransactionError {
    TransactionError::State {
        call,
        state: "the producer is closed",
    }
}

impl Producer {
    /// Starts an operation on the transaction manager and waits for its outcome.
    async fn txn_op(
        &self,
        call: &'static str,
        start: impl FnOnce(&mut State) -> std::result::Result<Option<OpId>, TransactionError>,
    ) -> std::result::Result<(), TransactionError> {
        let rx = {
            let mut s = lock(&self.shared.state);
            if s.closed {
                return Err(closed(call));
            }
            let Some(op) = start(&mut s)? else {
                return Ok(());
            };
            let (tx, rx) = oneshot::channel();
            s.txn_io.waiters.entry(op).or_default().push(tx);
            rx
        };
        self.shared.wake_driver.notify_one();
        // Bounded by max.block.ms, as Java's calls are: a coordinator that never
        // answers (or hangs up on every attempt) must not hang the application.
        match tokio::time::timeout(self.max_block, rx).await {
            Ok(result) => result.unwrap_or_else(|_| Err(closed(call))),
            Err(_) => Err(TransactionError::Timeout {
                call,
                after: self.max_block,
            }),
        }
    }

    fn no_transactional_id(call: &'static str) -> TransactionError {
        TransactionError::State {
            call,
            state: "the producer has no transactional.id",
        }
    }

    /// `initTransactions` (Java), `init_transactions` (rust-rdkafka): finds the
    /// transaction coordinator of `transactional.id` and takes its producer id and a
    /// new epoch, which fences every earlier producer with the same id (its open
    /// transaction is aborted). Call once, before the first transaction.
    pub async fn init_transactions(&self) -> std::result::Result<(), TransactionError> {
        const CALL: &str = "init_transactions";
        self.txn_op(CALL, |s| {
            let txn = s.txn.as_mut().ok_or(Self::no_transactional_id(CALL))?;
            txn.init().map(Some)
        })
        .await
    }

    /// `beginTransaction`: opens a transaction. Nothing goes to the broker until a
    /// record or offsets do; records may be sent only inside a transaction.
    pub fn begin_transaction(&self) -> std::result::Result<(), TransactionError> {
        const CALL: &str = "begin_transaction";
        let mut s = lock(&self.shared.state);
        if s.closed {
            return Err(closed(CALL));
        }
        s.txn
            .as_mut()
            .ok_or(Self::no_transactional_id(CALL))?
            .begin()
    }

    /// `sendOffsetsToTransaction`: the consumer's offsets (the next record to read of
    /// each partition) commit if and only if the transaction does. `group` is the
    /// consumer's [`Consumer::group_metadata`](crate::Consumer::group_metadata): the
    /// group coordinator refuses offsets from a generation that moved on (KIP-447),
    /// which makes the transaction abortable.
    pub async fn send_offsets_to_transaction(
        &self,
        offsets: Vec<TxnOffset>,
        group: ConsumerGroupMetadata,
    ) -> std::result::Result<(), TransactionError> {
        const CALL: &str = "send_offsets_to_transaction";
        self.txn_op(CALL, |s| {
            let txn = s.txn.as_mut().ok_or(Self::no_transactional_id(CALL))?;
            txn.send_offsets(group, offsets).map(Some)
        })
        .await
    }

    /// `commitTransaction`: sends every record of the transaction, waits for their
    /// deliveries, then ends the transaction with a commit. An abortable error
    /// ([`TransactionError::txn_requires_abort`]) leaves the transaction to be
    /// aborted; a fatal one ([`TransactionError::is_fatal`]) leaves a producer that
    /// can only be closed.
    pub async fn commit_transaction(&self) -> std::result::Result<(), TransactionError> {
        const CALL: &str = "commit_transaction";
        self.txn_op(CALL, |s| {
            let State { txn, acc, .. } = s;
            let txn = txn.as_mut().ok_or(Self::no_transactional_id(CALL))?;
            let op = txn.commit()?;
            acc.flush();
            Ok(Some(op))
        })
        .await
    }

    /// `abortTransaction`: records not yet sent fail with
    /// [`ProduceError::Aborted`]; once those sent are answered, the transaction ends
    /// with an abort, and `read_committed` consumers never see its records. After an
    /// error that lost the producer's sequence state, the abort ends with a new epoch
    /// (KIP-360), and the next transaction can commit.
    pub async fn abort_transaction(&self) -> std::result::Result<(), TransactionError> {
        const CALL: &str = "abort_transaction";
        self.txn_op(CALL, |s| {
            let txn = s.txn.as_mut().ok_or(Self::no_transactional_id(CALL))?;
            txn.abort().map(Some)
        })
        .await
    }
}

/// One step of the driver loop for the transaction manager: the undrained batches of
/// an aborting transaction fail, the manager learns whether batches are pending, its
/// events are handed out, and its next request (if any) is returned to be sent.
pub(super) fn step(
    s: &mut State,
    now: std::time::Instant,
) -> Option<(Destination, TxnBody, TxnToken)> {
    let State {
        txn, acc, txn_io, ..
    } = s;
    let txn = txn.as_mut()?;
    if txn.aborts_undrained() {
        acc.abort_undrained();
    }
    txn.set_batches_pending(!acc.is_idle());
    while let Some(event) = txn.poll_event() {
        match event {
            TxnEvent::Done { op, result } => {
                for tx in txn_io.waiters.remove(&op).unwrap_or_default() {
                    let _ = tx.send(result.clone());
                }
            }
            TxnEvent::ProducerId { id, epoch } => acc.set_producer_id(now, Ok((id, epoch))),
        }
    }
    txn.poll_request(now)
}

/// Sends one request of the transaction manager and hands back its answer.
pub(super) async fn send(
    cluster: Cluster,
    shared: Arc<Shared>,
    destination: Destination,
    body: TxnBody,
    token: TxnToken,
) {
    let result = exchange(&cluster, &shared, destination, body).await;
    {
        let mut s = lock(&shared.state);
        let now = Instant::now().into_std();
        if let Some(txn) = s.txn.as_mut() {
            match result {
                Ok(response) => txn.handle_response(now, token, response),
                Err(e) => {
                    debug!(error = %e, "transactional request failed");
                    let failure = match e {
                        // The broker lacks the API: the manager fails for good
                        // instead of retrying (TxnError::Unsupported).
                        e @ RequestError::UnsupportedVersion { .. } => {
                            crate::proto::Failure::Unsupported(e.to_string())
                        }
                        e => crate::driver::failure(e),
                    };
                    txn.handle_failure(now, token, failure);
                }
            }
        }
    }
    shared.wake_driver.notify_one();
}

async fn exchange(
    cluster: &Cluster,
    shared: &Shared,
    destination: Destination,
    body: TxnBody,
) -> std::result::Result<TxnResponse, RequestError> {
    let conn = match destination {
        Destination::AnyBroker => cluster.any_connection(),
        Destination::TransactionCoordinator(node) | Destination::GroupCoordinator(node) => {
            let address = lock(&shared.state).txn_io.coordinators.get(&node).cloned();
            match address {
                Some(a) => cluster.coordinator_connection(&a),
                None => match cluster.broker(node) {
                    Ok(c) => c,
                    Err(_) => {
                        return Err(RequestError::Disconnected {
                            broker: format!("node {}", node.0),
                            reason: "the coordinator's address is unknown".into(),
                        });
                    }
                },
            }
        }
    };
    let versions = conn.versions().await?;
    let version = |api: ApiKey| {
        versions
            .version(api)
            .ok_or_else(|| RequestError::UnsupportedVersion {
                broker: conn.address().to_string(),
                api,
                version: -1,
                negotiated: "none".into(),
            })
    };
    Ok(match body {
        TxnBody::FindCoordinator { key, kind } => {
            let v = version(ApiKey::FindCoordinator)?;
            let key_type = match kind {
                CoordinatorKind::Group => 0,
                CoordinatorKind::Transaction => 1,
            };
            let mut r = FindCoordinatorRequest::default().with_key_type(key_type);
            if v >= 4 {
                r.coordinator_keys = vec![StrBytes::from_string(key)];
            } else {
                r.key = StrBytes::from_string(key);
            }
            let response = conn.send_version(&r, v).await?;
            let (error, node, host, port) = match response.coordinators.first() {
                Some(c) if v >= 4 => (c.error_code, c.node_id.0, c.host.to_string(), c.port),
                _ => (
                    response.error_code,
                    response.node_id.0,
                    response.host.to_string(),
                    response.port,
                ),
            };
            let node = (error == 0 && node >= 0).then_some(NodeId(node));
            if let Some(n) = node {
                lock(&shared.state)
                    .txn_io
                    .coordinators
                    .insert(n, format!("{host}:{port}"));
            }
            TxnResponse::FindCoordinator { error, node }
        }
        TxnBody::InitProducerId(r) => {
            let v = version(ApiKey::InitProducerId)?;
            let response = conn.send_version::<InitProducerIdRequest>(&r, v).await?;
            TxnResponse::InitProducerId {
                error: response.error_code,
                producer_id: response.producer_id.0,
                epoch: response.producer_epoch,
            }
        }
        body @ TxnBody::AddPartitionsToTxn { .. } => {
            let v = version(ApiKey::AddPartitionsToTxn)?;
            let Some(r) = body.add_partitions_request(v) else {
                return Err(RequestError::Disconnected {
                    broker: conn.address().to_string(),
                    reason: "no AddPartitionsToTxn request to build".into(),
                });
            };
            let response = conn
                .send_version::<AddPartitionsToTxnRequest>(&r, v)
                .await?;
            TxnResponse::from_add_partitions(&response)
        }
        TxnBody::AddOffsetsToTxn(r) => {
            let v = version(ApiKey::AddOffsetsToTxn)?;
            let response = conn.send_version::<AddOffsetsToTxnRequest>(&r, v).await?;
            TxnResponse::AddOffsetsToTxn {
                error: response.error_code,
            }
        }
        TxnBody::TxnOffsetCommit(r) => {
            let v = version(ApiKey::TxnOffsetCommit)?;
            let response = conn.send_version::<TxnOffsetCommitRequest>(&r, v).await?;
            let partitions = response
                .topics
                .iter()
                .flat_map(|t| {
                    t.partitions.iter().map(|p| {
                        (
                            crate::proto::group::consumer_protocol::TopicPartition::new(
                                t.name.0.to_string(),
                                p.partition_index,
                            ),
                            p.error_code,
                        )
                    })
                })
                .collect();
            TxnResponse::TxnOffsetCommit { partitions }
        }
        TxnBody::EndTxn(r) => {
            let v = version(ApiKey::EndTxn)?;
            let response = conn.send_version::<EndTxnRequest>(&r, v).await?;
            TxnResponse::EndTxn {
                error: response.error_code,
            }
        }
        _ => {
            return Err(RequestError::Disconnected {
                broker: conn.address().to_string(),
                reason: "a transactional request ottla cannot send".into(),
            });
        }
    })
}
