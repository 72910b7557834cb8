//! Scenario tests of the consumer-protocol member, named `<state>_<input>_<outcome>`.
//! Each asserts the exact requests and events.

use std::sync::Arc;

use super::super::testing::{Harness, lost};
use super::*;
use crate::group::assignor::{Assignor, builtin};

const GROUP: &str = "g";
const TOPIC: &str = "t";
const MEMBER: &str = "client-made-id";

fn topic_id() -> Uuid {
    Uuid::from_u128(0x1111)
}

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new(TOPIC, p)
}

fn config() -> GroupConfig {
    let a: Arc<dyn Assignor> = Arc::from(builtin("range").expect("builtin assignor"));
    let mut c = GroupConfig::new(GROUP, vec![TOPIC.into()], vec![a]);
    c.heartbeat_interval = Duration::from_secs(3);
    c.max_poll_interval = Duration::from_secs(30);
    c.request_timeout = Duration::from_secs(5);
    c.protocol = super::super::member::GroupProtocol::Consumer;
    c
}

/// The shared harness ([`Harness`]) on a consumer-protocol member.
type H = Harness<ConsumerGroupMember>;

/// The fields of a heartbeat request, for assertions.
#[derive(Debug, PartialEq)]
struct Hb {
    epoch: i32,
    names: Option<Vec<String>>,
    regex: Option<String>,
    rebalance_timeout_ms: i32,
    owned: Option<Vec<(Uuid, Vec<i32>)>>,
}

impl Harness<ConsumerGroupMember> {
    fn new(c: GroupConfig) -> Self {
        let now = Instant::now();
        let mut m = ConsumerGroupMember::new(c, MEMBER.into(), now);
        m.set_topic_ids(now, BTreeMap::from([(topic_id(), TOPIC.to_string())]));
        Harness::at(m, now)
    }
    /// Finds the coordinator at `node` and checks the event that says so.
    fn coordinator_found(&mut self, node: i32) {
        self.find_coordinator(node);
        let ev = self.events();
        assert!(
            matches!(&ev[..], [Event::CoordinatorFound { node: NodeId(n), .. }] if *n == node),
            "{ev:?}"
        );
    }
    /// The next request, which must be a heartbeat; its fields.
    fn heartbeat(&mut self) -> (RequestId, Hb) {
        let out = self.request();
        let GroupRequest::ConsumerGroupHeartbeat {
            member_id,
            member_epoch,
            subscribed_topic_names,
            subscribed_topic_regex,
            rebalance_timeout_ms,
            topic_partitions,
            ..
        } = out.request
        else {
            panic!("not a heartbeat: {out:?}")
        };
        assert_eq!(member_id, MEMBER);
        (
            out.id,
            Hb {
                epoch: member_epoch,
                names: subscribed_topic_names,
                regex: subscribed_topic_regex,
                rebalance_timeout_ms,
                owned: topic_partitions,
            },
        )
    }
    fn answer(&mut self, id: RequestId, epoch: i32, assignment: Option<Vec<i32>>) {
        self.respond(id, ok(epoch, assignment));
    }
    /// Joined with epoch 1 and partitions `ps`, acknowledged, offsets fetched.
    fn stable(ps: Vec<i32>) -> H {
        Self::stable_with(config(), ps)
    }
    /// [`H::stable`] with config `c`.
    fn stable_with(c: GroupConfig, ps: Vec<i32>) -> H {
        let mut h = H::new(c);
        h.coordinator_found(2);
        let (id, join) = h.heartbeat();
        assert_eq!(join.epoch, 0);
        h.answer(id, 1, Some(ps.clone()));
        let (ack, hb) = h.heartbeat();
        assert_eq!(hb.owned, Some(vec![(topic_id(), ps)]));
        h.answer(ack, 1, None);
        let fetch = h.request();
        assert!(matches!(fetch.request, GroupRequest::OffsetFetch { .. }));
        h.events();
        h
    }
}

fn ok(epoch: i32, assignment: Option<Vec<i32>>) -> GroupResponse {
    GroupResponse::ConsumerGroupHeartbeat {
        error: 0,
        error_message: None,
        member_id: Some(MEMBER.into()),
        member_epoch: epoch,
        heartbeat_interval_ms: 3000,
        assignment: assignment.map(|ps| vec![(topic_id(), ps)]),
    }
}

/// [`ok`] with no assignment, asking for heartbeats every `interval_ms`.
fn ok_every(epoch: i32, interval_ms: i32) -> GroupResponse {
    let mut r = ok(epoch, None);
    if let GroupResponse::ConsumerGroupHeartbeat {
        heartbeat_interval_ms,
        ..
    } = &mut r
    {
        *heartbeat_interval_ms = interval_ms;
    }
    r
}

fn refused(code: i16) -> GroupResponse {
    GroupResponse::ConsumerGroupHeartbeat {
        error: code,
        error_message: Some("refused".into()),
        member_id: None,
        member_epoch: -1,
        heartbeat_interval_ms: 0,
        assignment: None,
    }
}

#[test]
fn joining_sends_every_field_then_assigns_acknowledges_and_fetches_offsets() {
    let mut h = H::new(config());
    h.coordinator_found(2);
    let (id, join) = h.heartbeat();
    assert_eq!(
        join,
        Hb {
            epoch: 0,
            names: Some(vec![TOPIC.into()]),
            // Names and an empty regex together: conformant, and what the librdkafka
            // mock requires.
            regex: Some(String::new()),
            rebalance_timeout_ms: 30_000,
            owned: Some(vec![]),
        }
    );
    h.no_request();
    h.answer(id, 5, Some(vec![0, 1]));
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Joined { generation: 5, leader: false, .. }, Event::Assigned { generation: 5, added, .. }] if added == &vec![tp(0), tp(1)]),
        "{ev:?}"
    );
    // The acknowledgement goes at once, with only what changed.
    let (_, ack) = h.heartbeat();
    assert_eq!(
        ack,
        Hb {
            epoch: 5,
            names: None,
            regex: None,
            rebalance_timeout_ms: -1,
            owned: Some(vec![(topic_id(), vec![0, 1])]),
        }
    );
    let fetch = h.request();
    assert!(
        matches!(&fetch.request, GroupRequest::OffsetFetch { partitions, member: Some((m, 5)), .. } if partitions.len() == 2 && m == MEMBER),
        "{fetch:?}"
    );
    assert_eq!(h.m.epoch(), Some(5));
}

