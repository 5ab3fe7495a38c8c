"""A backend's APNs sender in Python: httpx over HTTP/2, strict TLS trusting only the given CA,
an ES256 provider token from PyJWT. It speaks APNs only — no Isle code, no simulator control API.

Configuration (environment): APNS_URL, APNS_BROADCAST_URL, APNS_MANAGEMENT_URL, APNS_CA (PEM),
APNS_KEY (.p8), APNS_KEY_ID, APNS_TEAM_ID, APNS_BUNDLE_ID, CLIENT_LABEL (put into the content, so
the pushes can be told apart on the phone).

Commands on stdin, one a line, as a backend gets work (the tokens reach it from the app):
    start <push-to-start token>    update <update token>    end <update token>
    widgets <widget push token>    channel                  broadcast <channel id>
For each it prints one line: `<command> <status> <apns-id | channel id | apns-request-id> [outcome]`,
and exits 1 on an answer other than 200 (201 for `channel`).

    pip install 'httpx[http2]' PyJWT cryptography
    printf 'start 0a1b…\n' | APNS_URL=… python3 apns_httpx.py
"""
import json
import os
import ssl
import sys
import time

import httpx
import jwt

env = os.environ
LABEL = env.get("CLIENT_LABEL", "python-httpx")
BUNDLE = env["APNS_BUNDLE_ID"]
# 2001-01-01: a Swift Date in a ContentState is seconds since then (JSONEncoder's default).
APPLE_EPOCH = 978307200

ctx = ssl.create_default_context(cafile=env["APNS_CA"])
ctx.verify_flags |= ssl.VERIFY_X509_STRICT

with open(env["APNS_KEY"], "rb") as f:
    signing_key = f.read()
# One provider token for the run, shared by every connection (APNs refuses a new one on a
# connection within 20 minutes). Header exactly {"alg","kid"}: PyJWT's "typ" is dropped.
TOKEN = jwt.encode({"iss": env["APNS_TEAM_ID"], "iat": int(time.time())}, signing_key, algorithm="ES256",
                   headers={"kid": env["APNS_KEY_ID"], "typ": None})

# One HTTP/2 connection per APNs host, kept for the whole run.
clients = {}


def client(base):
    if base not in clients:
        clients[base] = httpx.Client(http2=True, verify=ctx, base_url=base, timeout=15.0)
    return clients[base]


last_timestamp = 0


def timestamp():
    """Seconds, strictly increasing from step to step."""
    global last_timestamp
    last_timestamp = max(int(time.time()), last_timestamp + 1)
    return last_timestamp


def state(step):
    now = int(time.time()) - APPLE_EPOCH
    return {"driverName": "%s %s" % (LABEL, step), "deliveryTimer": [now, now + 1800]}


def send(base, path, headers, body):
    r = client(base).post(path, headers={"authorization": "bearer " + TOKEN, "content-type": "application/json", **headers},
                          content=json.dumps(body, separators=(",", ":")).encode())
    if r.http_version != "HTTP/2":
        sys.exit("%s answered over %s, not HTTP/2" % (base, r.http_version))
    return r


def device_push(push_type, token, aps):
    suffix = {"liveactivity": ".push-type.liveactivity", "widgets": ".push-type.widgets"}[push_type]
    return send(env["APNS_URL"], "/3/device/" + token,
                {"apns-push-type": push_type, "apns-topic": BUNDLE + suffix, "apns-priority": "10"}, {"aps": aps})


def run(command, args):
    if command == "start":
        r = device_push("liveactivity", args[0], {
            "timestamp": timestamp(), "event": "start",
            "alert": {"title": "Order confirmed", "body": "%s is on it" % LABEL},
            "attributes-type": "PizzaDeliveryAttributes",
            "attributes": {"numberOfPizzas": 2, "totalAmount": "$21.00", "orderNumber": LABEL},
            "content-state": state("start"), "input-push-token": 1})
        return r, 200, r.headers.get("apns-id")
    if command == "update":
        r = device_push("liveactivity", args[0], {
            "timestamp": timestamp(), "event": "update", "content-state": state("update"),
            "alert": {"title": "On the way", "body": "%s is driving" % LABEL}})
        return r, 200, r.headers.get("apns-id")
    if command == "end":
        t = timestamp()
        r = device_push("liveactivity", args[0], {
            "timestamp": t, "event": "end", "content-state": state("end"), "dismissal-date": t + 3600})
        return r, 200, r.headers.get("apns-id")
    if command == "widgets":
        r = device_push("widgets", args[0], {"content-changed": True})
        return r, 200, r.headers.get("apns-id")
    if command == "channel":
        r = send(env["APNS_MANAGEMENT_URL"], "/1/apps/%s/channels" % BUNDLE, {},
                 {"message-storage-policy": 0, "push-type": "LiveActivity"})
        return r, 201, r.headers.get("apns-channel-id")
    if command == "broadcast":
        r = send(env["APNS_BROADCAST_URL"], "/4/broadcasts/apps/" + BUNDLE,
                 {"apns-channel-id": args[0], "apns-push-type": "liveactivity", "apns-priority": "10", "apns-expiration": "0"},
                 {"aps": {"timestamp": timestamp(), "event": "update", "content-state": state("broadcast")}})
        return r, 200, r.headers.get("apns-request-id")
    sys.exit("unknown command %r" % command)


for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    if words[0] == "quit":
        break
    answer, expected, value = run(words[0], words[1:])
    ok = answer.status_code == expected and value
    if not ok:
        try:
            value = answer.json().get("reason", "-")
        except ValueError:
            value = "-"
    print("%s %d %s %s" % (words[0], answer.status_code, value, answer.headers.get("isle-sim-outcome", "")), flush=True)
    if not ok:
        sys.exit("%s: APNs answered %d %s" % (words[0], answer.status_code, answer.text))

for c in clients.values():
    c.close()
