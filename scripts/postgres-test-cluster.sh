#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster on a free loopback port (trust auth, fsync off: test data
# only) and prints the URL to use as ISLE_TEST_POSTGRES_URL / isle serve --database.
#   scripts/postgres-test-cluster.sh start   -> prints postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
#   scripts/postgres-test-cluster.sh stop
#   scripts/postgres-test-cluster.sh halt    -> stops the server, keeping the cluster (an outage)
#   scripts/postgres-test-cluster.sh resume  -> starts it again on the same port
# The cluster lives in ${ISLE_PG_DIR:-/tmp/isle-pg}; as root it runs as the postgres user.
# ISLE_PG_FSYNC=on keeps fsync on (benchmarks: durable commits, as in production).
# ISLE_PG_OPTIONS='-c …' adds server settings (profiling: -c shared_preload_libraries=pg_stat_statements).
# ISLE_PG_PASSWORD=… makes a cluster that asks for that password (scram-sha-256) instead of trusting.
set -euo pipefail
DIR="${ISLE_PG_DIR:-/tmp/isle-pg}"
BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[ -n "$BIN" ] || { echo "PostgreSQL is not installed (apt-get install -y postgresql)" >&2; exit 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "${1:-start}" in
  start)
    as_pg "$BIN/pg_ctl" -D "$DIR/data" stop -m fast >/dev/null 2>&1 || true
    rm -rf "$DIR"
    mkdir -p "$DIR"
    if [ "$(id -u)" = 0 ]; then
      chown postgres "$DIR"
      runuser -u postgres -- test -w "$DIR" || { echo "the postgres user cannot reach $DIR (a parent directory is private): set ISLE_PG_DIR to a directory under /tmp" >&2; exit 1; }
    fi
    if [ -n "${ISLE_PG_PASSWORD:-}" ]; then
      # Password authentication (scram-sha-256) for the postgres user, as a production server has.
      printf '%s\n' "$ISLE_PG_PASSWORD" > "$DIR/pwfile"
      [ "$(id -u)" = 0 ] && chown postgres "$DIR/pwfile"
      chmod 600 "$DIR/pwfile"
      as_pg "$BIN/initdb" -D "$DIR/data" --auth=scram-sha-256 --pwfile="$DIR/pwfile" --username=postgres >/dev/null
      rm -f "$DIR/pwfile"
    else
      as_pg "$BIN/initdb" -D "$DIR/data" --auth=trust --username=postgres >/dev/null
    fi
    # The port is free when picked but could be taken before PostgreSQL binds it: three tries.
    for try in 1 2 3; do
      PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
      OPTIONS="-c listen_addresses=127.0.0.1 -p $PORT -c unix_socket_directories=$DIR -c fsync=${ISLE_PG_FSYNC:-off} -c max_connections=300 ${ISLE_PG_OPTIONS:-}"
      if as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -o "$OPTIONS" start >/dev/null; then
        printf '%s\n' "$OPTIONS" > "$DIR/options"
        break
      fi
      if [ "$try" = 3 ]; then
        echo "PostgreSQL did not start; its log ($DIR/log) ends:" >&2; tail -20 "$DIR/log" >&2 || true; exit 1
      fi
    done
    echo "postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=disable"
    ;;
  stop)
    as_pg "$BIN/pg_ctl" -D "$DIR/data" stop -m fast >/dev/null 2>&1 || true
    rm -rf "$DIR" "$DIR.url"
    ;;
  restart)
    as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" restart -m fast -w >/dev/null
    ;;
  halt)
    as_pg "$BIN/pg_ctl" -D "$DIR/data" stop -m fast -w >/dev/null
    ;;
  resume)
    as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -o "$(cat "$DIR/options")" start >/dev/null
    ;;
esac
