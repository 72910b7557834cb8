//! Scenario tests, one per transition of the error table, named
//! `<state>_<input>_<outcome>`. Each asserts the exact requests and events.

use super::super::assignor::builtin;
use super::super::messages::JoinedMember;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::super::assignor::{Assignor, RebalanceProtocol};
use super::super::consumer_protocol::{
    Assignment, Subscription, decode_subscription, encode_assignment, encode_subscription,
};
use super::super::testing::{Harness, lost};
use super::join::SUBSCRIPTION_VERSION;
use super::*;
use crate::error_name;
use std::time::Duration;

const GROUP: &str = "g";
const TOPIC: &str = "t";

fn tp(p: i32) -> TopicPartition {
    TopicPartition {
        topic: TOPIC.into(),
        partition: p,
    }
}

fn config(assignor: &str) -> GroupConfig {
    let a: Arc<dyn Assignor> = Arc::from(builtin(assignor).expect("builtin assignor"));
    let mut c = GroupConfig::new(GROUP, vec![TOPIC.into()], vec![a]);
    c.session_timeout = Duration::from_secs(10);
    c.heartbeat_interval = Duration::from_secs(1);
    c.max_poll_interval = Duration::from_secs(30);
    c
}

/// The shared harness ([`Harness`]) on a classic member.
type H = Harness<GroupMember>;

impl Harness<GroupMember> {
    /// A member with `c` on a topic of 4 partitions, at a fresh clock.
    fn new(c: GroupConfig) -> Self {
        let now = Instant::now();
        let mut m = GroupMember::new(c, now);
        m.set_topic_partitions(now, BTreeMap::from([(TOPIC.to_string(), 4)]));
        Harness::at(m, now)
    }
    /// Joins as the only member (the leader) with `assignment` being whatever the
    /// assignor gives a single member: all 4 partitions.
    fn join_alone(&mut self) -> i32 {
        self.join_alone_p("range")
    }
    /// [`H::join_alone`] with the group choosing `protocol`.
    fn join_alone_p(&mut self, protocol: &str) -> i32 {
        self.find_coordinator(2);
        let join = self.request();
        let GroupRequest::JoinGroup {
            protocols,
            member_id,
            ..
        } = &join.request
        else {
            panic!("{join:?}")
        };
        assert_eq!(member_id, "");
        let metadata = protocols[0].1.clone();
        self.respond(
            join.id,
            join_response(ResponseError::MemberIdRequired.code(), 0, "m1", "", vec![]),
        );
        let join = self.request();
        let GroupRequest::JoinGroup { member_id, .. } = &join.request else {
            panic!()
        };
        assert_eq!(
            member_id, "m1",
            "rejoins at once with the id the broker gave"
        );
        let members = vec![JoinedMember {
            member_id: "m1".into(),
            instance_id: None,
            metadata,
        }];
        self.respond(
            join.id,
            join_response_p(protocol, 0, 7, "m1", "m1", members),
        );
        let sync = self.request();
        let GroupRequest::SyncGroup {
            assignments,
            generation,
            ..
        } = &sync.request
        else {
            panic!("{sync:?}")
        };
        assert_eq!(*generation, 7);
        let mine = assignments
            .iter()
            .find(|(m, _)| m == "m1")
            .expect("leader assigns itself")
            .1
            .clone();
        self.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment: mine,
            },
        );
        7
    }
    /// A rebalance announced by a heartbeat, the member's JoinGroup answered with
    /// itself alone as leader of `generation` (with `protocol`): its SyncGroup.
    fn rejoin_alone(&mut self, protocol: &str, generation: i32) -> Outgoing {
        let hb = self.heartbeat();
        self.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
        let join = self.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!("{join:?}")
        };
        let members = vec![JoinedMember {
            member_id: "m1".into(),
            instance_id: None,
            metadata: protocols[0].1.clone(),
        }];
        self.respond(
            join.id,
            join_response_p(protocol, 0, generation, "m1", "m1", members),
        );
        self.request()
    }
    /// Answers the leader's own SyncGroup with what it assigned itself.
    fn answer_own_sync(&mut self, sync: &Outgoing) {
        let GroupRequest::SyncGroup { assignments, .. } = &sync.request else {
            panic!("{sync:?}")
        };
        let mine = assignments[0].1.clone();
        self.respond(
            sync.id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment: mine,
            },
        );
    }
    /// Commits `offset` of partition `p` of the test topic, without metadata.
    fn commit_one(&mut self, p: i32, offset: i64) -> Result<RequestId, CommitError> {
        self.m.commit(
            self.now,
            vec![CommitOffset {
                partition: tp(p),
                offset,
                leader_epoch: -1,
                metadata: None,
            }],
        )
    }
    fn heartbeat(&mut self) -> Outgoing {
        self.advance(Duration::from_secs(1));
        let hb = self.request();
        assert!(
            matches!(hb.request, GroupRequest::Heartbeat { .. }),
            "{hb:?}"
        );
        hb
    }
}

fn join_response(
    error: i16,
    generation: i32,
    member: &str,
    leader: &str,
    members: Vec<JoinedMember>,
) -> GroupResponse {
    join_response_p("range", error, generation, member, leader, members)
}

fn join_response_p(
    protocol: &str,
    error: i16,
    generation: i32,
    member: &str,
    leader: &str,
    members: Vec<JoinedMember>,
) -> GroupResponse {
    GroupResponse::JoinGroup {
        error,
        generation,
        protocol_name: Some(protocol.into()),
        leader: leader.into(),
        member_id: member.into(),
        members,
        skip_assignment: false,
    }
}

fn stable(assignor: &str) -> H {
    let mut h = H::new(config(assignor));
    h.join_alone();
    let ev = h.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Assigned { added, .. } if added.len() == 4)),
        "{ev:?}"
    );
    assert_eq!(h.m.state(), StateKind::Stable);
    // The OffsetFetch for the new partitions.
    let fetch = h.request();
    assert!(
        matches!(fetch.request, GroupRequest::OffsetFetch { ref partitions, .. } if partitions.len() == 4)
    );
    h
}

#[test]
fn stable_offset_fetch_answered_after_a_new_generation_still_gives_offsets() {
    // A cooperative member granted partitions at generation 7 rejoins before its
    // OffsetFetch is answered. The answer still counts: the committed offsets do
    // not depend on the generation, and without them the fetcher never starts.
    let mut h = H::new(config("cooperative-sticky"));
    h.join_alone_p("cooperative-sticky");
    h.events();
    let fetch = h.request();
    assert!(matches!(fetch.request, GroupRequest::OffsetFetch { .. }));
    let fetch_id = fetch.id;
    let sync = h.rejoin_alone("cooperative-sticky", 8);
    h.answer_own_sync(&sync);
    assert_eq!(h.m.generation(), Some(8));
    h.events();
    h.respond(
        fetch_id,
        GroupResponse::OffsetFetch {
            error: 0,
            partitions: (0..4).map(|p| (tp(p), 10 + i64::from(p), -1, 0)).collect(),
            metadata: vec![(tp(1), "ottla.f1:1,2".into()), (tp(9), "not ours".into())],
        },
    );
    let ev = h.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::CommittedOffsets { offsets, .. } if offsets.len() == 4)),
        "{ev:?}"
    );
    // The committed metadata comes along, for the partitions whose offsets came.
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::CommittedOffsets { metadata, .. }
            if metadata == &vec![(tp(1), "ottla.f1:1,2".to_string())])),
        "{ev:?}"
    );
}

#[test]
fn joining_assignment_error_closes_like_every_fatal_error() {
    // Found by the group_ops fuzz target: a leader that could not assign closed by
    // setting the state alone, so the closed member still reported its generation
    // and kept the offset fetch's timer armed.
    let mut h = H::new(config("cooperative-sticky"));
    h.join_alone_p("cooperative-sticky");
    h.events();
    let _fetch = h.request();
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    let join = h.request();
    assert_eq!(
        h.m.generation(),
        Some(7),
        "cooperative: kept while rejoining"
    );
    h.respond(
        join.id,
        join_response_p("no-such-assignor", 0, 8, "m1", "m1", vec![]),
    );
    let ev = h.events();
    assert!(
        matches!(ev[..], [.., Event::Fatal(GroupError::Assignment { .. })]),
        "{ev:?}"
    );
    assert_eq!(h.m.state(), StateKind::Closed);
    assert_eq!(h.m.generation(), None);
    assert_eq!(h.m.poll_timeout(), None);
    assert!(h.m.assignment().is_empty());
    h.no_request();
}

/// A cooperative assignor that breaks KIP-429: it gives everything to the last member,
/// whoever owns it now.
#[derive(Debug)]
struct Mover;

impl Assignor for Mover {
    fn name(&self) -> &'static str {
        "mover"
    }
    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Cooperative
    }
    fn assign(
        &self,
        partitions_per_topic: &BTreeMap<String, i32>,
        members: &[super::super::assignor::MemberSubscription],
    ) -> Result<BTreeMap<String, Assignment>, super::super::assignor::AssignError> {
        let all: Vec<TopicPartition> = partitions_per_topic
            .iter()
            .flat_map(|(t, n)| (0..*n).map(move |p| TopicPartition::new(t.clone(), p)))
            .collect();
        let last = members.len().saturating_sub(1);
        Ok(members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let partitions = if i == last { all.clone() } else { Vec::new() };
                (
                    m.member_id.clone(),
                    Assignment {
                        partitions,
                        user_data: None,
                    },
                )
            })
            .collect())
    }
}

