//! A peer row for `bench transport`: a 64-byte publish/subscribe ping-pong
//! over iceoryx2's inter-process services (shared memory, polled), between
//! two threads pinned to two cores, each with its own node and ports, as two
//! processes would have them.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use iceoryx2::prelude::*;

use crate::pin;

/// Bytes per message.
pub const MSG: usize = 64;

type Msg = [u8; MSG];

/// A publisher on `out` and a subscriber on `inp`, on a node of our own.
struct Ends {
    _node: Node<ipc::Service>,
    out: iceoryx2::port::publisher::Publisher<ipc::Service, Msg, ()>,
    inp: iceoryx2::port::subscriber::Subscriber<ipc::Service, Msg, ()>,
}

impl Ends {
    fn new(out: &str, inp: &str) -> Result<Self> {
        let node = NodeBuilder::new()
            .create::<ipc::Service>()
            .context("creating an iceoryx2 node")?;
        // What a run killed mid-way left behind (its node is dead) goes
        // first, so that a later run never meets its services.
        node.try_cleanup_dead_nodes();
        let service = |name: &str| {
            let name: ServiceName = name.try_into().context("an iceoryx2 service name")?;
            node.service_builder(&name)
                .publish_subscribe::<Msg>()
                .open_or_create()
                .with_context(|| format!("opening the iceoryx2 service {name}"))
        };
        let out = service(out)?
            .publisher_builder()
            .create()
            .context("creating an iceoryx2 publisher")?;
        let inp = service(inp)?
            .subscriber_builder()
            .create()
            .context("creating an iceoryx2 subscriber")?;
        Ok(Self {
            _node: node,
            out,
            inp,
        })
    }

    fn send(&self, seq: u64) -> Result<()> {
        let mut m = [0u8; MSG];
        m[..8].copy_from_slice(&seq.to_le_bytes());
        self.out.send_copy(m).context("iceoryx2 send")?;
        Ok(())
    }

    /// The sequence number of the next message, if one has arrived.
    fn try_recv(&self) -> Result<Option<u64>> {
        Ok(self
            .inp
            .receive()
            .context("iceoryx2 receive")?
            .map(|s| u64::from_le_bytes(s.payload()[..8].try_into().expect("8 bytes"))))
    }
}

/// `batches` timed batches of `batch` round trips of a 64-byte message
/// between a thread on core `a` (timed) and one on core `b` that echoes
/// each message; returns each batch's duration.
pub fn pingpong(a: usize, b: usize, batch: u64, batches: u64) -> Result<Vec<Duration>> {
    // Unique per run, not only per process (pids repeat in containers).
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tag = format!("ntbdk-bench-{}-{nonce}", std::process::id());
    let (ping, pong) = (format!("{tag}/ping"), format!("{tag}/pong"));
    iceoryx2::prelude::set_log_level(LogLevel::Error);
    let ready = &Barrier::new(2);
    let stop = &AtomicBool::new(false);
    std::thread::scope(|s| {
        let echo = s.spawn(|| -> Result<()> {
            pin(b);
            let ends = Ends::new(&pong, &ping);
            ready.wait();
            let ends = ends?;
            let mut idle = 0u32;
            loop {
                match ends.try_recv()? {
                    Some(seq) => ends.send(seq)?,
                    None => {
                        idle = idle.wrapping_add(1);
                        if idle.is_multiple_of(4096) && stop.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                    }
                }
            }
        });
        pin(a);
        let ends = Ends::new(&ping, &pong);
        ready.wait();
        let r = ends.and_then(|ends| run(&ends, batch, batches));
        stop.store(true, Ordering::Relaxed);
        let echoed = echo.join().expect("the iceoryx2 echo thread panicked");
        let times = r?;
        echoed?;
        Ok(times)
    })
}

/// The timed side: a handshake (the first message is sent again until its
/// echo comes, as a subscriber may connect after it), then the batches.
fn run(ends: &Ends, batch: u64, batches: u64) -> Result<Vec<Duration>> {
    let start = Instant::now();
    'handshake: loop {
        ends.send(0)?;
        let sent = Instant::now();
        while sent.elapsed() < Duration::from_millis(1) {
            if ends.try_recv()? == Some(0) {
                break 'handshake;
            }
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("the iceoryx2 echo never answered");
        }
    }
    // Echoes of repeated handshakes may still come: skip them.
    let end = Instant::now() + Duration::from_millis(5);
    while Instant::now() < end {
        ends.try_recv()?;
    }
    let mut seq = 1u64;
    let mut times = Vec::with_capacity(batches as usize);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..batch {
            ends.send(seq)?;
            let mut spins = 0u64;
            loop {
                match ends.try_recv()? {
                    Some(s) if s == seq => break,
                    Some(s) => bail!("iceoryx2 echoed {s} while {seq} was expected"),
                    None => {
                        spins += 1;
                        if spins.is_multiple_of(1 << 20) && t.elapsed() > Duration::from_secs(10) {
                            bail!("no iceoryx2 echo of {seq} within 10 s");
                        }
                    }
                }
            }
            seq += 1;
        }
        times.push(t.elapsed());
    }
    Ok(times)
}
