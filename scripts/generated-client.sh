#!/usr/bin/env bash
# A typed client generated from the server's own /openapi.json by a standard generator
# (openapi-python-client, from PyPI) drives a real isle serve and isle sim through a backend's flow:
# a ticket, an installation and an activity registered as the app does, an update and an end by
# the order's key, the events paged and long-polled, a webhook with a filter (its signatures
# verified) managed through its life, listing, and refusals read as the typed error. Every answer
# is parsed by the generated models, so an answer the document misstates fails here. CI runs it.
#   scripts/generated-client.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-generated-client
if [ ! -x "$VENV/bin/openapi-python-client" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet openapi-python-client httpx attrs python-dateutil
fi
ISLE_SERVE_FLAGS="--webhook-hosts 127.0.0.1"
source scripts/isle-stack.sh
isle_stack 18700
# The client is generated from what the running server serves, not from the committed copy.
curl -sf "$SERVER/openapi.json" -o "$DIR/openapi.json"
cmp -s <(python3 -m json.tool --sort-keys "$DIR/openapi.json") <(python3 -m json.tool --sort-keys docs/openapi.json) \
  || { echo "the served document differs from docs/openapi.json"; exit 1; }
mkdir -p "$DIR/gen"
"$VENV/bin/openapi-python-client" generate --path "$DIR/openapi.json" --output-path "$DIR/gen/isle_client" --meta none > "$DIR/generate.log" 2>&1 \
  || { cat "$DIR/generate.log"; exit 1; }
# Warnings other than the missing formatter (ruff) mean parts were skipped: an endpoint or a model.
if grep -v -e "ruff is not in PATH" -e "^Generating" -e "Skipping Integration" -e "^Warning(s) encountered" -e "^If you believe" -e "^$" "$DIR/generate.log" | grep -q .; then
  echo "openapi-python-client warned:"; cat "$DIR/generate.log"; exit 1
fi
ticket() { .build/debug/isle ticket --key "$TICKET_KEY" --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --ttl 3600 "$@"; }
export ISLE_SERVER="$SERVER" ISLE_SIM_CONTROL="$SIM_CONTROL" ISLE_BACKEND="$BACKEND" ISLE_DEVICE="$DEVICE"
export ISLE_USER_TICKET="$(ticket --user gen-user --installation gen-phone)" ISLE_KEY_TICKET="$(ticket --external-key order-gen --installation gen-phone)"
PYTHONPATH="$DIR/gen" "$VENV/bin/python" scripts/generated_client_flow.py
if grep -q " 500 \|status=500" "$DIR/serve.log"; then echo "the server logged a 500"; exit 1; fi
