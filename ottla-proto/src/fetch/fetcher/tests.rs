//! Scenario tests of the fetcher against hand-built responses. The same paths run
//! against the mock cluster and tansu in `protocol-tests/tests/consumer.rs`.

use crate::Failure;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record as KRecord, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType as KTimestampType,
};

use super::*;
use crate::metadata::{LeaderEpoch, PartitionMetadata, TopicMetadata};

const T: &str = "t";

fn tp(p: i32) -> TopicPartition {
    TopicPartition {
        topic: T.into(),
        partition: p,
    }
}

fn batch(first: i64, n: i64) -> Bytes {
    let records: Vec<KRecord> = (first..first + n)
        .map(|o| KRecord {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 4,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: KTimestampType::Creation,
            offset: o,
            sequence: o as i32,
            timestamp: 1000 + o,
            key: Some(Bytes::from(format!("k{o}"))),
            value: Some(Bytes::from(format!("v{o}"))),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("encode");
    buf.freeze()
}

fn metadata(leaders: &[(i32, i32)]) -> ClusterMetadata {
    let mut m = ClusterMetadata::default();
    m.topics.insert(
        T.into(),
        TopicMetadata {
            name: T.into(),
            id: Uuid::from_u128(7),
            internal: false,
            partitions: leaders
                .iter()
                .enumerate()
                .map(|(p, &(leader, epoch))| PartitionMetadata {
                    partition: p as i32,
                    leader: Some(NodeId(leader)),
                    leader_epoch: LeaderEpoch(epoch),
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

fn response(session: i32, parts: Vec<(i32, i16, Option<Bytes>)>) -> FetchResponse {
    let mut topic = FetchableTopicResponse::default();
    topic.topic = TopicName(StrBytes::from_static_str(T));
    topic.topic_id = Uuid::from_u128(7);
    topic.partitions = parts
        .into_iter()
        .map(|(p, error, records)| {
            let mut d = PartitionData::default();
            d.partition_index = p;
            d.error_code = error;
            d.high_watermark = 100;
            d.last_stable_offset = 100;
            d.records = records;
            d
        })
        .collect();
    let mut r = FetchResponse::default();
    r.session_id = session;
    r.responses = vec![topic];
    r
}

/// `response` with each partition's high watermark set.
fn response_hw(session: i32, parts: Vec<(i32, Option<Bytes>, i64)>) -> FetchResponse {
    let hws: Vec<i64> = parts.iter().map(|p| p.2).collect();
    let mut r = response(
        session,
        parts.into_iter().map(|(p, b, _)| (p, 0, b)).collect(),
    );
    for (d, hw) in r.responses[0].partitions.iter_mut().zip(hws) {
        d.high_watermark = hw;
        d.last_stable_offset = hw;
    }
    r
}

/// A fetcher with partitions 0 and 1 led by node 1, both at offset 0.
fn started(config: FetcherConfig) -> (Fetcher, Instant) {
    let now = Instant::now();
    let mut f = Fetcher::new(config);
    f.assign(&[tp(0), tp(1)], true);
    f.set_committed(&tp(0), 0, -1);
    f.set_committed(&tp(1), 0, -1);
    f.update_metadata(&metadata(&[(1, 5), (1, 5)]));
    (f, now)
}

/// The partitions of a request in the order sent.
fn sent_in_order(r: &FetchRequest) -> Vec<(i32, i64)> {
    r.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (p.partition, p.fetch_offset)))
        .collect()
}

/// The partitions of a request, sorted (requests turn their order).
fn sent(r: &FetchRequest) -> Vec<(i32, i64)> {
    let mut v = sent_in_order(r);
    v.sort_unstable();
    v
}

fn drain(f: &mut Fetcher) -> Vec<(i32, i64)> {
    std::iter::from_fn(|| f.next_record())
        .map(|r| {
            let r = r.expect("a record");
            (r.partition(), r.offset())
        })
        .collect()
}

/// A fetcher with partitions `0..n` of `T` led by node 1, each at offset 0.
fn started_many(n: i32) -> (Fetcher, Instant) {
    let now = Instant::now();
    let mut f = Fetcher::new(FetcherConfig::default());
    let all: Vec<TopicPartition> = (0..n).map(tp).collect();
    f.assign(&all, true);
    for p in &all {
        f.set_committed(p, 0, -1);
    }
    f.update_metadata(&metadata(&vec![(1, 5); n as usize]));
    (f, now)
}

#[test]
fn a_large_response_updates_quiet_partitions_and_buffers_the_others_in_response_order() {
    // Most entries of a large fetch carry no records; they are taken in one ordered
    // walk, the rest one by one, in the order the broker sent them.
    let (mut f, now) = started_many(300);
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
    let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!(sent(&req).len(), 300);
    // Partition 7 was sought while the fetch was out: its entry is stale.
    f.seek(&tp(7), 3);
    let mut parts: Vec<(i32, Option<Bytes>, i64)> = (0..300)
        .rev()
        .map(|p| (p, None, 10 + i64::from(p)))
        .collect();
    parts.push((250, Some(batch(0, 2)), 2));
    parts.insert(0, (40, Some(batch(0, 3)), 3));
    parts.retain(|(p, b, _)| !(b.is_none() && (*p == 250 || *p == 40)));
    let mut response = response_hw(0, parts);
    // An error on one entry goes the slow way too.
    if let Some(d) = response.responses[0]
        .partitions
        .iter_mut()
        .find(|d| d.partition_index == 9)
    {
        d.error_code = ResponseError::UnknownServerError.code();
    }
    f.handle_fetch(now, token, response);
    assert_eq!(
        drain(&mut f),
        vec![(40, 0), (40, 1), (40, 2), (250, 0), (250, 1)]
    );
    assert_eq!(f.lag(&tp(0)), Some(10));
    assert_eq!(f.lag(&tp(299)), Some(309));
    assert_eq!(
        f.watermarks(&tp(7)),
        Some((-1, -1, -1)),
        "stale entry ignored"
    );
    assert_eq!(f.lag(&tp(9)), None, "the error left it unknown");
    assert!(f.poll_timeout().is_some(), "the failed partition retries");
}

#[test]
fn leaders_are_found_in_metadata_whatever_its_order() {
    let mut f = Fetcher::new(FetcherConfig::default());
    f.assign(&[tp(0), tp(1), tp(2)], true);
    let mut m = metadata(&[(1, 5), (2, 5), (3, 5)]);
    if let Some(t) = m.topics.get_mut(T) {
        t.partitions.reverse();
    }
    f.update_metadata(&m);
    for p in 0..3 {
        f.set_committed(&tp(p), 0, -1);
    }
    let now = Instant::now();
    assert_eq!(f.claim_fetches(now), vec![NodeId(1), NodeId(2), NodeId(3)]);
}

#[test]
fn resets_and_retries_are_found_after_the_passes_skip() {
    // resets_due and poll_timeout skip their passes while nothing can be due; a
    // reset or a retry set later is still found.
    let (mut f, now) = started(FetcherConfig {
        reset: OffsetReset::Earliest,
        ..FetcherConfig::default()
    });
    assert_eq!(f.resets_due(now), vec![]);
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
    assert_eq!(f.poll_timeout(), None);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(
        now,
        token,
        response(
            0,
            vec![
                (0, ResponseError::OffsetOutOfRange.code(), None),
                (1, ResponseError::UnknownServerError.code(), None),
            ],
        ),
    );
    assert!(f.poll_timeout().is_some(), "partition 1 backs off");
    assert_eq!(f.resets_due(now), vec![NodeId(1)], "partition 0 resets");
}

#[test]
fn incremental_sessions_send_only_what_changed_and_forget_what_stopped() {
    let (mut f, now) = started(FetcherConfig::default());
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
    assert_eq!(f.claim_fetches(now), vec![], "one fetch per broker");
    let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!(
        (req.session_id, req.session_epoch),
        (0, 0),
        "full, asks for a session"
    );
    assert_eq!(sent(&req), vec![(0, 0), (1, 0)]);
    assert_eq!(
        req.topics[0].topic_id,
        Uuid::from_u128(7),
        "v16 names topics by id"
    );
    assert_eq!(req.topics[0].partitions[0].current_leader_epoch, 5);
    f.handle_fetch(
        now,
        token,
        response(55, vec![(0, 0, Some(batch(0, 3))), (1, 0, None)]),
    );
    // Partition 0 has buffered data, so the next fetch has only partition 1, which
    // the session already holds at offset 0: nothing to send, partition 0 forgotten.
    f.claim_fetches(now);
    let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!((req.session_id, req.session_epoch), (55, 1));
    assert_eq!(sent(&req), vec![]);
    assert_eq!(req.forgotten_topics_data[0].partitions, vec![0]);
    f.handle_fetch(now, token, response(55, vec![]));
    assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
    assert_eq!(f.position(&tp(0)), Some((3, 4)));
    f.claim_fetches(now);
    let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!((req.session_id, req.session_epoch), (55, 2));
    assert_eq!(
        sent(&req),
        vec![(0, 3)],
        "partition 0 comes back at its new offset"
    );
    assert!(req.forgotten_topics_data.is_empty());
}

#[test]
fn a_session_error_starts_over_with_a_full_fetch() {
    let (mut f, now) = started(FetcherConfig::default());
    f.claim_fetches(now);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(now, token, response(55, vec![]));
    f.claim_fetches(now);
    let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!(req.session_id, 55);
    let mut r = response(0, vec![]);
    r.error_code = ResponseError::InvalidFetchSessionEpoch.code();
    f.handle_fetch(now, token, r);
    assert_eq!(
        f.claim_fetches(now),
        vec![NodeId(1)],
        "no backoff for a session reset"
    );
    let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!((req.session_id, req.session_epoch), (0, 0));
    assert_eq!(sent(&req), vec![(0, 0), (1, 0)]);
}

#[test]
fn a_broker_without_sessions_gets_full_fetches_and_old_versions_get_names() {
    let (mut f, now) = started(FetcherConfig::default());
    f.claim_fetches(now);
    let (req, token) = f.build_fetch(now, NodeId(1), 11).expect("a fetch");
    assert_eq!(req.topics[0].topic.0.as_str(), T);
    f.handle_fetch(now, token, response(0, vec![]));
    f.claim_fetches(now);
    let (req, _) = f.build_fetch(now, NodeId(1), 11).expect("a fetch");
    assert_eq!((req.session_id, req.session_epoch), (0, 0));
    assert_eq!(
        sent(&req),
        vec![(0, 0), (1, 0)],
        "every partition, every time"
    );
}

#[test]
fn paused_partitions_are_not_fetched_and_their_records_wait() {
    let (mut f, now) = after_first_fetch(response(
        0,
        vec![(0, 0, Some(batch(0, 2))), (1, 0, Some(batch(0, 2)))],
    ));
    f.pause(now, &tp(0));
    assert_eq!(drain(&mut f), vec![(1, 0), (1, 1)]);
    f.claim_fetches(now);
    let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!(
        sent(&req),
        vec![(1, 2)],
        "the paused partition is not fetched"
    );
    f.resume(&tp(0));
    assert_eq!(drain(&mut f), vec![(0, 0), (0, 1)]);
}

#[test]
fn a_full_buffer_stops_fetching_until_the_application_drains_it() {
    let config = FetcherConfig {
        buffer_max_bytes: 100,
        ..Default::default()
    };
    let (mut f, now) = started(config);
    f.claim_fetches(now);
    let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!(req.max_bytes, 100, "asks for no more than the room left");
    let data = batch(0, 10);
    assert!(data.len() > 100);
    f.handle_fetch(now, token, response(0, vec![(1, 0, Some(data))]));
    assert!(f.buffered_bytes() > 100);
    assert_eq!(f.claim_fetches(now), vec![], "over the cap: no fetch");
    assert_eq!(drain(&mut f).len(), 10);
    assert_eq!(f.buffered_bytes(), 0);
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
}

#[test]
fn out_of_range_resets_through_list_offsets_with_an_event() {
    let config = FetcherConfig {
        reset: OffsetReset::Earliest,
        ..Default::default()
    };
    let (mut f, now) = started(config);
    while f.poll_event().is_some() {}
    f.claim_fetches(now);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(
        now,
        token,
        response(0, vec![(0, ResponseError::OffsetOutOfRange.code(), None)]),
    );
    assert_eq!(f.position(&tp(0)), None, "no position until the reset");
    assert_eq!(f.resets_due(now), vec![NodeId(1)]);
    let req = f
        .build_list_offsets(now, NodeId(1), 7)
        .expect("a ListOffsets");
    let p = &req.topics[0].partitions[0];
    assert_eq!((p.partition_index, p.timestamp), (0, -2), "earliest");
    assert_eq!(f.resets_due(now), vec![], "already resetting");
    let mut part = ListOffsetsPartitionResponse::default();
    part.partition_index = 0;
    part.offset = 40;
    part.leader_epoch = 5;
    let mut topic = ListOffsetsTopicResponse::default();
    topic.name = TopicName(StrBytes::from_static_str(T));
    topic.partitions = vec![part];
    let mut resp = ListOffsetsResponse::default();
    resp.topics = vec![topic];
    f.handle_list_offsets(now, NodeId(1), resp);
    assert_eq!(f.position(&tp(0)), Some((40, 5)));
    assert_eq!(
        f.poll_event(),
        Some(FetcherEvent::OffsetReset {
            partition: tp(0),
            reason: ResetReason::OutOfRange { offset: 0 },
            offset: 40
        })
    );
}

#[test]
fn out_of_range_with_reset_none_stops_the_partition_with_an_error() {
    let config = FetcherConfig {
        reset: OffsetReset::None,
        ..Default::default()
    };
    let (mut f, now) = started(config);
    f.claim_fetches(now);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(
        now,
        token,
        response(
            0,
            vec![
                (0, ResponseError::OffsetOutOfRange.code(), None),
                (1, 0, Some(batch(0, 1))),
            ],
        ),
    );
    assert!(matches!(
        f.next_record(),
        Some(Err(FetchError::OutOfRange {
            partition: 0,
            offset: 0,
            ..
        }))
    ));
    assert_eq!(drain(&mut f), vec![(1, 0)], "other partitions go on");
    f.claim_fetches(now);
    let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!(
        sent(&req),
        vec![(1, 1)],
        "the stopped partition is not fetched"
    );
    f.seek(&tp(0), 0);
    assert_eq!(f.position(&tp(0)), Some((0, -1)), "a seek restarts it");
}

#[test]
fn leadership_errors_refresh_metadata_and_fetch_from_the_new_leader() {
    let (mut f, now) = started(FetcherConfig::default());
    while f.poll_event().is_some() {}
    f.claim_fetches(now);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(
        now,
        token,
        response(
            0,
            vec![
                (0, ResponseError::NotLeaderOrFollower.code(), None),
                (1, 0, None),
            ],
        ),
    );
    assert_eq!(f.poll_event(), Some(FetcherEvent::MetadataNeeded));
    f.update_metadata(&metadata(&[(2, 6), (1, 5)]));
    let later = now + Duration::from_secs(1);
    assert_eq!(f.claim_fetches(later), vec![NodeId(1), NodeId(2)]);
    let (req, _) = f.build_fetch(later, NodeId(2), 16).expect("a fetch");
    assert_eq!(sent(&req), vec![(0, 0)]);
    assert_eq!(req.topics[0].partitions[0].current_leader_epoch, 6);
    // Stale metadata (an older epoch) does not move the leader back.
    f.update_metadata(&metadata(&[(1, 5), (1, 5)]));
    f.handle_failure(later, FetcherRequest::Fetch(NodeId(2)), Failure::Timeout);
    let (req, _) = {
        f.fetching.remove(&NodeId(1));
        let later = later + Duration::from_secs(1);
        f.claim_fetches(later);
        f.build_fetch(later, NodeId(2), 16).expect("still node 2")
    };
    assert_eq!(sent(&req), vec![(0, 0)]);
}

#[test]
fn a_broker_failing_again_and_again_is_fetched_from_after_a_doubling_backoff() {
    // A flat `retry.backoff.ms` after each failed Fetch; now it doubles with each
    // failure in a row up to `retry.backoff.max.ms` (KIP-580), and an answer resets
    // it.
    let (mut f, now) = started(FetcherConfig::default());
    let mut at = now;
    let mut waits = Vec::new();
    for _ in 0..5 {
        assert_eq!(f.claim_fetches(at), vec![NodeId(1)]);
        f.build_fetch(at, NodeId(1), 16).expect("a fetch");
        f.handle_failure(at, FetcherRequest::Fetch(NodeId(1)), Failure::Disconnected);
        let again = f.poll_timeout().expect("the broker's backoff is timed");
        assert_eq!(f.claim_fetches(again - Duration::from_millis(1)), vec![]);
        waits.push((again - at).as_millis() as u64);
        at = again;
    }
    for (w, nominal) in waits.iter().zip([100u64, 200, 400, 800, 1000]) {
        assert!(*w >= nominal * 8 / 10 && *w <= 1000, "{waits:?}");
    }
    assert!(waits[0] < waits[1] && waits[1] < waits[2], "{waits:?}");
    // An answer resets the step.
    assert_eq!(f.claim_fetches(at), vec![NodeId(1)]);
    let (_, token) = f.build_fetch(at, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(at, token, response(0, vec![(0, 0, None), (1, 0, None)]));
    assert_eq!(f.claim_fetches(at), vec![NodeId(1)]);
    f.build_fetch(at, NodeId(1), 16).expect("a fetch");
    f.handle_failure(at, FetcherRequest::Fetch(NodeId(1)), Failure::Disconnected);
    let again = f.poll_timeout().expect("timed");
    assert!(
        (again - at) < Duration::from_millis(121),
        "{:?}",
        again - at
    );
}

#[test]
fn consumed_positions_are_those_of_the_last_poll() {
    // What a commit reads: everything delivered before the application came back
    // (mark_consumed), never the record it holds now.
    let (mut f, now) = after_first_fetch(response_hw(
        55,
        vec![(0, Some(batch(0, 3)), 3), (1, None, 0)],
    ));
    let at = |f: &Fetcher| f.consumed(Some(&[tp(0)]));
    assert_eq!(
        at(&f),
        vec![(tp(0), 0, -1)],
        "the committed offset, at once"
    );
    assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(0)));
    assert_eq!(
        at(&f),
        vec![(tp(0), 0, -1)],
        "record 0 is in the application's hands"
    );
    f.mark_consumed();
    assert_eq!(at(&f), vec![(tp(0), 1, 4)]);
    assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(1)));
    assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(2)));
    assert_eq!(at(&f), vec![(tp(0), 1, 4)], "two more in hand, one poll");
    f.mark_consumed();
    f.mark_consumed();
    assert_eq!(
        at(&f),
        vec![(tp(0), 3, 4)],
        "rounds without records keep it"
    );
    // A seek counts from the next poll, as a delivery does.
    f.seek(&tp(0), 1);
    assert_eq!(at(&f), vec![(tp(0), 3, 4)]);
    f.mark_consumed();
    assert_eq!(at(&f), vec![(tp(0), 1, -1)]);
    assert_eq!(
        f.consumed(None),
        vec![(tp(0), 1, -1), (tp(1), 0, -1)],
        "every partition with a position"
    );
    let _ = now;
}

