//! ottla's record-batch iterator against `kafka-protocol`'s encoder: for arbitrary
//! record sets and every codec, the records read back are the records written. The
//! compressors are pure Rust (flate2, snap, lz4_flex, ruzstd), like ottla's decoders.

use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use ottla_proto::fetch::batch::{
    BatchErrorKind, BatchOptions, Batches, CommittedFilter, Marker, control_markers,
};
use proptest::prelude::*;

fn compress(src: &mut BytesMut, dst: &mut BytesMut, codec: Compression) -> anyhow::Result<()> {
    let out: Vec<u8> = match codec {
        Compression::None => src.to_vec(),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(src)?;
            e.finish()?
        }
        Compression::Snappy => snap::raw::Encoder::new().compress_vec(src)?,
        Compression::Lz4 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(src)?;
            e.finish()?
        }
        Compression::Zstd => {
            ruzstd::encoding::compress_to_vec(&src[..], ruzstd::encoding::CompressionLevel::Fastest)
        }
    };
    dst.put_slice(&out);
    Ok(())
}

fn encode(records: &[Record], codec: Compression) -> Bytes {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode_with_custom_compression(
        &mut buf,
        records,
        &RecordEncodeOptions {
            version: 2,
            compression: codec,
        },
        Some(compress),
    )
    .expect("encode");
    buf.freeze()
}

fn record(
    offset: i64,
    ts: i64,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 3,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        // kafka-protocol keeps records in one batch while offset - sequence is constant.
        sequence: offset as i32,
        timestamp: ts,
        key: key.map(Bytes::from),
        value: value.map(Bytes::from),
        headers: headers
            .into_iter()
            .map(|(k, v)| (StrBytes::from_string(k), v.map(Bytes::from)))
            .collect::<IndexMap<_, _>>(),
    }
}

fn arb_records() -> impl Strategy<Value = Vec<Record>> {
    let one = (
        0i64..1_000_000,
        prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..200)),
        prop::collection::vec(
            (
                "[a-z]{1,8}",
                prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
            ),
            0..4,
        ),
    );
    (0i64..1_000_000, prop::collection::vec(one, 1..30)).prop_map(|(base, rs)| {
        rs.into_iter()
            .enumerate()
            .map(|(i, (ts, k, v, mut h))| {
                // Header keys are unique per record in kafka-protocol's map.
                h.sort_by(|a, b| a.0.cmp(&b.0));
                h.dedup_by(|a, b| a.0 == b.0);
                record(base + i as i64, 1_600_000_000_000 + ts, k, v, h)
            })
            .collect()
    })
}

const CODECS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_codec_reads_back_what_kafka_protocol_wrote(records in arb_records(), codec in 0usize..5) {
        let bytes = encode(&records, CODECS[codec]);
        // kafka-protocol may split the records into several batches.
        let mut batches = Batches::new(bytes, BatchOptions::default());
        let mut kept = Vec::new();
        for batch in batches.by_ref() {
            let batch = batch.expect("valid batch");
            prop_assert_eq!(batch.compression() == ottla_proto::fetch::batch::Compression::None, codec == 0);
            kept.push(batch);
        }
        let count = kept.len();
        let read: Vec<_> = kept
            .iter()
            .flat_map(|b| b.records())
            .collect::<Result<Vec<_>, _>>()
            .expect("records");
        prop_assert_eq!(batches.remaining(), 0);
        prop_assert_eq!(count, 1, "all records share one batch, so offset and timestamp deltas are exercised");
        prop_assert_eq!(read.len(), records.len());
        for (r, w) in read.iter().zip(&records) {
            prop_assert_eq!(r.offset, w.offset);
            prop_assert_eq!(r.timestamp, w.timestamp);
            prop_assert_eq!(r.key(), w.key.as_deref());
            prop_assert_eq!(r.value(), w.value.as_deref());
            let headers: Vec<(&[u8], Option<&[u8]>)> =
                w.headers.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
            let read: Vec<(&[u8], Option<&[u8]>)> = r.headers().map(|h| (h.key(), h.value())).collect();
            prop_assert_eq!(read, headers);
        }
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        for batch in Batches::new(Bytes::from(bytes), BatchOptions::default()).take(4).flatten() {
            for r in batch.records().take(100) {
                let _ = r;
            }
        }
    }
}

#[test]
fn a_flipped_byte_is_a_crc_error_naming_the_offset() {
    let records = vec![record(40, 1, Some(vec![1]), Some(vec![2; 10]), vec![])];
    let mut bytes = BytesMut::from(&encode(&records, Compression::None)[..]);
    let last = bytes.len() - 3;
    bytes[last] ^= 0x01;
    let err = Batches::new(bytes.freeze(), BatchOptions::default())
        .next()
        .unwrap()
        .unwrap_err();
    assert_eq!(err.base_offset, 40);
    assert!(matches!(err.kind, BatchErrorKind::Crc { .. }), "{err}");
    assert!(err.to_string().contains("offset 40"));
}

