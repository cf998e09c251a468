//! The `wasm` guest on the async path: `Executor::execute` runs a cached
//! module on the caller's task (wasmtime yields at every epoch tick), so a
//! hostile guest cannot hold a runtime thread, and every limit holds as on
//! the blocking path.
//!
//! Most tests run on a current-thread runtime whose only blocking-pool
//! thread is held for the whole test ([`OnTask`]): a run that finishes there
//! did not go to the blocking pool, and a task that keeps ticking while a
//! guest runs shows the guest did not hold the runtime's one thread.
#![cfg(feature = "wasm")]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use execbox::backends::{InterpreterConfig, WasmEngine, WasmGuest, WasmGuestConfig, WasmInterpreter};
use execbox::tools::{ToolLimits, ToolRegistry, ToolSpec};
use execbox::{Backend, ExecFile, ExecRequest, ExecResult, Executor, Language, Outcome, SandboxPolicy};
use serde_json::{Value, json};

macro_rules! guest {
    (wat $name:literal) => {
        include_bytes!(concat!("../../guests/wat/", $name, ".wat")).to_vec()
    };
    (prebuilt $name:literal) => {
        include_bytes!(concat!("../../guests/prebuilt/", $name, ".wasm")).to_vec()
    };
}

/// Sleeps `ms` milliseconds with `poll_oneoff` (a relative monotonic
/// clock), then writes "awake\n".
fn nap(ms: u64) -> Vec<u8> {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 256) "awake\n")
  (func (export "_start")
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const {}))
    (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))
    (i32.store (i32.const 200) (i32.const 256))
    (i32.store (i32.const 204) (i32.const 6))
    (drop (call $fd_write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 208)))))"#,
        ms * 1_000_000
    )
    .into_bytes()
}

/// Writes one byte to stdout forever: an endless loop of host calls.
const WRITE_FOREVER: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "x")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 1))
    (loop $again
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $again))))"#;

/// Recurses without end, writing a byte to stdout at every level: host
/// calls made with the wasm stack nearly used up, until it overflows.
const RECURSE_AND_WRITE: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "x")
  (func $down (param i32) (result i32)
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 1))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.add (call $down (i32.add (local.get 0) (i32.const 1))) (i32.const 1)))
  (func (export "_start") (drop (call $down (i32.const 0)))))"#;

const TOOL_CALLER: &[u8] = include_bytes!("../../guests/prebuilt/tool_caller.wasm");

/// Tools for the guests here: `slow.nap` answers after 200 ms, `slow.hang`
/// never (and counts the calls that started and the ones that ended).
fn tools(hangs: &Arc<(AtomicUsize, AtomicUsize)>) -> ToolRegistry {
    let hangs = hangs.clone();
    ToolRegistry::builder()
        .tool(ToolSpec::new("slow.nap"), |_: Value| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(json!("rested"))
        })
        .tool(ToolSpec::new("slow.hang"), move |_: Value| {
            let hangs = hangs.clone();
            async move {
                hangs.0.fetch_add(1, Ordering::SeqCst);
                let _ended = Ended(hangs);
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Value::Null)
            }
        })
        .build()
        .expect("a valid registry")
}

struct Ended(Arc<(AtomicUsize, AtomicUsize)>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.1.fetch_add(1, Ordering::SeqCst);
    }
}

/// A backend and an executor of it alone, with the tools above.
fn matrix(cfg: WasmGuestConfig) -> (Arc<WasmGuest>, Executor, Arc<(AtomicUsize, AtomicUsize)>) {
    let guest = Arc::new(WasmGuest::new(cfg).expect("wasm backend"));
    let hangs = Arc::default();
    let exec = Executor::builder().shared_backend(guest.clone()).tools(tools(&hangs)).build();
    (guest, exec, hangs)
}

/// A current-thread runtime whose only blocking-pool thread is held until
/// this drops: a run that ends on it never went to the blocking pool.
struct OnTask {
    /// Dropped first: lets the held blocking thread end, so the runtime can.
    release: std::sync::mpsc::Sender<()>,
    runtime: tokio::runtime::Runtime,
}

impl OnTask {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(1)
            .build()
            .expect("runtime");
        let (release, held) = std::sync::mpsc::channel::<()>();
        drop(runtime.spawn_blocking(move || {
            let _ = held.recv();
        }));
        Self { release, runtime }
    }

    /// `future`'s output; a test failure after 60 s (a run that went to the
    /// held blocking pool would wait forever).
    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(60), future).await.expect("waited for the blocking pool")
        })
    }
}

impl Drop for OnTask {
    fn drop(&mut self) {
        let _ = self.release.send(());
    }
}

/// Runs `work` while another task on the same runtime wakes every 2 ms;
/// returns `work`'s output and the longest the other task waited between
/// two wake-ups (how long `work` held the thread at most) and its count.
async fn beside<T>(work: impl Future<Output = T>) -> (T, Duration, usize) {
    let gaps = Arc::new(Mutex::new((Duration::ZERO, 0usize)));
    let stop = Arc::new(tokio::sync::Notify::new());
    let ticker = {
        let (gaps, stop) = (gaps.clone(), stop.clone());
        tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                tokio::select! {
                    _ = stop.notified() => break,
                    _ = tokio::time::sleep(Duration::from_millis(2)) => {}
                }
                let now = Instant::now();
                let mut g = gaps.lock().unwrap();
                g.0 = g.0.max(now - last);
                g.1 += 1;
                last = now;
            }
            last
        })
    };
    // Let the ticker start first.
    tokio::task::yield_now().await;
    let out = work.await;
    stop.notify_one();
    let last = ticker.await.expect("ticker");
    // The wait since the last wake-up counts too (a `work` that held the
    // thread to its end left no wake-up after it).
    let mut g = gaps.lock().unwrap();
    g.0 = g.0.max(last.elapsed());
    let (gap, ticks) = *g;
    (out, gap, ticks)
}

fn strict(timeout_ms: u64) -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_millis(timeout_ms))
}

/// `work`, given up (dropped) after `limit`.
async fn within<T>(limit: Duration, work: impl Future<Output = T>) -> Result<T, tokio::time::error::Elapsed> {
    tokio::time::timeout(limit, work).await
}

