//! The wasm backend against real guests (guests/): every ABI, limit, hostile
//! guest and filesystem escape, with the exact outcome.
#![cfg(feature = "wasm")]

use crate::common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use execbox::backends::{WasmGuest, WasmGuestConfig};
use execbox::{
    Access, Backend, ExecError, ExecFile, ExecRequest, ExecResult, Executor, InvalidRequest, Outcome, PathGrants,
    SandboxPolicy,
};
use serde_json::json;

macro_rules! guest {
    (wat $name:literal) => {
        include_bytes!(concat!("../../guests/wat/", $name, ".wat")).to_vec()
    };
    (prebuilt $name:literal) => {
        include_bytes!(concat!("../../guests/prebuilt/", $name, ".wasm")).to_vec()
    };
}

/// One backend for the whole file: one engine, one module cache.
fn backend() -> &'static WasmGuest {
    static BACKEND: OnceLock<WasmGuest> = OnceLock::new();
    BACKEND.get_or_init(|| WasmGuest::new(WasmGuestConfig::default()).expect("wasm backend"))
}

fn run(request: ExecRequest) -> ExecResult {
    Executor::run_on(backend(), request).expect("execute")
}

fn tool(args: &[&str]) -> ExecRequest {
    args.iter().fold(ExecRequest::wasm(guest!(prebuilt "wasi_tool")), |r, a| r.arg(*a))
}

fn stdout(result: &ExecResult) -> String {
    result.stdout.text().into_owned()
}

fn stderr(result: &ExecResult) -> String {
    result.stderr.text().into_owned()
}

// ---- ABIs ----------------------------------------------------------------

#[test]
fn wat_command_writes_stdout_and_exits_zero() {
    let r = run(ExecRequest::wasm(guest!(wat "hello")));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(stdout(&r), "hello from wasm\n");
    assert_eq!(r.backend, "wasm");
    assert!(r.usage.fuel.unwrap() > 0);
}

#[test]
fn json_abi_echo_returns_input_as_output() {
    let input = json!({"a": [1, 2, {"b": "ü"}], "n": null});
    let r = run(ExecRequest::wasm(guest!(wat "echo_json")).input(input.clone()));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.output, Some(input));
    assert_eq!(r.exit_code, None);
}

#[test]
fn json_abi_without_input_sees_null() {
    let r = run(ExecRequest::wasm(guest!(wat "echo_json")));
    assert_eq!(r.output, Some(json!(null)));
}

#[test]
fn c_json_transform_doubles_items() {
    let r = run(ExecRequest::wasm(guest!(prebuilt "json_transform")).input(json!({"items": [1, 2, 3.5]})));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.output, Some(json!({"items": [2, 4, 7], "sum": 6.5, "count": 3})));
}

#[test]
fn json_abi_guest_that_breaks_the_abi_fails_cleanly() {
    let guest = |data: &str, alloc: &str, run: &str| {
        format!(
            r#"(module (memory (export "memory") 1) (data (i32.const 0) "{data}")
                (func (export "alloc") (param i32) (result i32) (i32.const {alloc}))
                (func (export "run") (param i32 i32) (result i64) (i64.const {run})))"#
        )
    };
    let cases = [
        ("returns garbage", guest("{oops", "64", "5"), "not valid JSON"),
        ("returns an out-of-bounds result", guest("", "64", "0x7fff000000000010"), "outside the guest's memory"),
        ("allocates out of bounds", guest("", "-8", "0"), "outside the guest's memory"),
    ];
    for (what, module, expected) in cases {
        let r = run(ExecRequest::wasm(module.into_bytes()).input(json!([1, 2, 3])));
        assert_eq!(r.outcome, Outcome::Failed, "{what}");
        assert!(r.message.as_deref().unwrap().contains(expected), "{what}: {r:?}");
    }
}

#[test]
fn json_abi_output_over_the_stdout_cap_is_refused() {
    let big = json!({"text": "y".repeat(10_000)});
    let r = run(ExecRequest::wasm(guest!(wat "echo_json"))
        .input(big)
        .policy(SandboxPolicy::strict().max_output_bytes(1000)));
    assert_eq!((r.outcome, r.output_truncated), (Outcome::Failed, true), "{r:?}");
    // The same verdict and words as the executor's result caps give every backend.
    assert_eq!(
        r.message.as_deref(),
        Some("the returned value is over the output cap of 1000 bytes (max_stdout_bytes)")
    );
}

#[test]
fn command_reads_stdin() {
    let r = run(tool(&["cat"]).stdin(b"line one\nline two\n".to_vec()));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(stdout(&r), "line one\nline two\n");
}

#[test]
fn command_gets_json_input_on_stdin() {
    let r = run(tool(&["cat"]).input(json!({"x": 1})));
    assert_eq!(stdout(&r), r#"{"x":1}"#);
}

#[test]
fn command_with_stdin_and_input_is_invalid() {
    let err = Executor::run_on(backend(), tool(&["cat"]).stdin(b"x".to_vec()).input(json!(1))).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::Conflict(_))), "{err:?}");
}

