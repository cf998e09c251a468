//! Artifacts: code keeps versioned files across runs of one scope through
//! the `artifacts.*` tools (contained boa JavaScript, CPython-in-wasm,
//! sessions), scopes are apart, quotas are typed errors the code catches,
//! nothing is reachable without a grant, and spilled output keeps the
//! whole stdout.
//!
//! The Python tests need the interpreters of `scripts/fetch-interpreters.sh`:
//! without them they print why and pass, unless
//! `EXECBOX_REQUIRE_INTERPRETERS=1` makes that a failure.
#![cfg(all(feature = "artifacts", feature = "js"))]

use std::time::Duration;

use execbox::artifacts::{ArtifactStore, ArtifactStoreConfig};
use execbox::backends::BoaJs;
use execbox::tools::{ToolCallOutcome, ToolRegistry, ToolSpec};
use execbox::{ExecError, ExecRequest, ExecResult, Executor, InvalidRequest, Outcome, SandboxPolicy, Sessions};
use serde_json::{Value, json};

/// A store in a new temporary directory: 4 KiB per scope.
fn store() -> (tempfile::TempDir, ArtifactStore) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ArtifactStoreConfig::default().dir(dir.path()).max_scope_bytes(4096).max_file_bytes(64 << 10);
    (dir, ArtifactStore::new(cfg).unwrap())
}

/// The store's tools and one other (`math.add`), in one registry.
fn registry(store: &ArtifactStore) -> ToolRegistry {
    ToolRegistry::builder()
        .tool(ToolSpec::new("math.add"), |args: Value| async move {
            Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
        })
        .tools(&store.tools())
        .build()
        .unwrap()
}

fn js_exec(store: &ArtifactStore) -> Executor {
    Executor::builder().backend(BoaJs::default()).tools(registry(store)).artifacts(store.clone()).build()
}

fn policy(grants: &[&str]) -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_secs(20)).tools(grants.iter().copied())
}

fn js(code: &str, grants: &[&str], scope: Option<&str>) -> ExecRequest {
    let request = ExecRequest::javascript(code).policy(policy(grants));
    match scope {
        Some(scope) => request.artifact_scope(scope),
        None => request,
    }
}

fn ok(r: &ExecResult) -> Value {
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    r.output.clone().unwrap_or(Value::Null)
}

#[test]
fn js_keeps_versioned_artifacts_across_runs_of_one_scope_only() {
    let (_dir, store) = store();
    let exec = js_exec(&store);
    let saved = exec
        .execute_blocking(js(
            "const a = await tools.artifacts.save({name: 'notes.txt', content: 'first'});
             const b = await tools.artifacts.save({name: 'notes.txt', content: 'second', media_type: 'text/plain'});
             return [a.version, b.version, b.size];",
            &["artifacts.*"],
            Some("key:a"),
        ))
        .unwrap();
    assert_eq!(ok(&saved), json!([1, 2, 6]));
    assert_eq!(saved.tool_calls.len(), 2, "ledgered like any tool");
    assert!(saved.tool_calls.iter().all(|c| c.outcome == ToolCallOutcome::Ok));

    // A later run of the same scope sees both versions.
    let loaded = exec
        .execute_blocking(js(
            "const latest = await tools.artifacts.load({name: 'notes.txt'});
             const first = await tools.artifacts.load({name: 'notes.txt', version: 1});
             const listed = await tools.artifacts.list();
             return [latest.content, latest.version, first.content,
                     listed.artifacts.map(a => [a.name, a.versions.length]), listed.usage.files];",
            &["artifacts.*"],
            Some("key:a"),
        ))
        .unwrap();
    assert_eq!(ok(&loaded), json!(["second", 2, "first", [["notes.txt", 2]], 2]));
    // The host reads the same files.
    assert_eq!(store.load("key:a", "notes.txt", Some(1)).unwrap().content, b"first");

    // Another scope sees none of them: not_found, a ToolError the code catches.
    let other = exec
        .execute_blocking(js(
            "let kind;
             try { await tools.artifacts.load({name: 'notes.txt'}); } catch (e) { kind = [e instanceof ToolError, e.kind]; }
             return [kind, (await tools.artifacts.list()).artifacts.length];",
            &["artifacts.*"],
            Some("key:b"),
        ))
        .unwrap();
    assert_eq!(ok(&other), json!([[true, "not_found"], 0]));

    // A run without a scope has no artifacts: `unavailable`.
    let unscoped = exec
        .execute_blocking(js(
            "try { await tools.artifacts.list(); return 'listed'; } catch (e) { return e.kind; }",
            &["artifacts.*"],
            None,
        ))
        .unwrap();
    assert_eq!(ok(&unscoped), json!("unavailable"));
}

