//! Record batches (magic v2) read in place: the CRC32C is checked once per batch, keys,
//! values and headers are `Bytes` slices of the fetch response (or of the one buffer a
//! compressed batch is inflated into), offsets and timestamps come from the batch's base
//! values.
//!
//! A fetch response's records field is a run of batches; the last one may be cut short
//! by `max.partition.fetch.bytes`. [`Batches`] stops cleanly at such a partial batch:
//! the protocol intends the client to fetch again from the next offset.

use std::io::Read;

use bytes::{Buf, Bytes};

use super::record::{Headers, Span, nullable};
pub use crate::record_format::Compression;
use crate::record_format::{varint, varlong};

/// A batch-level failure, naming where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record batch at offset {base_offset}: {kind}")]
pub struct BatchError {
    /// The batch's base offset (or the offset reached, for a record-level fault).
    pub base_offset: i64,
    /// What is wrong.
    pub kind: BatchErrorKind,
}

/// What is wrong with a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchErrorKind {
    /// The stored CRC32C does not match the batch's bytes.
    #[error("CRC32C mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Crc {
        /// The CRC in the batch header.
        stored: u32,
        /// The CRC of the bytes.
        computed: u32,
    },
    /// Message format v0/v1 (before Kafka 0.11), which ottla does not decode.
    #[error(
        "legacy message format (magic {magic}) is not supported; upgrade the topic's message format"
    )]
    Legacy {
        /// The magic byte.
        magic: i8,
    },
    /// An unknown magic byte.
    #[error("unknown magic byte {0}")]
    Magic(i8),
    /// An unknown compression codec id.
    #[error("unknown compression codec {0}")]
    Codec(i16),
    /// Decompression failed.
    #[error("{codec} decompression failed: {message}")]
    Decompress {
        /// The codec.
        codec: &'static str,
        /// What the decoder said.
        message: String,
    },
    /// The decompressed batch would exceed the configured limit.
    #[error("decompressed batch exceeds {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// A length or count does not fit the bytes present.
    #[error("malformed batch: {0}")]
    Malformed(&'static str),
}

/// The codec a batch's attributes name.
fn compression_of(attributes: i16) -> Result<Compression, BatchErrorKind> {
    match attributes & 0x07 {
        0 => Ok(Compression::None),
        1 => Ok(Compression::Gzip),
        2 => Ok(Compression::Snappy),
        3 => Ok(Compression::Lz4),
        4 => Ok(Compression::Zstd),
        other => Err(BatchErrorKind::Codec(other)),
    }
}

/// How batches are read.
#[derive(Debug, Clone, Copy)]
pub struct BatchOptions {
    /// Verify the CRC32C of each batch (`check.crcs`, default on).
    pub check_crcs: bool,
    /// The largest size one batch may inflate to (default 64 MiB).
    pub max_decompressed: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self {
            check_crcs: true,
            max_decompressed: 64 * 1024 * 1024,
        }
    }
}

/// A record batch's header, and its records still encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordBatch {
    /// Offset of the first record.
    pub base_offset: i64,
    /// The partition leader epoch that wrote the batch.
    pub partition_leader_epoch: i32,
    /// Raw attributes.
    pub attributes: i16,
    /// Offset delta of the last record (the batch covers base..=base+delta even when
    /// compaction removed records).
    pub last_offset_delta: i32,
    /// Timestamp of the first record.
    pub base_timestamp: i64,
    /// The largest timestamp in the batch.
    pub max_timestamp: i64,
    /// Producer id, or -1.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Sequence of the first record.
    pub base_sequence: i32,
    /// Number of records.
    pub record_count: i32,
    /// The records, decompressed if needed.
    records: Bytes,
}

impl RecordBatch {
    /// The compression codec.
    pub fn compression(&self) -> Compression {
        compression_of(self.attributes).unwrap_or(Compression::None)
    }

    /// Whether the batch belongs to a transaction.
    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }

    /// Whether this is a control batch (transaction markers), never shown to users.
    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }

    /// Whether timestamps are log-append times (then every record carries
    /// `max_timestamp`).
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & 0x08 != 0
    }

    /// The offset after this batch.
    pub fn next_offset(&self) -> i64 {
        self.base_offset + (i64::from(self.last_offset_delta) + 1)
    }

    /// The records' bytes (decompressed, if the batch was compressed): what the
    /// spans of its [`Record`]s index.
    pub fn data(&self) -> &Bytes {
        &self.records
    }

    /// The batch's records.
    pub fn records(&self) -> Records<'_> {
        Records {
            batch: self,
            pos: 0,
            remaining: self.record_count.max(0),
            next_min: self.base_offset,
            last: self.next_offset() - 1,
        }
    }
}

