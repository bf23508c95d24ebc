//! Message buffers, as DPDK's `rte_mbuf`: a handle to one object of an
//! `ntbdk-mempool` pool, with a data offset and length, where it came from
//! (peer and queue) and a word of user metadata.
//!
//! Two kinds of pool lie under mbufs:
//! - an [`MbufPool`] the application creates (private memory, hugepages
//!   where available): it fills mbufs and sends them with
//!   [`DataQueue::tx_burst`](crate::transport::DataQueue::tx_burst);
//! - the receive pools a data queue builds over its buffers in our inbound
//!   window ([`Pool::create_over`](ntbdk_mempool::Pool::create_over)): `rx_burst` hands those buffers out in
//!   place, with no copy, and freeing one lends it back to the peer that
//!   sent into it.
//!
//! A received mbuf's bytes lie in memory the peer can write at any time, so
//! nobody gets a slice over them (rust-vmm/vm-memory's rule):
//! [`read`](Mbuf::read) and [`to_vec`](Mbuf::to_vec) copy out through raw
//! pointers (a `memcpy`, as every bulk read of a window in ntbdk is; a
//! byte the peer changes during the copy may be either value, and nothing
//! is ever read through a reference), and [`load_u8`](Mbuf::load_u8) is a
//! volatile load, for polling. Mbufs of a private pool also give
//! [`data_mut`](Mbuf::data_mut).
//!
//! An mbuf returns its object to its pool when dropped, from any thread;
//! [`free_bulk`](Mbuf::free_bulk) returns many at once. Pipeline stages pass
//! mbufs to each other through an [`MbufRing`] (an `ntbdk-ring` ring).

use std::fmt;
use std::ptr::NonNull;

mod pool;
mod pool_ref;
mod ring;

pub use pool::MbufPool;
pub use ring::{MbufConsumer, MbufProducer, MbufRing};

pub(crate) use pool_ref::{Adding, PoolRef};

use ntbdk_mempool::ObjIdx;
use pool_ref::PoolPtr;

/// One message buffer: an object of a pool, owned by this handle until it
/// is dropped, freed or sent.
pub struct Mbuf {
    /// Its pool (one counted reference, released when the mbuf goes).
    pool: PoolPtr,
    obj: ObjIdx,
    /// The object's first byte (valid while `pool` lives).
    base: NonNull<u8>,
    room: u32,
    data_off: u32,
    len: u32,
    /// Whether the bytes lie in memory a peer writes (a receive pool).
    shared: bool,
    port: u16,
    queue: u16,
    user: u64,
}

