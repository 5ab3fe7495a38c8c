"""HTTP helpers the flow scripts share (topics_flow.py, renewal_flow.py): JSON over urllib with
the backend's and the device's keys, checks that stop the flow with what failed, and waits with a
deadline."""
import json
import time
import urllib.error
import urllib.request


class Flow:
    def __init__(self, name, server, control, backend_key, device_key):
        self.name, self.server, self.control = name, server, control
        self.backend_key, self.device_key = backend_key, device_key

    @staticmethod
    def call(method, url, body=None, headers=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                text = r.read()
                return r.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            text = e.read()
            return e.code, (json.loads(text) if text else None)

    def backend(self, method, path, body=None):
        return self.call(method, self.server + path, body, {"authorization": "Bearer " + self.backend_key})

    def device(self, method, path, body=None, secret=None):
        headers = {"authorization": "Bearer " + self.device_key}
        if secret:
            headers["isle-installation-secret"] = secret
        return self.call(method, self.server + path, body, headers)

    def check(self, condition, what):
        if not condition:
            raise SystemExit("%s: FAILED: %s" % (self.name, what))

    def eventually(self, what, predicate, within=20):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        # What the fake APNs last saw, to say why.
        _, log = self.call("GET", self.control + "/requests")
        for r in (log or [])[-4:]:
            print("  fake APNs: %s %s → %s %s %s" % (r["method"], r["path"], r["status"], r.get("reason") or "", (r.get("outcome") or {}).get("sentence") or ""))
        raise SystemExit("%s: FAILED (after %ss): %s" % (self.name, within, what))
