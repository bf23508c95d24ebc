//! The transport's per-peer counters published in a small file for other
//! processes (`ntb-tool qp`): what each queue pair has outstanding, and
//! what it dropped, by kind.
//!
//! The owner ([`Transport::publish_stats`](super::Transport::publish_stats)) creates the file, maps it and
//! rewrites it from its slow path (every [`PUBLISH_INTERVAL`] at most)
//! with relaxed atomic stores inside a sequence lock; it removes the file
//! when the transport is dropped. A reader ([`read_stats`]) reads it with
//! `pread`, validates it like any input from another process, and keeps a
//! consistent snapshot.
//!
//! ```text
//! word 0     magic "NTBDKQPS"
//!      1     VERSION
//!      2     header words (HEADER_WORDS), 3  words per peer (RECORD_WORDS)
//!      4     our port, 5  ports (records), 6  pid, 7  our join generation
//!      8     sequence (odd while the owner writes), 9  last update, Unix ms
//! HEADER_WORDS + p * RECORD_WORDS: port p's record (see `field`)
//! ```
//!
//! Every word is a little-endian `u64` at an 8-byte aligned offset. The
//! owner reaches its mapping only through atomics (no Rust reference or
//! slice over the file); readers copy the file out with `pread`.

use std::fs::File;
use std::num::NonZeroUsize;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU64, fence};
use std::time::{Duration, Instant};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use super::counters::{DROP_KINDS, QpCounters};
use super::error::{Result, TransportError};
use super::ops::{OutKind, OutOp};
use super::peer::Peer;
use super::types::PeerState;
use crate::hw::Port;

/// "NTBDKQPS", little endian.
const MAGIC: u64 = u64::from_le_bytes(*b"NTBDKQPS");
/// Bumped on every incompatible change of the layout.
pub const VERSION: u64 = 1;
/// Header words.
const HEADER_WORDS: usize = 16;
/// Words of one peer's record.
const RECORD_WORDS: usize = 32;
/// Most ports a page describes (a reader refuses more).
const MAX_PORTS: u64 = 4096;
/// The state code of the host's own port.
const STATE_US: u64 = 5;
/// How long a reader retries a page its owner is rewriting before it
/// reports [`TransportError::StatsMidWrite`].
const MID_WRITE_PATIENCE: Duration = Duration::from_millis(100);
/// How often the owner rewrites its page at most.
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(10);

/// Header word indices.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_HEADER_WORDS: usize = 2;
const H_RECORD_WORDS: usize = 3;
const H_PORT: usize = 4;
const H_PORTS: usize = 5;
const H_PID: usize = 6;
const H_GENERATION: usize = 7;
const H_SEQ: usize = 8;
const H_UPDATED_MS: usize = 9;

/// Record word indices: state, outstanding work, then [`QpCounters`].
mod field {
    pub const STATE: usize = 0;
    pub const OUT_WRITES: usize = 1;
    pub const OUT_READS: usize = 2;
    pub const OUT_MULTICASTS: usize = 3;
    pub const SERVING: usize = 4;
    pub const RECVS_POSTED: usize = 5;
    pub const BACKLOG: usize = 6;
    pub const SENDS: usize = 7;
    pub const RECVS: usize = 8;
    pub const WRITES: usize = 9;
    pub const READS: usize = 10;
    pub const MULTICASTS: usize = 11;
    pub const SERVED: usize = 12;
    pub const BYTES_OUT: usize = 13;
    pub const BYTES_IN: usize = 14;
    pub const FAILED_OPS: usize = 15;
    pub const EMPTY_POLLS: usize = 16;
    pub const CONNECTS: usize = 17;
    pub const DISCONNECTS: usize = 18;
    pub const RESYNCS: usize = 19;
    /// `DROP_KINDS` words, in `DropKind` order.
    pub const DROPPED: usize = 20;
}
const _: () = assert!(field::DROPPED + DROP_KINDS <= RECORD_WORDS);

/// A peer's state as published (a [`PeerState`] without its payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishedState {
    /// Link down.
    Down,
    /// Handshake under way.
    Connecting,
    /// Connected.
    Connected,
    /// Handshake failed.
    Failed,
    /// We lost our place on the fabric.
    Lost,
    /// Our own port (no queue pair).
    Us,
    /// A code this reader does not know.
    Unknown(u64),
}

