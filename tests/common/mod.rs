//! What the test binaries share. Each binary declares `mod common;` (a
//! binary in a directory of its own: `#[path = "../common/mod.rs"]`) and
//! uses the part it needs; the rest is dead code there, hence the `allow`.
//!
//! Waiting: a test waits on the event that says what it waits for — a
//! process's exit ([`process`]: a poll on its pidfd), a docker event
//! ([`docker::Events`]), a channel, a condition variable ([`tools::Probe`]),
//! a backend's own `prepare` — and polls ([`wait::wait_until`]) only a state
//! that nothing announces (a counter of a library type, a file, a thread's
//! name).
#![allow(dead_code)]

pub mod docker;
pub mod large_replies;
pub mod process;
pub mod procfs;
pub mod programs;
pub mod skip;
pub mod soak;
pub mod tools;
pub mod wait;
