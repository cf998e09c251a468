//! `execbox serve` in front of an agent: an MCP `run_code` round trip over
//! stdio (rmcp's client, the release `execbox` binary as the server) against
//! the same run through the library (blocking, and awaited on a task of an
//! execbox runtime as the server awaits it), for a JS transform back to
//! back, and paced like an agent loop for a pooled Python `print(1+1)` and a
//! JS `return 2`. The server's share is `mcp_stdio_paced` minus
//! `library_async_paced`.
//!
//! Beside them, `serve_http`: an MCP `ping` over streamable HTTP with the
//! DNS-rebinding check (`Host`, `Origin`) and without it.
//!
//! `cargo bench --bench serve` (it builds the `execbox` binary it talks to).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::{BackendsConfig, ExecRequest, Executor, Language, SandboxPolicy};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

const JS: &str = "return input.items.map(x => x * 2)";

fn execbox_binary() -> std::path::PathBuf {
    // target/release/deps/serve-... -> target/release/execbox
    let exe = std::env::current_exe().expect("bench binary");
    exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("execbox")
}

fn arguments(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

fn bench(c: &mut Criterion) {
    let binary = execbox_binary();
    if !binary.exists() {
        eprintln!("skipping: {} is missing (cargo build --release)", binary.display());
        return;
    }
    // An execbox runtime, as the server's: a run awaited on one of its tasks
    // talks to a JS worker on the task, with no blocking-pool hand-off.
    let runtime = execbox::runtime_builder().worker_threads(2).build().unwrap();
    let client = runtime.block_on(async {
        let mut command = tokio::process::Command::new(&binary);
        command.arg("serve");
        let transport = TokioChildProcess::new(command).expect("spawn execbox serve");
        ().serve(transport).await.expect("MCP handshake")
    });
    let call = |args: Value| {
        let peer = client.peer().clone();
        runtime.block_on(async move {
            peer.call_tool(CallToolRequestParams::new("run_code").with_arguments(arguments(args))).await.unwrap()
        })
    };
    // Let the server's pools fill.
    std::thread::sleep(Duration::from_secs(3));
    let input = json!({"items": (0..100).collect::<Vec<i64>>()});

    let exec = Executor::builder().default_backends(&BackendsConfig::default()).unwrap().build();
    exec.prepare_all();
    std::thread::sleep(Duration::from_secs(3));

    let mut g = c.benchmark_group("serve");
    g.sample_size(30).measurement_time(Duration::from_secs(6)).warm_up_time(Duration::from_secs(1));
    g.bench_function("js_transform/mcp_stdio", |b| {
        b.iter(|| {
            let r = call(json!({"language": "javascript", "code": JS, "input": input}));
            assert_eq!(r.is_error, Some(false));
            black_box(r)
        })
    });
    g.bench_function("js_transform/library", |b| {
        b.iter(|| {
            let request = ExecRequest::javascript(JS).input(input.clone()).policy(SandboxPolicy::strict());
            black_box(exec.execute_blocking(request).unwrap())
        })
    });
    // Paced like an agent loop: the warm pool refills between turns (200 ms,
    // untimed; at 100 ms a CPython start-up at lowered priority on a busy
    // 2-CPU VM sometimes missed the turn, and the median measured the pool's
    // refill rate instead of the hop). `run` makes one call and gives its output.
    let paced = |b: &mut criterion::Bencher, run: &dyn Fn() -> Value| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                std::thread::sleep(Duration::from_millis(200));
                let started = std::time::Instant::now();
                let output = run();
                total += started.elapsed();
                assert_eq!(output, json!(2));
            }
            total
        })
    };
    // Awaited on a task of the runtime, as the server awaits a call.
    let awaited = |request: ExecRequest| {
        let exec = exec.clone();
        let run = runtime.spawn(async move { exec.execute(request).await.unwrap() });
        runtime.block_on(run).unwrap().output.unwrap_or_default()
    };
    let print = || ExecRequest::source(Language::Python, "print(1+1)").policy(SandboxPolicy::strict());
    g.sample_size(20).measurement_time(Duration::from_secs(6));
    g.bench_function("python_print/mcp_stdio_paced", |b| {
        paced(b, &|| {
            let r = call(json!({"language": "python", "code": "print(1+1)"}));
            r.structured_content.as_ref().unwrap()["output"].clone()
        })
    });
    g.bench_function("python_print/library_paced", |b| {
        paced(b, &|| exec.execute_blocking(print()).unwrap().output.unwrap_or_default())
    });
    // The same awaited on a task, as the server awaits it.
    g.bench_function("python_print/library_async_paced", |b| paced(b, &|| awaited(print())));
    g.bench_function("js_return/mcp_stdio_paced", |b| {
        paced(b, &|| {
            let r = call(json!({"language": "javascript", "code": "return 2"}));
            r.structured_content.as_ref().unwrap()["output"].clone()
        })
    });
    let ret = || ExecRequest::javascript("return 2").policy(SandboxPolicy::strict());
    g.bench_function("js_return/library_async_paced", |b| paced(b, &|| awaited(ret())));
    g.bench_function("js_return/library_paced", |b| {
        paced(b, &|| exec.execute_blocking(ret()).unwrap().output.unwrap_or_default())
    });
    g.finish();
    drop(runtime.block_on(client.cancel()));
}

