#!/usr/bin/env bash
# Property-based conformance: schemathesis (PyPI) generates requests from /openapi.json and checks
# every answer against the document, with a backend key and then a device key. CI runs it.
#   scripts/schemathesis.sh [--max-examples N] [--seed N]
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_EXAMPLES=25
SEED=20261123
while [ $# -gt 0 ]; do
  case "$1" in
    --max-examples) MAX_EXAMPLES="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    *) echo "unknown option $1"; exit 2 ;;
  esac
done
# schemathesis from PyPI, in a virtual environment of its own when it is not installed already.
if ! command -v schemathesis >/dev/null; then
  [ -x .venv-schemathesis/bin/schemathesis ] || { python3 -m venv .venv-schemathesis && .venv-schemathesis/bin/pip install --quiet schemathesis; }
  PATH="$PWD/.venv-schemathesis/bin:$PATH"
fi
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
DIR=$(mktemp -d)
PORT=18190
SERVE=""; SIM=""
trap 'kill $SERVE $SIM 2>/dev/null; wait $SERVE $SIM 2>/dev/null; rm -rf "$DIR"' EXIT
# APNs is the simulator (channel creation and deletion go to it).
.build/debug/isle sim --dir "$DIR/sim" --apns-port 18443 --broadcast-port 18444 --management-port 18445 --control-port 18180 --device iPhone --app com.example.pizza \
  --schema Examples/PizzaDeliveryAttributes.schema.json > "$DIR/sim.log" 2>&1 &
SIM=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:18180/health" >/dev/null && break; sleep 0.1; done
isle master-key > "$DIR/master.key" && chmod 600 "$DIR/master.key"
export ISLE_MASTER_KEY_FILE="$DIR/master.key" ISLE_DATABASE="$DIR/isle.sqlite"
isle app add --bundle-id com.example.pizza --key "$DIR/sim/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json >/dev/null
BACKEND=$(isle key create --bundle-id com.example.pizza --scope backend 2>/dev/null)
DEVICE=$(isle key create --bundle-id com.example.pizza --scope device 2>/dev/null)
.build/debug/isle serve --port $PORT --apns-url https://127.0.0.1:18443 --apns-broadcast-url https://127.0.0.1:18444 \
  --apns-management-url https://127.0.0.1:18445 --apns-ca-cert "$DIR/sim/ca.pem" > "$DIR/serve.log" 2>&1 &
SERVE=$!
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
status=0
for key in "$BACKEND" "$DEVICE"; do
  schemathesis run "http://127.0.0.1:$PORT/openapi.json" -H "Authorization: Bearer $key" \
    --checks all --seed "$SEED" --max-examples "$MAX_EXAMPLES" --no-color || status=1
done
if grep -q " 500 \|status=500" "$DIR/serve.log"; then echo "the server logged a 500"; status=1; fi
exit $status