#[test]
fn a_batch_of_records_ends_before_the_error_which_comes_next() {
    // next_records hands out the good records and keeps the error for the next
    // call, also when `out` held records before the call.
    let corrupt_after_two = || {
        let (mut f, now) = started(FetcherConfig::default());
        f.claim_fetches(now);
        let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        let mut bad = batch(2, 2).to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        let mut both = batch(0, 2).to_vec();
        both.extend_from_slice(&bad);
        f.handle_fetch(
            now,
            token,
            response(0, vec![(0, 0, Some(Bytes::from(both)))]),
        );
        f
    };
    let mut f = corrupt_after_two();
    let mut out = Vec::new();
    assert_eq!(f.next_records(10, &mut out), None, "records first");
    assert_eq!(out.iter().map(|r| r.offset()).collect::<Vec<_>>(), [0, 1]);
    assert!(matches!(
        f.next_records(10, &mut Vec::new()),
        Some(FetchError::Corrupt { offset: 2, .. })
    ));
    // A caller's `out` that already holds a record: the error waits too.
    let mut f = corrupt_after_two();
    let mut out = Vec::new();
    assert_eq!(f.next_records(1, &mut out), None);
    assert_eq!(f.next_records(5, &mut out), None, "out is not empty");
    assert_eq!(out.len(), 2);
    let mut fresh = Vec::new();
    assert!(matches!(
        f.next_records(5, &mut fresh),
        Some(FetchError::Corrupt { .. })
    ));
    assert!(fresh.is_empty());
}

