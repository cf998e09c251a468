//! What a workspace costs: the same Python run with and without one, in
//! python-wasm (a workspace run starts a fresh instance: compared with a
//! fresh run and with the warm pool's) and in a one-shot container; a
//! workspace's create and drop (mount and unmount); a 1 MiB file written
//! by python-wasm and read by a container run in the same workspace; a
//! python-wasm run in a workspace of 1,000 files (the walk that hands what
//! it made to the code's user).
//!
//! `cargo bench --bench workspace`. Skipped, with a message, where this
//! process cannot mount a workspace (not root), the interpreters or a
//! container engine are missing.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::backends::{Container, InterpreterConfig, WasmInterpreter};
use execbox::{Access, Backend, ExecRequest, Executor, Language, Outcome, SandboxPolicy, Workspace, WorkspaceConfig};

fn python(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Python, code).policy(SandboxPolicy::strict())
}

fn ok(backend: &dyn Backend, request: ExecRequest) {
    let r = Executor::run_on(backend, request).expect("runs");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    black_box(r);
}

fn bench(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("tempdir");
    let config = || WorkspaceConfig::default().root(root.path()).quota_bytes(64 << 20);
    let ws = match Workspace::create(config()) {
        Ok(ws) => ws,
        Err(e) => {
            eprintln!("skipping the workspace bench: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("workspace");
    g.sample_size(20).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(2));

    g.bench_function("create_and_drop", |b| b.iter(|| drop(black_box(Workspace::create(config()).unwrap()))));
    // The host's write of 1 MiB (renamed into place, recorded with its sha256 in the metadata).
    let mib = vec![7u8; 1 << 20];
    g.bench_function("host_write_one_mib", |b| b.iter(|| ws.write("one.bin", black_box(&mib)).unwrap()));

    let wasm = WasmInterpreter::new(InterpreterConfig::default()).expect("engine");
    let wasm = match wasm.availability() {
        Ok(()) => {
            wasm.warm_up().expect("the interpreter loads");
            Some(wasm)
        }
        Err(reason) => {
            eprintln!("skipping python-wasm: {reason}");
            None
        }
    };
    if let Some(wasm) = &wasm {
        let code = "print(1 + 1)";
        // What a run gets without a workspace (the warm pool when it has an
        // instance ready; back to back it often has not).
        g.bench_function("python_wasm_default", |b| b.iter(|| ok(wasm, python(code))));
        // An environment value is fixed at an instance's start: always fresh.
        let env = SandboxPolicy::strict().environment(Access::Allow(vec!["X".into()]));
        g.bench_function("python_wasm_fresh", |b| b.iter(|| ok(wasm, python(code).policy(env.clone()).env("X", "1"))));
        g.bench_function("python_wasm_in_workspace", |b| b.iter(|| ok(wasm, python(code).workspace(&ws))));
        // What the walk that hands a wasm run's files to the code's user
        // costs in a workspace holding 1,000 files in 10 directories.
        let full = Workspace::create(config()).unwrap();
        for i in 0..1000 {
            full.write(&format!("d{}/f{i}.txt", i % 10), b"x").unwrap();
        }
        g.bench_function("python_wasm_in_workspace_of_1000_files", |b| {
            b.iter(|| ok(wasm, python(code).workspace(&full)))
        });
    }

    let container = Container::default();
    let container = match container.availability() {
        Ok(()) => Some(container),
        Err(reason) => {
            eprintln!("skipping the container: {reason}");
            None
        }
    };
    if let Some(container) = &container {
        g.bench_function("container_print", |b| b.iter(|| ok(container, python("print(1 + 1)"))));
        g.bench_function("container_print_in_workspace", |b| {
            b.iter(|| ok(container, python("print(1 + 1)").workspace(&ws)))
        });
    }
    if let (Some(wasm), Some(container)) = (&wasm, &container) {
        let write = "open('/work/mib.bin', 'wb').write(b'x' * (1 << 20))";
        let read = "print(len(open('/work/mib.bin', 'rb').read()))";
        g.bench_function("one_mib_python_wasm_to_container", |b| {
            b.iter(|| {
                ok(wasm, python(write).workspace(&ws));
                ok(container, python(read).workspace(&ws));
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