// SAFETY: an Mbuf owns its object exclusively (taken from the pool, not
// returned until drop), its pool pointer is Send + Sync and counted, and
// `base` points into memory the pool keeps mapped; nothing in it is tied to
// a thread.
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// An mbuf over object `obj` of `owner`'s pool holding `len` bytes at
    /// offset 0; `adding` counts its reference to the pool.
    ///
    /// # Safety
    /// `obj` is a handle of that pool taken as a raw handle by the caller and
    /// not returned: the mbuf becomes its only owner. `adding` was made from
    /// `owner`.
    #[inline]
    pub(crate) unsafe fn from_pool(
        owner: &PoolRef,
        adding: &mut Adding,
        obj: ObjIdx,
        len: u32,
        (port, queue): (u16, u16),
    ) -> Mbuf {
        let pool = owner.pool();
        let base = pool
            .ptr(obj)
            .expect("a handle just taken from this pool is its own");
        let room = pool.elt_size() as u32;
        adding.one();
        Mbuf {
            pool: owner.ptr(),
            obj,
            base,
            room,
            data_off: 0,
            len: len.min(room),
            shared: pool.is_external(),
            port,
            queue,
            user: 0,
        }
    }

    /// Bytes of data.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether it holds no data.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the buffer (data offset plus the most data).
    #[inline]
    pub fn data_room(&self) -> usize {
        self.room as usize
    }

    /// Where the data starts in the buffer (headroom).
    #[inline]
    pub fn data_off(&self) -> usize {
        self.data_off as usize
    }

    /// Bytes that can still be appended.
    #[inline]
    pub fn tailroom(&self) -> usize {
        (self.room - self.data_off - self.len) as usize
    }

    /// The peer it came from (received mbufs; 0 otherwise).
    #[inline]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data queue it came from (received mbufs; 0 otherwise).
    #[inline]
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// The user word: carried to the receiver with the data.
    #[inline]
    pub fn user(&self) -> u64 {
        self.user
    }

    /// Sets the user word.
    #[inline]
    pub fn set_user(&mut self, user: u64) {
        self.user = user;
    }

    /// Whether its bytes lie in memory a peer can write (a received mbuf):
    /// then only copies and loads reach them.
    #[inline]
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Empties it and moves the data start to `headroom`.
    ///
    /// # Errors
    /// [`MbufError::NoRoom`] when `headroom` exceeds the data room (the
    /// mbuf is then unchanged).
    pub fn reset(&mut self, headroom: usize) -> Result<(), MbufError> {
        let room = self.data_room();
        if headroom > room {
            return Err(MbufError::NoRoom {
                len: headroom,
                room,
            });
        }
        self.data_off = headroom as u32;
        self.len = 0;
        Ok(())
    }

    /// Sets the data length (the bytes are whatever the buffer holds).
    ///
    /// # Errors
    /// [`MbufError::NoRoom`] past the data room.
    pub fn set_len(&mut self, len: usize) -> Result<(), MbufError> {
        if len > (self.room - self.data_off) as usize {
            return Err(self.no_room(len));
        }
        self.len = len as u32;
        Ok(())
    }

    /// Appends `bytes` after the data (DPDK's `rte_pktmbuf_append` and a
    /// copy).
    ///
    /// # Errors
    /// [`MbufError::NoRoom`] when they do not fit; the mbuf is unchanged.
    pub fn append(&mut self, bytes: &[u8]) -> Result<(), MbufError> {
        if bytes.len() > self.tailroom() {
            return Err(self.no_room(self.len() + bytes.len()));
        }
        let at = self.data_off as usize + self.len as usize;
        // SAFETY: `at + bytes.len() <= room` (checked), inside the object,
        // which this mbuf owns; raw copy, so no reference is made over
        // memory a peer may write (a received buffer).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.as_ptr().add(at), bytes.len())
        };
        self.len += bytes.len() as u32;
        Ok(())
    }

    /// Copies data bytes `off .. off + out.len()` into `out`.
    ///
    /// # Errors
    /// [`MbufError::OutOfRange`] past the data.
    pub fn read(&self, off: usize, out: &mut [u8]) -> Result<(), MbufError> {
        let start = self.data_at(off, out.len())?;
        // SAFETY: `data_at` checked the range lies in the data, inside the
        // object this mbuf owns; raw copy (the bytes may be a peer's).
        unsafe { std::ptr::copy_nonoverlapping(start, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies all the data into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read(0, &mut v).expect("the whole data is in range");
        v
    }

    /// Loads data byte `off` (`None` past the data): a volatile load, for
    /// polling a byte a peer writes.
    #[inline]
    pub fn load_u8(&self, off: usize) -> Option<u8> {
        let p = self.data_at(off, 1).ok()?;
        // SAFETY: in the data (checked), inside the object this mbuf owns;
        // a volatile read of one byte makes no reference.
        Some(unsafe { p.read_volatile() })
    }

    /// The data as a slice, for mbufs of a private pool (`None` for a
    /// received mbuf, whose bytes a peer can write).
    pub fn data(&self) -> Option<&[u8]> {
        if self.shared {
            return None;
        }
        // SAFETY: private memory this mbuf owns exclusively (nobody else
        // writes it while `&self` lives); in bounds of the object.
        Some(unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().add(self.data_off as usize), self.len())
        })
    }

    /// The data as a mutable slice, for mbufs of a private pool (`None` for
    /// a received mbuf).
    pub fn data_mut(&mut self) -> Option<&mut [u8]> {
        if self.shared {
            return None;
        }
        // SAFETY: as in `data`, and `&mut self` makes the borrow unique.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.base.as_ptr().add(self.data_off as usize),
                self.len(),
            )
        })
    }

    /// Pointer to the first data byte and the data length, for copying the
    /// data out pointer to pointer (see `PeerWindow::write_from_ptr`).
    #[inline]
    pub(crate) fn data_ptr(&self) -> (*const u8, usize) {
        // SAFETY: `data_off <= room`: inside the object (or one past it).
        (
            unsafe { self.base.as_ptr().add(self.data_off as usize) },
            self.len(),
        )
    }

    /// Gives the mbuf up as plain data (for a ring slot); its object and
    /// pool handle stay taken until [`from_raw`](Mbuf::from_raw).
    #[inline]
    pub(crate) fn into_raw(self) -> RawMbuf {
        // Not dropped: its object and its reference to the pool move into
        // the raw form.
        let m = std::mem::ManuallyDrop::new(self);
        RawMbuf {
            pool: m.pool.to_bits(),
            obj: m.obj,
            base: m.base.as_ptr() as usize,
            room: m.room,
            data_off: m.data_off,
            len: m.len,
            shared: m.shared,
            port: m.port,
            queue: m.queue,
            user: m.user,
        }
    }

    /// Takes an mbuf back from its raw form.
    ///
    /// # Safety
    /// `raw` came from [`into_raw`](Mbuf::into_raw) and is taken back
    /// exactly once.
    #[inline]
    pub(crate) unsafe fn from_raw(raw: RawMbuf) -> Mbuf {
        Mbuf {
            // SAFETY: the caller's contract: the reference was given up once
            // by `into_raw` and is taken back once.
            pool: unsafe { PoolPtr::from_bits(raw.pool) },
            obj: raw.obj,
            // SAFETY: `into_raw` stored a NonNull's address.
            base: unsafe { NonNull::new_unchecked(raw.base as *mut u8) },
            room: raw.room,
            data_off: raw.data_off,
            len: raw.len,
            shared: raw.shared,
            port: raw.port,
            queue: raw.queue,
            user: raw.user,
        }
    }

    /// Returns every mbuf of `mbufs` to its pool, in bulk where consecutive
    /// mbufs share a pool (DPDK's `rte_pktmbuf_free_bulk`); `mbufs` is left
    /// empty.
    pub fn free_bulk(mbufs: &mut Vec<Mbuf>) {
        Self::free_front(mbufs, mbufs.len());
    }

    /// Returns the first `n` mbufs of `mbufs` to their pools in bulk and
    /// removes them from `mbufs`.
    pub(crate) fn free_front(mbufs: &mut Vec<Mbuf>, n: usize) {
        const CHUNK: usize = 64;
        let len = mbufs.len();
        let n = n.min(len);
        let mut hs = [ObjIdx::default(); CHUNK];
        // Read in place, not moved out one by one: their objects and pool
        // references are returned below, a run of one pool at a time, and
        // then the first `n` are removed without being dropped. Until then
        // the vector claims none of its elements, so a panic in between
        // leaks them rather than returning any twice.
        // SAFETY: shrinking the length only forgets elements; they stay
        // initialised in the buffer, read below and then overwritten or
        // reclaimed.
        unsafe { mbufs.set_len(0) };
        let base = mbufs.as_mut_ptr();
        let mut i = 0;
        while i < n {
            // SAFETY: `i < n <= len`: an initialised element, read by
            // reference while nothing else touches the buffer.
            let first = unsafe { &*base.add(i) };
            hs[0] = first.obj;
            let mut k = 1;
            while k < CHUNK && i + k < n {
                // SAFETY: as for `first`, with `i + k < n`.
                let m = unsafe { &*base.add(i + k) };
                if m.pool != first.pool {
                    break;
                }
                hs[k] = m.obj;
                k += 1;
            }
            // Each handle was owned by exactly one of these mbufs, never
            // dropped (they are removed below without a drop).
            // SAFETY: so each object is returned once, and the `k` references
            // they held are released once.
            unsafe {
                first.pool.pool().put_bulk(&hs[..k]);
                first.pool.release(k);
            }
            i += k;
        }
        // SAFETY: the first `n` elements are given up (their contents were
        // returned above); the `len - n` after them move to the front and
        // are claimed again.
        unsafe {
            std::ptr::copy(base.add(n), base, len - n);
            mbufs.set_len(len - n);
        }
    }

    /// A pointer to data bytes `off .. off + len`, checked.
    #[inline]
    fn data_at(&self, off: usize, len: usize) -> Result<*mut u8, MbufError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len() => {
                // SAFETY: `data_off + end <= room`: inside the object.
                Ok(unsafe { self.base.as_ptr().add(self.data_off as usize + off) })
            }
            _ => Err(MbufError::OutOfRange {
                off,
                len,
                data_len: self.len(),
            }),
        }
    }

    fn no_room(&self, len: usize) -> MbufError {
        MbufError::NoRoom {
            len,
            room: (self.room - self.data_off) as usize,
        }
    }
}

