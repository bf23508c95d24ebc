//! The out-of-band control channel between an `ntb-perf` client and its
//! servers, through scratchpad registers (where perftest uses a TCP socket).
//!
//! The client writes a command into the server's scratchpads — code,
//! argument, the index of its reply registers — and the sequence number
//! last; the server polls its own sequence register, acts, and answers into
//! the client's scratchpads `2i + 1` (a value) and then `2i` (the sequence
//! number acknowledged), where `i` is the server's index in the client's
//! peer list. Every access is a posted write or a read of one's own
//! registers: nothing reads through the bridge.
//!
//! Roles. The last scratchpad of each side is its *role register*: while a
//! server waits for its first command it keeps writing "server, port P"
//! into its peer's role register, and a client writes "client, port P"
//! into each server's. A side that finds its own kind in its role register
//! has met a twin — two servers, or two clients — and says so instead of
//! waiting for commands (or answers) that will never come.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ntbdk_pmd::hw::{NtbDevice, Port};

use super::{Op, WriteMode};
use crate::cli::role::{Role, announce, announced, await_counterpart, clear_role};

/// Server scratchpad: the sequence number of the current command (written
/// last).
const SP_SEQ: usize = 0;
/// Server scratchpad: the command code.
const SP_CMD: usize = 1;
/// Server scratchpad: the command's argument.
const SP_ARG: usize = 2;
/// Server scratchpad: the index of the client's reply registers.
const SP_IDX: usize = 3;
/// The value a server answers to a command it cannot carry out.
pub const REFUSED: u32 = u32::MAX;

/// What a client asks of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Opens the session: the argument is the client's region key; the
    /// answer is the server's.
    Hello {
        /// The client's data region key.
        client_key: u32,
    },
    /// Asks for the length of the server's data region (the answer).
    RegionLen,
    /// Starts a phase: what the server does besides serving (answer 0).
    Phase(Phase),
    /// Ends the session; the server exits after answering.
    Stop,
    /// What the server posts towards the client in a bidirectional
    /// bandwidth phase ([`Phase::Bidir`]): the client's own load.
    BidirLoad(BidirLoad),
    /// The completion moderation of the next [`BidirLoad`]s (perftest's
    /// `--cq-mod`; a server not told signals every request).
    BidirCqMod {
        /// One request in `cq_mod` signaled.
        cq_mod: u32,
    },
    /// How many operations the server posts in the next bidirectional
    /// phase (perftest's `-n` with `-b`: each side runs its count), or
    /// `None`: until the client's next command (a timed run).
    BidirIters {
        /// Operations (at most `u32::MAX - 1`), or `None`.
        iters: Option<u32>,
    },
    /// Asks for word `0..=3` of what the server did in the last
    /// bidirectional phase ([`BidirResult`]), once it ended.
    BidirResult {
        /// Which word.
        word: u32,
    },
}

/// [`Command::BidirIters`]' argument for "until the next command".
const UNTIL_STOPPED: u32 = u32::MAX;

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Hello { .. } => f.write_str("the session's opening"),
            Command::RegionLen => f.write_str("the length of its region"),
            Command::Phase(p) => write!(f, "the start of a {p} phase"),
            Command::Stop => f.write_str("the end of the session"),
            Command::BidirLoad(l) => write!(f, "a bidirectional load ({:?})", l.op),
            Command::BidirCqMod { cq_mod } => write!(f, "a completion moderation of {cq_mod}"),
            Command::BidirResult { .. } => f.write_str("the result of the bidirectional phase"),
            Command::BidirIters { iters: Some(n) } => write!(f, "a bidirectional count of {n}"),
            Command::BidirIters { iters: None } => f.write_str("a timed bidirectional phase"),
        }
    }
}

/// What a server posts in a bidirectional phase, packed in one argument:
/// the operation (2 bits), the write mode (1), `burst - 1` (12) and
/// `depth - 1` (12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BidirLoad {
    /// The operation.
    pub op: Op,
    /// How writes write.
    pub write_mode: WriteMode,
    /// Work requests per post, 1 to 4096.
    pub burst: u32,
    /// Most outstanding, 1 to 4096.
    pub depth: u32,
}

impl BidirLoad {
    fn pack(self) -> u32 {
        let op = match self.op {
            Op::Write => 0,
            Op::Read => 1,
            Op::Send => 2,
        };
        let mode = u32::from(self.write_mode == WriteMode::Rendezvous);
        op | mode << 2
            | (self.burst.clamp(1, 4096) - 1) << 3
            | (self.depth.clamp(1, 4096) - 1) << 15
    }

