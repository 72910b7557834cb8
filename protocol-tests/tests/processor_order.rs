//! The Processor's orders against real peers: by key, different keys of one partition
//! run at once while each key's records are handled in offset order, a retrying key
//! holds only its own records, and the commit ends at each partition's end; by
//! partition (the control), one call per partition at a time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, OffsetReset, TopicPartition};
use ottla::processor::{
    Metric, MetricsLog, ProcessError, ProcessingOrder, Processor, RetryBackoff, RetryPolicy, owned,
};
use ottla::producer::{Producer, ProducerRecord};
use protocol_tests::peer::Peer;

const RECORDS: usize = 240;
const KEYS: usize = 24;
const PARTITIONS: i32 = 2;
/// The key whose first record fails twice before it succeeds.
const SLOW_KEY: usize = 3;

/// What the handler saw.
#[derive(Default)]
struct Seen {
    /// Per key, the sequence numbers handled successfully, in the order they finished.
    done: BTreeMap<usize, Vec<usize>>,
    /// Per partition, the calls running now and the most seen at once.
    running: HashMap<i32, (usize, usize)>,
    /// The keys with a call running, and the keys seen starting while one ran.
    busy: HashSet<usize>,
    overlapped: Vec<usize>,
    /// When the slow key's first record succeeded, and the (partition, offset) of every
    /// success, with its time.
    slow_done: Option<Instant>,
    finished: Vec<(i32, i64, usize, Instant)>,
    /// The slow key's first record: (partition, offset).
    slow_first: Option<(i32, i64)>,
    failures: usize,
}

fn two_quick_retries() -> RetryPolicy {
    RetryPolicy {
        default: RetryBackoff {
            max_retries: 5,
            initial: Duration::from_millis(150),
            max: Duration::from_millis(300),
            multiplier: 2.0,
            jitter: false,
            min_delay: Duration::ZERO,
        },
        ..RetryPolicy::default()
    }
}

/// Writes RECORDS records over KEYS keys (`k{key}`, the value `{key}:{seq}`, `seq`
/// counting that key's records), keyed to partitions by the producer's partitioner.
/// Gives each partition's end offset.
async fn produce(peer: &Peer, topic: &str) -> BTreeMap<i32, i64> {
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut seq = [0usize; KEYS];
    let mut deliveries = Vec::new();
    for i in 0..RECORDS {
        let key = i % KEYS;
        let value = format!("{key}:{}", seq[key]);
        seq[key] += 1;
        let r = ProducerRecord::new(topic)
            .key(format!("k{key}"))
            .value(value);
        deliveries.push(producer.send(r).await.expect("send"));
    }
    let mut ends = BTreeMap::new();
    for d in deliveries {
        let m = d.await.expect("written");
        let end = ends.entry(m.partition).or_insert(0);
        *end = (*end).max(m.offset + 1);
    }
    producer.close().await;
    ends
}

/// Runs a Processor on `topic` with `order` until every record finished, and gives
/// what its handler saw.
async fn run(peer: &Peer, topic: &str, group: &str, order: ProcessingOrder) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let processor = Processor::builder(&peer.bootstrap(), group, [topic.to_string()])
        .retry_policy(two_quick_retries())
        .ordering(order)
        .concurrency(64)
        .processing_budget(Duration::from_secs(5))
        .commit_interval(Some(Duration::from_millis(100)))
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(20),
        )
        .consumer(|c| {
            c.offset_reset(OffsetReset::Earliest)
                .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
        })
        .build()
        .await
        .expect("processor");
    let s = seen.clone();
    let handler = owned(move |r: ottla::ConsumerRecord, _cancel| {
        let s = s.clone();
        async move {
            let value = String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned();
            let (key, seq) = value
                .split_once(':')
                .and_then(|(k, q)| Some((k.parse::<usize>().ok()?, q.parse::<usize>().ok()?)))
                .ok_or_else(|| ProcessError::malformed(format!("value {value}")))?;
            let p = r.partition();
            {
                let mut s = s.lock().expect("lock");
                let (now, max) = s.running.entry(p).or_default();
                *now += 1;
                *max = (*max).max(*now);
                if !s.busy.insert(key) {
                    s.overlapped.push(key);
                }
            }
            // A downstream call.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut s = s.lock().expect("lock");
            if let Some((now, _)) = s.running.get_mut(&p) {
                *now -= 1;
            }
            s.busy.remove(&key);
            if key == SLOW_KEY && seq == 0 && s.failures < 2 {
                s.failures += 1;
                s.slow_first = Some((p, r.offset()));
                return Err(ProcessError::transient("Downstream", "the service is down"));
            }
            if key == SLOW_KEY && seq == 0 {
                s.slow_done = Some(Instant::now());
            }
            s.done.entry(key).or_default().push(seq);
            s.finished.push((p, r.offset(), key, Instant::now()));
            Ok(())
        }
    });
    let until = seen.clone();
    let shutdown = async move {
        let started = Instant::now();
        while until.lock().expect("lock").finished.len() < RECORDS
            && started.elapsed() < Duration::from_secs(60)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The last commit goes out on the interval, or at the shutdown.
    };
    tokio::time::timeout(Duration::from_secs(90), processor.run(handler, shutdown))
        .await
        .expect("run ends")
        .expect("run");
    seen
}