#[test]
fn joining_a_cooperative_assignment_that_moves_an_owned_partition_directly_is_refused() {
    // KIP-429: a partition changes owner in two rounds, revoked by the old owner
    // first. Nothing checked a custom assignor, so one that moved an owned partition
    // directly gave it two owners. The Java client's leader refuses such an
    // assignment (`validateCooperativeAssignment`, an IllegalStateException out of
    // poll); here it is a fatal `GroupError::Assignment` naming the partition.
    let mut c = config("range");
    c.assignors = vec![Arc::new(Mover)];
    let mut h = H::new(c);
    h.find_coordinator(2);
    let join = h.request();
    let subscription = |owned: Vec<TopicPartition>| {
        encode_subscription(
            &Subscription {
                topics: vec![TOPIC.into()],
                user_data: None,
                owned_partitions: owned,
                generation_id: 7,
                rack_id: None,
            },
            SUBSCRIPTION_VERSION,
        )
        .expect("subscription")
    };
    let members = vec![
        JoinedMember {
            member_id: "m1".into(),
            instance_id: None,
            metadata: subscription((0..4).map(tp).collect()),
        },
        JoinedMember {
            member_id: "m2".into(),
            instance_id: None,
            metadata: subscription(Vec::new()),
        },
    ];
    h.respond(join.id, join_response_p("mover", 0, 8, "m1", "m1", members));
    let ev = h.events();
    let Some(Event::Fatal(GroupError::Assignment { message, .. })) = ev.last() else {
        panic!("{ev:?}");
    };
    assert!(
        message.contains("t-0") && message.contains("m2"),
        "{message}"
    );
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn syncing_an_illegal_generation_answer_to_the_last_generations_commit_changes_nothing() {
    // A cooperative member commits in generation 7, then rejoins keeping its
    // partitions; the commit reaches the coordinator after the JoinGroup, which
    // already moved the group to generation 8, and is refused ILLEGAL_GENERATION
    // while the member syncs. The member reset and lost every partition, though
    // its own generation was fine: the answer is about an older one.
    let mut h = H::new(config("cooperative-sticky"));
    h.join_alone_p("cooperative-sticky");
    h.events();
    let _fetch = h.request();
    let commit = h.commit_one(0, 5).expect("commit");
    let _sent = h.request();
    let sync = h.rejoin_alone("cooperative-sticky", 8);
    assert_eq!(h.m.state(), StateKind::Syncing);
    h.events();
    h.respond(
        commit,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), ResponseError::IllegalGeneration.code())],
        },
    );
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::CommitCompleted { result: Err(e), .. }] if e.is_retriable()),
        "{ev:?}"
    );
    assert_eq!(h.m.state(), StateKind::Syncing);
    assert_eq!(h.m.assignment().len(), 4);
    h.answer_own_sync(&sync);
    assert_eq!(h.m.generation(), Some(8));
    assert_eq!(h.m.assignment().len(), 4);
    assert!(
        !h.events().iter().any(|e| matches!(e, Event::Lost { .. })),
        "nothing lost"
    );
}

#[test]
fn stable_commits_go_out_one_at_a_time_and_a_queued_one_may_follow_the_join() {
    // The one-commit-in-flight queue lived in the driver, where neither the
    // simulation nor the fuzzer saw it. A commit queued behind another reaches the
    // coordinator after the member's next JoinGroup, and its ILLEGAL_GENERATION
    // answer while syncing speaks of the older generation: the member keeps its
    // partitions.
    let mut h = H::new(config("cooperative-sticky"));
    h.join_alone_p("cooperative-sticky");
    h.events();
    let _fetch = h.request();
    let a = h.commit_one(0, 5).expect("a");
    let b = h.commit_one(0, 6).expect("b");
    assert_eq!(h.request().id, a);
    h.no_request();
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    let metadata = protocols[0].1.clone();
    h.no_request();
    h.respond(
        a,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), 0)],
        },
    );
    let sent_b = h.request();
    assert_eq!(sent_b.id, b, "b goes out once a is answered");
    assert!(
        matches!(&sent_b.request, GroupRequest::OffsetCommit { generation: 7, offsets, .. } if offsets[0].offset == 6),
        "{sent_b:?}"
    );
    let members = vec![JoinedMember {
        member_id: "m1".into(),
        instance_id: None,
        metadata,
    }];
    h.respond(
        join.id,
        join_response_p("cooperative-sticky", 0, 8, "m1", "m1", members),
    );
    let sync = h.request();
    h.events();
    h.respond(
        b,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), ResponseError::IllegalGeneration.code())],
        },
    );
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::CommitCompleted { id, result: Err(CommitError::Stale { generation: 7 }) }] if *id == b),
        "{ev:?}"
    );
    h.answer_own_sync(&sync);
    assert_eq!(h.m.generation(), Some(8));
    assert_eq!(h.m.assignment().len(), 4);
}

#[test]
fn closing_fails_the_queued_commits() {
    let mut h = stable("range");
    let a = h.commit_one(0, 5).expect("a");
    let b = h.commit_one(1, 5).expect("b");
    assert_eq!(h.request().id, a);
    h.m.leave(h.now);
    let leave = h.request();
    assert!(matches!(leave.request, GroupRequest::LeaveGroup { .. }));
    h.respond(leave.id, GroupResponse::LeaveGroup { error: 0 });
    assert_eq!(h.m.state(), StateKind::Closed);
    let ev = h.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::CommitCompleted { id, result: Err(_) } if *id == b)),
        "the queued commit is answered: {ev:?}"
    );
    h.no_request();
}

#[test]
fn stable_leader_asks_for_metadata_every_max_age_and_rebalances_when_a_topic_grows() {
    // Partition counts reached the member once, at startup: a leader never learnt
    // that a subscribed topic gained partitions, and the new ones were never
    // assigned. Java's leader checks its assignment snapshot against metadata
    // refreshed at least every metadata.max.age.ms.
    let mut c = config("range");
    c.metadata_max_age = Duration::from_secs(20);
    c.session_timeout = Duration::from_secs(60);
    c.max_poll_interval = Duration::from_secs(600);
    let mut h = H::new(c);
    h.join_alone();
    h.events();
    let _fetch = h.request();
    let start = h.now;
    let mut asked = None;
    for _ in 0..20 {
        let hb = h.heartbeat();
        h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
        h.m.note_progress(h.now);
        if let Some(Event::MetadataNeeded { topics }) = h
            .events()
            .into_iter()
            .find(|e| matches!(e, Event::MetadataNeeded { .. }))
        {
            asked = Some((h.now, topics));
            break;
        }
    }
    let (at, topics) = asked.expect("the leader asks for metadata within max age");
    assert_eq!(topics, vec![TOPIC.to_string()]);
    assert!(at - start >= Duration::from_secs(20), "not before max age");
    // The topic grew from 4 to 6 partitions: rebalance, and the new ones are assigned.
    h.m.set_topic_partitions(h.now, BTreeMap::from([(TOPIC.to_string(), 6)]));
    let ev = h.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::RevokeRequested { .. })),
        "an eager leader gives back and rejoins: {ev:?}"
    );
}

#[test]
fn stable_leader_rebalances_when_a_subscribed_topic_is_deleted() {
    // The driver reports a topic the broker no longer knows with 0 partitions.
    let mut h = stable("range");
    h.m.set_topic_partitions(h.now, BTreeMap::from([(TOPIC.to_string(), 0)]));
    let ev = h.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::RevokeRequested { .. })),
        "{ev:?}"
    );
}

#[test]
fn syncing_unanswered_times_out_after_the_request_timeout() {
    // A follower's SyncGroup waited max.poll.interval.ms + 5 s (305 s by default) for
    // a coordinator that had gone silent. The Java client sends SyncGroup with
    // request.timeout.ms.
    let mut c = config("range");
    c.request_timeout = Duration::from_secs(10);
    let mut h = H::new(c);
    h.find_coordinator(2);
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    let metadata = protocols[0].1.clone();
    let members = vec![JoinedMember {
        member_id: "m0".into(),
        instance_id: None,
        metadata,
    }];
    // A follower: m0 leads.
    h.respond(join.id, join_response_p("range", 0, 3, "m1", "m0", members));
    let sync = h.request();
    assert!(matches!(sync.request, GroupRequest::SyncGroup { .. }));
    h.advance(Duration::from_secs(10) - Duration::from_millis(1));
    assert_eq!(h.m.state(), StateKind::Syncing);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.m.state(), StateKind::Unjoined);
    assert_eq!(
        h.m.coordinator(),
        None,
        "the silent coordinator is looked up again"
    );
}

#[test]
fn joining_the_join_group_is_waited_for_as_long_as_the_member_times_it_and_no_longer() {
    // The member's Joining deadline and the driver's request timeout for the JoinGroup
    // were computed in two places (member/join.rs and driver/group.rs). The member now
    // hands the wait with the request; both come from `GroupConfig::join_wait`.
    let mut c = config("range");
    c.max_poll_interval = Duration::from_secs(20);
    c.request_timeout = Duration::from_secs(3);
    let mut h = H::new(c);
    h.find_coordinator(2);
    let join = h.request();
    assert!(matches!(join.request, GroupRequest::JoinGroup { .. }));
    let wait = join.wait.expect("a JoinGroup outlives request.timeout.ms");
    assert_eq!(wait, h.m.config().join_wait());
    assert_eq!(
        wait,
        Duration::from_secs(25),
        "rebalance timeout + 5 s, as Java's"
    );
    // The application keeps polling (else `max.poll.interval.ms` suspends it first).
    for _ in 0..24 {
        h.m.note_progress(h.now);
        h.advance(Duration::from_secs(1));
    }
    h.m.note_progress(h.now);
    h.advance(Duration::from_secs(1) - Duration::from_millis(1));
    assert_eq!(h.m.state(), StateKind::Joining);
    h.m.note_progress(h.now);
    h.advance(Duration::from_millis(1));
    assert_ne!(h.m.state(), StateKind::Joining, "given up at the same wait");
    // Other requests keep the request timeout.
    let mut h = H::new(config("range"));
    h.find_coordinator(2);
    let (join, members) = {
        let join = h.request();
        let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
            panic!("{join:?}")
        };
        let m = vec![JoinedMember {
            member_id: "m0".into(),
            instance_id: None,
            metadata: protocols[0].1.clone(),
        }];
        (join.id, m)
    };
    h.respond(join, join_response_p("range", 0, 3, "m1", "m0", members));
    let sync = h.request();
    assert!(matches!(sync.request, GroupRequest::SyncGroup { .. }));
    assert_eq!(sync.wait, None);
}

/// The coordinator found and the first JoinGroup sent: its id, and the group's member
/// list for the answer, with one member, `id`, carrying this member's subscription.
fn first_join_as(h: &mut H, id: &str) -> (RequestId, Vec<JoinedMember>) {
    h.find_coordinator(2);
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    let members = vec![JoinedMember {
        member_id: id.into(),
        instance_id: None,
        metadata: protocols[0].1.clone(),
    }];
    (join.id, members)
}

/// A follower's JoinGroup answered: its SyncGroup, in flight.
fn syncing_follower(h: &mut H, generation: i32) -> Outgoing {
    let (join, members) = first_join_as(h, "m0");
    h.respond(
        join,
        join_response_p("range", 0, generation, "m1", "m0", members),
    );
    let sync = h.request();
    assert!(matches!(sync.request, GroupRequest::SyncGroup { .. }));
    sync
}

