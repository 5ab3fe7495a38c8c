#!/usr/bin/env bash
# The README's "Test without an iPhone" and "Run the server" sections one after the other, as a
# reader follows them: the simulator started with its virtual clock, moved 8 h on, started again
# (as "Run the server" says), the server set up against it and an update delivered; then the
# simulator started a third time in the same --dir under the running server: its CA and provider
# key are kept, so the next update is delivered too.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
rm -rf /tmp/isle-sim /tmp/isle.sqlite /tmp/isle.sqlite-wal /tmp/isle.sqlite-shm /tmp/isle-ticket.pem
for port in 18080 18090; do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then echo "something already listens on 127.0.0.1:$port; stop it first"; exit 1; fi
done
PIDS=()
SIM=""
trap 'for p in "${PIDS[@]}" $SIM; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; cat /tmp/isle-*.log; exit 1; }
start_sim() {  # the README's command, as written
  .build/debug/isle sim --virtual-clock --dir /tmp/isle-sim --apns-port 18443 --broadcast-port 18444 --management-port 18445 \
    --control-port 18080 --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json >> /tmp/isle-sim.log 2>&1 &
  SIM=$!
  wait_for http://127.0.0.1:18080/health
}
stop_sim() { kill "$SIM"; wait "$SIM" 2>/dev/null || true; SIM=""; }
: > /tmp/isle-sim.log

# --- "Test without an iPhone": the simulator, and its clock moved on 8 h -------------------------
start_sim
cp /tmp/isle-sim/ca.pem /tmp/isle-sim-ca-first.pem
curl -s -X POST http://127.0.0.1:18080/clock/advance -d '{"seconds":28800}' >/dev/null
# --- "Run the server": it was moved on, so start it again (the same command) ----------------------
stop_sim
start_sim
cmp -s /tmp/isle-sim/ca.pem /tmp/isle-sim-ca-first.pem || { echo "isle sim --dir made a new CA on restart"; exit 1; }

isle master-key > /tmp/isle-master.key && chmod 600 /tmp/isle-master.key
export ISLE_MASTER_KEY_FILE=/tmp/isle-master.key
isle app add --database /tmp/isle.sqlite --bundle-id com.example.pizza \
  --key /tmp/isle-sim/AuthKey_SIMKEY0001.p8 --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json
BACKEND_KEY=$(isle key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --scope backend)
DEVICE_KEY=$(isle key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --scope device)
TICKET_KEY_ID=$(isle app ticket-key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --out /tmp/isle-ticket.pem)
.build/debug/isle serve --database /tmp/isle.sqlite --port 18090 --apns-url https://127.0.0.1:18443 \
  --apns-broadcast-url https://127.0.0.1:18444 --apns-management-url https://127.0.0.1:18445 --apns-ca-cert /tmp/isle-sim/ca.pem > /tmp/isle-serve.log 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18090/health

register_and_update() {  # $1: the order; $2: the driver
  TOKEN=$(curl -s -X POST http://127.0.0.1:18080/devices/device-1/apps/com.example.pizza/activities \
    -d '{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":3,"totalAmount":"$42.00","orderNumber":"'"$1"'"},"contentState":{"driverName":"Bill James","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["updateToken"])')
  SECRET=$(curl -s -X PUT "http://127.0.0.1:18090/v1/installations/phone-$1" -H "authorization: Bearer $DEVICE_KEY" -d '{}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["installationSecret"])')
  TICKET=$(isle ticket --key /tmp/isle-ticket.pem --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key "order-$1")
  curl -s -X POST http://127.0.0.1:18090/v1/activities -H "authorization: Bearer $DEVICE_KEY" -H "Isle-Installation-Secret: $SECRET" \
    -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"token\":\"$TOKEN\",\"installationID\":\"phone-$1\",\"externalKey\":\"order-$1\",\"ticket\":\"$TICKET\"}" >/dev/null
  curl -s -X POST "http://127.0.0.1:18090/v1/activities/by-key/order-$1/update" -H "authorization: Bearer $BACKEND_KEY" \
    -d '{"contentState":{"driverName":"'"$2"'","deliveryTimer":[788918400,788919900]},"alert":{"title":"Delivery Update","body":"On its way"}}' >/dev/null
  for _ in $(seq 1 150); do
    curl -s "http://127.0.0.1:18090/v1/activities/by-key/order-$1" -H "authorization: Bearer $BACKEND_KEY" > /tmp/isle-activity.json
    grep -q '"status":200' /tmp/isle-activity.json && break
    sleep 0.1
  done
  curl -s http://127.0.0.1:18080/devices/device-1/screen > /tmp/isle-screen.json
  python3 - "$2" <<'PY'
import json, sys
activity = json.load(open("/tmp/isle-activity.json"))
assert activity["deliveries"] and activity["deliveries"][-1]["status"] == 200, activity
screen = json.load(open("/tmp/isle-screen.json"))
assert any(a["contentState"]["driverName"] == sys.argv[1] for a in screen["lockScreen"]), screen
PY
}
register_and_update 12345 "Anne Johnson"

# --- the simulator started again in the same --dir, under the running server ---------------------
stop_sim
start_sim
register_and_update 12346 "Second Driver"
curl -s http://127.0.0.1:18090/v1/app -H "authorization: Bearer $BACKEND_KEY" | grep -q '"state":"running"' || { echo "the app is not running"; exit 1; }
echo "README in order: ok (the simulator restarted twice in one --dir; the server kept trusting it)"