// ---- the runtime stays free ------------------------------------------------

#[test]
fn an_endless_guest_cannot_block_a_current_thread_runtime() {
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    guest.precompile(&guest!(wat "infinite_loop")).unwrap();
    let request = ExecRequest::wasm(guest!(wat "infinite_loop")).policy(strict(400));
    let (r, gap, ticks) = rt.block_on(beside(exec.execute(request)));
    let r = r.unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    let took = r.usage.duration;
    assert!(took >= Duration::from_millis(400) && took < Duration::from_millis(900), "{took:?}");
    // The other task ran all along: at 2 ms a tick, ~200 wake-ups, none
    // held up for long (one epoch tick plus a loaded machine's noise).
    assert!(ticks >= 40, "only {ticks} wake-ups beside the guest");
    assert!(gap < Duration::from_millis(100), "the guest held the thread for {gap:?}");
    assert_eq!(guest.engine().slots_in_use(), 0);
}

#[test]
fn an_endless_loop_of_host_calls_cannot_block_a_current_thread_runtime() {
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    guest.precompile(WRITE_FOREVER.as_bytes()).unwrap();
    let request = ExecRequest::wasm(WRITE_FOREVER.as_bytes().to_vec()).policy(strict(300).max_output_bytes(100));
    let (r, gap, ticks) = rt.block_on(beside(exec.execute(request)));
    let r = r.unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.stdout.truncated && r.stdout.bytes.len() == 100 && r.stdout.total_bytes > 100, "{:?}", r.stdout);
    assert!(r.usage.duration < Duration::from_millis(800), "{r:?}");
    assert!(ticks >= 30, "only {ticks} wake-ups beside the guest");
    assert!(gap < Duration::from_millis(100), "the guest held the thread for {gap:?}");
}

#[test]
fn host_calls_at_the_bottom_of_a_full_wasm_stack_end_as_a_stack_overflow() {
    let request =
        || ExecRequest::wasm(RECURSE_AND_WRITE.as_bytes().to_vec()).policy(strict(10_000).max_output_bytes(10));
    let check = |r: ExecResult| {
        assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
        assert!(r.message.as_deref().unwrap_or_default().contains("call stack exhausted"), "{r:?}");
        assert!(r.stdout.total_bytes > 1000, "{:?}", r.stdout);
    };
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    guest.precompile(RECURSE_AND_WRITE.as_bytes()).unwrap();
    check(rt.block_on(exec.execute(request())).unwrap());
    let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    check(multi.block_on(exec.execute(request())).unwrap());
    check(exec.execute_blocking(request()).unwrap());
    // A smaller wasm stack leaves the host its own share all the same.
    let (guest, exec, _) = matrix(WasmGuestConfig::default().max_wasm_stack(64 << 10));
    guest.precompile(RECURSE_AND_WRITE.as_bytes()).unwrap();
    check(rt.block_on(exec.execute(request())).unwrap());
}

#[test]
fn a_sleeping_guest_awaits_on_a_current_thread_runtime() {
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    let napper = nap(150);
    guest.precompile(&napper).unwrap();
    guest.precompile(&guest!(wat "sleep_forever")).unwrap();

    let (r, gap, ticks) = rt.block_on(beside(exec.execute(ExecRequest::wasm(napper).policy(strict(5_000)))));
    let r = r.unwrap();
    assert_eq!((r.outcome, r.stdout.text().as_ref()), (Outcome::Ok, "awake\n"), "{r:?}");
    assert!(r.usage.duration >= Duration::from_millis(150), "{r:?}");
    assert!(r.usage.duration < Duration::from_millis(1_000), "{r:?}");
    assert!(ticks >= 20, "only {ticks} wake-ups beside the sleeper");
    assert!(gap < Duration::from_millis(100), "the sleeper held the thread for {gap:?}");

    // A sleep past the deadline ends at the deadline.
    let forever = ExecRequest::wasm(guest!(wat "sleep_forever")).policy(strict(300));
    let (r, gap, _) = rt.block_on(beside(exec.execute(forever)));
    let r = r.unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    let took = r.usage.duration;
    assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(800), "{took:?}");
    assert!(gap < Duration::from_millis(100), "the sleeper held the thread for {gap:?}");
    assert_eq!(guest.engine().slots_in_use(), 0);
}

#[test]
fn a_tool_call_awaits_on_a_current_thread_runtime() {
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    guest.precompile(TOOL_CALLER).unwrap();
    let request = ExecRequest::wasm(TOOL_CALLER.to_vec()).arg("slow.nap").policy(strict(10_000).tools(["slow.*"]));
    let (r, gap, ticks) = rt.block_on(beside(exec.execute(request)));
    let r = r.unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let answer: Value = serde_json::from_str(r.stdout.text().trim()).unwrap();
    assert_eq!(answer, json!({"id": 1, "ok": true, "value": "rested"}));
    assert_eq!(r.tool_calls.len(), 1);
    assert!(ticks >= 20, "only {ticks} wake-ups beside the tool call");
    assert!(gap < Duration::from_millis(100), "the tool call held the thread for {gap:?}");
}

#[test]
fn a_hanging_tool_call_ends_at_the_runs_deadline() {
    let rt = OnTask::new();
    let (guest, exec, hangs) = matrix(WasmGuestConfig::default());
    guest.precompile(TOOL_CALLER).unwrap();
    let request = ExecRequest::wasm(TOOL_CALLER.to_vec())
        .arg("slow.hang")
        .policy(strict(300).tools(["slow.*"]).tool_limits(ToolLimits::default()));
    let r = rt.block_on(exec.execute(request)).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.usage.duration < Duration::from_millis(3_500), "{r:?}");
    settled(|| hangs.1.load(Ordering::SeqCst) == hangs.0.load(Ordering::SeqCst));
    assert_eq!(hangs.0.load(Ordering::SeqCst), 1);
}

// ---- cancellation ----------------------------------------------------------

