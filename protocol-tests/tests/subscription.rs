//! Subscriptions that change at run time, on the classic protocol against the
//! librdkafka mock and tansu: a pattern picks up a topic created after the consumer
//! started (the consumer matches on each metadata refresh, `metadata.max.age.ms`), and
//! `subscribe` on a running consumer moves only the partitions of topics that joined or
//! left the subscription under `cooperative-sticky`, with every record read once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ottla::consumer::{Consumer, ConsumerEvent, GroupProtocol, OffsetReset, TopicPartition};
use ottla::producer::{Producer, ProducerRecord};
use protocol_tests::peer::Peer;

/// Writes `n` records to each partition of `topic` (`partitions` of them); gives
/// (topic, partition, offset) of each.
async fn produce(peer: &Peer, topic: &str, partitions: i32, n: usize) -> Vec<(String, i32, i64)> {
    let producer = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("producer");
    let mut deliveries = Vec::new();
    for p in 0..partitions {
        for i in 0..n {
            let record = ProducerRecord::new(topic)
                .partition(p)
                .value(format!("{i}"));
            deliveries.push(producer.send(record).await.expect("send"));
        }
    }
    let mut out = Vec::new();
    for d in deliveries {
        let m = d.await.expect("written");
        out.push((topic.to_string(), m.partition, m.offset));
    }
    producer.close().await;
    out
}

/// How often each (topic, partition, offset) was read or handled.
type Counts = BTreeMap<(String, i32, i64), usize>;

/// What a consumer read (with how often) and the group events it saw, until `done`
/// holds or `timeout` passes.
#[derive(Default)]
struct Read {
    records: BTreeMap<(String, i32, i64), usize>,
    revoked: Vec<Vec<TopicPartition>>,
    assigned: Vec<Vec<TopicPartition>>,
}

impl Read {
    async fn until(
        &mut self,
        consumer: &mut Consumer,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Read) -> bool,
    ) {
        let started = Instant::now();
        while !done(self) {
            assert!(
                started.elapsed() < timeout,
                "{what}: not within {timeout:?}; read {} records, revoked {:?}, assigned {:?}",
                self.records.len(),
                self.revoked,
                self.assigned
            );
            if let Ok(Some(r)) =
                tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await
            {
                let r = r.expect("record");
                *self
                    .records
                    .entry((r.topic().to_string(), r.partition(), r.offset()))
                    .or_insert(0) += 1;
            }
            while let Some(event) = consumer.try_event() {
                match event {
                    ConsumerEvent::RevokeRequested { partitions, .. } => {
                        self.revoked.push(partitions)
                    }
                    ConsumerEvent::Assigned { added, .. } => self.assigned.push(added),
                    ConsumerEvent::Fatal(e) => panic!("{e}"),
                    _ => {}
                }
            }
        }
    }

    fn has_all(&self, written: &[(String, i32, i64)]) -> bool {
        written
            .iter()
            .all(|(t, p, o)| self.records.contains_key(&(t.clone(), *p, *o)))
    }
}

async fn consumer(peer: &Peer, group: &str, topics: &[&str], pattern: Option<&str>) -> Consumer {
    consumer_on(peer, group, topics, pattern, GroupProtocol::Classic).await
}

async fn consumer_on(
    peer: &Peer,
    group: &str,
    topics: &[&str],
    pattern: Option<&str>,
    protocol: GroupProtocol,
) -> Consumer {
    let mut b = Consumer::builder(&peer.bootstrap())
        .group_id(group)
        .topics(topics.iter().copied())
        .session_timeout(Duration::from_secs(6))
        .metadata_max_age(Duration::from_secs(1))
        .offset_reset(OffsetReset::Earliest)
        .auto_commit(Some(Duration::from_millis(200)));
    if let Some(p) = pattern {
        b = b.topic_regex(p);
    }
    b = if protocol == GroupProtocol::Classic {
        b.heartbeat_interval(Duration::from_millis(500))
            .assignors(["cooperative-sticky"])
            .expect("assignor")
            .tweak_group(|g| g.leader_sync_delay = Duration::from_millis(50))
    } else {
        b.group_protocol(protocol)
    };
    b.build().await.expect("consumer")
}

async fn pattern_picks_up_a_topic_created_later(peer: Peer) {
    let group = format!("pattern-{}-{}", peer.name(), std::process::id());
    peer.create_topic("sub-a", 2).expect("topic");
    peer.create_topic("other", 1).expect("topic");
    let first = produce(&peer, "sub-a", 2, 5).await;
    let unmatched = produce(&peer, "other", 1, 5).await;
    let mut c = consumer(&peer, &group, &[], Some("sub-.*")).await;
    let mut read = Read::default();
    read.until(&mut c, Duration::from_secs(60), "sub-a read", |r| {
        r.has_all(&first)
    })
    .await;
    // A topic created now is matched at the next refresh (1 s here), and the member
    // rejoins with it.
    peer.create_topic("sub-b", 2).expect("topic");
    let later = produce(&peer, "sub-b", 2, 5).await;
    read.until(&mut c, Duration::from_secs(60), "sub-b read", |r| {
        r.has_all(&later)
    })
    .await;
    assert!(
        unmatched
            .iter()
            .all(|(t, p, o)| !read.records.contains_key(&(t.clone(), *p, *o))),
        "a topic the pattern does not match was read"
    );
    let twice: Vec<_> = read.records.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "read twice: {twice:?}");
    c.close().await.expect("close");
}

