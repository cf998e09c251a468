//! Session ids. [`Session`] and [`SessionBackend`], what a backend
//! implements to keep interpreter state across calls, live beside the
//! [`Backend`](crate::backend::Backend) trait they extend.

pub use crate::backend::{CALL_OVERRUN_LIMIT, Session, SessionBackend};

/// A new session id: 128 random bits as hex.
pub fn new_id() -> String {
    crate::nonce::hex128()
}