#[test]
fn a_corrupt_batch_is_a_typed_error_and_the_position_stays() {
    let (mut f, now) = started(FetcherConfig::default());
    f.claim_fetches(now);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    let good = batch(0, 2);
    let mut bad = batch(2, 2).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    let mut both = good.to_vec();
    both.extend_from_slice(&bad);
    f.handle_fetch(
        now,
        token,
        response(0, vec![(0, 0, Some(Bytes::from(both)))]),
    );
    assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(0)));
    assert_eq!(f.next_record().map(|r| r.map(|r| r.offset())), Some(Ok(1)));
    match f.next_record() {
        Some(Err(FetchError::Corrupt {
            topic,
            partition,
            offset,
            ..
        })) => assert_eq!((topic.as_str(), partition, offset), (T, 0, 2)),
        other => panic!("{other:?}"),
    }
    assert_eq!(f.next_record(), None);
    assert!(f.is_stopped(&tp(0)));
    assert_eq!(
        f.position(&tp(0)),
        Some((2, 4)),
        "stopped, not moved past the batch"
    );
    f.mark_consumed();
    assert_eq!(
        f.consumed(Some(&[tp(0)])),
        vec![(tp(0), 2, 4)],
        "commits stop before it"
    );
}

#[test]
fn data_fetched_before_a_seek_is_dropped() {
    let (mut f, now) = started(FetcherConfig::default());
    f.claim_fetches(now);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.seek(&tp(0), 50);
    f.handle_fetch(now, token, response(0, vec![(0, 0, Some(batch(0, 2)))]));
    assert_eq!(drain(&mut f), vec![]);
    assert_eq!(f.position(&tp(0)), Some((50, -1)));
    assert_eq!(f.buffered_bytes(), 0);
}

