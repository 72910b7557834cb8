//! The tokio driver: it owns the sockets, timers and tasks of the connections, the
//! group members, the consumer and the producer, and reads the clock for the sans-IO
//! machines under them. (The Processor, `src/processor.rs`, still reads the clock
//! itself.)

mod auth;
mod cluster;
mod connection;
mod group;
#[cfg(feature = "oauthbearer-oidc")]
pub(crate) mod oidc;
mod stream;
#[cfg(feature = "tls-core")]
mod tls;

pub(crate) use cluster::metadata_request;
pub use cluster::{Cluster, TopicScope};
pub use connection::{BrokerConnection, BrokerHangUp, HANGUPS_BEFORE_DIAGNOSIS};
pub use group::{GroupCommander, GroupHandle};

/// What a machine of the core is told of a request that got no answer: the one
/// mapping of the IO layer's errors to [`Failure`](crate::proto::Failure).
pub(crate) fn failure(e: crate::error::RequestError) -> crate::proto::Failure {
    use crate::error::RequestError;
    use crate::proto::Failure;
    match e {
        RequestError::Timeout { .. } => Failure::Timeout,
        // A TLS or SASL failure is surfaced by the Consumer and the Producer (from the
        // cluster's alarm); the machines treat it as a lost connection and retry after
        // their backoff, which the connection stretches to the longest reconnect
        // backoff.
        RequestError::Connect { .. }
        | RequestError::Disconnected { .. }
        | RequestError::Closed { .. }
        | RequestError::Tls { .. }
        | RequestError::Authentication { .. }
        | RequestError::WrongSecurityProtocol { .. } => Failure::Disconnected,
        other => Failure::Protocol(other.to_string()),
    }
}

/// Sleeps until `at`, or forever when there is no deadline (for `select!` arms).
pub(crate) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(crate) use crate::sync::lock;
