//! The public `Consumer` against real peers: records written by librdkafka (through
//! rdkafka, in test code only) under every codec, read by groups of one and three
//! ottla consumers, byte-identical, with no gaps and no duplicates; pause and resume;
//! leader moves; offset resets. On the librdkafka mock cluster and on tansu.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::Error;
use ottla::consumer::{
    Consumer, ConsumerBuilder, ConsumerEvent, FetchError, GroupProtocol, IsolationLevel,
    OffsetReset, ResetReason, TopicPartition,
};
use protocol_tests::data::{index_of, matches, produce};
use protocol_tests::peer::Peer;

/// `OTTLA_FIDELITY_RECORDS` overrides the record count of the fidelity suites
/// (default 100,000 per codec, as the issue asks).
fn fidelity_records() -> u64 {
    protocol_tests::env_number("OTTLA_FIDELITY_RECORDS", 100_000)
}

fn mock() -> Peer {
    let peer = Peer::mock(3).expect("mock cluster");
    if let Peer::Mock(m) = &peer {
        m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    }
    peer
}

/// A builder with the settings each peer needs (see PEERS.md).
fn builder(peer: &Peer) -> ConsumerBuilder {
    let b = Consumer::builder(&peer.bootstrap())
        .offset_reset(OffsetReset::Earliest)
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .max_poll_interval(Duration::from_secs(20));
    match peer {
        // The mock's SyncGroup race: let followers' SyncGroups in first.
        Peer::Mock(_) => b.tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50)),
        _ => b,
    }
}

#[derive(Debug, Default)]
struct Tally {
    seen: HashMap<(i32, i64), u32>,
    unique: u64,
    duplicates: u64,
    mismatched: Vec<String>,
    per_member: Vec<u64>,
}

impl Tally {
    /// Counts member `m`'s batch, checking each record against what was written.
    fn add(&mut self, m: usize, batch: &[ottla::ConsumerRecord], partitions: i32, total: u64) {
        for r in batch {
            let i = index_of(r.partition(), r.offset(), partitions);
            let count = self.seen.entry((r.partition(), r.offset())).or_insert(0);
            *count += 1;
            if *count == 1 {
                self.unique += 1;
            } else {
                self.duplicates += 1;
            }
            self.per_member[m] += 1;
            let good = i < total && matches(i, r.key(), r.value(), &r.headers_owned());
            if !good && self.mismatched.len() < 5 {
                self.mismatched.push(format!(
                    "{}/{}@{}: {r:?}",
                    r.topic(),
                    r.partition(),
                    r.offset()
                ));
            }
        }
    }
}

/// Consumes `total` records of a fresh `topic` with `members` consumers of one group,
/// checking each against what was written. Stops when every record was seen, then
/// waits a moment for stragglers that would be duplicates.
async fn consume_group(
    peer: &Peer,
    group: &str,
    topic: &str,
    partitions: i32,
    total: u64,
    members: usize,
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally {
        per_member: vec![0; members],
        ..Tally::default()
    }));
    let mut handles = Vec::new();
    for m in 0..members {
        let consumer = builder(peer)
            .group_id(group)
            .topics([topic])
            .client_id(format!("ottla-{m}"))
            .auto_commit(Some(Duration::from_secs(1)))
            .build()
            .await
            .expect("consumer");
        let tally = tally.clone();
        handles.push(tokio::spawn(member_loop(
            consumer, m, tally, total, partitions,
        )));
    }
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let unique = tally.lock().unwrap().unique;
        if unique >= total || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Duplicates would show up now.
    tokio::time::sleep(Duration::from_millis(700)).await;
    for h in &handles {
        h.abort();
    }
    for h in handles {
        let _ = h.await;
    }
    Arc::try_unwrap(tally)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_else(|a| std::mem::take(&mut *a.lock().unwrap()))
}

async fn member_loop(
    mut consumer: Consumer,
    m: usize,
    tally: Arc<Mutex<Tally>>,
    total: u64,
    partitions: i32,
) {
    loop {
        let batch =
            match tokio::time::timeout(Duration::from_millis(200), consumer.recv_batch(2000)).await
            {
                Err(_) => continue,
                Ok(Ok(batch)) => batch,
                Ok(Err(e)) => panic!("member {m}: {e}"),
            };
        tally.lock().unwrap().add(m, &batch, partitions, total);
    }
}

fn check(t: &Tally, total: u64, partitions: i32, what: &str) {
    check_with(t, total, partitions, what, false);
}

fn check_with(t: &Tally, total: u64, partitions: i32, what: &str, allow_duplicates: bool) {
    assert!(
        t.mismatched.is_empty(),
        "{what}: records differ: {:?}",
        t.mismatched
    );
    assert_eq!(t.unique, total, "{what}: records seen");
    if !allow_duplicates {
        assert_eq!(t.duplicates, 0, "{what}: duplicates");
    }
    // No gaps: every partition holds offsets 0..n exactly.
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, o) in t.seen.keys() {
        by_partition.entry(*p).or_default().push(*o);
    }
    for (p, mut offsets) in by_partition {
        offsets.sort_unstable();
        let n = offsets.len() as i64;
        assert_eq!(
            offsets.first().copied(),
            Some(0),
            "{what}: partition {p} starts at 0"
        );
        assert_eq!(
            offsets.last().copied(),
            Some(n - 1),
            "{what}: partition {p} has a gap"
        );
    }
    let _ = partitions;
}

