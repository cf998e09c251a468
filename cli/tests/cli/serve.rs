//! `execbox serve` through a real MCP client (rmcp's, over the server's
//! stdio): the tool contract, the policy ceiling no call can widen, load
//! (busy, floods), sessions per connection, graceful shutdown.
#![cfg(all(feature = "serve", feature = "js"))]

use crate::common;

use std::time::{Duration, Instant};

use common::wait::{wait_until, wait_until_async};
use common::{process, procfs};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, NumberOrString, ProgressNotificationParam, ProgressToken, RequestMetaObject,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};

/// The tests' client: it does nothing but take note of the server's
/// progress notifications (sent while a call that asked for them runs).
#[derive(Default)]
struct Watcher {
    progressed: tokio::sync::Notify,
}

impl ClientHandler for Watcher {
    fn on_progress(
        &self,
        _: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.progressed.notify_one();
        std::future::ready(())
    }
}

type Client = RunningService<RoleClient, Watcher>;

/// `run_code` with `arguments`, asking for progress notifications: the
/// server sends one a second while the run goes on.
fn run_code_with_progress(arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
    let mut params = CallToolRequestParams::new("run_code").with_arguments(arguments);
    params.meta = Some(RequestMetaObject::with_progress_token(ProgressToken(NumberOrString::Number(1))));
    params
}

/// Waits until a call of `client`'s that asked for progress has run for a
/// second (its first progress notification): it is in flight.
async fn running(client: &Client) {
    let first = client.service().progressed.notified();
    tokio::time::timeout(Duration::from_secs(60), first).await.expect("a progress notification");
}

/// A server started with `args`, its pid, and a client connected to it.
async fn connect(args: &[&str]) -> (Client, u32) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_execbox"));
    command.arg("serve").args(args);
    let transport = TokioChildProcess::new(command).expect("spawn execbox serve");
    let pid = transport.id().expect("pid");
    let client = Watcher::default().serve(transport).await.expect("MCP handshake");
    (client, pid)
}

async fn call(client: &Client, tool: &'static str, arguments: Value) -> Result<CallToolResult, ServiceError> {
    let Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
    client.peer().call_tool(CallToolRequestParams::new(tool).with_arguments(arguments)).await
}

/// A successful call's `structuredContent` and `isError`.
async fn run(client: &Client, arguments: Value) -> (Value, bool) {
    let result = call(client, "run_code", arguments).await.expect("a tool result");
    (result.structured_content.expect("structuredContent"), result.is_error == Some(true))
}

