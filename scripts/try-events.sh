#!/usr/bin/env bash
# Delivery events end to end, with real processes (docs/events.md): isle sim, isle serve (SQLite)
# and a webhook receiver (scripts/webhook-receiver.py) that checks every signature. The receiver
# answers 500 for a while, and isle serve is SIGKILLed mid-stream and started again; at the end the
# receiver must hold exactly the events GET /v1/events returns, in the same order: every update
# delivered, a 410 (token retired, then the push failed for good), a device-reported end.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
ISLE=.build/debug/isle
D=$(mktemp -d /tmp/isle-events.XXXXXX)
SIM=18180; APNS=18543; API=18190; HOOK=18195
for port in $SIM $API $HOOK; do
  if curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then echo "something already listens on 127.0.0.1:$port; stop it first"; exit 1; fi
done
PIDS=()
SERVE=""
cleanup() { set +e; for p in "${PIDS[@]}" $SERVE; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$D"; true; }
trap cleanup EXIT
fail() { echo "try-events: $*"; echo "--- serve log:"; tail -30 "$D"/serve*.log; exit 1; }
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; fail "nothing answers at $1"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

$ISLE sim --dir "$D/sim" --apns-port $APNS --control-port $SIM --device iPhone --app com.example.pizza \
  --schema Examples/PizzaDeliveryAttributes.schema.json > "$D/sim.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:$SIM/health

$ISLE master-key > "$D/master.key" && chmod 600 "$D/master.key"
export ISLE_MASTER_KEY_FILE="$D/master.key"
DB="$D/isle.sqlite"
$ISLE app add --database "$DB" --bundle-id com.example.pizza --key "$D/sim/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json >/dev/null
BACKEND=$($ISLE key create --database "$DB" --bundle-id com.example.pizza --scope backend)
DEVICE=$($ISLE key create --database "$DB" --bundle-id com.example.pizza --scope device)
TICKET_KEY_ID=$($ISLE app ticket-key create --database "$DB" --bundle-id com.example.pizza --out "$D/ticket.pem")

serve() {
  # The receiver listens on 127.0.0.1, which webhooks may reach only when allowed.
  $ISLE serve --database "$DB" --port $API --apns-url https://127.0.0.1:$APNS --apns-ca-cert "$D/sim/ca.pem" --webhook-allow-private >> "$D/serve.log" 2>&1 &
  SERVE=$!
  wait_for http://127.0.0.1:$API/health
}
serve

# The backend's endpoint, down (500) at first.
touch "$D/down"
python3 scripts/webhook-receiver.py --port $HOOK --secret-file "$D/secret" --out "$D/received.jsonl" --fail-while "$D/down" &
PIDS+=($!)
for _ in $(seq 1 50); do curl -s -o /dev/null -X POST http://127.0.0.1:$HOOK/ && break; sleep 0.1; done
curl -sf -X POST http://127.0.0.1:$API/v1/webhooks -H "authorization: Bearer $BACKEND" -d "{\"url\":\"http://127.0.0.1:$HOOK/isle\"}" > "$D/webhook.json"
field '["secret"]' < "$D/webhook.json" > "$D/secret"

# Three activities on the phone, registered as the app does.
INSTALLATION_SECRET=$(curl -sf -X PUT http://127.0.0.1:$API/v1/installations/phone-1 -H "authorization: Bearer $DEVICE" -d '{}' | field '["installationSecret"]')
IDS=(); PHONE_IDS=()
for i in 1 2 3; do
  curl -sf -X POST http://127.0.0.1:$SIM/devices/device-1/apps/com.example.pizza/activities \
    -d '{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":1,"totalAmount":"$9.00","orderNumber":"'$i'"},"contentState":{"driverName":"Bill","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' > "$D/started.json"
  TOKEN=$(field '["updateToken"]' < "$D/started.json")
  PHONE_IDS+=("$(field '["id"]' < "$D/started.json")")
  TICKET=$($ISLE ticket --key "$D/ticket.pem" --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key order-$i)
  IDS+=("$(curl -sf -X POST http://127.0.0.1:$API/v1/activities -H "authorization: Bearer $DEVICE" -H "Isle-Installation-Secret: $INSTALLATION_SECRET" \
    -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"token\":\"$TOKEN\",\"installationID\":\"phone-1\",\"externalKey\":\"order-$i\",\"ticket\":\"$TICKET\"}" | field '["id"]')")
done

update() {  # activity, round: an update with an alert (alerts are never coalesced: each is delivered)
  curl -sf -o /dev/null -X POST "http://127.0.0.1:$API/v1/activities/$1/update" -H "authorization: Bearer $BACKEND" -H "Idempotency-Key: $1-$2" \
    -d "{\"contentState\":{\"driverName\":\"Driver $2\",\"deliveryTimer\":[788918400,788919900]},\"alert\":{\"title\":\"Update\",\"body\":\"round $2\"}}"
}
ROUNDS=20
for r in $(seq 1 10); do for id in "${IDS[@]}"; do update "$id" "$r"; done; done
# SIGKILL mid-stream (deliveries and webhook retries in flight), then start again on the same file.
kill -9 "$SERVE"; wait "$SERVE" 2>/dev/null || true
serve
# The same requests again (Idempotency-Key: queued once), then the rest.
for r in $(seq 1 $ROUNDS); do for id in "${IDS[@]}"; do update "$id" "$r"; done; done
rm -f "$D/down"   # the backend is back
# The app ends activity 3 on the phone and reports it, once its 20 updates reached the phone (a
# push in flight at the report would be delivered after it, rightly, and its event come later).
for _ in $(seq 1 300); do
  N=$(curl -sf "http://127.0.0.1:$API/v1/activities/${IDS[2]}" -H "authorization: Bearer $BACKEND" \
    | python3 -c 'import json,sys; print(sum(1 for d in json.load(sys.stdin)["deliveries"] if d["status"] == 200))')
  [ "$N" -ge "$ROUNDS" ] && break
  sleep 0.2
done
curl -sf -o /dev/null -X POST "http://127.0.0.1:$API/v1/activities/${IDS[2]}/ended" -H "authorization: Bearer $DEVICE" -H "Isle-Installation-Secret: $INSTALLATION_SECRET"
# A 410: activity 2's token rotates on the phone and the new one never reaches the server; the
# next push to the old token finds it dead.
curl -sf -o /dev/null -X POST "http://127.0.0.1:$SIM/devices/device-1/activities/${PHONE_IDS[1]}/rotate-token" -d '{}'
curl -sf -o /dev/null -X POST "http://127.0.0.1:$API/v1/activities/${IDS[1]}/update" -H "authorization: Bearer $BACKEND" \
  -d '{"contentState":{"driverName":"Anyone?","deliveryTimer":[788918400,788919900]}}'

# Wait for the whole story (the 410's push fails for good after the 30 s grace for a rotated
# token), and for the receiver to hold as many events as the pull API.
EXPECTED_DELIVERED=$((ROUNDS * 3))
for _ in $(seq 1 450); do
  python3 - "$D" "$BACKEND" $API $EXPECTED_DELIVERED <<'PY' && break
import json, sys, urllib.request
d, key, port, delivered = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
events, cursor = [], "0"
while True:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/events?after={cursor}&limit=100", headers={"authorization": "Bearer " + key})
    page = json.load(urllib.request.urlopen(req))
    if not page["events"]:
        break
    events += page["events"]
    cursor = page["next"]
types = [e["type"] for e in events]
try:
    received = [json.loads(l) for l in open(d + "/received.jsonl")]
except FileNotFoundError:
    received = []
done = types.count("push.failed") == 1 and len(received) == len(events)
json.dump(events, open(d + "/pulled.json", "w"))
sys.exit(0 if done else 1)
PY
  sleep 0.2
done
python3 - "$D" $EXPECTED_DELIVERED "${IDS[@]}" <<'PY'
import json, sys
d, delivered, ids = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
pulled = json.load(open(d + "/pulled.json"))
received = [json.loads(l) for l in open(d + "/received.jsonl")]
types = [e["type"] for e in pulled]
assert [e["id"] for e in received] == [e["id"] for e in pulled], f"the receiver's {len(received)} events differ from the pull API's {len(pulled)}"
assert types.count("push.delivered") == delivered, f"{types.count('push.delivered')} deliveries, expected {delivered}: {types}"
second = [e["type"] for e in pulled if e.get("activityID") == ids[1]]
assert second[-2:] == ["token.retired", "push.failed"], second
third = [e["type"] for e in pulled if e.get("activityID") == ids[2]]
assert third.count("activity.ended") == 1 and third[-1] == "activity.ended", third
# Per activity, the delivered pushes' rounds in order: nothing out of order across the crash.
for a in ids:
    rounds = [e["data"]["jobID"] for e in pulled if e.get("activityID") == a and e["type"] == "push.delivered"]
    assert rounds == sorted(rounds), (a, rounds)
rejected = open(d + "/received.jsonl.rejected").read().splitlines() if __import__("os").path.exists(d + "/received.jsonl.rejected") else []
assert not rejected, f"{len(rejected)} requests with a bad signature"
print(f"events: ok ({len(pulled)} events, {types.count('push.delivered')} delivered, the receiver down at first and isle serve SIGKILLed mid-stream; every signature valid)")
PY
grep -q '"status":"ok"' <(curl -sf http://127.0.0.1:$API/v1/webhooks -H "authorization: Bearer $BACKEND") || fail "the webhook does not show ok"
