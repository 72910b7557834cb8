//! # ottla
//!
//! A pure-Rust Kafka client library with a hand-written consumer-group protocol.
//!
//! The crate is layered as in `quinn`/`quinn-proto`:
//!
//! - [`proto`] is the sans-IO core: framing, version negotiation, metadata, and (later)
//!   the group member and the fetcher as state machines. No sockets, tasks or clocks.
//! - [`driver`] runs that core on tokio: one task per broker connection, the cluster's
//!   metadata, reconnects and timeouts.
//!
//! ```no_run
//! # async fn demo() -> ottla::Result<()> {
//! use ottla::{ClientConfig, driver::{Cluster, TopicScope}};
//!
//! let config = ClientConfig::new("127.0.0.1:9092");
//! let cluster = Cluster::connect(&config, TopicScope::All, &[]).await?;
//! for topic in cluster.metadata().topics.values() {
//!     println!("{} has {} partitions", topic.name, topic.partitions.len());
//! }
//! # Ok(()) }
//! ```

pub mod config;
pub mod consumer;
pub mod dlq;
pub mod driver;
pub mod error;
pub mod processor;
pub mod producer;
pub mod proto;

pub use config::ClientConfig;
pub use consumer::{Consumer, ConsumerBuilder, ConsumerEvent, ConsumerRecord};
pub use error::{Error, NegotiationError, RequestError, Result, WireError};
pub use producer::{Producer, ProducerBuilder, ProducerRecord, RecordMetadata};
