//! The processing loop's pure parts: error classes ([`classify`]), the retry policy
//! ([`retry`]), the commit rule ([`tracker`]), dead-letter records ([`dlq`]), the
//! shared runs of records a lane queues and lends its calls ([`run`]), the records
//! finished past a commit, written into its metadata ([`finished`]), and the lanes that
//! put them together ([`lanes`]).

pub mod classify;
pub mod dlq;
pub mod finished;
pub mod lanes;
pub mod retry;
pub mod run;
pub mod tracker;
