#!/usr/bin/env bash
# The whole test suite: lint, types, then pytest. Run it through `make test`, which installs
# everything first. pytest's "no tests collected" (exit 5) is a failure here, never a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin

echo "== ruff"
"$BIN/ruff" check src tests bench
"$BIN/ruff" format --check src tests bench
echo "== mypy"
"$BIN/mypy"
echo "== browser (Debian's chromium, for the dashboard test)"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: the dashboard test will be skipped" >&2
  fi
fi

echo "== agent CLIs (Claude Code, Codex CLI; pinned, installed into this checkout)"
BALLAST_AGENT_BIN=$(scripts/agent-clis.sh)
export BALLAST_AGENT_BIN

echo "== kubectl (renders deploy/k8s) and nginx (the fleet test's load balancer)"
for tool in kubectl nginx; do
  if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      package=$tool
      [ "$tool" = kubectl ] && ! apt-cache show kubectl >/dev/null 2>&1 && package=kubernetes-client
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
    else
      echo "$tool is missing: the tests that need it will be skipped" >&2
    fi
  fi
done

echo "== services (Redis, PostgreSQL)"
services_dir=$(mktemp -d)
export BALLAST_SERVICES_DIR="$services_dir"
# Free loopback ports, so a second run (or a developer's own services) never collides.
read -r BALLAST_TEST_REDIS_PORT BALLAST_TEST_PG_PORT < <("$BIN/python" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
')
export BALLAST_TEST_REDIS_PORT BALLAST_TEST_PG_PORT
trap 'scripts/services.sh stop; rm -rf "$services_dir"' EXIT
eval "$(scripts/services.sh start)"

echo "== pytest"
set +e
"$BIN/pytest" -q "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
