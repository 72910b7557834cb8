//! # ottla
//!
//! A pure-Rust Kafka client library with a hand-written consumer-group protocol: no
//! librdkafka and no C in the default build, compression codecs included.
//!
//! What most applications use:
//!
//! - [`Processor`](processor::Processor): a handler per record (or per batch), retries
//!   with backoff that never stall other partitions, a dead-letter topic, commits that
//!   never pass an unfinished record, and acquiescing on rebalance;
//! - [`Consumer`]: a consumer-group member (or manual assignment) with a zero-copy
//!   fetch path, pause/resume, seeks and every commit form;
//! - [`Producer`]: an idempotent producer with the Java client's partitioner;
//! - [`dlq`]: reading and replaying a dead-letter topic.
//!
//! They are layered as in `quinn`/`quinn-proto`:
//!
//! - [`proto`] is the sans-IO core: framing, version negotiation, metadata, the group
//!   member, the assignors, the fetcher, record batches, the producer's accumulator and
//!   the processing loop's pure parts, as state machines and pure functions. No
//!   sockets, tasks or clocks.
//! - [`driver`] runs that core on tokio: one task per broker connection, the cluster's
//!   metadata, the group task, reconnects and timeouts.
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
//!     println!("{}@{}: {:?}", record.partition, record.offset, record.value);
//!     consumer.commit_async();
//! }
//! # Ok(()) }
//! ```

pub mod admin;
pub mod config;
pub mod consumer;
pub mod dlq;
pub mod driver;
pub mod error;
mod event_queue;
pub mod processor;
pub mod producer;
pub mod proto;
pub mod security;

pub use admin::{AdminClient, AdminClientBuilder};
pub use config::ClientConfig;
pub use consumer::{Consumer, ConsumerBuilder, ConsumerEvent, ConsumerRecord};
pub use error::{AuthError, Error, NegotiationError, RequestError, Result, TlsFailure, WireError};
pub use producer::{Producer, ProducerBuilder, ProducerRecord, RecordMetadata};

/// The README's examples, compiled by `cargo test --doc` so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
