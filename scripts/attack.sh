#!/usr/bin/env bash
# The attacker suite against real processes (isle sim + isle serve): with only the public device
# key and installations of its own, an attacker tries every route against a victim's installation,
# activity and order; the victim's phone alone must receive the victim's update. CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/isle-stack.sh
# Short deadlines, so the slow-client checks take seconds; a small sign-in failure burst.
ISLE_SERVE_FLAGS="--header-timeout 3 --body-timeout 3 --idle-timeout 4 --auth-failure-rate 0.1/s,burst=8" isle_stack 18743
ISLE_SIM_CONTROL="$SIM_CONTROL" ISLE_SERVER="$SERVER" ISLE_BACKEND_KEY="$BACKEND" ISLE_DEVICE_KEY="$DEVICE" ISLE_ADMIN_KEY="$ADMIN" \
  ISLE_TICKET_KEY="$TICKET_KEY" ISLE_TICKET_KEY_ID="$TICKET_KEY_ID" ISLE_ATTACK_HEADER_TIMEOUT=3 ISLE_ATTACK_AUTH_FAILURE_BURST=8 python3 scripts/attack.py
if grep -q " 500 \|status=500" "$DIR/serve.log"; then echo "the server logged a 500"; exit 1; fi

# Trust v3 (scripts/attack_v3.py): a second stack with small fleet and creation allowances, so one
# run shows that a flood, a disk fill and thousands of idle sockets from one loopback address do not
# hurt another. Started with the soft open-file limit systemd gives a service by default (1,024):
# the server raises its own.
(
  ulimit -Sn 1024
  ISLE_SERVE_FLAGS="--device-rate 100/s,burst=100 --address-rate 20/s,burst=40 --max-new-installations-per-address 30 --max-new-activities-per-address 30 --max-connections-per-address 64" \
    isle_stack 18843
  ISLE_SIM_CONTROL="$SIM_CONTROL" ISLE_SERVER="$SERVER" ISLE_BACKEND_KEY="$BACKEND" ISLE_DEVICE_KEY="$DEVICE" ISLE_DATABASE="$ISLE_DATABASE" \
    ISLE_V3_CONNECTIONS_PER_ADDRESS=64 ISLE_V3_NEW_PER_HOUR=30 python3 scripts/attack_v3.py
  if grep -q " 500 \|status=500" "$DIR/serve.log"; then echo "the server logged a 500"; exit 1; fi
)
