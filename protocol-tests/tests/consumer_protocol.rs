//! KIP-848's consumer group protocol (`group.protocol=consumer`) against real peers:
//! the librdkafka mock cluster, which implements ConsumerGroupHeartbeat, and tansu,
//! which does not. Each test asserts what the group does, from the consumer's events
//! and the records it reads.
//!
//! The sequences of `docs/rebalance.md`'s KIP-848 chapter come from these tests and
//! from `src/proto/group/consumer_member/tests.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ottla::consumer::{
    Consumer, ConsumerBuilder, ConsumerEvent, GroupProtocol, Membership, OffsetReset,
};
use ottla_proto::group::member::LostReason;
use protocol_tests::data::produce;
use protocol_tests::mock::MockCluster;
use protocol_tests::tansu::Tansu;

const TOPIC: &str = "kip848";
const PARTITIONS: i32 = 6;
/// ConsumerGroupHeartbeat's API key.
const CONSUMER_GROUP_HEARTBEAT: i16 = 68;
const FENCED_MEMBER_EPOCH: i16 = 110;

/// A 3-broker mock with the test topic and `records` records in it, its consumer
/// groups heartbeating every 300 ms with a 6 s session.
async fn mock_with(records: u64) -> MockCluster {
    protocol_tests::init_tracing();
    let mock = MockCluster::new(3).expect("mock");
    mock.create_topic(TOPIC, PARTITIONS, 1).expect("topic");
    mock.set_group_consumer_heartbeat_interval(Duration::from_millis(300))
        .expect("interval");
    mock.set_group_consumer_session_timeout(Duration::from_secs(6))
        .expect("session");
    if records > 0 {
        produce(&mock.bootstrap(), TOPIC, PARTITIONS, 0, records, "none")
            .await
            .expect("produce");
    }
    mock
}

fn builder(bootstrap: &str, group: &str) -> ConsumerBuilder {
    Consumer::builder(bootstrap)
        .group_id(group)
        .topics([TOPIC])
        .offset_reset(OffsetReset::Earliest)
        .group_protocol(GroupProtocol::Consumer)
        .auto_commit(Some(Duration::from_millis(200)))
        .max_poll_interval(Duration::from_secs(20))
}

/// What one consumer read and saw.
#[derive(Debug, Default)]
struct Seen {
    records: BTreeMap<(i32, i64), u32>,
    events: Vec<(Instant, ConsumerEvent)>,
    /// The coordinator as `Consumer::stats` showed it after each new lookup (the
    /// member's coordinator lookups are the driver's business, not events).
    coordinators: Vec<(Instant, i32)>,
    /// `ConsumerStats::coordinator_lookups` as last read.
    lookups: u64,
}

impl Seen {
    fn owned(&self) -> BTreeSet<i32> {
        let mut owned = BTreeSet::new();
        for (_, e) in &self.events {
            match e {
                ConsumerEvent::Assigned { added, .. } => {
                    owned.extend(added.iter().map(|tp| tp.partition))
                }
                ConsumerEvent::RevokeRequested { partitions, .. }
                | ConsumerEvent::Lost { partitions, .. } => {
                    for tp in partitions {
                        owned.remove(&tp.partition);
                    }
                }
                _ => {}
            }
        }
        owned
    }
}

/// Reads from `consumer` for `d` (records and group events) into `seen`.
async fn read_for(consumer: &mut Consumer, seen: &mut Seen, d: Duration) {
    read_paced(consumer, seen, d, 1000, Duration::ZERO).await
}

