//! The role register: the last scratchpad of a host, where the peer it
//! pairs with says what it is (an `ntb-perf` server or client, an
//! `ntb-pingpong` echo or measuring side), so that an app pairs only with
//! its own counterpart: not with a twin (two servers, two measuring sides),
//! another app, or a host that joined the fabric for a moment (`ntb-tool`).
//! A value is a role's mark and the writer's port, so a stale mark of an
//! earlier peer on that port's place is told apart only by a clear at start
//! ([`clear_role`]).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ntbdk_pmd::hw::{NtbDevice, Port};

/// What a side of a run is, as its role register says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An `ntb-perf --server` (serves).
    Server,
    /// An `ntb-perf` client (measures).
    Client,
    /// An `ntb-pingpong --server` (echoes).
    Echo,
    /// An `ntb-pingpong` measuring side (pings).
    Measure,
}

impl Role {
    /// What the role is, in messages ("an ntb-perf client").
    pub fn describe(self) -> &'static str {
        match self {
            Role::Server => "an ntb-perf --server",
            Role::Client => "an ntb-perf client",
            Role::Echo => "an ntb-pingpong echo side (--server)",
            Role::Measure => "an ntb-pingpong measuring side",
        }
    }

    /// The register value of `role` written by `port`: two letters, then
    /// the port in the low 16 bits.
    fn mark(self, port: Port) -> u32 {
        let letters: u32 = match self {
            Role::Server => 0x5345_0000,  // "SE"
            Role::Client => 0x434C_0000,  // "CL"
            Role::Echo => 0x5045_0000,    // "PE"
            Role::Measure => 0x504D_0000, // "PM"
        };
        letters | u32::from(port)
    }
}

/// Scratchpads a device needs for the role register beside the apps' own
/// (scratchpad 0 at least).
pub const MIN_SPADS: usize = 2;

/// The role register: the last scratchpad (`None` on a device with fewer
/// than [`MIN_SPADS`]).
fn role_spad(dev: &dyn NtbDevice) -> Option<usize> {
    let n = dev.spad_count();
    (n >= MIN_SPADS).then(|| n - 1)
}

/// Tells `peer` that we (`role`) are on the other end: a posted write into
/// its role register.
pub fn announce(dev: &dyn NtbDevice, peer: Port, role: Role) -> Result<()> {
    if let Some(r) = role_spad(dev) {
        dev.peer_spad_write(peer, r, role.mark(dev.port()))?;
    }
    Ok(())
}

/// Whether `peer` announced itself to us as `role` (our own role register).
pub fn announced(dev: &dyn NtbDevice, peer: Port, role: Role) -> bool {
    role_spad(dev).is_some_and(|r| dev.spad_read(r).is_ok_and(|v| v == role.mark(peer)))
}

/// Clears our role register (stale marks of an earlier run). Fails on a
/// device with fewer than [`MIN_SPADS`] scratchpads, saying so: there is
/// no register to pair through.
pub fn clear_role(dev: &dyn NtbDevice) -> Result<()> {
    let Some(r) = role_spad(dev) else {
        bail!(
            "the device has {} scratchpad(s); pairing needs at least {MIN_SPADS} (the last \
             is the role register): make the fabric with more (ntb-tool create --spads)",
            dev.spad_count()
        );
    };
    dev.spad_write(r, 0)?;
    Ok(())
}

/// Tells `peer` we are `mine` (again every 64 looks, as its register may
/// be cleared under us) and waits until it says it is `theirs`, calling
/// `idle` between looks. Fails when `peer` says it is `mine` too (a twin,
/// told once more before we leave: it may have cleared its register after
/// our last word), says nothing for `timeout`, or `idle` fails.
pub fn await_counterpart(
    dev: &dyn NtbDevice,
    peer: Port,
    mine: Role,
    theirs: Role,
    timeout: Duration,
    mut idle: impl FnMut() -> Result<()>,
) -> Result<()> {
    let start = Instant::now();
    let mut looks = 0u32;
    loop {
        if looks.is_multiple_of(64) {
            // A peer that left is noticed by `idle` or the timeout.
            let _ = announce(dev, peer, mine);
        }
        looks = looks.wrapping_add(1);
        if announced(dev, peer, theirs) {
            return Ok(());
        }
        if announced(dev, peer, mine) {
            let _ = announce(dev, peer, mine);
            bail!(
                "port {peer} is {} too, not {}: two cannot pair; run one side with --server",
                mine.describe(),
                theirs.describe()
            );
        }
        idle()?;
        if start.elapsed() >= timeout {
            bail!(
                "port {peer} did not say it is {} within {timeout:?} (is it one, and not another \
                 tool or version?)",
                theirs.describe()
            );
        }
    }
}
