"""`execbox serve` through the official MCP Python SDK, as an agent would use it.

Run by cli/tests/cli/mcp_sdks.rs:  python mcp_client.py EXECBOX_BINARY
Checks stdio and streamable HTTP (with a bearer token): tools, a JS and a
Python run, structuredContent, two failing programs in a row as normal
results (their outcome first) and a refusal as an isError result, an
output schema,
streamed stdout lines (logging), progress notifications, sessions, the
token check, workspaces (as root). Prints "ok" at the end; any failed check raises.
"""

import asyncio
import base64
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx2
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

EXECBOX = sys.argv[1]


def check(condition, what):
    if not condition:
        raise AssertionError(what)


async def exercise(session: ClientSession, logs: list, transport: str):
    tools = {t.name for t in (await session.list_tools()).tools}
    expected = {"run_code", "list_backends", "create_session", "close_session",
                "create_workspace", "close_workspace", "describe_workspace", "write_files", "read_files",
                "start_program", "poll_program", "write_program", "kill_program"}
    check(tools == expected, f"{transport}: tools {tools}")

    r = await session.call_tool("run_code", {"language": "javascript", "code": "return input.map(x => x * 2)", "input": [1, 2, 3]})
    check(not r.is_error and r.structured_content["output"] == [2, 4, 6], f"{transport}: js {r}")
    check(r.structured_content["backend"] == "boa-js", f"{transport}: backend {r.structured_content}")

    r = await session.call_tool("run_code", {"language": "python", "code": "import json\nprint(json.dumps(sum(input)))", "input": [1, 2, 3]})
    check(not r.is_error and r.structured_content["output"] == 6, f"{transport}: python {r}")

    # A program that ran and failed is the tool's answer, twice in a row: an
    # agent framework does not spend its tool retries on the model's bugs.
    for code in ["throw new TypeError('nope')", "throw new TypeError('nope again')"]:
        r = await session.call_tool("run_code", {"language": "js", "code": code})
        check(not r.is_error and r.structured_content["outcome"] == "failed", f"{transport}: failure {r}")
        check("TypeError: nope" in r.structured_content["message"], f"{transport}: message {r.structured_content}")
        check(r.content[0].text.startswith("outcome: failed"), f"{transport}: outcome first {r.content[0].text}")
        check(next(iter(r.structured_content)) == "outcome", f"{transport}: outcome first {r.structured_content}")

    # An output schema: the mismatch names the failing place.
    r = await session.call_tool("run_code", {"language": "python", "code": "print('[1, \"two\"]')",
                                             "output_schema": {"type": "array", "items": {"type": "integer"}}})
    s = r.structured_content
    check(not r.is_error and s["outcome"] == "invalid_output" and s["output_errors"][0]["path"] == "/1", f"{transport}: schema {s}")

    # A refusal (no backend runs JS with a network allow-list... nor can a call ask for one):
    # pin a backend that does not run the language.
    r = await session.call_tool("run_code", {"language": "python", "code": "1", "backend": "boa-js"})
    check(r.is_error and r.structured_content["error"]["kind"] == "refused", f"{transport}: refusal {r}")

    # Streaming: the client asked for info logs, so stdout lines arrive as notifications.
    logs.clear()
    await session.set_logging_level("info")
    r = await session.call_tool("run_code", {"language": "python", "code": "for i in range(3):\n    print('line', i)"})
    check(not r.is_error, f"{transport}: streamed run {r}")
    deadline = time.monotonic() + 5
    while len([l for l in logs if l.get("stream") == "stdout"]) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    lines = [l["text"] for l in logs if l.get("stream") == "stdout"]
    check(lines == ["line 0", "line 1", "line 2"], f"{transport}: streamed lines {logs}")

    # Progress: a run over a second reports progress when asked.
    progress = []

    async def on_progress(value, total, message):
        progress.append((value, total))

    r = await session.call_tool("run_code", {"language": "python", "code": "import time\ntime.sleep(1.6)\nprint('done')", "timeout_ms": 4000}, progress_callback=on_progress)
    check(not r.is_error, f"{transport}: slow run {r}")
    check(len(progress) >= 1 and progress[0][1] == 4000.0, f"{transport}: progress {progress}")

    # Sessions.
    r = await session.call_tool("create_session", {"language": "javascript"})
    sid = r.structured_content["session_id"]
    r = await session.call_tool("run_code", {"language": "javascript", "code": "var total = 40", "session_id": sid})
    check(not r.is_error, f"{transport}: session 1 {r}")
    r = await session.call_tool("run_code", {"language": "javascript", "code": "total + 2", "session_id": sid})
    check(r.structured_content["output"] == 42, f"{transport}: session 2 {r}")
    r = await session.call_tool("close_session", {"session_id": sid})
    check(r.structured_content["closed"] is True, f"{transport}: close {r}")
    r = await session.call_tool("run_code", {"language": "javascript", "code": "total", "session_id": sid})
    check(r.is_error and r.structured_content["error"]["kind"] == "unknown_session", f"{transport}: closed session {r}")

    r = await session.call_tool("list_backends", {})
    names = [b["name"] for b in r.structured_content["backends"]]
    check("boa-js" in names and "python-wasm" in names, f"{transport}: backends {names}")
    check("javascript" in r.structured_content["sessions"]["languages"], f"{transport}: session languages")

    # Workspaces (mounting one needs root): a file written, used by a run, read back.
    if os.geteuid() == 0:
        r = await session.call_tool("create_workspace", {"quota_mb": 8})
        check(not r.is_error and r.structured_content["quota_bytes"] == 8 << 20, f"{transport}: create_workspace {r}")
        ws = r.structured_content["workspace_id"]
        data = base64.b64encode(b"21").decode()
        r = await session.call_tool("write_files", {"workspace_id": ws, "files": [{"path": "in.txt", "content_base64": data}]})
        check(not r.is_error and r.structured_content["written"] == 1, f"{transport}: write_files {r}")
        code = "n = int(open('/work/in.txt').read())\nopen('/work/out.txt', 'w').write(str(n * 2))"
        r = await session.call_tool("run_code", {"language": "python", "code": code, "workspace_id": ws})
        check(not r.is_error and r.structured_content["outcome"] == "ok", f"{transport}: run in a workspace {r}")
        r = await session.call_tool("read_files", {"workspace_id": ws, "globs": ["*.txt"]})
        files = {f["path"]: base64.b64decode(f["content_base64"]) for f in r.structured_content["files"]}
        check(files == {"in.txt": b"21", "out.txt": b"42"}, f"{transport}: read_files {r}")
        # Programs (they need a container engine): a REPL driven by write and
        # poll, and a bash `read` answered.
        if os.environ.get("EXECBOX_REQUIRE_CONTAINERS"):
            r = await session.call_tool("start_program", {"workspace_id": ws, "command": ["python3", "-i", "-q"],
                                                          "tty": True, "yield_ms": 10000})
            check(not r.is_error and r.structured_content["status"] == "running"
                  and ">>> " in r.structured_content["output"], f"{transport}: start_program {r}")
            repl = r.structured_content["program_id"]
            r = await session.call_tool("write_program", {"program_id": repl, "data": "print(open('/work/out.txt').read())",
                                                          "newline": True, "yield_ms": 10000})
            check(not r.is_error and "42" in r.structured_content["output"], f"{transport}: write_program {r}")
            r = await session.call_tool("start_program", {"workspace_id": ws, "command": "read -r n; echo \"got $n\""})
            asker = r.structured_content["program_id"]
            r = await session.call_tool("write_program", {"program_id": asker, "data": "7", "newline": True, "yield_ms": 10000})
            out = r.structured_content["output"]
            while r.structured_content["status"] == "running":
                r = await session.call_tool("poll_program", {"program_id": asker, "yield_ms": 10000})
                out += r.structured_content["output"]
            check(out == "got 7\n" and r.structured_content["exit_code"] == 0, f"{transport}: bash read {r}")
            r = await session.call_tool("kill_program", {"program_id": repl, "grace_ms": 500})
            check(r.structured_content["status"] == "killed", f"{transport}: kill_program {r}")
            # A Python session in the workspace: its globals kept, the workspace at /work.
            r = await session.call_tool("create_session", {"language": "python", "workspace_id": ws})
            check(not r.is_error and r.structured_content["workspace_id"] == ws, f"{transport}: session in a workspace {r}")
            sid = r.structured_content["session_id"]
            r = await session.call_tool("run_code", {"language": "python", "session_id": sid,
                                                     "code": "n = int(open('/work/out.txt').read())"})
            check(not r.is_error and r.structured_content["outcome"] == "ok", f"{transport}: session cell {r}")
            r = await session.call_tool("run_code", {"language": "python", "session_id": sid, "code": "print(n + 1)"})
            check(r.structured_content["stdout"].strip() == "43", f"{transport}: session state {r}")
            # A shell session in the workspace: one bash's variables and working directory kept.
            r = await session.call_tool("create_session", {"language": "shell", "workspace_id": ws})
            check(not r.is_error, f"{transport}: shell session {r}")
            sid = r.structured_content["session_id"]
            r = await session.call_tool("run_code", {"language": "shell", "session_id": sid,
                                                     "code": "mkdir -p /tmp/d && cd /tmp/d && n=$(cat /work/out.txt)"})
            check(not r.is_error and r.structured_content["outcome"] == "ok", f"{transport}: shell cell {r}")
            r = await session.call_tool("run_code", {"language": "shell", "session_id": sid, "code": "echo $((n + 2)) $PWD"})
            check(r.structured_content["stdout"] == "44 /tmp/d\n", f"{transport}: shell session state {r}")
        r = await session.call_tool("close_workspace", {"workspace_id": ws})
        check(r.structured_content["closed"] is True, f"{transport}: close_workspace {r}")
        r = await session.call_tool("read_files", {"workspace_id": ws, "globs": ["*"]})
        check(r.is_error, f"{transport}: a closed workspace {r}")

    # Malformed arguments are a tool result the model can read (SEP-1303), not a JSON-RPC error.
    r = await session.call_tool("run_code", {"language": "javascript", "code": "1", "policy": {}})
    check(r.is_error and r.structured_content["error"]["kind"] == "invalid_arguments", f"{transport}: malformed {r}")
    check("policy" in r.structured_content["error"]["message"], f"{transport}: malformed names the field {r}")


