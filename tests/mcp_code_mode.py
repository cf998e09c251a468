"""Code Mode through `execbox serve`, with the official MCP Python SDK as the
client and the MCP project's "everything" server as a real upstream.

Run by tests/mcp_python.rs:  python mcp_code_mode.py EXECBOX_BINARY EVERYTHING_ENTRY_JS
Checks: the catalog in run_code's description; JS and Python code calling
upstream tools; the ledger in the result; approval by elicitation (accept,
decline); the upstream's environment is its own (not the server's); a run
that ends mid-call; an upstream that cannot start is reported, not fatal.
Prints "ok" at the end; any failed check raises.
"""

import asyncio
import json
import os
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

EXECBOX, EVERYTHING = sys.argv[1], sys.argv[2]


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


async def main():
    config = {"mcpServers": {
        "everything": {"command": "node", "args": [EVERYTHING, "stdio"], "requireApproval": ["get-env"]},
        "broken": {"command": "/nonexistent/mcp-server"},
    }}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
        path = f.name
    env = dict(os.environ, EXECBOX_TEST_SECRET="must-not-reach-upstreams")
    params = StdioServerParameters(
        command=EXECBOX, args=["serve", "--upstreams", path, "--allow-tool", "everything.*"], env=env)
    try:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, elicitation_callback=on_elicit) as session:
                await session.initialize()
                await exercise(session)
    finally:
        os.unlink(path)
    print("ok")


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
    check(r.is_error and s["outcome"] == "timed_out", f"mid-call {s}")
    check(s["tool_calls"][0]["outcome"] == "unknown", f"mid-call ledger {s['tool_calls']}")
    r, s = await run(session, "javascript", "return await tools.everything.echo({message: 'still here'})")
    check(not r.is_error and s["output"] == "Echo: still here", f"after {s}")

    # Not granted: another namespace.
    r, s = await run(session, "javascript",
                     "try { await tools.call('broken.x', {}) } catch (e) { return e.kind }")
    check(s["output"] == "not_granted", f"not granted {s}")


asyncio.run(main())
