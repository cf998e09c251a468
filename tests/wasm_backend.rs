//! The wasm backend against real guests (guests/): every ABI, limit, hostile
//! guest and filesystem escape, with the exact outcome.
#![cfg(feature = "wasm")]

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
        include_bytes!(concat!("../guests/wat/", $name, ".wat")).to_vec()
    };
    (prebuilt $name:literal) => {
        include_bytes!(concat!("../guests/prebuilt/", $name, ".wasm")).to_vec()
    };
}

/// One backend for the whole file: one engine, one module cache.
fn backend() -> &'static WasmGuest {
    static BACKEND: OnceLock<WasmGuest> = OnceLock::new();
    BACKEND.get_or_init(|| WasmGuest::new().expect("wasm backend"))
}

fn run(request: ExecRequest) -> ExecResult {
    backend().execute(request).expect("execute")
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
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.message.as_deref().unwrap().contains("max_stdout_bytes"), "{r:?}");
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
    let err = backend().execute(tool(&["cat"]).stdin(b"x".to_vec()).input(json!(1))).unwrap_err();
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
    let exec = Executor::builder().backend(WasmGuest::new().unwrap()).build();
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
    let err = backend().execute(tool(&["ls", "/data"]).policy(policy)).unwrap_err();
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
        let err = backend().execute(tool(&["ls", "/input"]).input_file(file)).unwrap_err();
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
    // Without a policy cap the backend's ceiling (1 GiB) admits it.
    let r = run(ExecRequest::wasm(guest!(wat "big_initial_memory")));
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
    let err = backend().execute(ExecRequest::wasm(guest!(wat "missing_import"))).unwrap_err();
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
        let err = backend().execute(ExecRequest::wasm(bytes.to_vec())).unwrap_err();
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
    let err = backend().execute(ExecRequest::wasm(guest!(wat "echo_json")).input(deep)).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::TooDeep { .. })), "{err:?}");
}

// ---- caching -------------------------------------------------------------

#[test]
fn second_call_of_a_module_does_not_recompile() {
    let wasm = WasmGuest::new().unwrap();
    wasm.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap();
    wasm.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap();
    let stats = wasm.cache_stats();
    assert_eq!((stats.compiled, stats.memory_hits, stats.entries), (1, 1, 1), "{stats:?}");
}

#[test]
fn disk_cache_serves_a_new_engine() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = WasmGuestConfig { disk_cache_dir: Some(dir.path().join("cache")), ..WasmGuestConfig::default() };
    let first = WasmGuest::with_config(cfg.clone()).unwrap();
    assert_eq!(stdout(&first.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap()), "hello from wasm\n");
    assert_eq!(first.cache_stats().compiled, 1);
    drop(first);

    let second = WasmGuest::with_config(cfg.clone()).unwrap();
    assert_eq!(stdout(&second.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap()), "hello from wasm\n");
    let stats = second.cache_stats();
    assert_eq!((stats.compiled, stats.disk_hits), (0, 1), "{stats:?}");

    // A corrupt artifact is discarded and recompiled, never trusted.
    for entry in std::fs::read_dir(dir.path().join("cache")).unwrap() {
        std::fs::write(entry.unwrap().path(), b"corrupt").unwrap();
    }
    let third = WasmGuest::with_config(cfg).unwrap();
    assert_eq!(third.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
    assert_eq!(third.cache_stats().compiled, 1);
}

#[test]
fn cache_evicts_least_recently_used_modules() {
    let wasm =
        WasmGuest::with_config(WasmGuestConfig { module_cache_entries: 2, ..WasmGuestConfig::default() }).unwrap();
    for module in [guest!(wat "hello"), guest!(wat "echo_json"), guest!(wat "hello"), guest!(wat "exit42")] {
        wasm.execute(ExecRequest::wasm(module)).unwrap();
    }
    // hello was used last before exit42 arrived, so echo_json was evicted.
    wasm.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap();
    let stats = wasm.cache_stats();
    assert_eq!((stats.compiled, stats.memory_hits, stats.entries), (3, 2, 2), "{stats:?}");
}

// ---- threads and async ---------------------------------------------------

#[test]
fn a_full_instance_pool_is_a_typed_unavailable_error() {
    let wasm = WasmGuest::with_config(WasmGuestConfig { pooled_instances: 1, ..Default::default() }).unwrap();
    // Compile first, so the sleeper holds the only slot when the second run starts.
    wasm.precompile(&guest!(prebuilt "wasi_tool")).unwrap();
    wasm.precompile(&guest!(wat "hello")).unwrap();
    std::thread::scope(|s| {
        let sleeper = s.spawn(|| wasm.execute(tool(&["sleep", "400"])).unwrap());
        std::thread::sleep(Duration::from_millis(150));
        let err = wasm.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap_err();
        assert!(
            matches!(&err, ExecError::BackendUnavailable { reason, .. } if reason.contains("pooled_instances")),
            "{err:?}"
        );
        assert_eq!(stdout(&sleeper.join().unwrap()), "awake\n");
    });
    // The slot is free again.
    assert_eq!(wasm.execute(ExecRequest::wasm(guest!(wat "hello"))).unwrap().outcome, Outcome::Ok);
}

#[tokio::test(flavor = "current_thread")]
async fn direct_call_from_an_async_worker_does_not_panic() {
    // Sync WASI would block on a nested runtime here; the backend moves the
    // run to a thread of its own.
    let r = backend().execute(tool(&["cat"]).stdin(b"async".to_vec())).unwrap();
    assert_eq!(stdout(&r), "async");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executor_execute_runs_wasm_on_the_blocking_pool() {
    let exec = Executor::builder().backend(WasmGuest::new().unwrap()).build();
    let r = exec.execute(tool(&["args", "x"])).await.unwrap();
    assert_eq!(stdout(&r), "x\n");
}
