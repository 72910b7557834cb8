//! The `record_batch` target's input: either a records field taken as it is, or a v2
//! batch built around fuzzed content and compressed with a codec the input chooses, so
//! that the decompressors and the record parser behind them see the fuzzer's bytes.
//!
//! Layout: `[mode] ...`, where the low three bits of `mode` choose the form:
//!
//! | bits | form |
//! |---|---|
//! | 0 | the rest of the input is the records field, read as it is (bit 3: check CRCs) |
//! | 1..=6 | one batch, codec none, gzip, snappy, xerial-framed snappy, lz4, zstd |
//! | 7 | one batch whose attributes name a codec ottla does not know |
//!
//! For a built batch, bit 4 of `mode` chooses well-formed records written by ottla's own
//! encoder (then what is read back must equal what was written) over arbitrary bytes
//! as the (compressed) records; bits 5 to 7 set the transactional, control and
//! log-append-time attributes. The header fields follow, then the content; whatever
//! input is left is appended after the batch, as the next batch or a partial one.

use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};
use ottla_proto::fetch::batch::{
    BatchOptions, Batches, CommittedFilter, Compression, control_markers,
};
use ottla_proto::produce::encode::{OutRecord, ProducerFields, encode_batch};

use crate::input::Input;

/// The inflation bound the target reads with.
pub const MAX_DECOMPRESSED: usize = 1 << 20;

/// How a built batch's records are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// No compression.
    None,
    /// gzip.
    Gzip,
    /// Raw snappy.
    Snappy,
    /// Snappy in the xerial framing the Java client writes.
    XerialSnappy,
    /// lz4 frames.
    Lz4,
    /// zstd.
    Zstd,
    /// A codec id (5..=7) ottla does not know; the bytes are left as they are.
    Unknown,
}

impl Codec {
    fn from_mode(mode: u8) -> Option<Codec> {
        Some(match mode & 7 {
            0 => return None,
            1 => Codec::None,
            2 => Codec::Gzip,
            3 => Codec::Snappy,
            4 => Codec::XerialSnappy,
            5 => Codec::Lz4,
            6 => Codec::Zstd,
            _ => Codec::Unknown,
        })
    }

    /// The mode bits that choose this codec.
    pub fn mode(self) -> u8 {
        match self {
            Codec::None => 1,
            Codec::Gzip => 2,
            Codec::Snappy => 3,
            Codec::XerialSnappy => 4,
            Codec::Lz4 => 5,
            Codec::Zstd => 6,
            Codec::Unknown => 7,
        }
    }

    fn compression(self) -> Compression {
        match self {
            Codec::None | Codec::Unknown => Compression::None,
            Codec::Gzip => Compression::Gzip,
            Codec::Snappy | Codec::XerialSnappy => Compression::Snappy,
            Codec::Lz4 => Compression::Lz4,
            Codec::Zstd => Compression::Zstd,
        }
    }
}

/// Mode bit 3: check CRCs when reading a records field as it is.
pub const CHECK_CRCS: u8 = 0x08;
/// Mode bit 4: well-formed records from ottla's encoder.
pub const STRUCTURED: u8 = 0x10;
/// Mode bit 5: the transactional attribute.
pub const TRANSACTIONAL: u8 = 0x20;
/// Mode bit 6: the control attribute.
pub const CONTROL: u8 = 0x40;
/// Mode bit 7: the log-append-time attribute.
pub const LOG_APPEND_TIME: u8 = 0x80;

/// Runs one input through the batch iterator, the record parser, the transaction
/// filter and the marker scan.
pub fn run(data: &[u8]) {
    let _ = read_input(data);
}

/// How many records of `data`'s batches read back without error (for the seed writer).
pub fn reads_back(data: &[u8]) -> usize {
    read_input(data)
}

fn read_input(data: &[u8]) -> usize {
    let mut input = Input::new(data);
    let mode = input.u8();
    let Some(codec) = Codec::from_mode(mode) else {
        return read(
            Bytes::copy_from_slice(input.rest()),
            mode & CHECK_CRCS != 0,
            None,
        );
    };
    let (batch, written) = if mode & STRUCTURED != 0 && codec != Codec::Unknown {
        structured(&mut input, mode, codec)
    } else {
        (raw(&mut input, mode, codec), None)
    };
    let mut records = BytesMut::from(&batch[..]);
    records.put_slice(input.rest());
    read(records.freeze(), true, written.as_deref())
}

