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
source scripts/isle-stack.sh
# The console's webhook in the test points at a closed port on 127.0.0.1, which webhooks reach only when allowed.
ISLE_SERVE_FLAGS="${ISLE_SERVE_FLAGS:-} --webhook-allow-private"
# The pages watch one priority-5 update land: its delivery, not APNs' right to lose priority 5
# ("Never kinder than Apple", docs/simulator.md), is what this checks.
ISLE_SIM_FLAGS="--low-priority-loss 0" isle_stack 18643

rm -rf artifacts/screenshots && mkdir -p artifacts/screenshots
ISLE_SIM_CONTROL="$SIM_CONTROL" ISLE_SERVER="$SERVER" ISLE_BACKEND_KEY="$BACKEND" ISLE_DEVICE_KEY="$DEVICE" ISLE_ADMIN_KEY="$ADMIN" ISLE_SERVER_ADMIN_KEY="$SERVER_ADMIN" \
  ISLE_TICKET_KEY="$TICKET_KEY" ISLE_TICKET_KEY_ID="$TICKET_KEY_ID" \
  ISLE_SCREENSHOTS="$PWD/artifacts/screenshots" CHROMIUM="$CHROMIUM" CHROMEDRIVER="$CHROMEDRIVER" \
  .venv-browser/bin/python Tests/browser/pages_test.py
echo "screenshots: $PWD/artifacts/screenshots"
ls -1 artifacts/screenshots
