"""The attacker suite (docs/security.md): real `isle sim` and `isle serve` processes, an attacker
holding only the public device key (and any number of installations of its own), a victim whose
app registered its order through IsleClient's flow (an installation with its secret, the order key
with the backend's ticket). Every route is tried against the victim's installation, activity and
order; then the backend's update must reach the victim's phone alone, and nothing of the victim's
may have changed. Run by scripts/attack.sh (CI)."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SIM = os.environ["ISLE_SIM_CONTROL"]
SERVER = os.environ["ISLE_SERVER"]
BACKEND = os.environ["ISLE_BACKEND_KEY"]
DEVICE = os.environ["ISLE_DEVICE_KEY"]
ISLE = os.environ.get("ISLE_BIN", ".build/debug/isle")
TICKET_KEY = os.environ["ISLE_TICKET_KEY"]
TICKET_KEY_ID = os.environ["ISLE_TICKET_KEY_ID"]
ADMIN = os.environ.get("ISLE_ADMIN_KEY")
# attack.sh starts isle serve with these deadlines (seconds) and sign-in failure burst.
HEADER_TIMEOUT = float(os.environ.get("ISLE_ATTACK_HEADER_TIMEOUT", "10"))
AUTH_FAILURE_BURST = int(os.environ.get("ISLE_ATTACK_AUTH_FAILURE_BURST", "20"))
STATE = {"content": {"driverName": "Bill James", "deliveryTimer": [788918400, 788919900]}}
failures = []
checks = 0


def call(method, url, body=None, key=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    if key:
        request.add_header("authorization", "Bearer " + key)
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            text = response.read().decode()
            return response.status, (json.loads(text) if text else None), text
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text), text
        except ValueError:
            return e.code, None, text


def expect(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print("FAILED:", what)


def ticket(key=None, user=None, installation=None):
    args = [ISLE, "ticket", "--key", TICKET_KEY, "--key-id", TICKET_KEY_ID, "--bundle-id", "com.example.pizza"]
    if key:
        args += ["--external-key", key]
    if user:
        args += ["--user", user]
    if installation:
        args += ["--installation", installation]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def phone(device, order):
    status, activity, _ = call("POST", f"{SIM}/devices/{device}/apps/com.example.pizza/activities", {
        "attributesType": "PizzaDeliveryAttributes",
        "attributes": {"numberOfPizzas": 1, "totalAmount": "$9.00", "orderNumber": order},
        "contentState": STATE["content"], "waitForPushToken": True})
    assert status == 201, (status, activity)
    return activity


def install(installation_id):
    status, body, text = call("PUT", f"{SERVER}/v1/installations/{installation_id}", {"liveActivitiesEnabled": True}, key=DEVICE)
    assert status == 200, text
    return body["installationSecret"]


def main():
    # Two phones: the victim's and the attacker's.
    status, attacker_device, _ = call("POST", f"{SIM}/devices", {"name": "Attacker's iPhone"})
    assert status == 201
    attacker_device = attacker_device["id"]
    status, _, text = call("POST", f"{SIM}/devices/{attacker_device}/apps", {"bundleID": "com.example.pizza", "schemas": [json.load(open("Examples/PizzaDeliveryAttributes.schema.json"))]})
    assert status == 201, text

    # The victim: installation, order 8888 with the backend's ticket.
    victim_secret = install("victim-phone")
    victim_activity = phone("device-1", "8888")
    status, victim, text = call("POST", f"{SERVER}/v1/activities", {
        "attributesType": "PizzaDeliveryAttributes", "token": victim_activity["updateToken"], "installationID": "victim-phone",
        "externalKey": "order-8888", "ticket": ticket(key="order-8888")}, key=DEVICE, headers={"Isle-Installation-Secret": victim_secret})
    assert status == 201, text
    victim_id = victim["id"]
    status, _, text = call("PUT", f"{SERVER}/v1/installations/victim-phone/user", {"userID": "victim-user"}, key=BACKEND)
    assert status == 200, text

    # The attacker: its own installations and phone.
    attacker_activity = phone(attacker_device, "6666")
    mine = install("attacker-1")
    install("attacker-2")
    their_token = attacker_activity["updateToken"]
    seen = []

    def attempt(what, method, path, body=None, headers=None, key=DEVICE):
        status, answer, text = call(method, SERVER + path, body, key=key, headers=headers)
        seen.append(text)
        expect(status >= 400, f"{what}: refused (got {status} {text[:200]})")
        expect(status < 500, f"{what}: a 4xx, never a 5xx (got {status})")
        expect(victim_id not in text, f"{what}: the answer never names the victim's activity ({text[:200]})")
        expect(victim_secret not in text, f"{what}: the answer never holds the victim's secret")
        return status, answer

    secrets = [{}, {"Isle-Installation-Secret": mine}, {"Isle-Installation-Secret": "isle_inst_guess"}]
    # Re-registration and squatting of the victim's order key.
    for h in secrets:
        for installation in [None, "attacker-1", "victim-phone"]:
            body = {"attributesType": "PizzaDeliveryAttributes", "token": their_token, "externalKey": "order-8888"}
            if installation:
                body["installationID"] = installation
            attempt(f"register order-8888 on {installation} with {list(h.values())}", "POST", "/v1/activities", body, h)
            body["ticket"] = ticket(key="order-6666")
            attempt(f"register order-8888 with a ticket for another order on {installation}", "POST", "/v1/activities", body, h)
            body["ticket"] = ticket(key="order-8888", installation="victim-phone")
            if installation != "victim-phone":
                attempt(f"replay a ticket bound to the victim's installation on {installation}", "POST", "/v1/activities", body, h)
    # A future order: squatting a key the victim's app will use later.
    attempt("squat order-9999 without a ticket", "POST", "/v1/activities",
            {"attributesType": "PizzaDeliveryAttributes", "token": their_token, "externalKey": "order-9999", "installationID": "attacker-1"}, {"Isle-Installation-Secret": mine})
    # The victim's activity: token rotation, dismissal, end, key binding.
    for h in secrets:
        attempt("rotate the victim's token", "PUT", f"/v1/activities/{victim_id}/token", {"token": their_token}, h)
        attempt("dismiss the victim's activity", "POST", f"/v1/activities/{victim_id}/dismissed", {}, h)
        attempt("end the victim's activity", "POST", f"/v1/activities/{victim_id}/ended", {}, h)
        attempt("bind a key with the device key", "PUT", f"/v1/activities/{victim_id}/key", {"externalKey": "order-6666"}, h)
        # The victim's installation: re-registration, user, tokens.
        attempt("re-register the victim's installation", "PUT", "/v1/installations/victim-phone", {"pushToStartTokens": {"PizzaDeliveryAttributes": their_token}}, h)
        attempt("claim the victim's user", "PUT", "/v1/installations/attacker-1", {"userID": "victim-user"}, h)
        attempt("claim the victim's user by the backend route", "PUT", "/v1/installations/attacker-1/user", {"userID": "victim-user"}, h)
        attempt("claim the victim's user with a ticket for another user", "PUT", "/v1/installations/attacker-2", {"ticket": ticket(user="someone-else", installation="victim-phone")}, h)
    # Backend routes with the device key.
    for method, path, body in [("POST", "/v1/activities/by-key/order-8888/update", {"contentState": STATE["content"]}),
                               ("GET", "/v1/activities/by-key/order-8888", None), ("GET", f"/v1/activities/{victim_id}", None),
                               ("POST", "/v1/users/victim-user/start", {}), ("GET", "/v1/app", None)]:
        attempt(f"{method} {path} with the device key", method, path, body)
    # Ids that errors used to leak: a token in use, a key in use.
    attempt("register the victim's own token", "POST", "/v1/activities",
            {"attributesType": "PizzaDeliveryAttributes", "token": victim_activity["updateToken"], "installationID": "attacker-1"}, {"Isle-Installation-Secret": mine})

    # Nothing of the victim's changed.
    status, record, text = call("GET", f"{SERVER}/v1/activities/{victim_id}", key=BACKEND)
    expect(status == 200 and record["state"] == "active" and record["externalKey"] == "order-8888" and record["installationID"] == "victim-phone",
           f"the victim's activity is as registered ({text[:300]})")
    status, live, text = call("GET", f"{SERVER}/v1/activities/by-key/order-9999", key=BACKEND)
    expect(status == 404, f"no activity holds the squatted key order-9999 ({status})")
    # The backend's next update reaches the victim's phone, and only it.
    status, answer, text = call("POST", f"{SERVER}/v1/activities/by-key/order-8888/update",
                                {"contentState": {"driverName": "Door code 4321", "deliveryTimer": [788918400, 788919900]}}, key=BACKEND)
    expect(status == 202 and answer.get("activityID") == victim_id, f"the by-key update goes to the victim's activity ({text})")
    deadline = time.time() + 20
    victim_screen = attacker_screen = None
    while time.time() < deadline:
        _, victim_screen, _ = call("GET", f"{SIM}/devices/device-1/screen")
        if any(i["contentState"].get("driverName") == "Door code 4321" for i in victim_screen["lockScreen"]):
            break
        time.sleep(0.1)
    _, attacker_screen, _ = call("GET", f"{SIM}/devices/{attacker_device}/screen")
    expect(any(i["contentState"].get("driverName") == "Door code 4321" for i in victim_screen["lockScreen"]), "the victim's phone shows the update")
    expect(not any(i["contentState"].get("driverName") == "Door code 4321" for i in attacker_screen["lockScreen"]), "the attacker's phone never does")
    _, requests, _ = call("GET", f"{SIM}/requests")
    expect(not any(r["path"].endswith(their_token) for r in requests), "nothing was ever sent to the attacker's token")

    bounded_and_secrets()
    print(f"attacker suite: {checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


def raw(chunks, every, deadline):
    """Sends chunks on a raw connection, one every `every` seconds, until the server closes it or
    `deadline` seconds pass; returns (what the server sent, whether it closed, seconds taken)."""
    host, port = SERVER.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=deadline)
    start = time.time()
    received = b""
    closed = False
    s.settimeout(every if chunks else deadline)
    try:
        for chunk in chunks + [None]:
            if chunk is not None:
                s.sendall(chunk.encode())
            try:
                data = s.recv(65536)
                if not data:
                    closed = True
                    break
                received += data
            except socket.timeout:
                pass
            if time.time() - start > deadline:
                break
        if not closed:
            s.settimeout(max(0.1, deadline - (time.time() - start)))
            while True:
                data = s.recv(65536)
                if not data:
                    closed = True
                    break
                received += data
    except (socket.timeout, ConnectionResetError, BrokenPipeError):
        closed = closed or not isinstance(sys.exc_info()[1], socket.timeout)
    finally:
        s.close()
    return received.decode(errors="replace"), closed, time.time() - start


def console_login(key, size=None):
    body = ("key=" + urllib.request.quote(key)) if size is None else ("key=" + "k" * size)
    request = urllib.request.Request(SERVER + "/console/login", data=body.encode(), method="POST")
    request.add_header("content-type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def bounded_and_secrets():
    """The lesser findings, from outside: deadlines, the console's sign-in, /ready."""
    # A head trickled one line every half second is cut off at the header deadline with a 408.
    text, closed, took = raw(["GET /health HTTP/1.1\r\nHost: x\r\n"] + ["X-Slow: 1\r\n"] * 200, 0.5, HEADER_TIMEOUT + 10)
    expect(closed and text.startswith("HTTP/1.1 408") and took < HEADER_TIMEOUT + 5, f"a trickled head is answered 408 and closed at the deadline ({took:.1f} s, {text[:40]!r})")
    # A body trickled after its head is closed too, and nothing of it is stored.
    head = f"PUT /v1/installations/trickle HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {DEVICE}\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{{"
    text, closed, took = raw([head] + [" " * 10] * 400, 0.5, 60)
    expect(closed and " 200 " not in text, f"a trickled body is cut off ({took:.1f} s, {text[:40]!r})")
    # Idle connections are closed (attack.sh sets a short idle timeout).
    sockets = []
    host, port = SERVER.split("//")[1].split(":")
    for _ in range(100):
        sockets.append(socket.create_connection((host, int(port)), timeout=30))
    start = time.time()
    closed = 0
    for sock in sockets:
        sock.settimeout(max(0.1, 30 - (time.time() - start)))
        try:
            if sock.recv(1) == b"":
                closed += 1
        except (socket.timeout, ConnectionResetError):
            pass
        sock.close()
    expect(closed == 100, f"100 idle connections are closed by the server ({closed} were)")
    # /ready names no app without an admin key.
    status, _, text = call("GET", SERVER + "/ready")
    expect("com.example.pizza" not in text, f"/ready without a key names no app ({text[:200]})")
    # The console's sign-in: one answer for an unknown and a backend or device key; 413 for a big form.
    _, unknown = console_login("isle_admin_guess-0")
    for key in [BACKEND, DEVICE]:
        _, answer = console_login(key)
        expect(answer == unknown, "the login page gives one answer to a key of another scope and an unknown key")
    status, _ = console_login("", size=(1 << 20) + 100)
    expect(status == 413, f"a console form over 1 MiB is a 413 ({status})")
    # Wrong keys from one address: past the burst, 429 — even for the right admin key.
    statuses = [console_login(f"isle_admin_guess-{i}")[0] for i in range(AUTH_FAILURE_BURST + 2)]
    expect(statuses[-1] == 429, f"guessing sign-ins are throttled per address ({statuses})")
    if ADMIN:
        status, _ = console_login(ADMIN)
        expect(status == 429, f"while throttled, even the right key waits ({status})")


if __name__ == "__main__":
    sys.exit(main())
