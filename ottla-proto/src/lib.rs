//! ottla's sans-IO core: the Kafka wire codec, the consumer-group members, the
//! assignors, the fetcher, the producer's accumulator, the Processor's lanes, SASL, the
//! admin client's pure parts and the session rules, as state machines with no sockets,
//! no tasks and no clock reads.
//!
//! Everything here takes its inputs as arguments (bytes, responses, `now`) and returns
//! outputs (bytes, requests, events), so it can be driven step by step by tests and by
//! the `ottla` crate's tokio driver alike. This crate's `Cargo.toml` has no tokio: the
//! compiler keeps it sans-IO (the test command checks its dependency tree too).
//!
//! Most users want the `ottla` crate, which re-exports what an application needs.

#![warn(missing_docs)]
#![forbid(unsafe_code)]
// No clock reads, sockets or threads (the methods and types listed in clippy.toml); tests
// make their own virtual clocks from a real `Instant`.
#![cfg_attr(not(test), deny(clippy::disallowed_methods, clippy::disallowed_types))]
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod admin;
pub mod backoff;
pub mod fetch;
pub mod group;
pub mod metadata;
pub mod process;
pub mod produce;
pub mod record_format;
pub mod sasl;
pub mod session;
pub mod trace;
pub mod wire;

use kafka_protocol::ResponseError;

/// How a request failed below the protocol, with no response to interpret: the one
/// input every machine takes for it (`handle_failure(now, <request>, failure)` on the
/// group members, the fetcher and the accumulator).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// The connection dropped or could not be made (TLS and SASL failures included:
    /// the driver reports those to the application itself).
    Disconnected,
    /// No response within the request timeout.
    Timeout,
    /// The response could not be decoded, or the version is unusable.
    Protocol(String),
    /// The broker does not offer the API at any version ottla speaks (a broker without
    /// KIP-848 asked for ConsumerGroupHeartbeat).
    Unsupported(String),
}

/// The protocol name of a Kafka error code (`"NOT_COORDINATOR"` style is the Java
/// client's; ottla uses the `kafka-protocol` variant names, e.g. `NotCoordinator`).
pub fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        None => "None".to_string(),
        Some(ResponseError::Unknown(c)) => format!("Unknown({c})"),
        Some(e) => format!("{e:?}"),
    }
}

/// Whether a partition-level error code means the client's view of leadership is stale
/// and cluster metadata must be refreshed before retrying.
pub fn needs_metadata_refresh(code: i16) -> bool {
    matches!(
        ResponseError::try_from_code(code),
        Some(
            ResponseError::NotLeaderOrFollower
                | ResponseError::LeaderNotAvailable
                | ResponseError::UnknownTopicOrPartition
                | ResponseError::FencedLeaderEpoch
                | ResponseError::UnknownLeaderEpoch
                | ResponseError::KafkaStorageError
                | ResponseError::UnknownTopicId
                | ResponseError::InconsistentTopicId
        )
    )
}
