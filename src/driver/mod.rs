//! The tokio driver: it owns every socket, timer and task, and is the only part of
//! ottla that reads the clock.

mod cluster;
mod connection;
mod group;

pub use cluster::{Cluster, TopicScope};
pub use connection::BrokerConnection;
pub use group::{GroupCommander, GroupHandle};
