"""Debian's headless Chromium through chromium-driver, for the inspector's browser tests.

`chromium()` yields a Selenium `WebDriver` and quits it afterwards. Chromium is a hard
requirement (`.ci/run` installs it): when it is missing or cannot start, the test fails
and says why; it never skips. `picture(driver, name)` saves a screenshot into the folder
`TORPOR_UI_SCREENSHOTS` names (docs/, to refresh the pictures there), else does nothing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.waiting import wait_until

CHROMIUM: Final = os.environ.get("TORPOR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER: Final = os.environ.get("TORPOR_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOTS_ENV: Final = "TORPOR_UI_SCREENSHOTS"


@contextmanager
def chromium() -> Iterator[WebDriver]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (Path(p).exists() or shutil.which(p))]
    if missing:
        pytest.fail(f"headless Chromium is needed for this test and {missing} is not installed: "
                    "`apt-get install chromium chromium-driver` (.ci/run does it)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    except WebDriverException as error:
        pytest.fail(f"headless Chromium ({CHROMIUM}, driver {CHROMEDRIVER}) did not start: {error.msg}")
    try:
        yield driver
    finally:
        driver.quit()


def thread_row(driver: WebDriver, thread: str) -> WebElement | None:
    """The threads list's row of `thread`, or None while the page does not show it."""
    for row in driver.find_elements(By.CSS_SELECTOR, "#threads tbody tr"):
        if row.get_attribute("data-thread") == thread:
            return row
    return None


def click(find: Callable[[], WebElement | None], what: str, timeout: float) -> None:
    """Click what `find` finds, again if the page redrew it in between (a live page does)."""
    def clicked() -> bool:
        element = find()
        if element is None:
            return False
        element.click()  # a stale element raises: not clicked, tried again
        return True

    wait_until(clicked, timeout=timeout, message=f"to click {what}")


def picture(driver: WebDriver, name: str) -> None:
    if folder := os.environ.get(SCREENSHOTS_ENV):
        driver.save_screenshot(str(Path(folder) / name))