#[test]
fn js_catches_the_quota_and_bad_names_as_tool_errors() {
    let (_dir, store) = store();
    let exec = js_exec(&store);
    let r = exec
        .execute_blocking(js(
            "const kb = 'x'.repeat(1000);
             let saved = 0, error;
             for (let i = 0; i < 10; i++) {
               try { await tools.artifacts.save({name: 'blob', content: kb}); saved++; }
               catch (e) { error = [e.tool, e.kind]; break; }
             }
             let bad;
             try { await tools.artifacts.save({name: '../escape', content: 'x'}); } catch (e) { bad = e.kind; }
             return [saved, error, bad];",
            &["artifacts.*"],
            Some("key:q"),
        ))
        .unwrap();
    assert_eq!(ok(&r), json!([3, ["artifacts.save", "quota_exceeded"], "invalid_arguments"]));
    let usage = store.usage("key:q").unwrap();
    assert!(usage.bytes <= 4096 && usage.files == 3, "{usage:?}");
}

#[test]
fn without_a_grant_code_cannot_touch_the_artifacts() {
    let (_dir, store) = store();
    store.save_text("key:a", "secret", "the host's", None).unwrap();
    let exec = js_exec(&store);
    let r = exec
        .execute_blocking(js(
            "const kinds = [typeof tools.artifacts];
             for (const name of ['artifacts.load', 'artifacts.list', 'artifacts.save']) {
               try { await tools.call(name, {name: 'secret'}); kinds.push('ok'); } catch (e) { kinds.push(e.kind); }
             }
             return [kinds, await tools.math.add({a: 1, b: 2}), await tools.list()];",
            &["math.*"],
            Some("key:a"),
        ))
        .unwrap();
    assert_eq!(ok(&r), json!([["undefined", "not_granted", "not_granted", "not_granted"], 3, ["math.add"]]));
    assert_eq!(store.list("key:a").unwrap().len(), 1, "nothing was saved");
    // No grant at all: no `tools` object.
    let r = exec.execute_blocking(js("return typeof tools;", &[], Some("key:a"))).unwrap();
    assert_eq!(ok(&r), json!("undefined"));
}

#[test]
fn session_cells_share_their_sessions_scope() {
    let (_dir, store) = store();
    let sessions =
        Sessions::builder().backend(BoaJs::default()).tools(registry(&store)).artifacts(store.clone()).build();
    let cell = |code: &str| {
        sessions.execute_or_open("s1", ExecRequest::javascript(code).policy(policy(&["artifacts.*"]))).unwrap()
    };
    ok(&cell("await tools.artifacts.save({name: 'state.json', content: JSON.stringify({n: 1})}); return 0"));
    let r = cell("return JSON.parse((await tools.artifacts.load({name: 'state.json'})).content).n + 1");
    assert_eq!(ok(&r), json!(2));
    let scope = Sessions::artifact_scope("s1");
    assert_eq!(store.list(&scope).unwrap()[0].name, "state.json");
    assert!(store.list("session:s2").unwrap().is_empty());
}

/// A version larger than one tool result (`tool_limits.max_result_bytes`)
/// is read in parts: each answer says how many bytes it carries (`length`)
/// and that it was cut (`truncated`), so `offset += length` reads it all.
/// The answer used to be cut by the bridge's generic cut: `content` ended
/// in "…" while `length` still said the whole size, and such a loop lost
/// everything past the first part.
#[test]
fn js_reads_a_version_larger_than_one_tool_result_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path())).unwrap();
    let exec = js_exec(&store);
    // Quotes, newlines and a two-byte character: JSON takes more than a byte for some.
    let text: String = (0..2000).map(|i| format!("{i}: \"é\"\n")).collect();
    store.save_text("key:big", "big.txt", &text, None).unwrap();
    let policy = policy(&["artifacts.*"]).tool_limits(execbox::tools::ToolLimits::default().max_result_bytes(4096));
    let code = "let offset = 0, size = -1, cut = 0;
        const parts = [];
        while (offset !== size) {
          const part = await tools.artifacts.load({name: 'big.txt', offset});
          parts.push(part.content);
          offset += part.length;
          size = part.size;
          if (part.truncated) cut++;
        }
        return {text: parts.join(''), cut, size, offset, calls: parts.length};";
    let r = exec.execute_blocking(ExecRequest::javascript(code).policy(policy).artifact_scope("key:big")).unwrap();
    let out = ok(&r);
    let read = out["text"].as_str().unwrap();
    assert!(read == text, "the parts hold {} bytes, not the version's {} in order", read.len(), text.len());
    assert_eq!((out["size"].as_u64(), out["offset"].as_u64()), (Some(text.len() as u64), Some(text.len() as u64)));
    let calls = out["calls"].as_u64().unwrap();
    assert!(calls > 5 && out["cut"].as_u64() == Some(calls - 1), "{calls} calls, {} cut", out["cut"]);
    assert!(r.tool_calls.iter().all(|c| !c.truncated), "no answer needed the bridge's cut: {:?}", r.tool_calls);
}