/// One record, read in place: its key, value and headers are where they lie in the
/// batch's bytes (checked, not copied).
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Its offset.
    pub offset: i64,
    /// Its timestamp (ms).
    pub timestamp: i64,
    data: &'a [u8],
    pub(crate) key: Span,
    pub(crate) value: Span,
    pub(crate) headers: Span,
    pub(crate) header_count: u32,
}

impl<'a> Record<'a> {
    /// The key, or `None` for a null key.
    #[inline]
    pub fn key(&self) -> Option<&'a [u8]> {
        self.key.get(self.data)
    }

    /// The value, or `None` for a null value (a tombstone).
    #[inline]
    pub fn value(&self) -> Option<&'a [u8]> {
        self.value.get(self.data)
    }

    /// The headers in order.
    #[inline]
    pub fn headers(&self) -> Headers<'a> {
        Headers::new(
            self.headers.get(self.data).unwrap_or_default(),
            self.header_count,
        )
    }
}

/// Iterator over the batches of a fetch response's records field.
#[derive(Debug, Clone)]
pub struct Batches {
    buf: Bytes,
    options: BatchOptions,
    failed: bool,
}

impl Batches {
    /// Batches in `records` (a partition's records field).
    pub fn new(records: Bytes, options: BatchOptions) -> Self {
        Self {
            buf: records,
            options,
            failed: false,
        }
    }

    /// Bytes not consumed: a partial trailing batch, if any.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
}

const HEADER_LEN: usize = 61;

impl Iterator for Batches {
    type Item = Result<RecordBatch, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.buf.len() < 17 {
            // 8 (offset) + 4 (length) + 4 (epoch) + 1 (magic): less is a partial batch.
            return None;
        }
        let base_offset = i64::from_be_bytes(self.buf[0..8].try_into().ok()?);
        let length = i32::from_be_bytes(self.buf[8..12].try_into().ok()?);
        let fail = |kind| Some(Err(BatchError { base_offset, kind }));
        let Ok(length) = usize::try_from(length) else {
            self.failed = true;
            return fail(BatchErrorKind::Malformed("negative batch length"));
        };
        let magic = self.buf[16] as i8;
        match magic {
            2 => {}
            0 | 1 => {
                self.failed = true;
                return fail(BatchErrorKind::Legacy { magic });
            }
            other => {
                self.failed = true;
                return fail(BatchErrorKind::Magic(other));
            }
        }
        if 12 + length > self.buf.len() {
            // Cut by the fetch size limit: the next fetch starts at this batch.
            return None;
        }
        if 12 + length < HEADER_LEN {
            self.failed = true;
            return fail(BatchErrorKind::Malformed("batch shorter than its header"));
        }
        let mut batch = self.buf.split_to(12 + length);
        let result = parse_batch(&mut batch, base_offset, self.options);
        if result.is_err() {
            self.failed = true;
        }
        Some(result)
    }
}

fn parse_batch(
    b: &mut Bytes,
    base_offset: i64,
    options: BatchOptions,
) -> Result<RecordBatch, BatchError> {
    let err = |kind| BatchError { base_offset, kind };
    b.advance(12);
    let partition_leader_epoch = b.get_i32();
    let _magic = b.get_i8();
    let stored = b.get_u32();
    if options.check_crcs {
        // The CRC covers everything from the attributes to the end of the batch.
        let computed = crc32c::crc32c(&b[..]);
        if computed != stored {
            return Err(err(BatchErrorKind::Crc { stored, computed }));
        }
    }
    let attributes = b.get_i16();
    let last_offset_delta = b.get_i32();
    let base_timestamp = b.get_i64();
    let max_timestamp = b.get_i64();
    let producer_id = b.get_i64();
    let producer_epoch = b.get_i16();
    let base_sequence = b.get_i32();
    let record_count = b.get_i32();
    // The batch's offsets must fit an i64, so that `next_offset` and every offset
    // computed from it are exact (found by fuzzing: a base offset near i64::MAX
    // overflowed, a panic in debug builds and a wrapped offset in release ones).
    // Negative base offsets are not offsets (and `i64::MIN` with a delta of -1 once
    // overflowed `next_offset() - 1`; found by fuzzing).
    if base_offset < 0
        || base_offset
            .checked_add(i64::from(last_offset_delta) + 1)
            .is_none()
    {
        return Err(err(BatchErrorKind::Malformed(
            "batch offsets past the end of the log",
        )));
    }
    let compression = compression_of(attributes).map_err(err)?;
    let records = match compression {
        Compression::None => b.clone(),
        codec => decompress(codec, b, options.max_decompressed).map_err(err)?,
    };
    // A record's fields are `u32` places in these bytes (and `u32::MAX` a null).
    if records.len() >= u32::MAX as usize {
        return Err(err(BatchErrorKind::TooLarge {
            limit: u32::MAX as usize - 1,
        }));
    }
    Ok(RecordBatch {
        base_offset,
        partition_leader_epoch,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
        records,
    })
}

