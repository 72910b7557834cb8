//! The transaction manager on a virtual clock: the happy paths, and every row of the
//! error table driven through the request it answers.

use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError as E;

use super::errors::{RULES, STALE_MEMBER, disposition};
use super::*;

const TXN_NODE: NodeId = NodeId(7);
const GROUP_NODE: NodeId = NodeId(8);

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new("out", p)
}

fn group() -> GroupMetadata {
    GroupMetadata {
        group_id: "g".into(),
        generation_id: 4,
        member_id: "m-1".into(),
        group_instance_id: None,
    }
}

fn offsets() -> Vec<TxnOffset> {
    vec![TxnOffset {
        partition: TopicPartition::new("in", 0),
        offset: 42,
        leader_epoch: 3,
        metadata: None,
    }]
}

/// The answer of `api` with `code` (each partition of a per-partition answer too).
fn answer(api: TxnApi, code: i16, partitions: &[TopicPartition]) -> TxnResponse {
    match api {
        TxnApi::FindCoordinator => TxnResponse::FindCoordinator {
            error: code,
            node: None,
        },
        TxnApi::InitProducerId => TxnResponse::InitProducerId {
            error: code,
            producer_id: -1,
            epoch: -1,
        },
        TxnApi::AddPartitionsToTxn => TxnResponse::AddPartitionsToTxn {
            error: 0,
            partitions: partitions.iter().map(|p| (p.clone(), code)).collect(),
        },
        TxnApi::AddOffsetsToTxn => TxnResponse::AddOffsetsToTxn { error: code },
        TxnApi::TxnOffsetCommit => TxnResponse::TxnOffsetCommit {
            partitions: vec![(TopicPartition::new("in", 0), code)],
        },
        TxnApi::EndTxn | TxnApi::Produce => TxnResponse::EndTxn { error: code },
    }
}

/// Drives the manager's requests with good answers until `stop` says a request is the
/// one wanted, which is returned unanswered.
struct H {
    m: TransactionManager,
    now: Instant,
    next_pid_epoch: (i64, i16),
}

impl H {
    fn new() -> Self {
        Self {
            m: TransactionManager::new(TransactionConfig::new("tx-1")),
            now: Instant::now(),
            next_pid_epoch: (1000, 0),
        }
    }

    fn request(&mut self) -> (Destination, TxnBody, TxnToken) {
        self.m.poll_request(self.now).expect("a request")
    }

    /// Answers requests well until one of `api` comes; returns it.
    fn until(&mut self, api: TxnApi) -> (Destination, TxnBody, TxnToken) {
        for _ in 0..20 {
            let (dest, body, token) = self.request();
            if body_api(&body) == api {
                return (dest, body, token);
            }
            self.answer_well(&dest, &body, token);
        }
        panic!("no {api:?} request");
    }

    fn answer_well(&mut self, dest: &Destination, body: &TxnBody, token: TxnToken) {
        let response = match body {
            TxnBody::FindCoordinator { kind, .. } => {
                assert_eq!(*dest, Destination::AnyBroker);
                TxnResponse::FindCoordinator {
                    error: 0,
                    node: Some(match kind {
                        CoordinatorKind::Transaction => TXN_NODE,
                        CoordinatorKind::Group => GROUP_NODE,
                    }),
                }
            }
            TxnBody::InitProducerId(_) => {
                let (id, epoch) = self.next_pid_epoch;
                self.next_pid_epoch.1 += 1;
                TxnResponse::InitProducerId {
                    error: 0,
                    producer_id: id,
                    epoch,
                }
            }
            TxnBody::AddPartitionsToTxn { partitions, .. } => TxnResponse::AddPartitionsToTxn {
                error: 0,
                partitions: partitions.iter().map(|p| (p.clone(), 0)).collect(),
            },
            TxnBody::AddOffsetsToTxn(_) => TxnResponse::AddOffsetsToTxn { error: 0 },
            TxnBody::TxnOffsetCommit(_) => {
                assert_eq!(*dest, Destination::GroupCoordinator(GROUP_NODE));
                TxnResponse::TxnOffsetCommit {
                    partitions: vec![(TopicPartition::new("in", 0), 0)],
                }
            }
            TxnBody::EndTxn(_) => TxnResponse::EndTxn { error: 0 },
        };
        self.m.handle_response(self.now, token, response);
    }

