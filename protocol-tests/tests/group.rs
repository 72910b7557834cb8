//! The group member against real peers: the 3-broker librdkafka mock cluster and tansu.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kafka_protocol::messages::ApiKey;
use ottla_proto::group::member::{Event, GroupError, Membership};
use protocol_tests::group_app::{
    MemberOptions, TestMember, eventually, owned_exactly_once, partitions,
};
use protocol_tests::mock::MockCluster;
use protocol_tests::tansu::Tansu;

const TOPIC: &str = "group-topic";

fn mock(partitions: i32) -> MockCluster {
    let m = MockCluster::new(3).expect("mock cluster");
    m.cap_group_apis().expect("cap group apis");
    m.set_group_initial_rebalance_delay(Duration::from_millis(200));
    m.create_topic(TOPIC, partitions, 1).expect("topic");
    m
}

fn opts(assignor: &'static str) -> MemberOptions {
    MemberOptions {
        assignor,
        ..MemberOptions::default()
    }
}

async fn converge(assignor: &'static str) {
    let m = mock(12);
    let group = format!("converge-{assignor}");
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(
            TestMember::start(&m.bootstrap(), &group, &[TOPIC], opts(assignor))
                .await
                .unwrap(),
        );
    }
    let all = partitions(TOPIC, 12);
    let refs: Vec<&TestMember> = members.iter().collect();
    eventually(Duration::from_secs(30), || owned_exactly_once(&refs, &all))
        .await
        .unwrap_or_else(|e| panic!("{assignor}: {e}"));
    for (i, member) in members.iter().enumerate() {
        let n = member.owned().len();
        assert!(
            (3..=5).contains(&n),
            "{assignor}: member {i} owns {n} of 12"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_three_members_converge_range() {
    converge("range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_three_members_converge_roundrobin() {
    converge("roundrobin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_three_members_converge_sticky() {
    converge("sticky").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_three_members_converge_cooperative_sticky() {
    converge("cooperative-sticky").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_member_leaving_hands_over_its_partitions() {
    let m = mock(12);
    let group = "leaving";
    let a = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("range"))
        .await
        .unwrap();
    let b = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("range"))
        .await
        .unwrap();
    let c = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("range"))
        .await
        .unwrap();
    let all = partitions(TOPIC, 12);
    eventually(Duration::from_secs(30), || {
        owned_exactly_once(&[&a, &b, &c], &all)
    })
    .await
    .unwrap();
    c.stop().await;
    eventually(Duration::from_secs(30), || {
        owned_exactly_once(&[&a, &b], &all)
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_member_joining_cooperative_never_revokes_partitions_that_stay() {
    let m = mock(12);
    let group = "scale-out";
    let a = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("cooperative-sticky"))
        .await
        .unwrap();
    let b = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("cooperative-sticky"))
        .await
        .unwrap();
    let all = partitions(TOPIC, 12);
    eventually(Duration::from_secs(30), || {
        owned_exactly_once(&[&a, &b], &all)
    })
    .await
    .unwrap();
    let before_a = a.owned();
    let before_b = b.owned();
    let mark = Instant::now();
    let c = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("cooperative-sticky"))
        .await
        .unwrap();
    eventually(Duration::from_secs(30), || {
        owned_exactly_once(&[&a, &b, &c], &all)
    })
    .await
    .unwrap();
    for (name, member, before) in [("a", &a, &before_a), ("b", &b, &before_b)] {
        let after = member.owned();
        let stayed: BTreeSet<_> = before.intersection(&after).cloned().collect();
        let revoked: BTreeSet<_> = member
            .seen()
            .events
            .iter()
            .filter(|(t, _)| *t >= mark)
            .flat_map(|(_, e)| match e {
                Event::RevokeRequested { partitions, .. } | Event::Lost { partitions, .. } => {
                    partitions.clone()
                }
                _ => vec![],
            })
            .collect();
        assert!(
            stayed.is_disjoint(&revoked),
            "member {name} had partitions revoked that it kept: {:?}",
            stayed.intersection(&revoked).collect::<Vec<_>>()
        );
        assert!(revoked.iter().all(|p| !after.contains(p)));
    }
    assert!(!c.owned().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_coordinator_moves_twenty_times_without_eviction() {
    let m = mock(6);
    let group = "moves";
    m.set_group_coordinator(group, 1).unwrap();
    let a = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("range"))
        .await
        .unwrap();
    let b = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("range"))
        .await
        .unwrap();
    let all = partitions(TOPIC, 6);
    eventually(Duration::from_secs(30), || {
        owned_exactly_once(&[&a, &b], &all)
    })
    .await
    .unwrap();
    let generation = a.seen().generation;
    m.start_request_tracking();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let target = 1 + ((i + 1) % 3);
        m.clear_requests();
        m.set_group_coordinator(group, target).unwrap();
        let moved = Instant::now();
        // Heartbeats (api 12) reach the new coordinator from both members within 1 s.
        let deadline = moved + Duration::from_secs(1);
        loop {
            let reached = m
                .requests()
                .iter()
                .filter(|r| r.api_key == ApiKey::Heartbeat as i16 && r.broker == target)
                .count();
            if reached >= 2 {
                slowest = slowest.max(moved.elapsed());
                break;
            }
            assert!(
                Instant::now() < deadline,
                "move {i}: heartbeats did not reach broker {target} within 1 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!(
        "20 coordinator moves: heartbeats from both members reached the new coordinator within {slowest:?} at worst"
    );
    assert_eq!(
        a.seen().generation,
        generation,
        "a rebalance happened: a member was evicted"
    );
    assert_eq!(b.seen().generation, generation);
    owned_exactly_once(&[&a, &b], &all).unwrap();
    for member in [&a, &b] {
        assert!(
            !member
                .seen()
                .events
                .iter()
                .any(|(_, e)| matches!(e, Event::Lost { .. } | Event::RevokeRequested { .. }))
        );
    }
}

/// Pushes `code` for `api` and waits until the member sends `then` to the cluster.
async fn inject_and_expect(m: &MockCluster, api: ApiKey, code: i16, then: ApiKey) {
    m.clear_requests();
    m.push_request_errors(api as i16, &[code]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reqs = m.requests();
        let hit = reqs.iter().position(|r| r.api_key == api as i16);
        if let Some(i) = hit
            && reqs[i + 1..].iter().any(|r| r.api_key == then as i16)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {code} on {api:?}, no {then:?} followed: {reqs:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_injected_errors_follow_the_table() {
    let m = mock(6);
    let group = "errors";
    let a = TestMember::start(&m.bootstrap(), group, &[TOPIC], opts("range"))
        .await
        .unwrap();
    let all = partitions(TOPIC, 6);
    eventually(Duration::from_secs(30), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    m.start_request_tracking();
    // NOT_COORDINATOR on a heartbeat: rediscover, no rejoin.
    let gen_before = a.seen().generation;
    inject_and_expect(&m, ApiKey::Heartbeat, 16, ApiKey::FindCoordinator).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(a.seen().generation, gen_before);
    // COORDINATOR_NOT_AVAILABLE likewise.
    inject_and_expect(&m, ApiKey::Heartbeat, 15, ApiKey::FindCoordinator).await;
    // REBALANCE_IN_PROGRESS: rejoin.
    inject_and_expect(&m, ApiKey::Heartbeat, 27, ApiKey::JoinGroup).await;
    eventually(Duration::from_secs(20), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    // UNKNOWN_MEMBER_ID: partitions lost, rejoin.
    inject_and_expect(&m, ApiKey::Heartbeat, 25, ApiKey::JoinGroup).await;
    eventually(Duration::from_secs(20), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    assert!(
        a.seen()
            .events
            .iter()
            .any(|(_, e)| matches!(e, Event::Lost { .. }))
    );
    // ILLEGAL_GENERATION: rejoin.
    inject_and_expect(&m, ApiKey::Heartbeat, 22, ApiKey::JoinGroup).await;
    eventually(Duration::from_secs(20), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    // COORDINATOR_LOAD_IN_PROGRESS on JoinGroup: retried.
    m.push_request_errors(ApiKey::JoinGroup as i16, &[14]);
    inject_and_expect(&m, ApiKey::Heartbeat, 27, ApiKey::JoinGroup).await;
    eventually(Duration::from_secs(20), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    // INVALID_REQUEST on SyncGroup: rejoin.
    m.push_request_errors(ApiKey::SyncGroup as i16, &[42]);
    inject_and_expect(&m, ApiKey::Heartbeat, 27, ApiKey::JoinGroup).await;
    eventually(Duration::from_secs(20), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    // REQUEST_TIMED_OUT on a heartbeat: retried, no rejoin.
    let generation = a.seen().generation;
    inject_and_expect(&m, ApiKey::Heartbeat, 7, ApiKey::Heartbeat).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(a.seen().generation, generation);
    // FENCED_INSTANCE_ID: fatal and sticky.
    m.push_request_errors(ApiKey::Heartbeat as i16, &[82]);
    eventually(Duration::from_secs(10), || {
        let s = a.seen();
        match s.events.iter().find(|(_, e)| matches!(e, Event::Fatal(_))) {
            Some((_, Event::Fatal(GroupError::Broker { code: 82, .. }))) => Ok(()),
            other => Err(format!("no fatal yet: {other:?}")),
        }
    })
    .await
    .unwrap();
    assert!(a.owned().is_empty());
}

/// The librdkafka mock does not implement KIP-345 (every JoinGroup rebalances), so
/// what it can show is the member's side: a static member's close sends no LeaveGroup,
/// and the restarted process, under the same `group.instance.id`, gets the same
/// partitions back. The no-rebalance half is shown against the simulated coordinator
/// (`simulation.rs::a_static_member_restarted_within_the_session_timeout_causes_no_rebalance`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_static_member_restart_sends_no_leave_group_and_gets_its_partitions_back() {
    let m = mock(6);
    let group = "static";
    let static_opts = |id: &str| MemberOptions {
        instance_id: Some(id.to_string()),
        session_timeout: Duration::from_secs(10),
        ..opts("range")
    };
    let a = TestMember::start(&m.bootstrap(), group, &[TOPIC], static_opts("a"))
        .await
        .unwrap();
    let b = TestMember::start(&m.bootstrap(), group, &[TOPIC], static_opts("b"))
        .await
        .unwrap();
    let all = partitions(TOPIC, 6);
    eventually(Duration::from_secs(30), || {
        owned_exactly_once(&[&a, &b], &all)
    })
    .await
    .unwrap();
    let b_owned = b.owned();
    m.start_request_tracking();
    b.stop().await;
    let b2 = TestMember::start(&m.bootstrap(), group, &[TOPIC], static_opts("b"))
        .await
        .unwrap();
    eventually(Duration::from_secs(20), || {
        if b2.owned() == b_owned {
            Ok(())
        } else {
            Err(format!("{:?}", b2.owned()))
        }
    })
    .await
    .unwrap();
    eventually(Duration::from_secs(20), || {
        owned_exactly_once(&[&a, &b2], &all)
    })
    .await
    .unwrap();
    assert!(
        !m.requests()
            .iter()
            .any(|r| r.api_key == ApiKey::LeaveGroup as i16),
        "a static member sent LeaveGroup"
    );
}

/// Rack-aware assignment (KIP-881): brokers in racks a, b and c, every partition on
/// one broker, and one member per rack with `client.rack` set: under `range` and
/// `cooperative-sticky` each member gets exactly the partitions in its own rack, so
/// it reads from a broker next to it. Without racks the same group splits by index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_members_with_racks_get_the_partitions_in_their_rack() {
    for assignor in ["range", "cooperative-sticky"] {
        let m = MockCluster::new(3).expect("mock cluster");
        m.cap_group_apis().expect("cap");
        m.set_group_initial_rebalance_delay(Duration::from_millis(200));
        let racks = ["a", "b", "c"];
        for (b, rack) in m.broker_ids().into_iter().zip(racks) {
            m.set_broker_rack(b, rack).expect("rack");
        }
        m.create_topic(TOPIC, 6, 1).expect("topic");
        let cluster = ottla::driver::Cluster::connect(
            &ottla::ClientConfig::new(&m.bootstrap()),
            ottla::driver::TopicScope::Topics([TOPIC.to_string()].into()),
            &[],
        )
        .await
        .expect("cluster");
        let metadata = cluster.metadata();
        let rack_of = |p: i32| -> String {
            let (leader, _) = metadata.leader(TOPIC, p).expect("leader");
            metadata
                .broker(leader)
                .and_then(|b| b.rack.clone())
                .expect("the mock reports racks")
        };
        let mut members = Vec::new();
        for rack in racks {
            let o = MemberOptions {
                rack: Some(rack.to_string()),
                ..opts(assignor)
            };
            members.push(
                TestMember::start(&m.bootstrap(), &format!("racks-{assignor}"), &[TOPIC], o)
                    .await
                    .unwrap(),
            );
        }
        let all = partitions(TOPIC, 6);
        let refs: Vec<&TestMember> = members.iter().collect();
        eventually(Duration::from_secs(30), || {
            owned_exactly_once(&refs, &all)?;
            for (member, rack) in members.iter().zip(racks) {
                let owned = member.owned();
                if owned.len() != 2 || owned.iter().any(|p| rack_of(p.partition) != rack) {
                    return Err(format!(
                        "{assignor}: the member in rack {rack} owns {owned:?}"
                    ));
                }
            }
            Ok(())
        })
        .await
        .unwrap();
        for member in members {
            member.stop().await;
        }
    }
}

/// A static member closed for good (the Java client's `CloseOptions` with
/// LEAVE_GROUP; a scale-in) sends LeaveGroup with its `group.instance.id`, and its
/// partitions move before its session would have expired. (On tansu: the librdkafka
/// mock reads LeaveGroup only up to v2, without the instance id.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_static_member_closed_for_good_leaves_and_its_partitions_move_before_its_session_ends()
 {
    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, 6).unwrap();
    let session = Duration::from_secs(16);
    let static_opts = |id: &str| MemberOptions {
        instance_id: Some(id.to_string()),
        session_timeout: session,
        heartbeat_interval: Duration::from_millis(500),
        ..opts("range")
    };
    let group = "static-leave";
    let a = TestMember::start(&t.bootstrap(), group, &[TOPIC], static_opts("a"))
        .await
        .unwrap();
    let b = TestMember::start(&t.bootstrap(), group, &[TOPIC], static_opts("b"))
        .await
        .unwrap();
    let all = partitions(TOPIC, 6);
    eventually(Duration::from_secs(60), || {
        owned_exactly_once(&[&a, &b], &all)
    })
    .await
    .unwrap();
    let left = std::time::Instant::now();
    b.stop_with(Membership::Leave).await;
    eventually(session, || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    println!(
        "static member left for good: partitions moved in {:?} (session timeout {session:?})",
        left.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_two_members_converge_and_a_leaving_member_hands_over() {
    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, 6).unwrap();
    // tansu holds each JoinGroup for half the session timeout: keep it short.
    let o = MemberOptions {
        session_timeout: Duration::from_secs(6),
        heartbeat_interval: Duration::from_millis(500),
        ..opts("range")
    };
    let a = TestMember::start(&t.bootstrap(), "tansu-group", &[TOPIC], o.clone())
        .await
        .unwrap();
    let b = TestMember::start(&t.bootstrap(), "tansu-group", &[TOPIC], o)
        .await
        .unwrap();
    let all = partitions(TOPIC, 6);
    eventually(Duration::from_secs(40), || {
        owned_exactly_once(&[&a, &b], &all)
    })
    .await
    .unwrap();
    assert_eq!(a.owned().len(), 3);
    b.stop().await;
    eventually(Duration::from_secs(40), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_transport_errors_are_retried_and_config_errors_are_fatal() {
    let m = mock(6);
    m.start_request_tracking();
    let a = TestMember::start(&m.bootstrap(), "transport", &[TOPIC], opts("range"))
        .await
        .unwrap();
    let all = partitions(TOPIC, 6);
    eventually(Duration::from_secs(30), || owned_exactly_once(&[&a], &all))
        .await
        .unwrap();
    let generation = a.seen().generation;
    // A transport failure (the mock drops the connection) on a heartbeat: rediscover
    // and carry on in the same generation.
    inject_and_expect(&m, ApiKey::Heartbeat, -195, ApiKey::FindCoordinator).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(a.seen().generation, generation);
    owned_exactly_once(&[&a], &all).unwrap();

    // INCONSISTENT_GROUP_PROTOCOL and INVALID_SESSION_TIMEOUT on JoinGroup: fatal,
    // with a message that names what to change.
    for (code, words) in [
        (23i16, "partition.assignment.strategy"),
        (26, "session.timeout.ms"),
    ] {
        m.push_request_errors(ApiKey::JoinGroup as i16, &[code]);
        let b = TestMember::start(
            &m.bootstrap(),
            &format!("fatal-{code}"),
            &[TOPIC],
            opts("range"),
        )
        .await
        .unwrap();
        eventually(Duration::from_secs(10), || {
            let s = b.seen();
            match s.events.iter().find_map(|(_, e)| match e {
                Event::Fatal(err) => Some(err.to_string()),
                _ => None,
            }) {
                Some(msg) if msg.contains(words) => Ok(()),
                other => Err(format!(
                    "no fatal naming {words}: {other:?} in {:?}",
                    s.events.iter().map(|(_, e)| e).collect::<Vec<_>>()
                )),
            }
        })
        .await
        .unwrap();
    }
}

/// Commits from one member are what the next owner reads back (OffsetCommit and
/// OffsetFetch at the negotiated versions).
async fn commit_then_fetch(bootstrap: &str, group: &str) {
    use ottla::ClientConfig;
    use ottla::driver::{Cluster, GroupHandle, TopicScope};
    use ottla_proto::group::assignor::builtin;
    use ottla_proto::group::member::GroupConfig;
    use ottla_proto::group::messages::CommitOffset;
    use std::sync::Arc;

    async fn member(bootstrap: &str, group: &str) -> GroupHandle {
        let config = ClientConfig::new(bootstrap).with_request_timeout(Duration::from_secs(10));
        let cluster =
            Cluster::connect(&config, TopicScope::Topics([TOPIC.to_string()].into()), &[])
                .await
                .unwrap();
        let assignor: Arc<dyn ottla_proto::group::assignor::Assignor> =
            Arc::from(builtin("range").unwrap());
        let mut gc = GroupConfig::new(group, vec![TOPIC.into()], vec![assignor]);
        gc.session_timeout = Duration::from_secs(6);
        gc.heartbeat_interval = Duration::from_millis(500);
        gc.leader_sync_delay = Duration::from_millis(50);
        GroupHandle::spawn(cluster, gc)
    }
    async fn wait_for<T>(h: &mut GroupHandle, mut f: impl FnMut(&Event) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let e = tokio::time::timeout_at(deadline, h.next_event())
                .await
                .expect("timed out")
                .expect("member stopped");
            if let Some(t) = f(&e) {
                return t;
            }
        }
    }

    let mut a = member(bootstrap, group).await;
    let assigned = wait_for(&mut a, |e| match e {
        Event::Assigned { assignment, .. } => Some(assignment.clone()),
        _ => None,
    })
    .await;
    assert_eq!(assigned.len(), 6);
    let offsets: Vec<CommitOffset> = assigned
        .iter()
        .map(|p| CommitOffset {
            partition: p.clone(),
            offset: 100 + i64::from(p.partition),
            leader_epoch: -1,
            metadata: None,
        })
        .collect();
    let committed = a.commit(offsets.clone()).await.expect("commit");
    assert_eq!(committed, offsets);
    a.leave().await;

    let mut b = member(bootstrap, group).await;
    let fetched = wait_for(&mut b, |e| match e {
        Event::CommittedOffsets { offsets, .. } => Some(offsets.clone()),
        _ => None,
    })
    .await;
    let mut fetched: Vec<(i32, i64)> = fetched.iter().map(|(p, o, _)| (p.partition, *o)).collect();
    fetched.sort();
    assert_eq!(
        fetched,
        (0..6).map(|p| (p, 100 + i64::from(p))).collect::<Vec<_>>()
    );
    b.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_commits_are_read_back_by_the_next_owner() {
    let m = mock(6);
    commit_then_fetch(&m.bootstrap(), "commits").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_commits_are_read_back_by_the_next_owner() {
    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, 6).unwrap();
    commit_then_fetch(&t.bootstrap(), "tansu-commits").await;
}

/// `range`, taking `took` for every assignment (a large group's leader).
#[derive(Debug)]
struct SlowRange {
    took: Duration,
}

impl ottla_proto::group::assignor::Assignor for SlowRange {
    fn name(&self) -> &'static str {
        "range"
    }
    fn protocol(&self) -> ottla_proto::group::assignor::RebalanceProtocol {
        ottla_proto::group::assignor::RebalanceProtocol::Eager
    }
    fn assign(
        &self,
        partitions_per_topic: &std::collections::BTreeMap<String, i32>,
        members: &[ottla_proto::group::assignor::MemberSubscription],
    ) -> Result<
        std::collections::BTreeMap<String, ottla_proto::group::consumer_protocol::Assignment>,
        ottla_proto::group::assignor::AssignError,
    > {
        std::thread::sleep(self.took);
        ottla_proto::group::assignor::RangeAssignor.assign(partitions_per_topic, members)
    }
}

/// Issue 36: a leader whose assignment takes longer than the session (9 s against 6 s)
/// heartbeats meanwhile (the assignment runs on a blocking thread), so tansu keeps it
/// and the group forms in its first generation: both members are assigned in the same
/// generation and nobody loses a partition. When the assignment ran on the member's
/// task, the leader fell silent for 9 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_a_leader_assigning_for_longer_than_the_session_still_forms_the_group() {
    use ottla::ClientConfig;
    use ottla::driver::{Cluster, GroupHandle, TopicScope};
    use ottla_proto::group::member::GroupConfig;
    use std::sync::Arc;

    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, 6).unwrap();
    async fn member(bootstrap: &str) -> GroupHandle {
        let config = ClientConfig::new(bootstrap).with_request_timeout(Duration::from_secs(30));
        let cluster =
            Cluster::connect(&config, TopicScope::Topics([TOPIC.to_string()].into()), &[])
                .await
                .unwrap();
        let assignor: Arc<dyn ottla_proto::group::assignor::Assignor> = Arc::new(SlowRange {
            took: Duration::from_secs(9),
        });
        let mut gc = GroupConfig::new("slow-leader", vec![TOPIC.into()], vec![assignor]);
        gc.session_timeout = Duration::from_secs(6);
        gc.heartbeat_interval = Duration::from_millis(500);
        gc.request_timeout = Duration::from_secs(30);
        GroupHandle::spawn(cluster, gc)
    }
    let started = Instant::now();
    let mut handles = vec![member(&t.bootstrap()).await, member(&t.bootstrap()).await];
    // Per member: the generation of its first assignment, and what it lost before.
    let mut firsts = Vec::new();
    for h in &mut handles {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        let mut lost = Vec::new();
        let first = loop {
            let e = tokio::time::timeout_at(deadline, h.next_event())
                .await
                .expect("no assignment within 90 s")
                .expect("member stopped");
            match e {
                Event::Assigned {
                    generation,
                    assignment,
                    ..
                } if !assignment.is_empty() => break (generation, assignment.len()),
                Event::Lost { reason, .. } => lost.push(format!("{reason:?}")),
                Event::Fatal(e) => panic!("fatal: {e}"),
                _ => {}
            }
        };
        assert!(
            lost.is_empty(),
            "lost before the first assignment: {lost:?}"
        );
        firsts.push(first);
    }
    println!("assigned after {:?}: {firsts:?}", started.elapsed());
    assert_eq!(
        firsts[0].0, firsts[1].0,
        "both members were assigned in one generation: {firsts:?}"
    );
    assert_eq!(firsts[0].1 + firsts[1].1, 6, "{firsts:?}");
    // And the group stays: another session passes without a rebalance.
    tokio::time::sleep(Duration::from_secs(7)).await;
    for h in &mut handles {
        while let Some(e) = h.try_event() {
            assert!(
                !matches!(
                    e,
                    Event::Lost { .. } | Event::RevokeRequested { .. } | Event::Fatal(_)
                ),
                "{e:?}"
            );
        }
    }
    for h in handles {
        h.leave().await;
    }
}
