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
# APNs is the simulator (channel creation and deletion go to it).
source scripts/isle-stack.sh
isle_stack 18443
# The device runs as an app does: with its installation's secret, so device routes are exercised
# past the secret check (requests for other installations are refused with 403, as documented).
SECRET=$(curl -s -X PUT "$SERVER/v1/installations/schemathesis-phone" -H "Authorization: Bearer $DEVICE" -d '{}' \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["installationSecret"])')
status=0
schemathesis run "$SERVER/openapi.json" -H "Authorization: Bearer $BACKEND" \
  --checks all --seed "$SEED" --max-examples "$MAX_EXAMPLES" --no-color || status=1
schemathesis run "$SERVER/openapi.json" -H "Authorization: Bearer $DEVICE" -H "Isle-Installation-Secret: $SECRET" \
  --checks all --seed "$SEED" --max-examples "$MAX_EXAMPLES" --no-color || status=1
if grep -q " 500 \|status=500" "$DIR/serve.log"; then echo "the server logged a 500"; status=1; fi
exit $status
