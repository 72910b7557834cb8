//! Tests behind claims in `docs/rebalance.md` that no other suite showed: the pain
//! points (eviction after `max.poll.interval.ms`, commits after revocation,
//! NOT_COORDINATOR loops) and a few rows of the error table and the timings.
//!
//! The scenario tests drive the group member's state machine on a virtual clock, as the
//! tests in `src/proto/group/member.rs` do; the `mock_` tests run a `Consumer` against
//! the librdkafka mock cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, ConsumerEvent, OffsetReset};
use ottla_proto::group::assignor::{Assignor, builtin};
use ottla_proto::group::consumer_protocol::{Assignment, TopicPartition, encode_assignment};
use ottla_proto::group::member::{
    CommitError, Event, Failure, GroupConfig, GroupMember, LostReason, Outgoing, RequestId,
    StateKind,
};
use ottla_proto::group::messages::{CommitOffset, GroupRequest, GroupResponse, JoinedMember};
use ottla_proto::group::testing::Harness;
use protocol_tests::peer::Peer;

const TOPIC: &str = "t";
const NOT_COORDINATOR: i16 = 16;
const ILLEGAL_GENERATION: i16 = 22;
const UNKNOWN_MEMBER_ID: i16 = 25;
const REBALANCE_IN_PROGRESS: i16 = 27;
const MEMBER_ID_REQUIRED: i16 = 79;

fn tp(p: i32) -> TopicPartition {
    TopicPartition::new(TOPIC, p)
}

fn offset(p: i32, at: i64) -> CommitOffset {
    CommitOffset {
        partition: tp(p),
        offset: at,
        leader_epoch: -1,
        metadata: None,
    }
}

/// A member on a virtual clock: session 10 s, heartbeat 1 s, rebalance timeout 30 s,
/// the default backoffs (100 ms doubling to 1 s), one topic of 4 partitions.
/// The library's member harness ([`Harness`]) on a classic member, with this guide's
/// steps ([`Steps`]).
type H = Harness<GroupMember>;

/// The classic protocol's steps the guide's scenarios take.
trait Steps: Sized {
    /// A member with `assignor`: session 10 s, heartbeat 1 s, rebalance timeout 30 s,
    /// one topic of 4 partitions.
    fn new(assignor: &str) -> Self;
    fn joined(&mut self, id: RequestId, generation: i32, me: &str, leader: &str, protocol: &str);
    fn synced(&mut self, id: RequestId, partitions: &[i32]);
    fn follower(assignor: &str, generation: i32, partitions: &[i32]) -> Self;
    fn stable_leader() -> Self;
    fn heartbeat(&mut self) -> Outgoing;
}

impl Steps for Harness<GroupMember> {
    fn new(assignor: &str) -> Self {
        let a: Arc<dyn Assignor> = Arc::from(builtin(assignor).expect("assignor"));
        let mut c = GroupConfig::new("g", vec![TOPIC.into()], vec![a]);
        c.session_timeout = Duration::from_secs(10);
        c.heartbeat_interval = Duration::from_secs(1);
        c.max_poll_interval = Duration::from_secs(30);
        let now = Instant::now();
        let mut m = GroupMember::new(c, now);
        m.set_topic_partitions(now, BTreeMap::from([(TOPIC.to_string(), 4)]));
        Harness::at(m, now)
    }

    /// Answers the pending JoinGroup for member `me` (leader `leader`) in `generation`.
    fn joined(&mut self, id: RequestId, generation: i32, me: &str, leader: &str, protocol: &str) {
        self.respond(
            id,
            GroupResponse::JoinGroup {
                error: 0,
                generation,
                protocol_name: Some(protocol.into()),
                leader: leader.into(),
                member_id: me.into(),
                members: vec![],
                skip_assignment: false,
            },
        );
    }

    /// Answers the pending SyncGroup with `partitions`.
    fn synced(&mut self, id: RequestId, partitions: &[i32]) {
        let assignment = encode_assignment(
            &Assignment {
                partitions: partitions.iter().map(|p| tp(*p)).collect(),
                user_data: None,
            },
            3,
        )
        .expect("assignment");
        self.respond(
            id,
            GroupResponse::SyncGroup {
                error: 0,
                protocol_name: None,
                assignment,
            },
        );
    }

