//! The fetch path, sans-IO: record batches read in place ([`batch`]) and Fetch requests
//! and responses for a negotiated version ([`request`]).

pub mod batch;
pub mod fetcher;
pub mod record;
pub mod request;
