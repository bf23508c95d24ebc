//! [`IntelNtbModel`]: a software model of an Intel NTB's register file with
//! the hardware's side effects, so [`IntelNtb`] is proven on every test run
//! without the hardware (the backend reaches BAR0 only through
//! [`Mmio`], and the model is another implementation
//! of it).
//!
//! Two models over one [`ModelMemory`] are the two ends of a back-to-back
//! link, in one process or in two (the memory is a memfd the other process
//! opens as `/proc/<pid>/fd/<fd>`). What the model does per register is in
//! [`registers`]; how the windows are resolved through the other side's
//! translation registers is in [`windows`]; [`FenceRecorder`] checks the
//! fence points of write-combined apertures.
//!
//! ```
//! use ntbdk_pmd::hw::NtbDevice;
//! use ntbdk_pmd::hw::intel::{B2bSide, IntelConfig, IntelPart};
//! use ntbdk_pmd::hw::intel::model::{IntelNtbModel, ModelMemory};
//!
//! let mem = ModelMemory::create(IntelPart::Gen3Skx, [1 << 20, 1 << 20], 4 << 20).unwrap();
//! let a = IntelNtbModel::attach(&mem, B2bSide::Usd).device(IntelConfig::default(), false).unwrap();
//! let b = IntelNtbModel::attach(&mem, B2bSide::Dsd).device(IntelConfig::default(), false).unwrap();
//! // The handshake runs as the devices are polled.
//! for _ in 0..4 {
//!     a.service().unwrap();
//!     b.service().unwrap();
//! }
//! assert_eq!(a.link(1).unwrap().generation, b.generation());
//! a.peer_window(1, 0).unwrap().write(0, b"hello").unwrap();
//! let mut got = [0u8; 5];
//! b.local_window(0).unwrap().read(0, &mut got).unwrap();
//! assert_eq!(&got, b"hello");
//! ```

mod memory;
mod probe;
pub mod registers;
pub mod windows;

use std::sync::Arc;

pub use memory::{DRAM_IOVA, ModelMemory};
pub use probe::{FenceRecorder, FenceReport};
pub use registers::{ModelBar, ModelConfig};

use super::memory::{InboundMemory, Outbound};
use super::part::B2bSide;
use super::{IntelConfig, IntelError, IntelNtb};
use crate::hw::WriteCombining;
use crate::hw::mmio::Mmio;
use registers::ModelSide;
use windows::{ModelInbound, ModelOutbound};

/// One side of a modelled back-to-back link.
#[derive(Debug, Clone)]
pub struct IntelNtbModel {
    side: Arc<ModelSide>,
    fences: [Arc<FenceRecorder>; 2],
}

impl IntelNtbModel {
    /// Attaches to `mem` as `side`: a power-on reset of that side's
    /// registers (a side already attached is taken over, as by a rebooted
    /// host). The side stays present until this model and every device and
    /// handle made from it are dropped.
    pub fn attach(mem: &ModelMemory, side: B2bSide) -> IntelNtbModel {
        IntelNtbModel {
            side: ModelSide::attach(mem, side),
            fences: [
                Arc::new(FenceRecorder::new()),
                Arc::new(FenceRecorder::new()),
            ],
        }
    }

    /// BAR0.
    pub fn bar0(&self) -> ModelBar {
        ModelBar(self.side.clone())
    }

    /// Config space.
    pub fn config(&self) -> Arc<dyn Mmio> {
        Arc::new(ModelConfig(self.side.clone()))
    }

    /// Our BAR2/BAR4 apertures; write-combining (recorded by
    /// [`fences`](Self::fences)) when `write_combining`.
    pub fn outbound(&self, write_combining: bool) -> Box<dyn Outbound> {
        let wc = |mw: usize| {
            write_combining.then(|| {
                let probe: Arc<dyn crate::hw::StoreProbe> = self.fences[mw].clone();
                Arc::new(WriteCombining::probed(probe))
            })
        };
        Box::new(ModelOutbound {
            side: self.side.clone(),
            wc: [wc(0), wc(1)],
        })
    }

    /// Memory for our inbound windows, from this side's DRAM.
    pub fn inbound(&self) -> Box<dyn InboundMemory> {
        Box::new(ModelInbound::new(self.side.clone()))
    }

    /// An [`IntelNtb`] over this model, brought up with `cfg`.
    pub fn device(
        &self,
        cfg: IntelConfig,
        write_combining: bool,
    ) -> Result<IntelNtb<ModelBar>, IntelError> {
        IntelNtb::new(
            self.bar0(),
            self.config(),
            self.outbound(write_combining),
            self.inbound(),
            cfg,
        )
    }

    /// The store recorder of window `mw`'s write-combined aperture.
    pub fn fences(&self, mw: usize) -> &FenceRecorder {
        &self.fences[mw.min(1)]
    }

    /// Whether the modelled link is up (both sides present and enabled).
    pub fn link_up(&self) -> bool {
        self.side.link_up()
    }
}