/// B2 from code: saves the store's total refuses leave no directories
/// behind (they used to leave one empty name directory each, which the
/// quota does not count and `list` does not show).
#[test]
fn js_saves_the_total_refuses_leave_nothing_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ArtifactStoreConfig::default().dir(dir.path()).max_total_bytes(3000);
    let store = ArtifactStore::new(cfg).unwrap();
    let exec = js_exec(&store);
    let code = "let saved = 0, refused = 0;
        for (let i = 0; i < 90; i++) {
          try { await tools.artifacts.save({name: 'f' + i, content: 'x'.repeat(500)}); saved++; }
          catch (e) { if (e.kind !== 'quota_exceeded') throw e; refused++; }
        }
        const listed = await tools.artifacts.list({limit: 1000});
        return [saved, refused, listed.artifacts.length, listed.usage.files];";
    let r = exec.execute_blocking(js(code, &["artifacts.*"], Some("key:full"))).unwrap();
    let saved = ok(&r)[0].as_u64().unwrap();
    assert_eq!(ok(&r), json!([saved, 90 - saved, saved, saved]));
    assert!(saved > 0 && saved < 10, "{saved}");
    let scopes: Vec<_> = std::fs::read_dir(dir.path().join("scopes")).unwrap().collect();
    assert_eq!(scopes.len(), 1);
    let names = std::fs::read_dir(scopes[0].as_ref().unwrap().path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
        .count();
    assert_eq!(names as u64, saved, "a directory per saved name, none per refused one");
}

/// A policy whose stdout spills past 2000 bytes.
fn spilling() -> SandboxPolicy {
    let mut policy = policy(&["artifacts.*"]);
    policy.max_stdout_bytes = Some(2000);
    policy.spill_output(true)
}

/// `lines` lines `line <i>`, as a program prints them.
fn printed(lines: usize) -> String {
    (0..lines).map(|i| format!("line {i}\n")).collect()
}

/// What every spilled result holds: the head and tail within the cap, the
/// artifact named, the whole stream in it.
fn assert_spilled(store: &ArtifactStore, scope: &str, r: &ExecResult, whole: &str) -> String {
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let name = r.spilled.clone().unwrap_or_else(|| panic!("spilled: {r:?}"));
    assert!(r.stdout.bytes.len() <= 2000, "{}", r.stdout.bytes.len());
    assert!(r.stdout.truncated);
    assert_eq!(r.stdout.total_bytes, whole.len() as u64);
    let shown = r.stdout.text();
    assert!(shown.starts_with("line 0\nline 1\n"), "{shown}");
    assert!(shown.ends_with(&whole[whole.len() - 20..]), "{shown}");
    assert!(shown.contains(&format!("is artifact {name:?}")), "{shown}");
    assert_eq!(String::from_utf8(store.load(scope, &name, None).unwrap().content).unwrap(), whole);
    assert_eq!(r.to_json()["spilled"], json!(name));
    name
}

