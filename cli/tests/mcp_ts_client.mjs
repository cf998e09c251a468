// `execbox serve` through the official MCP TypeScript SDK over stdio, as
// most MCP hosts (Node) start a server: Node gives the child a socket pair
// for its stdin and stdout, not pipes, so this drives the server's
// socket-on-the-reactor path (src/serve/stdio_io.rs).
//
// node cli/tests/mcp_ts_client.mjs <execbox binary> <@modelcontextprotocol/sdk dir>
// Prints "ok" last when every check held.

import { pathToFileURL } from "node:url";

const [, , execbox, sdk] = process.argv;
const load = (path) => import(pathToFileURL(`${sdk}/dist/esm/${path}`).href);
const { Client } = await load("client/index.js");
const { StdioClientTransport } = await load("client/stdio.js");

function check(condition, what, detail) {
  if (!condition) {
    console.log(`FAILED: ${what}: ${JSON.stringify(detail)}`);
    process.exit(1);
  }
}

const transport = new StdioClientTransport({ command: execbox, args: ["serve"], stderr: "ignore" });
const client = new Client({ name: "execbox-ts-test", version: "1.0.0" });
await client.connect(transport);
const pid = transport.pid;
const run = (args) => client.callTool({ name: "run_code", arguments: args });

const { tools } = await client.listTools();
check(tools.some((t) => t.name === "run_code"), "run_code is listed", tools.map((t) => t.name));

let r = await run({ language: "javascript", code: "return input.items.map(x => x * 2)", input: { items: [1, 2, 3] } });
check(!r.isError && JSON.stringify(r.structuredContent.output) === "[2,4,6]", "the JS transform", r);

r = await run({ language: "python", code: "print(6 * 7)" });
check(!r.isError && r.structuredContent.stdout === "42\n", "Python", r);

// Calls in flight at once: every answer comes back to its own call.
const many = await Promise.all(
  Array.from({ length: 24 }, (_, i) => run({ language: "javascript", code: `return ${i} * 3` })),
);
many.forEach((m, i) => check(!m.isError && m.structuredContent.output === i * 3, `concurrent call ${i}`, m));

// An answer far larger than a socket's buffer crosses whole.
r = await run({ language: "javascript", code: "return 'x'.repeat(600000)" });
check(!r.isError && r.structuredContent.output.length === 600000, "a 600 kB answer", r.structuredContent?.message);

// Hostile code ends typed, and the server answers the next call.
r = await run({ language: "javascript", code: "while (true) {}", timeout_ms: 300 });
// (A program that ran is the tool's answer, not a failed call.)
check(!r.isError && r.structuredContent.outcome === "timed_out", "an endless loop times out", r.structuredContent);
r = await run({ language: "javascript", code: "return 1" });
check(!r.isError && r.structuredContent.output === 1, "a call after the endless loop", r);

// A workspace (mounting one needs root): a file from one run read by the next, in another language's backend.
if (process.getuid() === 0) {
  const call = (name, args) => client.callTool({ name, arguments: args });
  r = await call("create_workspace", {});
  check(!r.isError && typeof r.structuredContent.workspace_id === "string", "create_workspace", r);
  const workspace_id = r.structuredContent.workspace_id;
  r = await run({ language: "python", code: "open('/work/note.txt', 'w').write('from python')", workspace_id });
  check(!r.isError && r.structuredContent.outcome === "ok", "a Python run writes into the workspace", r);
  r = await run({ language: "shell", code: "cat /work/note.txt", workspace_id });
  // Shell needs a container engine: without one (and not required) it is refused.
  const noEngine = r.isError && r.structuredContent.error?.kind === "refused" && !process.env.EXECBOX_REQUIRE_CONTAINERS;
  check(noEngine || (!r.isError && r.structuredContent.stdout === "from python"), "a shell run reads it", r.structuredContent);
  r = await call("read_files", { workspace_id, globs: ["*.txt"] });
  check(!r.isError && r.structuredContent.files.length === 1, "read_files", r.structuredContent);
  // The host's record of it: the file read back, with its size and hash.
  r = await call("describe_workspace", { workspace_id });
  const out = r.structuredContent?.metadata?.outputs ?? [];
  check(!r.isError && out.length === 1 && out[0].path === "note.txt" && out[0].via === "collect"
        && out[0].size === 11 && out[0].sha256.length === 64, "describe_workspace", r.structuredContent);
  // A program (it needs a container engine): started, written to, polled to its exit code.
  if (!noEngine) {
    r = await call("start_program", { workspace_id, command: "read -r line; echo \"$line\" | tr a-z A-Z; exit 4" });
    check(!r.isError && r.structuredContent.status === "running", "start_program", r.structuredContent);
    const program_id = r.structuredContent.program_id;
    r = await call("write_program", { program_id, data: "shout", newline: true, yield_ms: 10000 });
    let output = r.structuredContent.output;
    while (r.structuredContent.status === "running") {
      r = await call("poll_program", { program_id, yield_ms: 10000 });
      output += r.structuredContent.output;
    }
    check(output === "SHOUT\n" && r.structuredContent.exit_code === 4, "a program polled to its exit", r.structuredContent);
  }
  r = await call("close_workspace", { workspace_id });
  check(r.structuredContent.closed === true, "close_workspace", r);
}

await client.close();
let alive = true;
try {
  process.kill(pid, 0);
} catch {
  alive = false;
}
check(!alive, "the server is gone once the client closed", pid);
console.log("ok");
