#!/usr/bin/env bash
# CI's release check: build the tarball, check its files' modes and owners, check the binary needs
# no Swift library (ldd), run `isle --version`, `isle demo` and `isle sim` (with curl pushing to it)
# from the unpacked tarball in an empty directory, then follow the installation lines at the top of its isle.service as written, in a
# temporary root, and run the installed unit's server until GET /ready answers and SIGTERM stops it.
#   scripts/check-release.sh            # builds dist/isle-….tar.gz with scripts/release.sh first
#   scripts/check-release.sh TARBALL    # checks a tarball built before (no build)
# As root (CI: a Debian container without systemd) it creates the unit's user for real (and removes
# it afterwards if it created it); as another user it installs everything as that user instead.
set -euo pipefail
TARBALL=""
if [ $# -gt 0 ]; then TARBALL=$(realpath "$1"); fi
cd "$(dirname "$0")/.."
REPO_ROOT=$PWD
[ -n "$TARBALL" ] || TARBALL=$(realpath "$(bash scripts/release.sh | tail -1)")

fail() { echo "release check: $*" >&2; exit 1; }
WORK=$(mktemp -d)
EMPTY="" ROOT="" SERVER_PID="" CREATED_USER="" CREATED_GROUP=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill -KILL "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK" ${EMPTY:+"$EMPTY"} ${ROOT:+"$ROOT"}
  if [ -n "$CREATED_USER" ]; then userdel "$CREATED_USER" || echo "release check: could not remove the user $CREATED_USER it created" >&2; fi
  if [ -n "$CREATED_GROUP" ] && getent group "$CREATED_GROUP" >/dev/null; then groupdel "$CREATED_GROUP" || echo "release check: could not remove the group $CREATED_GROUP it created" >&2; fi
}
trap cleanup EXIT

# --- The tarball's files: root's, with the modes the installation copies --------------------------
# isle.json is 0600 because `isle serve --config` refuses a file others can read.
tar --numeric-owner -tvzf "$TARBALL" | awk '
  BEGIN { want["/"] = "drwxr-xr-x"; want["/isle"] = "-rwxr-xr-x"; want["/isle.service"] = "-rw-r--r--"
          want["/isle.json"] = "-rw-------"; want["/README.txt"] = "-rw-r--r--" }
  { name = $NF; sub(/^[^\/]*/, "", name)
    if (!(name in want)) { print "unexpected file " $NF; bad = 1; next }
    if ($1 != want[name] || $2 != "0/0") { print $NF " is " $1 " " $2 ", not " want[name] " 0/0"; bad = 1 }
    seen[name] = 1 }
  END { for (n in want) if (!(n in seen)) { print "missing " n; bad = 1 }; exit bad }' >&2 \
  || fail "the tarball's files do not have the modes and owners above"

tar -C "$WORK" -xzf "$TARBALL"
BIN=$(ls -d "$WORK"/isle-*/isle)
DIR=$(dirname "$BIN")
if ldd "$BIN" | grep -Ei 'libswift|libFoundation|libdispatch|libBlocksRuntime|not found'; then
  echo "release check: the binary needs libraries a machine without Swift lacks"; exit 1
fi
EMPTY=$(mktemp -d)
(cd "$EMPTY" && env -i PATH=/usr/bin:/bin HOME="$EMPTY" "$BIN" --version | grep -q "^isle .*(commit ") || { echo "release check: isle --version does not name its commit"; exit 1; }
(cd "$EMPTY" && env -i PATH=/usr/bin:/bin HOME="$EMPTY" "$BIN" demo > "$WORK/demo.log" 2>&1) || { tail -20 "$WORK/demo.log"; echo "release check: isle demo failed from the tarball"; exit 1; }
# isle sim from the tarball, for a team without Swift: started in the empty directory, a third-party
# client (curl --http2, with the tarball's isle jwt) pushes a start, an update, an end, a widgets push
# and a broadcast to it, and the simulated phone shows each (scripts/try-third-party.sh).
(cd "$EMPTY" && env -i PATH=/usr/bin:/bin HOME="$EMPTY" bash "$REPO_ROOT/scripts/try-third-party.sh" --only curl "$BIN") > "$WORK/sim.log" 2>&1 \
  || { tail -40 "$WORK/sim.log"; echo "release check: isle sim from the tarball did not take a third-party client's pushes"; exit 1; }
