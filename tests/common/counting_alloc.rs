//! A global allocator that counts the allocations each thread makes, for
//! the tests that assert how many a path costs (`tests/alloc.rs`,
//! `tests/redis_alloc.rs`). Include it with `#[path]` and declare
//! `#[global_allocator] static GLOBAL: Counting = Counting;`.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator, counting every `alloc`,
/// `alloc_zeroed` and `realloc` on the calling thread.
pub struct Counting;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: a thread-local that is gone (thread teardown) counts
    // nothing.
    let _ = COUNT.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards every call to the system allocator unchanged; the
// bookkeeping only touches a const-initialised thread-local, which never
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations this thread has made so far.
pub fn count() -> u64 {
    COUNT.with(Cell::get)
}

/// Allocations on this thread while `f` runs.
pub fn allocations(f: impl FnOnce()) -> u64 {
    let before = count();
    f();
    count() - before
}