/// [`read_for`], `max` records at a time with a pause of `pace` after each batch, as
/// an application that takes time over its records.
async fn read_paced(
    consumer: &mut Consumer,
    seen: &mut Seen,
    d: Duration,
    max: usize,
    pace: Duration,
) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if let Ok(batch) =
            tokio::time::timeout(Duration::from_millis(100), consumer.recv_batch(max)).await
        {
            for r in batch.expect("records") {
                *seen.records.entry((r.partition(), r.offset())).or_default() += 1;
            }
            tokio::time::sleep(pace).await;
        }
        while let Some(e) = consumer.try_event() {
            seen.events.push((Instant::now(), e));
        }
        let stats = consumer.stats();
        if stats.coordinator_lookups > seen.lookups {
            seen.lookups = stats.coordinator_lookups;
            if let Some(node) = stats.coordinator {
                seen.coordinators.push((Instant::now(), node));
            }
        }
    }
}

/// Reads from `consumer` into `seen` until it owns every partition; panics naming
/// `what` after `within`.
async fn until_owns_all(consumer: &mut Consumer, seen: &mut Seen, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while seen.owned().len() != PARTITIONS as usize {
        assert!(Instant::now() < deadline, "{what}: {:?}", seen.events);
        read_for(consumer, seen, Duration::from_millis(100)).await;
    }
}

/// tansu 0.6.0 has no ConsumerGroupHeartbeat. The consumer does not hang: its first
/// receive fails with an error that names the API and the setting to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_consumer_protocol_on_a_broker_without_it_fails_naming_the_setting() {
    protocol_tests::init_tracing();
    let tansu = Tansu::start().expect("tansu");
    tansu.create_topic(TOPIC, 2).expect("topic");
    let mut consumer = builder(&tansu.bootstrap(), "no-kip848")
        .build()
        .await
        .expect("the consumer starts: the broker is reachable");
    let started = Instant::now();
    let error = loop {
        match tokio::time::timeout(Duration::from_secs(15), consumer.recv_batch(10)).await {
            Err(_) => panic!("no error within 15 s: the consumer hangs silently"),
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => break e,
        }
    };
    let text = error.to_string();
    println!(
        "tansu, group.protocol=consumer: {text} (after {:?})",
        started.elapsed()
    );
    assert!(text.contains("group.protocol=classic"), "{text}");
    assert!(text.contains("ConsumerGroupHeartbeat"), "{text}");
}

/// The coordinator moves three times while one member consumes: its epoch and
/// partitions survive every move (the group's state is the broker's), no partition is
/// revoked or lost, and every record is read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_coordinator_moves_neither_revoke_nor_lose_partitions() {
    let records = 20_000;
    let mock = mock_with(records).await;
    let group = "moves";
    let pace = Duration::from_millis(20);
    mock.set_group_coordinator(group, 1).expect("coordinator");
    let mut consumer = builder(&mock.bootstrap(), group)
        .max_partition_fetch_bytes(2048)
        .build()
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    read_paced(&mut consumer, &mut seen, Duration::from_secs(2), 50, pace).await;
    assert_eq!(seen.owned().len(), PARTITIONS as usize, "{:?}", seen.events);
    let before = seen.records.len();
    for to in [2, 3, 1] {
        mock.set_group_coordinator(group, to).expect("move");
        read_paced(&mut consumer, &mut seen, Duration::from_secs(1), 50, pace).await;
    }
    let during = seen.records.len();
    println!(
        "coordinator moves: {before} records read before the moves, {during} after them, of {records}"
    );
    assert!(
        (during as u64) < records,
        "the moves happened while records were still being read"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while (seen.records.len() as u64) < records && Instant::now() < deadline {
        read_for(&mut consumer, &mut seen, Duration::from_millis(500)).await;
    }
    let moved_away: Vec<&ConsumerEvent> = seen
        .events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| {
            matches!(
                e,
                ConsumerEvent::RevokeRequested { .. } | ConsumerEvent::Lost { .. }
            )
        })
        .collect();
    assert!(moved_away.is_empty(), "{moved_away:?}");
    let found = seen.lookups;
    assert!(
        found >= 2,
        "the member followed the coordinator: {found} lookups"
    );
    assert_eq!(seen.records.len() as u64, records, "every record read");
    assert!(
        seen.records.values().all(|n| *n == 1),
        "no record read twice"
    );
    consumer.close().await.expect("close");
}

