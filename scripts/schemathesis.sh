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
# APNs is the simulator (channel creation and deletion go to it). The device-key limits are raised
# so generated requests reach the handlers rather than the rate limiter (attack.sh checks the limits).
# Webhooks only to this machine (whatever URL the generator makes), long polls of at most 1 s.
ISLE_SERVE_FLAGS="--installation-rate 5000/s,burst=10000 --address-rate 5000/s,burst=10000 --device-rate 5000/s,burst=10000 --webhook-hosts 127.0.0.1 --max-event-wait 1"
# Every generated installation id and activity is new: no hourly allowance of new ones per address
# (environment, not flags: a server without these settings ignores them).
export ISLE_MAX_NEW_INSTALLATIONS_PER_ADDRESS=0 ISLE_MAX_NEW_ACTIVITIES_PER_ADDRESS=0
source scripts/isle-stack.sh
isle_stack 18443
ISLE=.build/debug/isle
ticket() { "$ISLE" ticket --key "$TICKET_KEY" --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --ttl 3600 "$@"; }
json_field() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
# Records that exist, as an app and its backend make them: the installation (its user from a
# ticket; the secret the server made for it), a live activity on the simulated phone registered
# with the backend's ticket for its order key and a topic, and a spare installation registered with
# a secret the "app" chose (DELETE removes it, never the first). scripts/schemathesis_hooks.py puts
# them (with their secrets, and a valid ticket) into most generated requests, so device and backend
# routes run past "not found" and the secret check.
SECRET=$(curl -sf -X PUT "$SERVER/v1/installations/schemathesis-phone" -H "Authorization: Bearer $DEVICE" \
  -d "{\"ticket\":\"$(ticket --user schemathesis-user --installation schemathesis-phone)\"}" | json_field installationSecret)
SPARE_SECRET=isle_app_schemathesis_spare_0123456789abcdefghij
curl -sf -X PUT "$SERVER/v1/installations/schemathesis-spare" -H "Authorization: Bearer $DEVICE" -H "Isle-Installation-Secret: $SPARE_SECRET" -d '{}' \
  | python3 -c 'import json,sys; sys.exit("the spare installation did not take the secret it presented" if "installationSecret" in json.load(sys.stdin) else 0)'
TOKEN=$(curl -sf -X POST "$SIM_CONTROL/devices/device-1/apps/com.example.pizza/activities" -d '{"attributesType":"PizzaDeliveryAttributes",
  "attributes":{"numberOfPizzas":1,"totalAmount":"$9.00","orderNumber":"4242"},
  "contentState":{"driverName":"Bill James","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' | json_field updateToken)
ACTIVITY=$(curl -sf -X POST "$SERVER/v1/activities" -H "Authorization: Bearer $DEVICE" -H "Isle-Installation-Secret: $SECRET" \
  -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"token\":\"$TOKEN\",\"installationID\":\"schemathesis-phone\",
       \"externalKey\":\"order-4242\",\"topics\":[\"kitchen\"],\"ticket\":\"$(ticket --external-key order-4242 --installation schemathesis-phone)\"}" | json_field id)
export SCHEMATHESIS_HOOKS=schemathesis_hooks PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
export ISLE_ST_INSTALLATION=schemathesis-phone ISLE_ST_ACTIVITY="$ACTIVITY" ISLE_ST_KEY=order-4242 ISLE_ST_TOPIC=kitchen ISLE_ST_USER=schemathesis-user
export ISLE_ST_SECRET="$SECRET" ISLE_ST_SPARE=schemathesis-spare ISLE_ST_SPARE_SECRET="$SPARE_SECRET"
export ISLE_ST_TICKET="$(ticket --external-key order-4243 --user schemathesis-user --installation schemathesis-phone)" ISLE_ST_TICKET_KEY=order-4243
echo "records: installation schemathesis-phone, activity $ACTIVITY (order-4242, topic kitchen), user schemathesis-user, spare installation schemathesis-spare"
status=0
schemathesis --config-file scripts/schemathesis.toml run "$SERVER/openapi.json" -H "Authorization: Bearer $BACKEND" \
  --checks all --seed "$SEED" --max-examples "$MAX_EXAMPLES" --no-color || status=1
# No Isle-Installation-Secret here: schemathesis generates it from the document's rule (the hooks
# make most well-formed ones the installation's own), and sends it missing or malformed too.
schemathesis --config-file scripts/schemathesis.toml run "$SERVER/openapi.json" -H "Authorization: Bearer $DEVICE" \
  --checks all --seed "$SEED" --max-examples "$MAX_EXAMPLES" --no-color || status=1
if grep -q " 500 \|status=500" "$DIR/serve.log"; then echo "the server logged a 500"; status=1; fi
exit $status