    /// Runs every request with good answers until none is left.
    fn settle(&mut self) {
        while let Some((dest, body, token)) = self.m.poll_request(self.now) {
            self.answer_well(&dest, &body, token);
        }
    }

    fn done(&mut self) -> Vec<(OpId, Result<(), TxnError>)> {
        std::iter::from_fn(|| self.m.poll_event())
            .filter_map(|e| match e {
                TxnEvent::Done { op, result } => Some((op, result)),
                TxnEvent::ProducerId { .. } => None,
            })
            .collect()
    }

    fn ready() -> Self {
        let mut h = H::new();
        let op = h.m.init().expect("init");
        h.settle();
        assert_eq!(h.done(), vec![(op, Ok(()))]);
        assert_eq!(h.m.state(), &TxnState::Ready);
        h
    }
}

fn body_api(body: &TxnBody) -> TxnApi {
    match body {
        TxnBody::FindCoordinator { .. } => TxnApi::FindCoordinator,
        TxnBody::InitProducerId(_) => TxnApi::InitProducerId,
        TxnBody::AddPartitionsToTxn { .. } => TxnApi::AddPartitionsToTxn,
        TxnBody::AddOffsetsToTxn(_) => TxnApi::AddOffsetsToTxn,
        TxnBody::TxnOffsetCommit(_) => TxnApi::TxnOffsetCommit,
        TxnBody::EndTxn(_) => TxnApi::EndTxn,
    }
}

#[test]
fn a_transaction_adds_its_partitions_before_they_are_written_and_commits_with_its_offsets() {
    let mut h = H::ready();
    assert_eq!(h.m.producer(), Some((1000, 0)));
    h.m.begin().expect("begin");
    h.m.add_partition(&tp(0)).expect("add");
    h.m.add_partition(&tp(1)).expect("add");
    assert!(!h.m.may_send(&tp(0)), "not before AddPartitionsToTxn");
    let (dest, body, token) = h.request();
    assert_eq!(dest, Destination::TransactionCoordinator(TXN_NODE));
    let TxnBody::AddPartitionsToTxn { partitions, .. } = &body else {
        panic!("{body:?}");
    };
    assert_eq!(partitions, &vec![tp(0), tp(1)], "one request for both");
    // Both layouts name them.
    let v3 = body.add_partitions_request(3).expect("v3");
    assert_eq!(v3.v3_and_below_topics[0].partitions, vec![0, 1]);
    assert_eq!(v3.v3_and_below_producer_id.0, 1000);
    let v4 = body.add_partitions_request(4).expect("v4");
    assert_eq!(v4.transactions[0].topics[0].partitions, vec![0, 1]);
    h.answer_well(&dest, &body, token);
    assert!(h.m.may_send(&tp(0)) && h.m.may_send(&tp(1)));
    let offsets_op = h.m.send_offsets(group(), offsets()).expect("offsets");
    let commit_op = h.m.commit().expect("commit");
    h.m.set_batches_pending(true);
    // AddOffsetsToTxn, FindCoordinator(group), TxnOffsetCommit; EndTxn waits for the
    // batches.
    let (_, body, token) = h.until(TxnApi::TxnOffsetCommit);
    let TxnBody::TxnOffsetCommit(request) = &body else {
        panic!()
    };
    assert_eq!(
        (request.generation_id, request.member_id.as_str()),
        (4, "m-1"),
        "KIP-447: the group metadata goes with the offsets"
    );
    assert_eq!(request.topics[0].partitions[0].committed_offset, 42);
    h.answer_well(&Destination::GroupCoordinator(GROUP_NODE), &body, token);
    assert!(
        h.m.poll_request(h.now).is_none(),
        "EndTxn waits for the batches"
    );
    h.m.set_batches_pending(false);
    let (_, body, token) = h.request();
    let TxnBody::EndTxn(end) = &body else {
        panic!("{body:?}")
    };
    assert!(end.committed);
    h.answer_well(&Destination::TransactionCoordinator(TXN_NODE), &body, token);
    assert_eq!(h.done(), vec![(offsets_op, Ok(())), (commit_op, Ok(()))]);
    assert_eq!(h.m.state(), &TxnState::Ready);
}