#[test]
fn dropping_the_future_ends_the_run_and_gives_its_slot_back() {
    let rt = OnTask::new();
    let (guest, exec, hangs) = matrix(WasmGuestConfig::default().pooled_instances(2));
    let spinner = ExecRequest::wasm(guest!(wat "infinite_loop")).policy(strict(30_000));
    let sleeper = ExecRequest::wasm(guest!(wat "sleep_forever")).policy(strict(30_000));
    let hanger = ExecRequest::wasm(TOOL_CALLER.to_vec()).arg("slow.hang").policy(strict(30_000).tools(["slow.*"]));
    for module in [guest!(wat "infinite_loop"), guest!(wat "sleep_forever"), TOOL_CALLER.to_vec(), guest!(wat "hello")]
    {
        guest.precompile(&module).unwrap();
    }
    for (what, request) in [("spinning", spinner), ("sleeping", sleeper), ("calling a tool", hanger)] {
        let gave_up = rt.block_on(within(Duration::from_millis(150), exec.execute(request)));
        assert!(gave_up.is_err(), "a guest {what} for 30 s ended within 150 ms");
        // The store went with the future, and its slot with it: at once,
        // not at the run's deadline.
        assert_eq!(guest.engine().slots_in_use(), 0, "a guest {what} kept its slot");
    }
    // The tool call of the dropped run ended with it.
    settled(|| hangs.1.load(Ordering::SeqCst) == hangs.0.load(Ordering::SeqCst));
    assert_eq!(hangs.0.load(Ordering::SeqCst), 1);
    // And the engine runs on: both slots are free.
    let r = rt.block_on(exec.execute(ExecRequest::wasm(guest!(wat "hello")).policy(strict(5_000)))).unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(guest.engine().slots_in_use(), 0);
}

// ---- every limit as on the blocking path ------------------------------------

/// What must be the same on both paths (durations aside).
#[derive(Debug, PartialEq)]
struct Verdict {
    outcome: Outcome,
    exit_code: Option<i32>,
    stdout: Vec<u8>,
    stdout_total: u64,
    stdout_truncated: bool,
    stderr: String,
    output: Option<Value>,
    output_truncated: bool,
    message: Option<String>,
    fuel: Option<u64>,
}

fn verdict(r: &ExecResult) -> Verdict {
    Verdict {
        outcome: r.outcome,
        exit_code: r.exit_code,
        stdout: r.stdout.bytes.clone(),
        stdout_total: r.stdout.total_bytes,
        stdout_truncated: r.stdout.truncated,
        stderr: r.stderr.text().into_owned(),
        output: r.output.clone(),
        output_truncated: r.output_truncated,
        // A timeout's message names its duration.
        message: r.message.clone().map(|m| if r.outcome == Outcome::TimedOut { "timed out".into() } else { m }),
        fuel: r.usage.fuel,
    }
}

fn hostile() -> Vec<(&'static str, ExecRequest)> {
    let input = json!({"a": [1, 2, {"b": "ü"}]});
    vec![
        ("hello", ExecRequest::wasm(guest!(wat "hello"))),
        ("exit 42", ExecRequest::wasm(guest!(wat "exit42"))),
        ("unreachable", ExecRequest::wasm(guest!(wat "unreachable"))),
        ("json abi", ExecRequest::wasm(guest!(wat "echo_json")).input(input.clone())),
        (
            "json abi over the cap",
            ExecRequest::wasm(guest!(wat "echo_json")).input(input).policy(strict(5_000).max_output_bytes(4)),
        ),
        ("memory bomb", ExecRequest::wasm(guest!(wat "grow_bomb")).policy(strict(5_000).memory_bytes(64 << 20))),
        ("stdout flood", ExecRequest::wasm(guest!(wat "stdout_flood")).policy(strict(10_000).max_output_bytes(1000))),
        ("deep recursion", ExecRequest::wasm(guest!(wat "deep_recursion"))),
        ("out of fuel", ExecRequest::wasm(guest!(wat "infinite_loop")).policy(strict(5_000).fuel(1_000_000))),
        ("endless loop", ExecRequest::wasm(guest!(wat "infinite_loop")).policy(strict(200))),
        ("endless sleep", ExecRequest::wasm(guest!(wat "sleep_forever")).policy(strict(200))),
        (
            "stdin in, stdout out",
            ExecRequest::wasm(guest!(prebuilt "wasi_tool")).arg("cat").stdin(b"on the task".to_vec()),
        ),
        ("argv", ExecRequest::wasm(guest!(prebuilt "wasi_tool")).arg("args").arg("x")),
        ("usleep", ExecRequest::wasm(guest!(prebuilt "wasi_tool")).arg("sleep").arg("30")),
        (
            "malloc bomb",
            ExecRequest::wasm(guest!(prebuilt "wasi_tool"))
                .arg("malloc-bomb")
                .policy(strict(10_000).memory_bytes(32 << 20)),
        ),
    ]
}

#[test]
fn hostile_guests_end_the_same_on_both_paths_on_a_current_thread_runtime() {
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    for (what, request) in hostile() {
        let blocking = exec.execute_blocking(request.clone()).expect("runs");
        let on_task = rt.block_on(exec.execute(request)).expect("runs");
        assert_eq!(verdict(&on_task), verdict(&blocking), "{what}: {on_task:?}\nvs {blocking:?}");
        assert_eq!(guest.engine().slots_in_use(), 0, "{what}");
    }
}

#[test]
fn hostile_guests_end_the_same_on_both_paths_on_a_multi_thread_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (guest, exec, _) = matrix(WasmGuestConfig::default().pooled_instances(16));
    let requests = hostile();
    let expected: Vec<_> =
        requests.iter().map(|(_, r)| verdict(&exec.execute_blocking(r.clone()).expect("runs"))).collect();
    // Every hostile guest at once, 4 times over, on 2 worker threads.
    let results = rt.block_on(async {
        let mut tasks = Vec::new();
        for round in 0..4 {
            for (i, (_, request)) in requests.iter().enumerate() {
                let (exec, request) = (exec.clone(), request.clone());
                tasks.push(tokio::spawn(async move { (round, i, exec.execute(request).await) }));
            }
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        results
    });
    for (round, i, result) in results {
        let r = result.expect("runs");
        assert_eq!(verdict(&r), expected[i], "{} (round {round}): {r:?}", requests[i].0);
    }
    assert_eq!(guest.engine().slots_in_use(), 0);
}

