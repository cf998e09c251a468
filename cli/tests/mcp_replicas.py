"""`execbox serve` as replicas behind a Kubernetes Service, driven by the
official MCP Python SDK (cli/tests/cli/replicas.rs runs this on the test
cluster, after applying deploy/kubernetes/serve.yaml).

argv: URL TOKEN SOURCES KUBECTL KUBECONFIG
  URL      http://<the Service's ClusterIP>:8931/mcp
  SOURCES  comma-separated local addresses to connect from: the Service keeps
           each source address on one replica (ClientIP affinity), so
           several sources reach several replicas.

Checks, printing a JSON report line per phase and "ok" last:
1. Every source sticks to one replica, and the sources reach both.
2. 200 concurrent calls, over one MCP session per source, are all answered
   with their own result; runs per second through the Service.
3. Python through the kubernetes backend from both replicas at once: every
   run is in a pod of its own (the warm pool is shared by the replicas and
   a pod is never claimed twice: each run prints its pod's name); Rust
   compiled in its pod; Code Mode: code in a pod saves and loads an
   artifact through the replica's artifacts.* tools.
4. One replica is deleted (force, no grace) while 200 calls are in flight:
   calls of the other replica's sessions are all answered; calls of the
   deleted replica's sessions are answered or fail, never hang or get
   another call's answer. A deleted replica's session then reaches another
   replica, which answers unknown_session naming itself, and a new session
   from the same address works.

With MCP_REPLICAS_MEASURE=N it only measures: the median runs per second of
N rounds of phase 2, through however many replicas the Service has.
"""

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

URL, TOKEN, SOURCES, KUBECTL, KUBECONFIG = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4], sys.argv[5]
BASE = URL.rsplit("/mcp", 1)[0]
CALLS = 200
# A call that does not answer in this long is a hung call.
CALL_TIMEOUT = 90


def check(condition, what):
    if not condition:
        raise AssertionError(what)


def http(source, timeout=CALL_TIMEOUT):
    transport = httpx2.AsyncHTTPTransport(local_address=source)
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout, transport=transport)


async def replica_of(source):
    async with http(source, 10) as client:
        r = await client.get(BASE + "/readyz")
        check(r.status_code == 200, f"readyz from {source}: {r.status_code} {r.text}")
        return r.json()["replica"]


async def open_session(stack, source):
    client = await stack.enter_async_context(http(source))
    read, write, *_ = await stack.enter_async_context(streamable_http_client(URL, http_client=client))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


JS = "let x = 0; for (let i = 0; i < input.spin; i++) { x += i % 7; } return {i: input.i, x: x};"


def expected_x(spin):
    return sum(i % 7 for i in range(spin))


async def call(session, i, spin):
    r = await asyncio.wait_for(
        session.call_tool("run_code", {"language": "javascript", "code": JS, "input": {"i": i, "spin": spin}}),
        CALL_TIMEOUT,
    )
    s = r.structured_content or {}
    if r.is_error and "error" in s:
        return f"refused: {s['error']['kind']}"
    check(not r.is_error and s.get("outcome") == "ok", f"call {i}: {r}")
    check(s["output"] == {"i": i, "x": expected_x(spin)}, f"call {i} got another answer: {s['output']}")
    return "ok"


async def calls_from(k, source, spin):
    """Source k's share of CALLS, at once over one MCP session of its own (in
    its own task: a session whose replica goes away fails alone). Per call:
    "ok", "hung", or "lost: why"."""
    mine = list(range(k, CALLS, len(SOURCES)))
    done = {}

    async def one(i):
        try:
            done[i] = await call(session, i, spin)
        except asyncio.TimeoutError:
            done[i] = "hung"
        except AssertionError as e:
            done[i] = f"wrong: {e}"
        except Exception as e:  # a transport error or an MCP error: the call was lost
            done[i] = f"lost: {type(e).__name__}: {e}"

    try:
        async with contextlib.AsyncExitStack() as stack:
            session = await open_session(stack, source)
            await asyncio.gather(*(one(i) for i in mine))
    except Exception as e:
        for i in mine:
            done.setdefault(i, f"lost: the session failed: {type(e).__name__}")
    return [(k, done[i]) for i in mine]


