# Schemathesis hooks for scripts/schemathesis.sh: most generated requests name records that exist
# (the installation, activity, order key, topic and user the script made) and carry a valid
# registration ticket where a body has `ticket`, so the routes are exercised past "not found" and
# the secret and ticket checks; the rest keep schemathesis' own values, so refusals stay covered.
# Which one a request gets depends on a CRC of the generated value: the same seed, the same run.
import atexit
import collections
import os
import re
import zlib

import schemathesis

REAL = {
    "installation": os.environ.get("ISLE_ST_INSTALLATION"),
    "activity": os.environ.get("ISLE_ST_ACTIVITY"),
    "key": os.environ.get("ISLE_ST_KEY"),
    "topic": os.environ.get("ISLE_ST_TOPIC"),
    "user": os.environ.get("ISLE_ST_USER"),
}
TICKET = os.environ.get("ISLE_ST_TICKET")
# The document's pattern for a webhook URL (WebhookCreation.url).
WEBHOOK_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~!$&'()*+,;=:@/-]*)?(\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?$")
TICKET_KEY = os.environ.get("ISLE_ST_TICKET_KEY")


def mostly(value):
    """True for three generated values in four."""
    return zlib.crc32(repr(value).encode("utf-8", "surrogatepass")) % 4 != 0


@schemathesis.hook
def map_path_parameters(ctx, path_parameters):
    if not path_parameters:
        return path_parameters
    for name, real in REAL.items():
        if real and name in path_parameters and mostly(path_parameters[name]):
            path_parameters[name] = real
    return path_parameters


@schemathesis.hook
def map_query(ctx, query):
    # GET /v1/events?wait=… long-polls up to 30 s when no event comes: the run keeps it short.
    if query and "wait" in query:
        query["wait"] = 0.2
    return query


@schemathesis.hook
def map_body(ctx, body):
    # A webhook's URL is where the server will POST: a valid one goes to this machine (a closed
    # port), so most are created rather than refused (the server, run with --webhook-hosts
    # 127.0.0.1, refuses any other host with a 422); an invalid one stays as generated.
    if isinstance(body, dict) and isinstance(body.get("url"), str) and WEBHOOK_URL.match(body["url"]):
        body["url"] = "http://127.0.0.1:9/schemathesis"
    if not isinstance(body, dict) or not mostly(body):
        return body
    if "ticket" in body and TICKET:
        body["ticket"] = TICKET
        if "externalKey" in body and TICKET_KEY:
            body["externalKey"] = TICKET_KEY
    if "installationID" in body and REAL["installation"]:
        body["installationID"] = REAL["installation"]
    if "attributesType" in body:
        body["attributesType"] = "PizzaDeliveryAttributes"
    return body


# What each operation answered, printed when the run ends: evidence that the routes were reached,
# not only refused.
ANSWERS = {}


@schemathesis.hook
def after_call(ctx, case, response):
    key = f"{case.method} {case.path}"
    ANSWERS.setdefault(key, collections.Counter())[response.status_code] += 1


def report():
    print("answers by operation (status: count):")
    for key in sorted(ANSWERS):
        print(f"  {key}: " + ", ".join(f"{s}: {n}" for s, n in sorted(ANSWERS[key].items())))


atexit.register(report)