#[test]
fn syncing_heartbeats_with_the_new_generation_and_ignores_a_rebalance_answer() {
    // The Java client heartbeats from the JoinGroup response on (COMPLETING_REBALANCE):
    // a follower whose leader is slow to assign stays alive at the broker, and a
    // coordinator gone silent is noticed by the session clock too. ottla sent none
    // until the SyncGroup was answered.
    let mut h = H::new(config("range"));
    let sync = syncing_follower(&mut h, 3);
    h.advance(Duration::from_secs(1));
    let hb = h.request();
    assert!(
        matches!(hb.request, GroupRequest::Heartbeat { generation: 3, ref member_id, .. } if member_id == "m1"),
        "a heartbeat of the new generation while syncing: {hb:?}"
    );
    // REBALANCE_IN_PROGRESS while syncing is what a broker may say before it has
    // the leader's assignment; Java ignores it outside STABLE.
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    h.no_request();
    assert_eq!(h.m.state(), StateKind::Syncing);
    let hb = h.heartbeat();
    h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
    // The assignment comes; heartbeats go on at their own pace, same generation.
    let assignment = encode_assignment(
        &Assignment {
            partitions: vec![tp(0)],
            user_data: None,
        },
        0,
    )
    .expect("assignment");
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: 0,
            protocol_name: None,
            assignment,
        },
    );
    assert_eq!(h.m.state(), StateKind::Stable);
    let _fetch = h.request();
    let hb = h.heartbeat();
    assert!(matches!(
        hb.request,
        GroupRequest::Heartbeat { generation: 3, .. }
    ));
}

#[test]
fn syncing_heartbeat_illegal_generation_rejoins_and_drops_the_sync_answer() {
    let mut h = H::new(config("range"));
    let sync = syncing_follower(&mut h, 3);
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::IllegalGeneration.code(),
        },
    );
    let join = h.request();
    assert!(
        matches!(join.request, GroupRequest::JoinGroup { ref member_id, .. } if member_id == "m1"),
        "rejoins keeping the id: {join:?}"
    );
    assert_eq!(h.m.state(), StateKind::Joining);
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: 0,
            protocol_name: None,
            assignment: Bytes::new(),
        },
    );
    assert_eq!(h.m.state(), StateKind::Joining, "the stale sync is dropped");
}
#[test]
fn closed_late_fatal_find_coordinator_answer_keeps_the_clean_close() {
    // Found by the group_ops fuzz target: a member that left while its
    // FindCoordinator was in flight turned its clean close into a fatal error (and
    // emitted Fatal after Left) when that lookup was answered with a fatal code.
    let mut h = H::new(config("range"));
    let lookup = h.request();
    assert!(matches!(
        lookup.request,
        GroupRequest::FindCoordinator { .. }
    ));
    h.m.leave(h.now);
    assert_eq!(h.events(), vec![Event::Left]);
    h.lookup_refused(lookup.id, ResponseError::GroupAuthorizationFailed.code());
    assert_eq!(h.events(), vec![]);
    assert_eq!(h.m.state(), StateKind::Closed);
    assert_eq!(h.m.error(), None);
    assert_eq!(
        h.m.commit(h.now, vec![]),
        Err(CommitError::Closed(GroupError::Closed {
            group: GROUP.into()
        }))
    );
}

#[test]
fn joining_offset_fetch_retry_for_revoked_partitions_leaves_no_timer_due() {
    // Found by the group_ops fuzz target: the partitions of a pending OffsetFetch
    // were revoked, then the fetch failed. Its retry timer stayed armed with nothing
    // left to ask for, so `poll_timeout` stayed in the past and the driver's loop
    // spun for as long as the JoinGroup was held.
    let mut h = H::new(config("range"));
    h.join_alone();
    h.events();
    let fetch = h.request();
    assert!(matches!(fetch.request, GroupRequest::OffsetFetch { .. }));
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    h.events();
    h.m.complete_revocation(h.now, 7);
    let join = h.request();
    assert!(matches!(join.request, GroupRequest::JoinGroup { .. }));
    h.respond(
        fetch.id,
        GroupResponse::OffsetFetch {
            error: ResponseError::CoordinatorLoadInProgress.code(),
            partitions: vec![],
            metadata: vec![],
        },
    );
    h.advance(Duration::from_secs(1));
    h.no_request();
    assert_eq!(h.m.state(), StateKind::Joining);
    let next = h.m.poll_timeout().expect("the JoinGroup's timer");
    assert!(next > h.now, "{:?} is due and stays due", h.m.next_timer());
}

#[test]
fn leader_delay_with_the_coordinator_unknown_leaves_no_timer_due() {
    // Found by the group_ops fuzz target: a leader holding its SyncGroup lost its
    // coordinator (a commit of the generation it is leaving failed); the held
    // SyncGroup's timer stayed armed though it cannot be sent until the coordinator
    // is found again, and the driver's loop spun.
    let mut c = config("cooperative-sticky");
    c.leader_sync_delay = Duration::from_millis(50);
    let mut h = H::new(c);
    h.find_coordinator(2);
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    let members = vec![JoinedMember {
        member_id: "m1".into(),
        instance_id: None,
        metadata: protocols[0].1.clone(),
    }];
    h.respond(
        join.id,
        join_response_p("cooperative-sticky", 0, 7, "m1", "m1", members.clone()),
    );
    h.no_request();
    h.advance(Duration::from_millis(50));
    let sync = h.request();
    let GroupRequest::SyncGroup { assignments, .. } = &sync.request else {
        panic!("{sync:?}")
    };
    let mine = assignments[0].1.clone();
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: 0,
            protocol_name: None,
            assignment: mine,
        },
    );
    let _fetch = h.request();
    h.events();
    let commit = h.commit_one(0, 1).expect("stable");
    let _ = h.request();
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    let join = h.request();
    h.respond(
        join.id,
        join_response_p("cooperative-sticky", 0, 8, "m1", "m1", members),
    );
    assert_eq!(h.m.state(), StateKind::Syncing, "holding the SyncGroup");
    h.m.handle_failure(h.now, commit, Failure::Disconnected);
    assert_eq!(h.m.coordinator(), None);
    h.events();
    h.advance(Duration::from_millis(60));
    h.no_request();
    let next = h.m.poll_timeout().expect("the coordinator lookup's timer");
    assert!(next > h.now, "{:?} is due and stays due", h.m.next_timer());
}

#[test]
fn unjoined_member_id_required_rejoins_at_once_with_the_given_id() {
    // Asserted inside join_alone.
    stable("range");
}

#[test]
fn stable_heartbeat_rebalance_in_progress_eager_revokes_everything_then_rejoins() {
    let mut h = stable("range");
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    let ev = h.events();
    assert_eq!(
        ev,
        vec![Event::RevokeRequested {
            generation: 7,
            partitions: (0..4).map(tp).collect()
        }]
    );
    assert_eq!(h.m.state(), StateKind::Revoking);
    h.no_request();
    // Commits are still possible with the old generation while revoking.
    let commit = h.commit_one(0, 5);
    assert!(commit.is_ok());
    let _ = h.request();
    h.m.complete_revocation(h.now, 7);
    let join = h.request();
    let GroupRequest::JoinGroup {
        member_id,
        protocols,
        ..
    } = &join.request
    else {
        panic!("{join:?}")
    };
    assert_eq!(member_id, "m1");
    let sub = decode_subscription(protocols[0].1.clone()).unwrap();
    assert!(
        sub.owned_partitions.is_empty(),
        "eager members own nothing when they rejoin"
    );
    assert!(h.m.assignment().is_empty());
}

#[test]
fn stable_heartbeat_not_coordinator_rediscovers_and_resumes_heartbeats_without_rejoining() {
    let mut h = stable("range");
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::NotCoordinator.code(),
        },
    );
    assert!(h.events().is_empty());
    assert_eq!(h.m.coordinator(), None);
    h.advance(Duration::from_millis(200));
    h.find_coordinator(2);
    assert!(matches!(h.events()[..], [Event::CoordinatorFound { .. }]));
    let hb = h.request();
    assert!(
        matches!(hb.request, GroupRequest::Heartbeat { generation: 7, .. }),
        "heartbeat at once on the new coordinator: {hb:?}"
    );
    assert_eq!(h.m.state(), StateKind::Stable);
    assert_eq!(h.m.assignment().len(), 4);
}

#[test]
fn stable_heartbeat_unknown_member_id_loses_partitions_and_rejoins_without_an_id() {
    let mut h = stable("range");
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::UnknownMemberId.code(),
        },
    );
    assert_eq!(
        h.events(),
        vec![Event::Lost {
            partitions: (0..4).map(tp).collect(),
            reason: LostReason::UnknownMember
        }]
    );
    let join = h.request();
    assert!(
        matches!(&join.request, GroupRequest::JoinGroup { member_id, .. } if member_id.is_empty())
    );
    assert_eq!(h.m.generation(), None);
}

#[test]
fn stable_heartbeat_illegal_generation_loses_partitions_and_rejoins_keeping_the_id() {
    let mut h = stable("range");
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::IllegalGeneration.code(),
        },
    );
    assert_eq!(
        h.events(),
        vec![Event::Lost {
            partitions: (0..4).map(tp).collect(),
            reason: LostReason::IllegalGeneration
        }]
    );
    let join = h.request();
    assert!(
        matches!(&join.request, GroupRequest::JoinGroup { member_id, .. } if member_id == "m1")
    );
}

#[test]
fn stable_heartbeat_fenced_instance_id_is_fatal_and_sticky() {
    let mut h = stable("range");
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::FencedInstanceId.code(),
        },
    );
    let ev = h.events();
    assert!(matches!(
        &ev[0],
        Event::Lost {
            reason: LostReason::Fatal,
            ..
        }
    ));
    assert!(matches!(
        &ev[1],
        Event::Fatal(GroupError::Broker { code: 82, .. })
    ));
    assert_eq!(h.m.state(), StateKind::Closed);
    let err = h.m.commit(h.now, vec![]).unwrap_err();
    assert!(
        matches!(
            err,
            CommitError::Closed(GroupError::Broker { code: 82, .. })
        ),
        "{err:?}"
    );
    h.advance(Duration::from_secs(60));
    h.no_request();
    assert_eq!(h.m.poll_timeout(), None);
}

#[test]
fn joining_coordinator_load_in_progress_retries_after_backoff() {
    let mut h = H::new(config("range"));
    h.find_coordinator(2);
    let join = h.request();
    h.respond(
        join.id,
        join_response(
            ResponseError::CoordinatorLoadInProgress.code(),
            -1,
            "",
            "",
            vec![],
        ),
    );
    h.no_request();
    assert_eq!(h.m.next_timer().map(|t| t.0), Some(Timer::Join));
    h.advance(Duration::from_secs(2));
    assert!(matches!(
        h.request().request,
        GroupRequest::JoinGroup { .. }
    ));
}

#[test]
fn joining_inconsistent_group_protocol_is_fatal_and_names_the_cause() {
    let mut h = H::new(config("range"));
    h.find_coordinator(2);
    let join = h.request();
    h.respond(
        join.id,
        join_response(
            ResponseError::InconsistentGroupProtocol.code(),
            -1,
            "",
            "",
            vec![],
        ),
    );
    let ev = h.events();
    let Some(Event::Fatal(e)) = ev.last() else {
        panic!("{ev:?}")
    };
    assert_eq!(
        e,
        &GroupError::InconsistentGroupProtocol {
            group: GROUP.into(),
            offered: vec!["range".into()],
        }
    );
    let message = e.to_string();
    for words in [
        "INCONSISTENT_GROUP_PROTOCOL",
        "(range)",
        "partition.assignment.strategy",
        "docs/migrating.md",
    ] {
        assert!(message.contains(words), "{words:?} missing from {message}");
    }
    assert_eq!(h.m.state(), StateKind::Closed);
    assert_eq!(h.m.error(), Some(e));
}

