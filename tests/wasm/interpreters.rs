//! CPython and QuickJS inside wasmtime: semantics shared with the other
//! backends of the same language, every wasm limit, and routing.
//!
//! The modules come from `scripts/fetch-interpreters.sh`. Without them the
//! tests print why and pass, unless `EXECBOX_REQUIRE_INTERPRETERS=1` (set by
//! `.ci/run`) makes that a failure.
#![cfg(feature = "wasm")]

use crate::common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::wait::wait_until;
use execbox::backends::{BoaJs, BoaJsConfig, Interpreter, InterpreterConfig, WasmInterpreter};
use execbox::{Backend, ExecRequest, ExecResult, Executor, Language, Outcome, SandboxPolicy};
use serde_json::json;

fn shared(
    slot: &'static OnceLock<Option<WasmInterpreter>>,
    make: fn() -> WasmInterpreter,
) -> Option<&'static WasmInterpreter> {
    slot.get_or_init(|| common::skip::interpreter(make())).as_ref()
}

fn python_backend() -> Option<&'static WasmInterpreter> {
    static SLOT: OnceLock<Option<WasmInterpreter>> = OnceLock::new();
    shared(&SLOT, || WasmInterpreter::new(InterpreterConfig::default()).expect("engine"))
}

fn quickjs_backend() -> Option<&'static WasmInterpreter> {
    static SLOT: OnceLock<Option<WasmInterpreter>> = OnceLock::new();
    shared(&SLOT, || WasmInterpreter::new(InterpreterConfig::default().kind(Interpreter::QuickJs)).expect("engine"))
}

fn python(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Python, code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(30)))
}

fn run(backend: &WasmInterpreter, request: ExecRequest) -> ExecResult {
    Executor::run_on(backend, request).expect("execute")
}

// ---- Python --------------------------------------------------------------------

#[test]
fn python_gets_input_and_its_json_stdout_is_output() {
    let Some(py) = python_backend() else { return };
    let code = "import json, sys\nprint(json.dumps({'sum': sum(input['items']), 'argv': sys.argv[1:]}))";
    let r = run(py, python(code).input(json!({"items": [1, 2, 3]})).arg("x"));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.backend, "python-wasm");
    assert_eq!(r.output, Some(json!({"sum": 6, "argv": ["x"]})));
    let r = run(py, python("print(open('/work/input.json').read())").input(json!([1])));
    assert_eq!(r.stdout.text().trim(), "[1]");
    let r = run(
        py,
        python("print(open('/work/data.txt').read())").input_file(execbox::ExecFile::new("data.txt", "staged")),
    );
    assert_eq!(r.stdout.text().trim(), "staged");
}

#[test]
fn python_stdlib_modules_work() {
    let Some(py) = python_backend() else { return };
    let code = "\
import json, re, statistics, datetime, decimal, csv, io, collections, math
rows = list(csv.reader(io.StringIO('a,1\\nb,2')))
print(json.dumps({
    'mean': statistics.mean([1, 2, 3, 4]),
    're': re.findall(r'\\d+', 'a1b22'),
    'date': datetime.date(2026, 11, 22).isoformat(),
    'dec': str(decimal.Decimal('0.1') + decimal.Decimal('0.2')),
    'csv': rows,
}))";
    let r = run(py, python(code));
    assert_eq!(r.outcome, Outcome::Ok, "{}", r.stderr.text());
    assert_eq!(
        r.output,
        Some(
            json!({"mean": 2.5, "re": ["1", "22"], "date": "2026-11-22", "dec": "0.3", "csv": [["a", "1"], ["b", "2"]]})
        )
    );
}

#[test]
fn python_errors_point_at_the_callers_lines() {
    let Some(py) = python_backend() else { return };
    let r = run(py, python("x = 1\ny = x / 0\n"));
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(1)));
    let stderr = r.stderr.text();
    assert!(stderr.contains("File \"<code>\", line 2") && stderr.contains("ZeroDivisionError"), "{stderr}");
}

