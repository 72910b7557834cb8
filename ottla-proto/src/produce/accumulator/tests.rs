//! The accumulator's scenario tests, on hand-built responses and a virtual clock.

use crate::Failure;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::*;
use crate::fetch::batch::{BatchOptions, Batches};
use crate::metadata::{LeaderEpoch, PartitionMetadata, TopicMetadata};
use crate::produce::partitioner::{BuiltInPartitioner, Partitioner, crc32, partition_for_key};

fn metadata(partitions: i32) -> ClusterMetadata {
    let mut m = ClusterMetadata::default();
    m.topics.insert(
        "t".into(),
        TopicMetadata {
            name: "t".into(),
            id: uuid::Uuid::nil(),
            internal: false,
            partitions: (0..partitions)
                .map(|p| PartitionMetadata {
                    partition: p,
                    leader: Some(NodeId(1)),
                    leader_epoch: LeaderEpoch(0),
                    replicas: vec![],
                    isr: vec![],
                    error: 0,
                })
                .collect(),
            error: 0,
        },
    );
    m
}

fn record(v: &str) -> OutRecord {
    OutRecord {
        timestamp: 1,
        key: None,
        value: Some(Bytes::from(v.to_string())),
        headers: vec![],
    }
}

fn ready(config: ProducerConfig) -> (Accumulator, Instant) {
    let now = Instant::now();
    let mut a = Accumulator::new(config);
    a.update_metadata(&metadata(2));
    assert!(a.claim_producer_id(now));
    a.set_producer_id(now, Ok((42, 3)));
    (a, now)
}

fn answer(error: i16, base: i64) -> ProduceResponse {
    let mut p = PartitionProduceResponse::default();
    p.index = 0;
    p.error_code = error;
    p.base_offset = base;
    let mut t = TopicProduceResponse::default();
    t.name = TopicName(StrBytes::from_static_str("t"));
    t.partition_responses = vec![p];
    let mut r = ProduceResponse::default();
    r.responses = vec![t];
    r
}

fn sent_batch(r: &ProduceRequest) -> (i64, i16, i32, i32) {
    let records = r.topic_data[0].partition_data[0]
        .records
        .clone()
        .unwrap_or_default();
    let b = Batches::new(records, BatchOptions::default())
        .next()
        .expect("a batch")
        .expect("valid");
    (
        b.producer_id,
        b.producer_epoch,
        b.base_sequence,
        b.record_count,
    )
}

#[test]
fn metadata_is_asked_for_once_by_event_until_it_comes_or_the_refresh_fails() {
    let mut a = Accumulator::new(ProducerConfig::default());
    let now = Instant::now();
    assert!(
        a.append(now, "t", None, record("a")).is_err(),
        "unknown topic"
    );
    assert!(a.append(now, "t", None, record("b")).is_err());
    assert_eq!(a.poll_event(), Some(AccumulatorEvent::MetadataNeeded));
    assert_eq!(a.poll_event(), None, "asked once, not per record");
    a.metadata_failed();
    assert_eq!(
        a.poll_event(),
        Some(AccumulatorEvent::MetadataNeeded),
        "a failed refresh is asked for again"
    );
    a.update_metadata(&metadata(2));
    assert!(a.append(now, "t", None, record("c")).is_ok());
    assert_eq!(a.poll_event(), None);
    assert!(a.append(now, "u", None, record("d")).is_err());
    assert_eq!(a.poll_event(), Some(AccumulatorEvent::MetadataNeeded));
}