#[test]
fn spilled_output_keeps_the_whole_stdout() {
    let (_dir, store) = {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path())).unwrap();
        (dir, store)
    };
    let exec = js_exec(&store);
    let code = "for (let i = 0; i < 3000; i++) console.log('line ' + i); return 'done';";
    let r = exec.execute_blocking(ExecRequest::javascript(code).policy(spilling()).artifact_scope("key:s")).unwrap();
    let name = assert_spilled(&store, "key:s", &r, &printed(3000));
    assert_eq!(r.output, Some(json!("done")));
    // A later run of the scope reads it back, in parts.
    let load = format!(
        "const part = await tools.artifacts.load({{name: {name:?}, offset: 7, length: 7}}); return [part.content, part.size];"
    );
    let r = exec.execute_blocking(ExecRequest::javascript(load).policy(spilling()).artifact_scope("key:s")).unwrap();
    assert_eq!(ok(&r), json!(["line 1\n", printed(3000).len()]));
    assert_eq!(r.spilled, None, "within the cap nothing spills");

    // Not asked: cut as always, nothing kept.
    let mut plain = spilling();
    plain.spill_output = None;
    let r = exec.execute_blocking(ExecRequest::javascript(code).policy(plain).artifact_scope("key:t")).unwrap();
    assert_eq!((r.spilled.as_ref(), r.stdout.bytes.len(), r.stdout.truncated), (None, 2000, true));
    assert!(store.list("key:t").unwrap().is_empty());

    // Asked where it cannot be kept: refused before anything runs.
    let refused = |exec: &Executor, request: ExecRequest| match exec.execute_blocking(request) {
        Err(ExecError::InvalidRequest(InvalidRequest::CannotSpill { reason })) => reason,
        other => panic!("{other:?}"),
    };
    let no_scope = refused(&exec, ExecRequest::javascript(code).policy(spilling()));
    assert!(no_scope.contains("scope"), "{no_scope}");
    let storeless = Executor::builder().backend(BoaJs::default()).build();
    let no_store = refused(&storeless, ExecRequest::javascript(code).policy(spilling()).artifact_scope("key:s"));
    assert!(no_store.contains("store"), "{no_store}");
    // A ceiling that says never refuses it.
    let mut never = SandboxPolicy::strict().tools(["artifacts.*"]);
    never.spill_output = Some(false);
    let held =
        Executor::builder().backend(BoaJs::default()).tools(store.tools()).artifacts(store.clone()).ceiling(never);
    let err = held.build().execute_blocking(ExecRequest::javascript(code).policy(spilling()).artifact_scope("key:s"));
    assert!(matches!(err, Err(ExecError::InvalidRequest(InvalidRequest::OverCeiling { control: "spill_output", .. }))));
}

#[cfg(feature = "wasm")]
mod python {
    use super::*;
    use execbox::Backend;
    use execbox::backends::{InterpreterConfig, WasmInterpreter};

    /// CPython-in-wasm with the store, if the interpreter is installed.
    fn exec(store: &ArtifactStore) -> Option<Executor> {
        let backend = WasmInterpreter::new(InterpreterConfig::default().warm_pool(0)).unwrap();
        if !crate::common::skip::available(crate::common::skip::INTERPRETERS, backend.availability()) {
            return None;
        }
        Some(Executor::builder().backend(backend).tools(registry(store)).artifacts(store.clone()).build())
    }

    fn python(code: &str, scope: &str) -> ExecRequest {
        ExecRequest::source(execbox::Language::Python, code).policy(policy(&["artifacts.*"])).artifact_scope(scope)
    }

    #[test]
    fn python_keeps_artifacts_across_runs_and_catches_the_quota() {
        let (_dir, store) = store();
        let Some(exec) = exec(&store) else { return };
        let saved = exec
            .execute_blocking(python(
                "import json, tools
v = tools.artifacts.save(name='data.csv', content='a,b\\n1,2\\n', media_type='text/csv')
print(json.dumps(v['version']))",
                "key:py",
            ))
            .unwrap();
        assert_eq!(ok(&saved), json!(1));
        let loaded = exec
            .execute_blocking(python(
                "import json, tools
from tools.artifacts import load
a = load(name='data.csv')
seen = []
for i in range(10):
    try:
        tools.artifacts.save(name='blob', content='x' * 1000)
    except tools.ToolError as e:
        seen = [i, e.tool, e.kind]
        break
try:
    tools.call('artifacts.load', {'name': 'nope'})
except tools.ToolError as e:
    seen.append(e.kind)
print(json.dumps([a['content'], a['media_type'], seen]))",
                "key:py",
            ))
            .unwrap();
        // The scope already holds data.csv: three more kilobytes do not fit.
        assert_eq!(
            ok(&loaded),
            json!(["a,b\n1,2\n", "text/csv", [3, "artifacts.save", "quota_exceeded", "not_found"]])
        );
        // JavaScript runs of the same scope see what Python saved.
        let js = js_exec(&store)
            .execute_blocking(js(
                "return (await tools.artifacts.load({name: 'data.csv'})).content;",
                &["artifacts.*"],
                Some("key:py"),
            ))
            .unwrap();
        assert_eq!(ok(&js), json!("a,b\n1,2\n"));
        let other = exec
            .execute_blocking(python(
                "import json, tools\nprint(json.dumps(tools.artifacts.list()['artifacts']))",
                "key:other",
            ))
            .unwrap();
        assert_eq!(ok(&other), json!([]));
    }

    #[test]
    fn python_output_spills_too() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path())).unwrap();
        let Some(exec) = exec(&store) else { return };
        let request = ExecRequest::source(execbox::Language::Python, "for i in range(3000):\n    print(f'line {i}')")
            .policy(spilling())
            .artifact_scope("key:pys");
        let r = exec.execute_blocking(request).unwrap();
        assert_spilled(&store, "key:pys", &r, &printed(3000));
    }
}