    fn unpack(v: u32) -> Option<Self> {
        let op = match v & 3 {
            0 => Op::Write,
            1 => Op::Read,
            2 => Op::Send,
            _ => return None,
        };
        if v >> 27 != 0 {
            return None;
        }
        Some(Self {
            op,
            write_mode: if v >> 2 & 1 == 1 {
                WriteMode::Rendezvous
            } else {
                WriteMode::Direct
            },
            burst: (v >> 3 & 0xfff) + 1,
            depth: (v >> 15 & 0xfff) + 1,
        })
    }
}

/// What a server did in a bidirectional phase, as [`Command::BidirResult`]
/// hands it over a word at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BidirResult {
    /// Operations it completed.
    pub done: u64,
    /// From its first post to its last completion, in microseconds.
    pub micros: u32,
    /// Its peak message rate, millions per second.
    pub peak_mpps: f32,
}

impl BidirResult {
    /// Word `i`: the low and high halves of `done`, `micros`, and the bits
    /// of `peak_mpps`; `None` past the last.
    pub fn word(&self, i: u32) -> Option<u32> {
        match i {
            0 => Some(self.done as u32),
            1 => Some((self.done >> 32) as u32),
            2 => Some(self.micros),
            3 => Some(self.peak_mpps.to_bits()),
            _ => None,
        }
    }

    /// The result from its four words.
    pub fn from_words(w: [u32; 4]) -> Self {
        Self {
            done: u64::from(w[0]) | u64::from(w[1]) << 32,
            micros: w[2],
            peak_mpps: f32::from_bits(w[3]),
        }
    }
}

/// What the server does during a phase, besides serving writes and reads
/// and reposting receives (which it always does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing more (bandwidth tests, read latency).
    Passive,
    /// Echoes every message received with a send of the same length
    /// (`ib_send_lat`).
    SendEcho,
    /// Answers every write placed into its region with a write of `size`
    /// bytes into the client's region (`ib_write_lat`).
    WriteEcho {
        /// Bytes of each answering write.
        size: u32,
    },
    /// Polls the last byte of the first `size` bytes of its region for the
    /// next value of the sequence 1, 2, ..., 255, 1, ... and answers each
    /// with a one-sided write of `size` bytes ending in that value into the
    /// client's region (`ib_write_lat`).
    WriteDirectEcho {
        /// Bytes of each write, both ways.
        size: u32,
    },
    /// Posts the [`BidirLoad`] of `size` bytes towards the client until the
    /// next command (bidirectional bandwidth, `-b`).
    Bidir {
        /// Bytes per operation.
        size: u32,
    },
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Phase::Passive => f.write_str("passive"),
            Phase::SendEcho => f.write_str("send echo"),
            Phase::WriteEcho { size } => write!(f, "{size} B write echo"),
            Phase::WriteDirectEcho { size } => write!(f, "{size} B one-sided write echo"),
            Phase::Bidir { size } => write!(f, "{size} B bidirectional"),
        }
    }
}

impl Command {
    fn encode(self) -> (u32, u32) {
        match self {
            Command::Hello { client_key } => (1, client_key),
            Command::RegionLen => (2, 0),
            Command::Phase(Phase::Passive) => (3, 0),
            Command::Phase(Phase::SendEcho) => (4, 0),
            Command::Phase(Phase::WriteEcho { size }) => (5, size),
            Command::Stop => (6, 0),
            Command::Phase(Phase::WriteDirectEcho { size }) => (7, size),
            Command::BidirLoad(load) => (8, load.pack()),
            Command::Phase(Phase::Bidir { size }) => (9, size),
            Command::BidirResult { word } => (10, word),
            Command::BidirCqMod { cq_mod } => (11, cq_mod),
            // (Code 12 was this command's first form, where 0 meant "until
            // stopped": refused now, so the two versions do not mix.)
            Command::BidirIters { iters } => (13, iters.unwrap_or(UNTIL_STOPPED)),
        }
    }

    fn decode(code: u32, arg: u32) -> Option<Self> {
        Some(match code {
            1 => Command::Hello { client_key: arg },
            2 => Command::RegionLen,
            3 => Command::Phase(Phase::Passive),
            4 => Command::Phase(Phase::SendEcho),
            5 => Command::Phase(Phase::WriteEcho { size: arg }),
            6 => Command::Stop,
            7 => Command::Phase(Phase::WriteDirectEcho { size: arg }),
            8 => Command::BidirLoad(BidirLoad::unpack(arg)?),
            9 => Command::Phase(Phase::Bidir { size: arg }),
            10 => Command::BidirResult { word: arg },
            11 => Command::BidirCqMod { cq_mod: arg },
            13 => Command::BidirIters {
                iters: (arg != UNTIL_STOPPED).then_some(arg),
            },
            _ => return None,
        })
    }
}