#[test]
fn a_batch_failing_again_and_again_backs_off_exponentially_to_the_cap() {
    // The pause before a retry was a flat `retry.backoff.ms`; Java doubles it with
    // each attempt of the batch up to `retry.backoff.max.ms` (KIP-580).
    let (mut a, now) = ready(ProducerConfig {
        linger: Duration::ZERO,
        ..ProducerConfig::default()
    });
    a.append(now, "t", Some(0), record("r")).unwrap();
    let mut at = now;
    let mut waits = Vec::new();
    for _ in 0..6 {
        assert_eq!(a.claim_ready(at), vec![NodeId(1)]);
        let (_, token) = a.build_produce(at, NodeId(1), 9).expect("an attempt");
        a.handle_failure(at, token, Failure::Timeout);
        let retry = a.poll_timeout().expect("a retry is timed");
        assert_eq!(
            a.claim_ready(retry - Duration::from_millis(1)),
            vec![],
            "not before its time"
        );
        waits.push((retry - at).as_millis() as u64);
        at = retry;
    }
    for (w, nominal) in waits.iter().zip([100u64, 200, 400, 800, 1000, 1000]) {
        assert!(*w >= nominal * 8 / 10 && *w <= 1000, "{waits:?}");
    }
    assert!(
        waits[0] < waits[1] && waits[1] < waits[2] && waits[2] < waits[3],
        "{waits:?}"
    );
}

#[test]
fn a_failed_init_producer_id_is_asked_again_after_a_growing_backoff() {
    // The driver used to sleep a flat `retry.backoff.ms`; the accumulator now
    // times the next InitProducerId itself.
    let mut a = Accumulator::new(ProducerConfig::default());
    let mut at = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..4 {
        assert!(a.claim_producer_id(at));
        assert!(!a.claim_producer_id(at), "one at a time");
        a.set_producer_id(at, Err(()));
        let again = a.poll_timeout().expect("the next attempt is timed");
        assert!(!a.claim_producer_id(again - Duration::from_millis(1)));
        waits.push((again - at).as_millis() as u64);
        at = again;
    }
    for (w, nominal) in waits.iter().zip([100u64, 200, 400, 800]) {
        assert!(
            *w >= nominal * 8 / 10 && *w < nominal * 12 / 10 + 1,
            "{waits:?}"
        );
    }
    assert!(a.claim_producer_id(at));
    a.set_producer_id(at, Ok((7, 0)));
    assert_eq!(a.poll_timeout(), None, "nothing waits once the id came");
}

#[test]
fn a_retried_batch_is_sent_again_with_the_same_sequence_numbers() {
    let (mut a, now) = ready(ProducerConfig::default());
    for i in 0..3 {
        a.append(now, "t", Some(0), record(&format!("r{i}")))
            .unwrap();
    }
    assert_eq!(a.claim_ready(now), vec![], "lingering");
    let later = now + Duration::from_millis(10);
    assert_eq!(a.claim_ready(later), vec![NodeId(1)]);
    let (req, token) = a.build_produce(later, NodeId(1), 9).expect("a request");
    assert_eq!(sent_batch(&req), (42, 3, 0, 3));
    assert_eq!(a.retries(), 0, "a first attempt is no retry");
    let first = req.topic_data[0].partition_data[0].records.clone();
    // More records meanwhile go to a new batch, held back behind the first.
    a.append(later, "t", Some(0), record("r3")).unwrap();
    a.handle_failure(later, token, Failure::Disconnected);
    let retry = later + Duration::from_secs(1);
    a.claim_ready(retry);
    let (req, token) = a.build_produce(retry, NodeId(1), 9).expect("the retry");
    assert_eq!(
        req.topic_data[0].partition_data[0].records, first,
        "byte for byte"
    );
    assert_eq!(a.retries(), 1, "counted once, for the one batch sent again");
    a.handle_produce(retry, token, answer(0, 100));
    let offsets: Vec<i64> = std::iter::from_fn(|| a.poll_delivery())
        .map(|d| d.result.unwrap())
        .collect();
    assert_eq!(offsets, vec![100, 101, 102]);
    a.claim_ready(retry);
    let (req, _) = a
        .build_produce(retry, NodeId(1), 9)
        .expect("the next batch");
    assert_eq!(
        sent_batch(&req),
        (42, 3, 3, 1),
        "sequence continues after 3 records"
    );
}

