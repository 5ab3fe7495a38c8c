"""The phone page in a real headless Chromium (Debian's chromium + chromium-driver, driven by
selenium from PyPI; nothing is downloaded at run time). Run by scripts/browser-test.sh, which
starts `isle sim` and `isle serve` and passes their URLs and keys in the environment.

It checks what a person would: the Lock Screen text changes without a reload when the backend
updates the activity through Isle's API, a second activity turns the Dynamic Island minimal, and
content state is shown as text, never run. Screenshots go to $ISLE_SCREENSHOTS."""
import json
import os
import subprocess
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, WebDriverException
from selenium.webdriver.support.ui import Select, WebDriverWait

SIM = os.environ["ISLE_SIM_CONTROL"]
SERVER = os.environ["ISLE_SERVER"]
BACKEND = os.environ["ISLE_BACKEND_KEY"]
DEVICE_KEY = os.environ["ISLE_DEVICE_KEY"]
ADMIN = os.environ["ISLE_ADMIN_KEY"]
SERVER_ADMIN = os.environ["ISLE_SERVER_ADMIN_KEY"]
SHOTS = os.environ.get("ISLE_SCREENSHOTS", "artifacts/screenshots")
os.makedirs(SHOTS, exist_ok=True)


def call(method, url, body=None, key=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    if key:
        request.add_header("authorization", "Bearer " + key)
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    with urllib.request.urlopen(request, timeout=20) as response:
        text = response.read().decode()
        return response.status, (json.loads(text) if text else None)


def window(minutes):
    """A delivery window from now, as ActivityKit encodes a ClosedRange<Date>: seconds since 2001."""
    now = time.time() - 978307200
    return [now, now + minutes * 60]


def start_activity(order, driver, score):
    status, activity = call("POST", SIM + "/devices/device-1/apps/com.example.pizza/activities", {
        "attributesType": "PizzaDeliveryAttributes",
        "attributes": {"numberOfPizzas": 2, "totalAmount": "$28.00", "orderNumber": order},
        "contentState": {"driverName": driver, "deliveryTimer": window(25 if order == "12345" else 40)},
        "relevanceScore": score, "waitForPushToken": True})
    assert status == 201, status
    # As IsleClient does: on the app's installation (with its secret), the order key with the
    # registration ticket the backend signed for it.
    ticket = subprocess.run([".build/debug/isle", "ticket", "--key", os.environ["ISLE_TICKET_KEY"], "--key-id", os.environ["ISLE_TICKET_KEY_ID"],
                             "--bundle-id", "com.example.pizza", "--external-key", "order-" + order], check=True, capture_output=True, text=True).stdout.strip()
    status, _ = call("POST", SERVER + "/v1/activities", {
        "attributesType": "PizzaDeliveryAttributes", "token": activity["updateToken"], "externalKey": "order-" + order,
        "installationID": "browser-phone", "ticket": ticket}, key=DEVICE_KEY, headers={"Isle-Installation-Secret": installation_secret()})
    assert status == 201, status


_secret = []


def installation_secret():
    """The app's installation, registered once; its secret goes with every device call."""
    if not _secret:
        status, answer = call("PUT", SERVER + "/v1/installations/browser-phone", {"liveActivitiesEnabled": True}, key=DEVICE_KEY)
        assert status == 200, status
        _secret.append(answer["installationSecret"])
    return _secret[0]


def lock_text(browser):
    """The Lock Screen's visible text, whitespace (and wrapping) collapsed."""
    return " ".join(browser.find_element(By.CSS_SELECTOR, "section.lock").text.split())


def main():
    options = Options()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"]:
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
    # Pages change under the test (live updates, form posts): a vanished element is looked up again.
    wait = WebDriverWait(browser, 20, ignored_exceptions=[NoSuchElementException, StaleElementReferenceException, WebDriverException])
    try:
        start_activity("12345", "Bill James", 50)
        browser.get(SIM + "/phone/device-1")
        wait.until(lambda b: "Bill James" in lock_text(b))
        assert browser.find_element(By.CSS_SELECTOR, ".island").get_attribute("data-mode") == "compact"
        browser.save_screenshot(os.path.join(SHOTS, "phone-1-started.png"))

        # A marker that a reload would wipe: the update must arrive live.
        browser.execute_script("window.__stillTheSamePage = true")
        status, answer = call("POST", SERVER + "/v1/activities/by-key/order-12345/update",
                              {"contentState": {"driverName": "Anne Johnson", "deliveryTimer": window(19)}}, key=BACKEND)
        assert status == 202, (status, answer)
        wait.until(lambda b: "Anne Johnson" in lock_text(b))
        assert browser.execute_script("return window.__stillTheSamePage === true"), "the page reloaded"
        browser.save_screenshot(os.path.join(SHOTS, "phone-2-updated.png"))

        # A second activity: the Dynamic Island goes minimal.
        start_activity("12346", "Carol", 100)
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".island").get_attribute("data-mode") == "minimal")
        cards = browser.find_elements(By.CSS_SELECTOR, "section.lock article.activity")
        assert len(cards) == 2 and "Carol" in cards[0].text, [c.text for c in cards]  # relevance 100 first
        browser.save_screenshot(os.path.join(SHOTS, "phone-3-two-activities.png"))

        # Content state is data: a <script> in it is shown as text and never runs.
        alerts = []
        status, _ = call("POST", SERVER + "/v1/activities/by-key/order-12346/update",
                         {"contentState": {"driverName": "<script>window.__pwned = true</script><img src=x onerror=\"window.__pwned=true\">",
                                           "deliveryTimer": window(40)}}, key=BACKEND)
        assert status == 202
        wait.until(lambda b: "<script>window.__pwned = true</script>" in lock_text(b))
        assert browser.execute_script("return window.__pwned === undefined"), "content state ran as code"
        assert browser.find_elements(By.CSS_SELECTOR, "section.lock img") == []
        browser.save_screenshot(os.path.join(SHOTS, "phone-4-escaped.png"))

        # A paired Apple Watch, CarPlay and a paired Mac: the same activity in each, live.
        status, _ = call("PATCH", SIM + "/devices/device-1", {"pairedWatch": True, "carPlay": True, "pairedMac": True})
        assert status == 200, status
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".elsewhere .surface")) >= 3)
        surfaces = [e.get_attribute("data-surface") for e in browser.find_elements(By.CSS_SELECTOR, ".elsewhere .surface")]
        assert surfaces[:2] == ["watchSmartStack", "carPlay"] and "macMenuBar" in surfaces, surfaces
        assert browser.execute_script("return window.__stillTheSamePage === true"), "the page reloaded"
        browser.save_screenshot(os.path.join(SHOTS, "phone-5-watch-carplay-mac.png"))
        print("phone page in Chromium: ok")
        console(browser, wait)
        print("console in Chromium: ok (screenshots in %s)" % SHOTS)
    except Exception:
        browser.save_screenshot(os.path.join(SHOTS, "failure.png"))
        print(browser.page_source[:4000], file=sys.stderr)
        raise
    finally:
        browser.quit()