#[test]
fn joining_an_answer_without_an_assignor_name_is_inconsistent_group_protocol() {
    let mut c = config("cooperative-sticky");
    c.assignors
        .push(Arc::from(builtin("range").expect("builtin assignor")));
    let mut h = H::new(c);
    h.find_coordinator(2);
    let join = h.request();
    h.respond(
        join.id,
        GroupResponse::JoinGroup {
            error: 0,
            generation: 1,
            protocol_name: None,
            leader: "m1".into(),
            member_id: "m1".into(),
            members: vec![],
            skip_assignment: false,
        },
    );
    let ev = h.events();
    assert!(
        matches!(ev.last(), Some(Event::Fatal(GroupError::InconsistentGroupProtocol { offered, .. }))
            if offered == &["cooperative-sticky".to_string(), "range".to_string()]),
        "{ev:?}"
    );
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn stable_offering_an_eager_assignor_revokes_everything_even_under_cooperative_sticky() {
    // The first bounce of a move to cooperative (docs/migrating.md) offers `range` and
    // `cooperative-sticky`. As in the Java client, such a member is eager even when the
    // group chose `cooperative-sticky`: the next generation may choose `range`, which
    // would hand a partition it kept straight to another member.
    let mut c = config("range");
    c.assignors.push(Arc::from(
        builtin("cooperative-sticky").expect("builtin assignor"),
    ));
    let mut h = H::new(c);
    let generation = h.join_alone_p("cooperative-sticky");
    let ev = h.events();
    assert!(
        ev.iter().any(
            |e| matches!(e, Event::Joined { protocol, .. } if protocol == "cooperative-sticky")
        ),
        "{ev:?}"
    );
    let _offset_fetch = h.request();
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    assert_eq!(
        h.events(),
        vec![Event::RevokeRequested {
            generation,
            partitions: (0..4).map(tp).collect()
        }]
    );
    assert_eq!(h.m.state(), StateKind::Revoking);
    h.m.complete_revocation(h.now, generation);
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    let names: Vec<&str> = protocols.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["range", "cooperative-sticky"]);
    let sub = decode_subscription(protocols[0].1.clone()).unwrap();
    assert!(sub.owned_partitions.is_empty(), "{sub:?}");
}

#[test]
fn syncing_an_unexpected_error_code_rejoins_after_backoff_instead_of_closing() {
    // The Java client raises an unexpected SyncGroup (or JoinGroup, FindCoordinator,
    // OffsetFetch) error from poll() and rejoins on the next one; the consumer stays
    // usable. ottla closed the member for good. Seen in chaos runs: the librdkafka
    // mock answered a SyncGroup INVALID_PARTITIONS (37) after giving two clients one
    // member id.
    let mut h = H::new(config("range"));
    let sync = syncing_follower(&mut h, 3);
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: ResponseError::InvalidPartitions.code(),
            protocol_name: None,
            assignment: Bytes::new(),
        },
    );
    assert_eq!(h.m.state(), StateKind::Unjoined);
    assert!(
        !h.events().iter().any(|e| matches!(e, Event::Fatal(_))),
        "not fatal"
    );
    h.advance(Duration::from_secs(1));
    let join = h.request();
    assert!(
        matches!(join.request, GroupRequest::JoinGroup { .. }),
        "{join:?}"
    );
}

#[test]
fn joining_a_member_listed_twice_is_assigned_once() {
    // The Java leader keys subscriptions by member id, so a member listed twice (the
    // librdkafka mock gave two clients one id) counts once; ottla's leader refused
    // the whole assignment and closed for good.
    let mut h = H::new(config("range"));
    h.find_coordinator(2);
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    let metadata = protocols[0].1.clone();
    let member = |id: &str| JoinedMember {
        member_id: id.into(),
        instance_id: None,
        metadata: metadata.clone(),
    };
    h.respond(
        join.id,
        join_response_p(
            "range",
            0,
            3,
            "m1",
            "m1",
            vec![member("m1"), member("m0"), member("m0")],
        ),
    );
    let sync = h.request();
    let GroupRequest::SyncGroup { assignments, .. } = &sync.request else {
        panic!("{sync:?}")
    };
    let members: Vec<&str> = assignments.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(!h.events().iter().any(|e| matches!(e, Event::Fatal(_))));
}

#[test]
fn syncing_invalid_request_rejoins() {
    let mut h = H::new(config("range"));
    h.find_coordinator(2);
    let join = h.request();
    h.respond(join.id, join_response(0, 3, "m2", "m1", vec![]));
    let sync = h.request();
    assert!(
        matches!(&sync.request, GroupRequest::SyncGroup { assignments, .. } if assignments.is_empty()),
        "followers send no assignments"
    );
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: ResponseError::InvalidRequest.code(),
            protocol_name: None,
            assignment: Bytes::new(),
        },
    );
    assert!(matches!(
        h.request().request,
        GroupRequest::JoinGroup { .. }
    ));
}

#[test]
fn stable_session_lapse_loses_the_partitions_keeps_the_member_id_and_rejoins() {
    // A lapse once lost the partitions and forgot the member id, so the member rejoined
    // as a stranger and its old id stayed a ghost for a session timeout. Then it kept
    // both (as the Java client), and went on processing partitions the coordinator had
    // already given to others: a zombie until the next heartbeat answer (chaos seed
    // 20261127). Now the partitions are lost at the lapse and the id is kept.
    let mut h = stable("range");
    let generation = h.m.generation().expect("in a generation");
    // Heartbeats go out but are never answered, for a whole session (10 s).
    let mut lookup = None;
    for _ in 0..1100 {
        h.advance(Duration::from_millis(10));
        while let Some(out) = h.m.poll_request() {
            if matches!(out.request, GroupRequest::FindCoordinator { .. }) {
                lookup = Some(out);
            }
        }
        if lookup.is_some() {
            break;
        }
    }
    let lookup = lookup.expect("the lapse rediscovers the coordinator");
    let ev = h.events();
    assert!(
        ev.contains(&Event::Lost {
            partitions: (0..4).map(tp).collect(),
            reason: LostReason::SessionLapsed
        }),
        "{ev:?}"
    );
    assert!(h.m.assignment().is_empty());
    assert_eq!(
        h.m.generation(),
        None,
        "nothing may be committed for the old generation"
    );
    assert_eq!(h.m.member_id(), "m1");
    // Found again: the member rejoins under the same id.
    h.respond(
        lookup.id,
        GroupResponse::FindCoordinator {
            error: 0,
            node_id: 2,
            host: "b2".into(),
            port: 9092,
        },
    );
    let join = h.request();
    let GroupRequest::JoinGroup { member_id, .. } = &join.request else {
        panic!("expected a JoinGroup, got {join:?}");
    };
    assert_eq!(member_id, "m1");
    assert!(generation >= 1);
}

#[test]
fn a_failure_from_the_coordinator_given_up_on_leaves_the_new_one_known() {
    // The driver closes the connection to a coordinator the member gave up on (as
    // the Java client), so the heartbeat and commit still on it fail. Found again
    // meanwhile, the member must not give up on the new coordinator for them.
    let mut h = stable("range");
    let commit = h.commit_one(0, 5).expect("commit");
    let _sent = h.request();
    let mut lookup = None;
    let mut stale_heartbeat = None;
    for _ in 0..1100 {
        h.advance(Duration::from_millis(10));
        while let Some(out) = h.m.poll_request() {
            match out.request {
                GroupRequest::FindCoordinator { .. } => lookup = Some(out),
                GroupRequest::Heartbeat { .. } => stale_heartbeat = Some(out),
                _ => {}
            }
        }
        if lookup.is_some() {
            break;
        }
    }
    let (lookup, stale) = (lookup.expect("lapse"), stale_heartbeat.expect("heartbeat"));
    h.respond(
        lookup.id,
        GroupResponse::FindCoordinator {
            error: 0,
            node_id: 2,
            host: "b2".into(),
            port: 9092,
        },
    );
    // The lapse lost the partitions: the member rejoins with the new coordinator.
    let join = h.request();
    assert!(
        matches!(join.request, GroupRequest::JoinGroup { .. }),
        "{join:?}"
    );
    h.m.handle_failure(h.now, stale.id, Failure::Disconnected);
    h.m.handle_failure(h.now, commit, Failure::Disconnected);
    assert_eq!(
        h.m.coordinator(),
        Some(NodeId(2)),
        "failures on the old connection say nothing about the new coordinator"
    );
    assert_eq!(h.m.state(), StateKind::Joining);
}

#[test]
fn a_late_heartbeat_response_from_an_old_generation_is_dropped() {
    let mut h = stable("range");
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::IllegalGeneration.code(),
        },
    );
    let _ = h.events();
    // The same response again (a duplicate) changes nothing.
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::FencedInstanceId.code(),
        },
    );
    assert!(h.events().is_empty());
    assert_ne!(h.m.state(), StateKind::Closed);
}

#[test]
fn stable_commit_for_an_unowned_partition_is_refused() {
    let mut h = stable("range");
    let other = TopicPartition {
        topic: "other".into(),
        partition: 0,
    };
    let err =
        h.m.commit(
            h.now,
            vec![CommitOffset {
                partition: other.clone(),
                offset: 1,
                leader_epoch: -1,
                metadata: None,
            }],
        )
        .unwrap_err();
    assert_eq!(err, CommitError::NotOwned(other));
    let id = h.commit_one(1, 1).unwrap();
    let out = h.request();
    assert_eq!(out.id, id);
    assert!(
        matches!(&out.request, GroupRequest::OffsetCommit { generation: 7, member_id, .. } if member_id == "m1")
    );
}

#[test]
fn stable_commit_refused_for_its_content_fails_only_that_commit() {
    // OFFSET_METADATA_TOO_LARGE once closed the member for good; the Java client
    // fails the commit and carries on. So for the other codes about the commit's
    // content.
    let mut h = stable("range");
    for code in [
        ResponseError::OffsetMetadataTooLarge,
        ResponseError::InvalidCommitOffsetSize,
        ResponseError::TopicAuthorizationFailed,
        ResponseError::UnknownTopicOrPartition,
    ] {
        let commit = |offset| {
            vec![CommitOffset {
                partition: tp(1),
                offset,
                leader_epoch: -1,
                metadata: Some("x".repeat(5000)),
            }]
        };
        let id = h.m.commit(h.now, commit(1)).unwrap();
        let _ = h.request();
        h.respond(
            id,
            GroupResponse::OffsetCommit {
                partitions: vec![(tp(1), code.code())],
            },
        );
        let ev = h.events();
        assert!(
            matches!(
                &ev[..],
                [Event::CommitCompleted { result: Err(CommitError::Broker { code: c, .. }), .. }] if *c == code.code()
            ),
            "{code:?}: {ev:?}"
        );
        assert_eq!(h.m.state(), StateKind::Stable, "{code:?}");
        let id =
            h.m.commit(h.now, commit(2))
                .expect("the member still commits");
        let out = h.request();
        assert_eq!(out.id, id);
        h.respond(
            id,
            GroupResponse::OffsetCommit {
                partitions: vec![(tp(1), 0)],
            },
        );
        let ev = h.events();
        assert!(
            matches!(&ev[..], [Event::CommitCompleted { result: Ok(_), .. }]),
            "{code:?}: {ev:?}"
        );
    }
}

