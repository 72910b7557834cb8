//! The processor's lanes as a state machine: deliveries, handler outcomes, writes,
//! commits, revocations, losses and time, checked against a model after every step.
//! See `ottla_proto::process::lanes::script` for the input format and the promises.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(broken) = ottla_proto::process::lanes::script::run(data) {
        panic!("{broken}");
    }
});
