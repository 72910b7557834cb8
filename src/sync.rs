//! Helpers over `std::sync` that every layer uses.

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical
/// section here is a few field updates).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
