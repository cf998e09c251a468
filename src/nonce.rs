//! Nonces: container and file names no other run shares, markers a guest
//! cannot predict, session ids another client cannot guess. All from the
//! operating system's random source (`getrandom`).

/// 64 random bits from the OS.
#[cfg_attr(not(any(feature = "container", feature = "artifacts")), allow(dead_code))]
pub(crate) fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    fill(&mut bytes);
    u64::from_ne_bytes(bytes)
}

/// 128 random bits from the OS, as 32 lowercase hex digits.
pub(crate) fn hex128() -> String {
    let mut bytes = [0u8; 16];
    fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fills `bytes` from the OS. `getrandom` fails only where the OS has no
/// random source at all; then no id can be trusted, and the process stops
/// rather than hand out guessable ones.
fn fill(bytes: &mut [u8]) {
    if let Err(e) = getrandom::fill(bytes) {
        // No fallback to a weaker source: a guessable session id would let
        // one client use another's session.
        panic!("execbox: the operating system's random source failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_hex_and_differ() {
        let (a, b) = (super::hex128(), super::hex128());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
