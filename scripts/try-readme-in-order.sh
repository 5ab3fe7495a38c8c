#!/usr/bin/env bash
# The README's walkthrough — "Test without an iPhone", then "Run the server" — typed as a reader types
# it, at human speed: every command of its console blocks, read from README.md and run as written
# (scripts/walkthrough/readme_walkthrough.py), with the reader leaving for half an hour before each
# one. The pause is everyone's wall clock jumping 30 minutes at once — isle sim, isle serve, isle,
# curl, date, python — through scripts/walkthrough/pause-clock.c (LD_PRELOAD; ISLE_PAUSE=0 turns it
# off), as across a laptop's sleep: the simulator's virtual clock stands still meanwhile, as it does
# for a person who reads. Nothing
# may answer an error the reader did not cause: no command fails, no API or APNs answer is an
# error, the phone shows the backend's update, the app is running. Then the simulator is started a
# third time in the same --dir under the running server: its CA and provider key are kept, so the
# next update is delivered too.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build --product isle >/dev/null
ISLE_BIN="$PWD/.build/debug/isle"
PAUSE=${ISLE_PAUSE:-1800}
rm -rf /tmp/isle-sim /tmp/isle.sqlite /tmp/isle.sqlite-wal /tmp/isle.sqlite-shm /tmp/isle-ticket.pem /tmp/isle-walkthrough
mkdir -p /tmp/isle-walkthrough
for port in 18080 18090; do
  if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then echo "something already listens on 127.0.0.1:$port; stop it first"; exit 1; fi
done

# Everyone's clock, from here on: the pause clock (the C compiler at hand, or the Swift toolchain's clang).
CC=$(command -v cc || command -v gcc || echo "$(dirname "$(readlink -f "$(command -v swift)")")/clang")
"$CC" -O2 -shared -fPIC -o /tmp/isle-walkthrough/pause-clock.so scripts/walkthrough/pause-clock.c -ldl
echo 0 > /tmp/isle-walkthrough/offset
export ISLE_PAUSE_CLOCK_FILE=/tmp/isle-walkthrough/offset LD_PRELOAD=/tmp/isle-walkthrough/pause-clock.so
offset=0
pause() {
  [ "$PAUSE" = 0 ] && return
  offset=$((offset + PAUSE)); echo "$offset" > "$ISLE_PAUSE_CLOCK_FILE"
  # Every process reads the file again within 100 ms.
  sleep 0.3
}