/// The broker fences the member's epoch (FENCED_MEMBER_EPOCH, injected): the member
/// drops its partitions as lost (nothing committed for them after), rejoins with epoch
/// 0 and the same member id, gets them back, and reads on from the last commit: no
/// record is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_fenced_member_loses_its_partitions_rejoins_and_loses_no_record() {
    let records = 3_000;
    let mock = mock_with(records).await;
    let mut consumer = builder(&mock.bootstrap(), "fenced")
        .max_partition_fetch_bytes(2048)
        .build()
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    read_for(&mut consumer, &mut seen, Duration::from_secs(2)).await;
    assert_eq!(seen.owned().len(), PARTITIONS as usize);
    mock.push_request_errors(CONSUMER_GROUP_HEARTBEAT, &[FENCED_MEMBER_EPOCH]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while (seen.records.len() as u64) < records && Instant::now() < deadline {
        read_for(&mut consumer, &mut seen, Duration::from_millis(500)).await;
    }
    read_for(&mut consumer, &mut seen, Duration::from_secs(1)).await;
    let events: Vec<&ConsumerEvent> = seen.events.iter().map(|(_, e)| e).collect();
    let lost = events
        .iter()
        .position(|e| {
            matches!(e, ConsumerEvent::Lost { reason: LostReason::FencedEpoch, partitions, .. } if partitions.len() == PARTITIONS as usize)
        })
        .unwrap_or_else(|| panic!("no loss by fencing: {events:?}"));
    let joined_again = events[lost..]
        .iter()
        .any(|e| matches!(e, ConsumerEvent::Joined { .. }));
    assert!(joined_again, "rejoined after the fence: {events:?}");
    assert_eq!(seen.owned().len(), PARTITIONS as usize, "{events:?}");
    assert_eq!(seen.records.len() as u64, records, "no record lost");
    consumer.close().await.expect("close");
}

/// A static member that closes (epoch -2) keeps its partitions reserved: the other
/// member is not given them while it is away, and it gets the same ones back when it
/// returns with the same `group.instance.id` within the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_static_member_returning_within_the_session_gets_its_partitions_back() {
    let mock = mock_with(0).await;
    let group = "static";
    let start_static = || async {
        builder(&mock.bootstrap(), group)
            .instance_id("static-1")
            .build()
            .await
            .expect("static consumer")
    };
    let mut a = start_static().await;
    let mut seen_a = Seen::default();
    read_for(&mut a, &mut seen_a, Duration::from_secs(1)).await;
    let mut b = builder(&mock.bootstrap(), group)
        .build()
        .await
        .expect("consumer");
    let mut seen_b = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen_a.owned().len() + seen_b.owned().len() != PARTITIONS as usize
        || seen_b.owned().is_empty()
        || seen_a.owned().is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "no split: a {:?}, b {:?}",
            seen_a.owned(),
            seen_b.owned()
        );
        read_for(&mut a, &mut seen_a, Duration::from_millis(200)).await;
        read_for(&mut b, &mut seen_b, Duration::from_millis(200)).await;
    }
    let a_owned = seen_a.owned();
    let b_owned = seen_b.owned();
    assert!(a_owned.is_disjoint(&b_owned));
    a.close_with(Membership::Default).await.expect("close");
    // Away for two seconds (a third of the session): b keeps its share only.
    read_for(&mut b, &mut seen_b, Duration::from_secs(2)).await;
    assert_eq!(
        seen_b.owned(),
        b_owned,
        "b was given a's partitions while a was away"
    );
    let mut a = start_static().await;
    let mut seen_a = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen_a.owned() != a_owned {
        assert!(
            Instant::now() < deadline,
            "a came back to {:?}, had {a_owned:?}",
            seen_a.owned()
        );
        read_for(&mut a, &mut seen_a, Duration::from_millis(200)).await;
        read_for(&mut b, &mut seen_b, Duration::from_millis(100)).await;
    }
    assert_eq!(seen_b.owned(), b_owned);
    a.close_with(Membership::Leave).await.expect("close");
    b.close().await.expect("close");
}

