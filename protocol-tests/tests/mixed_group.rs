//! Mixed groups: ottla members share a group with members of other clients (the Python
//! `confluent-kafka` package, i.e. librdkafka, and `kafka-python`), under `range`,
//! `roundrobin` and `cooperative-sticky`, on the librdkafka mock cluster and on tansu.
//! Every partition must end up owned exactly once across all the clients. On KIP-848's
//! consumer group protocol (confluent-kafka only), every record must also be read
//! exactly once.
//!
//! Needs `bash scripts/install-peers.sh`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, GroupProtocol, OffsetReset};
use protocol_tests::group_app::{MemberOptions, TestMember};
use protocol_tests::mock::MockCluster;
use protocol_tests::pyclient::{PyClient, PyMember};
use protocol_tests::tansu::Tansu;

const TOPIC: &str = "mixed";
const PARTITIONS: i32 = 12;
/// The KIP-848 test's topic.
const TOPIC_848: &str = "mixed-848";
/// JoinGroup's API key (the classic protocol's join).
const JOIN_GROUP: i16 = 11;
/// ConsumerGroupHeartbeat's API key (KIP-848).
const CONSUMER_GROUP_HEARTBEAT: i16 = 68;

async fn mixed(
    bootstrap: &str,
    client: PyClient,
    strategy: &'static str,
    api_version: Option<&str>,
) {
    let group = format!("mixed-{client}-{strategy}-{}", std::process::id());
    let spawn = |name: &str| {
        let mut b = PyMember::builder(client, bootstrap, &group, &[TOPIC], strategy)
            .session_timeout(Duration::from_secs(6))
            .heartbeat(Duration::from_millis(500))
            .client_id(name);
        if let Some(v) = api_version {
            b = b.api_version(v).assign_delay(Duration::from_millis(150));
        }
        b.spawn().expect("python member")
    };
    let options = MemberOptions {
        assignor: strategy,
        ..MemberOptions::default()
    };
    let o1 = TestMember::start(bootstrap, &group, &[TOPIC], options.clone())
        .await
        .unwrap();
    let p1 = spawn("py-1");
    let o2 = TestMember::start(bootstrap, &group, &[TOPIC], options)
        .await
        .unwrap();
    let p2 = spawn("py-2");

    let all: BTreeSet<(String, i32)> = (0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    loop {
        let ottla: Vec<BTreeSet<(String, i32)>> = [&o1, &o2]
            .iter()
            .map(|m| {
                m.owned()
                    .into_iter()
                    .map(|tp| (tp.topic, tp.partition))
                    .collect()
            })
            .collect();
        let python = [p1.assignment(), p2.assignment()];
        let sets: Vec<&BTreeSet<(String, i32)>> = ottla.iter().chain(python.iter()).collect();
        let total: usize = sets.iter().map(|s| s.len()).sum();
        let union: BTreeSet<(String, i32)> = sets.iter().flat_map(|s| s.iter().cloned()).collect();
        let sizes: Vec<usize> = sets.iter().map(|s| s.len()).collect();
        if union == all && total == all.len() && sizes.iter().all(|n| *n == 3) {
            eprintln!(
                "{client} {strategy}: every partition owned once, 3 each, after {:?}",
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{client} {strategy}: not converged: sizes {sizes:?}, union {} of {}, total {total}\npy-1: {:#?}\npy-2: {:#?}",
            union.len(),
            all.len(),
            p1.lines(),
            p2.lines()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = p1.close();
    let _ = p2.close();
    o1.stop().await;
    o2.stop().await;
}

fn mock() -> MockCluster {
    let m = MockCluster::new(3).expect("mock");
    m.cap_group_apis().expect("caps");
    m.set_group_initial_rebalance_delay(Duration::from_millis(1500));
    m.create_topic(TOPIC, PARTITIONS, 1).expect("topic");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_confluent_range() {
    let m = mock();
    mixed(&m.bootstrap(), PyClient::Confluent, "range", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_confluent_roundrobin() {
    let m = mock();
    mixed(&m.bootstrap(), PyClient::Confluent, "roundrobin", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_confluent_cooperative_sticky() {
    let m = mock();
    mixed(
        &m.bootstrap(),
        PyClient::Confluent,
        "cooperative-sticky",
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_kafka_python_range() {
    let m = mock();
    mixed(
        &m.bootstrap(),
        PyClient::KafkaPython,
        "range",
        Some("2.0.0"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_kafka_python_roundrobin() {
    let m = mock();
    mixed(
        &m.bootstrap(),
        PyClient::KafkaPython,
        "roundrobin",
        Some("2.0.0"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_ottla_and_confluent_range() {
    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, PARTITIONS).unwrap();
    mixed(&t.bootstrap(), PyClient::Confluent, "range", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_ottla_and_confluent_roundrobin() {
    let t = Tansu::start().unwrap();
    t.create_topic(TOPIC, PARTITIONS).unwrap();
    mixed(&t.bootstrap(), PyClient::Confluent, "roundrobin", None).await;
}

// ----- KIP-848: the consumer group protocol -----

/// What every member of the KIP-848 mixed group read: `(member, partition, offset)`.
type Reads = Arc<Mutex<Vec<(String, i32, i64)>>>;

/// An ottla member on the consumer protocol, reading in its own task until told to
/// stop, then closing (which commits what it read and leaves).
struct OttlaReader {
    name: String,
    owned: Arc<Mutex<BTreeSet<(String, i32)>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl OttlaReader {
    async fn start(bootstrap: &str, group: &str, name: &str, reads: Reads) -> Self {
        let mut consumer = Consumer::builder(bootstrap)
            .client_id(name)
            .group_id(group)
            .topics([TOPIC_848])
            .group_protocol(GroupProtocol::Consumer)
            .offset_reset(OffsetReset::Earliest)
            .auto_commit(Some(Duration::from_millis(500)))
            .fetch_max_wait(Duration::from_millis(100))
            .build()
            .await
            .expect("ottla consumer");
        let owned = Arc::new(Mutex::new(BTreeSet::new()));
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let (mine, who) = (owned.clone(), name.to_string());
        let task = tokio::spawn(async move {
            // The assignment is sampled between batches, and at least every 50 ms.
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {}
                    batch = consumer.recv_batch(500) => {
                        let batch = batch.unwrap_or_else(|e| panic!("{who}: {e}"));
                        let mut reads = reads.lock().unwrap();
                        for r in &batch {
                            reads.push((who.clone(), r.partition(), r.offset()));
                        }
                    }
                }
                *mine.lock().unwrap() = consumer
                    .assignment()
                    .into_iter()
                    .map(|tp| (tp.topic, tp.partition))
                    .collect();
            }
            consumer.close().await.expect("close commits and leaves");
            mine.lock().unwrap().clear();
        });
        Self {
            name: name.to_string(),
            owned,
            stop: Some(stop),
            task,
        }
    }

    fn owned(&self) -> BTreeSet<(String, i32)> {
        self.owned.lock().unwrap().clone()
    }

    async fn close(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .unwrap_or_else(|_| panic!("{} did not close within 30 s", self.name))
            .expect("member task");
    }
}

/// Writes 120 records (10 per partition) every 100 ms, record `i` to partition
/// `i % PARTITIONS`, until told to stop; returns how many it wrote.
fn steady_producer(
    bootstrap: &str,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<u64>,
) {
    let producer =
        protocol_tests::data::producer(bootstrap, "none", &[("linger.ms", "5")]).expect("producer");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut written = 0;
        while !*stopped.borrow() {
            protocol_tests::data::produce_with(&producer, TOPIC_848, PARTITIONS, written, 120)
                .await
                .expect("produce");
            written += 120;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        written
    });
    (stop, task)
}

/// Waits until the members own every partition exactly once between them, `sizes`
/// each (in the order given: ottla's, then the Python members').
async fn owned_once(
    what: &str,
    ottla: &[&OttlaReader],
    python: &[&PyMember],
    sizes: &[usize],
    within: Duration,
) {
    let all: BTreeSet<(String, i32)> = (0..PARTITIONS)
        .map(|p| (TOPIC_848.to_string(), p))
        .collect();
    let started = Instant::now();
    loop {
        let sets: Vec<BTreeSet<(String, i32)>> = ottla
            .iter()
            .map(|m| m.owned())
            .chain(python.iter().map(|m| m.assignment()))
            .collect();
        let total: usize = sets.iter().map(BTreeSet::len).sum();
        let union: BTreeSet<(String, i32)> = sets.iter().flatten().cloned().collect();
        let have: Vec<usize> = sets.iter().map(BTreeSet::len).collect();
        if union == all && total == all.len() && have == sizes {
            eprintln!(
                "{what}: every partition owned once, {sizes:?}, after {:?}",
                started.elapsed()
            );
            // Some reading in this split before the next change.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        if started.elapsed() > within {
            let lines: Vec<String> = python
                .iter()
                .map(|p| format!("{p:?}:\n  {}", p.lines().join("\n  ")))
                .collect();
            panic!(
                "{what}: not converged within {within:?}: sizes {have:?} (want {sizes:?}), union {} of {}, total {total}\n{}",
                union.len(),
                all.len(),
                lines.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// KIP-848 on the librdkafka 2.12.1 mock: ottla members and confluent-kafka members
/// (librdkafka 2.16.0), all with `group.protocol=consumer`, share one group while a
/// producer writes steadily. Members join one by one (ottla, Python, ottla, Python)
/// until each owns 3 of the 12 partitions, then one of each client leaves. After
/// every step every partition is owned exactly once across the clients; at the end,
/// every record written was read exactly once, by one client or the other: each
/// member commits what it read when it gives a partition back (ottla's automatic
/// commit at revocation, the Python member's synchronous commit in its revocation
/// callback), and the mock hands a partition over only once its owner acknowledged
/// the revocation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ottla_and_confluent_consumer_protocol_nothing_lost_or_repeated() {
    protocol_tests::init_tracing();
    let m = MockCluster::new(3).expect("mock");
    m.set_group_consumer_heartbeat_interval(Duration::from_millis(500))
        .expect("interval");
    m.set_group_consumer_session_timeout(Duration::from_secs(6))
        .expect("session");
    m.create_topic(TOPIC_848, PARTITIONS, 1).expect("topic");
    // To check below that nobody fell back to the classic protocol.
    m.start_request_tracking();
    let bootstrap = m.bootstrap();
    let group = format!("mixed-848-{}", std::process::id());
    let reads: Reads = Arc::default();
    let python = |name: &str| {
        PyMember::consumer_protocol_builder(PyClient::Confluent, &bootstrap, &group, &[TOPIC_848])
            .client_id(name)
            .report_records()
            .spawn()
            .expect("python member")
    };
    let (stop_producing, producer) = steady_producer(&bootstrap);
    let step = Duration::from_secs(30);

    let o1 = OttlaReader::start(&bootstrap, &group, "ottla-1", reads.clone()).await;
    owned_once("ottla-1 alone", &[&o1], &[], &[12], step).await;
    let p1 = python("py-1");
    owned_once("ottla-1, py-1", &[&o1], &[&p1], &[6, 6], step).await;
    let o2 = OttlaReader::start(&bootstrap, &group, "ottla-2", reads.clone()).await;
    owned_once("+ ottla-2", &[&o1, &o2], &[&p1], &[4, 4, 4], step).await;
    let p2 = python("py-2");
    owned_once("+ py-2", &[&o1, &o2], &[&p1, &p2], &[3, 3, 3, 3], step).await;
    // The first of each leaves: their partitions go to the two that stay.
    let mut p1 = p1;
    tokio::task::block_in_place(|| p1.leave_and_exit()).expect("py-1 commits, leaves and exits");
    o1.close().await;
    owned_once("ottla-1 and py-1 gone", &[&o2], &[&p2], &[6, 6], step).await;
    // Let the last records be read, then close the rest (each commits and leaves).
    let _ = stop_producing.send(true);
    let written = producer.await.expect("producer");
    let per_partition = written / PARTITIONS as u64;
    let everything = |p2: &PyMember| {
        let mut all = reads.lock().unwrap().clone();
        for (who, p) in [("py-1", &p1), ("py-2", p2)] {
            let records = p.records().into_iter();
            all.extend(records.map(|(_, partition, offset)| (who.to_string(), partition, offset)));
        }
        all
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let mut next = [0u64; PARTITIONS as usize];
        for (_, p, o) in everything(&p2) {
            next[p as usize] = next[p as usize].max(o as u64 + 1);
        }
        if next.iter().all(|n| *n >= per_partition) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A little longer: a record read twice would show up now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut p2 = p2;
    tokio::task::block_in_place(|| p2.leave_and_exit()).expect("py-2 commits, leaves and exits");
    o2.close().await;

    let requests = m.requests();
    let count = |key: i16| requests.iter().filter(|r| r.api_key == key).count();
    let (joins, heartbeats) = (count(JOIN_GROUP), count(CONSUMER_GROUP_HEARTBEAT));
    assert_eq!(joins, 0, "a member joined with the classic protocol");
    assert!(heartbeats > 0, "no ConsumerGroupHeartbeat reached the mock");

    let all = everything(&p2);
    let mut readers: BTreeMap<(i32, i64), Vec<String>> = BTreeMap::new();
    let mut per_member: BTreeMap<String, usize> = BTreeMap::new();
    for (who, p, o) in all {
        *per_member.entry(who.clone()).or_default() += 1;
        readers.entry((p, o)).or_default().push(who);
    }
    eprintln!("{written} records written; read per member {per_member:?}");
    assert_eq!(
        per_member.len(),
        4,
        "every member read records: {per_member:?}"
    );
    let repeated: Vec<_> = readers.iter().filter(|(_, who)| who.len() > 1).collect();
    assert!(
        repeated.is_empty(),
        "{} records read more than once, e.g. {:?}",
        repeated.len(),
        &repeated[..repeated.len().min(10)]
    );
    let missing: Vec<(i32, i64)> = (0..PARTITIONS)
        .flat_map(|p| (0..per_partition as i64).map(move |o| (p, o)))
        .filter(|k| !readers.contains_key(k))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {written} records never read, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert_eq!(
        readers.len() as u64,
        written,
        "no record beyond those written"
    );
}

// ----- Joining a group of librdkafka members (docs/migrating.md) -----

/// A librdkafka consumer in this process (the `rdkafka` crate) with librdkafka's
/// default `partition.assignment.strategy`, `range,roundrobin`, polling on its own
/// thread until dropped. `owned` is its assignment's size.
struct RdMember {
    owned: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RdMember {
    fn start(bootstrap: &str, group: &str, topic: &str) -> Self {
        use rdkafka::consumer::{BaseConsumer, Consumer as _};
        use std::sync::atomic::Ordering;
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("client.id", "librdkafka-member")
            .set("partition.assignment.strategy", "range,roundrobin")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .create()
            .expect("librdkafka consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let owned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (o, s) = (owned.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = consumer.poll(Duration::from_millis(100));
                let n = consumer.assignment().map(|a| a.count()).unwrap_or(0);
                o.store(n, Ordering::Relaxed);
            }
            consumer.unsubscribe();
        });
        Self {
            owned,
            stop,
            thread: Some(thread),
        }
    }

    fn owned(&self) -> usize {
        self.owned.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for RdMember {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until `check` holds, for up to `within`.
async fn until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `error` is the INCONSISTENT_GROUP_PROTOCOL failure naming `offered` and
/// the guide.
fn names_assignors_and_guide(error: &ottla::Error, offered: &[&str]) {
    use ottla::proto::group::member::GroupError;
    let ottla::Error::Group(GroupError::InconsistentGroupProtocol { offered: got, .. }) = error
    else {
        panic!("not INCONSISTENT_GROUP_PROTOCOL: {error:?}");
    };
    assert_eq!(got, offered);
    let message = error.to_string();
    for words in [
        "INCONSISTENT_GROUP_PROTOCOL",
        &format!("({})", offered.join(",")),
        "partition.assignment.strategy",
        "docs/migrating.md",
    ] {
        assert!(message.contains(words), "{words:?} missing from: {message}");
    }
}

/// ottla's default (`cooperative-sticky`) shares no assignor with a librdkafka member
/// on its default (`range,roundrobin`): tansu answers INCONSISTENT_GROUP_PROTOCOL, and
/// `recv` returns it naming the assignors ottla offered and docs/migrating.md. The
/// guide's first step, `range` first and `cooperative-sticky` second, then shares the
/// group: both members own half. (The librdkafka mock cannot show the refusal: its
/// `rdkafka_mock_cgrp.c` never compares protocols; it takes the leader's first one and
/// `rd_assert`s that every member's first is the same. The next test injects the
/// error there instead. Neither peer can show the guide's second step, the move to
/// `cooperative-sticky`: tansu keeps the assignor its group's first member listed first
/// and refuses every member that does not offer it, and the mock asserts that every
/// member lists the same assignor first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_ottla_default_assignor_joining_a_librdkafka_group_names_the_assignors_and_the_guide()
{
    const T: &str = "mixed-upgrade";
    let t = Tansu::start().unwrap();
    t.create_topic(T, 4).unwrap();
    let group = format!("mixed-upgrade-{}", std::process::id());
    let rd = RdMember::start(&t.bootstrap(), &group, T);
    until(
        Duration::from_secs(30),
        "librdkafka member owns all 4",
        || rd.owned() == 4,
    )
    .await;

    let consumer = |b: ottla::ConsumerBuilder| {
        b.group_id(&group)
            .topics([T])
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(500))
    };
    let mut refused = consumer(Consumer::builder(&t.bootstrap()))
        .build()
        .await
        .unwrap();
    let Ok(Some(Err(error))) = tokio::time::timeout(Duration::from_secs(30), refused.recv()).await
    else {
        panic!("the default consumer was not refused");
    };
    names_assignors_and_guide(&error, &["cooperative-sticky"]);
    assert_eq!(rd.owned(), 4, "the librdkafka member keeps its partitions");
    drop(refused);

    let mut joined = consumer(Consumer::builder(&t.bootstrap()))
        .assignors(["range", "cooperative-sticky"])
        .unwrap()
        .build()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    while !(joined.assignment().len() == 2 && rd.owned() == 2) {
        assert!(
            Instant::now() < deadline,
            "not shared: ottla {:?}, librdkafka {}",
            joined.assignment(),
            rd.owned()
        );
        if let Ok(Some(Err(e))) =
            tokio::time::timeout(Duration::from_millis(100), joined.recv()).await
        {
            panic!("range,cooperative-sticky refused: {e}");
        }
    }
    let first = joined_protocols(&mut joined);
    assert_eq!(first.last().map(String::as_str), Some("range"), "{first:?}");
    let _ = joined.close().await;
    drop(rd);
}

/// The assignors the group chose in the generations `consumer` joined since the last
/// call (`Event::Joined`).
fn joined_protocols(consumer: &mut Consumer) -> Vec<String> {
    use ottla::consumer::ConsumerEvent;
    use ottla::proto::group::member::Event;
    let mut out = Vec::new();
    while let Some(event) = consumer.try_event() {
        if let ConsumerEvent::Group(Event::Joined { protocol, .. }) = event {
            out.push(protocol);
        }
    }
    out
}

/// The same failure through the librdkafka mock, with the error injected (the mock
/// itself never refuses a join; see above): the consumer's `recv` names the
/// assignors offered, in order, and the guide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_join_inconsistent_group_protocol_names_the_offered_assignors_and_the_guide() {
    let m = mock();
    m.push_request_errors(JOIN_GROUP, &[23]);
    let mut consumer = Consumer::builder(&m.bootstrap())
        .group_id(format!("mixed-inconsistent-{}", std::process::id()))
        .topics([TOPIC])
        .assignors(["cooperative-sticky", "range"])
        .unwrap()
        .build()
        .await
        .unwrap();
    let Ok(Some(Err(error))) = tokio::time::timeout(Duration::from_secs(20), consumer.recv()).await
    else {
        panic!("no INCONSISTENT_GROUP_PROTOCOL from recv");
    };
    names_assignors_and_guide(&error, &["cooperative-sticky", "range"]);
    assert!(
        consumer.recv().await.is_none(),
        "fatal and sticky: the consumer stops"
    );
}
