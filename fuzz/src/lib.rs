//! What the fuzz targets share: an allocator that aborts on any single allocation larger
//! than [`LIMIT`]. Inputs are at most 64 KiB (`-max_len`), so a larger allocation can only
//! come from a length field believed before the bytes arrived. libFuzzer's own
//! `-malloc_limit_mb` needs a sanitizer's malloc hooks, and an allocation that is never
//! touched does not show in `-rss_limit_mb`; this catches both.

use std::alloc::{GlobalAlloc, Layout, System};

/// The largest single allocation allowed.
pub const LIMIT: usize = 64 << 20;

/// Use as `#[global_allocator] static ALLOC: BoundedAlloc = BoundedAlloc;`.
pub struct BoundedAlloc;

fn check(size: usize) {
    if size > LIMIT {
        // No allocation here: print and abort, which libFuzzer reports as a crash.
        let msg = b"BoundedAlloc: single allocation above 64 MiB (a length believed before the bytes arrived?)\n";
        let _ = std::io::Write::write_all(&mut std::io::stderr(), msg);
        std::process::abort();
    }
}

// SAFETY: forwards to the system allocator unchanged, after a size check.
unsafe impl GlobalAlloc for BoundedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
