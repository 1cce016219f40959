"""A real headless Chromium driven over WebDriver, from Debian's ``chromium`` and
``chromium-driver`` packages (installed with apt-get when missing).

Selenium is given both paths, so it never runs Selenium Manager and never downloads a browser
or a driver. chromedriver runs in its own session (process group): :meth:`Chromium.stop` quits
the browser through WebDriver, then kills whatever is left of that group by its id, so that no
browser outlives a failed test.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from harness.procs import apt_lock, free_port

PACKAGES = ("chromium", "chromium-driver")


def ensure_chromium() -> tuple[str, str]:
    """The paths of chromium and chromedriver, installing Debian's packages if needed."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser and driver:
        return browser, driver
    with apt_lock():
        browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
        if browser and driver:
            return browser, driver
        subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver, f"apt-get installed {PACKAGES} but chromium/chromedriver are not on PATH"
    return browser, driver


class Chromium:
    """One headless browser with its own profile folder and driver log under ``folder``."""

    def __init__(self, folder: Path, width: int = 1280, height: int = 1000):
        self.folder = folder
        self.width, self.height = width, height
        self.driver: webdriver.Chrome | None = None
        self._service: Service | None = None

    def start(self) -> webdriver.Chrome:
        browser, driver = ensure_chromium()
        self.folder.mkdir(parents=True, exist_ok=True)
        options = Options()
        options.binary_location = browser
        for arg in (
            "--headless=new",
            "--no-sandbox",  # tests run as root, where Chromium's sandbox cannot start
            "--disable-dev-shm-usage",
            "--disable-gpu",
            f"--window-size={self.width},{self.height}",
            "--force-device-scale-factor=1",
            f"--user-data-dir={self.folder / 'profile'}",
            "--lang=en-US",
            "--no-first-run",
            "--no-default-browser-check",
            # Nothing but the page under test: no update checks, sync or other calls home.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
        ):
            options.add_argument(arg)
        # Everything the page logs, for the failure message.
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self._service = Service(
            executable_path=driver,
            port=free_port(),
            log_output=str(self.folder / "chromedriver.log"),
            popen_kw={"start_new_session": True},
        )
        self.driver = webdriver.Chrome(options=options, service=self._service)
        return self.driver

    def console(self) -> list[str]:
        """The page's console messages so far (each read returns only new ones)."""
        if self.driver is None:
            return []
        try:
            return [f"{e['level']} {e['message']}" for e in self.driver.get_log("browser")]
        except Exception as e:  # a browser that died cannot answer
            return [f"(no console log: {e})"]

    def stop(self) -> None:
        """Quits the browser; then kills the driver's process group by id. Idempotent."""
        driver, self.driver = self.driver, None
        if driver is not None:
            try:
                driver.quit()
            except Exception as e:  # the browser may already be gone; the group kill follows
                print(f"chromium: quit failed: {e}")
        process = self._service.process if self._service else None
        if process is not None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(timeout=10)