    /// Joins as a follower ("m2"; the leader is "m1") owning `partitions` in
    /// `generation`, and drains what that produced.
    fn follower(assignor: &str, generation: i32, partitions: &[i32]) -> Self {
        let mut h = H::new(assignor);
        h.find_coordinator(2);
        let join = h.request();
        h.joined(join.id, generation, "m2", "m1", assignor);
        let sync = h.request();
        h.synced(sync.id, partitions);
        h.events();
        h.requests();
        h
    }

    /// Joins alone (the leader, after MEMBER_ID_REQUIRED) with all 4 partitions in
    /// generation 7 under `range`; the OffsetFetch is answered with nothing committed.
    fn stable_leader() -> Self {
        let mut h = H::new("range");
        h.find_coordinator(2);
        let join = h.request();
        h.respond(
            join.id,
            GroupResponse::JoinGroup {
                error: MEMBER_ID_REQUIRED,
                generation: -1,
                protocol_name: None,
                leader: String::new(),
                member_id: "m1".into(),
                members: vec![],
                skip_assignment: false,
            },
        );
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
            GroupResponse::JoinGroup {
                error: 0,
                generation: 7,
                protocol_name: Some("range".into()),
                leader: "m1".into(),
                member_id: "m1".into(),
                members,
                skip_assignment: false,
            },
        );
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
        h.events();
        let fetch = h.request();
        assert!(matches!(fetch.request, GroupRequest::OffsetFetch { .. }));
        h.respond(
            fetch.id,
            GroupResponse::OffsetFetch {
                error: 0,
                partitions: (0..4).map(|p| (tp(p), -1, -1, 0)).collect(),
                metadata: vec![],
            },
        );
        h.events();
        assert_eq!(h.m.state(), StateKind::Stable);
        assert_eq!(h.m.assignment().len(), 4);
        h
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

fn is_join(o: &Outgoing) -> bool {
    matches!(o.request, GroupRequest::JoinGroup { .. })
}

// ----- commits after revocation -----

/// A cooperative member keeps heartbeating while it revokes, and may commit a partition
/// it is revoking, in the generation it is revoking it from. Once it has acknowledged the revocation, nothing is committed until
/// the second round forms a generation (`NoGeneration`), and after that the revoked
/// partition is refused locally (`NotOwned`). A commit sent before and answered after
/// the next generation formed is reported `Stale` and changes nothing. After partitions
/// are lost there is no generation to commit with at all.
#[test]
fn revoked_partitions_cannot_be_committed_and_a_late_commit_answer_changes_nothing() {
    let mut h = H::follower("cooperative-sticky", 1, &[0, 1, 2, 3]);
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: REBALANCE_IN_PROGRESS,
        },
    );
    let join = h.request();
    h.joined(join.id, 2, "m2", "m1", "cooperative-sticky");
    let sync = h.request();
    h.synced(sync.id, &[0, 1]);
    let ev = h.events();
    assert!(
        matches!(&ev[..], [Event::Joined { generation: 2, .. }, Event::RevokeRequested { generation: 2, partitions }] if partitions == &vec![tp(2), tp(3)]),
        "{ev:?}"
    );
    // The group is stable in generation 2: the member heartbeats while it revokes.
    let hb = h.heartbeat();
    assert!(
        matches!(hb.request, GroupRequest::Heartbeat { generation: 2, .. }),
        "{hb:?}"
    );
    h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
    assert_eq!(h.m.state(), StateKind::Revoking);
    // While revoking: the partition is still owned, the commit goes out in generation 2.
    let late =
        h.m.commit(h.now, vec![offset(2, 5)])
            .expect("commit while revoking");
    let sent = h.request();
    assert_eq!(sent.id, late);
    assert!(
        matches!(
            &sent.request,
            GroupRequest::OffsetCommit { generation: 2, .. }
        ),
        "{sent:?}"
    );
    // Acknowledged: the partition is gone and the second round starts.
    h.m.complete_revocation(h.now, 2);
    assert_eq!(h.m.assignment(), vec![tp(0), tp(1)]);
    let join = h
        .requests()
        .into_iter()
        .find(is_join)
        .expect("second round");
    // Between the two rounds there is no generation to commit with.
    assert_eq!(
        h.m.commit(h.now, vec![offset(0, 6)]),
        Err(CommitError::NoGeneration)
    );
    // The second round forms generation 3.
    h.joined(join.id, 3, "m2", "m1", "cooperative-sticky");
    let sync = h.request();
    h.synced(sync.id, &[0, 1]);
    h.events();
    assert_eq!(h.m.generation(), Some(3));
    assert_eq!(
        h.m.commit(h.now, vec![offset(2, 6)]),
        Err(CommitError::NotOwned(tp(2))),
        "a revoked partition is refused before anything is sent"
    );
    assert!(h.requests().is_empty());
    // Now the generation-2 commit is answered: the broker refused it. Stale, no effect.
    h.respond(
        late,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(2), ILLEGAL_GENERATION)],
        },
    );
    let ev = h.events();
    assert_eq!(
        ev,
        vec![Event::CommitCompleted {
            id: late,
            result: Err(CommitError::Stale { generation: 2 })
        }]
    );
    assert_eq!(h.m.state(), StateKind::Stable);
    assert_eq!(h.m.generation(), Some(3));
    assert_eq!(h.m.assignment(), vec![tp(0), tp(1)]);
    // Lost partitions: no generation is left to commit with.
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: UNKNOWN_MEMBER_ID,
        },
    );
    assert!(matches!(
        &h.events()[..],
        [Event::Lost {
            reason: LostReason::UnknownMember,
            ..
        }]
    ));
    assert_eq!(
        h.m.commit(h.now, vec![offset(0, 1)]),
        Err(CommitError::NoGeneration)
    );
}

