//! Dead-letter records: the original key, value and headers, byte for byte, plus
//! diagnostic headers in a selectable format.

use bytes::Bytes;

use super::classify::{ErrorClass, ProcessError};
use crate::fetch::fetcher::TimestampType;

/// The diagnostic header format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DlqFormat {
    /// `__dlq.errors.*` (topic, partition, offset, group, delivery.count, message) plus
    /// `ottla.dlq.*` (class, type, timestamps, dedup id). The default.
    #[default]
    Apache,
    /// Spring Kafka's `kafka_dlt-*` headers (binary ints, as Spring writes them).
    Spring,
    /// Kafka Connect's `__connect.errors.*` headers.
    Connect,
    /// The value becomes a JSON envelope (`original_message`, `error_type`,
    /// `error_message`, `failed_at`, `retry_count`, `error_classification`); the key and
    /// the original headers are kept.
    JsonEnvelope,
}

/// The timestamp a dead-letter record carries. The original one is kept in the
/// `ottla.dlq.original.timestamp` header either way (and Spring's
/// `kafka_dlt-original-timestamp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DlqTimestamp {
    /// When it was dead-lettered (the default): time-based retention of the DLQ counts
    /// from when the record got there, so a record dead-lettered long after it was
    /// written is not deleted before anyone sees it.
    #[default]
    DeadLettered,
    /// The original record's (ottla's behaviour before 0.2, and Spring's default).
    Original,
}

/// What is known about a record that is dead-lettered.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// Original topic.
    pub topic: &'a str,
    /// Original partition.
    pub partition: i32,
    /// Original offset.
    pub offset: i64,
    /// Original timestamp (ms).
    pub timestamp: i64,
    /// How the original timestamp was set.
    pub timestamp_type: TimestampType,
    /// The consumer group.
    pub group: &'a str,
    /// The last error.
    pub error: &'a ProcessError,
    /// The class used (an exhausted unclassified error counts as transient).
    pub class: ErrorClass,
    /// Attempts made (the first one included).
    pub attempts: u32,
    /// When the first attempt failed (ms).
    pub first_failure_ms: i64,
    /// When the record was dead-lettered (ms).
    pub dead_lettered_ms: i64,
}

/// Error messages longer than this are cut (at a character boundary).
pub const MAX_MESSAGE: usize = 1000;