#[test]
fn a_duplicate_is_success_and_lost_state_renews_the_producer_id() {
    let (mut a, now) = ready(ProducerConfig {
        linger: Duration::ZERO,
        ..Default::default()
    });
    a.append(now, "t", Some(0), record("a")).unwrap();
    a.claim_ready(now);
    let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
    a.handle_produce(
        now,
        token,
        answer(ResponseError::DuplicateSequenceNumber.code(), -1),
    );
    assert_eq!(a.poll_delivery().map(|d| d.result), Some(Ok(-1)));
    a.append(now, "t", Some(0), record("b")).unwrap();
    a.claim_ready(now);
    let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
    a.handle_produce(
        now,
        token,
        answer(ResponseError::UnknownProducerId.code(), -1),
    );
    assert!(a.poll_delivery().is_none(), "not failed: sent again");
    let later = now + Duration::from_secs(1);
    assert_eq!(
        a.claim_ready(later),
        vec![],
        "nothing goes out without a new id"
    );
    assert!(a.claim_producer_id(now));
    a.set_producer_id(now, Ok((43, 0)));
    a.claim_ready(later);
    let (req, _) = a.build_produce(later, NodeId(1), 9).unwrap();
    assert_eq!(
        sent_batch(&req),
        (43, 0, 0, 1),
        "renumbered under the new id"
    );
}

#[test]
fn a_base_offset_near_i64_max_gives_unknown_offsets_not_an_overflow() {
    // Found by the `response` fuzz target: `base + i` overflowed (a panic in debug
    // builds) for a Produce answer with a base offset near i64::MAX.
    let (mut a, now) = ready(ProducerConfig {
        linger: Duration::ZERO,
        ..Default::default()
    });
    for v in ["a", "b", "c"] {
        a.append(now, "t", Some(0), record(v)).unwrap();
    }
    a.claim_ready(now);
    let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
    a.handle_produce(now, token, answer(0, i64::MAX - 1));
    let offsets: Vec<i64> = std::iter::from_fn(|| a.poll_delivery())
        .map(|d| d.result.unwrap())
        .collect();
    assert_eq!(offsets, vec![i64::MAX - 1, i64::MAX, -1]);
}

#[test]
fn buffer_memory_pushes_back_and_deliveries_free_it() {
    let (mut a, now) = ready(ProducerConfig {
        buffer_memory: 1000,
        linger: Duration::ZERO,
        ..Default::default()
    });
    let big = OutRecord {
        value: Some(Bytes::from(vec![0u8; 600])),
        ..record("")
    };
    a.append(now, "t", Some(0), big.clone()).unwrap();
    assert_eq!(
        a.append(now, "t", Some(0), big.clone()).map_err(|e| e.0),
        Err(AppendError::BufferFull)
    );
    a.claim_ready(now);
    let (_, token) = a.build_produce(now, NodeId(1), 9).unwrap();
    a.handle_produce(now, token, answer(0, 0));
    assert_eq!(a.buffered_bytes(), 0);
    a.append(now, "t", Some(0), big).unwrap();
}

#[test]
fn keyed_records_follow_murmur2_and_explicit_partitions_win() {
    let (mut a, now) = ready(ProducerConfig::default());
    let mut keyed = record("v");
    keyed.key = Some(Bytes::from_static(b"foobar"));
    let (_, tp) = a.append(now, "t", None, keyed.clone()).unwrap();
    assert_eq!(tp.partition, partition_for_key(b"foobar", 2));
    let (_, tp) = a.append(now, "t", Some(1), keyed).unwrap();
    assert_eq!(tp.partition, 1);
    assert!(matches!(
        a.append(now, "t", Some(5), record("x")),
        Err((AppendError::NoSuchPartition { .. }, _))
    ));
    assert!(matches!(
        a.append(now, "nope", None, record("x")),
        Err((AppendError::UnknownTopic(_), _))
    ));
}

