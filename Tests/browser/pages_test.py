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
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.support.ui import WebDriverWait

SIM = os.environ["ISLE_SIM_CONTROL"]
SERVER = os.environ["ISLE_SERVER"]
BACKEND = os.environ["ISLE_BACKEND_KEY"]
DEVICE_KEY = os.environ["ISLE_DEVICE_KEY"]
ADMIN = os.environ["ISLE_ADMIN_KEY"]
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
    wait = WebDriverWait(browser, 20, ignored_exceptions=[NoSuchElementException, StaleElementReferenceException])
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
    field = wait.until(lambda b: b.find_element(By.ID, "key"))
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
    browser.save_screenshot(os.path.join(SHOTS, "console-1-dashboard.png"))
    # Find the activity by its key; its timeline shows the delivery with status 200.
    field = browser.find_element(By.CSS_SELECTOR, "form.search input[name='key']")
    field.send_keys("order-12345")
    browser.find_element(By.CSS_SELECTOR, "form.search button").click()
    wait.until(lambda b: b.find_element(By.LINK_TEXT, "order-12345")).click()
    wait.until(lambda b: any(td.text == "200" for td in b.find_elements(By.CSS_SELECTOR, "td.status")))
    browser.save_screenshot(os.path.join(SHOTS, "console-2-timeline.png"))
    # An invalid update: the validator's error, inline.
    body = browser.find_element(By.ID, "body")
    body.clear()
    body.send_keys('{"contentState": {"driverName": 5}}')
    browser.find_element(By.CSS_SELECTOR, "form[action$='/compose'] button").click()
    wait.until(lambda b: "contentState.driverName" in b.find_element(By.CSS_SELECTOR, ".error").text)
    browser.save_screenshot(os.path.join(SHOTS, "console-3-invalid-update.png"))


if __name__ == "__main__":
    main()
