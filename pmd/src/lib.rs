//! The poll-mode NTB driver.