// ---- what goes to the blocking pool ------------------------------------------

#[test]
fn a_run_that_finds_no_slot_free_waits_on_the_blocking_pool() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (guest, exec, _) = matrix(WasmGuestConfig::default().pooled_instances(1));
    let napper = nap(200);
    guest.precompile(&napper).unwrap();
    let (first, second) = rt.block_on(async {
        let first = tokio::spawn({
            let exec = exec.clone();
            let request = ExecRequest::wasm(napper.clone()).policy(strict(5_000));
            async move { exec.execute(request).await }
        });
        // The first holds the only slot while it sleeps, on the task.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(guest.engine().slots_in_use(), 1);
        let second = exec.execute(ExecRequest::wasm(napper).policy(strict(5_000))).await;
        (first.await.unwrap(), second)
    });
    for r in [first.unwrap(), second.unwrap()] {
        assert_eq!((r.outcome, r.stdout.text().as_ref()), (Outcome::Ok, "awake\n"), "{r:?}");
    }
    assert_eq!(guest.engine().slots_in_use(), 0);
}

#[test]
fn a_module_not_yet_cached_compiles_on_the_blocking_pool() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    let r = rt.block_on(exec.execute(ExecRequest::wasm(guest!(wat "hello")))).unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(guest.cache_stats().compiled, 1);
    // The next call finds it cached, and runs on the task.
    let held = OnTask::new();
    let r = held.block_on(exec.execute(ExecRequest::wasm(guest!(wat "hello")))).unwrap();
    assert_eq!(r.stdout.text(), "hello from wasm\n");
    assert_eq!(guest.cache_stats().memory_hits, 1);
}

#[test]
fn runs_with_files_or_without_async_runs_take_the_blocking_pool() {
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    guest.precompile(&guest!(prebuilt "wasi_tool")).unwrap();
    let with_file = || {
        ExecRequest::wasm(guest!(prebuilt "wasi_tool"))
            .arg("read")
            .arg("/input/a.txt")
            .input_file(ExecFile::new("a.txt", b"staged".to_vec()))
    };
    // Held: the run waits for the blocking pool, which never frees.
    let held = OnTask::new();
    assert!(held.block_on(within(Duration::from_millis(300), exec.execute(with_file()))).is_err());
    drop(held);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let r = rt.block_on(exec.execute(with_file())).unwrap();
    assert_eq!(r.stdout.text(), "staged", "{r:?}");

    let (guest, exec, _) = matrix(WasmGuestConfig::default().async_runs(false));
    guest.precompile(&guest!(wat "hello")).unwrap();
    let held = OnTask::new();
    let hello = || ExecRequest::wasm(guest!(wat "hello"));
    assert!(held.block_on(within(Duration::from_millis(300), exec.execute(hello()))).is_err());
    drop(held);
    assert_eq!(rt.block_on(exec.execute(hello())).unwrap().outcome, Outcome::Ok);
}

/// Waits at most 10 s for `done`, and fails the test if it never is.
fn settled(done: impl FnMut() -> bool) {
    assert!(crate::common::wait::wait_until(Duration::from_secs(10), done), "not within 10 s");
}

// ---- what a hostile guest or caller tries next -------------------------------

/// Reads one byte of stdin: `w` fills the whole memory (grown to 1 MiB,
/// data segments and the kept-resident first 64 KiB included) with 0x5A;
/// `x` does that too, then checks (finds it dirty: the check works); `r`
/// checks that nothing of that is left — the data segments
/// as the module has them, every other word of the grown memory free of
/// 0x5A5A5A5A — and prints "clean" or "dirty". `variant` makes a
/// different module of the same code.
fn memory_spy(variant: u32) -> Vec<u8> {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global (export "variant") i32 (i32.const {variant}))
  (data (i32.const 1024) "PRISTINE")
  (data (i32.const 70000) "IMAGE2!!")
  (func (export "_start")
    (local $at i32) (local $dirty i32) (local $mode i32)
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 1))
    (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (drop (memory.grow (i32.const 14)))
    (local.set $mode (i32.load8_u (i32.const 16)))
    (if (i32.ne (local.get $mode) (i32.const 114))
      (then (memory.fill (i32.const 0) (i32.const 0x5A) (i32.const 1048576))))
    (if (i32.eq (local.get $mode) (i32.const 119)) (then (return)))
    (local.set $dirty
      (i32.or
        (i64.ne (i64.load (i32.const 1024)) (i64.const 0x454E495453495250))
        (i64.ne (i64.load (i32.const 70000)) (i64.const 0x2121324547414D49))))
    (local.set $at (i32.const 0))
    (loop $scan
      (if (i32.eq (i32.load (local.get $at)) (i32.const 0x5A5A5A5A))
        (then (local.set $dirty (i32.const 1))))
      (local.set $at (i32.add (local.get $at) (i32.const 4)))
      (br_if $scan (i32.lt_u (local.get $at) (i32.const 1048576))))
    (i32.store (i32.const 2048) (select (i32.const 0x74726964) (i32.const 0x61656c63) (local.get $dirty)))
    (i32.store16 (i32.const 2052) (select (i32.const 0x0a79) (i32.const 0x0a6e) (local.get $dirty)))
    (i32.store (i32.const 200) (i32.const 2048))
    (i32.store (i32.const 204) (i32.const 6))
    (drop (call $fd_write (i32.const 1) (i32.const 200) (i32.const 1) (i32.const 208)))))"#
    )
    .into_bytes()
}

