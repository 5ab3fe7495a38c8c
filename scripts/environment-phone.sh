# Sourced by try-environments.sh and try-environment-keys.sh: a phone's app on the simulator at
# control port CONTROL starts order ORDER, registers its installation (phone-ENV, reporting ENV) and
# the activity's token with the server at SERVER (the backend's ticket for the order key), then the
# backend sends the order an update ("Driver ORDER"). Needs D (with ticket.pem), DEVICE_KEY,
# BACKEND_KEY and TICKET_KEY_ID.
#   environment_phone SERVER ENV CONTROL ORDER [PRIORITY]
environment_phone() {
  local server=$1 env=$2 control=$3 order=$4 priority=${5:-}
  local token secret ticket
  token=$(curl -s -X POST "http://127.0.0.1:$control/devices/device-1/apps/com.example.pizza/activities" \
    -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"attributes\":{\"numberOfPizzas\":1,\"totalAmount\":\"\$9.00\",\"orderNumber\":\"$order\"},\"contentState\":{\"driverName\":\"Bill James\",\"deliveryTimer\":[788918400,788919900]},\"waitForPushToken\":true}" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["updateToken"])')
  secret=$(curl -s -X PUT "$server/v1/installations/phone-$env" -H "authorization: Bearer $DEVICE_KEY" -d "{\"environment\":\"$env\"}" \
    | python3 -c 'import json,sys; a=json.load(sys.stdin); assert a["environment"]==sys.argv[1], a; print(a["installationSecret"])' "$env")
  ticket=$(.build/debug/isle ticket --key "$D/ticket.pem" --key-id "$TICKET_KEY_ID" --bundle-id com.example.pizza --external-key "order-$order")
  curl -sf -X POST "$server/v1/activities" -H "authorization: Bearer $DEVICE_KEY" -H "Isle-Installation-Secret: $secret" \
    -d "{\"attributesType\":\"PizzaDeliveryAttributes\",\"token\":\"$token\",\"externalKey\":\"order-$order\",\"installationID\":\"phone-$env\",\"ticket\":\"$ticket\"}" > /dev/null
  curl -sf -X POST "$server/v1/activities/by-key/order-$order/update" -H "authorization: Bearer $BACKEND_KEY" \
    -d "{\"contentState\":{\"driverName\":\"Driver $order\",\"deliveryTimer\":[788918400,788919900]}${priority:+,\"priority\":$priority}}" > /dev/null
}