fn policy_file(policy: Value) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), policy.to_string()).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread")]
async fn results_are_the_cli_json_programs_that_ran_are_answers_and_refusals_are_tool_errors() {
    let (client, _) = connect(&[]).await;
    let (ok, is_error) =
        run(&client, json!({"language": "javascript", "code": "return input.a + 1", "input": {"a": 41}})).await;
    assert!(!is_error);
    // Exactly the keys of `execbox run --json`, the outcome first.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_execbox"))
        .args(["run", "--code", "return 1", "--json"])
        .output()
        .unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&ok), keys(&cli));
    assert_eq!(keys(&ok)[0], "outcome");
    assert_eq!((ok["outcome"].as_str(), ok["output"].as_i64()), (Some("ok"), Some(42)));

    // Two failing programs in a row are two answers, not two failed tool
    // calls: an agent framework's retry budget is not spent on them.
    let text = |r: &CallToolResult| r.content[0].as_text().map(|t| t.text.clone()).unwrap_or_default();
    for (code, outcome) in [("while (true) {}", "timed_out"), ("throw new Error('boom')", "failed")] {
        let result =
            call(&client, "run_code", json!({"language": "js", "code": code, "timeout_ms": 100})).await.unwrap();
        assert_eq!(result.is_error, Some(false), "{code}: {result:?}");
        assert_eq!(result.structured_content.as_ref().unwrap()["outcome"], outcome);
        assert!(text(&result).starts_with(&format!("outcome: {outcome}")), "{}", text(&result));
    }
    // An output schema: a mismatch is an answer that names each failing place.
    let schema = json!({"type": "array", "items": {"type": "integer"}});
    let (bad, is_error) =
        run(&client, json!({"language": "js", "code": "return [1, 'x', 3, 'y']", "output_schema": schema})).await;
    assert!(!is_error, "{bad}");
    assert_eq!(bad["outcome"], "invalid_output", "{bad}");
    assert_eq!(bad["output"], json!([1, "x", 3, "y"]), "what it gave is kept");
    let paths: Vec<&str> =
        bad["output_errors"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["/1", "/3"], "{bad}");
    let (good, _) = run(&client, json!({"language": "js", "code": "return [1, 2]", "output_schema": schema})).await;
    assert_eq!(good["outcome"], "ok", "{good}");
    // A schema execbox will not compile is the caller's mistake: a tool error.
    let (r, is_error) =
        run(&client, json!({"language": "js", "code": "return 1", "output_schema": {"$ref": "https://x/s.json"}}))
            .await;
    assert!(is_error && r["error"]["kind"] == "invalid_arguments", "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("output_schema"), "{r}");

    let request = json!({"language": "shell", "code": "echo", "backend": "boa-js"});
    let (refused, is_error) = run(&client, request.clone()).await;
    assert!(is_error);
    assert_eq!(refused["error"]["kind"], "refused", "{refused}");
    assert_eq!(refused["error"]["violations"][0]["control"], "language");
    let said = text(&call(&client, "run_code", request).await.unwrap());
    assert!(said.starts_with("refused: ") && !said.contains("refused: refused"), "{said}");

    // Malformed arguments are tool errors a model can read (SEP-1303), naming what is wrong.
    for (bad, named) in [
        (json!({"language": "cobol", "code": "1"}), "cobol"),
        (json!({"code": "1"}), "language"),
        (json!({"language": "js", "code": "1", "timeout_ms": 0}), "timeout_ms"),
        (json!({"language": "js", "code": "1", "files": [{"name": "a", "content_base64": "%%%"}]}), "content_base64"),
    ] {
        let (r, is_error) = run(&client, bad.clone()).await;
        assert!(is_error, "{bad}: {r}");
        assert_eq!(r["error"]["kind"], "invalid_arguments", "{bad}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(named), "{bad}: {r}");
    }
    // Only a call that names no tool of this server is a JSON-RPC error.
    match call(&client, "no_such_tool", json!({})).await {
        Err(ServiceError::McpError(e)) => assert_eq!(e.code.0, -32602, "{e:?}"),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    client.cancel().await.unwrap();
}

/// `--failures-as-errors` brings back the old contract: a program's
/// failure is a failed tool call.
#[tokio::test(flavor = "multi_thread")]
async fn failures_as_errors_makes_a_programs_failure_a_tool_error() {
    let (client, _) = connect(&["--failures-as-errors"]).await;
    let (failed, is_error) = run(&client, json!({"language": "js", "code": "throw new Error('x')"})).await;
    assert!(is_error && failed["outcome"] == "failed", "{failed}");
    let (ok, is_error) = run(&client, json!({"language": "js", "code": "return 1"})).await;
    assert!(!is_error && ok["outcome"] == "ok", "{ok}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_cannot_widen_any_control() {
    let ceiling = policy_file(json!({"timeout_ms": 1500, "memory_bytes": 64 << 20, "max_stdout_bytes": 64}));
    let (client, _) = connect(&["--policy", ceiling.path().to_str().unwrap()]).await;
    // A longer deadline is held to the ceiling's.
    let started = Instant::now();
    let (r, _) = run(&client, json!({"language": "js", "code": "while (true) {}", "timeout_ms": 600_000})).await;
    assert_eq!(r["outcome"], "timed_out");
    assert!(r["message"].as_str().unwrap().contains("1500 ms"), "{r}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // A larger memory cap is held to the ceiling's 64 MiB.
    let bomb = "let s = 'x'; while (true) s = s + s;";
    let (r, _) = run(&client, json!({"language": "js", "code": bomb, "memory_mb": 1_000_000})).await;
    assert_eq!(r["outcome"], "out_of_memory", "{r}");
    // The output cap holds.
    let (r, _) = run(&client, json!({"language": "js", "code": "console.log('x'.repeat(1000))"})).await;
    assert_eq!((r["stdout_truncated"].as_bool(), r["stdout"].as_str().map(str::len)), (Some(true), Some(64)));
    // No argument names a grant: each is an invalid-arguments tool error, nothing runs.
    for (name, value) in [
        ("policy", json!({"network": {"mode": "not_asked"}})),
        ("env", json!({"HOME": "/root"})),
        ("preopen", json!(["/:/host:rw"])),
        ("network", json!("allow")),
        ("filesystem", json!({"mode": "allow"})),
        ("engine", json!("docker")),
        ("fuel", json!(1)),
    ] {
        let mut args = json!({"language": "js", "code": "return 1"});
        args[name] = value;
        let (r, is_error) = run(&client, args).await;
        assert!(is_error && r["error"]["kind"] == "invalid_arguments", "{name}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(name), "{name}: {r}");
    }
    // Python sees no host environment.
    let (r, _) =
        run(&client, json!({"language": "python", "code": "import os, json\nprint(json.dumps(sorted(os.environ)))"}))
            .await;
    let names: Vec<String> = serde_json::from_value(r["output"].clone()).unwrap_or_default();
    assert!(!names.iter().any(|n| n == "HOME" || n == "PATH" || n.starts_with("CARGO")), "{names:?}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn excess_calls_get_busy_and_a_flood_leaves_the_server_serving() {
    let (client, pid) = connect(&["--max-concurrent", "1", "--max-queued", "2"]).await;
    let rss = || procfs::rss_kb(pid);
    run(&client, json!({"language": "js", "code": "return 1"})).await;
    let before = rss();
    let peer = client.peer().clone();
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let peer = peer.clone();
            tokio::spawn(async move {
                let code = if i % 50 == 0 {
                    "let t = Date.now(); while (Date.now() - t < 300) {} return 0"
                } else {
                    "return 1"
                };
                let Value::Object(args) = json!({"language": "js", "code": code, "timeout_ms": 2000}) else {
                    unreachable!()
                };
                peer.call_tool(CallToolRequestParams::new("run_code").with_arguments(args)).await
            })
        })
        .collect();
    let (mut ok, mut busy) = (0, 0);
    for c in calls {
        let r = c.await.unwrap().expect("every call is answered");
        let body = r.structured_content.unwrap();
        if body["outcome"] == "ok" {
            ok += 1;
        } else {
            assert_eq!(body["error"]["kind"], "busy", "{body}");
            busy += 1;
        }
    }
    assert!(ok >= 1 && busy >= 1, "ok {ok}, busy {busy}");
    // Still serving, and memory did not grow with the flood.
    let (r, _) = run(&client, json!({"language": "js", "code": "return 2"})).await;
    assert_eq!(r["output"], 2);
    assert!(rss() < before + 64 * 1024, "RSS {} kB -> {} kB", before, rss());
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_bounded_and_belong_to_their_connection() {
    let (a, pid) = connect(&["--max-sessions", "2", "--session-idle-secs", "600"]).await;
    let open = |client: &Client| {
        let peer = client.peer().clone();
        async move {
            let Value::Object(args) = json!({"language": "javascript"}) else { unreachable!() };
            peer.call_tool(CallToolRequestParams::new("create_session").with_arguments(args)).await.unwrap()
        }
    };
    let created = open(&a).await.structured_content.unwrap();
    let id = created["session_id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 32, "random ids: {id}");
    let (r, _) = run(&a, json!({"language": "js", "code": "var n = 41", "session_id": id})).await;
    assert_eq!(r["outcome"], "ok");
    let (r, _) = run(&a, json!({"language": "js", "code": "++n", "session_id": id})).await;
    assert_eq!(r["output"], 42);
    // Stateless runs do not see it.
    let (r, _) = run(&a, json!({"language": "js", "code": "return typeof n"})).await;
    assert_eq!(r["output"], "undefined");
    // A wrong language is refused, typed.
    let (r, is_error) = run(&a, json!({"language": "python", "code": "1", "session_id": id})).await;
    assert!(is_error && r["error"]["kind"] == "wrong_language", "{r}");
    // The bound holds.
    let second = open(&a).await.structured_content.unwrap();
    let third = open(&a).await.structured_content.unwrap();
    assert_eq!(third["error"]["kind"], "too_many_sessions", "{third}");
    // A timed-out cell ends the session: reported as lost, once, never silently reset.
    let sid2 = second["session_id"].as_str().unwrap();
    let (r, _) = run(
        &a,
        json!({"language": "js", "code": "[1].map(() => { while (true) {} })", "session_id": sid2, "timeout_ms": 200}),
    )
    .await;
    assert_eq!(r["outcome"], "timed_out");
    let (r, _) = run(&a, json!({"language": "js", "code": "1", "session_id": sid2})).await;
    assert_eq!(r["error"]["kind"], "session_lost", "{r}");

    // (Ids belong to their connection: see the HTTP test, where two
    // connections share one server.) Closing a session ends its worker.
    let before = procfs::live_children(pid);
    let closed = call(&a, "close_session", json!({"session_id": id})).await.unwrap().structured_content.unwrap();
    assert_eq!(closed["closed"], true);
    let ended = || before.iter().any(|child| !procfs::live_children(pid).contains(child));
    tokio::task::block_in_place(|| process::wait_any_exit(&before, Duration::from_secs(5)));
    assert!(ended(), "closing the session ended its worker");
    a.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn http_sessions_are_isolated_per_connection_and_need_the_token() {
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "a-long-enough-test-token\n").unwrap();
    let workspaces = tempfile::tempdir().unwrap();
    let (mut server, port) = http_server(&[
        "--token-file",
        token.path().to_str().unwrap(),
        "--workspace-root",
        workspaces.path().to_str().unwrap(),
        "--replica",
        "replica-a",
    ]);
    let server = &mut server.0;
    // Raw JSON-RPC over HTTP (the Python SDK test covers a full client).
    let post = |auth: Option<&str>, session: Option<&str>, body: Value| {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-s", "-i", "-X", "POST", &format!("http://127.0.0.1:{port}/mcp")])
            .args(["-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream"])
            .args(["-H", "mcp-protocol-version: 2025-06-18", "--data", &body.to_string()]);
        if let Some(auth) = auth {
            cmd.args(["-H", &format!("authorization: Bearer {auth}")]);
        }
        if let Some(session) = session {
            cmd.args(["-H", &format!("mcp-session-id: {session}")]);
        }
        String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    assert!(post(None, None, init.clone()).starts_with("HTTP/1.1 401"));
    assert!(post(Some("wrong-token"), None, init.clone()).starts_with("HTTP/1.1 401"));
    let connect_http = || {
        let head = post(Some("a-long-enough-test-token"), None, init.clone());
        let session = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id: ").map(|s| s.trim().to_string()))
            .unwrap_or_else(|| panic!("no session header: {head}"));
        post(
            Some("a-long-enough-test-token"),
            Some(&session),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        session
    };
    let tool = |session: &str, name: &str, arguments: Value| {
        let reply = post(
            Some("a-long-enough-test-token"),
            Some(session),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": arguments}}),
        );
        // An SSE stream: the answer is the event whose data is a JSON-RPC response.
        let answer = reply
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|v| v.get("result").is_some())
            .unwrap_or_else(|| panic!("{reply}"));
        answer["result"]["structuredContent"].clone()
    };
    let (one, two) = (connect_http(), connect_http());
    let opened = tool(&one, "create_session", json!({"language": "js"}));
    // Which replica holds it (--replica): another one would not know it.
    assert_eq!(opened["replica"], "replica-a", "{opened}");
    let sid = opened["session_id"].as_str().unwrap().to_string();
    assert_eq!(
        tool(&one, "run_code", json!({"language": "js", "code": "var s = 'mine'", "session_id": sid}))["outcome"],
        "ok"
    );
    let stolen = tool(&two, "run_code", json!({"language": "js", "code": "s", "session_id": sid}));
    assert_eq!(stolen["error"]["kind"], "unknown_session", "{stolen}");
    assert_eq!(stolen["error"]["replica"], "replica-a", "{stolen}");
    assert!(stolen["error"]["message"].as_str().unwrap().contains("replica replica-a answered"), "{stolen}");
    // So is a workspace id this replica does not hold, wherever it is named.
    for (name, arguments) in [
        ("run_code", json!({"language": "js", "code": "1", "workspace_id": "nope"})),
        ("create_session", json!({"language": "js", "workspace_id": "nope"})),
        ("describe_workspace", json!({"workspace_id": "nope"})),
    ] {
        let refused = tool(&one, name, arguments);
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("no workspace nope") && message.contains("replica replica-a"), "{name}: {refused}");
    }
    assert_eq!(tool(&one, "run_code", json!({"language": "js", "code": "s", "session_id": sid}))["output"], "mine");
    // So are workspaces (mounting one needs root): another connection of the
    // same server cannot reach one by its id.
    if rustix::process::geteuid().is_root() {
        let ws = tool(&one, "create_workspace", json!({}))["workspace_id"].as_str().unwrap().to_string();
        let files = json!([{"path": "mine.txt", "content_base64": "bWluZQ=="}]);
        assert_eq!(tool(&one, "write_files", json!({"workspace_id": ws, "files": files}))["written"], 1);
        for (name, arguments) in [
            ("read_files", json!({"workspace_id": ws, "globs": ["**"]})),
            ("write_files", json!({"workspace_id": ws, "files": []})),
            ("run_code", json!({"language": "python", "code": "print(1)", "workspace_id": ws})),
            ("close_workspace", json!({"workspace_id": ws})),
        ] {
            let theirs = tool(&two, name, arguments);
            assert!(theirs.to_string().contains("no workspace") || theirs["closed"] == false, "{name}: {theirs}");
        }
        let mine = tool(&one, "read_files", json!({"workspace_id": ws, "globs": ["*.txt"]}));
        assert_eq!(mine["files"][0]["content_base64"], "bWluZQ==", "{mine}");
    }
    // Closing an MCP session: 204 (clients expect 200 or 204; rmcp says 202),
    // and the session is gone.
    let delete = std::process::Command::new("curl")
        .args(["-s", "-i", "-X", "DELETE", &format!("http://127.0.0.1:{port}/mcp")])
        .args(["-H", "authorization: Bearer a-long-enough-test-token", "-H", &format!("mcp-session-id: {two}")])
        .args(["-H", "mcp-protocol-version: 2025-06-18"])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&delete.stdout).into_owned();
    assert!(head.starts_with("HTTP/1.1 204"), "{head}");
    let after =
        post(Some("a-long-enough-test-token"), Some(&two), json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}));
    assert!(after.starts_with("HTTP/1.1 404"), "{after}");
    // Still the 404 the specification asks for, now with a JSON-RPC error
    // that names the cause and the replica that answered.
    let body: Value = serde_json::from_str(after.split("\r\n\r\n").nth(1).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {after}"));
    assert_eq!(body["error"]["data"], json!({"kind": "unknown_session", "replica": "replica-a"}), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("replica replica-a answered"), "{body}");
    // Under /mcp/ too (rmcp's own answer there is plain text).
    let under = std::process::Command::new("curl")
        .args(["-s", "-i", "-X", "POST", &format!("http://127.0.0.1:{port}/mcp/x")])
        .args(["-H", "authorization: Bearer a-long-enough-test-token", "-H", &format!("mcp-session-id: {two}")])
        .args(["-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream"])
        .args(["--data", r#"{"jsonrpc": "2.0", "id": 4, "method": "tools/list"}"#])
        .output()
        .unwrap();
    let under = String::from_utf8_lossy(&under.stdout).into_owned();
    assert!(under.starts_with("HTTP/1.1 404") && under.contains("\"unknown_session\""), "{under}");
    // MCP sessions are bounded: past the cap, another initialize gets 503.
    let refused =
        (0..300).any(|_| post(Some("a-long-enough-test-token"), None, init.clone()).starts_with("HTTP/1.1 503"));
    assert!(refused, "300 MCP sessions were all accepted");
    // A session id that is not UTF-8 is none to rmcp: such an initialize
    // opens a session, so it is held to the bound too.
    let not_utf8 = {
        use std::os::unix::ffi::OsStrExt as _;
        std::ffi::OsStr::from_bytes(b"mcp-session-id: \xff").to_os_string()
    };
    let past_the_bound = std::process::Command::new("curl")
        .args(["-s", "-i", "-X", "POST", &format!("http://127.0.0.1:{port}/mcp")])
        .args(["-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream"])
        .args(["-H", "authorization: Bearer a-long-enough-test-token", "-H"])
        .arg(not_utf8)
        .args(["--data", &init.to_string()])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&past_the_bound.stdout).into_owned();
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    send_signal(server.id(), "TERM");
    let status = server.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

/// `execbox serve --http 127.0.0.1:0 args`, its bound port and its stderr banner read.
pub(crate) fn http_server(args: &[&str]) -> (KillOnDrop, u16) {
    use std::io::BufRead;
    let mut server = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_execbox"))
            .args(["serve", "--http", "127.0.0.1:0"])
            .args(args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut banner = String::new();
    let mut stderr = std::io::BufReader::new(server.0.stderr.take().unwrap());
    stderr.read_line(&mut banner).unwrap();
    // The rest of the log is drained, so a warning never meets a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let port = banner
        .trim()
        .strip_suffix("/mcp")
        .and_then(|s| s.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {banner:?}"));
    (server, port)
}

/// A POST to the server at `port` with these extra headers: the status
/// line and the whole answer.
fn post_with(port: u16, headers: &[String], body: &Value) -> (String, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-i", "-X", "POST", &format!("http://127.0.0.1:{port}/mcp")])
        .args(["-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream"])
        .args(["-H", "mcp-protocol-version: 2025-06-18"])
        .args(headers.iter().flat_map(|h| ["-H", h.as_str()]))
        .args(["--data", &body.to_string()])
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout).into_owned();
    (answer.lines().next().unwrap_or_default().trim().to_string(), answer)
}

/// An orchestrator's probes: `/healthz` and `/readyz` answer without the
/// token (which `/mcp` still needs), and readiness names the available
/// backends.
#[test]
fn health_and_readiness_answer_probes_without_the_token() {
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "a-long-enough-test-token\n").unwrap();
    let (server, port) = http_server(&["--token-file", token.path().to_str().unwrap()]);
    let get = |path: &str| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-i", &format!("http://127.0.0.1:{port}{path}")])
            .output()
            .unwrap();
        let answer = String::from_utf8_lossy(&out.stdout).into_owned();
        (answer.lines().next().unwrap_or_default().trim().to_string(), answer)
    };
    let (status, answer) = get("/healthz");
    assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
    assert!(answer.ends_with("ok\n"), "{answer}");
    let (status, answer) = get("/readyz");
    assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");
    let body: Value = serde_json::from_str(answer.rsplit("\r\n\r\n").next().unwrap()).unwrap();
    assert_eq!(body["ready"], true);
    assert!(body["available"].as_array().unwrap().iter().any(|b| b == "boa-js"), "{body}");
    let (status, answer) = post_with(port, &[], &json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
    assert_eq!(status, "HTTP/1.1 401 Unauthorized", "{answer}");
    drop(server);
}

/// DNS rebinding: a page that points its own name at 127.0.0.1 sends its
/// name in `Host` and its origin in `Origin`. Both get 403 before anything
/// runs, with or without a token; loopback names and allowed names pass.
#[cfg(feature = "artifacts")]
#[test]
fn http_requests_naming_another_site_get_403_and_run_nothing() {
    let store = tempfile::tempdir().unwrap();
    let args = ["--artifacts", store.path().to_str().unwrap(), "--allow-tool", "artifacts.*"];
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let session_of = |answer: &str| {
        answer
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id: ").map(|s| s.trim().to_string()))
            .unwrap_or_else(|| panic!("no session header: {answer}"))
    };
    let saves = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_code",
        "arguments": {"language": "js", "code": "return (await tools.artifacts.save({name: 'pwned', content: 'x'})).version"}}});
    let saved = |dir: &std::path::Path| {
        let scopes = dir.join("scopes");
        std::fs::read_dir(scopes).map(|d| d.count()).unwrap_or(0)
    };

    let (_server, port) = http_server(&args);
    let host = |name: &str| format!("host: {name}");
    // The attacker's name in Host: refused before the handshake.
    for bad_host in ["evil.example", &format!("evil.example:{port}"), "localhost:1", &format!("127.0.0.2:{port}")] {
        let (status, answer) = post_with(port, &[host(bad_host)], &init);
        assert_eq!(status, "HTTP/1.1 403 Forbidden", "Host {bad_host}: {answer}");
    }
    // A page's Origin, with a loopback Host (a rebound name cannot send
    // one, but a page on another loopback server could send this Origin).
    for bad_origin in ["http://evil.example", &format!("http://evil.example:{port}"), "null", "file://"] {
        let (status, answer) = post_with(port, &[format!("origin: {bad_origin}")], &init);
        assert_eq!(status, "HTTP/1.1 403 Forbidden", "Origin {bad_origin}: {answer}");
    }
    // Loopback names and origins pass; so does a client that sends no Origin.
    for good in [
        vec![host(&format!("localhost:{port}"))],
        vec![host(&format!("[::1]:{port}"))],
        vec![format!("origin: http://localhost:6274")],
        vec![format!("origin: http://127.0.0.1:{port}")],
        vec![],
    ] {
        let (status, answer) = post_with(port, &good, &init);
        assert_eq!(status, "HTTP/1.1 200 OK", "{good:?}: {answer}");
    }
    // A session opened legitimately cannot be driven from a page: the call
    // is refused and its code never runs (nothing is saved).
    let session = session_of(&post_with(port, &[], &init).1);
    let sid = format!("mcp-session-id: {session}");
    post_with(port, std::slice::from_ref(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let (status, answer) = post_with(port, &[sid.clone(), "origin: http://evil.example".into()], &saves);
    assert_eq!(status, "HTTP/1.1 403 Forbidden", "{answer}");
    let (status, answer) = post_with(port, &[sid.clone(), host(&format!("evil.example:{port}"))], &saves);
    assert_eq!(status, "HTTP/1.1 403 Forbidden", "{answer}");
    assert_eq!(saved(store.path()), 0, "a refused call ran nothing");
    // The same call from the client itself runs (the check is not a wall).
    let (_, answer) = post_with(port, &[sid], &saves);
    assert!(answer.contains(r#""outcome":"ok""#), "{answer}");
    assert_eq!(saved(store.path()), 1);

    // A token does not replace the check: the right token from a page is
    // still refused.
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "a-long-enough-test-token\n").unwrap();
    let bearer = "authorization: Bearer a-long-enough-test-token".to_string();
    let (_server, port) = http_server(&["--token-file", token.path().to_str().unwrap()]);
    let (status, answer) = post_with(port, &[bearer.clone(), "origin: http://evil.example".into()], &init);
    assert_eq!(status, "HTTP/1.1 403 Forbidden", "{answer}");
    let (status, answer) = post_with(port, &[bearer.clone(), host("evil.example")], &init);
    assert_eq!(status, "HTTP/1.1 403 Forbidden", "{answer}");
    let (status, answer) = post_with(port, &[bearer], &init);
    assert_eq!(status, "HTTP/1.1 200 OK", "{answer}");

    // Names behind a proxy are allowed one by one.
    let (_server, port) =
        http_server(&["--allowed-host", "proxy.example", "--allowed-origin", "https://app.example:8443"]);
    for good in [vec![host("proxy.example")], vec![format!("origin: https://app.example:8443")]] {
        let (status, answer) = post_with(port, &good, &init);
        assert_eq!(status, "HTTP/1.1 200 OK", "{good:?}: {answer}");
    }
    let (status, _) = post_with(port, &["origin: https://app.example:9999".to_string()], &init);
    assert_eq!(status, "HTTP/1.1 403 Forbidden", "another port of an allowed origin");

    // `*` without a token would let any page in: the server refuses to start.
    for flag in ["--allowed-host", "--allowed-origin"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_execbox"))
            .args(["serve", "--http", "127.0.0.1:0", flag, "*"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} *: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("needs a token"));
    }
}

/// A replica's name goes into answers: one no Kubernetes object could have
/// (over 253 bytes, or with a control character) is refused at start.
#[test]
fn a_replica_name_no_object_could_have_is_refused_at_start() {
    for name in ["a\nb".to_string(), "x".repeat(254)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_execbox"))
            .args(["serve", "--http", "127.0.0.1:0", "--replica", &name])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--replica"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_call_in_flight_answer_then_exits_cleanly() {
    let (client, pid) = connect(&[]).await;
    let peer = client.peer().clone();
    let slow = tokio::spawn(async move {
        // Long enough to be still running a second in, at its first progress notification.
        let code = "let t = Date.now(); while (Date.now() - t < 2200) {} return 'finished'";
        peer.call_tool(run_code_with_progress(json!({"language": "js", "code": code}))).await
    });
    running(&client).await;
    send_signal(pid, "TERM");
    let answered = slow.await.unwrap().expect("the call in flight is answered");
    assert_eq!(answered.structured_content.unwrap()["output"], "finished");
    // Exited: a zombie until the transport reaps it, or gone.
    tokio::task::block_in_place(|| process::wait_exit(pid, Duration::from_secs(15)));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(state.is_empty() || state.split_whitespace().nth(2) == Some("Z"), "still running: {state}");
    let _ = client.cancel().await;
}

/// The same over streamable HTTP: the call's stream carries its result
/// before the server ends the MCP sessions (it used to end them at once,
/// and the client read "SSE stream ended" while the call finished on the
/// server).
#[test]
fn sigterm_over_http_lets_the_call_in_flight_answer_on_its_stream() {
    use std::io::BufRead;
    let (mut server, port) = http_server(&[]);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let (_, answer) = post_with(port, &[], &init);
    let session = answer
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id: ").map(|s| s.trim().to_string()))
        .unwrap_or_else(|| panic!("no session header: {answer}"));
    let sid = format!("mcp-session-id: {session}");
    post_with(port, std::slice::from_ref(&sid), &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    // Still running a second in, at its first progress notification.
    let code = "let t = Date.now(); while (Date.now() - t < 2500) {} return 'finished'";
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_code",
        "arguments": {"language": "js", "code": code}, "_meta": {"progressToken": 1}}});
    let mut curl = std::process::Command::new("curl")
        .args(["-s", "-N", "-X", "POST", &format!("http://127.0.0.1:{port}/mcp")])
        .args(["-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream"])
        .args(["-H", "mcp-protocol-version: 2025-06-18", "-H", &sid, "--data", &call.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(curl.stdout.take().unwrap()).lines();
    let progressed = lines.by_ref().map_while(Result::ok).any(|line| line.contains("notifications/progress"));
    assert!(progressed, "the call's stream ended before its first progress notification");
    send_signal(server.0.id(), "TERM");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let result = rest
        .iter()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|v| v.get("result").is_some())
        .unwrap_or_else(|| panic!("no result on the call's stream after SIGTERM: {rest:?}"));
    assert_eq!(result["result"]["structuredContent"]["output"], "finished", "{result}");
    let _ = curl.wait();
    assert_eq!(server.0.wait().unwrap().code(), Some(0));
}

/// A server process that a failed assertion does not leave running.
pub(crate) struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends a signal with the `kill` command (no unsafe in tests).
fn send_signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

/// `execbox serve args` over pipes, initialized, with its stdin and an
/// stdout nobody reads (held, so the pipe stays open and fills).
fn unread_server(args: &[&str]) -> (KillOnDrop, std::process::ChildStdin, std::process::ChildStdout) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_execbox"))
            .arg("serve")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdin = server.0.stdin.take().unwrap();
    let stdout = server.0.stdout.take().unwrap();
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    writeln!(stdin, "{init}\n{initialized}").unwrap();
    (server, stdin, stdout)
}

/// A `tools/call` of `list_backends` with JSON-RPC id `id`.
fn list_backends_call(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"list_backends","arguments":{{}}}}}}"#
    )
}