async fn fidelity(peer: Peer, codec: &str) {
    protocol_tests::init_tracing();
    let total = fidelity_records();
    let partitions = 6;
    let topic = format!("fidelity-{codec}");
    peer.create_topic(&topic, partitions).expect("topic");
    let started = Instant::now();
    produce(&peer.bootstrap(), &topic, partitions, 0, total, codec)
        .await
        .expect("produce");
    let produced = started.elapsed();
    for members in [1, 3] {
        let started = Instant::now();
        let group = format!("fidelity-{codec}-{members}");
        let t = consume_group(&peer, &group, &topic, partitions, total, members).await;
        println!(
            "{} {codec}: {total} records produced in {produced:?}; group of {members} read them in {:?} (per member {:?})",
            peer.name(),
            started.elapsed(),
            t.per_member
        );
        check(
            &t,
            total,
            partitions,
            &format!("{} {codec} group of {members}", peer.name()),
        );
        if members == 3 {
            assert!(
                t.per_member.iter().filter(|n| **n > 0).count() >= 2,
                "the work was shared: {:?}",
                t.per_member
            );
        }
    }
}

macro_rules! fidelity_tests {
    ($($name:ident: $peer:expr, $codec:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            fidelity($peer, $codec).await;
        }
    )*};
}

fidelity_tests! {
    mock_fidelity_none: mock(), "none";
    mock_fidelity_gzip: mock(), "gzip";
    mock_fidelity_snappy: mock(), "snappy";
    mock_fidelity_lz4: mock(), "lz4";
    mock_fidelity_zstd: mock(), "zstd";
    tansu_fidelity_none: Peer::tansu().expect("tansu"), "none";
    tansu_fidelity_gzip: Peer::tansu().expect("tansu"), "gzip";
    tansu_fidelity_snappy: Peer::tansu().expect("tansu"), "snappy";
    tansu_fidelity_lz4: Peer::tansu().expect("tansu"), "lz4";
    tansu_fidelity_zstd: Peer::tansu().expect("tansu"), "zstd";
}

// ----- corruption through the wire layer -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_corruption_on_the_wire_is_a_typed_error() {
    protocol_tests::init_tracing();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = listener.local_addr().unwrap().to_string();
    let tansu = protocol_tests::Tansu::start_advertising(Some(&proxy_addr)).expect("tansu");
    let upstream: std::net::SocketAddr = tansu.bootstrap().parse().unwrap();
    // Fetch responses with data get a byte flipped 20 bytes before their end: inside
    // the last record of the last batch (3 bytes of tagged fields follow the records).
    let proxy = protocol_tests::proxy::CorruptingProxy::start(listener, upstream, 300, 20);
    tansu.create_topic("corrupt", 1).expect("topic");
    // Small batches, so that good ones come before the corrupted one.
    let producer = protocol_tests::data::producer(
        &proxy.address(),
        "none",
        &[("linger.ms", "0"), ("batch.num.messages", "20")],
    )
    .expect("producer");
    protocol_tests::data::produce_with(&producer, "corrupt", 1, 0, 500)
        .await
        .expect("produce");
    let tp = TopicPartition::new("corrupt", 0);
    let mut consumer = Consumer::builder(&proxy.address())
        .assign([tp.clone()])
        .offset_reset(OffsetReset::Earliest)
        .build()
        .await
        .expect("consumer");
    let mut delivered = Vec::new();
    let error = loop {
        match tokio::time::timeout(Duration::from_secs(20), consumer.recv()).await {
            Ok(Some(Ok(r))) => {
                assert!(matches(
                    r.offset() as u64,
                    r.key(),
                    r.value(),
                    &r.headers_owned()
                ));
                delivered.push(r.offset());
            }
            Ok(Some(Err(e))) => break e,
            Ok(None) => panic!("the consumer stopped"),
            Err(_) => panic!("no error within 20 s; delivered {}", delivered.len()),
        }
    };
    let Error::Fetch(FetchError::Corrupt {
        topic,
        partition,
        offset,
        source,
    }) = &error
    else {
        panic!("expected a corrupt-batch error, got {error}");
    };
    println!("corruption reported as: {error}");
    assert_eq!((topic.as_str(), *partition), ("corrupt", 0));
    assert!(proxy.corrupted() >= 1);
    assert!(
        source.to_string().to_lowercase().contains("crc"),
        "{source}"
    );
    // Everything before the bad batch was delivered, in order, and nothing after it.
    let expected: Vec<i64> = (0..*offset).collect();
    assert_eq!(delivered, expected);
    assert!(*offset > 0, "good batches came first");
    assert_eq!(
        consumer.position(&tp),
        Some(*offset),
        "the position stays at the batch"
    );
}

// ----- pause and resume -----

