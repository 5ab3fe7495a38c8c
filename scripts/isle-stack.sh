# Sourced by the scripts that need a whole Isle on loopback: `isle sim` with the pizza app, and
# `isle serve` on a fresh SQLite file pointed at it, with a backend, a device and an admin key.
#   isle_stack <first port>   # the simulator takes ports N…N+3 (device, broadcast, management
#                             # hosts, control), the server N+10
# Sets DIR, SIM_CONTROL, SERVER, BACKEND, DEVICE, ADMIN, SERVER_ADMIN (and a second app,
# com.example.tacos), and the backend's registration-ticket key
# (TICKET_KEY file, TICKET_KEY_ID); stops both and removes DIR on exit. ISLE_SERVE_FLAGS adds flags
# to isle serve, ISLE_SIM_FLAGS to isle sim.
isle_stack() {
  local base=$1
  swift build --product isle >/dev/null
  DIR=$(mktemp -d)
  STACK_PIDS=()
  trap 'for p in "${STACK_PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$DIR"; true' EXIT
  SIM_CONTROL="http://127.0.0.1:$((base + 3))"
  SERVER="http://127.0.0.1:$((base + 10))"
  # The binary itself in the background (not a shell function), so the trap stops the process.
  .build/debug/isle sim --dir "$DIR/sim" --apns-port "$base" --broadcast-port $((base + 1)) --management-port $((base + 2)) --control-port $((base + 3)) \
    --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json ${ISLE_SIM_FLAGS:-} > "$DIR/sim.log" 2>&1 &
  STACK_PIDS+=($!)
  isle_wait_for "$SIM_CONTROL/health"
  .build/debug/isle master-key > "$DIR/master.key" && chmod 600 "$DIR/master.key"
  export ISLE_MASTER_KEY_FILE="$DIR/master.key" ISLE_DATABASE="$DIR/isle.sqlite"
  .build/debug/isle app add --bundle-id com.example.pizza --key "$DIR/sim/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
    --schema Examples/PizzaDeliveryAttributes.schema.json >/dev/null
  BACKEND=$(.build/debug/isle key create --bundle-id com.example.pizza --scope backend 2>/dev/null)
  DEVICE=$(.build/debug/isle key create --bundle-id com.example.pizza --scope device 2>/dev/null)
  ADMIN=$(.build/debug/isle key create --bundle-id com.example.pizza --scope admin 2>/dev/null)
  # A second app and a server-admin key (the console's app switcher).
  .build/debug/isle app add --bundle-id com.example.tacos --key "$DIR/sim/AuthKey_SIMKEY0001.p8" --key-id SIMKEY0001 --team-id SIMTEAM001 \
    --schema Examples/PizzaDeliveryAttributes.schema.json >/dev/null
  SERVER_ADMIN=$(.build/debug/isle key create --bundle-id com.example.pizza --scope server-admin 2>/dev/null)
  TICKET_KEY="$DIR/ticket.pem"
  TICKET_KEY_ID=$(.build/debug/isle app ticket-key create --bundle-id com.example.pizza --out "$TICKET_KEY" 2>/dev/null)
  .build/debug/isle serve --port $((base + 10)) --apns-url "https://127.0.0.1:$base" --apns-broadcast-url "https://127.0.0.1:$((base + 1))" \
    --apns-management-url "https://127.0.0.1:$((base + 2))" --apns-ca-cert "$DIR/sim/ca.pem" ${ISLE_SERVE_FLAGS:-} > "$DIR/serve.log" 2>&1 &
  STACK_PIDS+=($!)
  isle_wait_for "$SERVER/health"
}

isle_wait_for() {
  for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done
  echo "nothing answers at $1"; cat "$DIR"/*.log; exit 1
}