impl PublishedState {
    fn code(s: &PeerState) -> u64 {
        match s {
            PeerState::Down => 0,
            PeerState::Connecting => 1,
            PeerState::Connected => 2,
            PeerState::Failed(_) => 3,
            PeerState::Lost => 4,
        }
    }

    fn from_code(c: u64) -> Self {
        match c {
            0 => Self::Down,
            1 => Self::Connecting,
            2 => Self::Connected,
            3 => Self::Failed,
            4 => Self::Lost,
            STATE_US => Self::Us,
            c => Self::Unknown(c),
        }
    }
}

impl std::fmt::Display for PublishedState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Down => f.write_str("down"),
            Self::Connecting => f.write_str("connecting"),
            Self::Connected => f.write_str("connected"),
            Self::Failed => f.write_str("failed"),
            Self::Lost => f.write_str("lost"),
            Self::Us => f.write_str("us"),
            Self::Unknown(c) => write!(f, "unknown({c})"),
        }
    }
}

/// One queue pair (one peer port) as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedPeer {
    /// The peer port.
    pub peer: Port,
    /// Its state.
    pub state: PublishedState,
    /// Rendezvous writes of ours to it in flight.
    pub outstanding_writes: u64,
    /// Reads of ours from it in flight.
    pub outstanding_reads: u64,
    /// Multicast puts of ours that involve it in flight.
    pub outstanding_multicasts: u64,
    /// Its operations we are serving.
    pub serving: u64,
    /// Receives posted for its messages.
    pub recvs_posted: u64,
    /// Messages waiting for its credits.
    pub backlog: u64,
    /// The queue pair's counters (drops by kind among them).
    pub counters: QpCounters,
}

/// A snapshot of one host's page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedStats {
    /// The host's port.
    pub port: Port,
    /// Its pid.
    pub pid: u32,
    /// Its join generation when it created the page (compare with the
    /// fabric's to tell a page left by a dead host).
    pub generation: u64,
    /// When it last rewrote the page, Unix milliseconds.
    pub updated_unix_ms: u64,
    /// One entry per port but its own.
    pub peers: Vec<PublishedPeer>,
}

/// Where a host of fabric `fabric` at `port` publishes its page: beside
/// the fabric's control segment in `dir`.
pub fn stats_path(dir: &Path, fabric: &str, port: Port) -> PathBuf {
    dir.join(format!("{}{fabric}-{port}", stats_prefix()))
}

/// The file-name prefix of every page (`ntbdk-qpstats-`).
pub fn stats_prefix() -> &'static str {
    "ntbdk-qpstats-"
}

/// Where this process builds the page for `path` before renaming it over
/// `path`: `<page>.<pid>.new`.
fn building_path(path: &Path) -> PathBuf {
    let mut building = path.as_os_str().to_owned();
    building.push(format!(".{}.new", std::process::id()));
    PathBuf::from(building)
}

/// Whether `name`, a file name beside fabric `fabric`'s control segment, is
/// a page of that fabric a host was building (`<page>.<pid>.new`): one that
/// is not being renamed over its page was left by a host that died while
/// building it.
pub fn is_page_being_built(name: &str, fabric: &str) -> bool {
    name.strip_prefix(stats_prefix())
        .and_then(|n| n.strip_prefix(fabric))
        .and_then(|n| n.strip_prefix('-'))
        .and_then(|n| n.strip_suffix(".new"))
        .and_then(|n| n.split_once('.'))
        .is_some_and(|(port, pid)| port.parse::<u16>().is_ok() && pid.parse::<u32>().is_ok())
}

/// A shared mapping of a page file: its base and length, unmapped on drop.
struct Mapping {
    base: NonNull<u8>,
    words: usize,
}

impl Mapping {
    fn map(file: &File, len: usize, writable: bool, what: &Path) -> Result<Self> {
        let nz = NonZeroUsize::new(len).ok_or_else(|| TransportError::Stats {
            what: format!("{}: empty", what.display()),
        })?;
        let prot = if writable {
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
        } else {
            ProtFlags::PROT_READ
        };
        // SAFETY: a fresh shared mapping of an open file at an address the
        // kernel picks, so it aliases no Rust object; it is reached only
        // through atomics (`word`).
        let base = unsafe { mmap(None, nz, prot, MapFlags::MAP_SHARED, file, 0) }.map_err(|e| {
            TransportError::Stats {
                what: format!("mapping {}: {e}", what.display()),
            }
        })?;
        Ok(Self {
            base: base.cast(),
            words: len / 8,
        })
    }