fn decompress(codec: Compression, data: &[u8], limit: usize) -> Result<Bytes, BatchErrorKind> {
    let (name, out) = match codec {
        Compression::None => return Ok(Bytes::copy_from_slice(data)),
        Compression::Gzip => (
            "gzip",
            read_limited(flate2::read::GzDecoder::new(data), limit),
        ),
        Compression::Lz4 => (
            "lz4",
            read_limited(lz4_flex::frame::FrameDecoder::new(data), limit),
        ),
        Compression::Zstd => match ruzstd::decoding::StreamingDecoder::new(data) {
            Ok(d) => ("zstd", read_limited(d, limit)),
            Err(e) => {
                return Err(BatchErrorKind::Decompress {
                    codec: "zstd",
                    message: e.to_string(),
                });
            }
        },
        Compression::Snappy => ("snappy", snappy(data, limit)),
    };
    out.map(Bytes::from).map_err(|e| match e {
        ReadError::TooLarge => BatchErrorKind::TooLarge { limit },
        ReadError::Codec(message) => BatchErrorKind::Decompress {
            codec: name,
            message,
        },
    })
}

enum ReadError {
    TooLarge,
    Codec(String),
}

fn read_limited<R: Read>(reader: R, limit: usize) -> Result<Vec<u8>, ReadError> {
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ReadError::Codec(e.to_string()))?;
    if out.len() > limit {
        return Err(ReadError::TooLarge);
    }
    Ok(out)
}

/// The xerial snappy framing the Java client writes: an 8-byte magic, two i32 versions,
/// then blocks of `[i32 length][raw snappy]`. Other producers write raw snappy.
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";

