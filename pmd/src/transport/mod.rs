//! The transport: posted-write-only queue pairs between hosts over an NTB.
//!
//! No host ever reads a peer's memory: every message, payload and credit is
//! a posted write into the receiver's inbound window, and the receiver polls
//! its own memory. Non-posted reads need an R-LUT entry each (about 32 per
//! NTB), so a transport that never reads scales past that many peers.
//!
//! # Window layout
//! Every host's window (memory window `Config::mw`) is laid out from the
//! agreed [`Geometry`] (see [`Layout`]):
//!
//! ```text
//! 0                header: "NTBDKXPT", version, geometry, region area start (owner's, informative)
//! 64 + p*64        mailbox of port p: p's hello (one slot; at a geometry-independent
//!                  offset, so hosts with different geometries still see the mismatch)
//! 64 + P*64 + p*S  section of port p (P ports, S = Layout::section_size), written only by p:
//!   +0               credits: u64 x 4, p's consumer progress on the RX/TX/CQ/PostQ
//!                    rings WE write into p's window, tagged as slots are ((epoch << 32) | seq)
//!   +64              RX ring   (queue_depth slots): "prepare to receive" from p
//!                    TX ring   (queue_depth slots): "prepare to send" from p
//!                    CQ ring   (queue_depth slots): "done"/"received" from p
//!                    PostQ     (queue_depth slots): p's eager sends
//!                    FreeQ     (eager_count u64 entries): eager buffers of p's window
//!                              p lends us to send into
//!                    eager buffers (eager_count x eager_size): p's sends to us
//!                    data queues (Geometry::data, when configured), per queue: credit,
//!                    FreeQ of lent buffers, descriptor ring, receive buffers
//!                    (`dataq/mod.rs` has their format)
//! region area      page aligned, to the window's end: registered regions
//! ```
//!
//! A slot is 64 bytes: a 56-byte body (`wire`) and a tag
//! `(epoch << 32) | seq` written last with a release store. The consumer
//! polls the slot it expects, copies the body out once, then decodes and
//! validates the copy. Credits go back in batches (a quarter ring).
//! FreeQ entries are self-tagged u64s `(epoch + seq) << 32 | (index + 1)`.
//!
//! # Messages
//! Every message is one slot (except a long inline send, see below); `op`
//! is the initiator's operation id (rising from a start drawn from the
//! transport's incarnation, so that a transport replacing another on the
//! same port never reuses an id its peers may still hear about).
//!
//! | operation | flow | implements |
//! | --- | --- | --- |
//! | write | initiator → target RX `WriteReq{op, rkey, roff, len}`; target checks key, remote-write permission and range, → initiator TX `Sgl{op, start, entries}` (5 per slot, as many slots as needed); initiator copies each segment straight into the target's region (the only copy), → target CQ `Done{op, len}`; target → initiator CQ `Ack{op, status, len}`: completion | EP 3025241 (seed 001) FIG. 3, steps 301–313 (and FIG. 4, 401–409); the optional step 313 is always sent |
//! | read, size known | initiator → target TX `ReadReq{op, rkey, roff, len}` + `ReadSgl{op, start, entries}` (our region's extents); target checks remote-read permission and range, copies each segment into our window, → initiator CQ `Ack{op, Ok, len}`: completion | EP 3025241 FIG. 5, steps 505–513 (optional 515 not sent) |
//! | read, size unknown | initiator → target TX `ReadIntent{op, rkey, roff}`; target → initiator RX `ReadSize{op, status, len}`; initiator allocates a region of that size (bounded by the caller's `max_len`) and reads as above under a fresh op id | EP 3025241 FIG. 6, steps 601–613 (FIG. 7, 701–713) |
//! | send | up to 48 bytes inline in one PostQ slot `SendInline`; up to 216 bytes inline in up to four consecutive PostQ slots (a `SEND_INLINE_LONG` head and continuation slots, written back to back; the receiver takes the run once the last slot's tag is there and validates it as a unit); larger (up to `eager_size`): into an eager buffer taken from our FreeQ, then a PostQ slot `SendBuf{buf, len}`; the receiver copies it into the oldest posted receive and lends the buffer back through the sender's FreeQ | ntbdk's own eager path (the FreeQ and PostQ of the layout above), beside the seed's rendezvous |
//! | one-sided write | target → initiator TX `Advertise{rkey, offset, len}` once per remote-write region (contiguous, in the peer's domain); initiator checks key, bounds and permission, then writes the bytes straight into the target's region (posted writes) and completes at once; with an immediate, then initiator → target RX `WriteImm{rkey, roff, len, imm}` (after the data); deregistering sends `Revoke{rkey}`, answered by initiator → target CQ `RevokeAck{rkey}`, and only then are the bytes reused | seed 004 (the channel adapter's direct placement into a remote address range), as verbs' RDMA write (with immediate) |
//! | multicast put | initiator → each target RX `Rts{op, len}`; each target allocates storage and answers on our TX with `Sgl` segments (clear to send); a check-in counter of targets not yet ready reaches zero (the operation's deadline stays a timeout after the post, however the storage trickles in); one put copies to every target and sends each a `Done` (each copy only within three quarters of the operation timeout of the post: later, every target left is failed with a timeout and cancelled instead, as a target's own deadline, which started when its request came, may have passed); each `Ack`s; one completion | seed 002 (remote direct memory access): request to send to a plurality of targets, each prepares to receive, a check-in counter, one direct put |
//! | multicast put, chain | initiator → each target RX `ChainRts{op, len, prev, next}`; each target allocates storage and, once it holds its successor's storage (`ChainSgl{op, origin, ...}` from `next`, or at once if last), sends its own to `prev` (`ChainSgl`, or a plain `Sgl` to the initiator); the first target's clear-to-send means the whole chain is ready; the initiator copies to the first target and sends `Done`; each target deposits, forwards the data to `next` with `ChainDone{op, origin, len}` (only before its own deadline; after it, it releases `next`'s storage instead) and `Ack`s the initiator; a `Done` or `ChainDone` before our clear-to-send is no data | seed 002, the deposit bit: each target deposits and forwards |
//! | multicast put that fails before its put | a target refuses or times out (in a chain, that fails every target), or the put's copy to a target (a chain's first) fails: initiator → each target it will not reach RX `Cancel{op}`; a target frees its storage at once, unless it is a chain link whose storage went to a previous target, which keeps it until that target's CQ `ChainRelease{op, origin}` or `ChainDone` (then frees it, delivering and forwarding nothing); a link that will never write its successor's storage (it refused the request, was cancelled or released, gave the operation up at its timeout, lost its connection to the origin, never got the request, or finds another host on the successor's port than the one that gave the storage) sends it `ChainRelease`; a link that gives the operation up (at its timeout, or when its connection to the initiator ends) while its previous link may still write its storage sets that storage aside, unused, until the previous link's `ChainDone` or `ChainRelease`, or two more operation timeouts; only the one peer that may write a range ends its use | ntbdk's own (storage is otherwise held until the operation timeout) |
//!
//! Errors travel as `Ack`/`ReadSize` statuses (access, protocol, no room).
//!
//! # Peers are untrusted
//! Every message is decoded and validated (`wire::decode_validated`:
//! op code, reserved bytes, counts, routing to the right queue, lengths,
//! SGL entries inside the peer's region area and inside the transfer), then
//! checked against our state: op ids against our outstanding operations (in
//! the right state, from the right peer, segments in order and within the
//! length), fresh op ids against a per-ring high-water mark (replays), keys
//! and permissions against the region table, eager buffer indexes against
//! the buffers we lent. A bad message fails its operation (error
//! completion, or an error `Ack` to the peer) or, with no operation to
//! fail, is dropped and counted ([`DropKind`]). With a finite
//! `Config::op_timeout` (the default), every operation has a deadline and
//! nothing waits forever.
//!
//! A peer can exhaust only what it is given, with the exceptions listed
//! after: at most `Config::max_outstanding` operations served for it at
//! once (more are refused with an error `Ack`), a bounded backlog of
//! messages towards it (a peer that stops crediting is disconnected),
//! storage it asks for only from the region area and only until its
//! operation's deadline (a chain link's storage, while its previous link
//! may still write it, up to two more timeouts), at most 65 536 regions of
//! its own advertised to us at once, and at most one lap of each of its rings per poll (a peer
//! refilling a ring just ahead of us cannot keep us in one poll). A region
//! deregistered while a peer works on it ends safely: the reads of it we
//! serve are refused from then on, and its bytes are not reused before the
//! peer acknowledged the revocation (one-sided writes) or the rendezvous
//! writes we granted into it end (their `Done`, or our deadline for them:
//! a writer slower than our `op_timeout` is outside this).
//!
//! The storage lists a multicast keeps (16 bytes per SGL entry) hold only
//! entries a region could make: at least a grain (64 bytes) each but the
//! one ending the transfer, so at most a quarter of the transfer.
//!
//! A served operation keeps no copy of its region's extents (a read walks
//! the region's own as the reader's SGL arrives), so a region of many small
//! extents (`register_region_scattered`) costs nothing per request. The
//! write-with-immediate notices a peer sends unasked wait for the
//! application up to `Config::cq_depth` completions; past that they are
//! dropped and counted (`Overload`), their data in place.
//!
//! Where the device enforces per-peer translation (the emulated fabric:
//! [`Transport::peers_isolated`]), a peer's raw stores reach only its own
//! mailbox and section and the regions registered for it (each region's
//! extents are granted to its protection domain while it is registered or
//! being revoked; see `region.rs`), whatever it writes through its device.
//!
//! # Connections
//! A handshake with posted writes only (see the `handshake` module source):
//! each side writes a hello {magic, version, geometry, its incarnation, the
//! incarnation of ours it saw} into its mailbox in the peer's window; a side
//! is connected once it sees its own incarnation in the peer's hello, and
//! both derive the connection epoch from the two incarnations, so nothing of
//! an earlier connection is ever taken for a new message. A different
//! version or geometry fails the connection with a clear error
//! ([`PeerState::Failed`], [`TransportError::HandshakeFailed`]). Link down
//! (the device's dead-peer detection), a new incarnation of the peer, or a
//! transport being dropped (it says goodbye with a fresh incarnation) tears
//! the connection down: outstanding operations complete with
//! [`Status::PeerDown`], posted receives are flushed, and the peer's section
//! is cleared, so eager buffers and credits start afresh when it
//! reconnects. A connection this side ends on its own, the peer perhaps
//! still up (its rings wedged, a store into its window failed, it stopped
//! crediting), fails with [`Status::Reset`]; after it, and after a link
//! drop (the peer may only have stalled), what the peer may still write
//! into is held until it can no longer (see `handshake.rs`). The hello
//! carries the protocol version ([`VERSION`]): builds of another version
//! fail the handshake, saying both.
//!
//! # Where things are
//! One role a file (see `docs/ARCHITECTURE.md` for the whole map):
//! `endpoint.rs` (the [`Transport`]), `completion_queue.rs`, `memory.rs`
//! (region verbs), `post.rs` (posting work), `poll.rs` (the poll loop),
//! `receive.rs` (sends → receive completions), `target.rs` (serving a
//! peer's requests), `initiator.rs` (our operations' progress),
//! `multicast.rs`, `direct.rs` (one-sided writes), `handshake.rs`; underneath, `conn.rs` (one
//! connection), `peer.rs`, `ops.rs` (operations in flight), `queue.rs`
//! (slot rings), `wire.rs` (the message format), `geometry.rs`,
//! `region.rs`, `sgl.rs`, `dma.rs`; the data queues in `dataq/` (with
//! `watch.rs`, the connection word they follow); the stats page in
//! `stats_page.rs` and `publish.rs`; copies set aside while a peer's grant
//! table is mid-edit in `parked.rs` and `retry.rs`; `claim.rs` (one
//! transport per window), `idhash.rs`.
//!
//! # Batching and progress
//! A slot is published by its own tag, so a batch of work requests
//! ([`Transport::post_sends`], [`Transport::post_writes`]) is a run of
//! slots written back to back with no index to update; with
//! [`Config::doorbell`] the batch ends with one doorbell. Consumers credit
//! back once per quarter ring. All progress happens in
//! [`Transport::poll_completions`] / [`Transport::progress`]: no threads.

