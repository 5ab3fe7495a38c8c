"""A backend's flow through a client generated from Isle's OpenAPI document (scripts/generated-client.sh).

Only the generated package (isle_client) talks to the server; the simulated phone is driven through
isle sim's control API with httpx. Every answer is parsed by the generated models: a field the
document misstates raises here.
"""
import hashlib
import hmac
import http.server
import json
import os
import threading
import time

import httpx

from isle_client import AuthenticatedClient
from isle_client.api.backend import (change_webhook, create_webhook, delete_webhook, end_activity, get_activity, get_activity_by_key,
                                     list_activities, list_events, list_webhook_attempts, redeliver_event, rotate_webhook_secret,
                                     update_activity_by_key)
from isle_client.api.default import health
from isle_client.api.device import register_activity, register_installation
from isle_client.models import (Accepted, Activity, ActivityDetail, ActivityPage, ActivityRegistration, Alert, End, Error, EventPage, EventType,
                                InstallationRegistration, InstallationReport, Update, UpdateContentState, Webhook, WebhookAttemptList,
                                WebhookChange, WebhookCreation, WebhookRedelivery, WebhookRedeliveryResult, WebhookRotation)
from isle_client.models.end_content_state_type_0 import EndContentStateType0

SERVER = os.environ["ISLE_SERVER"]
SIM = os.environ["ISLE_SIM_CONTROL"]
backend = AuthenticatedClient(base_url=SERVER, token=os.environ["ISLE_BACKEND"], raise_on_unexpected_status=True)
device = AuthenticatedClient(base_url=SERVER, token=os.environ["ISLE_DEVICE"], raise_on_unexpected_status=True)
DEADLINE = 30.0
checks = 0


def check(condition, what, found=None):
    global checks
    if not condition:
        raise SystemExit(f"FAILED: {what}" + (f" (found {found!r})" if found is not None else ""))
    checks += 1
    print(f"ok: {what}")


def typed(response, model, status):
    check(response.status_code == status and isinstance(response.parsed, model),
          f"{response.status_code} {model.__name__}", (response.status_code, response.content[:300]))
    return response.parsed


