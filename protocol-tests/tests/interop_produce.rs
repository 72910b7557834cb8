//! ottla reads what other clients write: the Python `confluent-kafka` (librdkafka) with
//! every codec and transactions, and `kafka-python` with the codecs it has without
//! extra packages (none, gzip). Every record is checked field by field: key, value,
//! partition, order, and headers, including an empty-valued one.
//!
//! Transactions run on tansu only: the published librdkafka mock writes no transaction
//! markers (docs/peers.md); the workspace's patched mock does, and
//! `transactions.rs` and `consumer.rs` read transactions on it.

use std::collections::BTreeMap;
use std::time::Duration;

use ottla::consumer::{Consumer, IsolationLevel, OffsetReset, TopicPartition};
use protocol_tests::peer::Peer;
use protocol_tests::pyclient::{PyClient, PyProduce};

const COUNT: u64 = 1500;
const PARTITIONS: i32 = 3;

/// Reads every partition of `topic` from the start until `want` records arrived and
/// nothing more comes for a second.
async fn read_all(
    peer: &Peer,
    topic: &str,
    isolation: IsolationLevel,
    want: usize,
) -> Vec<ottla::ConsumerRecord> {
    let mut consumer = Consumer::builder(&peer.bootstrap())
        .assign((0..PARTITIONS).map(|p| TopicPartition::new(topic, p)))
        .offset_reset(OffsetReset::Earliest)
        .isolation(isolation)
        .build()
        .await
        .expect("consumer");
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let quiet = if out.len() >= want {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        };
        match tokio::time::timeout(quiet, consumer.recv_batch(1000)).await {
            Ok(batch) => out.extend(batch.expect("records")),
            Err(_) if out.len() >= want => break,
            Err(_) => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{topic}: {} of {want} records after 60 s",
            out.len()
        );
    }
    consumer.close().await.expect("close");
    out
}

/// Checks `records` against the script's numbering: exactly the indexes `want`, each
/// once, on its partition, in order within it, with its key, value and headers.
fn check(records: &[ottla::ConsumerRecord], codec: &str, want: &[u64], what: &str) {
    let header = |r: &ottla::ConsumerRecord, name: &str| -> Option<Option<Vec<u8>>> {
        r.headers_owned()
            .iter()
            .find(|(k, _)| &k[..] == name.as_bytes())
            .map(|(_, v)| v.as_ref().map(|v| v.to_vec()))
    };
    let mut seen: BTreeMap<u64, i64> = BTreeMap::new();
    let mut last: BTreeMap<i32, u64> = BTreeMap::new();
    for r in records {
        let key = String::from_utf8_lossy(r.key().unwrap_or_default()).into_owned();
        let i: u64 = key
            .strip_prefix('k')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: unexpected key {key:?}"));
        let value = format!("v{i}:{codec}:{}", "x".repeat((i % 97) as usize));
        assert_eq!(r.value(), Some(value.as_bytes()), "{what}: value of {i}");
        assert_eq!(
            r.partition(),
            (i % PARTITIONS as u64) as i32,
            "{what}: partition of {i}"
        );
        assert_eq!(
            header(r, "idx"),
            Some(Some(i.to_string().into_bytes())),
            "{what}: idx header of {i}"
        );
        assert_eq!(
            header(r, "codec"),
            Some(Some(codec.as_bytes().to_vec())),
            "{what}: codec header of {i}"
        );
        assert_eq!(
            header(r, "empty"),
            Some(Some(Vec::new())),
            "{what}: empty header of {i}"
        );
        if let Some(prev) = last.insert(r.partition(), i) {
            assert!(
                prev < i,
                "{what}: {i} after {prev} on partition {}",
                r.partition()
            );
        }
        assert!(
            seen.insert(i, r.offset()).is_none(),
            "{what}: {i} read twice"
        );
    }
    let got: Vec<u64> = seen.keys().copied().collect();
    assert_eq!(got.len(), want.len(), "{what}: record count");
    assert_eq!(got, want, "{what}: which records");
}

async fn written_by(peer: Peer, client: PyClient, codecs: &[&str]) {
    protocol_tests::init_tracing();
    for codec in codecs {
        let topic = format!("interop-{client}-{codec}");
        peer.create_topic(&topic, PARTITIONS).expect("topic");
        let run = PyProduce {
            client,
            bootstrap: peer.bootstrap(),
            topic: topic.clone(),
            partitions: PARTITIONS,
            count: COUNT,
            codec: codec.to_string(),
            transactions: 0,
            // kafka-python cannot guess the mock's version (PEERS.md).
            api_version: (client == PyClient::KafkaPython && matches!(peer, Peer::Mock(_)))
                .then(|| "2.0.0".to_string()),
        };
        tokio::task::spawn_blocking(move || run.run())
            .await
            .expect("join")
            .expect("the Python producer");
        let records = read_all(
            &peer,
            &topic,
            IsolationLevel::ReadUncommitted,
            COUNT as usize,
        )
        .await;
        let all: Vec<u64> = (0..COUNT).collect();
        check(
            &records,
            codec,
            &all,
            &format!("{} {client} {codec}", peer.name()),
        );
        println!(
            "{} {client} {codec}: {} records read back exactly",
            peer.name(),
            records.len()
        );
    }
}

const CONFLUENT_CODECS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];
const KAFKA_PYTHON_CODECS: [&str; 2] = ["none", "gzip"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_reads_what_confluent_kafka_writes_with_every_codec() {
    written_by(
        Peer::mock(1).expect("mock"),
        PyClient::Confluent,
        &CONFLUENT_CODECS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_reads_what_kafka_python_writes() {
    written_by(
        Peer::mock(1).expect("mock"),
        PyClient::KafkaPython,
        &KAFKA_PYTHON_CODECS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_reads_what_confluent_kafka_writes_with_every_codec() {
    written_by(
        Peer::tansu().expect("tansu"),
        PyClient::Confluent,
        &CONFLUENT_CODECS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_reads_what_kafka_python_writes() {
    written_by(
        Peer::tansu().expect("tansu"),
        PyClient::KafkaPython,
        &KAFKA_PYTHON_CODECS,
    )
    .await;
}

/// confluent-kafka writes in 9 transactions (lz4) and aborts every third: a
/// `read_committed` ottla consumer reads exactly the committed records, and a
/// `read_uncommitted` one reads all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_read_committed_over_confluent_kafka_transactions() {
    protocol_tests::init_tracing();
    let peer = Peer::tansu().expect("tansu");
    let topic = "interop-txn";
    peer.create_topic(topic, PARTITIONS).expect("topic");
    let run = PyProduce {
        client: PyClient::Confluent,
        bootstrap: peer.bootstrap(),
        topic: topic.to_string(),
        partitions: PARTITIONS,
        count: 900,
        codec: "lz4".into(),
        transactions: 9,
        api_version: None,
    };
    let aborted = tokio::task::spawn_blocking(move || run.run())
        .await
        .expect("join")
        .expect("the Python producer");
    assert_eq!(aborted.len(), 300, "three of nine transactions aborted");
    let committed: Vec<u64> = (0..900).filter(|i| !aborted.contains(i)).collect();
    let records = read_all(&peer, topic, IsolationLevel::ReadCommitted, committed.len()).await;
    check(&records, "lz4", &committed, "tansu read_committed");
    let records = read_all(&peer, topic, IsolationLevel::ReadUncommitted, 900).await;
    check(
        &records,
        "lz4",
        &(0..900).collect::<Vec<_>>(),
        "tansu read_uncommitted",
    );
}
