#!/usr/bin/env bash
# The official MCP Python SDK, as a real client for the tests of `execbox
# serve` (cli/tests/cli/mcp_sdks.rs): a venv under the cache dir. Idempotent.
#   EXECBOX_MCP_VENV (default ~/.cache/execbox/mcp-venv)
set -euo pipefail
version="2.3.0"
venv="${EXECBOX_MCP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/execbox/mcp-venv}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import mcp, importlib.metadata as m; assert m.version('mcp') == '$version'" 2>/dev/null; then
  echo "mcp client: $venv has mcp $version"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$version"
"$venv/bin/python" -c "import mcp, importlib.metadata as m; print('mcp client: installed mcp', m.version('mcp'), 'in $venv')"
