//! A cursor over fuzz input that never fails: reads past the end give zeros, so every
//! input decodes to something and the fuzzer's mutations stay meaningful.

/// Reads fixed-size values from the front of the input.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.data
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A big-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// A big-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A big-endian `i64`.
    pub fn i64(&mut self) -> i64 {
        let hi = u64::from(self.u32());
        let lo = u64::from(self.u32());
        ((hi << 32) | lo) as i64
    }

    /// One bit's worth of choice.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// An index below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n
    }

    /// One of `items` (non-empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// Up to `max` bytes, the length read first.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let n = (usize::from(self.u16()) % (max + 1)).min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }
}
