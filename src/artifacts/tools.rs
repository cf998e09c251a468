//! The `artifacts.*` tools: code's view of an [`ArtifactStore`], always in
//! the scope of the run that calls them ([`ToolContext::scope`]), never one
//! the code names.
//!
//! ```text
//! artifacts.save {name, content | content_base64, media_type?}
//!     → {name, version, size, sha256, created_unix_ms, media_type?, text}
//! artifacts.load {name, version?, offset?, length?}
//!     → {name, version, size, sha256, created_unix_ms, media_type?, text,
//!        offset, length, truncated, content | content_base64}
//! artifacts.list {name?, after?, limit?}
//!     → {artifacts: [{name, versions: [{version, size, sha256, created_unix_ms, media_type?, text}]}],
//!        more, usage: {bytes, files}, quota: {max_scope_bytes, max_scope_files, max_file_bytes}}
//! ```
//!
//! `load` gives text back as `content` when it was saved as text and the
//! bytes asked for are valid UTF-8, else as `content_base64`; `offset` and
//! `length` (bytes) read part of a version. An answer is held to the run's
//! `tool_limits.max_result_bytes` by `load` itself, not by the bridge's
//! generic cut (which would shorten `content` and leave `length` saying
//! otherwise): it carries fewer bytes, `length` says how many, and
//! `truncated` is true, so `offset += length` until `offset == size` reads
//! the whole version (text is cut between characters).
//!
//! Errors code can catch (`ToolError.kind`): `invalid_arguments` (a bad
//! name, a bad range, unknown arguments), `not_found` (no such artifact or
//! version), `quota_exceeded` (the scope's bytes or files, or the largest
//! file), `unavailable` (the run has no scope), `failed` (the store's disk).

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ArtifactError;
use super::store::{Artifact, ArtifactStore};
use crate::error::tool::{ToolError, ToolErrorKind};
use crate::tools::frame::json_len;
use crate::tools::registry::{ToolAnnotations, ToolContext, ToolFuture, ToolHandler, ToolRegistry, ToolSpec};

/// The namespace of the artifact tools (grant them with `artifacts.*`).
pub const NAMESPACE: &str = "artifacts";

/// The three operations.
#[derive(Clone, Copy, Debug)]
enum Op {
    Save,
    Load,
    List,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Save => "artifacts.save",
            Op::Load => "artifacts.load",
            Op::List => "artifacts.list",
        }
    }
}

/// One `artifacts.*` tool of a store.
struct ArtifactTool {
    store: ArtifactStore,
    op: Op,
}

impl ToolHandler for ArtifactTool {
    fn call(&self, args: Value) -> ToolFuture {
        self.call_in(args, &ToolContext::default())
    }

