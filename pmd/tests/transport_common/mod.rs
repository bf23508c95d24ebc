//! Helpers shared by the transport tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ntbdk_pmd::hw::Port;
use ntbdk_pmd::hw::loopback::{LoopbackDevice, LoopbackFabric};
use ntbdk_pmd::transport::{Completion, Config, Geometry, Transport};

/// Runs `scenario` until a run reaches its check (`Some`, with the
/// check's verdict), at most 8 times: for a scenario that depends on a poll
/// order the transport does not fix (its housekeeping runs every 64th
/// poll), so that a rare run that missed it is tried again rather than
/// passing unchecked. Panics, saying `missed`, when no run reached it.
pub fn until_reached(missed: &str, mut scenario: impl FnMut() -> Option<bool>) -> bool {
    (0..8)
        .find_map(|_| scenario())
        .unwrap_or_else(|| panic!("{missed}"))
}

/// A tiny deterministic generator (xorshift64*), so tests need no extra crates.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    /// Splits `len` into 1..=max_parts random positive pieces.
    pub fn split(&mut self, len: u64, max_parts: u64) -> Vec<u64> {
        let parts = 1 + self.below(max_parts.min(len));
        let mut cuts: Vec<u64> = (1..parts).map(|_| 1 + self.below(len - 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = Vec::new();
        let mut prev = 0;
        for c in cuts {
            out.push(c - prev);
            prev = c;
        }
        out.push(len - prev);
        out
    }
}

/// Transports on a loopback fabric, all connected to each other.
pub fn loopback(
    n: u16,
    window: usize,
    geometry: Geometry,
) -> (Arc<LoopbackFabric>, Vec<Transport>) {
    loopback_with(n, window, |_| Config::new(geometry))
}

/// [`loopback`] with each port's configuration from `cfg`.
pub fn loopback_with(
    n: u16,
    window: usize,
    cfg: impl Fn(Port) -> Config,
) -> (Arc<LoopbackFabric>, Vec<Transport>) {
    let fabric = LoopbackFabric::new(n, window);
    let ts: Vec<Transport> = (0..n)
        .map(|p| {
            let dev: Arc<LoopbackDevice> = Arc::new(fabric.join(p).unwrap());
            Transport::new(dev, cfg(p)).unwrap()
        })
        .collect();
    let mut ts = ts;
    connect_all(&mut ts);
    (fabric, ts)
}

pub fn connect_all(ts: &mut [Transport]) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        for t in ts.iter_mut() {
            t.progress();
        }
        let all = ts.iter().all(|t| {
            ts.iter()
                .all(|u| u.port() == t.port() || t.is_connected(u.port()))
        });
        if all {
            return;
        }
        if Instant::now() >= end {
            let states: Vec<_> = ts
                .iter()
                .map(|t| {
                    let peers: Vec<_> = ts
                        .iter()
                        .filter(|u| u.port() != t.port())
                        .map(|u| (u.port(), t.peer_state(u.port())))
                        .collect();
                    (t.port(), peers)
                })
                .collect();
            panic!("transports did not connect: {states:?}");
        }
        std::thread::yield_now();
    }
}

/// Polls every transport until `want` completions have been collected from
/// transport `who` (others just progress). Panics after 20 s.
pub fn collect(ts: &mut [Transport], who: usize, want: usize) -> Vec<Completion> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    let mut buf = [Completion::default(); 32];
    while got.len() < want {
        for (i, t) in ts.iter_mut().enumerate() {
            if i == who {
                let n = t.poll_completions(&mut buf);
                got.extend_from_slice(&buf[..n]);
            } else {
                t.progress();
            }
        }
        assert!(
            Instant::now() < end,
            "only {} of {want} completions",
            got.len()
        );
    }
    got
}