async fn pause_resume(peer: Peer, hold: Duration) {
    protocol_tests::init_tracing();
    let topic = "pause";
    peer.create_topic(topic, 2).expect("topic");
    produce(&peer.bootstrap(), topic, 2, 0, 2000, "lz4")
        .await
        .expect("produce");
    let mut consumer = builder(&peer)
        .group_id(format!("pause-{}", peer.name()))
        .topics([topic])
        .max_partition_fetch_bytes(4096)
        .build()
        .await
        .expect("consumer");
    let (p0, p1) = (TopicPartition::new(topic, 0), TopicPartition::new(topic, 1));
    let mut counts: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    let recv = async |c: &mut Consumer, counts: &mut BTreeMap<i32, Vec<i64>>, wait: Duration| {
        match tokio::time::timeout(wait, c.recv()).await {
            Ok(Some(Ok(r))) => {
                counts.entry(r.partition()).or_default().push(r.offset());
                true
            }
            Ok(Some(Err(e))) => panic!("{e}"),
            Ok(None) => panic!("stopped"),
            Err(_) => false,
        }
    };
    // Read until partition 0 has delivered something, then pause it.
    while counts.get(&0).is_none_or(|v| v.is_empty()) {
        assert!(
            recv(&mut consumer, &mut counts, Duration::from_secs(30)).await,
            "no record"
        );
    }
    consumer.pause(std::slice::from_ref(&p0));
    assert_eq!(consumer.paused(), vec![p0.clone()]);
    let held = counts[&0].len();
    // Partition 1 keeps flowing to its end while partition 0 stays still.
    while counts.get(&1).map_or(0, Vec::len) < 1000 {
        assert!(
            recv(&mut consumer, &mut counts, Duration::from_secs(30)).await,
            "partition 1 stalled at {:?}",
            counts.get(&1).map(Vec::len)
        );
    }
    let started = Instant::now();
    while started.elapsed() < hold {
        recv(&mut consumer, &mut counts, Duration::from_millis(200)).await;
    }
    assert_eq!(
        counts[&0].len(),
        held,
        "a paused partition delivered records"
    );
    // Heartbeats went on: nothing was lost or revoked while paused.
    while let Some(event) = consumer.try_event() {
        assert!(!matches!(event, ConsumerEvent::Lost { .. }), "{event:?}");
    }
    assert!(consumer.assignment().contains(&p0), "still assigned");
    assert_eq!(consumer.position(&p0), Some(held as i64));
    assert_eq!(consumer.lag(&p1), Some(0));
    consumer.resume(std::slice::from_ref(&p0));
    while counts[&0].len() < 1000 {
        assert!(
            recv(&mut consumer, &mut counts, Duration::from_secs(30)).await,
            "no resume"
        );
    }
    for (p, offsets) in &counts {
        let expected: Vec<i64> = (0..1000).collect();
        assert_eq!(
            offsets, &expected,
            "partition {p}: every offset once, in order"
        );
    }
    consumer.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_pause_holds_one_partition_while_the_other_flows() {
    // Paused for longer than the session timeout (6 s): heartbeats must go on.
    pause_resume(mock(), Duration::from_secs(7)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_pause_holds_one_partition_while_the_other_flows() {
    pause_resume(Peer::tansu().expect("tansu"), Duration::from_secs(1)).await;
}

// ----- leader moves -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_leader_moves_during_consumption_lose_nothing() {
    protocol_tests::init_tracing();
    let m = protocol_tests::MockCluster::new(3).expect("mock");
    m.cap_group_apis().expect("cap");
    m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    let topic = "moving";
    let partitions = 3;
    m.create_topic(topic, partitions, 3).expect("topic");
    let peer = Peer::Mock(m);
    let total: u64 = 30_000;
    let tally = Arc::new(Mutex::new(Tally {
        per_member: vec![0],
        ..Tally::default()
    }));
    let consumer = builder(&peer)
        .group_id("moving")
        .topics([topic])
        .max_partition_fetch_bytes(8192)
        .build()
        .await
        .expect("consumer");
    let member = tokio::spawn(member_loop(consumer, 0, tally.clone(), total, partitions));
    let bootstrap = peer.bootstrap();
    let producer = tokio::spawn(async move {
        for chunk in 0..10u64 {
            produce(&bootstrap, topic, partitions, chunk * 3000, 3000, "snappy")
                .await
                .expect("produce");
        }
    });
    let Peer::Mock(m) = &peer else { unreachable!() };
    let mut moves = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while tally.lock().unwrap().unique < total && Instant::now() < deadline {
        let p = moves % partitions;
        let broker = m.broker_ids()[(moves as usize / partitions as usize) % 3];
        m.partition_set_leader(topic, p, broker)
            .expect("move leader");
        moves += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    producer.await.expect("producer");
    tokio::time::sleep(Duration::from_millis(700)).await;
    member.abort();
    let _ = member.await;
    let t = std::mem::take(&mut *tally.lock().unwrap());
    println!("{moves} leader moves during consumption");
    assert!(
        moves >= 5,
        "the leaders moved during consumption ({moves} moves)"
    );
    check(&t, total, partitions, "leader moves");
}

// ----- offset resets -----

async fn first_record_and_reset(
    c: &mut Consumer,
) -> (i64, Option<(TopicPartition, ResetReason, i64)>) {
    let r = tokio::time::timeout(Duration::from_secs(30), c.recv())
        .await
        .expect("a record")
        .expect("open")
        .expect("ok");
    let mut reset = None;
    while let Some(event) = c.try_event() {
        if let ConsumerEvent::OffsetReset {
            partition,
            reason,
            offset,
            ..
        } = event
        {
            reset = Some((partition, reason, offset));
        }
    }
    (r.offset(), reset)
}

/// Resets: no committed offset (earliest), a committed offset past the log end
/// (OFFSET_OUT_OF_RANGE, where the peer reports it), and `none`.
async fn offset_resets(peer: Peer, reports_out_of_range: bool) {
    protocol_tests::init_tracing();
    let topic = "reset";
    peer.create_topic(topic, 1).expect("topic");
    produce(&peer.bootstrap(), topic, 1, 0, 100, "none")
        .await
        .expect("produce");
    let tp = TopicPartition::new(topic, 0);
    let group = format!("reset-{}", peer.name());
    // No committed offset: earliest.
    let mut first = builder(&peer)
        .group_id(&group)
        .topics([topic])
        .build()
        .await
        .expect("consumer");
    let (offset, reset) = first_record_and_reset(&mut first).await;
    assert_eq!(offset, 0);
    assert_eq!(reset, Some((tp.clone(), ResetReason::NoCommittedOffset, 0)));
    if reports_out_of_range {
        // Commit an offset far past the end of the log; the next member starts there,
        // gets OFFSET_OUT_OF_RANGE and resets to earliest.
        first
            .commit_offsets(&[(tp.clone(), 1_000_000)])
            .await
            .expect("commit");
        assert_eq!(first.committed(&tp), Some(1_000_000));
        first.close().await.expect("close");
        let mut second = builder(&peer)
            .group_id(&group)
            .topics([topic])
            .build()
            .await
            .expect("consumer");
        let (offset, reset) = first_record_and_reset(&mut second).await;
        assert_eq!(offset, 0, "reset to the earliest offset");
        assert_eq!(
            reset,
            Some((tp.clone(), ResetReason::OutOfRange { offset: 1_000_000 }, 0)),
            "the reset was reported"
        );
        second.close().await.expect("close");
    } else {
        first.close().await.expect("close");
    }
    // With auto.offset.reset=none, a group with no committed offset gets a clear error.
    let mut strict = builder(&peer)
        .group_id(format!("{group}-none"))
        .topics([topic])
        .offset_reset(OffsetReset::None)
        .build()
        .await
        .expect("consumer");
    match tokio::time::timeout(Duration::from_secs(30), strict.recv()).await {
        Ok(Some(Err(Error::Fetch(FetchError::NoOffset {
            topic: t,
            partition: 0,
        })))) => {
            assert_eq!(t, topic);
        }
        other => panic!("expected NoOffset, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_positions_reset_as_configured() {
    offset_resets(mock(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_positions_reset_as_configured() {
    // tansu answers a Fetch past the log end with no error and no records, where Kafka
    // answers OFFSET_OUT_OF_RANGE (PEERS.md), so that part runs on the mock only. ottla
    // does not guess from the high watermark: a new leader's high watermark can lag,
    // and resetting on it could skip records.
    offset_resets(Peer::tansu().expect("tansu"), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_reset_latest_starts_at_the_end() {
    // tansu's ListOffsets "latest" answers too small an offset (PEERS.md), so this runs
    // on the mock only.
    protocol_tests::init_tracing();
    let peer = mock();
    let topic = "latest";
    peer.create_topic(topic, 1).expect("topic");
    produce(&peer.bootstrap(), topic, 1, 0, 100, "none")
        .await
        .expect("produce");
    let tp = TopicPartition::new(topic, 0);
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign([tp.clone()])
        .offset_reset(OffsetReset::Latest)
        .build()
        .await
        .expect("consumer");
    let started = Instant::now();
    while consumer.position(&tp).is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "no position");
        let _ = tokio::time::timeout(Duration::from_millis(50), consumer.recv()).await;
    }
    assert_eq!(consumer.position(&tp), Some(100));
    produce(&peer.bootstrap(), topic, 1, 100, 10, "none")
        .await
        .expect("produce");
    assert_eq!(
        offsets_read(&mut consumer, 10).await,
        (100..110).collect::<Vec<_>>()
    );
}

// ----- rebalances during consumption -----

/// A member that processes slowly and stops (committing, then leaving) on a signal.
async fn slow_member(
    mut consumer: Consumer,
    m: usize,
    tally: Arc<Mutex<Tally>>,
    partitions: i32,
    pace: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => break,
            batch = consumer.recv_batch(200) => {
                let batch = batch.unwrap_or_else(|e| panic!("member {m}: {e}"));
                tally.lock().unwrap().add(m, &batch, partitions, u64::MAX);
                // Processing takes time, so rebalances land mid-stream.
                tokio::time::sleep(pace).await;
            }
        }
    }
    consumer.close().await.expect("close commits and leaves");
}

/// `allow_duplicates`: the peer refuses commits during a rebalance (see the eager mock
/// test), so records processed since the last commit are read again; none is lost.
async fn members_come_and_go(
    peer: Peer,
    assignor: &str,
    step: Duration,
    pace: Duration,
    allow_duplicates: bool,
) {
    members_come_and_go_on(
        peer,
        GroupProtocol::Classic,
        assignor,
        step,
        pace,
        allow_duplicates,
    )
    .await
}

/// [`members_come_and_go`] on either group protocol (`assignor` is the classic
/// protocol's; the consumer protocol's broker assigns).
async fn members_come_and_go_on(
    peer: Peer,
    protocol: GroupProtocol,
    assignor: &str,
    step: Duration,
    pace: Duration,
    allow_duplicates: bool,
) {
    protocol_tests::init_tracing();
    let topic = "churn";
    let partitions = 6;
    let total: u64 = 40_000;
    peer.create_topic(topic, partitions).expect("topic");
    produce(&peer.bootstrap(), topic, partitions, 0, total, "zstd")
        .await
        .expect("produce");
    let tally = Arc::new(Mutex::new(Tally {
        per_member: vec![0; 3],
        ..Tally::default()
    }));
    let group = format!("churn-{assignor}-{}", protocol.name());
    let mut stops = Vec::new();
    let mut handles = Vec::new();
    for m in 0..3 {
        if m > 0 {
            tokio::time::sleep(step).await;
        }
        let consumer = builder(&peer)
            .group_id(&group)
            .topics([topic])
            .assignors([assignor])
            .expect("assignor")
            .auto_commit(Some(Duration::from_millis(500)))
            .max_partition_fetch_bytes(16 * 1024)
            .group_protocol(protocol)
            .build()
            .await
            .expect("consumer");
        let (tx, rx) = tokio::sync::oneshot::channel();
        stops.push(Some(tx));
        handles.push(tokio::spawn(slow_member(
            consumer,
            m,
            tally.clone(),
            partitions,
            pace,
            rx,
        )));
    }
    // The first member leaves mid-stream; the others take over from its commits.
    tokio::time::sleep(step).await;
    let left_at = tally.lock().unwrap().unique;
    if let Some(tx) = stops[0].take() {
        let _ = tx.send(());
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while tally.lock().unwrap().unique < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    for tx in stops.iter_mut().filter_map(Option::take) {
        let _ = tx.send(());
    }
    for h in handles {
        h.await.expect("member");
    }
    let t = std::mem::take(&mut *tally.lock().unwrap());
    println!(
        "{} {assignor}: member 0 left after {left_at} of {total}; per member {:?}; {} duplicates",
        peer.name(),
        t.per_member,
        t.duplicates
    );
    assert!(left_at < total, "member 0 left before the end");
    assert!(
        t.per_member.iter().all(|n| *n > 0),
        "every member worked: {:?}",
        t.per_member
    );
    let what = format!("{} {assignor} {} churn", peer.name(), protocol.name());
    check_with(&t, total, partitions, &what, allow_duplicates);
}

/// KIP-848 on the librdkafka mock: three members join one after another, the first
/// leaves mid-stream, and every record is read exactly once: a partition moves only
/// after its owner committed, gave it back and acknowledged, and the next owner starts
/// from that commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_consumer_protocol_members_come_and_go_nothing_lost_or_repeated() {
    let peer = mock();
    if let Peer::Mock(m) = &peer {
        m.set_group_consumer_heartbeat_interval(Duration::from_millis(500))
            .expect("interval");
        m.set_group_consumer_session_timeout(Duration::from_secs(6))
            .expect("session");
    }
    members_come_and_go_on(
        peer,
        GroupProtocol::Consumer,
        "range",
        Duration::from_millis(1500),
        Duration::from_millis(40),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_members_come_and_go_cooperative_nothing_lost_or_repeated() {
    members_come_and_go(
        mock(),
        "cooperative-sticky",
        Duration::from_millis(1500),
        Duration::from_millis(40),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_members_come_and_go_eager_nothing_lost() {
    // The mock refuses OffsetCommit with REBALANCE_IN_PROGRESS as soon as a JoinGroup
    // starts a rebalance (its JOINING state); Kafka accepts commits of the current
    // generation until the rebalance completes. An eager member learns of the
    // rebalance only then, so its last commit fails and its partitions' new owners
    // read the uncommitted tail again. Cooperative members commit after the rebalance
    // and repeat nothing (the test above).
    members_come_and_go(
        mock(),
        "range",
        Duration::from_millis(1500),
        Duration::from_millis(40),
        true,
    )
    .await;
}

/// Reads `n` records from `consumer`, returning their offsets.
async fn offsets_read(consumer: &mut Consumer, n: usize) -> Vec<i64> {
    let mut offsets = Vec::new();
    while offsets.len() < n {
        let r = tokio::time::timeout(Duration::from_secs(10), consumer.recv())
            .await
            .expect("records")
            .expect("open")
            .expect("ok");
        offsets.push(r.offset());
    }
    offsets
}

/// A close whose commit is refused ILLEGAL_GENERATION: the generation ended under it,
/// as it did on CI when the eager churn test above stopped two members at once and
/// the second one's close commit met the rebalance the first one's leaving started.
/// The close used to return that refusal as its error. Now it succeeds, as the Java
/// client's does (the refused auto-commit is a warning), and nothing is lost: the
/// next member reads from the last commit. A refusal that is not about membership
/// (GROUP_AUTHORIZATION_FAILED) is still the close's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_close_whose_commit_finds_the_generation_ended_still_closes() {
    use kafka_protocol::ResponseError as E;
    use kafka_protocol::messages::ApiKey;
    protocol_tests::init_tracing();
    let peer = mock();
    let Peer::Mock(m) = &peer else {
        unreachable!("mock() is the mock")
    };
    let topic = "close-refused";
    peer.create_topic(topic, 1).expect("topic");
    produce(&peer.bootstrap(), topic, 1, 0, 20, "none")
        .await
        .expect("produce");
    // Only the close commits: the periodic commit is far away.
    let member = || {
        builder(&peer)
            .group_id("close-refused")
            .topics([topic])
            .auto_commit(Some(Duration::from_secs(600)))
            .build()
    };
    let mut first = member().await.expect("first");
    assert_eq!(
        offsets_read(&mut first, 20).await,
        (0..20).collect::<Vec<_>>()
    );
    m.push_request_errors(ApiKey::OffsetCommit as i16, &[E::IllegalGeneration.code()]);
    first
        .close()
        .await
        .expect("a commit refused for an ended generation does not fail the close");

    let mut second = member().await.expect("second");
    assert_eq!(
        offsets_read(&mut second, 20).await,
        (0..20).collect::<Vec<_>>(),
        "the refused commit committed nothing, so the next member reads all 20 again"
    );
    m.push_request_errors(
        ApiKey::OffsetCommit as i16,
        &[E::GroupAuthorizationFailed.code()],
    );
    match second.close().await {
        Err(Error::Commit(e)) => assert!(
            e.to_string().contains("GroupAuthorizationFailed"),
            "the refusal is named: {e}"
        ),
        other => panic!("an authorization refusal must fail the close, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_members_come_and_go_cooperative_nothing_lost_or_repeated() {
    // tansu holds each JoinGroup for half the session timeout (3 s here).
    members_come_and_go(
        Peer::tansu().expect("tansu"),
        "cooperative-sticky",
        Duration::from_secs(5),
        Duration::from_millis(80),
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_members_come_and_go_eager_nothing_lost_or_repeated() {
    members_come_and_go(
        Peer::tansu().expect("tansu"),
        "range",
        Duration::from_secs(5),
        Duration::from_millis(80),
        false,
    )
    .await;
}

// ----- isolation -----

/// A transactional producer (librdkafka) commits 10 records, aborts 10, commits 10; a
/// `read_committed` ottla consumer sees the 20 committed ones only, a
/// `read_uncommitted` one sees all 30, and neither sees a marker.
async fn read_committed_hides_aborted(peer: &Peer) {
    use rdkafka::producer::{FutureRecord, Producer};
    protocol_tests::init_tracing();
    // Unique names, so the test can run again on a long-lived external broker.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let topic = format!("txn-{run}");
    let topic = topic.as_str();
    peer.create_topic(topic, 1).expect("topic");
    let producer = protocol_tests::data::producer(
        &peer.bootstrap(),
        "none",
        &[
            ("transactional.id", &format!("ottla-txn-{run}")),
            ("linger.ms", "0"),
        ],
    )
    .expect("producer");
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.init_transactions(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("init transactions");
    for (prefix, commit) in [("c1", true), ("a2", false), ("c3", true)] {
        producer.begin_transaction().expect("begin");
        for i in 0..10 {
            let value = format!("{prefix}-{i}");
            producer
                .send(
                    FutureRecord::<(), _>::to(topic)
                        .partition(0)
                        .payload(&value),
                    Duration::from_secs(10),
                )
                .await
                .expect("send");
        }
        let p = producer.clone();
        tokio::task::spawn_blocking(move || {
            if commit {
                p.commit_transaction(Duration::from_secs(30))
            } else {
                p.abort_transaction(Duration::from_secs(30))
            }
        })
        .await
        .unwrap()
        .expect("end transaction");
    }
    let read = async |isolation: IsolationLevel, want: usize| -> Vec<String> {
        let mut consumer = Consumer::builder(&peer.bootstrap())
            .assign([TopicPartition::new(topic, 0)])
            .offset_reset(OffsetReset::Earliest)
            .isolation(isolation)
            .build()
            .await
            .expect("consumer");
        let mut values = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        // Read until `want` records, then a little longer: extra ones would be a bug.
        while Instant::now() < deadline {
            let wait = if values.len() >= want {
                Duration::from_millis(700)
            } else {
                Duration::from_secs(2)
            };
            match tokio::time::timeout(wait, consumer.recv()).await {
                Ok(Some(Ok(r))) => {
                    values.push(String::from_utf8_lossy(r.value().unwrap_or_default()).to_string())
                }
                Ok(Some(Err(e))) => panic!("{e}"),
                Ok(None) => panic!("stopped"),
                Err(_) if values.len() >= want => break,
                Err(_) => {}
            }
        }
        values
    };
    let committed = read(IsolationLevel::ReadCommitted, 20).await;
    let expected: Vec<String> = ["c1", "c3"]
        .iter()
        .flat_map(|p| (0..10).map(move |i| format!("{p}-{i}")))
        .collect();
    assert_eq!(committed, expected, "{}: read_committed", peer.name());
    let all = read(IsolationLevel::ReadUncommitted, 30).await;
    assert_eq!(
        all.len(),
        30,
        "{}: read_uncommitted sees every record, no marker: {all:?}",
        peer.name()
    );
    assert!(all.iter().any(|v| v.starts_with("a2")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_read_committed_hides_aborted_transactions() {
    // tansu writes markers but reports no aborted transactions in Fetch; ottla reads
    // the ABORT marker of the same range (see CommittedFilter).
    read_committed_hides_aborted(&Peer::tansu().expect("tansu")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_read_committed_hides_aborted_transactions() {
    // The workspace's patched mock writes the markers and lists the aborted
    // transaction in Fetch, as Kafka does (the published mock did neither).
    read_committed_hides_aborted(&Peer::mock(1).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_read_committed_hides_aborted_transactions() {
    // Point OTTLA_BOOTSTRAP at a broker with transactions (Kafka, Redpanda, franz-go's
    // kfake) to run this there.
    match Peer::external_from_env() {
        Some(peer) => read_committed_hides_aborted(&peer).await,
        None => println!("OTTLA_BOOTSTRAP not set: skipped"),
    }
}

// ----- commits and shutdown -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_commit_forms_and_what_the_next_owner_sees() {
    protocol_tests::init_tracing();
    let peer = mock();
    let topic = "commits";
    peer.create_topic(topic, 2).expect("topic");
    produce(&peer.bootstrap(), topic, 2, 0, 200, "none")
        .await
        .expect("produce");
    let (p0, p1) = (TopicPartition::new(topic, 0), TopicPartition::new(topic, 1));
    let mut consumer = builder(&peer)
        .group_id("commits")
        .topics([topic])
        .build()
        .await
        .expect("consumer");
    // Read everything: 100 records per partition.
    let mut n = 0;
    while n < 200 {
        n += tokio::time::timeout(Duration::from_secs(30), consumer.recv_batch(500))
            .await
            .expect("records")
            .expect("ok")
            .len();
    }
    assert_eq!(consumer.position(&p0), Some(100));
    assert_eq!(consumer.lag(&p0), Some(0));
    // Synchronous: every position.
    consumer.commit().await.expect("commit");
    assert_eq!(
        (consumer.committed(&p0), consumer.committed(&p1)),
        (Some(100), Some(100))
    );
    // A dropped async commit still happens; its result also arrives as an event.
    drop(consumer.commit_async());
    let mut seen_event = false;
    let started = Instant::now();
    while !seen_event && started.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(ConsumerEvent::CommitCompleted {
            result: Ok(done), ..
        })) = tokio::time::timeout(Duration::from_secs(10), consumer.next_event()).await
        {
            seen_event = done.iter().any(|c| c.partition == p0 && c.offset == 100);
        }
    }
    assert!(seen_event, "the dropped async commit completed");
    // Commits land in the order they were made: the async commit of 100, then the
    // explicit 40, which therefore stays.
    let pending = consumer.commit_async();
    consumer
        .commit_offsets(&[(p0.clone(), 40)])
        .await
        .expect("explicit commit");
    pending.await.expect("async commit");
    assert_eq!(consumer.committed(&p0), Some(40));
    consumer.close().await.expect("close");
    // The next member of the group starts where the commits left each partition.
    let mut next = builder(&peer)
        .group_id("commits")
        .topics([topic])
        .build()
        .await
        .expect("consumer");
    let mut first: BTreeMap<i32, i64> = BTreeMap::new();
    let started = Instant::now();
    while first.is_empty() || next.position(&p1).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the next owner read nothing: {first:?}, position of partition 1 {:?}",
            next.position(&p1)
        );
        if let Ok(Some(Ok(r))) = tokio::time::timeout(Duration::from_secs(5), next.recv()).await {
            first.entry(r.partition()).or_insert(r.offset());
        }
    }
    assert_eq!(
        first.get(&0),
        Some(&40),
        "partition 0 resumes at the explicit commit"
    );
    assert_eq!(
        next.position(&p1),
        Some(100),
        "partition 1 resumes at its position commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_dropping_a_consumer_never_hangs_and_it_leaves_the_group() {
    protocol_tests::init_tracing();
    let peer = mock();
    let topic = "dropped";
    peer.create_topic(topic, 2).expect("topic");
    let mut consumer = builder(&peer)
        .group_id("dropped")
        .topics([topic])
        .build()
        .await
        .expect("consumer");
    // Wait until it holds its partitions.
    let started = Instant::now();
    while consumer.assignment().len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never assigned"
        );
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
    }
    let Peer::Mock(m) = &peer else { unreachable!() };
    m.start_request_tracking();
    let dropped = Instant::now();
    drop(consumer);
    let took = dropped.elapsed();
    assert!(took < Duration::from_secs(1), "drop took {took:?}");
    // The background task still sends LeaveGroup (API key 13).
    let started = Instant::now();
    while !m.requests().iter().any(|r| r.api_key == 13) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no LeaveGroup after the drop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ----- a broker that hangs up on a version it advertises -----

/// The librdkafka mock advertises JoinGroup v6 (and SyncGroup, Heartbeat and LeaveGroup
/// v4) but cannot parse their flexible forms: it closes the connection. Without the
/// fixture's caps, ottla warns after three hang-ups on JoinGroup v6, reports a
/// `BrokerHangUp` through the event stream, steps down to v5, and joins and reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_hanging_up_on_an_advertised_version_is_diagnosed_and_stepped_down() {
    let logs = protocol_tests::log_capture::LogCapture::install("warn").expect("log capture");
    let m = protocol_tests::MockCluster::new(1).expect("mock");
    m.set_group_initial_rebalance_delay(Duration::from_millis(300));
    let topic = "hangs-up";
    m.create_topic(topic, 2, 1).expect("topic");
    let peer = Peer::Mock(m);
    produce(&peer.bootstrap(), topic, 2, 0, 20, "none")
        .await
        .expect("produce");
    let mut consumer = builder(&peer)
        .group_id("hangs-up")
        .topics([topic])
        .build()
        .await
        .expect("consumer");
    let mut events = consumer.take_events();
    let mut reports = Vec::new();
    let mut read = 0;
    let start = Instant::now();
    while read < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "read {read} of 20 in 90 s; reports: {reports:?}"
        );
        tokio::select! {
            Some(event) = events.recv() => {
                if let ConsumerEvent::BrokerHangUp(report) = event {
                    reports.push((start.elapsed(), report));
                }
            }
            r = tokio::time::timeout(Duration::from_millis(200), consumer.recv()) => {
                if let Ok(Some(r)) = r {
                    r.expect("a record");
                    read += 1;
                }
            }
        }
    }
    while let Ok(ConsumerEvent::BrokerHangUp(report)) = events.try_recv() {
        reports.push((start.elapsed(), report));
    }
    let join = reports
        .iter()
        .find(|(_, r)| r.api == kafka_protocol::messages::ApiKey::JoinGroup)
        .unwrap_or_else(|| panic!("no JoinGroup report: {reports:?}"));
    assert_eq!(
        (join.1.version, join.1.hangups, join.1.stepped_down_to),
        (6, ottla::driver::HANGUPS_BEFORE_DIAGNOSIS, Some(5)),
        "{reports:?}"
    );
    assert!(
        logs.count("closed the connection on JoinGroup v6 3 times in a row; using v5") >= 1,
        "no warning"
    );
    eprintln!(
        "reports: {:?}; 20 records read after {:?}",
        reports
            .iter()
            .map(|(t, r)| format!("{t:?}: {r}"))
            .collect::<Vec<_>>(),
        start.elapsed()
    );
    consumer.close().await.expect("close");
}

// ----- the commit made at a revocation -----

/// A revocation that overlaps a coordinator move: the commit of the revoked partitions
/// is answered NOT_COORDINATOR twice (a proxy in front of tansu rewrites the first two
/// OffsetCommit answers). It used to be tried once, so the next owner started at an
/// older offset and read again what was already read (48,000 duplicates in one
/// coordinator-move run). Now it is retried with the backoff while the member finds
/// its coordinator again, and the next owner reads nothing twice. (tansu accepts
/// commits of the current generation during a rebalance, as Kafka does; the librdkafka
/// mock refuses them from the moment any member's JoinGroup starts one, so no retry
/// can help there.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_the_commit_at_revocation_is_retried_through_a_coordinator_move() {
    protocol_tests::init_tracing();
    let topic = "revoked";
    let (listener, _tansu, upstream) = protocol_tests::tansu::behind_a_front(topic, 4)
        .await
        .expect("tansu");
    let proxy = protocol_tests::proxy::CorruptingProxy::failing_commits(listener, upstream, 16, 2);
    let bootstrap = proxy.address();
    produce(&bootstrap, topic, 4, 0, 400, "none")
        .await
        .expect("produce");
    // Commits only at revocation: the periodic one is far away.
    let member = |id: &str| {
        Consumer::builder(&bootstrap)
            .offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(500))
            .group_id("revocation-retry")
            .topics([topic])
            .assignors(["range"])
            .expect("range")
            .auto_commit(Some(Duration::from_secs(600)))
            .client_id(id)
    };
    let read = |mut consumer: Consumer, out: Arc<Mutex<Vec<(i32, i64)>>>| {
        tokio::spawn(async move {
            loop {
                if let Ok(Some(Ok(r))) =
                    tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await
                {
                    out.lock().unwrap().push((r.partition(), r.offset()));
                }
            }
        })
    };
    let first = Arc::new(Mutex::new(Vec::new()));
    let a = read(member("a").build().await.expect("a"), first.clone());
    let start = Instant::now();
    while first.lock().unwrap().len() < 400 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "a read {} of 400",
            first.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = Arc::new(Mutex::new(Vec::new()));
    let b = read(member("b").build().await.expect("b"), second.clone());
    // Long enough for the rebalance (tansu holds a JoinGroup half the session) and B's
    // first fetches.
    let start = Instant::now();
    while proxy.corrupted() < 2 || start.elapsed() < Duration::from_secs(12) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the commits were not refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.abort();
    b.abort();
    let again = second.lock().unwrap().clone();
    assert!(
        again.is_empty(),
        "the next owner read {} records again, e.g. {:?}",
        again.len(),
        again.first()
    );
    assert_eq!(first.lock().unwrap().len(), 400, "a read each record once");
}
