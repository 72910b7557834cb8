//! The produce path, sans-IO: record batches written by ottla ([`encode`]), the
//! partitioner ([`partitioner`]) and the idempotent producer's state ([`accumulator`]).

pub mod accumulator;
pub mod encode;
pub mod partitioner;
pub mod record;
