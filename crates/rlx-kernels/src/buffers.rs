//! Recycled f32 output buffers: the executor's memory plan by liveness.
//!
//! Every kernel returns its output in a fresh `Vec`. Without this module each of those is a
//! `malloc` and, when the value dies, a `free`: on small transformers (GPT-2, BERT-style,
//! ~0.07 ms per run) the allocator was about a tenth of the profile. Here, while a
//! `rlx_cpu::CpuExecutor` runs, a dead f32 value's buffer goes into a pool
//! ([`give`]) and the kernels take their output buffers from it ([`take`], [`filled`]): the
//! most recently freed buffer that holds the request (its lines are the likeliest to be
//! still in cache) without being more than about 4× larger. The pool is kept in the
//! executor between runs, so a steady-state run allocates only its outputs (which go to
//! the caller).
//!
//! Memory: the pool holds at most the graph's peak of live f32 intermediates plus its
//! largest one (computed from its static shapes when the executor is built), dropping its
//! oldest buffers first,
//! and a buffer not reused during a whole run is released when that run ends. Off an
//! executor's thread (constant folding, other threads of a parallel kernel) [`take`] is a
//! plain allocation.
//!
//! Only f32 is pooled (every float model's activations); other element types allocate.

use rlx_ir::TensorData;
use std::any::TypeId;
use std::cell::RefCell;
use std::mem::ManuallyDrop;

/// A pooled buffer serves a request of `n` elements only up to `n * SLACK + SLACK_ABS`
/// elements of capacity (a large buffer is not spent on a small output).
const SLACK: usize = 4;
const SLACK_ABS: usize = 1024;

/// A free buffer of a [`Pool`].
#[derive(Debug)]
struct Free {
    /// Length 0; its memory holds `init` values of its earlier use.
    buf: Vec<f32>,
    /// Its length when it was given back.
    init: usize,
    /// Given back during the current run (else it is released when the run ends).
    fresh: bool,
}

/// The free buffers of one executor.
#[derive(Debug, Default)]
pub struct Pool {
    free: Vec<Free>,
    /// Bytes of capacity in `free` (kept, so a `give` does not sum the pool).
    bytes: usize,
    /// The most bytes `free` may hold: the graph's peak of live f32 intermediates plus its
    /// largest one, so the pool at most about doubles a run's working set (0: nothing is
    /// kept).
    limit: usize,
    /// Buffers handed out during the current run, by allocation (pointer, capacity), with
    /// how many leading elements held values when they left: a buffer given back shorter
    /// than that (a 3 MB stem output's buffer reused for a 1.5 MB concat) keeps its longer
    /// initialized prefix, so a later [`overwritten`] of the full size needs no fill pass
    /// (SqueezeNet's stem zero-filled 3 MB per run: ~0.2 ms). Cleared at each run's start
    /// and end; at most [`LENT_MAX`] entries (the oldest dropped).
    lent: Vec<(usize, usize, usize)>,
}

/// See [`Pool::lent`].
const LENT_MAX: usize = 256;

impl Pool {
    /// An empty pool that holds at most `limit` bytes.
    pub fn with_limit(limit: usize) -> Pool {
        Pool {
            limit,
            ..Pool::default()
        }
    }

    fn push(&mut self, v: Vec<f32>, init: usize) {
        let b = v.capacity() * 4;
        if b > self.limit {
            return;
        }
        // Oldest first out, until the new buffer fits under the limit.
        let mut drop_n = 0;
        while self.bytes + b > self.limit {
            self.bytes -= self.free[drop_n].buf.capacity() * 4;
            drop_n += 1;
        }
        self.free.drain(..drop_n);
        self.bytes += b;
        self.free.push(Free {
            buf: v,
            init,
            fresh: true,
        });
    }

    /// Capacities (elements) of the free buffers, oldest first (for tests, also rlx-cpu's).
    #[doc(hidden)]
    pub fn capacities(&self) -> Vec<usize> {
        self.free.iter().map(|e| e.buf.capacity()).collect()
    }

    fn remove(&mut self, i: usize) -> (Vec<f32>, usize) {
        let Free { buf, init, .. } = self.free.remove(i);
        self.bytes -= buf.capacity() * 4;
        if self.lent.len() >= LENT_MAX {
            self.lent.remove(0);
        }
        self.lent
            .push((buf.as_ptr() as usize, buf.capacity(), init));
        (buf, init)
    }

