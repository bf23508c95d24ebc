//! Lock-free bounded rings in the spirit of DPDK's `rte_ring`.
//!
//! A [`Ring`] is a fixed-capacity FIFO of `Copy` elements (handles, offsets,
//! small `#[repr(C)]` descriptors). Its capacity is a power of two and all of
//! it is usable. Whether one or many threads enqueue, and one or many
//! dequeue, is chosen at creation ([`RingMode`]): SPSC, MPSC, SPMC or MPMC.
//! Elements move one at a time ([`Ring::enqueue`], [`Ring::dequeue`]), all or
//! nothing ([`Ring::enqueue_bulk`], [`Ring::dequeue_bulk`]) or as many as
//! possible ([`Ring::enqueue_burst`], [`Ring::dequeue_burst`]); bulk and burst
//! operations pay for synchronisation once per call, not once per element.
//!
//! A ring can live in memory shared between processes: its header is
//! `#[repr(C)]`, holds no pointer, and keeps its indices as atomics in the
//! region. [`Ring::init_in`] constructs one in place over a caller's region
//! of [`Ring::bytes_for`] bytes; [`Ring::attach`] validates the header (magic,
//! version, element size and alignment, capacity, region size) and returns a handle, or an
//! error for a region that holds no valid ring. [`Ring::new`] is the same on a
//! heap allocation of its own. Elements in shared memory must be plain data:
//! a pointer means nothing in another address space.
//!
//! ```
//! use ntbdk_ring::{Ring, RingMode};
//!
//! let ring = Ring::<u64>::new(8, RingMode::MPMC)?;
//! assert_eq!(ring.enqueue_bulk(&[1, 2, 3]), Ok(5)); // 5 slots left
//! let mut out = [0; 4];
//! let got = ring.dequeue_burst(&mut out);
//! assert_eq!((got.n, &out[..got.n]), (3, &[1, 2, 3][..]));
//! # Ok::<(), ntbdk_ring::RingError>(())
//! ```
//!
//! # The head/tail reservation scheme
//!
//! Each side (producers, consumers) has a *head* and a *tail*, free-running
//! `u64` indices masked with `capacity - 1` on access (see "Region layout"
//! for where they live). Slots in `[cons.tail, prod.tail)` hold elements;
//! slots in `[prod.tail, cons.tail + capacity)` are free. An operation on
//! either side runs three steps:
//!
//! 1. **Reserve.** Read the own head `h` and the *other* side's tail, and
//!    compute how many slots are available: `capacity + cons.tail - h` free
//!    slots for a producer, `prod.tail - h` filled slots for a consumer.
//!    (Each side keeps a cached copy of the other side's tail in its own
//!    block and reads the real one only when the cache shows too few slots;
//!    see below.) Decide `n` (all or nothing for bulk, up to the number asked
//!    for burst). A `Multi` side then moves its head from `h` to `h + n` with
//!    a compare-and-swap; if another thread moved it first, it starts again
//!    from the head the CAS returned. A `Single` side has no reservation in
//!    flight between its operations, so its head is its own tail and it
//!    stores nothing until it publishes.
//! 2. **Copy** the elements into or out of slots `h .. h + n`, which now
//!    belong to this thread alone: other threads of the same side reserve
//!    beyond `h + n`, and the other side does not go past this side's tail.
//!    Runs are copied contiguously: one copy, or two when the run wraps.
//! 3. **Publish.** Store `h + n` to the own tail. On a `Multi` side, threads
//!    may finish their copies out of order, but the tail must only ever
//!    cover finished slots, so a thread first waits until the tail equals its
//!    `h` (every earlier reservation is published): tails move in reservation
//!    order.
//!
//! Memory orderings, and why:
//!
//! - The **tail store is `Release`** and every load of the *other* side's
//!   tail is **`Acquire`**. A producer's slot writes therefore happen before
//!   a consumer reads them, and a consumer's slot reads happen before a
//!   producer overwrites the slots it released.
//! - On a `Multi` side, the **wait for the own tail is `Acquire`**: the
//!   earlier thread's copies happen before our `Release` store, so a thread
//!   on the other side that acquires our tail sees theirs as well (a plain
//!   store does not extend another thread's release sequence).
//! - On a `Multi` side, the **own head is loaded `Acquire` and moved with a
//!   CAS that is `AcqRel` (`Acquire` on failure)**. The thread that set head
//!   `h` had seen an other-side tail that made `h` legal; acquiring its head
//!   makes our read of that tail at least as recent, so the available count
//!   is never negative (a wrapped-around count would overwrite live slots).
//! - Each side keeps, in its own block, a **cached copy of the other side's
//!   tail**, and loads the real tail (`Acquire`) and refreshes the cache only
//!   when the cached view shows too few slots. The uncontended fast path thus
//!   touches no cache line the other side writes, except the slots. Every
//!   value the cache holds was the real tail once and tails only grow, so a
//!   stale cache under-counts, never over-counts, as long as this side's
//!   index has not passed it; when it has (a handle ran the side, below, or
//!   another thread moved a `Multi` side's head), the count is "negative",
//!   a `u64` above the capacity, and that too sends the operation to the
//!   real tail.
//! - A `Single` side reads its own tail (its head) and its cache `Relaxed`:
//!   only its one thread writes them.
//! - A `Multi` side's threads share the cache, so it is stored `Release` and
//!   loaded `Acquire` (whoever uses a cached tail synchronises, through the
//!   thread that cached it, with the other side's release of those slots).
//!   A cached tail may be older than the head another thread has since
//!   moved; the count is then "negative", a `u64` above the capacity, and
//!   that too sends the thread to the real tail.
//! - [`Ring::len`] loads the consumer tail, then the producer tail, both
//!   `Acquire`, so the difference is never negative.
//!
//! A `Single` side is a promise by the caller, as in DPDK: at most one thread
//! at a time uses that side (handing the role to another thread needs the
//! usual synchronisation, such as a join or a channel). Through one `Ring`
//! handle (shared, say, in an `Arc`) the promise is checked: the first
//! thread to use a `Single` side holds it, another thread's operation on it
//! panics instead of copying the same slots at once, and the holder hands
//! the side over with [`Ring::release_producer`] /
//! [`Ring::release_consumer`] (a join alone does not; with `&mut` to the
//! handle, [`Ring::release_sides`] forgets the holders). Across processes,
//! and across handles made with the `unsafe` [`Ring::attach`], it stays a
//! promise.
//!
//! Every count is clamped to the capacity and every slot index is masked with
//! the handle's own copy of the mask, so even a header corrupted by another
//! process after [`Ring::attach`] cannot make an operation touch memory
//! outside the slot array. What it cannot prevent: a process that dies
//! between reserving and publishing on a `Multi` side stalls that side (later
//! threads wait for its tail), as in DPDK.
//!
//! # Split handles
//!
//! A `Single` side can also be run through a handle that its one thread (or
//! process) owns: [`Ring::split_spsc`] turns an SPSC ring into a
//! [`Producer`] and a [`Consumer`]; [`Ring::into_producer`] and
//! [`Ring::into_consumer`] take one `Single` side of any ring (the producer
//! of an SPMC ring, the consumer of an MPSC ring), the other side being run
//! through other handles on the same region. A [`Ring`] operation takes
//! `&self`, so a `Single` side keeps its index and its cached copy of the
//! other side's tail in the header and loads them on every call; a handle
//! keeps them in itself instead, as `rtrb` does:
//!
//! ```text
//!  Producer (its thread's memory)        ring region (shared)            Consumer (its thread's memory)
//! +---------------------------+        +----------------------+        +---------------------------+
//! | tail   next index to write| -----> | prod.tail  (Release) | -----> | limit  prod.tail as last  |
//! | limit  cons.tail + N as   |        |                      |        |        loaded (Acquire)   |
//! |        last loaded        | <----- | cons.tail  (Release) | <----- | head   next index to read |
//! +---------------------------+        | slots                |        +---------------------------+
//!                                      +----------------------+
//! ```
//!
//! - An operation reads only the handle's own fields while its cached view
//!   (`limit`) shows enough room or elements; only when it does not does it
//!   load the other side's tail (`Acquire`) from the region and refresh the
//!   cache. Every cached value was the real tail once and tails only grow,
//!   so a stale cache under-counts, never over-counts.
//! - It publishes with **one `Release` store** of its own tail per call, be
//!   the call one element or a burst. The handle's index always equals the
//!   tail it last published, so the region holds the whole state of the
//!   ring between calls: another process attached to the region, or a
//!   `Ring` handle used after this one is dropped, sees a consistent ring
//!   (the header's cached tails, which handles leave alone, may fall behind
//!   the side's index; a `Ring` operation that finds such a count loads the
//!   real tail).
//! - The ring itself, header and slots, stays in its region, so handles work
//!   across processes: one process [`init_in`](Ring::init_in)s a ring and
//!   takes its [`Producer`], another [`attach`](Ring::attach)es and takes its
//!   [`Consumer`].
//! - Each handle is aligned to 128 bytes (the header's block size), so its
//!   fields, written on every call, never share a cache line with the other
//!   handle or anything else.
//! - Counts are clamped to the capacity and slot indices masked with the
//!   handle's own copy of the mask, as in the ring: a corrupted tail in the
//!   region cannot make a handle touch memory outside the slot array.
//!
//! A handle is `Send` but neither `Clone` nor `Sync`, and its operations take
//! `&mut self`: within a process, the type system keeps its side to one
//! thread at a time. Across processes, taking a side's handle is the same
//! promise as a `Single` side of a `Ring`: nothing else uses that side while
//! the handle lives.
//!
//! ```
//! use ntbdk_ring::{Ring, RingMode};
//!
//! let (mut tx, mut rx) = Ring::<u64>::new(4, RingMode::SPSC)?.split_spsc()?;
//! let t = std::thread::spawn(move || {
//!     for i in 0..1000u64 {
//!         let mut item = i;
//!         while let Err(back) = tx.enqueue(item) {
//!             item = back;
//!             std::thread::yield_now();
//!         }
//!     }
//! });
//! let mut next = 0;
//! while next < 1000 {
//!     match rx.dequeue() {
//!         Some(v) => {
//!             assert_eq!(v, next);
//!             next += 1;
//!         }
//!         None => std::thread::yield_now(),
//!     }
//! }
//! t.join().unwrap();
//! # Ok::<(), ntbdk_ring::RingError>(())
//! ```
//!
//! # Region layout
//!
//! The region of a ring of capacity `N` holding `T` is laid out as follows
//! (offsets in bytes, all integers in the machine's byte order):
//!
//! | offset | size | field |
//! | ---: | ---: | --- |
//! | 0 | 8 | magic, `b"NTBDKRNG"` read as a little-endian `u64`; stored last by `init_in` |
//! | 8 | 4 | header layout version, 1 |
//! | 12 | 4 | header size in bytes (640) |
//! | 16 | 4 | `size_of::<T>()` |
//! | 20 | 4 | `align_of::<T>()` |
//! | 24 | 4 | mode flags: bit 0 multi-producer, bit 1 multi-consumer |
//! | 28 | 4 | reserved, 0 |
//! | 32 | 8 | capacity `N` (a power of two) |
//! | 40 | 8 | mask `N - 1` |
//! | 128 | 8 | producer tail |
//! | 256 | 8 | producer head (multi-producer rings; 0 otherwise) |
//! | 264 | 8 | producers' cached copy of the consumer tail |
//! | 384 | 8 | consumer tail |
//! | 512 | 8 | consumer head (multi-consumer rings; 0 otherwise) |
//! | 520 | 8 | consumers' cached copy of the producer tail |
//! | 640 | `N * size_of::<T>()` | the slots |
//!
//! Each 128-byte block (two cache lines on x86, so the adjacent-line
//! prefetcher does not couple blocks) has one role: the metadata, written
//! once; each side's tail, written by that side and read by the other; each
//! side's head and cached tail, touched by that side only. Indices are
//! free-running `u64`s, masked with `N - 1`
//! on access: they never wrap in practice, so a stale compare-and-swap cannot
//! succeed by wrap-around.
//!
//! [`Ring::attach`] checks everything in the first block against what this
//! build would have written, and the region length against the capacity.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod burst;
mod dequeue;
mod enqueue;
mod error;
mod exclusive;
mod handle;
mod header;
mod headtail;
mod mode;
mod ring;
mod slots;
mod sync;

pub use burst::Burst;
pub use error::RingError;
pub use handle::{Consumer, Producer};
pub use mode::{RingMode, SyncMode};
pub use ring::Ring;
