"""Trust v3 from outside (docs/security.md): real `isle sim` and `isle serve` processes, started by
scripts/attack.sh with the limits below. Several loopback addresses stand for several clients:
127.0.0.2 floods, 127.0.0.3 is a genuine device, 127.0.0.4 tries to fill the disk, 127.0.0.5 holds
idle sockets. Webhook URLs pointing inside are refused at creation, so nothing is sent anywhere.
Each case fails on the code before trust v3."""
import http.client
import json
import os
import resource
import socket
import sys
import threading
import time

SERVER = os.environ["ISLE_SERVER"]
BACKEND = os.environ["ISLE_BACKEND_KEY"]
DEVICE = os.environ["ISLE_DEVICE_KEY"]
SIM = os.environ["ISLE_SIM_CONTROL"]
DATABASE = os.environ["ISLE_DATABASE"]
CONNECTIONS_PER_ADDRESS = int(os.environ["ISLE_V3_CONNECTIONS_PER_ADDRESS"])
NEW_PER_HOUR = int(os.environ["ISLE_V3_NEW_PER_HOUR"])
HOST, PORT = SERVER.split("//")[1].split(":")
PORT = int(PORT)
failures = []
checks = 0


def expect(ok, what):
    global checks
    checks += 1
    print(("ok:     " if ok else "FAILED: ") + what)
    if not ok:
        failures.append(what)


class Client:
    """One keep-alive HTTP/1.1 connection from a chosen loopback address."""

    def __init__(self, source):
        self.source = source
        self.connection = None

    def call(self, method, path, body=None, key=DEVICE, headers=None):
        for attempt in range(2):
            if self.connection is None:
                self.connection = http.client.HTTPConnection(HOST, PORT, timeout=20, source_address=(self.source, 0))
            h = {"content-type": "application/json", "authorization": "Bearer " + key}
            h.update(headers or {})
            try:
                self.connection.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=h)
                response = self.connection.getresponse()
                text = response.read().decode()
                if response.getheader("connection", "").lower() == "close":
                    self.connection.close()
                    self.connection = None
                try:
                    return response.status, json.loads(text) if text else None
                except ValueError:
                    return response.status, None
            except (http.client.HTTPException, OSError):
                self.connection = None
                if attempt == 1:
                    return 0, None
        return 0, None


