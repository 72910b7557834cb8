//! ottla's transactional producer against real peers: commit, abort, fencing by a
//! second instance with the same `transactional.id`, and a group's offsets committed
//! with the outputs, each read back by `read_committed` consumers of both ottla and
//! librdkafka (test code only); and a librdkafka transactional producer's records
//! read by ottla's `read_committed` consumer.
//!
//! What each peer does with transactions (docs/peers.md):
//! - tansu 0.6.0 answers every transactional API, writes the markers, and filters
//!   aborted records for `read_committed`;
//! - the librdkafka mock answers InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
//!   TxnOffsetCommit and EndTxn and checks the producer's epoch (so fencing works);
//!   the workspace's patch (vendor/rdkafka-sys/OTTLA-PATCH.md) makes it write the
//!   control markers, hold the last stable offset at the oldest open transaction,
//!   list aborted transactions to `read_committed` fetches, commit a
//!   TxnOffsetCommit's offsets with the transaction, fence an earlier instance of a
//!   `transactional.id` (same producer id, next epoch) and abort a transaction open
//!   past its `transaction.timeout.ms`, as Kafka does. The published mock does none
//!   of these.

use std::time::Duration;

use ottla::consumer::{Consumer, IsolationLevel, OffsetReset, TopicPartition};
use ottla::producer::{Producer, ProducerRecord, TransactionApi, TransactionError, TxnOffset};
use protocol_tests::peer::Peer;
use rdkafka::ClientConfig as RdConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};

const PARTITIONS: i32 = 2;

fn transactional(peer: &Peer, id: &str) -> ottla::ProducerBuilder {
    Producer::builder(&peer.bootstrap())
        .transactional_id(id)
        .linger(Duration::from_millis(1))
}

/// A transactional producer for `id`, initialised (fencing any earlier one).
async fn initialised(peer: &Peer, id: &str) -> Producer {
    let producer = transactional(peer, id).build().await.expect("producer");
    producer.init_transactions().await.expect("init");
    producer
}

/// [`initialised`], and its `topic` created.
async fn ready_producer(peer: &Peer, topic: &str, id: &str) -> Producer {
    peer.create_topic(topic, PARTITIONS).expect("topic");
    initialised(peer, id).await
}

/// One transaction of [`send`]'s `count` records, committed; then the producer closes.
async fn commit_and_close(producer: Producer, topic: &str, prefix: &str, count: usize) {
    producer.begin_transaction().expect("begin");
    send(&producer, topic, prefix, count).await;
    producer.commit_transaction().await.expect("commit");
    producer.close().await;
}

/// Sends `count` records `{prefix}-{i}` over both partitions and waits for their
/// deliveries.
async fn send(producer: &Producer, topic: &str, prefix: &str, count: usize) {
    let mut deliveries = Vec::new();
    for i in 0..count {
        let record = ProducerRecord::new(topic)
            .partition(i as i32 % PARTITIONS)
            .key(format!("{i}"))
            .value(format!("{prefix}-{i}"));
        deliveries.push(producer.send(record).await.expect("send"));
    }
    for d in deliveries {
        d.await.expect("delivered");
    }
}

/// Values of `topic` read by ottla at `isolation` from the start, until `count`
/// records with `until` in front have been seen (they come last).
async fn read_ottla(
    peer: &Peer,
    topic: &str,
    isolation: IsolationLevel,
    until: &str,
    count: usize,
) -> Vec<String> {
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign((0..PARTITIONS).map(|p| TopicPartition::new(topic, p)))
        .offset_reset(OffsetReset::Earliest)
        .isolation(isolation)
        .build()
        .await
        .expect("consumer");
    let mut values = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while values
        .iter()
        .filter(|v: &&String| v.starts_with(until))
        .count()
        < count
    {
        let batch = tokio::time::timeout_at(deadline, consumer.recv_batch(1000))
            .await
            .unwrap_or_else(|_| panic!("{isolation:?}: {until}* not all read: {values:?}"))
            .expect("records");
        for r in &batch {
            values.push(String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned());
        }
    }
    consumer.close().await.expect("close");
    values
}

/// The same with librdkafka's consumer (`isolation.level` as given).
async fn read_librdkafka(
    bootstrap: String,
    topic: &str,
    isolation: &'static str,
    until: &str,
    count: usize,
) -> Vec<String> {
    let (topic, until) = (topic.to_string(), until.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = RdConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", format!("rd-{topic}-{isolation}"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .create()
            .expect("rdkafka consumer");
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(&topic, p, rdkafka::Offset::Beginning)
                .expect("tpl");
        }
        consumer.assign(&tpl).expect("assign");
        let mut values = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while values
            .iter()
            .filter(|v: &&String| v.starts_with(&until))
            .count()
            < count
        {
            assert!(
                std::time::Instant::now() < deadline,
                "librdkafka {isolation}: {until}* not all read: {values:?}"
            );
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
            }
        }
        values
    })
    .await
    .expect("reader")
}

fn count(values: &[String], prefix: &str) -> usize {
    values.iter().filter(|v| v.starts_with(prefix)).count()
}

/// Both `read_committed` readers, ottla's and librdkafka's, find `want` records
/// `{prefix}-*` in `topic`, and none `{absent}-*`.
async fn both_read(peer: &Peer, topic: &str, prefix: &str, want: usize, absent: &str) {
    let ottla = read_ottla(peer, topic, IsolationLevel::ReadCommitted, prefix, want).await;
    assert_eq!(count(&ottla, absent), 0, "{ottla:?}");
    assert_eq!(count(&ottla, prefix), want, "{ottla:?}");
    let rd = read_librdkafka(peer.bootstrap(), topic, "read_committed", prefix, want).await;
    assert_eq!(count(&rd, absent), 0, "librdkafka: {rd:?}");
    assert_eq!(count(&rd, prefix), want, "librdkafka: {rd:?}");
}