#[test]
fn stable_heartbeats_at_the_interval_the_broker_gives() {
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_millis(2_900));
    h.no_request();
    h.advance(Duration::from_millis(100));
    let (id, hb) = h.heartbeat();
    assert_eq!(hb.owned, None, "nothing changed: {hb:?}");
    assert_eq!(hb.names, None);
    h.respond(id, ok_every(1, 500));
    h.advance(Duration::from_millis(500));
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 1);
}

#[test]
fn stable_target_dropping_partitions_revokes_then_acknowledges_the_rest() {
    let mut h = H::stable(vec![0, 1, 2]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, Some(vec![0]));
    let ev = h.events();
    assert_eq!(
        ev,
        vec![Event::RevokeRequested {
            generation: 2,
            partitions: vec![tp(1), tp(2)],
        }]
    );
    // Nothing is acknowledged before the application gave the partitions back.
    h.no_request();
    assert_eq!(h.m.state(), StateKind::Revoking);
    // It can still commit them meanwhile.
    let commit = h.m.commit(
        h.now,
        vec![CommitOffset {
            partition: tp(1),
            offset: 10,
            leader_epoch: -1,
            metadata: None,
        }],
    );
    assert!(commit.is_ok());
    let c = h.request();
    assert!(matches!(
        c.request,
        GroupRequest::OffsetCommit { generation: 2, .. }
    ));
    h.m.complete_revocation(h.now, 2);
    let (_, ack) = h.heartbeat();
    assert_eq!(ack.owned, Some(vec![(topic_id(), vec![0])]));
    assert_eq!(h.m.assignment(), vec![tp(0)]);
}

#[test]
fn stable_target_adding_partitions_assigns_them_without_a_revocation() {
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 3, Some(vec![0, 3]));
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Assigned { generation: 3, added, .. }] if added == &vec![tp(3)]),
        "{ev:?}"
    );
    let (_, ack) = h.heartbeat();
    assert_eq!(ack.owned, Some(vec![(topic_id(), vec![0, 3])]));
}

#[test]
fn stable_epoch_bump_without_an_assignment_changes_nothing_but_the_epoch() {
    // The librdkafka mock bumps every member's epoch on each recomputation and leaves
    // the assignment out when it did not change. The new epoch is told (transactional
    // offsets carry it: the coordinator refuses any other, KIP-447); nothing else.
    let mut h = H::stable(vec![0, 1]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 4, None);
    assert_eq!(h.all_events(), vec![Event::MemberEpoch { epoch: 4 }]);
    // The same epoch again is not news.
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 4, None);
    assert_eq!(h.all_events(), vec![]);
    h.no_request();
    assert_eq!(h.m.epoch(), Some(4));
    assert_eq!(h.m.assignment(), vec![tp(0), tp(1)]);
}

#[test]
fn joining_an_unknown_topic_id_asks_for_metadata_and_assigns_once_named() {
    let mut h = H::new(config());
    h.m.set_topic_ids(h.now, BTreeMap::new());
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.answer(id, 1, Some(vec![0]));
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Joined { .. }, Event::MetadataNeeded { topics }] if topics == &vec![TOPIC.to_string()]),
        "{ev:?}"
    );
    // The new target is acknowledged at once with what the member holds: nothing yet.
    let (first, ack) = h.heartbeat();
    assert_eq!(ack.owned, Some(vec![]));
    h.no_request();
    h.m.set_topic_ids(h.now, BTreeMap::from([(topic_id(), TOPIC.to_string())]));
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Assigned { added, .. }] if added == &vec![tp(0)]),
        "{ev:?}"
    );
    let fetch = h.request();
    assert!(matches!(fetch.request, GroupRequest::OffsetFetch { .. }));
    h.answer(first, 1, None);
    let (_, ack) = h.heartbeat();
    assert_eq!(ack.owned, Some(vec![(topic_id(), vec![0])]));
}

#[test]
fn stable_fenced_member_epoch_loses_everything_and_rejoins_with_epoch_0_and_the_same_id() {
    let mut h = H::stable(vec![0, 1]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::FencedMemberEpoch.code()));
    assert_eq!(
        h.events(),
        vec![Event::Lost {
            partitions: vec![tp(0), tp(1)],
            reason: LostReason::FencedEpoch,
        }]
    );
    // The fenced incarnation stays on the broker with its partitions: the member
    // leaves it first (chaos seed 340586618: a bare rejoin met it on the mock, got no
    // assignment, and its partitions stalled for good), and rejoins on the answer.
    let (leave, hb) = h.heartbeat();
    assert_eq!(hb.epoch, -1);
    h.no_request();
    h.answer(leave, -1, None);
    let (_, rejoin) = h.heartbeat();
    assert_eq!(rejoin.epoch, 0);
    assert_eq!(rejoin.owned, Some(vec![]));
    assert_eq!(rejoin.names, Some(vec![TOPIC.into()]));
    assert_eq!(h.m.assignment(), vec![]);
}

#[test]
fn revoking_unknown_member_id_loses_the_partitions_and_ignores_the_late_completion() {
    let mut h = H::stable(vec![0, 1]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, Some(vec![0]));
    h.events();
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::UnknownMemberId.code()));
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Lost { reason: LostReason::UnknownMember, partitions }] if partitions.len() == 2),
        "{ev:?}"
    );
    let (_, rejoin) = h.heartbeat();
    assert_eq!(rejoin.epoch, 0);
    h.m.complete_revocation(h.now, 2);
    assert_eq!(h.m.state(), StateKind::Joining);
    h.no_request();
}

#[test]
fn stable_not_coordinator_rediscovers_and_resends_every_field_keeping_the_epoch() {
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::NotCoordinator.code()));
    assert_eq!(h.m.coordinator(), None);
    assert_eq!(h.events(), vec![]);
    h.advance(Duration::from_millis(100));
    h.coordinator_found(3);
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 1, "the epoch survives a coordinator move");
    assert_eq!(hb.names, Some(vec![TOPIC.into()]));
    assert_eq!(hb.owned, Some(vec![(topic_id(), vec![0])]));
    assert_eq!(h.m.assignment(), vec![tp(0)]);
}