async fn subscribe_moves_only_what_changed(peer: Peer, protocol: GroupProtocol) {
    let group = format!(
        "resubscribe-{}-{}-{}",
        peer.name(),
        protocol.name(),
        std::process::id()
    );
    peer.create_topic("sub-x", 3).expect("topic");
    peer.create_topic("sub-y", 3).expect("topic");
    let x1 = produce(&peer, "sub-x", 3, 4).await;
    let y1 = produce(&peer, "sub-y", 3, 4).await;
    let mut c = consumer_on(&peer, &group, &["sub-x"], None, protocol).await;
    let mut read = Read::default();
    read.until(&mut c, Duration::from_secs(60), "sub-x read", |r| {
        r.has_all(&x1)
    })
    .await;
    let revoked_before = read.revoked.len();

    // Adding a topic: its partitions are added, sub-x's stay.
    c.subscribe(["sub-x", "sub-y"]).expect("subscribe");
    read.until(&mut c, Duration::from_secs(60), "sub-y read", |r| {
        r.has_all(&y1)
    })
    .await;
    let revoked: Vec<&TopicPartition> = read.revoked[revoked_before..].iter().flatten().collect();
    assert!(revoked.is_empty(), "nothing was to be revoked: {revoked:?}");
    let x2 = produce(&peer, "sub-x", 3, 2).await;
    read.until(&mut c, Duration::from_secs(30), "sub-x read on", |r| {
        r.has_all(&x2)
    })
    .await;

    // Dropping a topic: only its partitions are revoked.
    let revoked_before = read.revoked.len();
    c.subscribe(["sub-y"]).expect("subscribe");
    read.until(&mut c, Duration::from_secs(60), "sub-x revoked", |r| {
        r.revoked[revoked_before..].iter().flatten().count() == 3
    })
    .await;
    let revoked: Vec<&TopicPartition> = read.revoked[revoked_before..].iter().flatten().collect();
    assert!(
        revoked.iter().all(|tp| tp.topic == "sub-x"),
        "only sub-x's partitions go: {revoked:?}"
    );
    let x3 = produce(&peer, "sub-x", 3, 2).await;
    let y3 = produce(&peer, "sub-y", 3, 2).await;
    read.until(&mut c, Duration::from_secs(30), "sub-y read on", |r| {
        r.has_all(&y3)
    })
    .await;
    assert!(
        x3.iter()
            .all(|(t, p, o)| !read.records.contains_key(&(t.clone(), *p, *o))),
        "sub-x was read after it left the subscription"
    );
    let twice: Vec<_> = read.records.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "read twice: {twice:?}");
    assert!(
        c.subscribe_pattern("sub-[").is_err(),
        "an invalid pattern is refused"
    );
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_pattern_picks_up_a_topic_created_later() {
    pattern_picks_up_a_topic_created_later(Peer::mock(3).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_pattern_picks_up_a_topic_created_later() {
    pattern_picks_up_a_topic_created_later(Peer::tansu().expect("tansu")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_subscribe_moves_only_what_changed() {
    subscribe_moves_only_what_changed(Peer::mock(3).expect("mock"), GroupProtocol::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_subscribe_moves_only_what_changed() {
    subscribe_moves_only_what_changed(Peer::tansu().expect("tansu"), GroupProtocol::Classic).await;
}

/// The same under KIP-848's consumer protocol: the next heartbeat carries the new
/// topic names and the broker assigns (the mock; tansu has no consumer protocol).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_consumer_protocol_subscribe_moves_only_what_changed() {
    subscribe_moves_only_what_changed(Peer::mock(3).expect("mock"), GroupProtocol::Consumer).await;
}

/// The Processor follows a pattern too (its consumer's `topic_regex`): records of a
/// matching topic created while it runs are handled, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_processor_follows_a_pattern() {
    use ottla::processor::{Processor, owned};
    use std::sync::{Arc, Mutex};
    let peer = Arc::new(Peer::tansu().expect("tansu"));
    let group = format!("proc-pattern-{}", std::process::id());
    peer.create_topic("proc-a", 2).expect("topic");
    let first = produce(&peer, "proc-a", 2, 5).await;
    let handled: Arc<Mutex<Counts>> = Arc::default();
    let processor = Processor::builder(&peer.bootstrap(), &group, Vec::<String>::new())
        .timeouts(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(60),
        )
        .consumer(|c| {
            c.topic_regex("proc-.*")
                .metadata_max_age(Duration::from_secs(1))
                .offset_reset(OffsetReset::Earliest)
        })
        .build()
        .await
        .expect("processor");
    let h = handled.clone();
    let handler = owned(move |r: ottla::ConsumerRecord, _cancel| {
        let h = h.clone();
        async move {
            *h.lock()
                .expect("lock")
                .entry((r.topic().to_string(), r.partition(), r.offset()))
                .or_insert(0) += 1;
            Ok(())
        }
    });
    let seen = handled.clone();
    let peer2 = Arc::clone(&peer);
    let until = async move {
        let has = |w: &[(String, i32, i64)]| {
            let s = seen.lock().expect("lock");
            w.iter().all(|k| s.contains_key(k))
        };
        let started = Instant::now();
        while !has(&first) && started.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        peer2.create_topic("proc-b", 2).expect("topic");
        let later = produce(&peer2, "proc-b", 2, 5).await;
        while !has(&later) && started.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (first, later)
    };
    let (written, stop) = tokio::sync::oneshot::channel();
    let run = processor.run(handler, async move {
        let w = until.await;
        let _ = written.send(w);
    });
    tokio::time::timeout(Duration::from_secs(150), run)
        .await
        .expect("the processor stops")
        .expect("run");
    let (first, later) = stop.await.expect("written");
    let handled = handled.lock().expect("lock");
    for k in first.iter().chain(later.iter()) {
        assert_eq!(handled.get(k), Some(&1), "{k:?} handled once");
    }
}
