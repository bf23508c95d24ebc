//! The role register: the last scratchpad of a host, where the peer it
//! pairs with says what it is (an `ntb-perf` server or client, an
//! `ntb-pingpong` echo or measuring side), so that an app pairs only with
//! its own counterpart: not with a twin (two servers, two measuring sides),
//! another app, or a host that joined the fabric for a moment (`ntb-tool`).
//! A value is a role's mark and the writer's port, so a stale mark of an
//! earlier peer on that port's place is told apart only by a clear at start
//! ([`clear_role`]).

use anyhow::Result;
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
        anyhow::bail!(
            "the device has {} scratchpad(s); pairing needs at least {MIN_SPADS} (the last \
             is the role register): make the fabric with more (ntb-tool create --spads)",
            dev.spad_count()
        );
    };
    dev.spad_write(r, 0)?;
    Ok(())
}