/// Puts keys starting with `p` on partition 1, `x` on partition 9, and leaves the rest
/// to the built-in partitioner.
#[derive(Debug)]
struct ByFirstByte;

impl Partitioner for ByFirstByte {
    fn partition(&self, topic: &str, key: Option<&[u8]>, partitions: i32) -> Option<i32> {
        assert_eq!((topic, partitions), ("t", 2));
        match key?.first()? {
            b'p' => Some(1),
            b'x' => Some(9),
            _ => None,
        }
    }
}

#[test]
fn a_custom_partitioner_is_asked_first_and_none_leaves_the_record_to_the_built_in_one() {
    let (mut a, now) = ready(ProducerConfig {
        partitioner: BuiltInPartitioner::Consistent,
        custom_partitioner: Some(std::sync::Arc::new(ByFirstByte)),
        ..Default::default()
    });
    let keyed = |k: &'static [u8]| {
        let mut r = record("v");
        r.key = Some(Bytes::from_static(k));
        r
    };
    // "p..." by the custom one, although consistent puts it on 0.
    let p: &'static [u8] = [&b"pear"[..], b"plum", b"peach", b"papaya", b"prune"]
        .into_iter()
        .find(|k| crc32(k) % 2 == 0)
        .unwrap();
    assert_eq!(a.append(now, "t", None, keyed(p)).unwrap().1.partition, 1);
    // Left to consistent: CRC-32, not murmur2 (the two differ for this key).
    let k: &'static [u8] = [&b"key-1"[..], b"key-2", b"key-3", b"key-4", b"key-5"]
        .into_iter()
        .find(|k| crc32(k) % 2 != partition_for_key(k, 2) as u32)
        .unwrap();
    let (_, tp) = a.append(now, "t", None, keyed(k)).unwrap();
    assert_eq!(tp.partition as u32, crc32(k) % 2);
    // A partition the topic does not have fails that record only.
    assert!(matches!(
        a.append(now, "t", None, keyed(b"xylophone")),
        Err((
            AppendError::NoSuchPartition {
                partition: 9,
                partitions: 2,
                ..
            },
            _
        ))
    ));
    // An explicit partition still wins over both.
    assert_eq!(
        a.append(now, "t", Some(0), keyed(b"pear"))
            .unwrap()
            .1
            .partition,
        0
    );
}

#[test]
fn ignoring_keys_sends_keyed_records_to_the_sticky_partition() {
    let (mut a, now) = ready(ProducerConfig {
        ignore_keys: true,
        ..Default::default()
    });
    // Keys that murmur2 spreads over both partitions all land on one.
    let parts: std::collections::BTreeSet<i32> = (0..20)
        .map(|i| {
            let mut r = record("v");
            r.key = Some(Bytes::from(format!("k{i}")));
            a.append(now, "t", None, r).unwrap().1.partition
        })
        .collect();
    assert_eq!(parts.len(), 1, "{parts:?}");
    let spread: std::collections::BTreeSet<i32> = (0..20)
        .map(|i| partition_for_key(format!("k{i}").as_bytes(), 2))
        .collect();
    assert_eq!(spread.len(), 2);
}

#[test]
fn an_expired_batch_fails_with_a_timeout() {
    let (mut a, now) = ready(ProducerConfig {
        delivery_timeout: Duration::from_secs(1),
        ..Default::default()
    });
    a.append(now, "t", Some(0), record("a")).unwrap();
    a.handle_timeout(now + Duration::from_secs(2));
    assert!(matches!(
        a.poll_delivery().map(|d| d.result),
        Some(Err(ProduceError::Timeout { .. }))
    ));
    assert!(a.is_idle());
}

