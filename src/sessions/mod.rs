//! [`Sessions`]: interpreter state kept across calls, by id.
//!
//! A session is one live interpreter (a JS realm in a worker process of its
//! own, a CPython instance, a container) that runs a request per call and
//! keeps its globals between calls. The registry guarantees, whatever the
//! backend:
//!
//! - **Opened under the effective policy**: a session opens under its
//!   [`SessionSpec`] held to the registry's ceiling, exactly as a one-shot
//!   run of the same request would be; controls fixed at that moment
//!   (network, directories, environment; a container's memory and process
//!   caps) cannot be lowered by a later call, which is refused naming them.
//! - **One admission path**: each call is validated, held to the ceiling
//!   and matched against the session's capabilities like a one-shot run
//!   ([`crate::admission`]); its deadline starts before it waits for its turn.
//! - **Bounded**: at most [`SessionConfig::max_sessions`] live (or opening)
//!   at once; one more is [`SessionError::TooMany`].
//! - **Closed when idle**: a session unused for
//!   [`SessionConfig::idle_timeout`] is closed by a background thread (alive
//!   only while sessions are), not when the registry is next touched.
//! - **One call at a time** per session, in arrival order.
//! - **Nothing outlives its deadline**: every backend stops a call at its
//!   deadline; as a backstop, the same thread kills a session whose call is
//!   still running [`CALL_OVERRUN_LIMIT`] past its deadline.
//! - **Closing means closed**: [`Sessions::close`] (and expiry, and
//!   [`Sessions::close_all`] at shutdown) kills the session's interpreter at
//!   once, even while a call of it runs; that call ends as `killed`.
//! - **Never silently reset**: a session that a call ended (time-out, memory,
//!   an engine crash) or that expired is *lost*; the next call with its id
//!   gets [`SessionError::Lost`] once, with the reason, and only a call after
//!   that may open a fresh one.

pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod registry;
pub(crate) mod session;

mod table;
mod turns;

pub use crate::session_spec::SessionSpec;
pub use config::SessionConfig;
pub use error::SessionError;
pub use registry::{Sessions, SessionsBuilder};
pub use session::{CALL_OVERRUN_LIMIT, Session, SessionBackend, new_id};
