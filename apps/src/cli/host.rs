//! The device an app runs on, of either kind: a member of a fabric (the
//! emulated fabric, ivshmem), which also has a fabric's status page, stats
//! pages and published window facts, or a two-port bridge (an Intel NTB),
//! which is a device and nothing more.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use ntbdk_pmd::hw::emu::EmuDevice;
use ntbdk_pmd::hw::intel::IntelConfig;
use ntbdk_pmd::hw::open::{DeviceSpec, OpenOptions, Opened, open_either};
use ntbdk_pmd::hw::vfio::ivshmem::IvshmemConfig;
use ntbdk_pmd::hw::{NtbDevice, Port};

use super::hugepages::{hugepage_pools, windows_by_side};

/// A device and, when it is a fabric member, the member itself.
pub struct Host {
    /// The device, for the transport and the control channel.
    pub dev: Arc<dyn NtbDevice>,
    /// The same device as a fabric member; `None` for a bridge.
    pub member: Option<Arc<EmuDevice>>,
    /// For a bridge, whether its inbound windows are on hugepages, when it
    /// can say.
    pub bridge_hugepages: Option<bool>,
    /// What the device is called in messages: `fabric "NAME"` for a member,
    /// the spec (`vfio:0000:af:00.0`) for a bridge.
    pub place: String,
}

impl Host {
    /// A fabric member.
    pub fn member(dev: EmuDevice) -> Host {
        let place = format!("fabric {:?}", dev.fabric().name());
        let member = Arc::new(dev);
        Host {
            dev: member.clone(),
            member: Some(member),
            bridge_hugepages: None,
            place,
        }
    }

    /// This side's port.
    pub fn port(&self) -> Port {
        self.dev.port()
    }

    /// What backs the windows of `ports`: each member's published page
    /// size ([`windows_by_side`]); for a bridge, what its inbound memory
    /// got (the peer's is its own host's business).
    pub fn windows(&self, ports: &[Port]) -> String {
        match (&self.member, self.bridge_hugepages) {
            (Some(m), _) => windows_by_side(m, ports),
            (None, Some(true)) => "this side's inbound memory on hugepages".into(),
            (None, Some(false)) => format!(
                "this side's inbound memory on 4 KiB pages ({})",
                hugepage_pools()
            ),
            (None, None) => "this side's inbound memory as the device allocated it".into(),
        }
    }

    /// Whether this side's windows are on 4 KiB pages, as far as the device
    /// can say (a bridge that cannot say counts as not).
    pub fn on_small_pages(&self) -> bool {
        match &self.member {
            Some(m) => !m.window_is_huge(),
            None => self.bridge_hugepages == Some(false),
        }
    }
}

/// How long an Intel NTB peer's heartbeat may stop before the apps
/// declare it gone (both sides beat; the link itself stays up when a host's
/// process dies, so this is how a server learns its client crashed).
/// Generous, as the apps have no heartbeat thread: a side beats while it
/// polls.
pub const INTEL_HEARTBEAT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens `--device SPEC`: a fabric member at `slot` (or the first free
/// slot), or an Intel NTB, whose port is its side of the link (0 upstream,
/// 1 downstream) and takes no `--slot`.
pub fn open_device(spec: &DeviceSpec, slot: Option<Port>) -> Result<Host> {
    let opts = OpenOptions {
        ivshmem: IvshmemConfig {
            slot,
            ..IvshmemConfig::default()
        },
        intel: IntelConfig {
            heartbeat_timeout: Some(INTEL_HEARTBEAT_TIMEOUT),
            ..IntelConfig::default()
        },
        ..OpenOptions::default()
    };
    match open_either(spec, &opts).with_context(|| format!("opening device {spec}"))? {
        Opened::Member(m) => Ok(Host::member(m)),
        Opened::Bridge { .. } if slot.is_some() => bail!(
            "--slot: {spec} is an Intel NTB, a two-port bridge whose port is its side of the \
             link (0 upstream, 1 downstream): drop --slot"
        ),
        Opened::Bridge { dev, hugepages } => Ok(Host {
            dev,
            member: None,
            bridge_hugepages: hugepages,
            place: format!("device {spec}"),
        }),
    }
}
