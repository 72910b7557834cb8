//! A delivered record: one shared reference to the bytes of the batch it came in, and
//! where its key, value and headers lie in them.
//!
//! A record used to hold a `Bytes` for its key, one for its value and two for each
//! header, in a `Vec`: every clone and drop of a record touched four or more reference
//! counts, each an atomic operation on the fetch response's buffer, shared between the
//! threads that handle records. Now the records of one batch share one `Arc` (the
//! batch's bytes, topic, partition, leader epoch and timestamp type) and a record is
//! that `Arc` and a few offsets: one reference count per clone.
//!
//! Headers are checked when the batch is read (every length, and that no key is null),
//! so a record that exists is well formed; they are parsed again, without allocating,
//! each time [`ConsumerRecord::headers`] is iterated. Nothing here can fail or panic on
//! a record that was built: the accessors only read what the decoder checked.

use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::batch::Record;
use crate::group::consumer_protocol::TopicPartition;
use crate::record_format::{put_bytes, varint};

/// How a record's timestamp was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    /// Set by the producer.
    CreateTime,
    /// Set by the broker when it appended the batch.
    LogAppendTime,
}

/// A record delivered to the application.
///
/// Cloning one is cheap (one reference count), and a clone keeps the bytes of the
/// whole batch it came in alive: a handler that keeps a record past its call clones it
/// (or `to_owned()`); one that keeps only the value keeps [`value_bytes`], a slice of
/// the same bytes.
///
/// [`value_bytes`]: ConsumerRecord::value_bytes
#[derive(Clone)]
pub struct ConsumerRecord {
    shared: Arc<Shared>,
    offset: i64,
    timestamp: i64,
    key: Span,
    value: Span,
    /// The header entries, as they are on the wire (after the count).
    headers: Span,
    header_count: u32,
}

/// What the records of one batch share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    /// -1: the broker did not set one.
    pub(crate) leader_epoch: i32,
    pub(crate) timestamp_type: TimestampType,
    /// The batch's records (decompressed, if it was compressed).
    pub(crate) data: Bytes,
}

impl Shared {
    pub(crate) fn new(
        topic: Arc<str>,
        partition: i32,
        leader_epoch: i32,
        timestamp_type: TimestampType,
        data: Bytes,
    ) -> Arc<Self> {
        Arc::new(Self {
            topic,
            partition,
            leader_epoch,
            timestamp_type,
            data,
        })
    }
}

/// Where a field lies in its batch's bytes. The decoder refuses a batch of 4 GiB or
/// more, so a `u32` reaches every byte; `len == u32::MAX` is a null field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) start: u32,
    pub(crate) len: u32,
}

impl Span {
    pub(crate) const NULL: Span = Span {
        start: 0,
        len: u32::MAX,
    };

    pub(crate) fn is_null(self) -> bool {
        self.len == u32::MAX
    }

    fn range(self) -> Option<std::ops::Range<usize>> {
        if self.is_null() {
            return None;
        }
        let start = self.start as usize;
        Some(start..start + self.len as usize)
    }

    /// The bytes in `data`, `None` for a null field. A span that does not fit `data`
    /// (which the decoder never builds) reads as empty rather than panicking.
    #[inline]
    pub(crate) fn get(self, data: &[u8]) -> Option<&[u8]> {
        self.range().map(|r| data.get(r).unwrap_or_default())
    }

    fn slice(self, data: &Bytes) -> Option<Bytes> {
        let r = self.range()?;
        Some(if r.end <= data.len() {
            data.slice(r)
        } else {
            Bytes::new()
        })
    }
}

impl ConsumerRecord {
    /// The record `r` of the batch whose bytes and coordinates `shared` holds.
    #[inline]
    pub(crate) fn new(shared: Arc<Shared>, r: &Record<'_>) -> Self {
        Self {
            shared,
            offset: r.offset,
            timestamp: r.timestamp,
            key: r.key,
            value: r.value,
            headers: r.headers,
            header_count: r.header_count,
        }
    }

    /// A record built by hand, for tests and tools (a fake consumer, a replay, a
    /// handler's unit test): `ConsumerRecord::builder("orders", 0, 42).value("{}")`.
    pub fn builder(topic: &str, partition: i32, offset: i64) -> ConsumerRecordBuilder {
        ConsumerRecordBuilder {
            topic: Arc::from(topic),
            partition,
            offset,
            timestamp: 0,
            timestamp_type: TimestampType::CreateTime,
            leader_epoch: None,
            key: None,
            value: None,
            headers: Vec::new(),
        }
    }

