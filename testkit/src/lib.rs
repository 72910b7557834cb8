#![doc = include_str!("../README.md")]
#![cfg(unix)]

#[cfg(feature = "chaos")]
pub mod chaos;
pub mod codes;
pub mod mock;
pub mod process;
pub mod tansu;

pub use codes::{ErrorCode, api_key};
pub use mock::{MockCluster, MockClusterBuilder, TrackedRequest};
pub use tansu::{Tansu, TansuOptions, find_tansu};