fn truncate(s: &str) -> &str {
    if s.len() <= MAX_MESSAGE {
        return s;
    }
    let mut end = MAX_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl DeadLetter<'_> {
    /// `group/topic/partition/offset`: the same record dead-lettered twice has the
    /// same id.
    pub fn dedup_id(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.group, self.topic, self.partition, self.offset
        )
    }

    /// The error and its causes as a stack-trace-like text, as Spring's
    /// `kafka_dlt-exception-stacktrace` holds a Java stack trace: `kind: message`, then
    /// `Caused by: ` each cause, outermost first (Rust errors carry no frames).
    pub fn trace(&self) -> String {
        let mut out = format!("{}: {}", self.error.kind, self.error.message);
        if let Some(cause) = &self.error.cause {
            for (i, message) in cause.chain.iter().enumerate() {
                out.push_str("\nCaused by: ");
                if i == 0 {
                    out.push_str(&cause.kind);
                    out.push_str(": ");
                }
                out.push_str(message);
            }
        }
        out
    }

    fn string_headers(&self, names: &[(&str, String)]) -> Vec<(String, Option<Bytes>)> {
        names
            .iter()
            .map(|(k, v)| (k.to_string(), Some(Bytes::from(v.clone()))))
            .collect()
    }

    /// The diagnostic headers of `format` (none for [`DlqFormat::JsonEnvelope`], whose
    /// diagnostics are in the value; the `ottla.dlq.*` ones are added to every format).
    pub fn headers(&self, format: DlqFormat) -> Vec<(String, Option<Bytes>)> {
        let message = truncate(&self.error.message).to_string();
        let ours = self.string_headers(&[
            ("ottla.dlq.class", self.class.label().to_string()),
            ("ottla.dlq.error.type", self.error.kind.clone()),
            ("ottla.dlq.original.timestamp", self.timestamp.to_string()),
            ("ottla.dlq.first.failure", self.first_failure_ms.to_string()),
            (
                "ottla.dlq.dead.lettered.at",
                self.dead_lettered_ms.to_string(),
            ),
            ("ottla.dlq.dedup.id", self.dedup_id()),
        ]);
        let mut out = match format {
            DlqFormat::Apache => self.string_headers(&[
                ("__dlq.errors.topic", self.topic.to_string()),
                ("__dlq.errors.partition", self.partition.to_string()),
                ("__dlq.errors.offset", self.offset.to_string()),
                ("__dlq.errors.group", self.group.to_string()),
                ("__dlq.errors.delivery.count", self.attempts.to_string()),
                ("__dlq.errors.message", message),
            ]),
            DlqFormat::Spring => {
                let b = |v: Vec<u8>| Some(Bytes::from(v));
                let mut headers = vec![
                    (
                        "kafka_dlt-original-topic".into(),
                        b(self.topic.as_bytes().to_vec()),
                    ),
                    (
                        "kafka_dlt-original-partition".into(),
                        b(self.partition.to_be_bytes().to_vec()),
                    ),
                    (
                        "kafka_dlt-original-offset".into(),
                        b(self.offset.to_be_bytes().to_vec()),
                    ),
                    (
                        "kafka_dlt-original-timestamp".into(),
                        b(self.timestamp.to_be_bytes().to_vec()),
                    ),
                    (
                        "kafka_dlt-original-timestamp-type".into(),
                        b(match self.timestamp_type {
                            TimestampType::CreateTime => b"CreateTime".to_vec(),
                            TimestampType::LogAppendTime => b"LogAppendTime".to_vec(),
                        }),
                    ),
                    (
                        "kafka_dlt-original-consumer-group".into(),
                        b(self.group.as_bytes().to_vec()),
                    ),
                    (
                        "kafka_dlt-exception-fqcn".into(),
                        b(self.error.kind.as_bytes().to_vec()),
                    ),
                    (
                        "kafka_dlt-exception-message".into(),
                        b(message.into_bytes()),
                    ),
                    (
                        "kafka_dlt-exception-stacktrace".into(),
                        b(truncate(&self.trace()).as_bytes().to_vec()),
                    ),
                ];
                if let Some(cause) = &self.error.cause {
                    headers.push((
                        "kafka_dlt-exception-cause-fqcn".into(),
                        b(cause.kind.as_bytes().to_vec()),
                    ));
                }
                headers
            }
            DlqFormat::Connect => self.string_headers(&[
                ("__connect.errors.topic", self.topic.to_string()),
                ("__connect.errors.partition", self.partition.to_string()),
                ("__connect.errors.offset", self.offset.to_string()),
                ("__connect.errors.connector.name", self.group.to_string()),
                ("__connect.errors.stage", "TASK_PUT".to_string()),
                (
                    "__connect.errors.exception.class.name",
                    self.error.kind.clone(),
                ),
                ("__connect.errors.exception.message", message),
            ]),
            DlqFormat::JsonEnvelope => Vec::new(),
        };
        out.extend(ours);
        out
    }

    /// The JSON envelope of [`DlqFormat::JsonEnvelope`]. Key and value are strings when
    /// they are UTF-8, else base64 (`key_base64`, `value_base64`).
    pub fn envelope(
        &self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(Bytes, Option<Bytes>)],
    ) -> String {
        let field = |name: &str, data: Option<&[u8]>| match data {
            None => format!("\"{name}\":null"),
            Some(d) => match std::str::from_utf8(d) {
                Ok(s) => format!("\"{name}\":{}", json_string(s)),
                Err(_) => format!("\"{name}_base64\":\"{}\"", base64(d)),
            },
        };
        let headers: Vec<String> = headers
            .iter()
            .map(|(k, v)| {
                format!(
                    "{{{},{}}}",
                    field("key", Some(k)),
                    field("value", v.as_deref())
                )
            })
            .collect();
        format!(
            "{{\"original_message\":{{\"topic\":{},\"partition\":{},\"offset\":{},\"timestamp\":{},{},{},\"headers\":[{}]}},\"error_type\":{},\"error_message\":{},\"failed_at\":\"{}\",\"retry_count\":{},\"error_classification\":\"{}\",\"consumer_group\":{},\"dedup_id\":{}}}",
            json_string(self.topic),
            self.partition,
            self.offset,
            self.timestamp,
            field("key", key),
            field("value", value),
            headers.join(","),
            json_string(&self.error.kind),
            json_string(truncate(&self.error.message)),
            rfc3339(self.dead_lettered_ms),
            self.attempts.saturating_sub(1),
            self.class.label(),
            json_string(self.group),
            json_string(&self.dedup_id()),
        )
    }
}