/// The pool keeps the first 64 KiB of a slot's memory resident and resets
/// only the pages a run touched: a run still finds nothing of the last one
/// on its slot (same module or another, either path), in the kept pages,
/// past them, in its data segments or in memory it grows.
#[test]
fn a_pooled_memory_holds_nothing_of_the_last_run_on_its_slot() {
    let rt = OnTask::new();
    // One slot: every run takes the slot the last one left.
    let (guest, exec, _) = matrix(WasmGuestConfig::default().pooled_instances(1));
    let (spy, other) = (memory_spy(1), memory_spy(2));
    guest.precompile(&spy).unwrap();
    guest.precompile(&other).unwrap();
    let run = |module: &[u8], stdin: &[u8], on_task: bool| {
        let request = ExecRequest::wasm(module.to_vec()).stdin(stdin.to_vec()).policy(strict(10_000));
        let r = if on_task { rt.block_on(exec.execute(request)) } else { exec.execute_blocking(request) };
        r.expect("runs")
    };
    // The check sees what a run leaves in its own memory.
    assert_eq!(run(&spy, b"x", true).stdout.text(), "dirty\n");
    assert_eq!(run(&spy, b"x", false).stdout.text(), "dirty\n");
    for (write_on_task, read_on_task) in [(true, true), (false, true), (true, false), (false, false)] {
        for reader in [&spy, &other] {
            let w = run(&spy, b"w", write_on_task);
            assert_eq!(w.outcome, Outcome::Ok, "{w:?}");
            let r = run(reader, b"r", read_on_task);
            assert_eq!(
                (r.outcome, r.stdout.text().as_ref()),
                (Outcome::Ok, "clean\n"),
                "written on the task: {write_on_task}, read on the task: {read_on_task}, same module: {}",
                std::ptr::eq(reader, &spy)
            );
        }
    }
}

/// Fills 64 MiB of its memory with `random_get` (wasmtime-wasi's limit for
/// one call), over and over.
const RANDOM_FOREVER: &str = r#"(module
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (memory (export "memory") 1025)
  (func (export "_start")
    (loop $again
      (drop (call $random (i32.const 0) (i32.const 67108864)))
      (br $again))))"#;

/// `random_get` of 32 bytes (0: fills them), then of 100 bytes that run
/// past the end of memory (21: `EFAULT`): exits with the sum, plus 1 if
/// the 32 bytes are not all zero.
const RANDOM_SMALL: &str = r#"(module
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (local $sum i32)
    (local.set $sum (i32.add (call $random (i32.const 0) (i32.const 32)) (call $random (i32.const 65500) (i32.const 100))))
    (call $exit (i32.add (local.get $sum)
      (i64.ne (i64.or (i64.or (i64.load (i32.const 0)) (i64.load (i32.const 8)))
                      (i64.or (i64.load (i32.const 16)) (i64.load (i32.const 24)))) (i64.const 0))))))"#;

/// wasmtime-wasi's `random_get` built 64 MiB on the host a byte at a time,
/// deaf to the deadline: 17 s of the runtime's one thread (debug build)
/// for a run of 300 ms. execbox's fills the guest's memory in chunks,
/// looking at the deadline (and yielding, on a task) between two.
#[test]
fn random_get_of_a_large_buffer_cannot_hold_the_runtime_thread() {
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    guest.precompile(RANDOM_FOREVER.as_bytes()).unwrap();
    let request = ExecRequest::wasm(RANDOM_FOREVER.as_bytes().to_vec()).policy(strict(300));
    let (r, gap, _) = rt.block_on(beside(exec.execute(request)));
    let r = r.unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.usage.duration < Duration::from_millis(1_000), "{r:?}");
    assert!(gap < Duration::from_millis(100), "the guest held the thread for {gap:?}");
    let blocking = exec.execute_blocking(ExecRequest::wasm(RANDOM_FOREVER.as_bytes().to_vec()).policy(strict(300)));
    let blocking = blocking.unwrap();
    assert_eq!(blocking.outcome, Outcome::TimedOut, "{blocking:?}");
    assert!(blocking.usage.duration < Duration::from_millis(1_000), "{blocking:?}");
    // And it still answers as WASI says.
    guest.precompile(RANDOM_SMALL.as_bytes()).unwrap();
    let small = || ExecRequest::wasm(RANDOM_SMALL.as_bytes().to_vec());
    for r in [rt.block_on(exec.execute(small())).unwrap(), exec.execute_blocking(small()).unwrap()] {
        assert_eq!(r.exit_code, Some(22), "{r:?}");
    }
}

/// A start function that spins forever: it runs while instantiating.
const START_SPINS: &str = r#"(module
  (func $spin (loop $forever (br $forever)))
  (start $spin)
  (func (export "_start")))"#;

/// A JSON-ABI guest whose `alloc` traps.
const ALLOC_TRAPS: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "alloc") (param i32) (result i32) unreachable)
  (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#;

/// A JSON-ABI guest whose `run` exits with code 3.
const RUN_EXITS: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "run") (param i32 i32) (result i64) (call $exit (i32.const 3)) (i64.const 0)))"#;

/// A JSON-ABI guest whose `run` spins forever.
const RUN_SPINS: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "run") (param i32 i32) (result i64) (loop $l (br $l)) (i64.const 0)))"#;

/// A JSON-ABI guest whose `run` answers outside its memory.
const RUN_OUTSIDE: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "run") (param i32 i32) (result i64) (i64.const 0x0010000000000010)))"#;

/// A JSON-ABI guest whose `alloc` points outside its memory.
const ALLOC_OUTSIDE: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "alloc") (param i32) (result i32) (i32.const 65530))
  (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#;

/// Sleeps with an absolute clock: realtime (0) or monotonic (1), `ms` from
/// now, then prints the poll's errno and event count.
fn absolute_nap(clock: u32, ms: u64) -> Vec<u8> {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "clock_time_get" (func $now (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $now (i32.const {clock}) (i64.const 0) (i32.const 304)))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const {clock}))
    (i64.store (i32.const 24) (i64.add (i64.load (i32.const 304)) (i64.const {ns})))
    (i32.store16 (i32.const 40) (i32.const 1))
    (call $exit (i32.add (i32.mul (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)) (i32.const 10))
      (i32.load (i32.const 128))))))"#,
        ns = ms * 1_000_000
    )
    .into_bytes()
}

/// Polls `n` subscriptions (all zeroed: relative clock 0 timeouts, due
/// now) and exits with the errno * 10 + events (mod 256).
fn many_subscriptions(n: u32) -> Vec<u8> {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 200)
  (func (export "_start")
    (call $exit (i32.add (call $poll (i32.const 0) (i32.const 6000000) (i32.const {n}) (i32.const 16))
      (i32.mul (i32.const 10) (i32.ne (i32.load (i32.const 16)) (i32.const 0)))))))"#
    )
    .into_bytes()
}