    /// The topic.
    #[inline]
    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    /// The partition.
    #[inline]
    pub fn partition(&self) -> i32 {
        self.shared.partition
    }

    /// The offset.
    #[inline]
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The timestamp (ms since the epoch).
    #[inline]
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }

    /// How the timestamp was set.
    #[inline]
    pub fn timestamp_type(&self) -> TimestampType {
        self.shared.timestamp_type
    }

    /// The leader epoch of the batch, or `None` when the broker did not set one.
    #[inline]
    pub fn leader_epoch(&self) -> Option<i32> {
        let epoch = self.shared.leader_epoch;
        (epoch >= 0).then_some(epoch)
    }

    /// The key (`None`: null).
    #[inline]
    pub fn key(&self) -> Option<&[u8]> {
        self.key.get(&self.shared.data)
    }

    /// The value (`None`: null, a tombstone).
    #[inline]
    pub fn value(&self) -> Option<&[u8]> {
        self.value.get(&self.shared.data)
    }

    /// The key as a shared slice of the fetched bytes (no copy; it keeps the batch's
    /// bytes alive while it is kept).
    pub fn key_bytes(&self) -> Option<Bytes> {
        self.key.slice(&self.shared.data)
    }

    /// The value as a shared slice of the fetched bytes (no copy; it keeps the batch's
    /// bytes alive while it is kept).
    pub fn value_bytes(&self) -> Option<Bytes> {
        self.value.slice(&self.shared.data)
    }

    /// The headers, in order, read in place.
    #[inline]
    pub fn headers(&self) -> Headers<'_> {
        Headers {
            rest: self.headers.get(&self.shared.data).unwrap_or_default(),
            remaining: self.header_count,
        }
    }

    /// The first header named `key` (`headers().first(key)`), with the usual record,
    /// which has no header, answered by one comparison before any parsing.
    #[inline]
    pub fn header(&self, key: &str) -> Option<Header<'_>> {
        if self.header_count == 0 {
            return None;
        }
        self.headers().first(key)
    }

    /// Whether the record has any header.
    #[inline]
    pub fn has_headers(&self) -> bool {
        self.header_count > 0
    }

    /// The headers as owned pairs of shared slices (no copy of the bytes; one `Vec`).
    pub fn headers_owned(&self) -> Vec<(Bytes, Option<Bytes>)> {
        let data = &self.shared.data;
        let base = data.as_ptr() as usize;
        let slice = |s: &[u8]| {
            let start = s.as_ptr() as usize - base;
            data.slice(start..start + s.len())
        };
        self.headers()
            .map(|h| (slice(h.key), h.value.map(slice)))
            .collect()
    }

    /// This record's partition.
    pub fn topic_partition(&self) -> TopicPartition {
        TopicPartition {
            topic: self.topic().to_string(),
            partition: self.partition(),
        }
    }

    /// Whether the record is of `topic`/`partition`: the topic is compared by pointer
    /// first (the records of one partition share the fetcher's name), then as text.
    #[doc(hidden)]
    #[inline]
    pub fn is_in(&self, topic: &Arc<str>, partition: i32) -> bool {
        self.shared.partition == partition
            && (Arc::ptr_eq(&self.shared.topic, topic) || *self.shared.topic == **topic)
    }

    /// The topic's shared name.
    #[doc(hidden)]
    #[inline]
    pub fn topic_arc(&self) -> &Arc<str> {
        &self.shared.topic
    }
}

impl PartialEq for ConsumerRecord {
    fn eq(&self, other: &Self) -> bool {
        self.offset == other.offset
            && self.partition() == other.partition()
            && self.topic() == other.topic()
            && self.timestamp == other.timestamp
            && self.timestamp_type() == other.timestamp_type()
            && self.leader_epoch() == other.leader_epoch()
            && self.key() == other.key()
            && self.value() == other.value()
            && self.headers().eq(other.headers())
    }
}

impl Eq for ConsumerRecord {}

impl fmt::Debug for ConsumerRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
        f.debug_struct("ConsumerRecord")
            .field("topic", &self.topic())
            .field("partition", &self.partition())
            .field("offset", &self.offset)
            .field("timestamp", &self.timestamp)
            .field("timestamp_type", &self.timestamp_type())
            .field("leader_epoch", &self.leader_epoch())
            .field("key", &bytes(self.key()))
            .field("value", &bytes(self.value()))
            .field("headers", &self.headers().collect::<Vec<_>>())
            .finish()
    }
}

