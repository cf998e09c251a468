"""Code Mode through `execbox serve`, with the official MCP Python SDK as the
client and the MCP project's "everything" server as a real upstream.

Run by cli/tests/cli/mcp_sdks.rs:  python mcp_code_mode.py EXECBOX_BINARY EVERYTHING_ENTRY_JS
Checks: the catalog in run_code's description; JS and Python code calling
upstream tools; the ledger in the result; approval by elicitation (accept,
decline); the upstream's environment is its own (not the server's); a run
that ends mid-call, its call cancelled upstream; a streamable-HTTP upstream
with a bearer token from a file, which never reaches the sandbox; an
upstream that cannot start is reported, not fatal.
Prints "ok" at the end; any failed check raises.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

EXECBOX, EVERYTHING = sys.argv[1], sys.argv[2]
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcp_upstream_probe.py")
TOKEN = "upstream-token-7f3a9c"  # must never reach the sandbox


def check(condition, what):
    if not condition:
        raise AssertionError(what)


answers = []  # what the person says to each approval question, in order
asked = []


async def on_elicit(context, params):
    asked.append(params.message)
    action = answers.pop(0) if answers else "decline"
    return types.ElicitResult(action=action, content={"approve": True} if action == "accept" else None)


async def run(session, language, code, **extra):
    r = await session.call_tool("run_code", {"language": language, "code": code, **extra})
    return r, r.structured_content


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main():
    with tempfile.TemporaryDirectory() as work:
        await in_dir(work)


async def in_dir(work):
    token_file, marker = os.path.join(work, "token"), os.path.join(work, "cancelled")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    port = free_port()
    http_probe = subprocess.Popen([sys.executable, PROBE, "http", str(port), token_file, marker])
    config = {"mcpServers": {
        "everything": {"command": "node", "args": [EVERYTHING, "stdio"], "requireApproval": ["get-env"]},
        "probe": {"command": sys.executable, "args": [PROBE, "stdio", marker], "env": {"PROBE_ONLY": "1"}},
        "probehttp": {"url": f"http://127.0.0.1:{port}/mcp", "bearerTokenFile": token_file},
        "broken": {"command": "/nonexistent/mcp-server"},
    }}
    path = os.path.join(work, "upstreams.json")
    with open(path, "w") as f:
        json.dump(config, f)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            await asyncio.sleep(0.1)
    env = dict(os.environ, EXECBOX_TEST_SECRET="must-not-reach-upstreams")
    grants = ["--allow-tool", "everything.*", "--allow-tool", "probe.*", "--allow-tool", "probehttp.*"]
    params = StdioServerParameters(command=EXECBOX, args=["serve", "--upstreams", path, *grants], env=env)
    try:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, elicitation_callback=on_elicit) as session:
                await session.initialize()
                await exercise(session)
                await probe(session, marker)
    finally:
        http_probe.terminate()
        http_probe.wait(10)
    print("ok")


async def probe(session, marker):
    # A run that ends mid-call cancels the call upstream (notifications/cancelled).
    r, s = await run(session, "javascript", "await tools.probe.hang({seconds: 60})", timeout_ms=1000)
    check(s["outcome"] == "timed_out" and s["tool_calls"][0]["outcome"] == "unknown", f"hang {s}")
    deadline = time.monotonic() + 10
    while not (os.path.exists(marker) and "cancelled" in open(marker).read()) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    check(os.path.exists(marker), "the upstream call was not cancelled when the run ended")

    # A stdio upstream gets its configured environment, not the server's.
    r, s = await run(session, "javascript", "return await tools.probe.whoami({})")
    check(not r.is_error and "PROBE_ONLY" in s["output"]["env"], f"probe env {s}")
    check("EXECBOX_TEST_SECRET" not in s["output"]["env"], f"the server's environment reached an upstream {s}")

    # Streamable HTTP with a bearer token from a file: it reaches the upstream...
    r, s = await run(session, "javascript", "return await tools.probehttp.whoami({})")
    check(not r.is_error and s["output"]["authorized"] is True, f"http upstream {s}")

    # ...and never the sandbox, whatever the code looks at.
    r, s = await run(session, "javascript",
                     "const seen = [];\n"
                     "for (const k of Object.getOwnPropertyNames(globalThis)) { try { seen.push(k + '=' + String(globalThis[k])); } catch (e) {} }\n"
                     "seen.push(JSON.stringify(await tools.describe('probehttp.whoami')));\n"
                     "seen.push(JSON.stringify(await tools.list()));\n"
                     "return seen.join('\\n')")
    check(not r.is_error and TOKEN not in json.dumps(s), f"js saw the token {s}")
    r, s = await run(session, "python",
                     "import os, json, sys, tools\n"
                     "print(json.dumps([dict(os.environ), sys.argv, tools.list(), tools.describe('probehttp.whoami')]))")
    check(not r.is_error and TOKEN not in json.dumps(s), f"python saw the token {s}")


async def exercise(session):
    tools = {t.name: t for t in (await session.list_tools()).tools}
    description = tools["run_code"].description
    check("everything: {" in description and "echo(args:" in description and '"get-sum"(args:' in description,
          f"catalog: {description[-800:]}")

    r = await session.call_tool("list_backends", {})
    upstreams = {u["name"]: u for u in r.structured_content["tools"]["upstreams"]}
    check(upstreams["everything"]["connected"] is True, f"upstreams {upstreams}")
    check(upstreams["broken"]["connected"] is False and upstreams["broken"]["reason"], f"broken {upstreams}")

    # JavaScript: a round trip, and the ledger in the result.
    r, s = await run(session, "javascript",
                     "const a = await tools.everything.echo({message: 'hi'});\n"
                     "const b = await tools.call('everything.get-sum', {a: 2, b: 3});\n"
                     "return [a, b]")
    check(not r.is_error and s["output"] == ["Echo: hi", "The sum of 2 and 3 is 5."], f"js {s}")
    check([c["tool"] for c in s["tool_calls"]] == ["everything.echo", "everything.get-sum"], f"ledger {s['tool_calls']}")
    check(all(c["outcome"] == "ok" for c in s["tool_calls"]), f"ledger outcomes {s['tool_calls']}")

    # Python (CPython in wasm): the same tools, synchronously.
    r, s = await run(session, "python",
                     "import json, tools\n"
                     "print(json.dumps(tools.call('everything.echo', {'message': 'py'})))")
    check(not r.is_error and s["output"] == "Echo: py", f"python {s}")

    # Approval: accepted, then declined. The upstream's environment is its own.
    answers.extend(["accept", "decline"])
    r, s = await run(session, "javascript",
                     "const env = await tools.call('everything.get-env', {});\n"
                     "let second;\n"
                     "try { await tools.call('everything.get-env', {}); second = 'ran'; }\n"
                     "catch (e) { second = e.kind + ': ' + e.message; }\n"
                     "return {env: JSON.stringify(env), second}")
    check(not r.is_error, f"approval run {s}")
    check(len(asked) == 2 and "everything.get-env" in asked[0], f"questions {asked}")
    check("must-not-reach-upstreams" not in s["output"]["env"], "the server's environment reached an upstream")
    check(s["output"]["second"].startswith("denied: not approved: declined"), f"declined {s['output']}")
    check([c["outcome"] for c in s["tool_calls"]] == ["ok", "refused"], f"approval ledger {s['tool_calls']}")

    # A run that ends mid-call: timed out, the call unknown, the server fine.
    r, s = await run(session, "javascript",
                     "await tools.call('everything.trigger-long-running-operation', {duration: 30, steps: 3});",
                     timeout_ms=1500)
    check(not r.is_error and s["outcome"] == "timed_out", f"mid-call {s}")
    check(s["tool_calls"][0]["outcome"] == "unknown", f"mid-call ledger {s['tool_calls']}")
    r, s = await run(session, "javascript", "return await tools.everything.echo({message: 'still here'})")
    check(not r.is_error and s["output"] == "Echo: still here", f"after {s}")

    # Not granted: another namespace.
    r, s = await run(session, "javascript",
                     "try { await tools.call('broken.x', {}) } catch (e) { return e.kind }")
    check(s["output"] == "not_granted", f"not granted {s}")


asyncio.run(main())