#[test]
fn command_gets_argv() {
    let r = run(tool(&["args", "one", "two words", "ü"]));
    assert_eq!(stdout(&r), "one\ntwo words\nü\n");
}

#[test]
fn rust_guest_counts_words() {
    let r = run(ExecRequest::wasm(guest!(prebuilt "word_count")).stdin(b"a b\nc\n".to_vec()));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(stdout(&r), "{\"lines\":2,\"words\":3,\"bytes\":6}\n");
}

#[test]
fn rust_guest_panic_is_a_failed_trap_with_its_message() {
    let r = run(ExecRequest::wasm(guest!(prebuilt "word_count")).arg("panic"));
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(stderr(&r).contains("asked to panic"), "{r:?}");
    assert!(r.message.as_deref().unwrap().contains("unreachable"), "{r:?}");
}

// ---- environment ---------------------------------------------------------

#[test]
fn environment_holds_only_allowed_request_values() {
    // SAFETY: set before any thread of this test reads the environment; the
    // variable is unique to this test.
    unsafe { std::env::set_var("EXECBOX_HOST_CANARY", "leaked") };
    let policy = SandboxPolicy::strict().environment(Access::Allow(vec!["GREETING".into()]));
    let r = run(tool(&["env"]).env("GREETING", "hi").policy(policy));
    assert_eq!(stdout(&r), "GREETING=hi\n");

    let r = run(tool(&["env"]));
    assert_eq!(stdout(&r), "", "no variable reaches a guest by default");
}

#[test]
fn env_outside_the_allow_list_is_refused_by_the_executor() {
    let exec = Executor::builder().backend(WasmGuest::new(WasmGuestConfig::default()).unwrap()).build();
    let err = exec.execute_blocking(tool(&["env"]).env("SECRET", "x")).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::EnvNotAllowed { .. })), "{err:?}");
}

// ---- filesystem ----------------------------------------------------------

fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "host data\n").unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/inner.txt"), "inner\n").unwrap();
    dir
}

fn read_only_at_data(dir: &tempfile::TempDir) -> SandboxPolicy {
    SandboxPolicy::strict().filesystem(Access::Allow(PathGrants::new().read_only_at(dir.path(), "/data")))
}

#[test]
fn read_only_preopen_lists_and_reads() {
    let dir = data_dir();
    let r = run(tool(&["ls", "/data"]).policy(read_only_at_data(&dir)));
    let mut names: Vec<_> = stdout(&r).lines().map(str::to_string).collect();
    names.sort();
    assert_eq!(names, ["data.txt", "sub"]);
    let r = run(tool(&["read", "/data/sub/inner.txt"]).policy(read_only_at_data(&dir)));
    assert_eq!(stdout(&r), "inner\n");
}

#[test]
fn read_only_preopen_refuses_writes() {
    let dir = data_dir();
    let r = run(tool(&["write", "/data/new.txt", "x"]).policy(read_only_at_data(&dir)));
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.exit_code, Some(1));
    assert!(stderr(&r).starts_with("write /data/new.txt:"), "{r:?}");
    assert!(!dir.path().join("new.txt").exists());
    let r = run(tool(&["write", "/data/data.txt", "overwritten"]).policy(read_only_at_data(&dir)));
    assert_eq!(r.exit_code, Some(1));
    assert_eq!(std::fs::read_to_string(dir.path().join("data.txt")).unwrap(), "host data\n");
}

#[test]
fn read_write_preopen_writes_to_the_host_directory() {
    let dir = tempfile::tempdir().unwrap();
    let policy =
        SandboxPolicy::strict().filesystem(Access::Allow(PathGrants::new().read_write_at(dir.path(), "/work")));
    let r = run(tool(&["write", "/work/out.txt", "from the guest"]).policy(policy));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(std::fs::read_to_string(dir.path().join("out.txt")).unwrap(), "from the guest");
}

#[test]
fn nothing_outside_a_preopen_is_reachable() {
    let dir = data_dir();
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("passwd_link")).unwrap();
    std::os::unix::fs::symlink("/etc", dir.path().join("etc_link")).unwrap();
    let host_path = dir.path().join("data.txt").display().to_string();
    for path in [
        "/data/../etc/passwd",
        "/data/sub/../../etc/passwd",
        "/data/passwd_link",
        "/data/etc_link/passwd",
        "/etc/passwd",
        host_path.as_str(),
    ] {
        let r = run(tool(&["read", path]).policy(read_only_at_data(&dir)));
        assert_eq!(r.exit_code, Some(1), "{path} must not be readable: {r:?}");
        assert!(!stdout(&r).contains("root:"), "{path} leaked: {r:?}");
    }
    let r = run(tool(&["ls", "/"]));
    assert_eq!(r.exit_code, Some(1), "no preopen, no root: {r:?}");
}

