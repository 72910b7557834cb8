//! ConsumerProtocol subscription and assignment decoding, any version: nothing panics,
//! and what decodes encodes again at the version read and decodes to the same thing
//! (partitions compare as sets: the writer groups them by topic, as the Java client).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ottla_proto::group::consumer_protocol::{
    MAX_VERSION, decode_assignment, decode_subscription, encode_assignment, encode_subscription,
    version_of,
};

fuzz_target!(|data: &[u8]| {
    let version = version_of(data).unwrap_or(0).clamp(0, MAX_VERSION);
    if let Ok(mut s) = decode_subscription(Bytes::copy_from_slice(data)) {
        let again = encode_subscription(&s, version).expect("a decoded subscription encodes");
        let mut t = decode_subscription(again).expect("an encoded subscription decodes");
        s.owned_partitions.sort();
        t.owned_partitions.sort();
        assert_eq!(s, t);
    }
    if let Ok(mut a) = decode_assignment(Bytes::copy_from_slice(data)) {
        let again = encode_assignment(&a, version).expect("a decoded assignment encodes");
        let mut b = decode_assignment(again).expect("an encoded assignment decodes");
        a.partitions.sort();
        b.partitions.sort();
        assert_eq!(a, b);
    }
});