    /// The initialized prefix of `v` (given back with `len` values) when it was handed out
    /// in this run with a longer one (the entry is consumed).
    fn lent_init(&mut self, v: &Vec<f32>, len: usize) -> usize {
        let key = (v.as_ptr() as usize, v.capacity());
        match self.lent.iter().rposition(|&(p, c, _)| (p, c) == key) {
            Some(i) => len.max(self.lent.swap_remove(i).2),
            None => len,
        }
    }
}

thread_local! {
    /// The pool of the executor running on this thread, if any.
    static ACTIVE: RefCell<Option<Pool>> = const { RefCell::new(None) };
    /// [`reserve_next`]'s request: `(n, cap)`.
    static RESERVE: std::cell::Cell<Option<(usize, usize)>> = const { std::cell::Cell::new(None) };
}

/// Until [`reserve_clear`] (or until served), the next buffer of exactly `n` elements that
/// this thread takes ([`overwritten`], [`take`], [`filled`]) gets room for at least `cap`:
/// the executor asks it for the value whose buffer a Concat then extends in place (its
/// first input, `cap` the Concat's size), so the Concat copies only its other inputs. Only
/// capacity changes: a buffer taken by something else of the same length is merely larger.
pub fn reserve_next(n: usize, cap: usize) {
    RESERVE.with(|r| r.set((n > 0 && cap > n).then_some((n, cap))));
}

/// Drops a [`reserve_next`] request that was not served.
pub fn reserve_clear() {
    RESERVE.with(|r| r.set(None));
}

/// The capacity to take for `n` elements: a pending [`reserve_next`] request's (consumed)
/// when it is for `n`, else `n`.
fn wanted(n: usize) -> usize {
    RESERVE.with(|r| match r.get() {
        Some((rn, cap)) if rn == n => {
            r.set(None);
            cap
        }
        _ => n,
    })
}

/// Makes `pool` this thread's active pool until dropped, then moves it back into `pool`
/// (whatever was active before is restored), releasing the buffers this run did not reuse.
pub struct Active<'a> {
    home: &'a mut Pool,
    prev: Option<Pool>,
}

impl<'a> Active<'a> {
    pub fn install(home: &'a mut Pool) -> Active<'a> {
        let mut pool = std::mem::take(home);
        for e in &mut pool.free {
            e.fresh = false;
        }
        pool.lent.clear();
        let prev = ACTIVE.with(|a| a.replace(Some(pool)));
        Active { home, prev }
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        let pool = ACTIVE.with(|a| a.replace(self.prev.take()));
        let mut pool = pool.unwrap_or_default();
        pool.free.retain(|e| e.fresh);
        pool.lent.clear();
        pool.bytes = pool.free.iter().map(|e| e.buf.capacity() * 4).sum();
        *self.home = pool;
    }
}

/// Hands a dead value's storage to the active pool (f32 only; anything else is dropped).
pub fn give(data: TensorData) {
    if let TensorData::F32(mut v) = data {
        if v.capacity() == 0 {
            return;
        }
        let len = v.len();
        v.clear();
        ACTIVE.with(|a| {
            if let Ok(mut a) = a.try_borrow_mut() {
                if let Some(p) = a.as_mut() {
                    // Its memory past `len` may still hold values of its use before this
                    // one (handed out in this run with a longer prefix).
                    let init = p.lent_init(&v, len).min(v.capacity());
                    p.push(v, init);
                }
            }
        });
    }
}

/// An empty `Vec<T>` with capacity for at least `n` elements: a pooled buffer when `T` is
/// f32 and this thread has an active pool with one that fits, else a new allocation.
pub(crate) fn take<T: 'static>(n: usize) -> Vec<T> {
    take_init(n).0
}

/// [`take`], with how many leading elements of the buffer's memory hold values of an earlier
/// use (0 for a new allocation).
fn take_init<T: 'static>(n: usize) -> (Vec<T>, usize) {
    if n == 0 {
        return (Vec::new(), 0);
    }
    let cap = wanted(n);
    if TypeId::of::<T>() != TypeId::of::<f32>() {
        return (Vec::with_capacity(cap), 0);
    }
    let hit = ACTIVE.with(|a| {
        let mut a = a.try_borrow_mut().ok()?;
        let p = a.as_mut()?;
        let max = cap.saturating_mul(SLACK).saturating_add(SLACK_ABS);
        let last = p
            .free
            .iter()
            .rposition(|e| e.buf.capacity() >= cap && e.buf.capacity() <= max)?;
        Some(p.remove(last))
    });
    match hit {
        Some((v, init)) => {
            let mut v = ManuallyDrop::new(v);
            // SAFETY: T is f32 (checked by TypeId above), so the pointer, length (0) and
            // capacity describe an allocation made for T's layout.
            let v = unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T>(), 0, v.capacity()) };
            (v, init)
        }
        None => (Vec::with_capacity(cap), 0),
    }
}