/// `group`'s committed offsets of `topic`, read by a consumer of its own that joins
/// the group.
async fn committed(peer: &Peer, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let mut check = Consumer::builder(&peer.bootstrap())
        .group_id(group)
        .topics([topic])
        .auto_commit(None)
        .session_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .build()
        .await
        .expect("checker");
    let started = Instant::now();
    loop {
        let found: BTreeMap<i32, i64> = (0..PARTITIONS)
            .filter_map(|p| Some((p, check.committed(&TopicPartition::new(topic, p))?)))
            .collect();
        if found.len() == PARTITIONS as usize || started.elapsed() > Duration::from_secs(30) {
            return found;
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), check.recv()).await;
    }
}

async fn by_key(peer: Peer) {
    protocol_tests::init_tracing();
    let topic = format!("keyed-{}", peer.name());
    peer.create_topic(&topic, PARTITIONS).expect("topic");
    peer.create_topic(&format!("{topic}.dlq"), 1).expect("dlq");
    let ends = produce(&peer, &topic).await;
    let group = format!("by-key-{}", peer.name());
    let seen = run(&peer, &topic, &group, ProcessingOrder::Key).await;
    {
        let seen = seen.lock().expect("lock");
        // One call at a time per key, every record handled once, and each key's in order.
        assert!(
            seen.overlapped.is_empty(),
            "two calls at once on keys {:?}",
            seen.overlapped
        );
        assert_eq!(
            seen.finished.len(),
            RECORDS,
            "handled {}",
            seen.finished.len()
        );
        for (key, seqs) in &seen.done {
            let expected: Vec<usize> = (0..seqs.len()).collect();
            assert_eq!(seqs, &expected, "key {key} handled out of order or twice");
        }
        assert_eq!(seen.failures, 2);
        // Keys of one partition ran at once.
        let most = seen
            .running
            .values()
            .map(|(_, max)| *max)
            .max()
            .unwrap_or(0);
        assert!(
            most > 1,
            "at most {most} call at once on a partition under key ordering"
        );
        // While the slow key waited for its retries, later records of its partition, of
        // other keys, finished: it held only its own.
        let (slow_p, slow_offset) = seen.slow_first.expect("the slow key failed");
        let slow_done = seen.slow_done.expect("the slow key succeeded");
        let passed = seen
            .finished
            .iter()
            .filter(|(p, o, k, at)| {
                *p == slow_p && *o > slow_offset && *k != SLOW_KEY && *at < slow_done
            })
            .count();
        assert!(
            passed > 0,
            "nothing after the retrying record finished before it"
        );
    }
    assert_eq!(committed(&peer, &group, &topic).await, ends);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_by_key_keys_run_at_once_each_in_order_and_a_retrying_key_holds_only_itself() {
    by_key(Peer::mock(1).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_by_key_keys_run_at_once_each_in_order_and_a_retrying_key_holds_only_itself() {
    by_key(Peer::tansu().expect("tansu")).await;
}

/// The control: by partition, one call per partition at a time, and nothing after the
/// retrying record of its partition finishes before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_by_partition_one_call_per_partition_and_a_retry_holds_the_partition() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let topic = "by-partition";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    peer.create_topic(&format!("{topic}.dlq"), 1).expect("dlq");
    let ends = produce(&peer, topic).await;
    let seen = run(&peer, topic, "by-partition", ProcessingOrder::Partition).await;
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.finished.len(), RECORDS);
        let most = seen
            .running
            .values()
            .map(|(_, max)| *max)
            .max()
            .unwrap_or(0);
        assert_eq!(most, 1, "more than one call at once on a partition");
        let (slow_p, slow_offset) = seen.slow_first.expect("the slow key failed");
        let slow_done = seen.slow_done.expect("the slow key succeeded");
        let passed = seen
            .finished
            .iter()
            .filter(|(p, o, _, at)| *p == slow_p && *o > slow_offset && *at < slow_done)
            .count();
        assert_eq!(
            passed, 0,
            "records after the retrying one finished before it"
        );
    }
    assert_eq!(committed(&peer, "by-partition", topic).await, ends);
}