/// Commits 10 records, aborts 10, commits 10 more: `read_committed` consumers see the
/// 20 committed ones, a `read_uncommitted` one all 30. Returns how many aborted
/// records each `read_committed` reader saw (ottla's, librdkafka's).
async fn commit_and_abort(peer: &Peer) -> (usize, usize) {
    protocol_tests::init_tracing();
    let topic = format!("txn-commit-abort-{}", peer.name());
    peer.create_topic(&topic, PARTITIONS).expect("topic");
    let producer = transactional(peer, &format!("tx-ca-{}", peer.name()))
        .build()
        .await
        .expect("producer");
    // Outside a transaction a record is refused, typed.
    producer.init_transactions().await.expect("init");
    let outside = producer.send(ProducerRecord::new(&topic).value("x")).await;
    assert!(
        matches!(outside, Err(ottla::Error::Transaction(_))),
        "a send outside a transaction: {outside:?}"
    );
    producer.begin_transaction().expect("begin");
    send(&producer, &topic, "committed", 10).await;
    producer.commit_transaction().await.expect("commit");
    producer.begin_transaction().expect("begin");
    send(&producer, &topic, "aborted", 10).await;
    producer.abort_transaction().await.expect("abort");
    commit_and_close(producer, &topic, "last", 10).await;

    let uncommitted = read_ottla(peer, &topic, IsolationLevel::ReadUncommitted, "last", 10).await;
    assert_eq!(count(&uncommitted, "committed"), 10, "{uncommitted:?}");
    assert_eq!(
        count(&uncommitted, "aborted"),
        10,
        "read_uncommitted sees the aborted records"
    );
    let ottla = read_ottla(peer, &topic, IsolationLevel::ReadCommitted, "last", 10).await;
    assert_eq!(count(&ottla, "committed"), 10, "{ottla:?}");
    let rd = read_librdkafka(peer.bootstrap(), &topic, "read_committed", "last", 10).await;
    assert_eq!(
        count(&rd, "committed"),
        10,
        "librdkafka read_committed: {rd:?}"
    );
    (count(&ottla, "aborted"), count(&rd, "aborted"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_commit_is_read_and_abort_is_not_by_read_committed_consumers() {
    let peer = Peer::tansu().expect("tansu");
    let (ottla, rd) = commit_and_abort(&peer).await;
    assert_eq!(
        ottla, 0,
        "aborted records seen by ottla's read_committed consumer"
    );
    // librdkafka's read_committed consumer shows the aborted records on tansu, as it
    // shows those of librdkafka's own aborted transactions there
    // (tansu_ottla_read_committed_reads_librdkafka_transactions): ottla's abort reads
    // to it exactly as librdkafka's does.
    assert_eq!(
        rd, 10,
        "aborted records seen by librdkafka's read_committed consumer"
    );
}

/// The patched mock writes the markers and lists the aborted transaction to
/// `read_committed` fetches: neither reader sees the aborted records (the published
/// mock showed them to both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_commit_is_read_and_abort_is_not_by_read_committed_consumers() {
    let peer = Peer::mock(1).expect("mock");
    let (ottla, rd) = commit_and_abort(&peer).await;
    assert_eq!(
        (ottla, rd),
        (0, 0),
        "aborted records seen by read_committed (ottla, librdkafka)"
    );
}

/// An open transaction holds the last stable offset back at its first record: a
/// `read_committed` reader sees none of its records (nor the plain record written
/// after it) until the commit, a `read_uncommitted` one sees them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_open_transaction_holds_back_the_last_stable_offset() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let topic = "txn-lso";
    let producer = ready_producer(&peer, topic, "tx-lso").await;
    producer.begin_transaction().expect("begin");
    send(&producer, topic, "open", 4).await;
    let plain = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("plain");
    plain
        .send(ProducerRecord::new(topic).partition(0).value("plain"))
        .await
        .expect("send")
        .await
        .expect("delivered");

    let uncommitted = read_ottla(&peer, topic, IsolationLevel::ReadUncommitted, "open", 4).await;
    assert_eq!(count(&uncommitted, "open"), 4, "{uncommitted:?}");

    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign((0..PARTITIONS).map(|p| TopicPartition::new(topic, p)))
        .offset_reset(OffsetReset::Earliest)
        .isolation(IsolationLevel::ReadCommitted)
        .build()
        .await
        .expect("consumer");
    let mut values = Vec::new();
    let mut read = async |values: &mut Vec<String>, until: tokio::time::Instant| {
        while let Ok(batch) = tokio::time::timeout_at(until, consumer.recv_batch(100)).await {
            for r in &batch.expect("records") {
                values.push(String::from_utf8_lossy(r.value().unwrap_or_default()).into_owned());
            }
        }
    };
    read(
        &mut values,
        tokio::time::Instant::now() + Duration::from_secs(2),
    )
    .await;
    assert!(
        values.is_empty(),
        "read_committed read past the open transaction: {values:?}"
    );

    producer.commit_transaction().await.expect("commit");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while (count(&values, "open"), count(&values, "plain")) != (4, 1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not all read after the commit: {values:?}"
        );
        read(
            &mut values,
            tokio::time::Instant::now() + Duration::from_millis(500),
        )
        .await;
    }
    consumer.close().await.expect("close");
    producer.close().await;
    plain.close().await;
}

