//! The processing loop's pure parts: error classes ([`classify`]), the retry policy
//! ([`retry`]), the commit rule ([`tracker`]), dead-letter records ([`dlq`]), the
//! shared runs of records a lane queues and lends its calls ([`run`]), and the lanes
//! that put them together ([`lanes`]).

pub mod classify;
pub mod dlq;
pub mod lanes;
pub mod retry;
pub mod run;
pub mod tracker;
