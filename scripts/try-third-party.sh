#!/usr/bin/env bash
# Third-party client matrix: unmodified standard HTTP/2 stacks of other languages — Python's httpx
# (strict X.509 verification), Node's built-in http2, Java's java.net.http.HttpClient and curl —
# push to `isle sim` as a backend would, and the simulated phone must show what they sent.
#
# Each client (scripts/third-party/) speaks APNs only; this driver plays the app and the person
# through the simulator's control API, and hands the client the tokens a backend would get from the
# app. For every client, on a fresh iOS 26 phone: a push-to-start (the activity shows the start's
# content and alert), an update and an end to the token the new activity reports (the update's
# content, then the ended activity), a widgets push to the app's widget push token (the widget
# reloads), and a broadcast on a channel the client creates, to an activity the app subscribed to
# it (the broadcast's content). Every push whose effect is checked goes at priority 10. The clients
# run side by side, each on its own phone (WidgetKit may act on a widget push only a while later),
# and every check is a deadline loop. It prints one line per client ("node: ok") and fails with the
# phone's events, its screen and what the fake APNs saw.
#
#   scripts/try-third-party.sh [ISLE_BINARY]               # all four; default .build/debug/isle (not built here)
#   scripts/try-third-party.sh --only curl [ISLE_BINARY]   # one: python-httpx, node, java or curl
#
# Needs python3; node (with http2), java (a JDK, 11+: it runs ApnsJava.java as a source file) and
# curl (with HTTP/2) for their clients. The Python client's packages (httpx[http2], PyJWT,
# cryptography) go into .venv-third-party, made here if missing. Nothing is read from Examples/:
# the one schema it installs is below, so --only works from any directory with any isle binary.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
ALL="python-httpx node java curl"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
ONLY="" BIN=""
while [ $# -gt 0 ]; do
  case $1 in
    --only) [ $# -ge 2 ] || { echo "--only needs a client: $ALL" >&2; exit 2; }; ONLY=$2; shift 2 ;;
    --only=*) ONLY=${1#--only=}; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) [ -z "$BIN" ] || { echo "one isle binary, please" >&2; exit 2; }; BIN=$1; shift ;;
  esac
done
case $ONLY in
  "") CLIENTS=$ALL ;;
  python | httpx | python-httpx) CLIENTS=python-httpx ;;
  node | java | curl) CLIENTS=$ONLY ;;
  *) echo "unknown client $ONLY; one of: $ALL" >&2; exit 2 ;;
esac
BIN=${BIN:-$REPO/.build/debug/isle}
[ -x "$BIN" ] || { echo "no isle binary at $BIN (build it, or name one: $0 [--only CLIENT] ISLE_BINARY)" >&2; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

# --- What the clients need: said clearly, never skipped ----------------------------------------
missing=""
command -v python3 >/dev/null || missing+=" python3 (the driver)"
for c in $CLIENTS; do
  case $c in
    node)
      if ! command -v node >/dev/null; then missing+=" node (Node.js, for apns_node.js)"
      elif ! node -e 'require("http2"); process.exit(Number(process.versions.node.split(".")[0]) >= 12 ? 0 : 1)' 2>/dev/null; then
        missing+=" node>=12 (found $(node --version))"
      fi ;;
    java)
      if ! command -v java >/dev/null; then missing+=" java (a JDK 11+, for ApnsJava.java)"
      elif ! java --list-modules 2>/dev/null | grep -q '^jdk\.compiler@'; then
        missing+=" a JDK, not only a JRE ($(command -v java) cannot run a .java source file: no jdk.compiler)"
      fi ;;
    curl)
      if ! command -v curl >/dev/null; then missing+=" curl"
      elif ! curl -V | grep -qw HTTP2; then missing+=" curl with HTTP/2 (this curl has no nghttp2)"
      fi
      command -v openssl >/dev/null || missing+=" openssl" ;;
  esac
done
if [ -n "$missing" ]; then
  echo "try-third-party: missing:$missing" >&2
  echo "  (Debian: apt-get install curl python3-venv nodejs openjdk-17-jdk-headless)" >&2
  exit 1
fi