/// A second producer with the same `transactional.id` fences the first on tansu: its
/// InitProducerId bumps the epoch and aborts the first's open transaction. tansu
/// answers the first's EndTxn by closing the connection rather than with
/// PRODUCER_FENCED, so the first's commit ends at `max.block.ms`; either way nothing
/// of the fenced transaction is ever committed, and the second commits its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_a_second_instance_fences_the_first() {
    protocol_tests::init_tracing();
    let peer = Peer::tansu().expect("tansu");
    let topic = "txn-fence";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    let first = transactional(&peer, "tx-fence")
        .max_block(Duration::from_secs(5))
        .build()
        .await
        .expect("first");
    first.init_transactions().await.expect("init first");
    first.begin_transaction().expect("begin");
    send(&first, topic, "zombie", 4).await;

    let second = initialised(&peer, "tx-fence").await;

    let e = first
        .commit_transaction()
        .await
        .expect_err("the first is fenced");
    assert!(
        !e.txn_requires_abort(),
        "a fenced commit is not abortable: {e:?}"
    );
    drop(first);

    commit_and_close(second, topic, "second", 4).await;

    let ottla = read_ottla(&peer, topic, IsolationLevel::ReadCommitted, "second", 4).await;
    assert_eq!(count(&ottla, "zombie"), 0, "{ottla:?}");
}

/// A second instance with the same `transactional.id` fences the first on the patched
/// mock, as on Kafka: its InitProducerId gets the same producer id with the next epoch
/// and aborts the first's open transaction. The first's commit, with the old epoch, is
/// refused (EndTxn v1, the highest the mock offers, gets INVALID_PRODUCER_EPOCH, which
/// Kafka 3.x answers from v2 as PRODUCER_FENCED), and ottla, as Java's `EndTxnHandler`,
/// takes either as fenced: fatal, and sticky. `read_committed` readers see only the
/// second's records. The published mock gave the second a new producer id and kept the
/// first's valid: its commit succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_second_instance_fences_the_first() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let topic = "txn-fence";
    let first = ready_producer(&peer, topic, "tx-fence").await;
    first.begin_transaction().expect("begin");
    send(&first, topic, "zombie", 4).await;

    let second = initialised(&peer, "tx-fence").await;

    let e = first
        .commit_transaction()
        .await
        .expect_err("the first is fenced");
    assert!(e.is_fatal() && !e.txn_requires_abort(), "{e:?}");
    assert!(
        matches!(
            e,
            TransactionError::Broker {
                api: TransactionApi::EndTxn,
                code: 47,
                ..
            }
        ),
        "EndTxn refused with INVALID_PRODUCER_EPOCH: {e:?}"
    );
    let again = first.begin_transaction().expect_err("fatal is sticky");
    assert!(again.is_fatal(), "{again:?}");
    let abort = first
        .abort_transaction()
        .await
        .expect_err("no abort after fatal");
    assert!(abort.is_fatal(), "{abort:?}");
    first.close().await;

    commit_and_close(second, topic, "second", 4).await;

    both_read(&peer, topic, "second", 4, "zombie").await;
}

/// A second producer's InitProducerId for the same `transactional.id` aborts the
/// transaction the first left open, as Kafka's coordinator does when it fences the
/// old epoch: `read_committed` readers never see the first's records, though it
/// never ended its transaction (the published mock left it open, and its records
/// visible, for ever). That the first is fenced too is
/// `mock_a_second_instance_fences_the_first`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_second_instance_aborts_the_first_s_open_transaction() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let topic = "txn-zombie";
    let first = ready_producer(&peer, topic, "tx-zombie").await;
    first.begin_transaction().expect("begin");
    send(&first, topic, "zombie", 4).await;

    let second = initialised(&peer, "tx-zombie").await;
    commit_and_close(second, topic, "second", 4).await;

    let ottla = read_ottla(&peer, topic, IsolationLevel::ReadCommitted, "second", 4).await;
    assert_eq!(count(&ottla, "zombie"), 0, "{ottla:?}");
    let rd = read_librdkafka(peer.bootstrap(), topic, "read_committed", "second", 4).await;
    assert_eq!(count(&rd, "zombie"), 0, "librdkafka: {rd:?}");
    // The first producer ends only now, so that its own abort cannot be what hid
    // its records.
    drop(first);
}

/// A group's offsets committed with the transaction: visible after a commit, not
/// after an abort. The group metadata is a live member's (KIP-447).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_offsets_commit_with_the_transaction_and_not_with_an_abort() {
    let peer = Peer::tansu().expect("tansu");
    offsets_commit_with_the_transaction(&peer, false).await;
}

/// The same on the patched mock, where a stable OffsetFetch (librdkafka's
/// `read_committed` consumer asks with require_stable) of an offset the transaction
/// has pending gets UNSTABLE_OFFSET_COMMIT until the commit, as in Kafka (KIP-447).
/// The published mock never stored the offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_offsets_commit_with_the_transaction_and_not_with_an_abort() {
    let peer = Peer::mock(1).expect("mock");
    offsets_commit_with_the_transaction(&peer, true).await;
}