#[test]
fn records_before_the_position_in_a_batch_are_skipped() {
    let (mut f, now) = started(FetcherConfig::default());
    f.seek(&tp(0), 3);
    f.claim_fetches(now);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(now, token, response(0, vec![(0, 0, Some(batch(0, 5)))]));
    assert_eq!(drain(&mut f), vec![(0, 3), (0, 4)]);
    assert_eq!(f.lag(&tp(0)), Some(95));
}
/// A fetcher in session 55 whose partition 0 has records 0 to 2 waiting in the
/// buffer (high watermark 3) and whose partition 1 is at its log end (0).
fn buffered_and_caught_up() -> (Fetcher, Instant) {
    after_first_fetch(response_hw(
        55,
        vec![(0, Some(batch(0, 3)), 3), (1, None, 0)],
    ))
}

/// A fetcher from [`started`] whose first Fetch (v16) was answered with `answer`.
fn after_first_fetch(answer: FetchResponse) -> (Fetcher, Instant) {
    let (mut f, now) = started(FetcherConfig::default());
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(now, token, answer);
    (f, now)
}

#[test]
fn a_fetch_that_would_only_long_poll_waits_for_the_buffered_data_to_drain() {
    // The 500 ms stall: partition 0's data waits in the buffer, partition 1 is at
    // the log end. A Fetch of partition 1 alone would sit at the broker for
    // fetch.max.wait.ms, and partition 0 could not be fetched again until it came
    // back. Instead the fetch waits for partition 0 to drain and carries both.
    let (mut f, now) = buffered_and_caught_up();
    assert_eq!(
        f.claim_fetches(now),
        vec![],
        "deferred: only a long poll is possible"
    );
    let wait = Duration::from_millis(500);
    assert_eq!(
        f.poll_timeout(),
        Some(now + wait),
        "the driver wakes when the deferral ends"
    );
    assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
    let later = now + Duration::from_millis(3);
    assert_eq!(f.claim_fetches(later), vec![NodeId(1)]);
    assert_eq!(f.poll_timeout(), None);
    let (req, _) = f.build_fetch(later, NodeId(1), 16).expect("a fetch");
    assert_eq!(
        sent(&req),
        vec![(0, 3)],
        "partition 0 goes out with partition 1 (in the session)"
    );
}