#[test]
fn a_transaction_the_coordinator_never_heard_of_ends_without_end_txn() {
    let mut h = H::ready();
    h.m.begin().expect("begin");
    let op = h.m.commit().expect("commit");
    assert!(h.m.poll_request(h.now).is_none(), "no request at all");
    assert_eq!(h.done(), vec![(op, Ok(()))]);
    assert_eq!(h.m.state(), &TxnState::Ready);
}

#[test]
fn calls_out_of_turn_are_refused_and_change_nothing() {
    let mut h = H::new();
    assert!(matches!(h.m.begin(), Err(TxnError::State { .. })));
    let mut h = H::ready();
    assert!(matches!(h.m.commit(), Err(TxnError::State { .. })));
    assert!(matches!(
        h.m.add_partition(&tp(0)),
        Err(TxnError::State { .. })
    ));
    assert!(matches!(h.m.init(), Err(TxnError::State { .. })));
    assert_eq!(h.m.state(), &TxnState::Ready);
}

/// Puts the request of `api` in flight (for Produce: a transaction with a partition
/// added), returning the operation it serves, if any.
fn in_flight(h: &mut H, api: TxnApi) -> (Option<OpId>, Option<(Destination, TxnBody, TxnToken)>) {
    match api {
        TxnApi::FindCoordinator | TxnApi::InitProducerId => {
            let op = h.m.init().expect("init");
            (Some(op), Some(h.until(api)))
        }
        // The transaction is started (a partition added) first, so that its abort
        // needs an EndTxn.
        TxnApi::AddPartitionsToTxn => {
            *h = H::ready();
            h.m.begin().expect("begin");
            h.m.add_partition(&tp(1)).expect("add");
            h.settle();
            h.m.add_partition(&tp(0)).expect("add");
            (None, Some(h.until(api)))
        }
        TxnApi::AddOffsetsToTxn | TxnApi::TxnOffsetCommit => {
            *h = H::ready();
            h.m.begin().expect("begin");
            h.m.add_partition(&tp(1)).expect("add");
            h.settle();
            let op = h.m.send_offsets(group(), offsets()).expect("offsets");
            (Some(op), Some(h.until(api)))
        }
        TxnApi::EndTxn => {
            *h = H::ready();
            h.m.begin().expect("begin");
            h.m.add_partition(&tp(0)).expect("add");
            h.settle();
            let op = h.m.commit().expect("commit");
            (Some(op), Some(h.until(api)))
        }
        TxnApi::Produce => {
            *h = H::ready();
            h.m.begin().expect("begin");
            h.m.add_partition(&tp(0)).expect("add");
            h.settle();
            (None, None)
        }
    }
}

/// Every row of the table, through the request it answers: the outcome the row names
/// is what the manager does.
#[test]
fn every_row_of_the_error_table_does_what_it_says() {
    let mut rows = 0;
    for rule in RULES {
        for &api in rule.apis {
            for &error in rule.errors {
                rows += 1;
                let what = format!("{api:?} answered {error:?} ({})", rule.why);
                assert_eq!(disposition(api, error.code()), rule.outcome, "{what}");
                check_row(api, error, rule.outcome, &what);
            }
        }
    }
    assert!(rows > 60, "{rows}");
}

