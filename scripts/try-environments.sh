#!/usr/bin/env bash
# A debug build and a TestFlight build of one app, served side by side by one isle serve: two
# `isle sim` processes stand in for APNs' sandbox and production hosts (sharing one provider key,
# as Apple's two environments do), each installation reports its environment, and each update must
# reach its own phone through its own host. Real processes, real HTTP/2 over TLS, loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
D=/tmp/isle-env
rm -rf "$D" && mkdir -p "$D"
for port in 18280 18281 18290; do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then echo "something already listens on 127.0.0.1:$port; stop it first"; exit 1; fi
done
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; cat "$D"/*.log; exit 1; }

# The sandbox host, then the production host with the same provider key. Each priority-5 update is
# checked on its phone: without APNs' right to lose one (docs/simulator.md, "Never kinder than Apple").
.build/debug/isle sim --dir "$D/sandbox" --single-host --apns-port 18643 --control-port 18280 --low-priority-loss 0 \
  --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > "$D/sim-sandbox.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18280/health
.build/debug/isle sim --production --dir "$D/production" --single-host --apns-port 18644 --control-port 18281 --low-priority-loss 0 --key "$D/sandbox/AuthKey_SIMKEY0001.p8" \
  --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > "$D/sim-production.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18281/health
cat "$D/sandbox/ca.pem" "$D/production/ca.pem" > "$D/cas.pem"

isle master-key > "$D/master.key" && chmod 600 "$D/master.key"
export ISLE_MASTER_KEY_FILE="$D/master.key"
isle app add --database "$D/isle.sqlite" --bundle-id com.example.pizza \
  --key "$D/sandbox/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json
BACKEND_KEY=$(isle key create --database "$D/isle.sqlite" --bundle-id com.example.pizza --scope backend)
DEVICE_KEY=$(isle key create --database "$D/isle.sqlite" --bundle-id com.example.pizza --scope device)
TICKET_KEY_ID=$(isle app ticket-key create --database "$D/isle.sqlite" --bundle-id com.example.pizza --out "$D/ticket.pem")
.build/debug/isle serve --database "$D/isle.sqlite" --port 18290 \
  --apns-sandbox-url https://127.0.0.1:18643 --apns-production-url https://127.0.0.1:18644 --apns-ca-cert "$D/cas.pem" > "$D/serve.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18290/health
said() { grep -q "APNs sandbox (default): https://127.0.0.1:18643 " "$D/serve.log" && grep -q "APNs production: https://127.0.0.1:18644 " "$D/serve.log"; }
for _ in $(seq 1 50); do said && break; sleep 0.1; done
said || { echo "serve does not say where each environment goes:"; cat "$D/serve.log"; exit 1; }

# Each phone's app: start an order, register its installation (with its environment) and the token.
source scripts/environment-phone.sh
environment_phone http://127.0.0.1:18290 sandbox 18280 dev
environment_phone http://127.0.0.1:18290 production 18281 tf

# Each update reached its own phone, through its own host.
for pair in "sandbox 18280 dev" "production 18281 tf"; do
  set -- $pair
  ENV=$1 CONTROL=$2 ORDER=$3
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:18290/v1/activities/by-key/order-$ORDER" -H "authorization: Bearer $BACKEND_KEY" > "$D/activity-$ORDER.json"
    grep -q '"status":200' "$D/activity-$ORDER.json" && break
    sleep 0.1
  done
  # Priority 5 lands opportunistically (isle sim: a seeded 0.5-3 s after APNs' 200), so look as an app would: until it shows.
  for _ in $(seq 1 100); do
    curl -s "http://127.0.0.1:$CONTROL/devices/device-1/screen" > "$D/screen-$ORDER.json"
    grep -q "Driver $ORDER" "$D/screen-$ORDER.json" && break
    sleep 0.1
  done
  curl -s "http://127.0.0.1:$CONTROL/requests" > "$D/requests-$ORDER.json"
  ENV=$ENV ORDER=$ORDER D=$D python3 - <<'PY'
import json, os
env, order, d = os.environ["ENV"], os.environ["ORDER"], os.environ["D"]
activity = json.load(open(f"{d}/activity-{order}.json"))
assert activity["environment"] == env, activity
assert activity["deliveries"] and all(x["status"] == 200 for x in activity["deliveries"]), activity
screen = json.load(open(f"{d}/screen-{order}.json"))
assert [i["contentState"]["driverName"] for i in screen["lockScreen"]] == [f"Driver {order}"], screen
pushes = [r for r in json.load(open(f"{d}/requests-{order}.json")) if r["path"].startswith("/3/device/")]
assert pushes and all(r["status"] == 200 for r in pushes), pushes
print(f"{env}: order-{order} reached its phone through the {env} host ({len(pushes)} push, 200)")
PY
done
echo "environments walkthrough: ok"
