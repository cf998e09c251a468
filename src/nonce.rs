//! Nonces: container and file names no other run shares, markers a guest
//! cannot predict, session ids another client cannot guess.

use std::hash::{BuildHasher, Hasher};

/// 64 unpredictable bits: std's randomly keyed SipHash (keys from the OS,
/// per process and thread) over the time.
pub(crate) fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.finish()
}

/// 128 unpredictable bits as 32 hex digits.
pub(crate) fn hex128() -> String {
    format!("{:016x}{:016x}", random_u64(), random_u64())
}