/// SIGTERM ends a server whose client reads nothing (answers it cannot
/// write do not hold the exit up).
#[test]
fn sigterm_ends_a_server_whose_client_reads_nothing() {
    use std::io::Write;
    let (mut server, mut stdin, unread) = unread_server(&[]);
    for id in 1..300 {
        if writeln!(stdin, "{}", list_backends_call(id)).is_err() {
            break;
        }
    }
    // Once its answers fill the pipe nobody reads, its writes block (nothing
    // announces that: the pipe, or a thread blocked writing it, is looked at;
    // on the reactor no thread blocks in the write). A full 64 KiB pipe
    // holds a little less than 64 KiB of multi-page answers.
    let pid = server.0.id();
    let full = || rustix::io::ioctl_fionread(&unread).is_ok_and(|unread| unread >= 48 * 1024);
    assert!(
        wait_until(Duration::from_secs(20), || full() || procfs::blocked_writing_a_pipe(pid)),
        "the server's answers never filled its stdout"
    );
    send_signal(pid, "TERM");
    process::wait_child(&mut server.0, Duration::from_secs(8));
    assert!(server.0.try_wait().unwrap().is_some(), "still running 8 s after SIGTERM");
    drop(stdin);
}

/// A client that floods requests and never reads an answer: the server's
/// memory stays bounded, it disconnects the client after 10 s of blocked
/// writes, and exits (on stdio the client is all it serves).
#[test]
fn a_client_that_never_reads_is_disconnected_and_memory_stays_bounded() {
    use std::io::Write;
    let (mut server, mut stdin, _unread) = unread_server(&["--max-concurrent", "2", "--max-queued", "4"]);
    let pid = server.0.id();
    let writer = std::thread::spawn(move || {
        for id in 1..20_000 {
            if writeln!(stdin, "{}", list_backends_call(id)).is_err() {
                return None;
            }
        }
        // Kept open (the thread's result) until the test ends: only the
        // unread stdout may end the connection.
        Some(stdin)
    });
    let started = Instant::now();
    let mut peak = 0;
    let exited = loop {
        peak = peak.max(procfs::rss_kb(pid));
        if let Some(status) = server.0.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(40) {
            break None;
        }
        // The next sample of the peak: 100 ms on, or at once when the server exits.
        process::wait_exit(pid, Duration::from_millis(100));
    };
    assert!(exited.is_some(), "the server still serves a client that reads nothing");
    // Measured: ~83 MB (it was 579 MB before reads paused on blocked writes).
    assert!(peak < 200 * 1024, "peak RSS {peak} kB");
    drop(writer);
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_work_when_the_server_passes_environment_values() {
    // SAFETY-free: the variable is only read by the child process.
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_execbox"));
    command.args(["serve", "--allow-env", "EXECBOX_TEST_VALUE"]).env("EXECBOX_TEST_VALUE", "visible");
    let transport = TokioChildProcess::new(command).unwrap();
    let client = Watcher::default().serve(transport).await.unwrap();
    let (r, _) =
        run(&client, json!({"language": "python", "code": "import os\nprint(os.environ['EXECBOX_TEST_VALUE'])"})).await;
    assert_eq!(r["stdout"], "visible\n", "{r}");
    let created =
        call(&client, "create_session", json!({"language": "python"})).await.unwrap().structured_content.unwrap();
    let sid = created["session_id"].as_str().unwrap();
    let (r, is_error) = run(&client, json!({"language": "python", "code": "x = 1\nprint(x)", "session_id": sid})).await;
    assert!(!is_error && r["stdout"] == "1\n", "{r}");
    // Opened as a one-shot run runs: with the server's environment.
    let code = "import os\nprint(os.environ.get('EXECBOX_TEST_VALUE'))";
    let (r, is_error) = run(&client, json!({"language": "python", "code": code, "session_id": sid})).await;
    assert!(!is_error && r["stdout"] == "visible\n", "{r}");
    client.cancel().await.unwrap();
}

// ---- sessions under hostile cells (issue 17) -------------------------------------------------

/// A session created over MCP, and its id.
async fn create_session(client: &Client, arguments: Value) -> String {
    let created = call(client, "create_session", arguments).await.unwrap().structured_content.unwrap();
    created["session_id"].as_str().unwrap_or_else(|| panic!("no session: {created}")).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_pin_leaves_the_session_to_expire_and_errors_name_the_callers_id() {
    let (client, _) = connect(&["--session-idle-secs", "1"]).await;
    let id = create_session(&client, json!({"language": "javascript"})).await;
    let (r, is_error) =
        run(&client, json!({"language": "js", "code": "1", "session_id": id, "backend": "container"})).await;
    assert!(is_error && r["error"]["kind"] == "wrong_backend", "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("\"{id}\"")) && !message.contains('/'), "the caller's id only: {message}");
    // The refused call left nothing busy: the session expires when idle
    // (which the server announces to no one: its status is asked).
    let asking = &client;
    let expired = move || async move {
        let status = call(asking, "list_backends", json!({})).await.unwrap().structured_content.unwrap();
        status["sessions"]["live"] == 0
    };
    wait_until_async(Duration::from_secs(10), expired).await;
    let (lost, _) = run(&client, json!({"language": "js", "code": "1", "session_id": id})).await;
    assert_eq!(lost["error"]["kind"], "session_lost", "{lost}");
    assert!(lost["error"]["message"].as_str().unwrap().contains("idle"), "{lost}");
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_wait_for_a_run_slot_counts_against_the_calls_deadline() {
    let (client, _) = connect(&["--max-concurrent", "1"]).await;
    let peer = client.peer().clone();
    let first = tokio::spawn(async move {
        // It holds the only slot 1.6 s past its first progress notification.
        let args = json!({"language": "js", "code": "while (true) {}", "timeout_ms": 2600});
        peer.call_tool(run_code_with_progress(args)).await
    });
    // The first call has the only slot.
    running(&client).await;
    let started = Instant::now();
    let (r, is_error) = run(&client, json!({"language": "js", "code": "while (true) {}", "timeout_ms": 2000})).await;
    let took = started.elapsed();
    // Either no slot came free within its deadline (busy, a failed call),
    // or it ran with what was left (timed out, an answer).
    let kind = r["error"]["kind"].as_str().or(r["outcome"].as_str()).unwrap_or_default().to_string();
    assert!(kind == "busy" || kind == "timed_out", "{r}");
    assert_eq!(is_error, kind == "busy", "{r}");
    // Before the fix: 1.7 s waiting, then a fresh 2 s deadline.
    assert!(took < Duration::from_millis(3_000), "{took:?}: the wait did not count");
    first.await.unwrap().unwrap();
    client.cancel().await.unwrap();
}

#[cfg(feature = "container")]
mod container_sessions {
    use super::*;
    use crate::common::programs::STOP_READING;
    use crate::common::{docker, skip};

    fn engine_available() -> bool {
        let ok = std::process::Command::new("docker")
            .args(["image", "inspect", "localhost/execbox-python:3.11"])
            .output()
            .is_ok_and(|o| o.status.success());
        skip::available(skip::CONTAINERS, if ok { Ok(()) } else { Err("no image localhost/execbox-python:3.11") })
    }

    /// Whether every session container of the server whose owner token is
    /// `token` is removed within `limit` (each waited for on its docker
    /// event). The server's warm containers are not sessions' and stay.
    fn gone(token: &str, limit: Duration) -> bool {
        tokio::task::block_in_place(|| {
            docker::wait_gone(&[&docker::owned_by(token), "label=execbox.role=session"], limit)
        })
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_cell_that_stops_the_loop_reading_cannot_hold_a_run_slot_past_its_deadline() {
        if !engine_available() {
            return;
        }
        let (client, pid) = connect(&["--max-concurrent", "1"]).await;
        let token = procfs::owner_token(pid);
        let (other, _) = connect(&[]).await;
        let id = create_session(&client, json!({"language": "python", "packages": ["numpy"]})).await;
        let (r, _) =
            run(&client, json!({"language": "python", "code": STOP_READING, "session_id": id, "timeout_ms": 20_000}))
                .await;
        assert_eq!(r["stdout"], "armed\n", "{r}");
        let big = format!("x = 1\n{}print('done')", "# padding padding padding padding padding\n".repeat(23_000));
        let started = Instant::now();
        let (r, _) =
            run(&client, json!({"language": "python", "code": big, "session_id": id, "timeout_ms": 3000})).await;
        let took = started.elapsed();
        eprintln!("serve, container session: a 1 MB cell after the hostile cell took {took:?} (deadline 3000 ms)");
        assert_eq!(r["outcome"], "timed_out", "{r}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        // The slot is free again for everyone, and the session is lost, its container gone.
        let (r, _) = run(&client, json!({"language": "js", "code": "return 7"})).await;
        assert_eq!(r["output"], 7, "{r}");
        let (r, _) = run(&client, json!({"language": "python", "code": "1", "session_id": id})).await;
        assert_eq!(r["error"]["kind"], "session_lost", "{r}");
        assert!(gone(&token, Duration::from_secs(10)), "the session's container outlived it");
        drop(other);
        client.cancel().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn closing_a_session_during_a_call_kills_its_container_and_the_call_returns() {
        if !engine_available() {
            return;
        }
        let (client, pid) = connect(&[]).await;
        let token = procfs::owner_token(pid);
        let id = create_session(&client, json!({"language": "python", "packages": ["numpy"]})).await;
        let call_in_flight = {
            let peer = client.peer().clone();
            let id = id.clone();
            tokio::spawn(async move {
                let args = json!({"language": "python", "code": "import time\ntime.sleep(600)", "session_id": id, "timeout_ms": 60_000});
                peer.call_tool(run_code_with_progress(args)).await
            })
        };
        running(&client).await;
        let started = Instant::now();
        let closed = call(&client, "close_session", json!({"session_id": id})).await.unwrap();
        assert_eq!(closed.structured_content.unwrap()["closed"], true);
        let r = call_in_flight.await.unwrap().unwrap().structured_content.unwrap();
        assert_eq!(r["outcome"], "killed", "{r}");
        assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
        assert!(gone(&token, Duration::from_secs(10)), "closed, yet its container is still there");
        client.cancel().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn container_sessions_are_held_to_the_servers_process_ceiling() {
        if !engine_available() {
            return;
        }
        let ceiling = policy_file(json!({"max_processes": 4, "timeout_ms": 20_000}));
        let (client, _) = connect(&["--policy", ceiling.path().to_str().unwrap()]).await;
        let spawn = "import subprocess\nstarted = []\nfor _ in range(30):\n    try:\n        started.append(subprocess.Popen(['/bin/sleep', '1']))\n    except OSError:\n        break\nprint(len(started))\nfor p in started:\n    p.wait()";
        let (one_shot, _) = run(&client, json!({"language": "python", "code": spawn, "backend": "container"})).await;
        let id = create_session(&client, json!({"language": "python", "packages": ["numpy"]})).await;
        let (in_session, _) = run(&client, json!({"language": "python", "code": spawn, "session_id": id})).await;
        for r in [&one_shot, &in_session] {
            let started: u64 = r["stdout"].as_str().unwrap_or("99").trim().parse().unwrap_or(99);
            assert!(started < 4, "{r}");
        }
        // A call cannot ask its session for a lower cap than it opened with.
        let (r, _) = run(&client, json!({"language": "python", "code": "1", "session_id": id, "memory_mb": 8})).await;
        assert_eq!(r["error"]["kind"], "refused", "{r}");
        assert_eq!(r["error"]["violations"][0]["control"], "memory", "{r}");
        client.cancel().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn shutdown_ends_sessions_with_calls_in_flight_within_their_deadline() {
        if !engine_available() {
            return;
        }
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_execbox"));
        command.arg("serve");
        let transport = TokioChildProcess::new(command).unwrap();
        let pid = transport.id().unwrap();
        let token = procfs::owner_token(pid);
        let client = Watcher::default().serve(transport).await.unwrap();
        let id = create_session(&client, json!({"language": "python", "packages": ["numpy"]})).await;
        let (r, _) = run(&client, json!({"language": "python", "code": STOP_READING, "session_id": id})).await;
        assert_eq!(r["stdout"], "armed\n", "{r}");
        let peer = client.peer().clone();
        let big = format!("x = 1\n{}", "# padding\n".repeat(100_000));
        let stuck = tokio::spawn(async move {
            let args = json!({"language": "python", "code": big, "session_id": id, "timeout_ms": 4000});
            peer.call_tool(run_code_with_progress(args)).await
        });
        running(&client).await;
        // End of stdin: the server drains, then exits.
        let started = Instant::now();
        drop(client);
        let _ = stuck.await;
        tokio::task::block_in_place(|| process::wait_exit(pid, Duration::from_secs(15)));
        let took = started.elapsed();
        eprintln!("serve: exit after stdin EOF with a stuck session call in flight: {took:?}");
        assert!(took < Duration::from_millis(4000 + 2000 + 1500), "{took:?}");
        assert!(gone(&token, Duration::from_secs(10)), "the server left its session's container");
    }
}

/// `--artifacts DIR`: a connection's runs and session cells share one
/// scope, `artifact_key` picks another of the same connection, another
/// server process on the same directory sees none of it, spilled output
/// lands in the scope, and a connection's scopes go when it ends.
#[cfg(feature = "artifacts")]
#[tokio::test(flavor = "multi_thread")]
async fn artifacts_belong_to_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().to_str().unwrap();
    let policy = policy_file(json!({"max_stdout_bytes": 2000}));
    let args = ["--artifacts", store, "--allow-tool", "artifacts.*", "--spill-output", "--policy"];
    let mut args = args.to_vec();
    args.push(policy.path().to_str().unwrap());
    let (a, _) = connect(&args).await;
    let (r, _) = run(
        &a,
        json!({"language": "js", "code": "return (await tools.artifacts.save({name: 'n', content: 'a'})).version"}),
    )
    .await;
    assert_eq!(r["output"], 1, "{r}");
    let load = "try { return (await tools.artifacts.load({name: 'n'})).content } catch (e) { return e.kind }";
    let (r, _) = run(&a, json!({"language": "js", "code": load})).await;
    assert_eq!(r["output"], "a", "{r}");
    // A session cell of the connection shares the scope.
    let created = call(&a, "create_session", json!({"language": "javascript"})).await.unwrap();
    let id = created.structured_content.unwrap()["session_id"].as_str().unwrap().to_string();
    let (r, _) = run(&a, json!({"language": "js", "code": load, "session_id": id})).await;
    assert_eq!(r["output"], "a", "{r}");
    // A key is another scope; a bad key is invalid arguments.
    let (r, _) = run(&a, json!({"language": "js", "code": load, "artifact_key": "other"})).await;
    assert_eq!(r["output"], "not_found", "{r}");
    let (r, is_error) = run(&a, json!({"language": "js", "code": "1", "artifact_key": ""})).await;
    assert!(is_error && r["error"]["kind"] == "invalid_arguments", "{r}");
    // Spilled output is kept in the caller's scope.
    let (r, _) =
        run(&a, json!({"language": "js", "code": "for (let i = 0; i < 1000; i++) console.log('line ' + i)"})).await;
    let name = r["spilled"].as_str().unwrap_or_else(|| panic!("spilled: {r}")).to_string();
    assert!(r["stdout"].as_str().unwrap().len() <= 2000, "{r}");
    let code = format!("return (await tools.artifacts.load({{name: {name:?}, offset: 0, length: 7}})).content");
    let (r, _) = run(&a, json!({"language": "js", "code": code})).await;
    assert_eq!(r["output"], "line 0\n", "{r}");

    // Another server on the same directory: its own scopes.
    let (b, _) = connect(&args).await;
    let (r, _) = run(&b, json!({"language": "js", "code": load})).await;
    assert_eq!(r["output"], "not_found", "{r}");
    b.cancel().await.unwrap();

    // The connection ends: its scopes are removed.
    let scopes = dir.path().join("scopes");
    assert_eq!(std::fs::read_dir(&scopes).unwrap().count(), 1, "one scope saved anything");
    a.cancel().await.unwrap();
    // Nothing announces a removed directory: it is looked for.
    let emptied = || std::future::ready(std::fs::read_dir(&scopes).unwrap().count() == 0);
    wait_until_async(Duration::from_secs(10), emptied).await;
    assert_eq!(std::fs::read_dir(&scopes).unwrap().count(), 0, "the connection's artifacts are gone");
}

/// B1: a server's exit used to leave its connections' artifacts on disk
/// (removed by a detached thread the exit did not wait for), and their
/// random scope names meant no later process removed them, while they
/// counted against the store's total quota for good. Now the drain removes
/// them before the exit, and a store opened later reclaims what a killed
/// server left (its owner record names a process that is gone).
#[cfg(feature = "artifacts")]
mod artifacts_end_with_the_server {
    use super::*;

    /// JavaScript that saves 100 artifacts of 100 bytes (a run's default
    /// budget of tool calls) and returns how many it saved.
    const SAVE_100: &str = "let n = 0;
        for (let i = 0; i < 100; i++) { await tools.artifacts.save({name: 'f' + i, content: 'x'.repeat(100)}); n++; }
        return n;";

    /// The scope directories under the store `dir`.
    fn scopes(dir: &std::path::Path) -> Vec<String> {
        let entries = std::fs::read_dir(dir.join("scopes")).unwrap();
        entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }

    /// Regular files below the store `dir`'s scopes.
    fn files(dir: &std::path::Path) -> usize {
        let mut count = 0;
        let mut todo = vec![dir.join("scopes")];
        while let Some(at) = todo.pop() {
            for entry in std::fs::read_dir(at).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    todo.push(entry.path());
                } else {
                    count += 1;
                }
            }
        }
        count
    }

    /// A server started with `args` and a client on its pipes: closing the
    /// client closes the server's stdin, and nothing else ends the server
    /// (rmcp's child-process transport kills its child after 3 s), so its
    /// exit and status are its own.
    async fn connect_piped(args: &[&str]) -> (Client, tokio::process::Child) {
        use std::process::Stdio;
        let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_execbox"))
            .arg("serve")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn execbox serve");
        let pipes = (server.stdout.take().unwrap(), server.stdin.take().unwrap());
        let client = Watcher::default().serve(pipes).await.expect("MCP handshake");
        (client, server)
    }

    /// Three scopes of one connection, 100 versions each.
    async fn save_300(client: &Client) {
        for key in [None, Some("b"), Some("c")] {
            let mut arguments = json!({"language": "js", "code": SAVE_100});
            if let Some(key) = key {
                arguments["artifact_key"] = json!(key);
            }
            let (r, _) = run(client, arguments).await;
            assert_eq!(r["output"], 100, "{r}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn stdin_closing_removes_the_connections_artifacts_before_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let args = ["--artifacts", dir.path().to_str().unwrap(), "--allow-tool", "artifacts.*"];
        let (client, mut server) = connect_piped(&args).await;
        save_300(&client).await;
        assert_eq!(scopes(dir.path()).len(), 3);
        assert!(files(dir.path()) >= 300, "{}", files(dir.path()));
        // The client goes: the server's stdin ends.
        client.cancel().await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(60), server.wait()).await.expect("an exit").unwrap();
        assert!(status.success(), "{status}");
        // Looked at once, at the exit: nothing is left for later.
        assert_eq!(scopes(dir.path()), Vec::<String>::new(), "{} files left", files(dir.path()));
    }

    #[test]
    fn sigterm_over_http_removes_every_connections_artifacts_before_the_exit() {
        let dir = tempfile::tempdir().unwrap();
        let (mut server, port) =
            http_server(&["--artifacts", dir.path().to_str().unwrap(), "--allow-tool", "artifacts.*"]);
        let server = &mut server.0;
        let url = format!("http://127.0.0.1:{port}/mcp");
        let post = |session: Option<&str>, body: Value| {
            let mut cmd = std::process::Command::new("curl");
            cmd.args(["-s", "-i", "-X", "POST", &url])
                .args(["-H", "content-type: application/json", "-H", "accept: application/json, text/event-stream"])
                .args(["-H", "mcp-protocol-version: 2025-06-18", "--data", &body.to_string()]);
            if let Some(session) = session {
                cmd.args(["-H", &format!("mcp-session-id: {session}")]);
            }
            String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
        };
        let connect_http = || {
            let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion":
                "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
            let head = post(None, init);
            let session = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("mcp-session-id: ").map(|s| s.trim().to_string()))
                .unwrap_or_else(|| panic!("no session header: {head}"));
            post(Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
            session
        };
        let save_100 = |session: &str, key: &str| {
            let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_code",
                "arguments": {"language": "js", "code": SAVE_100, "artifact_key": key}}});
            let reply = post(Some(session), call);
            let answer = reply
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                .find(|v| v.get("result").is_some())
                .unwrap_or_else(|| panic!("{reply}"));
            assert_eq!(answer["result"]["structuredContent"]["output"], 100, "{answer}");
        };
        // Three connections, two scopes each; one connection ends before
        // the signal (its cleanup runs), two are open at it.
        let sessions: Vec<String> = (0..3).map(|_| connect_http()).collect();
        for session in &sessions {
            save_100(session, "a");
            save_100(session, "b");
        }
        assert_eq!(scopes(dir.path()).len(), 6);
        let delete = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "DELETE", &url])
            .args(["-H", &format!("mcp-session-id: {}", sessions[0]), "-H", "mcp-protocol-version: 2025-06-18"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&delete.stdout), "204");
        send_signal(server.id(), "TERM");
        let status = process::wait_child(server, Duration::from_secs(60)).expect("an exit within 60 s");
        assert_eq!(status.code(), Some(0));
        assert_eq!(scopes(dir.path()), Vec::<String>::new(), "{} files left", files(dir.path()));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_fresh_server_reclaims_what_a_killed_one_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().to_str().unwrap();
        // A scope of `execbox run`'s (a key's: no process owns it) is never swept.
        let cli = |code: &str| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_execbox"))
                .args(["run", "--artifacts", store, "--artifact-key", "keep", "--allow-tool", "artifacts.*"])
                .args(["--code", code, "--json"])
                .output()
                .unwrap();
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"))["output"].clone()
        };
        let kept = "return (await tools.artifacts.save({name: 'kept', content: 'mine'})).version";
        tokio::task::block_in_place(|| assert_eq!(cli(kept), 1));
        let args = ["--artifacts", store, "--allow-tool", "artifacts.*"];
        let (client, mut killed) = connect_piped(&args).await;
        save_300(&client).await;
        // SIGKILL: no drain, no cleanup of any kind (and reaped: a zombie counts as gone too).
        killed.kill().await.unwrap();
        let _ = client.cancel().await;
        assert_eq!(scopes(dir.path()).len(), 4, "the killed server's three scopes and the key's");
        assert!(files(dir.path()) > 300);

        // A fresh server's store sweeps when it opens, off the request path.
        let (fresh, _) = connect(&args).await;
        let swept = || std::future::ready(scopes(dir.path()).len() == 1);
        assert!(wait_until_async(Duration::from_secs(30), swept).await, "{:?}", scopes(dir.path()));
        let (r, _) = run(&fresh, json!({"language": "js", "code": SAVE_100})).await;
        assert_eq!(r["output"], 100, "{r}");
        fresh.cancel().await.unwrap();
        let load = "return (await tools.artifacts.load({name: 'kept'})).content";
        tokio::task::block_in_place(|| assert_eq!(cli(load), "mine"));
    }
}