mod claim;
mod completion_queue;
mod config;
mod conn;
mod counters;
mod dataq;
mod dataqueues;
mod direct;
mod dma;
mod endpoint;
mod error;
mod geometry;
mod handshake;
mod idhash;
mod initiator;
#[cfg(feature = "internals")]
pub mod inject;
mod key;
mod memory;
mod multicast;
mod ops;
mod parked;
mod peer;
mod poll;
mod post;
mod publish;
mod queue;
mod receive;
mod region;
mod retry;
mod sgl;
mod stats_page;
mod target;
mod types;
mod watch;
#[cfg(feature = "internals")]
pub mod wire;
#[cfg(not(feature = "internals"))]
mod wire;

pub use config::Config;
pub use counters::{DROP_KINDS, DropKind, QpCounters};
pub use dataq::{DataQueue, DataQueueStats, RxQueue, TxQueue};
pub use dma::{CpuEngine, DmaEngine, MIN_NT_THRESHOLD, default_nt_threshold};
pub use endpoint::Transport;
pub use error::{GeometryError, Result, TransportError};
#[cfg(feature = "internals")]
pub use geometry::Part;
pub use geometry::{DataPart, DataQueues, Geometry, Layout};
pub use handshake::{VERSION, epoch};
pub use key::{Access, RegionKey};
pub use memory::RegionView;
pub use multicast::MulticastMode;
pub use sgl::{RemoteAddr, Sge};
pub use stats_page::{
    PUBLISH_INTERVAL, PublishedPeer, PublishedState, PublishedStats, is_page_being_built,
    read_stats, stats_path, stats_prefix,
};
pub use types::{
    Completion, DirectWr, OpKind, PeerState, Qp, RecvWr, Resources, SendWr, Status, WriteWr,
};
pub use wire::Ring;