fn check_row(api: TxnApi, error: E, outcome: Disposition, what: &str) {
    let mut h = H::new();
    let (op, flight) = in_flight(&mut h, api);
    let _ = h.done();
    let sent_step = flight.as_ref().map(|(_, body, _)| body_api(body));
    match flight {
        Some((_, body, token)) => {
            let parts = match &body {
                TxnBody::AddPartitionsToTxn { partitions, .. } => partitions.clone(),
                _ => Vec::new(),
            };
            h.m.handle_response(h.now, token, answer(api, error.code(), &parts));
        }
        None => h.m.handle_produce_error(error.code()),
    }
    match outcome {
        Disposition::Done => unreachable!(),
        Disposition::Retry => {
            assert!(
                h.m.poll_request(h.now).is_none(),
                "{what}: waits the backoff"
            );
            let at = h.m.poll_timeout().expect("a retry");
            assert!(
                at > h.now && at <= h.now + Duration::from_millis(200),
                "{what}"
            );
            h.now = at;
            let (_, body, _) = h.request();
            assert_eq!(Some(body_api(&body)), sent_step, "{what}: the same request");
        }
        Disposition::FindCoordinator(kind) => {
            h.now = h.m.poll_timeout().unwrap_or(h.now);
            let (_, body, _) = h.request();
            assert!(
                matches!(body, TxnBody::FindCoordinator { kind: k, .. } if k == kind),
                "{what}: {body:?}"
            );
        }
        Disposition::Abortable | Disposition::AbortableBumpEpoch => {
            let TxnState::Abortable(e) = h.m.state().clone() else {
                panic!("{what}: {:?}", h.m.state());
            };
            assert_eq!(e.kind(), Some(TxnErrorKind::Abortable), "{what}");
            // Only the group's refusal of a member it no longer has tells the
            // Processor to wait for the member's next generation.
            assert_eq!(
                e.is_stale_member(),
                api == TxnApi::TxnOffsetCommit && STALE_MEMBER.contains(&error),
                "{what}"
            );
            if let Some(op) = op {
                assert_eq!(h.done(), vec![(op, Err(e.clone()))], "{what}");
            }
            assert_eq!(h.m.commit(), Err(e.clone()), "{what}: commit refused");
            let (pid, epoch) = h.m.producer().expect("a producer");
            let abort = h.m.abort().expect("abort allowed");
            let mut sent = Vec::new();
            while let Some((dest, body, token)) = h.m.poll_request(h.now) {
                sent.push(body.clone());
                h.answer_well(&dest, &body, token);
            }
            assert_eq!(h.done(), vec![(abort, Ok(()))], "{what}");
            assert_eq!(h.m.state(), &TxnState::Ready, "{what}");
            let bumps: Vec<&InitProducerIdRequest> = sent
                .iter()
                .filter_map(|b| match b {
                    TxnBody::InitProducerId(r) => Some(r),
                    _ => None,
                })
                .collect();
            let ended = sent.iter().any(|b| matches!(b, TxnBody::EndTxn(_)));
            if outcome == Disposition::AbortableBumpEpoch {
                assert_eq!(bumps.len(), 1, "{what}: a new epoch after the abort");
                assert_eq!(
                    (bumps[0].producer_id.0, bumps[0].producer_epoch),
                    (pid, epoch),
                    "{what}: KIP-360 names the current id and epoch"
                );
                assert_eq!(
                    ended,
                    error != E::InvalidProducerIdMapping,
                    "{what}: EndTxn skipped only without a producer id mapping"
                );
            } else {
                assert!(bumps.is_empty(), "{what}: no new epoch");
            }
        }
        Disposition::Fatal => {
            let TxnState::Fatal(e) = h.m.state().clone() else {
                panic!("{what}: {:?}", h.m.state());
            };
            assert_eq!(e.kind(), Some(TxnErrorKind::Fatal), "{what}");
            assert!(!e.is_stale_member(), "{what}");
            if let Some(op) = op {
                assert_eq!(h.done(), vec![(op, Err(e.clone()))], "{what}");
            }
            assert_eq!(h.m.abort(), Err(e.clone()), "{what}: nothing more");
            assert_eq!(h.m.begin(), Err(e), "{what}");
            assert!(h.m.poll_request(h.now).is_none(), "{what}");
        }
    }
}

#[test]
fn an_error_no_row_names_is_fatal_except_in_produce() {
    let unnamed = E::UnknownServerError.code();
    assert_eq!(disposition(TxnApi::EndTxn, unnamed), Disposition::Fatal);
    assert_eq!(
        disposition(TxnApi::Produce, unnamed),
        Disposition::Abortable
    );
    assert_eq!(disposition(TxnApi::EndTxn, 9999), Disposition::Fatal);
}

