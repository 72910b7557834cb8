//! Every group response ottla reads, at every version it negotiates, through the group
//! codec (also reached by the `response` target; this one spends all its time there).
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ottla_proto::group::codec::{GROUP_APIS, decode_response};
use ottla_proto::wire::SUPPORTED;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let api = GROUP_APIS[usize::from(selector) % GROUP_APIS.len()];
    let Some(&(_, min, max)) = SUPPORTED.iter().find(|(a, _, _)| *a == api) else {
        return;
    };
    let version = min + i16::from(selector >> 3) % (max - min + 1);
    let _ = decode_response(api, version, Bytes::copy_from_slice(body));
});
