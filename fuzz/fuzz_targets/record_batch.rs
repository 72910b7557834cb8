//! The record-batch iterator, compressed input included: a records field as it is, or a
//! batch built around fuzzed content under a codec the input chooses (gzip, snappy raw
//! and xerial, lz4, zstd, unknown). Nothing panics, nothing inflates past the bound, and
//! what ottla's encoder wrote reads back. See `ottla_fuzz::batch`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ottla_fuzz::batch::run(data));