/// What a [`DlqFormat::JsonEnvelope`] value says of the original record: enough to
/// replay it (origin, key, value, headers) and to report why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enveloped {
    /// Original topic.
    pub topic: String,
    /// Original partition.
    pub partition: i32,
    /// Original offset.
    pub offset: i64,
    /// Original timestamp (ms).
    pub timestamp: i64,
    /// Original key (`None`: null).
    pub key: Option<Bytes>,
    /// Original value (`None`: null).
    pub value: Option<Bytes>,
    /// Original headers, in order.
    pub headers: Vec<(Bytes, Option<Bytes>)>,
    /// `error_type`.
    pub error_type: Option<String>,
    /// `error_message`.
    pub error_message: Option<String>,
    /// `error_classification` (`retryable` / `non-retryable`).
    pub classification: Option<String>,
}

/// Reads a [`DlqFormat::JsonEnvelope`] value back ([`DeadLetter::envelope`]'s
/// output). `None` when `value` is not such an envelope: not JSON, nested deeper than
/// an envelope is, or missing the original topic, partition or offset.
pub fn parse_envelope(value: &[u8]) -> Option<Enveloped> {
    let text = std::str::from_utf8(value).ok()?;
    let mut p = json::Parser::new(text);
    let root = p.value(0)?;
    if !p.at_end() {
        return None;
    }
    let original = root.get("original_message")?;
    let bytes_of = |obj: &json::Value, name: &str| -> Option<Option<Bytes>> {
        if let Some(encoded) = obj
            .get(&format!("{name}_base64"))
            .and_then(json::Value::str)
        {
            use base64::Engine;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()?;
            return Some(Some(Bytes::from(raw)));
        }
        match obj.get(name)? {
            json::Value::Null => Some(None),
            json::Value::Str(s) => Some(Some(Bytes::from(s.clone().into_bytes()))),
            _ => None,
        }
    };
    let mut headers = Vec::new();
    for h in original
        .get("headers")
        .and_then(json::Value::array)
        .unwrap_or(&[])
    {
        let key = bytes_of(h, "key")??;
        headers.push((key, bytes_of(h, "value")?));
    }
    let text_of = |name: &str| {
        root.get(name)
            .and_then(json::Value::str)
            .map(str::to_string)
    };
    Some(Enveloped {
        topic: original.get("topic")?.str()?.to_string(),
        partition: original.get("partition")?.int()?.try_into().ok()?,
        offset: original.get("offset")?.int()?,
        timestamp: original
            .get("timestamp")
            .and_then(json::Value::int)
            .unwrap_or(-1),
        key: bytes_of(original, "key")?,
        value: bytes_of(original, "value")?,
        headers,
        error_type: text_of("error_type"),
        error_message: text_of("error_message"),
        classification: text_of("error_classification"),
    })
}

/// Just enough JSON to read an envelope back: objects, arrays, strings (with every
/// escape), integers, `true`, `false`, `null`; nesting bounded, so hostile input
/// cannot exhaust the stack.
mod json {
    /// How deep values may nest (an envelope needs 4).
    const MAX_DEPTH: usize = 16;

    #[derive(Debug, Clone, PartialEq)]
    pub(super) enum Value {
        Null,
        Bool,
        /// A number as written (integers are read exactly from it).
        Num(String),
        Str(String),
        Arr(Vec<Value>),
        Obj(Vec<(String, Value)>),
    }