/// Copies `txn-in` to `txn-out` in two transactions with the group's offsets, the
/// first committed (offset 10), the second aborted (offset 20): the group's committed
/// offset is 10. With `stable_fetch_waits`, also checks that a stable OffsetFetch
/// asked while the first transaction is open is answered only after its commit, with
/// its offset.
async fn offsets_commit_with_the_transaction(peer: &Peer, stable_fetch_waits: bool) {
    protocol_tests::init_tracing();
    let (input, output, group) = ("txn-in", "txn-out", "txn-offsets-g");
    peer.create_topic(input, 1).expect("topic");
    peer.create_topic(output, PARTITIONS).expect("topic");
    let plain = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("plain");
    for i in 0..20 {
        plain
            .send(
                ProducerRecord::new(input)
                    .partition(0)
                    .value(format!("in-{i}")),
            )
            .await
            .expect("send")
            .await
            .expect("delivered");
    }
    plain.close().await;

    let mut consumer = Consumer::builder(&peer.bootstrap())
        .group_id(group)
        .topics([input])
        .session_timeout(Duration::from_secs(6))
        .offset_reset(OffsetReset::Earliest)
        .auto_commit(None)
        .isolation(IsolationLevel::ReadCommitted)
        .build()
        .await
        .expect("consumer");
    let mut read = Vec::new();
    while read.len() < 20 {
        let batch = tokio::time::timeout(Duration::from_secs(60), consumer.recv_batch(20))
            .await
            .expect("records in time")
            .expect("records");
        read.extend(batch);
    }
    let metadata = consumer.group_metadata().expect("group metadata");
    assert_eq!(metadata.group_id, group);
    // tansu numbers a group's first generation 0 (Kafka 1).
    assert!(metadata.generation_id >= 0, "a joined member: {metadata:?}");
    assert!(!metadata.member_id.is_empty(), "{metadata:?}");

    let producer = initialised(peer, "tx-offsets").await;
    let offsets = |next: i64| {
        vec![TxnOffset {
            partition: TopicPartition::new(input, 0),
            offset: next,
            leader_epoch: -1,
            metadata: None,
        }]
    };
    // Committed: the first 10 copied, offset 10.
    producer.begin_transaction().expect("begin");
    send(&producer, output, "copy", 10).await;
    producer
        .send_offsets_to_transaction(offsets(10), metadata.clone())
        .await
        .expect("offsets");
    let waiting = if stable_fetch_waits {
        let waiting = tokio::spawn(rd_committed(peer.bootstrap(), group, input));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !waiting.is_finished(),
            "a stable OffsetFetch answered while the transaction's offset is pending"
        );
        Some(waiting)
    } else {
        None
    };
    producer.commit_transaction().await.expect("commit");
    if let Some(waiting) = waiting {
        assert_eq!(
            waiting.await.expect("reader"),
            Some(10),
            "the stable OffsetFetch answered after the commit, with its offset"
        );
    }
    // Aborted: offset 20 must not stick.
    producer.begin_transaction().expect("begin");
    send(&producer, output, "dropped", 10).await;
    producer
        .send_offsets_to_transaction(offsets(20), metadata)
        .await
        .expect("offsets");
    producer.abort_transaction().await.expect("abort");
    producer.close().await;

    let committed = rd_committed(peer.bootstrap(), group, input).await;
    assert_eq!(
        committed,
        Some(10),
        "the committed transaction's offset, not the aborted one's"
    );
    consumer.close().await.expect("close");
}

/// The group's committed offset of `topic`/0, read by librdkafka.
async fn rd_committed(bootstrap: String, group: &str, topic: &str) -> Option<i64> {
    rd_committed_at(bootstrap, group, topic, 0).await
}

/// The group's committed offset of `topic`/`partition`, read by librdkafka.
async fn rd_committed_at(
    bootstrap: String,
    group: &str,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let (group, topic) = (group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = RdConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("rdkafka consumer");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&topic, partition);
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(20))
            .expect("committed offsets");
        committed
            .elements()
            .first()
            .and_then(|e| e.offset().to_raw())
            .filter(|o| *o >= 0)
    })
    .await
    .expect("reader")
}

/// KIP-447 on the patched mock (vendor/rdkafka-sys/OTTLA-PATCH.md): TxnOffsetCommit
/// carries the consumer's group metadata, and the group coordinator refuses the
/// offsets of a generation that is not the group's current one, or of a member not
/// in the group, so a member expelled from the group cannot commit a zombie's
/// offsets with its transaction. The published mock read those fields and ignored
/// them. The transaction must then be aborted; the producer goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_offsets_of_a_stale_generation_or_an_unknown_member_are_refused() {
    let peer = Peer::mock(1).expect("mock");
    let (input, group) = ("txn-kip447-in", "txn-kip447-g");
    peer.create_topic(input, 1).expect("topic");
    let plain = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("plain");
    plain
        .send(ProducerRecord::new(input).value("one"))
        .await
        .expect("send")
        .await
        .expect("delivered");
    plain.close().await;
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .group_id(group)
        .topics([input])
        .offset_reset(OffsetReset::Earliest)
        .auto_commit(None)
        .build()
        .await
        .expect("consumer");
    tokio::time::timeout(Duration::from_secs(60), consumer.recv())
        .await
        .expect("a record in time")
        .expect("a record")
        .expect("no error");
    let current = consumer.group_metadata().expect("group metadata");
    let producer = ready_producer(&peer, "txn-kip447-out", "tx-kip447").await;
    let offsets = vec![TxnOffset {
        partition: TopicPartition::new(input, 0),
        offset: 1,
        leader_epoch: -1,
        metadata: None,
    }];
    let stale = ottla::producer::ConsumerGroupMetadata {
        generation_id: current.generation_id + 7,
        ..current.clone()
    };
    let stranger = ottla::producer::ConsumerGroupMetadata {
        member_id: "not-a-member".into(),
        ..current.clone()
    };
    for (what, metadata) in [
        ("a stale generation", stale),
        ("an unknown member", stranger),
    ] {
        producer.begin_transaction().expect("begin");
        let e = producer
            .send_offsets_to_transaction(offsets.clone(), metadata)
            .await
            .expect_err(what);
        assert!(e.txn_requires_abort(), "{what}: {e:?}");
        producer.abort_transaction().await.expect("abort");
    }
    producer.begin_transaction().expect("begin");
    producer
        .send_offsets_to_transaction(offsets, current)
        .await
        .expect("the current generation's offsets");
    producer.commit_transaction().await.expect("commit");
    producer.close().await;
    consumer.close().await.expect("close");
}

