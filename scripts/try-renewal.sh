#!/usr/bin/env bash
# An activity that outlives 8 hours with real processes (docs/server.md, "Activities that outlive 8
# hours"): `isle sim --virtual-clock` and `isle serve --clock-url` following its clock, so 8 hours
# pass in a second. The flow is scripts/renewal_flow.py. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
D=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$D"; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; cat "$D"/*.log; exit 1; }

# The clock moves only when the flow moves it, so a push APNs held for reordering would wait for
# that; and the flow's app reports each token once, not on every pushTokenUpdates (IsleClient does):
# this checks the renewal, not reordering or token changes (docs/simulator.md, "Never kinder than Apple").
# isle serve follows the virtual clock, so its provider tokens are judged by that clock alone
# (docs/simulator.md, "Provider tokens and the virtual clock"): one it failed to refresh is refused.
.build/debug/isle sim --virtual-clock --provider-token-clock virtual --dir "$D/sim" --single-host --apns-port 18763 --control-port 18580 --key-id SIMKEY0001 --reorder 0 --token-rotation off \
  --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > "$D/sim.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18580/health
for _ in $(seq 1 100); do [ -s "$D/sim/AuthKey_SIMKEY0001.p8" ] && break; sleep 0.1; done
isle master-key > "$D/master.key" && chmod 600 "$D/master.key"
export ISLE_MASTER_KEY_FILE="$D/master.key" ISLE_DATABASE="$D/isle.sqlite"
isle app add --bundle-id com.example.pizza --key "$D/sim/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json > /dev/null
BACKEND_KEY=$(isle key create --bundle-id com.example.pizza --scope backend 2>/dev/null)
DEVICE_KEY=$(isle key create --bundle-id com.example.pizza --scope device 2>/dev/null)
TICKET_KEY_ID=$(isle app ticket-key create --bundle-id com.example.pizza --out "$D/ticket.pem" 2>/dev/null)
TICKET=$(isle ticket --key "$D/ticket.pem" --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key flight-1 --ttl 3600)
.build/debug/isle serve --port 18590 --apns-url https://127.0.0.1:18763 --apns-ca-cert "$D/sim/ca.pem" --clock-url http://127.0.0.1:18580 > "$D/serve.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18590/health

if ! python3 scripts/renewal_flow.py http://127.0.0.1:18590 http://127.0.0.1:18580 "$BACKEND_KEY" "$DEVICE_KEY" "$TICKET"; then
  echo "--- serve.log"; tail -40 "$D/serve.log"; echo "--- sim.log"; tail -20 "$D/sim.log"
  exit 1
fi
echo "try-renewal: ok"