async def load(spin):
    """CALLS calls at once from every source; per call: its source's index and what happened."""
    per_source = await asyncio.gather(*(calls_from(k, s, spin) for k, s in enumerate(SOURCES)))
    return [o for outcomes in per_source for o in outcomes]


async def raw_initialize(source):
    """An MCP session opened by hand: its id, to present again later."""
    async with http(source, 10) as client:
        r = await client.post(URL, headers={"Accept": "application/json, text/event-stream"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "mcp_replicas.py", "version": "0"}}})
        check(r.status_code == 200, f"initialize: {r.status_code} {r.text}")
        return r.headers["mcp-session-id"]


async def measure(rounds):
    """Runs per second through the Service: the median of `rounds` rounds of
    CALLS calls at once (phase 2), whatever the number of replicas."""
    rates = []
    for _ in range(rounds):
        started = time.monotonic()
        outcomes = await load(1000)
        took = time.monotonic() - started
        check(all(o[1] == "ok" for o in outcomes), f"unanswered: {[o for o in outcomes if o[1] != 'ok'][:3]}")
        rates.append(CALLS / took)
    replicas = sorted({await replica_of(s) for s in SOURCES})
    print(json.dumps({"replicas": len(replicas), "rounds": rounds,
                      "median_runs_per_second": round(statistics.median(rates), 1),
                      "runs_per_second": [round(r, 1) for r in rates]}))


