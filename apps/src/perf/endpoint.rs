//! One side of an `ntb-perf` run: the transport over an emulated device, its
//! data region (the source and target of writes and reads) and its receive
//! buffers, sized so that the largest message fits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ntbdk_pmd::hw::emu::FabricConfig;
use ntbdk_pmd::hw::{NtbDevice, Port};
use ntbdk_pmd::transport::{
    Access, Config, DataQueues, Geometry, Qp, RegionKey, Sge, Transport, TransportError,
};

use crate::cli::session::check_interrupted;
use crate::cli::units::MAX_SIZE;

/// Slots per message queue: deep enough for bursts of 32 with a window of
/// 128 outstanding operations.
pub const QUEUE_DEPTH: u32 = 256;
/// Eager buffers each sender may hold in a receiver's window.
pub const EAGER_COUNT: u32 = 128;
/// Largest `send` message (bytes of one eager buffer).
pub const EAGER_SIZE: u32 = 4096;
/// Receives kept posted per peer.
pub const RECVS: usize = 256;
/// Heartbeat timeout of the fabrics ntb-perf and ntb-fwd create: generous,
/// because two spinning processes on a small, busy machine can starve a
/// heartbeat thread for a while.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// The transport geometry for a fabric of `ports` ports (the same on every
/// side, or the handshake fails).
pub fn geometry(ports: usize) -> Geometry {
    Geometry {
        ports: ports as u16,
        queue_depth: QUEUE_DEPTH,
        eager_count: EAGER_COUNT,
        eager_size: EAGER_SIZE,
        data: DataQueues::NONE,
    }
}

/// Bytes of region area one side needs: its receive buffers and a data
/// region of the largest message.
fn region_bytes() -> usize {
    RECVS * EAGER_SIZE as usize + MAX_SIZE as usize + 64 * 1024
}

/// The window size that holds the queues of `ports` ports, the receive
/// buffers and an 8 MiB data region, rounded up to a MiB.
pub fn window_size(ports: usize) -> usize {
    let layout = geometry(ports)
        .layout()
        .expect("the constant geometry is valid");
    layout
        .window_size_for(region_bytes())
        .next_multiple_of(1 << 20)
}

/// The fabric ntb-perf creates for `slots` ports: windows that hold the
/// largest message plus queues, a generous heartbeat timeout.
///
/// ```
/// use ntbdk_apps::perf::fabric_config;
/// let cfg = fabric_config(2);
/// assert!(cfg.window_size >= (8 << 20) + (1 << 20));
/// ```
pub fn fabric_config(slots: usize) -> FabricConfig {
    FabricConfig {
        slots,
        window_size: window_size(slots),
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        ..FabricConfig::default()
    }
}

/// A transport with a data region and posted receives.
pub struct Endpoint {
    /// The transport.
    pub t: Transport,
    /// The data region: source of our writes, target of the peer's, source
    /// and target of reads (all access).
    pub data: RegionKey,
    /// Its length.
    pub data_len: u64,
    recv: RegionKey,
}

impl Endpoint {
    /// Waits for the transport handshake with `peer` for at most `timeout`,
    /// in slices so that Ctrl-C ends the wait; a failure names the port and
    /// adds `hint`.
    pub fn wait_connected(&mut self, peer: Port, timeout: Duration, hint: &str) -> Result<()> {
        const SLICE: Duration = Duration::from_millis(50);
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            match self.t.wait_connected(peer, left.min(SLICE)) {
                Ok(()) => return Ok(()),
                Err(TransportError::ConnectTimeout { .. }) if left > SLICE => check_interrupted()?,
                Err(e) => {
                    let e = match e {
                        TransportError::ConnectTimeout { peer, state, .. } => {
                            TransportError::ConnectTimeout {
                                peer,
                                timeout,
                                state,
                            }
                        }
                        e => e,
                    };
                    bail!("connecting to port {peer}: {}: {hint}", connect_failure(&e));
                }
            }
        }
    }

    /// Creates the transport on `dev` (operations time out after
    /// `op_timeout`) and registers the receive buffers and the data region.
    pub fn new(dev: Arc<dyn NtbDevice>, op_timeout: Duration) -> Result<Self> {
        let ports = dev.port_count();
        let mut cfg = Config::new(geometry(ports));
        cfg.op_timeout = op_timeout;
        // Sends complete only when their request asks (verbs' `sq_sig_all`
        // off): the bandwidth pump signals one in `--cq-mod`, and nothing
        // else waits for a send's completion.
        cfg.signal_sends = false;
        let window = dev.mw_geometry(0).map(|g| g.size).unwrap_or(0);
        let mut t = Transport::new(dev, cfg).with_context(|| {
            format!(
                "setting up the transport on a {window}-byte window (needs {}): \
                 was the fabric created by another tool? recreate it with ntb-perf --server",
                window_size(ports)
            )
        })?;
        let recv = t
            .register_region(RECVS * EAGER_SIZE as usize, Access::LOCAL)
            .context("registering the receive buffers")?;
        let free = t.region_area_free() & !4095;
        let data_len = MAX_SIZE.min(free);
        if data_len < 4096 {
            bail!(
                "the window has no room for a data region ({free} bytes free): \
                 recreate the fabric with larger windows (ntb-perf --server creates one)"
            );
        }
        let data = t
            .register_region(data_len as usize, Access::ALL)
            .context("registering the data region")?;
        // Recognisable bytes, so a copy that moved nothing would show.
        let pattern: Vec<u8> = (0..data_len.min(1 << 16)).map(|i| i as u8).collect();
        let mut at = 0;
        while at < data_len {
            let n = pattern.len().min((data_len - at) as usize);
            t.region_write(data, at, &pattern[..n])?;
            at += n as u64;
        }
        Ok(Self {
            t,
            data,
            data_len,
            recv,
        })
    }

    /// Posts receives towards `qp`, one per receive buffer.
    pub fn post_recvs(&mut self, qp: Qp) -> Result<()> {
        for i in 0..RECVS as u64 {
            self.repost(qp, i)?;
        }
        Ok(())
    }

    /// Posts receive buffer `cookie` again (after its message was consumed).
    pub fn repost(&mut self, qp: Qp, cookie: u64) -> Result<(), TransportError> {
        let sge = Sge {
            key: self.recv,
            offset: (cookie % RECVS as u64) * u64::from(EAGER_SIZE),
            len: u64::from(EAGER_SIZE),
        };
        self.t.post_recv(qp, sge, cookie)
    }

    /// Copies the message in receive buffer `cookie` into `out`.
    pub fn read_recv(&self, cookie: u64, out: &mut [u8]) -> Result<(), TransportError> {
        let off = (cookie % RECVS as u64) * u64::from(EAGER_SIZE);
        self.t.region_read(self.recv, off, out)
    }
}

/// Why connecting failed, without the library's advice to its callers.
pub fn connect_failure(e: &TransportError) -> String {
    match e {
        TransportError::ConnectTimeout { timeout, .. } => {
            format!("no transport handshake within {timeout:?}")
        }
        TransportError::HandshakeFailed { reason, .. } => {
            format!(
                "the transport handshake failed ({reason}): are both sides the same ntbdk version?"
            )
        }
        other => other.to_string(),
    }
}