/// A batch of records written by ottla's encoder, then given the input's base offset and
/// attribute bits (and a fresh CRC). Returns it with the records, when reading it back
/// must give exactly them.
fn structured(input: &mut Input, mode: u8, codec: Codec) -> (Bytes, Option<Vec<OutRecord>>) {
    let base_offset = input.i64();
    let n = 1 + input.below(8);
    let records: Vec<OutRecord> = (0..n)
        .map(|_| {
            let timestamp = i64::from(input.u32());
            let key = input
                .bool()
                .then(|| Bytes::copy_from_slice(input.bytes(32)));
            let value = input
                .bool()
                .then(|| Bytes::copy_from_slice(input.bytes(200)));
            let headers = (0..input.below(3))
                .map(|_| {
                    let k = String::from_utf8_lossy(input.bytes(8)).into_owned();
                    let v = input
                        .bool()
                        .then(|| Bytes::copy_from_slice(input.bytes(16)));
                    (k, v)
                })
                .collect();
            OutRecord {
                timestamp,
                key,
                value,
                headers,
            }
        })
        .collect();
    let producer = ProducerFields {
        producer_id: i64::from(input.u8()) - 1,
        producer_epoch: 0,
        base_sequence: 0,
        transactional: false,
    };
    let Ok(encoded) = encode_batch(&records, codec.compression(), producer) else {
        return (Bytes::new(), None);
    };
    let extra = attribute_bits(mode);
    let batch = rebase(&encoded, base_offset, extra);
    // Offsets below 0 or past i64::MAX are not offsets; such a batch is only read.
    let fits = base_offset >= 0 && base_offset.checked_add(n as i64).is_some();
    let plain = extra & (CONTROL_BIT | LOG_APPEND_BIT) == 0;
    (batch, (plain && fits).then_some(records))
}

/// A batch whose header fields and (compressed) records are the fuzzer's.
fn raw(input: &mut Input, mode: u8, codec: Codec) -> Bytes {
    let base_offset = input.i64();
    let last_offset_delta = i32::from(input.u16() as i16);
    let record_count = i32::from(input.u8() as i8);
    let base_timestamp = input.i64();
    let producer_id = i64::from(input.u8()) - 1;
    let content = input.bytes(4096);
    let split = input.u16();
    let payload = compress(codec, content, usize::from(split));
    let codec_bits = match codec {
        Codec::Unknown => 5 + i16::from(input.u8() % 3),
        c => c.compression().attribute_bits(),
    };
    let mut b = BytesMut::with_capacity(61 + payload.len());
    b.put_i64(base_offset);
    b.put_i32(0); // length, set by seal
    b.put_i32(0); // partition leader epoch
    b.put_i8(2); // magic
    b.put_u32(0); // crc, set by seal
    b.put_i16(codec_bits | attribute_bits(mode));
    b.put_i32(last_offset_delta);
    b.put_i64(base_timestamp);
    b.put_i64(base_timestamp.wrapping_add(1));
    b.put_i64(producer_id);
    b.put_i16(0);
    b.put_i32(0);
    b.put_i32(record_count);
    b.put_slice(&payload);
    seal(&mut b);
    b.freeze()
}

/// The transactional bit of a batch's attributes.
pub const TRANSACTIONAL_BIT: i16 = 0x10;
/// The control bit of a batch's attributes.
pub const CONTROL_BIT: i16 = 0x20;
const LOG_APPEND_BIT: i16 = 0x08;

fn attribute_bits(mode: u8) -> i16 {
    let mut bits = 0;
    if mode & TRANSACTIONAL != 0 {
        bits |= TRANSACTIONAL_BIT;
    }
    if mode & CONTROL != 0 {
        bits |= CONTROL_BIT;
    }
    if mode & LOG_APPEND_TIME != 0 {
        bits |= LOG_APPEND_BIT;
    }
    bits
}