/// Drains whatever completions `t` has now.
pub fn drain(t: &mut Transport) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut buf = [Completion::default(); 32];
    loop {
        let n = t.poll_completions(&mut buf);
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

pub fn port_of(t: &Transport) -> Port {
    t.port()
}

// ---- hosts: a transport plus inboxes of received messages ----

use std::collections::{HashMap, VecDeque};

use ntbdk_pmd::transport::{Access, OpKind, Qp, RegionKey, Sge, Status};

/// Cookies of posted receives carry this bit.
pub const RECV_BIT: u64 = 1 << 63;

/// A transport with receives posted to every peer, inboxes of the messages
/// received, and the completions of other operations by cookie.
pub struct Host {
    pub t: Transport,
    pub recv_region: RegionKey,
    pub slots: u64,
    pub slot_size: u64,
    pub inbox: HashMap<Port, VecDeque<Vec<u8>>>,
    pub done: HashMap<u64, Completion>,
    pub mc: VecDeque<Completion>,
    pub ports: u16,
}

impl Host {
    pub fn new(mut t: Transport, ports: u16, slots: u64) -> Host {
        let slot_size = u64::from(t.layout().geometry().eager_size);
        let recv_region = t
            .register_region((ports as u64 * slots * slot_size) as usize, Access::LOCAL)
            .unwrap();
        let mut h = Host {
            t,
            recv_region,
            slots,
            slot_size,
            inbox: HashMap::new(),
            done: HashMap::new(),
            mc: VecDeque::new(),
            ports,
        };
        for p in 0..ports {
            if p != h.t.port() {
                h.t.create_qp(p).unwrap();
                for s in 0..slots {
                    h.repost(p, s);
                }
            }
        }
        h
    }

    fn repost(&mut self, p: Port, s: u64) {
        let qp = self.t.create_qp(p).unwrap();
        let off = (p as u64 * self.slots + s) * self.slot_size;
        let sge = Sge {
            key: self.recv_region,
            offset: off,
            len: self.slot_size,
        };
        self.t
            .post_recv(qp, sge, RECV_BIT | (u64::from(p) << 16) | s)
            .unwrap();
    }

    /// Polls once; files what completed.
    pub fn pump(&mut self) {
        let mut buf = [Completion::default(); 64];
        let n = self.t.poll_completions(&mut buf);
        if n == 0 {
            // Test machines have fewer cores than spinning hosts.
            std::thread::yield_now();
        }
        for c in &buf[..n] {
            if c.cookie & RECV_BIT != 0 && c.op == OpKind::Recv {
                let p = ((c.cookie >> 16) & 0xffff) as Port;
                let s = c.cookie & 0xffff;
                if c.status == Status::Success {
                    let mut v = vec![0u8; c.bytes as usize];
                    let off = (p as u64 * self.slots + s) * self.slot_size;
                    self.t.region_read(self.recv_region, off, &mut v).unwrap();
                    self.inbox.entry(p).or_default().push_back(v);
                }
                if c.status != Status::Flushed {
                    self.repost(p, s);
                }
            } else if c.op == OpKind::MulticastRecv {
                self.mc.push_back(*c);
            } else if c.op == OpKind::Send {
                // Eager sends complete at once; nothing to check beyond status.
                assert_eq!(c.status, Status::Success);
            } else {
                let dup = self.done.insert(c.cookie, *c);
                assert!(
                    dup.is_none(),
                    "completion for cookie {} delivered twice",
                    c.cookie
                );
            }
        }
    }

    /// Re-posts the receives of a peer after its connection reset them.
    pub fn repost_all(&mut self, p: Port) {
        for s in 0..self.slots {
            self.repost(p, s);
        }
    }

    pub fn qp(&mut self, p: Port) -> Qp {
        self.t.create_qp(p).unwrap()
    }

    /// Sends `msg` to `p`, retrying while the queue is busy.
    pub fn send(&mut self, p: Port, msg: &[u8]) {
        let qp = self.qp(p);
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            match self.t.post_send(qp, msg, 0) {
                Ok(()) => return,
                Err(ntbdk_pmd::transport::TransportError::Busy { .. }) => self.pump(),
                Err(e) => panic!("send to {p}: {e}"),
            }
            assert!(Instant::now() < end, "send to {p} stuck");
        }
    }

    /// The next message from `p`, within `limit`.
    pub fn recv(&mut self, p: Port, limit: Duration) -> Vec<u8> {
        let end = Instant::now() + limit;
        loop {
            if let Some(m) = self.inbox.get_mut(&p).and_then(|q| q.pop_front()) {
                return m;
            }
            self.pump();
            assert!(
                Instant::now() < end,
                "no message from port {p} within {limit:?}"
            );
        }
    }

    /// The completion of `cookie`, within `limit`.
    pub fn wait(&mut self, cookie: u64, limit: Duration) -> Completion {
        let end = Instant::now() + limit;
        loop {
            if let Some(c) = self.done.remove(&cookie) {
                return c;
            }
            self.pump();
            assert!(
                Instant::now() < end,
                "no completion for cookie {cookie} within {limit:?}"
            );
        }
    }
}

/// FNV-1a, to compare large buffers across processes.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

// ---- child processes ----

#[path = "../child_roles/mod.rs"]
mod child_roles;
#[allow(unused_imports)] // not every test crate runs children
pub use child_roles::{RoleChild, TestDir, child_role, death_bound, env};