#[test]
fn stable_coordinator_moves_apart_each_rediscover_after_retry_backoff_alone() {
    // KIP-580's pace backs off only while coordinators keep refusing: one that served
    // a heartbeat in between starts it over, so the tenth move of a long-lived member
    // is found as fast as the first.
    let mut h = H::stable(vec![0]);
    for node in [3, 4, 5] {
        h.advance(Duration::from_secs(3));
        let (id, _) = h.heartbeat();
        h.respond(id, refused(ResponseError::NotCoordinator.code()));
        assert_eq!(h.m.coordinator(), None);
        assert_eq!(
            h.m.poll_timeout(),
            Some(h.now + h.m.config().retry_backoff),
            "move to {node}: the lookup waits retry.backoff.ms"
        );
        h.advance(h.m.config().retry_backoff);
        h.coordinator_found(node);
        let (id, hb) = h.heartbeat();
        h.answer(id, hb.epoch, None);
    }
}

#[test]
fn stable_heartbeat_timeout_rediscovers_the_coordinator() {
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (_, _) = h.heartbeat();
    h.advance(Duration::from_secs(5));
    assert_eq!(h.m.coordinator(), None);
    assert_eq!(h.m.assignment(), vec![tp(0)], "the partitions stay");
}

#[test]
fn stable_heartbeat_unanswered_for_two_intervals_looks_the_coordinator_up_again() {
    // The broker's interval is 3 s and request.timeout.ms 5 s in this config: a
    // heartbeat held by a silent broker is given up after 5 s. With a 500 ms interval
    // it is given up after 1 s, well before a session of a few seconds ends, and the
    // next goes to the coordinator found again, with every field.
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, ok_every(1, 500));
    h.advance(Duration::from_millis(500));
    let (_, _) = h.heartbeat();
    h.advance(Duration::from_millis(999));
    assert!(h.m.coordinator().is_some(), "still waiting");
    h.advance(Duration::from_millis(1));
    assert_eq!(h.m.coordinator(), None, "given up after two intervals");
    h.advance(Duration::from_millis(100));
    h.coordinator_found(3);
    let (_, again) = h.heartbeat();
    assert_eq!(again.epoch, 1);
    assert_eq!(again.names, Some(vec![TOPIC.into()]), "every field");
    assert_eq!(h.m.assignment(), vec![tp(0)]);
}

#[test]
fn stable_commit_with_a_stale_epoch_goes_again_with_the_new_one() {
    let mut h = H::stable(vec![0]);
    let offsets = vec![CommitOffset {
        partition: tp(0),
        offset: 7,
        leader_epoch: -1,
        metadata: None,
    }];
    let cid = h.m.commit(h.now, offsets.clone()).unwrap();
    let c = h.request();
    assert!(matches!(
        c.request,
        GroupRequest::OffsetCommit { generation: 1, .. }
    ));
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, None);
    h.respond(
        c.id,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), ResponseError::StaleMemberEpoch.code())],
        },
    );
    assert_eq!(h.events(), vec![]);
    let again = h.request();
    assert_eq!(again.id, cid);
    assert!(matches!(
        again.request,
        GroupRequest::OffsetCommit { generation: 2, .. }
    ));
    h.respond(
        again.id,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), 0)],
        },
    );
    assert_eq!(
        h.events(),
        vec![Event::CommitCompleted {
            id: cid,
            result: Ok(offsets)
        }]
    );
}

/// Chaos, consumer protocol, seed 76387901: a member lost p5 with its commit of it on
/// the wire, rejoined, got p5 back and asked for its committed offset; the answer
/// predated that commit, which landed after, and the member handled again what it had
/// just committed. The committed offset of a partition is asked for only once this
/// member's own commits of it have settled.
#[test]
fn a_partition_granted_while_its_commit_is_on_the_wire_is_fetched_once_the_commit_settles() {
    let mut h = H::stable(vec![0, 1]);
    let offsets = vec![CommitOffset {
        partition: tp(0),
        offset: 50,
        leader_epoch: -1,
        metadata: None,
    }];
    let cid = h.m.commit(h.now, offsets.clone()).unwrap();
    let commit = h.request();
    assert!(matches!(commit.request, GroupRequest::OffsetCommit { .. }));
    // Fenced while the commit is out: everything lost, a leave, then a rejoin.
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::FencedMemberEpoch.code()));
    h.events();
    let (leave, _) = h.heartbeat();
    h.answer(leave, -1, None);
    let (join, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 0);
    h.answer(join, 3, Some(vec![0, 1]));
    let (ack, _) = h.heartbeat();
    h.answer(ack, 3, None);
    // p1 is asked for at once; p0 waits for its commit.
    let fetch = h.request();
    let GroupRequest::OffsetFetch { partitions, .. } = &fetch.request else {
        panic!("not an OffsetFetch: {fetch:?}")
    };
    assert_eq!(partitions, &vec![tp(1)]);
    h.respond(
        fetch.id,
        GroupResponse::OffsetFetch {
            error: 0,
            partitions: vec![(tp(1), 40, -1, 0)],
            metadata: vec![],
        },
    );
    h.events();
    h.no_request();
    assert!(
        h.m.poll_timeout().is_some_and(|at| at > h.now),
        "no OffsetFetch timer due while p0's commit is out"
    );
    // The commit lands (the broker took it before the fencing): now p0 is asked for.
    h.respond(
        commit.id,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), 0)],
        },
    );
    assert_eq!(
        h.events(),
        vec![Event::CommitCompleted {
            id: cid,
            result: Ok(offsets)
        }]
    );
    let fetch = h.request();
    let GroupRequest::OffsetFetch { partitions, .. } = &fetch.request else {
        panic!("not an OffsetFetch: {fetch:?}")
    };
    assert_eq!(partitions, &vec![tp(0)]);
}

