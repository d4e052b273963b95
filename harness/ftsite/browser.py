"""A real browser on the site: Debian's headless chromium, driven by
Debian's chromium-driver through Selenium (python3-selenium), in the
client's network namespace (where the agents' addresses are reached).
Used by harness/tests/test_dashboard.py.

Every command to the driver goes through `do`, on a thread that has
entered the client's namespace: the driver listens on that namespace's
loopback, and a socket made there stays there. The browser is quit however
the run ends (an undo step)."""

import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from .cleanup import on_cleanup, undo_now
from .errors import TrialFailed
from .site import in_netns

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


class Browser:
    """Headless chromium in namespace `ns`, its window `size` (w, h),
    trusting the certificates of the public keys `pins` (ftsite.pki's
    spki_pins: the agents serve HTTPS under the cluster's own authority,
    which no browser knows)."""

    def __init__(self, site, ns="client", size=(1400, 1500), pins=()):
        self.ns = site.ns[ns]
        self.profile = tempfile.TemporaryDirectory(prefix="ftvm-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", f"--user-data-dir={self.profile.name}",
                    f"--window-size={size[0]},{size[1]}"):
            options.add_argument(arg)
        if pins:
            options.add_argument("--ignore-certificate-errors-spki-list=" + ",".join(pins))
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # The driver (and the browser it starts) inherit the namespace.
        self.driver = in_netns(self.ns, lambda: webdriver.Chrome(service=Service(CHROMEDRIVER), options=options))
        self._undo = on_cleanup(self._quit)

    def _quit(self):
        try:
            in_netns(self.ns, self.driver.quit)
        finally:
            self.profile.cleanup()

    def quit(self):
        undo_now(self._undo)

    def do(self, f):
        """f(driver), on a thread in the namespace."""
        return in_netns(self.ns, lambda: f(self.driver))

    def get(self, url):
        self.do(lambda d: d.get(url))

    def css(self, selector):
        """The elements `selector` finds now."""
        return self.do(lambda d: d.find_elements(By.CSS_SELECTOR, selector))

    def text(self, selector):
        """The text of the first element `selector` finds, or None."""
        def read(d):
            found = d.find_elements(By.CSS_SELECTOR, selector)
            try:
                return found[0].text if found else None
            except WebDriverException:  # replaced by the page meanwhile
                return None
        return self.do(read)

    def attr(self, selector, name):
        def read(d):
            found = d.find_elements(By.CSS_SELECTOR, selector)
            try:
                return found[0].get_attribute(name) if found else None
            except WebDriverException:
                return None
        return self.do(read)

    def click(self, selector, within=10):
        """Clicks the first element `selector` finds, trying again while
        the page replaces it under the click."""
        t0 = time.monotonic()
        while True:
            try:
                return self.do(lambda d: d.find_element(By.CSS_SELECTOR, selector).click())
            except WebDriverException as e:
                if time.monotonic() - t0 > within:
                    raise TrialFailed(f"cannot click {selector}: {e.msg}") from None
                time.sleep(0.2)

    def type(self, selector, text):
        self.do(lambda d: d.find_element(By.CSS_SELECTOR, selector).send_keys(text))

    def screenshot(self, path):
        if not self.do(lambda d: d.save_screenshot(str(path))):
            raise TrialFailed(f"the browser saved no screenshot at {path}")
        return path

    def console_errors(self):
        """The page's JavaScript errors and refused loads since the last
        call."""
        try:
            logs = self.do(lambda d: d.get_log("browser"))
        except WebDriverException:
            return []
        return [entry["message"] for entry in logs if entry.get("level") == "SEVERE"]