fn snappy(data: &[u8], limit: usize) -> Result<Vec<u8>, ReadError> {
    let raw = |block: &[u8], out: &mut Vec<u8>| -> Result<(), ReadError> {
        let len = snap::raw::decompress_len(block).map_err(|e| ReadError::Codec(e.to_string()))?;
        if out.len() + len > limit {
            return Err(ReadError::TooLarge);
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(block, &mut out[start..])
            .map_err(|e| ReadError::Codec(e.to_string()))?;
        Ok(())
    };
    let mut out = Vec::new();
    let Some(mut rest) = data.strip_prefix(XERIAL_MAGIC) else {
        raw(data, &mut out)?;
        return Ok(out);
    };
    rest = rest
        .get(8..)
        .ok_or(ReadError::Codec("truncated xerial header".into()))?;
    while !rest.is_empty() {
        let len = rest
            .get(..4)
            .map(|l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize)
            .ok_or(ReadError::Codec("truncated xerial block length".into()))?;
        let block = rest
            .get(4..4 + len)
            .ok_or(ReadError::Codec("truncated xerial block".into()))?;
        raw(block, &mut out)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

/// Iterator over one batch's records.
#[derive(Debug)]
pub struct Records<'a> {
    batch: &'a RecordBatch,
    /// Where the next record starts in `batch.records`.
    pos: usize,
    remaining: i32,
    /// The lowest offset the next record may have: offsets rise within a batch.
    next_min: i64,
    /// The batch's last offset: no record may be past it.
    last: i64,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, BatchError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining <= 0 {
            return None;
        }
        self.remaining -= 1;
        let result = read_record(&self.batch.records, &mut self.pos, self.batch).and_then(|r| {
            // Offsets rise within a batch and end at its last offset. A record out of
            // that order is malformed: delivered, it moved the position past records
            // not yet read, then back (found by fuzzing).
            let last = self.last;
            if r.offset < self.next_min || r.offset > last {
                return Err(BatchError {
                    base_offset: self.batch.base_offset,
                    kind: BatchErrorKind::Malformed(if r.offset > last {
                        "record offset past the batch's last offset"
                    } else {
                        "record offsets out of order"
                    }),
                });
            }
            self.next_min = r.offset + 1;
            Ok(r)
        });
        if result.is_err() {
            self.remaining = 0;
        }
        Some(result)
    }
}

/// Reads the record at `data[*pos..]` and moves `pos` past it. Nothing is built: the
/// key, value and headers are checked and kept as places in `data`.
#[inline]
fn read_record<'a>(
    data: &'a Bytes,
    pos: &mut usize,
    batch: &RecordBatch,
) -> Result<Record<'a>, BatchError> {
    #[cold]
    fn malformed(batch: &RecordBatch, what: &'static str) -> BatchError {
        BatchError {
            base_offset: batch.base_offset,
            kind: BatchErrorKind::Malformed(what),
        }
    }
    let err = |what| malformed(batch, what);
    let bytes: &'a [u8] = data;
    let mut buf: &[u8] = bytes.get(*pos..).unwrap_or_default();
    let len = varint(&mut buf).ok_or_else(|| err("record length"))?;
    let len = usize::try_from(len).map_err(|_| err("negative record length"))?;
    let Some(mut r) = buf.get(..len) else {
        return Err(err("record longer than the batch"));
    };
    // `r` ends at `end` in `data`: a field's place there is `end - r.len()`.
    let end = bytes.len() - buf.len() + len;
    *pos = end;
    let Some((_attributes, rest)) = r.split_first() else {
        return Err(err("empty record"));
    };
    r = rest;
    let timestamp_delta = varlong(&mut r).ok_or_else(|| err("timestamp delta"))?;
    let offset_delta = varint(&mut r).ok_or_else(|| err("offset delta"))?;
    let key = span(end, &mut r).ok_or_else(|| err("key"))?;
    let value = span(end, &mut r).ok_or_else(|| err("value"))?;
    let count = varint(&mut r).ok_or_else(|| err("header count"))?;
    let count = u32::try_from(count).map_err(|_| err("negative header count"))?;
    // A header takes at least two bytes (two lengths).
    if count as usize > r.len() / 2 {
        return Err(err("more headers than bytes"));
    }
    let headers = Span {
        // Below `end`, which is at most the batch's length (checked under 4 GiB).
        start: (end - r.len()) as u32,
        len: r.len() as u32,
    };
    for _ in 0..count {
        let k = span(end, &mut r).ok_or_else(|| err("header key"))?;
        if k.is_null() {
            return Err(err("null header key"));
        }
        span(end, &mut r).ok_or_else(|| err("header value"))?;
    }
    if !r.is_empty() {
        return Err(err("record has trailing bytes"));
    }
    let timestamp = if batch.is_log_append_time() {
        batch.max_timestamp
    } else {
        batch.base_timestamp.wrapping_add(timestamp_delta)
    };
    // A record may claim a delta past the batch's last one; its offset, and the one
    // after it, must still fit an i64.
    let offset = batch
        .base_offset
        .checked_add(i64::from(offset_delta))
        .filter(|o| *o < i64::MAX)
        .ok_or_else(|| err("record offset past the end of the log"))?;
    Ok(Record {
        offset,
        timestamp,
        data: bytes,
        key,
        value,
        headers,
        header_count: count,
    })
}

/// Length-prefixed bytes, null for a negative length, read from `r` (which ends at
/// `end` in the batch's bytes) and returned as their place there.
#[inline(always)]
fn span(end: usize, r: &mut &[u8]) -> Option<Span> {
    let Some(field) = nullable(r)? else {
        return Some(Span::NULL);
    };
    // `r` lies inside the batch's bytes and ends at `end`; the field ends where `r`
    // now starts. The batch is under 4 GiB.
    let start = end - r.len() - field.len();
    Some(Span {
        start: start as u32,
        len: field.len() as u32,
    })
}

/// A transaction marker found in a fetched range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// The producer whose transaction it ends.
    pub producer_id: i64,
    /// The marker's offset.
    pub offset: i64,
    /// ABORT (true) or COMMIT (false).
    pub abort: bool,
}

