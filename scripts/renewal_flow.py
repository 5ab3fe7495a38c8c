"""An activity that outlives 8 hours, driven over HTTP against real `isle serve` (its clock
following the simulator's, --clock-url) and `isle sim --virtual-clock` processes
(scripts/try-renewal.sh starts them): the backend asks for a renewal; 7 h 31 min later on the
simulated clock a successor is on the phone with the same state; the app hands back its token; the
old one ends; the backend's next update by key reaches the successor.

    python3 renewal_flow.py SERVER CONTROL BACKEND_KEY DEVICE_KEY TICKET
"""
import sys

from flow_http import Flow

SERVER, CONTROL, BACKEND, DEVICE, TICKET = sys.argv[1:6]
flow = Flow("renewal_flow", SERVER, CONTROL, BACKEND, DEVICE)
call, backend, device, check, eventually = flow.call, flow.backend, flow.device, flow.check, flow.eventually
BUNDLE = "com.example.pizza"
ATTRIBUTES = {"numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": "F1"}


def state(driver):
    return {"driverName": driver, "deliveryTimer": [788918400, 788919900]}


def phone():
    return call("GET", CONTROL + "/devices/device-1")[1]


def advance(seconds):
    status, _ = call("POST", CONTROL + "/clock/advance", {"seconds": seconds})
    check(status == 200, "advance the simulated clock")


# The app starts the activity and registers it (its installation holds the push-to-start token).
status, first = call("POST", CONTROL + "/devices/device-1/apps/%s/activities" % BUNDLE,
                     {"attributesType": "PizzaDeliveryAttributes", "attributes": ATTRIBUTES, "contentState": state("Boarding"), "waitForPushToken": True})
check(status == 201, "start the activity: %s %s" % (status, first))
pts = phone()["apps"][BUNDLE]["pushToStartTokens"]["PizzaDeliveryAttributes"]
status, inst = device("PUT", "/v1/installations/phone-1", {"pushToStartTokens": {"PizzaDeliveryAttributes": pts}})
check(status == 200, "register the installation: %s %s" % (status, inst))
secret = inst["installationSecret"]
status, registered = device("POST", "/v1/activities", {"attributesType": "PizzaDeliveryAttributes", "token": first["updateToken"], "externalKey": "flight-1",
                                                        "installationID": "phone-1", "ticket": TICKET, "topics": ["flights"]}, secret)
check(status == 201, "register the activity: %s %s" % (status, registered))
first_id = registered["id"]
check(backend("POST", "/v1/activities/by-key/flight-1/update", {"contentState": state("Over the Atlantic"), "priority": 10})[0] == 202, "update")


def shows(activity, driver):
    def probe():
        a = next((a for a in phone()["activities"] if a["id"] == activity), None)
        return a is not None and a["contentState"].get("driverName") == driver
    return probe


eventually("the phone shows the update", shows(first["id"], "Over the Atlantic"))

# The backend asks for a renewal until 20 hours from now on the simulated clock.
now = call("GET", CONTROL + "/clock")[1]["unix"]
# The app registered the activity by its token alone (as IsleClient does), so the backend gives its
# attributes; the content is the last one pushed.
without = backend("PUT", "/v1/activities/by-key/flight-1/renewal", {"renewUntil": int(now) + 20 * 3600, "alert": {"title": "Still flying", "body": "Your flight continues"}})
check(without[0] == 422 and without[1]["error"]["code"] == "attributesRequired", "a renewal without attributes the server lacks: %s" % (without,))
status, renewal = backend("PUT", "/v1/activities/by-key/flight-1/renewal", {"renewUntil": int(now) + 20 * 3600, "alert": {"title": "Still flying", "body": "Your flight continues"},
                                                                           "attributes": ATTRIBUTES})
check(status == 200 and renewal["activityID"] == first_id, "renewal: %s %s" % (status, renewal))

# 7 h 31 min later (the simulator's clock, which the server follows): the successor is on the phone.
advance(7 * 3600 + 31 * 60)


def successor():
    return next((a for a in phone()["activities"] if a["startedBy"] == "push" and a["state"] == "active"), None)


new = eventually("the successor starts on the phone", successor)
check(new["contentState"]["driverName"] == "Over the Atlantic" and new["attributes"] == ATTRIBUTES, "the successor has the state: %s" % new)
print("renewal_flow: at 7 h 31 min a successor is on the phone with the same attributes and state")
# The app hands back its token (IsleClient does): linked by the key; the old one ends.
status, token = call("GET", CONTROL + "/devices/device-1/activities/%s/push-token" % new["id"])
check(status == 200, "the successor's token: %s" % status)
status, linked = device("POST", "/v1/activities", {"attributesType": "PizzaDeliveryAttributes", "token": token["token"], "externalKey": "flight-1", "installationID": "phone-1"}, secret)
check(status == 200 and linked["id"] != first_id, "linked to the started successor: %s %s" % (status, linked))
successor_id = linked["id"]
eventually("the old activity ends", lambda: backend("GET", "/v1/activities/" + first_id)[1]["state"] in ("ended", "dismissed"))

# Past the first activity's 8 hours: the backend's next update by key reaches the successor.
advance(45 * 60)
status, accepted = backend("POST", "/v1/activities/by-key/flight-1/update", {"contentState": state("Descending"), "priority": 10})
check(status == 202 and accepted.get("activityID") == successor_id, "the update by key goes to the successor: %s %s" % (status, accepted))
eventually("the successor shows it", shows(new["id"], "Descending"))
status, by_key = backend("GET", "/v1/activities/by-key/flight-1")
check(by_key["id"] == successor_id and by_key["topics"] == ["flights"], "the key names the successor, with its topics: %s" % by_key)
print("renewal_flow: past the 8-hour end the backend's update by key reached the successor")
