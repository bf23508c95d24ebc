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
//! version, element type, capacity, region size) and returns a handle, or an
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
//! `u64` indices masked with `capacity - 1` on access, each side's pair in a
//! 128-byte block of its own. Slots in `[cons.tail, prod.tail)` hold elements;
//! slots in `[prod.tail, cons.tail + capacity)` are free. An operation on
//! either side runs three steps:
//!
//! 1. **Reserve.** Read the own head `h` and the *other* side's tail, and
//!    compute how many slots are available: `capacity + cons.tail - h` free
//!    slots for a producer, `prod.tail - h` filled slots for a consumer.
//!    Decide `n` (all or nothing for bulk, up to the number asked for burst).
//!    A `Multi` side then moves its head from `h` to `h + n` with a
//!    compare-and-swap; if another thread moved it first, it starts again
//!    from the head the CAS returned. A `Single` side just stores `h + n`.
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
//! - A `Single` side reads and stores its own head `Relaxed` (no other thread
//!   writes it) and keeps, in its own block, a **cached copy of the other
//!   side's tail**, also `Relaxed`. Only when the cache shows too few slots
//!   does it load the real tail (`Acquire`) and refresh the cache, so an
//!   uncontended fast path touches no cache line the other side writes
//!   except the slots. A stale cache only under-counts: the other tail only
//!   grows.
//! - [`Ring::len`] loads the consumer tail, then the producer tail, both
//!   `Acquire`, so the difference is never negative.
//!
//! A `Single` side is a promise by the caller, as in DPDK: at most one thread
//! at a time uses that side (handing the role to another thread needs the
//! usual synchronisation, such as a join or a channel). Breaking it makes two
//! threads copy the same slots at once.
//!
//! Every count is clamped to the capacity and every slot index is masked with
//! the handle's own copy of the mask, so even a header corrupted by another
//! process after [`Ring::attach`] cannot make an operation touch memory
//! outside the slot array. What it cannot prevent: a process that dies
//! between reserving and publishing on a `Multi` side stalls that side (later
//! threads wait for its tail), as in DPDK.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod burst;
mod dequeue;
mod enqueue;
mod error;
mod header;
mod headtail;
mod mode;
mod ring;
mod slots;
mod sync;

pub use burst::Burst;
pub use error::RingError;
pub use mode::{RingMode, SyncMode};
pub use ring::Ring;