#[test]
fn stable_commit_for_an_unowned_partition_is_refused() {
    let mut h = H::stable(vec![0]);
    let r = h.m.commit(
        h.now,
        vec![CommitOffset {
            partition: tp(1),
            offset: 1,
            leader_epoch: -1,
            metadata: None,
        }],
    );
    assert_eq!(r, Err(CommitError::NotOwned(tp(1))));
}

#[test]
fn dynamic_member_leaves_with_epoch_minus_one() {
    let mut h = H::stable(vec![0]);
    h.m.leave(h.now);
    let out = h.request();
    assert!(
        matches!(
            &out.request,
            GroupRequest::ConsumerGroupHeartbeat {
                member_epoch: -1,
                subscribed_topic_names: None,
                subscribed_topic_regex: None,
                topic_partitions: None,
                ..
            }
        ),
        "{out:?}"
    );
    h.respond(out.id, ok(-1, None));
    assert_eq!(h.events(), vec![Event::Left]);
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn static_member_leaves_with_epoch_minus_two_unless_asked_to_leave_for_good() {
    let mut c = config();
    c.instance_id = Some("i1".into());
    let mut h = H::new(c.clone());
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.answer(id, 1, Some(vec![0]));
    let (ack, _) = h.heartbeat();
    h.answer(ack, 1, None);
    let _fetch = h.m.poll_request();
    h.m.leave(h.now);
    let out = h.request();
    assert!(matches!(
        &out.request,
        GroupRequest::ConsumerGroupHeartbeat { member_epoch: -2, instance_id: Some(i), .. } if i == "i1"
    ));

    let mut h = H::new(c);
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.answer(id, 1, Some(vec![0]));
    h.m.leave_with(h.now, Membership::Leave);
    let out = std::iter::from_fn(|| h.m.poll_request())
        .last()
        .expect("a request");
    assert!(matches!(
        &out.request,
        GroupRequest::ConsumerGroupHeartbeat {
            member_epoch: -1,
            ..
        }
    ));
}

#[test]
fn stable_member_asked_to_remain_sends_nothing_and_closes() {
    let mut h = H::stable(vec![0]);
    h.m.leave_with(h.now, Membership::Remain);
    h.no_request();
    assert_eq!(h.events(), vec![Event::Left]);
}

#[test]
fn stable_progress_timeout_leaves_loses_and_rejoins_on_progress() {
    let mut h = H::stable(vec![0]);
    // Heartbeats keep going meanwhile; answer them.
    for _ in 0..10 {
        h.advance(Duration::from_secs(3));
        if let Some(out) = h.m.poll_request() {
            h.answer(out.id, 1, None);
        }
    }
    h.progress_timed_out();
    assert_eq!(h.m.poll_timeout(), None);
    h.m.note_progress(h.now);
    let (_, rejoin) = h.heartbeat();
    assert_eq!(rejoin.epoch, 0);
}

#[test]
fn revoking_not_completed_within_the_rebalance_timeout_loses_and_rejoins() {
    let mut h = H::stable(vec![0, 1]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, Some(vec![0]));
    h.events();
    for _ in 0..10 {
        h.advance(Duration::from_secs(3));
        h.m.note_progress(h.now);
        while let Some(out) = h.m.poll_request() {
            if let GroupRequest::ConsumerGroupHeartbeat { member_epoch, .. } = out.request {
                if member_epoch == 0 {
                    let ev = h.events();
                    assert!(lost(&ev, LostReason::RevocationTimedOut), "{ev:?}");
                    return;
                }
                h.answer(out.id, 2, None);
            }
        }
    }
    panic!("no rejoin after the rebalance timeout");
}

#[test]
fn joining_on_a_broker_without_the_api_closes_with_an_error_naming_the_setting() {
    let mut h = H::new(config());
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.m.handle_failure(
        h.now,
        id,
        Failure::Unsupported(
            "127.0.0.1:9092 offers no usable ConsumerGroupHeartbeat version".into(),
        ),
    );
    let ev = h.events();
    let [Event::Fatal(e)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert!(e.to_string().contains("group.protocol=classic"), "{e}");
    assert_eq!(h.m.state(), StateKind::Closed);
    assert_eq!(h.m.poll_timeout(), None);
}

#[test]
fn joining_unsupported_assignor_is_fatal_and_names_the_setting() {
    let mut h = H::new(config());
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::UnsupportedAssignor.code()));
    let ev = h.events();
    let [Event::Fatal(e)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert!(e.to_string().contains("group.remote.assignor"), "{e}");
}

#[test]
fn joining_coordinator_load_in_progress_retries_after_the_backoff_with_every_field() {
    let mut h = H::new(config());
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::CoordinatorLoadInProgress.code()));
    h.no_request();
    h.advance(Duration::from_millis(200));
    let (_, again) = h.heartbeat();
    assert_eq!(again.epoch, 0);
    assert_eq!(again.names, Some(vec![TOPIC.into()]));
}

#[test]
fn a_timer_is_armed_in_every_state_but_closed_and_suspended() {
    let mut h = H::stable(vec![0]);
    assert!(h.m.poll_timeout().is_some());
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, Some(vec![]));
    assert_eq!(h.m.state(), StateKind::Revoking);
    assert!(h.m.poll_timeout().is_some());
}

#[test]
fn member_ids_are_22_characters_of_url_safe_base64() {
    let id = new_member_id([7; 16]);
    assert_eq!(id.len(), 22);
    assert!(
        id.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    );
    assert_ne!(id, new_member_id([8; 16]));
}

#[test]
fn joining_with_a_regex_sends_it_beside_the_names_and_only_on_a_full_heartbeat() {
    let mut c = config();
    c.topics = vec![];
    c.topic_regex = Some("^orders\\..*".into());
    let mut h = H::new(c);
    h.coordinator_found(2);
    let (id, join) = h.heartbeat();
    assert_eq!(join.names, Some(vec![]));
    assert_eq!(join.regex, Some("^orders\\..*".into()));
    h.answer(id, 1, Some(vec![0]));
    let (_, ack) = h.heartbeat();
    assert_eq!((ack.names, ack.regex), (None, None));
}

// ----- Held to the Java client's rules (issue 30); each failed before its fix -----