/// Grows its table by `n` (past the engine's limit when large).
fn table_grow(n: u32) -> Vec<u8> {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (table 1 funcref)
  (func (export "_start")
    (call $exit (i32.add (i32.const 2) (table.grow (ref.null func) (i32.const {n}))))))"#
    )
    .into_bytes()
}

fn more_hostile() -> Vec<(&'static str, ExecRequest)> {
    vec![
        ("start spins", ExecRequest::wasm(START_SPINS.as_bytes().to_vec()).policy(strict(200))),
        ("alloc traps", ExecRequest::wasm(ALLOC_TRAPS.as_bytes().to_vec()).input(json!({"a": 1}))),
        ("run exits 3", ExecRequest::wasm(RUN_EXITS.as_bytes().to_vec()).input(json!({"a": 1}))),
        ("run spins", ExecRequest::wasm(RUN_SPINS.as_bytes().to_vec()).input(json!(1)).policy(strict(200))),
        (
            "run spins out of fuel",
            ExecRequest::wasm(RUN_SPINS.as_bytes().to_vec()).input(json!(1)).policy(strict(5_000).fuel(100_000)),
        ),
        ("run outside", ExecRequest::wasm(RUN_OUTSIDE.as_bytes().to_vec()).input(json!(1))),
        ("alloc outside", ExecRequest::wasm(ALLOC_OUTSIDE.as_bytes().to_vec()).input(json!("0123456789"))),
        ("realtime nap", ExecRequest::wasm(absolute_nap(0, 50))),
        ("monotonic nap", ExecRequest::wasm(absolute_nap(1, 50))),
        ("realtime nap past the deadline", ExecRequest::wasm(absolute_nap(0, 3_600_000)).policy(strict(200))),
        ("monotonic nap past the deadline", ExecRequest::wasm(absolute_nap(1, 3_600_000)).policy(strict(200))),
        ("process cputime nap", ExecRequest::wasm(absolute_nap(2, 3_600_000)).policy(strict(200))),
        ("21845 subscriptions", ExecRequest::wasm(many_subscriptions(21845))),
        ("21846 subscriptions", ExecRequest::wasm(many_subscriptions(21846))),
        ("-1 subscriptions", ExecRequest::wasm(many_subscriptions(u32::MAX))),
        ("table grow", ExecRequest::wasm(table_grow(1000))),
        ("table grow past the limit", ExecRequest::wasm(table_grow(10_000_000))),
        ("exit 125", ExecRequest::wasm(guest!(prebuilt "wasi_tool")).arg("exit").arg("125")),
        ("exit 255", ExecRequest::wasm(guest!(prebuilt "wasi_tool")).arg("exit").arg("255")),
        ("exit 1", ExecRequest::wasm(guest!(prebuilt "wasi_tool")).arg("exit").arg("1")),
        (
            "stderr cap",
            ExecRequest::wasm(guest!(prebuilt "wasi_tool")).arg("nope").policy(strict(5_000).max_output_bytes(3)),
        ),
    ]
}

/// Start functions, JSON-ABI traps and exits, absolute sleeps on every
/// clock, huge poll subscription counts, table growth and exit codes end
/// the same on the task as on the blocking path.
#[test]
fn more_hostile_guests_end_the_same_on_both_paths() {
    let rt = OnTask::new();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    let mut differ = Vec::new();
    for (what, request) in more_hostile() {
        let blocking = exec.execute_blocking(request.clone()).expect("runs");
        let on_task = rt.block_on(exec.execute(request)).expect("runs");
        if verdict(&on_task) != verdict(&blocking) {
            differ.push(format!("{what}: {on_task:?}\nvs {blocking:?}"));
        }
        assert_eq!(guest.engine().slots_in_use(), 0, "{what}");
    }
    assert!(differ.is_empty(), "{differ:#?}");
}

/// A runtime dropped (or shut down in the background) with runs on its
/// tasks — spinning, sleeping, in a tool call, in a start function — drops
/// their futures: every slot comes back and every tool call ends.
#[test]
fn shutting_down_the_runtime_mid_runs_gives_every_slot_back() {
    for background in [false, true] {
        let (guest, exec, hangs) = matrix(WasmGuestConfig::default().pooled_instances(64));
        for module in [guest!(wat "infinite_loop"), guest!(wat "sleep_forever"), TOOL_CALLER.to_vec()] {
            guest.precompile(&module).unwrap();
        }
        guest.precompile(START_SPINS.as_bytes()).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        for i in 0..32 {
            let request = match i % 4 {
                0 => ExecRequest::wasm(guest!(wat "infinite_loop")),
                1 => ExecRequest::wasm(guest!(wat "sleep_forever")),
                2 => ExecRequest::wasm(TOOL_CALLER.to_vec()).arg("slow.hang").policy(strict(30_000).tools(["slow.*"])),
                _ => ExecRequest::wasm(START_SPINS.as_bytes().to_vec()),
            };
            let request = if i % 4 == 2 { request } else { request.policy(strict(30_000)) };
            let exec = exec.clone();
            rt.spawn(async move { exec.execute(request).await });
        }
        settled(|| guest.engine().slots_in_use() == 32 && hangs.0.load(Ordering::SeqCst) == 8);
        if background {
            rt.shutdown_background();
        } else {
            drop(rt);
        }
        settled(|| guest.engine().slots_in_use() == 0);
        settled(|| hangs.1.load(Ordering::SeqCst) == 8);
    }
}