#[test]
fn a_lost_answer_looks_the_coordinator_up_again() {
    let mut h = H::ready();
    h.m.begin().expect("begin");
    h.m.add_partition(&tp(0)).expect("add");
    let (_, _, token) = h.until(TxnApi::AddPartitionsToTxn);
    h.m.handle_failure(h.now, token, Failure::Disconnected);
    h.now = h.m.poll_timeout().expect("a backoff");
    let (dest, body, token) = h.request();
    assert!(matches!(
        body,
        TxnBody::FindCoordinator {
            kind: CoordinatorKind::Transaction,
            ..
        }
    ));
    h.answer_well(&dest, &body, token);
    h.settle();
    assert!(h.m.may_send(&tp(0)));
}

/// A broker without the transaction APIs: the request fails at once with a typed,
/// fatal error instead of being retried until `max.block.ms`.
#[test]
fn a_broker_without_a_transaction_api_fails_init_at_once_and_for_good() {
    let mut h = H::new();
    let op = h.m.init().expect("init");
    let (_, _, token) = h.until(TxnApi::InitProducerId);
    h.m.handle_failure(
        h.now,
        token,
        Failure::Unsupported("InitProducerId: no version offered".into()),
    );
    let done = h.done();
    let [(failed, Err(error))] = done.as_slice() else {
        panic!("one failed operation: {done:?}");
    };
    assert_eq!(*failed, op);
    assert!(
        matches!(
            error,
            TxnError::Unsupported {
                api: TxnApi::InitProducerId,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.is_fatal(), "{error:?}");
    assert!(
        error.to_string().contains("does not support transactions"),
        "{error}"
    );
    assert!(matches!(h.m.state(), TxnState::Fatal(_)));
    assert!(h.m.poll_request(h.now).is_none(), "nothing is retried");
    assert!(h.m.poll_timeout().is_none(), "no retry is scheduled");
    // Every later call fails the same way.
    assert_eq!(h.m.begin(), Err(error.clone()));
}

#[test]
fn partitions_added_while_an_add_is_out_go_in_the_next_one() {
    let mut h = H::ready();
    h.m.begin().expect("begin");
    h.m.add_partition(&tp(0)).expect("add");
    let (dest, body, token) = h.until(TxnApi::AddPartitionsToTxn);
    h.m.add_partition(&tp(1)).expect("add");
    h.answer_well(&dest, &body, token);
    assert!(h.m.may_send(&tp(0)) && !h.m.may_send(&tp(1)));
    let (_, body, _) = h.request();
    let TxnBody::AddPartitionsToTxn { partitions, .. } = body else {
        panic!("{body:?}")
    };
    assert_eq!(partitions, vec![tp(1)]);
}

#[test]
fn a_retried_answer_backs_off_exponentially() {
    let mut h = H::new();
    h.m.init().expect("init");
    let mut waits = Vec::new();
    for _ in 0..5 {
        let (_, _, token) = h.until(TxnApi::InitProducerId);
        h.m.handle_response(
            h.now,
            token,
            answer(
                TxnApi::InitProducerId,
                E::ConcurrentTransactions.code(),
                &[],
            ),
        );
        let at = h.m.poll_timeout().expect("a backoff");
        waits.push(at - h.now);
        h.now = at;
    }
    for pair in waits.windows(2) {
        assert!(
            pair[1] >= pair[0] || pair[1] >= Duration::from_millis(800),
            "{waits:?}"
        );
    }
    assert!(waits[3] > waits[0] * 3, "{waits:?}");
}

#[test]
fn produce_failures_map_to_codes_and_aborts_or_closes_change_nothing() {
    use crate::produce::accumulator::ProduceError;
    let open = || {
        let mut h = H::new();
        h.m.init().expect("init");
        while let Some((dest, body, token)) = h.m.poll_request(h.now) {
            h.answer_well(&dest, &body, token);
        }
        h.m.begin().expect("begin");
        h
    };
    for ignored in [ProduceError::Aborted, ProduceError::Closed] {
        let mut h = open();
        h.m.handle_produce_failure(&ignored);
        assert_eq!(*h.m.state(), TxnState::InTransaction, "{ignored:?}");
    }
    let mut h = open();
    h.m.handle_produce_failure(&ProduceError::Timeout {
        topic: "out".into(),
        partition: 0,
        timeout: Duration::from_secs(1),
    });
    assert!(
        matches!(h.m.state(), TxnState::Abortable(e) if e.txn_requires_abort() && !e.is_fatal()),
        "{:?}",
        h.m.state()
    );
    assert!(h.m.aborts_undrained());
    assert!(
        h.m.check_send().is_err(),
        "no record goes into an abortable transaction"
    );
    let mut h = open();
    h.m.handle_produce_failure(&ProduceError::Broker {
        topic: "out".into(),
        partition: 0,
        code: E::ProducerFenced.code(),
    });
    assert!(
        matches!(h.m.state(), TxnState::Fatal(e) if e.is_fatal() && !e.txn_requires_abort()),
        "{:?}",
        h.m.state()
    );
}

#[test]
fn check_send_allows_records_only_inside_a_transaction() {
    let mut h = H::new();
    assert!(h.m.check_send().is_err(), "before init");
    h.m.init().expect("init");
    while let Some((dest, body, token)) = h.m.poll_request(h.now) {
        h.answer_well(&dest, &body, token);
    }
    assert!(h.m.check_send().is_err(), "no transaction open");
    h.m.begin().expect("begin");
    assert!(h.m.check_send().is_ok());
    assert!(!h.m.aborts_undrained());
    h.m.abort().expect("abort");
    assert!(h.m.aborts_undrained());
    assert!(h.m.check_send().is_err(), "aborting");
}

#[test]
fn a_commit_called_again_while_under_way_resumes_the_same_operation() {
    // Java lets commitTransaction be called again after its TimeoutException; the
    // second call waits for the same EndTxn instead of failing as out of turn.
    let mut h = H::new();
    let init = h.m.init().expect("init");
    assert_eq!(h.m.init(), Ok(init), "init again resumes");
    while let Some((dest, body, token)) = h.m.poll_request(h.now) {
        h.answer_well(&dest, &body, token);
    }
    h.m.begin().expect("begin");
    h.m.add_partition(&tp(0)).expect("add");
    let commit = h.m.commit().expect("commit");
    assert_eq!(h.m.commit(), Ok(commit), "commit again resumes");
    assert!(
        matches!(h.m.abort(), Err(TxnError::State { .. })),
        "an abort while committing is out of turn"
    );
    while let Some((dest, body, token)) = h.m.poll_request(h.now) {
        h.answer_well(&dest, &body, token);
    }
    let mut done = Vec::new();
    while let Some(e) = h.m.poll_event() {
        if let TxnEvent::Done { op, result } = e {
            done.push((op, result));
        }
    }
    assert!(done.contains(&(commit, Ok(()))), "{done:?}");
    assert_eq!(*h.m.state(), TxnState::Ready);
    assert!(
        matches!(h.m.commit(), Err(TxnError::State { .. })),
        "once finished, a commit outside a transaction is out of turn"
    );
}

#[test]
fn a_fatal_producer_fails_its_undrained_batches() {
    let mut h = H::new();
    h.m.init().expect("init");
    while let Some((dest, body, token)) = h.m.poll_request(h.now) {
        h.answer_well(&dest, &body, token);
    }
    h.m.begin().expect("begin");
    h.m.handle_produce_error(E::ProducerFenced.code());
    assert!(matches!(h.m.state(), TxnState::Fatal(_)));
    assert!(
        h.m.aborts_undrained(),
        "held batches must not wait for ever"
    );
}

#[test]
fn is_open_while_a_transaction_can_be_aborted() {
    let mut h = H::ready();
    assert!(!h.m.is_open(), "ready: nothing to abort");
    h.m.begin().expect("begin");
    assert!(h.m.is_open(), "begun");
    h.m.handle_produce_error(E::InvalidProducerEpoch.code());
    assert!(
        matches!(h.m.state(), TxnState::Abortable(_)) && h.m.is_open(),
        "abortable: still to be aborted ({:?})",
        h.m.state()
    );
    h.m.abort().expect("abort");
    assert!(!h.m.is_open(), "aborting");
    h.settle();
    assert_eq!(h.m.state(), &TxnState::Ready);
    assert!(!h.m.is_open(), "aborted");
    h.m.begin().expect("begin");
    h.m.handle_produce_error(E::ProducerFenced.code());
    assert!(!h.m.is_open(), "fatal: nothing more can be ended");
}