/// One v2 batch moved to `base_offset`, with `attributes` bits added and its CRC made
/// good again.
pub fn rebase(batch: &[u8], base_offset: i64, attributes: i16) -> Bytes {
    let mut b = BytesMut::from(batch);
    b[0..8].copy_from_slice(&base_offset.to_be_bytes());
    let bits = i16::from_be_bytes([b[21], b[22]]) | attributes;
    b[21..23].copy_from_slice(&bits.to_be_bytes());
    seal(&mut b);
    b.freeze()
}

/// Sets a built batch's length and CRC32C (over attributes to the end).
fn seal(batch: &mut BytesMut) {
    let length = i32::try_from(batch.len() - 12).expect("small batch");
    batch[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&batch[21..]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// `data` compressed with `codec`; `split` chooses the xerial block size.
pub fn compress(codec: Codec, data: &[u8], split: usize) -> Vec<u8> {
    match codec {
        Codec::None | Codec::Unknown => data.to_vec(),
        Codec::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).expect("in memory");
            e.finish().expect("in memory")
        }
        Codec::Snappy => snap::raw::Encoder::new()
            .compress_vec(data)
            .expect("snappy compresses any input"),
        Codec::XerialSnappy => {
            let mut out = b"\x82SNAPPY\x00".to_vec();
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            for block in data.chunks(split.max(1)) {
                let c = snap::raw::Encoder::new()
                    .compress_vec(block)
                    .expect("snappy compresses any input");
                out.extend_from_slice(&(c.len() as u32).to_be_bytes());
                out.extend_from_slice(&c);
            }
            out
        }
        Codec::Lz4 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(data).expect("in memory");
            e.finish().expect("in memory")
        }
        Codec::Zstd => {
            ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

/// Reads every batch and record of `records`. No batch inflates past the bound; a batch
/// ottla wrote reads back as written. Returns how many records read back.
fn read(records: Bytes, check_crcs: bool, written: Option<&[OutRecord]>) -> usize {
    let mut count = 0;
    let options = BatchOptions {
        check_crcs,
        max_decompressed: MAX_DECOMPRESSED,
    };
    let markers = control_markers(&records);
    let mut filter = CommittedFilter::new(vec![(0, 0), (1, 3)]).with_markers(markers);
    let mut first = true;
    for batch in Batches::new(records, options) {
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                assert!(
                    !(first && written.is_some()),
                    "a batch ottla wrote did not read back: {e}"
                );
                break;
            }
        };
        let _ = filter.admit(&batch);
        let mut inflated = 0usize;
        let mut read = Vec::new();
        for record in batch.records() {
            let Ok(r) = record else {
                assert!(
                    !(first && written.is_some()),
                    "a record ottla wrote did not read back: {record:?}"
                );
                break;
            };
            inflated += r.key().map_or(0, <[u8]>::len)
                + r.value().map_or(0, <[u8]>::len)
                + r.headers()
                    .map(|h| h.key().len() + h.value().map_or(0, <[u8]>::len))
                    .sum::<usize>();
            read.push(r);
        }
        count += read.len();
        if batch.compression() != Compression::None {
            assert!(inflated <= MAX_DECOMPRESSED, "{inflated} bytes inflated");
        }
        if let (true, Some(written)) = (first, written) {
            assert_eq!(read.len(), written.len(), "record count");
            for (i, (r, w)) in read.iter().zip(written).enumerate() {
                assert_eq!(r.offset, batch.base_offset + i as i64);
                assert_eq!(r.timestamp, w.timestamp);
                assert_eq!(r.key(), w.key.as_deref());
                assert_eq!(r.value(), w.value.as_deref());
                let headers: Vec<(&[u8], Option<&[u8]>)> = w
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_bytes(), v.as_deref()))
                    .collect();
                let read: Vec<(&[u8], Option<&[u8]>)> =
                    r.headers().map(|h| (h.key(), h.value())).collect();
                assert_eq!(read, headers);
            }
        }
        first = false;
    }
    count
}

/// The mode byte that builds one batch compressed with `codec`, of records written by
/// ottla's encoder when `structured`.
pub fn mode(codec: Codec, structured: bool) -> u8 {
    codec.mode() | if structured { STRUCTURED } else { 0 }
}
