#!/usr/bin/env bash
# Tracing with real processes (docs/server.md, "Tracing"): isle sim, an OTLP receiver
# (scripts/otlp-receiver.py) and isle serve started with the OTEL_* variables, as an operator
# would. One update sent with the backend's traceparent must come back as three spans of that
# trace, linked (request → delivery attempt → APNs request, with the delivery's apns-id), and the
# server's log line for the push must carry the trace id.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
ISLE=.build/debug/isle
D=$(mktemp -d /tmp/isle-tracing.XXXXXX)
SIM=18280; APNS=18643; API=18290; OTLP=18295
for port in $SIM $API $OTLP; do
  if curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then echo "something already listens on 127.0.0.1:$port; stop it first"; exit 1; fi
done
PIDS=()
cleanup() { set +e; for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$D"; true; }
trap cleanup EXIT
fail() { echo "try-tracing: $*"; echo "--- serve log:"; tail -30 "$D/serve.log"; echo "--- spans:"; cat "$D/spans.jsonl" 2>/dev/null; exit 1; }
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; fail "nothing answers at $1"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

$ISLE sim --dir "$D/sim" --apns-port $APNS --control-port $SIM --device iPhone --app com.example.pizza \
  --schema Examples/PizzaDeliveryAttributes.schema.json > "$D/sim.log" 2>&1 &
PIDS+=($!)
python3 scripts/otlp-receiver.py --port $OTLP --out "$D/spans.jsonl" &
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

OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$OTLP OTEL_EXPORTER_OTLP_PROTOCOL=http/json OTEL_BSP_SCHEDULE_DELAY=200 \
  $ISLE serve --database "$DB" --port $API --apns-url https://127.0.0.1:$APNS --apns-ca-cert "$D/sim/ca.pem" --log-level debug > "$D/serve.log" 2>&1 &
SERVE=$!
PIDS+=($SERVE)
wait_for http://127.0.0.1:$API/health
grep -q "tracing:   OTLP http/json to http://127.0.0.1:$OTLP/v1/traces" "$D/serve.log" || fail "the banner does not say where spans go"

INSTALLATION_SECRET=$(curl -sf -X PUT http://127.0.0.1:$API/v1/installations/phone-1 -H "authorization: Bearer $DEVICE" -d '{}' | field '["installationSecret"]')
curl -sf -X POST http://127.0.0.1:$SIM/devices/device-1/apps/com.example.pizza/activities \
  -d '{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":1,"totalAmount":"$9.00","orderNumber":"1"},"contentState":{"driverName":"Bill","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' > "$D/started.json"
TOKEN=$(field '["updateToken"]' < "$D/started.json")
TICKET=$($ISLE ticket --key "$D/ticket.pem" --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key order-1)
ID=$(curl -sf -X POST http://127.0.0.1:$API/v1/activities -H "authorization: Bearer $DEVICE" -H "Isle-Installation-Secret: $INSTALLATION_SECRET" \
  -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"token\":\"$TOKEN\",\"installationID\":\"phone-1\",\"externalKey\":\"order-1\",\"ticket\":\"$TICKET\"}" | field '["id"]')

TRACE=4bf92f3577b34da6a3ce929d0e0e4736
PARENT=00f067aa0ba902b7
curl -sf -o /dev/null -X POST "http://127.0.0.1:$API/v1/activities/$ID/update" -H "authorization: Bearer $BACKEND" -H "traceparent: 00-$TRACE-$PARENT-01" \
  -d '{"contentState":{"driverName":"Traced","deliveryTimer":[788918400,788919900]},"alert":{"title":"Update","body":"traced"}}'
for _ in $(seq 1 100); do
  APNS_ID=$(curl -sf "http://127.0.0.1:$API/v1/activities/$ID" -H "authorization: Bearer $BACKEND" | python3 -c 'import json,sys; d=json.load(sys.stdin)["deliveries"]; print(d[0]["apnsID"] if d else "")')
  [ -n "$APNS_ID" ] && break; sleep 0.1
done
[ -n "$APNS_ID" ] || fail "the update was not delivered"
for _ in $(seq 1 100); do
  [ "$(grep -c "\"trace\": \"$TRACE\"" "$D/spans.jsonl" 2>/dev/null || true)" -ge 3 ] && break; sleep 0.1
done
python3 - "$D/spans.jsonl" "$TRACE" "$PARENT" "$APNS_ID" <<'PY' || fail "the spans are not one linked trace"
import json, sys
path, trace, parent, apns_id = sys.argv[1:]
spans = [s for s in map(json.loads, open(path)) if s["trace"] == trace]
by_kind = {s["kind"]: s for s in spans}
request, attempt, push = by_kind.get(2), by_kind.get(5), by_kind.get(3)
assert len(spans) == 3 and request and attempt and push, spans
assert request["parent"] == parent and request["name"].endswith("/update"), request
assert attempt["parent"] == request["span"] and attempt["attributes"].get("isle.job.result") == "sent", attempt
assert push["parent"] == attempt["span"] and push["attributes"].get("apns.id", "").lower() == apns_id.lower(), push
assert push["attributes"].get("http.response.status_code") == "200", push
print("try-tracing: spans:", " → ".join(f'{s["name"]}' for s in (request, attempt, push)))
PY
grep "pushed" "$D/serve.log" | grep -q "trace_id=$TRACE" || fail "the log line of the push does not carry the trace id"
kill -TERM $SERVE; wait $SERVE 2>/dev/null || true
echo "try-tracing: passed (one update: request, attempt and APNs request spans in the backend's trace; the log line carries its trace id)"