# `swift run isle …` as written, on the binary built above (the reader's `swift run` builds nothing new).
swift() { if [ "$1" = run ] && [ "$2" = isle ]; then shift 2; "$ISLE_BIN" "$@"; else command swift "$@"; fi; }
PIDS=(); SIM=""
trap 'for p in "${PIDS[@]}" $SIM; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; true' EXIT
wait_for() { for _ in $(seq 1 150); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "nothing answers at $1"; tail -20 /tmp/isle-walkthrough/*.log; exit 1; }

n=0
while IFS= read -r entry; do
  n=$((n + 1))
  command=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["command"])' "$entry")
  background=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["background"] or "")' "$entry")
  [ "$n" -gt 1 ] && pause
  echo "[$n, +$((offset / 60)) min] $command" | cut -c1-160
  case "$background" in
    sim)
      # "Ctrl-C, then the same command": a second start replaces the first.
      if [ -n "$SIM" ]; then kill "$SIM"; wait "$SIM" 2>/dev/null || true; fi
      eval "exec ${command/swift run isle/\"\$ISLE_BIN\"}" >> /tmp/isle-walkthrough/sim.log 2>&1 &
      SIM=$!
      wait_for http://127.0.0.1:18080/health ;;
    serve)
      eval "exec ${command/swift run isle/\"\$ISLE_BIN\"}" >> /tmp/isle-walkthrough/serve.log 2>&1 &
      PIDS+=($!)
      wait_for http://127.0.0.1:18090/health ;;
    *)
      status=0
      eval "$command" < /dev/null > /tmp/isle-walkthrough/out.txt 2>&1 || status=$?
      cat /tmp/isle-walkthrough/out.txt >> /tmp/isle-walkthrough/commands.log
      if [ "$status" != 0 ] || grep -qE '"error" ?: ?\{|"reason" ?: ?"|InvalidProviderToken|ExpiredProviderToken|isle: ' /tmp/isle-walkthrough/out.txt; then
        cat /tmp/isle-walkthrough/out.txt
        echo "README in order: command $n failed after $((offset / 60)) minutes of pauses (exit $status): $command"; exit 1
      fi ;;
  esac
done < <(python3 scripts/walkthrough/readme_walkthrough.py README.md)
[ "$n" -ge 20 ] || { echo "README in order: only $n commands read from README.md"; exit 1; }

# What the reader sees at the end: the backend's update on the phone, delivered with a 200, the app running.
for _ in $(seq 1 150); do
  curl -s http://127.0.0.1:18090/v1/activities/by-key/12345 -H "authorization: Bearer $BACKEND_KEY" > /tmp/isle-walkthrough/activity.json
  grep -q '"status":200' /tmp/isle-walkthrough/activity.json && break
  sleep 0.1
done
curl -s http://127.0.0.1:18080/devices/device-1/screen > /tmp/isle-walkthrough/screen.json
curl -s http://127.0.0.1:18080/requests > /tmp/isle-walkthrough/requests.json
curl -s http://127.0.0.1:18090/v1/app -H "authorization: Bearer $BACKEND_KEY" > /tmp/isle-walkthrough/app.json
python3 - <<'PY'
import json
activity = json.load(open("/tmp/isle-walkthrough/activity.json"))
assert activity["deliveries"] and activity["deliveries"][-1]["status"] == 200, activity
screen = json.load(open("/tmp/isle-walkthrough/screen.json"))
assert any(a["contentState"]["driverName"] == "Anne Johnson" for a in screen["lockScreen"]), screen
requests = json.load(open("/tmp/isle-walkthrough/requests.json"))
requests = requests.get("requests", requests) if isinstance(requests, dict) else requests
refused = [(r["status"], r.get("reason"), r.get("note")) for r in requests if r["status"] >= 400]
assert not refused, "the simulator refused: %s" % refused
app = json.load(open("/tmp/isle-walkthrough/app.json"))
assert app["delivery"]["state"] == "running", app
print("README in order: %d APNs requests, none refused; the phone shows the backend's update" % len(requests))
PY
curl -sf http://127.0.0.1:18090/ready >/dev/null || { echo "the server is not ready"; exit 1; }

# --- the simulator started again in the same --dir, under the running server ---------------------
kill "$SIM"; wait "$SIM" 2>/dev/null || true
"$ISLE_BIN" sim --virtual-clock --dir /tmp/isle-sim --apns-port 18443 --broadcast-port 18444 --management-port 18445 \
  --control-port 18080 --device iPhone --app com.example.pizza --schema Examples/PizzaDeliveryAttributes.schema.json >> /tmp/isle-walkthrough/sim.log 2>&1 &
SIM=$!
wait_for http://127.0.0.1:18080/health
pause
curl -s -X POST http://127.0.0.1:18080/devices/device-1/apps/com.example.pizza/activities \
  -d '{"attributesType":"PizzaDeliveryAttributes","attributes":{"numberOfPizzas":3,"totalAmount":"$42.00","orderNumber":"12346"},"contentState":{"driverName":"Bill James","deliveryTimer":[788918400,788919900]},"waitForPushToken":true}' >/dev/null
TOKEN=$(curl -s http://127.0.0.1:18080/devices/device-1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["activities"][0]["updateToken"])')
SECRET=$(curl -s -X PUT http://127.0.0.1:18090/v1/installations/phone-2 -H "authorization: Bearer $DEVICE_KEY" -d '{}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["installationSecret"])')
TICKET=$("$ISLE_BIN" ticket --key /tmp/isle-ticket.pem --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key 12346)
curl -sf -X POST http://127.0.0.1:18090/v1/activities -H "authorization: Bearer $DEVICE_KEY" -H "Isle-Installation-Secret: $SECRET" \
  -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"token\":\"$TOKEN\",\"installationID\":\"phone-2\",\"externalKey\":\"12346\",\"ticket\":\"$TICKET\"}" >/dev/null
curl -sf -X POST http://127.0.0.1:18090/v1/activities/by-key/12346/update -H "authorization: Bearer $BACKEND_KEY" \
  -d '{"contentState":{"driverName":"Second Driver","deliveryTimer":[788918400,788919900]},"alert":{"title":"Delivery Update","body":"On its way"}}' >/dev/null
for _ in $(seq 1 150); do
  curl -s http://127.0.0.1:18080/devices/device-1/screen | grep -q '"Second Driver"' && break
  sleep 0.1
done
curl -s http://127.0.0.1:18080/devices/device-1/screen | grep -q '"Second Driver"' || { echo "the update after the simulator's restart did not reach the phone"; exit 1; }
curl -s http://127.0.0.1:18090/v1/app -H "authorization: Bearer $BACKEND_KEY" | grep -q '"state":"running"' || { echo "the app is not running"; exit 1; }
echo "README in order: ok — $n commands as written, a $((PAUSE / 60))-minute pause before each ($((offset / 3600)) h in all); the simulator restarted twice in one --dir, the server kept trusting it"
