//! Locking shared by every part.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex; a panic in another holder leaves data that is still consistent for our
/// uses (every critical section here replaces values whole), so poisoning is ignored.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