def sign_in(browser, wait, key):
    browser.get(SERVER + "/console")
    field = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "form[action='/console/login'] #key"))
    field.send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "form[action='/console/login'] button").click()


def console(browser, wait):
    # A backend key is refused.
    sign_in(browser, wait, BACKEND)
    wait.until(lambda b: "takes an admin key" in b.find_element(By.CSS_SELECTOR, ".error").text)
    # The admin key signs in; the dashboard names the app.
    sign_in(browser, wait, ADMIN)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "h1").text == "com.example.pizza")
    # The live counters run from /console/console.js under a CSP without inline script: after two
    # polls the rate is a number.
    wait.until(lambda b: b.find_element(By.ID, "rate").text not in ("", "–"))
    shot(browser, "console-1-dashboard.png")
    # Find the activity by its key; its timeline shows the delivery with status 200.
    field = browser.find_element(By.CSS_SELECTOR, "form.search input[name='key']")
    field.send_keys("order-12345")
    browser.find_element(By.CSS_SELECTOR, "form.search button").click()
    wait.until(lambda b: b.find_element(By.LINK_TEXT, "order-12345")).click()
    wait.until(lambda b: any(td.text == "200" for td in b.find_elements(By.CSS_SELECTOR, "td.status")))
    shot(browser, "console-2-timeline.png")
    # An invalid update: the validator's error, inline.
    body = browser.find_element(By.ID, "body")
    body.clear()
    body.send_keys('{"contentState": {"driverName": 5}}')
    browser.find_element(By.CSS_SELECTOR, "form[action$='/compose'] button").click()
    wait.until(lambda b: "contentState.driverName" in b.find_element(By.CSS_SELECTOR, ".error").text)
    shot(browser, "console-3-invalid-update.png")
    activity_url = browser.current_url.split("/compose")[0]
    console_actions(browser, wait, activity_url)