#[test]
fn stable_heartbeat_unexpected_errors_retry_and_keep_the_partitions() {
    // INVALID_REQUEST on a heartbeat was read as ILLEGAL_GENERATION (partitions lost,
    // rejoin), UNSUPPORTED_VERSION closed the member. The Java client's heartbeat
    // raises "Unexpected error in heartbeat response" and tries again after its
    // backoff (`Heartbeat::failHeartbeat`).
    for code in [
        ResponseError::InvalidRequest,
        ResponseError::UnsupportedVersion,
        ResponseError::GroupIdNotFound,
    ] {
        let mut h = stable("range");
        let hb = h.heartbeat();
        h.respond(hb.id, GroupResponse::Heartbeat { error: code.code() });
        assert_eq!(h.events(), vec![], "{code:?}");
        assert_eq!(h.m.state(), StateKind::Stable, "{code:?}");
        assert_eq!(h.m.assignment().len(), 4, "{code:?}");
        h.no_request();
        h.advance(h.m.config().retry_backoff * 2);
        let again = h.request();
        assert!(
            matches!(again.request, GroupRequest::Heartbeat { .. }),
            "{code:?}: {again:?}"
        );
    }
}

#[test]
fn stable_commit_unexpected_errors_fail_that_commit_only() {
    // GROUP_ID_NOT_FOUND (Kafka's answer on OffsetCommit v9+ for a group that no
    // longer exists) and STALE_MEMBER_EPOCH closed the member for good; the Java
    // client raises "Unexpected error in commit" to the committer and carries on.
    let mut h = stable("range");
    for code in [
        ResponseError::GroupIdNotFound,
        ResponseError::StaleMemberEpoch,
        ResponseError::InvalidRequest,
    ] {
        let id = h.commit_one(1, 1).expect("the member commits");
        let _ = h.request();
        h.respond(
            id,
            GroupResponse::OffsetCommit {
                partitions: vec![(tp(1), code.code())],
            },
        );
        let ev = h.events();
        let [
            Event::CommitCompleted {
                result: Err(err), ..
            },
        ] = &ev[..]
        else {
            panic!("{code:?}: {ev:?}");
        };
        assert!(!err.is_retriable(), "{code:?}");
        assert_eq!(h.m.state(), StateKind::Stable, "{code:?}");
    }
}

#[test]
fn commit_retriability_follows_the_reaction_table() {
    let broker = |e: ResponseError| CommitError::Broker {
        code: e.code(),
        name: error_name(e.code()),
    };
    // NETWORK_EXCEPTION was not retriable, so the final commit at close gave up.
    for retriable in [
        ResponseError::NetworkException,
        ResponseError::RequestTimedOut,
        ResponseError::CoordinatorLoadInProgress,
        ResponseError::CoordinatorNotAvailable,
        ResponseError::NotCoordinator,
        ResponseError::UnknownTopicOrPartition,
        ResponseError::RebalanceInProgress,
    ] {
        assert!(broker(retriable).is_retriable(), "{retriable:?}");
    }
    for fatal in [
        ResponseError::UnknownMemberId,
        ResponseError::IllegalGeneration,
        ResponseError::FencedInstanceId,
        ResponseError::GroupAuthorizationFailed,
        ResponseError::OffsetMetadataTooLarge,
        ResponseError::GroupIdNotFound,
    ] {
        assert!(!broker(fatal).is_retriable(), "{fatal:?}");
    }
}

/// Steps the clock by 5 ms until a request `wanted` picks goes out, answering the
/// other requests (heartbeats) without error; the time it took.
fn wait_for(h: &mut H, wanted: impl Fn(&GroupRequest) -> bool) -> (Duration, Outgoing) {
    let start = h.now;
    for _ in 0..2000 {
        while let Some(out) = h.m.poll_request() {
            if wanted(&out.request) {
                return (h.now - start, out);
            }
            if matches!(out.request, GroupRequest::Heartbeat { .. }) {
                h.respond(out.id, GroupResponse::Heartbeat { error: 0 });
            }
        }
        h.advance(Duration::from_millis(5));
    }
    panic!("no such request in 10 s");
}

#[test]
fn stable_offset_fetch_asks_for_stable_offsets_and_backs_off_exponentially() {
    // UNSTABLE_OFFSET_COMMIT: a transactional commit of these partitions is pending.
    // The Java client asks with require_stable (so a new owner never resumes before
    // it settles) and retries with KIP-580's backoff, 100 ms doubling to 1 s; ottla
    // asked without the flag and retried every 100 ms.
    let mut h = H::new(config("range"));
    h.join_alone();
    h.events();
    let mut fetch = h.request();
    let mut waits = Vec::new();
    for _ in 0..6 {
        let GroupRequest::OffsetFetch { require_stable, .. } = &fetch.request else {
            panic!("{fetch:?}");
        };
        assert!(require_stable, "{fetch:?}");
        h.respond(
            fetch.id,
            GroupResponse::OffsetFetch {
                error: 0,
                partitions: (0..4)
                    .map(|p| (tp(p), -1, -1, ResponseError::UnstableOffsetCommit.code()))
                    .collect(),
                metadata: vec![],
            },
        );
        let (waited, next) = wait_for(&mut h, |r| matches!(r, GroupRequest::OffsetFetch { .. }));
        waits.push(waited);
        fetch = next;
    }
    let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
    // 100, 200, 400, 800, 1000, 1000 ms, each within ±20% jitter (and 5 ms steps).
    for (i, expected) in [100u128, 200, 400, 800, 1000, 1000].into_iter().enumerate() {
        let (lo, hi) = (expected * 8 / 10, expected * 12 / 10 + 5);
        assert!((lo..=hi).contains(&ms[i]), "retry {i}: {ms:?}");
    }
}

#[test]
fn stable_heartbeat_retries_back_off_exponentially_and_start_over_after_a_success() {
    let mut h = stable("range");
    let mut gaps = Vec::new();
    let mut hb = h.heartbeat();
    for _ in 0..5 {
        h.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RequestTimedOut.code(),
            },
        );
        let (waited, next) = wait_for(&mut h, |r| matches!(r, GroupRequest::Heartbeat { .. }));
        gaps.push(waited.as_millis());
        hb = next;
    }
    for (i, expected) in [100u128, 200, 400, 800, 1000].into_iter().enumerate() {
        let (lo, hi) = (expected * 8 / 10, expected * 12 / 10 + 5);
        assert!((lo..=hi).contains(&gaps[i]), "retry {i}: {gaps:?}");
    }
    // A success starts the count over: the next failure waits 100 ms again.
    h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
    let (_, hb) = wait_for(&mut h, |r| matches!(r, GroupRequest::Heartbeat { .. }));
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RequestTimedOut.code(),
        },
    );
    let (waited, _) = wait_for(&mut h, |r| matches!(r, GroupRequest::Heartbeat { .. }));
    assert!(waited <= Duration::from_millis(125), "{waited:?}");
}

#[test]
fn stable_commit_rebalance_in_progress_acquiesces() {
    let mut h = stable("range");
    let id = h.commit_one(1, 1).unwrap();
    let _ = h.request();
    h.respond(
        id,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(1), ResponseError::RebalanceInProgress.code())],
        },
    );
    let ev = h.events();
    assert!(
        matches!(
            &ev[0],
            Event::CommitCompleted {
                result: Err(CommitError::Broker { code: 27, .. }),
                ..
            }
        ),
        "{ev:?}"
    );
    assert!(matches!(&ev[1], Event::RevokeRequested { .. }), "{ev:?}");
}

#[test]
fn stable_progress_timeout_leaves_and_rejoins_on_progress() {
    let mut h = stable("range");
    for _ in 0..30 {
        h.advance(Duration::from_secs(1));
        while let Some(o) = h.m.poll_request() {
            if matches!(o.request, GroupRequest::Heartbeat { .. }) {
                h.respond(o.id, GroupResponse::Heartbeat { error: 0 });
            }
        }
    }
    h.progress_timed_out();
    h.m.note_progress(h.now);
    assert!(matches!(
        h.request().request,
        GroupRequest::JoinGroup { .. }
    ));
}

#[test]
fn revoking_without_ack_within_the_rebalance_timeout_loses_the_partitions() {
    let mut h = stable("range");
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    let _ = h.events();
    // The application keeps polling but never finishes the revocation. Heartbeats
    // go on meanwhile, answered REBALANCE_IN_PROGRESS, which keeps the session.
    let mut heartbeats = 0;
    let mut others = Vec::new();
    for _ in 0..30 {
        h.m.note_progress(h.now);
        h.advance(Duration::from_secs(1));
        while let Some(out) = h.m.poll_request() {
            if matches!(out.request, GroupRequest::Heartbeat { .. }) {
                heartbeats += 1;
                h.respond(
                    out.id,
                    GroupResponse::Heartbeat {
                        error: ResponseError::RebalanceInProgress.code(),
                    },
                );
            } else {
                others.push(out);
            }
        }
    }
    assert!(heartbeats >= 10, "{heartbeats} heartbeats while revoking");
    let ev = h.events();
    assert!(lost(&ev, LostReason::RevocationTimedOut), "{ev:?}");
    assert!(
        matches!(&others[..], [o] if matches!(o.request, GroupRequest::JoinGroup { .. })),
        "{others:?}"
    );
}

#[test]
fn static_member_leave_sends_no_leave_group() {
    let mut c = config("range");
    c.instance_id = Some("instance-1".into());
    let mut h = H::new(c);
    h.join_alone();
    let _ = h.events();
    while h.m.poll_request().is_some() {}
    h.m.leave(h.now);
    h.no_request();
    assert_eq!(h.events(), vec![Event::Left]);
}

