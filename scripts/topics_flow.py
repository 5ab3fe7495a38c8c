"""Topics as audiences, driven over HTTP against real `isle serve` and `isle sim` processes
(scripts/try-topics.sh starts them). Each phone's app follows the topic as IsleClient's
follow(topic:) does: the topic's channel on iOS 18 and later, a token before.

    python3 topics_flow.py SERVER CONTROL BACKEND_KEY DEVICE_KEY SCHEMA_FILE
"""
import json
import sys
import urllib.parse

from flow_http import Flow

SERVER, CONTROL, BACKEND, DEVICE, SCHEMA_FILE = sys.argv[1:6]
flow = Flow("topics_flow", SERVER, CONTROL, BACKEND, DEVICE)
call, backend, device, check, eventually = flow.call, flow.backend, flow.device, flow.check, flow.eventually
BUNDLE = "com.example.pizza"
TOPIC = "derby-2026"
ATTRIBUTES = {"numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": "1"}


def state(score):
    return {"driverName": score, "deliveryTimer": [788918400, 788919900]}


schema = json.load(open(SCHEMA_FILE))
topic_path = "/v1/topics/" + urllib.parse.quote(TOPIC, safe="")

# The backend opens the match as an audience (its channels keep the latest score for a phone
# that was offline).
status, opened = backend("PUT", topic_path, {"storagePolicy": 1})
check(status == 200 and opened["channels"] == [], "open the topic: %s %s" % (status, opened))

# Four phones, two on iOS 18 and later, two before; each app follows the topic.
phones = []
for n, os_version in enumerate(["18.0", "26.0", "17.2", "16.4"]):
    status, d = call("POST", CONTROL + "/devices", {"name": "fan-%d" % n, "osVersion": os_version, "model": "iPhone 15"})
    check(status == 201, "create a phone on iOS %s: %s %s" % (os_version, status, d))
    status, _ = call("POST", CONTROL + "/devices/%s/apps" % d["id"], {"bundleID": BUNDLE, "schemas": [schema]})
    check(status == 201, "install the app: %s" % status)
    installation = "fan-%d" % n
    status, inst = device("PUT", "/v1/installations/" + installation, {"liveActivitiesEnabled": True})
    check(status == 200, "register the installation: %s %s" % (status, inst))
    secret = inst["installationSecret"]
    on_channel = int(os_version.split(".")[0]) >= 18
    request = {"attributesType": "PizzaDeliveryAttributes", "attributes": ATTRIBUTES, "contentState": state("0-0")}
    registration = {"attributesType": "PizzaDeliveryAttributes", "installationID": installation, "topics": [TOPIC]}
    if on_channel:
        status, ch = device("POST", topic_path + "/channel", {"installationID": installation}, secret)
        check(status == 200, "the topic's channel: %s %s" % (status, ch))
        request["pushType"] = {"channel": ch["channelID"]}
        registration["channelID"] = ch["channelID"]
    else:
        request["waitForPushToken"] = True
    status, activity = call("POST", CONTROL + "/devices/%s/apps/%s/activities" % (d["id"], BUNDLE), request)
    check(status == 201, "start the activity: %s %s" % (status, activity))
    if not on_channel:
        registration["token"] = activity["updateToken"]
    status, registered = device("POST", "/v1/activities", registration, secret)
    check(status == 201, "register the activity: %s %s" % (status, registered))
    phones.append({"device": d["id"], "activity": activity["id"], "channel": registration.get("channelID"), "os": os_version})

channels = {p["channel"] for p in phones if p["channel"]}
check(len(channels) == 1, "one channel for the topic, got %s" % channels)
channel = channels.pop()


def shows(score):
    def every_phone():
        for p in phones:
            _, d = call("GET", CONTROL + "/devices/" + p["device"])
            a = next((a for a in d["activities"] if a["id"] == p["activity"]), None)
            if a is None or a["contentState"].get("driverName") != score:
                return False
        return True
    return every_phone


