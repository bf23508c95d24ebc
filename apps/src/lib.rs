//! Shared code of the ntbdk applications.

pub mod cli;
pub mod fwd;
pub mod perf;
pub mod report;
pub mod tool;
