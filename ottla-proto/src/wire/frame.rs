//! Length-prefixed framing: check, then parse.

use bytes::{Buf, Bytes, BytesMut};

use crate::wire::WireError;

/// The default maximum size of one response frame: 100 MiB, the Java broker's
/// `socket.request.max.bytes`. Fetch responses are bounded by `fetch.max.bytes`
/// (50 MiB by default), so a frame above this is a broken or hostile peer.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 100 * 1024 * 1024;

/// The smallest valid response: a 4-byte correlation id.
const MIN_FRAME_SIZE: usize = 4;

/// Frames larger than this get an allocation of their exact size.
const EXACT_ALLOCATION_ABOVE: usize = 64 * 1024;

/// Splits a byte stream into frames of `[i32 length][length bytes]`.
///
/// The length is checked against the maximum before any buffer is reserved for the
/// body, so a peer that announces a huge frame costs nothing but an error.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame_size: usize,
}

impl FrameDecoder {
    /// A decoder that refuses frames over `max_frame_size` bytes.
    pub fn new(max_frame_size: usize) -> Self {
        Self { max_frame_size }
    }

    /// The configured maximum frame size.
    pub fn max_frame_size(&self) -> usize {
        self.max_frame_size
    }

    /// Takes one complete frame (without its length prefix) off the front of `buf`.
    ///
    /// Returns `Ok(None)` when `buf` does not yet hold a whole frame; in that case it
    /// reserves room for the rest of the frame so the next read can complete it. An
    /// error leaves the stream unusable: the connection must be dropped.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, WireError> {
        let Some(prefix) = buf.get(..4) else {
            return Ok(None);
        };
        let length = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        let size = usize::try_from(length).map_err(|_| WireError::InvalidFrameLength { length })?;
        if size < MIN_FRAME_SIZE {
            return Err(WireError::InvalidFrameLength { length });
        }
        if size > self.max_frame_size {
            return Err(WireError::FrameTooLarge {
                size,
                max: self.max_frame_size,
            });
        }
        let total = 4 + size;
        if buf.len() < total {
            if buf.capacity() < total && total > EXACT_ALLOCATION_ABOVE {
                // A large frame (a Fetch response) gets a buffer of exactly its size:
                // its records are handed out as slices, so the allocation lives as
                // long as they do, and growing by doubling would keep up to twice the
                // frame (plus the start of the next one) alive.
                let mut exact = BytesMut::with_capacity(total);
                exact.extend_from_slice(buf);
                *buf = exact;
            } else {
                buf.reserve(total - buf.len());
            }
            return Ok(None);
        }
        buf.advance(4);
        Ok(Some(buf.split_to(size).freeze()))
    }
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FRAME_SIZE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(body: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        b.extend_from_slice(&(body.len() as i32).to_be_bytes());
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn whole_frame_is_split_off() {
        let mut buf = framed(&[0, 0, 0, 7, 1, 2]);
        buf.extend_from_slice(&[9, 9]);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(&frame[..], &[0, 0, 0, 7, 1, 2]);
        assert_eq!(&buf[..], &[9, 9]);
    }

    #[test]
    fn truncated_frame_waits_for_more() {
        let full = framed(&[0, 0, 0, 7, 1, 2, 3]);
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert_eq!(FrameDecoder::default().decode(&mut buf).unwrap(), None);
            assert_eq!(buf.len(), cut, "nothing consumed from a partial frame");
        }
    }

    #[test]
    fn oversized_frame_is_refused_before_allocation() {
        let mut buf = BytesMut::from(&i32::MAX.to_be_bytes()[..]);
        let cap_before = buf.capacity();
        let err = FrameDecoder::new(1024).decode(&mut buf).unwrap_err();
        assert_eq!(
            err,
            WireError::FrameTooLarge {
                size: i32::MAX as usize,
                max: 1024
            }
        );
        assert_eq!(buf.capacity(), cap_before);
    }

    #[test]
    fn negative_and_tiny_lengths_are_refused() {
        for length in [-1i32, i32::MIN, 0, 3] {
            let mut buf = BytesMut::from(&length.to_be_bytes()[..]);
            assert_eq!(
                FrameDecoder::default().decode(&mut buf).unwrap_err(),
                WireError::InvalidFrameLength { length }
            );
        }
    }
}
