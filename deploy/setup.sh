#!/usr/bin/env bash
# Prepare a fresh Debian machine for fleetcrawl: system packages and .venv.
# Idempotent; every step says what failed. Services are started by
# `fleetcrawl services start` (Redis; FerretDB is built there with Go).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-cli >/dev/null || need_apt+=(redis-tools)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# Chromium's old headless mode: what nodes render with (a fifth less memory and CPU)
[ -x /usr/bin/chromium-headless-shell ] || need_apt+=(chromium-headless-shell)
command -v faketime >/dev/null || need_apt+=(faketime)  # the tests run a node with a wrong clock
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing Debian packages: ${need_apt[*]}"
    $SUDO apt-get update -qq || { echo "setup: apt-get update failed" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null \
        || { echo "setup: apt-get install ${need_apt[*]} failed" >&2; exit 1; }
fi
command -v go >/dev/null || echo "setup: warning: Go is missing; FerretDB cannot be built (set MONGO_URI to use another MongoDB)" >&2

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || { echo "setup: python3 -m venv failed" >&2; exit 1; }
fi
stamp=.venv/.installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    echo "setup: installing Python packages into .venv"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -c constraints.txt -e '.[dev]' \
        || { echo "setup: pip install failed" >&2; exit 1; }
    touch "$stamp"
fi
# The project's own bytecode, as the container image has it: where PYTHONDONTWRITEBYTECODE is
# set (this machine, most container images) Python never writes it, and every node start
# compiled the project's hundred modules again (about 0.09 s). Only changed files are redone.
.venv/bin/python -m compileall -q -j 0 project pipelines spiders tests \
    || { echo "setup: compileall failed" >&2; exit 1; }