def flood_and_genuine():
    """A flooder at 127.0.0.2 and a genuine device at 127.0.0.3: the flood spends its own address's
    allowance only, and the genuine device's 90 registrations all pass."""
    genuine = Client("127.0.0.3")
    status, body = genuine.call("PUT", "/v1/installations/genuine-phone", {"liveActivitiesEnabled": True})
    assert status == 200, (status, body)
    secret = body["installationSecret"]
    stop = threading.Event()
    counts = {"sent": 0, "429": 0, "other": 0}
    lock = threading.Lock()

    def flood(n):
        c = Client("127.0.0.2")
        i = 0
        while not stop.is_set():
            status, _ = c.call("PUT", "/v1/installations/flood-%d-%d" % (n, i), {})
            i += 1
            with lock:
                counts["sent"] += 1
                counts["429" if status == 429 else "other"] += 1

    threads = [threading.Thread(target=flood, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    time.sleep(1)  # the flood is under way before the genuine device starts
    refused = 0
    start = time.time()
    for i in range(90):
        status, _ = genuine.call("PUT", "/v1/installations/genuine-phone", {"liveActivitiesEnabled": True}, headers={"Isle-Installation-Secret": secret})
        if status != 200:
            refused += 1
        # About 12 a second: within the device's own limits (5/s, burst 60 per installation).
        time.sleep(max(0, start + (i + 1) / 12 - time.time()))
    stop.set()
    for t in threads:
        t.join()
    took = time.time() - start
    rate = counts["sent"] / (took + 1)
    expect(rate > 100, f"the flood ran faster than the fleet's allowance ({rate:.0f} req/s from 127.0.0.2)")
    expect(counts["429"] > counts["sent"] * 0.5, f"most of the flood was refused ({counts['429']} of {counts['sent']})")
    expect(refused == 0, f"the genuine device at another address had none of its 90 registrations refused ({refused} were)")


def installation_throttling():
    """80 DELETEs of the victim's installation without its secret do not throttle the victim."""
    victim = Client("127.0.0.6")
    status, body = victim.call("PUT", "/v1/installations/throttle-victim", {"liveActivitiesEnabled": True})
    assert status == 200, (status, body)
    secret = body["installationSecret"]
    # From four addresses, so each stays within its own address's allowance: 80 requests, more
    # than the installation's burst of 60.
    answers = []
    for source in ["127.0.0.7", "127.0.0.8", "127.0.0.9", "127.0.0.10"]:
        attacker = Client(source)
        answers += [attacker.call("DELETE", "/v1/installations/throttle-victim")[0] for _ in range(20)]
    expect(all(a in (403, 429) for a in answers), f"the secretless DELETEs are refused ({sorted(set(answers))})")
    status, _ = victim.call("PUT", "/v1/installations/throttle-victim", {"liveActivitiesEnabled": True}, headers={"Isle-Installation-Secret": secret})
    expect(status == 200, f"the victim's own PUT with its secret still passes after 80 secretless requests ({status})")


def database_bytes():
    return sum(os.path.getsize(DATABASE + suffix) for suffix in ["", "-wal"] if os.path.exists(DATABASE + suffix))


def disk_fill():
    """One address registering installations and activities as fast as it can for 10 s stays
    within its hourly allowance of each."""
    filler = Client("127.0.0.4")
    before = database_bytes()
    created = {"installations": 0, "activities": 0}
    refused = 0
    deadline = time.time() + 10
    i = 0
    big = "x" * 900
    while time.time() < deadline:
        status, body = filler.call("PUT", f"/v1/installations/fill-{i}", {"liveActivitiesEnabled": True, "pushToStartTokens": {"PizzaDeliveryAttributes": "ab" * 80}})
        if status == 200:
            created["installations"] += 1
            secret = body["installationSecret"]
            for j in range(20):
                status, _ = filler.call("POST", "/v1/activities", {
                    "installationID": f"fill-{i}", "attributesType": "PizzaDeliveryAttributes", "token": "%064x" % (i * 100 + j),
                    "attributes": {"numberOfPizzas": 1, "totalAmount": big, "orderNumber": big},
                    "contentState": {"driverName": big, "deliveryTimer": [788918400, 788919900]}}, headers={"Isle-Installation-Secret": secret})
                if status == 201:
                    created["activities"] += 1
                elif status == 429:
                    refused += 1
                    break
        elif status == 429:
            refused += 1
        i += 1
    grew = database_bytes() - before
    expect(created["installations"] <= NEW_PER_HOUR + 1, f"installations created by one address in 10 s stay within its hourly allowance ({created['installations']} ≤ {NEW_PER_HOUR})")
    expect(created["activities"] <= NEW_PER_HOUR + 1, f"activities created by one address in 10 s stay within its hourly allowance ({created['activities']} ≤ {NEW_PER_HOUR})")
    expect(refused > 0, f"past it, 429 quotaExceeded ({refused} refusals)")
    # (The write-ahead log's pages included; the same run on the code before trust v3 wrote tens of MB.)
    expect(grew < 5_000_000, f"the database grew by at most 5 MB ({grew} bytes)")


def webhooks_inside():
    """Webhooks to loopback, private and link-local addresses, and to a name resolving to loopback,
    are refused at creation: nothing is ever sent there."""
    backend = Client("127.0.0.1")
    sim_port = SIM.rsplit(":", 1)[1]
    for url in [f"http://127.0.0.1:{sim_port}/devices", f"http://[::1]:{PORT}/health", "http://10.1.2.3/hook", "http://169.254.169.254/latest/meta-data",
                f"http://localhost:{sim_port}/devices", f"http://[::ffff:127.0.0.1]:{sim_port}/", f"http://2130706433:{sim_port}/", "http://192.168.1.1/"]:
        status, body = backend.call("POST", "/v1/webhooks", {"url": url}, key=BACKEND)
        code = (body or {}).get("error", {}).get("code")
        expect(status == 422 and code == "webhookAddressNotAllowed", f"a webhook to {url} is refused ({status} {code})")
    status, body = backend.call("GET", "/v1/webhooks", key=BACKEND)
    expect(status == 200 and body["webhooks"] == [], "no webhook was made")


def idle_sockets():
    """Thousands of idle sockets from 127.0.0.5 do not stop 127.0.0.1's requests."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    sockets = []
    for _ in range(3000):
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.5", 0))
            s.settimeout(5)
            s.connect((HOST, PORT))
            sockets.append(s)
        except OSError:
            break
    expect(len(sockets) >= 2900, f"the client opened its idle sockets ({len(sockets)})")
    answered = 0
    for _ in range(12):
        c = Client("127.0.0.1")
        status, _ = c.call("GET", "/health", key="")
        answered += status == 200
    expect(answered == 12, f"/health answered another address 12 of 12 times while 127.0.0.5 held {len(sockets)} sockets ({answered})")
    # The server closed all but its cap of them.
    time.sleep(1)
    open_ = 0
    for s in sockets:
        s.setblocking(False)
        try:
            open_ += s.recv(1) != b""
        except BlockingIOError:
            open_ += 1
        except OSError:
            pass
        s.close()
    expect(open_ <= CONNECTIONS_PER_ADDRESS, f"the server kept at most {CONNECTIONS_PER_ADDRESS} of them open ({open_})")


def main():
    flood_and_genuine()
    installation_throttling()
    disk_fill()
    webhooks_inside()
    idle_sockets()
    print(f"attack v3: {checks - len(failures)} of {checks} checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
