#!/usr/bin/env bash
# Runs the README's "Test without an iPhone" commands as written, and checks what they show.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
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
  -H "apns-topic: com.example.pizza.push-type.liveactivity" -H "apns-priority: 10" \
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
# The push-to-start token comes a moment after install, as on a phone; the line waits for it.
assert len(info["devices"][0]["pushToStartTokens"].get("PizzaDeliveryAttributes", "")) == 80, info["devices"]
with urllib.request.urlopen(info["controlURL"] + "/health", timeout=5) as r:
    assert r.status == 200
print("isle sim --json: one line, and its control API answers at %s" % info["controlURL"])
PY
kill $JSIM; wait $JSIM 2>/dev/null || true
rm -rf "$J"

# --- A library with a fixed host and the team's own CA: --hostname, --ca-cert/--ca-key -------------
# The team's CA (made here with openssl); the simulator's certificate for Apple's sandbox name is
# signed by it, and a strict verifier that trusts only that CA accepts it under that name.
T=$(mktemp -d)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -subj "/O=Example Team/CN=Example Team CI Root" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -addext "subjectKeyIdentifier=hash" \
  -keyout "$T/team-ca-key.pem" -out "$T/team-ca.pem" 2>/dev/null
.build/debug/isle sim --json --dir "$T/sim" --apns-port 0 --control-port 0 --hostname api.sandbox.push.apple.com \
  --ca-cert "$T/team-ca.pem" --ca-key "$T/team-ca-key.pem" > "$T/out" 2> "$T/err" &
TSIM=$!
trap 'kill $SIM $TSIM 2>/dev/null; wait $SIM $TSIM 2>/dev/null || true; rm -rf "$T"' EXIT
for _ in $(seq 1 100); do [ -s "$T/out" ] && break; kill -0 $TSIM 2>/dev/null || break; sleep 0.1; done
[ -s "$T/out" ] || { cat "$T/err"; echo "isle sim --hostname --ca-cert did not start"; exit 1; }
TPORT=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["apnsURL"].rsplit(":",1)[1])' "$T/out")
python3 scripts/strict-tls.py "$T/team-ca.pem" "$TPORT" api.sandbox.push.apple.com
cmp -s "$T/team-ca.pem" "$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["caPath"])' "$T/out")" \
  || { echo "the caPath of isle sim --ca-cert is not the team's CA"; exit 1; }
# A name the certificate does not carry is refused by the same verifier.
if python3 scripts/strict-tls.py "$T/team-ca.pem" "$TPORT" api.push.apple.com >/dev/null 2>&1; then
  echo "a strict verifier accepted the simulator's certificate for a name it was not given"; exit 1
fi
echo "isle sim --hostname api.sandbox.push.apple.com --ca-cert: a strict verifier trusting only the team's CA accepts it"
# A CA that is not a CA is refused with the flag's name.
if .build/debug/isle sim --dir "$T/sim2" --ca-cert "$T/team-ca.pem" --ca-key /dev/null > "$T/bad" 2>&1; then echo "isle sim took an empty --ca-key"; exit 1; fi
grep -q -- "--ca-key" "$T/bad" || { cat "$T/bad"; echo "the --ca-key error does not name the flag"; exit 1; }
kill $TSIM; wait $TSIM 2>/dev/null || true
# An RSA root with an intermediate CA under it: the simulator signs with the intermediate's RSA key
# and serves the intermediate beside its certificate, so a client that trusts only the root verifies.
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/O=Example Team/CN=Example RSA Root" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" -addext "subjectKeyIdentifier=hash" -keyout "$T/root-key.pem" -out "$T/root.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/O=Example Team/CN=Example RSA Intermediate" -keyout "$T/int-key.pem" -out "$T/int.csr" 2>/dev/null
printf 'basicConstraints=critical,CA:TRUE,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n' > "$T/int.ext"
openssl x509 -req -in "$T/int.csr" -CA "$T/root.pem" -CAkey "$T/root-key.pem" -CAcreateserial -days 30 -extfile "$T/int.ext" -out "$T/int.pem" 2>/dev/null
.build/debug/isle sim --json --dir "$T/sim3" --apns-port 0 --control-port 0 --ca-cert "$T/int.pem" --ca-key "$T/int-key.pem" > "$T/out3" 2> "$T/err3" &
TSIM=$!
for _ in $(seq 1 100); do [ -s "$T/out3" ] && break; kill -0 $TSIM 2>/dev/null || break; sleep 0.1; done
[ -s "$T/out3" ] || { cat "$T/err3"; echo "isle sim with an RSA intermediate CA did not start"; exit 1; }
TPORT=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["apnsURL"].rsplit(":",1)[1])' "$T/out3")
python3 scripts/strict-tls.py "$T/root.pem" "$TPORT" localhost
echo "isle sim --ca-cert with an RSA intermediate: a strict verifier trusting only the root accepts it"
kill $TSIM; wait $TSIM 2>/dev/null || true
rm -rf "$T"