/// Under the consumer protocol (KIP-848) a member's epoch moves on whenever the
/// group's assignment is recomputed (here: a second member joins), and the group
/// coordinator takes a transaction's offsets only with the member's current epoch
/// (Kafka's `validateMemberEpoch`; the patched mock does the same). The consumer's
/// group metadata kept the epoch of its first join, so once a second member had
/// joined, every transaction's offsets were refused (STALE_MEMBER_EPOCH) for as long
/// as the member lived: an exactly-once Processor aborted every commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_consumer_protocol_group_metadata_follows_the_member_epoch() {
    let peer = Peer::mock(1).expect("mock");
    let (input, group) = ("txn-epoch-in", "txn-epoch-g");
    peer.create_topic(input, 2).expect("topic");
    let plain = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("plain");
    for partition in 0..2 {
        plain
            .send(ProducerRecord::new(input).partition(partition).value("one"))
            .await
            .expect("send")
            .await
            .expect("delivered");
    }
    plain.close().await;
    let member = || {
        Consumer::builder(&peer.bootstrap())
            .group_id(group)
            .topics([input])
            .offset_reset(OffsetReset::Earliest)
            .auto_commit(None)
            .group_protocol(ottla::consumer::GroupProtocol::Consumer)
            .build()
    };
    let mut first = member().await.expect("first member");
    tokio::time::timeout(Duration::from_secs(60), first.recv())
        .await
        .expect("a record in time")
        .expect("a record")
        .expect("no error");
    let joined = first.group_metadata().expect("group metadata");
    let mut second = member().await.expect("second member");
    let reading = tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(90), second.recv()).await;
        second
    });
    let producer = ready_producer(&peer, "txn-epoch-out", "tx-epoch").await;
    let offsets = vec![TxnOffset {
        partition: TopicPartition::new(input, 0),
        offset: 1,
        leader_epoch: -1,
        metadata: None,
    }];
    // The epoch may move again between a read and the commit: a refusal is aborted
    // and the commit tried again with the metadata as it is then.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut refusals = Vec::new();
    let committed_with = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no commit with a moved-on epoch within 60 s (joined with {joined:?}; refusals: {refusals:?})"
        );
        let metadata = first.group_metadata().expect("group metadata");
        if metadata.generation_id <= joined.generation_id {
            // Coming back for records completes the revocation the new member's
            // arrival asks for; the epoch moves on after it.
            let _ = tokio::time::timeout(Duration::from_millis(200), first.recv()).await;
            continue;
        }
        producer.begin_transaction().expect("begin");
        match producer
            .send_offsets_to_transaction(offsets.clone(), metadata.clone())
            .await
        {
            Ok(()) => {
                producer.commit_transaction().await.expect("commit");
                break metadata;
            }
            Err(e) => {
                assert!(e.txn_requires_abort(), "{e:?}");
                refusals.push(e.to_string());
                producer.abort_transaction().await.expect("abort");
            }
        }
    };
    assert_eq!(committed_with.member_id, joined.member_id);
    producer.close().await;
    let second = reading.await.expect("second member's task");
    second.close().await.expect("close second");
    first.close().await.expect("close first");
}

/// A quirk of tansu 0.6.0 that rules it out for exactly-once chaos runs (PEERS.md):
/// two transactional producers commit offsets for one group, as a group's members do
/// in exactly-once mode. Producer A commits offset 30 for partition 0 while producer
/// B has a transaction open (with offsets for partition 1), and B is then fenced by a
/// new instance, which aborts B's transaction.
///
/// Kafka shows 30 right after A's commit (only B's partition is unstable), and still
/// shows it after B's abort. tansu hides A's offset while B's transaction is open, and
/// loses it when B's transaction is aborted: the group's next owner of partition 0
/// would start from 10 and handle again what A's committed transaction had finished.
/// This test asserts tansu's behaviour, so that a fixed tansu is noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_loses_a_committed_transactions_offsets_when_another_producers_open_one_is_fenced() {
    let peer = Peer::tansu().expect("tansu");
    let (input, group) = ("txn-quirk-in", "txn-quirk-g");
    peer.create_topic(input, 2).expect("topic");
    let metadata = ottla::producer::ConsumerGroupMetadata {
        group_id: group.into(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
    };
    let offsets = |partition: i32, next: i64| {
        vec![TxnOffset {
            partition: TopicPartition::new(input, partition),
            offset: next,
            leader_epoch: -1,
            metadata: None,
        }]
    };
    let committed = |partition: i32| rd_committed_at(peer.bootstrap(), group, input, partition);
    let a = initialised(&peer, "tx-quirk-a").await;
    let b = initialised(&peer, "tx-quirk-b").await;
    for (producer, partition, next) in [(&a, 0, 10), (&b, 1, 20)] {
        producer.begin_transaction().expect("begin");
        producer
            .send_offsets_to_transaction(offsets(partition, next), metadata.clone())
            .await
            .expect("offsets");
        producer.commit_transaction().await.expect("commit");
    }
    assert_eq!(
        (committed(0).await, committed(1).await),
        (Some(10), Some(20)),
        "one transaction at a time: each commit is seen"
    );
    b.begin_transaction().expect("begin b");
    b.send_offsets_to_transaction(offsets(1, 40), metadata.clone())
        .await
        .expect("b's offsets");
    a.begin_transaction().expect("begin a");
    a.send_offsets_to_transaction(offsets(0, 30), metadata.clone())
        .await
        .expect("a's offsets");
    a.commit_transaction().await.expect("a commits");
    assert_eq!(
        committed(0).await,
        Some(10),
        "tansu hides A's committed offset while B's transaction is open (Kafka: 30)"
    );
    // B's instance goes away with its transaction open; its successor fences it.
    let successor = initialised(&peer, "tx-quirk-b").await;
    assert_eq!(
        (committed(0).await, committed(1).await),
        (Some(10), Some(20)),
        "tansu loses A's committed offset with B's aborted transaction (Kafka: 30 and 20)"
    );
    drop(b);
    a.close().await;
    successor.close().await;
}

