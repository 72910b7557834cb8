//! A subscribed topic gains partitions while the group is stable: the leader must
//! notice (from metadata it refreshes at least every `metadata.max.age.ms`, as the Java
//! client does) and start a rebalance, so the new partitions get assigned and read.
//!
//! Neither tansu nor the librdkafka mock can add partitions (no CreatePartitions), so
//! the topic is created with 4 and a proxy in front of tansu hides partitions 2 and 3
//! from every Metadata answer until the test shows them: to the consumer, the topic
//! grows from 2 to 4 partitions. Every client connection goes through the proxy (tansu
//! advertises its address). The records of partitions 2 and 3 are written before the
//! consumer starts, so reading them proves the partitions were assigned.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use protocol_tests::data::produce;
use protocol_tests::proxy::CorruptingProxy;
use protocol_tests::tansu::behind_a_front;

const PARTITIONS: i32 = 4;
/// Visible before the growth.
const BEFORE: i32 = 2;
/// Records per partition.
const PER_PARTITION: u64 = 10;
/// The consumers' `metadata.max.age.ms`.
const MAX_AGE: Duration = Duration::from_secs(2);
/// From the growth to the new partitions' records being read: one metadata age (2 s),
/// a rebalance (tansu holds each JoinGroup for half the session, 3 s here; a follower
/// hears of the rebalance at its next heartbeat, 0.5 s), the new owner's OffsetFetch,
/// ListOffsets and Fetch, and 6 s for a noisy two-core machine that also runs the
/// broker. Measured with the library's `metadata_max_age`: 4.1 s with one member,
/// 6.5 s with two. Without a periodic refresh the new partitions are never read.
const GROWTH_BOUND: Duration = Duration::from_secs(12);

/// Records read, as `(partition, offset, member)`.
type Reads = Arc<Mutex<Vec<(i32, i64, usize)>>>;