/// Scale-out from one member to two. The first member is asked to give back half its
/// partitions and holds on to them (its application is still finishing them): the
/// broker gives them to the second member only after the first acknowledged giving
/// them back, so no partition is ever owned by both. The partitions the first member
/// keeps are never revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_scale_out_hands_partitions_over_only_after_their_owner_released_them() {
    scale_out(false).await;
}

/// The same with the coordinator moving while the first member holds on: a move
/// changes nothing of who owns what. (The member does not close its connection to the
/// coordinator it gave up on, as Java's consumer-protocol member; the librdkafka mock
/// takes a closed connection for a release, and handed the partitions to the second
/// member while the first still read them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_scale_out_with_a_coordinator_move_still_hands_over_only_after_the_release() {
    scale_out(true).await;
}

async fn scale_out(move_coordinator: bool) {
    let mock = mock_with(0).await;
    let group = if move_coordinator {
        "scale-out-moving"
    } else {
        "scale-out"
    };
    mock.set_group_coordinator(group, 1).expect("coordinator");
    let mut a = builder(&mock.bootstrap(), group)
        .manual_revocation()
        .build()
        .await
        .expect("consumer");
    let mut seen_a = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen_a.owned().len() != PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "a alone never got every partition"
        );
        read_for(&mut a, &mut seen_a, Duration::from_millis(100)).await;
    }
    let mut b = builder(&mock.bootstrap(), group)
        .build()
        .await
        .expect("consumer");
    let mut seen_b = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (epoch, revoked) = loop {
        assert!(
            Instant::now() < deadline,
            "a was never asked to give partitions back"
        );
        read_for(&mut a, &mut seen_a, Duration::from_millis(100)).await;
        read_for(&mut b, &mut seen_b, Duration::from_millis(100)).await;
        let asked = seen_a.events.iter().find_map(|(_, e)| match e {
            ConsumerEvent::RevokeRequested {
                generation,
                partitions,
                ..
            } => Some((*generation, partitions.clone())),
            _ => None,
        });
        if let Some(asked) = asked {
            break asked;
        }
    };
    assert_eq!(revoked.len(), PARTITIONS as usize / 2, "{revoked:?}");
    if move_coordinator {
        mock.set_group_coordinator(group, 2).expect("move");
    }
    // a holds on for two seconds, heartbeating meanwhile: b gets none of them.
    read_for(&mut a, &mut seen_a, Duration::from_secs(1)).await;
    read_for(&mut b, &mut seen_b, Duration::from_secs(1)).await;
    let revoked_ids: BTreeSet<i32> = revoked.iter().map(|tp| tp.partition).collect();
    assert!(
        seen_b.owned().is_disjoint(&revoked_ids),
        "b was given {:?} while a still held them",
        seen_b.owned()
    );
    let released = Instant::now();
    a.complete_revocation(epoch, revoked.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen_b.owned() != revoked_ids {
        assert!(
            Instant::now() < deadline,
            "b never got {revoked_ids:?}: {:?}",
            seen_b.owned()
        );
        read_for(&mut a, &mut seen_a, Duration::from_millis(50)).await;
        read_for(&mut b, &mut seen_b, Duration::from_millis(50)).await;
    }
    println!(
        "scale-out: b got {revoked_ids:?} {:?} after a released them (heartbeat interval 300 ms)",
        released.elapsed()
    );
    let kept: BTreeSet<i32> = (0..PARTITIONS)
        .filter(|p| !revoked_ids.contains(p))
        .collect();
    assert_eq!(seen_a.owned(), kept, "a keeps the rest");
    let revocations = seen_a
        .events
        .iter()
        .filter(|(_, e)| {
            matches!(
                e,
                ConsumerEvent::RevokeRequested { .. } | ConsumerEvent::Lost { .. }
            )
        })
        .count();
    assert_eq!(
        revocations, 1,
        "the partitions a keeps were never revoked: {:?}",
        seen_a.events
    );
    a.close().await.expect("close");
    b.close().await.expect("close");
}

