//! The errors of the wire layer, defined in the core so that the sans-IO codec needs
//! nothing of the IO layer (`ottla::error` re-exports them).

use kafka_protocol::messages::ApiKey;

use super::VersionRangeDisplay;

/// A violation of the framing or encoding rules on one connection.
///
/// Errors that break the byte stream (a bad length, an unexpected correlation id) poison
/// the connection; decode errors of a single body do not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A frame announced a size above the configured maximum. Nothing was allocated for it.
    #[error("frame of {size} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge {
        /// The size the length prefix announced.
        size: usize,
        /// The configured maximum frame size.
        max: usize,
    },
    /// A frame announced a negative size, or one too small to hold a response header.
    #[error("invalid frame length {length}")]
    InvalidFrameLength {
        /// The length prefix as read.
        length: i32,
    },
    /// A response arrived while no request was in flight.
    #[error("unsolicited response with correlation id {correlation_id}")]
    Unsolicited {
        /// The correlation id the response carried.
        correlation_id: i32,
    },
    /// A response did not answer the oldest in-flight request. Kafka answers in order, so
    /// the stream is out of step and the connection must be dropped.
    #[error(
        "response correlation id {got} does not match the oldest in-flight request ({expected}, {api:?})"
    )]
    CorrelationMismatch {
        /// The correlation id of the oldest in-flight request.
        expected: i32,
        /// The correlation id the response carried.
        got: i32,
        /// The API of the oldest in-flight request.
        api: ApiKey,
    },
    /// A request could not be encoded at the chosen version (for example a field the
    /// version lacks was set).
    #[error("cannot encode {api:?} v{version}: {message}")]
    Encode {
        /// The API being encoded.
        api: ApiKey,
        /// The version chosen.
        version: i16,
        /// What the encoder reported.
        message: String,
    },
    /// A response header or body could not be decoded.
    #[error("cannot decode {api:?} v{version} response: {message}")]
    Decode {
        /// The API being decoded.
        api: ApiKey,
        /// The negotiated version.
        version: i16,
        /// What the decoder reported.
        message: String,
    },
    /// A response body decoded but left bytes unread: the version or schema disagree.
    #[error("{api:?} v{version} response left {remaining} trailing bytes")]
    TrailingBytes {
        /// The API being decoded.
        api: ApiKey,
        /// The negotiated version.
        version: i16,
        /// How many bytes were left over.
        remaining: usize,
    },
}

/// Why no common version of an API could be found with a broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NegotiationError {
    /// A required API is not offered by the broker at all.
    #[error("broker does not support {api:?}; ottla needs versions {ours}")]
    Missing {
        /// The API.
        api: ApiKey,
        /// The versions ottla implements.
        ours: VersionRangeDisplay,
    },
    /// A required API is offered, but the ranges do not overlap.
    #[error("no common version of {api:?}: ottla implements {ours}, broker offers {broker}")]
    Disjoint {
        /// The API.
        api: ApiKey,
        /// The versions ottla implements.
        ours: VersionRangeDisplay,
        /// The versions the broker offers.
        broker: VersionRangeDisplay,
    },
    /// The ApiVersions exchange itself failed with a broker error code.
    #[error("ApiVersions failed with error code {code}")]
    Broker {
        /// The error code.
        code: i16,
    },
}
