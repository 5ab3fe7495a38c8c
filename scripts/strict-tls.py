"""Connects to a TLS server as a strict client does (OpenSSL's X509_V_FLAG_X509_STRICT, which
Python's default context sets from 3.13: it refuses, for one, a certificate without an Authority
Key Identifier), trusting only the given CA, with ALPN h2. Exits non-zero with the reason if the
handshake fails.

    python3 strict-tls.py CA_PEM PORT [HOSTNAME]
"""
import socket
import ssl
import sys

ca, port = sys.argv[1], int(sys.argv[2])
hostname = sys.argv[3] if len(sys.argv) > 3 else "localhost"
ctx = ssl.create_default_context(cafile=ca)
ctx.verify_flags |= ssl.VERIFY_X509_STRICT
ctx.set_alpn_protocols(["h2"])
try:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s, ctx.wrap_socket(s, server_hostname=hostname) as t:
        print("strict TLS verification of %s:%d ok (%s, ALPN %s)" % (hostname, port, t.version(), t.selected_alpn_protocol()))
except ssl.SSLError as e:
    raise SystemExit("strict TLS verification of %s:%d failed: %s" % (hostname, port, e))
