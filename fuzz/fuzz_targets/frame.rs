//! Response framing and matching: arbitrary bytes from a peer never panic (and never
//! allocate without bound); they yield frames or a typed error.
#![no_main]

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, MetadataResponse};
use libfuzzer_sys::fuzz_target;
use ottla::proto::wire::{Codec, decode_response};

fuzz_target!(|data: &[u8]| {
    let mut codec = Codec::new(Some("fuzz"), 1 << 20);
    let mut out = BytesMut::new();
    // A few requests in flight, so matching is exercised too.
    for _ in 0..3 {
        let _ = codec.encode_raw(ApiKey::Metadata, 9, &[], true, &mut out);
    }
    let mut input = BytesMut::from(data);
    while let Ok(Some(frame)) = codec.decode_frame(&mut input) {
        let _ = decode_response::<MetadataResponse>(
            frame.request.api,
            frame.request.version,
            frame.body,
        );
    }
});
