"""A probe upstream MCP server for Code Mode tests, on the official MCP Python SDK.

    python mcp_upstream_probe.py stdio MARKER_FILE
    python mcp_upstream_probe.py http PORT TOKEN_FILE MARKER_FILE

Tools: `hang(seconds)` sleeps, and appends "cancelled" to MARKER_FILE when the
client cancels it (notifications/cancelled); `whoami()` says what this server
sees: its environment's names, and (over HTTP) whether the client sent the
bearer token. Over HTTP every request without the token gets 401.
"""

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

mode = sys.argv[1]
marker = sys.argv[-1]
server = MCPServer("probe")
seen = {"authorized": None}


@server.tool()
async def hang(seconds: float) -> str:
    """Sleeps, then says so; notes a cancellation in the marker file."""
    try:
        await asyncio.sleep(seconds)
        return "slept"
    except asyncio.CancelledError:
        with open(marker, "a") as f:
            f.write("cancelled\n")
        raise


@server.tool()
async def whoami() -> dict:
    """What this server sees of its own process and its client."""
    return {"env": sorted(os.environ), "authorized": seen["authorized"]}


if mode == "stdio":
    server.run()
else:
    import uvicorn

    port, token = int(sys.argv[2]), open(sys.argv[3]).read().strip()
    app = server.streamable_http_app()

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            seen["authorized"] = True
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")
