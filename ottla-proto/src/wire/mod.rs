//! Wire hygiene, sans-IO: framing, request headers, correlation ids, the in-flight queue
//! and ApiVersions negotiation.
//!
//! The [`Codec`] owns one connection's protocol state. The driver feeds it the bytes it
//! reads and writes the bytes it produces; nothing here performs I/O.

mod codec;
mod error;
mod frame;
pub mod lifecycle;
pub mod listener;
mod versions;

pub use codec::{Codec, CorrelationId, InFlight, ResponseFrame, decode_response, encode_body};
pub use error::{NegotiationError, WireError};
pub use frame::{DEFAULT_MAX_FRAME_SIZE, FrameDecoder};
pub use versions::{
    ApiVersionsOutcome, SUPPORTED, VersionRangeDisplay, VersionTable, api_versions_request,
    handle_api_versions_response, negotiate,
};
