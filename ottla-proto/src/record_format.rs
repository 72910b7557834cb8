//! The v2 record format's pieces that reading (`fetch::batch`, `fetch::record`) and
//! writing (`produce::encode`) share: the compression codecs, zigzag varints and
//! length-prefixed bytes.

use bytes::{BufMut, BytesMut};

/// Compression codecs of record batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Compression {
    /// None.
    None,
    /// gzip (flate2 on a pure-Rust backend).
    Gzip,
    /// snappy (raw or xerial-framed, as the Java client writes).
    Snappy,
    /// lz4 frame format.
    Lz4,
    /// zstd (pure-Rust decoder).
    Zstd,
}

impl Compression {
    /// The codec's bits in a batch's attributes.
    pub fn attribute_bits(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// `compression.type` by name: none, gzip, snappy, lz4, zstd.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "none" => Compression::None,
            "gzip" => Compression::Gzip,
            "snappy" => Compression::Snappy,
            "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd,
            _ => return None,
        })
    }
}

/// A zigzag varint (i32): a varlong that must fit an i32. One and two bytes, the usual
/// lengths in a record, are read without a loop (and always fit).
#[inline(always)]
pub(crate) fn varint(b: &mut &[u8]) -> Option<i32> {
    match **b {
        [b0, ref rest @ ..] if b0 < 0x80 => {
            *b = rest;
            Some(zigzag32(u32::from(b0)))
        }
        // b0 has its continuation bit (the arm above took it otherwise).
        [b0, b1, ref rest @ ..] if b1 < 0x80 => {
            *b = rest;
            Some(zigzag32(u32::from(b0 & 0x7f) | u32::from(b1) << 7))
        }
        _ => i32::try_from(varlong_long(b)?).ok(),
    }
}

#[inline(always)]
fn zigzag32(raw: u32) -> i32 {
    ((raw >> 1) as i32) ^ -((raw & 1) as i32)
}

#[inline(always)]
fn zigzag(raw: u64) -> i64 {
    ((raw >> 1) as i64) ^ -((raw & 1) as i64)
}

/// A zigzag varlong (i64), at most 10 bytes; one or two are read without a loop.
#[inline(always)]
pub(crate) fn varlong(b: &mut &[u8]) -> Option<i64> {
    match **b {
        [b0, ref rest @ ..] if b0 < 0x80 => {
            *b = rest;
            Some(zigzag(u64::from(b0)))
        }
        [b0, b1, ref rest @ ..] if b1 < 0x80 => {
            *b = rest;
            Some(zigzag(u64::from(b0 & 0x7f) | u64::from(b1) << 7))
        }
        _ => varlong_long(b),
    }
}

/// [`varlong`] of any length (and the end of the bytes, or an eleventh byte: `None`).
#[inline(never)]
fn varlong_long(b: &mut &[u8]) -> Option<i64> {
    let mut raw: u64 = 0;
    for (i, &byte) in b.iter().take(10).enumerate() {
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *b = b.get(i + 1..)?;
            return Some(zigzag(raw));
        }
    }
    None
}

/// Writes `v` as a zigzag varlong.
pub(crate) fn put_varint(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// Writes length-prefixed bytes (`-1` for null).
pub(crate) fn put_bytes(out: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.put_slice(b);
        }
        None => put_varint(out, -1),
    }
}
