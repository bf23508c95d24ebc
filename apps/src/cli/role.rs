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

/// The role register: the last scratchpad.
fn role_spad(dev: &dyn NtbDevice) -> usize {
    dev.spad_count() - 1
}

/// Tells `peer` that we (`role`) are on the other end: a posted write into
/// its role register.
pub fn announce(dev: &dyn NtbDevice, peer: Port, role: Role) -> Result<()> {
    dev.peer_spad_write(peer, role_spad(dev), role.mark(dev.port()))?;
    Ok(())
}

/// Whether `peer` announced itself to us as `role` (our own role register).
pub fn announced(dev: &dyn NtbDevice, peer: Port, role: Role) -> bool {
    dev.spad_read(role_spad(dev))
        .is_ok_and(|v| v == role.mark(peer))
}

/// Clears our role register (stale marks of an earlier run).
pub fn clear_role(dev: &dyn NtbDevice) -> Result<()> {
    dev.spad_write(role_spad(dev), 0)?;
    Ok(())
}