async def main():
    if os.environ.get("MCP_REPLICAS_MEASURE"):
        return await measure(int(os.environ["MCP_REPLICAS_MEASURE"]))
    # 1. affinity
    replicas = {}
    for source in SOURCES:
        replicas[source] = await replica_of(source)
        again = await replica_of(source)
        check(again == replicas[source], f"{source} moved from {replicas[source]} to {again}")
    names = sorted(set(replicas.values()))
    print(json.dumps({"phase": "affinity", "replicas": names, "sources": len(SOURCES)}), flush=True)
    check(len(names) == 2, f"the sources reach {names}, not both replicas")

    # 2. 200 concurrent calls, all answered
    started = time.monotonic()
    outcomes = await load(1000)
    took = time.monotonic() - started
    bad = [o for o in outcomes if o[1] != "ok"]
    check(not bad, f"unanswered: {bad[:5]} ({len(bad)})")
    print(json.dumps({"phase": "load", "calls": CALLS, "seconds": round(took, 3),
                      "runs_per_second": round(CALLS / took, 1)}), flush=True)

    # 3. pods from both replicas at once, never one pod twice
    one_source_each = {}
    for source in SOURCES:
        one_source_each.setdefault(replicas[source], source)
    code = "import socket\nprint(socket.gethostname())"

    async def in_pods(source):
        async with contextlib.AsyncExitStack() as stack:
            session = await open_session(stack, source)

            async def one():
                r = await asyncio.wait_for(session.call_tool("run_code", {
                    "language": "python", "code": code, "backend": "kubernetes", "timeout_ms": 30000}), CALL_TIMEOUT)
                s = r.structured_content or {}
                check(not r.is_error and s.get("outcome") == "ok", f"python in a pod: {r}")
                return s["stdout"].strip()
            return await asyncio.gather(*(one() for _ in range(3)))
    per_replica = await asyncio.gather(*(in_pods(s) for s in one_source_each.values()))
    pods = [p for ps in per_replica for p in ps]
    check(len(set(pods)) == len(pods), f"a pod ran twice: {pods}")
    print(json.dumps({"phase": "pods", "runs": len(pods), "distinct_pods": len(set(pods))}), flush=True)

    # 3b. Rust, compiled in its pod's init container, through a replica
    async with contextlib.AsyncExitStack() as stack:
        session = await open_session(stack, SOURCES[0])
        r = await asyncio.wait_for(session.call_tool("run_code", {
            "language": "rust", "code": "fn run(input: Value) -> Value { input }", "input": {"n": 3},
            "backend": "kubernetes", "timeout_ms": 30000}), CALL_TIMEOUT)
        s = r.structured_content or {}
        check(not r.is_error and s.get("outcome") == "ok" and s.get("output") == {"n": 3}, f"rust in a pod: {r}")
    print(json.dumps({"phase": "rust", "outcome": s.get("outcome")}), flush=True)

    # 3c. Code Mode: code in a pod calls the replica's artifacts.* tools
    # through its tool socket (the launcher carries it to the replica)
    async with contextlib.AsyncExitStack() as stack:
        session = await open_session(stack, SOURCES[0])
        code = ("import json, tools\n"
                "saved = tools.artifacts.save(name='note.txt', content='from a pod')\n"
                "loaded = tools.artifacts.load(name='note.txt')\n"
                "print(json.dumps([saved['version'], loaded['content']]))")
        r = await asyncio.wait_for(session.call_tool("run_code", {
            "language": "python", "code": code, "backend": "kubernetes", "timeout_ms": 30000}), CALL_TIMEOUT)
        s = r.structured_content or {}
        check(not r.is_error and s.get("outcome") == "ok" and s.get("output") == [1, "from a pod"],
              f"code mode in a pod: {r}")
        calls = [c.get("tool") for c in s.get("tool_calls", [])]
        check(calls == ["artifacts.save", "artifacts.load"], f"the ledger: {s}")
    print(json.dumps({"phase": "code_mode", "tool_calls": calls}), flush=True)

    # 4. a replica deleted mid-load
    victim = replicas[SOURCES[0]]
    stale = await raw_initialize(SOURCES[0])

    async def delete_victim():
        await asyncio.sleep(1.0)
        await asyncio.to_thread(subprocess.run, [
            KUBECTL, "--kubeconfig", KUBECONFIG, "-n", "execbox", "delete", "pod", victim,
            "--grace-period=0", "--force", "--wait=false"], check=True, capture_output=True)
    deleting = asyncio.create_task(delete_victim())
    outcomes = await load(20000)
    await deleting
    for what in ("hung", "wrong"):
        found = [o for o in outcomes if o[1].startswith(what)]
        check(not found, f"{what} calls: {found[:3]} ({len(found)})")
    survivors = [o for o in outcomes if replicas[SOURCES[o[0]]] != victim]
    lost_elsewhere = [o for o in survivors if o[1] != "ok"]
    check(not lost_elsewhere, f"the other replica lost calls: {lost_elsewhere[:5]} ({len(lost_elsewhere)})")
    # How each of the deleted replica's calls ended: "ok", "refused: <kind>" or "lost".
    on_victim = [o[1] if o[1].startswith(("ok", "refused")) else o[1].split(":")[0]
                 for o in outcomes if replicas[SOURCES[o[0]]] == victim]
    for what in set(on_victim):
        check(what in ("ok", "refused: busy", "lost"), f"the deleted replica's call ended as {what}")
    print(json.dumps({"phase": "delete", "victim": victim, "other_replica_answered": len(survivors),
                      "victim_calls": {w: on_victim.count(w) for w in sorted(set(on_victim))}}), flush=True)

    # The victim's MCP session, presented again, reaches another replica:
    # a 404 whose JSON-RPC error says unknown_session and names that replica.
    deadline = time.monotonic() + 60
    while True:
        try:
            async with http(SOURCES[0], 10) as client:
                r = await client.post(URL, headers={"Accept": "application/json, text/event-stream",
                                                    "mcp-session-id": stale},
                                      json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            break
        except httpx2.TransportError:
            # The Service still had the deleted pod's address for a moment.
            check(time.monotonic() < deadline, "the deleted replica's address never went")
            await asyncio.sleep(0.5)
    check(r.status_code == 404, f"a stale session: {r.status_code} {r.text}")
    error = r.json()["error"]
    check(error["data"]["kind"] == "unknown_session", f"not unknown_session: {error}")
    other = error["data"]["replica"]
    check(other not in (None, victim) and other in error["message"], f"names the wrong replica: {error}")
    # A new session from the same address works, on the replica that remains.
    async with contextlib.AsyncExitStack() as stack:
        await call(await open_session(stack, SOURCES[0]), 0, 10)
    print(json.dumps({"phase": "unknown_session", "answered_by": other}), flush=True)
    print("ok")


asyncio.run(main())
