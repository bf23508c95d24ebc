//! How `ntb-perf --op write` writes: one-sided, as RDMA writes are, or
//! through the transport's rendezvous.

/// How a write moves its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum WriteMode {
    /// One-sided (`Transport::post_writes_direct`, a burst per call):
    /// posted writes straight into the peer's advertised region, complete
    /// once posted; the latency test polls the buffer's last byte, as
    /// `ib_write_lat` does.
    #[default]
    Direct,
    /// Rendezvous (`Transport::post_write`): the target resolves the key
    /// and answers with where to copy, then acknowledges the copy.
    Rendezvous,
}

impl WriteMode {
    /// `direct`, `rendezvous`.
    pub fn name(self) -> &'static str {
        match self {
            WriteMode::Direct => "direct",
            WriteMode::Rendezvous => "rendezvous",
        }
    }

    /// What a run's header says of it.
    pub fn describe(self) -> &'static str {
        match self {
            WriteMode::Direct => {
                "direct (one-sided posted writes into the advertised region, \
                 complete once posted; latency polls the last byte)"
            }
            WriteMode::Rendezvous => {
                "rendezvous (request, placement by the initiator, acknowledgment)"
            }
        }
    }
}
