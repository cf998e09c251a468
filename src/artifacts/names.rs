//! Artifact names, and the directory name of a scope.
//!
//! A name becomes one directory name inside its scope's directory, so it is
//! checked here before anything touches the disk: 1 to [`MAX_NAME_BYTES`]
//! bytes, no `/` or `\`, no control character (NUL, newlines), not starting
//! with `.` (which also rules out `.` and `..`, and keeps the store's own
//! temporary and lock files apart). A scope is any string: its directory is
//! named by its sha256, so no scope can name a path.

use sha2::{Digest, Sha256};

use super::error::ArtifactError;

/// Longest artifact name, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Longest media type, in bytes.
pub(crate) const MAX_MEDIA_TYPE_BYTES: usize = 127;

/// Checks that `name` can name an artifact (see the module docs).
pub fn check_name(name: &str) -> Result<(), ArtifactError> {
    let bad = |reason| ArtifactError::BadName { name: crate::text::cap_text(name.to_string(), 64), reason };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(bad("longer than 128 bytes"));
    }
    if name.starts_with('.') {
        return Err(bad("starts with `.`"));
    }
    if name.contains(['/', '\\']) {
        return Err(bad("contains `/` or `\\`"));
    }
    if name.chars().any(char::is_control) {
        return Err(bad("contains a control character"));
    }
    if name.trim().is_empty() {
        return Err(bad("only white space"));
    }
    Ok(())
}

/// Checks a media type: printable ASCII without spaces, at most
/// [`MAX_MEDIA_TYPE_BYTES`].
pub(crate) fn check_media_type(media_type: &str) -> Result<(), ArtifactError> {
    let printable = media_type.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    if media_type.is_empty() || media_type.len() > MAX_MEDIA_TYPE_BYTES || !printable {
        return Err(ArtifactError::BadArgument(format!(
            "media_type must be 1 to {MAX_MEDIA_TYPE_BYTES} printable ASCII characters (e.g. text/csv)"
        )));
    }
    Ok(())
}

/// The directory of scope `scope`: its sha256, in hex.
pub(crate) fn scope_dir_name(scope: &str) -> String {
    hex::encode(Sha256::digest(scope.as_bytes()))
}

/// The version a file name holds: decimal digits, no leading zero, from 1.
pub(crate) fn version_of(file_name: &str) -> Option<u32> {
    let digits = !file_name.is_empty() && file_name.bytes().all(|b| b.is_ascii_digit()) && !file_name.starts_with('0');
    if !digits {
        return None;
    }
    file_name.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused_before_the_disk() {
        let long = "x".repeat(10 << 10);
        for bad in ["", ".", "..", "../x", "/etc/passwd", "a/b", "a\\b", "a\0b", "a\nb", ".hidden", " ", &long] {
            assert!(matches!(check_name(bad), Err(ArtifactError::BadName { .. })), "{bad:?}");
        }
        let err = check_name(&long).unwrap_err().to_string();
        assert!(err.len() < 200, "the name is cut in the message: {err}");
        for good in ["report.csv", "a..b", "résumé v2.txt", "x@3", "notes-2026"] {
            check_name(good).unwrap();
        }
        assert!(check_media_type("text/csv").is_ok());
        assert!(check_media_type("text/\ncsv").is_err());
    }

    #[test]
    fn versions_and_scope_dirs() {
        assert_eq!(version_of("1"), Some(1));
        assert_eq!(version_of("42"), Some(42));
        for not in ["0", "01", "", "1a", ".tmp-1", "99999999999"] {
            assert_eq!(version_of(not), None, "{not}");
        }
        let dir = scope_dir_name("../../etc");
        assert_eq!(dir.len(), 64);
        assert!(dir.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(dir, scope_dir_name("session:a"));
    }
}