/// The transaction markers in a partition's records field, read from batch headers
/// only: no CRC check, no decompression (control batches are never compressed). Stops
/// quietly at anything malformed; the iterator reports that.
pub fn control_markers(records: &Bytes) -> Vec<Marker> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let options = BatchOptions {
        check_crcs: false,
        max_decompressed: 1 << 16,
    };
    while let Some(head) = records.get(at..at + 12) {
        let Ok(length) =
            usize::try_from(i32::from_be_bytes([head[8], head[9], head[10], head[11]]))
        else {
            break;
        };
        let Some(batch) = records.get(at..at + 12 + length) else {
            break;
        };
        // attributes at 21..23; the control bit is 0x20.
        let is_control = batch.get(21..23).is_some_and(|a| a[1] & 0x20 != 0);
        if is_control && batch.get(16) == Some(&2) {
            let one = records.slice(at..at + 12 + length);
            if let Some(Ok(b)) = Batches::new(one, options).next() {
                if let Some(t) = control_type(&b) {
                    out.push(Marker {
                        producer_id: b.producer_id,
                        offset: b.base_offset,
                        abort: t == 0,
                    });
                }
            }
        }
        at += 12 + length;
    }
    out
}

/// `read_committed` filtering (KIP-98), as the Java client does it: records of a
/// transaction aborted within the fetched range are dropped, and control batches
/// (transaction markers) are never shown.
///
/// Feed the batches of one partition in offset order, with the partition's aborted
/// transactions from the same Fetch response. Where the markers of the same range are
/// given too ([`CommittedFilter::with_markers`]), a transactional batch whose
/// producer's next marker in the range is an ABORT is dropped even if the broker left
/// it out of the aborted list (tansu does); a real broker's list and markers agree, so
/// this changes nothing there.
#[derive(Debug, Clone, Default)]
pub struct CommittedFilter {
    /// `(first offset, producer id)` not yet reached, in offset order.
    pending: std::collections::VecDeque<(i64, i64)>,
    /// Producers whose transaction is aborted and whose abort marker is still ahead.
    aborted: std::collections::HashSet<i64>,
    /// Markers in the fetched range, in offset order.
    markers: Vec<Marker>,
}

impl CommittedFilter {
    /// A filter for one partition's fetched range.
    pub fn new(mut aborted: Vec<(i64, i64)>) -> Self {
        // From the response as (producer id, first offset).
        aborted.sort_by_key(|&(_, first)| first);
        Self {
            pending: aborted
                .into_iter()
                .map(|(producer, first)| (first, producer))
                .collect(),
            aborted: Default::default(),
            markers: Vec::new(),
        }
    }

    /// Adds the markers of the fetched range ([`control_markers`]).
    pub fn with_markers(mut self, markers: Vec<Marker>) -> Self {
        self.markers = markers;
        self
    }

    /// Whether `batch`'s records are shown to the application.
    pub fn admit(&mut self, batch: &RecordBatch) -> bool {
        let last = batch.next_offset() - 1;
        while let Some(&(first, producer)) = self.pending.front() {
            if first > last {
                break;
            }
            self.aborted.insert(producer);
            self.pending.pop_front();
        }
        if batch.is_control() {
            // An ABORT marker ends that producer's aborted transaction.
            if control_type(batch) == Some(0) {
                self.aborted.remove(&batch.producer_id);
            }
            return false;
        }
        if !batch.is_transactional() {
            return true;
        }
        if self.aborted.contains(&batch.producer_id) {
            return false;
        }
        // The producer's next marker in the range decides, if there is one.
        !self
            .markers
            .iter()
            .find(|m| m.producer_id == batch.producer_id && m.offset > last)
            .is_some_and(|m| m.abort)
    }
}