/// One header of a record, borrowed from the record's bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    key: &'a [u8],
    value: Option<&'a [u8]>,
}

impl<'a> Header<'a> {
    /// The key's bytes (UTF-8 by the protocol; not checked).
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The key as text, `None` if it is not UTF-8.
    pub fn key_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.key).ok()
    }

    /// The value (`None`: null).
    pub fn value(&self) -> Option<&'a [u8]> {
        self.value
    }
}

impl fmt::Debug for Header<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.value.map(String::from_utf8_lossy);
        write!(f, "({:?}, {value:?})", String::from_utf8_lossy(self.key))
    }
}

/// A record's headers in order, parsed in place as they are iterated.
#[derive(Debug, Clone)]
pub struct Headers<'a> {
    rest: &'a [u8],
    remaining: u32,
}

impl<'a> Headers<'a> {
    /// The headers in `entries` (as a record holds them, after the count), `count` of
    /// them, checked by the decoder.
    pub(crate) fn new(entries: &'a [u8], count: u32) -> Self {
        Self {
            rest: entries,
            remaining: count,
        }
    }

    /// The first header named `key` (as Kafka's own `Headers` keep several of a name).
    pub fn first(mut self, key: &str) -> Option<Header<'a>> {
        self.find(|h| h.key == key.as_bytes())
    }

    /// The last header named `key` (Java's `Headers.lastHeader`).
    pub fn last(self, key: &str) -> Option<Header<'a>> {
        self.filter(|h| h.key == key.as_bytes()).last()
    }
}

impl<'a> Iterator for Headers<'a> {
    type Item = Header<'a>;

    #[inline]
    fn next(&mut self) -> Option<Header<'a>> {
        if self.remaining == 0 {
            return None;
        }
        let header = read_header(&mut self.rest);
        // The decoder checked every header; a failure here would be a bug, and ends
        // the iteration rather than panicking.
        self.remaining = if header.is_some() {
            self.remaining - 1
        } else {
            0
        };
        header
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining as usize))
    }
}

fn read_header<'a>(rest: &mut &'a [u8]) -> Option<Header<'a>> {
    let key = nullable(rest)??;
    let value = nullable(rest)?;
    Some(Header { key, value })
}

/// Length-prefixed bytes (`Some(None)`: null), or `None` when the bytes end first.
#[inline]
pub(crate) fn nullable<'a>(rest: &mut &'a [u8]) -> Option<Option<&'a [u8]>> {
    let len = varint(rest)?;
    let Ok(len) = usize::try_from(len) else {
        return Some(None);
    };
    let (field, tail) = rest.split_at_checked(len)?;
    *rest = tail;
    Some(Some(field))
}

/// Builds a [`ConsumerRecord`] by hand ([`ConsumerRecord::builder`]).
#[derive(Debug, Clone)]
pub struct ConsumerRecordBuilder {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    timestamp: i64,
    timestamp_type: TimestampType,
    leader_epoch: Option<i32>,
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: Vec<(Bytes, Option<Bytes>)>,
}

