//! The role register: the last scratchpad of a host, where the peer it
//! pairs with says what it is (an `ntb-perf` server or client, an
//! `ntb-pingpong` echo or measuring side), so that an app pairs only with
//! its own counterpart: not with a twin (two servers, two measuring sides),
//! another app, or a host that joined the fabric for a moment (`ntb-tool`).
//! A value is a role's mark and the writer's port, so a stale mark of an
//! earlier peer on that port's place is told apart only by a clear at start
//! ([`clear_role`]). An `ntb-pingpong` side's mark also says which
//! registers it ping-pongs through, so that two sides given different
//! `--via`s say so at once instead of waiting out the timeout.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::ValueEnum;
use ntbdk_pmd::hw::{NtbDevice, Port};

/// What a side of a run is, as its role register says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An `ntb-perf --server` (serves).
    Server,
    /// An `ntb-perf` client (measures).
    Client,
    /// An `ntb-pingpong --server` (echoes) through these registers.
    Echo(Via),
    /// An `ntb-pingpong` measuring side (pings) through these registers.
    Measure(Via),
}

/// Through which registers an `ntb-pingpong` run ping-pongs (`--via`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// Doorbell bits.
    Db,
    /// Scratchpad registers.
    Spad,
}

impl Via {
    /// The registers, in messages ("doorbell").
    pub fn describe(self) -> &'static str {
        match self {
            Via::Db => "doorbell",
            Via::Spad => "scratchpad",
        }
    }

    /// Bytes a ping carries (a scratchpad is one 32-bit register; a
    /// doorbell carries no payload).
    pub fn bytes(self) -> u64 {
        match self {
            Via::Db => 0,
            Via::Spad => 4,
        }
    }

    /// The other one.
    fn other(self) -> Via {
        match self {
            Via::Db => Via::Spad,
            Via::Spad => Via::Db,
        }
    }
}

impl Role {
    /// What the role is, in messages ("an ntb-perf client").
    pub fn describe(self) -> String {
        match self {
            Role::Server => "an ntb-perf --server".into(),
            Role::Client => "an ntb-perf client".into(),
            Role::Echo(via) => format!(
                "an ntb-pingpong echo side (--server) via {}",
                via.describe()
            ),
            Role::Measure(via) => format!("an ntb-pingpong measuring side via {}", via.describe()),
        }
    }

    /// The same role through the other registers, for an `ntb-pingpong`
    /// side (`None` for the others).
    fn with_other_via(self) -> Option<Role> {
        match self {
            Role::Echo(via) => Some(Role::Echo(via.other())),
            Role::Measure(via) => Some(Role::Measure(via.other())),
            Role::Server | Role::Client => None,
        }
    }

    /// The register value of `role` written by `port`: two letters, then
    /// the port in the low 16 bits.
    fn mark(self, port: Port) -> u32 {
        let letters: u32 = match self {
            Role::Server => 0x5345_0000,             // "SE"
            Role::Client => 0x434C_0000,             // "CL"
            Role::Echo(Via::Db) => 0x5045_0000,      // "PE"
            Role::Measure(Via::Db) => 0x504D_0000,   // "PM"
            Role::Echo(Via::Spad) => 0x5365_0000,    // "Se"
            Role::Measure(Via::Spad) => 0x536D_0000, // "Sm"
        };
        letters | u32::from(port)
    }
}

/// Fails when `peer` announced itself to us as `wanted` but through the
/// other registers: two `ntb-pingpong` sides given different `--via`s. It
/// tells `peer` what we are (`mine`) first, so that it fails as clearly.
pub fn check_same_via(dev: &dyn NtbDevice, peer: Port, mine: Role, wanted: Role) -> Result<()> {
    if let Some(other) = wanted.with_other_via()
        && announced(dev, peer, other)
    {
        let _ = announce(dev, peer, mine);
        bail!(
            "port {peer} is {}, and this side is {}: give both sides the same --via",
            other.describe(),
            mine.describe()
        );
    }
    Ok(())
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
/// our last word), is `theirs` through the other registers
/// ([`check_same_via`]), says nothing for `timeout`, or `idle` fails.
pub fn await_counterpart(
    dev: &dyn NtbDevice,
    peer: Port,
    mine: Role,
    theirs: Role,
    timeout: Duration,
    mut idle: impl FnMut() -> Result<()>,
) -> Result<()> {
    // `Ok(true)` once `peer` says it is `theirs`; the error when it says it
    // is `theirs` through the other registers, or a twin.
    let marks = || -> Result<bool> {
        if announced(dev, peer, theirs) {
            return Ok(true);
        }
        check_same_via(dev, peer, mine, theirs)?;
        // A twin, through the same registers or the other ones.
        if let Some(twin) = [Some(mine), mine.with_other_via()]
            .into_iter()
            .flatten()
            .find(|&r| announced(dev, peer, r))
        {
            let _ = announce(dev, peer, mine);
            bail!(
                "port {peer} is {} too, not {}: two cannot pair; run one side with --server",
                twin.describe(),
                theirs.describe()
            );
        }
        Ok(false)
    };
    let start = Instant::now();
    let mut looks = 0u32;
    loop {
        if looks.is_multiple_of(64) {
            // A peer that left is noticed by `idle` or the timeout.
            let _ = announce(dev, peer, mine);
        }
        looks = looks.wrapping_add(1);
        if marks()? {
            return Ok(());
        }
        if let Err(e) = idle() {
            // A peer that said what it is and left at once (a twin, the
            // other --via): say what it was, not only that it left.
            marks()?;
            return Err(e);
        }
        if start.elapsed() >= timeout {
            bail!(
                "port {peer} did not say it is {} within {timeout:?} (is it one, and not another \
                 tool or version?)",
                theirs.describe()
            );
        }
    }
}