/// The type of a control batch's marker: 0 abort, 1 commit.
fn control_type(batch: &RecordBatch) -> Option<i16> {
    let record = batch.records().next()?.ok()?;
    let key = record.key()?;
    // Control record key: version (i16), type (i16).
    let t = key.get(2..4)?;
    Some(i16::from_be_bytes([t[0], t[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xerial_framed_snappy_as_the_java_client_writes_it() {
        let data = b"hello hello hello hello, kafka".repeat(20);
        let block = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        let mut framed = XERIAL_MAGIC.to_vec();
        framed.extend_from_slice(&1i32.to_be_bytes());
        framed.extend_from_slice(&1i32.to_be_bytes());
        // Two blocks, to exercise the loop.
        for _ in 0..2 {
            framed.extend_from_slice(&(block.len() as u32).to_be_bytes());
            framed.extend_from_slice(&block);
        }
        let out = decompress(Compression::Snappy, &framed, 1 << 20).unwrap();
        assert_eq!(out.len(), data.len() * 2);
        assert_eq!(&out[..data.len()], &data[..]);
        // A truncated block is an error, not a panic.
        let cut = &framed[..framed.len() - 3];
        assert!(matches!(
            decompress(Compression::Snappy, cut, 1 << 20),
            Err(BatchErrorKind::Decompress { .. })
        ));
    }

    /// One two-record batch written by ottla, moved to `base_offset`, its last offset
    /// delta set to `last_delta` (with CRC checks off, the CRC need not follow).
    fn batch_at(base_offset: i64, last_delta: i32) -> Bytes {
        use crate::produce::encode::{OutRecord, ProducerFields, encode_batch};
        let record = OutRecord {
            value: Some(Bytes::from_static(b"v")),
            ..OutRecord::default()
        };
        let batch = encode_batch(
            &[record.clone(), record],
            Compression::None,
            ProducerFields::NONE,
        )
        .unwrap();
        let mut b = batch.to_vec();
        b[0..8].copy_from_slice(&base_offset.to_be_bytes());
        b[23..27].copy_from_slice(&last_delta.to_be_bytes());
        Bytes::from(b)
    }

    #[test]
    fn offsets_past_i64_max_are_malformed_not_an_overflow() {
        // Found by the record_batch fuzz target.
        let options = BatchOptions {
            check_crcs: false,
            ..BatchOptions::default()
        };
        let first = |bytes| Batches::new(bytes, options).next().unwrap();
        assert!(matches!(
            first(batch_at(i64::MAX - 1, 1)),
            Err(BatchError {
                kind: BatchErrorKind::Malformed(_),
                ..
            })
        ));
        assert!(matches!(
            first(batch_at(i64::MIN, -2)),
            Err(BatchError {
                kind: BatchErrorKind::Malformed(_),
                ..
            })
        ));
        // The batch fits (it claims to end at i64::MAX - 1), its second record does
        // not: the first is read, the second is an error.
        let batch = first(batch_at(i64::MAX - 1, 0)).expect("the header fits");
        assert_eq!(batch.next_offset(), i64::MAX);
        let records: Vec<_> = batch.records().collect();
        assert_eq!(records[0].as_ref().unwrap().offset, i64::MAX - 1);
        assert!(records[1].is_err());
        // At the edge, everything fits.
        let batch = first(batch_at(i64::MAX - 2, 1)).expect("fits");
        assert!(batch.records().all(|r| r.is_ok()));
        // A negative base offset: `i64::MIN` with a delta of -1 passed the check above
        // and overflowed `next_offset() - 1` (found by the record_batch target).
        for (base, delta) in [(i64::MIN, -1), (-1, 1)] {
            assert!(
                matches!(
                    first(batch_at(base, delta)),
                    Err(BatchError {
                        kind: BatchErrorKind::Malformed("batch offsets past the end of the log"),
                        ..
                    })
                ),
                "{base} {delta}"
            );
        }
    }

    #[test]
    fn record_offsets_must_rise_within_the_batch() {
        // Found by the fetch_response target: a record claiming offset 17 in a batch
        // ending at 2, then a record at 2, moved the position to 18 and back to 3.
        let at = |delta: u8| -> Vec<u8> { vec![0, 0, delta * 2, 1, 1, 0] };
        let (r0, r1, r2, r5) = (at(0), at(1), at(2), at(5));
        // In order: fine; a gap (compaction: two records left of three) is fine too.
        let records = read_raw(raw_batch(&[&r0, &r1, &r2]));
        assert!(records.iter().all(|r| r.is_ok()), "{records:?}");
        let mut gap = raw_batch(&[&r0, &r2]).to_vec();
        gap[23..27].copy_from_slice(&2i32.to_be_bytes());
        let records = read_raw(Bytes::from(gap));
        let offsets: Vec<i64> = records.iter().map(|r| r.as_ref().unwrap().offset).collect();
        assert_eq!(offsets, vec![0, 2]);
        // Back to an earlier offset, or the same one twice.
        for second in [&r0, &r1] {
            let records = read_raw(raw_batch(&[&r1, second, &r2]));
            assert!(records[0].is_ok());
            assert_eq!(records.len(), 2, "iteration stops at the error");
            assert_eq!(
                records[1].as_ref().unwrap_err().kind,
                malformed("record offsets out of order")
            );
        }
        // Past the batch's last offset (2 records: last delta 1).
        let records = read_raw(raw_batch(&[&r0, &r5]));
        assert!(records[0].is_ok());
        assert_eq!(
            records[1].as_ref().unwrap_err().kind,
            malformed("record offset past the batch's last offset")
        );
    }

    #[test]
    fn varints_follow_the_zigzag_encoding() {
        for (bytes, value) in [
            (&[0x00][..], 0i64),
            (&[0x01], -1),
            (&[0x02], 1),
            (&[0x96, 0x01], 75),
            (&[0xff, 0x01], -128),
            (&[0x80, 0x80, 0x01], 8192),
            (&[0xfe, 0xff, 0xff, 0xff, 0x0f], i64::from(i32::MAX)),
            (
                &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                i64::MAX,
            ),
            (
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                i64::MIN,
            ),
        ] {
            // Followed by another byte, which must be left in place.
            let mut with_next = bytes.to_vec();
            with_next.push(0x2a);
            let mut b = &with_next[..];
            assert_eq!(varlong(&mut b), Some(value), "{bytes:?}");
            assert_eq!(b, &[0x2a], "{bytes:?}");
        }
        // Eleven continuation bytes: not a varlong.
        assert_eq!(varlong(&mut &[0x80; 11][..]), None);
        // Cut short after one, two or three bytes, or empty.
        for cut in [&[][..], &[0x80], &[0x80, 0x80], &[0x80, 0x80, 0x80]] {
            assert_eq!(varlong(&mut &cut[..]), None, "{cut:?}");
        }
        // A varint is a varlong within i32.
        assert_eq!(
            varint(&mut &[0xfe, 0xff, 0xff, 0xff, 0x0f][..]),
            Some(i32::MAX)
        );
        assert_eq!(varint(&mut &[0x80, 0x80, 0x80, 0x80, 0x10][..]), None);
    }

    /// A v2 batch at offset 0 around `records`, each given as its body (the length
    /// prefix is added), with a CRC of zero: read it with CRC checks off.
    fn raw_batch(records: &[&[u8]]) -> Bytes {
        let mut body = Vec::new();
        for r in records {
            // Zigzag, one byte: bodies here are shorter than 64 bytes.
            assert!(r.len() < 64);
            body.push((r.len() * 2) as u8);
            body.extend_from_slice(r);
        }
        let mut b = Vec::new();
        b.extend_from_slice(&0i64.to_be_bytes()); // base offset
        b.extend_from_slice(&((HEADER_LEN - 12 + body.len()) as i32).to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes()); // partition leader epoch
        b.push(2); // magic
        b.extend_from_slice(&0u32.to_be_bytes()); // CRC
        b.extend_from_slice(&0i16.to_be_bytes()); // attributes
        b.extend_from_slice(&(records.len() as i32 - 1).to_be_bytes()); // last offset delta
        b.extend_from_slice(&1_000i64.to_be_bytes()); // base timestamp
        b.extend_from_slice(&1_000i64.to_be_bytes()); // max timestamp
        b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
        b.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
        b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
        b.extend_from_slice(&(records.len() as i32).to_be_bytes());
        assert_eq!(b.len(), HEADER_LEN);
        b.extend_from_slice(&body);
        Bytes::from(b)
    }

    /// A record's fields, copied out of its batch for the assertions.
    #[derive(Debug)]
    struct Read {
        offset: i64,
        timestamp: i64,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        /// Where the key starts in memory (to tell a slice from a copy).
        key_at: Option<usize>,
    }

    /// The records of the first batch in `bytes`, read with CRC checks off.
    fn read_raw(bytes: Bytes) -> Vec<Result<Read, BatchError>> {
        let options = BatchOptions {
            check_crcs: false,
            ..BatchOptions::default()
        };
        let batch = Batches::new(bytes, options).next().unwrap().unwrap();
        batch
            .records()
            .map(|r| {
                r.map(|r| Read {
                    offset: r.offset,
                    timestamp: r.timestamp,
                    key: r.key().map(<[u8]>::to_vec),
                    value: r.value().map(<[u8]>::to_vec),
                    headers: r
                        .headers()
                        .map(|h| (h.key().to_vec(), h.value().map(<[u8]>::to_vec)))
                        .collect(),
                    key_at: r.key().map(|k| k.as_ptr() as usize),
                })
            })
            .collect()
    }

    fn malformed(what: &'static str) -> BatchErrorKind {
        BatchErrorKind::Malformed(what)
    }

    #[test]
    fn records_read_in_place_with_their_fields_as_slices() {
        // attributes, timestamp delta 5, offset delta 0, key "k", null value, two
        // headers ("h" = "xy", "n" = null).
        let first: &[u8] = &[0, 10, 0, 2, b'k', 1, 4, 2, b'h', 4, b'x', b'y', 2, b'n', 1];
        // Empty key and value, no headers.
        let second: &[u8] = &[0, 0, 2, 0, 0, 0];
        let bytes = raw_batch(&[first, second]);
        let records: Vec<Read> = read_raw(bytes.clone())
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(records[0].offset, 0);
        assert_eq!(records[0].timestamp, 1_005);
        assert_eq!(records[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(records[0].value, None);
        assert_eq!(
            records[0].headers,
            [(b"h".to_vec(), Some(b"xy".to_vec())), (b"n".to_vec(), None)]
        );
        // The key is read where it lies in the response bytes, not copied.
        let at = bytes.windows(2).position(|w| w == [2, b'k']).unwrap() + 1;
        assert_eq!(records[0].key_at, Some(bytes[at..].as_ptr() as usize));
        assert_eq!(records[1].offset, 1);
        assert_eq!(records[1].key.as_deref(), Some(&b""[..]));
        assert_eq!(records[1].value.as_deref(), Some(&b""[..]));
        assert!(records[1].headers.is_empty());
    }

    #[test]
    fn fields_end_with_their_record_not_the_batch() {
        // The next record's bytes must never complete a field of this one: each case
        // is followed by a valid record.
        let valid: &[u8] = &[0, 0, 0, 1, 1, 0];
        for (record, what) in [
            // Header count cut after a continuation byte (a truncated varint at the
            // end of the record).
            (&[0, 0, 0, 1, 1, 0x80][..], "header count"),
            // Offset delta cut the same way, two bytes in.
            (&[0, 0, 0x80, 0x80], "offset delta"),
            (&[0, 0x80], "timestamp delta"),
            // A value longer than what is left of the record.
            (&[0, 0, 0, 1, 6, b'a', b'b'], "value"),
            (&[0, 0, 0, 4, b'a'], "key"),
            (&[0, 0, 0, 1, 1, 2, 2, b'h'], "header value"),
            (&[0, 0, 0, 1, 1, 2, 0x80, 0x80], "header key"),
            (&[0, 0, 0, 1, 1, 2, 1, 1], "null header key"),
            (&[0, 0, 0, 1, 1, 0, 0], "record has trailing bytes"),
            (&[0, 0, 0, 1, 1, 1], "negative header count"),
            (&[0, 0, 0, 1, 1, 8, 0, 0], "more headers than bytes"),
            (&[], "empty record"),
        ] {
            let records = read_raw(raw_batch(&[record, valid]));
            assert_eq!(records.len(), 1, "{what}: iteration stops at the error");
            assert_eq!(
                records[0].as_ref().unwrap_err().kind,
                malformed(what),
                "{record:?}"
            );
        }
        // A record length past the batch's end, negative, or cut short.
        for (tail, what) in [
            (&[0x7e][..], "record longer than the batch"),
            (&[0x01], "negative record length"),
            (&[0x80], "record length"),
        ] {
            let mut bytes = raw_batch(&[valid]).to_vec();
            let n = bytes.len();
            bytes.extend_from_slice(tail);
            // One more record, in the length and count.
            let length = i32::from_be_bytes(bytes[8..12].try_into().unwrap()) + tail.len() as i32;
            bytes[8..12].copy_from_slice(&length.to_be_bytes());
            bytes[57..61].copy_from_slice(&2i32.to_be_bytes());
            assert_eq!(n + tail.len(), bytes.len());
            let records = read_raw(Bytes::from(bytes));
            assert!(records[0].is_ok());
            assert_eq!(records[1].as_ref().unwrap_err().kind, malformed(what));
        }
        // A batch claiming more records than it holds: an error at the end, not a
        // panic.
        let mut bytes = raw_batch(&[valid]).to_vec();
        bytes[57..61].copy_from_slice(&3i32.to_be_bytes());
        let records = read_raw(Bytes::from(bytes));
        assert!(records[0].is_ok());
        assert_eq!(
            records[1].as_ref().unwrap_err().kind,
            malformed("record length")
        );
        assert_eq!(records.len(), 2);
    }
}
