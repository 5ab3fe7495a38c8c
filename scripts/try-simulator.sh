#!/usr/bin/env bash
# Runs the README's "Test without an iPhone" commands as written, and checks what they show.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --traits Server --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
rm -rf /tmp/isle-sim

# --- README: start the simulator -------------------------------------------------------------
if curl -sf http://127.0.0.1:18080/health >/dev/null 2>&1; then
  echo "something already listens on 127.0.0.1:18080 (an earlier isle sim?); stop it first"; exit 1
fi
.build/debug/isle sim --virtual-clock --dir /tmp/isle-sim --apns-port 18443 --broadcast-port 18444 --management-port 18445 \
  --control-port 18080 \
  --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > /tmp/isle-sim.log 2>&1 &
SIM=$!
trap 'kill $SIM 2>/dev/null; wait $SIM 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  kill -0 $SIM 2>/dev/null || { cat /tmp/isle-sim.log; echo "the simulator exited"; exit 1; }
  curl -sf http://127.0.0.1:18080/health >/dev/null && break
  sleep 0.1
done
curl -sf http://127.0.0.1:18080/health >/dev/null || { cat /tmp/isle-sim.log; echo "the simulator did not start"; exit 1; }

# --- README: the app starts a Live Activity and gets its push token ---------------------------
curl -s -X POST http://127.0.0.1:18080/devices/device-1/apps/com.example.pizza/activities \
  -d '{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":3,"totalAmount":"$42.00","orderNumber":"12345"},"contentState":{"driverName":"Bill James","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' > /dev/null
TOKEN=$(curl -s http://127.0.0.1:18080/devices/device-1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["activities"][0]["updateToken"])')

# The provider key is its owner's alone: any local user could mint tokens the simulator accepts.
MODE=$(stat -c %a /tmp/isle-sim/AuthKey_SIMKEY0001.p8)
[ "$MODE" = 600 ] || { echo "the simulator's provider key is mode $MODE, not 600"; exit 1; }

# A strict TLS client (Python 3.13's default verification) accepts its certificates, by name and by address.
python3 scripts/strict-tls.py /tmp/isle-sim/ca.pem 18443 localhost
python3 scripts/strict-tls.py /tmp/isle-sim/ca.pem 18443 127.0.0.1

# --- README: push to it with isle push --------------------------------------------------------
export ISLE_APNS_URL=https://127.0.0.1:18443 ISLE_APNS_CA_CERT=/tmp/isle-sim/ca.pem
export ISLE_APNS_BROADCAST_URL=https://127.0.0.1:18444 ISLE_APNS_MANAGEMENT_URL=https://127.0.0.1:18445
export ISLE_APNS_KEY=/tmp/isle-sim/AuthKey_SIMKEY0001.p8 ISLE_APNS_KEY_ID=SIMKEY0001 ISLE_APNS_TEAM_ID=SIMTEAM001 ISLE_BUNDLE_ID=com.example.pizza
isle push update --token "$TOKEN" --priority 10 \
  --content-state '{"driverName":"Anne Johnson","deliveryTimer":[788918400,788919900]}' \
  --alert-title "Delivery Update" --alert-body "Your pizza order will arrive in 25 minutes"

# --- README: or with any client: curl over HTTP/2 with a JWT from isle jwt ---------------------
curl --http2 --cacert /tmp/isle-sim/ca.pem \
  -H "authorization: bearer $(isle jwt)" -H "apns-push-type: liveactivity" \
  -H "apns-topic: com.example.pizza.push-type.liveactivity" -H "apns-priority: 5" \
  -d "{\"aps\":{\"timestamp\":$(date +%s),\"event\":\"update\",\"content-state\":{\"driverName\":\"Curl\",\"deliveryTimer\":[788918400,788919900]}}}" \
  "https://127.0.0.1:18443/3/device/$TOKEN" -s -o /dev/null -w "%{http_code} HTTP/%{http_version}\n" | tee /tmp/isle-sim-curl.txt
grep -q "^200 HTTP/2" /tmp/isle-sim-curl.txt

# --- README: broadcast channels (the same exports) -----------------------------------------------
CHANNEL=$(isle channel create --storage-policy 0)
[ -n "$CHANNEL" ] || { echo "isle channel create printed no channel id"; exit 1; }
isle channel list | grep -q -- "$CHANNEL" || { echo "isle channel list does not show $CHANNEL"; exit 1; }

# --- README: what the phone shows, and why ----------------------------------------------------
curl -s -X POST http://127.0.0.1:18080/clock/advance -d '{"seconds":3}' > /dev/null
curl -s http://127.0.0.1:18080/devices/device-1/screen > /tmp/isle-sim-screen.json
curl -s http://127.0.0.1:18080/devices/device-1/events > /tmp/isle-sim-events.json
curl -s -X POST http://127.0.0.1:18080/clock/advance -d '{"seconds":28800}' > /dev/null
curl -s http://127.0.0.1:18080/devices/device-1 > /tmp/isle-sim-after.json

python3 - <<'PY'
import json
screen = json.load(open("/tmp/isle-sim-screen.json"))
assert screen["lockScreen"][0]["contentState"]["driverName"] == "Curl", screen
assert screen["lockScreen"][0]["lastAlert"]["title"] == "Delivery Update", screen
events = [e["message"] for e in json.load(open("/tmp/isle-sim-events.json"))]
assert any("Applied with an alert" in m for m in events), events
after = json.load(open("/tmp/isle-sim-after.json"))
assert after["activities"][0]["state"] == "ended", after["activities"][0]["state"]
print("simulator walkthrough: ok")
PY

# --- For scripts: --json prints one line with where everything is (any free ports here) ---------
J=$(mktemp -d)
.build/debug/isle sim --json --dir "$J/sim" --apns-port 0 --control-port 0 --device CI --app com.example.pizza \
  --schema Examples/PizzaDeliveryAttributes.schema.json > "$J/out" 2> "$J/err" &
JSIM=$!
trap 'kill $SIM $JSIM 2>/dev/null; wait $SIM $JSIM 2>/dev/null || true; rm -rf "$J"' EXIT
for _ in $(seq 1 100); do [ -s "$J/out" ] && break; sleep 0.1; done
python3 - "$J/out" <<'PY'
import json, sys, urllib.request
line = open(sys.argv[1]).readline()
info = json.loads(line)
for key in ["apnsURL", "broadcastURL", "managementURL", "controlURL", "caPath", "keyPath", "keyID", "teamID", "environment", "devices"]:
    assert key in info, (key, info)
assert info["devices"][0]["app"] == "com.example.pizza" and info["devices"][0]["id"] == "device-1", info["devices"]
with urllib.request.urlopen(info["controlURL"] + "/health", timeout=5) as r:
    assert r.status == 200
print("isle sim --json: one line, and its control API answers at %s" % info["controlURL"])
PY
kill $JSIM; wait $JSIM 2>/dev/null || true
rm -rf "$J"