/// Reads with `members` consumers of one group while the topic grows from 2 to 4
/// partitions, and checks that before the growth only partitions 0 and 1 were read,
/// and after it every record of partitions 2 and 3 within [`GROWTH_BOUND`].
async fn grow(topic: &'static str, members: usize) {
    protocol_tests::init_tracing();
    let (listener, _tansu, upstream) = behind_a_front(topic, PARTITIONS).await.expect("tansu");
    let visible = Arc::new(AtomicI32::new(PARTITIONS));
    let proxy = CorruptingProxy::hiding_partitions(listener, upstream, topic, visible.clone());
    let bootstrap = proxy.address();
    // Record i goes to partition i % 4.
    let total = PER_PARTITION * PARTITIONS as u64;
    produce(&bootstrap, topic, PARTITIONS, 0, total, "none")
        .await
        .expect("produce");
    visible.store(BEFORE, Ordering::SeqCst);

    let reads: Reads = Arc::default();
    let assignments: Arc<Mutex<Vec<Vec<TopicPartition>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); members]));
    let mut tasks = Vec::new();
    for m in 0..members {
        let consumer = Consumer::builder(&bootstrap)
            .group_id(format!("{topic}-group"))
            .topics([topic])
            .offset_reset(OffsetReset::Earliest)
            .session_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(500))
            .max_poll_interval(Duration::from_secs(20))
            // Commits at the revocation when the second member joins, so its new
            // partition is not read again from the start.
            .auto_commit(Some(Duration::from_millis(500)))
            .metadata_max_age(MAX_AGE)
            .client_id(format!("grow-{m}"))
            .build()
            .await
            .expect("consumer");
        let (reads, assignments) = (reads.clone(), assignments.clone());
        tasks.push(tokio::spawn(read(consumer, m, reads, assignments)));
    }

    // Before the growth: partitions 0 and 1, all of them, and nothing else.
    let before = PER_PARTITION * BEFORE as u64;
    let start = Instant::now();
    while reads.lock().unwrap().len() < before as usize {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "read {} of the {before} records of partitions 0 and 1",
            reads.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A few metadata ages: the hidden partitions stay unknown while they are hidden.
    tokio::time::sleep(MAX_AGE * 2).await;
    assert_eq!(
        owned(&assignments),
        BTreeSet::from([0, 1]),
        "before the growth the group owns partitions 0 and 1"
    );
    let early: Vec<_> = reads
        .lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| *p >= BEFORE)
        .copied()
        .collect();
    assert!(
        early.is_empty(),
        "hidden partitions read: {:?}",
        &early[..early.len().min(5)]
    );

    visible.store(PARTITIONS, Ordering::SeqCst);
    let grown = Instant::now();
    let grown_records = |reads: &Reads| {
        reads
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| *p >= BEFORE)
            .map(|(p, o, _)| (*p, *o))
            .collect::<BTreeSet<_>>()
            .len() as u64
    };
    let expected = PER_PARTITION * (PARTITIONS - BEFORE) as u64;
    while grown_records(&reads) < expected {
        assert!(
            grown.elapsed() < GROWTH_BOUND,
            "{members} member(s): read {} of the {expected} records of partitions 2 and 3 within {GROWTH_BOUND:?} of the growth; the group owns {:?}",
            grown_records(&reads),
            owned_by_member(&assignments),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = grown.elapsed();
    // Let the group settle, then check the outcome: every partition owned once, every
    // record read, none twice.
    tokio::time::sleep(Duration::from_secs(1)).await;
    eprintln!(
        "partition growth, {members} member(s): the new partitions were read {:.1} s after they appeared (bound {:.0} s, metadata.max.age {:.0} s); owned: {:?}",
        took.as_secs_f64(),
        GROWTH_BOUND.as_secs_f64(),
        MAX_AGE.as_secs_f64(),
        owned_by_member(&assignments)
    );
    for t in &tasks {
        t.abort();
    }
    let all = reads.lock().unwrap().clone();
    let unique: BTreeSet<(i32, i64)> = all.iter().map(|(p, o, _)| (*p, *o)).collect();
    assert_eq!(unique.len() as u64, total, "every record read");
    assert_eq!(all.len() as u64, total, "no record read twice");
    assert_eq!(
        owned(&assignments),
        (0..PARTITIONS).collect::<BTreeSet<_>>(),
        "every partition owned"
    );
    if members > 1 {
        let per: Vec<usize> = owned_by_member(&assignments).iter().map(Vec::len).collect();
        assert!(
            per.iter().all(|n| *n > 0) && per.iter().sum::<usize>() == PARTITIONS as usize,
            "the partitions are shared, each owned once: {per:?}"
        );
    }
}

/// One member's reading loop: records into `reads`, its assignment into
/// `assignments[m]` (refreshed every turn).
async fn read(
    mut consumer: Consumer,
    m: usize,
    reads: Reads,
    assignments: Arc<Mutex<Vec<Vec<TopicPartition>>>>,
) {
    loop {
        if let Ok(Some(Ok(r))) =
            tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await
        {
            reads.lock().unwrap().push((r.partition(), r.offset(), m));
        }
        assignments.lock().unwrap()[m] = consumer.assignment();
    }
}

fn owned_by_member(assignments: &Mutex<Vec<Vec<TopicPartition>>>) -> Vec<Vec<i32>> {
    assignments
        .lock()
        .unwrap()
        .iter()
        .map(|a| a.iter().map(|tp| tp.partition).collect())
        .collect()
}

fn owned(assignments: &Mutex<Vec<Vec<TopicPartition>>>) -> BTreeSet<i32> {
    owned_by_member(assignments).into_iter().flatten().collect()
}

/// One member: it is its own leader, and must see the growth to assign itself the new
/// partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_one_member_reads_partitions_added_to_its_topic() {
    grow("grown-alone", 1).await;
}

/// Two members: the leader sees the growth and rebalances, and the new partitions are
/// shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_two_members_rebalance_onto_partitions_added_to_their_topic() {
    grow("grown-shared", 2).await;
}
