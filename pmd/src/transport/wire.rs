//! The wire format: every message is one 64-byte slot, a 56-byte body and an
//! 8-byte tag written last.
//!
//! [`decode`] turns a body copied out of the window into a [`Msg`], checking
//! its structure (known op code, reserved bytes zero, counts in range);
//! [`validate`] then checks it against what the receiving queue accepts and
//! the window's bounds. Both are total functions over arbitrary bytes: they
//! never panic, which the property tests and the fuzz target check.
//!
//! Body layout (little endian):
//!
//! | bytes | scalar messages | SGL messages | inline send |
//! | --- | --- | --- | --- |
//! | 0 | op code | op code | op code |
//! | 1 | status (0 where unused) | entry count 1..=5 | payload length 0..=48 |
//! | 2..4 | zero | zero (`ChainSgl`: origin port) | zero |
//! | 4..8 | `a`: rkey / buffer index / next+1 / origin | byte offset of the first entry in the transfer | zero |
//! | 8..16 | op id | op id | payload 0..8 |
//! | 16..24 | `b`: remote offset / previous port | entry 0 | payload 8..16 |
//! | 24..28 | `c`: length | entries 1..5 (8 bytes each: offset << 24 \| length) | payload 16..48 |
//! | 28..56 | zero | | |

use super::dataqueues::DataQueues;

/// Bytes per queue slot (one cache line).
pub const SLOT: usize = 64;
/// Bytes of a slot's body (the tag takes the last 8).
pub const BODY: usize = 56;
/// Offset of the tag within a slot.
pub const TAG_OFFSET: usize = 56;
/// SGL entries per message.
pub const SGES_PER_MSG: usize = 5;
/// Largest payload carried inline in a send slot.
pub const INLINE_MAX: usize = 48;
/// Most consecutive slots one inline send spans (a head and up to three
/// continuation slots).
pub const INLINE_SLOTS_MAX: usize = 4;
/// Largest payload carried inline in consecutive send slots: 48 bytes in
/// the head, 56 in each continuation slot.
pub const INLINE_LONG_MAX: usize = INLINE_MAX + (INLINE_SLOTS_MAX - 1) * BODY;
/// Largest length of one SGL entry (24 bits).
pub const SGE_MAX_LEN: u32 = (1 << 24) - 1;
/// Longest entry [`chunk_sgl`] makes: [`SGE_MAX_LEN`] rounded down to the
/// region grain (64 bytes), so that a long extent splits into entries a
/// target's storage check accepts (each at least a grain, and the pieces
/// of an extent all whole grains but its last).
pub const SGE_CHUNK_LEN: u32 = SGE_MAX_LEN / 64 * 64;
const _: () = assert!((SGE_CHUNK_LEN as u64).is_multiple_of(super::region::GRAIN));
/// Largest window offset of an SGL entry (40 bits).
pub const SGE_MAX_OFFSET: u64 = (1 << 40) - 1;

// The slot layout, checked at compile time: a body and its tag fill one
// cache line, the tag is the slot's last word (8-byte aligned, so one
// release store publishes it), an SGL message's entries fit its body, and a
// run of inline slots fits a body per slot after the head.
const _: () = assert!(BODY + 8 == SLOT && TAG_OFFSET == BODY && TAG_OFFSET.is_multiple_of(8));
const _: () = assert!(24 + (SGES_PER_MSG - 1) * 8 <= BODY);
const _: () = assert!(8 + INLINE_MAX == BODY && INLINE_LONG_MAX <= u8::MAX as usize);
const _: () = assert!(SGE_MAX_OFFSET < (1 << 40) && SGE_MAX_LEN < (1 << 24));

/// A message body as it sits in a slot.
pub type Body = [u8; BODY];

/// One SGL entry: `len` bytes at `offset` of a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireSge {
    /// Window offset.
    pub offset: u64,
    /// Length in bytes (1..=[`SGE_MAX_LEN`]).
    pub len: u32,
}

/// The status a peer reports in an [`Msg::Ack`] or [`Msg::ReadSize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WireStatus {
    /// Success.
    Ok = 0,
    /// Bad key, permission or range.
    Access = 1,
    /// A protocol violation seen by the peer.
    Protocol = 2,
    /// No room (region area full, object too large).
    NoRoom = 3,
}

impl WireStatus {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Ok,
            1 => Self::Access,
            2 => Self::Protocol,
            3 => Self::NoRoom,
            _ => return None,
        })
    }
}

/// Op codes.
pub mod code {
    /// [`super::Msg::WriteReq`].
    pub const WRITE_REQ: u8 = 0x01;
    /// [`super::Msg::Sgl`].
    pub const SGL: u8 = 0x02;
    /// [`super::Msg::Done`].
    pub const DONE: u8 = 0x03;
    /// [`super::Msg::Ack`].
    pub const ACK: u8 = 0x04;
    /// [`super::Msg::ReadReq`].
    pub const READ_REQ: u8 = 0x05;
    /// [`super::Msg::ReadSgl`].
    pub const READ_SGL: u8 = 0x06;
    /// [`super::Msg::ReadIntent`].
    pub const READ_INTENT: u8 = 0x07;
    /// [`super::Msg::ReadSize`].
    pub const READ_SIZE: u8 = 0x08;
    /// [`super::Msg::Rts`].
    pub const RTS: u8 = 0x09;
    /// [`super::Msg::ChainRts`].
    pub const CHAIN_RTS: u8 = 0x0a;
    /// [`super::Msg::ChainSgl`].
    pub const CHAIN_SGL: u8 = 0x0b;
    /// [`super::Msg::ChainDone`].
    pub const CHAIN_DONE: u8 = 0x0c;
    /// [`super::Msg::SendInline`].
    pub const SEND_INLINE: u8 = 0x10;
    /// [`super::Msg::SendBuf`].
    pub const SEND_BUF: u8 = 0x11;
    /// Head of a multi-slot inline send (see
    /// [`super::encode_inline_slots`]); not a message on its own.
    pub const SEND_INLINE_LONG: u8 = 0x12;
    /// [`super::Msg::Advertise`].
    pub const ADVERTISE: u8 = 0x0d;
    /// [`super::Msg::Revoke`].
    pub const REVOKE: u8 = 0x0e;
    /// [`super::Msg::RevokeAck`].
    pub const REVOKE_ACK: u8 = 0x0f;
    /// [`super::Msg::WriteImm`].
    pub const WRITE_IMM: u8 = 0x13;
    /// [`super::Msg::Cancel`].
    pub const CANCEL: u8 = 0x14;
    /// [`super::Msg::ChainRelease`].
    pub const CHAIN_RELEASE: u8 = 0x15;
}

