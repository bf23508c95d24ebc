//! Shared code of the ntbdk applications.

pub mod report;
pub mod tool;