/// Most servers one client can talk to (two reply registers each; the last
/// scratchpad is the role register).
pub fn max_servers(dev: &dyn NtbDevice) -> usize {
    dev.spad_count().saturating_sub(1) / 2
}

/// The client's end of the channel to one server.
pub struct ClientControl {
    dev: Arc<dyn NtbDevice>,
    server: Port,
    index: usize,
    seq: u32,
}

impl ClientControl {
    /// The channel to `server`, answering into our reply registers `index`.
    pub fn new(dev: Arc<dyn NtbDevice>, server: Port, index: usize) -> Result<Self> {
        if index >= max_servers(dev.as_ref()) {
            bail!(
                "at most {} servers per client ({} scratchpads, two per server)",
                max_servers(dev.as_ref()),
                dev.spad_count()
            );
        }
        // Our reply registers start from zero: a stale answer must not
        // acknowledge a new command.
        dev.spad_write(2 * index, 0)?;
        if index == 0 {
            clear_role(dev.as_ref())?;
        }
        Ok(Self {
            dev,
            server,
            index,
            seq: 0,
        })
    }

    /// The server's port.
    pub fn server(&self) -> Port {
        self.server
    }

    /// Before the first command: tells the server we are a client and
    /// waits until it says it is a server
    /// ([`await_counterpart`]).
    pub fn await_server(&self, timeout: Duration, idle: impl FnMut() -> Result<()>) -> Result<()> {
        await_counterpart(
            self.dev.as_ref(),
            self.server,
            Role::Client,
            Role::Server,
            timeout,
            idle,
        )
    }

    /// Sends `cmd` and waits for the answer, calling `idle` between polls
    /// (to keep the transport progressing). Fails after `timeout`, when
    /// `idle` fails, or when the server refuses.
    pub fn call(
        &mut self,
        cmd: Command,
        timeout: Duration,
        mut idle: impl FnMut() -> Result<()>,
    ) -> Result<u32> {
        self.call_while_busy(cmd, timeout, || idle().map(|()| false))
    }

    /// [`call`](Self::call) for a command the server answers once it has
    /// finished work we see progress on: `idle` says whether the work moved
    /// since its last call, and `timeout` counts from the last move.
    pub fn call_while_busy(
        &mut self,
        cmd: Command,
        timeout: Duration,
        mut idle: impl FnMut() -> Result<bool>,
    ) -> Result<u32> {
        self.seq = self.seq.wrapping_add(1).max(1);
        let (code, arg) = cmd.encode();
        let peer = self.server;
        self.dev.peer_spad_write(peer, SP_CMD, code)?;
        self.dev.peer_spad_write(peer, SP_ARG, arg)?;
        self.dev.peer_spad_write(peer, SP_IDX, self.index as u32)?;
        self.dev.peer_spad_write(peer, SP_SEQ, self.seq)?;
        let mut start = Instant::now();
        let mut polls = 0u32;
        loop {
            if self.dev.spad_read(2 * self.index)? == self.seq {
                let v = self.dev.spad_read(2 * self.index + 1)?;
                if v == REFUSED {
                    bail!(
                        "the server on port {peer} refused {cmd}: is it the same ntb-perf \
                         version?"
                    );
                }
                return Ok(v);
            }
            if idle()? {
                start = Instant::now();
            }
            // A server that died or left is not waited for until the
            // timeout: its link goes down (the fabric's dead-peer
            // detection, a heartbeat of at most a few seconds).
            polls = polls.wrapping_add(1);
            // (Its answer is read once more first: a server that answers
            // `Stop` leaves at once, possibly between our two reads.)
            if polls.is_multiple_of(256)
                && !self.dev.link(peer)?.up
                && self.dev.spad_read(2 * self.index)? != self.seq
            {
                bail!(
                    "the server on port {peer} is gone (its link went down: it exited or was \
                     killed) while we waited for it to answer {cmd}"
                );
            }
            if start.elapsed() >= timeout {
                bail!(
                    "the server on port {peer} did not answer {cmd} within {timeout:?}: \
                     is it an ntb-perf --server, and still running?"
                );
            }
        }
    }
}

/// The server's end: polls its own registers for commands.
pub struct ServerControl {
    dev: Arc<dyn NtbDevice>,
    last: u32,
}

/// A command received, to be answered with [`ServerControl::reply`].
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// The command (`None`: an unknown code, answer [`REFUSED`]).
    pub cmd: Option<Command>,
    seq: u32,
    index: usize,
}