#[test]
fn a_partial_trailing_batch_is_left_for_the_next_fetch() {
    let a = vec![record(0, 1, None, Some(vec![7; 50]), vec![])];
    let b = vec![record(1, 1, None, Some(vec![8; 50]), vec![])];
    let mut both = BytesMut::from(&encode(&a, Compression::None)[..]);
    let second = encode(&b, Compression::None);
    both.extend_from_slice(&second[..second.len() - 10]);
    let mut batches = Batches::new(both.freeze(), BatchOptions::default());
    let first = batches.next().unwrap().unwrap();
    assert_eq!(first.next_offset(), 1);
    assert!(batches.next().is_none(), "the cut batch is not an error");
    assert_eq!(batches.remaining(), second.len() - 10);
}

#[test]
fn legacy_message_sets_are_refused_clearly() {
    let mut b = BytesMut::new();
    b.put_i64(9);
    b.put_i32(30);
    b.put_i32(0);
    b.put_i8(1);
    b.put_slice(&[0; 30]);
    let err = Batches::new(b.freeze(), BatchOptions::default())
        .next()
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind, BatchErrorKind::Legacy { magic: 1 });
    assert!(err.to_string().contains("legacy message format"));
}

#[test]
fn a_decompression_bomb_is_refused() {
    let big: Vec<Record> = (0..10)
        .map(|i| record(i, 1, None, Some(vec![0; 100_000]), vec![]))
        .collect();
    let bytes = encode(&big, Compression::Gzip);
    let options = BatchOptions {
        max_decompressed: 64 * 1024,
        ..BatchOptions::default()
    };
    let err = Batches::new(bytes, options).next().unwrap().unwrap_err();
    assert_eq!(err.kind, BatchErrorKind::TooLarge { limit: 64 * 1024 });
}

fn txn_record(offset: i64, producer: i64, control: bool, value: &[u8]) -> Record {
    Record {
        transactional: true,
        control,
        producer_id: producer,
        producer_epoch: 0,
        ..record(offset, 1, None, Some(value.to_vec()), vec![])
    }
}

/// A control record: key = version 0, type (0 abort, 1 commit).
fn marker(offset: i64, producer: i64, commit: bool) -> Record {
    let mut r = txn_record(offset, producer, true, &[0, 0, 0, 0, 0, 0]);
    r.key = Some(Bytes::from(vec![0, 0, 0, u8::from(commit)]));
    r
}

#[test]
fn read_committed_drops_aborted_transactions_and_every_marker() {
    // Producer 7 commits offsets 0-1, producer 8 aborts 2-3 (interleaved with 7's
    // second transaction at 4), markers at 5 (abort, 8) and 6 (commit, 7).
    let batches = [
        vec![
            txn_record(0, 7, false, b"a0"),
            txn_record(1, 7, false, b"a1"),
        ],
        vec![marker(2, 7, true)],
        vec![
            txn_record(3, 8, false, b"b0"),
            txn_record(4, 8, false, b"b1"),
        ],
        vec![txn_record(5, 7, false, b"c0")],
        vec![marker(6, 8, false)],
        vec![marker(7, 7, true)],
    ];
    let mut bytes = BytesMut::new();
    for b in &batches {
        bytes.extend_from_slice(&encode(b, Compression::None));
    }
    let bytes_frozen = bytes.clone().freeze();
    let read_with = |aborted: Vec<(i64, i64)>, markers: Vec<Marker>| -> Vec<String> {
        let mut filter = CommittedFilter::new(aborted).with_markers(markers);
        let mut out = Vec::new();
        for batch in Batches::new(bytes.clone().freeze(), BatchOptions::default()) {
            let batch = batch.unwrap();
            if filter.admit(&batch) {
                out.extend(
                    batch
                        .records()
                        .map(|r| String::from_utf8(r.unwrap().value().unwrap().to_vec()).unwrap()),
                );
            }
        }
        out
    };
    let read = |aborted: Vec<(i64, i64)>| read_with(aborted, vec![]);
    // The broker reports producer 8's aborted transaction starting at offset 3.
    assert_eq!(read(vec![(8, 3)]), ["a0", "a1", "c0"]);
    // No aborted list and no markers: everything but the markers.
    assert_eq!(read(vec![]), ["a0", "a1", "b0", "b1", "c0"]);
    // The markers are read from the headers alone, in order.
    let markers = control_markers(&bytes_frozen);
    assert_eq!(
        markers,
        [
            Marker {
                producer_id: 7,
                offset: 2,
                abort: false
            },
            Marker {
                producer_id: 8,
                offset: 6,
                abort: true
            },
            Marker {
                producer_id: 7,
                offset: 7,
                abort: false
            },
        ]
    );
    // A broker that leaves the aborted list empty (tansu): the ABORT marker in the
    // same range still hides producer 8's records.
    assert_eq!(read_with(vec![], markers.clone()), ["a0", "a1", "c0"]);
    // List and markers agreeing (a real broker) give the same answer.
    assert_eq!(read_with(vec![(8, 3)], markers), ["a0", "a1", "c0"]);
}

#[test]
fn control_markers_stop_quietly_at_garbage() {
    assert!(control_markers(&Bytes::from_static(&[0xff; 40])).is_empty());
    assert!(control_markers(&Bytes::new()).is_empty());
}