    fn call_in(&self, args: Value, context: &ToolContext) -> ToolFuture {
        let (op, store, context) = (self.op, self.store.clone(), context.clone());
        let Some(scope) = context.scope.clone() else {
            return Box::pin(async move {
                Err(ToolError::new(
                    op.name(),
                    ToolErrorKind::Unavailable,
                    "this run has no artifact scope: artifacts are kept per session, or per key its caller gives",
                ))
            });
        };
        Box::pin(async move {
            // File work blocks: off the tool runtime's async threads.
            let max_result = context.max_result_bytes;
            match tokio::task::spawn_blocking(move || run(op, &store, &scope, args, max_result)).await {
                Ok(answer) => answer,
                Err(e) => Err(ToolError::failed(op.name(), format!("the store's task failed: {e}"))),
            }
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SaveArgs {
    name: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    content_base64: Option<String>,
    #[serde(default)]
    media_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadArgs {
    name: String,
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    length: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// Artifacts one `artifacts.list` answers with when the call sets no `limit`.
const LIST_DEFAULT: usize = 100;

/// Most artifacts one `artifacts.list` answers with.
const LIST_MAX: usize = 1000;

/// Runs `op` with `args` in `scope` (on a blocking thread); `max_result`
/// is the largest answer the run takes.
fn run(op: Op, store: &ArtifactStore, scope: &str, args: Value, max_result: Option<u64>) -> Result<Value, ToolError> {
    let tool = op.name();
    let store_error = |e: ArtifactError| e.to_tool_error(tool);
    let bad = |message: String| ToolError::new(tool, ToolErrorKind::InvalidArguments, message);
    let args = if args.is_null() { json!({}) } else { args };
    match op {
        Op::Save => {
            let a: SaveArgs = serde_json::from_value(args).map_err(|e| bad(e.to_string()))?;
            let media_type = a.media_type.as_deref();
            let saved = match (a.content, a.content_base64) {
                (Some(text), None) => store.save_text(scope, &a.name, &text, media_type),
                (None, Some(encoded)) => {
                    let max = store.config().max_file_bytes;
                    if (encoded.len() as u64 / 4).saturating_mul(3) > max {
                        return Err(store_error(ArtifactError::QuotaExceeded(format!(
                            "content_base64 holds more than the largest artifact of {max} bytes"
                        ))));
                    }
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(encoded.as_bytes())
                        .map_err(|e| bad(format!("content_base64: {e}")))?;
                    store.save_bytes(scope, &a.name, &bytes, media_type)
                }
                _ => return Err(bad("give exactly one of content (text) and content_base64 (bytes)".into())),
            }
            .map_err(store_error)?;
            let mut value = serde_json::to_value(&saved).unwrap_or_default();
            value["name"] = json!(a.name);
            Ok(value)
        }
        Op::Load => {
            let a: LoadArgs = serde_json::from_value(args).map_err(|e| bad(e.to_string()))?;
            if a.version == Some(0) {
                return Err(bad("versions start at 1".into()));
            }
            let artifact = store.load(scope, &a.name, a.version).map_err(store_error)?;
            match loaded(artifact, a.offset, a.length, max_result) {
                Ok(value) => Ok(value),
                Err(Unloadable::Range(message)) => Err(bad(message)),
                Err(Unloadable::NoRoom(message)) => Err(ToolError::new(tool, ToolErrorKind::ResultTooLarge, message)),
            }
        }
        Op::List => {
            let a: ListArgs = serde_json::from_value(args).map_err(|e| bad(e.to_string()))?;
            let limit = a.limit.unwrap_or(LIST_DEFAULT);
            if !(1..=LIST_MAX).contains(&limit) {
                return Err(bad(format!("limit must be 1 to {LIST_MAX}")));
            }
            let mut artifacts = store.list(scope).map_err(store_error)?;
            if let Some(name) = &a.name {
                artifacts.retain(|info| &info.name == name);
            }
            if let Some(after) = &a.after {
                artifacts.retain(|info| info.name.as_str() > after.as_str());
            }
            let more = artifacts.len() > limit;
            artifacts.truncate(limit);
            let usage = store.usage(scope).map_err(store_error)?;
            let cfg = store.config();
            Ok(json!({
                "artifacts": artifacts,
                "more": more,
                "usage": usage,
                "quota": {
                    "max_scope_bytes": cfg.max_scope_bytes,
                    "max_scope_files": cfg.max_scope_files,
                    "max_file_bytes": cfg.max_file_bytes,
                },
            }))
        }
    }
}

/// Why `load` cannot answer.
enum Unloadable {
    /// `offset` is past the end.
    Range(String),
    /// The run's largest answer cannot hold one byte (or character) of content.
    NoRoom(String),
}

/// `load`'s answer: the version's description and the bytes from
/// `offset` (default 0), at most `length` of them (default: to the end),
/// and no more than fit an answer of `max_result` bytes of JSON: then
/// `length` counts the bytes it carries and `truncated` is true.
fn loaded(
    artifact: Artifact,
    offset: Option<u64>,
    length: Option<u64>,
    max_result: Option<u64>,
) -> Result<Value, Unloadable> {
    let size = artifact.content.len() as u64;
    let offset = offset.unwrap_or(0);
    if offset > size {
        return Err(Unloadable::Range(format!("offset {offset} is past the end ({size} bytes)")));
    }
    let asked_end = length.map_or(size, |n| offset.saturating_add(n).min(size));
    let content = &artifact.content;
    // Text stays text: a cut ends between characters (when the bytes asked for are text at all).
    let asked = &content[offset as usize..asked_end as usize];
    let text = std::str::from_utf8(asked).ok().filter(|_| artifact.version.text);
    let cut = |end: u64| {
        let mut at = (end - offset) as usize;
        while text.is_some_and(|t| !t.is_char_boundary(at)) {
            at -= 1;
        }
        offset + at as u64
    };
    let mut described = serde_json::to_value(&artifact.version).unwrap_or_default();
    described["name"] = json!(artifact.name);
    described["offset"] = json!(offset);
    let answer = |end: u64| {
        let slice = &content[offset as usize..end as usize];
        let mut value = described.clone();
        value["length"] = json!(end - offset);
        value["truncated"] = json!(end < asked_end);
        match text {
            Some(t) => value["content"] = json!(&t[..slice.len()]),
            None => value["content_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(slice)),
        }
        value
    };
    let Some(max) = max_result else { return Ok(answer(asked_end)) };
    let whole = answer(asked_end);
    if json_len(&whole) <= max {
        return Ok(whole);
    }
    // The most bytes that fit: the answer grows with its content, so a
    // binary search (content never takes less than a byte of JSON per byte,
    // so no more than `max` bytes can fit).
    let (mut fits, mut over) = (0u64, (asked_end - offset).min(max.saturating_add(1)));
    if json_len(&answer(offset)) > max {
        return Err(Unloadable::NoRoom(format!(
            "the answer's description alone is over the run's largest tool result ({max} bytes, \
             tool_limits.max_result_bytes)"
        )));
    }
    while over - fits > 1 {
        let mid = fits + (over - fits) / 2;
        if json_len(&answer(cut(offset + mid))) <= max {
            fits = mid;
        } else {
            over = mid;
        }
    }
    let end = cut(offset + fits);
    if end == offset {
        return Err(Unloadable::NoRoom(format!(
            "the run's largest tool result ({max} bytes, tool_limits.max_result_bytes) has no room for content \
             after the answer's description"
        )));
    }
    Ok(answer(end))
}

impl ArtifactStore {
    /// The tools code reaches this store with: `artifacts.save`,
    /// `artifacts.load` and `artifacts.list` (see the module docs of
    /// [`crate::artifacts`]). Merge them into the registry an executor or
    /// a session registry calls ([`ToolRegistry::merged`]), and grant them
    /// like any tool (`artifacts.*`). Each call works in its run's scope
    /// ([`ExecRequest::artifact_scope`](crate::request::ExecRequest::artifact_scope)).
    pub fn tools(&self) -> ToolRegistry {
        let tool = |op: Op| ArtifactTool { store: self.clone(), op };
        let name = json!({"type": "string", "description": "1 to 128 bytes: no `/`, `\\` or control characters, not starting with `.`"});
        let save = ToolSpec::new(Op::Save.name())
            .description(
                "Save a file as the next version of `name` in this run's artifact scope (kept across runs of the \
                 same session or key). Give `content` (text) or `content_base64` (bytes). Returns its version, \
                 size and sha256. Fails with quota_exceeded past the scope's quota.",
            )
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "name": name,
                    "content": {"type": "string", "description": "the content, as text"},
                    "content_base64": {"type": "string", "description": "the content, as base64 bytes"},
                    "media_type": {"type": "string", "description": "e.g. text/csv"},
                },
                "required": ["name"],
                "additionalProperties": false,
            }))
            .annotations(ToolAnnotations::default());
        let load = ToolSpec::new(Op::Load.name())
            .description(
                "Load an artifact of this run's scope: the latest version, or `version`. Text comes back as \
                 `content`, bytes as `content_base64`; `offset` and `length` (bytes) read part of a large one \
                 (`size` is the whole). An answer too large for one tool result carries fewer bytes: `length` \
                 says how many and `truncated` is true; read on from `offset + length`. Fails with not_found \
                 when there is no such artifact or version.",
            )
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "name": name,
                    "version": {"type": "integer", "minimum": 1},
                    "offset": {"type": "integer", "minimum": 0},
                    "length": {"type": "integer", "minimum": 0},
                },
                "required": ["name"],
                "additionalProperties": false,
            }))
            .annotations(ToolAnnotations::default().read_only(true));
        let list = ToolSpec::new(Op::List.name())
            .description(
                "List the artifacts of this run's scope (or only `name`), sorted by name, at most `limit` (default \
                 100; `more` says whether there are others: pass the last name as `after` for the next page): each \
                 name with its versions (size, sha256, created_unix_ms), and the scope's usage and quota.",
            )
            .input_schema(json!({
                "type": "object",
                "properties": {
                    "name": name,
                    "after": {"type": "string", "description": "list only names after this one (the last name of the previous page)"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": LIST_MAX, "description": "most artifacts to list (default 100)"},
                },
                "additionalProperties": false,
            }))
            .annotations(ToolAnnotations::default().read_only(true));
        ToolRegistry::builder()
            .tool(save, tool(Op::Save))
            .tool(load, tool(Op::Load))
            .tool(list, tool(Op::List))
            .build()
            .expect("the artifact tools' names are valid and distinct")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::config::ArtifactStoreConfig;

    fn call(store: &ArtifactStore, scope: Option<&str>, name: &str, args: Value) -> Result<Value, ToolError> {
        let tools = store.tools();
        let context = scope.map(ToolContext::with_scope).unwrap_or_default();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(tools.get(name).unwrap().handler.call_in(args, &context))
    }

    #[test]
    fn the_tools_work_in_their_runs_scope_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path()).max_file_bytes(16)).unwrap();
        let saved = call(&store, Some("a"), "artifacts.save", json!({"name": "n", "content": "hi"})).unwrap();
        assert_eq!(
            (saved["name"].clone(), saved["version"].clone(), saved["size"].clone()),
            (json!("n"), json!(1), json!(2))
        );
        let bytes = call(&store, Some("a"), "artifacts.save", json!({"name": "n", "content_base64": "AP8="})).unwrap();
        assert_eq!(bytes["version"], 2);
        let loaded = call(&store, Some("a"), "artifacts.load", json!({"name": "n", "version": 1})).unwrap();
        assert_eq!(loaded["content"], "hi");
        let loaded = call(&store, Some("a"), "artifacts.load", json!({"name": "n"})).unwrap();
        assert_eq!(loaded["content_base64"], "AP8=");
        let part =
            call(&store, Some("a"), "artifacts.load", json!({"name": "n", "version": 1, "offset": 1, "length": 5}))
                .unwrap();
        assert_eq!((part["content"].clone(), part["length"].clone()), (json!("i"), json!(1)));
        // Another scope sees nothing; no scope is `unavailable`.
        let other = call(&store, Some("b"), "artifacts.load", json!({"name": "n"})).unwrap_err();
        assert_eq!(other.kind, ToolErrorKind::NotFound);
        let none = call(&store, None, "artifacts.list", json!({})).unwrap_err();
        assert_eq!(none.kind, ToolErrorKind::Unavailable);
        // Typed errors code can catch.
        let kind = |args: Value| call(&store, Some("a"), "artifacts.save", args).unwrap_err().kind;
        assert_eq!(kind(json!({"name": "../x", "content": "x"})), ToolErrorKind::InvalidArguments);
        assert_eq!(kind(json!({"name": "x", "content": "x", "path": "/etc"})), ToolErrorKind::InvalidArguments);
        assert_eq!(kind(json!({"name": "x"})), ToolErrorKind::InvalidArguments);
        assert_eq!(kind(json!({"name": "x", "content": "x".repeat(17)})), ToolErrorKind::QuotaExceeded);
        assert_eq!(kind(json!({"name": "x", "content_base64": "A".repeat(40)})), ToolErrorKind::QuotaExceeded);
    }

    #[test]
    fn listing_is_paged() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path())).unwrap();
        for i in 0..5 {
            store.save_text("s", &format!("f{i}"), "x", None).unwrap();
        }
        let page = call(&store, Some("s"), "artifacts.list", json!({"limit": 2})).unwrap();
        let names =
            |v: &Value| v["artifacts"].as_array().unwrap().iter().map(|a| a["name"].clone()).collect::<Vec<_>>();
        assert_eq!((names(&page), page["more"].clone()), (vec![json!("f0"), json!("f1")], json!(true)));
        let next = call(&store, Some("s"), "artifacts.list", json!({"limit": 2, "after": "f3"})).unwrap();
        assert_eq!((names(&next), next["more"].clone()), (vec![json!("f4")], json!(false)));
        assert_eq!(next["usage"]["files"], 5);
        let err = call(&store, Some("s"), "artifacts.list", json!({"limit": 0})).unwrap_err();
        assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    }

    /// An answer held to the run's largest tool result carries fewer bytes
    /// and says so; `offset += length` reads the whole version, text cut
    /// only between characters, bytes too.
    #[test]
    fn a_load_too_large_for_one_result_says_how_much_it_carries() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path())).unwrap();
        let text: String = (0..400).map(|i| format!("\"é{i}\"\n")).collect();
        store.save_text("s", "t", &text, None).unwrap();
        let bytes: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        store.save_bytes("s", "b", &bytes, None).unwrap();
        let load = |name: &str, offset: u64, max: u64| {
            let args = json!({"name": name, "offset": offset});
            run(Op::Load, &store, "s", args, Some(max))
        };
        for max in [600u64, 1000, 4096] {
            let (mut offset, mut text_read, mut bytes_read, mut parts) = (0u64, String::new(), Vec::new(), 0);
            loop {
                let part = load("t", offset, max).unwrap();
                assert!(json_len(&part) <= max, "{max}: {}", json_len(&part));
                let content = part["content"].as_str().unwrap();
                assert_eq!(part["length"].as_u64().unwrap(), content.len() as u64);
                text_read.push_str(content);
                offset += part["length"].as_u64().unwrap();
                parts += 1;
                assert_eq!(part["truncated"], json!(offset < text.len() as u64), "{part}");
                if part["truncated"] == json!(false) {
                    break;
                }
            }
            assert_eq!(text_read, text, "{max}");
            assert!(parts > 1, "{max}: cut into parts");
            offset = 0;
            loop {
                let part = load("b", offset, max).unwrap();
                assert!(json_len(&part) <= max);
                let chunk =
                    base64::engine::general_purpose::STANDARD.decode(part["content_base64"].as_str().unwrap()).unwrap();
                assert_eq!(part["length"].as_u64().unwrap(), chunk.len() as u64);
                bytes_read.extend(chunk);
                offset += part["length"].as_u64().unwrap();
                if part["truncated"] == json!(false) {
                    break;
                }
            }
            assert_eq!(bytes_read, bytes, "{max}");
        }
        // Within the limit: the whole, not truncated; `length` asked for is kept.
        let whole = run(Op::Load, &store, "s", json!({"name": "t", "length": 10}), Some(1 << 20)).unwrap();
        assert_eq!((whole["length"].clone(), whole["truncated"].clone()), (json!(10), json!(false)));
        // No room for a single character: an error, not an empty answer code would loop on.
        let err = load("t", 0, 100).unwrap_err();
        assert_eq!(err.kind, ToolErrorKind::ResultTooLarge, "{err}");
    }
}
