#!/usr/bin/env python3
"""A backend's webhook endpoint for Isle's events, as docs/events.md describes it: checks each
request's Isle-Signature (HMAC-SHA256 over "<t>.<body>" with the webhook's secret, a 5-minute
replay window, constant-time comparison) and records each event once (by its id).

  scripts/webhook-receiver.py --port 18095 --secret-file secret.txt --out events.jsonl [--fail-while FILE]

--fail-while FILE: answer 500 while FILE exists (the backend is down), to test Isle's retries.
Requests with a bad or old signature are answered 401 and counted in <out>.rejected.
Only this machine: it listens on 127.0.0.1.
"""
import argparse
import hashlib
import hmac
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPLAY_WINDOW = 300


def verify(header, body, secret, now=None):
    """True when `header` (t=...,v1=...) signs `body` (bytes) with `secret` within the window."""
    parts = dict(p.strip().split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((now or time.time()) - t) > REPLAY_WINDOW:
        return False
    expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, v) for k, v in (p.strip().split("=", 1) for p in header.split(",") if "=" in p) if k == "v1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fail-while")
    args = ap.parse_args()
    lock = threading.Lock()
    seen = set()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, status):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if args.fail_while and os.path.exists(args.fail_while):
                return self.answer(500)
            secret = open(args.secret_file).read().strip() if os.path.exists(args.secret_file) else ""
            if not secret or not verify(self.headers.get("Isle-Signature", ""), body, secret):
                with lock, open(args.out + ".rejected", "a") as f:
                    f.write(self.headers.get("Isle-Signature", "") + "\n")
                return self.answer(401)
            with lock, open(args.out, "a") as f:
                for e in json.loads(body)["events"]:
                    if e["id"] in seen:  # delivered again (an answer Isle did not get): once is enough
                        continue
                    seen.add(e["id"])
                    f.write(json.dumps(e) + "\n")
            self.answer(200)

    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
