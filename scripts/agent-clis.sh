#!/usr/bin/env bash
# The coding agents the test suite drives through Ballast: Claude Code and Codex CLI at
# pinned versions, installed by package name into a directory of this checkout (never
# globally). A run that finds both at their pinned versions does nothing. Prints the
# directory of their executables.
set -euo pipefail
cd "$(dirname "$0")/.."
CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
DIR=${BALLAST_AGENT_CLIS:-$PWD/.agent-clis}

installed() {  # package version -> true when that version is there
  local manifest="$DIR/node_modules/$1/package.json"
  [ -f "$manifest" ] && grep -q "\"version\": \"$2\"" "$manifest"
}

if ! installed @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" \
  || ! installed @openai/codex "$CODEX_VERSION"; then
  command -v npm >/dev/null 2>&1 || { echo "npm is needed to install the agent CLIs" >&2; exit 1; }
  mkdir -p "$DIR"
  npm install --prefix "$DIR" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
fi
echo "$DIR/node_modules/.bin"
