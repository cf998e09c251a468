//! Mechanisms every backend shares: bounded output capture, deadlines,
//! nesting bounds that keep recursive parsers off the end of the native stack,
//! and the caps on a result's other fields.

#[cfg(any(feature = "js", feature = "wasm", feature = "container"))]
pub(crate) mod backoff;
#[cfg(any(feature = "js", feature = "wasm", feature = "container"))]
pub(crate) mod child;
pub mod deadline;
pub(crate) mod nesting;
pub mod output;
#[cfg(any(feature = "js", feature = "wasm", feature = "container"))]
pub(crate) mod poll;
#[cfg(any(feature = "wasm", feature = "container"))]
pub(crate) mod records;
pub(crate) mod result_caps;
#[cfg(any(feature = "js", feature = "wasm", feature = "container"))]
pub(crate) mod write;

pub use deadline::Deadline;
pub use output::{BoundedBuffer, OutputTap, StreamKind};
