//! WASM guest latency: compile vs cached module, the floor of raw wasmtime
//! (`InstancePre` + pooling, no WASI), JSON-ABI transforms, a WASI command
//! round trip, and fuel metering on vs off.
//!
//! `cargo bench --bench wasm`. The `command_cached_*` benches run the same
//! cached command through the executor: `execute_blocking` (a sync caller)
//! and `execute` awaited on a tokio runtime (an async caller), side by side.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::Executor;
use execbox::backends::{WasmGuest, WasmGuestConfig};
use execbox::{ExecRequest, SandboxPolicy};
use serde_json::json;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Linker, Module, PoolingAllocationConfig, Store, TypedFunc};

const HELLO: &str = include_str!("../guests/wat/hello.wat");
const ECHO: &str = include_str!("../guests/wat/echo_json.wat");
const COUNT_LOOP: &str = include_str!("../guests/wat/count_loop.wat");
const TRANSFORM: &[u8] = include_bytes!("../guests/prebuilt/json_transform.wasm");
const TOOL: &[u8] = include_bytes!("../guests/prebuilt/wasi_tool.wasm");

fn binary(wat_text: &str) -> Vec<u8> {
    wat::parse_str(wat_text).expect("valid WAT")
}

/// `module` plus a custom section holding `n`: a module no cache has seen.
fn unseen(module: &[u8], n: u64) -> Vec<u8> {
    let name = b"execbox-bench";
    let payload = n.to_le_bytes();
    let size = 1 + name.len() + payload.len();
    let mut out = module.to_vec();
    out.extend_from_slice(&[0, size as u8, name.len() as u8]);
    out.extend_from_slice(name);
    out.extend_from_slice(&payload);
    out
}

fn run(backend: &WasmGuest, request: ExecRequest) {
    let result = Executor::run_on(backend, request).expect("runs");
    assert!(result.is_ok(), "{result:?}");
    black_box(result);
}

fn bench(c: &mut Criterion) {
    let wasm = WasmGuest::new(WasmGuestConfig::default()).expect("backend");
    let hello = binary(HELLO);
    let echo = binary(ECHO);
    let mut g = c.benchmark_group("wasm");

    // Floor: raw wasmtime with the same engine settings, no WASI, no execbox.
    let floor = raw_floor();
    g.bench_function("raw_instance_pre_call", |b| b.iter(|| black_box(floor.call())));

    // First call of a module: sha256 + compile + link + run.
    let counter = AtomicU64::new(0);
    g.bench_function("command_first_call_compiles", |b| {
        b.iter(|| run(&wasm, ExecRequest::wasm(unseen(&hello, counter.fetch_add(1, Ordering::Relaxed)))))
    });
    // Every later call: sha256 + cache hit + WASI ctx + instantiate + `_start`.
    g.bench_function("command_cached", |b| b.iter(|| run(&wasm, ExecRequest::wasm(hello.clone()))));
    // The same through an executor: as a sync caller, and as an async one
    // (`block_on` polls the future on this thread; a multi-thread runtime
    // as in a server, and a current-thread one).
    let exec = Executor::with_backend(WasmGuest::on_engine(wasm.engine().clone()));
    let checked = |result: Result<execbox::ExecResult, execbox::ExecError>| {
        let result = result.expect("runs");
        assert!(result.is_ok(), "{result:?}");
        black_box(result);
    };
    g.bench_function("command_cached_execute_blocking", |b| {
        b.iter(|| checked(exec.execute_blocking(ExecRequest::wasm(hello.clone()))))
    });
    let multi = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    g.bench_function("command_cached_execute", |b| {
        b.iter(|| checked(multi.block_on(exec.execute(ExecRequest::wasm(hello.clone())))))
    });
    let current = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    g.bench_function("command_cached_execute_current_thread", |b| {
        b.iter(|| checked(current.block_on(exec.execute(ExecRequest::wasm(hello.clone())))))
    });
    g.bench_function("json_abi_echo_cached", |b| {
        b.iter(|| run(&wasm, ExecRequest::wasm(echo.clone()).input(json!({"x": 1}))))
    });

    let items = json!({"items": (0..100).collect::<Vec<i32>>()});
    g.bench_function("json_abi_c_transform_100_numbers", |b| {
        b.iter(|| run(&wasm, ExecRequest::wasm(TRANSFORM).input(items.clone())))
    });
    let text = "a line of text for the guest to echo\n".repeat(28); // ~1 KiB
    g.bench_function("wasi_command_stdin_roundtrip_1kib", |b| {
        b.iter(|| run(&wasm, ExecRequest::wasm(TOOL).arg("cat").stdin(text.clone())))
    });

    // Fuel metering on a tight loop (10 M iterations).
    let unmetered = WasmGuest::new(WasmGuestConfig::default().consume_fuel(false)).unwrap();
    let count_loop = binary(COUNT_LOOP);
    g.sample_size(20);
    g.bench_function("loop_10m_fuel_on", |b| {
        b.iter(|| run(&wasm, ExecRequest::wasm(count_loop.clone()).policy(SandboxPolicy::strict().fuel(u64::MAX / 4))))
    });
    g.bench_function("loop_10m_fuel_off", |b| b.iter(|| run(&unmetered, ExecRequest::wasm(count_loop.clone()))));
    g.finish();
}

/// The cheapest instantiate+call wasmtime allows: pooled `InstancePre`, a
/// store with fuel and an epoch deadline, the echo guest's `run`.
struct Floor {
    engine: Engine,
    pre: wasmtime::InstancePre<()>,
}

fn raw_floor() -> Floor {
    let mut config = Config::new();
    config.consume_fuel(true).epoch_interruption(true);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(8).total_memories(8).total_tables(8).max_memory_size(1 << 30);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    let engine = Engine::new(&config).unwrap();
    let module = Module::new(&engine, ECHO).unwrap();
    let pre = Linker::new(&engine).instantiate_pre(&module).unwrap();
    Floor { engine, pre }
}

impl Floor {
    fn call(&self) -> i64 {
        let mut store = Store::new(&self.engine, ());
        store.set_fuel(u64::MAX).unwrap();
        store.set_epoch_deadline(1 << 40);
        let instance = self.pre.instantiate(&mut store).unwrap();
        let run: TypedFunc<(i32, i32), i64> = instance.get_typed_func(&mut store, "run").unwrap();
        run.call(&mut store, (1024, 7)).unwrap()
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
