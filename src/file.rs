//! [`ExecFile`]: a named file handed to or produced by the code.

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::error::InvalidRequest;

/// A named file handed to or produced by the code.
///
/// In JSON: `{"name", "mime_type", "size", "content"}` with `content` in
/// standard base64. When read back, `mime_type` and `size` may be left out;
/// a `size` that is given must match the decoded content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "FileJson", try_from = "FileJson")]
pub struct ExecFile {
    /// Path relative to the working directory; never absolute, never `..`.
    pub name: String,
    /// File contents.
    pub content: Vec<u8>,
    /// MIME type, if known.
    pub mime_type: Option<String>,
}

/// [`ExecFile`]'s JSON shape.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    name: String,
    #[serde(default)]
    mime_type: Option<String>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(with = "base64_bytes")]
    content: Vec<u8>,
}

impl From<ExecFile> for FileJson {
    fn from(f: ExecFile) -> Self {
        FileJson { size: Some(f.content.len() as u64), name: f.name, mime_type: f.mime_type, content: f.content }
    }
}

impl TryFrom<FileJson> for ExecFile {
    type Error = String;
    fn try_from(f: FileJson) -> Result<Self, String> {
        if let Some(size) = f.size.filter(|&size| size != f.content.len() as u64) {
            return Err(format!(
                "file {:?}: size {size} does not match its {} bytes of content",
                f.name,
                f.content.len()
            ));
        }
        Ok(ExecFile { name: f.name, content: f.content, mime_type: f.mime_type })
    }
}

impl ExecFile {
    /// A file with no MIME type.
    pub fn new(name: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        Self { name: name.into(), content: content.into(), mime_type: None }
    }

    /// The file's name as a path under a staging directory: relative, no
    /// `..`, no root or prefix components, not empty.
    pub fn relative_path(&self) -> Result<&Path, InvalidRequest> {
        let path = Path::new(&self.name);
        let bad = |reason: &str| InvalidRequest::BadPath { path: self.name.clone(), reason: reason.into() };
        if self.name.is_empty() {
            return Err(bad("file name is empty"));
        }
        if self.name.ends_with('/') {
            return Err(bad("file names name files, not directories"));
        }
        if !path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
            return Err(bad("file names must be relative, without `..`"));
        }
        if path.components().all(|c| matches!(c, Component::CurDir)) {
            return Err(bad("file name names no file"));
        }
        Ok(path)
    }
}

/// Serde for byte contents as standard base64 text.
pub(crate) mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
    }
}
