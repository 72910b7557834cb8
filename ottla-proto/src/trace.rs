//! W3C trace context (`traceparent`) for records: parsed from a record's header,
//! continued by the handler's span, and written into the records ottla produces on the
//! record's behalf (dead letters, retry-topic hops).
//!
//! Sans-IO: no clock, no random source. A span id is derived from the trace id and
//! what the span is about (group, partition, offset, attempt), so the lanes, which
//! build dead letters, and the driver, which opens spans, name the same span without
//! sharing state, and a replay of the same record gives the same ids.
//!
//! Format (W3C Trace Context, level 1): `00-<32 hex trace id>-<16 hex parent id>-<2 hex
//! flags>`, lowercase. A trace id or parent id of all zeros is invalid, as is version
//! `ff`. A later version may append fields after a `-`; they are ignored, as the
//! specification asks.

/// The header a record carries its trace context in.
pub const TRACEPARENT: &str = "traceparent";

/// One position in a trace: the trace, the span that sent the record, and whether the
/// trace is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace id (never all zeros).
    pub trace_id: [u8; 16],
    /// The span id of the sender (never all zeros).
    pub span_id: [u8; 8],
    /// The `sampled` flag.
    pub sampled: bool,
}

impl TraceContext {
    /// Parses a `traceparent` value; `None` if it is not one (the record is then
    /// handled without a trace to continue, as the specification asks).
    pub fn parse(value: &[u8]) -> Option<Self> {
        // version(2) - trace(32) - parent(16) - flags(2) = 55 bytes.
        let head = value.get(..55)?;
        let version = hex_byte(head.get(0..2)?)?;
        if version == 0xff || head.get(2) != Some(&b'-') {
            return None;
        }
        match value.get(55) {
            // Version 00 has exactly these fields; later versions may add more.
            None => {}
            Some(b'-') if version > 0 => {}
            Some(_) => return None,
        }
        let trace_id: [u8; 16] = hex_array(head.get(3..35)?)?;
        let span_id: [u8; 8] = hex_array(head.get(36..52)?)?;
        if head.get(35) != Some(&b'-') || head.get(52) != Some(&b'-') {
            return None;
        }
        let flags = hex_byte(head.get(53..55)?)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` value (version 00).
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// The trace id in lowercase hex, as tracing backends show it.
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id in lowercase hex.
    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }

    /// A span of the same trace whose parent is this one, named by `parts` (what the
    /// span is about: group, topic, partition, offset, attempt, ...). The same parts
    /// always give the same id.
    pub fn child(&self, parts: &[&[u8]]) -> Self {
        Self {
            span_id: derive_span_id(&self.trace_id, &self.span_id, parts),
            ..*self
        }
    }
}

/// The trace context a record's headers carry: the first `traceparent` header that
/// parses (a record with none, or a malformed one, starts no trace here).
pub fn of_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    headers: &[(K, Option<V>)],
) -> Option<TraceContext> {
    headers
        .iter()
        .find(|(k, _)| k.as_ref() == TRACEPARENT.as_bytes())
        .and_then(|(_, v)| v.as_ref())
        .and_then(|v| TraceContext::parse(v.as_ref()))
}

/// The trace context a consumed record carries ([`of_headers`], read in place).
pub fn of_record(record: &crate::fetch::record::ConsumerRecord) -> Option<TraceContext> {
    record
        .header(TRACEPARENT)
        .and_then(|h| h.value())
        .and_then(TraceContext::parse)
}

/// Whether a consumed record has a `traceparent` header ([`has_header`], read in place).
pub fn record_has_header(record: &crate::fetch::record::ConsumerRecord) -> bool {
    record.header(TRACEPARENT).is_some()
}

/// Whether `headers` has a `traceparent` header (valid or not: a record that names its
/// own trace context keeps it).
pub fn has_header<K: AsRef<[u8]>, V>(headers: &[(K, V)]) -> bool {
    headers
        .iter()
        .any(|(k, _)| k.as_ref() == TRACEPARENT.as_bytes())
}

/// Sets `headers`' `traceparent` to `context`: the first one is replaced in place,
/// later ones are removed, and one is appended if there was none. `tracestate` is left
/// as it is, as the specification allows a participant that keeps no state of its own.
pub fn set_header(headers: &mut Vec<(String, Option<bytes::Bytes>)>, context: &TraceContext) {
    let value = Some(bytes::Bytes::from(context.header()));
    let mut seen = false;
    headers.retain_mut(|(k, v)| {
        if k != TRACEPARENT {
            return true;
        }
        if seen {
            return false;
        }
        seen = true;
        *v = value.clone();
        true
    });
    if !seen {
        headers.push((TRACEPARENT.to_string(), value));
    }
}

/// FNV-1a over the trace id, the parent span id and `parts` (each length-prefixed, so
/// that `["ab", "c"]` and `["a", "bc"]` differ), then a final mix; never zero.
fn derive_span_id(trace: &[u8; 16], parent: &[u8; 8], parts: &[&[u8]]) -> [u8; 8] {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    feed(trace);
    feed(parent);
    for part in parts {
        feed(&(part.len() as u64).to_be_bytes());
        feed(part);
    }
    // splitmix64's finaliser: FNV's low bits alone mix poorly.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    if h == 0 {
        h = 1;
    }
    h.to_be_bytes()
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// One lowercase hex digit (the specification allows no uppercase).
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    match two {
        [hi, lo] => Some(nibble(*hi)? << 4 | nibble(*lo)?),
        _ => None,
    }
}

fn hex_array<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        *out.get_mut(i)? = hex_byte(pair)?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specifications_example_parses_and_formats_back() {
        let t = TraceContext::parse(EXAMPLE.as_bytes()).expect("valid");
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id_hex(), "00f067aa0ba902b7");
        assert!(t.sampled);
        assert_eq!(t.header(), EXAMPLE);
    }

    #[test]
    fn invalid_values_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            // Uppercase hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // All-zero trace id, all-zero parent id.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Version ff, a wrong separator, version 00 with more fields.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            assert_eq!(TraceContext::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_with_more_fields_keeps_the_known_ones() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more";
        let t = TraceContext::parse(later.as_bytes()).expect("valid");
        assert!(!t.sampled);
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn children_keep_the_trace_and_are_named_by_their_parts() {
        let t = TraceContext::parse(EXAMPLE.as_bytes()).expect("valid");
        let attempt = |n: &[u8]| t.child(&[b"billing", b"orders", b"3", b"17", n]);
        let (first, second) = (attempt(b"1"), attempt(b"2"));
        assert_eq!(first.trace_id, t.trace_id);
        assert_eq!(first.sampled, t.sampled);
        assert_ne!(first.span_id, t.span_id);
        assert_ne!(first.span_id, second.span_id);
        assert_eq!(attempt(b"1"), first, "the same parts, the same span");
        // Length prefixes: moving a byte between parts names another span.
        assert_ne!(t.child(&[b"ab", b"c"]), t.child(&[b"a", b"bc"]));
        // A grandchild differs from a child with the same parts.
        assert_ne!(first.child(&[b"dlq"]), t.child(&[b"dlq"]));
    }

    #[test]
    fn headers_are_read_and_rewritten_in_place() {
        let t = TraceContext::parse(EXAMPLE.as_bytes()).expect("valid");
        let consumed: Vec<(bytes::Bytes, Option<bytes::Bytes>)> = vec![
            (bytes::Bytes::from_static(b"a"), None),
            (
                bytes::Bytes::from_static(b"traceparent"),
                Some(bytes::Bytes::from_static(b"junk")),
            ),
        ];
        assert_eq!(
            of_headers(&consumed),
            None,
            "a malformed value starts no trace"
        );
        assert!(has_header(&consumed));
        let child = t.child(&[b"x"]);
        let mut out = vec![
            ("a".to_string(), None),
            (
                TRACEPARENT.to_string(),
                Some(bytes::Bytes::from(t.header())),
            ),
            ("b".to_string(), None),
            (
                TRACEPARENT.to_string(),
                Some(bytes::Bytes::from_static(b"old")),
            ),
        ];
        set_header(&mut out, &child);
        let names: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["a", TRACEPARENT, "b"],
            "replaced in place, the duplicate gone"
        );
        assert_eq!(of_headers(&out), Some(child));
        let mut none: Vec<(String, Option<bytes::Bytes>)> = Vec::new();
        assert!(!has_header(&none));
        set_header(&mut none, &t);
        assert_eq!(of_headers(&none), Some(t));
    }

    proptest::proptest! {
        /// Header values come from the network: any bytes are refused or read, never a
        /// panic; what ottla writes reads back as it was.
        #[test]
        fn any_value_parses_or_is_refused_and_ours_read_back(
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            trace_id in proptest::prelude::any::<[u8; 16]>(),
            span_id in proptest::prelude::any::<[u8; 8]>(),
            sampled in proptest::prelude::any::<bool>(),
        ) {
            let _ = TraceContext::parse(&junk);
            let ours = TraceContext { trace_id, span_id, sampled };
            let read = TraceContext::parse(ours.header().as_bytes());
            if trace_id == [0; 16] || span_id == [0; 8] {
                proptest::prop_assert_eq!(read, None);
            } else {
                proptest::prop_assert_eq!(read, Some(ours));
            }
        }
    }
}