/// Whether `pid` catches SIGTERM (its handler is installed: `SigCgt`).
fn catches_sigterm(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let caught = status.lines().find_map(|line| line.strip_prefix("SigCgt:")).map(str::trim);
    caught.and_then(|mask| u64::from_str_radix(mask, 16).ok()).is_some_and(|mask| mask & (1 << (15 - 1)) != 0)
}

/// SIGTERM (or Ctrl-C) before the client's `initialize` ends the server: it
/// used to wait for the handshake first, so a client that never sent one
/// (or a stdin that never ends) left only SIGKILL.
#[test]
fn a_signal_before_the_handshake_ends_the_server() {
    use std::process::{Command, Stdio};
    let mut server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_execbox"))
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = server.0.id();
    assert!(wait_until(Duration::from_secs(30), || catches_sigterm(pid)), "no SIGTERM handler installed");
    send_signal(pid, "TERM");
    let status = process::wait_child(&mut server.0, Duration::from_secs(15));
    assert!(status.is_some(), "still waiting for the handshake 15 s after SIGTERM");
    assert_eq!(status.unwrap().code(), Some(0));
}

/// One Unix socket as stdin, stdout and stderr (systemd's
/// `StandardInput=socket`, inetd): an answer larger than the socket's
/// buffer, written while the client is not reading yet, arrives whole (stdin
/// on the reactor used to make the shared socket non-blocking under stdout's
/// and stderr's blocking writes: the answer was cut at `EAGAIN`).
#[test]
fn one_socket_for_stdin_stdout_and_stderr_gets_whole_answers() {
    use std::io::{BufRead, Write};
    use std::os::unix::net::UnixStream;
    use std::process::{Command, Stdio};
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let (stdin, stdout, stderr) = (
        std::os::fd::OwnedFd::from(ours.try_clone().unwrap()),
        std::os::fd::OwnedFd::from(ours.try_clone().unwrap()),
        std::os::fd::OwnedFd::from(ours),
    );
    let mut server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_execbox"))
            .arg("serve")
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap(),
    );
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let big = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code","arguments":{"language":"javascript","code":"return 'y'.repeat(300000)"}}}"#;
    writeln!(theirs, "{init}\n{initialized}\n{big}").unwrap();
    // Not read yet: the answer (~600 kB) fills the socket's buffer.
    let mut lines = std::io::BufReader::new(theirs.try_clone().unwrap()).lines();
    let first = lines.next().expect("the initialize answer").unwrap();
    assert!(first.contains(r#""id":0"#), "{first}");
    // Not synchronisation: the subject. Unread for a while, the answer meets
    // a full buffer (EAGAIN) on the server's side; the test passes either
    // way, and tests the cut only if the server got there first.
    std::thread::sleep(Duration::from_secs(2));
    let answer = lines.next().expect("the call's answer").unwrap();
    let answer: Value =
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("a cut answer ({e}): {} bytes", answer.len()));
    assert_eq!(answer["result"]["structuredContent"]["output"].as_str().map(str::len), Some(300_000));
    theirs.shutdown(std::net::Shutdown::Write).unwrap();
    let status = process::wait_child(&mut server.0, Duration::from_secs(30));
    assert_eq!(status.and_then(|s| s.code()), Some(0));
}

