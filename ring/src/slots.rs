//! The slot array after the header, and the copies in and out of it.
//!
//! Bulk and burst operations copy contiguous runs: a run that crosses the end
//! of the array is two copies, one up to the end and one from slot 0.

use core::mem::MaybeUninit;

/// One slot. Uninitialised until a producer writes it; only slots between the
/// consumer head and the producer tail are ever read.
#[cfg(not(loom))]
pub(crate) type Slot<T> = MaybeUninit<T>;
/// One slot, as a loom cell so that the model checker sees every access and
/// reports a producer and a consumer touching one slot without ordering.
#[cfg(loom)]
pub(crate) type Slot<T> = loom::cell::UnsafeCell<MaybeUninit<T>>;

/// Number of elements up to which the copy is an element-by-element loop
/// (which the compiler unrolls) instead of a call to `memcpy`.
#[cfg(not(loom))]
const SMALL_RUN: usize = 8;

/// Copies `src` into the slots starting at `start`, wrapping at `capacity`.
///
/// # Safety
///
/// `slots` points to `capacity` slots; `start < capacity`;
/// `src.len() <= capacity`; the calling thread has reserved the slots
/// `start .. start + src.len()` (modulo `capacity`): no other thread reads or
/// writes them until it publishes them.
#[inline(always)]
pub(crate) unsafe fn write<T: Copy>(slots: *mut Slot<T>, capacity: usize, start: usize, src: &[T]) {
    debug_assert!(start < capacity && src.len() <= capacity);
    let first = src.len().min(capacity - start);
    let (a, b) = src.split_at(first);
    // SAFETY: `start + a.len() <= capacity`, so the run stays in the array;
    // the caller reserved these slots for this thread.
    unsafe { write_run(slots.add(start), a) };
    if !b.is_empty() {
        // SAFETY: `b.len() = src.len() - first <= capacity - first`, so the
        // wrapped run fits in the array from slot 0, below `start`; reserved
        // as above.
        unsafe { write_run(slots, b) };
    }
}

/// Copies `len` slots starting at `start`, wrapping at `capacity`, to `dst`.
///
/// # Safety
///
/// As for [`write`], with the slots reserved for reading; in addition the
/// slots were written by a producer whose tail store this thread has
/// acquired, and `dst` is valid for writes of `len` elements and does not
/// overlap the slots.
#[inline(always)]
pub(crate) unsafe fn read<T: Copy>(
    slots: *const Slot<T>,
    capacity: usize,
    start: usize,
    dst: *mut T,
    len: usize,
) {
    debug_assert!(start < capacity && len <= capacity);
    let first = len.min(capacity - start);
    // SAFETY: the run stays in the array (see `write`); the slots are
    // reserved for this thread and were initialised by a producer whose tail
    // store this thread acquired; `dst` holds `len >= first` elements.
    unsafe { read_run(slots.add(start), dst, first) };
    if first < len {
        // SAFETY: as in `write`, the wrapped run fits below `start`; `dst`
        // holds `len` elements, so `first..len` is in it.
        unsafe { read_run(slots, dst.add(first), len - first) };
    }
}

/// Writes `value` into slot `index`.
///
/// # Safety
///
/// `slots` points to more than `index` slots, and the calling thread has
/// reserved slot `index`: no other thread reads or writes it until it is
/// published.
#[inline(always)]
pub(crate) unsafe fn write_one<T: Copy>(slots: *mut Slot<T>, index: usize, value: T) {
    // SAFETY: slot `index` is in the array and reserved for this thread (the
    // caller's promise); a run of one element.
    unsafe { write_run(slots.add(index), core::slice::from_ref(&value)) };
}

/// Reads slot `index`.
///
/// # Safety
///
/// `slots` points to more than `index` slots; slot `index` is reserved for
/// this thread and was initialised by a producer whose tail store this thread
/// has acquired.
#[inline(always)]
pub(crate) unsafe fn read_one<T: Copy>(slots: *const Slot<T>, index: usize) -> T {
    let mut out = MaybeUninit::<T>::uninit();
    // SAFETY: slot `index` is in the array, reserved and initialised (the
    // caller's promise); `out` holds one element and is not a slot.
    unsafe { read_run(slots.add(index), out.as_mut_ptr(), 1) };
    // SAFETY: `read_run` wrote the one element.
    unsafe { out.assume_init() }
}

/// Copies `src` into the `src.len()` slots at `dst`.
///
/// # Safety
///
/// The slots are in the array and reserved for this thread.
#[cfg(not(loom))]
#[inline(always)]
unsafe fn write_run<T: Copy>(dst: *mut Slot<T>, src: &[T]) {
    let dst = dst.cast::<T>();
    if src.len() <= SMALL_RUN {
        for (i, v) in src.iter().enumerate() {
            // SAFETY: `i < src.len()`: slot `i` of the run, reserved for us;
            // `Slot<T>` has `T`'s layout.
            unsafe { dst.add(i).write(*v) };
        }
    } else {
        // SAFETY: the destination run is in the array, reserved for us, and
        // cannot overlap `src`, which the caller borrows from elsewhere.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
    }
}

/// Copies the `len` slots at `src` to `dst`.
///
/// # Safety
///
/// The slots are in the array, reserved for this thread, and initialised;
/// `dst` is valid for writes of `len` elements and does not overlap them.
#[cfg(not(loom))]
#[inline(always)]
unsafe fn read_run<T: Copy>(src: *const Slot<T>, dst: *mut T, len: usize) {
    let src = src.cast::<T>();
    if len <= SMALL_RUN {
        for i in 0..len {
            // SAFETY: `i < len`: slot `i` of the run, reserved for us and
            // initialised by a producer, and element `i` of `dst`.
            unsafe { dst.add(i).write(src.add(i).read()) };
        }
    } else {
        // SAFETY: the source run is in the array, initialised and reserved
        // for us; `dst` holds `len` elements and does not overlap it.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
    }
}

/// Loom build: writes slot by slot through the model checker's cells.
///
/// # Safety
///
/// The slots are in the array and reserved for this thread.
#[cfg(loom)]
unsafe fn write_run<T: Copy>(dst: *mut Slot<T>, src: &[T]) {
    for (i, v) in src.iter().enumerate() {
        // SAFETY: slot `i` of the run is in the array; loom checks that no
        // other thread accesses it concurrently.
        let cell = unsafe { &*dst.add(i) };
        // SAFETY: the pointer comes from the cell, valid for a write.
        cell.with_mut(|p| unsafe { p.write(MaybeUninit::new(*v)) });
    }
}

/// Loom build: reads slot by slot through the model checker's cells.
///
/// # Safety
///
/// The slots are in the array, reserved for this thread, and initialised;
/// `dst` is valid for writes of `len` elements.
#[cfg(loom)]
unsafe fn read_run<T: Copy>(src: *const Slot<T>, dst: *mut T, len: usize) {
    for i in 0..len {
        // SAFETY: slot `i` of the run is in the array; loom checks that no
        // other thread accesses it concurrently.
        let cell = unsafe { &*src.add(i) };
        // SAFETY: the slot was initialised by the producer we synchronised
        // with (loom reports it otherwise).
        let v = cell.with(|p| unsafe { (*p).assume_init() });
        // SAFETY: element `i < len` of `dst`.
        unsafe { dst.add(i).write(v) };
    }
}
