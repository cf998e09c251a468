//! Mechanisms every backend shares: bounded output capture, deadlines, and
//! nesting bounds that keep recursive parsers off the end of the native stack.

pub mod deadline;
pub mod nesting;
pub mod output;

pub use deadline::Deadline;
pub use output::BoundedBuffer;