/// A named FIFO as stdin whose writer wrote its requests and closed before
/// the server looked (`execbox serve < fifo` with a quick writer): every
/// request is answered and the server exits at the FIFO's end.
#[test]
fn a_named_fifo_whose_writer_is_gone_is_read_to_its_end() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("requests");
    assert!(Command::new("mkfifo").arg(&path).status().unwrap().success());
    // O_NONBLOCK: opening to read does not wait for a writer.
    let read = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).unwrap();
    let mut write = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    writeln!(write, "{init}\n{initialized}\n{}", list_backends_call(1)).unwrap();
    drop(write);
    let mut server = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_execbox"))
            .arg("serve")
            .stdin(Stdio::from(read))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = server.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let status = process::wait_child(&mut server.0, Duration::from_secs(30));
    assert!(status.is_some(), "the server never saw the FIFO's end");
    assert_eq!(status.unwrap().code(), Some(0));
    let answers = reader.join().unwrap();
    assert_eq!(answers.lines().count(), 2, "{answers}");
}

/// Workspaces over MCP: files written, used by a run, read back by globs;
/// ids per connection; closed by `close_workspace` and by the connection's
/// end. Skipped where this process cannot mount (not root) unless
/// `EXECBOX_REQUIRE_WORKSPACES` is set.
#[tokio::test(flavor = "multi_thread")]
async fn workspaces_keep_files_across_runs_and_belong_to_their_connection() {
    use base64::Engine as _;
    let root = tempfile::tempdir().unwrap();
    if !workspaces_can_run() {
        return;
    }
    let args =
        ["--workspace-root", root.path().to_str().unwrap(), "--workspace-quota-mb", "4", "--max-workspaces", "2"];
    let (client, _) = connect(&args).await;
    let created = call(&client, "create_workspace", json!({})).await.unwrap();
    let body = created.structured_content.unwrap();
    assert_eq!(created.is_error, Some(false), "{body}");
    let id = body["workspace_id"].as_str().unwrap().to_string();
    assert_eq!(body["quota_bytes"], 4 << 20, "{body}");

    let data = base64::engine::general_purpose::STANDARD.encode(br#"{"n": 41}"#);
    let files = json!([{"path": "in/data.json", "content_base64": data}]);
    let written = call(&client, "write_files", json!({"workspace_id": id, "files": files})).await.unwrap();
    assert_eq!(written.structured_content.unwrap()["written"], 1);
    let code =
        "import json\nn = json.load(open('/work/in/data.json'))['n']\nopen('/work/out.txt', 'w').write(str(n + 1))";
    let (result, is_error) = run(&client, json!({"language": "python", "code": code, "workspace_id": id})).await;
    assert!(!is_error && result["outcome"] == "ok", "{result}");
    assert_eq!(result["workspace"]["full"], false, "{result}");

    let read = call(&client, "read_files", json!({"workspace_id": id, "globs": ["*.txt", "in/**"]})).await.unwrap();
    let read = read.structured_content.unwrap();
    let paths: Vec<&str> = read["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["in/data.json", "out.txt"], "{read}");
    assert_eq!(read["files"][1]["content_base64"], base64::engine::general_purpose::STANDARD.encode("42"));

    let too_big = call(&client, "create_workspace", json!({"quota_mb": 5})).await.unwrap();
    assert_eq!(too_big.is_error, Some(true));

    // Another server's connection cannot reach it by its id (connections of
    // one server: `http_sessions_are_isolated_per_connection_and_need_the_token`).
    let (other, _) = connect(&args).await;
    let (refused, is_error) = run(&other, json!({"language": "python", "code": "print(1)", "workspace_id": id})).await;
    assert!(is_error && refused.to_string().contains("no workspace"), "{refused}");
    let theirs = call(&other, "read_files", json!({"workspace_id": id, "globs": ["**"]})).await.unwrap();
    assert_eq!(theirs.is_error, Some(true));
    let mounts_under_root = || {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        let root = root.path().to_str().unwrap().to_string();
        mounts.lines().filter(|l| l.split(' ').nth(1).is_some_and(|m| m.starts_with(&root))).count()
    };
    assert_eq!(mounts_under_root(), 1);
    // Each server counts its own (one server per stdio connection here).
    call(&other, "create_workspace", json!({})).await.unwrap();
    call(&client, "create_workspace", json!({})).await.unwrap();
    assert_eq!(mounts_under_root(), 3);
    let over = call(&client, "create_workspace", json!({})).await.unwrap();
    assert_eq!(over.is_error, Some(true), "the server's third workspace");
    assert!(over.structured_content.unwrap().to_string().contains("already holds 2 workspaces"));

    let closed = call(&client, "close_workspace", json!({"workspace_id": id})).await.unwrap();
    assert_eq!(closed.structured_content.unwrap()["closed"], true);
    assert_eq!(mounts_under_root(), 2);
    // A connection's end unmounts its workspaces.
    other.cancel().await.unwrap();
    assert!(wait_until_async(Duration::from_secs(10), || async { mounts_under_root() == 1 }).await);
    client.cancel().await.unwrap();
    assert!(wait_until_async(Duration::from_secs(10), || async { mounts_under_root() == 0 }).await);
}

/// Programs over MCP: a REPL driven by write_program and poll_program, a
/// program polled to its exit code, kill_program with a grace, ids per
/// connection, and every program gone with its workspace. Needs root and
/// containers (skipped otherwise unless required).
#[tokio::test(flavor = "multi_thread")]
async fn programs_run_between_calls_and_end_with_their_workspace() {
    use base64::Engine as _;
    let root = tempfile::tempdir().unwrap();
    if !programs_can_run() {
        return;
    }
    let (client, _) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    let body = ok_body;
    let ws =
        body(call(&client, "create_workspace", json!({})).await.unwrap())["workspace_id"].as_str().unwrap().to_string();

    // A REPL with a terminal: its prompt, then an answer to a written line.
    let started = call(
        &client,
        "start_program",
        json!({"workspace_id": ws, "command": ["python3", "-i", "-q"], "tty": true, "yield_ms": 5000}),
    )
    .await
    .unwrap();
    let started = body(started);
    assert_eq!(started["status"], "running", "{started}");
    assert!(started["output"].as_str().unwrap().contains(">>> "), "{started}");
    let repl = started["program_id"].as_str().unwrap().to_string();
    let answer = call(
        &client,
        "write_program",
        json!({"program_id": repl, "data": "print(6 * 7)", "newline": true, "yield_ms": 5000}),
    )
    .await
    .unwrap();
    let answer = body(answer);
    assert!(answer["output"].as_str().unwrap().contains("42"), "{answer}");
    assert_eq!(answer["offset"], started["next_offset"], "{answer}");

    // A program polled to its exit code, its output in order.
    let line = "echo one; sleep 0.5; echo two > /work/two.txt; exit 3";
    let first = body(call(&client, "start_program", json!({"workspace_id": ws, "command": line})).await.unwrap());
    let id = first["program_id"].as_str().unwrap().to_string();
    let mut output = first["output"].as_str().unwrap().to_string();
    let mut last = first;
    while last["status"] == "running" {
        last = body(call(&client, "poll_program", json!({"program_id": id, "yield_ms": 5000})).await.unwrap());
        output.push_str(last["output"].as_str().unwrap());
    }
    assert_eq!((output.as_str(), &last["status"], &last["exit_code"]), ("one\n", &json!("exited"), &json!(3)));
    let read = body(call(&client, "read_files", json!({"workspace_id": ws, "globs": ["two.txt"]})).await.unwrap());
    assert_eq!(read["files"][0]["size"], 4, "{read}");
    // Its end was read: it is forgotten.
    let gone = call(&client, "poll_program", json!({"program_id": id})).await.unwrap();
    assert_eq!(gone.is_error, Some(true));

    // A script written with its mode runs as a command.
    let script = base64::engine::general_purpose::STANDARD.encode("#!/bin/bash\necho scripted\n");
    let files = json!([{"path": "bin/run.sh", "content_base64": script, "mode": 0o755}]);
    body(call(&client, "write_files", json!({"workspace_id": ws, "files": files})).await.unwrap());
    let mut ran = body(
        call(
            &client,
            "start_program",
            json!({"workspace_id": ws, "command": ["./run.sh"], "cwd": "bin", "yield_ms": 5000}),
        )
        .await
        .unwrap(),
    );
    let mut output = ran["output"].as_str().unwrap().to_string();
    while ran["status"] == "running" {
        ran = body(
            call(&client, "poll_program", json!({"program_id": ran["program_id"], "yield_ms": 5000})).await.unwrap(),
        );
        output.push_str(ran["output"].as_str().unwrap());
    }
    assert_eq!((output.as_str(), &ran["exit_code"]), ("scripted\n", &json!(0)), "{ran}");

    // Another connection cannot reach the REPL by its id.
    let (other, _) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    for tool in ["poll_program", "write_program", "kill_program"] {
        let theirs = call(&other, tool, json!({"program_id": repl})).await.unwrap();
        assert_eq!(theirs.is_error, Some(true), "{tool}");
    }
    other.cancel().await.unwrap();

    // Kill with a grace: a program that ignores SIGTERM is killed at its end.
    let stubborn = "trap '' TERM; echo ready; sleep 1000";
    let started = body(
        call(&client, "start_program", json!({"workspace_id": ws, "command": stubborn, "yield_ms": 5000}))
            .await
            .unwrap(),
    );
    let killed = body(
        call(&client, "kill_program", json!({"program_id": started["program_id"], "grace_ms": 200})).await.unwrap(),
    );
    assert_eq!((&killed["status"], &killed["exit_code"]), (&json!("killed"), &json!(137)), "{killed}");

    // Closing the workspace ends the REPL and removes its container.
    let mount = std::fs::read_dir(root.path()).unwrap().next().unwrap().unwrap().path();
    let filter = format!("volume={}", mount.display());
    assert_eq!(common::docker::ps(&["--filter", &filter]).len(), 1, "the workspace's program container");
    body(call(&client, "close_workspace", json!({"workspace_id": ws})).await.unwrap());
    let after = call(&client, "poll_program", json!({"program_id": repl})).await.unwrap();
    assert_eq!(after.is_error, Some(true), "the workspace's programs are forgotten with it");
    assert!(common::docker::wait_gone(&[&filter], Duration::from_secs(20)), "its container outlived it");
    client.cancel().await.unwrap();

    // A server killed with SIGKILL while a program runs: its container goes
    // (the watcher), and the next server's first workspace sweeps the mount.
    let (doomed, pid) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    let ws = body(call(&doomed, "create_workspace", json!({})).await.unwrap())["workspace_id"].clone();
    let line = json!({"workspace_id": ws, "command": "echo up; sleep 1000", "yield_ms": 10_000});
    assert_eq!(body(call(&doomed, "start_program", line).await.unwrap())["status"], "running");
    let mount = std::fs::read_dir(root.path()).unwrap().next().unwrap().unwrap().path();
    let filter = format!("volume={}", mount.display());
    assert_eq!(common::docker::ps(&["--filter", &filter]).len(), 1);
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    assert!(common::docker::wait_gone(&[&filter], Duration::from_secs(30)), "a dead server's program container stayed");
    drop(doomed);
    let (next, _) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    body(call(&next, "create_workspace", json!({})).await.unwrap());
    assert!(!mount.exists(), "the dead server's workspace was not swept");
    next.cancel().await.unwrap();
}

/// Sessions in a workspace over MCP: `create_session {workspace_id}` opens a
/// Python session whose calls see the workspace at /work (globals kept,
/// files passed both ways with one-shot runs and `read_files`); another
/// connection cannot use the workspace for a session; closing the
/// workspace closes the session and removes its container. Needs root and
/// containers.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_in_a_workspace_sees_its_files_and_closes_with_it() {
    use base64::Engine as _;
    let root = tempfile::tempdir().unwrap();
    if !programs_can_run() {
        return;
    }
    let body = ok_body;
    let (client, _) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    let ws = body(call(&client, "create_workspace", json!({})).await.unwrap())["workspace_id"].clone();
    let opened = call(&client, "create_session", json!({"language": "python", "workspace_id": ws})).await.unwrap();
    let opened = body(opened);
    assert_eq!(opened["workspace_id"], ws, "{opened}");
    let session = opened["session_id"].clone();
    let cell = |code: &str| json!({"language": "python", "code": code, "session_id": session});
    let (first, is_error) = run(&client, cell("x = 41\nopen('/work/a.txt', 'w').write('from session')")).await;
    assert!(!is_error && first["outcome"] == "ok" && first["backend"] == "container-session", "{first}");
    let (one_shot, _) =
        run(&client, json!({"language": "python", "code": "print(open('/work/a.txt').read())", "workspace_id": ws}))
            .await;
    assert_eq!(one_shot["stdout"].as_str().unwrap().trim(), "from session", "{one_shot}");
    let files = json!([{"path": "b.txt", "content_base64": base64::engine::general_purpose::STANDARD.encode("host")}]);
    body(call(&client, "write_files", json!({"workspace_id": ws, "files": files})).await.unwrap());
    let (second, _) = run(&client, cell("print(x + 1, open('/work/b.txt').read())")).await;
    assert_eq!(second["stdout"].as_str().unwrap().trim(), "42 host", "{second}");
    // A shell session in the same workspace keeps its variables and sees the same files.
    let opened = call(&client, "create_session", json!({"language": "shell", "workspace_id": ws})).await.unwrap();
    let shell = body(opened)["session_id"].clone();
    let shell_cell = |code: &str| json!({"language": "shell", "code": code, "session_id": shell});
    let (set, _) = run(&client, shell_cell("v=7; cd /work")).await;
    assert_eq!(set["outcome"], "ok", "{set}");
    let (got, _) = run(&client, shell_cell("echo $v $(cat a.txt)")).await;
    assert_eq!(got["stdout"].as_str().unwrap().trim(), "7 from session", "{got}");
    // Naming the workspace beside the session is fine; another connection's id is not found.
    let both = json!({"language": "python", "code": "print(x)", "session_id": session, "workspace_id": ws});
    assert_eq!(run(&client, both).await.0["stdout"].as_str().unwrap().trim(), "41");
    let (other, _) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    let theirs = call(&other, "create_session", json!({"language": "python", "workspace_id": ws})).await.unwrap();
    assert_eq!(theirs.is_error, Some(true), "another connection opened a session in the workspace");
    other.cancel().await.unwrap();

    let mount = std::fs::read_dir(root.path()).unwrap().next().unwrap().unwrap().path();
    let filter = format!("volume={}", mount.display());
    assert_eq!(common::docker::ps(&["--filter", &filter]).len(), 2, "the sessions' containers");
    body(call(&client, "close_workspace", json!({"workspace_id": ws})).await.unwrap());
    assert!(common::docker::wait_gone(&[&filter], Duration::from_secs(20)), "a session's container outlived it");
    let (after, is_error) = run(&client, cell("print(x)")).await;
    assert!(is_error, "the session outlived its workspace: {after}");
    assert!(wait_until_async(Duration::from_secs(10), || async { !mount.exists() }).await, "the mount stayed");
    client.cancel().await.unwrap();
}

/// `create_workspace {packages}`: every Python run, session and program in
/// the workspace declares them, so they run where they are (the data
/// image); packages no backend has are refused before anything is mounted.
/// Needs root and containers.
#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_s_packages_go_with_its_runs_sessions_and_programs() {
    let root = tempfile::tempdir().unwrap();
    if !programs_can_run() {
        return;
    }
    let body = ok_body;
    let (client, _) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    let refused = call(&client, "create_workspace", json!({"packages": ["no_such_package"]})).await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert!(refused.structured_content.unwrap().to_string().contains("no backend provides no_such_package"));
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0, "a refused workspace was mounted");

    let created = body(call(&client, "create_workspace", json!({"packages": ["numpy"]})).await.unwrap());
    assert_eq!(created["packages"], json!(["numpy"]), "{created}");
    let ws = created["workspace_id"].clone();
    let import = "import numpy\nprint(int(numpy.arange(4).sum()))";
    let (ran, is_error) = run(&client, json!({"language": "python", "code": import, "workspace_id": ws})).await;
    assert!(!is_error && ran["stdout"].as_str().unwrap().trim() == "6", "{ran}");
    let session = body(
        call(&client, "create_session", json!({"language": "python", "workspace_id": ws})).await.unwrap(),
    )["session_id"]
        .clone();
    let (cell, _) = run(&client, json!({"language": "python", "code": import, "session_id": session})).await;
    assert_eq!(cell["stdout"].as_str().unwrap().trim(), "6", "{cell}");
    let line = json!({"workspace_id": ws, "command": ["python3", "-c", import], "yield_ms": 20_000});
    let mut polled = body(call(&client, "start_program", line).await.unwrap());
    let mut output = polled["output"].as_str().unwrap().to_string();
    while polled["status"] == "running" {
        let poll = json!({"program_id": polled["program_id"], "yield_ms": 5000});
        polled = body(call(&client, "poll_program", poll).await.unwrap());
        output.push_str(polled["output"].as_str().unwrap());
    }
    assert_eq!((polled["exit_code"].clone(), output.trim()), (json!(0), "6"), "{polled}");
    body(call(&client, "close_workspace", json!({"workspace_id": ws})).await.unwrap());
    client.cancel().await.unwrap();
}