#[test]
fn python_sockets_and_subprocesses_fail_cleanly() {
    let Some(py) = python_backend() else { return };
    let code = "\
results = []
try:
    import socket
    socket.create_connection(('1.1.1.1', 53), timeout=1)
    results.append('connected')
except Exception as e:
    results.append('socket: ' + type(e).__name__)
try:
    import subprocess
    subprocess.run(['ls'])
    results.append('spawned')
except Exception as e:
    results.append('subprocess: ' + type(e).__name__)
print('|'.join(results))";
    let r = run(py, python(code));
    assert_eq!(r.outcome, Outcome::Ok, "{}", r.stderr.text());
    let out = r.stdout.text();
    assert!(out.starts_with("socket: ") && out.contains("|subprocess: "), "{out}");
    assert!(!out.contains("connected") && !out.contains("spawned"));
}

#[test]
fn python_memory_bomb_is_out_of_memory() {
    let Some(py) = python_backend() else { return };
    let policy = SandboxPolicy::strict().memory_bytes(64 << 20).timeout(Duration::from_secs(30));
    let r = run(py, python("x = bytearray(1 << 30)\nprint('survived')").policy(policy));
    // CPython turns the failed allocation into a MemoryError; the run, which
    // hit the cap and then failed, is reported as out_of_memory.
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert!(r.stderr.text().contains("MemoryError"), "{}", r.stderr.text());
    assert!(!r.stdout.text().contains("survived"));
}

#[test]
fn python_infinite_loops_time_out_or_run_out_of_fuel() {
    let Some(py) = python_backend() else { return };
    let started = Instant::now();
    let r = run(py, python("while True: pass").policy(SandboxPolicy::strict().timeout(Duration::from_millis(500))));
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    let r = run(py, python("while True: pass").policy(SandboxPolicy::strict().fuel(2_000_000_000)));
    assert_eq!(r.outcome, Outcome::OutOfFuel, "{r:?}");
}

#[test]
fn python_runs_never_share_state() {
    let Some(py) = python_backend() else { return };
    let r = run(py, python("import builtins\nbuiltins.leaked = 42\nglobals()['mine'] = 1\nprint('set')"));
    assert_eq!(r.stdout.text(), "set\n");
    let r = run(py, python("import builtins\nprint(hasattr(builtins, 'leaked'), 'mine' in globals())"));
    assert_eq!(r.stdout.text(), "False False\n");
}

// ---- QuickJS --------------------------------------------------------------------

#[test]
fn quickjs_has_boas_request_semantics() {
    let Some(qjs) = quickjs_backend() else { return };
    let code = "console.log('hi', {a: 1}); console.warn('careful'); return input.items.map(x => x * 2)";
    let r = run(qjs, ExecRequest::javascript(code).input(json!({"items": [1, 2, 3]})));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.backend, "quickjs-wasm");
    assert_eq!(r.output, Some(json!([2, 4, 6])));
    assert_eq!(r.stdout.text(), "hi {\"a\":1}\n", "the returned value is not in stdout");
    assert_eq!(r.stdout.total_bytes, r.stdout.bytes.len() as u64);
    assert_eq!(r.stderr.text(), "careful\n");

    let r = run(qjs, ExecRequest::javascript("await null; return 5"));
    assert_eq!(r.output, Some(json!(5)));
    let r = run(qjs, ExecRequest::javascript("console.log('no return')"));
    assert_eq!((r.outcome, r.output), (Outcome::Ok, None));
    let r = run(qjs, ExecRequest::javascript("throw new TypeError('bad')"));
    assert_eq!((r.outcome, r.message.as_deref()), (Outcome::Failed, Some("TypeError: bad")));
    assert!(r.stderr.text().ends_with("Uncaught TypeError: bad\n"));
    let r = run(qjs, ExecRequest::javascript("return 1n"));
    assert_eq!(r.outcome, Outcome::Failed, "BigInt has no JSON form, as on boa");
}

#[test]
fn quickjs_memory_bombs_and_loops_are_stopped() {
    let Some(qjs) = quickjs_backend() else { return };
    let policy = SandboxPolicy::strict().memory_bytes(64 << 20).timeout(Duration::from_secs(20));
    let bomb = "let a = []; while (true) a.push(new Array(100000).fill(1))";
    let r = run(qjs, ExecRequest::javascript(bomb).policy(policy));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    let started = Instant::now();
    let r = run(
        qjs,
        ExecRequest::javascript("while (true) {}").policy(SandboxPolicy::strict().timeout(Duration::from_millis(300))),
    );
    assert_eq!(r.outcome, Outcome::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(3));
}