/// `JoinHandle::abort` of a spawned run, at every kind of wait, 50 times.
#[test]
fn aborting_spawned_runs_gives_their_slots_back() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (guest, exec, hangs) = matrix(WasmGuestConfig::default().pooled_instances(4));
    for module in [guest!(wat "infinite_loop"), guest!(wat "sleep_forever"), TOOL_CALLER.to_vec()] {
        guest.precompile(&module).unwrap();
    }
    guest.precompile(START_SPINS.as_bytes()).unwrap();
    for round in 0..50 {
        let request = match round % 4 {
            0 => ExecRequest::wasm(guest!(wat "infinite_loop")).policy(strict(30_000)),
            1 => ExecRequest::wasm(guest!(wat "sleep_forever")).policy(strict(30_000)),
            2 => ExecRequest::wasm(TOOL_CALLER.to_vec()).arg("slow.hang").policy(strict(30_000).tools(["slow.*"])),
            _ => ExecRequest::wasm(START_SPINS.as_bytes().to_vec()).policy(strict(30_000)),
        };
        let exec2 = exec.clone();
        let task = rt.spawn(async move { exec2.execute(request).await });
        settled(|| guest.engine().slots_in_use() == 1);
        task.abort();
        let joined = rt.block_on(task);
        assert!(joined.unwrap_err().is_cancelled());
        assert_eq!(guest.engine().slots_in_use(), 0, "round {round}");
    }
    settled(|| hangs.1.load(Ordering::SeqCst) == hangs.0.load(Ordering::SeqCst));
}

/// 300 runs at once (spinners, sleepers, quick ones) on 2 worker threads.
#[test]
fn hundreds_of_runs_on_two_threads_end_within_their_limits() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (guest, exec, _) = matrix(WasmGuestConfig::default().pooled_instances(400));
    guest.precompile(&guest!(wat "infinite_loop")).unwrap();
    guest.precompile(&guest!(wat "hello")).unwrap();
    let napper = nap(100);
    guest.precompile(&napper).unwrap();
    let started = Instant::now();
    let results = rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..300 {
            let request = match i % 3 {
                0 => ExecRequest::wasm(guest!(wat "infinite_loop")).policy(strict(300)),
                1 => ExecRequest::wasm(guest!(wat "hello")).policy(strict(5_000)),
                _ => ExecRequest::wasm(napper.clone()).policy(strict(5_000)),
            };
            let exec = exec.clone();
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                (i, exec.execute(request).await, t.elapsed())
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let mut worst = Duration::ZERO;
    for (i, r, wall) in results {
        let r = r.unwrap();
        match i % 3 {
            0 => {
                assert_eq!(r.outcome, Outcome::TimedOut);
                worst = worst.max(wall.saturating_sub(Duration::from_millis(300)));
            }
            _ => assert_eq!(r.outcome, Outcome::Ok, "{r:?}"),
        }
    }
    // 100 spinners share 2 threads a tick at a time: each is looked at
    // every ~50 ms at worst; 2 s is a loaded machine's margin.
    assert!(worst < Duration::from_secs(2), "a spinner ended {worst:?} past its deadline");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(guest.engine().slots_in_use(), 0);
}

/// A runtime built without timers: a tool call on the task made its
/// timeout with the caller's timer and panicked through `execute`.
#[test]
fn a_runtime_without_timers_or_io_runs_sleeps_and_tool_calls() {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let (guest, exec, _) = matrix(WasmGuestConfig::default());
    let napper = nap(50);
    for module in [guest!(wat "sleep_forever"), TOOL_CALLER.to_vec(), napper.clone(), guest!(wat "hello")] {
        guest.precompile(&module).unwrap();
    }
    let r = rt.block_on(exec.execute(ExecRequest::wasm(napper).policy(strict(5_000)))).unwrap();
    assert_eq!(r.stdout.text(), "awake\n", "{r:?}");
    let r = rt.block_on(exec.execute(ExecRequest::wasm(guest!(wat "sleep_forever")).policy(strict(200)))).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    let request = ExecRequest::wasm(TOOL_CALLER.to_vec()).arg("slow.nap").policy(strict(10_000).tools(["slow.*"]));
    let r = rt.block_on(exec.execute(request)).unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(r.stdout.text().contains("rested"), "{r:?}");
    let request = ExecRequest::wasm(TOOL_CALLER.to_vec()).arg("slow.hang").policy(strict(300).tools(["slow.*"]));
    let r = rt.block_on(exec.execute(request)).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
}

/// A run's future polled on one runtime (so it started on the task, in a
/// sleep, a tool call or a spin), then dropped on a plain thread after
/// that runtime is gone: its slot and tool call end with it. Another one
/// finishes on a second runtime.
#[test]
fn a_run_started_on_one_runtime_ends_off_it() {
    let (guest, exec, hangs) = matrix(WasmGuestConfig::default().pooled_instances(8));
    let napper = nap(100);
    for module in [guest!(wat "infinite_loop"), guest!(wat "sleep_forever"), TOOL_CALLER.to_vec(), napper.clone()] {
        guest.precompile(&module).unwrap();
    }
    let first = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut futures: Vec<_> = [
        ExecRequest::wasm(guest!(wat "infinite_loop")).policy(strict(30_000)),
        ExecRequest::wasm(guest!(wat "sleep_forever")).policy(strict(30_000)),
        ExecRequest::wasm(TOOL_CALLER.to_vec()).arg("slow.hang").policy(strict(30_000).tools(["slow.*"])),
        ExecRequest::wasm(napper).policy(strict(30_000)),
    ]
    .into_iter()
    .map(|request| {
        let exec = exec.clone();
        Box::pin(async move { exec.execute(request).await })
    })
    .collect();
    first.block_on(async {
        for (i, future) in futures.iter_mut().enumerate() {
            // The tool caller is polled until its call started.
            while {
                let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
                assert!(polled.is_pending());
                i == 2 && hangs.0.load(Ordering::SeqCst) == 0
            } {
                tokio::task::yield_now().await;
            }
        }
    });
    assert_eq!(guest.engine().slots_in_use(), 4);
    drop(first);
    let napper = futures.pop().unwrap();
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let r = second.block_on(napper).unwrap();
    assert_eq!((r.outcome, r.stdout.text().as_ref()), (Outcome::Ok, "awake\n"), "{r:?}");
    std::thread::spawn(move || drop(futures)).join().unwrap();
    assert_eq!(guest.engine().slots_in_use(), 0);
    settled(|| hangs.1.load(Ordering::SeqCst) == 1);
    assert_eq!(hangs.0.load(Ordering::SeqCst), 1);
}

// ---- pooled Python on the task ----------------------------------------------

