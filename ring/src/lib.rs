//! Lock-free bounded rings in the spirit of DPDK's `rte_ring`.