/// librdkafka's transactional producer commits one transaction and aborts one:
/// ottla's `read_committed` consumer reads the committed records and not the aborted.
async fn librdkafka_transactions_read_by_ottla(peer: &Peer) -> (usize, usize) {
    protocol_tests::init_tracing();
    let topic = format!("txn-rd-{}", peer.name());
    peer.create_topic(&topic, PARTITIONS).expect("topic");
    let (bootstrap, t) = (peer.bootstrap(), topic.clone());
    tokio::task::spawn_blocking(move || {
        let producer: ThreadedProducer<DefaultProducerContext> = RdConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("transactional.id", format!("rd-tx-{t}"))
            .create()
            .expect("rdkafka producer");
        let timeout = Duration::from_secs(30);
        producer.init_transactions(timeout).expect("init");
        let write = |prefix: &str| {
            for i in 0..10 {
                let value = format!("{prefix}-{i}");
                let key = format!("{i}");
                producer
                    .send(
                        BaseRecord::to(&t)
                            .partition(i % PARTITIONS)
                            .key(&key)
                            .payload(&value),
                    )
                    .expect("send");
            }
        };
        producer.begin_transaction().expect("begin");
        write("committed");
        producer.commit_transaction(timeout).expect("commit");
        producer.begin_transaction().expect("begin");
        write("aborted");
        producer.flush(timeout).expect("flush");
        producer.abort_transaction(timeout).expect("abort");
        producer.begin_transaction().expect("begin");
        write("last");
        producer.commit_transaction(timeout).expect("commit");
    })
    .await
    .expect("librdkafka producer");
    let values = read_ottla(peer, &topic, IsolationLevel::ReadCommitted, "last", 10).await;
    assert_eq!(count(&values, "committed"), 10, "{values:?}");
    let rd = read_librdkafka(peer.bootstrap(), &topic, "read_committed", "last", 10).await;
    (count(&values, "aborted"), count(&rd, "aborted"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_ottla_read_committed_reads_librdkafka_transactions() {
    let peer = Peer::tansu().expect("tansu");
    let (ottla, rd) = librdkafka_transactions_read_by_ottla(&peer).await;
    assert_eq!(
        ottla, 0,
        "aborted records seen by ottla's read_committed consumer"
    );
    // tansu's quirk (docs/peers.md): librdkafka's own read_committed consumer shows
    // its producer's aborted records there.
    assert_eq!(
        rd, 10,
        "aborted records seen by librdkafka's read_committed consumer"
    );
}

/// Which error each transactional call gives when the producer has no
/// `transactional.id`, and that `transactional.id` by property name builds the same
/// producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_transactional_id_by_property_and_calls_without_one() {
    let peer = Peer::mock(1).expect("mock");
    let plain = Producer::builder(&peer.bootstrap())
        .build()
        .await
        .expect("plain");
    let e = plain
        .init_transactions()
        .await
        .expect_err("no transactional.id");
    assert!(!e.is_fatal() && !e.txn_requires_abort(), "{e:?}");
    plain.close().await;
    let topic = "txn-props";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    let by_name = Producer::builder(&peer.bootstrap())
        .set("transactional.id", "tx-props")
        .expect("transactional.id")
        .set("transaction.timeout.ms", "30000")
        .expect("transaction.timeout.ms")
        .build()
        .await
        .expect("producer");
    by_name.init_transactions().await.expect("init");
    commit_and_close(by_name, topic, "v", 4).await;
    let refused = Producer::builder(&peer.bootstrap())
        .transactional_id("tx-acks")
        .acks(ottla::producer::Acks::Leader)
        .build()
        .await;
    assert!(
        refused.is_err(),
        "acks=1 with a transactional.id is refused"
    );
}

/// A broker without a transaction API ottla does not negotiate at `build` (those it
/// does, the build refuses: InitProducerId, AddPartitionsToTxn, EndTxn): here the mock
/// with AddOffsetsToTxn switched off, as a Kafka-compatible broker with transactions
/// but no offsets in them may have. `send_offsets_to_transaction` fails at once with
/// a fatal, typed error that names the API, instead of being retried until
/// `max.block.ms` (which it was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_a_broker_without_add_offsets_to_txn_fails_with_a_typed_fatal_error() {
    let peer = Peer::mock(1).expect("mock");
    let Peer::Mock(mock) = &peer else {
        unreachable!("Peer::mock")
    };
    let topic = "txn-unsupported";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    mock.set_api_version(protocol_tests::mock::api_key::ADD_OFFSETS_TO_TXN, -1, -1)
        .expect("switch AddOffsetsToTxn off");
    let producer = transactional(&peer, "tx-unsupported")
        .max_block(Duration::from_secs(20))
        .build()
        .await
        .expect("producer");
    producer.init_transactions().await.expect("init");
    producer.begin_transaction().expect("begin");
    send(&producer, topic, "v", 2).await;
    let group = ottla::producer::ConsumerGroupMetadata {
        group_id: "g-unsupported".into(),
        generation_id: -1,
        member_id: String::new(),
        group_instance_id: None,
    };
    let offsets = vec![TxnOffset {
        partition: TopicPartition::new(topic, 0),
        offset: 1,
        leader_epoch: -1,
        metadata: None,
    }];
    let e = producer
        .send_offsets_to_transaction(offsets, group)
        .await
        .expect_err("no AddOffsetsToTxn on this broker");
    assert!(
        matches!(
            e,
            TransactionError::Unsupported {
                api: TransactionApi::AddOffsetsToTxn,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_fatal(), "{e:?}");
    assert!(
        producer.commit_transaction().await.is_err(),
        "the producer is finished"
    );
    producer.close().await;
}

/// The transaction coordinator moves mid-transaction: the old one answers
/// NOT_COORDINATOR, the producer looks the coordinator up again, adds the next
/// partition and ends the transaction at the new one, and the records commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_transaction_coordinator_moves_mid_transaction() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(3).expect("mock");
    let Peer::Mock(mock) = &peer else {
        unreachable!()
    };
    let topic = "txn-move";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    mock.set_transaction_coordinator("tx-move", 1)
        .expect("coordinator");
    let producer = initialised(&peer, "tx-move").await;
    producer.begin_transaction().expect("begin");
    producer
        .send(ProducerRecord::new(topic).partition(0).value("moved-0"))
        .await
        .expect("send")
        .await
        .expect("delivered");
    mock.set_transaction_coordinator("tx-move", 2)
        .expect("move");
    mock.start_request_tracking();
    producer
        .send(ProducerRecord::new(topic).partition(1).value("moved-1"))
        .await
        .expect("send")
        .await
        .expect("delivered after the partition was added at the new coordinator");
    producer.commit_transaction().await.expect("commit");
    let requests = mock.requests();
    mock.stop_request_tracking();
    let at = |api: i16| -> Vec<i32> {
        requests
            .iter()
            .filter(|r| r.api_key == api)
            .map(|r| r.broker)
            .collect()
    };
    // AddPartitionsToTxn (24) first at the old coordinator, then at the new one;
    // FindCoordinator (10) in between; EndTxn (26) at the new one only.
    assert_eq!(at(24).first(), Some(&1), "AddPartitionsToTxn: {:?}", at(24));
    assert_eq!(at(24).last(), Some(&2), "AddPartitionsToTxn: {:?}", at(24));
    assert!(!at(10).is_empty(), "the coordinator was looked up again");
    assert_eq!(at(26), vec![2], "EndTxn");
    let values = read_ottla(&peer, topic, IsolationLevel::ReadCommitted, "moved", 2).await;
    assert_eq!(count(&values, "moved"), 2, "{values:?}");

    // The patched mock keeps a transaction's state in the cluster, not at its
    // coordinator: a transaction aborted at the coordinator it moved to mid-way is
    // still hidden from read_committed, and the next one commits.
    producer.begin_transaction().expect("begin");
    send(&producer, topic, "dropped", 2).await;
    mock.set_transaction_coordinator("tx-move", 3)
        .expect("move");
    producer.abort_transaction().await.expect("abort");
    commit_and_close(producer, topic, "after", 2).await;
    let values = read_ottla(&peer, topic, IsolationLevel::ReadCommitted, "after", 2).await;
    assert_eq!(count(&values, "dropped"), 0, "{values:?}");
    assert_eq!(count(&values, "moved"), 2, "{values:?}");
}

/// A transactional producer with `transaction.timeout.ms` of 1 s that leaves its
/// transaction open for 3 s: the patched mock's coordinator, as Kafka's, aborts it on
/// its own (ABORT markers) and bumps the producer's epoch (KIP-588). Its commit, with
/// the old epoch, is refused: EndTxn v1 gets INVALID_PRODUCER_EPOCH (PRODUCER_FENCED
/// from v2 on Kafka 3.x, whose EndTxn refuses any epoch but the current one), which
/// ottla, as Java's `EndTxnHandler`, takes as fenced: fatal, so the producer cannot
/// abort either. `read_committed` readers get past the aborted records without seeing
/// them before anyone else touches the `transactional.id`, and a new instance's
/// transaction commits. The published mock did not time transactions out: the commit
/// succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_transaction_timed_out_by_the_coordinator_is_aborted_and_its_commit_fenced() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let topic = "txn-timeout";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    let producer = transactional(&peer, "tx-timeout")
        .transaction_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("producer");
    producer.init_transactions().await.expect("init");
    producer.begin_transaction().expect("begin");
    send(&producer, topic, "timed-out", 4).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let e = producer
        .commit_transaction()
        .await
        .expect_err("the coordinator aborted the transaction");
    assert!(e.is_fatal() && !e.txn_requires_abort(), "{e:?}");
    assert!(
        matches!(
            e,
            TransactionError::Broker {
                api: TransactionApi::EndTxn,
                code: 47,
                ..
            }
        ),
        "EndTxn refused with INVALID_PRODUCER_EPOCH: {e:?}"
    );
    let abort = producer
        .abort_transaction()
        .await
        .expect_err("no abort after fatal");
    assert!(abort.is_fatal(), "{abort:?}");
    producer.close().await;

    // Nothing but the coordinator ended the transaction: records written after it
    // are read, its own are not.
    let plain = Producer::builder(&peer.bootstrap())
        .linger(Duration::from_millis(1))
        .build()
        .await
        .expect("producer");
    send(&plain, topic, "plain", 4).await;
    plain.close().await;
    let ottla = read_ottla(&peer, topic, IsolationLevel::ReadCommitted, "plain", 4).await;
    assert_eq!(count(&ottla, "timed-out"), 0, "{ottla:?}");
    let rd = read_librdkafka(peer.bootstrap(), topic, "read_committed", "plain", 4).await;
    assert_eq!(count(&rd, "timed-out"), 0, "librdkafka: {rd:?}");

    let next = initialised(&peer, "tx-timeout").await;
    commit_and_close(next, topic, "after", 4).await;
    both_read(&peer, topic, "after", 4, "timed-out").await;
}

/// The same timeout found by a Produce: the batch written after the coordinator aborted
/// the transaction has the old epoch and is refused with INVALID_PRODUCER_EPOCH, which
/// makes the transaction abortable (Java: `InvalidProducerEpochException`), so the
/// commit fails as abortable. The abort's EndTxn has the old epoch too and is refused
/// as fenced: fatal, as in Java with Kafka 3.x. A new instance commits. The published
/// mock wrote the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_produce_after_the_transaction_timed_out_is_refused_and_the_abort_fenced() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    let topic = "txn-timeout-produce";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    let producer = transactional(&peer, "tx-timeout-produce")
        .transaction_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("producer");
    producer.init_transactions().await.expect("init");
    producer.begin_transaction().expect("begin");
    send(&producer, topic, "timed-out", 4).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let refused = producer
        .send(ProducerRecord::new(topic).partition(0).value("late"))
        .await
        .expect("send")
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let e = producer
        .commit_transaction()
        .await
        .expect_err("the transaction can only be aborted");
    assert!(e.txn_requires_abort() && !e.is_fatal(), "{e:?}");
    let abort = producer
        .abort_transaction()
        .await
        .expect_err("the abort's EndTxn has the old epoch");
    assert!(abort.is_fatal(), "{abort:?}");
    producer.close().await;

    let next = initialised(&peer, "tx-timeout-produce").await;
    commit_and_close(next, topic, "after", 4).await;
    let ottla = read_ottla(&peer, topic, IsolationLevel::ReadCommitted, "after", 4).await;
    assert_eq!(
        count(&ottla, "timed-out") + count(&ottla, "late"),
        0,
        "{ottla:?}"
    );
    let rd = read_librdkafka(peer.bootstrap(), topic, "read_committed", "after", 4).await;
    assert_eq!(
        count(&rd, "timed-out") + count(&rd, "late"),
        0,
        "librdkafka: {rd:?}"
    );
}