class Receiver(http.server.BaseHTTPRequestHandler):
    """A webhook endpoint: keeps each request's body and signature, answers 200."""
    received = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((body, self.headers["Isle-Signature"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def verified(body, signature, secret):
    parts = dict(p.split("=", 1) for p in signature.split(",") if p.startswith("t="))
    macs = [p.split("=", 1)[1] for p in signature.split(",") if p.startswith("v1=")]
    expected = hmac.new(secret.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, m) for m in macs)


def wait_for(what, probe):
    end = time.monotonic() + DEADLINE
    while time.monotonic() < end:
        found = probe()
        if found:
            return found
        time.sleep(0.1)
    raise SystemExit(f"FAILED: {what} within {DEADLINE} s")


check(health.sync(client=backend).status == "ok", "GET /health is typed")

# A webhook with a filter, to a receiver on this machine.
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/isle-events"
hook = typed(create_webhook.sync_detailed(client=backend, body=WebhookCreation(url=url, event_types=[EventType.PUSH_DELIVERED, EventType.ACTIVITY_ENDED])), Webhook, 201)
check(hook.secret and hook.secret.startswith("whsec_") and hook.event_types == [EventType.PUSH_DELIVERED, EventType.ACTIVITY_ENDED] and hook.enabled,
      "the webhook answers its secret and its filter")

# The app's side: an installation (its user from the backend's ticket) and an activity on the phone.
reg = typed(register_installation.sync_detailed("gen-phone", client=device, body=InstallationReport(ticket=os.environ["ISLE_USER_TICKET"])),
            InstallationRegistration, 200)
check(reg.id == "gen-phone" and reg.user_id == "gen-user" and reg.installation_secret, "the installation is bound to its user and answers its secret once")
phone = httpx.post(f"{SIM}/devices/device-1/apps/com.example.pizza/activities", json={
    "attributesType": "PizzaDeliveryAttributes", "attributes": {"numberOfPizzas": 2, "totalAmount": "$21.00", "orderNumber": "7001"},
    "contentState": {"driverName": "Anne", "deliveryTimer": [788918400, 788919900]}, "waitForPushToken": True}, timeout=10).json()
activity = typed(register_activity.sync_detailed(client=device, isle_installation_secret=reg.installation_secret, body=ActivityRegistration(
    attributes_type="PizzaDeliveryAttributes", installation_id="gen-phone", token=phone["updateToken"], external_key="order-gen", topics=["kitchen"],
    ticket=os.environ["ISLE_KEY_TICKET"])), Activity, 201)
check(activity.external_key == "order-gen" and activity.state.value == "active" and activity.has_token and activity.ended_at is None,
      "the activity is registered under the order's key")

# The backend's side: an update and the end, by the order's key and by id.
state = {"driverName": "Bill James", "deliveryTimer": [788918400, 788920200]}
accepted = typed(update_activity_by_key.sync_detailed("order-gen", client=backend, body=Update(content_state=UpdateContentState.from_dict(state),
                                                                                                  alert=Alert(title="On its way", body="Bill is driving"))), Accepted, 202)
check(accepted.accepted == 1 and accepted.activity_id == activity.id and len(accepted.jobs) == 1, "the update is accepted for the activity, with its job")
wait_for("the phone shows the update",
         lambda: any(a["contentState"].get("driverName") == "Bill James" for a in httpx.get(f"{SIM}/devices/device-1/screen", timeout=10).json()["lockScreen"]))
ended = typed(end_activity.sync_detailed(activity.id, client=backend, body=End(content_state=EndContentStateType0.from_dict({"driverName": "Delivered", "deliveryTimer": [788918400, 788920200]}),
                                                                               dismissal_date=int(time.time()) + 60)), Accepted, 202)
check(ended.accepted == 1, "the end is accepted")

# The events: paged and long-polled; each names the order, the installation and the user.
events, after = [], None
def more():
    global after
    page = list_events.sync_detailed(client=backend, after=after if after is not None else "0", wait=1, limit=2)
    page = typed(page, EventPage, 200)
    events.extend(page.events)
    after = page.next_
    return sum(1 for e in events if e.type_ == EventType.PUSH_DELIVERED) >= 2
wait_for("two push.delivered events", more)
about = [e for e in events if e.activity_id == activity.id]
check(about and all(e.external_key == "order-gen" and e.installation_id == "gen-phone" and e.user_id == "gen-user" for e in about),
      "every event about the activity names its key, installation and user", [e.to_dict() for e in about])
delivered = [e for e in about if e.type_ == EventType.PUSH_DELIVERED]
check(all(e.data.job_id and e.data.apns_id and e.data.attempts == 1 for e in delivered), "push.delivered carries its job, apns-id and attempts",
      [e.data.to_dict() for e in delivered])

detail = typed(get_activity.sync_detailed(activity.id, client=backend), ActivityDetail, 200)
check(len(detail.deliveries) >= 2 and all(d.status == 200 for d in detail.deliveries), "the activity's deliveries are typed", [d.to_dict() for d in detail.deliveries])
by_key = typed(get_activity_by_key.sync_detailed("order-gen", client=backend), ActivityDetail, 200)
check(by_key.id == activity.id, "the activity by its key")
page = typed(list_activities.sync_detailed(client=backend, key_prefix="order-", limit=10), ActivityPage, 200)
check([a.id for a in page.activities] == [activity.id] and page.next_ is None, "listing by key prefix finds it, on one page")

# The webhook got exactly the filtered events, signed with its secret.
def hooked():
    got = []
    for body, signature in Receiver.received:
        check(verified(body, signature, hook.secret), "a webhook request's signature verifies")
        got += json.loads(body)["events"]
    wanted = [e.id for e in events if e.type_ in (EventType.PUSH_DELIVERED, EventType.ACTIVITY_ENDED)]
    return got if [e["id"] for e in got if e["id"] in wanted] == wanted else None
got = wait_for("the webhook receives the filtered events", hooked)
check({e["type"] for e in got} <= {"push.delivered", "activity.ended"}, "the filter held: nothing else was sent", {e["type"] for e in got})

# Managing it: attempts, redelivery, rotation (two signatures in the overlap), disable, delete.
attempts = typed(list_webhook_attempts.sync_detailed(hook.id, client=backend), WebhookAttemptList, 200)
check(attempts.attempts and attempts.attempts[0].status == 200, "its attempts are logged")
redone = typed(redeliver_event.sync_detailed(hook.id, client=backend, body=WebhookRedelivery(event_id=got[0]["id"])), WebhookRedeliveryResult, 200)
check(redone.delivered and redone.event_id == got[0]["id"], "one event redelivered")
rotated = typed(rotate_webhook_secret.sync_detailed(hook.id, client=backend, body=WebhookRotation(overlap_seconds=60)), Webhook, 200)
check(rotated.secret != hook.secret and rotated.previous_secret_valid_until, "a rotation answers the new secret and the overlap's end")
before = len(Receiver.received)
typed(redeliver_event.sync_detailed(hook.id, client=backend, body=WebhookRedelivery(event_id=got[0]["id"])), WebhookRedeliveryResult, 200)
body, signature = Receiver.received[before]
check(verified(body, signature, rotated.secret) and verified(body, signature, hook.secret), "during the overlap a request verifies with either secret")
off = typed(change_webhook.sync_detailed(hook.id, client=backend, body=WebhookChange(enabled=False)), Webhook, 200)
check(not off.enabled and off.status.value == "disabled", "disabled through PATCH")
check(delete_webhook.sync_detailed(hook.id, client=backend).status_code == 200, "deleted")

# Refusals are the typed error, naming the field.
missing = get_activity.sync_detailed("act_nope", client=backend)
check(missing.status_code == 404 and isinstance(missing.parsed, Error) and missing.parsed.error.code == "notFound", "an unknown activity is a typed 404")
late = update_activity_by_key.sync_detailed("order-gen", client=backend, body=Update(content_state=UpdateContentState.from_dict(state), stale_date=1_790_000_000_000))
check(late.status_code == 400 and isinstance(late.parsed, Error) and late.parsed.error.field == "staleDate", "milliseconds in a date are refused naming the field",
      late.content)
print(f"the generated client's flow: {checks} checks passed")
