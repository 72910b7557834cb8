//! The record-batch iterator, compressed input included: arbitrary bytes never panic.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ottla::proto::fetch::batch::{BatchOptions, Batches, CommittedFilter};

fuzz_target!(|data: &[u8]| {
    // Skip the CRC half the time so the fuzzer reaches the decoders behind it.
    let check_crcs = data.first().is_some_and(|b| b & 1 == 1);
    let options = BatchOptions {
        check_crcs,
        max_decompressed: 1 << 20,
    };
    let mut filter = CommittedFilter::new(vec![(1, 0)]);
    for batch in Batches::new(Bytes::copy_from_slice(data), options).flatten() {
        let _ = filter.admit(&batch);
        for record in batch.records() {
            let _ = record;
        }
    }
});
