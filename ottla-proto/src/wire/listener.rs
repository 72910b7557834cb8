//! Which `security.protocol` a broker's listener most likely speaks, from what it did to
//! a connection that spoke another one.
//!
//! A client left on `PLAINTEXT` against a TLS listener sees its ApiVersions request
//! answered by a TLS alert (Kafka's listener, Java's JSSE: `15 03 03 00 02 02 0a`,
//! which read as a Kafka frame claims 352,518,912 bytes) or sees the connection closed
//! (stunnel and OpenSSL reset it without a word). A client without SASL against a SASL
//! listener gets its ApiVersions answered, and the connection closed on the next
//! request (Kafka's `SaslServerAuthenticator`, tansu). The bytes of a TLS record are
//! proof; a close is only a clue, since a broker that restarts closes connections too.
//! The driver reports what it saw; the rule that turns it into advice lives here.

/// What a connection saw that points at the listener's security protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The broker answered a plaintext request with the bytes of a TLS record.
    TlsRecord(TlsRecord),
    /// The broker closed every connection during ApiVersions, at every version tried.
    ClosedDuringApiVersions,
    /// The broker answered ApiVersions, then closed the connection on the first request
    /// after it, before answering anything else.
    ClosedAfterApiVersions,
}

/// The kind of TLS record a broker sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRecord {
    /// An alert (content type 21): a TLS listener refusing what it read.
    Alert,
    /// A handshake message (content type 22).
    Handshake,
}

/// What the client's settings are, as far as the diagnosis needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Configured {
    /// `security.protocol` is `SSL` or `SASL_SSL`.
    pub tls: bool,
    /// `security.protocol` is `SASL_PLAINTEXT` or `SASL_SSL`.
    pub sasl: bool,
}

/// Advice about `security.protocol`: the value the listener most likely wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// The value (or values) of `security.protocol` to try, as a user writes them.
    pub suggested: &'static str,
    /// Proven by the broker's bytes (`true`), or only likely (`false`).
    pub certain: bool,
    /// What the broker did, in words.
    pub evidence: &'static str,
}

/// The kind of TLS record `bytes` (the first bytes a broker sent on a plaintext
/// connection) begin with, if they begin like one: content type 21 or 22, then major
/// version 3 (SSL 3.0 to TLS 1.3 all write 3), then a minor version of at most 4.
/// A Kafka response begins with its length, whose first byte is 0 for any frame below
/// 16 MiB, and an ApiVersions answer is far below that.
pub fn tls_record(bytes: &[u8]) -> Option<TlsRecord> {
    let [kind, 3, minor, ..] = *bytes else {
        return None;
    };
    if minor > 4 {
        return None;
    }
    match kind {
        21 => Some(TlsRecord::Alert),
        22 => Some(TlsRecord::Handshake),
        _ => None,
    }
}

/// The advice for what a connection saw, given the client's settings; `None` when the
/// evidence says nothing about them (a client already on TLS that sees its connections
/// closed during ApiVersions has another problem).
pub fn diagnose(evidence: Evidence, configured: Configured) -> Option<Diagnosis> {
    let tls = |certain, evidence| {
        (!configured.tls).then_some(Diagnosis {
            suggested: if configured.sasl {
                "SASL_SSL"
            } else {
                "SSL, or SASL_SSL if the listener also authenticates"
            },
            certain,
            evidence,
        })
    };
    match evidence {
        Evidence::TlsRecord(TlsRecord::Alert) => tls(
            true,
            "answered the plaintext ApiVersions request with a TLS alert",
        ),
        Evidence::TlsRecord(TlsRecord::Handshake) => tls(
            true,
            "answered the plaintext ApiVersions request with a TLS handshake record",
        ),
        Evidence::ClosedDuringApiVersions => tls(
            false,
            "kept closing the connection during ApiVersions (a TLS listener does this to plaintext; so does a broker older than 0.10)",
        ),
        Evidence::ClosedAfterApiVersions => (!configured.sasl).then_some(Diagnosis {
            suggested: if configured.tls {
                "SASL_SSL"
            } else {
                "SASL_PLAINTEXT, or SASL_SSL over TLS, with sasl.mechanism and its credentials"
            },
            certain: false,
            evidence: "answered ApiVersions, then closed the connection on the next request, as a SASL listener does to a client that does not authenticate",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAINTEXT: Configured = Configured {
        tls: false,
        sasl: false,
    };
    const SSL: Configured = Configured {
        tls: true,
        sasl: false,
    };
    const SASL_PLAINTEXT: Configured = Configured {
        tls: false,
        sasl: true,
    };
    const SASL_SSL: Configured = Configured {
        tls: true,
        sasl: true,
    };

    #[test]
    fn tls_records_are_recognised_and_kafka_frames_are_not() {
        // What Java's JSSE (Kafka's TLS listener) sends to a plaintext ApiVersions.
        let jsse = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a];
        assert_eq!(tls_record(&jsse), Some(TlsRecord::Alert));
        assert_eq!(tls_record(&[0x16, 0x03, 0x01]), Some(TlsRecord::Handshake));
        // Too short to tell: no claim.
        assert_eq!(tls_record(&[0x15, 0x03]), None);
        // An ApiVersions answer of 224 bytes (tansu), and a frame of 16 MiB and more.
        assert_eq!(tls_record(&[0x00, 0x00, 0x00, 0xdc, 0, 0, 0, 1]), None);
        assert_eq!(tls_record(&[0x01, 0x03, 0x00, 0x00]), None);
        // A content type or a version TLS does not have.
        assert_eq!(tls_record(&[0x17, 0x03, 0x03, 0x00]), None);
        assert_eq!(tls_record(&[0x15, 0x03, 0x05, 0x00]), None);
        assert_eq!(tls_record(&[0x15, 0x02, 0x00, 0x00]), None);
    }

    #[test]
    fn a_tls_record_is_proof_and_a_close_is_a_clue() {
        let alert = diagnose(Evidence::TlsRecord(TlsRecord::Alert), PLAINTEXT).unwrap();
        assert!(alert.certain);
        assert!(alert.suggested.starts_with("SSL"));
        let closed = diagnose(Evidence::ClosedDuringApiVersions, PLAINTEXT).unwrap();
        assert!(!closed.certain);
        assert!(closed.suggested.starts_with("SSL"));
        // A SASL client keeps its SASL: the TLS form of it.
        let sasl = diagnose(Evidence::ClosedDuringApiVersions, SASL_PLAINTEXT).unwrap();
        assert_eq!(sasl.suggested, "SASL_SSL");
        // A client already on TLS is not told to use TLS.
        assert_eq!(diagnose(Evidence::ClosedDuringApiVersions, SSL), None);
        assert_eq!(
            diagnose(Evidence::TlsRecord(TlsRecord::Alert), SASL_SSL),
            None
        );
    }

    #[test]
    fn a_close_after_api_versions_points_at_sasl_unless_the_client_authenticates() {
        let plain = diagnose(Evidence::ClosedAfterApiVersions, PLAINTEXT).unwrap();
        assert!(!plain.certain);
        assert!(plain.suggested.starts_with("SASL_PLAINTEXT"));
        let ssl = diagnose(Evidence::ClosedAfterApiVersions, SSL).unwrap();
        assert_eq!(ssl.suggested, "SASL_SSL");
        assert_eq!(
            diagnose(Evidence::ClosedAfterApiVersions, SASL_PLAINTEXT),
            None
        );
        assert_eq!(diagnose(Evidence::ClosedAfterApiVersions, SASL_SSL), None);
    }
}
