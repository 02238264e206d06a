#!/usr/bin/env bash
# Starts the real Redis and PostgreSQL the integration tests need, on loopback ports of
# their own, in a throwaway directory; prints the environment to export. Installs them with
# apt-get when missing (Debian, as root, as on CI); elsewhere it says what is missing.
#   eval "$(scripts/services.sh start)"      scripts/services.sh stop
set -euo pipefail

DIR=${BALLAST_SERVICES_DIR:-/tmp/ballast-test-services}
REDIS_PORT=${BALLAST_TEST_REDIS_PORT:-6391}
PG_PORT=${BALLAST_TEST_PG_PORT:-5491}

find_pg_bin() {
  if command -v pg_ctl >/dev/null 2>&1; then dirname "$(readlink -f "$(command -v pg_ctl)")"; return; fi
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

install_missing() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  [ -n "$(find_pg_bin)" ] || missing+=(postgresql)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${missing[@]}" >&2
  else
    echo "missing: ${missing[*]} (install them, or put them on PATH)" >&2
    exit 1
  fi
}

start() {
  install_missing
  stop >/dev/null 2>&1 || true
  rm -rf "$DIR" && mkdir -p "$DIR"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" --dir "$DIR" >&2
  local bin; bin=$(find_pg_bin)
  local run_as=()
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    chown -R postgres "$DIR"
    run_as=(runuser -u postgres --)
  fi
  "${run_as[@]}" "$bin/initdb" -D "$DIR/pg" -U ballast --auth=trust >"$DIR/initdb.log" 2>&1
  "${run_as[@]}" "$bin/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w \
    -o "-p $PG_PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >&2
  "${run_as[@]}" "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U ballast ballast >&2
  for _ in $(seq 50); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  echo "export BALLAST_TEST_REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
  echo "export BALLAST_TEST_DATABASE_URL=postgresql+asyncpg://ballast@127.0.0.1:$PG_PORT/ballast"
}

stop() {
  if [ -f "$DIR/redis.pid" ]; then kill "$(cat "$DIR/redis.pid")" 2>/dev/null || true; fi
  if [ -d "$DIR/pg" ]; then
    local bin; bin=$(find_pg_bin)
    if [ "$(id -u)" = 0 ]; then
      runuser -u postgres -- "$bin/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1 || true
    else
      "$bin/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1 || true
    fi
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