impl ConsumerRecordBuilder {
    /// The key (default: null).
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The value (default: null, a tombstone).
    pub fn value(mut self, value: impl Into<Bytes>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Adds a header (a `None` value is a null one).
    pub fn header(mut self, key: impl Into<Bytes>, value: Option<impl Into<Bytes>>) -> Self {
        self.headers.push((key.into(), value.map(Into::into)));
        self
    }

    /// The timestamp (ms since the epoch; default 0).
    pub fn timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// How the timestamp was set (default: create time).
    pub fn timestamp_type(mut self, timestamp_type: TimestampType) -> Self {
        self.timestamp_type = timestamp_type;
        self
    }

    /// The leader epoch (default: none).
    pub fn leader_epoch(mut self, epoch: i32) -> Self {
        self.leader_epoch = Some(epoch);
        self
    }

    /// The record. Its key, value and headers are laid out as a batch holds them, so
    /// it reads exactly like a fetched one.
    ///
    /// # Panics
    ///
    /// If the key, value and headers add up to 4 GiB or more, which no batch holds.
    pub fn build(self) -> ConsumerRecord {
        let mut data = BytesMut::new();
        let span = |data: &mut BytesMut, field: Option<&Bytes>| match field {
            None => Span::NULL,
            Some(b) => {
                let start = data.len();
                data.extend_from_slice(b);
                Span {
                    start: to_u32(start),
                    len: to_u32(b.len()),
                }
            }
        };
        let key = span(&mut data, self.key.as_ref());
        let value = span(&mut data, self.value.as_ref());
        let start = data.len();
        for (k, v) in &self.headers {
            put_bytes(&mut data, Some(k));
            put_bytes(&mut data, v.as_deref());
        }
        let headers = Span {
            start: to_u32(start),
            len: to_u32(data.len() - start),
        };
        let shared = Shared::new(
            self.topic,
            self.partition,
            self.leader_epoch.unwrap_or(-1),
            self.timestamp_type,
            data.freeze(),
        );
        ConsumerRecord {
            shared,
            offset: self.offset,
            timestamp: self.timestamp,
            key,
            value,
            headers,
            header_count: to_u32(self.headers.len()),
        }
    }
}

fn to_u32(n: usize) -> u32 {
    match u32::try_from(n) {
        Ok(n) if n < u32::MAX => n,
        _ => panic!("a hand-built record must be smaller than 4 GiB"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_record_reads_back_through_every_accessor() {
        let r = ConsumerRecord::builder("orders", 3, 42)
            .key("k")
            .value("v")
            .header("a", Some("1"))
            .header("b", None::<Bytes>)
            .header("a", Some("2"))
            .timestamp(7)
            .leader_epoch(5)
            .build();
        assert_eq!(
            (r.topic(), r.partition(), r.offset(), r.timestamp()),
            ("orders", 3, 42, 7)
        );
        assert_eq!(r.leader_epoch(), Some(5));
        assert_eq!(r.key(), Some(&b"k"[..]));
        assert_eq!(r.value_bytes(), Some(Bytes::from_static(b"v")));
        let headers: Vec<_> = r.headers().map(|h| (h.key(), h.value())).collect();
        assert_eq!(
            headers,
            [
                (&b"a"[..], Some(&b"1"[..])),
                (&b"b"[..], None),
                (&b"a"[..], Some(&b"2"[..]))
            ]
        );
        assert_eq!(
            r.headers().first("a").and_then(|h| h.value()),
            Some(&b"1"[..])
        );
        assert_eq!(
            r.headers().last("a").and_then(|h| h.value()),
            Some(&b"2"[..])
        );
        assert!(r.headers().first("c").is_none());
        assert_eq!(r.header("a").and_then(|h| h.value()), Some(&b"1"[..]));
        assert!(r.header("c").is_none());
        assert_eq!(
            r.headers_owned(),
            vec![
                (Bytes::from("a"), Some(Bytes::from("1"))),
                (Bytes::from("b"), None),
                (Bytes::from("a"), Some(Bytes::from("2"))),
            ]
        );
        assert!(r.has_headers());
    }

    #[test]
    fn nulls_and_empties_are_told_apart() {
        let r = ConsumerRecord::builder("t", 0, 0).key("").build();
        assert_eq!(r.key(), Some(&b""[..]));
        assert_eq!(r.value(), None);
        assert_eq!(r.value_bytes(), None);
        assert!(!r.has_headers());
        assert_eq!(r.headers().count(), 0);
        assert!(r.header("k").is_none());
        assert_eq!(r.leader_epoch(), None);
    }

    #[test]
    fn equality_is_by_content_not_by_layout() {
        let a = ConsumerRecord::builder("t", 1, 2).value("x").build();
        let b = ConsumerRecord::builder("t", 1, 2).value("x").build();
        assert_eq!(a, b);
        assert_ne!(a, ConsumerRecord::builder("t", 1, 2).value("y").build());
        assert_ne!(a, ConsumerRecord::builder("t", 1, 2).key("x").build());
        let shared: Arc<str> = Arc::from("t");
        assert!(a.is_in(&shared, 1));
        assert!(!a.is_in(&shared, 2));
    }

    #[test]
    fn a_span_past_the_bytes_reads_empty_instead_of_panicking() {
        let data = Bytes::from_static(b"abc");
        let bad = Span { start: 2, len: 9 };
        assert_eq!(bad.get(&data), Some(&b""[..]));
        assert_eq!(bad.slice(&data), Some(Bytes::new()));
        let mut truncated: &[u8] = &[0x06, b'a'];
        assert!(read_header(&mut truncated).is_none());
    }
}