fn other_topic_id() -> Uuid {
    Uuid::from_u128(0x2222)
}

/// An answer with epoch `epoch` and the assignment `topics` (by topic id).
fn ok_topics(epoch: i32, topics: Vec<(Uuid, Vec<i32>)>) -> GroupResponse {
    let mut r = ok(epoch, None);
    if let GroupResponse::ConsumerGroupHeartbeat { assignment, .. } = &mut r {
        *assignment = Some(topics);
    }
    r
}

/// Answers every heartbeat waiting with `epoch` and no assignment, drops the rest;
/// the epochs the heartbeats carried.
fn answer_heartbeats(h: &mut H, epoch: i32) -> Vec<i32> {
    let mut sent = Vec::new();
    while let Some(out) = h.m.poll_request() {
        if let GroupRequest::ConsumerGroupHeartbeat { member_epoch, .. } = out.request {
            sent.push(member_epoch);
            h.answer(out.id, epoch, None);
        }
    }
    sent
}

#[test]
fn revoking_timed_out_loses_every_partition_not_only_the_revoked_ones() {
    // Finding 1: the kept partitions were cleared with no event, so the Consumer and
    // the Processor went on fetching and handling them after the epoch-0 rejoin.
    let mut h = H::stable(vec![0, 1, 2]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, Some(vec![0]));
    h.events();
    let mut lost = Vec::new();
    for _ in 0..12 {
        h.advance(Duration::from_secs(3));
        h.m.note_progress(h.now);
        lost.extend(
            h.events()
                .into_iter()
                .filter(|e| matches!(e, Event::Lost { .. })),
        );
        if h.m.state() == StateKind::Joining {
            break;
        }
        answer_heartbeats(&mut h, 2);
    }
    assert_eq!(
        lost,
        vec![Event::Lost {
            partitions: vec![tp(0), tp(1), tp(2)],
            reason: LostReason::RevocationTimedOut,
        }]
    );
    assert_eq!(h.m.assignment(), vec![]);
}

#[test]
fn revoking_timed_out_gives_up_the_heartbeat_in_flight_so_its_late_answer_cannot_restore_the_old_epoch()
 {
    // Finding 1, second half: a success for a heartbeat sent before the fence put the
    // member back in Stable at its old epoch, with no epoch-0 rejoin.
    let mut h = H::stable(vec![0, 1]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, Some(vec![0]));
    h.events();
    // Heartbeats every 3 s, answered, until the one sent 27 s in, which the broker
    // holds past the rebalance timeout (30 s).
    let mut held = None;
    for step in 1..=9 {
        h.advance(Duration::from_secs(3));
        h.m.note_progress(h.now);
        if step < 9 {
            answer_heartbeats(&mut h, 2);
        } else {
            held = Some(h.heartbeat().0);
        }
    }
    h.advance(Duration::from_secs(3));
    let ev = h.events();
    assert!(lost(&ev, LostReason::RevocationTimedOut), "{ev:?}");
    // The broker may still count the member in: it leaves, then rejoins once the
    // leave is answered.
    let (leave_id, leave) = h.heartbeat();
    assert_eq!(leave.epoch, -1);
    assert!(
        h.requests().is_empty(),
        "the rejoin waits for the leave's answer"
    );
    h.answer(leave_id, -1, None);
    let (join, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 0, "the rejoin goes once the leave is answered");
    h.answer(held.expect("a held heartbeat"), 2, None);
    assert_eq!(h.events(), vec![], "the late answer is ignored");
    assert_eq!(h.m.state(), StateKind::Joining);
    assert_eq!(h.m.epoch(), None);
    h.answer(join, 3, Some(vec![1]));
    let ev = h.events();
    assert!(
        matches!(
            &ev[..],
            [Event::Joined { generation: 3, .. }, Event::Assigned { .. }]
        ),
        "{ev:?}"
    );
}

#[test]
fn joining_member_closing_sends_a_leave_so_no_ghost_holds_partitions() {
    // Finding 2: a consumer closed while its join was in flight left a member the
    // broker had taken in, holding partitions until its session expired.
    let mut h = H::new(config());
    h.coordinator_found(2);
    let (_join, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 0);
    h.m.leave(h.now);
    let out = h.request();
    assert!(
        matches!(
            &out.request,
            GroupRequest::ConsumerGroupHeartbeat {
                member_epoch: -1,
                ..
            }
        ),
        "{out:?}"
    );
    assert_eq!(h.m.state(), StateKind::Leaving);
    h.respond(out.id, ok(-1, None));
    assert_eq!(h.events(), vec![Event::Left]);
}

#[test]
fn joining_member_closing_before_any_heartbeat_closes_at_once() {
    let mut h = H::new(config());
    let _lookup = h.request();
    h.m.leave(h.now);
    assert_eq!(h.events(), vec![Event::Left]);
    h.no_request();
}

#[test]
fn stable_member_closing_with_the_coordinator_unknown_leaves_once_it_is_found() {
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::NotCoordinator.code()));
    h.m.leave(h.now);
    assert_eq!(h.m.state(), StateKind::Leaving);
    h.advance(h.m.config().retry_backoff);
    h.find_coordinator(3);
    let out = h.request();
    assert!(
        matches!(
            &out.request,
            GroupRequest::ConsumerGroupHeartbeat {
                member_epoch: -1,
                ..
            }
        ),
        "{out:?}"
    );
}

