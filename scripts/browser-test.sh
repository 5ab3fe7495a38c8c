#!/usr/bin/env bash
# The web pages (the simulator's phone, the server's console) in a real headless Chromium: Debian's chromium and chromium-driver, selenium from
# PyPI in a virtual environment of its own (nothing downloaded at run time besides the wheel).
# Screenshots are written to artifacts/screenshots (CI prints where).
set -euo pipefail
cd "$(dirname "$0")/.."
CHROMIUM=${CHROMIUM:-$(command -v chromium || true)}
CHROMEDRIVER=${CHROMEDRIVER:-$(command -v chromedriver || true)}
if [ -z "$CHROMIUM" ] || [ -z "$CHROMEDRIVER" ]; then echo "browser test: needs chromium and chromium-driver (apt-get install -y chromium chromium-driver)"; exit 1; fi
if ! .venv-browser/bin/python -c "import selenium" >/dev/null 2>&1; then
  python3 -m venv .venv-browser && .venv-browser/bin/pip install --quiet selenium
fi
swift build --product isle >/dev/null
isle() { .build/debug/isle "$@"; }
DIR=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$DIR"; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; cat "$DIR"/*.log; exit 1; }

.build/debug/isle sim --dir "$DIR/sim" --apns-port 18643 --broadcast-port 18644 --management-port 18645 --control-port 18680 \
  --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json > "$DIR/sim.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18680/health
isle master-key > "$DIR/master.key" && chmod 600 "$DIR/master.key"
export ISLE_MASTER_KEY_FILE="$DIR/master.key" ISLE_DATABASE="$DIR/isle.sqlite"
isle app add --bundle-id com.example.pizza --key "$DIR/sim/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
  --schema Examples/PizzaDeliveryAttributes.schema.json >/dev/null
BACKEND=$(isle key create --bundle-id com.example.pizza --scope backend 2>/dev/null)
DEVICE=$(isle key create --bundle-id com.example.pizza --scope device 2>/dev/null)
ADMIN=$(isle key create --bundle-id com.example.pizza --scope admin 2>/dev/null)
.build/debug/isle serve --port 18690 --apns-url https://127.0.0.1:18643 --apns-broadcast-url https://127.0.0.1:18644 \
  --apns-management-url https://127.0.0.1:18645 --apns-ca-cert "$DIR/sim/ca.pem" > "$DIR/serve.log" 2>&1 &
PIDS+=($!)
wait_for http://127.0.0.1:18690/health

rm -rf artifacts/screenshots && mkdir -p artifacts/screenshots
ISLE_SIM_CONTROL=http://127.0.0.1:18680 ISLE_SERVER=http://127.0.0.1:18690 ISLE_BACKEND_KEY="$BACKEND" ISLE_DEVICE_KEY="$DEVICE" ISLE_ADMIN_KEY="$ADMIN" \
  ISLE_SCREENSHOTS="$PWD/artifacts/screenshots" CHROMIUM="$CHROMIUM" CHROMEDRIVER="$CHROMEDRIVER" \
  .venv-browser/bin/python Tests/browser/pages_test.py
echo "screenshots: $PWD/artifacts/screenshots"
ls -1 artifacts/screenshots
