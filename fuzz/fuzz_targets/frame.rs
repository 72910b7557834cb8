//! Response framing and matching, then decoding: a stream of bytes from a peer, read
//! against up to four requests in flight of any API and version ottla sends, never
//! panics (nor allocates without bound); each frame it yields is decoded as the response
//! to the request it matched and handed to the state that reads it.
//!
//! Input: `[n] ([api] [version]){1 + n % 4} stream`, each pair as in the `response`
//! target.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use ottla_fuzz::input::Input;
use ottla_fuzz::response::{apply, select};
use ottla_proto::wire::Codec;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mut codec = Codec::new(Some("fuzz"), 1 << 20);
    let mut out = BytesMut::new();
    for _ in 0..1 + input.below(4) {
        let (api, version) = select(input.u8(), input.u8());
        codec
            .encode_raw(api, version, &[], true, &mut out)
            .expect("a header for a supported version");
    }
    let mut stream = BytesMut::from(input.rest());
    while let Ok(Some(frame)) = codec.decode_frame(&mut stream) {
        apply(frame.request.api, frame.request.version, 0, frame.body);
    }
});
