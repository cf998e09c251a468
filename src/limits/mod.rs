//! Mechanisms every backend shares: bounded output capture, deadlines,
//! nesting bounds that keep recursive parsers off the end of the native stack,
//! and the caps on a result's other fields.

pub mod deadline;
pub mod nesting;
pub mod output;
pub mod result_caps;

pub use deadline::Deadline;
pub use output::{BoundedBuffer, OutputTap, StreamKind};