rm -rf "$EMPTY"; EMPTY=""
# docs/simulator.md's copy-paste CI job, as written, with this tarball, in an empty directory.
JOB=$(awk '/^### A CI job, copy-paste/ { s = 1; next } s && /^```sh$/ { f = 1; next } f && /^```$/ { exit } f { print }' docs/simulator.md)
[ -n "$JOB" ] || fail "docs/simulator.md has no CI job (### A CI job, copy-paste, then a sh block)"
EMPTY=$(mktemp -d)
(cd "$EMPTY" && env -i PATH=/usr/bin:/bin HOME="$EMPTY" ISLE_TARBALL="$TARBALL" bash -euo pipefail -c "$JOB") > "$WORK/job.log" 2>&1 \
  || { tail -30 "$WORK/job.log"; fail "docs/simulator.md's CI job failed with the tarball"; }
rm -rf "$EMPTY"; EMPTY=""

# --- The installation lines of isle.service, as written, in a temporary root ---------------------
# The lines are the comment lines that start with "#   ". docs/server.md shows the same lines.
UNIT="$DIR/isle.service"
mapfile -t LINES < <(sed -n 's/^#   //p' "$UNIT")
[ ${#LINES[@]} -gt 0 ] || fail "isle.service has no installation lines (comment lines starting with '#   ')"
DOC_LINES=$(awk '/^## Install from a release/ { s = 1; next } s && /^## / { exit } s && /^```sh$/ { f = 1; next } f && /^```$/ { exit } f { print }' docs/server.md)
if [ "$DOC_LINES" != "$(sed -n 's/^#   //p' packaging/isle.service)" ]; then
  diff <(echo "$DOC_LINES") <(sed -n 's/^#   //p' packaging/isle.service) >&2 || true
  fail "the installation lines in docs/server.md (Install from a release) differ from packaging/isle.service's"
fi
unit() { sed -n "s/^$1=//p" "$UNIT"; }
UNIT_USER=$(unit User); UNIT_GROUP=$(unit Group); UNIT_GROUP=${UNIT_GROUP:-$UNIT_USER}
[ -n "$UNIT_USER" ] || fail "isle.service has no User="

# A system path in a line moves under $ROOT; any other absolute path left in a line fails the check
# (as root, a line must never touch the machine outside $ROOT).
ROOT=$(mktemp -d /tmp/isle-check-root.XXXXXX)   # under /tmp: the unit's user must reach it
chmod 0755 "$ROOT"
rewrite() { ROOT="$ROOT" perl -pe 's{(^|[\s=<>(:"'\''])(/etc/isle|/var/lib/isle|/usr/local/bin|/etc/systemd/system)(?=/|[\s);"'\'']|$)}{$1$ENV{ROOT}$2}g' <<<"$1"; }
outside() { grep -oE "(^|[[:space:]=<>(:\"'])/[^[:space:]);\"'<>]*" <<<"$1" | sed 's|^[^/]||' | while read -r p; do
  case $p in "$ROOT" | "$ROOT"/*) ;; /usr/sbin/nologin | /dev/null) ;; *) echo "$p" ;; esac
done || true; }
# What exists on any Debian system before the lines run.
(umask 022 && mkdir -p "$ROOT/etc/systemd/system" "$ROOT/var/lib" "$ROOT/usr/local/bin")

# The operator's Apple key: a P-256 key made here stands in for AuthKey_<KEYID>.p8.
BUNDLE=com.example.releasecheck KEY_ID=RELCHECK01 TEAM_ID=RELTEAM001
command -v openssl >/dev/null || fail "openssl is needed to make a stand-in .p8 key"
(umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$DIR/AuthKey_$KEY_ID.p8" 2>/dev/null) || fail "openssl could not make a P-256 key"

if [ "$(id -u)" = 0 ]; then AS_ROOT=1; else AS_ROOT=""; fi
ME=$(id -un); MY_GROUP=$(id -gn)
SWITCHES=0 SYSTEMCTL=0
for ORIGINAL in "${LINES[@]}"; do
  line=${ORIGINAL//AuthKey_….p8/AuthKey_$KEY_ID.p8}
  line=${line//--bundle-id …/--bundle-id $BUNDLE}
  line=${line//--key-id …/--key-id $KEY_ID}
  line=${line//--team-id …/--team-id $TEAM_ID}
  [[ $line != *…* ]] || fail "a placeholder the check does not know: $ORIGINAL"
  line=$(rewrite "$line")
  bad=$(outside "$line")
  [ -z "$bad" ] || fail "this line names a path the check does not move under its temporary root ($bad): $ORIGINAL"
  case $line in
    *systemctl*)
      # No systemd in CI: the unit's server is started by hand below instead.
      SYSTEMCTL=1; continue ;;
    useradd\ *)
      [ -n "$AS_ROOT" ] || continue   # not root: everything is installed as the current user
      NEW_USER=${line##* }
      if getent passwd "$NEW_USER" >/dev/null; then echo "release check: the user $NEW_USER exists already; kept as it is"; continue; fi
      getent group "$NEW_USER" >/dev/null && NEW_GROUP="" || NEW_GROUP=$NEW_USER ;;
  esac
  if [[ $line == *"sudo -u "* || $line == *"runuser -u "* ]]; then SWITCHES=$((SWITCHES + 1)); fi
  if [ -n "$AS_ROOT" ]; then
    # A minimal Debian has no sudo; runuser (util-linux) is always there and does the same for root.
    # (A "sudo -u u VAR=value cmd" line would need env: runuser takes no assignments.)
    if ! command -v sudo >/dev/null; then line=$(sed -E 's/(^|[;&|(][[:space:]]*)sudo -u ([^[:space:]]+) /\1runuser -u \2 -- /g' <<<"$line"); fi
  else
    # Not root: no user switch, and the current user and group own what root, the unit's user and
    # its group would own.
    line=$(sed -E -e 's/(^|[;&|(][[:space:]]*)(sudo -u [^[:space:]]+|runuser -u [^[:space:]]+ --) /\1/g' \
      -e "s/(^|[[:space:]])-o (root|$UNIT_USER)( |\$)/\1-o $ME\3/g" -e "s/(^|[[:space:]])-g (root|$UNIT_GROUP|$UNIT_USER)( |\$)/\1-g $MY_GROUP\3/g" \
      -e "s/(^|[;&|(][[:space:]]*)chown [^[:space:]]+ /\1chown $ME:$MY_GROUP /g" <<<"$line")
  fi
  # A root shell on Debian: umask 022, the system's PATH, in the unpacked tarball's directory.
  if ! (cd "$DIR" && umask 022 && PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -euo pipefail -c "$line") > "$WORK/step.log" 2>&1; then
    cat "$WORK/step.log" >&2
    fail "this installation line failed: $ORIGINAL (run as: $line)"
  fi
  if [[ $line == useradd\ * ]]; then CREATED_USER=$NEW_USER CREATED_GROUP=$NEW_GROUP; fi
done
[ "$SYSTEMCTL" = 1 ] || fail "the installation lines never start the service (systemctl … enable --now isle)"
[ "$SWITCHES" -gt 0 ] || fail "no installation line runs isle as the unit's user $UNIT_USER"

# The modes (and, as root, owners) the lines promise. `isle serve` refuses a --config or master
# key file others can read; the database and its companions must be the unit's user's alone.
expect() {
  local got
  got=$(stat -c '%a %U %G' "$ROOT/$1" 2>/dev/null) || fail "the installation lines did not create /$1"
  if [ -n "$AS_ROOT" ]; then [ "$got" = "$2 $3 $4" ] || fail "/$1 is mode/owner/group $got, not $2 $3 $4"
  else [ "${got%% *}" = "$2" ] || fail "/$1 is mode ${got%% *}, not $2"; fi
}
expect etc/isle 750 root "$UNIT_GROUP"
expect etc/isle/isle.json 600 "$UNIT_USER" "$UNIT_GROUP"
expect etc/isle/master.key 600 "$UNIT_USER" "$UNIT_GROUP"
expect var/lib/isle 700 "$UNIT_USER" "$UNIT_GROUP"
expect var/lib/isle/isle.sqlite 600 "$UNIT_USER" "$UNIT_GROUP"
expect usr/local/bin/isle 755 root root
expect etc/systemd/system/isle.service 644 root root
[ -z "$(find "$ROOT" -name '*.p8')" ] || fail "a .p8 key is left under the installed system: $(find "$ROOT" -name '*.p8')"
private() {
  local open
  open=$(find "$ROOT/etc/isle" "$ROOT/var/lib/isle" -mindepth 1 -perm /o=rwx)
  [ -z "$open" ] || fail "others can use $open"
}
private

# The database the lines filled is the one the installed config serves.
CONFIG_DB=$(sed -n 's/^[[:space:]]*"database":[[:space:]]*"\([^"]*\)".*/\1/p' "$ROOT/etc/isle/isle.json")
ADD_DB=$(printf '%s\n' "${LINES[@]}" | sed -n 's/.* app add .*--database \([^[:space:]]*\).*/\1/p' | head -1)
[ -n "$CONFIG_DB" ] && [ "$CONFIG_DB" = "$ADD_DB" ] || fail "isle.json serves the database \"$CONFIG_DB\", but the installation lines add the app to \"$ADD_DB\""

# --- The unit's server, as systemd would start it --------------------------------------------------
# ExecStart= with its Environment=, UMask=, LimitNOFILE=, NoNewPrivileges and, as root, its User=
# and Group= (setpriv execs in place, so SIGTERM reaches isle itself, as systemd sends it), in /
# (the temporary root). Flags win over the config file and the environment: --host 127.0.0.1 (never
# anything but loopback), --port 0 (a free port; the banner says which) and --database moved under
# the temporary root. GET /ready needs no key and no app: it answers 200 {"status":"ready"} once the
# database answers (503 until then; "degraded", still 200, when an app is paused), so that is what
# is waited for; the banner must list the app the lines added.
[ "$(grep -c '^ExecStart=' "$UNIT")" = 1 ] || fail "isle.service must have one ExecStart="
EXEC=$(unit ExecStart)
case $EXEC in [-@+!:]*) fail "ExecStart= with a prefix (-@+!:) is not something this check knows how to run" ;; esac
[ -z "$(outside "$(rewrite "$EXEC")")" ] || fail "ExecStart= names a path the check does not move: $EXEC"
read -r -a EXEC_ARGS <<<"$(rewrite "$EXEC")"
ENV_ARGS=()
while IFS= read -r e; do
  case $e in *[\"\'\\%\$]*) fail "Environment=$e: quotes, escapes and specifiers are not something this check parses" ;; esac
  read -r -a assignments <<<"$(rewrite "$e")"
  ENV_ARGS+=("${assignments[@]}")
done < <(unit Environment)
UMASK=$(unit UMask); UMASK=${UMASK:-0022}
STOP=$(sed -n 's/^TimeoutStopSec=\([0-9][0-9]*\)s\{0,1\}$/\1/p' "$UNIT"); STOP=${STOP:-90}
KILL_SIGNAL=$(unit KillSignal); [ "${KILL_SIGNAL:-SIGTERM}" = SIGTERM ] || fail "KillSignal=$KILL_SIGNAL: the check stops the server with SIGTERM"
NOFILE=$(unit LimitNOFILE)
if [ -n "$NOFILE" ] && ! (ulimit -n "$NOFILE") 2>/dev/null; then
  echo "release check: note: this machine does not let the check set LimitNOFILE=$NOFILE (hard limit $(ulimit -Hn)); the server runs with the current limit"
  NOFILE=""
fi
SERVE_DB=$(rewrite "$CONFIG_DB")
SWITCH=(setpriv --no-new-privs)
if [ -n "$AS_ROOT" ]; then
  SWITCH+=(--reuid="$UNIT_USER" --regid="$UNIT_GROUP" --init-groups)
  RUN_HOME=$(getent passwd "$UNIT_USER" | cut -d: -f6) RUN_USER=$UNIT_USER
else
  RUN_HOME=${HOME:-/} RUN_USER=$ME
fi
(
  cd "$ROOT"
  umask "$UMASK"
  if [ -n "$NOFILE" ]; then ulimit -n "$NOFILE"; fi
  exec "${SWITCH[@]}" -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$RUN_HOME" USER="$RUN_USER" LOGNAME="$RUN_USER" \
    "${ENV_ARGS[@]}" "${EXEC_ARGS[@]}" --host 127.0.0.1 --port 0 --database "$SERVE_DB"
) > "$WORK/serve.log" 2>&1 &
SERVER_PID=$!
# Gone, or a zombie not yet reaped: bash keeps its status for `wait` either way.
exited() { [ ! -d "/proc/$1" ] || [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" = Z ]; }
serve_failed() { cat "$WORK/serve.log" >&2; fail "$*"; }
DEADLINE=$((SECONDS + 30))
URL=""
until [ -n "$URL" ]; do
  URL=$(sed -n 's/^Isle server on //p' "$WORK/serve.log" | head -1)
  [ -n "$URL" ] && break
  ! exited "$SERVER_PID" || serve_failed "the installed isle serve stopped before it listened"
  [ $SECONDS -lt $DEADLINE ] || serve_failed "the installed isle serve did not listen within 30 s"
  sleep 0.1
done
case $URL in http://127.0.0.1:[0-9]*) PORT=${URL##*:} ;; *) serve_failed "the installed isle serve listens on $URL, not on 127.0.0.1" ;; esac
grep -Eq "^  apps: +$BUNDLE\$" "$WORK/serve.log" || serve_failed "the installed isle serve does not serve the app the installation lines added ($BUNDLE)"
until [ "$(curl -s -o "$WORK/ready.json" -w '%{http_code}' --max-time 2 "http://127.0.0.1:$PORT/ready" || true)" = 200 ]; do
  ! exited "$SERVER_PID" || serve_failed "the installed isle serve stopped before GET /ready answered 200"
  [ $SECONDS -lt $DEADLINE ] || serve_failed "GET /ready did not answer 200 within 30 s (last: $(cat "$WORK/ready.json" 2>/dev/null))"
  sleep 0.1
done
grep -Eq '"status" *: *"ready"' "$WORK/ready.json" || serve_failed "GET /ready answered $(cat "$WORK/ready.json"), not ready"
kill -TERM "$SERVER_PID" 2>/dev/null || true
DEADLINE=$((SECONDS + STOP))
until exited "$SERVER_PID"; do
  [ $SECONDS -lt $DEADLINE ] || serve_failed "the installed isle serve did not exit within TimeoutStopSec=$STOP s of SIGTERM"
  sleep 0.1
done
STATUS=0; wait "$SERVER_PID" || STATUS=$?
SERVER_PID=""
[ "$STATUS" = 0 ] || serve_failed "the installed isle serve exited with $STATUS after SIGTERM, not 0"
private   # the database's -wal, -shm and -lock files too

echo "release check: ok ($(basename "$TARBALL"), $(du -h "$BIN" | cut -f1), no Swift library needed, isle demo, isle sim with curl pushing to it and docs/simulator.md's CI job passed from the tarball, installed by the unit's lines in a temporary root${AS_ROOT:+ as user $UNIT_USER}: /ready 200, SIGTERM exit 0)"