/// Python on an engine of its own, its warm pool of one ready; `None`
/// (skipped) without the interpreter modules.
fn pooled_python() -> Option<(WasmInterpreter, Executor)> {
    let engine = WasmEngine::new(WasmGuestConfig::default().pooled_instances(8)).expect("engine");
    let py = crate::common::skip::interpreter(WasmInterpreter::on_engine(
        engine,
        InterpreterConfig::default().warm_pool(1),
    ))?;
    py.prepare(Duration::from_secs(60));
    let exec = Executor::builder().backend(py.clone()).build();
    Some((py, exec))
}

fn python(code: &str, timeout_ms: u64) -> ExecRequest {
    ExecRequest::source(Language::Python, code).policy(strict(timeout_ms))
}

#[test]
fn pooled_python_is_awaited_on_the_task_and_an_endless_loop_holds_no_runtime_thread() {
    let Some((py, exec)) = pooled_python() else { return };
    let held = OnTask::new();
    let r = held.block_on(exec.execute(python("print(6 * 7)", 30_000).input(json!({"n": 1})))).unwrap();
    assert_eq!((r.outcome, r.output.clone(), r.usage.fuel), (Outcome::Ok, Some(json!(42)), None), "{r:?}");

    py.prepare(Duration::from_secs(60));
    let started = Instant::now();
    let (r, gap, ticks) = held.block_on(beside(exec.execute(python("while True: pass", 1_000))));
    let r = r.unwrap();
    assert_eq!((r.outcome, r.usage.fuel), (Outcome::TimedOut, None), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(gap < Duration::from_millis(500) && ticks > 10, "the run held the thread for {gap:?} ({ticks} ticks)");
}

#[test]
fn dropping_a_pooled_python_run_ends_it_at_once() {
    let Some((py, exec)) = pooled_python() else { return };
    let held = OnTask::new();
    assert_eq!(py.engine().slots_in_use(), 1, "the warm instance");
    let gave_up = held.block_on(within(Duration::from_millis(300), exec.execute(python("while True: pass", 30_000))));
    assert!(gave_up.is_err(), "a 30 s loop ended within 300 ms");
    // Its instance stops at the next epoch tick and gives its slot back;
    // the replacement (listed by the refill thread) keeps one.
    settled(|| py.warm_idle() == 1 && py.engine().slots_in_use() == 1);
    let r = held.block_on(exec.execute(python("print(1)", 30_000))).unwrap();
    assert_eq!(r.output, Some(json!(1)), "{r:?}");
}

/// `print(1)` under a memory cap that a fresh instance honours but a warm
/// one cannot (its start-up took more); `None` if no cap from 9 MiB to
/// 16 MiB is such (found on the blocking path, which runs it fresh).
fn cap_below_a_warm_start(py: &WasmInterpreter, exec: &Executor) -> Option<ExecRequest> {
    (144..=256).map(|pages: u64| pages << 16).find_map(|cap| {
        let request = ExecRequest::source(Language::Python, "print(1)").policy(strict(30_000).memory_bytes(cap));
        py.prepare(Duration::from_secs(60));
        let r = exec.execute_blocking(request.clone()).unwrap();
        (r.outcome == Outcome::Ok && r.usage.fuel.is_some()).then_some(request)
    })
}

/// A request whose memory cap a warm instance cannot honour runs fresh on
/// either path, as a caller sends it: awaited, or right after another run
/// (when the pool's only instance is its replacement, still starting).
/// The async path's fallback took that replacement, which then ran out of
/// memory starting; and such requests leave the pool's instances alone.
#[test]
fn a_memory_cap_below_a_warm_start_runs_fresh_on_both_paths() {
    let Some((py, exec)) = pooled_python() else { return };
    let low = cap_below_a_warm_start(&py, &exec).expect("a cap a fresh instance honours and a warm one cannot");
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for round in 0..3 {
        py.prepare(Duration::from_secs(60));
        let r = rt.block_on(exec.execute(low.clone())).unwrap();
        assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(1))), "awaited, round {round}: {r:?}");
        assert!(r.usage.fuel.is_some(), "ran fresh: {r:?}");
        py.prepare(Duration::from_secs(60));
        let before = exec.execute_blocking(python("print(0)", 30_000)).unwrap();
        assert_eq!(before.outcome, Outcome::Ok, "{before:?}");
        let r = exec.execute_blocking(low.clone()).unwrap();
        assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(1))), "back to back, round {round}: {r:?}");
    }
    // The warm instance stayed for a run it can serve.
    py.prepare(Duration::from_secs(60));
    let r = rt.block_on(exec.execute(python("print(2)", 30_000))).unwrap();
    assert_eq!((r.output.clone(), r.usage.fuel), (Some(json!(2)), None), "{r:?}");
}

/// An async caller that arrives while another thread loads the interpreter
/// (a cold load compiles it: seconds) waits for that load on the blocking
/// pool, never on its runtime's thread. Checking whether the module was
/// loaded took the lock the load holds, on the task.
#[test]
fn an_async_run_during_a_cold_interpreter_load_holds_no_runtime_thread() {
    let Some(installed) = InterpreterConfig::default().dir else { return };
    if !crate::common::skip::available(
        crate::common::skip::INTERPRETERS,
        WasmInterpreter::new(InterpreterConfig::default()).unwrap().availability(),
    ) {
        return;
    }
    // A directory of its own, with no compiled form cached: the load compiles.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(installed.join("python.wasm"), dir.path().join("python.wasm")).unwrap();
    let py = WasmInterpreter::new(InterpreterConfig::default().dir(dir.path().to_path_buf()).warm_pool(1)).unwrap();
    let exec = Executor::builder().backend(py.clone()).build();
    let loader = {
        let py = py.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            py.warm_up().unwrap();
            started.elapsed()
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (r, gap, _) = rt.block_on(beside(exec.execute(python("print(1)", 600_000))));
    let load = loader.join().unwrap();
    assert_eq!(r.unwrap().output, Some(json!(1)));
    if load < Duration::from_secs(2) {
        eprintln!("skipping: the interpreter compiled in {load:?}, too fast to tell");
        return;
    }
    assert!(gap < Duration::from_millis(1_000), "the task waited {gap:?} for a load of {load:?}");
}