// ---- routing ---------------------------------------------------------------------

#[test]
fn js_goes_to_contained_boa_and_to_quickjs_when_boa_has_no_worker() {
    let (Some(_), Some(_)) = (python_backend(), quickjs_backend()) else { return };
    let exec = Executor::builder()
        .backend(BoaJs::default())
        .backend(WasmInterpreter::new(InterpreterConfig::default().kind(Interpreter::QuickJs)).unwrap())
        .backend(WasmInterpreter::new(InterpreterConfig::default()).unwrap())
        .build();
    // Contained boa enforces the memory cap itself.
    let capped = ExecRequest::javascript("return 1").policy(SandboxPolicy::strict().memory_bytes(32 << 20));
    assert_eq!(exec.select(&capped).unwrap().name(), "boa-js");
    assert_eq!(exec.select(&python("print(1)")).unwrap().name(), "python-wasm");
    // Without a worker program boa is unavailable, and QuickJS, which also
    // enforces everything, takes the request (never in-process boa).
    let no_worker = BoaJs::new(BoaJsConfig::default().worker_program("/nonexistent")).unwrap();
    let exec = Executor::builder()
        .backend(no_worker)
        .backend(WasmInterpreter::new(InterpreterConfig::default().kind(Interpreter::QuickJs)).unwrap())
        .build();
    assert_eq!(exec.select(&capped).unwrap().name(), "quickjs-wasm");
    assert_eq!(exec.execute_blocking(capped).unwrap().output, Some(json!(1)));
}

#[test]
#[cfg(feature = "container")]
fn python_prefers_wasm_over_the_container_unless_pinned() {
    let Some(_) = python_backend() else { return };
    let exec = Executor::with_default_backends();
    assert_eq!(exec.select(&python("print(1)")).unwrap().name(), "python-wasm");
    let pinned = python("print(1)").on_backend("container");
    assert_eq!(exec.select(&pinned).map(|b| b.name().to_string()).unwrap_or_default(), "container");
}

// ---- the warm pool ----------------------------------------------------------------

#[test]
fn warm_instances_serve_requests_and_are_replaced_at_once() {
    let Some(py) = python_backend() else { return };
    assert_eq!(py.warm_idle(), 2, "warm_up started the pool");
    // `prepare` waits for one ready instance; the pool's second says nothing.
    wait_until(Duration::from_secs(60), || py.warm_ready() >= 2);
    assert_eq!(py.warm_ready(), 2, "both instances finished start-up and wait for code");
    let r = run(py, python("print(6 * 7)"));
    assert_eq!(r.output, Some(json!(42)));
    assert_eq!(r.usage.fuel, None, "served by a warm instance (no per-request fuel figure)");
    // The pool's refill thread starts it, off the request's path.
    assert!(wait_until(Duration::from_secs(30), || py.warm_idle() == 2), "a replacement started");
    let r = run(py, python("import sys\nprint(sys.argv[1:])").arg("x"));
    assert_eq!(r.stdout.text(), "['x']\n");
    assert!(r.usage.fuel.is_some(), "arguments are fixed at start-up: a fresh instance ran it");
}

#[test]
fn back_to_back_runs_wait_for_the_replacement_rather_than_start_fresh() {
    let Some(py) = common::skip::interpreter(WasmInterpreter::new(InterpreterConfig::default().warm_pool(1)).unwrap())
    else {
        return;
    };
    py.prepare(Duration::from_secs(60));
    // Each run's replacement is started by the pool's refill thread after
    // the run answers; the next run, sent at once, waits for it to be
    // listed instead of starting a fresh instance.
    for i in 0..5 {
        let r = run(&py, python(&format!("print({i})")));
        assert_eq!((r.output, r.usage.fuel), (Some(json!(i)), None), "run {i} was not warm");
    }
}