#[test]
fn missing_preopen_directory_is_a_bad_path() {
    let policy = SandboxPolicy::strict()
        .filesystem(Access::Allow(PathGrants::new().read_only_at("/definitely/not/here", "/data")));
    let err = Executor::run_on(backend(), tool(&["ls", "/data"]).policy(policy)).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::BadPath { .. })), "{err:?}");
}

#[test]
fn input_files_are_staged_read_only_and_removed() {
    let file = ExecFile { name: "nested/in.csv".into(), content: b"a,b\n1,2\n".to_vec(), mime_type: None };
    let r = run(tool(&["read", "/input/nested/in.csv"]).input_file(file.clone()));
    assert_eq!(stdout(&r), "a,b\n1,2\n", "{r:?}");
    let r = run(tool(&["write", "/input/x", "y"]).input_file(file));
    assert_eq!(r.exit_code, Some(1));
    let leftovers = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("execbox-input-"))
        .count();
    // Other tests may be staging right now; none of ours may stay behind for long.
    assert!(leftovers <= 2, "{leftovers} staging dirs left");
}

#[test]
fn input_file_names_cannot_escape() {
    for name in ["../evil", "/etc/evil", "", "a/../../b", "."] {
        let file = ExecFile { name: name.into(), content: vec![], mime_type: None };
        let err = Executor::run_on(backend(), tool(&["ls", "/input"]).input_file(file)).unwrap_err();
        assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::BadPath { .. })), "{name:?}: {err:?}");
    }
}

// ---- limits and hostile guests -------------------------------------------

#[test]
fn infinite_loop_runs_out_of_fuel() {
    let r = run(ExecRequest::wasm(guest!(wat "infinite_loop")).policy(SandboxPolicy::strict().fuel(1_000_000)));
    assert_eq!(r.outcome, Outcome::OutOfFuel, "{r:?}");
    assert_eq!(r.usage.fuel, Some(1_000_000));
}

#[test]
fn infinite_loop_is_preempted_at_the_deadline() {
    let started = Instant::now();
    let r = run(ExecRequest::wasm(guest!(wat "infinite_loop"))
        .policy(SandboxPolicy::strict().timeout(Duration::from_millis(200))));
    let took = started.elapsed();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert_eq!(r.message.as_deref(), Some("deadline of 200 ms exceeded"));
    assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn sleeping_past_the_deadline_ends_at_the_deadline() {
    let started = Instant::now();
    let r = run(ExecRequest::wasm(guest!(wat "sleep_forever"))
        .policy(SandboxPolicy::strict().timeout(Duration::from_millis(150))));
    let took = started.elapsed();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(took >= Duration::from_millis(150) && took < Duration::from_secs(3), "{took:?}");

    let r = run(tool(&["sleep", "5000"]).policy(SandboxPolicy::strict().timeout(Duration::from_millis(100))));
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
}

#[test]
fn short_sleeps_within_the_deadline_complete() {
    let r = run(tool(&["sleep", "20"]));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(stdout(&r), "awake\n");
}

#[test]
fn memory_grow_bomb_is_out_of_memory() {
    let cap = 32 << 20;
    let r = run(ExecRequest::wasm(guest!(wat "grow_bomb")).policy(SandboxPolicy::strict().memory_bytes(cap)));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert!(r.usage.peak_memory_bytes.unwrap() <= cap);
    assert!(r.message.as_deref().unwrap().contains("memory limit"), "{r:?}");
}

#[test]
fn c_malloc_bomb_sees_allocation_failure_and_is_out_of_memory() {
    let r = run(tool(&["malloc-bomb"]).policy(SandboxPolicy::strict().memory_bytes(64 << 20)));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert_eq!(r.exit_code, Some(3));
    let mib: u64 = stdout(&r).trim().rsplit(' ').nth(1).unwrap().parse().unwrap();
    assert!((40..64).contains(&mib), "{r:?}");
}

#[test]
fn initial_memory_over_the_cap_is_out_of_memory() {
    let r =
        run(ExecRequest::wasm(guest!(wat "big_initial_memory")).policy(SandboxPolicy::strict().memory_bytes(64 << 20)));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    // Without a policy cap the backend's ceiling (1 GiB) admits it (strict asks for 256 MiB).
    let uncapped = {
        let mut p = SandboxPolicy::strict();
        p.memory_bytes = None;
        p
    };
    let r = run(ExecRequest::wasm(guest!(wat "big_initial_memory")).policy(uncapped));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
}

#[test]
fn deep_recursion_traps_without_hurting_the_host() {
    let r = run(ExecRequest::wasm(guest!(wat "deep_recursion")));
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(r.message.as_deref().unwrap().contains("call stack exhausted"), "{r:?}");
}

#[test]
fn unreachable_is_a_failed_trap() {
    let r = run(ExecRequest::wasm(guest!(wat "unreachable")));
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.exit_code, None);
    assert!(r.message.as_deref().unwrap().contains("unreachable"), "{r:?}");
}