/// A subscription by regular expression, evaluated by the broker: the member reads
/// the topics the pattern matches and nothing of the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_regex_subscription_reads_the_matching_topics_only() {
    protocol_tests::init_tracing();
    let mock = MockCluster::new(3).expect("mock");
    mock.set_group_consumer_heartbeat_interval(Duration::from_millis(300))
        .expect("interval");
    let per_topic = 300;
    for topic in ["orders.eu", "orders.us", "payments"] {
        mock.create_topic(topic, 2, 1).expect("topic");
        produce(&mock.bootstrap(), topic, 2, 0, per_topic, "none")
            .await
            .expect("produce");
    }
    let mut consumer = Consumer::builder(&mock.bootstrap())
        .group_id("regex")
        .topic_regex("^orders\\..*")
        .offset_reset(OffsetReset::Earliest)
        .group_protocol(GroupProtocol::Consumer)
        .build()
        .await
        .expect("consumer");
    let mut read: BTreeMap<String, u64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while read.values().sum::<u64>() < 2 * per_topic && Instant::now() < deadline {
        if let Ok(batch) =
            tokio::time::timeout(Duration::from_millis(200), consumer.recv_batch(1000)).await
        {
            for r in batch.expect("records") {
                *read.entry(r.topic().to_string()).or_default() += 1;
            }
        }
    }
    // Anything of the other topic would show up now.
    if let Ok(batch) =
        tokio::time::timeout(Duration::from_millis(500), consumer.recv_batch(1000)).await
    {
        for r in batch.expect("records") {
            *read.entry(r.topic().to_string()).or_default() += 1;
        }
    }
    assert_eq!(
        read,
        BTreeMap::from([
            ("orders.eu".to_string(), per_topic),
            ("orders.us".to_string(), per_topic)
        ])
    );
    consumer.close().await.expect("close");
}

/// TOPIC_AUTHORIZATION_FAILED on the heartbeat (injected: the principal lost DESCRIBE
/// on the topic) reaches the application: `recv_batch` returns
/// `Error::GroupRetrying` naming the topic and the ACL, once per refusal. The member
/// is not closed and keeps its partitions; once the broker stops refusing (the ACL
/// granted again) it goes on, and every record is read once. Before, the refusal was
/// only logged and a consumer missing its ACL sat idle (issue 30, finding 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_topic_authorization_failed_is_returned_by_recv_and_the_member_goes_on() {
    const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    let records = 600;
    let mock = mock_with(records).await;
    let mut consumer = builder(&mock.bootstrap(), "topic-acl")
        .max_partition_fetch_bytes(512)
        .build()
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    until_owns_all(
        &mut consumer,
        &mut seen,
        Duration::from_secs(15),
        "never assigned",
    )
    .await;
    mock.push_request_errors(
        CONSUMER_GROUP_HEARTBEAT,
        &[TOPIC_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED],
    );
    let mut refusals = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while (seen.records.len() as u64) < records || refusals.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "{} records, refusals {refusals:?}",
            seen.records.len()
        );
        match tokio::time::timeout(Duration::from_millis(100), consumer.recv_batch(100)).await {
            Err(_) => {}
            Ok(Ok(batch)) => {
                for r in batch {
                    *seen.records.entry((r.partition(), r.offset())).or_default() += 1;
                }
            }
            Ok(Err(ottla::Error::GroupRetrying(e))) => refusals.push(e.to_string()),
            Ok(Err(e)) => panic!("not a retrying group error: {e}"),
        }
        while let Some(e) = consumer.try_event() {
            seen.events.push((Instant::now(), e));
        }
    }
    println!("topic ACL refused on the heartbeat: recv returned {refusals:?}");
    assert!(
        refusals
            .iter()
            .all(|r| r.contains(TOPIC) && r.contains("DESCRIBE")),
        "{refusals:?}"
    );
    let lost: Vec<_> = seen
        .events
        .iter()
        .filter(|(_, e)| matches!(e, ConsumerEvent::Lost { .. } | ConsumerEvent::Fatal(_)))
        .collect();
    assert!(lost.is_empty(), "the member kept its partitions: {lost:?}");
    assert_eq!(seen.owned().len(), PARTITIONS as usize);
    assert!(
        seen.records.values().all(|n| *n == 1),
        "no record read twice"
    );
    consumer.close().await.expect("close");
}