/// A keep-alive HTTP/1.1 client of one MCP session, just enough for the
/// benches: a POST, then its response read whole (chunked or not).
struct Http {
    stream: std::io::BufReader<std::net::TcpStream>,
    port: u16,
    session: Option<String>,
}

impl Http {
    fn connect(port: u16) -> Self {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_nodelay(true).unwrap();
        Self { stream: std::io::BufReader::new(stream), port, session: None }
    }

    /// POSTs `body` to /mcp and returns the response's body.
    fn post(&mut self, body: &Value) -> String {
        use std::io::{BufRead, Read, Write};
        let body = body.to_string();
        let session = self.session.as_ref().map(|s| format!("mcp-session-id: {s}\r\n")).unwrap_or_default();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{}\r\nauthorization: Bearer bench-token-0123456789\r\n\
             content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
             mcp-protocol-version: 2025-06-18\r\n{session}content-length: {}\r\n\r\n{body}",
            self.port,
            body.len()
        );
        self.stream.get_mut().write_all(request.as_bytes()).unwrap();
        let (mut chunked, mut length) = (false, 0usize);
        loop {
            let mut line = String::new();
            self.stream.read_line(&mut line).unwrap();
            let lower = line.to_ascii_lowercase();
            if line == "\r\n" {
                break;
            } else if lower.starts_with("transfer-encoding: chunked") {
                chunked = true;
            } else if let Some(n) = lower.strip_prefix("content-length: ") {
                length = n.trim().parse().unwrap();
            } else if let Some(id) = lower.strip_prefix("mcp-session-id: ") {
                self.session = Some(line[line.len() - id.len()..].trim().to_string());
            }
        }
        let mut out = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                self.stream.read_line(&mut size).unwrap();
                let n = usize::from_str_radix(size.trim(), 16).unwrap();
                let mut chunk = vec![0u8; n + 2];
                self.stream.read_exact(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&chunk[..n]);
            }
        } else {
            out.resize(length, 0);
            self.stream.read_exact(&mut out).unwrap();
        }
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// `execbox serve --http` with a token and `extra` flags: the server and its port.
fn http_server(binary: &std::path::Path, token: &std::path::Path, extra: &[&str]) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut server = std::process::Command::new(binary)
        .args(["serve", "--http", "127.0.0.1:0", "--token-file", token.to_str().unwrap()])
        .args(extra)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn execbox serve --http");
    let mut stderr = std::io::BufReader::new(server.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let port = banner.trim().trim_end_matches("/mcp").rsplit(':').next().unwrap().parse().unwrap();
    (server, port)
}

/// The DNS-rebinding check's cost per HTTP request: an MCP `ping` over
/// streamable HTTP to a server that checks `Host` and `Origin` (the
/// default) and to one that checks neither (`--allowed-host '*'
/// --allowed-origin '*'`, which needs a token: both get one).
fn http(c: &mut Criterion) {
    let binary = execbox_binary();
    if !binary.exists() {
        eprintln!("skipping: {} is missing (cargo build --release)", binary.display());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "bench-token-0123456789").unwrap();
    let mut g = c.benchmark_group("serve_http");
    g.sample_size(40).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    for (name, extra) in [
        ("ping/host_and_origin_checked", &[][..]),
        ("ping/unchecked", &["--allowed-host", "*", "--allowed-origin", "*"][..]),
    ] {
        let (mut server, port) = http_server(&binary, &token, extra);
        let mut client = Http::connect(port);
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
            "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
        assert!(client.post(&init).contains("\"result\""));
        client.post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        assert!(client.post(&ping).contains("\"result\""));
        g.bench_function(name, |b| b.iter(|| black_box(client.post(&ping))));
        drop(server.kill());
        drop(server.wait());
    }
    g.finish();
}

criterion_group!(benches, bench, http);
criterion_main!(benches);