/// Sends `count` records `{prefix}-{i}` and returns where they were written.
async fn send_at(producer: &Producer, topic: &str, prefix: &str, count: usize) -> Vec<(i32, i64)> {
    let mut deliveries = Vec::new();
    for i in 0..count {
        let record = ProducerRecord::new(topic)
            .partition(i as i32 % PARTITIONS)
            .value(format!("{prefix}-{i}"));
        deliveries.push(producer.send(record).await.expect("send"));
    }
    let mut at = Vec::new();
    for d in deliveries {
        let m = d.await.expect("delivered");
        at.push((m.partition, m.offset));
    }
    at
}

/// confluent-kafka (Python; librdkafka 2.16.0) with `isolation.level=read_committed`,
/// in a group of its own on tansu, reads what ottla's transactions wrote: every
/// committed record; what it makes of the aborted ones is asserted as seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_confluent_kafka_read_committed_reads_ottla_transactions() {
    use protocol_tests::pyclient::{PyClient, PyMember};
    protocol_tests::init_tracing();
    let peer = Peer::tansu().expect("tansu");
    let topic = "txn-py";
    let producer = ready_producer(&peer, topic, "tx-py").await;
    producer.begin_transaction().expect("begin");
    let committed = send_at(&producer, topic, "committed", 10).await;
    producer.commit_transaction().await.expect("commit");
    producer.begin_transaction().expect("begin");
    let aborted = send_at(&producer, topic, "aborted", 10).await;
    producer.abort_transaction().await.expect("abort");
    producer.begin_transaction().expect("begin");
    let last = send_at(&producer, topic, "last", 10).await;
    producer.commit_transaction().await.expect("commit");
    producer.close().await;

    let member = PyMember::builder(
        PyClient::Confluent,
        &peer.bootstrap(),
        "txn-py-g",
        &[topic],
        "range",
    )
    .session_timeout(Duration::from_secs(6))
    .set("isolation.level", "read_committed")
    .report_records()
    .spawn()
    .expect("confluent-kafka member");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let seen = loop {
        let seen: std::collections::BTreeSet<(i32, i64)> = member
            .records()
            .into_iter()
            .map(|(_, p, o)| (p, o))
            .collect();
        if last.iter().all(|r| seen.contains(r)) {
            break seen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "confluent-kafka did not read the last transaction: {seen:?}; errors {:?}",
            member.errors()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = tokio::task::spawn_blocking(move || member.close()).await;
    assert!(
        committed.iter().all(|r| seen.contains(r)),
        "committed records missing: {seen:?}"
    );
    let aborted_seen = aborted.iter().filter(|r| seen.contains(r)).count();
    println!("confluent-kafka read_committed on tansu: {aborted_seen} of 10 aborted records seen");
    // As librdkafka 2.12.1 (tansu_commit_is_read_and_abort_is_not_by_read_committed_consumers):
    // tansu's Fetch lists no aborted transactions, which librdkafka relies on.
    assert_eq!(
        aborted_seen, 10,
        "aborted records seen by confluent-kafka's read_committed consumer"
    );
}
