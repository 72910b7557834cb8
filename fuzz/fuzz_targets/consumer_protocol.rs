//! ConsumerProtocol subscription and assignment decoding.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ottla::proto::group::consumer_protocol::{decode_assignment, decode_subscription};

fuzz_target!(|data: &[u8]| {
    let _ = decode_subscription(Bytes::copy_from_slice(data));
    let _ = decode_assignment(Bytes::copy_from_slice(data));
});
