//! Locks that survive a panic elsewhere. A thread that panicked while
//! holding one of the broker's locks poisons it; the broker goes on
//! serving with the data as it is (every update behind these locks is one
//! statement or leaves a consistent value), rather than failing every
//! later call.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) trait LockAnyway<T> {
    /// `lock()`, taking the data of a poisoned lock too.
    fn lock_anyway(&self) -> MutexGuard<'_, T>;
}

impl<T> LockAnyway<T> for Mutex<T> {
    fn lock_anyway(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(crate) trait RwLockAnyway<T> {
    /// `read()`, taking the data of a poisoned lock too.
    fn read_anyway(&self) -> RwLockReadGuard<'_, T>;
    /// `write()`, taking the data of a poisoned lock too.
    fn write_anyway(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> RwLockAnyway<T> for RwLock<T> {
    fn read_anyway(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_anyway(&self) -> RwLockWriteGuard<'_, T> {
        self.write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