def shot(browser, name):
    """The page at a laptop's 1366 px and a phone's 390 px (name-1366.png, name-390.png), whole:
    tall pages (the queue, the audit log) are shown whole. At either width the page must not
    scroll sideways (a wide table scrolls inside itself)."""
    base = name[:-4] if name.endswith(".png") else name
    for width, mobile in [(1366, False), (390, True)]:
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile})
        height = browser.execute_script("return document.documentElement.scrollHeight")
        sideways = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert sideways <= 1, f"{name} at {width} px scrolls sideways by {sideways} px"
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": width, "height": max(900, min(height + 40, 4000)), "deviceScaleFactor": 1, "mobile": mobile})
        browser.save_screenshot(os.path.join(SHOTS, f"{base}-{width}.png"))
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def console_actions(browser, wait, activity_url):
    """Every console action, clicked as an operator would (issue 26); screenshots in docs/images."""
    activity_id = activity_url.rstrip("/").split("/")[-1]
    # Compose a payload the validator warns about (Unix time in a Date field): not queued; the
    # warning is confirmed with the box, then it is.
    browser.get(activity_url)
    body = wait.until(lambda b: b.find_element(By.ID, "body"))
    body.clear()
    body.send_keys('{"contentState": {"driverName": "Anne", "deliveryTimer": [1767225600, 1767227400]}}')
    browser.find_element(By.CSS_SELECTOR, "form[action$='/compose'] button").click()
    wait.until(lambda b: "unixTimeInDateField" in b.find_element(By.ID, "warnings").text)
    assert not browser.find_elements(By.ID, "compose-result"), "queued despite a warning"
    assert "Fix:" in browser.find_element(By.ID, "warnings").text, "the warning without the validator's fix"
    shot(browser, "console-4-warning.png")
    browser.find_element(By.ID, "confirm").click()
    browser.find_element(By.CSS_SELECTOR, "form[action$='/compose'] button").click()
    wait.until(lambda b: "warnings were confirmed" in b.find_element(By.ID, "compose-result").text)

    # A webhook to a closed port on this machine: the secret is shown once.
    browser.get(SERVER + "/console/webhooks")
    wait.until(lambda b: b.find_element(By.ID, "url")).send_keys("http://127.0.0.1:9/closed")
    browser.find_element(By.CSS_SELECTOR, "form[action='/console/webhooks'] button").click()
    wait.until(lambda b: b.find_element(By.ID, "secret").text.startswith("whsec_"))

    # The queue: a push scheduled four hours ahead (within the job deadline), shown and cancelled; a push waiting for its retry
    # after a 503, sent now.
    status, queued = call("POST", SERVER + "/v1/activities/%s/update" % activity_id,
                          {"contentState": {"driverName": "Tomorrow", "deliveryTimer": window(30)}, "sendAt": int(time.time()) + 4 * 3600}, key=BACKEND)
    assert status == 202, status
    scheduled = queued["jobs"][0]
    # Four 503s in a row: after the fourth the push waits 4–8 s for its next try (the server's
    # backoff), long enough for the click to find it waiting (below the 5 that back the app off).
    call("POST", SIM + "/failures", {"status": 503, "reason": "ServiceUnavailable", "times": 4})
    status, retried = call("POST", SERVER + "/v1/activities/%s/update" % activity_id,
                           {"contentState": {"driverName": "Retried", "deliveryTimer": window(30)}}, key=BACKEND)
    assert status == 202, status
    waiting = retried["jobs"][0]
    browser.get(SERVER + "/console")
    row = "tr[data-job='%d']" % waiting
    wait.until(lambda b: (b.find_element(By.CSS_SELECTOR, row + " td.state").text == "waiting for retry"
                          and b.find_element(By.CSS_SELECTOR, row + " td:nth-child(6)").text == "4") or (b.refresh() and False))
    assert browser.find_element(By.CSS_SELECTOR, "tr[data-job='%d'] td.state" % scheduled).text == "scheduled"
    # The queue names the activity by its key, not its id.
    named = browser.find_element(By.CSS_SELECTOR, row + " td.id a").text
    assert named and named != activity_id, ("the queue shows the activity's id", named)
    shot(browser, "console-5-queue.png")
    browser.find_element(By.CSS_SELECTOR, "tr[data-job='%d'] button.cancel" % scheduled).click()
    wait.until(lambda b: "cancelled" in b.find_element(By.ID, "notice").text)
    assert not browser.find_elements(By.CSS_SELECTOR, "tr[data-job='%d']" % scheduled)
    browser.find_element(By.CSS_SELECTOR, "tr[data-job='%d'] button.retry" % waiting).click()
    wait.until(lambda b: "goes now" in b.find_element(By.ID, "notice").text)

    # Pause the app by hand, with a reason; then resume it.
    browser.find_element(By.ID, "reason").send_keys("checking the alert copy")
    browser.find_element(By.ID, "pause-app").click()
    wait.until(lambda b: "paused by an operator" in b.find_element(By.ID, "status").text)
    # A pause reads as a warning (amber), not as a success; held pushes say why.
    assert "warn" in browser.find_element(By.ID, "notice").get_attribute("class").split(), "the pause notice is not a warning"
    assert "warn" in (browser.find_element(By.ID, "status").get_attribute("class") or ""), "the paused status is not a warning"
    shot(browser, "console-6-paused.png")
    browser.find_element(By.ID, "resume-app").click()
    wait.until(lambda b: b.find_element(By.ID, "status").text == "sending")

    # End the activity from its page.
    browser.get(activity_url)
    wait.until(lambda b: b.find_element(By.ID, "end-activity")).click()
    wait.until(lambda b: "Queued as job" in b.find_element(By.ID, "compose-result").text)

    # The webhook shows its failure (the app's events since it was added went nowhere).
    browser.get(SERVER + "/console/webhooks")
    wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#webhooks td.status").text == "failing" or (b.refresh() and False))
    assert "could not connect" in browser.find_element(By.CSS_SELECTOR, "#webhooks td.failure").text
    shot(browser, "console-7-webhooks.png")
    browser.find_element(By.CSS_SELECTOR, "#webhooks button.delete").click()
    wait.until(lambda b: "deleted" in b.find_element(By.ID, "notice").text)
    assert not browser.find_elements(By.CSS_SELECTOR, "#webhooks tr[data-webhook]")

    # The audit log: each action, with the admin key.
    browser.get(SERVER + "/console/audit")
    actions = [td.text for td in wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#audit td.action"))]
    for a in ["signIn", "activity.push", "webhook.create", "job.cancel", "job.retry", "app.pause", "app.resume", "activity.end", "webhook.delete"]:
        assert a in actions, (a, actions)
    shot(browser, "console-8-audit.png")

    # The history: the deliveries of this run drawn by the server (the counters are written every
    # five seconds), the 503s by reason with Isle's advice.
    browser.get(SERVER + "/console/history")
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#chart-deliveries polyline[data-series='delivered']")
               and "ServiceUnavailable" in b.find_element(By.ID, "reasons").text or (b.refresh() and False))
    assert int(browser.find_element(By.ID, "total-delivered").text) >= 3
    shot(browser, "console-9-history.png")
    browser.find_element(By.LINK_TEXT, "7d").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#chart-deliveries"))

    # A server-admin key: every app of the server, with the switcher.
    browser.find_element(By.CSS_SELECTOR, "form[action='/console/logout'] button").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "form[action='/console/login']"))
    sign_in(browser, wait, SERVER_ADMIN)
    wait.until(lambda b: b.find_element(By.TAG_NAME, "h1").text == "com.example.pizza")
    Select(browser.find_element(By.ID, "app")).select_by_value("com.example.tacos")
    browser.find_element(By.ID, "switch-app").click()
    wait.until(lambda b: b.find_element(By.TAG_NAME, "h1").text == "com.example.tacos")
    shot(browser, "console-10-switch.png")


if __name__ == "__main__":
    main()
