#!/usr/bin/env bash
# Runs the README's "Run the server" commands as written (against isle sim instead of Apple),
# and checks the update reached the simulated iPhone.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
rm -rf /tmp/isle-sim /tmp/isle.sqlite /tmp/isle.sqlite-wal /tmp/isle.sqlite-shm /tmp/isle-ticket.pem
for port in 18080 18090; do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then echo "something already listens on 127.0.0.1:$port; stop it first"; exit 1; fi
done
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; cat /tmp/isle-*.log; exit 1; }

# --- README: an APNs to talk to (the simulator) -------------------------------------------------
.build/debug/isle sim --dir /tmp/isle-sim --apns-port 18443 --broadcast-port 18444 --management-port 18445 \
  --control-port 18080 --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > /tmp/isle-sim.log 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18080/health

# --- README: first setup --------------------------------------------------------------------------
isle master-key > /tmp/isle-master.key && chmod 600 /tmp/isle-master.key
export ISLE_MASTER_KEY_FILE=/tmp/isle-master.key
isle app add --database /tmp/isle.sqlite --bundle-id com.example.pizza \
  --key /tmp/isle-sim/AuthKey_SIMKEY0001.p8 --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json
BACKEND_KEY=$(isle key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --scope backend)
DEVICE_KEY=$(isle key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --scope device)
TICKET_KEY_ID=$(isle app ticket-key create --database /tmp/isle.sqlite --bundle-id com.example.pizza --out /tmp/isle-ticket.pem)

# --- README: run it -------------------------------------------------------------------------------
.build/debug/isle serve --database /tmp/isle.sqlite --port 18090 --apns-url https://127.0.0.1:18443 \
  --apns-broadcast-url https://127.0.0.1:18444 --apns-management-url https://127.0.0.1:18445 --apns-ca-cert /tmp/isle-sim/ca.pem > /tmp/isle-serve.log 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18090/health

# --- README: the app starts an activity and registers its token; the backend updates it ----------
TOKEN=$(curl -s -X POST http://127.0.0.1:18080/devices/device-1/apps/com.example.pizza/activities \
  -d '{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":3,"totalAmount":"$42.00","orderNumber":"12345"},"contentState":{"driverName":"Bill James","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["updateToken"])')
SECRET=$(curl -s -X PUT http://127.0.0.1:18090/v1/installations/phone-1 -H "authorization: Bearer $DEVICE_KEY" -d '{}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["installationSecret"])')
TICKET=$(isle ticket --key /tmp/isle-ticket.pem --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key 12345)
curl -s -X POST http://127.0.0.1:18090/v1/activities -H "authorization: Bearer $DEVICE_KEY" -H "Isle-Installation-Secret: $SECRET" \
  -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"token\":\"$TOKEN\",\"installationID\":\"phone-1\",\"externalKey\":\"12345\",\"ticket\":\"$TICKET\"}"
echo
curl -s -X POST http://127.0.0.1:18090/v1/activities/by-key/12345/update \
  -H "authorization: Bearer $BACKEND_KEY" -H "Idempotency-Key: 12345-eta-1" \
  -d '{"contentState":{"driverName":"Anne Johnson","deliveryTimer":[788918400,788919900]},"alert":{"title":"Delivery Update","body":"Your pizza order will arrive in 25 minutes"}}'
echo
for _ in $(seq 1 100); do
  curl -s http://127.0.0.1:18090/v1/activities/by-key/12345 -H "authorization: Bearer $BACKEND_KEY" > /tmp/isle-activity.json
  grep -q '"status":200' /tmp/isle-activity.json && break
  sleep 0.1
done
curl "http://127.0.0.1:18090/v1/activities?state=active&keyPrefix=123&limit=50" -H "authorization: Bearer $BACKEND_KEY" -s > /tmp/isle-list.json
curl -s -X POST http://127.0.0.1:18090/v1/channels -H "authorization: Bearer $BACKEND_KEY" -d '{}' > /tmp/isle-channel.json
curl -s http://127.0.0.1:18080/devices/device-1/screen > /tmp/isle-screen.json
python3 - <<'PY'
import json
activity = json.load(open("/tmp/isle-activity.json"))
assert activity["deliveries"] and activity["deliveries"][0]["status"] == 200, activity
screen = json.load(open("/tmp/isle-screen.json"))
assert screen["lockScreen"][0]["contentState"]["driverName"] == "Anne Johnson", screen
listed = json.load(open("/tmp/isle-list.json"))
assert [a["externalKey"] for a in listed["activities"]] == ["12345"] and listed.get("next") is None, ("the README's list step failed", listed)
channel = json.load(open("/tmp/isle-channel.json"))
assert channel.get("id"), ("the README's channel step failed", channel)
print("server walkthrough: ok (listing and channels included)")
PY
