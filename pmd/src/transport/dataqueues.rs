//! The shape of the data queues (a leaf: the hello carries it, the
//! geometry lays it out and checks it).

/// The shape of the data queues every peer section carries beside its queue
/// pair: `count` queues, each with `nb_desc` descriptors and `nb_desc`
/// receive buffers of `buf_size` bytes (DPDK's `nb_rx_queues`, `nb_desc`
/// and mbuf data room). Each queue is owned by one thread at a time
/// ([`Transport::data_queue`](super::Transport::data_queue)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataQueues {
    /// Queues per peer (0..=16; 0: no data plane).
    pub count: u16,
    /// Descriptors (and receive buffers) per queue: a power of two in
    /// 16..=4096.
    pub nb_desc: u32,
    /// Bytes per receive buffer: a multiple of 64 in 64..=64 KiB.
    pub buf_size: u32,
}

impl DataQueues {
    /// No data queues: the window is the queue pair's alone.
    pub const NONE: DataQueues = DataQueues {
        count: 0,
        nb_desc: 0,
        buf_size: 0,
    };

    /// The most data queues per peer.
    pub const MAX_COUNT: u16 = 16;

    /// `count` queues of 1024 descriptors and 2 KiB buffers (DPDK's
    /// defaults for `ntb_fwd`: `--nb-desc 1024`, `--buf-size 2048`).
    pub fn new(count: u16) -> Self {
        DataQueues {
            count,
            nb_desc: 1024,
            buf_size: 2048,
        }
    }
}