#[test]
fn proc_exit_sets_the_exit_code() {
    let r = run(ExecRequest::wasm(guest!(wat "exit42")));
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.exit_code, Some(42));
    assert_eq!(stderr(&r), "bye\n");
    let r = run(tool(&["exit", "0"]));
    assert_eq!((r.outcome, r.exit_code), (Outcome::Ok, Some(0)));
}

#[test]
fn stdout_flood_is_truncated_at_the_cap_and_counted() {
    let r = run(ExecRequest::wasm(guest!(wat "stdout_flood")).policy(SandboxPolicy::strict().max_output_bytes(1000)));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.stdout.bytes.len(), 1000);
    assert_eq!(r.stdout.total_bytes, 64 << 20);
    assert!(r.stdout.truncated);
}

#[test]
fn missing_import_is_refused_before_running() {
    let err = Executor::run_on(backend(), ExecRequest::wasm(guest!(wat "missing_import"))).unwrap_err();
    let ExecError::InvalidRequest(InvalidRequest::InvalidModule { reason }) = &err else { panic!("{err:?}") };
    assert!(reason.contains("launch_missiles"), "{reason}");
}

#[test]
fn malformed_modules_are_invalid_requests() {
    let cases: [&[u8]; 4] = [
        b"\0asm\x01\0\0\0\xff\xff garbage",
        b"not wasm at all",
        b"(module (func (export \"helper\")))",
        b"(module (func (export \"_start\") (param i32)))",
    ];
    for bytes in cases {
        let err = Executor::run_on(backend(), ExecRequest::wasm(bytes.to_vec())).unwrap_err();
        assert!(
            matches!(err, ExecError::InvalidRequest(InvalidRequest::InvalidModule { .. })),
            "{:?}: {err:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn deep_input_is_refused_without_overflowing() {
    let mut deep = json!(0);
    for _ in 0..100_000 {
        deep = serde_json::Value::Array(vec![deep]);
    }
    let err = Executor::run_on(backend(), ExecRequest::wasm(guest!(wat "echo_json")).input(deep)).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::TooDeep { .. })), "{err:?}");
}

// ---- caching -------------------------------------------------------------

#[test]
fn second_call_of_a_module_does_not_recompile() {
    let wasm = WasmGuest::new(WasmGuestConfig::default()).unwrap();
    Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap();
    Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap();
    let stats = wasm.cache_stats();
    assert_eq!((stats.compiled, stats.memory_hits, stats.entries), (1, 1, 1), "{stats:?}");
}

