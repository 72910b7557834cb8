//! The produce path, sans-IO: record batches written by ottla ([`encode`]), the
//! partitioner ([`partitioner`]), the idempotent producer's state ([`accumulator`]) and
//! a transactional producer's side of the transaction protocol ([`transaction`]).

pub mod accumulator;
pub mod encode;
pub mod partitioner;
pub mod record;
pub mod transaction;
