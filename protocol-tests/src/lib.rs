//! Test peers for ottla's suites: the librdkafka mock cluster ([`mock`]), the tansu
//! broker ([`tansu`]), and [`peer::Peer`], which lets one suite run on either, or on an
//! external cluster named by `OTTLA_BOOTSTRAP`. `PEERS.md` lists their quirks.

pub mod alloc;
pub mod data;
pub mod group_app;
pub mod hostile;
#[cfg(feature = "metrics")]
pub mod kept;
pub mod log_capture;
pub mod mock;
pub mod oauth_server;
pub mod peer;
pub mod proxy;
pub mod pyclient;
pub mod sasl_responder;
pub mod tansu;
pub mod tls;
pub mod traced;

pub use mock::{MockCluster, TrackedRequest};
/// A test's length or size knob from the environment (e.g. `OTTLA_REAUTH_SECS`).
pub use ottla_core_tests::env_number;
/// The one seeded generator (splitmix64), from the broker-free harness.
pub use ottla_core_tests::rng;
pub use peer::Peer;
pub use tansu::{Tansu, find_tansu};

/// Installs a `tracing` subscriber for tests: `RUST_LOG` filter (default `warn`),
/// output through the test harness's capture. Safe to call many times.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A retry policy of `max_retries` retries 20 ms apart, without jitter: for the suites
/// that wait for a record's retries and dead letter.
pub fn quick_retries(max_retries: u32) -> ottla::processor::RetryPolicy {
    use ottla::processor::{RetryBackoff, RetryPolicy};
    RetryPolicy {
        default: RetryBackoff {
            max_retries,
            initial: std::time::Duration::from_millis(20),
            max: std::time::Duration::from_millis(20),
            multiplier: 1.0,
            jitter: false,
            min_delay: std::time::Duration::ZERO,
        },
        ..RetryPolicy::default()
    }
}
