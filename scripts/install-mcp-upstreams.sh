#!/usr/bin/env bash
# A reference upstream MCP server for the Code Mode tests of `execbox serve`
# and `execbox run --upstreams` (cli/tests/cli/mcp_sdks.rs): the MCP project's
# "everything" server from npm, pinned, under the cache dir; and the official
# TypeScript SDK, pinned, whose stdio client drives the server as Node hosts
# do (cli/tests/mcp_ts_client.mjs). Idempotent.
#   EXECBOX_MCP_UPSTREAMS (default ~/.cache/execbox/mcp-upstreams)
set -euo pipefail
version="2026.8.31"
sdk_version="1.32.2"
dir="${EXECBOX_MCP_UPSTREAMS:-${XDG_CACHE_HOME:-$HOME/.cache}/execbox/mcp-upstreams}"
entry="$dir/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "mcp upstreams: installing nodejs and npm (Debian)"
  "$(dirname "$0")/apt-install.sh" nodejs npm
fi
installed() {
  [ -f "$entry" ] && node -e "
    const v = (p) => require('$dir/node_modules/@modelcontextprotocol/' + p + '/package.json').version;
    process.exit(v('server-everything') === '$version' && v('sdk') === '$sdk_version' ? 0 : 1)"
}
if installed; then
  echo "mcp upstreams: $dir has server-everything $version and sdk $sdk_version"
  exit 0
fi
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name": "execbox-mcp-upstreams", "private": true}' > "$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --silent "@modelcontextprotocol/server-everything@$version" \
  "@modelcontextprotocol/sdk@$sdk_version"
installed || { echo "mcp upstreams: server-everything $version and sdk $sdk_version did not install" >&2; exit 1; }
echo "mcp upstreams: installed server-everything $version and sdk $sdk_version in $dir"