/// Workspace files and artifacts over MCP: `read_files {save_as_artifacts}`
/// saves what it read as versioned artifacts of the connection (which its
/// code then loads with `artifacts.load`), with `name_template`; a name the
/// store refuses is left out and named; `write_files` takes a file's
/// content from `name@version`. A server without `--artifacts` refuses
/// both as invalid arguments. Needs root.
#[cfg(feature = "artifacts")]
#[tokio::test(flavor = "multi_thread")]
async fn workspace_files_are_saved_as_artifacts_and_written_from_them() {
    use base64::Engine as _;
    let root = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    if !workspaces_can_run() {
        return;
    }
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let body = ok_body;
    let root_path = root.path().to_str().unwrap();
    let args =
        ["--workspace-root", root_path, "--artifacts", store.path().to_str().unwrap(), "--allow-tool", "artifacts.*"];
    let (client, _) = connect(&args).await;
    let ws = body(call(&client, "create_workspace", json!({})).await.unwrap())["workspace_id"].clone();
    let files = json!([
        {"path": "out/report.txt", "content_base64": b64("v1")},
        {"path": "out/data.csv", "content_base64": b64("a,b")},
    ]);
    body(call(&client, "write_files", json!({"workspace_id": ws, "files": files})).await.unwrap());
    let save = json!({"workspace_id": ws, "globs": ["out/*"], "save_as_artifacts": true});
    let saved = body(call(&client, "read_files", save.clone()).await.unwrap());
    let artifacts: Vec<(&str, &Value)> = saved["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert!(f.get("content_base64").is_none(), "saved files are not inline by default: {f}");
            (f["artifact"]["name"].as_str().unwrap(), &f["artifact"]["version"])
        })
        .collect();
    assert_eq!(artifacts, [("out_data.csv", &json!(1)), ("out_report.txt", &json!(1))], "{saved}");
    // Saving again makes version 2; the code of a run of this connection loads it.
    let report = json!([{"path": "out/report.txt", "content_base64": b64("v2")}]);
    body(call(&client, "write_files", json!({"workspace_id": ws, "files": report})).await.unwrap());
    let again = body(call(&client, "read_files", save).await.unwrap());
    assert_eq!(again["files"][1]["artifact"]["version"], 2, "{again}");
    let code = "return (await tools.artifacts.load({name: 'out_report.txt', version: 1})).content";
    let (loaded, _) = run(&client, json!({"language": "javascript", "code": code})).await;
    assert_eq!(loaded["output"], "v1", "{loaded}");

    // A template, inline content, and a name the store refuses.
    let named = json!({"workspace_id": ws, "globs": ["out/data.csv"], "save_as_artifacts": true,
        "name_template": "run-{name}", "inline": true});
    let named = body(call(&client, "read_files", named).await.unwrap());
    assert_eq!(named["files"][0]["artifact"]["name"], "run-data.csv", "{named}");
    assert_eq!(named["files"][0]["content_base64"], b64("a,b"), "{named}");
    let bad =
        json!({"workspace_id": ws, "globs": ["out/data.csv"], "save_as_artifacts": true, "name_template": ".{name}"});
    let bad = body(call(&client, "read_files", bad).await.unwrap());
    assert!(bad["files"][0].get("artifact").is_none(), "{bad}");
    assert_eq!(bad["limits_hit"], json!(["artifacts"]), "{bad}");
    assert!(bad["left_out"][0].as_str().unwrap().contains("not saved as an artifact"), "{bad}");

    // Files written from artifacts: a version, or the latest.
    let from = json!([
        {"path": "in/old.txt", "artifact": "out_report.txt@1"},
        {"path": "in/new.txt", "artifact": "out_report.txt", "mode": 493},
    ]);
    body(call(&client, "write_files", json!({"workspace_id": ws, "files": from})).await.unwrap());
    let read = body(call(&client, "read_files", json!({"workspace_id": ws, "globs": ["in/*"]})).await.unwrap());
    let contents: Vec<&Value> = read["files"].as_array().unwrap().iter().map(|f| &f["content_base64"]).collect();
    assert_eq!(contents, [&json!(b64("v2")), &json!(b64("v1"))], "{read}");
    for (files, why) in [
        (json!([{"path": "x", "artifact": "no-such@1"}]), "no-such"),
        (json!([{"path": "x"}]), "one of them"),
        (json!([{"path": "x", "artifact": "a", "content_base64": ""}]), "one of them"),
    ] {
        let refused = call(&client, "write_files", json!({"workspace_id": ws, "files": files})).await.unwrap();
        assert_eq!(refused.is_error, Some(true), "{refused:?}");
        assert!(refused.structured_content.unwrap().to_string().contains(why), "{why}");
    }
    // The host's record of it all, oldest first, code unable to change it.
    let (_, _) = run(&client, json!({"language": "python", "code": "print(1)", "workspace_id": ws})).await;
    let described = body(call(&client, "describe_workspace", json!({"workspace_id": ws})).await.unwrap());
    let entries = |list: &str| -> Vec<(String, String)> {
        described["metadata"][list]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["path"].as_str().unwrap().to_string(), e["via"].as_str().unwrap().to_string()))
            .collect()
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter().map(|(p, v)| (p.to_string(), v.to_string())).collect()
    };
    assert_eq!(
        entries("inputs"),
        pairs(&[
            ("out/report.txt", "write"),
            ("out/data.csv", "write"),
            ("out/report.txt", "write"),
            ("in/old.txt", "artifact:out_report.txt@1"),
            ("in/new.txt", "artifact:out_report.txt@2"),
        ]),
        "{described}"
    );
    let outputs = entries("outputs");
    assert!(outputs.contains(&("out/data.csv".into(), "artifact:run-data.csv@1".into())), "{described}");
    assert!(outputs.contains(&("out/report.txt".into(), "artifact:out_report.txt@2".into())), "{described}");
    assert!(outputs.contains(&("in/new.txt".into(), "collect".into())), "{described}");
    assert!(!outputs.iter().any(|(_, via)| via == "artifact:.data.csv@1"), "a refused save is not recorded");
    let first = &described["metadata"]["inputs"][0];
    assert_eq!((first["size"].clone(), first["sha256"].as_str().unwrap().len()), (json!(2), 64), "{first}");
    assert!(described["usage"]["bytes_used"].as_u64().unwrap() > 0, "{described}");
    client.cancel().await.unwrap();

    // Without a store: both refused, naming why.
    let (plain, _) = connect(&["--workspace-root", root_path]).await;
    let ws = body(call(&plain, "create_workspace", json!({})).await.unwrap())["workspace_id"].clone();
    let save = json!({"workspace_id": ws, "globs": ["*"], "save_as_artifacts": true});
    let from = json!({"workspace_id": ws, "files": [{"path": "x", "artifact": "a"}]});
    for (tool, args) in [("read_files", save), ("write_files", from)] {
        let refused = call(&plain, tool, args).await.unwrap();
        assert_eq!(refused.is_error, Some(true), "{tool}");
        assert!(refused.structured_content.unwrap().to_string().contains("keeps no artifacts"), "{tool}");
    }
    plain.cancel().await.unwrap();
}