/// A decoded message. `op` is always the initiator's operation id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Msg {
    /// Initiator → target RX: intent to write `len` bytes at `roff` of region `rkey`.
    WriteReq {
        /// Op id.
        op: u64,
        /// Target region key.
        rkey: u32,
        /// Offset in the region.
        roff: u64,
        /// Bytes.
        len: u32,
    },
    /// Target → initiator TX: where bytes `start..` of the transfer go
    /// (write clear-to-send, multicast clear-to-send).
    Sgl {
        /// Op id.
        op: u64,
        /// Transfer offset of the first entry.
        start: u32,
        /// Number of valid entries.
        n: u8,
        /// Entries (window offsets in the target's window).
        sges: [WireSge; SGES_PER_MSG],
    },
    /// Initiator → target CQ: the data of op `op` is in place.
    Done {
        /// Op id.
        op: u64,
        /// Bytes written.
        len: u32,
    },
    /// Target → initiator CQ: op finished (received / read done / refused).
    Ack {
        /// Op id.
        op: u64,
        /// Outcome.
        status: WireStatus,
        /// Bytes.
        len: u32,
    },
    /// Initiator → target TX: read `len` bytes at `roff` of region `rkey`;
    /// the destination SGL follows in [`Msg::ReadSgl`] messages.
    ReadReq {
        /// Op id.
        op: u64,
        /// Target region key.
        rkey: u32,
        /// Offset in the region.
        roff: u64,
        /// Bytes.
        len: u32,
    },
    /// Initiator → target TX: part of a read's destination SGL (offsets in
    /// the initiator's window).
    ReadSgl {
        /// Op id.
        op: u64,
        /// Transfer offset of the first entry.
        start: u32,
        /// Number of valid entries.
        n: u8,
        /// Entries.
        sges: [WireSge; SGES_PER_MSG],
    },
    /// Initiator → target TX: how big is region `rkey` from `roff` on?
    ReadIntent {
        /// Op id.
        op: u64,
        /// Target region key.
        rkey: u32,
        /// Offset in the region.
        roff: u64,
    },
    /// Target → initiator RX: the size asked for by a [`Msg::ReadIntent`].
    ReadSize {
        /// Op id.
        op: u64,
        /// Outcome.
        status: WireStatus,
        /// Bytes available.
        len: u32,
    },
    /// Initiator → target RX: multicast request to send `len` bytes.
    Rts {
        /// Op id.
        op: u64,
        /// Bytes.
        len: u32,
    },
    /// Initiator → target RX: multicast request to send down a chain
    /// (store and forward): the target sends its storage to `prev` and,
    /// once it has the data, forwards it to `next`.
    ChainRts {
        /// Op id.
        op: u64,
        /// Bytes.
        len: u32,
        /// The port this target receives from (the initiator or a target).
        prev: u16,
        /// The port this target forwards to, if any.
        next: Option<u16>,
    },
    /// Target → previous target TX: the storage of the next target in a
    /// chain (offsets in the sender's window), for op `op` of `origin`.
    ChainSgl {
        /// Op id (the initiator's).
        op: u64,
        /// The initiator.
        origin: u16,
        /// Transfer offset of the first entry.
        start: u32,
        /// Number of valid entries.
        n: u8,
        /// Entries.
        sges: [WireSge; SGES_PER_MSG],
    },
    /// Target → next target CQ: the data of chain op `op` of `origin` is
    /// deposited; store it, forward it, acknowledge to the origin.
    ChainDone {
        /// Op id (the initiator's).
        op: u64,
        /// The initiator.
        origin: u16,
        /// Bytes.
        len: u32,
    },
    /// Target → initiator TX: region `rkey` (remote-write) is `len` bytes
    /// at `offset` of the target's window; the initiator may write into it
    /// directly (one-sided) until it is revoked.
    Advertise {
        /// Region key.
        rkey: u32,
        /// Window offset of the region's first byte.
        offset: u64,
        /// Its length.
        len: u32,
    },
    /// Target → initiator TX: region `rkey` is no longer advertised; the
    /// initiator answers [`Msg::RevokeAck`] once it will write no more.
    Revoke {
        /// Region key.
        rkey: u32,
    },
    /// Initiator → target CQ: we forgot region `rkey` (after a revoke).
    RevokeAck {
        /// Region key.
        rkey: u32,
    },
    /// Initiator → target RX: a one-sided write of `len` bytes at `roff` of
    /// region `rkey` is in place (written before this message); tell the
    /// application, with `imm` (write with immediate).
    WriteImm {
        /// Region key.
        rkey: u32,
        /// Offset in the region.
        roff: u64,
        /// Bytes written.
        len: u32,
        /// The initiator's immediate value.
        imm: u64,
    },
    /// Initiator → target RX: multicast `op` will put nothing (it failed
    /// before its data was sent: another target refused it, or it timed
    /// out); the storage allocated for it goes now, not at the target's
    /// own timeout.
    Cancel {
        /// Op id (the initiator's).
        op: u64,
    },
    /// Target → next target CQ: we will never write the storage the next
    /// target sent us for chain op `op` of `origin` (we refused the
    /// request, or it was cancelled): it may go now.
    ChainRelease {
        /// Op id (the initiator's).
        op: u64,
        /// The initiator.
        origin: u16,
    },
    /// Sender → receiver PostQ: a small payload carried in the slot.
    SendInline {
        /// Payload length.
        len: u8,
        /// Payload (first `len` bytes valid).
        data: [u8; INLINE_MAX],
    },
    /// Sender → receiver PostQ: `len` bytes in eager buffer `buf`.
    SendBuf {
        /// Eager buffer index.
        buf: u32,
        /// Bytes.
        len: u32,
    },
}

/// Why a body failed to decode or validate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Unknown op code.
    #[error("unknown op code {0:#x}")]
    UnknownCode(u8),
    /// A reserved byte or unused field is not zero, or a count is out of range.
    #[error("malformed message")]
    Malformed,
    /// The message is not allowed on the queue it arrived on.
    #[error("message not allowed on this queue")]
    WrongQueue,
    /// A length or offset is out of range.
    #[error("length or offset out of range")]
    OutOfRange,
}