#[test]
fn stable_progress_timeout_with_the_coordinator_unknown_leaves_once_it_is_found_then_rejoins() {
    // Finding 2: the poll-timer leave was sent only if the coordinator was known at
    // that instant; otherwise the rejoin met the old incarnation, was fenced, and
    // went again at once, until the old session expired.
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::NotCoordinator.code()));
    // Every lookup goes unanswered (the brokers are away) past max.poll.interval.ms.
    for _ in 0..400 {
        h.advance(Duration::from_millis(100));
        h.requests();
        if h.m.state() == StateKind::Suspended {
            break;
        }
    }
    h.progress_timed_out();
    assert!(h.m.poll_timeout().is_some(), "still looking, for the leave");
    // The application comes back before the coordinator is found.
    h.m.note_progress(h.now);
    assert_eq!(h.m.state(), StateKind::Suspended);
    let lookup = (0..200)
        .find_map(|_| {
            h.advance(Duration::from_millis(100));
            h.requests()
                .into_iter()
                .find(|o| matches!(o.request, GroupRequest::FindCoordinator { .. }))
        })
        .expect("a lookup");
    h.found(lookup.id, 3);
    h.events();
    let (leave, hb) = h.heartbeat();
    assert_eq!(hb.epoch, -1, "the leave first");
    h.no_request();
    assert_eq!(
        h.m.state(),
        StateKind::Suspended,
        "the rejoin waits for its answer"
    );
    h.answer(leave, -1, None);
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 0, "then the rejoin");
    assert_eq!(h.m.state(), StateKind::Joining);
}

#[test]
fn joining_fenced_rejoins_after_the_backoff_not_at_once() {
    // Finding 2: a join fenced because the broker still held the member's older
    // incarnation went again at once, in a loop, until that session ended.
    let mut h = H::new(config());
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::FencedMemberEpoch.code()));
    h.no_request();
    h.advance(Duration::from_millis(200));
    let (_, again) = h.heartbeat();
    assert_eq!(again.epoch, 0);
}

#[test]
fn stable_target_revoking_only_a_partition_never_taken_is_still_acknowledged_at_once() {
    // Finding 3: the member took nothing of a topic whose id it could not resolve;
    // when the broker took that partition back, the owned set did not change, no
    // acknowledgement went out, and the broker waited for one until the rebalance
    // timeout, then fenced the member.
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(
        id,
        ok_topics(2, vec![(topic_id(), vec![0]), (other_topic_id(), vec![0])]),
    );
    let ev = h.events();
    assert!(matches!(&ev[..], [Event::MetadataNeeded { .. }]), "{ev:?}");
    let (ack, hb) = h.heartbeat();
    assert_eq!(hb.owned, Some(vec![(topic_id(), vec![0])]));
    h.respond(ack, ok_topics(3, vec![(topic_id(), vec![0])]));
    assert_eq!(h.events(), vec![]);
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 3);
    assert_eq!(hb.owned, Some(vec![(topic_id(), vec![0])]), "acknowledged");
}

#[test]
fn stable_same_target_again_is_not_acknowledged_again() {
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.answer(id, 2, Some(vec![0]));
    assert_eq!(h.events(), vec![]);
    h.no_request();
}

#[test]
fn stable_topic_authorization_failed_is_reported_naming_the_topic_and_retried_keeping_the_partitions()
 {
    // Finding 4: only logged before, so a consumer missing a topic ACL sat idle.
    let mut h = H::stable(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::TopicAuthorizationFailed.code()));
    let ev = h.events();
    let [Event::Error(e)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert!(
        matches!(e, GroupError::TopicAuthorization { topics, .. } if topics == &vec![TOPIC.to_string()]),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("DESCRIBE") && text.contains("for topic(s) t"),
        "{text}"
    );
    assert_eq!(h.m.state(), StateKind::Stable);
    assert_eq!(h.m.assignment(), vec![tp(0)]);
    h.no_request();
    h.advance(Duration::from_millis(200));
    let (id, hb) = h.heartbeat();
    assert_eq!(
        hb.names,
        Some(vec![TOPIC.into()]),
        "every field after an error"
    );
    h.answer(id, 1, None);
    assert_eq!(h.events(), vec![]);
}

#[test]
fn stable_group_id_not_found_loses_everything_and_rejoins_with_epoch_0() {
    // Finding 5: retried for ever with the partitions kept. The group is gone (deleted,
    // or lost by its coordinator): the partitions are lost and a join creates it again.
    let mut h = H::stable(vec![0, 1]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::GroupIdNotFound.code()));
    assert_eq!(
        h.events(),
        vec![Event::Lost {
            partitions: vec![tp(0), tp(1)],
            reason: LostReason::UnknownMember,
        }]
    );
    let (_, rejoin) = h.heartbeat();
    assert_eq!(rejoin.epoch, 0);
}

#[test]
fn joining_group_id_not_found_is_fatal_and_names_the_classic_group() {
    // To a join, GROUP_ID_NOT_FOUND means a classic group of that id that the broker
    // does not convert: no join can succeed, as Java says.
    let mut h = H::new(config());
    h.coordinator_found(2);
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::GroupIdNotFound.code()));
    let ev = h.events();
    let [Event::Fatal(e)] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert!(e.to_string().contains("group.protocol=classic"), "{e}");
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn stable_owned_topic_missing_from_metadata_is_still_reported_and_assigned_by_id() {
    // Finding 6: the owned set was mapped to ids through the metadata of the moment;
    // during a topic-level metadata error a full heartbeat reported nothing owned,
    // which the broker can read as a release.
    let mut h = H::stable(vec![0, 1]);
    h.m.set_topic_ids(h.now, BTreeMap::new());
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    h.respond(id, refused(ResponseError::NotCoordinator.code()));
    h.advance(h.m.config().retry_backoff);
    h.coordinator_found(3);
    let (id, hb) = h.heartbeat();
    assert_eq!(hb.owned, Some(vec![(topic_id(), vec![0, 1])]));
    // A target that adds a partition of that topic is assigned under the name it
    // already has.
    h.answer(id, 2, Some(vec![0, 1, 2]));
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Assigned { added, .. }] if added == &vec![tp(2)]),
        "{ev:?}"
    );
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.owned, Some(vec![(topic_id(), vec![0, 1, 2])]));
}

#[test]
fn finding_the_coordinator_group_authorization_failed_is_reported_and_the_lookup_goes_on() {
    // Finding 7: it closed the member, so a granted ACL did not help.
    let mut h = H::new(config());
    let out = h.request();
    h.lookup_refused(out.id, ResponseError::GroupAuthorizationFailed.code());
    let ev = h.events();
    assert!(
        matches!(
            &ev[..],
            [Event::Error(GroupError::Broker {
                api: "FindCoordinator",
                code: 30,
                ..
            })]
        ),
        "{ev:?}"
    );
    assert_eq!(h.m.state(), StateKind::Joining);
    h.advance(Duration::from_millis(200));
    h.coordinator_found(2);
    let (_, join) = h.heartbeat();
    assert_eq!(join.epoch, 0);
}

