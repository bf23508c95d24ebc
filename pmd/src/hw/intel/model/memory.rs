//! The memory two register models share: both sides' registers (what the
//! other side's writes reach) and both hosts' "DRAM" (what the translation
//! registers point the windows at), in one memfd that another process can
//! map.
//!
//! ```text
//! 0x0000  header: magic, version, part, BAR2/BAR4 sizes, DRAM size, link word
//! 0x1000  side 0 (USD) registers        0x2000  side 1 (DSD) registers
//! 0x3000  side 0 DRAM (dram_len bytes), then side 1 DRAM
//! ```
//!
//! Every register is an atomic word (a shared `&AtomicU64` into a mapping
//! is sound however many processes write it); DRAM is reached only through
//! window handles (raw pointers).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::hw::emu::SharedRegion;
use crate::hw::intel::IntelPart;
use crate::hw::{HwError, Result};

const MAGIC: u64 = 0x4E54_424B_494E_544D; // "NTBKINTM"
const VERSION: u64 = 1;
const PAGE: usize = 4096;
const SIDE_BLOCK: usize = PAGE;
const DRAM_START: usize = 3 * PAGE;

/// The bus address of the first byte of each side's DRAM (4 GiB: aligned
/// for any BAR the model offers).
pub const DRAM_IOVA: u64 = 1 << 32;

// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_PART: usize = 16;
const H_BAR: usize = 24; // two words
const H_DRAM: usize = 40;
const H_LINK: usize = 48;
const H_ATTACHES: usize = 56;

/// Offsets of one side's register words in its block.
pub(super) mod side {
    pub const PRESENT: usize = 0;
    pub const NTBCNTL: usize = 8;
    pub const LINK_CTRL: usize = 16;
    pub const PPD0: usize = 24;
    pub const DB_STATUS: usize = 32;
    pub const DB_MASK: usize = 40;
    /// `XBASE(mw)` at `+ 16 * mw`, `XLMT(mw)` at `+ 16 * mw + 8`.
    pub const XLAT: usize = 48;
    /// Gen3 external limit of window `mw` at `+ 8 * mw`.
    pub const EM_XLMT: usize = 80;
    /// The token of the model attached as this side (0 = none).
    pub const OWNER: usize = 96;
    /// 16 scratchpads of 32 bits.
    pub const SPAD: usize = 128;
}

/// Shared memory of a pair of register models.
#[derive(Clone)]
pub struct ModelMemory {
    region: SharedRegion,
    file: Arc<File>,
    part: IntelPart,
    bar_size: [usize; 2],
    dram_len: usize,
}

impl std::fmt::Debug for ModelMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelMemory")
            .field("part", &self.part)
            .field("bar_size", &self.bar_size)
            .field("dram_len", &self.dram_len)
            .finish_non_exhaustive()
    }
}

fn part_code(p: IntelPart) -> u64 {
    match p {
        IntelPart::Gen3Skx => 3,
        IntelPart::Gen4Icx => 4,
        IntelPart::Gen4Spr => 5,
    }
}

impl ModelMemory {
    /// A fresh memfd for a pair of `part` models with BAR2/BAR4 of
    /// `bar_size` bytes (powers of two, at least 4 KiB) and `dram_len` bytes
    /// of DRAM per side.
    pub fn create(part: IntelPart, bar_size: [usize; 2], dram_len: usize) -> Result<ModelMemory> {
        if bar_size
            .iter()
            .any(|&b| !b.is_power_of_two() || b < PAGE || b as u64 > DRAM_IOVA)
            || dram_len == 0
            || !dram_len.is_multiple_of(PAGE)
        {
            return Err(HwError::Invalid(format!(
                "model geometry: BAR sizes {bar_size:?} must be powers of two from 4 KiB to \
                 4 GiB, DRAM {dram_len:#x} a nonzero multiple of 4 KiB"
            )));
        }
        let fd = nix::sys::memfd::memfd_create(
            c"ntbdk-intel-model",
            nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
        )
        .map_err(|e| HwError::Io {
            what: "creating the register model's memfd".into(),
            source: e.into(),
        })?;
        let file = File::from(fd);
        let len = DRAM_START + 2 * dram_len;
        file.set_len(len as u64).map_err(|source| HwError::Io {
            what: format!("sizing the register model's memfd to {len} bytes"),
            source,
        })?;
        let region = SharedRegion::map_fd(&file, len, "the register model's memory")?;
        let m = ModelMemory {
            region,
            file: Arc::new(file),
            part,
            bar_size,
            dram_len,
        };
        m.word(H_PART).store(part_code(part), SeqCst);
        m.word(H_BAR).store(bar_size[0] as u64, SeqCst);
        m.word(H_BAR + 8).store(bar_size[1] as u64, SeqCst);
        m.word(H_DRAM).store(dram_len as u64, SeqCst);
        m.word(H_VERSION).store(VERSION, SeqCst);
        m.word(H_MAGIC).store(MAGIC, SeqCst);
        Ok(m)
    }