impl ServerControl {
    /// The server's end on `dev`; clears the sequence and role registers.
    pub fn new(dev: Arc<dyn NtbDevice>) -> Result<Self> {
        dev.spad_write(SP_SEQ, 0)?;
        clear_role(dev.as_ref())?;
        Ok(Self { dev, last: 0 })
    }

    /// Waits for a client: the first peer whose link is up and that told
    /// us it is an `ntb-perf` client (other servers on the fabric, waiting
    /// too, are not taken for one). Calls `idle` between looks (to let the
    /// transport's handshakes go on: a client says what it is once
    /// connected). Fails as [`wait_peers`](crate::cli::session::wait_peers)
    /// does: after `timeout`, saying `start_hint`, on Ctrl-C, or when
    /// `idle` fails.
    pub fn await_client(
        &self,
        place: &str,
        timeout: Option<Duration>,
        start_hint: &str,
        idle: impl FnMut() -> Result<()>,
    ) -> Result<Port> {
        let dev = self.dev.as_ref();
        let is_client = |p| announced(dev, p, Role::Client);
        let found = crate::cli::session::wait_peers_where(
            dev,
            place,
            &[],
            1,
            timeout,
            start_hint,
            is_client,
            idle,
        )?;
        Ok(found[0])
    }

    /// Before the first command: tells `client` we are a server, and fails
    /// when it told us the same (two servers never pair).
    pub fn check_peer_role(&self, client: Port) -> Result<()> {
        // Look first: a twin that told us and left already cannot be told.
        let twin = announced(self.dev.as_ref(), client, Role::Server);
        // Told again even when leaving: the twin may have cleared its
        // register after our last word. A peer that left already is noticed
        // by the caller (its link is down), so a failure here is ignored.
        let _ = announce(self.dev.as_ref(), client, Role::Server);
        if twin {
            bail!(
                "port {client} is another ntb-perf --server: two servers cannot pair; start \
                 the other side without --server (the client measures)"
            );
        }
        Ok(())
    }

    /// A new command, if the client wrote one since the last call.
    pub fn poll(&mut self) -> Option<Received> {
        let seq = self.dev.spad_read(SP_SEQ).ok()?;
        if seq == self.last {
            return None;
        }
        self.last = seq;
        let code = self.dev.spad_read(SP_CMD).ok()?;
        let arg = self.dev.spad_read(SP_ARG).ok()?;
        let index = self.dev.spad_read(SP_IDX).ok()? as usize;
        Some(Received {
            cmd: Command::decode(code, arg),
            seq,
            index,
        })
    }

    /// Answers `rx` with `value` into `client`'s reply registers.
    pub fn reply(&self, client: Port, rx: &Received, value: u32) -> Result<()> {
        if 2 * rx.index + 1 >= self.dev.spad_count() {
            bail!(
                "the client named reply registers {} that do not exist",
                rx.index
            );
        }
        self.dev.peer_spad_write(client, 2 * rx.index + 1, value)?;
        self.dev.peer_spad_write(client, 2 * rx.index, rx.seq)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_survive_their_encoding() {
        let loads = [
            BidirLoad {
                op: Op::Write,
                write_mode: WriteMode::Direct,
                burst: 1,
                depth: 4096,
            },
            BidirLoad {
                op: Op::Send,
                write_mode: WriteMode::Rendezvous,
                burst: 4096,
                depth: 1,
            },
            BidirLoad {
                op: Op::Read,
                write_mode: WriteMode::Direct,
                burst: 32,
                depth: 128,
            },
        ];
        for cmd in loads.map(Command::BidirLoad).into_iter().chain([
            Command::Phase(Phase::Bidir { size: 8 << 20 }),
            Command::BidirResult { word: 3 },
            Command::BidirCqMod { cq_mod: 100 },
            Command::BidirIters { iters: Some(2000) },
            Command::BidirIters { iters: Some(0) },
            Command::BidirIters { iters: None },
            Command::Phase(Phase::WriteDirectEcho { size: 64 }),
        ]) {
            let (code, arg) = cmd.encode();
            assert_eq!(Command::decode(code, arg), Some(cmd));
        }
        assert_eq!(Command::decode(8, 3), None, "no fourth operation");
        assert_eq!(Command::decode(8, 1 << 27), None, "bits past the depth");
    }

    #[test]
    fn bidir_results_go_by_words() {
        let r = BidirResult {
            done: (7 << 32) | 5,
            micros: 200_000,
            peak_mpps: 12.5,
        };
        let words = [0, 1, 2, 3].map(|i| r.word(i).unwrap());
        assert_eq!(BidirResult::from_words(words), r);
        assert_eq!(r.word(4), None);
    }
}