/// Workspaces over MCP expire: one no call uses is closed after the idle
/// timeout (its mount gone), one in use stays; any is closed at its
/// lifetime, used or not. Needs root (skipped otherwise unless required).
#[tokio::test(flavor = "multi_thread")]
async fn idle_workspaces_and_old_ones_are_closed() {
    let root = tempfile::tempdir().unwrap();
    if !workspaces_can_run() {
        return;
    }
    let root_path = root.path().to_str().unwrap();
    let (client, _) = connect(&["--workspace-root", root_path, "--workspace-idle-secs", "1"]).await;
    let create = || async {
        let created = call(&client, "create_workspace", json!({})).await.unwrap().structured_content.unwrap();
        assert_eq!(created["idle_timeout_ms"], 1000, "{created}");
        created["workspace_id"].as_str().unwrap().to_string()
    };
    let (idle, used) = (create().await, create().await);
    let list = |id: &str| json!({"workspace_id": id, "globs": ["*"]});
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert_eq!(call(&client, "read_files", list(&used)).await.unwrap().is_error, Some(false));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gone = call(&client, "read_files", list(&idle)).await.unwrap();
    assert_eq!(gone.is_error, Some(true), "an idle workspace stayed: {gone:?}");
    assert!(gone.structured_content.unwrap().to_string().contains("no workspace"));
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1, "the idle workspace's mount stayed");
    client.cancel().await.unwrap();

    let (client, _) = connect(&["--workspace-root", root_path, "--workspace-lifetime-secs", "1"]).await;
    let created = call(&client, "create_workspace", json!({})).await.unwrap().structured_content.unwrap();
    assert_eq!(created["lifetime_ms"], 1000, "{created}");
    let id = created["workspace_id"].as_str().unwrap().to_string();
    let mut answers = Vec::new();
    for _ in 0..12 {
        answers.push(call(&client, "read_files", list(&id)).await.unwrap().is_error);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!((answers[0], answers[11]), (Some(false), Some(true)), "a workspace past its lifetime: {answers:?}");
    client.cancel().await.unwrap();
}

