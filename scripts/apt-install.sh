#!/usr/bin/env bash
# Installs Debian packages (no recommends, quietly), as root or through sudo,
# from the machine's own apt sources. The install scripts call it for what
# they find missing.
#   scripts/apt-install.sh PACKAGE...
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
