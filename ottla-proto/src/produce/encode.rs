//! Record batches (magic v2) written by ottla: the mirror of [`crate::fetch::batch`].
//!
//! ottla writes its own encoder rather than `kafka-protocol`'s so that headers keep
//! their order and may repeat a key (Kafka allows both; an index map would merge
//! them), and so that keys and values are copied once, straight into the batch.

use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};

use crate::record_format::{Compression, put_bytes, put_varint};

/// One record to write.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutRecord {
    /// Timestamp (ms).
    pub timestamp: i64,
    /// The key (`None`: null).
    pub key: Option<Bytes>,
    /// The value (`None`: null).
    pub value: Option<Bytes>,
    /// Headers in order; keys may repeat.
    pub headers: Vec<(String, Option<Bytes>)>,
}

impl OutRecord {
    /// Key plus value bytes (what the producer's byte counts report).
    pub fn payload_bytes(&self) -> u64 {
        (self.key.as_ref().map_or(0, Bytes::len) + self.value.as_ref().map_or(0, Bytes::len)) as u64
    }

    /// An upper bound of the record's encoded size, for batch sizing and buffer memory.
    pub fn size_estimate(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, Bytes::len) + 10)
            .sum();
        21 + self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + headers
    }
}

/// The producer fields of a batch (idempotence, KIP-98).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerFields {
    /// The producer id, or -1.
    pub producer_id: i64,
    /// The producer epoch, or -1.
    pub producer_epoch: i16,
    /// The sequence number of the first record, or -1.
    pub base_sequence: i32,
    /// The batch belongs to a transaction (attributes bit 4): a `read_committed`
    /// consumer sees it only once its transaction committed.
    pub transactional: bool,
}

impl ProducerFields {
    /// No idempotence.
    pub const NONE: ProducerFields = ProducerFields {
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        transactional: false,
    };
}

/// A codec failed to compress (it only fails on I/O into memory, which does not happen,
/// but the error is kept rather than unwrapped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{codec} compression failed: {message}")]
pub struct EncodeError {
    /// The codec.
    pub codec: &'static str,
    /// Why.
    pub message: String,
}

/// Encodes `records` as one v2 batch with base offset 0 (the broker assigns offsets).
pub fn encode_batch(
    records: &[OutRecord],
    compression: Compression,
    producer: ProducerFields,
) -> Result<Bytes, EncodeError> {
    let base_timestamp = records.first().map_or(0, |r| r.timestamp);
    let max_timestamp = records.iter().map(|r| r.timestamp).max().unwrap_or(0);
    let mut body = BytesMut::with_capacity(records.iter().map(OutRecord::size_estimate).sum());
    let mut one = BytesMut::new();
    for (delta, r) in records.iter().enumerate() {
        one.clear();
        one.put_i8(0); // attributes
        put_varint(&mut one, r.timestamp - base_timestamp);
        put_varint(&mut one, delta as i64);
        put_bytes(&mut one, r.key.as_deref());
        put_bytes(&mut one, r.value.as_deref());
        put_varint(&mut one, r.headers.len() as i64);
        for (k, v) in &r.headers {
            put_bytes(&mut one, Some(k.as_bytes()));
            put_bytes(&mut one, v.as_deref());
        }
        put_varint(&mut body, one.len() as i64);
        body.put_slice(&one);
    }
    let payload = compress(compression, &body)?;
    let mut out = BytesMut::with_capacity(61 + payload.len());
    out.put_i64(0); // base offset
    out.put_i32(0); // length, below
    out.put_i32(-1); // partition leader epoch: set by the broker
    out.put_i8(2); // magic
    out.put_u32(0); // crc, below
    let crc_from = out.len();
    // Bit 4 of the attributes: transactional (KIP-98).
    let transactional = if producer.transactional { 0x10 } else { 0 };
    out.put_i16(compression.attribute_bits() | transactional);
    out.put_i32(records.len().saturating_sub(1) as i32);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(producer.producer_id);
    out.put_i16(producer.producer_epoch);
    out.put_i32(producer.base_sequence);
    out.put_i32(records.len() as i32);
    out.put_slice(&payload);
    let length = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&out[crc_from..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(out.freeze())
}

fn compress(codec: Compression, data: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let fail = |codec: &'static str| {
        move |e: std::io::Error| EncodeError {
            codec,
            message: e.to_string(),
        }
    };
    Ok(match codec {
        Compression::None => data.to_vec(),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).map_err(fail("gzip"))?;
            e.finish().map_err(fail("gzip"))?
        }
        Compression::Snappy => {
            snap::raw::Encoder::new()
                .compress_vec(data)
                .map_err(|e| EncodeError {
                    codec: "snappy",
                    message: e.to_string(),
                })?
        }
        Compression::Lz4 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(data).map_err(fail("lz4"))?;
            e.finish().map_err(|e| EncodeError {
                codec: "lz4",
                message: e.to_string(),
            })?
        }
        Compression::Zstd => {
            ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::batch::{BatchOptions, Batches};

    #[test]
    fn batches_read_back_through_ottlas_reader_under_every_codec() {
        let records: Vec<OutRecord> = (0..50)
            .map(|i| OutRecord {
                timestamp: 1_000 + i,
                key: (i % 3 != 0).then(|| Bytes::from(format!("k{i}"))),
                value: (i % 5 != 0).then(|| Bytes::from(vec![b'v'; i as usize * 7])),
                headers: vec![
                    ("dup".into(), Some(Bytes::from_static(b"1"))),
                    ("dup".into(), None),
                ],
            })
            .collect();
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let producer = ProducerFields {
                producer_id: 9,
                producer_epoch: 2,
                base_sequence: 40,
                transactional: false,
            };
            let bytes = encode_batch(&records, codec, producer).expect("encode");
            let mut it = Batches::new(bytes, BatchOptions::default());
            let batch = it.next().expect("a batch").expect("valid");
            assert!(it.next().is_none());
            assert_eq!(batch.compression(), codec);
            assert_eq!(
                (batch.producer_id, batch.producer_epoch, batch.base_sequence),
                (9, 2, 40)
            );
            assert_eq!(batch.record_count, 50);
            let read: Vec<_> = batch.records().map(|r| r.expect("record")).collect();
            for (i, (r, w)) in read.iter().zip(&records).enumerate() {
                assert_eq!(r.offset, i as i64);
                assert_eq!(r.timestamp, w.timestamp);
                assert_eq!(r.key(), w.key.as_deref());
                assert_eq!(r.value(), w.value.as_deref());
                let headers: Vec<(String, Option<Bytes>)> = r
                    .headers()
                    .map(|h| {
                        let key = String::from_utf8_lossy(h.key()).to_string();
                        (key, h.value().map(Bytes::copy_from_slice))
                    })
                    .collect();
                assert_eq!(headers, w.headers, "headers keep order and repeated keys");
            }
        }
    }
}