// ----- A coordinator whose broker goes silent (issue 30) -----
//
// The mock's form of a black hole: the coordinator's broker still takes requests but
// holds every answer for `SILENCE` (`MockCluster::set_rtt`), while the coordinator
// moves to another broker at the same moment, as the chaos runner's `silent` fault
// does. The member must notice, find the new coordinator and be a working member
// again; each test prints the time it took beside the Java client's bound for the
// same state (the Java member waits `request.timeout.ms` for any answer, then looks
// the coordinator up again, and has no session clock of its own).

/// The mock's consumer-group session, and the members' `session.timeout.ms`.
const SILENT_SESSION: Duration = Duration::from_secs(6);
/// The mock's consumer-group heartbeat interval.
const SILENT_INTERVAL: Duration = Duration::from_millis(500);
/// The members' `request.timeout.ms` (Java's bound in every state).
const SILENT_REQUEST: Duration = Duration::from_secs(5);
/// How long the old coordinator's broker holds its answers.
const SILENCE: Duration = Duration::from_secs(20);

async fn silent_mock(group: &str, records: u64) -> MockCluster {
    let mock = mock_with(records).await;
    mock.set_group_consumer_heartbeat_interval(SILENT_INTERVAL)
        .expect("interval");
    mock.set_group_consumer_session_timeout(SILENT_SESSION)
        .expect("session");
    mock.set_group_coordinator(group, 1).expect("coordinator");
    mock
}

fn silent_builder(mock: &MockCluster, group: &str) -> ConsumerBuilder {
    let client = ottla::ClientConfig::new(&mock.bootstrap()).with_request_timeout(SILENT_REQUEST);
    builder(&mock.bootstrap(), group)
        .client_config(client)
        .session_timeout(SILENT_SESSION)
        .heartbeat_interval(SILENT_INTERVAL)
}

/// Silences broker 1 (the coordinator) and moves the coordinator to broker 2; when.
fn silence(mock: &MockCluster, group: &str) -> Instant {
    mock.set_rtt(1, SILENCE).expect("rtt");
    mock.set_group_coordinator(group, 2).expect("move");
    Instant::now()
}

/// The first event at or after `since` that `pick` matches, and when.
fn first_after(
    seen: &Seen,
    since: Instant,
    pick: impl Fn(&ConsumerEvent) -> bool,
) -> Option<Instant> {
    seen.events
        .iter()
        .find(|(at, e)| *at >= since && pick(e))
        .map(|(at, _)| *at)
}