# Three scores, one backend call each: one broadcast and two token pushes.
for score in ["1-0", "1-1", "2-1"]:
    status, accepted = backend("POST", topic_path + "/update", {"contentState": state(score), "alert": {"title": "Goal", "body": score}})
    check(status == 202, "update: %s %s" % (status, accepted))
    check(accepted["accepted"] == 3 and accepted["audience"] == {"broadcasts": 1, "channelFollowers": 2, "tokenFollowers": 2}, "both legs counted: %s" % accepted)
    eventually("every phone (iOS 18, 26, 17.2, 16.4) shows %s" % score, shows(score))
print("topics_flow: 3 updates reached 4 phones (2 on the channel, 2 by token), one call each")

status, view = backend("GET", topic_path)
check(status == 200 and view["channelFollowers"] == 2 and view["tokenFollowers"] == 2 and len(view["channels"]) == 1, "the topic: %s" % view)

# The channel limit (isle serve --channel-limit 2): the match has a channel with followers.
phone = phones[0]
status, inst = device("PUT", "/v1/installations/fan-limit", {"liveActivitiesEnabled": True})
secret = inst["installationSecret"]
for t in ["warm-up", "post-match"]:
    check(backend("PUT", "/v1/topics/" + t)[0] == 200, "open " + t)
status, warm = device("POST", "/v1/topics/warm-up/channel", {"installationID": "fan-limit"}, secret)
check(status == 200, "warm-up's channel: %s %s" % (status, warm))
# At the limit: warm-up's channel (no follower, idlest) is closed to make room for post-match's.
status, post = device("POST", "/v1/topics/post-match/channel", {"installationID": "fan-limit"}, secret)
check(status == 200, "post-match's channel, making room: %s %s" % (status, post))
status, view = backend("GET", "/v1/topics/warm-up")
check(view["channels"] == [], "warm-up's channel closed for room: %s" % view)
# The app's own channel takes post-match's place; then nothing is free: 409 channelLimit.
status, own = backend("POST", "/v1/channels", {"storagePolicy": 0})
check(status == 201, "the app's own channel, making room: %s %s" % (status, own))
status, refused = device("POST", "/v1/topics/warm-up/channel", {"installationID": "fan-limit"}, secret)
check(status == 409 and refused["error"]["code"] == "channelLimit", "at the limit with nothing to close: %s %s" % (status, refused))
check(backend("DELETE", "/v1/channels/" + urllib.parse.quote(own["id"], safe=""))[0] == 204, "delete the app's own channel")
print("topics_flow: the channel limit closed the idlest unfollowed topic channel, then answered 409 channelLimit")

# Full time: the end reaches every phone; the topic's channel is deleted at APNs once it went out.
status, accepted = backend("POST", topic_path + "/end", {"contentState": state("Full time 2-1")})
check(status == 202 and accepted["audience"]["broadcasts"] == 1, "end: %s %s" % (status, accepted))


def all_ended():
    for p in phones:
        _, d = call("GET", CONTROL + "/devices/" + p["device"])
        a = next((a for a in d["activities"] if a["id"] == p["activity"]), None)
        if a is None or a["state"] != "ended":
            return False
    return True


eventually("every phone's activity ended", all_ended)


def channel_deleted():
    _, view = backend("GET", topic_path)
    if view["channels"]:
        return False
    # Channel management names the channel in its apns-channel-id header.
    _, log = call("GET", CONTROL + "/requests")
    return any(r["method"] == "DELETE" and 200 <= r["status"] < 300 and ["apns-channel-id", channel] in r["headers"] for r in log)


eventually("the topic's channel deleted at APNs", channel_deleted, within=15)
status, ended = device("POST", topic_path + "/channel", {"installationID": "fan-limit"}, secret)
check(status == 409 and ended["error"]["code"] == "topicEnded", "a follower after the end: %s %s" % (status, ended))
print("topics_flow: the end reached every phone; the channel was deleted at APNs")