/// Under key ordering, a member whose first record never finishes while the 1,000
/// after it do commits offset 0 with those 1,000 in the commit's metadata; it dies
/// (its run dropped: no commit on the way out), and the next member of the group
/// handles record 0 alone, then commits past all of them.
/// tansu keeps no commit metadata (its OffsetFetch answers carry none: PEERS.md), so
/// there the next owner handles the 1,000 again, once each: the fallback is the old
/// behaviour, nothing lost and nothing committed early.
async fn finished_records_survive_the_owner(peer: Peer, keeps_metadata: bool) {
    protocol_tests::init_tracing();
    let topic = format!("resume-{}", peer.name());
    let group = format!("resume-{}", peer.name());
    peer.create_topic(&topic, 1).expect("topic");
    peer.create_topic(&format!("{topic}.dlq"), 1).expect("dlq");
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for i in 0..=1000u32 {
        let key = if i == 0 {
            "stuck".to_string()
        } else {
            format!("k{}", i % 50)
        };
        let r = ProducerRecord::new(&topic)
            .partition(0)
            .key(key)
            .value(i.to_string());
        deliveries.push(producer.send(r).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("written");
    }
    producer.close().await;

    let builder = |log: &MetricsLog| {
        Processor::builder(&peer.bootstrap(), &group, [topic.clone()])
            .ordering(ProcessingOrder::Key)
            .concurrency(64)
            .commit_interval(Some(Duration::from_millis(100)))
            .processing_budget(Duration::from_secs(60))
            .timeouts(
                Duration::from_secs(6),
                Duration::from_millis(500),
                Duration::from_secs(120),
            )
            .metrics(log.hook())
            .consumer(|c| {
                c.offset_reset(OffsetReset::Earliest)
                    .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
            })
    };
    // The first member: record 0 hangs (until its run is dropped), the rest succeed.
    let first_log = MetricsLog::default();
    let first = builder(&first_log).build().await.expect("first");
    let handled_first = Arc::new(Mutex::new(Vec::<i64>::new()));
    let h = handled_first.clone();
    let handler = owned(
        move |r: ottla::ConsumerRecord, cancel: ottla::processor::Cancel| {
            let h = h.clone();
            async move {
                if r.offset() == 0 {
                    cancel.cancelled().await;
                    return Err(ProcessError::cancelled());
                }
                h.lock().expect("lock").push(r.offset());
                Ok(())
            }
        },
    );
    let run = first.run(handler, std::future::pending::<()>());
    let log = first_log.clone();
    let done = handled_first.clone();
    let watch = async move {
        let started = Instant::now();
        loop {
            let committed_after = done.lock().expect("lock").len() == 1000
                && log
                    .snapshot()
                    .iter()
                    .filter(|m| matches!(m, Metric::Committed { offset: 0, .. }))
                    .count()
                    >= 1;
            if committed_after || started.elapsed() > Duration::from_secs(60) {
                // Let one more commit interval pass, so the last commit names all.
                tokio::time::sleep(Duration::from_millis(500)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        r = run => panic!("the first member's run ended: {r:?}"),
        () = watch => {}
    }
    assert_eq!(handled_first.lock().expect("lock").len(), 1000);
    // The run future is dropped here: the member dies without a last commit.

    let second_log = MetricsLog::default();
    let second = builder(&second_log).build().await.expect("second");
    let handled_second = Arc::new(Mutex::new(Vec::<i64>::new()));
    let h = handled_second.clone();
    let handler = owned(move |r: ottla::ConsumerRecord, _cancel| {
        let h = h.clone();
        async move {
            h.lock().expect("lock").push(r.offset());
            Ok(())
        }
    });
    let log = second_log.clone();
    let until = async move {
        let started = Instant::now();
        while !log
            .snapshot()
            .iter()
            .any(|m| matches!(m, Metric::Committed { offset: 1001, .. }))
            && started.elapsed() < Duration::from_secs(60)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let stats = tokio::time::timeout(Duration::from_secs(90), second.run(handler, until))
        .await
        .expect("run ends")
        .expect("run");
    let mut second_handled = handled_second.lock().expect("lock").clone();
    if keeps_metadata {
        assert_eq!(
            second_handled,
            vec![0],
            "the next owner handles only the record its previous owner did not finish"
        );
        assert_eq!(stats.already_finished, 1000, "{stats:?}");
    } else {
        second_handled.sort_unstable();
        assert_eq!(second_handled, (0..=1000).collect::<Vec<i64>>());
        assert_eq!(stats.already_finished, 0, "{stats:?}");
    }
    assert!(
        second_log
            .snapshot()
            .iter()
            .any(|m| matches!(m, Metric::Committed { offset: 1001, .. })),
        "committed past all of them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_records_finished_past_the_commit_are_not_handled_again_by_the_next_owner() {
    finished_records_survive_the_owner(Peer::mock(1).expect("mock"), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_keeps_no_commit_metadata_so_the_next_owner_handles_them_again_once() {
    finished_records_survive_the_owner(Peer::tansu().expect("tansu"), false).await;
}
