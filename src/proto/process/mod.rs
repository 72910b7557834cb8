//! The processing loop's pure parts: error classes ([`classify`]), the retry policy
//! ([`retry`]), the commit rule ([`tracker`]), dead-letter records ([`dlq`]), and the
//! lanes that put them together ([`lanes`]).

pub mod classify;
pub mod dlq;
pub mod lanes;
pub mod retry;
pub mod tracker;