#[test]
fn stable_no_heartbeat_accepted_for_the_session_loses_everything_and_rejoins() {
    // The zombie window: a member whose coordinator went silent kept its partitions
    // for as long as the silence lasted, while the broker expired it after the session
    // and handed them on (chaos seed 99120031: 309 handler starts beside another
    // member's). Now it gives them up a session after the last heartbeat the broker
    // accepted was sent, no later than the broker's own expiry.
    let mut h = stable_with_a_6_s_session(vec![0, 1]);
    let accepted = h.now;
    // Heartbeats answered keep the session, however long.
    for _ in 0..5 {
        h.advance(Duration::from_secs(3));
        let (id, _) = h.heartbeat();
        h.answer(id, 1, None);
    }
    assert!(h.events().is_empty());
    let last_accepted = h.now;
    assert!(last_accepted > accepted);
    // Then the coordinator goes silent: nothing is answered any more.
    let mut lapsed_at = None;
    for _ in 0..100 {
        h.advance(Duration::from_millis(100));
        h.requests();
        let ev = h.events();
        if lost(&ev, LostReason::SessionLapsed) {
            assert!(
                matches!(&ev[..], [Event::Lost { partitions, .. }] if partitions.len() == 2),
                "{ev:?}"
            );
            lapsed_at = Some(h.now);
            break;
        }
    }
    assert_eq!(lapsed_at, Some(last_accepted + Duration::from_secs(6)));
    assert_eq!(h.m.assignment(), vec![]);
    assert_eq!(h.m.coordinator(), None, "looked up again");
    // Once found, it leaves (the broker may still count it in, with the partitions:
    // a join alone met that incarnation on the mock and the partitions stalled), then
    // rejoins with epoch 0 under the same member id.
    let lookup = (0..100)
        .find_map(|_| {
            h.advance(Duration::from_millis(100));
            h.requests()
                .into_iter()
                .find(|o| matches!(o.request, GroupRequest::FindCoordinator { .. }))
        })
        .expect("a lookup");
    h.found(lookup.id, 3);
    h.events();
    let (leave_id, leave) = h.heartbeat();
    assert_eq!(leave.epoch, -1);
    h.no_request();
    h.answer(leave_id, -1, None);
    let (_, rejoin) = h.heartbeat();
    assert_eq!(rejoin.epoch, 0);
    assert_eq!(rejoin.owned, Some(vec![]));
}

#[test]
fn stable_session_counts_from_when_the_accepted_heartbeat_was_sent_not_answered() {
    // The broker renews the session when it reads the request: an answer that took
    // 2 s to arrive renewed a session that began up to 2 s before it arrived.
    let mut h = stable_with_a_6_s_session(vec![0]);
    h.advance(Duration::from_secs(3));
    let (id, _) = h.heartbeat();
    let sent = h.now;
    h.advance(Duration::from_millis(2_000));
    h.answer(id, 1, None);
    // Nothing answered from here on.
    while h.now < sent + Duration::from_millis(5_900) {
        h.advance(Duration::from_millis(100));
        h.requests();
    }
    assert!(h.events().is_empty());
    h.advance(Duration::from_millis(100));
    assert!(lost(&h.events(), LostReason::SessionLapsed));
}

/// A member in the group owning `partitions`, its session 6 s.
fn stable_with_a_6_s_session(partitions: Vec<i32>) -> H {
    let mut c = config();
    c.session_timeout = Duration::from_secs(6);
    H::stable_with(c, partitions)
}

/// Advances in 100 ms steps until a FindCoordinator goes out, and answers it with `node`.
fn rediscover(h: &mut H, node: i32) {
    let lookup = (0..200)
        .find_map(|_| {
            h.advance(Duration::from_millis(100));
            h.requests()
                .into_iter()
                .find(|o| matches!(o.request, GroupRequest::FindCoordinator { .. }))
        })
        .expect("a lookup");
    h.found(lookup.id, node);
    h.events();
}

/// A member whose session lapsed against a silent coordinator: the lapse, the lookup,
/// and the leave sent to the coordinator found (node 3); returns the leave's id.
fn lapsed_and_leaving(h: &mut H) -> RequestId {
    for _ in 0..100 {
        h.advance(Duration::from_millis(100));
        h.requests();
        if lost(&h.events(), LostReason::SessionLapsed) {
            break;
        }
    }
    assert_eq!(h.m.assignment(), vec![]);
    rediscover(h, 3);
    let (leave, hb) = h.heartbeat();
    assert_eq!(hb.epoch, -1);
    leave
}

#[test]
fn session_lapse_leave_unanswered_goes_again_to_the_next_coordinator_before_the_rejoin() {
    // Chaos, consumer protocol, seed 487768142: after a lapse the leave went to a
    // silent broker and was never read; the join followed at once, met the member's
    // old incarnation at the next coordinator (the librdkafka mock answered it with no
    // assignment while it still gave the member its old partitions), and those
    // partitions stalled for good. The rejoin now waits for the leave's answer; a
    // leave left unanswered goes again to the coordinator found next.
    let mut h = stable_with_a_6_s_session(vec![0, 1]);
    let _first = lapsed_and_leaving(&mut h);
    // Not answered: no rejoin meanwhile, and the leave is given up as overdue.
    let mut sent = Vec::new();
    for _ in 0..30 {
        h.advance(Duration::from_millis(100));
        sent.extend(h.requests());
        if h.m.coordinator().is_none() {
            break;
        }
    }
    assert!(
        !sent.iter().any(|o| matches!(
            o.request,
            GroupRequest::ConsumerGroupHeartbeat {
                member_epoch: 0,
                ..
            }
        )),
        "a rejoin before the leave was answered: {sent:?}"
    );
    assert_eq!(
        h.m.coordinator(),
        None,
        "the leave's coordinator is looked up again"
    );
    assert_eq!(h.m.state(), StateKind::Suspended);
    rediscover(&mut h, 1);
    let (second, hb) = h.heartbeat();
    assert_eq!(hb.epoch, -1, "the leave again, to the next coordinator");
    h.no_request();
    h.answer(second, -1, None);
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 0, "then the rejoin");
    assert_eq!(h.m.state(), StateKind::Joining);
}

