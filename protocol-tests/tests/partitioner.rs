//! ottla's partitioners place keys exactly where librdkafka's partitioners of the same
//! names do, so that a producer moved from librdkafka keeps every key on its partition.
//!
//! Two checks: librdkafka's partitioner functions themselves (in-process, test code
//! only) against ottla's choice for thousands of keys, empty ones included, and every
//! partition count from 1 to 100; and a whole round trip on the mock and on tansu, an
//! ottla producer and an rdkafka producer with the same `partitioner` setting sending
//! the same keys, each record's delivered partition compared.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::ptr;
use std::time::Duration;

use ottla::producer::{BuiltInPartitioner, Placement, Producer, ProducerRecord};
use protocol_tests::peer::Peer;
use rdkafka::ClientConfig as RdConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka_sys::bindings as rd;

type RdPartitioner = unsafe extern "C" fn(
    *const rd::rd_kafka_topic_t,
    *const c_void,
    usize,
    i32,
    *mut c_void,
    *mut c_void,
) -> i32;

/// librdkafka's own function for `p`.
fn librdkafka(p: BuiltInPartitioner) -> RdPartitioner {
    match p {
        BuiltInPartitioner::Random => rd::rd_kafka_msg_partitioner_random,
        BuiltInPartitioner::Consistent => rd::rd_kafka_msg_partitioner_consistent,
        BuiltInPartitioner::ConsistentRandom => rd::rd_kafka_msg_partitioner_consistent_random,
        BuiltInPartitioner::Murmur2 => rd::rd_kafka_msg_partitioner_murmur2,
        BuiltInPartitioner::Murmur2Random => rd::rd_kafka_msg_partitioner_murmur2_random,
        BuiltInPartitioner::Fnv1a => rd::rd_kafka_msg_partitioner_fnv1a,
        BuiltInPartitioner::Fnv1aRandom => rd::rd_kafka_msg_partitioner_fnv1a_random,
        other => panic!("no librdkafka partitioner for {other}"),
    }
}

/// The partition librdkafka's `rd_kafka_msg_partitioner` gives a record with `key`, or
/// `None` where it does not hash: the record goes to the sticky partition
/// (`sticky.partitioning.linger.ms`, on by default) or, under `random`, anywhere.
/// librdkafka leaves to the sticky partition a missing key under every partitioner but
/// consistent, murmur2 and fnv1a, and an empty key under consistent_random.
fn librdkafka_partition(p: BuiltInPartitioner, key: Option<&[u8]>, n: i32) -> Option<i32> {
    use BuiltInPartitioner as B;
    let hashes_missing = matches!(p, B::Consistent | B::Murmur2 | B::Fnv1a);
    match key {
        _ if p == B::Random => None,
        None if !hashes_missing => None,
        Some([]) if p == B::ConsistentRandom => None,
        _ => {
            let (data, len) = key.map_or((ptr::null(), 0), |k| (k.as_ptr().cast(), k.len()));
            // SAFETY: these branches of librdkafka's partitioners read `len` bytes of
            // `data` and nothing of the topic handle or the opaques (the branches that
            // would, the random ones, are the `None`s above).
            Some(unsafe {
                librdkafka(p)(ptr::null(), data, len, n, ptr::null_mut(), ptr::null_mut())
            })
        }
    }
}

/// Keys of every length from 0 to 40 bytes and every byte value, text keys as services
/// use them, and a missing key.
fn keys() -> Vec<Option<Vec<u8>>> {
    let mut keys = vec![None, Some(Vec::new())];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..3000u64 {
        if i % 2 == 0 {
            keys.push(Some(format!("customer-{i}").into_bytes()));
        } else {
            let len = (i % 41) as usize;
            let bytes = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            keys.push(Some(bytes));
        }
    }
    keys
}

#[test]
fn every_name_places_each_key_as_librdkafkas_function_for_1_to_100_partitions() {
    let keys = keys();
    let mut compared = 0u64;
    for p in BuiltInPartitioner::ALL {
        for n in 1..=100 {
            for key in &keys {
                let ours = p.place(key.as_deref(), n);
                match librdkafka_partition(p, key.as_deref(), n) {
                    Some(theirs) => {
                        assert_eq!(
                            ours,
                            Placement::Partition(theirs),
                            "{p}, {n} partitions, key {key:?}"
                        );
                        compared += 1;
                    }
                    // librdkafka sticks or picks at random; so must ottla (on one
                    // partition there is nothing to choose).
                    None if n > 1 => assert!(
                        matches!(ours, Placement::Sticky | Placement::Random),
                        "{p}, {n} partitions, key {key:?}: {ours:?}"
                    ),
                    None => assert_eq!(ours, Placement::Partition(0)),
                }
            }
        }
    }
    // Six names hash (all but random), each over ~3,000 keys (fewer where a key is
    // missing or empty) and 100 counts.
    assert!(compared > 6 * 2900 * 100, "{compared}");
}