#[test]
fn warm_runs_keep_every_limit() {
    let Some(py) = python_backend() else { return };
    let started = Instant::now();
    let r = run(py, python("while True: pass").policy(SandboxPolicy::strict().timeout(Duration::from_millis(400))));
    assert_eq!((r.outcome, r.usage.fuel), (Outcome::TimedOut, None), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());

    let capped = SandboxPolicy::strict().memory_bytes(64 << 20).max_output_bytes(100);
    let r = run(py, python("x = bytearray(1 << 30)").policy(capped.clone()));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    let r = run(py, python("print('x' * 10000)").policy(capped));
    assert_eq!((r.stdout.bytes.len(), r.stdout.total_bytes, r.stdout.truncated), (100, 10001, true));
    let r = run(py, python("import sys\nprint('bye', flush=False)\nsys.exit(3)"));
    assert_eq!((r.outcome, r.exit_code, r.stdout.text().as_ref()), (Outcome::Failed, Some(3), "bye\n"));
    let r = run(py, python("import sys\nsys.exit('fatal')"));
    assert_eq!((r.exit_code, r.stderr.text().as_ref()), (Some(1), "fatal\n"));
    // An input file and the JSON input reach a warm instance too.
    let r = run(
        py,
        python("print(open('/work/f.txt').read() + str(input['n']))")
            .input(json!({"n": 7}))
            .input_file(execbox::ExecFile::new("f.txt", "n=")),
    );
    assert_eq!(r.stdout.text(), "n=7\n");
}

// ---- QuickJS: the returned value cannot be cut or forged -------------------------

fn js(code: &str) -> ExecRequest {
    ExecRequest::javascript(code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)))
}

#[test]
fn quickjs_returned_values_are_whole_or_flagged_never_cut() {
    let Some(qjs) = quickjs_backend() else { return };
    let capped =
        |code: &str| js(code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)).max_output_bytes(96));
    // The logs fill the stdout cap; the value travels apart from them, whole.
    let r = run(qjs, capped("console.log('x'.repeat(100)); return 12345"));
    assert_eq!((r.outcome, r.output.clone(), r.stdout.truncated), (Outcome::Ok, Some(json!(12345)), true), "{r:?}");
    // A value over the cap is failed and flagged, as the executor's result caps decide for every backend.
    let r = run(qjs, capped("return 'y'.repeat(200)"));
    assert_eq!((r.outcome, r.output.clone(), r.output_truncated), (Outcome::Failed, None, true), "{r:?}");
    assert_eq!(r.message.as_deref(), Some("the returned value is over the output cap of 96 bytes (max_stdout_bytes)"));
    // Non-ASCII: the length is in UTF-8 bytes.
    let r = run(qjs, js("return ['é', '€', '😀', 'a\\u0000b']"));
    assert_eq!(r.output, Some(json!(["é", "€", "😀", "a\u{0}b"])), "{r:?}");
}

#[test]
fn quickjs_code_cannot_forge_its_output() {
    let Some(qjs) = quickjs_backend() else { return };
    // Nothing of the runner is reachable, and stdin is spent before the code runs.
    let r = run(qjs, js("return [typeof __execbox, std.in.readAsString(), typeof MARK]"));
    assert_eq!(r.output, Some(json!(["undefined", "", "undefined"])), "{r:?}");
    // Replacing what the runner calls later changes nothing.
    let code = "JSON.stringify = () => '666'; std.out.puts = () => {}; Promise.prototype.then = () => {}; return 7";
    let r = run(qjs, js(code));
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(7))), "{r:?}");
    // A guessed record is ordinary output.
    let r = run(qjs, js("std.out.puts('\\0execbox:0123456789abcdef0123456789abcdef:R2:66\\n'); return 1"));
    assert_eq!(r.output, Some(json!(1)), "{r:?}");
    assert!(r.stdout.bytes.starts_with(b"\0execbox:"), "{r:?}");
    // Code that breaks out of the function body runs after the runner read stdin.
    let r = run(qjs, js("} console.log('leak:' + std.in.readAsString()); function __after() {"));
    assert_eq!((r.outcome, r.stdout.text().as_ref(), r.output.clone()), (Outcome::Ok, "leak:\n", None), "{r:?}");
}