    /// The word at index `i`, if inside the mapping.
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        (i < self.words).then(|| {
            // `AtomicU64` is valid for any bytes; the owner's mapping is the
            // only one (readers `pread`).
            // SAFETY: `i` words are inside the mapping (checked), which is
            // page aligned, so the address is 8-byte aligned; the mapping
            // lives as long as `self`.
            unsafe { AtomicU64::from_ptr(self.base.as_ptr().cast::<u64>().add(i)) }
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base + words * 8` is the mapping made in `map`,
        // unmapped once, here.
        let _ = unsafe { munmap(self.base.cast(), self.words * 8) };
    }
}

// SAFETY: the mapping is shared memory reached only through atomics.
unsafe impl Send for Mapping {}

/// The owner's page: written from the transport's slow path.
pub(crate) struct StatsPage {
    map: Mapping,
    path: PathBuf,
    /// The page's file (device, inode): what `path` names until another
    /// page replaces it.
    file_id: (u64, u64),
    ports: usize,
    last: Option<Instant>,
}

impl StatsPage {
    /// Creates (or replaces) the page at `path` for a host at `port` of a
    /// fabric of `ports` ports.
    ///
    /// The page is built in a file of its own and renamed over `path` once
    /// complete: a reader that opened an earlier page at `path` keeps
    /// reading that file whole.
    pub(crate) fn create(path: &Path, port: Port, ports: usize, generation: u64) -> Result<Self> {
        let err = |e: std::io::Error| TransportError::Stats {
            what: format!("creating {}: {e}", path.display()),
        };
        let words = HEADER_WORDS + ports * RECORD_WORDS;
        let building = building_path(path);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&building)
            .map_err(err)?;
        let sized = file.set_len((words * 8) as u64);
        let map = sized
            .map_err(err)
            .and_then(|()| Mapping::map(&file, words * 8, true, path));
        let map = match map {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&building);
                return Err(e);
            }
        };
        let w = |i: usize| map.word(i).expect("inside the page just sized");
        w(H_VERSION).store(VERSION, Relaxed);
        w(H_HEADER_WORDS).store(HEADER_WORDS as u64, Relaxed);
        w(H_RECORD_WORDS).store(RECORD_WORDS as u64, Relaxed);
        w(H_PORT).store(u64::from(port), Relaxed);
        w(H_PORTS).store(ports as u64, Relaxed);
        w(H_PID).store(u64::from(std::process::id()), Relaxed);
        w(H_GENERATION).store(generation, Relaxed);
        w(H_MAGIC).store(MAGIC, Release);
        let placed = file
            .metadata()
            .and_then(|m| std::fs::rename(&building, path).map(|()| (m.dev(), m.ino())));
        let file_id = match placed {
            Ok(id) => id,
            Err(e) => {
                let _ = std::fs::remove_file(&building);
                return Err(err(e));
            }
        };
        Ok(Self {
            map,
            path: path.to_owned(),
            file_id,
            ports,
            last: None,
        })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        self.map
            .word(i)
            .expect("inside the page (sized for `ports`)")
    }
}

impl Drop for StatsPage {
    /// Removes the page, unless another (a transport published again at the
    /// same path) has replaced it there.
    fn drop(&mut self) {
        let ours = std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file_id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl StatsPage {
    /// Whether the page is due a rewrite at `now`.
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.last
            .is_none_or(|t| now.duration_since(t) >= PUBLISH_INTERVAL)
    }

    /// Rewrites the page at `now`: `me`'s port, every port's `peers` entry
    /// and the operations of ours in flight.
    pub(crate) fn write<'a>(
        &mut self,
        now: Instant,
        me: Port,
        peers: &[Peer],
        ops: impl Iterator<Item = &'a OutOp>,
    ) {
        self.last = Some(now);
        let mut out = vec![[0u64; 3]; self.ports];
        for op in ops {
            match &op.kind {
                OutKind::Write { peer, .. } => bump(&mut out, *peer, 0),
                OutKind::Read { peer, .. } | OutKind::ReadSize { peer, .. } => {
                    bump(&mut out, *peer, 1)
                }
                OutKind::Multicast { targets, .. } => {
                    for t in targets {
                        bump(&mut out, t.peer, 2);
                    }
                }
            }
        }
        let seq = self.word(H_SEQ);
        let s = seq.load(Relaxed);
        seq.store(s | 1, Relaxed);
        fence(Release);
        for (p, peer) in peers.iter().enumerate().take(self.ports) {
            let base = HEADER_WORDS + p * RECORD_WORDS;
            let put = |f: usize, v: u64| self.word(base + f).store(v, Relaxed);
            let state = if p == me as usize {
                STATE_US
            } else {
                PublishedState::code(&peer.state)
            };
            let (serving, backlog) = peer
                .conn
                .as_ref()
                .map_or((0, 0), |c| (c.serving(), c.backlog()));
            let c = &peer.counters;
            put(field::STATE, state);
            put(field::OUT_WRITES, out[p][0]);
            put(field::OUT_READS, out[p][1]);
            put(field::OUT_MULTICASTS, out[p][2]);
            put(field::SERVING, serving as u64);
            put(field::RECVS_POSTED, peer.recvs.len() as u64);
            put(field::BACKLOG, backlog as u64);
            put(field::SENDS, c.sends);
            put(field::RECVS, c.recvs);
            put(field::WRITES, c.writes);
            put(field::READS, c.reads);
            put(field::MULTICASTS, c.multicasts);
            put(field::SERVED, c.served);
            put(field::BYTES_OUT, c.bytes_out);
            put(field::BYTES_IN, c.bytes_in);
            put(field::FAILED_OPS, c.failed_ops);
            put(field::EMPTY_POLLS, c.empty_polls);
            put(field::CONNECTS, c.connects);
            put(field::DISCONNECTS, c.disconnects);
            put(field::RESYNCS, c.resyncs);
            for (k, v) in c.dropped.iter().enumerate() {
                put(field::DROPPED + k, *v);
            }
        }
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.word(H_UPDATED_MS).store(ms, Relaxed);
        seq.store((s | 1).wrapping_add(1), Release);
    }
}

fn bump(out: &mut [[u64; 3]], peer: Port, kind: usize) {
    if let Some(o) = out.get_mut(peer as usize) {
        o[kind] += 1;
    }
}

/// Reads the page at `path` (see the module docs): opens it without
/// following a link or waiting on a FIFO, validates its header and size,
/// and copies a consistent snapshot out with `pread` (retrying while the
/// owner is mid-write). Reading, not mapping: a page cut short under the
/// reader by a hostile process is an error, not a `SIGBUS`. A page that is
/// not one, of another version, or cut short is an error saying which; a
/// page whose owner stays mid-write is [`TransportError::StatsMidWrite`].
pub fn read_stats(path: &Path) -> Result<PublishedStats> {
    let bad = |why: String| TransportError::Stats {
        what: format!("{}: {why}", path.display()),
    };
    let file = open_page(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| bad(format!("cannot stat: {e}")))?;
    if !meta.is_file() {
        return Err(bad("not a regular file: not a stats page".into()));
    }
    let len = meta.len();
    if len < (HEADER_WORDS * 8) as u64 {
        return Err(bad(format!(
            "{len} bytes, shorter than a header: not a stats page (or still being created)"
        )));
    }
    let words = |from: usize, n: usize| -> Result<Vec<u64>> {
        let mut bytes = vec![0u8; n * 8];
        file.read_exact_at(&mut bytes, (from * 8) as u64)
            .map_err(|e| {
                bad(format!(
                    "cannot read words {from}..{}: {e} (cut short?)",
                    from + n
                ))
            })?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    };
    let header = words(0, HEADER_WORDS)?;
    if header[H_MAGIC] != MAGIC {
        return Err(bad(
            "no stats-page magic: not a page, or still being created".into(),
        ));
    }
    if header[H_VERSION] != VERSION {
        return Err(bad(format!(
            "layout version {}, this tool reads {VERSION}: use the tool of the same ntbdk",
            header[H_VERSION]
        )));
    }
    let (hw, rw, ports) = (
        header[H_HEADER_WORDS],
        header[H_RECORD_WORDS],
        header[H_PORTS],
    );
    if hw != HEADER_WORDS as u64 || rw != RECORD_WORDS as u64 || ports > MAX_PORTS {
        return Err(bad(format!(
            "bad geometry: header {hw} words, records {rw} words, {ports} ports"
        )));
    }
    let ports = ports as usize;
    let total = HEADER_WORDS + ports * RECORD_WORDS;
    if (total * 8) as u64 > len {
        return Err(bad(format!(
            "{len} bytes cannot hold {ports} ports' records"
        )));
    }
    let port = header[H_PORT];
    if port >= ports as u64 {
        return Err(bad(format!("port {port} outside its {ports} ports")));
    }
    // A sequence lock's reader over `pread`s: the sequence, the whole page,
    // the sequence again. The fences order the loads the kernel makes for
    // us on this thread as they would our own. An owner preempted mid-write
    // on a loaded machine finishes within a scheduling period or two: tried
    // for MID_WRITE_PATIENCE before it is called stuck.
    let since = Instant::now();
    while since.elapsed() < MID_WRITE_PATIENCE {
        let s1 = words(H_SEQ, 1)?[0];
        fence(Acquire);
        if s1 & 1 == 1 {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let page = words(0, total)?;
        fence(Acquire);
        if words(H_SEQ, 1)?[0] == s1 {
            return Ok(snapshot(&|i| page[i], port as Port, ports));
        }
    }
    Err(TransportError::StatsMidWrite {
        path: path.to_owned(),
        pid: header[H_PID] as u32,
        generation: header[H_GENERATION],
    })
}

/// Opens a page for reading: never through a symbolic link, never waiting
/// for a writer (a FIFO planted under a page's name in a world-writable
/// directory would otherwise block the reader for good).
fn open_page(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
}

fn snapshot(w: &dyn Fn(usize) -> u64, port: Port, ports: usize) -> PublishedStats {
    let peers = (0..ports)
        .filter(|&p| p != port as usize)
        .map(|p| {
            let r = |f: usize| w(HEADER_WORDS + p * RECORD_WORDS + f);
            let mut dropped = [0u64; DROP_KINDS];
            for (k, d) in dropped.iter_mut().enumerate() {
                *d = r(field::DROPPED + k);
            }
            PublishedPeer {
                peer: p as Port,
                state: PublishedState::from_code(r(field::STATE)),
                outstanding_writes: r(field::OUT_WRITES),
                outstanding_reads: r(field::OUT_READS),
                outstanding_multicasts: r(field::OUT_MULTICASTS),
                serving: r(field::SERVING),
                recvs_posted: r(field::RECVS_POSTED),
                backlog: r(field::BACKLOG),
                counters: QpCounters {
                    sends: r(field::SENDS),
                    recvs: r(field::RECVS),
                    writes: r(field::WRITES),
                    reads: r(field::READS),
                    multicasts: r(field::MULTICASTS),
                    served: r(field::SERVED),
                    bytes_out: r(field::BYTES_OUT),
                    bytes_in: r(field::BYTES_IN),
                    failed_ops: r(field::FAILED_OPS),
                    dropped,
                    empty_polls: r(field::EMPTY_POLLS),
                    connects: r(field::CONNECTS),
                    disconnects: r(field::DISCONNECTS),
                    resyncs: r(field::RESYNCS),
                },
            }
        })
        .collect();
    PublishedStats {
        port,
        pid: w(H_PID) as u32,
        generation: w(H_GENERATION),
        updated_unix_ms: w(H_UPDATED_MS),
        peers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name a page is built under is the one ntb-tool's clean-up looks
    /// for; a page itself, or another fabric's, is not.
    #[test]
    fn the_building_name_is_the_one_recognised() {
        let dir = Path::new("/nowhere");
        let name = |p: PathBuf| p.file_name().unwrap().to_str().unwrap().to_owned();
        let page = stats_path(dir, "lab", 3);
        assert!(is_page_being_built(&name(building_path(&page)), "lab"));
        assert!(!is_page_being_built(&name(page.clone()), "lab"));
        assert!(!is_page_being_built(&name(building_path(&page)), "la"));
        let other = stats_path(dir, "lab-b", 3);
        assert!(!is_page_being_built(&name(building_path(&other)), "lab"));
    }
}
