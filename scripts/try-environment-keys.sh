#!/usr/bin/env bash
# A key per APNs environment (docs/server.md, "Keys per environment"): two `isle sim` processes
# stand in for APNs' sandbox and production hosts, each accepting only its own environment-scoped
# key (--scoped-key), as Apple does for keys scoped in the developer account. The app is added with
# the sandbox's key: the production phone's update pauses the app with BadEnvironmentKeyIdInToken
# and the remedy; `isle app environment-key set` gives production its own key, and the update
# arrives, signed with that key on the production host only. Real processes, loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
D=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$D"; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; cat "$D"/*.log; exit 1; }

.build/debug/isle sim --dir "$D/sandbox" --single-host --apns-port 18743 --control-port 18380 --scoped-key --key-id SBXKEY0001 \
  --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > "$D/sim-sandbox.log" 2>&1 &
PIDS+=($!)
.build/debug/isle sim --production --dir "$D/production" --single-host --apns-port 18744 --control-port 18381 --scoped-key --key-id PRDKEY0001 \
  --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > "$D/sim-production.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18380/health
wait_for http://127.0.0.1:18381/health
cat "$D/sandbox/ca.pem" "$D/production/ca.pem" > "$D/cas.pem"
# One developer account: each host knows both keys, and each key's scope (POST /keys on the control API).
register() {   # control port, key id, environment the key is scoped to
  PEM=$(openssl ec -in "$D/$3/AuthKey_$2.p8" -pubout 2>/dev/null)
  python3 -c 'import json,sys; print(json.dumps({"keyID": sys.argv[1], "teamID": "SIMTEAM001", "publicKeyPEM": sys.argv[2], "environment": sys.argv[3]}))' "$2" "$PEM" "$3" \
    | curl -sf -X POST "http://127.0.0.1:$1/keys" -d @- > /dev/null
}
register 18381 SBXKEY0001 sandbox
register 18380 PRDKEY0001 production

isle master-key > "$D/master.key" && chmod 600 "$D/master.key"
export ISLE_MASTER_KEY_FILE="$D/master.key" ISLE_DATABASE="$D/isle.sqlite"
isle app add --bundle-id com.example.pizza --key "$D/sandbox/AuthKey_SBXKEY0001.p8" --key-id SBXKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json
BACKEND_KEY=$(isle key create --bundle-id com.example.pizza --scope backend 2>/dev/null)
DEVICE_KEY=$(isle key create --bundle-id com.example.pizza --scope device 2>/dev/null)
TICKET_KEY_ID=$(isle app ticket-key create --bundle-id com.example.pizza --out "$D/ticket.pem" 2>/dev/null)
.build/debug/isle serve --port 18390 --apns-sandbox-url https://127.0.0.1:18743 --apns-production-url https://127.0.0.1:18744 --apns-ca-cert "$D/cas.pem" \
  > "$D/serve.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18390/health

# Each phone's app: an order, its installation (with its environment) and the token; then an update.
source scripts/environment-phone.sh
environment_phone http://127.0.0.1:18390 sandbox 18380 dev 10
environment_phone http://127.0.0.1:18390 production 18381 tf 10

# The production host refuses the sandbox's key: the app pauses, saying what to do.
for _ in $(seq 1 150); do
  curl -s http://127.0.0.1:18390/v1/app -H "authorization: Bearer $BACKEND_KEY" > "$D/app.json"
  grep -q BadEnvironmentKeyIdInToken "$D/app.json" && break
  sleep 0.1
done
python3 - "$D/app.json" <<'PY'
import json, sys
app = json.load(open(sys.argv[1]))
reason = app["delivery"].get("reason") or ""
assert app["delivery"]["state"] == "paused" and "BadEnvironmentKeyIdInToken" in reason and "isle app environment-key set" in reason, app
print("production refused the sandbox's key: the app paused, saying: " + reason[:160] + "…")
PY

# Production gets its own key; the app resumes and the update arrives.
isle app environment-key set --bundle-id com.example.pizza --environment production --key "$D/production/AuthKey_PRDKEY0001.p8" --key-id PRDKEY0001 --team-id SIMTEAM001
isle app list | grep -q "production key PRDKEY0001" || { echo "isle app list does not show production's key"; isle app list; exit 1; }
for _ in $(seq 1 150); do
  curl -s -X POST http://127.0.0.1:18390/v1/app/resume -H "authorization: Bearer $BACKEND_KEY" > /dev/null
  curl -s "http://127.0.0.1:18381/devices/device-1/screen" | grep -q "Driver tf" && break
  sleep 0.2
done

# Each update reached its own phone, signed with its environment's key only.
for pair in "sandbox 18380 dev SBXKEY0001" "production 18381 tf PRDKEY0001"; do
  set -- $pair
  ENV=$1 CONTROL=$2 ORDER=$3 KID=$4
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:$CONTROL/devices/device-1/screen" > "$D/screen-$ORDER.json"
    grep -q "Driver $ORDER" "$D/screen-$ORDER.json" && break
    sleep 0.1
  done
  curl -s "http://127.0.0.1:$CONTROL/requests" > "$D/requests-$ORDER.json"
  ENV=$ENV ORDER=$ORDER KID=$KID D=$D python3 - <<'PY'
import json, os
env, order, kid, d = os.environ["ENV"], os.environ["ORDER"], os.environ["KID"], os.environ["D"]
screen = json.load(open(f"{d}/screen-{order}.json"))
assert [i["contentState"]["driverName"] for i in screen["lockScreen"]] == [f"Driver {order}"], screen
pushes = [r for r in json.load(open(f"{d}/requests-{order}.json")) if r["path"].startswith("/3/device/")]
signed = {h[1].split("kid=")[1].split(" ")[0] for r in pushes for h in r["headers"] if h[0] == "authorization" and "kid=" in h[1]}
delivered = [r for r in pushes if r["status"] == 200]
assert delivered and all(f"kid={kid}" in h[1] for r in delivered for h in r["headers"] if h[0] == "authorization"), pushes
print(f"{env}: order-{order} reached its phone, signed with {kid} (keys seen on this host: {sorted(signed)})")
PY
done
echo "environment keys walkthrough: ok"
