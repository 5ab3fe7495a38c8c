#!/usr/bin/env bash
# A backend's APNs sender in shell: curl --http2 trusting only the given CA. The provider token comes
# from `isle jwt` when ISLE_BINARY names an isle binary (as docs/simulator.md and the README show),
# else from openssl (ES256, the DER signature turned into JOSE's raw r||s). It speaks APNs only — no
# simulator control API.
#
# Configuration (environment): APNS_URL, APNS_BROADCAST_URL, APNS_MANAGEMENT_URL, APNS_CA (PEM),
# APNS_KEY (.p8), APNS_KEY_ID, APNS_TEAM_ID, APNS_BUNDLE_ID, CLIENT_LABEL, ISLE_BINARY (optional).
#
# Commands on stdin, one a line (the tokens reach a backend from the app):
#     start <push-to-start token>    update <update token>    end <update token>
#     widgets <widget push token>    channel                  broadcast <channel id>
# For each it prints `<command> <status> <apns-id | channel id | apns-request-id> [outcome]`, and
# exits 1 on an answer other than 200 (201 for `channel`).
#
#     printf 'start 0a1b…\n' | APNS_URL=… bash apns_curl.sh
set -euo pipefail
: "${APNS_URL:?}" "${APNS_BROADCAST_URL:?}" "${APNS_MANAGEMENT_URL:?}" "${APNS_CA:?}" "${APNS_KEY:?}" "${APNS_KEY_ID:?}" "${APNS_TEAM_ID:?}" "${APNS_BUNDLE_ID:?}"
LABEL=${CLIENT_LABEL:-curl}
APPLE_EPOCH=978307200 # a Swift Date in a ContentState counts from 2001-01-01
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
# A DER ECDSA signature on stdin as the raw 64 bytes r||s (each integer left-padded to 32 bytes).
der_to_raw() {
  local hex="" n
  for n in $(openssl asn1parse -inform DER | sed -n 's/.*INTEGER *://p'); do
    n=$(printf '%064s' "$n" | tr ' ' 0)
    hex+=${n: -64}
  done
  [ ${#hex} = 128 ] || { echo "unexpected ECDSA signature" >&2; exit 1; }
  printf "$(sed 's/../\\x&/g' <<<"$hex")"
}
jwt_openssl() {
  local input
  input="$(printf '{"alg":"ES256","kid":"%s"}' "$APNS_KEY_ID" | b64url).$(printf '{"iss":"%s","iat":%d}' "$APNS_TEAM_ID" "$(date +%s)" | b64url)"
  printf '%s.%s' "$input" "$(printf '%s' "$input" | openssl dgst -sha256 -sign "$APNS_KEY" -binary | der_to_raw | b64url)"
}
# One provider token for the run (APNs refuses a new token on a connection within 20 minutes).
if [ -n "${ISLE_BINARY:-}" ]; then
  JWT=$(ISLE_APNS_KEY="$APNS_KEY" ISLE_APNS_KEY_ID="$APNS_KEY_ID" ISLE_APNS_TEAM_ID="$APNS_TEAM_ID" "$ISLE_BINARY" jwt)
else
  JWT=$(jwt_openssl)
fi

LAST_TS=0
next_timestamp() { # seconds, strictly increasing from step to step
  local now; now=$(date +%s)
  LAST_TS=$(( now > LAST_TS ? now : LAST_TS + 1 ))
}
json_string() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
state() {
  local now=$(( $(date +%s) - APPLE_EPOCH ))
  printf '{"driverName":%s,"deliveryTimer":[%d,%d]}' "$(json_string "$LABEL $1")" "$now" "$((now + 1800))"
}

# send BASE PATH BODY [header…]: sets STATUS; the answer's headers in $WORK/headers, body in $WORK/body.
send() {
  local base=$1 path=$2 body=$3; shift 3
  local args=() h out
  for h in "$@"; do args+=(-H "$h"); done
  out=$(curl -sS --http2 --cacert "$APNS_CA" --max-time 15 -X POST \
    -H "authorization: bearer $JWT" -H "content-type: application/json" "${args[@]}" \
    --data-binary "$body" -D "$WORK/headers" -o "$WORK/body" -w '%{http_code} %{http_version}' "$base$path")
  STATUS=${out% *}
  [ "${out#* }" = 2 ] || { echo "$base answered over HTTP/${out#* }, not HTTP/2" >&2; exit 1; }
}
header() { tr -d '\r' < "$WORK/headers" | sed -n "s/^$1: //Ip" | head -1; }
device_push() { # TYPE TOKEN APS
  send "$APNS_URL" "/3/device/$2" "{\"aps\":$3}" "apns-push-type: $1" "apns-topic: $APNS_BUNDLE_ID.push-type.$1" "apns-priority: 10"
}

while read -r command arg _; do
  [ -n "${command:-}" ] || continue
  expected=200 value_header=apns-id
  case $command in
    quit) break ;;
    start)
      next_timestamp
      device_push liveactivity "$arg" "{\"timestamp\":$LAST_TS,\"event\":\"start\",\"alert\":{\"title\":\"Order confirmed\",\"body\":$(json_string "$LABEL is on it")},\"attributes-type\":\"PizzaDeliveryAttributes\",\"attributes\":{\"numberOfPizzas\":2,\"totalAmount\":\"\$21.00\",\"orderNumber\":$(json_string "$LABEL")},\"content-state\":$(state start),\"input-push-token\":1}" ;;
    update)
      next_timestamp
      device_push liveactivity "$arg" "{\"timestamp\":$LAST_TS,\"event\":\"update\",\"content-state\":$(state update),\"alert\":{\"title\":\"On the way\",\"body\":$(json_string "$LABEL is driving")}}" ;;
    end)
      next_timestamp
      device_push liveactivity "$arg" "{\"timestamp\":$LAST_TS,\"event\":\"end\",\"content-state\":$(state end),\"dismissal-date\":$((LAST_TS + 3600))}" ;;
    widgets)
      device_push widgets "$arg" '{"content-changed":true}' ;;
    channel)
      send "$APNS_MANAGEMENT_URL" "/1/apps/$APNS_BUNDLE_ID/channels" '{"message-storage-policy":0,"push-type":"LiveActivity"}'
      expected=201 value_header=apns-channel-id ;;
    broadcast)
      next_timestamp
      send "$APNS_BROADCAST_URL" "/4/broadcasts/apps/$APNS_BUNDLE_ID" "{\"aps\":{\"timestamp\":$LAST_TS,\"event\":\"update\",\"content-state\":$(state broadcast)}}" \
        "apns-channel-id: $arg" "apns-push-type: liveactivity" "apns-priority: 10" "apns-expiration: 0"
      value_header=apns-request-id ;;
    *) echo "unknown command $command" >&2; exit 2 ;;
  esac
  value=$(header "$value_header")
  if [ "$STATUS" != "$expected" ] || [ -z "$value" ]; then
    value=$(sed -n 's/.*"reason" *: *"\([^"]*\)".*/\1/p' "$WORK/body")
    echo "$command $STATUS ${value:--}"
    echo "$command: APNs answered $STATUS $(cat "$WORK/body")" >&2
    exit 1
  fi
  echo "$command $STATUS $value $(header isle-sim-outcome)"
done
