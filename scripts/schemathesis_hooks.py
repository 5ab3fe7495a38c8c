# Schemathesis hooks for scripts/schemathesis.sh: most generated requests name records that exist
# (the installation, activity, order key, topic and user the script made) and carry a valid
# registration ticket where a body has `ticket`, so the routes are exercised past "not found" and
# the secret and ticket checks; the rest keep schemathesis' own values, so refusals stay covered.
# Which one a request gets depends on a CRC of the generated value: the same seed, the same run.
#
# Isle-Installation-Secret is generated from the document's rule (32 to 200 printable ASCII
# characters) and not passed on the command line, so schemathesis also sends it missing or malformed
# and expects a refusal. A generated secret that keeps the rule is, three times in four, replaced by
# the real secret of the installation the request acts for (the one the script registered, the spare
# it registered for DELETE, or a fixed one derived from the id for any other: the first PUT that
# presents it registers that installation with it); a missing or malformed one is sent as generated,
# to records that exist, so the secret check answers (403) rather than "not found".
import atexit
import collections
import hashlib
import itertools
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
# The document's pattern for a webhook URL (WebhookCreation.url, at most 512 characters) and a ticket
# (a JWT, at most 4096 characters).
WEBHOOK_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~!$&'()*+,;=:@/-]*)?(\?[A-Za-z0-9._~!$&'()*+,;=:@/?-]*)?$")
JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
TICKET_KEY = os.environ.get("ISLE_ST_TICKET_KEY")
# Installation secrets: the document's rule (components/schemas/InstallationSecret), the secrets of the
# installations the script registered, and the installation DELETE removes instead of the real one.
SECRET_HEADER = "Isle-Installation-Secret"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SECRET_RULE = re.compile(r"[\x21-\x7e]{32,200}")
IDEMPOTENCY_RULE = re.compile(r"[\x21-\x7e]{1,255}")
SPARE = os.environ.get("ISLE_ST_SPARE")
SECRETS = {
    REAL["installation"]: os.environ.get("ISLE_ST_SECRET"),
    SPARE: os.environ.get("ISLE_ST_SPARE_SECRET"),
}
# The operations that take the header (method, path template).
INSTALLATION = "/v1/installations/{installation}"
SECRET_OPERATIONS = {
    ("PUT", INSTALLATION),
    ("DELETE", INSTALLATION),
    ("POST", "/v1/activities"),
    ("PUT", "/v1/activities/{activity}/token"),
    ("POST", "/v1/activities/{activity}/dismissed"),
    ("POST", "/v1/activities/{activity}/ended"),
    ("POST", "/v1/topics/{topic}/channel"),
}
# Fresh Idempotency-Keys for requests whose secret is refused (see map_case).
FRESH_KEYS = itertools.count(1)


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


def fits(value, most):
    """Whether a generated value keeps the document's rule for an id-like string: 1 to `most`
    characters, no U+0000."""
    return isinstance(value, str) and 0 < len(value) <= most and "\0" not in value


@schemathesis.hook
def map_body(ctx, body):
    # Only values that keep the document's rules are replaced: a negative body stays negative (the
    # negative_data_rejection check does not look at the body again after the hooks).
    # A webhook's URL is where the server will POST: a valid one goes to this machine (a closed
    # port), so most are created rather than refused (the server, run with --webhook-hosts
    # 127.0.0.1, refuses any other host with a 422); an invalid one stays as generated.
    if isinstance(body, dict) and isinstance(body.get("url"), str) and len(body["url"]) <= 512 and WEBHOOK_URL.match(body["url"]):
        body["url"] = "http://127.0.0.1:9/schemathesis"
    if not isinstance(body, dict) or not mostly(body):
        return body
    ticket = body.get("ticket")
    if "ticket" in body and (ticket is None or isinstance(ticket, str) and len(ticket) <= 4096 and JWT.fullmatch(ticket)) and TICKET:
        body["ticket"] = TICKET
        if "externalKey" in body and (body["externalKey"] is None or fits(body["externalKey"], 256)) and TICKET_KEY:
            body["externalKey"] = TICKET_KEY
    if fits(body.get("installationID"), 128) and REAL["installation"]:
        body["installationID"] = REAL["installation"]
    if fits(body.get("attributesType"), 128):
        body["attributesType"] = "PizzaDeliveryAttributes"
    return body


def secret_for(installation):
    """The secret the run uses for an installation: the one the script registered it with, else a
    fixed valid one (43 characters) derived from its id."""
    known = SECRETS.get(installation)
    if known:
        return known
    return "st_" + hashlib.sha256(f"schemathesis:{installation}".encode("utf-8", "surrogatepass")).hexdigest()[:40]


def header(headers, name):
    """The header's value and its key as generated (header names are case-insensitive)."""
    for key in list(headers or {}):
        if key.lower() == name.lower():
            return headers[key], key
    return None, name


@schemathesis.hook
def map_case(ctx, case):
    # Runs in every phase (the coverage phase applies no other map_* hook), after the other hooks.
    operation = (case.method.upper(), case.operation.path)
    if operation not in SECRET_OPERATIONS:
        return case
    if case.headers is None:
        case.headers = {}
    path = case.path_parameters if case.path_parameters is not None else {}
    body = case.body if isinstance(case.body, dict) else None
    value, key = header(case.headers, SECRET_HEADER)
    # The installation the request acts for: the path's, the registration's installationID, or the
    # real activity's installation.
    if "installation" in path:
        target = path["installation"]
    elif body is not None and isinstance(body.get("installationID"), str):
        target = body["installationID"]
    elif path.get("activity") == REAL["activity"]:
        target = REAL["installation"]
    else:
        target = None
    if isinstance(value, str) and SECRET_RULE.fullmatch(value):
        # A well-formed secret: mostly the installation's own, so the request gets past the check.
        if target is not None and mostly(value):
            if operation == ("DELETE", INSTALLATION) and target == REAL["installation"] and SPARE:
                # Deleting retires the secret: the spare goes, never the installation the rest of
                # the run acts for.
                path["installation"] = target = SPARE
            case.headers[key] = secret_for(target)
        return case
    if value is None and operation == ("PUT", INSTALLATION):
        # Optional there: a first registration without one, or a 403 for a registered installation.
        return case
    # Missing where required, or malformed (a refusal is due): sent as generated, for the records
    # that exist, so the secret check is what refuses it — not "not found" (404), and not the
    # acceptance of a first registration (an empty header counts as none). A new installation with
    # a malformed secret (400 invalidInstallationSecret) is kept one time in four.
    if operation != ("PUT", INSTALLATION) or value == "" or mostly(value):
        if "installation" in path and REAL["installation"]:
            path["installation"] = REAL["installation"]
        if "activity" in path and REAL["activity"]:
            path["activity"] = REAL["activity"]
        if body is not None and "installationID" in body and REAL["installation"]:
            body["installationID"] = REAL["installation"]
    # A repeat of an earlier write with the same Idempotency-Key, method, path and body gets the
    # first answer before the secret is checked (documented): a fresh key keeps a refusal a refusal.
    idempotency, idempotency_key = header(case.headers, IDEMPOTENCY_HEADER)
    if isinstance(idempotency, str) and IDEMPOTENCY_RULE.fullmatch(idempotency):
        case.headers[idempotency_key] = f"schemathesis-refused-secret-{next(FRESH_KEYS)}"
    return case


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