def logging_callback(logs):
    async def on_log(params: types.LoggingMessageNotificationParams):
        if isinstance(params.data, dict):
            logs.append(params.data)
    return on_log


async def over_stdio():
    logs = []
    params = StdioServerParameters(command=EXECBOX, args=["serve"])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, logging_callback=logging_callback(logs)) as session:
            await session.initialize()
            await exercise(session, logs, "stdio")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def over_http():
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as f:
        f.write("s3cret-token-for-tests\n")
        token_file = f.name
    server = subprocess.Popen([EXECBOX, "serve", "--http", f"127.0.0.1:{port}", "--token-file", token_file], stderr=subprocess.PIPE, text=True)
    try:
        check("listening" in server.stderr.readline(), "http: the server did not start")
        url = f"http://127.0.0.1:{port}/mcp"
        # Without the token: 401.
        async with httpx2.AsyncClient() as plain:
            response = await plain.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            check(response.status_code == 401, f"http: no token gave {response.status_code}")
        logs = []
        headers = {"Authorization": "Bearer s3cret-token-for-tests"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as client:
            async with streamable_http_client(url, http_client=client) as (read, write, *_):
                async with ClientSession(read, write, logging_callback=logging_callback(logs)) as session:
                    await session.initialize()
                    await exercise(session, logs, "http")
    finally:
        server.terminate()
        code = server.wait(30)
        os.unlink(token_file)
    check(code == 0, f"http: the server exited with {code} on SIGTERM")


async def main():
    await over_stdio()
    await over_http()
    print("ok")


asyncio.run(main())
