//! Shared code of the ntbdk applications.
