//! # ottla
//!
//! A pure-Rust Kafka client library with a hand-written consumer-group protocol: no
//! librdkafka and no C in the default build, compression codecs included.
//!
//! What most applications use:
//!
//! - [`Processor`]: a handler per record (or per batch), retries
//!   with backoff that never stall other partitions, a dead-letter topic, commits that
//!   never pass an unfinished record, and acquiescing on rebalance;
//! - [`Consumer`]: a consumer-group member (or manual assignment) with a zero-copy
//!   fetch path, pause/resume, seeks and every commit form;
//! - [`Producer`]: an idempotent producer with the Java client's partitioner or
//!   librdkafka's (by name, key for key);
//! - [`dlq`]: reading and replaying a dead-letter topic.
//!
//! ## Stability
//!
//! The documented items are the stable surface: the modules [`config`], [`consumer`],
//! [`producer`], [`processor`], [`admin`], [`properties`], [`dlq`], [`error`],
//! [`security`] and [`stats`], and the re-exports at the crate root. Inside, ottla is
//! layered as in `quinn`/`quinn-proto`: the crate [`ottla_proto`] is the sans-IO core
//! (framing, version negotiation, the group member, the fetcher, the producer's
//! accumulator and the processing loop's rules, as state machines with no sockets, tasks
//! or clocks) and the `driver` module runs it on tokio. ottla re-exports every core type
//! that a stable signature names where that signature lives; ottla's own suites, fuzz
//! targets and benchmarks name the core as `ottla_proto` directly. `driver` is public
//! only so that those suites can drive it; it is hidden from these docs and outside
//! semver: any release may change it (CI checks that no stable signature names an item
//! reachable only through it, with `scripts/public-surface.py`).
//!
//! ## Features
//!
//! No feature is on by default, and the default build compiles no C (compression
//! codecs included; CI checks `cargo tree`).
//!
//! - `tls`: TLS with rustls and its `ring` provider (`security.protocol=SSL` or
//!   `SASL_SSL`). `ring` compiles its own C and assembly; no system library is linked.
//! - `tls-core`: TLS without a built-in crypto provider: install a
//!   `rustls::crypto::CryptoProvider` yourself (aws-lc-rs for FIPS, or a pure-Rust one)
//!   or pass one to [`security::TlsConfig`].
//! - `tls-webpki-roots`: Mozilla's root certificates compiled in
//!   ([`security::TrustRoots::WebpkiRoots`]), for hosts without a system trust store.
//! - `metrics`: named counters, gauges and histograms through the
//!   [`metrics`](https://docs.rs/metrics) facade, for any recorder (Prometheus,
//!   OpenTelemetry, ...). The names are in [`telemetry::names`]; docs/observability.md
//!   gives each one's meaning, unit and labels. Pure Rust.
//! - `opentelemetry`: the spans of [`trace`] become OpenTelemetry spans (through a
//!   `tracing-opentelemetry` layer the application installs): a record's handler span
//!   continues the record's remote parent, and the `traceparent` ottla writes names
//!   OpenTelemetry's span ids. Pure Rust; the SDK is the application's.
//! - `serde`: `Serialize` and `Deserialize` for the counters' snapshots in [`stats`]
//!   ([`Consumer::stats`], [`Producer::stats`]). Pure Rust.
//! - `testing`: turns on `ottla-proto`'s `testing` feature (the group members' test
//!   harness, `ottla_proto::group::testing`, for suites that drive a member on a
//!   virtual clock). ottla itself exposes nothing more with it. For ottla's own tests;
//!   not part of the stable surface.
//!
//! ## Minimum supported Rust version
//!
//! Rust 1.85 (`rust-version` in Cargo.toml, built in CI with that release). On 1.85 and
//! 1.86, keep the `ruzstd` codec at 0.8.1 (`cargo update -p ruzstd --precise 0.8.1`):
//! ruzstd 0.8.2 needs Rust 1.87 without saying so in its manifest.
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::consumer::{Consumer, OffsetReset};
//!
//! let mut consumer = Consumer::builder("127.0.0.1:9092")
//!     .group_id("billing")
//!     .topics(["orders"])
//!     .offset_reset(OffsetReset::Earliest)
//!     .build()
//!     .await?;
//! while let Some(record) = consumer.recv().await {
//!     let record = record?;
//!     println!("{}@{}: {:?}", record.partition(), record.offset(), record.value());
//!     consumer.commit_async();
//! }
//! # Ok(()) }
//! ```

pub mod admin;
pub mod config;
pub mod consumer;
pub mod dlq;
#[doc(hidden)]
pub mod driver;
pub mod error;
pub mod processor;
pub mod producer;
pub mod properties;
// The sans-IO core, its own crate (`ottla_proto`): used here as `crate::proto`. Private:
// what the stable API names is re-exported where that API lives, and suites, fuzz targets
// and benchmarks that drive the core depend on `ottla-proto` themselves.
use ottla_proto as proto;
pub mod security;
pub mod stats;
mod sync;
pub mod telemetry;
pub mod trace;

pub use admin::{AdminClient, AdminClientBuilder};
pub use config::ClientConfig;
pub use consumer::{Consumer, ConsumerBuilder, ConsumerEvent, ConsumerRecord};
pub use error::{AuthError, Error, NegotiationError, RequestError, Result, TlsFailure, WireError};
pub use processor::{Processor, ProcessorBuilder};
pub use producer::{Producer, ProducerBuilder, ProducerRecord, RecordMetadata};

/// The README's examples, compiled by `cargo test --doc` so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/migrating.md's examples, compiled by `cargo test --doc` so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../docs/migrating.md")]
pub struct MigratingDoctests;

/// docs/observability.md's examples, compiled by `cargo test --doc` so that they stay
/// true.
#[cfg(doctest)]
#[doc = include_str!("../docs/observability.md")]
pub struct ObservabilityDoctests;