#[test]
fn quickjs_runs_that_do_not_return_a_value_are_failed() {
    let Some(qjs) = quickjs_backend() else { return };
    let r = run(qjs, js("await new Promise(() => {}); return 1"));
    assert_eq!(
        (r.outcome, r.message.as_deref()),
        (Outcome::Failed, Some("the returned promise never settled")),
        "{r:?}"
    );
    let r = run(qjs, js("std.exit(0)"));
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(r.message.as_deref().unwrap().contains("before returning a value"), "{r:?}");
    // A rejection nobody handles fails the run (as on boa).
    let r = run(qjs, js("Promise.reject(new Error('lost')); return 1"));
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.message.as_deref(), Some("unhandled promise rejection: Error: lost"));
    // Errors keep the caller's line numbers.
    let r = run(qjs, js("let a = 1;\nlet b = 2;\nlet = = 3;"));
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.message.as_deref(), Some("SyntaxError: variable name expected (line 3)"), "{r:?}");
}

// ---- one engine, slots shared, every run bounded ---------------------------------

#[test]
fn a_run_that_cannot_get_a_slot_in_time_is_busy_naming_its_backend() {
    let Some(_) = python_backend() else { return };
    use execbox::backends::{WasmEngine, WasmGuest, WasmGuestConfig};
    let engine = WasmEngine::new(WasmGuestConfig::default().pooled_instances(1)).unwrap();
    let wasm = WasmGuest::on_engine(engine.clone());
    let py = WasmInterpreter::on_engine(engine.clone(), InterpreterConfig::default().warm_pool(0));
    py.warm_up().unwrap();
    let tool = include_bytes!("../../guests/prebuilt/wasi_tool.wasm").to_vec();
    wasm.precompile(&tool).unwrap();
    let sleeper = ExecRequest::wasm(tool).arg("sleep").arg("2000");
    std::thread::scope(|s| {
        let slept = s.spawn(|| Executor::run_on(&wasm, sleeper).unwrap());
        wait_until(Duration::from_secs(30), || engine.slots_in_use() > 0);
        let short = python("print(1)").policy(SandboxPolicy::strict().timeout(Duration::from_millis(100)));
        let err = Executor::run_on(&py, short).unwrap_err();
        assert!(matches!(&err, execbox::ExecError::Busy { backend, .. } if backend == "python-wasm"), "{err:?}");
        let r = Executor::run_on(&py, python("print(2)")).unwrap();
        assert_eq!(r.output, Some(json!(2)), "waited for the slot: {r:?}");
        assert_eq!(slept.join().unwrap().outcome, Outcome::Ok);
    });
}

#[test]
fn interpreter_runs_without_a_policy_timeout_get_the_default() {
    let (Some(_), Some(_)) = (python_backend(), quickjs_backend()) else { return };
    use execbox::backends::{WasmEngine, WasmGuestConfig};
    let mut cfg = WasmGuestConfig::default();
    cfg.defaults.timeout = Duration::from_millis(1500);
    let engine = WasmEngine::new(cfg).unwrap();
    let py = WasmInterpreter::on_engine(engine.clone(), InterpreterConfig::default().warm_pool(1));
    let qjs = WasmInterpreter::on_engine(engine, InterpreterConfig::default().kind(Interpreter::QuickJs));
    py.warm_up().unwrap();
    qjs.warm_up().unwrap();
    py.prepare(Duration::from_secs(60));
    let mut unbounded = SandboxPolicy::strict();
    unbounded.timeout_ms = None;
    let cases = [
        (&py, ExecRequest::source(Language::Python, "while True: pass")), // warm
        (&py, ExecRequest::source(Language::Python, "import time\ntime.sleep(3600)").arg("fresh")),
        (&qjs, ExecRequest::javascript("while (true) {}")),
    ];
    for (backend, request) in cases {
        let r = Executor::run_on(backend, request.policy(unbounded.clone())).unwrap();
        assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
        assert_eq!(r.message.as_deref(), Some("deadline of 1500 ms exceeded"), "{r:?}");
    }
}

