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
