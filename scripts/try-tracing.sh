#!/usr/bin/env bash
# Tracing with real processes (docs/server.md, "Tracing"): isle sim, an OTLP receiver
# (scripts/otlp-receiver.py) and isle serve started with the OTEL_* variables, as an operator
# would. One update sent with the backend's traceparent must come back as three spans of that
# trace, linked (request → delivery attempt → APNs request, with the delivery's apns-id), and the
# server's log line for the push must carry the trace id.
set -euo pipefail
cd "$(dirname "$0")/.."
# isle_stack: isle sim and isle serve on loopback with the pizza app and its keys; isle serve
# inherits the OTEL_* variables, as an operator's would.
source scripts/isle-stack.sh
OTLP=18895
if curl -s -o /dev/null "http://127.0.0.1:$OTLP/" 2>/dev/null; then echo "something already listens on 127.0.0.1:$OTLP; stop it first"; exit 1; fi
export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$OTLP OTEL_EXPORTER_OTLP_PROTOCOL=http/json OTEL_BSP_SCHEDULE_DELAY=200
ISLE_SERVE_FLAGS="--log-level debug" isle_stack 18843
unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_PROTOCOL OTEL_BSP_SCHEDULE_DELAY
ISLE=.build/debug/isle
API=${SERVER#http://127.0.0.1:}
SIM=${SIM_CONTROL#http://127.0.0.1:}
D=$DIR
python3 scripts/otlp-receiver.py --port $OTLP --out "$D/spans.jsonl" &
STACK_PIDS+=($!)
fail() { echo "try-tracing: $*"; echo "--- serve log:"; tail -30 "$D/serve.log"; echo "--- spans:"; cat "$D/spans.jsonl" 2>/dev/null; exit 1; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$OTLP/" && break; sleep 0.1; done
for _ in $(seq 1 50); do grep -q "tracing:   OTLP" "$D/serve.log" && break; sleep 0.1; done
grep -q "tracing:   OTLP http/json to http://127.0.0.1:$OTLP/v1/traces" "$D/serve.log" || fail "the banner does not say where spans go"

INSTALLATION_SECRET=$(curl -sf -X PUT http://127.0.0.1:$API/v1/installations/phone-1 -H "authorization: Bearer $DEVICE" -d '{}' | field '["installationSecret"]')
curl -sf -X POST http://127.0.0.1:$SIM/devices/device-1/apps/com.example.pizza/activities \
  -d '{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":1,"totalAmount":"$9.00","orderNumber":"1"},"contentState":{"driverName":"Bill","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' > "$D/started.json"
TOKEN=$(field '["updateToken"]' < "$D/started.json")
TICKET=$($ISLE ticket --key "$TICKET_KEY" --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key order-1)
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
echo "try-tracing: passed (one update: request, attempt and APNs request spans in the backend's trace; the log line carries its trace id)"