#[test]
fn session_lapse_leave_never_answered_rejoins_a_session_later() {
    // Bounded: a leave that no coordinator answers stops being owed a session after it
    // was first owed (by then the broker has expired the member: its clock started no
    // later than the last heartbeat sent), and the member rejoins.
    let mut h = stable_with_a_6_s_session(vec![0]);
    let _ = lapsed_and_leaving(&mut h);
    let owed_since = h.now;
    let mut rejoined_at = None;
    for _ in 0..200 {
        h.advance(Duration::from_millis(100));
        let mut out = h.requests();
        // Lookups answered with the same silent coordinator, which reads nothing.
        if let Some(i) = out
            .iter()
            .position(|o| matches!(o.request, GroupRequest::FindCoordinator { .. }))
        {
            let lookup = out.remove(i);
            h.found(lookup.id, 3);
            h.events();
            out.extend(h.requests());
        }
        if out.iter().any(|o| {
            matches!(
                o.request,
                GroupRequest::ConsumerGroupHeartbeat {
                    member_epoch: 0,
                    ..
                }
            )
        }) {
            rejoined_at = Some(h.now);
            break;
        }
    }
    let waited = rejoined_at.expect("a rejoin").duration_since(owed_since);
    assert!(
        waited <= Duration::from_secs(6) && waited >= Duration::from_secs(5),
        "rejoined {waited:?} after the leave was first owed"
    );
}

#[test]
fn commit_of_an_incarnation_that_lost_its_partitions_never_lands_with_the_next_ones_epoch() {
    // Chaos, consumer protocol, seed 773873162: a commit at epoch 9, answered
    // STALE_MEMBER_EPOCH after a session lapse and a rejoin that got the same
    // partition back (epoch 13, committed offset fetched at 769), was sent again with
    // epoch 13 and landed at 783: the member redid 769-782 below its own commit.
    let mut h = stable_with_a_6_s_session(vec![0]);
    let offsets = |o| {
        vec![CommitOffset {
            partition: tp(0),
            offset: o,
            leader_epoch: -1,
            metadata: None,
        }]
    };
    let first = h.m.commit(h.now, offsets(783)).unwrap();
    let on_wire = h.request();
    assert!(matches!(
        on_wire.request,
        GroupRequest::OffsetCommit { generation: 1, .. }
    ));
    // A second one waits behind it.
    let second = h.m.commit(h.now, offsets(790)).unwrap();
    h.no_request();
    // The coordinator goes silent: the session lapses, the member leaves and rejoins,
    // and gets partition 0 back at epoch 3.
    let leave = lapsed_and_leaving(&mut h);
    h.answer(leave, -1, None);
    let (join, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 0);
    h.answer(join, 3, Some(vec![0]));
    h.events();
    assert_eq!(h.m.assignment(), vec![tp(0)]);
    // Now the first commit's answer: the epoch it carried is stale.
    h.respond(
        on_wire.id,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), ResponseError::StaleMemberEpoch.code())],
        },
    );
    let events = h.events();
    let commits: Vec<_> = h
        .requests()
        .into_iter()
        .filter(|o| matches!(o.request, GroupRequest::OffsetCommit { .. }))
        .collect();
    assert!(commits.is_empty(), "sent with the new epoch: {commits:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::CommitCompleted { id, result: Err(_) } if *id == first)),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(e, Event::CommitCompleted { id, result: Err(CommitError::Stale { generation: 1 }) } if *id == second)),
        "the queued one fails too: {events:?}"
    );
    // A commit of the new incarnation goes, with its epoch.
    h.m.commit(h.now, offsets(769)).unwrap();
    assert!(matches!(
        h.request().request,
        GroupRequest::OffsetCommit { generation: 3, .. }
    ));
}

#[test]
fn session_lapse_leave_answered_not_coordinator_goes_again_before_the_rejoin() {
    // Chaos, consumer protocol, seed 848527062: the leave was answered
    // NOT_COORDINATOR (the coordinator had moved), taken as done, and the join met the
    // old incarnation at the next coordinator: no assignment for the member, every
    // partition held for it by the mock, the whole group stalled.
    let mut h = stable_with_a_6_s_session(vec![0, 1]);
    let leave = lapsed_and_leaving(&mut h);
    h.respond(leave, refused(ResponseError::NotCoordinator.code()));
    assert_eq!(h.m.state(), StateKind::Suspended, "no rejoin yet");
    assert_eq!(h.m.coordinator(), None, "looked up again");
    rediscover(&mut h, 1);
    let (again, hb) = h.heartbeat();
    assert_eq!(hb.epoch, -1, "the leave again");
    h.answer(again, -1, None);
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.epoch, 0, "then the rejoin");
}

#[test]
fn stable_subscription_change_goes_out_at_once_with_names_and_regex_then_not_again() {
    let mut h = H::stable(vec![0, 1]);
    h.m.set_subscription(h.now, vec![TOPIC.into(), "u".into()], None);
    let (id, hb) = h.heartbeat();
    assert_eq!(hb.names, Some(vec![TOPIC.to_string(), "u".to_string()]));
    assert_eq!(hb.regex.as_deref(), Some(""), "names and regex go together");
    h.answer(id, 1, None);
    // A pattern beside the names: sent once.
    h.m.set_subscription(h.now, vec![TOPIC.into()], Some("orders\\..*".into()));
    let (id, hb) = h.heartbeat();
    assert_eq!(hb.names, Some(vec![TOPIC.to_string()]));
    assert_eq!(hb.regex.as_deref(), Some("orders\\..*"));
    h.answer(id, 1, None);
    // The same subscription again changes nothing; the next heartbeat leaves it out.
    h.m.set_subscription(h.now, vec![TOPIC.into()], Some("orders\\..*".into()));
    h.no_request();
    h.advance(Duration::from_secs(5));
    let (_, hb) = h.heartbeat();
    assert_eq!(hb.names, None);
    assert_eq!(hb.regex, None);
}
