//! A global allocator for RLX's programs: the system allocator, with every block of at
//! least [`MIN_BYTES`] starting on a 64-byte boundary (a cache line).
//!
//! Tensors are `Vec`s, which the system allocator (glibc's `malloc`) starts 16 bytes past
//! a line for large blocks, so each 64-byte vector load or store of a tensor row touched two
//! lines. On an Intel Xeon (Ice Lake) VM, single convs with their tensors on lines ran
//! 8-28% faster (MobileNetV2's 16←32 1×1 at 112² on gemm 0.191-0.194 → 0.137-0.142 ms, a
//! 144-channel 3×3 depthwise at 56² 0.277-0.285 → 0.253-0.265), and MobileNetV2's nodes
//! summed 2.2% less (bench/NOTES.md §48). Whether a block is placed so is read from its
//! layout alone, so it is freed as it was made. Programs opt in with
//! `#[global_allocator] static A: rlx_kernels::alloc::LineAligned = LineAligned;` (the
//! `rlx` and `rlx-run` binaries and the Python extension do).

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes are aligned to [`LINE`] bytes.
pub const MIN_BYTES: usize = 4096;

/// The alignment given to large blocks (one cache line on x86-64 and most Arm cores).
pub const LINE: usize = 64;

/// The system allocator with blocks of [`MIN_BYTES`] or more on [`LINE`]-byte boundaries
/// (see the module).
///
/// Such a block (with an alignment of at most 16 asked) is a system block [`LINE`] bytes
/// longer, the first line boundary past its first 8 bytes returned, and the system block's
/// address kept in the 8 bytes before it. `posix_memalign` would do the same work, but
/// glibc's took 17 MB more peak memory on ResNet-50 (266 against 249 MB).
pub struct LineAligned;

/// True when blocks of layout `l` get a line of their own ([`LineAligned`]).
fn wide(l: Layout) -> bool {
    l.size() >= MIN_BYTES && l.align() <= 16
}

/// The system block under a wide block of `size` bytes.
fn outer(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(LINE)?, 16).ok()
}

/// The line boundary past `raw`'s first 8 bytes, with `raw` written in the 8 bytes before.
///
/// # Safety
/// `raw` is null or a system block of `outer(size)` (16-aligned, `LINE` bytes longer).
unsafe fn place(raw: *mut u8) -> *mut u8 {
    if raw.is_null() {
        return raw;
    }
    // `raw` is 16-aligned, so the boundary is 16 to 64 bytes past it, inside the block,
    // and the 8 bytes before the boundary are in it too.
    let p = raw.wrapping_add(LINE - (raw as usize % LINE));
    // SAFETY: `p − 8 ≥ raw + 8`, 8-aligned, inside the block.
    unsafe { p.cast::<usize>().sub(1).write(raw as usize) };
    p
}

/// The system block under `p` (a wide block's address, [`place`]).
///
/// # Safety
/// `p` was returned by [`place`] and not freed.
unsafe fn raw_of(p: *mut u8) -> *mut u8 {
    // SAFETY: `place` wrote it there.
    unsafe { p.cast::<usize>().sub(1).read() as *mut u8 }
}

// SAFETY: a block that is not wide is `System`'s with the caller's layout; a wide one
// (`wide` reads the caller's layout alone, so `dealloc` and `realloc` see how the block was
// made) sits `LINE`-aligned inside a system block of `outer(size)`, whose address `place`
// keeps before it; it holds `size` bytes and satisfies the asked alignment (≤ 16 | 64).
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        match outer(l.size()).filter(|_| wide(l)) {
            // SAFETY: `o` has a non-zero size; `place` gets its block.
            Some(o) => unsafe { place(System.alloc(o)) },
            // SAFETY: the caller's layout, as `GlobalAlloc::alloc` takes it.
            None => unsafe { System.alloc(l) },
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        match outer(l.size()).filter(|_| wide(l)) {
            // SAFETY: as `alloc` (the header is written after the zeroing).
            Some(o) => unsafe { place(System.alloc_zeroed(o)) },
            // SAFETY: as `alloc`.
            None => unsafe { System.alloc_zeroed(l) },
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        match outer(l.size()).filter(|_| wide(l)) {
            // SAFETY: `p` came from `alloc` with `l`: a wide block inside `o`'s.
            Some(o) => unsafe { System.dealloc(raw_of(p), o) },
            // SAFETY: `p` is `System`'s block of layout `l`.
            None => unsafe { System.dealloc(p, l) },
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let Ok(n) = Layout::from_size_align(new_size, l.align()) else {
            return std::ptr::null_mut();
        };
        if !wide(l) && !wide(n) {
            // SAFETY: `p` is `System`'s block of layout `l`; `new_size` is valid for it.
            return unsafe { System.realloc(p, l, new_size) };
        }
        // A new block, the bytes moved, the old block freed with its own layout.
        // SAFETY: `n` has a non-zero size; both blocks hold the bytes copied; `p` is this
        // allocator's block of layout `l`.
        unsafe {
            let q = self.alloc(n);
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
                self.dealloc(p, l);
            }
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Large blocks start on a line, small ones keep the system's alignment; a block that
    /// grows or shrinks across `MIN_BYTES` keeps its bytes and gets the new size's
    /// alignment.
    #[test]
    fn large_blocks_start_on_a_line_and_keep_their_bytes() {
        let a = LineAligned;
        for size in [MIN_BYTES, MIN_BYTES + 4, 1 << 20, 3 << 20] {
            let l = Layout::from_size_align(size, 4).unwrap();
            // SAFETY: non-zero sizes; each block freed with its layout.
            unsafe {
                let p = a.alloc(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % LINE, 0, "{size} bytes");
                a.dealloc(p, l);
                let z = a.alloc_zeroed(l);
                assert_eq!(z as usize % LINE, 0, "{size} bytes, zeroed");
                assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                a.dealloc(z, l);
            }
        }
        let small = Layout::from_size_align(100, 4).unwrap();
        let big = Layout::from_size_align(MIN_BYTES * 3, 4).unwrap();
        // SAFETY: as above; realloc's new sizes are non-zero.
        unsafe {
            let p = a.alloc(small);
            for i in 0..100 {
                *p.add(i) = i as u8;
            }
            let q = a.realloc(p, small, big.size());
            assert_eq!(q as usize % LINE, 0);
            assert!((0..100).all(|i| *q.add(i) == i as u8));
            let r = a.realloc(q, big, 50);
            assert!((0..50).all(|i| *r.add(i) == i as u8));
            a.dealloc(r, Layout::from_size_align(50, 4).unwrap());
        }
    }
}