#[test]
fn a_deferred_fetch_goes_out_after_fetch_max_wait_even_if_nothing_drains() {
    let (mut f, now) = buffered_and_caught_up();
    assert_eq!(f.claim_fetches(now + Duration::from_millis(499)), vec![]);
    // The application stopped reading: partition 1 must not starve.
    let late = now + Duration::from_millis(500);
    assert_eq!(f.claim_fetches(late), vec![NodeId(1)]);
    let (req, _) = f.build_fetch(late, NodeId(1), 16).expect("a fetch");
    assert_eq!(
        req.forgotten_topics_data[0].partitions,
        vec![0],
        "only partition 1 is fetched"
    );
}

#[test]
fn a_fetch_is_not_deferred_when_a_partition_has_data_to_get() {
    // Partition 1 lags (high watermark 10 at offset 0): the fetch returns at once.
    let (mut f, now) = after_first_fetch(response_hw(
        55,
        vec![(0, Some(batch(0, 3)), 3), (1, None, 10)],
    ));
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
}

#[test]
fn a_paused_partition_with_buffered_data_defers_the_others_at_most_fetch_max_wait() {
    // The Processor pauses a full lane's partition while its data is still in the
    // buffer and resumes it moments later: without holding back, the caught-up
    // partitions' Fetch long-polled and the resumed one waited behind it.
    let (mut f, now) = buffered_and_caught_up();
    f.pause(now, &tp(0));
    assert_eq!(f.claim_fetches(now), vec![]);
    // A pause that lasts: partition 1 is fetched once the wait is over, and every
    // time after.
    let late = now + Duration::from_millis(500);
    assert_eq!(f.claim_fetches(late), vec![NodeId(1)]);
    let (_, token) = f.build_fetch(late, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(late, token, response_hw(55, vec![(1, None, 0)]));
    assert_eq!(f.claim_fetches(late), vec![NodeId(1)]);
}

#[test]
fn a_partition_paused_with_data_to_get_defers_a_fetch_that_would_only_long_poll() {
    // The 1 KiB stall: the Processor drained partition 0 into a lane, paused it
    // (the lane was full) and resumed it a moment later. Partition 1 is at the
    // log end, so a Fetch sent meanwhile long-polled for fetch.max.wait.ms and
    // partition 0, resumed, waited behind it.
    let (mut f, now) = after_first_fetch(response_hw(
        55,
        vec![(0, Some(batch(0, 3)), 10), (1, None, 0)],
    ));
    assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
    f.pause(now, &tp(0));
    assert_eq!(f.claim_fetches(now), vec![], "only a long poll is possible");
    let wait = Duration::from_millis(500);
    assert_eq!(f.poll_timeout(), Some(now + wait));
    let later = now + Duration::from_millis(5);
    f.resume(&tp(0));
    assert_eq!(f.claim_fetches(later), vec![NodeId(1)]);
    let (req, token) = f.build_fetch(later, NodeId(1), 16).expect("a fetch");
    assert_eq!(sent(&req), vec![(0, 3)], "partition 0 goes out at once");
    f.handle_fetch(later, token, response_hw(55, vec![(0, None, 10)]));
    // A pause that lasts holds the others back once, for the wait, no longer.
    f.pause(later, &tp(0));
    assert_eq!(f.claim_fetches(later), vec![]);
    assert_eq!(f.claim_fetches(later + wait), vec![NodeId(1)]);
}

#[test]
fn a_paused_partition_at_the_log_end_holds_nothing_back() {
    let (mut f, now) = after_first_fetch(response_hw(
        55,
        vec![(0, Some(batch(0, 3)), 3), (1, None, 10)],
    ));
    assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
    f.pause(now, &tp(0));
    assert_eq!(
        f.claim_fetches(now),
        vec![NodeId(1)],
        "partition 1 has data to get"
    );
    let (_, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    f.handle_fetch(now, token, response_hw(55, vec![(1, None, 0)]));
    let (mut g, now) = after_first_fetch(response_hw(
        55,
        vec![(0, Some(batch(0, 3)), 3), (1, None, 0)],
    ));
    assert_eq!(drain(&mut g), vec![(0, 0), (0, 1), (0, 2)]);
    g.pause(now, &tp(0));
    assert_eq!(g.claim_fetches(now), vec![NodeId(1)], "nothing to wait for");
}

#[test]
fn each_full_fetch_starts_at_another_partition() {
    // Without a session every request names every partition; a broker fills the
    // response in request order, so the first partition must change.
    let config = FetcherConfig {
        sessions: false,
        ..FetcherConfig::default()
    };
    let now = Instant::now();
    let mut f = Fetcher::new(config);
    let all = [tp(0), tp(1), tp(2)];
    f.assign(&all, true);
    for p in &all {
        f.set_committed(p, 0, -1);
    }
    f.update_metadata(&metadata(&[(1, 5), (1, 5), (1, 5)]));
    let mut firsts = Vec::new();
    for _ in 0..4 {
        assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
        let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
        let order: Vec<i32> = sent_in_order(&req).into_iter().map(|(p, _)| p).collect();
        assert_eq!(order.len(), 3);
        firsts.push(order[0]);
        f.handle_fetch(now, token, response(0, vec![]));
    }
    assert_eq!(firsts, vec![0, 1, 2, 0]);
}

// ----- fetching from the replica the leader names (KIP-392) -----

/// `metadata` with brokers 1 to 3 listed.
fn metadata_with_brokers(leaders: &[(i32, i32)], brokers: &[i32]) -> ClusterMetadata {
    let mut m = metadata(leaders);
    for &b in brokers {
        m.brokers.insert(
            NodeId(b),
            crate::metadata::Broker {
                node: NodeId(b),
                host: format!("b{b}"),
                port: 9092,
                rack: Some(format!("rack-{b}")),
            },
        );
    }
    m
}

/// A fetcher with partitions 0 and 1 led by node 1 (brokers 1-3 known), `rack` set,
/// and the leader's first answer naming node 2 for partition 0.
fn redirected(expiry: Duration) -> (Fetcher, Instant) {
    let now = Instant::now();
    let mut f = Fetcher::new(FetcherConfig {
        rack: Some("rack-2".into()),
        read_replica_expiry: expiry,
        ..FetcherConfig::default()
    });
    f.assign(&[tp(0), tp(1)], true);
    f.set_committed(&tp(0), 0, -1);
    f.set_committed(&tp(1), 0, -1);
    f.update_metadata(&metadata_with_brokers(&[(1, 5), (1, 5)], &[1, 2, 3]));
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);
    let (req, token) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert_eq!(
        req.rack_id.as_str(),
        "rack-2",
        "client.rack goes with the Fetch"
    );
    let mut r = response(0, vec![(0, 0, None), (1, 0, None)]);
    r.responses[0].partitions[0].preferred_read_replica = kafka_protocol::messages::BrokerId(2);
    f.handle_fetch(now, token, r);
    (f, now)
}

#[test]
fn a_partition_whose_leader_names_a_replica_is_fetched_from_it_until_metadata_max_age() {
    let (mut f, now) = redirected(Duration::from_secs(300));
    // Partition 0 goes to node 2, partition 1 stays with its leader.
    let mut claimed = f.claim_fetches(now);
    claimed.sort();
    assert_eq!(claimed, vec![NodeId(1), NodeId(2)]);
    let (req, token) = f
        .build_fetch(now, NodeId(2), 16)
        .expect("the replica's fetch");
    assert_eq!(sent(&req), vec![(0, 0)]);
    let (leader_req, _) = f
        .build_fetch(now, NodeId(1), 16)
        .expect("the leader's fetch");
    assert_eq!(sent(&leader_req), vec![(1, 0)]);
    f.handle_fetch(now, token, response(0, vec![(0, 0, Some(batch(0, 3)))]));
    assert_eq!(drain(&mut f), vec![(0, 0), (0, 1), (0, 2)]);
    // After metadata.max.age.ms the leader is asked again.
    let later = now + Duration::from_secs(301);
    f.handle_fetch(
        later,
        FetchToken {
            node: NodeId(1),
            version: 16,
        },
        response(0, vec![]),
    );
    let claimed = f.claim_fetches(later);
    assert!(claimed.contains(&NodeId(1)), "{claimed:?}");
    let (req, _) = f
        .build_fetch(later, NodeId(1), 16)
        .expect("the leader again");
    assert_eq!(sent(&req), vec![(0, 3), (1, 0)]);
}

#[test]
fn out_of_range_on_the_replica_goes_back_to_the_leader_without_a_reset() {
    let (mut f, now) = redirected(Duration::from_secs(300));
    let _ = f.claim_fetches(now);
    let (_, token) = f
        .build_fetch(now, NodeId(2), 16)
        .expect("the replica's fetch");
    f.handle_fetch(
        now,
        token,
        response(0, vec![(0, ResponseError::OffsetOutOfRange.code(), None)]),
    );
    // No reset: the position stays, and the next fetch of it goes to the leader after
    // the partition's backoff.
    assert_eq!(f.position(&tp(0)), Some((0, -1)));
    assert_eq!(
        std::iter::from_fn(|| f.poll_event())
            .filter(|e| matches!(e, FetcherEvent::OffsetReset { .. }))
            .count(),
        0
    );
    let (req, _) = f
        .build_fetch(now, NodeId(1), 16)
        .expect("the leader's fetch");
    assert_eq!(sent(&req), vec![(1, 0)], "partition 0 backs off first");
    let later = f.poll_timeout().expect("a backoff");
    assert!(later > now && later <= now + Duration::from_millis(200));
    f.handle_fetch(
        later,
        FetchToken {
            node: NodeId(1),
            version: 16,
        },
        response(0, vec![]),
    );
    let _ = f.claim_fetches(later);
    let (req, _) = f
        .build_fetch(later, NodeId(1), 16)
        .expect("the leader's fetch");
    assert_eq!(sent(&req), vec![(0, 0), (1, 0)]);
}

#[test]
fn a_replica_that_fails_or_leaves_the_cluster_sends_its_partitions_back_to_the_leader() {
    // A failed Fetch to the replica.
    let (mut f, now) = redirected(Duration::from_secs(300));
    let _ = f.claim_fetches(now);
    f.handle_failure(now, FetcherRequest::Fetch(NodeId(2)), Failure::Disconnected);
    let (req, _) = f
        .build_fetch(now, NodeId(1), 16)
        .expect("the leader's fetch");
    assert_eq!(sent(&req), vec![(0, 0), (1, 0)]);

    // The replica gone from metadata.
    let (mut f, now) = redirected(Duration::from_secs(300));
    f.update_metadata(&metadata_with_brokers(&[(1, 5), (1, 5)], &[1, 3]));
    assert_eq!(f.claim_fetches(now), vec![NodeId(1)]);

    // NOT_LEADER_OR_FOLLOWER from the replica: metadata, then the leader.
    let (mut f, now) = redirected(Duration::from_secs(300));
    let _ = f.claim_fetches(now);
    let (_, token) = f
        .build_fetch(now, NodeId(2), 16)
        .expect("the replica's fetch");
    f.handle_fetch(
        now,
        token,
        response(
            0,
            vec![(0, ResponseError::NotLeaderOrFollower.code(), None)],
        ),
    );
    assert!(std::iter::from_fn(|| f.poll_event()).any(|e| e == FetcherEvent::MetadataNeeded));
    f.update_metadata(&metadata_with_brokers(&[(1, 5), (1, 5)], &[1, 2, 3]));
    let later = now + Duration::from_secs(2);
    let claimed = f.claim_fetches(later);
    assert!(!claimed.contains(&NodeId(2)), "{claimed:?}");
}

#[test]
fn without_a_rack_or_before_fetch_v11_no_rack_is_sent() {
    let (mut f, now) = started(FetcherConfig::default());
    let _ = f.claim_fetches(now);
    let (req, _) = f.build_fetch(now, NodeId(1), 16).expect("a fetch");
    assert!(req.rack_id.is_empty());
    let (mut f, now) = started(FetcherConfig {
        rack: Some("r".into()),
        ..FetcherConfig::default()
    });
    let _ = f.claim_fetches(now);
    let (req, _) = f.build_fetch(now, NodeId(1), 10).expect("a fetch");
    assert!(req.rack_id.is_empty());
}