/// Sends `keys` to `topic` with an rdkafka producer set to `partitioner`: each key's
/// delivered partition.
async fn with_rdkafka(
    peer: &Peer,
    partitioner: &str,
    topic: &str,
    keys: &[Vec<u8>],
) -> BTreeMap<Vec<u8>, i32> {
    let producer: FutureProducer = RdConfig::new()
        .set("bootstrap.servers", peer.bootstrap())
        .set("partitioner", partitioner)
        .set("message.timeout.ms", "60000")
        .create()
        .expect("rdkafka producer");
    let mut pending = Vec::new();
    for k in keys {
        let record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(topic).key(&k[..]).payload(&b"v"[..]);
        pending.push((k.clone(), producer.send_result(record).expect("queued")));
    }
    let mut out = BTreeMap::new();
    for (k, delivery) in pending {
        let delivery = delivery
            .await
            .expect("not cancelled")
            .unwrap_or_else(|(e, _)| panic!("rdkafka delivery: {e}"));
        out.insert(k, delivery.partition);
    }
    out
}

/// The same with ottla, its `partitioner` set by that name.
async fn with_ottla(
    peer: &Peer,
    partitioner: &str,
    topic: &str,
    keys: &[Vec<u8>],
) -> BTreeMap<Vec<u8>, i32> {
    let producer = Producer::builder(&peer.bootstrap())
        .set("partitioner", partitioner)
        .expect("a partitioner by its librdkafka name")
        .build()
        .await
        .expect("producer");
    let mut pending = Vec::new();
    for k in keys {
        let record = ProducerRecord::new(topic).key(k.clone()).value("v");
        pending.push((k.clone(), producer.send(record).await.expect("send")));
    }
    let mut out = BTreeMap::new();
    for (k, delivery) in pending {
        out.insert(k, delivery.await.expect("delivered").partition);
    }
    producer.close().await;
    out
}

/// Every hashing name, both clients, the same keys (the empty one too, except under
/// consistent_random, where librdkafka sticks it): the same partition for every key.
async fn each_name_lands_keys_where_librdkafka_does(peer: Peer) {
    protocol_tests::init_tracing();
    let partitions = 13;
    let mut keys: Vec<Vec<u8>> = (0..200)
        .map(|i| format!("order-{i}").into_bytes())
        .collect();
    keys.push(Vec::new());
    keys.push(vec![0xff; 17]);
    for p in BuiltInPartitioner::ALL {
        if p == BuiltInPartitioner::Random {
            continue;
        }
        let keys: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| !(k.is_empty() && p == BuiltInPartitioner::ConsistentRandom))
            .cloned()
            .collect();
        let ours = format!("keys-{}-ottla", p.name().replace('_', "-"));
        let theirs = format!("keys-{}-rdkafka", p.name().replace('_', "-"));
        peer.create_topic(&ours, partitions).expect("topic");
        peer.create_topic(&theirs, partitions).expect("topic");
        let by_ottla = with_ottla(&peer, p.name(), &ours, &keys).await;
        let by_rdkafka = with_rdkafka(&peer, p.name(), &theirs, &keys).await;
        assert_eq!(by_ottla.len(), keys.len());
        assert_eq!(
            by_ottla,
            by_rdkafka,
            "{}: {p}: same key, same partition",
            peer.name()
        );
        // The keys spread: a placement that ignored them would put all on one.
        let used: std::collections::BTreeSet<i32> = by_ottla.values().copied().collect();
        assert!(used.len() > partitions as usize / 2, "{p}: {used:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_each_partitioner_lands_keys_where_librdkafka_does() {
    each_name_lands_keys_where_librdkafka_does(Peer::mock(1).expect("mock")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_each_partitioner_lands_keys_where_librdkafka_does() {
    each_name_lands_keys_where_librdkafka_does(Peer::tansu().expect("tansu")).await;
}

/// `partitioner.ignore.keys` (Java): keyed records stick to one partition at a time,
/// as unkeyed ones do, instead of spreading by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_ignoring_keys_sticks_keyed_records_together() {
    protocol_tests::init_tracing();
    let peer = Peer::mock(1).expect("mock");
    peer.create_topic("ignored-keys", 8).expect("topic");
    let producer = Producer::builder(&peer.bootstrap())
        .set("partitioner.ignore.keys", "true")
        .expect("setting")
        .linger(Duration::from_millis(50))
        .build()
        .await
        .expect("producer");
    let mut pending = Vec::new();
    for i in 0..50 {
        let record = ProducerRecord::new("ignored-keys")
            .key(format!("order-{i}"))
            .value("v");
        pending.push(producer.send(record).await.expect("send"));
    }
    let mut used = std::collections::BTreeSet::new();
    for d in pending {
        used.insert(d.await.expect("delivered").partition);
    }
    producer.close().await;
    // 50 small records are far below one batch.size: one sticky partition.
    assert_eq!(used.len(), 1, "{used:?}");
}

#[test]
fn an_unknown_partitioner_name_is_refused_with_the_names() {
    let err = Producer::builder("h:1")
        .set("partitioner", "murmur3")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("partitioner") && err.contains("consistent_random"),
        "{err}"
    );
}
