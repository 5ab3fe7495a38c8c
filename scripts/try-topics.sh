#!/usr/bin/env bash
# Topics as audiences with real processes (docs/server.md, "Topics as audiences"): `isle sim`
# with phones on iOS 18, 26, 17.2 and 16.4, and `isle serve` with a channel limit of 2. The
# backend opens a match topic; each phone's app follows it as IsleClient does (the topic's
# channel on iOS 18 and later, a token before); three score updates, one backend call each, reach
# every phone; the channel limit closes the idlest unfollowed topic channel, then answers 409
# channelLimit; the end reaches every phone and the topic's channel is deleted at APNs.
# Loopback only. The flow itself is scripts/topics_flow.py.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
D=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$D"; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; cat "$D"/*.log; exit 1; }

.build/debug/isle sim --dir "$D/sim" --single-host --apns-port 18753 --control-port 18480 --key-id SIMKEY0001 \
  > "$D/sim.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18480/health
for _ in $(seq 1 100); do [ -s "$D/sim/AuthKey_SIMKEY0001.p8" ] && break; sleep 0.1; done
isle master-key > "$D/master.key" && chmod 600 "$D/master.key"
export ISLE_MASTER_KEY_FILE="$D/master.key" ISLE_DATABASE="$D/isle.sqlite"
isle app add --bundle-id com.example.pizza --key "$D/sim/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json > /dev/null
BACKEND_KEY=$(isle key create --bundle-id com.example.pizza --scope backend 2>/dev/null)
DEVICE_KEY=$(isle key create --bundle-id com.example.pizza --scope device 2>/dev/null)
.build/debug/isle serve --port 18490 --apns-url https://127.0.0.1:18753 \
  --apns-ca-cert "$D/sim/ca.pem" --channel-limit 2 > "$D/serve.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18490/health

if ! python3 scripts/topics_flow.py http://127.0.0.1:18490 http://127.0.0.1:18480 "$BACKEND_KEY" "$DEVICE_KEY" Examples/PizzaDeliveryAttributes.schema.json; then
  echo "--- serve.log"; tail -40 "$D/serve.log"; echo "--- sim.log"; tail -20 "$D/sim.log"
  exit 1
fi
echo "try-topics: ok"