VENV=$REPO/.venv-third-party
if [[ " $CLIENTS " == *" python-httpx "* ]] && ! "$VENV/bin/python" -c 'import httpx, h2, jwt, cryptography' 2>/dev/null; then
  echo "try-third-party: making $VENV (httpx[http2], PyJWT, cryptography from PyPI)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check 'httpx[http2]' PyJWT cryptography
fi

# --- The simulator: free ports, its own folder, killed on exit --------------------------------
DIR=$(mktemp -d)
SIM=""
cleanup() {
  if [ -n "$SIM" ]; then kill "$SIM" 2>/dev/null || true; wait "$SIM" 2>/dev/null || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Started from the empty temporary folder, as from an unpacked tarball: it needs nothing around it.
(cd "$DIR" && exec "$BIN" sim --json --dir "$DIR/sim" --apns-port 0 --broadcast-port 0 --management-port 0 --control-port 0) \
  > "$DIR/sim.json" 2> "$DIR/sim.log" &
SIM=$!
for _ in $(seq 1 150); do
  [ "$(wc -l < "$DIR/sim.json")" -ge 1 ] && break
  kill -0 "$SIM" 2>/dev/null || { cat "$DIR/sim.log" >&2; echo "try-third-party: isle sim exited" >&2; exit 1; }
  sleep 0.1
done
[ "$(wc -l < "$DIR/sim.json")" -ge 1 ] || { cat "$DIR/sim.log" >&2; echo "try-third-party: isle sim printed no JSON line in 15 s" >&2; exit 1; }

# --- The matrix --------------------------------------------------------------------------------
python3 - "$DIR/sim.json" "$HERE/third-party" "$VENV/bin/python" "$BIN" $CLIENTS <<'PY' || { if [ -s "$DIR/sim.log" ]; then echo "isle sim's log, the end:" >&2; tail -20 "$DIR/sim.log" >&2; fi; exit 1; }
import json, os, select, subprocess, sys, tempfile, threading, time, traceback, urllib.error, urllib.request

info = json.loads(open(sys.argv[1]).readline())
CLIENT_DIR, VENV_PYTHON, ISLE, NAMES = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
CONTROL = info["controlURL"]
BUNDLE = "com.example.pizza"
# Examples/PizzaDeliveryAttributes.schema.json, inline: --only runs without the repository's Examples.
SCHEMA = {"attributesType": "PizzaDeliveryAttributes",
          "attributes": {"numberOfPizzas": "int", "totalAmount": "string", "orderNumber": "string"},
          "contentState": {"driverName": "string", "deliveryTimer": "dateRange"}}
WIDGET = {"kind": "PizzaTracker", "family": "systemSmall",
          "timeline": {"entries": [{"date": 0, "content": {"status": "Waiting for an order"}}], "policy": {"never": {}}}}
COMMANDS = {
    "python-httpx": [VENV_PYTHON, os.path.join(CLIENT_DIR, "apns_httpx.py")],
    "node": ["node", os.path.join(CLIENT_DIR, "apns_node.js")],
    "java": ["java", os.path.join(CLIENT_DIR, "ApnsJava.java")],
    "curl": ["bash", os.path.join(CLIENT_DIR, "apns_curl.sh")],
}
CLIENT_ENV = {
    "APNS_URL": info["apnsURL"], "APNS_BROADCAST_URL": info["broadcastURL"], "APNS_MANAGEMENT_URL": info["managementURL"],
    "APNS_CA": info["caPath"], "APNS_KEY": info["keyPath"], "APNS_KEY_ID": info["keyID"], "APNS_TEAM_ID": info["teamID"],
    "APNS_BUNDLE_ID": BUNDLE,
}


class Failed(Exception):
    pass


def api(method, path, body=None, timeout=15):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(CONTROL + path, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raise Failed("control API %s %s answered %d: %s" % (method, path, e.code, e.read().decode(errors="replace")))


def until(what, check, seconds=10):
    """Polls check() until it returns something truthy; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed("the phone did not show %s within %d s" % (what, seconds))
        time.sleep(0.1)


class Client:
    """A client process: one command a line on its stdin, one answer a line on its stdout."""

    def __init__(self, name, env):
        self.name = name
        self.stderr = tempfile.TemporaryFile()
        self.p = subprocess.Popen(COMMANDS[name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                  env={**os.environ, **env}, cwd=tempfile.gettempdir())
        self.buf = b""
        self.first = True

    def errors(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace").strip()

    def do(self, line, expected):
        # The first command also pays for starting the runtime (Java compiles the source file).
        deadline = time.monotonic() + (45 if self.first else 20)
        self.first = False
        try:
            self.p.stdin.write((line + "\n").encode())
            self.p.stdin.flush()
        except BrokenPipeError:
            raise Failed("%s had exited (%s) before %r" % (self.name, self.p.poll(), line.split()[0]))
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failed("%s: no answer to %r in time" % (self.name, line.split()[0]))
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.p.wait(timeout=5)
                    raise Failed("%s exited with %s on %r" % (self.name, self.p.returncode, line.split()[0]))
                self.buf += chunk
        answer, self.buf = self.buf.split(b"\n", 1)
        words = answer.decode().split(" ", 3)
        if len(words) < 3 or words[0] != line.split()[0] or words[1] != str(expected) or words[2] in ("", "-"):
            raise Failed("%s: %r answered %r (expected %d)" % (self.name, line.split()[0], answer.decode(), expected))
        return words[2]

    def finish(self):
        self.p.stdin.close()
        try:
            code = self.p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise Failed("%s did not exit after its last command" % self.name)
        if code != 0:
            raise Failed("%s exited with %d" % (self.name, code))

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def lock_screen_entry(device, activity):
    return next((e for e in api("GET", "/devices/%s/screen" % device)["lockScreen"] if e["activityID"] == activity), None)


def shown(device, activity, what):
    """A check for until(): the activity's Lock Screen entry, if what(entry) holds."""
    return lambda: (lambda e: e if e and what(e) else None)(lock_screen_entry(device, activity))


def run(name):
    """One client's whole sequence on a phone of its own. Returns (ok, report lines)."""
    t0 = time.monotonic()
    report = []
    phone = {}
    client = None
    try:
        # A fresh phone for each client: its own budgets, push-to-start window and activities.
        device = phone["device"] = api("POST", "/devices", {"name": name, "osVersion": "26.0"})["id"]
        api("POST", "/devices/%s/apps" % device, {"bundleID": BUNDLE, "schemas": [SCHEMA], "widgets": [WIDGET]})

        # The push-to-start and widget push tokens come a moment after install, as on a device.
        def tokens():
            a = api("GET", "/devices/%s" % device)["apps"][BUNDLE]
            return a if a.get("widgetPushToken") and a["pushToStartTokens"].get("PizzaDeliveryAttributes") else None
        app = until("the app's push-to-start and widget push tokens", tokens)
        phone["push-to-start token"] = app["pushToStartTokens"]["PizzaDeliveryAttributes"]
        phone["widget push token"] = app["widgetPushToken"]
        env = {**CLIENT_ENV, "CLIENT_LABEL": name}
        if name == "curl":
            env["ISLE_BINARY"] = ISLE  # its provider token from `isle jwt`, as the README shows
        client = Client(name, env)

        # (a) push-to-start to the app's push-to-start token: the activity shows the start's content and alert.
        client.do("start " + phone["push-to-start token"], 200)
        activity = phone["activity"] = until("the push-started activity", lambda: next(
            (a for a in api("GET", "/devices/%s" % device)["activities"] if a["startedBy"] == "push" and a["attributes"].get("orderNumber") == name), None))["id"]
        entry = until("the start's content and alert on the Lock Screen", shown(device, activity, lambda e: e["state"] == "active"
                      and e["contentState"]["driverName"] == name + " start" and (e.get("lastAlert") or {}).get("title") == "Order confirmed"))
        if entry["attributes"] != {"numberOfPizzas": 2, "totalAmount": "$21.00", "orderNumber": name}:
            raise Failed("the activity shows attributes %s" % json.dumps(entry["attributes"]))
        # The app reports the new activity's update token (pushTokenUpdates) to its backend.
        token = phone["update token"] = api("GET", "/devices/%s/activities/%s/push-token" % (device, activity))["token"]

        # (b) update.
        client.do("update " + token, 200)
        until("the update's content and alert", shown(device, activity, lambda e: e["state"] == "active"
              and e["contentState"]["driverName"] == name + " update" and (e.get("lastAlert") or {}).get("title") == "On the way"))

        # (c) end: the activity shows ended, with the end's content.
        client.do("end " + token, 200)
        until("the activity ended with the end's content", shown(device, activity, lambda e: e["state"] == "ended" and e["contentState"]["driverName"] == name + " end"))
        state = next(a for a in api("GET", "/devices/%s" % device)["activities"] if a["id"] == activity)["state"]
        if state != "ended":
            raise Failed("the activity is %s after the end, not ended" % state)

        # (d) widgets push to the app's widget push token. WidgetKit may act on it a while later
        # (opportunistically), so the reload is checked at the end, with a deadline of its own.
        def reloads():
            return next(w for w in api("GET", "/devices/%s/screen" % device)["widgets"] if w["kind"] == WIDGET["kind"])["reloadCount"]
        before = reloads()
        widget_push = phone["widgets apns-id"] = client.do("widgets " + phone["widget push token"], 200)
        widget_deadline = time.monotonic() + 45

        # (e) a channel the client creates, an activity the app subscribes to it, a broadcast on it.
        channel = phone["channel"] = client.do("channel", 201)
        now = int(time.time()) - 978307200
        subscribed = phone["channel activity"] = api("POST", "/devices/%s/apps/%s/activities" % (device, BUNDLE), {
            "attributesType": "PizzaDeliveryAttributes", "attributes": {"numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": name + "-channel"},
            "contentState": {"driverName": name + " channel", "deliveryTimer": [now, now + 1800]}, "pushType": {"channel": channel}})["id"]
        client.do("broadcast " + channel, 200)
        until("the broadcast's content on the subscribed activity", shown(device, subscribed, lambda e: e["state"] == "active" and e["contentState"]["driverName"] == name + " broadcast"))
        client.finish()

        # (d), checked: the widget reloaded for that push.
        until("the widget reloaded by the widgets push", lambda: reloads() > before and any(
            (e.get("outcome") or {}).get("code") == "widgetsReloaded" and e.get("apnsID") == widget_push for e in api("GET", "/devices/%s/events" % device)),
            seconds=max(1, widget_deadline - time.monotonic()))
        report.append("%s: ok (%.1f s)" % (name, time.monotonic() - t0))
        return True, report
    except Exception as e:
        report.append("%s: FAILED: %s" % (name, e if isinstance(e, Failed) else traceback.format_exc().strip()))
        report.append("  phone: %s" % json.dumps(phone))
        try:
            if "device" in phone:
                for ev in api("GET", "/devices/%s/events" % phone["device"]):
                    code = (ev.get("outcome") or {}).get("code", "")
                    report.append("  %s %-6s %-18s %s %s" % (ev["time"], ev["source"], code, ev.get("activityID", ""), ev["message"]))
                report.append("  screen: " + json.dumps(api("GET", "/devices/%s/screen" % phone["device"])))
            # What the fake APNs saw of this client: pushes to this phone's tokens (shortened in
            # the log), its channel's broadcasts, and any refused channel or broadcast request.
            short = {t[:6] + "\u2026" + t[-6:] for k, t in phone.items() if k.endswith("token")}
            report.append("  the fake APNs' requests:")
            for r in api("GET", "/requests"):
                channel_header = next((v for k, v in r["headers"] if k == "apns-channel-id"), None)
                if r["path"].split("/")[-1] in short or (channel_header and channel_header == phone.get("channel")) or (not r["path"].startswith("/3/") and r["status"] >= 300):
                    report.append("   %s %s -> %d %s" % (r["method"], r["path"], r["status"], r.get("reason") or (r.get("outcome") or {}).get("code", "")))
        except Exception as e2:
            report.append("  (could not read the phone: %s)" % e2)
        if client:
            err = client.errors()
            if err:
                report.append("  %s's stderr: %s" % (name, err))
        return False, report
    finally:
        if client:
            client.kill()


# The clients run side by side, each on its own phone: a widget push may take WidgetKit a while.
results = {}
threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, run(n)), daemon=True) for n in NAMES]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=150)
failed = []
for name in NAMES:
    ok, report = results.get(name, (False, ["%s: FAILED: did not finish" % name]))
    print("\n".join(report), file=sys.stdout if ok else sys.stderr, flush=True)
    if not ok:
        failed.append(name)
if failed:
    sys.exit("third-party clients failed: " + " ".join(failed))
PY
