#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver (JSON encoding) on 127.0.0.1 for scripts/try-tracing.sh: writes each
span it is sent as one JSON line (ids in hex, attributes flattened) to --out."""
import argparse
import base64
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def hex_id(value):
    if not value:
        return ""
    if len(value) % 2 == 0 and all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    return base64.b64decode(value).hex()


def flat(value):
    for key in ("stringValue", "intValue", "doubleValue", "boolValue"):
        if key in value:
            return str(value[key])
    return json.dumps(value)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1/traces" or "json" not in self.headers.get("Content-Type", ""):
                self.send_response(415 if self.path == "/v1/traces" else 404)
                self.end_headers()
                return
            with open(args.out, "a") as out:
                for resource in json.loads(body).get("resourceSpans", []):
                    for scope in resource.get("scopeSpans", []):
                        for span in scope.get("spans", []):
                            out.write(json.dumps({
                                "trace": hex_id(span.get("traceId")), "span": hex_id(span.get("spanId")),
                                "parent": hex_id(span.get("parentSpanId")), "name": span.get("name"), "kind": span.get("kind"),
                                "attributes": {a["key"]: flat(a.get("value", {})) for a in span.get("attributes", [])},
                            }) + "\n")
            answer = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_):
            pass

    # Stopped with SIGTERM by the scripts' clean-up: a normal end, status 0.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