/// An mbuf given up as plain data (integers only, so an all-zero value is
/// a valid placeholder), to travel through a ring.
#[derive(Clone, Copy)]
pub(crate) struct RawMbuf {
    pool: usize,
    obj: ObjIdx,
    base: usize,
    room: u32,
    data_off: u32,
    len: u32,
    shared: bool,
    port: u16,
    queue: u16,
    user: u64,
}

impl RawMbuf {
    /// A placeholder for ring output buffers (never taken back).
    pub(crate) const EMPTY: RawMbuf = RawMbuf {
        pool: 0,
        obj: ObjIdx::NONE,
        base: 0,
        room: 0,
        data_off: 0,
        len: 0,
        shared: false,
        port: 0,
        queue: 0,
        user: 0,
    };
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: the mbuf owned its object and its reference to the pool,
        // and is going away: each is returned once.
        unsafe {
            self.pool.pool().put(self.obj);
            self.pool.release(1);
        }
    }
}

impl fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mbuf")
            .field("pool", &self.pool.pool().name())
            .field("index", &self.obj.index())
            .field("len", &self.len)
            .field("data_off", &self.data_off)
            .field("port", &self.port)
            .field("queue", &self.queue)
            .field("shared", &self.shared)
            .finish()
    }
}

/// What an mbuf call refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MbufError {
    /// More data than the buffer holds after its data offset.
    #[error("{len} bytes do not fit an mbuf with {room} bytes of room after its headroom")]
    NoRoom {
        /// Bytes asked for.
        len: usize,
        /// Bytes of room.
        room: usize,
    },
    /// A range past the data.
    #[error("bytes {off}..{off}+{len} are past the mbuf's {data_len} bytes of data")]
    OutOfRange {
        /// Start asked for.
        off: usize,
        /// Bytes asked for.
        len: usize,
        /// Bytes of data.
        data_len: usize,
    },
}