/// Stable: the heartbeat to the silent broker is given up after two of the broker's
/// intervals (Java waits `request.timeout.ms`), the new coordinator is found and
/// heartbeated with every field. If that takes longer than a session, the partitions
/// are given up first (the broker has expired the member meanwhile) and the member
/// rejoins; otherwise it keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_silent_coordinator_while_stable_is_left_within_the_java_bound() {
    let group = "silent-stable";
    let mock = silent_mock(group, 0).await;
    let mut a = silent_builder(&mock, group)
        .build()
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    until_owns_all(&mut a, &mut seen, Duration::from_secs(15), "never assigned").await;
    let silenced = silence(&mock, group);
    let deadline = silenced + Duration::from_secs(25);
    let found = loop {
        assert!(
            Instant::now() < deadline,
            "never found broker 2: {:?}",
            seen.events
        );
        read_for(&mut a, &mut seen, Duration::from_millis(100)).await;
        let found = seen
            .coordinators
            .iter()
            .find(|(at, node)| *at >= silenced && *node == 2)
            .map(|(at, _)| *at);
        if let Some(at) = found {
            break at;
        }
    };
    // Working again: heartbeating broker 2 with the partitions (kept, or back).
    until_owns_all(
        &mut a,
        &mut seen,
        Duration::from_secs(15),
        "never working again",
    )
    .await;
    let lapsed = first_after(&seen, silenced, |e| {
        matches!(
            e,
            ConsumerEvent::Lost {
                reason: LostReason::SessionLapsed,
                ..
            }
        )
    });
    println!(
        "consumer protocol, silent coordinator while stable: the new coordinator found after {:?}, {} (Java: the heartbeat waits request.timeout.ms = {SILENT_REQUEST:?}, then a lookup; partitions kept whatever the broker did)",
        found - silenced,
        match lapsed {
            Some(at) => format!(
                "partitions given up {:?} in (session {SILENT_SESSION:?})",
                at - silenced
            ),
            None => "partitions kept".into(),
        }
    );
    assert!(
        found - silenced <= SILENT_REQUEST + SILENT_INTERVAL * 2 + Duration::from_secs(2),
        "found after {:?}",
        found - silenced
    );
    if let Some(at) = lapsed {
        assert!(at - silenced <= SILENT_SESSION + Duration::from_secs(1));
    }
    mock.set_rtt(1, Duration::ZERO).expect("rtt");
    a.close().await.expect("close");
}

/// Joining: the coordinator's broker is silent from the start, so the member's join
/// heartbeat is held; the coordinator moves once the member has found the old one. The
/// join is given up after `request.timeout.ms` at most (before the first answer the
/// member knows no interval of the broker's), and the member joins at the new
/// coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_silent_coordinator_while_joining_is_left_within_the_java_bound() {
    let group = "silent-joining";
    let mock = silent_mock(group, 0).await;
    mock.set_rtt(1, SILENCE).expect("rtt");
    let silenced = Instant::now();
    let mut a = silent_builder(&mock, group)
        .build()
        .await
        .expect("consumer");
    let mut seen = Seen::default();
    let deadline = silenced + Duration::from_secs(25);
    let moved = loop {
        assert!(
            Instant::now() < deadline,
            "never found broker 1: {:?}",
            seen.events
        );
        read_for(&mut a, &mut seen, Duration::from_millis(5)).await;
        if seen.coordinators.iter().any(|(_, node)| *node == 1) {
            mock.set_group_coordinator(group, 2).expect("move");
            break Instant::now();
        }
    };
    while seen.owned().len() != PARTITIONS as usize {
        assert!(Instant::now() < deadline, "never joined: {:?}", seen.events);
        read_for(&mut a, &mut seen, Duration::from_millis(100)).await;
    }
    let took = Instant::now() - moved;
    let joined_at_1 = seen
        .events
        .iter()
        .any(|(at, e)| *at < moved && matches!(e, ConsumerEvent::Joined { .. }));
    assert!(!joined_at_1, "the join was answered: {:?}", seen.events);
    println!(
        "consumer protocol, silent coordinator while joining: assigned at the new coordinator {took:?} after the move ({:?} after the start) (Java: request.timeout.ms = {SILENT_REQUEST:?}, then a lookup and a join)",
        silenced.elapsed()
    );
    assert!(
        took <= SILENT_REQUEST * 2 + Duration::from_secs(3),
        "took {took:?}"
    );
    mock.set_rtt(1, Duration::ZERO).expect("rtt");
    a.close().await.expect("close");
}