/// A run or a session call that lasts longer than the idle timeout keeps
/// its workspace: running is use, and its end starts the idle time again
/// (found by the adversarial pass: the workspace closed mid-run and the
/// run's files were lost). Needs root and containers.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_call_keeps_its_workspace_from_going_idle() {
    let root = tempfile::tempdir().unwrap();
    if !programs_can_run() {
        return;
    }
    let (client, _) = connect(&["--workspace-root", root.path().to_str().unwrap(), "--workspace-idle-secs", "1"]).await;
    let created = call(&client, "create_workspace", json!({})).await.unwrap().structured_content.unwrap();
    let ws = created["workspace_id"].clone();
    let slow = "sleep 3; echo late > /work/late.txt";
    let (ran, is_error) = run(&client, json!({"language": "shell", "code": slow, "workspace_id": ws})).await;
    assert!(!is_error && ran["outcome"] == "ok", "{ran}");
    let read = call(&client, "read_files", json!({"workspace_id": ws, "globs": ["late.txt"]})).await.unwrap();
    assert_eq!(read.is_error, Some(false), "the workspace closed under its run: {read:?}");
    let session = call(&client, "create_session", json!({"language": "python", "workspace_id": ws})).await.unwrap();
    let session = session.structured_content.unwrap()["session_id"].clone();
    let cell =
        json!({"language": "python", "session_id": session, "code": "import time\ntime.sleep(3)\nprint('done')"});
    let (cell, is_error) = run(&client, cell).await;
    assert!(!is_error && cell["stdout"].as_str().unwrap().trim() == "done", "{cell}");
    client.cancel().await.unwrap();
}

/// The per-connection cap on programs holds against calls that race each
/// other: of 40 concurrent starts over 3 workspaces, exactly 32 run. Needs
/// root and containers.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_starts_cannot_pass_the_program_cap() {
    let root = tempfile::tempdir().unwrap();
    if !programs_can_run() {
        return;
    }
    let (client, _) = connect(&["--workspace-root", root.path().to_str().unwrap()]).await;
    let mut workspaces = Vec::new();
    for _ in 0..3 {
        let created = call(&client, "create_workspace", json!({})).await.unwrap().structured_content.unwrap();
        workspaces.push(created["workspace_id"].clone());
        // Its container started, so the starts below race each other only.
        let warm = json!({"workspace_id": created["workspace_id"], "command": "true", "yield_ms": 10_000});
        call(&client, "start_program", warm).await.unwrap();
    }
    let mut starts = tokio::task::JoinSet::new();
    for i in 0..40 {
        let peer = client.peer().clone();
        let args = json!({"workspace_id": workspaces[i % 3], "command": "sleep 100", "yield_ms": 0});
        let Value::Object(args) = args else { unreachable!() };
        starts.spawn(
            async move { peer.call_tool(CallToolRequestParams::new("start_program").with_arguments(args)).await },
        );
    }
    let mut started = 0;
    while let Some(answer) = starts.join_next().await {
        let answer = answer.unwrap().unwrap();
        if answer.is_error == Some(false) {
            started += 1;
        } else {
            let text = answer.structured_content.unwrap().to_string();
            assert!(text.contains("holds 32 programs"), "{text}");
        }
    }
    assert_eq!(started, 32);
    for ws in workspaces {
        call(&client, "close_workspace", json!({"workspace_id": ws})).await.unwrap();
    }
    client.cancel().await.unwrap();
}

/// A tool's answer that is not an error: its structured content.
fn ok_body(result: CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(false), "{result:?}");
    result.structured_content.unwrap()
}

/// Whether workspaces can be mounted here (root); else the test is skipped
/// (or fails, when they are required).
fn workspaces_can_run() -> bool {
    let ready = if rustix::process::geteuid().is_root() { Ok(()) } else { Err("workspaces need root") };
    common::skip::available("EXECBOX_REQUIRE_WORKSPACES", ready)
}

/// Whether programs can run here: workspaces (root) and a container engine;
/// else the test is skipped (or fails, when they are required).
fn programs_can_run() -> bool {
    if !workspaces_can_run() {
        return false;
    }
    let engine = std::process::Command::new("docker").arg("version").output().is_ok_and(|o| o.status.success());
    common::skip::available(common::skip::CONTAINERS, if engine { Ok(()) } else { Err("no container engine") })
}

/// Over MCP, code granted `workspace.*` (`--allow-tool`) starts a program
/// in its run's workspace that a later `run_code` in the workspace drives
/// to its end. Needs root and containers.
#[tokio::test(flavor = "multi_thread")]
async fn code_granted_workspace_tools_starts_a_program_a_later_run_reads() {
    let root = tempfile::tempdir().unwrap();
    if !programs_can_run() {
        return;
    }
    let root_path = root.path().to_str().unwrap();
    let args = [
        ["--workspace-root", root_path, "--allow-tool", "workspace.*"],
        ["--program-lifetime-secs", "3", "--workspace-idle-secs", "1"],
    ]
    .concat();
    let (client, _) = connect(&args).await;
    let ws = ok_body(call(&client, "create_workspace", json!({})).await.unwrap())["workspace_id"].clone();
    // Started from JavaScript (quickjs-wasm carries the workspace), read from Python.
    let start = "const a = await tools.workspace.start_program({command: 'sleep 1; echo done', yield_ms: 0});\n\
                 return [a.program_id, a.status];";
    let (started, _) = run(&client, json!({"language": "javascript", "code": start, "workspace_id": ws})).await;
    let id = started["output"][0].as_str().unwrap_or_else(|| panic!("{started}")).to_string();
    assert_eq!(started["output"][1], "running", "{started}");
    let wait = format!(
        "import tools\n\
         a = tools.workspace.poll_program(program_id='{id}', yield_ms=10000)\n\
         out = a['output']\n\
         while a['status'] == 'running':\n\
         \x20   a = tools.workspace.poll_program(program_id='{id}', yield_ms=10000)\n\
         \x20   out += a['output']\n\
         print(out.strip(), a['exit_code'])"
    );
    let (ended, _) = run(&client, json!({"language": "python", "code": wait, "workspace_id": ws})).await;
    assert_eq!(ended["stdout"].as_str().unwrap().trim(), "done 0", "{ended}");
    // The server's program lifetime holds code's programs too.
    let long = "import tools\n\
                a = tools.workspace.start_program(command='sleep 100', yield_ms=0)\n\
                while a['status'] == 'running':\n\
                \x20   a = tools.workspace.poll_program(program_id=a['program_id'], yield_ms=2000)\n\
                print(a['status'])";
    let policy = json!({"language": "python", "code": long, "workspace_id": ws, "timeout_ms": 30000});
    let (killed, _) = run(&client, policy).await;
    assert_eq!(killed["stdout"].as_str().unwrap_or_default().trim(), "killed", "{killed}");
    // A program code started keeps its workspace from going idle: no call
    // for twice the idle timeout, and a later run still reads its end.
    let start =
        "import tools\nprint(tools.workspace.start_program(command='sleep 2.5; echo late', yield_ms=0)['program_id'])";
    let (started, _) = run(&client, json!({"language": "python", "code": start, "workspace_id": ws})).await;
    let late = started["stdout"].as_str().unwrap().trim().to_string();
    tokio::time::sleep(Duration::from_millis(2200)).await; // the behaviour under test is the passing of time
    let (ended, _) =
        run(&client, json!({"language": "python", "code": wait.replace(&id, &late), "workspace_id": ws})).await;
    assert_eq!(ended["stdout"].as_str().unwrap_or_default().trim(), "late 0", "{ended}");
    // A server that grants tools still starts an MCP client's programs (they call none).
    let started = call(&client, "start_program", json!({"workspace_id": ws, "command": "echo hi", "yield_ms": 5000}));
    let started = ok_body(started.await.unwrap());
    assert_eq!(started["output"], "hi\n", "{started}");
    client.cancel().await.unwrap();
}
