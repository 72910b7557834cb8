//! The fetch response path: arbitrary bytes decoded as a Fetch response at a version
//! ottla negotiates, handed to a fetcher that asked for two partitions, and drained.
//! Nothing may panic, and the fetcher's positions never move backwards.
//!
//! Input: `[selector] body`: version `4 + selector % 13`; bit 7 skips CRC checks, bit 6
//! reads committed.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ottla_fuzz::response::{READ_COMMITTED, SKIP_CRCS, fetch};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let version = 4 + i16::from(selector) % 13;
    let mut flags = 0;
    if selector & 0x80 != 0 {
        flags |= SKIP_CRCS;
    }
    if selector & 0x40 != 0 {
        flags |= READ_COMMITTED;
    }
    fetch(version, flags, Bytes::copy_from_slice(body));
});