#[test]
fn disk_cache_serves_a_new_engine() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = WasmGuestConfig::default().disk_cache_dir(dir.path().join("cache"));
    let first = WasmGuest::new(cfg.clone()).unwrap();
    assert_eq!(stdout(&Executor::run_on(&first, ExecRequest::wasm(guest!(wat "hello"))).unwrap()), "hello from wasm\n");
    assert_eq!(first.cache_stats().compiled, 1);
    drop(first);

    let second = WasmGuest::new(cfg.clone()).unwrap();
    assert_eq!(
        stdout(&Executor::run_on(&second, ExecRequest::wasm(guest!(wat "hello"))).unwrap()),
        "hello from wasm\n"
    );
    let stats = second.cache_stats();
    assert_eq!((stats.compiled, stats.disk_hits), (0, 1), "{stats:?}");

    // A corrupt artifact is discarded and recompiled, never trusted.
    for entry in std::fs::read_dir(dir.path().join("cache")).unwrap() {
        std::fs::write(entry.unwrap().path(), b"corrupt").unwrap();
    }
    let third = WasmGuest::new(cfg).unwrap();
    assert_eq!(Executor::run_on(&third, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
    assert_eq!(third.cache_stats().compiled, 1);
}

#[test]
fn cache_evicts_least_recently_used_modules() {
    let wasm = WasmGuest::new(WasmGuestConfig::default().module_cache_entries(2)).unwrap();
    for module in [guest!(wat "hello"), guest!(wat "echo_json"), guest!(wat "hello"), guest!(wat "exit42")] {
        Executor::run_on(&wasm, ExecRequest::wasm(module)).unwrap();
    }
    // hello was used last before exit42 arrived, so echo_json was evicted.
    Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap();
    let stats = wasm.cache_stats();
    assert_eq!((stats.compiled, stats.memory_hits, stats.entries), (3, 2, 2), "{stats:?}");
}

// ---- threads and async ---------------------------------------------------

#[test]
fn a_burst_beyond_the_pool_waits_and_only_an_expired_wait_is_busy() {
    let wasm = WasmGuest::new(WasmGuestConfig::default().pooled_instances(1)).unwrap();
    // Compile first, so the sleeper holds the only slot when the others start.
    wasm.precompile(&guest!(prebuilt "wasi_tool")).unwrap();
    wasm.precompile(&guest!(wat "hello")).unwrap();
    std::thread::scope(|s| {
        let sleeper = s.spawn(|| Executor::run_on(&wasm, tool(&["sleep", "1500"])).unwrap());
        common::wait::wait_until(Duration::from_secs(30), || wasm.engine().slots_in_use() > 0);
        assert_eq!(wasm.engine().slots_in_use(), 1, "the sleeper holds the only slot");
        // A run whose deadline passes while it waits is refused, as busy, naming its backend...
        let short = SandboxPolicy::strict().timeout(Duration::from_millis(100));
        let err = Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello")).policy(short)).unwrap_err();
        assert!(
            matches!(&err, ExecError::Busy { backend, reason } if backend == "wasm" && reason.contains("slots")),
            "{err:?}"
        );
        assert_eq!(err.kind(), "busy");
        // ...one whose deadline allows waiting waits for the slot and runs.
        let r = Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap();
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(stdout(&sleeper.join().unwrap()), "awake\n");
    });
    assert_eq!(wasm.engine().slots_in_use(), 0, "every slot was given back");
}

#[tokio::test(flavor = "current_thread")]
async fn direct_call_from_an_async_worker_does_not_panic() {
    // Sync WASI would block on a nested runtime here; the backend moves the
    // run to a thread of its own.
    let r = Executor::run_on(backend(), tool(&["cat"]).stdin(b"async".to_vec())).unwrap();
    assert_eq!(stdout(&r), "async");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_execute_runs_wasm_on_the_blocking_pool() {
    let exec = Executor::builder().backend(WasmGuest::new(WasmGuestConfig::default()).unwrap()).build();
    let r = exec.execute(tool(&["args", "x"])).await.unwrap();
    assert_eq!(stdout(&r), "x\n");
}

// ---- compiling untrusted modules: static limits, the deadline ------------

/// A binary module of `functions` functions of type `() -> ()`, each with
/// `body` (local declarations, code and its final `end`); the first is
/// exported as `_start`.
fn binary_module(functions: u32, body: &[u8]) -> Vec<u8> {
    fn leb(mut n: u64, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn section(id: u8, content: Vec<u8>, out: &mut Vec<u8>) {
        out.push(id);
        leb(content.len() as u64, out);
        out.extend(content);
    }
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, vec![1, 0x60, 0, 0], &mut module);
    let mut funcs = Vec::new();
    leb(u64::from(functions), &mut funcs);
    funcs.resize(funcs.len() + functions as usize, 0);
    section(3, funcs, &mut module);
    let mut exports = vec![1, 6];
    exports.extend_from_slice(b"_start");
    exports.extend_from_slice(&[0, 0]);
    section(7, exports, &mut module);
    let mut code = Vec::new();
    leb(u64::from(functions), &mut code);
    for _ in 0..functions {
        leb(body.len() as u64, &mut code);
        code.extend_from_slice(body);
    }
    section(10, code, &mut module);
    module
}

/// A body without locals: `code`, then `end`.
fn body(code: &[u8]) -> Vec<u8> {
    [&[0u8][..], code, &[0x0b]].concat()
}

/// `depth` nested `if`s on a constant condition (`i32.const 0; if; ... end`).
fn nested_ifs(depth: usize) -> Vec<u8> {
    [[0x41, 0x00, 0x04, 0x40].repeat(depth), vec![0x0b; depth]].concat()
}

fn invalid_module_reason(err: ExecError) -> String {
    match err {
        ExecError::InvalidRequest(InvalidRequest::InvalidModule { reason }) => reason,
        other => panic!("expected an invalid module, got {other:?}"),
    }
}

#[test]
fn modules_that_would_compile_for_minutes_are_refused_naming_the_limit() {
    // What kept the host busy for over a minute before: 260,000 empty
    // functions; one function of nested `if`s; one with 50,000 locals.
    let cases = [
        ("260,000 functions", binary_module(260_000, &body(&[])), "max_functions"),
        ("10,000 nested ifs", binary_module(1, &body(&nested_ifs(10_000))), "max_control_depth"),
        ("a 1 MB body", binary_module(1, &body(&[0x01; 1 << 20])), "max_function_body_bytes"),
        ("50,000 locals", binary_module(1, &[1, 0xd0, 0x86, 0x03, 0x7f, 0x0b]), "max_locals_per_function"),
        ("48 bodies of 100 KB", binary_module(48, &body(&[0x01; 100 << 10])), "max_total_body_bytes"),
    ];
    // Past strict's 1 MiB of code: the module limits, not the policy, are under test.
    let roomy = SandboxPolicy::strict().max_code_bytes(8 << 20);
    for (what, module, limit) in cases {
        let request = ExecRequest::wasm(module).policy(roomy.clone());
        let reason = invalid_module_reason(Executor::run_on(backend(), request).unwrap_err());
        assert!(reason.contains(limit) && reason.contains("module_limits"), "{what}: {reason}");
    }
}

#[test]
fn modules_within_the_limits_compile_and_run() {
    let r = run(ExecRequest::wasm(binary_module(1, &body(&nested_ifs(256)))));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let r = run(ExecRequest::wasm(binary_module(2_000, &body(&[0x01; 64]))));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
}

#[test]
fn module_limits_come_from_the_config() {
    let mut cfg = WasmGuestConfig::default();
    cfg.module_limits.max_functions = 10;
    let strict = WasmGuest::new(cfg).unwrap();
    assert_eq!(Executor::run_on(&strict, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
    let reason = invalid_module_reason(Executor::run_on(&strict, tool(&["args"])).unwrap_err());
    assert!(reason.contains("max_functions") && reason.contains("at most 10"), "{reason}");

    let mut cfg = WasmGuestConfig::default();
    cfg.module_limits.max_module_bytes = 1_000;
    let tiny = WasmGuest::new(cfg).unwrap();
    let reason = invalid_module_reason(Executor::run_on(&tiny, tool(&["args"])).unwrap_err());
    assert!(reason.contains("max_module_bytes"), "{reason}");
}

#[test]
fn a_compile_that_ends_after_the_deadline_is_timed_out() {
    let wasm = WasmGuest::new(WasmGuestConfig::default()).unwrap();
    // Thousands of functions: tens of ms of Cranelift at least, never 1 ms.
    let module = binary_module(3_000, &body(&[0x41, 0x01, 0x1a].repeat(40)));
    let tight = SandboxPolicy::strict().timeout(Duration::from_millis(1));
    let r = Executor::run_on(&wasm, ExecRequest::wasm(module.clone()).policy(tight)).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert_eq!(r.message.as_deref(), Some("deadline of 1 ms exceeded while compiling the module, before it ran"));
    assert!(r.usage.duration >= Duration::from_millis(1), "the duration includes the compile: {r:?}");
    // With time to spare it runs (from the cache, if the first compile finished).
    let r = Executor::run_on(&wasm, ExecRequest::wasm(module)).unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(wasm.cache_stats().compiled, 1, "compiled once: {:?}", wasm.cache_stats());
}

/// A module that takes Cranelift seconds (thousands of functions, within
/// every static limit).
fn heavy_module() -> Vec<u8> {
    binary_module(9_000, &body(&[0x41, 0x01, 0x1a].repeat(40)))
}

#[test]
fn a_heavy_compile_is_stopped_at_the_deadline_in_its_worker() {
    let wasm = WasmGuest::new(WasmGuestConfig::default()).unwrap();
    assert!(wasm.engine().compiles_contained(), "the execbox binary serves as compile worker here");
    let started = Instant::now();
    let tight = SandboxPolicy::strict().timeout(Duration::from_millis(300)).max_code_bytes(8 << 20);
    let r = Executor::run_on(&wasm, ExecRequest::wasm(heavy_module()).policy(tight)).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.message.unwrap().ends_with("while compiling the module, before it ran"));
    // The host waited for the deadline, not for Cranelift.
    assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
    assert_eq!(wasm.cache_stats().compiled, 0);
    // The host is free at once: the next run is served.
    assert_eq!(Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
}

#[test]
fn a_compile_over_its_memory_cap_is_out_of_memory() {
    let cfg = WasmGuestConfig::default().max_compile_memory_bytes(4 << 20);
    let wasm = WasmGuest::new(cfg).unwrap();
    let roomy = SandboxPolicy::strict().timeout(Duration::from_secs(120)).max_code_bytes(8 << 20);
    let r = Executor::run_on(&wasm, ExecRequest::wasm(heavy_module()).policy(roomy)).unwrap();
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert!(r.message.unwrap().contains("compile memory cap"));
}

#[test]
fn without_a_worker_modules_compile_in_process_within_the_static_limits() {
    let cfg = WasmGuestConfig::default().worker_program("/nonexistent/execbox");
    let wasm = WasmGuest::new(cfg).unwrap();
    assert!(!wasm.engine().compiles_contained());
    assert_eq!(Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
    let cfg = WasmGuestConfig::default().compile_in_worker(false);
    let wasm = WasmGuest::new(cfg).unwrap();
    assert!(!wasm.engine().compiles_contained());
    assert_eq!(Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
}

#[test]
fn concurrent_runs_of_a_new_module_compile_it_once() {
    let wasm = WasmGuest::new(WasmGuestConfig::default()).unwrap();
    let module = binary_module(2_000, &body(&[0x41, 0x02, 0x1a].repeat(30)));
    let barrier = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    Executor::run_on(&wasm, ExecRequest::wasm(module.clone())).unwrap()
                })
            })
            .collect();
        for run in runs {
            assert_eq!(run.join().unwrap().outcome, Outcome::Ok);
        }
    });
    let stats = wasm.cache_stats();
    assert_eq!((stats.compiled, stats.memory_hits), (1, 7), "the others waited for the one compile: {stats:?}");
}

