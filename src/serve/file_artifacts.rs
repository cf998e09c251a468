//! Workspace files to and from the connection's artifacts: `read_files
//! {save_as_artifacts}` saves what it collected as versioned artifacts,
//! `write_files` takes a file's content from an artifact (`name@version`).
//! The scope is the connection's (or its scope for `artifact_key`), the one
//! its runs' `artifacts.*` tools use, so code and client share them.
//!
//! Without the `artifacts` feature, or on a server started without
//! `--artifacts`, both are refused as invalid arguments, naming why.

/// Where a tool call's artifacts go: the server's store and the call's scope.
#[cfg(feature = "artifacts")]
pub(super) struct Artifacts {
    store: crate::artifacts::store::ArtifactStore,
    scope: String,
}

/// Where a tool call's artifacts go: nothing, without the `artifacts` feature.
#[cfg(not(feature = "artifacts"))]
pub(super) enum Artifacts {}

/// What one save gave: the artifact's name, version and digest.
#[derive(Debug, serde::Serialize)]
pub(super) struct Saved {
    pub name: String,
    pub version: u32,
    pub sha256: String,
}

/// How an artifact's name is made from a file's path when no template is
/// given: the path, each `/` turned into `_` (names cannot hold a `/`).
pub(super) const DEFAULT_NAME_TEMPLATE: &str = "{path}";

impl Artifacts {
    /// The artifacts of `scope` in `store`.
    #[cfg(feature = "artifacts")]
    pub(super) fn new(store: crate::artifacts::store::ArtifactStore, scope: String) -> Self {
        Self { store, scope }
    }

    /// Saves `content` (the workspace file at `path`) as the next version of
    /// the name `template` makes of `path`: as text when it is UTF-8.
    pub(super) fn save(&self, template: &str, path: &str, content: &[u8]) -> Result<Saved, String> {
        let name = artifact_name(template, path);
        self.save_named(&name, content)
    }

    #[cfg(feature = "artifacts")]
    fn save_named(&self, name: &str, content: &[u8]) -> Result<Saved, String> {
        // Text stays text: code's `artifacts.load` gives it back as `content`.
        let saved = match std::str::from_utf8(content) {
            Ok(text) => self.store.save_text(&self.scope, name, text, None),
            Err(_) => self.store.save_bytes(&self.scope, name, content, None),
        }
        .map_err(|e| e.to_string())?;
        Ok(Saved { name: name.to_string(), version: saved.version, sha256: saved.sha256 })
    }

    #[cfg(not(feature = "artifacts"))]
    fn save_named(&self, _name: &str, _content: &[u8]) -> Result<Saved, String> {
        match *self {}
    }

    /// The content of artifact `reference` (`name@version`, or `name` for
    /// its latest version), and which version it was (`name@version`).
    pub(super) fn load(&self, reference: &str) -> Result<(Vec<u8>, String), String> {
        let (name, version) = parse_reference(reference).map_err(|e| format!("artifact {reference:?}: {e}"))?;
        self.load_named(name, version).map_err(|e| format!("artifact {reference:?}: {e}"))
    }

    #[cfg(feature = "artifacts")]
    fn load_named(&self, name: &str, version: Option<u32>) -> Result<(Vec<u8>, String), String> {
        let artifact = self.store.load(&self.scope, name, version).map_err(|e| e.to_string())?;
        Ok((artifact.content, format!("{name}@{}", artifact.version.version)))
    }

    #[cfg(not(feature = "artifacts"))]
    fn load_named(&self, _name: &str, _version: Option<u32>) -> Result<(Vec<u8>, String), String> {
        match *self {}
    }
}

/// `name@version` → (`name`, `Some(version)`); anything else is a name
/// (its latest version). A name may hold `@` itself: only a last `@`
/// followed by ASCII digits is a version (a number past `u32` is an error).
fn parse_reference(reference: &str) -> Result<(&str, Option<u32>), String> {
    match reference.rsplit_once('@') {
        Some((name, digits))
            if !name.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            let version = digits.parse::<u32>().map_err(|_| format!("version {digits} is out of range"))?;
            Ok((name, Some(version)))
        }
        _ => Ok((reference, None)),
    }
}

/// The artifact name `template` makes of the workspace path `path`:
/// `{path}` is the path with each `/` turned into `_`, `{name}` its last
/// component. The store checks what comes out (length, leading `.`).
fn artifact_name(template: &str, path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    template.replace("{path}", &path.replace('/', "_")).replace("{name}", name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_names() {
        assert_eq!(parse_reference("report.csv@3"), Ok(("report.csv", Some(3))));
        assert_eq!(parse_reference("report.csv"), Ok(("report.csv", None)));
        assert_eq!(parse_reference("a@b@2"), Ok(("a@b", Some(2))));
        assert_eq!(parse_reference("a@latest"), Ok(("a@latest", None)));
        assert_eq!(parse_reference("a@+1"), Ok(("a@+1", None)));
        assert_eq!(parse_reference("@2"), Ok(("@2", None)));
        assert!(parse_reference("a@99999999999").unwrap_err().contains("out of range"));
        assert_eq!(artifact_name(DEFAULT_NAME_TEMPLATE, "out/plots/a.png"), "out_plots_a.png");
        assert_eq!(artifact_name("run-7-{name}", "out/plots/a.png"), "run-7-a.png");
    }
}