#[test]
fn static_member_asked_to_leave_for_good_sends_leave_group_with_its_instance_id() {
    // Java 4.1's CloseOptions: a static member that is going away for good (a
    // scale-in) leaves at once instead of holding its partitions for a session.
    let mut c = config("range");
    c.instance_id = Some("instance-1".into());
    let mut h = H::new(c);
    h.join_alone();
    let _ = h.events();
    while h.m.poll_request().is_some() {}
    h.m.leave_with(h.now, Membership::Leave);
    let leave = h.request();
    assert!(
        matches!(&leave.request, GroupRequest::LeaveGroup { member_id, instance_id: Some(i), .. } if member_id == "m1" && i == "instance-1"),
        "{leave:?}"
    );
    h.respond(leave.id, GroupResponse::LeaveGroup { error: 0 });
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn dynamic_member_asked_to_remain_sends_no_leave_group() {
    let mut h = stable("range");
    while h.m.poll_request().is_some() {}
    h.m.leave_with(h.now, Membership::Remain);
    h.no_request();
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn joining_leave_waits_for_the_held_join_group_up_to_the_close_timeout() {
    // The broker holds a JoinGroup for the rebalance, and the LeaveGroup behind it
    // on the same connection waits. The member gave up after min(session, 5 s) and
    // the process could exit with the LeaveGroup unread, so the group waited a
    // session for the ghost. The Java client waits up to its close timeout (30 s).
    let mut h = H::new(config("range"));
    h.find_coordinator(2);
    let join = h.request();
    h.respond(
        join.id,
        join_response(ResponseError::MemberIdRequired.code(), 0, "m1", "", vec![]),
    );
    let _held = h.request();
    h.events();
    h.m.leave(h.now);
    let leave = h.request();
    assert!(
        matches!(&leave.request, GroupRequest::LeaveGroup { member_id, .. } if member_id == "m1")
    );
    h.advance(Duration::from_secs(29));
    assert_eq!(h.m.state(), StateKind::Leaving);
    h.respond(leave.id, GroupResponse::LeaveGroup { error: 0 });
    assert_eq!(h.events(), vec![Event::Left]);
    assert_eq!(h.m.state(), StateKind::Closed);
    // Unanswered, it closes at the close timeout.
    let mut h = stable("range");
    h.m.leave(h.now);
    let _leave = h.request();
    h.advance(h.m.config().close_timeout - Duration::from_millis(1));
    assert_eq!(h.m.state(), StateKind::Leaving);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn dynamic_member_leave_sends_leave_group() {
    let mut h = stable("range");
    h.m.leave(h.now);
    let out = h.request();
    assert!(
        matches!(&out.request, GroupRequest::LeaveGroup { member_id, .. } if member_id == "m1")
    );
    h.respond(out.id, GroupResponse::LeaveGroup { error: 0 });
    assert_eq!(h.events(), vec![Event::Left]);
    assert_eq!(h.m.state(), StateKind::Closed);
}

#[test]
fn cooperative_sync_revokes_only_moved_partitions_then_assigns_and_rejoins() {
    let mut h = H::new(config("cooperative-sticky"));
    h.find_coordinator(2);
    // Follower in generation 1 with partitions 0..4.
    let join = h.request();
    h.respond(
        join.id,
        join_response_p("cooperative-sticky", 0, 1, "m2", "m1", vec![]),
    );
    let sync = h.request();
    let full = encode_assignment(
        &Assignment {
            partitions: (0..4).map(tp).collect(),
            user_data: None,
        },
        3,
    )
    .unwrap();
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: 0,
            protocol_name: None,
            assignment: full,
        },
    );
    let _ = h.events();
    while h.m.poll_request().is_some() {}
    // A rebalance: cooperative members rejoin keeping their partitions.
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    assert!(
        h.events().is_empty(),
        "no revocation before the new assignment is known"
    );
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!()
    };
    let sub = decode_subscription(protocols[0].1.clone()).unwrap();
    assert_eq!(
        sub.owned_partitions.len(),
        4,
        "owned partitions travel in the subscription"
    );
    h.respond(
        join.id,
        join_response_p("cooperative-sticky", 0, 2, "m2", "m1", vec![]),
    );
    let sync = h.request();
    let half = encode_assignment(
        &Assignment {
            partitions: vec![tp(0), tp(1)],
            user_data: None,
        },
        3,
    )
    .unwrap();
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: 0,
            protocol_name: None,
            assignment: half,
        },
    );
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Joined { generation: 2, .. }, Event::RevokeRequested { generation: 2, partitions }] if partitions == &vec![tp(2), tp(3)]),
        "{ev:?}"
    );
    assert_eq!(
        h.m.assignment().len(),
        4,
        "nothing is taken before the application acknowledges"
    );
    h.m.complete_revocation(h.now, 2);
    assert_eq!(h.m.assignment(), vec![tp(0), tp(1)]);
    // Second round of KIP-429.
    let next = h.request();
    assert!(
        matches!(next.request, GroupRequest::JoinGroup { .. }),
        "{next:?}"
    );
}

/// A close whose commit finds the generation ended (ILLEGAL_GENERATION): the member
/// used to join again at once, the broker held that JoinGroup, and the LeaveGroup that
/// followed queued behind it on the coordinator's connection, so the close and the
/// next member's join both waited (CI saw the next member get nothing within 10 s).
/// Closing, a lost generation is not joined again and the LeaveGroup goes out at once,
/// with the member id the broker still knows.
#[test]
fn closing_commit_illegal_generation_does_not_rejoin_and_leaves_at_once() {
    let mut h = stable("range");
    h.m.prepare_to_close();
    let commit = h.commit_one(0, 5).expect("commit");
    assert_eq!(h.request().id, commit);
    h.respond(
        commit,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(0), ResponseError::IllegalGeneration.code())],
        },
    );
    let ev = h.events();
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::Lost {
                reason: LostReason::IllegalGeneration,
                ..
            }
        )),
        "{ev:?}"
    );
    h.advance(Duration::from_secs(5));
    h.no_request();
    h.m.leave(h.now);
    let leave = h.request();
    assert!(
        matches!(&leave.request, GroupRequest::LeaveGroup { member_id, .. } if member_id == "m1"),
        "{leave:?}"
    );
    h.respond(leave.id, GroupResponse::LeaveGroup { error: 0 });
    assert_eq!(h.m.state(), StateKind::Closed);
}

/// Closing does not stop a rebalance from being joined: the commit on close retries
/// in the new generation (cooperative members keep their partitions through it).
#[test]
fn closing_member_still_joins_a_rebalance() {
    let mut h = stable("range");
    h.m.prepare_to_close();
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::RebalanceInProgress.code(),
        },
    );
    h.events();
    h.m.complete_revocation(h.now, 7);
    let join = h.request();
    assert!(
        matches!(&join.request, GroupRequest::JoinGroup { member_id, .. } if member_id == "m1"),
        "{join:?}"
    );
}

#[test]
fn unjoined_find_coordinator_group_authorization_failed_is_reported_and_the_lookup_goes_on() {
    // Issue 30, finding 7: it closed the member (both protocols share the lookup), so
    // granting the ACL did not help; Java reports it from `poll` and looks again.
    let mut h = H::new(config("range"));
    let lookup = h.request();
    h.lookup_refused(lookup.id, ResponseError::GroupAuthorizationFailed.code());
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
    assert_ne!(h.m.state(), StateKind::Closed);
    h.advance(Duration::from_millis(200));
    // The ACL was granted meanwhile: the member joins.
    h.join_alone();
    assert_eq!(h.m.assignment().len(), 4);
}
// ----- the commit at revocation (issue 30) -----

/// Session 6 s, heartbeat 1 s and the default rebalance timeout (5 min): the eager
/// ottla member of issue 30.
fn short_session(assignor: &str) -> GroupConfig {
    let mut c = config(assignor);
    c.session_timeout = Duration::from_secs(6);
    c.heartbeat_interval = Duration::from_secs(1);
    c.max_poll_interval = DEFAULT_MAX_POLL_INTERVAL;
    c
}

impl Harness<GroupMember> {
    /// Answers every waiting heartbeat with REBALANCE_IN_PROGRESS (the broker is in
    /// its join phase) and returns the other requests.
    fn heartbeats_rebalancing(&mut self) -> Vec<Outgoing> {
        let mut others = Vec::new();
        for r in self.requests() {
            if matches!(r.request, GroupRequest::Heartbeat { .. }) {
                let error = ResponseError::RebalanceInProgress.code();
                self.respond(r.id, GroupResponse::Heartbeat { error });
            } else {
                others.push(r);
            }
        }
        others
    }
}

/// An eager member that owns 4 partitions is asked for them back (a heartbeat answered
/// REBALANCE_IN_PROGRESS) and commits them before giving them back, as the `Consumer`
/// does: each attempt is answered `answer` 10 ms later, every heartbeat meanwhile
/// REBALANCE_IN_PROGRESS, and [`RevocationCommit`] decides whether and when to try
/// again. Returns the attempts made and how long after the member asked it sent its
/// JoinGroup.
fn revoke_committing(c: GroupConfig, answer: ResponseError) -> (u32, Duration) {
    let mut h = H::new(c.clone());
    let generation = h.join_alone();
    h.events();
    let _fetch = h.request();
    let hb = h.heartbeat();
    let error = ResponseError::RebalanceInProgress.code();
    h.respond(hb.id, GroupResponse::Heartbeat { error });
    assert!(
        matches!(h.events()[..], [Event::RevokeRequested { .. }]),
        "asked to revoke"
    );
    let asked_at = h.now;
    let mut retry = RevocationCommit::new(&c, asked_at);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let id = h.commit_one(0, 5).expect("a revoking member commits");
        let sent = h.heartbeats_rebalancing();
        assert!(
            matches!(&sent[..], [r] if r.id == id && matches!(r.request, GroupRequest::OffsetCommit { .. })),
            "{sent:?}"
        );
        h.advance(Duration::from_millis(10));
        assert!(h.heartbeats_rebalancing().is_empty());
        let partitions = vec![(tp(0), answer.code())];
        h.respond(id, GroupResponse::OffsetCommit { partitions });
        let refused = h.events().into_iter().find_map(|e| match e {
            Event::CommitCompleted { result: Err(e), .. } => Some(e),
            _ => None,
        });
        let refused = refused.expect("the commit is refused");
        match retry.handle_failure(h.now, &refused) {
            RevocationStep::Retry { after } => {
                h.advance(after);
                assert!(h.heartbeats_rebalancing().is_empty());
            }
            RevocationStep::GiveUp { attempts: n } => {
                assert_eq!(n, attempts);
                break;
            }
        }
        assert_eq!(h.m.state(), StateKind::Revoking, "still in the group");
    }
    h.m.complete_revocation(h.now, generation);
    let join = h.request();
    assert!(
        matches!(join.request, GroupRequest::JoinGroup { .. }),
        "{join:?}"
    );
    (attempts, h.now - asked_at)
}