    /// Maps the model memory in the file at `path` (another process's
    /// `/proc/<pid>/fd/<fd>`, see [`path`](Self::path)) and validates it.
    pub fn open(path: &std::path::Path) -> Result<ModelMemory> {
        let io = |what: &str| {
            let what = format!("{what} {}", path.display());
            move |source| HwError::Io { what, source }
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io("opening the register model memory"))?;
        let len = file.metadata().map_err(io("reading the size of"))?.len() as usize;
        if len < DRAM_START {
            return Err(HwError::Fabric(format!(
                "{} is {len} bytes: not a register model memory",
                path.display()
            )));
        }
        let region = SharedRegion::map_fd(&file, len, "the register model's memory")?;
        let word = |off: usize| region.u64_at(off).map(|w| w.load(SeqCst));
        if word(H_MAGIC)? != MAGIC || word(H_VERSION)? != VERSION {
            return Err(HwError::Fabric(format!(
                "{} holds no register model memory of version {VERSION}",
                path.display()
            )));
        }
        let part = match word(H_PART)? {
            3 => IntelPart::Gen3Skx,
            4 => IntelPart::Gen4Icx,
            5 => IntelPart::Gen4Spr,
            p => return Err(HwError::Fabric(format!("unknown model part code {p}"))),
        };
        let bar_size = [word(H_BAR)? as usize, word(H_BAR + 8)? as usize];
        let dram_len = word(H_DRAM)? as usize;
        if DRAM_START + 2 * dram_len > len {
            return Err(HwError::Fabric(format!(
                "{}: header says {dram_len:#x} bytes of DRAM per side, the file is {len}",
                path.display()
            )));
        }
        Ok(ModelMemory {
            region,
            file: Arc::new(file),
            part,
            bar_size,
            dram_len,
        })
    }

    /// A path another process of this user can [`open`](Self::open) while
    /// this one holds the memory.
    pub fn path(&self) -> std::path::PathBuf {
        format!("/proc/{}/fd/{}", std::process::id(), self.file.as_raw_fd()).into()
    }

    /// The part both models present.
    pub fn part(&self) -> IntelPart {
        self.part
    }

    /// Sizes of BAR2 and BAR4.
    pub fn bar_size(&self) -> [usize; 2] {
        self.bar_size
    }

    /// Bytes of DRAM per side.
    pub fn dram_len(&self) -> usize {
        self.dram_len
    }

    pub(super) fn region(&self) -> &SharedRegion {
        &self.region
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        self.region
            .u64_at(off)
            .expect("header words lie in the first page")
    }

    /// The word holding the link state the models last computed.
    pub(super) fn link_word(&self) -> &AtomicU64 {
        self.word(H_LINK)
    }

    /// A fresh attach token (never 0).
    pub(super) fn next_token(&self) -> u64 {
        self.word(H_ATTACHES).fetch_add(1, SeqCst) + 1
    }

    /// Register word `off` of side `s`'s block.
    pub(super) fn reg(&self, s: usize, off: usize) -> &AtomicU64 {
        self.word(SIDE_BLOCK * (1 + s) + off)
    }

    /// Scratchpad `i` of side `s`.
    pub(super) fn spad(&self, s: usize, i: usize) -> &AtomicU32 {
        let off = SIDE_BLOCK * (1 + s) + side::SPAD + 4 * (i % 16);
        let p = self
            .region
            .ptr_at(off, 4)
            .expect("scratchpads lie in the side block");
        debug_assert!((p as usize).is_multiple_of(4));
        // SAFETY: in bounds (checked), 4-byte aligned (page-aligned mapping,
        // offset a multiple of 4), an atomic in shared memory that lives as
        // long as `self.region`.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    /// Byte offset of side `s`'s DRAM in the memory.
    pub(super) fn dram_offset(&self, s: usize) -> usize {
        DRAM_START + s * self.dram_len
    }
}
