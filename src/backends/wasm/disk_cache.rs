//! [`DiskCache`]: compiled modules serialized in one directory, reused
//! across processes, trusted only as far as that directory's owner.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, Module};

/// The wasmtime release this crate pins; part of the on-disk cache key
/// (wasmtime's own compatibility hash covers it too).
const WASMTIME_VERSION: &str = "48.0.8";

/// A module's sha256: the key of both caches.
pub(crate) type Key = [u8; 32];

/// Serialized modules in one directory, named by module hash and engine key.
///
/// Loading a serialized module runs its machine code (wasmtime's
/// `Module::deserialize` only checks a header), so an artifact is trusted only
/// when nobody but this user could have written it: the directory must be
/// ours (our effective uid) and not writable by group or others, and so must
/// each artifact, checked on the opened file (no symlinks followed). A
/// directory execbox creates is made owner-only; an existing one is never
/// chmodded, only checked.
pub(crate) struct DiskCache {
    dir: PathBuf,
    engine_key: String,
}

impl DiskCache {
    pub(crate) fn open(dir: PathBuf, engine: &Engine) -> std::io::Result<Self> {
        if !dir.exists() {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut builder = std::fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            match builder.create(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        let meta = std::fs::metadata(&dir)?;
        if !meta.is_dir() {
            return Err(std::io::Error::other(format!("{} is not a directory", dir.display())));
        }
        owned_privately(&meta).map_err(|why| std::io::Error::other(format!("{}: {why}", dir.display())))?;
        let mut hasher = Sha256Hasher(Sha256::new());
        WASMTIME_VERSION.hash(&mut hasher);
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let engine_key = hex::encode(&hasher.0.finalize()[..8]);
        Ok(Self { dir, engine_key })
    }

    /// The directory, for diagnostics.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &Key) -> PathBuf {
        self.dir.join(format!("{}-{}.cwasm", hex::encode(key), self.engine_key))
    }

    pub(crate) fn load(&self, engine: &Engine, key: &Key) -> Option<Module> {
        let path = self.path(key);
        let bytes = match read_private_file(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "not loading a cached wasm artifact");
                return None;
            }
        };
        // SAFETY: `read_private_file` checked that the artifact is a regular
        // file owned by this user and writable by nobody else, in a directory
        // of the same kind (checked in `open`): only this user (through
        // `store` below) can have written it. wasmtime checks the header,
        // version and engine config and errors on any mismatch.
        match unsafe { Module::deserialize(engine, &bytes) } {
            Ok(module) => Some(module),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %format!("{e:#}"), "discarding a stale wasm artifact");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    pub(crate) fn store(&self, module: &Module, key: &Key) -> std::io::Result<()> {
        let bytes = module.serialize().map_err(|e| std::io::Error::other(format!("{e:#}")))?;
        // Created 0600 by tempfile, then renamed into place.
        let mut file = tempfile::NamedTempFile::new_in(&self.dir)?;
        file.write_all(&bytes)?;
        file.persist(self.path(key)).map_err(|e| e.error)?;
        Ok(())
    }
}

/// Reads `path` whole, without following a symlink, if it is a regular file
/// owned by this user and writable by nobody else. Read, not mmap
/// (`deserialize_file`): a mapped artifact that someone truncates later
/// would kill the process with SIGBUS.
fn read_private_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    let mut file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    owned_privately(&meta).map_err(std::io::Error::other)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `Ok` when `meta` belongs to this process's effective user and is not
/// writable by group or others.
#[cfg(unix)]
fn owned_privately(meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!("owned by uid {}, not by this process's uid {me}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("writable by group or others (mode {:o})", meta.mode() & 0o7777));
    }
    Ok(())
}

#[cfg(not(unix))]
fn owned_privately(_meta: &std::fs::Metadata) -> Result<(), String> {
    Err("ownership cannot be checked on this platform".into())
}

/// Feeds `Hash` output into sha256, so the key is stable across Rust releases
/// (unlike `DefaultHasher`).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        0 // unused: the digest is read from `.0`
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}