// ---- filesystem: links and special files ---------------------------------

#[test]
fn guests_cannot_leave_symlinks_that_point_out_of_a_grant() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("secret.txt"), "host secret\n").unwrap();
    let grant = root.path().join("grant");
    std::fs::create_dir(&grant).unwrap();
    let policy = SandboxPolicy::strict().filesystem(Access::Allow(PathGrants::new().read_write_at(&grant, "/work")));
    for target in ["../secret.txt", "/etc/passwd", "inside.txt"] {
        let r = run(tool(&["symlink", target, "/work/innocent"]).policy(policy.clone()));
        assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(1)), "{target}: {r:?}");
        assert!(stderr(&r).starts_with("symlink /work/innocent: Operation not permitted"), "{target}: {r:?}");
        assert!(std::fs::symlink_metadata(grant.join("innocent")).is_err(), "{target}: a link was left behind");
    }
    assert_eq!(std::fs::read_dir(&grant).unwrap().count(), 0, "nothing was left in the grant");
}

#[test]
fn fifos_sockets_and_devices_in_a_grant_are_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    std::os::unix::fs::symlink("fifo", dir.path().join("to_fifo")).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
    let rw = SandboxPolicy::strict()
        .timeout(Duration::from_secs(2))
        .filesystem(Access::Allow(PathGrants::new().read_write_at(dir.path(), "/data").read_only_at("/dev", "/dev")));
    let cases: [&[&str]; 6] = [
        &["read", "/data/fifo"],
        &["write", "/data/fifo", "x"],
        &["read", "/data/to_fifo"],
        &["read", "/data/sock"],
        &["read", "/dev/zero"],
        &["read", "/dev/null"],
    ];
    for args in cases {
        // On another thread, so a regression fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let request = tool(args).policy(rw.clone());
        std::thread::spawn(move || {
            let _ = tx.send(Executor::run_on(backend(), request));
        });
        let Ok(result) = rx.recv_timeout(Duration::from_secs(20)) else {
            // Release the blocked host thread before failing.
            let _ = std::fs::OpenOptions::new().read(true).write(true).open(&fifo);
            panic!("{args:?} blocked the host thread past its deadline");
        };
        let r = result.unwrap();
        assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(1)), "{args:?}: {r:?}");
        assert!(stderr(&r).contains("No such device or address"), "{args:?}: {r:?}");
    }
    // Regular files and directories next to them still open.
    std::fs::write(dir.path().join("plain.txt"), "plain\n").unwrap();
    assert_eq!(stdout(&run(tool(&["read", "/data/plain.txt"]).policy(rw.clone()))), "plain\n");
    assert_eq!(run(tool(&["ls", "/data"]).policy(rw)).exit_code, Some(0));
}