// ----- NOT_COORDINATOR loops -----

/// A broker that FindCoordinator names but that answers every group request with
/// NOT_COORDINATOR (a coordinator still loading, or stale metadata): the member asks
/// FindCoordinator again `retry.backoff.ms` (100 ms) after the first refusal, then at a
/// pace that backs off to `retry.backoff.max.ms` (1 s; KIP-580), and keeps its
/// partitions until a session has passed since its last accepted heartbeat: a broker
/// that refuses renews nothing, and the real coordinator has expired the member by
/// then, so the partitions are lost (`SessionLapsed`) and it rejoins under the same id.
/// (Until issue 30 each coordinator found restarted the session clock, as Java's
/// `resetSessionTimeout`, and the member kept its partitions for as long as the
/// refusals lasted: a zombie once its coordinator had moved.)
#[test]
fn a_coordinator_that_keeps_answering_not_coordinator_is_asked_again_at_a_backing_off_pace() {
    let mut h = H::stable_leader();
    let start = h.now;
    let mut lookups: Vec<Duration> = Vec::new();
    let mut joins = 0;
    let mut lost = Vec::new();
    // 15 s of virtual time in 10 ms steps; the session is 10 s.
    for _ in 0..1500 {
        h.advance(Duration::from_millis(10));
        for out in h.requests() {
            match out.request {
                GroupRequest::FindCoordinator { .. } => {
                    lookups.push(h.now - start);
                    h.found(out.id, 2);
                }
                GroupRequest::Heartbeat { .. } => h.respond(
                    out.id,
                    GroupResponse::Heartbeat {
                        error: NOT_COORDINATOR,
                    },
                ),
                GroupRequest::JoinGroup { .. } => {
                    joins += 1;
                    h.respond(
                        out.id,
                        GroupResponse::JoinGroup {
                            error: NOT_COORDINATOR,
                            generation: -1,
                            protocol_name: None,
                            leader: String::new(),
                            member_id: String::new(),
                            members: vec![],
                            skip_assignment: false,
                        },
                    );
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        for e in h.events() {
            match e {
                Event::Lost { reason, .. } => lost.push((h.now - start, reason)),
                Event::CoordinatorFound { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        if lost.is_empty() {
            assert_eq!(h.m.state(), StateKind::Stable, "at {:?}", h.now - start);
            assert_eq!(h.m.assignment().len(), 4);
        }
    }
    // The pace while in the generation (before the session lapsed).
    let lapse = lost.first().map(|(at, _)| *at).unwrap_or(Duration::MAX);
    lookups.retain(|at| *at < lapse);
    let gaps: Vec<Duration> = lookups.windows(2).map(|w| w[1] - w[0]).collect();
    let shortest = gaps.iter().min().copied().unwrap_or_default();
    println!(
        "{} FindCoordinator in 15 s, shortest gap {shortest:?}, {joins} JoinGroups, lost {lost:?}",
        lookups.len()
    );
    assert!(
        shortest >= Duration::from_millis(100),
        "FindCoordinator faster than retry.backoff.ms: {shortest:?}"
    );
    // 100, 200, 400, 800 ms (each jittered by ±20%), then 0.8 to 1 s.
    assert!(
        gaps.iter()
            .skip(4)
            .all(|g| *g >= Duration::from_millis(640)),
        "the pace backs off: {gaps:?}"
    );
    assert!(
        gaps.iter().all(|g| *g <= Duration::from_millis(1_020)),
        "never slower than retry.backoff.max.ms: {gaps:?}"
    );
    assert!(
        (7..=18).contains(&lookups.len()),
        "about one lookup per second once backed off: {}",
        lookups.len()
    );
    // No heartbeat accepted since the generation began: lost once, a session after the
    // last accepted one was sent (the join, 1 s before `start`), then rejoining.
    assert_eq!(lost.len(), 1, "{lost:?}");
    let (at, reason) = &lost[0];
    assert_eq!(*reason, LostReason::SessionLapsed);
    assert!(*at <= Duration::from_secs(10), "lost at {at:?}");
    assert!(joins >= 1, "it rejoined");
}

/// The backed-off pace lasts only while the coordinator keeps refusing: once a request
/// goes through, the next refusal is followed by a lookup after `retry.backoff.ms`
/// again, not after the 1 s reached before.
#[test]
fn a_request_that_goes_through_resets_the_rediscovery_pace() {
    let mut h = H::stable_leader();
    let start = h.now;
    let mut lookups: Vec<Duration> = Vec::new();
    let mut refused_after_recovery: Option<Duration> = None;
    // Refuse for 4 s, accept until 6 s, refuse again until 8 s.
    for _ in 0..800 {
        h.advance(Duration::from_millis(10));
        let t = h.now - start;
        let refuse = t < Duration::from_secs(4) || t >= Duration::from_secs(6);
        for out in h.requests() {
            match out.request {
                GroupRequest::FindCoordinator { .. } => {
                    lookups.push(t);
                    h.found(out.id, 2);
                }
                GroupRequest::Heartbeat { .. } => {
                    if refuse && t >= Duration::from_secs(6) && refused_after_recovery.is_none() {
                        refused_after_recovery = Some(t);
                    }
                    let error = if refuse { NOT_COORDINATOR } else { 0 };
                    h.respond(out.id, GroupResponse::Heartbeat { error });
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let _ = h.events();
    }
    let before: Vec<Duration> = lookups
        .iter()
        .copied()
        .filter(|t| *t < Duration::from_secs(4))
        .collect();
    let last_gap = before
        .windows(2)
        .next_back()
        .map(|w| w[1] - w[0])
        .unwrap_or_default();
    assert!(
        last_gap >= Duration::from_millis(640),
        "backed off before the recovery: {before:?}"
    );
    let refused = refused_after_recovery.expect("a heartbeat refused after 6 s");
    let next = lookups
        .iter()
        .copied()
        .find(|t| *t >= refused)
        .expect("a lookup after the new refusal");
    assert!(
        next - refused <= Duration::from_millis(110),
        "the pace starts over at retry.backoff.ms: refused at {refused:?}, looked up at {next:?}"
    );
}

// ----- the error table -----

/// NOT_COORDINATOR on an OffsetCommit: the commit's caller gets a retriable error, the
/// member rediscovers the coordinator, and the commit is not sent again by the member
/// (the caller, or the next automatic commit, sends a new one).
#[test]
fn stable_commit_not_coordinator_reports_a_retriable_error_and_is_not_resent() {
    let mut h = H::stable_leader();
    let id = h.m.commit(h.now, vec![offset(1, 3)]).expect("commit");
    let sent = h.request();
    assert_eq!(sent.id, id);
    h.respond(
        id,
        GroupResponse::OffsetCommit {
            partitions: vec![(tp(1), NOT_COORDINATOR)],
        },
    );
    let ev = h.events();
    let [Event::CommitCompleted { result: Err(e), .. }] = &ev[..] else {
        panic!("{ev:?}")
    };
    assert!(e.is_retriable(), "{e:?}");
    assert_eq!(h.m.coordinator(), None);
    assert_eq!(
        h.m.commit(h.now, vec![offset(1, 3)]),
        Err(CommitError::CoordinatorUnknown),
        "no commit while the coordinator is unknown"
    );
    h.advance(Duration::from_millis(100));
    h.find_coordinator(2);
    let after = h.requests();
    assert!(
        after
            .iter()
            .all(|o| !matches!(o.request, GroupRequest::OffsetCommit { .. })),
        "{after:?}"
    );
    assert!(
        after
            .iter()
            .any(|o| matches!(o.request, GroupRequest::Heartbeat { generation: 7, .. })),
        "{after:?}"
    );
    assert_eq!(h.m.state(), StateKind::Stable);
}

/// REBALANCE_IN_PROGRESS on a SyncGroup (a member joined or left between the two
/// barriers): the member sends JoinGroup again at once, with the same member id.
#[test]
fn syncing_rebalance_in_progress_rejoins_at_once_keeping_the_member_id() {
    let mut h = H::new("range");
    h.find_coordinator(2);
    let join = h.request();
    h.joined(join.id, 3, "m2", "m1", "range");
    let sync = h.request();
    h.events();
    h.respond(
        sync.id,
        GroupResponse::SyncGroup {
            error: REBALANCE_IN_PROGRESS,
            protocol_name: None,
            assignment: Default::default(),
        },
    );
    let join = h.request();
    assert!(
        matches!(&join.request, GroupRequest::JoinGroup { member_id, .. } if member_id == "m2"),
        "{join:?}"
    );
    assert_eq!(
        h.events(),
        vec![],
        "no partitions were owned, so none are lost"
    );
}

// ----- timings -----

/// An eager member keeps heartbeating (once per interval) while the application
/// revokes, as the Java client does: until its JoinGroup the broker still expects
/// heartbeats. The answers (REBALANCE_IN_PROGRESS) keep the session, so a revocation
/// longer than the session timeout loses nothing. Once acknowledged, the member rejoins
/// at once and sends nothing while the JoinGroup waits; heartbeats of the new
/// generation resume one interval after the JoinGroup answer, while the member waits
/// for its SyncGroup (the Java client's COMPLETING_REBALANCE), and go on at their own
/// pace after the SyncGroup answer.
#[test]
fn eager_revoking_heartbeats_on_and_joining_sends_none_until_the_join_answer() {
    let mut h = H::stable_leader();
    let hb = h.heartbeat();
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: REBALANCE_IN_PROGRESS,
        },
    );
    assert!(matches!(
        &h.events()[..],
        [Event::RevokeRequested { generation: 7, .. }]
    ));
    // 5 s of revoking with a 1 s heartbeat interval.
    let mut heartbeats = 0;
    for _ in 0..50 {
        h.m.note_progress(h.now);
        h.advance(Duration::from_millis(100));
        for out in h.requests() {
            assert!(
                matches!(out.request, GroupRequest::Heartbeat { generation: 7, .. }),
                "only heartbeats while revoking: {out:?}"
            );
            heartbeats += 1;
            h.respond(
                out.id,
                GroupResponse::Heartbeat {
                    error: REBALANCE_IN_PROGRESS,
                },
            );
        }
    }
    assert!(
        (4..=6).contains(&heartbeats),
        "{heartbeats} heartbeats in 5 s"
    );
    assert_eq!(h.events(), vec![], "nothing lost while revoking");
    assert_eq!(h.m.state(), StateKind::Revoking);
    h.m.complete_revocation(h.now, 7);
    let join = h.request();
    assert!(is_join(&join));
    for _ in 0..50 {
        h.m.note_progress(h.now);
        h.advance(Duration::from_millis(100));
        assert!(h.requests().is_empty(), "sent while joining");
    }
    h.joined(join.id, 8, "m1", "m0", "range");
    let sync = h.request();
    h.advance(Duration::from_millis(999));
    assert!(h.requests().is_empty());
    h.advance(Duration::from_millis(1));
    let hb = h.request();
    assert!(
        matches!(hb.request, GroupRequest::Heartbeat { generation: 8, .. }),
        "a heartbeat while syncing: {hb:?}"
    );
    h.respond(hb.id, GroupResponse::Heartbeat { error: 0 });
    h.synced(sync.id, &[0, 1]);
    // The OffsetFetch for the partitions just assigned.
    let fetch = h.requests();
    assert!(
        matches!(&fetch[..], [o] if matches!(o.request, GroupRequest::OffsetFetch { .. })),
        "{fetch:?}"
    );
    h.advance(Duration::from_millis(999));
    assert!(h.requests().is_empty());
    h.advance(Duration::from_millis(1));
    assert!(matches!(
        h.request().request,
        GroupRequest::Heartbeat { generation: 8, .. }
    ));
}

/// Issue 30, found by the chaos runner under load (`chaos --duration 40s --seed 247241775
/// --contention 2 --stall 300ms`, cooperative-sticky; it fails about one replay in
/// three): a cooperative member that rejoins keeps its partitions and goes on handling
/// them, and from its JoinGroup on it has no session clock (the heartbeat, and with it
/// `Timer::Session`, lives only from the JoinGroup answer to the next rejoin). When the
/// coordinator holding that JoinGroup goes silent and the group moves to another
/// coordinator, the group forms generations without the member and hands its partitions
/// to others, while the member handles them for as long as the JoinGroup may take
/// (`max.poll.interval.ms` + 5 s: 35 s here, 5 min by default): records redone below a
/// successor's commit. The member loses what it kept once a session passes with no
/// answer from the coordinator, as it does in a generation (Java and librdkafka keep
/// them: docs/rebalance.md).
///
/// Failed while the session clock stopped at the JoinGroup (fixed in issue 30).
#[test]
fn cooperative_joining_unanswered_for_a_session_loses_the_kept_partitions() {
    let mut h = H::follower("cooperative-sticky", 7, &[0, 1]);
    let hb = h.heartbeat();
    // The session runs from when the last accepted heartbeat was sent.
    let renewed = h.now;
    h.respond(
        hb.id,
        GroupResponse::Heartbeat {
            error: REBALANCE_IN_PROGRESS,
        },
    );
    let join = h.request();
    assert!(is_join(&join), "{join:?}");
    assert_eq!(h.m.state(), StateKind::Joining);
    assert_eq!(h.m.assignment().len(), 2, "kept while rejoining");
    assert!(h.events().is_empty());
    // The coordinator answers nothing (silent) for a session and a second. The
    // application keeps coming back for records.
    let mut lost = Vec::new();
    let mut lost_at = None;
    let mut after = Vec::new();
    for _ in 0..110 {
        h.m.note_progress(h.now);
        h.advance(Duration::from_millis(100));
        let requests = h.requests();
        let events = h.events();
        if lost_at.is_none()
            && ottla_proto::group::testing::lost(&events, LostReason::SessionLapsed)
        {
            lost_at = Some(h.now.duration_since(renewed));
        } else if lost_at.is_some() {
            after.extend(requests);
        }
        lost.extend(events);
    }
    let lost_at = lost_at.unwrap_or_else(|| {
        panic!(
            "a session (10 s) with no answer while joining, and the partitions are still owned: {lost:?}, assignment {:?}",
            h.m.assignment()
        )
    });
    // Kept for the session, not a moment less (a join phase may last that long).
    assert!(
        lost_at >= Duration::from_secs(10) && lost_at <= Duration::from_millis(10_100),
        "lost {lost_at:?} after the last heartbeat was sent"
    );
    assert!(h.m.assignment().is_empty());
    // And it looks the coordinator up again, to rejoin under its member id.
    assert!(
        after
            .iter()
            .any(|o| matches!(o.request, GroupRequest::FindCoordinator { .. })),
        "no rediscovery after the lapse: {after:?}"
    );
}

/// Issue 30, found by the chaos runner under load (`chaos --duration 40s --seed 488062273
/// --contention 1 --stall 800ms`, sticky, eager; two replays in three fail): the
/// coordinator's broker is down for 5 s (longer than the 3 s session) while the other
/// brokers go on naming it in FindCoordinator answers. Every rediscovery ends in
/// `coordinator_found`, which restarts the session clock (`hb.last_ok = now`, as Java's
/// `heartbeat.resetSessionTimeout()`), so `Timer::Session` never fires: the members keep
/// the old generation's partitions and handle them, while the broker, back up, has
/// expired them and the first to rejoin forms a generation with every partition. Java
/// resets the clock but never drops partitions when it runs out; librdkafka, whose
/// drop-on-lapse ottla follows, renews it only on a SyncGroup or Heartbeat answer
/// (`rd_kafka_cgrp_update_session_timeout`). A coordinator found is not an answer from
/// the coordinator.
///
/// Failed while `coordinator_found` restarted the session clock (fixed in issue 30).
#[test]
fn stable_coordinator_found_again_and_again_with_no_answer_still_lapses_the_session() {
    let mut h = H::stable_leader();
    let mut events = Vec::new();
    // 12 s (the session is 10 s): every heartbeat fails to connect, every lookup names
    // the same coordinator again.
    for _ in 0..120 {
        h.m.note_progress(h.now);
        h.advance(Duration::from_millis(100));
        for out in h.requests() {
            match out.request {
                GroupRequest::FindCoordinator { .. } => h.found(out.id, 2),
                _ => h.m.handle_failure(h.now, out.id, Failure::Disconnected),
            }
        }
        events.extend(h.events());
    }
    assert!(
        ottla_proto::group::testing::lost(&events, LostReason::SessionLapsed),
        "12 s without an answer from the coordinator and the partitions are still owned: {events:?}, assignment {:?}",
        h.m.assignment()
    );
}

/// Errors in FindCoordinator answers (the coordinator is not available yet) are retried
/// after 100 ms, 200 ms, 400 ms, 800 ms, then every 1 s, each within -20%/+20% and
/// never above 1 s.
#[test]
fn finding_coordinator_not_available_backs_off_exponentially_to_one_second() {
    let mut h = H::new("range");
    let mut sent_at = Vec::new();
    let start = h.now;
    for _ in 0..800 {
        for out in h.requests() {
            assert!(matches!(out.request, GroupRequest::FindCoordinator { .. }));
            sent_at.push(h.now - start);
            h.respond(
                out.id,
                GroupResponse::FindCoordinator {
                    error: 15,
                    node_id: -1,
                    host: String::new(),
                    port: -1,
                },
            );
        }
        h.m.note_progress(h.now);
        h.advance(Duration::from_millis(10));
    }
    let gaps: Vec<u128> = sent_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    println!("FindCoordinator gaps (ms, 10 ms steps): {gaps:?}");
    for (i, nominal) in [100u128, 200, 400, 800, 1000, 1000].into_iter().enumerate() {
        let low = nominal * 8 / 10;
        let high = (nominal * 12 / 10).min(1000) + 10;
        assert!(
            (low..=high).contains(&gaps[i]),
            "gap {i}: {} ms, expected about {nominal}",
            gaps[i]
        );
    }
    assert!(gaps.iter().all(|g| *g <= 1010), "{gaps:?}");
}

/// The broker may hold a JoinGroup for the whole rebalance timeout, so the member waits
/// `max.poll.interval.ms` plus 5 s for the answer; then it counts the request as failed,
/// marks the coordinator unknown and looks it up again after `retry.backoff.ms`.
#[test]
fn joining_unanswered_times_out_after_the_rebalance_timeout_plus_five_seconds() {
    let mut h = H::new("range");
    h.find_coordinator(2);
    let join = h.request();
    assert!(is_join(&join));
    // 30 s rebalance timeout + 5 s slack, less a millisecond.
    for _ in 0..35 {
        h.advance(Duration::from_secs(1) - Duration::from_micros(29));
        h.m.note_progress(h.now);
        assert!(h.requests().is_empty());
    }
    h.advance(Duration::from_millis(2));
    assert_eq!(h.m.state(), StateKind::Unjoined);
    assert_eq!(h.m.coordinator(), None);
    assert!(h.requests().is_empty());
    h.advance(Duration::from_millis(100));
    assert!(matches!(
        h.request().request,
        GroupRequest::FindCoordinator { .. }
    ));
}

// ----- eviction after max.poll.interval.ms, through the Consumer -----

fn mock_consumer(peer: &Peer, group: &str, max_poll: Duration) -> ottla::ConsumerBuilder {
    Consumer::builder(&peer.bootstrap())
        .group_id(group)
        .topics(["away"])
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .max_poll_interval(max_poll)
        .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
}

async fn until_assigned(consumer: &mut Consumer, n: usize) {
    let started = Instant::now();
    while consumer.assignment().len() < n {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never assigned"
        );
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
    }
}

fn group_events(consumer: &mut Consumer) -> Vec<ConsumerEvent> {
    std::iter::from_fn(|| consumer.try_event()).collect()
}

fn mock_peer() -> Peer {
    let peer = Peer::mock(1).expect("mock");
    if let Peer::Mock(m) = &peer {
        m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    }
    peer.create_topic("away", 2).expect("topic");
    peer
}

/// Heartbeats run in the member's own task: an application that does not come back for
/// records for 9 s, longer than the 6 s session timeout but within
/// `max.poll.interval.ms` (20 s), keeps its partitions and its generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_an_application_away_longer_than_the_session_timeout_keeps_its_partitions() {
    protocol_tests::init_tracing();
    let peer = mock_peer();
    let Peer::Mock(m) = &peer else { unreachable!() };
    let mut consumer = mock_consumer(&peer, "away-session", Duration::from_secs(20))
        .build()
        .await
        .expect("consumer");
    until_assigned(&mut consumer, 2).await;
    let before = group_events(&mut consumer);
    let generation = before
        .iter()
        .rev()
        .find_map(|e| match e {
            ConsumerEvent::Joined { generation, .. } => Some(*generation),
            _ => None,
        })
        .expect("joined");
    m.start_request_tracking();
    tokio::time::sleep(Duration::from_secs(9)).await;
    let heartbeats = m.requests().iter().filter(|r| r.api_key == 12).count();
    let after = group_events(&mut consumer);
    println!("away 9 s: {heartbeats} heartbeats sent; events {after:?}");
    assert!(heartbeats >= 12, "heartbeats while away: {heartbeats}");
    assert!(
        !after.iter().any(|e| matches!(
            e,
            ConsumerEvent::Lost { .. }
                | ConsumerEvent::RevokeRequested { .. }
                | ConsumerEvent::ProgressTimeout { .. }
                | ConsumerEvent::Joined { .. }
        )),
        "{after:?}"
    );
    assert_eq!(consumer.assignment().len(), 2);
    let _ = tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await;
    assert!(
        !group_events(&mut consumer)
            .iter()
            .any(|e| matches!(e, ConsumerEvent::Joined { generation: g, .. } if *g != generation))
    );
    consumer.close().await.expect("close");
}

/// An application that does not come back for records within `max.poll.interval.ms`
/// (4 s here): the member reports `ProgressTimeout`, reports its partitions `Lost`,
/// sends LeaveGroup (so the others rebalance at once instead of after the
/// session timeout), and rejoins when the application asks for records again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_an_application_away_longer_than_max_poll_interval_leaves_and_rejoins_on_return() {
    protocol_tests::init_tracing();
    let peer = mock_peer();
    let Peer::Mock(m) = &peer else { unreachable!() };
    let mut consumer = mock_consumer(&peer, "away-poll", Duration::from_secs(4))
        .build()
        .await
        .expect("consumer");
    until_assigned(&mut consumer, 2).await;
    group_events(&mut consumer);
    m.start_request_tracking();
    let away = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let events = group_events(&mut consumer);
    let left = m.requests().iter().any(|r| r.api_key == 13);
    println!("away 6 s: LeaveGroup sent {left}; events {events:?}");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ConsumerEvent::ProgressTimeout { max_poll_interval, .. } if *max_poll_interval == Duration::from_secs(4))),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(
            e,
            ConsumerEvent::Lost {
                reason: LostReason::ProgressTimeout,
                partitions,
                ..
            } if partitions.len() == 2
        )),
        "{events:?}"
    );
    assert!(left, "a dynamic member sends LeaveGroup");
    assert!(consumer.assignment().is_empty());
    // Back: the next recv rejoins.
    let back = Instant::now();
    until_assigned(&mut consumer, 2).await;
    println!(
        "came back after {:?} away; assigned again {:?} later",
        back - away,
        back.elapsed()
    );
    assert!(
        group_events(&mut consumer)
            .iter()
            .any(|e| matches!(e, ConsumerEvent::Joined { .. }))
    );
    consumer.close().await.expect("close");
}