#[test]
fn revoking_commit_rebalance_in_progress_is_not_retried_and_the_join_goes_out_at_once() {
    // The librdkafka mock refuses every commit while its join phase lasts and closes
    // the round session timeout - 1 s after it began. Retrying the refused commit held
    // the JoinGroup back until after the round had closed without this member, which
    // was expelled, and whose rejoin began the next round (issue 30). Kafka refuses a
    // commit with REBALANCE_IN_PROGRESS only once the join phase is over; either way
    // it cannot succeed before this member has rejoined, and the Java client's
    // `onJoinPrepare` goes on to the JoinGroup (RebalanceInProgressException is not
    // retriable).
    let (attempts, join_after) =
        revoke_committing(short_session("range"), ResponseError::RebalanceInProgress);
    assert_eq!(attempts, 1);
    assert!(
        join_after <= Duration::from_millis(10),
        "JoinGroup {join_after:?} after the revocation began"
    );
}

#[test]
fn revoking_commit_retriable_errors_are_retried_within_half_the_session_less_a_heartbeat() {
    // A retriable refusal (the coordinator loading) is tried again, but the JoinGroup
    // still goes out before the mock's join window (session - 1 s) could close, even
    // for a round that began a heartbeat interval before this member heard of it.
    let c = short_session("range");
    let (attempts, join_after) =
        revoke_committing(c.clone(), ResponseError::CoordinatorLoadInProgress);
    assert!(attempts > 2, "retried: {attempts} attempts");
    assert!(
        join_after <= RevocationCommit::budget(&c),
        "JoinGroup {join_after:?} after the revocation began"
    );
    let window = c.session_timeout - Duration::from_secs(1) - c.heartbeat_interval;
    assert!(join_after < window, "{join_after:?} >= {window:?}");
}

#[test]
fn revocation_commit_budget_is_half_the_shorter_of_session_and_rebalance_timeout_less_a_heartbeat()
{
    let mut c = config("range");
    c.session_timeout = DEFAULT_SESSION_TIMEOUT;
    c.heartbeat_interval = DEFAULT_HEARTBEAT_INTERVAL;
    c.max_poll_interval = DEFAULT_MAX_POLL_INTERVAL;
    // 45 s / 2 - 3 s.
    assert_eq!(RevocationCommit::budget(&c), Duration::from_millis(19_500));
    c.max_poll_interval = Duration::from_secs(10);
    assert_eq!(RevocationCommit::budget(&c), Duration::from_secs(2));
    // A heartbeat interval longer than half the session leaves one attempt.
    c.session_timeout = Duration::from_secs(4);
    assert_eq!(RevocationCommit::budget(&c), Duration::ZERO);
    // KIP-848 has no join phase: the member acknowledges the revocation in its next
    // heartbeat, and the broker waits for it up to the rebalance timeout.
    c.protocol = GroupProtocol::Consumer;
    assert_eq!(RevocationCommit::budget(&c), Duration::from_secs(5));
}

// ----- the session clock under load (issue 30: classic chaos violations) -----

/// Steps by 100 ms answering nothing until the session lapses; when it did.
fn until_lapse(h: &mut H) -> Instant {
    for _ in 0..400 {
        h.advance(Duration::from_millis(100));
        h.requests();
        if lost(&h.events(), LostReason::SessionLapsed) {
            return h.now;
        }
    }
    panic!("the session never lapsed");
}

#[test]
fn stable_session_counts_from_when_the_accepted_heartbeat_was_sent_not_answered() {
    // The broker renews the session when it reads a heartbeat. An answer read 3 s late
    // (a starved runtime, a slow network) set the member's clock 3 s after the broker's:
    // for those 3 s it handled partitions the broker had already handed on.
    let mut h = stable("range");
    let hb = h.heartbeat();
    let sent = h.now;
    h.advance(Duration::from_secs(3));
    h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
    let lapsed = until_lapse(&mut h);
    assert_eq!(lapsed, sent + Duration::from_secs(10));
}

#[test]
fn stable_coordinator_found_again_does_not_renew_the_session() {
    // Finding the coordinator again renews nothing on the broker. Taking it for a
    // renewal (as Java's `resetSessionTimeout`) gave a member that found a moved
    // coordinator but could not heartbeat it a session more than the broker did.
    let mut h = stable("range");
    let hb = h.heartbeat();
    let accepted = h.now;
    h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: ResponseError::NotCoordinator.code(),
        },
    );
    h.advance(Duration::from_secs(4));
    let lookup = h
        .requests()
        .into_iter()
        .find(|o| matches!(o.request, GroupRequest::FindCoordinator { .. }))
        .expect("a lookup");
    h.found(lookup.id, 3);
    let lapsed = until_lapse(&mut h);
    assert_eq!(lapsed, accepted + Duration::from_secs(10));
}

#[test]
fn pending_revocation_finished_after_a_fence_and_a_regrant_stops_nothing_regranted() {
    // Chaos under load, consumer protocol (seed 216083087, `lost=721 drained=false`):
    // asked to give p4 and p5 back at epoch 7, the member was fenced (Lost p3-p5),
    // rejoined and got p5 back; the application then finished the old revocation, and
    // the Consumer stopped fetching p5 on its word, for good.
    let mut r = super::PendingRevocation::default();
    r.asked(7, &[tp(2), tp(3)]);
    r.lost(&[tp(1), tp(2), tp(3)]);
    r.assigned(&[tp(3)]);
    assert_eq!(r.ready(7, &[tp(2), tp(3)]), vec![]);
    // A revocation finished as asked stops what it asked for, once.
    r.asked(9, &[tp(0), tp(1)]);
    assert_eq!(r.ready(8, &[tp(0), tp(1)]), vec![], "another generation's");
    assert_eq!(r.ready(9, &[tp(0), tp(1)]), vec![tp(0), tp(1)]);
    assert_eq!(r.ready(9, &[tp(0), tp(1)]), vec![]);
    // Lost meanwhile, not assigned again: nothing left to stop or commit.
    r.asked(10, &[tp(0)]);
    r.lost(&[tp(0)]);
    assert_eq!(r.ready(10, &[tp(0)]), vec![]);
}

/// The member's JoinGroup answered with itself as the leader of generation 3 (alone,
/// with `config`), the assignment job not run: the job.
fn assigning_leader(h: &mut H) -> AssignmentJob {
    let (join, members) = first_join_as(h, "m1");
    // Not `respond`, which runs the assignment at once.
    h.m.handle_response(
        h.now,
        join,
        join_response_p("range", 0, 3, "m1", "m1", members),
    );
    assert_eq!(h.m.state(), StateKind::Syncing);
    let job = h.m.poll_assignment().expect("the leader's assignment job");
    assert!(
        h.m.poll_assignment().is_none(),
        "one job per JoinGroup answer"
    );
    assert_eq!(job.size(), (1, 4));
    h.no_request();
    job
}

#[test]
fn assigning_leader_heartbeats_for_two_sessions_then_syncs_the_result() {
    // Issue 36: a large group's assignment can take longer than a session. The leader
    // heartbeats while its job runs (as the Java client's heartbeat thread does, and
    // as Kafka answers in CompletingRebalance), so the group forms.
    let mut c = config("range");
    c.session_timeout = Duration::from_secs(6);
    c.heartbeat_interval = Duration::from_secs(1);
    let mut h = H::new(c);
    let job = assigning_leader(&mut h);
    for _ in 0..12 {
        let hb = h.heartbeat();
        let GroupRequest::Heartbeat { generation, .. } = hb.request else {
            unreachable!()
        };
        assert_eq!(generation, 3, "the JoinGroup answer's generation");
        h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
    }
    assert_eq!(h.m.state(), StateKind::Syncing, "12 s in, still a member");
    assert!(
        !h.events().iter().any(|e| matches!(e, Event::Lost { .. })),
        "nothing lost"
    );
    h.m.assignment_done(h.now, job.run());
    let sync = h.request();
    let GroupRequest::SyncGroup {
        generation,
        assignments,
        ..
    } = &sync.request
    else {
        panic!("{sync:?}")
    };
    assert_eq!(*generation, 3);
    assert_eq!(assignments.len(), 1);
    h.answer_own_sync(&sync);
    assert_eq!(h.m.state(), StateKind::Stable);
    assert_eq!(h.m.assignment().len(), 4);
}

#[test]
fn assigning_without_heartbeat_answers_lapses_and_drops_the_late_result() {
    // The leader's heartbeats go unanswered: its session lapses as in any state with a
    // heartbeat, and the result that comes after is dropped (no SyncGroup for a
    // generation the member left).
    let mut c = config("range");
    c.session_timeout = Duration::from_secs(6);
    c.heartbeat_interval = Duration::from_secs(1);
    let mut h = H::new(c);
    let job = assigning_leader(&mut h);
    h.advance(Duration::from_secs(7));
    assert_eq!(h.m.state(), StateKind::Unjoined);
    h.requests();
    h.m.assignment_done(h.now, job.run());
    assert!(
        !h.requests()
            .iter()
            .any(|r| matches!(r.request, GroupRequest::SyncGroup { .. })),
        "a late result sends nothing"
    );
}

#[test]
fn assigning_past_the_rebalance_timeout_rejoins() {
    // Kafka gives up on a SyncGroup that does not come within the rebalance timeout;
    // the member does not wait longer either.
    let mut c = config("range");
    c.max_poll_interval = Duration::from_secs(20);
    c.session_timeout = Duration::from_secs(6);
    c.heartbeat_interval = Duration::from_secs(1);
    let mut h = H::new(c);
    let job = assigning_leader(&mut h);
    for _ in 0..19 {
        let hb = h.heartbeat();
        h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
        // The application polls meanwhile (max.poll.interval.ms is its guard too).
        h.m.note_progress(h.now);
    }
    assert_eq!(h.m.state(), StateKind::Syncing);
    h.advance(Duration::from_secs(1));
    assert_eq!(h.m.state(), StateKind::Unjoined);
    // After the backoff of a failed rebalance step.
    h.advance(Duration::from_secs(1));
    let join = h
        .requests()
        .into_iter()
        .find(|r| matches!(r.request, GroupRequest::JoinGroup { .. }));
    assert!(join.is_some(), "rejoins");
    h.m.assignment_done(h.now, job.run());
    h.no_request();
}

/// An assignor that panics.
#[derive(Debug)]
struct Panicking;

impl Assignor for Panicking {
    fn name(&self) -> &'static str {
        "range"
    }
    fn protocol(&self) -> RebalanceProtocol {
        RebalanceProtocol::Eager
    }
    fn assign(
        &self,
        _: &BTreeMap<String, i32>,
        _: &[super::super::assignor::MemberSubscription],
    ) -> Result<BTreeMap<String, Assignment>, super::super::assignor::AssignError> {
        panic!("assignor bug")
    }
}

#[test]
fn assigning_with_a_panicking_assignor_is_fatal_and_names_the_panic() {
    let mut c = config("range");
    c.assignors = vec![Arc::new(Panicking)];
    let mut h = H::new(c);
    let job = assigning_leader(&mut h);
    h.m.assignment_done(h.now, job.run());
    let ev = h.events();
    assert!(
        ev.iter().any(|e| matches!(e, Event::Fatal(GroupError::Assignment { message, .. }) if message.contains("assignor bug"))),
        "{ev:?}"
    );
    assert_eq!(h.m.state(), StateKind::Closed);
}

