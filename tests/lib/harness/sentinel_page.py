"""Driving the Sentinel's page at ``/ui/`` in a WebDriver session, as a person would: the
helpers the page's tests share (the e2e tests against a Sentinel process, the cluster stage
against the chart's Sentinel behind its Service)."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 20  # seconds for anything the page does after an event


def until(driver, condition, what: str, timeout: float = WAIT):
    """WebDriverWait with a message that says what the page did not do."""
    return WebDriverWait(driver, timeout).until(condition, message=f"the page did not {what}")


def by_id(driver, element_id: str) -> WebElement:
    return driver.find_element(By.ID, element_id)


def card(driver, worker: str) -> WebElement:
    return driver.find_element(By.CSS_SELECTOR, f'li.card[data-worker="{worker}"]')


def enter_token(driver, token: str) -> None:
    """Types the token where the page put the focus and presses Enter."""
    until(driver, lambda d: by_id(d, "token-panel").is_displayed(), "ask for a token")
    active = driver.switch_to.active_element
    assert active.get_attribute("id") == "token-input", "the token field does not have the focus"
    active.send_keys(token + Keys.ENTER)


def sign_in(driver, page_url: str, token: str) -> None:
    driver.get(page_url)
    enter_token(driver, token)
    until(driver, lambda d: by_id(d, "workers").is_displayed(), "show the worker list")


def loaded_range(driver, wanted: str):
    """The history dialog once the answer for ``wanted`` is on screen (its status), else False."""
    dialog = by_id(driver, "history")
    if dialog.get_attribute("data-loaded-range") != wanted:
        return False
    return int(dialog.get_attribute("data-history-status"))


def opened(driver):
    """The history dialog once the range it opened on is on screen: ``(range, status)``, else
    False. The page opens on the shortest range that holds the recording (a day at most)."""
    dialog = by_id(driver, "history")
    loaded = dialog.get_attribute("data-loaded-range")
    if not loaded:
        return False
    return loaded, int(dialog.get_attribute("data-history-status"))


def save(driver, folder: Path, name: str) -> Path:
    path = folder / name
    assert driver.save_screenshot(str(path)), f"no screenshot {path}"
    return path
