//! Writes the seed inputs of the `fetch_response` fuzz target (fuzz/seeds/), so the
//! fuzzer starts from well-formed Fetch responses at the versions ottla negotiates.
//! Run by hand after a schema change:
//! `cargo test -p protocol-tests --test fuzz_seeds -- --ignored`
//! The normal run checks that every committed seed still decodes.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchResponse, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use ottla::proto::wire::decode_response;

fn batch(first: i64, n: i64, transactional: bool) -> Bytes {
    let records: Vec<Record> = (first..first + n)
        .map(|o| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: if transactional { 9 } else { -1 },
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset: o,
            sequence: o as i32,
            timestamp: 1_700_000_000_000 + o,
            key: (o % 2 == 0).then(|| Bytes::from(format!("k{o}"))),
            value: Some(Bytes::from(format!("value {o}"))),
            headers: [(
                StrBytes::from_static_str("h"),
                Some(Bytes::from_static(b"v")),
            )]
            .into_iter()
            .collect(),
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

/// `(file name, selector byte + encoded response)` for each seed.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for version in [4i16, 7, 11, 12, 13, 16] {
        let mut records = batch(0, 3, false).to_vec();
        records.extend_from_slice(&batch(3, 2, version >= 11));
        let mut p0 = PartitionData::default();
        p0.partition_index = 0;
        p0.high_watermark = 5;
        p0.last_stable_offset = 5;
        p0.records = Some(Bytes::from(records));
        let mut p1 = PartitionData::default();
        p1.partition_index = 1;
        p1.error_code = 1;
        let mut topic = FetchableTopicResponse::default();
        if version >= 13 {
            topic.topic_id = uuid::Uuid::from_u128(1);
        } else {
            topic.topic = TopicName(StrBytes::from_static_str("t"));
        }
        topic.partitions = vec![p0, p1];
        let mut response = FetchResponse::default();
        response.responses = vec![topic];
        if version >= 7 {
            response.session_id = 5;
        }
        let mut body = BytesMut::new();
        response.encode(&mut body, version).expect("encode");
        // The target's selector: version = 4 + selector % 13; bit 7 skips CRCs.
        let selector = (version - 4) as u8;
        let mut input = vec![selector];
        input.extend_from_slice(&body);
        out.push((format!("fetch-v{version}"), input));
    }
    out
}

#[test]
fn committed_seeds_decode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/fetch_response");
    for (name, input) in seeds() {
        let path = dir.join(&name);
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(on_disk, input, "{name} is stale: rerun with --ignored");
        let version = 4 + i16::from(input[0]) % 13;
        decode_response::<FetchResponse>(ApiKey::Fetch, version, Bytes::from(input[1..].to_vec()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
#[ignore]
fn write_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/fetch_response");
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (name, input) in seeds() {
        std::fs::write(dir.join(name), input).expect("write");
    }
}
