//! Waiting for the handshake with the peer, through stale hellos: the
//! mailbox may still hold the hello of another program that ran on the
//! peer's port before (an `ntb-perf`, another geometry), which the peer's
//! `ntb-fwd` replaces once it starts. So a geometry mismatch is reported
//! only if it is still there when the wait gives up.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ntbdk_pmd::hw::Port;
use ntbdk_pmd::transport::{PeerState, Transport};

use crate::cli::session::check_interrupted;

/// Polls `t` until `peer` is connected; fails after `timeout`, saying which
/// flags to align if a hello of another geometry was the last one seen
/// (the peer may have given up and left meanwhile).
pub fn wait_connected(t: &mut Transport, peer: Port, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut mismatch: Option<String> = None;
    loop {
        t.progress();
        let state = t.peer_state(peer);
        match &state {
            PeerState::Connected => return Ok(()),
            PeerState::Failed(reason) => mismatch = Some(reason.clone()),
            PeerState::Lost => {
                bail!("our place on the fabric was lost (another process took our slot?): restart")
            }
            _ => {}
        }
        check_interrupted()?;
        if start.elapsed() >= timeout {
            if let Some(reason) = mismatch {
                bail!(
                    "port {peer} runs another data-queue geometry ({reason}): give both sides \
                     the same --qp, --nb-desc and --buf-size"
                );
            }
            bail!(
                "no handshake with port {peer} within {timeout:?} (it is {state:?}): is it an \
                 {} too, and still running?",
                super::TOOL
            );
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}
