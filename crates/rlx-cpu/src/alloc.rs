//! [`CacheAligned`]: the global allocator of RLX's binaries.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of at least this many bytes are aligned to [`LINE`].
const BIG: usize = 4096;
/// One cache line, and one AVX-512 vector.
const LINE: usize = 64;

/// The system allocator, with every allocation of 4 KiB or more aligned to 64 bytes (a
/// cache line; one AVX-512 vector). Smaller allocations are passed through unchanged.
///
/// Why: tensor buffers are `Vec`s, and glibc's `malloc` returns large blocks at an address
/// 16 bytes past a 64-byte boundary, so every 64-byte vector load or store of a kernel on
/// such a buffer splits two cache lines. With it, ResNet-18 at 1 thread ran 4% faster and
/// GPT-2/BERT-style decoders 4–5% (bench/NOTES.md §10). Rust's allocator API has no
/// per-`Vec` alignment, so the alignment is set for the whole process:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOC: rlx_cpu::CacheAligned = rlx_cpu::CacheAligned;
/// ```
///
/// The `rlx` and `rlx-run` binaries do this. A program that embeds RLX gets the same
/// kernel speed by doing the same (or with any allocator that aligns large blocks, such as
/// mimalloc); without it, results are identical, only slower.
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheAligned;

/// `layout` with its alignment raised to [`LINE`] when it is [`BIG`] or larger.
fn lined(layout: Layout) -> Layout {
    if layout.size() >= BIG && layout.align() < LINE {
        // Cannot fail: LINE is a power of two, and a size that fit `layout`'s alignment
        // rounds up to a multiple of 64 without overflowing isize (sizes ≤ isize::MAX − 63
        // are all Rust allocates; `Layout::from_size_align` checks it anyway).
        Layout::from_size_align(layout.size(), LINE).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every block is allocated and freed by `System` with the same `lined` layout:
// `lined` depends only on the size and alignment that callers must pass identically to
// `alloc` and `dealloc` (and `realloc` maps old and new layouts separately, moving the block
// when its alignment class changes).
unsafe impl GlobalAlloc for CacheAligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        System.alloc(lined(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        System.alloc_zeroed(lined(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, lined(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = lined(layout);
        let Ok(new) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let new = lined(new);
        if old.align() == new.align() {
            return System.realloc(ptr, old, new_size);
        }
        let p = System.alloc(new);
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
            System.dealloc(ptr, old);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_blocks_are_line_aligned_through_realloc() {
        let a = CacheAligned;
        unsafe {
            let small = Layout::from_size_align(100, 4).unwrap();
            let p = a.alloc(small);
            assert!(!p.is_null());
            p.write_bytes(7, 100);
            // Grow across the threshold: moved to a 64-byte boundary, contents kept.
            let big = Layout::from_size_align(1 << 20, 4).unwrap();
            let q = a.realloc(p, small, big.size());
            assert_eq!(q as usize % LINE, 0);
            assert!(std::slice::from_raw_parts(q, 100).iter().all(|&b| b == 7));
            // Grow while big, then shrink back below it.
            let r = a.realloc(q, big, 3 << 20);
            assert_eq!(r as usize % LINE, 0);
            assert!(std::slice::from_raw_parts(r, 100).iter().all(|&b| b == 7));
            let bigger = Layout::from_size_align(3 << 20, 4).unwrap();
            let s = a.realloc(r, bigger, 50);
            assert!(std::slice::from_raw_parts(s, 50).iter().all(|&b| b == 7));
            a.dealloc(s, Layout::from_size_align(50, 4).unwrap());
            let z = a.alloc_zeroed(big);
            assert_eq!(z as usize % LINE, 0);
            assert!(std::slice::from_raw_parts(z, big.size())
                .iter()
                .all(|&b| b == 0));
            a.dealloc(z, big);
        }
    }
}
