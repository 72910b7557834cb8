//! A counting global allocator for tests that bound memory: a test binary installs
//! [`Counting`] with `#[global_allocator]`, then reads live bytes, the peak and the
//! largest single allocation over a [`MemoryWindow`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

/// Live bytes allocated by counted threads (signed: an uncounted thread may free a
/// little that was counted, or the reverse).
static CURRENT: AtomicI64 = AtomicI64::new(0);
/// The highest `CURRENT` since the last [`MemoryWindow::open`].
static PEAK: AtomicI64 = AtomicI64::new(0);
/// The largest single allocation (or reallocation target) requested since then.
static LARGEST: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on threads whose allocations are not the code under test's (a peer's
    /// runtime thread in the same process).
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Leaves this thread's allocations out of the counts (for a peer's threads; call it
/// from `on_thread_start`).
pub fn uncount_this_thread() {
    UNCOUNTED.with(|c| c.set(true));
}

/// Live bytes now (of counted threads, since the process started).
pub fn live_bytes() -> i64 {
    CURRENT.load(Ordering::SeqCst)
}

/// The allocator: `System`, with the bookkeeping above.
#[derive(Debug)]
pub struct Counting;

impl Counting {
    fn counted() -> bool {
        // `try_with`: during thread teardown the flag may be gone; count then.
        !UNCOUNTED.try_with(Cell::get).unwrap_or(false)
    }

    fn grow(requested: usize, delta: i64) {
        LARGEST.fetch_max(requested, Ordering::Relaxed);
        let now = CURRENT.fetch_add(delta, Ordering::Relaxed) + delta;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping only touches
// atomics and a `const` thread-local, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Self::counted() {
            // Recorded before the call, so an attempt that fails still shows.
            Self::grow(layout.size(), layout.size() as i64);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if Self::counted() {
            Self::grow(layout.size(), layout.size() as i64);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if Self::counted() {
            CURRENT.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if Self::counted() {
            Self::grow(new_size, new_size as i64 - layout.size() as i64);
        }
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// The memory figures of one phase of a test.
#[derive(Debug)]
pub struct MemoryWindow {
    baseline: i64,
}

impl MemoryWindow {
    /// Starts a phase: the peak restarts from the live bytes now.
    pub fn open() -> Self {
        let baseline = CURRENT.load(Ordering::SeqCst);
        PEAK.store(baseline, Ordering::SeqCst);
        LARGEST.store(0, Ordering::SeqCst);
        Self { baseline }
    }

    /// How far live memory rose above the start of the phase, at its highest.
    pub fn peak_growth(&self) -> usize {
        usize::try_from(PEAK.load(Ordering::SeqCst) - self.baseline).unwrap_or(0)
    }

    /// How far live memory is above the start of the phase now (negative: below).
    pub fn growth(&self) -> i64 {
        CURRENT.load(Ordering::SeqCst) - self.baseline
    }

    /// The largest single allocation of the phase.
    pub fn largest(&self) -> usize {
        LARGEST.load(Ordering::SeqCst)
    }
}

/// Bytes in MiB, for messages.
pub fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