    impl Value {
        pub(super) fn get(&self, name: &str) -> Option<&Value> {
            match self {
                Value::Obj(fields) => fields.iter().find(|(k, _)| k == name).map(|(_, v)| v),
                _ => None,
            }
        }
        pub(super) fn str(&self) -> Option<&str> {
            match self {
                Value::Str(s) => Some(s),
                _ => None,
            }
        }
        pub(super) fn int(&self) -> Option<i64> {
            match self {
                Value::Num(n) => n.parse().ok(),
                _ => None,
            }
        }
        pub(super) fn array(&self) -> Option<&[Value]> {
            match self {
                Value::Arr(items) => Some(items),
                _ => None,
            }
        }
    }

    /// Four hex digits of a `\u` escape.
    fn hex4(chars: &mut std::str::CharIndices<'_>) -> Option<u32> {
        let mut n = 0;
        for _ in 0..4 {
            n = n * 16 + chars.next()?.1.to_digit(16)?;
        }
        Some(n)
    }

    pub(super) struct Parser<'a> {
        rest: &'a str,
    }

    impl<'a> Parser<'a> {
        pub(super) fn new(text: &'a str) -> Self {
            Parser { rest: text }
        }

        pub(super) fn at_end(&mut self) -> bool {
            self.skip_ws();
            self.rest.is_empty()
        }

        fn skip_ws(&mut self) {
            self.rest = self.rest.trim_start_matches([' ', '\t', '\n', '\r']);
        }

        fn eat(&mut self, token: &str) -> bool {
            self.skip_ws();
            match self.rest.strip_prefix(token) {
                Some(rest) => {
                    self.rest = rest;
                    true
                }
                None => false,
            }
        }

        pub(super) fn value(&mut self, depth: usize) -> Option<Value> {
            if depth > MAX_DEPTH {
                return None;
            }
            self.skip_ws();
            match self.rest.chars().next()? {
                '{' => {
                    self.eat("{");
                    let mut fields = Vec::new();
                    if self.eat("}") {
                        return Some(Value::Obj(fields));
                    }
                    loop {
                        self.skip_ws();
                        let key = self.string()?;
                        if !self.eat(":") {
                            return None;
                        }
                        fields.push((key, self.value(depth + 1)?));
                        if self.eat("}") {
                            return Some(Value::Obj(fields));
                        }
                        if !self.eat(",") {
                            return None;
                        }
                    }
                }
                '[' => {
                    self.eat("[");
                    let mut items = Vec::new();
                    if self.eat("]") {
                        return Some(Value::Arr(items));
                    }
                    loop {
                        items.push(self.value(depth + 1)?);
                        if self.eat("]") {
                            return Some(Value::Arr(items));
                        }
                        if !self.eat(",") {
                            return None;
                        }
                    }
                }
                '"' => self.string().map(Value::Str),
                't' => self.eat("true").then_some(Value::Bool),
                'f' => self.eat("false").then_some(Value::Bool),
                'n' => self.eat("null").then_some(Value::Null),
                _ => {
                    let end = self
                        .rest
                        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
                        .unwrap_or(self.rest.len());
                    if end == 0 {
                        return None;
                    }
                    let (number, rest) = self.rest.split_at(end);
                    self.rest = rest;
                    Some(Value::Num(number.to_string()))
                }
            }
        }

        fn string(&mut self) -> Option<String> {
            self.rest = self.rest.strip_prefix('"')?;
            let mut out = String::new();
            let mut chars = self.rest.char_indices();
            loop {
                let (i, c) = chars.next()?;
                match c {
                    '"' => {
                        self.rest = &self.rest[i + 1..];
                        return Some(out);
                    }
                    '\\' => {
                        let (_, e) = chars.next()?;
                        match e {
                            '"' | '\\' | '/' => out.push(e),
                            'b' => out.push('\u{8}'),
                            'f' => out.push('\u{c}'),
                            'n' => out.push('\n'),
                            'r' => out.push('\r'),
                            't' => out.push('\t'),
                            'u' => {
                                let first = hex4(&mut chars)?;
                                let code = if (0xd800..0xdc00).contains(&first) {
                                    // A surrogate pair: the low half follows as \uXXXX.
                                    if chars.next()?.1 != '\\' || chars.next()?.1 != 'u' {
                                        return None;
                                    }
                                    let low = hex4(&mut chars)?;
                                    if !(0xdc00..0xe000).contains(&low) {
                                        return None;
                                    }
                                    0x10000 + ((first - 0xd800) << 10) + (low - 0xdc00)
                                } else {
                                    first
                                };
                                out.push(char::from_u32(code)?);
                            }
                            _ => return None,
                        }
                    }
                    c => out.push(c),
                }
            }
        }
    }
}