/// A `Vec<T>` of length `n` that the caller overwrites whole before reading any of it: a
/// pooled buffer keeps the values of its earlier uses (no fill pass over them); elements
/// past the longest of them, and anything not pooled, are `T::default()`. Only for kernels
/// that write every element.
pub fn overwritten<T: Copy + Default + 'static>(n: usize) -> Vec<T> {
    let (mut v, init) = take_init::<T>(n);
    // SAFETY: the first `init` elements of this allocation hold initialized f32 values
    // (`give` records its length, or the longer prefix it held when this run handed it out:
    // nothing de-initializes memory a Vec keeps; f32 is Copy and every bit pattern is a
    // valid f32); `take_init` returns init 0 for any other T and for a new allocation.
    // Only the elements past them are filled.
    unsafe { v.set_len(init.min(n)) };
    v.resize(n, T::default());
    v
}

/// `vec![x; n]` on a buffer from [`take`].
pub(crate) fn filled<T: Copy + 'static>(n: usize, x: T) -> Vec<T> {
    let mut v = take(n);
    v.resize(n, x);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `reserve_next(n, cap)`: the next buffer of exactly `n` elements has room for `cap`
    /// (from the pool or new), other lengths do not consume the request, it serves once, and
    /// `reserve_clear` drops it.
    #[test]
    fn reserve_next_gives_one_buffer_of_that_length_its_room() {
        let mut home = Pool::with_limit(1 << 30);
        {
            let _a = Active::install(&mut home);
            give(TensorData::F32(vec![0.0; 1000]));
            give(TensorData::F32(vec![0.0; 100]));
            reserve_next(100, 180);
            let other = overwritten::<f32>(50);
            assert!(other.capacity() < 180);
            let v = overwritten::<f32>(100);
            assert_eq!(v.len(), 100);
            assert_eq!(v.capacity(), 1000, "the pooled buffer with room");
            let w = take::<f32>(100);
            assert!(w.capacity() < 180, "served once");
            reserve_next(30, 60);
            reserve_clear();
            assert!(take::<f32>(30).capacity() < 60);
            reserve_next(7, 9);
            assert!(
                take::<i64>(7).capacity() >= 9,
                "other types get the room too"
            );
        }
        reserve_next(5, 50);
        assert!(
            filled(5, 1.0f32).capacity() >= 50,
            "no active pool: a new buffer with room"
        );
    }

    /// A buffer reused for a shorter value keeps its longer initialized prefix: the full
    /// size is then served by `overwritten` without a fill (its old values still there,
    /// which the caller overwrites), and a size past every earlier use is filled from the
    /// end of that prefix only.
    #[test]
    fn overwritten_fills_only_past_the_longest_earlier_use() {
        let mut home = Pool::with_limit(1 << 30);
        {
            let _a = Active::install(&mut home);
            let v: Vec<f32> = filled(1000, 7.0);
            let p = v.as_ptr();
            give(TensorData::F32(v));
            // Reused for 400 values (a smaller request within the slack), given back.
            let mut w: Vec<f32> = take(400);
            assert_eq!(w.as_ptr(), p);
            w.extend(std::iter::repeat_n(1.0, 400));
            give(TensorData::F32(w));
            let o: Vec<f32> = overwritten(1000);
            assert_eq!(o.as_ptr(), p);
            assert!(o[..400].iter().all(|&x| x == 1.0));
            assert!(
                o[400..].iter().all(|&x| x == 7.0),
                "no fill past 400: 7.0 kept"
            );
            give(TensorData::F32(o));
            // A buffer that came from outside the pool with 600 of its 1000 values set:
            // only the 400 past them are filled.
            let mut fresh: Vec<f32> = Vec::with_capacity(1000);
            fresh.extend(std::iter::repeat_n(5.0, 600));
            let fp = fresh.as_ptr();
            give(TensorData::F32(fresh));
            let o: Vec<f32> = overwritten(1000);
            assert_eq!(o.as_ptr(), fp);
            assert!(o[..600].iter().all(|&x| x == 5.0));
            assert!(o[600..].iter().all(|&x| x == 0.0));
            give(TensorData::F32(o));
        }
    }

    #[test]
    fn reuses_a_given_buffer_and_releases_unused_ones() {
        let mut home = Pool::with_limit(1 << 30);
        let ptr;
        {
            let _a = Active::install(&mut home);
            let v: Vec<f32> = filled(1000, 1.0);
            ptr = v.as_ptr();
            give(TensorData::F32(v));
            let w: Vec<f32> = take(900);
            assert_eq!(w.as_ptr(), ptr, "the freed buffer serves the next request");
            assert!(w.is_empty() && w.capacity() >= 900);
            // The latest fitting buffer is taken first.
            let other: Vec<f32> = filled(950, 0.0);
            let optr = other.as_ptr();
            give(TensorData::F32(w));
            give(TensorData::F32(other));
            let v: Vec<f32> = take(900);
            assert_eq!(v.as_ptr(), optr);
            give(TensorData::F32(v));
            // Far too large for a 10-element request: a new allocation.
            let big: Vec<f32> = filled(100_000, 0.0);
            let bptr = big.as_ptr();
            give(TensorData::F32(big));
            let small: Vec<f32> = take(10);
            assert_eq!(
                small.as_ptr(),
                optr,
                "the latest one that is not far too large"
            );
            let again: Vec<f32> = take(90_000);
            assert_eq!(again.as_ptr(), bptr);
            // Other element types never come from the pool.
            let ints: Vec<i32> = take(1000);
            assert_ne!(ints.as_ptr() as *const f32, ptr);
        }
        assert_eq!(home.free.len(), 1, "kept for the next run");
        {
            let _a = Active::install(&mut home);
            // A request the kept buffer does not fit.
            let _other: Vec<f32> = take(1 << 20);
        }
        assert!(home.free.is_empty(), "not reused during a run: released");
        // No active pool: plain allocations, and give() drops.
        give(TensorData::F32(vec![0.0; 8]));
        let v: Vec<f32> = filled(8, 2.0);
        assert_eq!(v, vec![2.0; 8]);
    }

    #[test]
    fn overwritten_has_the_length_asked_and_defaults_past_earlier_values() {
        let mut home = Pool::with_limit(1 << 30);
        let _a = Active::install(&mut home);
        let v: Vec<f32> = filled(1000, 3.0);
        let ptr = v.as_ptr();
        give(TensorData::F32(v));
        // Within the 1000 values of its earlier use: no fill.
        let w: Vec<f32> = overwritten(800);
        assert_eq!((w.as_ptr(), w.len()), (ptr, 800));
        give(TensorData::F32(w));
        // Past the 800 values it held when given back but within the 1000 it held when this
        // run handed it out: no fill either (the earlier values, which the caller overwrites).
        let x: Vec<f32> = overwritten(900);
        assert_eq!((x.as_ptr(), x.len()), (ptr, 900));
        assert!(x.iter().all(|&e| e == 3.0));
        give(TensorData::F32(x));
        // Not pooled: the default.
        let y: Vec<u8> = overwritten(5);
        assert_eq!(y, vec![0u8; 5]);
    }

    #[test]
    fn holds_at_most_its_limit_dropping_the_oldest() {
        let mut home = Pool::with_limit(10_000 * 4);
        let _a = Active::install(&mut home);
        let (a, b, c): (Vec<f32>, Vec<f32>, Vec<f32>) = (take(4000), take(4000), take(4000));
        let (pb, pc) = (b.as_ptr(), c.as_ptr());
        for v in [a, b, c] {
            give(TensorData::F32(v));
        }
        // `a` was dropped to make room for `c`.
        let (x, y, z): (Vec<f32>, Vec<f32>, Vec<f32>) = (take(4000), take(4000), take(4000));
        assert_eq!((x.as_ptr(), y.as_ptr()), (pc, pb));
        assert!(z.as_ptr() != pb && z.as_ptr() != pc);
        // Larger than the whole limit: never kept.
        give(TensorData::F32(Vec::with_capacity(20_000)));
        ACTIVE.with(|p| assert!(p.borrow().as_ref().unwrap().free.is_empty()));
    }
}
