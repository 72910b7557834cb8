//! The group member as a state machine: arbitrary responses, error codes, generations,
//! failures and timeouts, with its promises checked after every step. See
//! `ottla_fuzz::group_ops` for the input format and the promises.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ottla_fuzz::group_ops::run(data));