/// ottla's default list (`cooperative-sticky, range, roundrobin`) with the second
/// bounce after `hold` (`None`: the Java client's rule for any list).
fn default_list(hold: Option<Duration>) -> GroupConfig {
    let mut c = config("cooperative-sticky");
    for name in ["range", "roundrobin"] {
        c.assignors
            .push(Arc::from(builtin(name).expect("builtin assignor")));
    }
    c.cooperative_upgrade = hold;
    c
}

impl Harness<GroupMember> {
    /// Lets `d` pass a second at a time, answering heartbeats (and only them) with
    /// success, so the generation lives on.
    fn live_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.advance(Duration::from_secs(1));
            self.m.note_progress(self.now);
            for out in self.requests() {
                if matches!(out.request, GroupRequest::Heartbeat { .. }) {
                    self.respond(out.id, GroupResponse::Heartbeat { error: 0 });
                }
            }
        }
    }
    /// A rebalance announced by the next heartbeat.
    fn rebalance_announced(&mut self) {
        let hb = loop {
            self.advance(Duration::from_secs(1));
            self.m.note_progress(self.now);
            let outs = self.requests();
            if let Some(hb) = outs
                .into_iter()
                .find(|o| matches!(o.request, GroupRequest::Heartbeat { .. }))
            {
                break hb;
            }
        };
        self.respond(
            hb.id,
            GroupResponse::Heartbeat {
                error: ResponseError::RebalanceInProgress.code(),
            },
        );
    }
}

/// The JoinGroup among the requests now due (heartbeats and others may come with it).
fn next_join(h: &mut H, what: &str) -> Outgoing {
    h.requests()
        .into_iter()
        .find(|o| matches!(o.request, GroupRequest::JoinGroup { .. }))
        .unwrap_or_else(|| panic!("no JoinGroup: {what}"))
}

fn offered(join: &Outgoing) -> Vec<String> {
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    protocols.iter().map(|(n, _)| n.clone()).collect()
}

#[test]
fn default_list_rebalances_eagerly_until_the_group_chose_cooperative_for_the_hold() {
    let hold = Duration::from_secs(60);
    let mut h = H::new(default_list(Some(hold)));
    let generation = h.join_alone_p("cooperative-sticky");
    h.events();
    // Within the hold: eager, as the Java client with `range` in the list; every
    // assignor is offered again.
    h.live_for(Duration::from_secs(20));
    h.rebalance_announced();
    assert_eq!(
        h.events(),
        vec![Event::RevokeRequested {
            generation,
            partitions: (0..4).map(tp).collect()
        }]
    );
    h.m.complete_revocation(h.now, generation);
    let join = h.request();
    assert_eq!(
        offered(&join),
        ["cooperative-sticky", "range", "roundrobin"]
    );
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!()
    };
    let members = vec![JoinedMember {
        member_id: "m1".into(),
        instance_id: None,
        metadata: protocols[0].1.clone(),
    }];
    h.respond(
        join.id,
        join_response_p("cooperative-sticky", 0, 8, "m1", "m1", members),
    );
    let sync = h.request();
    h.answer_own_sync(&sync);
    h.events();
    // The hold counts from the first generation on cooperative-sticky, across the
    // eager rebalance: 20 s + 41 s later the member offers only the cooperative
    // assignor and keeps its partitions through the rebalance.
    h.live_for(Duration::from_secs(41));
    h.rebalance_announced();
    let after = h.events();
    assert!(
        !after
            .iter()
            .any(|e| matches!(e, Event::RevokeRequested { .. })),
        "{after:?}"
    );
    let join = next_join(&mut h, "rejoins at once, keeping its partitions");
    assert_eq!(offered(&join), ["cooperative-sticky"]);
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!()
    };
    let sub = decode_subscription(protocols[0].1.clone()).unwrap();
    assert_eq!(sub.owned_partitions.len(), 4, "{sub:?}");
}

#[test]
fn default_list_a_generation_on_an_eager_assignor_starts_the_hold_over() {
    let hold = Duration::from_secs(60);
    let mut h = H::new(default_list(Some(hold)));
    let generation = h.join_alone_p("cooperative-sticky");
    h.events();
    h.live_for(Duration::from_secs(40));
    // A member of the previous client joins: the group chooses range.
    h.rebalance_announced();
    h.events();
    h.m.complete_revocation(h.now, generation);
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!()
    };
    let members = vec![JoinedMember {
        member_id: "m1".into(),
        instance_id: None,
        metadata: protocols[1].1.clone(),
    }];
    h.respond(join.id, join_response_p("range", 0, 8, "m1", "m1", members));
    let sync = h.request();
    h.answer_own_sync(&sync);
    h.events();
    // ... and leaves: cooperative-sticky again. The hold starts over from here, so
    // 40 s + 30 s after the first generation the member is still eager.
    h.live_for(Duration::from_secs(10));
    h.rebalance_announced();
    let ev = h.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::RevokeRequested { generation: 8, .. })),
        "range's generation is eager: {ev:?}"
    );
    h.m.complete_revocation(h.now, 8);
    let join = h.request();
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!()
    };
    let members = vec![JoinedMember {
        member_id: "m1".into(),
        instance_id: None,
        metadata: protocols[0].1.clone(),
    }];
    h.respond(
        join.id,
        join_response_p("cooperative-sticky", 0, 9, "m1", "m1", members),
    );
    let sync = h.request();
    h.answer_own_sync(&sync);
    h.events();
    h.live_for(Duration::from_secs(30));
    h.rebalance_announced();
    let ev = h.events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::RevokeRequested { generation: 9, .. })),
        "30 s on cooperative-sticky is within the hold: {ev:?}"
    );
}

#[test]
fn explicit_mixed_list_keeps_the_java_rule_however_long_the_group_is_cooperative() {
    let mut h = H::new(default_list(None));
    let generation = h.join_alone_p("cooperative-sticky");
    h.events();
    h.live_for(Duration::from_secs(3600));
    h.rebalance_announced();
    let revocations: Vec<Event> = h
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::RevokeRequested { .. }))
        .collect();
    assert_eq!(
        revocations,
        vec![Event::RevokeRequested {
            generation,
            partitions: (0..4).map(tp).collect()
        }]
    );
    h.m.complete_revocation(h.now, generation);
    let join = h.request();
    assert_eq!(
        offered(&join),
        ["cooperative-sticky", "range", "roundrobin"]
    );
}

#[test]
fn upgraded_member_refused_for_inconsistent_protocol_gives_everything_back_and_offers_its_whole_list()
 {
    let mut h = H::new(default_list(Some(Duration::from_secs(10))));
    let generation = h.join_alone_p("cooperative-sticky");
    h.events();
    h.live_for(Duration::from_secs(11));
    h.rebalance_announced();
    let join = next_join(&mut h, "rejoins keeping its partitions");
    assert_eq!(offered(&join), ["cooperative-sticky"]);
    // A member without cooperative-sticky joined first: the broker refuses this
    // member's JoinGroup. The round is still open; nothing moved yet.
    h.respond(
        join.id,
        join_response(
            ResponseError::InconsistentGroupProtocol.code(),
            -1,
            "",
            "",
            vec![],
        ),
    );
    assert_eq!(
        h.events(),
        vec![Event::RevokeRequested {
            generation,
            partitions: (0..4).map(tp).collect()
        }],
        "not fatal: gives back what it holds, as an eager member before joining"
    );
    assert_eq!(h.m.state(), StateKind::Revoking);
    h.m.complete_revocation(h.now, generation);
    let join = next_join(&mut h, "rejoins after the revocation");
    assert_eq!(
        offered(&join),
        ["cooperative-sticky", "range", "roundrobin"]
    );
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!()
    };
    let sub = decode_subscription(protocols[0].1.clone()).unwrap();
    assert!(sub.owned_partitions.is_empty(), "{sub:?}");
}

fn subscribed_topics(join: &Outgoing) -> Vec<String> {
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!("{join:?}")
    };
    decode_subscription(protocols[0].1.clone()).unwrap().topics
}

#[test]
fn stable_eager_subscription_change_revokes_everything_and_rejoins_with_the_new_topics() {
    let mut h = stable("range");
    h.m.set_subscription(h.now, vec![TOPIC.into(), "u".into()]);
    assert_eq!(
        h.events(),
        vec![Event::RevokeRequested {
            generation: 7,
            partitions: (0..4).map(tp).collect()
        }]
    );
    h.m.complete_revocation(h.now, 7);
    let join = next_join(&mut h, "rejoins");
    assert_eq!(subscribed_topics(&join), [TOPIC, "u"]);
}

#[test]
fn stable_cooperative_subscription_change_rejoins_at_once_keeping_its_partitions() {
    let mut h = H::new(config("cooperative-sticky"));
    h.join_alone_p("cooperative-sticky");
    h.events();
    let _offset_fetch = h.request();
    // The same topics in another order are no change.
    h.m.set_subscription(h.now, vec![TOPIC.into(), TOPIC.into()]);
    h.no_request();
    h.m.set_subscription(h.now, vec!["u".into()]);
    assert!(
        !h.events()
            .iter()
            .any(|e| matches!(e, Event::RevokeRequested { .. }))
    );
    let join = next_join(&mut h, "rejoins at once");
    assert_eq!(subscribed_topics(&join), ["u"]);
    let GroupRequest::JoinGroup { protocols, .. } = &join.request else {
        panic!()
    };
    let sub = decode_subscription(protocols[0].1.clone()).unwrap();
    assert_eq!(
        sub.owned_partitions.len(),
        4,
        "keeps them until the assignment"
    );
}

#[test]
fn syncing_subscription_change_waits_for_the_generation_then_rejoins() {
    let mut h = H::new(config("cooperative-sticky"));
    let (join, members) = first_join_as(&mut h, "m1");
    h.respond(
        join,
        join_response_p("cooperative-sticky", 0, 3, "m1", "m0", members),
    );
    let sync = h.request();
    assert!(matches!(sync.request, GroupRequest::SyncGroup { .. }));
    h.m.set_subscription(h.now, vec!["u".into()]);
    h.no_request();
    let assignment = encode_assignment(
        &Assignment {
            partitions: vec![tp(0)],
            user_data: None,
        },
        SUBSCRIPTION_VERSION,
    )
    .unwrap();
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: 0,
            protocol_name: None,
            assignment,
        },
    );
    assert!(
        h.events()
            .iter()
            .any(|e| matches!(e, Event::Assigned { added, .. } if added == &[tp(0)])),
        "the generation started"
    );
    let join = next_join(&mut h, "rejoins once the generation started");
    assert_eq!(subscribed_topics(&join), ["u"]);
}
