//! The processing loop's pure parts: error classes ([`classify`]), the retry policy
//! ([`retry`]), the commit rule ([`tracker`]) and dead-letter records ([`dlq`]).

pub mod classify;
pub mod dlq;
pub mod retry;
pub mod tracker;