#[test]
fn records_behind_a_connection_no_retry_fixes_fail_with_the_drivers_error_kept_whole() {
    // The core keeps the IO layer's error opaque (it names no type of the driver's), and
    // the driver gets it back typed.
    let (mut a, now) = ready(ProducerConfig::default());
    a.append(now, "t", Some(0), record("x")).unwrap();
    let cause = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "SASL refused");
    let failure = ConnectionFailure::new(cause);
    a.fail_all(&failure);
    let d = a
        .poll_delivery()
        .expect("failed now, not at delivery.timeout.ms");
    let Err(ProduceError::Connection(f)) = d.result else {
        panic!("{:?}", d.result)
    };
    assert_eq!(f, failure);
    let io = f
        .downcast_ref::<std::io::Error>()
        .expect("the driver's type");
    assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
    assert_eq!(f.to_string(), "SASL refused");
}

/// A transactional accumulator: its producer id comes from the transaction manager.
fn transactional() -> (Accumulator, Instant) {
    let now = Instant::now();
    let mut a = Accumulator::new(ProducerConfig {
        transactional_id: Some("tx-1".into()),
        ..ProducerConfig::default()
    });
    a.update_metadata(&metadata(2));
    (a, now)
}

#[test]
fn transactional_takes_its_producer_id_from_the_manager_never_its_own_init() {
    let (mut a, now) = transactional();
    a.append(now, "t", Some(0), record("a")).expect("append");
    a.flush();
    assert!(
        !a.claim_producer_id(now),
        "the manager's InitProducerId carries the id"
    );
    assert!(
        a.claim_ready(now).is_empty(),
        "nothing goes before the producer id"
    );
    a.set_producer_id(now, Ok((77, 5)));
    assert_eq!(a.claim_ready(now), vec![NodeId(1)]);
}

#[test]
fn transactional_batches_carry_the_bit_and_the_request_the_id() {
    let (mut a, now) = transactional();
    a.set_producer_id(now, Ok((77, 5)));
    a.append(now, "t", Some(0), record("a")).expect("append");
    a.flush();
    assert_eq!(a.claim_ready(now), vec![NodeId(1)]);
    let (r, _) = a.build_produce(now, NodeId(1), 9).expect("request");
    assert_eq!(
        r.transactional_id.as_ref().map(|t| t.0.as_str()),
        Some("tx-1")
    );
    let records = r.topic_data[0].partition_data[0]
        .records
        .clone()
        .unwrap_or_default();
    let b = Batches::new(records, BatchOptions::default())
        .next()
        .expect("a batch")
        .expect("valid");
    assert!(b.is_transactional());
    assert_eq!(
        (b.producer_id, b.producer_epoch, b.base_sequence),
        (77, 5, 0)
    );

    // An idempotent producer's batches are not transactional.
    let (mut plain, now) = ready(ProducerConfig::default());
    plain
        .append(now, "t", Some(0), record("a"))
        .expect("append");
    plain.flush();
    plain.claim_ready(now);
    let (r, _) = plain.build_produce(now, NodeId(1), 9).expect("request");
    assert_eq!(r.transactional_id, None);
    let records = r.topic_data[0].partition_data[0]
        .records
        .clone()
        .unwrap_or_default();
    let b = Batches::new(records, BatchOptions::default())
        .next()
        .expect("a batch")
        .expect("valid");
    assert!(!b.is_transactional());
}

#[test]
fn gated_partitions_wait_until_the_gate_opens() {
    let (mut a, now) = transactional();
    a.set_producer_id(now, Ok((77, 5)));
    a.append(now, "t", Some(0), record("a")).expect("append");
    a.append(now, "t", Some(1), record("b")).expect("append");
    a.flush();
    let p0 = TopicPartition::new("t", 0);
    assert!(
        a.claim_ready_gated(now, |_| false).is_empty(),
        "no partition added to the transaction yet"
    );
    assert_eq!(a.claim_ready_gated(now, |tp| *tp == p0), vec![NodeId(1)]);
    let (r, _) = a
        .build_produce_gated(now, NodeId(1), 9, |tp| *tp == p0)
        .expect("request");
    let partitions: Vec<i32> = r.topic_data[0]
        .partition_data
        .iter()
        .map(|p| p.index)
        .collect();
    assert_eq!(
        partitions,
        vec![0],
        "partition 1 waits for its AddPartitionsToTxn"
    );
}

