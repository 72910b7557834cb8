//! Dead-letter records: the original key, value and headers, byte for byte, plus
//! diagnostic headers in a selectable format.

use bytes::Bytes;

use super::classify::{ErrorClass, ProcessError};

/// The diagnostic header format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
                vec![
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
                        b(b"CreateTime".to_vec()),
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
                ]
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

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
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
    fn dates_and_base64_are_right() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
    }
}