/// Revoking: a member asked to give partitions back finishes while its coordinator
/// is silent. Its acknowledgement reaches the new coordinator, and the second member
/// is given the partitions only after the first gave them up (acknowledged, or lost
/// when a session passed without an answer): at no moment do both own one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_silent_coordinator_while_revoking_hands_over_without_a_double_owner() {
    let group = "silent-revoking";
    let mock = silent_mock(group, 0).await;
    let mut a = silent_builder(&mock, group)
        .manual_revocation()
        .build()
        .await
        .expect("consumer");
    let mut seen_a = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(15);
    while seen_a.owned().len() != PARTITIONS as usize {
        assert!(Instant::now() < deadline, "a never assigned");
        read_for(&mut a, &mut seen_a, Duration::from_millis(100)).await;
    }
    let mut b = silent_builder(&mock, group)
        .build()
        .await
        .expect("consumer");
    let mut seen_b = Seen::default();
    let deadline = Instant::now() + Duration::from_secs(15);
    let (epoch, revoked) = loop {
        assert!(Instant::now() < deadline, "a was never asked to give back");
        read_for(&mut a, &mut seen_a, Duration::from_millis(50)).await;
        read_for(&mut b, &mut seen_b, Duration::from_millis(50)).await;
        let asked = seen_a.events.iter().find_map(|(_, e)| match e {
            ConsumerEvent::RevokeRequested {
                generation,
                partitions,
                ..
            } => Some((*generation, partitions.clone())),
            _ => None,
        });
        if let Some(asked) = asked {
            break asked;
        }
    };
    let silenced = silence(&mock, group);
    // a's application finishes a second later, while the coordinator is silent.
    read_for(&mut a, &mut seen_a, Duration::from_millis(500)).await;
    read_for(&mut b, &mut seen_b, Duration::from_millis(500)).await;
    a.complete_revocation(epoch, revoked.clone());
    let released = Instant::now();
    let mut completed = 1;
    // Ownership over time, checked on every step: never one partition in both.
    let deadline = silenced + Duration::from_secs(30);
    loop {
        read_for(&mut a, &mut seen_a, Duration::from_millis(50)).await;
        read_for(&mut b, &mut seen_b, Duration::from_millis(50)).await;
        // Later revocations (a member whose session lapsed behind the silence rejoins,
        // and the broker rebalances again) are finished at once.
        let asked: Vec<(i32, Vec<_>)> = seen_a
            .events
            .iter()
            .filter_map(|(_, e)| match e {
                ConsumerEvent::RevokeRequested {
                    generation,
                    partitions,
                    ..
                } => Some((*generation, partitions.clone())),
                _ => None,
            })
            .collect();
        for (generation, partitions) in asked.into_iter().skip(completed) {
            a.complete_revocation(generation, partitions);
            completed += 1;
        }
        let (oa, ob) = (seen_a.owned(), seen_b.owned());
        assert!(
            oa.is_disjoint(&ob),
            "a owns {oa:?} and b {ob:?} at once\na: {:?}\nb: {:?}",
            seen_a.events,
            seen_b.events
        );
        if oa.len() + ob.len() == PARTITIONS as usize && !ob.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the handover never completed: a {oa:?}, b {ob:?}"
        );
    }
    let lapses = |seen: &Seen| {
        seen.events
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    ConsumerEvent::Lost {
                        reason: LostReason::SessionLapsed,
                        ..
                    }
                )
            })
            .count()
    };
    println!(
        "consumer protocol, silent coordinator while revoking: handover complete {:?} after the silence began, {:?} after a released; a owns {:?}, b {:?}; sessions lapsed behind the silence: a {}, b {} (Java: request.timeout.ms = {SILENT_REQUEST:?} before the acknowledgement is sent again, and no session clock)",
        Instant::now() - silenced,
        released.elapsed(),
        seen_a.owned(),
        seen_b.owned(),
        lapses(&seen_a),
        lapses(&seen_b)
    );
    mock.set_rtt(1, Duration::ZERO).expect("rtt");
    a.close().await.expect("close");
    b.close().await.expect("close");
}
