//! The Intel NTB backend's errors: each says what is wrong and what to do.

use thiserror::Error;

use super::IntelPart;
use crate::hw::HwError;

/// What can go wrong bringing up or programming an Intel NTB.
#[derive(Debug, Error)]
pub enum IntelError {
    /// The device ID / revision is not a part ntbdk drives.
    #[error(
        "Intel NTB device {device:04x} revision {revision:#04x} is not driven: ntbdk drives \
         8086:201c (Skylake-SP) and 8086:347e (Ice Lake-SP revision 0x02-0x0f, Sapphire \
         Rapids above 0x0f)"
    )]
    UnknownPart {
        /// PCI device ID.
        device: u16,
        /// PCI revision ID.
        revision: u8,
    },
    /// The port is not configured back-to-back.
    #[error(
        "{} NTB port definition {ppd:#x} is not back-to-back: set the port to \"NTB to NTB\" \
         in the BIOS (and Crosslink Control override DSD/USP on one host, USD/DSP on the \
         other), then reboot", part.name()
    )]
    NotB2b {
        /// The part.
        part: IntelPart,
        /// The port definition register value.
        ppd: u32,
    },
    /// Split BAR mode (BAR4 and BAR5 as two 32-bit windows) is not driven.
    #[error(
        "NTB port definition {ppd:#x} has split BARs: set \"Enable SPLIT BARs\" to Disabled \
         in the BIOS and reboot"
    )]
    SplitBar {
        /// The port definition register value.
        ppd: u32,
    },
    /// A memory window index beyond BAR2 (0) and BAR4 (1).
    #[error("no memory window {mw}: the Intel NTB has 2 (BAR2 and BAR4)")]
    NoSuchWindow {
        /// The index asked for.
        mw: usize,
    },
    /// A translation of zero bytes, or more than the BAR holds.
    #[error(
        "inbound translation of {size:#x} bytes for window {mw} does not fit its BAR of \
         {bar_size:#x} bytes: use 1..={bar_size:#x} bytes, or raise the BIOS \
         Imbar/Embar size on both hosts"
    )]
    TranslationSize {
        /// The window.
        mw: usize,
        /// The size asked for.
        size: usize,
        /// The BAR's size.
        bar_size: usize,
    },
    /// A translation address that is not aligned as the part needs.
    #[error(
        "inbound translation address {iova:#x} for window {mw} is not a multiple of {align:#x}: \
         {} needs the address aligned to {}; allocate the window's memory with that alignment",
        part.name(),
        if *align > 4096 { "the whole BAR size" } else { "a 4 KiB page" }
    )]
    TranslationMisaligned {
        /// The part.
        part: IntelPart,
        /// The window.
        mw: usize,
        /// The address asked for.
        iova: u64,
        /// The alignment needed.
        align: usize,
    },
    /// The base register did not read back what was written.
    #[error(
        "window {mw}: wrote translation base {wrote:#x}, read back {read:#x}; the address is \
         outside what the NTB can translate (try memory below 2^46) or BAR0 is not the NTB"
    )]
    TranslationReadback {
        /// The window.
        mw: usize,
        /// What was written.
        wrote: u64,
        /// What was read back.
        read: u64,
    },
    /// A limit register did not read back what was written.
    #[error(
        "window {mw}: wrote translation limit {wrote:#x} (the BAR's bus address {bar:#x} plus \
         the window size), read back {read:#x}: the BAR address read from sysfs `resource` is \
         not where the NTB decodes it (a BAR moved by a hotplug or rescan: reopen the device), \
         the size is more than the BAR, or BAR0 is not the NTB"
    )]
    LimitReadback {
        /// The window.
        mw: usize,
        /// The BAR's bus address the limit was computed from.
        bar: u64,
        /// What was written.
        wrote: u64,
        /// What was read back.
        read: u64,
    },
    /// Our inbound window has no memory behind it (not translated by us).
    #[error(
        "window {mw} is not backed by memory this device allocated: open the device with \
         IntelConfig::windows covering it, or translate it to memory from its allocator"
    )]
    WindowNotBacked {
        /// The window.
        mw: usize,
    },
    /// The peer's inbound window is not (correctly) translated: our BAR
    /// aperture leads nowhere usable.
    #[error(
        "the peer's window {mw} is not usable: {why}; the peer must program its inbound \
         translation (base aligned as its part needs, limit = its BAR start + size) before \
         data is written"
    )]
    PeerWindowUnusable {
        /// The window.
        mw: usize,
        /// What is wrong with it.
        why: String,
    },
    /// No bus-address (IOVA) space left for a window's memory.
    #[error(
        "no IOVA space for {size:#x} bytes aligned to {align:#x} ({left:#x} bytes left of the \
         range): use smaller windows (IntelConfig::window_size) or a larger IOVA range"
    )]
    IovaExhausted {
        /// Bytes asked for.
        size: usize,
        /// Alignment asked for.
        align: u64,
        /// Bytes left in the range.
        left: u64,
    },
    /// A register access failed.
    #[error("register access: {0}")]
    Register(#[from] HwError),
}

impl From<IntelError> for HwError {
    fn from(e: IntelError) -> HwError {
        match e {
            IntelError::Register(e) => e,
            IntelError::NoSuchWindow { mw } => HwError::NoSuchWindow { mw, count: 2 },
            e @ (IntelError::TranslationSize { .. }
            | IntelError::TranslationMisaligned { .. }
            | IntelError::WindowNotBacked { .. }) => HwError::Invalid(e.to_string()),
            e => HwError::Fabric(e.to_string()),
        }
    }
}