#[test]
fn grants_on_filesystems_whose_reads_can_block_are_refused() {
    // /proc/kmsg is a regular file whose read waits for kernel messages:
    // granting /proc (or / , which contains it) would let a guest hold the
    // host thread past its deadline.
    for host in ["/proc", "/", "/sys/class"] {
        let policy = SandboxPolicy::strict().filesystem(Access::Allow(PathGrants::new().read_only_at(host, "/data")));
        let err = Executor::run_on(backend(), tool(&["read", "/data/kmsg"]).policy(policy)).unwrap_err();
        assert!(
            matches!(&err, ExecError::InvalidRequest(InvalidRequest::BadPath { reason, .. }) if reason.contains("block")),
            "{host}: {err:?}"
        );
    }
}

// ---- contracts: memory, disk cache, pooling -------------------------------

#[test]
fn initial_memory_or_table_over_the_ceiling_is_out_of_memory_not_invalid() {
    // 2 GiB of initial memory, over the 1 GiB ceiling: the module cannot start.
    let r = run(ExecRequest::wasm(b"(module (memory 32768) (func (export \"_start\")))".to_vec()));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert!(r.message.as_deref().unwrap().contains("initial memory of 2147483648 bytes"), "{r:?}");
    let r = run(ExecRequest::wasm(b"(module (table 200000 funcref) (func (export \"_start\")))".to_vec()));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    // The same verdict through the executor (the README promises it).
    let exec = Executor::builder().backend(WasmGuest::new(WasmGuestConfig::default()).unwrap()).build();
    let r = exec.execute_blocking(
        ExecRequest::wasm(guest!(wat "big_initial_memory")).policy(SandboxPolicy::strict().memory_bytes(64 << 20)),
    );
    assert_eq!(r.unwrap().outcome, Outcome::OutOfMemory);
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn disk_cache_trusts_only_private_directories_and_never_chmods_them() {
    let root = tempfile::tempdir().unwrap();
    let shared = root.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    let cfg = |dir: &std::path::Path| WasmGuestConfig::default().disk_cache_dir(dir);
    let err = WasmGuest::new(cfg(&shared)).err().expect("a world-writable cache dir is refused");
    assert!(err.to_string().contains("writable by group or others"), "{err}");
    assert!(
        matches!(err, execbox::ConfigError::Invalid { setting: "WasmGuestConfig::disk_cache_dir", .. }),
        "the caller's setting, named: {err:?}"
    );
    assert_eq!(mode(&shared), 0o1777, "an existing directory is not chmodded");

    let created = root.path().join("a/b/cache");
    WasmGuest::new(cfg(&created)).unwrap();
    assert_eq!(mode(&created), 0o700, "a directory execbox creates is owner-only");
}

#[test]
fn disk_cache_skips_artifacts_others_could_have_written() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    let cfg = WasmGuestConfig::default().disk_cache_dir(dir.clone());
    let first = WasmGuest::new(cfg.clone()).unwrap();
    assert_eq!(Executor::run_on(&first, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
    drop(first);
    let artifact = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();

    chmod(&artifact, 0o666);
    let second = WasmGuest::new(cfg.clone()).unwrap();
    assert_eq!(Executor::run_on(&second, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
    assert_eq!((second.cache_stats().disk_hits, second.cache_stats().compiled), (0, 1), "a group-writable artifact");

    // A symlink in place of the artifact is not followed.
    let elsewhere = root.path().join("elsewhere.cwasm");
    std::fs::rename(&artifact, &elsewhere).unwrap();
    chmod(&elsewhere, 0o600);
    std::os::unix::fs::symlink(&elsewhere, &artifact).unwrap();
    let third = WasmGuest::new(cfg).unwrap();
    assert_eq!(Executor::run_on(&third, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
    assert_eq!((third.cache_stats().disk_hits, third.cache_stats().compiled), (0, 1), "a symlinked artifact");
}

#[test]
fn a_refused_pool_reservation_is_visible() {
    // Far more slots than any address space holds: the reservation fails.
    let cfg = WasmGuestConfig::default().pooled_instances(50_000_000);
    let wasm = WasmGuest::new(cfg).unwrap();
    assert!(!wasm.engine().pooling_allocator());
    let memory = &wasm.capabilities().memory;
    assert!(format!("{memory:?}").contains("allocated on demand"), "{memory:?}");
    assert_eq!(Executor::run_on(&wasm, ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);

    assert!(backend().engine().pooling_allocator(), "the default pool fits here");
    assert!(format!("{:?}", backend().capabilities().memory).contains("pooling allocator of 32 slots"));
}

// ---- every run has a deadline --------------------------------------------

#[test]
fn runs_without_a_policy_timeout_get_the_backends_default() {
    let mut cfg = WasmGuestConfig::default();
    cfg.defaults.timeout = Duration::from_millis(300);
    let wasm = WasmGuest::new(cfg).unwrap();
    let mut unbounded = SandboxPolicy::strict();
    unbounded.timeout_ms = None;
    // Compiled first: the compile would count against the 300 ms too.
    for module in [guest!(wat "infinite_loop"), guest!(wat "sleep_forever"), guest!(prebuilt "wasi_tool")] {
        wasm.precompile(&module).unwrap();
    }
    for request in [
        ExecRequest::wasm(guest!(wat "infinite_loop")),
        ExecRequest::wasm(guest!(wat "sleep_forever")),
        tool(&["sleep", "600000"]),
    ] {
        // Called directly: no executor fills the timeout in.
        let r = Executor::run_on(&wasm, request.policy(unbounded.clone())).unwrap();
        assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
        assert_eq!(r.message.as_deref(), Some("deadline of 300 ms exceeded"), "{r:?}");
    }
}

#[test]
fn runs_without_a_policy_memory_cap_get_the_backends_default_held_to_its_ceiling() {
    let uncapped = {
        let mut p = SandboxPolicy::strict();
        p.memory_bytes = None;
        p
    };
    let bomb = || ExecRequest::wasm(guest!(wat "grow_bomb")).policy(uncapped.clone());
    let cap: u64 = 32 << 20;
    let mut cfg = WasmGuestConfig::default();
    cfg.defaults.memory_bytes = cap;
    let wasm = WasmGuest::new(cfg).unwrap();
    let r = Executor::run_on(&wasm, bomb()).unwrap();
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert!(r.usage.peak_memory_bytes.unwrap() <= cap, "{r:?}");
    assert!(r.message.as_deref().unwrap().contains(&format!("memory limit of {cap} bytes")), "{r:?}");
    // A default above the ceiling gets the ceiling.
    let ceiling: u64 = 48 << 20;
    let mut cfg = WasmGuestConfig::default().max_memory_bytes(ceiling).pooled_instances(2);
    cfg.defaults.memory_bytes = 1 << 40;
    let wasm = WasmGuest::new(cfg).unwrap();
    let r = Executor::run_on(&wasm, bomb()).unwrap();
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert!(r.message.as_deref().unwrap().contains(&format!("memory limit of {ceiling} bytes")), "{r:?}");
}