#[test]
fn an_interpreter_cache_dir_others_can_write_is_not_used() {
    let Some(_) = quickjs_backend() else { return };
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let source = execbox::backends::wasm::interpreters_dir().unwrap().join("quickjs.wasm");
    std::fs::copy(source, root.path().join("quickjs.wasm")).unwrap();
    let compiled = root.path().join("compiled");
    std::fs::create_dir(&compiled).unwrap();
    std::fs::set_permissions(&compiled, std::fs::Permissions::from_mode(0o777)).unwrap();
    let engine = execbox::backends::WasmEngine::new(Default::default()).unwrap();
    let interpreter = execbox::backends::Interpreter::QuickJs;
    let cfg = execbox::backends::InterpreterConfig::default().kind(interpreter).dir(root.path());
    let qjs = WasmInterpreter::on_engine(engine, cfg);
    let r = run(&qjs, js("return 6 * 7"));
    assert_eq!(r.output, Some(json!(42)), "{r:?}");
    assert_eq!(std::fs::read_dir(&compiled).unwrap().count(), 0, "no artifact was written to (or read from) it");
    let mode = std::fs::metadata(&compiled).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o777, "and it was not chmodded");
}

/// A guest cannot re-aim a symlink the host left in a read-write grant:
/// renaming a relative link to another depth (or hard-linking it) would
/// leave a link that points out of the grant for host programs to follow.
#[test]
fn python_cannot_move_or_hard_link_symlinks_in_a_grant() {
    let Some(py) = python_backend() else { return };
    let root = tempfile::tempdir().unwrap();
    let grant = root.path().join("grant");
    std::fs::create_dir_all(grant.join("sub")).unwrap();
    std::fs::write(root.path().join("secret.txt"), "TOPSECRET").unwrap();
    std::os::unix::fs::symlink("../secret.txt", grant.join("sub/inner")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", grant.join("abs")).unwrap();
    std::fs::write(grant.join("plain.txt"), "data").unwrap();
    let code = r#"
import errno, os, json
results = {}
for name, op in [("rename_rel", lambda: os.rename('/d/sub/inner', '/d/moved')),
                 ("rename_abs", lambda: os.rename('/d/abs', '/d/sub/abs2')),
                 ("link_abs", lambda: os.link('/d/abs', '/d/hard')),
                 ("link_rel", lambda: os.link('/d/sub/inner', '/d/sub/copy')),
                 ("rename_file", lambda: os.rename('/d/plain.txt', '/d/sub/plain.txt'))]:
    try:
        op()
        results[name] = "done"
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, e.errno)
print(json.dumps(results))
"#;
    let grants = execbox::PathGrants::new().read_write_at(&grant, "/d");
    let request = python(code)
        .policy(SandboxPolicy::strict().timeout(Duration::from_secs(30)).filesystem(execbox::Access::Allow(grants)));
    let r = run(py, request);
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let eperm = json!("EPERM");
    let out = r.output.expect("output");
    for op in ["rename_rel", "rename_abs", "link_abs", "link_rel"] {
        assert_eq!(out[op], eperm, "{op}: {out}");
    }
    assert_eq!(out["rename_file"], "done", "regular files still move: {out}");
    // The links are where the host put them, and no new one exists.
    assert!(grant.join("sub/inner").is_symlink() && grant.join("abs").is_symlink());
    for made in ["moved", "sub/abs2", "hard", "sub/copy"] {
        assert!(std::fs::symlink_metadata(grant.join(made)).is_err(), "{made} was made");
    }
}

#[test]
fn prepare_returns_once_a_warm_instance_is_ready() {
    let Some(_) = python_backend() else { return };
    let limit = Duration::from_secs(120);
    let py = WasmInterpreter::new(InterpreterConfig::default().warm_pool(1)).unwrap();
    let started = Instant::now();
    py.prepare(limit);
    assert!(py.warm_ready() >= 1, "prepare waited for the warm instance");
    assert!(started.elapsed() < limit, "woken when it was ready, not at the limit");
    // With no pool, prepare loads the module and returns.
    let cold = WasmInterpreter::new(InterpreterConfig::default().warm_pool(0)).unwrap();
    let started = Instant::now();
    cold.prepare(limit);
    assert!(started.elapsed() < limit);
    assert_eq!((cold.warm_idle(), cold.readiness()), (0, None));
}
