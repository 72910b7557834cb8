//! The fetch path, sans-IO. So far: record batches read in place ([`batch`]).

pub mod batch;