/// A JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The calendar date `(year, month, day)` of `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`): the DLQ's timestamps and the MSK IAM signer's dates.
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(error: &ProcessError) -> DeadLetter<'_> {
        DeadLetter {
            topic: "orders",
            partition: 2,
            offset: 41,
            timestamp: 1_700_000_000_000,
            timestamp_type: TimestampType::CreateTime,
            group: "billing",
            error,
            class: ErrorClass::Permanent,
            attempts: 1,
            first_failure_ms: 1_700_000_000_500,
            dead_lettered_ms: 1_700_000_000_600,
        }
    }

    fn get<'a>(h: &'a [(String, Option<Bytes>)], k: &str) -> Option<&'a [u8]> {
        h.iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.as_deref())
    }

    #[test]
    fn every_format_names_the_origin() {
        let e = ProcessError::malformed("expected value at line 1 column 1");
        let l = letter(&e);
        let a = l.headers(DlqFormat::Apache);
        assert_eq!(get(&a, "__dlq.errors.topic"), Some(&b"orders"[..]));
        assert_eq!(get(&a, "__dlq.errors.offset"), Some(&b"41"[..]));
        assert_eq!(get(&a, "__dlq.errors.delivery.count"), Some(&b"1"[..]));
        assert_eq!(get(&a, "ottla.dlq.class"), Some(&b"non-retryable"[..]));
        assert_eq!(
            get(&a, "ottla.dlq.dedup.id"),
            Some(&b"billing/orders/2/41"[..])
        );
        let s = l.headers(DlqFormat::Spring);
        assert_eq!(
            get(&s, "kafka_dlt-original-partition"),
            Some(&2i32.to_be_bytes()[..])
        );
        assert_eq!(
            get(&s, "kafka_dlt-original-offset"),
            Some(&41i64.to_be_bytes()[..])
        );
        let c = l.headers(DlqFormat::Connect);
        assert_eq!(
            get(&c, "__connect.errors.exception.class.name"),
            Some(&b"DeserializationError"[..])
        );
        let long = ProcessError::permanent("E", "é".repeat(2000));
        let h = letter(&long).headers(DlqFormat::Apache);
        let m = get(&h, "__dlq.errors.message").unwrap();
        assert!(
            m.len() <= MAX_MESSAGE && std::str::from_utf8(m).is_ok(),
            "cut at a char boundary"
        );
    }

    #[test]
    fn spring_headers_carry_the_real_timestamp_type_and_the_cause() {
        #[derive(Debug)]
        struct Lookup(std::num::ParseIntError);
        impl std::fmt::Display for Lookup {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "customer id unreadable")
            }
        }
        impl std::error::Error for Lookup {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let Err(parse) = "x1".parse::<i32>() else {
            unreachable!("x1 is not a number")
        };
        let e = ProcessError::permanent("Rejected", "order refused").caused_by(&Lookup(parse));
        let mut l = letter(&e);
        l.timestamp_type = TimestampType::LogAppendTime;
        let s = l.headers(DlqFormat::Spring);
        assert_eq!(
            get(&s, "kafka_dlt-original-timestamp-type"),
            Some(&b"LogAppendTime"[..])
        );
        let cause = get(&s, "kafka_dlt-exception-cause-fqcn").map(String::from_utf8_lossy);
        assert!(
            cause.as_deref().is_some_and(|c| c.ends_with("Lookup")),
            "{cause:?}"
        );
        let trace = get(&s, "kafka_dlt-exception-stacktrace").map(String::from_utf8_lossy);
        let trace = trace.expect("a stack trace header");
        let lines: Vec<&str> = trace.lines().collect();
        assert_eq!(lines.len(), 3, "{trace}");
        assert_eq!(lines[0], "Rejected: order refused");
        assert!(
            lines[1].starts_with("Caused by: ")
                && lines[1].ends_with("Lookup: customer id unreadable"),
            "{trace}"
        );
        assert_eq!(lines[2], "Caused by: invalid digit found in string");
        // Without a cause: no cause header, a one-line trace.
        let plain = ProcessError::permanent("Rejected", "order refused");
        let s = letter(&plain).headers(DlqFormat::Spring);
        assert_eq!(get(&s, "kafka_dlt-exception-cause-fqcn"), None);
        assert_eq!(
            get(&s, "kafka_dlt-exception-stacktrace"),
            Some(&b"Rejected: order refused"[..])
        );
    }

    #[test]
    fn the_envelope_is_json_with_the_seed_fields() {
        let e = ProcessError::permanent("ValueError", "bad \"code\"\n");
        let l = letter(&e);
        let j = l.envelope(
            Some(b"k1"),
            Some(&[0xff, 0x00, 0x10]),
            &[(Bytes::from_static(b"h"), None)],
        );
        assert!(
            j.starts_with("{\"original_message\":{\"topic\":\"orders\""),
            "{j}"
        );
        assert!(j.contains("\"value_base64\":\"/wAQ\""), "{j}");
        assert!(
            j.contains("\"error_message\":\"bad \\\"code\\\"\\n\""),
            "{j}"
        );
        assert!(
            j.contains("\"failed_at\":\"2023-11-14T22:13:20.600Z\""),
            "{j}"
        );
        assert!(j.contains("\"retry_count\":0"), "{j}");
        assert!(
            j.contains("\"error_classification\":\"non-retryable\""),
            "{j}"
        );
    }

    #[test]
    fn an_envelope_reads_back_to_the_original_record() {
        let e = ProcessError::permanent("ValueError", "bad \"code\"\n\u{1F980}");
        let l = letter(&e);
        let headers = vec![
            (
                Bytes::from_static(b"trace"),
                Some(Bytes::from_static(b"abc")),
            ),
            (
                Bytes::from_static(b"bin"),
                Some(Bytes::from_static(&[0xff, 0])),
            ),
            (Bytes::from_static(b"none"), None),
        ];
        let j = l.envelope(Some(b"k1"), Some(&[0xff, 0x00, 0x10]), &headers);
        let back = parse_envelope(j.as_bytes()).expect("an envelope");
        assert_eq!(
            back,
            Enveloped {
                topic: "orders".into(),
                partition: 2,
                offset: 41,
                timestamp: 1_700_000_000_000,
                key: Some(Bytes::from_static(b"k1")),
                value: Some(Bytes::from_static(&[0xff, 0x00, 0x10])),
                headers,
                error_type: Some("ValueError".into()),
                error_message: Some("bad \"code\"\n\u{1F980}".into()),
                classification: Some("non-retryable".into()),
            }
        );
        let null_value = l.envelope(None, None, &[]);
        let back = parse_envelope(null_value.as_bytes()).expect("an envelope");
        assert_eq!((back.key, back.value), (None, None));
    }

    #[test]
    fn what_is_not_an_envelope_is_none_not_a_panic() {
        for bad in [
            &b""[..],
            b"plain text",
            b"{\"original_message\":{\"topic\":\"t\"}}",
            b"{\"original_message\":{\"topic\":\"t\",\"partition\":1,\"offset\":2,\"key\":\"k\",\"value\":null}} trailing",
            b"\"\\ud800\"",
            &[0xff, 0xfe],
        ] {
            assert_eq!(parse_envelope(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "[".repeat(100_000);
        assert_eq!(parse_envelope(deep.as_bytes()), None);
        let surrogates = b"{\"original_message\":{\"topic\":\"\\ud83e\\udd80\",\"partition\":1,\"offset\":2,\"key\":null,\"value\":null}}";
        assert_eq!(
            parse_envelope(surrogates).map(|e| e.topic),
            Some("\u{1F980}".into())
        );
    }

    #[test]
    fn dates_and_base64_are_right() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
    }
}