#[test]
fn transactional_sequence_errors_fail_the_batch_instead_of_a_new_producer_id() {
    for error in [
        ResponseError::OutOfOrderSequenceNumber,
        ResponseError::UnknownProducerId,
        ResponseError::InvalidProducerEpoch,
    ] {
        let (mut a, now) = transactional();
        a.set_producer_id(now, Ok((77, 5)));
        a.append(now, "t", Some(0), record("a")).expect("append");
        a.flush();
        a.claim_ready(now);
        let (_, token) = a.build_produce(now, NodeId(1), 9).expect("request");
        a.handle_produce(now, token, answer(error.code(), -1));
        let d = a.poll_delivery().expect("the batch fails");
        assert_eq!(
            d.result,
            Err(ProduceError::Broker {
                topic: "t".into(),
                partition: 0,
                code: error.code()
            }),
            "{error:?}"
        );
        assert!(
            !a.claim_producer_id(now),
            "{error:?}: the manager, not the accumulator, moves the epoch"
        );
        assert!(a.is_idle());
    }
}

#[test]
fn abort_undrained_fails_unsent_batches_and_keeps_those_sent() {
    let (mut a, now) = transactional();
    a.set_producer_id(now, Ok((77, 5)));
    a.append(now, "t", Some(0), record("sent")).expect("append");
    a.flush();
    a.claim_ready(now);
    let (_, token) = a.build_produce(now, NodeId(1), 9).expect("request");
    a.append(now, "t", Some(0), record("queued"))
        .expect("append");
    a.append(now, "t", Some(1), record("other"))
        .expect("append");
    a.abort_undrained();
    let mut failed = Vec::new();
    while let Some(d) = a.poll_delivery() {
        assert_eq!(d.result, Err(ProduceError::Aborted));
        failed.push(d.partition.partition);
    }
    failed.sort();
    assert_eq!(failed, vec![0, 1], "the two unsent records");
    assert!(!a.is_idle(), "the batch in flight keeps its fate");
    a.handle_produce(now, token, answer(0, 10));
    assert_eq!(a.poll_delivery().map(|d| d.result), Some(Ok(10)));
    assert!(a.is_idle());
}

#[test]
fn a_past_linger_does_not_wake_the_driver_while_the_partition_waits_for_an_answer() {
    // An open batch behind a Produce in flight (its partition's, or its leader's) can
    // go only after the answer. Its linger, already past, made `poll_timeout` return a
    // time in the past, and the driver looped without sleeping until the answer came:
    // 10,000 records of 1 KiB per transaction cost about 40 µs of CPU each
    // (docs/benchmarks.md, bench-txn).
    let linger = Duration::from_millis(5);
    let (mut a, now) = ready(ProducerConfig {
        linger,
        ..ProducerConfig::default()
    });
    a.append(now, "t", Some(0), record("a")).unwrap();
    let sent_at = now + linger;
    assert_eq!(a.claim_ready(sent_at), vec![NodeId(1)]);
    let (_, token) = a.build_produce(sent_at, NodeId(1), 9).expect("sent");
    // Behind the batch in flight, and on the same leader.
    a.append(sent_at, "t", Some(0), record("b")).unwrap();
    a.append(sent_at, "t", Some(1), record("c")).unwrap();
    let answered_at = sent_at + 10 * linger;
    assert!(
        a.poll_timeout().expect("the delivery timeout is timed") > answered_at,
        "no wake-up before the answer"
    );
    a.handle_produce(answered_at, token, answer(0, 0));
    assert_eq!(
        a.poll_timeout(),
        Some(sent_at + linger),
        "answered, the lingers count again"
    );
    assert_eq!(a.claim_ready(answered_at), vec![NodeId(1)]);
}