#[inline]
fn u32_at(b: &Body, at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn u64_at(b: &Body, at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

#[inline]
fn put_u32(b: &mut Body, at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
fn put_u64(b: &mut Body, at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn scalar(code: u8, status: u8, a: u32, op: u64, b: u64, c: u32) -> Body {
    let mut body = [0u8; BODY];
    body[0] = code;
    body[1] = status;
    put_u32(&mut body, 4, a);
    put_u64(&mut body, 8, op);
    put_u64(&mut body, 16, b);
    put_u32(&mut body, 24, c);
    body
}

fn sgl(code: u8, op: u64, start: u32, n: u8, sges: &[WireSge; SGES_PER_MSG]) -> Body {
    let mut body = [0u8; BODY];
    body[0] = code;
    body[1] = n;
    put_u32(&mut body, 4, start);
    put_u64(&mut body, 8, op);
    for (i, s) in sges.iter().take(n as usize).enumerate() {
        put_u64(&mut body, 16 + 8 * i, (s.offset << 24) | u64::from(s.len));
    }
    body
}

/// Encodes `msg` into a slot body.
pub fn encode(msg: &Msg) -> Body {
    match *msg {
        Msg::WriteReq {
            op,
            rkey,
            roff,
            len,
        } => scalar(code::WRITE_REQ, 0, rkey, op, roff, len),
        Msg::Sgl { op, start, n, sges } => sgl(code::SGL, op, start, n, &sges),
        Msg::Done { op, len } => scalar(code::DONE, 0, 0, op, 0, len),
        Msg::Ack { op, status, len } => scalar(code::ACK, status as u8, 0, op, 0, len),
        Msg::ReadReq {
            op,
            rkey,
            roff,
            len,
        } => scalar(code::READ_REQ, 0, rkey, op, roff, len),
        Msg::ReadSgl { op, start, n, sges } => sgl(code::READ_SGL, op, start, n, &sges),
        Msg::ReadIntent { op, rkey, roff } => scalar(code::READ_INTENT, 0, rkey, op, roff, 0),
        Msg::ReadSize { op, status, len } => scalar(code::READ_SIZE, status as u8, 0, op, 0, len),
        Msg::Rts { op, len } => scalar(code::RTS, 0, 0, op, 0, len),
        Msg::ChainRts {
            op,
            len,
            prev,
            next,
        } => scalar(
            code::CHAIN_RTS,
            0,
            next.map_or(0, |n| u32::from(n) + 1),
            op,
            u64::from(prev),
            len,
        ),
        Msg::ChainSgl {
            op,
            origin,
            start,
            n,
            sges,
        } => {
            let mut b = sgl(code::CHAIN_SGL, op, start, n, &sges);
            b[2..4].copy_from_slice(&origin.to_le_bytes());
            b
        }
        Msg::ChainDone { op, origin, len } => {
            scalar(code::CHAIN_DONE, 0, u32::from(origin), op, 0, len)
        }
        Msg::SendInline { len, data } => {
            let mut body = [0u8; BODY];
            body[0] = code::SEND_INLINE;
            body[1] = len;
            let n = (len as usize).min(INLINE_MAX);
            body[8..8 + n].copy_from_slice(&data[..n]);
            body
        }
        Msg::SendBuf { buf, len } => scalar(code::SEND_BUF, 0, buf, 0, 0, len),
        Msg::Advertise { rkey, offset, len } => scalar(code::ADVERTISE, 0, rkey, 0, offset, len),
        Msg::Revoke { rkey } => scalar(code::REVOKE, 0, rkey, 0, 0, 0),
        Msg::RevokeAck { rkey } => scalar(code::REVOKE_ACK, 0, rkey, 0, 0, 0),
        Msg::WriteImm {
            rkey,
            roff,
            len,
            imm,
        } => scalar(code::WRITE_IMM, 0, rkey, imm, roff, len),
        Msg::Cancel { op } => scalar(code::CANCEL, 0, 0, op, 0, 0),
        Msg::ChainRelease { op, origin } => {
            scalar(code::CHAIN_RELEASE, 0, u32::from(origin), op, 0, 0)
        }
    }
}

/// Slots an inline send of `len` bytes takes (1 up to [`INLINE_MAX`]
/// bytes; `None` above [`INLINE_LONG_MAX`]).
#[inline]
pub fn inline_slots(len: usize) -> Option<usize> {
    match len {
        0..=INLINE_MAX => Some(1),
        l if l <= INLINE_LONG_MAX => Some(1 + (l - INLINE_MAX).div_ceil(BODY)),
        _ => None,
    }
}

/// Encodes an inline send of `payload` (at most [`INLINE_LONG_MAX`] bytes)
/// into consecutive slot bodies; returns how many (`None` when too long).
///
/// Up to [`INLINE_MAX`] bytes it is one [`Msg::SendInline`] slot. Longer, a
/// head slot (op code [`code::SEND_INLINE_LONG`], the length in byte 1, the
/// first 48 payload bytes at 8..56) is followed by continuation slots of 56
/// payload bytes each, unused bytes zero. The sender writes the
/// continuation slots first and the head last
/// (`Producer::write_ahead`); the receiver takes
/// the run once every slot's own tag is there and validates it as a unit,
/// in place in its ring ([`inline_first_word`], [`zero_from`]; on copied
/// bodies, [`decode_inline_head`] and [`gather_inline`]).
///
/// # Example
/// ```
/// use ntbdk_pmd::transport::wire::{self, BODY, INLINE_SLOTS_MAX};
/// let payload: Vec<u8> = (0..100).collect();
/// let mut slots = [[0u8; BODY]; INLINE_SLOTS_MAX];
/// let n = wire::encode_inline_slots(&payload, &mut slots).unwrap();
/// assert_eq!(n, 2);
/// let (len, k) = wire::decode_inline_head(&slots[0]).unwrap();
/// assert_eq!((len, k), (100, 2));
/// let mut out = [0u8; wire::INLINE_LONG_MAX];
/// assert_eq!(wire::gather_inline(&slots[0], &slots[1..n], &mut out), Ok(100));
/// assert_eq!(&out[..100], &payload[..]);
/// ```
#[cfg(any(test, feature = "internals"))]
pub fn encode_inline_slots(payload: &[u8], out: &mut [Body; INLINE_SLOTS_MAX]) -> Option<usize> {
    let n = inline_slots(payload.len())?;
    for (k, body) in out[..n].iter_mut().enumerate() {
        *body = words_body(&inline_slot_words(payload, k));
    }
    Some(n)
}

/// A slot body as seven little-endian words: the form a sender stores it
/// in, one 8-byte store a word. (Building a body byte by byte and copying
/// it out with wide loads stalls on store forwarding; words do not.)
pub type Words = [u64; BODY / 8];

/// Slot `k` of the inline encoding of `payload` (see
/// [`encode_inline_slots`]) as [`Words`], read straight from the payload.
/// `k` past the encoding's last slot, or a payload longer than
/// [`INLINE_LONG_MAX`], gives a slot of zero words.
///
/// # Example
/// ```
/// use ntbdk_pmd::transport::wire::{self, BODY, INLINE_SLOTS_MAX};
/// let payload: Vec<u8> = (0..64).collect();
/// let mut slots = [[0u8; BODY]; INLINE_SLOTS_MAX];
/// let n = wire::encode_inline_slots(&payload, &mut slots).unwrap();
/// for k in 0..n {
///     assert_eq!(wire::words_body(&wire::inline_slot_words(&payload, k)), slots[k]);
/// }
/// ```
#[cfg(any(test, feature = "internals"))]
pub fn inline_slot_words(payload: &[u8], k: usize) -> Words {
    build_inline_slot_words(payload, k)
}

/// [`inline_slot_words`]: slot `k`'s words built one at a time from the
/// payload. The reference [`encode_inline_words`] is tested against, and
/// its encoder on a big-endian host.
#[cfg(any(test, feature = "internals", not(target_endian = "little")))]
#[inline(always)]
pub(crate) fn build_inline_slot_words(payload: &[u8], k: usize) -> Words {
    let mut w = [0u64; BODY / 8];
    let len = payload.len();
    if len > INLINE_LONG_MAX {
        return w;
    }
    if k == 0 {
        let code = if len <= INLINE_MAX {
            code::SEND_INLINE
        } else {
            code::SEND_INLINE_LONG
        };
        w[0] = u64::from(code) | (len as u64) << 8;
        fill_words(&mut w[1..], &payload[..len.min(INLINE_MAX)]);
    } else {
        let start = (INLINE_MAX + (k - 1) * BODY).min(len);
        fill_words(&mut w, &payload[start..(start + BODY).min(len)]);
    }
    w
}

/// The inline encoding of `payload` (see [`encode_inline_slots`]) written
/// into `out`, one entry per slot, `out.len()` being
/// [`inline_slots`]`(payload.len())`: for each `k`, the words of
/// [`build_inline_slot_words`]`(payload, k)`. On a little-endian host those
/// words are, as bytes, the header word and then the payload contiguous
/// across the entries (a head's 48 bytes after its header, whole 56-byte
/// continuation bodies), zero after: one copy of the payload into our own
/// memory instead of a word at a time. A payload longer than the entries
/// hold is cut (the caller sizes `out` from its length).
#[inline(always)]
pub(crate) fn encode_inline_words(payload: &[u8], out: &mut [Words]) {
    #[cfg(target_endian = "little")]
    {
        let len = payload.len();
        let Some(last) = out.last_mut() else {
            return;
        };
        *last = [0; BODY / 8];
        let n = len.min(out.len() * BODY - 8);
        // `out` is `out.len() * BODY` bytes of our own memory (words viewed
        // as bytes: any bytes make valid words); bytes `8 .. 8 + n` lie
        // inside it (`n <= out.len() * BODY - 8`); the payload is
        // `len >= n` readable bytes of the caller's memory, apart from `out`.
        // SAFETY: as just said.
        unsafe {
            crate::hw::copy::move_bytes(payload.as_ptr(), out.as_mut_ptr().cast::<u8>().add(8), n);
        }
        let code = if len <= INLINE_MAX {
            code::SEND_INLINE
        } else {
            code::SEND_INLINE_LONG
        };
        out[0][0] = u64::from(code) | (len as u64) << 8;
    }
    #[cfg(not(target_endian = "little"))]
    for (k, w) in out.iter_mut().enumerate() {
        *w = build_inline_slot_words(payload, k);
    }
}

/// Fills `w` with `bytes` as little-endian words, zero-padded. Each word is
/// built in a register (whole 8-byte loads, a partial one by shifts) and
/// stored at a fixed index, so the words can stay in registers until they
/// are written out: no byte stores to forward from.
#[cfg(any(test, feature = "internals", not(target_endian = "little")))]
#[inline(always)]
fn fill_words(w: &mut [u64], bytes: &[u8]) {
    let len = bytes.len();
    for (i, d) in w.iter_mut().enumerate() {
        let at = 8 * i;
        *d = match bytes.get(at..at + 8) {
            Some(full) => u64::from_le_bytes(full.try_into().unwrap_or([0; 8])),
            None if at < len => bytes[at..]
                .iter()
                .rev()
                .fold(0u64, |a, &b| a << 8 | u64::from(b)),
            None => 0,
        };
    }
}

/// The words of a body (see [`Words`]).
#[inline]
pub fn body_words(b: &Body) -> Words {
    let mut w = [0u64; BODY / 8];
    for (d, c) in w.iter_mut().zip(b.chunks_exact(8)) {
        *d = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    }
    w
}

/// The body of some words (see [`Words`]).
#[inline]
#[cfg(any(test, feature = "internals"))]
pub fn words_body(w: &Words) -> Body {
    let mut b = [0u8; BODY];
    for (c, d) in b.chunks_exact_mut(8).zip(w) {
        c.copy_from_slice(&d.to_le_bytes());
    }
    b
}

/// The first word of a slot that starts an inline send (op code, length,
/// six reserved bytes), checked: `None` when the op code is not an inline
/// send's; else the payload length and the number of slots (head
/// included), or why the word is refused. One slot
/// ([`code::SEND_INLINE`]) carries up to [`INLINE_MAX`] bytes; a run's head
/// ([`code::SEND_INLINE_LONG`]) more, up to [`INLINE_LONG_MAX`]. The
/// receiver reads this word in place in its ring, and the bytes after the
/// payload with [`zero_from`].
#[inline]
pub fn inline_first_word(w0: u64) -> Option<Result<(usize, usize), WireError>> {
    let len = (w0 >> 8) as u8 as usize;
    let reserved_zero = w0 >> 16 == 0;
    let slots = match w0 as u8 {
        // No sender makes an empty send (`SendSize`), as none makes an
        // empty `SendBuf`.
        code::SEND_INLINE if (1..=INLINE_MAX).contains(&len) => Some(1),
        code::SEND_INLINE_LONG if len > INLINE_MAX => inline_slots(len),
        code::SEND_INLINE | code::SEND_INLINE_LONG => None,
        _ => return None,
    };
    Some(match slots {
        Some(k) if reserved_zero => Ok((len, k)),
        _ => Err(WireError::Malformed),
    })
}

/// Bytes of the last slot's body an inline send of `len` bytes in `slots`
/// slots uses (a lone slot's 8 header bytes included): every byte after
/// them is zero in a valid send.
#[inline]
pub fn inline_last_used(len: usize, slots: usize) -> usize {
    if slots <= 1 {
        8 + len
    } else {
        len - INLINE_MAX - (slots - 2) * BODY
    }
}

/// Whether the body bytes from `from` to its end are all zero, the body
/// given by its little-endian words (`word(i)`, `i < BODY / 8`): a body
/// copied out, or one read in place.
#[inline]
pub fn zero_from(from: usize, word: impl Fn(usize) -> u64) -> bool {
    let mut i = from / 8;
    let mut acc = 0;
    if !from.is_multiple_of(8) && i < BODY / 8 {
        acc |= word(i) >> (8 * (from % 8));
        i += 1;
    }
    while i < BODY / 8 {
        acc |= word(i);
        i += 1;
    }
    acc == 0
}

/// Word `i` of a body (little-endian), for [`zero_from`].
#[inline]
fn body_word(b: &Body, i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or([0xff; 8]))
}

/// Checks the head of a multi-slot inline send: op code, reserved bytes
/// zero, length above [`INLINE_MAX`] and at most [`INLINE_LONG_MAX`].
/// Returns the payload length and the number of slots (head included).
///
/// Never panics, whatever the bytes.
#[cfg(any(test, feature = "internals"))]
pub fn decode_inline_head(b: &Body) -> Result<(usize, usize), WireError> {
    if b[0] != code::SEND_INLINE_LONG {
        return Err(WireError::UnknownCode(b[0]));
    }
    inline_first_word(body_word(b, 0)).unwrap_or(Err(WireError::Malformed))
}

/// Gathers the payload of a multi-slot inline send from its head and its
/// continuation slots into `out`, after checking the head
/// ([`decode_inline_head`]), the number of continuation slots and that
/// every byte past the payload is zero. Returns the payload length.
///
/// Never panics, whatever the bytes.
#[cfg(any(test, feature = "internals"))]
pub fn gather_inline(
    head: &Body,
    conts: &[Body],
    out: &mut [u8; INLINE_LONG_MAX],
) -> Result<usize, WireError> {
    let (len, slots) = decode_inline_head(head)?;
    if conts.len() != slots - 1 {
        return Err(WireError::Malformed);
    }
    out[..INLINE_MAX].copy_from_slice(&head[8..]);
    let mut at = INLINE_MAX;
    for b in conts {
        let n = (len - at).min(BODY);
        if !zero_from(n, |i| body_word(b, i)) {
            return Err(WireError::Malformed);
        }
        out[at..at + n].copy_from_slice(&b[..n]);
        at += n;
    }
    Ok(len)
}

/// Whether every byte of `s` is zero, eight at a time (validation runs on
/// every received slot).
#[inline]
fn all_zero(s: &[u8]) -> bool {
    let mut words = s.chunks_exact(8);
    let acc = words.by_ref().fold(0u64, |a, w| {
        a | u64::from_ne_bytes(w.try_into().unwrap_or([1; 8]))
    });
    acc == 0 && words.remainder().iter().all(|&x| x == 0)
}

fn decode_scalar(b: &Body, uses_a: bool, uses_b: bool, uses_c: bool) -> Result<(), WireError> {
    let zero = |r: std::ops::Range<usize>| all_zero(&b[r]);
    let ok = b[2] == 0
        && b[3] == 0
        && (uses_a || zero(4..8))
        && (uses_b || zero(16..24))
        && (uses_c || zero(24..28))
        && zero(28..56);
    if ok {
        Ok(())
    } else {
        Err(WireError::Malformed)
    }
}

fn decode_sgl(
    b: &Body,
    with_origin: bool,
) -> Result<(u64, u32, u8, [WireSge; SGES_PER_MSG]), WireError> {
    let n = b[1];
    if n == 0 || n as usize > SGES_PER_MSG || (!with_origin && (b[2] != 0 || b[3] != 0)) {
        return Err(WireError::Malformed);
    }
    let mut sges = [WireSge::default(); SGES_PER_MSG];
    for (i, s) in sges.iter_mut().enumerate() {
        let raw = u64_at(b, 16 + 8 * i);
        if i < n as usize {
            let len = (raw & u64::from(SGE_MAX_LEN)) as u32;
            if len == 0 {
                return Err(WireError::Malformed);
            }
            *s = WireSge {
                offset: raw >> 24,
                len,
            };
        } else if raw != 0 {
            return Err(WireError::Malformed);
        }
    }
    Ok((u64_at(b, 8), u32_at(b, 4), n, sges))
}

/// Decodes a body copied out of a slot, checking its structure only.
///
/// Never panics, whatever the bytes.
pub fn decode(b: &Body) -> Result<Msg, WireError> {
    let (status, a, op, bb, c) = (
        b[1],
        u32_at(b, 4),
        u64_at(b, 8),
        u64_at(b, 16),
        u32_at(b, 24),
    );
    let st = || WireStatus::from_u8(status).ok_or(WireError::Malformed);
    let no_status = || {
        if status == 0 {
            Ok(())
        } else {
            Err(WireError::Malformed)
        }
    };
    Ok(match b[0] {
        code::WRITE_REQ => {
            no_status()?;
            decode_scalar(b, true, true, true)?;
            Msg::WriteReq {
                op,
                rkey: a,
                roff: bb,
                len: c,
            }
        }
        code::SGL => {
            let (op, start, n, sges) = decode_sgl(b, false)?;
            Msg::Sgl { op, start, n, sges }
        }
        code::DONE => {
            no_status()?;
            decode_scalar(b, false, false, true)?;
            Msg::Done { op, len: c }
        }
        code::ACK => {
            let status = st()?;
            decode_scalar(b, false, false, true)?;
            Msg::Ack { op, status, len: c }
        }
        code::READ_REQ => {
            no_status()?;
            decode_scalar(b, true, true, true)?;
            Msg::ReadReq {
                op,
                rkey: a,
                roff: bb,
                len: c,
            }
        }
        code::READ_SGL => {
            let (op, start, n, sges) = decode_sgl(b, false)?;
            Msg::ReadSgl { op, start, n, sges }
        }
        code::READ_INTENT => {
            no_status()?;
            decode_scalar(b, true, true, false)?;
            Msg::ReadIntent {
                op,
                rkey: a,
                roff: bb,
            }
        }
        code::READ_SIZE => {
            let status = st()?;
            decode_scalar(b, false, false, true)?;
            Msg::ReadSize { op, status, len: c }
        }
        code::RTS => {
            no_status()?;
            decode_scalar(b, false, false, true)?;
            Msg::Rts { op, len: c }
        }
        code::CHAIN_RTS => {
            no_status()?;
            decode_scalar(b, true, true, true)?;
            let prev = u16::try_from(bb).map_err(|_| WireError::Malformed)?;
            let next = match a {
                0 => None,
                x => Some(u16::try_from(x - 1).map_err(|_| WireError::Malformed)?),
            };
            Msg::ChainRts {
                op,
                len: c,
                prev,
                next,
            }
        }
        code::CHAIN_SGL => {
            let (op, start, n, sges) = decode_sgl(b, true)?;
            let origin = u16::from_le_bytes([b[2], b[3]]);
            Msg::ChainSgl {
                op,
                origin,
                start,
                n,
                sges,
            }
        }
        code::CHAIN_DONE => {
            no_status()?;
            decode_scalar(b, true, false, true)?;
            let origin = u16::try_from(a).map_err(|_| WireError::Malformed)?;
            Msg::ChainDone { op, origin, len: c }
        }
        code::SEND_INLINE => {
            let (len, _) =
                inline_first_word(body_word(b, 0)).unwrap_or(Err(WireError::Malformed))?;
            if !zero_from(inline_last_used(len, 1), |i| body_word(b, i)) {
                return Err(WireError::Malformed);
            }
            let mut data = [0u8; INLINE_MAX];
            data.copy_from_slice(&b[8..56]);
            Msg::SendInline { len: status, data }
        }
        code::SEND_BUF => {
            no_status()?;
            if op != 0 {
                return Err(WireError::Malformed);
            }
            decode_scalar(b, true, false, true)?;
            Msg::SendBuf { buf: a, len: c }
        }
        code::ADVERTISE => {
            no_status()?;
            decode_scalar(b, true, true, true)?;
            if op != 0 {
                return Err(WireError::Malformed);
            }
            Msg::Advertise {
                rkey: a,
                offset: bb,
                len: c,
            }
        }
        code::REVOKE | code::REVOKE_ACK => {
            no_status()?;
            decode_scalar(b, true, false, false)?;
            if op != 0 {
                return Err(WireError::Malformed);
            }
            if b[0] == code::REVOKE {
                Msg::Revoke { rkey: a }
            } else {
                Msg::RevokeAck { rkey: a }
            }
        }
        code::WRITE_IMM => {
            no_status()?;
            decode_scalar(b, true, true, true)?;
            Msg::WriteImm {
                rkey: a,
                roff: bb,
                len: c,
                imm: op,
            }
        }
        code::CANCEL => {
            no_status()?;
            decode_scalar(b, false, false, false)?;
            Msg::Cancel { op }
        }
        code::CHAIN_RELEASE => {
            no_status()?;
            decode_scalar(b, true, false, false)?;
            let origin = u16::try_from(a).map_err(|_| WireError::Malformed)?;
            Msg::ChainRelease { op, origin }
        }
        other => return Err(WireError::UnknownCode(other)),
    })
}

impl Msg {
    /// The op id of the receiver's own operation this message answers (a
    /// target's SGL, ack or size), if it is such an answer: a malformed
    /// answer then fails that operation at once instead of leaving it to
    /// its timeout.
    pub fn answer_to(&self) -> Option<u64> {
        match self {
            Msg::Sgl { op, .. } | Msg::Ack { op, .. } | Msg::ReadSize { op, .. } => Some(*op),
            _ => None,
        }
    }
}

/// Which ring of a peer's section a message travels on: the one spelling of
/// "which ring" in the transport (credit words, producers and consumers are
/// indexed by it, the validator routes by it, the injector writes into it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ring {
    /// RX: "prepare to receive" (intents, requests to send).
    Rx = 0,
    /// TX: "prepare to send" (SGLs, read requests).
    Tx = 1,
    /// CQ: "done" / "received" (dones, acks).
    Cq = 2,
    /// PostQ: eager sends (inline, or naming an eager buffer).
    PostQ = 3,
}

impl Ring {
    /// Every ring, in the order of the credit words.
    pub const ALL: [Ring; 4] = [Ring::Rx, Ring::Tx, Ring::Cq, Ring::PostQ];
    /// The rings that carry control messages (everything but sends), in
    /// the order a poll drains them: completions first, so an operation
    /// finishes before new work for it is served.
    pub const CONTROL: [Ring; 3] = [Ring::Cq, Ring::Tx, Ring::Rx];

    /// The ring's index: its credit word, producer and consumer.
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// What [`validate`] checks a message against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest transfer length accepted.
    pub max_len: u32,
    /// First byte of the region area of the window an SGL points into.
    pub region_start: u64,
    /// Length of the window an SGL points into.
    pub window_len: u64,
    /// Eager buffers per sender.
    pub eager_count: u32,
    /// Bytes per eager buffer.
    pub eager_size: u32,
}

/// Checks a decoded message against the queue it arrived on and `limits`:
/// routing, lengths, SGL entries inside the region area and within the
/// transfer, eager buffer index and length. Stateful checks (op ids, keys,
/// permissions) are the transport's; this one needs no state and never panics.
pub fn validate(msg: &Msg, queue: Ring, limits: &Limits) -> Result<(), WireError> {
    let allowed = match msg {
        Msg::WriteReq { .. }
        | Msg::Rts { .. }
        | Msg::ChainRts { .. }
        | Msg::ReadSize { .. }
        | Msg::WriteImm { .. }
        | Msg::Cancel { .. } => Ring::Rx,
        Msg::Advertise { .. } | Msg::Revoke { .. } => Ring::Tx,
        Msg::RevokeAck { .. } => Ring::Cq,
        Msg::ChainSgl { .. } => Ring::Tx,
        Msg::ChainDone { .. } | Msg::ChainRelease { .. } => Ring::Cq,
        Msg::Sgl { .. } | Msg::ReadReq { .. } | Msg::ReadSgl { .. } | Msg::ReadIntent { .. } => {
            Ring::Tx
        }
        Msg::Done { .. } | Msg::Ack { .. } => Ring::Cq,
        Msg::SendInline { .. } | Msg::SendBuf { .. } => Ring::PostQ,
    };
    if allowed != queue {
        return Err(WireError::WrongQueue);
    }
    let len_ok = |len: u32| len >= 1 && len <= limits.max_len;
    match *msg {
        Msg::WriteReq { len, roff, .. } | Msg::ReadReq { len, roff, .. } => {
            if !len_ok(len) || roff.checked_add(u64::from(len)).is_none() {
                return Err(WireError::OutOfRange);
            }
        }
        Msg::Rts { len, .. }
        | Msg::Done { len, .. }
        | Msg::ChainRts { len, .. }
        | Msg::ChainDone { len, .. } => {
            if !len_ok(len) {
                return Err(WireError::OutOfRange);
            }
        }
        Msg::Ack { .. }
        | Msg::ReadIntent { .. }
        | Msg::SendInline { .. }
        | Msg::Revoke { .. }
        | Msg::RevokeAck { .. }
        | Msg::Cancel { .. }
        | Msg::ChainRelease { .. } => {}
        Msg::WriteImm { len, roff, .. } => {
            if !len_ok(len) || roff.checked_add(u64::from(len)).is_none() {
                return Err(WireError::OutOfRange);
            }
        }
        Msg::Advertise { offset, len, .. } => {
            let end = offset.checked_add(u64::from(len));
            if len == 0 || offset < limits.region_start || end.is_none_or(|e| e > limits.window_len)
            {
                return Err(WireError::OutOfRange);
            }
        }
        Msg::ReadSize { status, len, .. } => {
            if status == WireStatus::Ok && len == 0 {
                return Err(WireError::OutOfRange);
            }
        }
        Msg::Sgl { start, n, sges, .. }
        | Msg::ReadSgl { start, n, sges, .. }
        | Msg::ChainSgl { start, n, sges, .. } => {
            let mut end = u64::from(start);
            for s in &sges[..(n as usize).min(SGES_PER_MSG)] {
                let stop = s.offset + u64::from(s.len);
                if s.offset < limits.region_start || stop > limits.window_len {
                    return Err(WireError::OutOfRange);
                }
                end += u64::from(s.len);
            }
            if end > u64::from(limits.max_len) {
                return Err(WireError::OutOfRange);
            }
        }
        Msg::SendBuf { buf, len } => {
            if buf >= limits.eager_count || len == 0 || len > limits.eager_size {
                return Err(WireError::OutOfRange);
            }
        }
    }
    Ok(())
}

/// Decodes and validates in one step: the entry point of the fuzz target.
///
/// # Example
/// ```
/// use ntbdk_pmd::transport::wire::{self, Limits, Msg, Ring};
/// let limits = Limits { max_len: 1 << 20, region_start: 4096, window_len: 1 << 20, eager_count: 8, eager_size: 256 };
/// let body = wire::encode(&Msg::Rts { op: 9, len: 100 });
/// assert_eq!(wire::decode_validated(&body, Ring::Rx, &limits), Ok(Msg::Rts { op: 9, len: 100 }));
/// // The same message on the wrong queue, or garbage, is refused.
/// assert!(wire::decode_validated(&body, Ring::Cq, &limits).is_err());
/// assert!(wire::decode_validated(&[0xff; 56], Ring::Rx, &limits).is_err());
/// ```
pub fn decode_validated(b: &Body, queue: Ring, limits: &Limits) -> Result<Msg, WireError> {
    let m = decode(b)?;
    validate(&m, queue, limits)?;
    Ok(m)
}

/// How many messages [`chunk_sgl`] makes of `extents`.
pub fn sgl_msgs(extents: &[(u64, u64)]) -> usize {
    let entries: u64 = extents
        .iter()
        .map(|&(_, len)| len.div_ceil(u64::from(SGE_CHUNK_LEN)))
        .sum();
    entries.div_ceil(SGES_PER_MSG as u64) as usize
}

/// Splits a list of window extents into SGL messages of at most
/// [`SGES_PER_MSG`] entries each, splitting extents longer than
/// [`SGE_CHUNK_LEN`]. Calls `emit(start, n, sges)` per message.
pub fn chunk_sgl(extents: &[(u64, u64)], mut emit: impl FnMut(u32, u8, [WireSge; SGES_PER_MSG])) {
    let mut sges = [WireSge::default(); SGES_PER_MSG];
    let mut n = 0usize;
    let mut pos: u64 = 0;
    let mut msg_start: u64 = 0;
    for &(off, len) in extents {
        let mut done = 0u64;
        while done < len {
            let piece = (len - done).min(u64::from(SGE_CHUNK_LEN));
            if n == 0 {
                msg_start = pos;
            }
            sges[n] = WireSge {
                offset: off + done,
                len: piece as u32,
            };
            n += 1;
            done += piece;
            pos += piece;
            if n == SGES_PER_MSG {
                emit(msg_start as u32, n as u8, sges);
                sges = [WireSge::default(); SGES_PER_MSG];
                n = 0;
            }
        }
    }
    if n > 0 {
        emit(msg_start as u32, n as u8, sges);
    }
}

/// The handshake message written into a peer's mailbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u16,
    /// Geometry: ports.
    pub ports: u16,
    /// Geometry: queue depth.
    pub queue_depth: u32,
    /// Geometry: eager buffers per sender.
    pub eager_count: u32,
    /// Geometry: eager buffer size.
    pub eager_size: u32,
    /// Geometry: data queues.
    pub data: DataQueues,
    /// The sender's incarnation (changes every time a transport starts).
    pub incarnation: u64,
    /// The receiver's incarnation as the sender last saw it (0: none).
    pub seen: u64,
}

/// Magic number at the start of a hello ("NTBT").
pub const HELLO_MAGIC: u32 = 0x5442_544e;

impl Hello {
    /// Encodes the hello into a slot body.
    pub fn encode(&self) -> Body {
        let mut b = [0u8; BODY];
        put_u32(&mut b, 0, HELLO_MAGIC);
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6..8].copy_from_slice(&self.ports.to_le_bytes());
        put_u32(&mut b, 8, self.queue_depth);
        put_u32(&mut b, 12, self.eager_count);
        put_u32(&mut b, 16, self.eager_size);
        put_u64(&mut b, 24, self.incarnation);
        put_u64(&mut b, 32, self.seen);
        b[40..42].copy_from_slice(&self.data.count.to_le_bytes());
        put_u32(&mut b, 44, self.data.nb_desc);
        put_u32(&mut b, 48, self.data.buf_size);
        b
    }

    /// Decodes a hello; `None` when the magic is wrong, the incarnation is 0
    /// or reserved bytes are set. Never panics.
    pub fn decode(b: &Body) -> Option<Self> {
        if u32_at(b, 0) != HELLO_MAGIC || !all_zero(&b[20..24]) {
            return None;
        }
        if !all_zero(&b[42..44]) || !all_zero(&b[52..56]) {
            return None;
        }
        let h = Self {
            version: u16::from_le_bytes([b[4], b[5]]),
            ports: u16::from_le_bytes([b[6], b[7]]),
            queue_depth: u32_at(b, 8),
            eager_count: u32_at(b, 12),
            eager_size: u32_at(b, 16),
            data: DataQueues {
                count: u16::from_le_bytes([b[40], b[41]]),
                nb_desc: u32_at(b, 44),
                buf_size: u32_at(b, 48),
            },
            incarnation: u64_at(b, 24),
            seen: u64_at(b, 32),
        };
        (h.incarnation != 0).then_some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words a sender stores are the bytes the receiver decodes, for
    /// every inline length, and slots past the run are zero.
    #[test]
    fn encode_inline_words_gives_each_slots_words() {
        for len in 1..=INLINE_LONG_MAX {
            let payload: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
            let n = inline_slots(len).unwrap();
            // Entries start dirty: every word must be written.
            let mut out = vec![[u64::MAX; BODY / 8]; n];
            encode_inline_words(&payload, &mut out);
            for (k, w) in out.iter().enumerate() {
                assert_eq!(
                    *w,
                    build_inline_slot_words(&payload, k),
                    "len {len} slot {k}"
                );
            }
        }
    }

    #[test]
    fn inline_slot_words_are_the_inline_encoding() {
        for len in 1..=INLINE_LONG_MAX {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let n = inline_slots(len).unwrap();
            let slots: Vec<Body> = (0..n)
                .map(|k| words_body(&inline_slot_words(&payload, k)))
                .collect();
            assert_eq!(body_words(&slots[0]), inline_slot_words(&payload, 0));
            assert_eq!(inline_slot_words(&payload, n), [0; BODY / 8]);
            let mut out = [0u8; INLINE_LONG_MAX];
            if n == 1 {
                let m = decode_validated(&slots[0], Ring::PostQ, &limits()).unwrap();
                assert_eq!(
                    m,
                    Msg::SendInline {
                        len: len as u8,
                        data: {
                            let mut d = [0u8; INLINE_MAX];
                            d[..len].copy_from_slice(&payload);
                            d
                        }
                    }
                );
            } else {
                assert_eq!(gather_inline(&slots[0], &slots[1..], &mut out), Ok(len));
                assert_eq!(&out[..len], &payload[..]);
            }
        }
        assert_eq!(
            inline_slot_words(&[1; INLINE_LONG_MAX + 1], 0),
            [0; BODY / 8]
        );
    }

    fn limits() -> Limits {
        Limits {
            max_len: 1 << 30,
            region_start: 4096,
            window_len: 1 << 20,
            eager_count: 8,
            eager_size: 256,
        }
    }

    #[test]
    fn roundtrip_every_message() {
        let sges = [
            WireSge {
                offset: 4096,
                len: 10,
            },
            WireSge {
                offset: 8192,
                len: 20,
            },
            WireSge::default(),
            WireSge::default(),
            WireSge::default(),
        ];
        let mut data = [0u8; INLINE_MAX];
        data[..3].copy_from_slice(b"abc");
        let msgs = [
            Msg::WriteReq {
                op: 7,
                rkey: 3,
                roff: 100,
                len: 5,
            },
            Msg::Sgl {
                op: 7,
                start: 0,
                n: 2,
                sges,
            },
            Msg::Done { op: 7, len: 30 },
            Msg::Ack {
                op: 7,
                status: WireStatus::Access,
                len: 0,
            },
            Msg::ReadReq {
                op: 8,
                rkey: 3,
                roff: 0,
                len: 30,
            },
            Msg::ReadSgl {
                op: 8,
                start: 0,
                n: 2,
                sges,
            },
            Msg::ReadIntent {
                op: 9,
                rkey: 3,
                roff: 5,
            },
            Msg::ReadSize {
                op: 9,
                status: WireStatus::Ok,
                len: 77,
            },
            Msg::Rts { op: 10, len: 99 },
            Msg::ChainRts {
                op: 11,
                len: 99,
                prev: 3,
                next: Some(0),
            },
            Msg::ChainRts {
                op: 11,
                len: 99,
                prev: 0,
                next: None,
            },
            Msg::ChainSgl {
                op: 11,
                origin: 4,
                start: 0,
                n: 2,
                sges,
            },
            Msg::ChainDone {
                op: 11,
                origin: 4,
                len: 99,
            },
            Msg::Cancel { op: 12 },
            Msg::ChainRelease { op: 12, origin: 4 },
            Msg::SendInline { len: 3, data },
            Msg::SendBuf { buf: 2, len: 200 },
        ];
        for m in msgs {
            assert_eq!(decode(&encode(&m)), Ok(m), "{m:?}");
        }
    }

    #[test]
    fn a_cancel_and_a_release_carry_nothing_else() {
        let l = limits();
        let cancel = Msg::Cancel { op: 5 };
        let release = Msg::ChainRelease { op: 5, origin: 2 };
        assert_eq!(validate(&cancel, Ring::Rx, &l), Ok(()));
        assert_eq!(validate(&cancel, Ring::Cq, &l), Err(WireError::WrongQueue));
        assert_eq!(validate(&release, Ring::Cq, &l), Ok(()));
        assert_eq!(validate(&release, Ring::Rx, &l), Err(WireError::WrongQueue));
        // Any byte outside the op id (and the origin) set is malformed.
        for m in [cancel, release] {
            let body = encode(&m);
            for i in (1..56).filter(|i| !(8..16).contains(i)) {
                if matches!(m, Msg::ChainRelease { .. }) && (4..6).contains(&i) {
                    continue;
                }
                let mut b = body;
                b[i] ^= 1;
                assert_eq!(decode(&b), Err(WireError::Malformed), "{m:?}, byte {i}");
            }
        }
        // An origin beyond a port number is malformed too.
        let mut b = encode(&release);
        b[6] = 1;
        assert_eq!(decode(&b), Err(WireError::Malformed));
    }

    #[test]
    fn routing_and_ranges_are_checked() {
        let l = limits();
        let m = Msg::WriteReq {
            op: 1,
            rkey: 1,
            roff: 0,
            len: 10,
        };
        assert_eq!(validate(&m, Ring::Tx, &l), Err(WireError::WrongQueue));
        assert_eq!(validate(&m, Ring::Rx, &l), Ok(()));
        let bad = Msg::SendBuf { buf: 8, len: 1 };
        assert_eq!(validate(&bad, Ring::PostQ, &l), Err(WireError::OutOfRange));
        let mut sges = [WireSge::default(); SGES_PER_MSG];
        sges[0] = WireSge { offset: 0, len: 64 };
        let into_queues = Msg::Sgl {
            op: 1,
            start: 0,
            n: 1,
            sges,
        };
        assert_eq!(
            validate(&into_queues, Ring::Tx, &l),
            Err(WireError::OutOfRange)
        );
    }

    #[test]
    fn chunking_covers_every_byte_once() {
        let ext = [
            (4096u64, 10u64),
            (9000, u64::from(SGE_MAX_LEN) + 5),
            (100_000, 1),
            (5000, 3),
            (6000, 4),
            (7000, 5),
        ];
        // Walk the extents with a cursor (extent, bytes of it consumed):
        // each entry must name the very next bytes, at their window offset.
        let (mut i, mut used) = (0usize, 0u64);
        let mut pos = 0u64;
        let mut msgs = Vec::new();
        chunk_sgl(&ext, |start, n, sges| {
            assert_eq!(u64::from(start), pos, "message start");
            assert!((1..=SGES_PER_MSG).contains(&(n as usize)));
            for s in &sges[..n as usize] {
                let (off, len) = ext[i];
                assert_eq!(s.offset, off + used, "entry offset");
                assert!(s.len > 0 && s.len <= SGE_MAX_LEN);
                assert!(used + u64::from(s.len) <= len, "entry runs past its extent");
                used += u64::from(s.len);
                pos += u64::from(s.len);
                if used == len {
                    (i, used) = (i + 1, 0);
                }
            }
            assert!(
                sges[n as usize..].iter().all(|s| *s == WireSge::default()),
                "unused entries are zero"
            );
            msgs.push(n);
        });
        assert_eq!(i, ext.len(), "every extent consumed");
        assert_eq!(pos, ext.iter().map(|e| e.1).sum::<u64>());
        // The long extent is split at SGE_CHUNK_LEN; every message but the
        // last is full.
        assert_eq!(msgs.iter().map(|&n| n as usize).sum::<usize>(), 7);
        let (last, full) = msgs.split_last().unwrap();
        assert!(full.iter().all(|&n| n as usize == SGES_PER_MSG));
        assert!(*last as usize <= SGES_PER_MSG);
        // Counted ahead as they are made.
        assert_eq!(sgl_msgs(&ext), msgs.len());
        assert_eq!(sgl_msgs(&[]), 0);
        assert_eq!(sgl_msgs(&[(0, 64); SGES_PER_MSG]), 1);
        assert_eq!(sgl_msgs(&[(0, 64); SGES_PER_MSG + 1]), 2);
    }
}
