//! Every response ottla reads, at every version it negotiates, through ottla's own
//! decode entry point and into the state that reads it (negotiation, metadata, the
//! fetcher, offset resets, the producer, the group codec).
//!
//! Input: `[api] [version] [flags] body`; see `ottla_fuzz::response`.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ottla_fuzz::input::Input;
use ottla_fuzz::response::{apply, select};

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let (api, version) = select(input.u8(), input.u8());
    let flags = input.u8();
    apply(api, version, flags, Bytes::copy_from_slice(input.rest()));
});
