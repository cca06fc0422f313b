"""The lag panel in headless Chromium: `torpor ui` as a process beside a real processor.

The list page shows a row per `inputs` partition (owner, committed, end, lag) with an
inline SVG chart, and the processor instance `p0` owning them all. A thread the
processor folds moves its partition's committed offset and leaves no lag. With the
processor killed, a new thread's two inputs show as lag 2 on its partition, and its
chart has the points of before and after. With no broker at all, the panel says so in
one line and the server keeps serving. `TORPOR_UI_SCREENSHOTS=docs` saves the picture docs/ui.md shows.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Final

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.cli.rig import send
from tests.inspector.chromium import picture
from tests.inspector.rig import Inspected, ui_log
from tests.processors.test_processor import PARTITIONS, REPO, TORPOR
from tests.waiting import wait_until
from torpor.streams.partitioner import partition_for

WAIT_S: Final = 120.0


def _lags(driver: WebDriver) -> dict[int, int] | None:
    """Partition -> lag as the page shows it, once every partition has a row with a chart."""
    rows = _rows(driver)
    if len(rows) != PARTITIONS or any(not r.find_elements(By.CSS_SELECTOR, "svg.spark polyline")
                                      for r in rows):
        return None
    return {int(r.get_attribute("data-partition") or -1): int(r.get_attribute("data-lag") or -1)
            for r in rows}


def _rows(driver: WebDriver) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#lag tbody tr")


def _committed(driver: WebDriver, partition: int) -> str | None:
    rows = driver.find_elements(By.CSS_SELECTOR, f'#lag tbody tr[data-partition="{partition}"]')
    return rows[0].find_elements(By.TAG_NAME, "td")[2].text if rows else None


def _state(driver: WebDriver) -> str:
    return driver.find_element(By.ID, "lag-state").text


def _found(driver: WebDriver, css: str) -> list[WebElement] | None:
    return driver.find_elements(By.CSS_SELECTOR, css) or None


@pytest.mark.kafka
def test_the_panel_shows_each_partition_its_owner_lag_and_chart_and_the_instance(
        ui: Inspected, browser: WebDriver) -> None:
    browser.get(ui.url)
    wait_until(lambda: (lags := _lags(browser)) is not None and set(lags.values()) == {0}, timeout=WAIT_S,
               message=lambda: f"every partition caught up, with its chart; ui log:\n{ui_log(ui)}")
    assert sorted(_lags(browser) or {}) == list(range(PARTITIONS))
    member = wait_until(lambda: _found(browser, '#members tr[data-instance="p0"]'), timeout=WAIT_S,
                        message="the processor instance p0")[0]
    assert member.find_elements(By.TAG_NAME, "td")[1].text == ", ".join(str(p) for p in range(PARTITIONS))
    assert {r.find_elements(By.TAG_NAME, "td")[1].text for r in _rows(browser)} == {"p0"}
    assert "total lag 0" in browser.find_element(By.ID, "lag-state").text

    # A thread the processor folds: its partition's committed offset moves, its lag stays 0.
    folded = f"folded-{uuid.uuid4().hex[:8]}"
    send(ui.deployment, folded, "hello", "--new", "--model", "scripted")
    wait_until(lambda: _committed(browser, partition_for(folded.encode(), PARTITIONS)) not in (None, "none")
               and set((_lags(browser) or {1: 1}).values()) == {0}, timeout=WAIT_S,
               message=lambda: f"the folded thread's inputs committed; ui log:\n{ui_log(ui)}")

    processor = ui.deployment.processes[0]  # the rig starts the processor first
    processor.kill()
    processor.wait(timeout=60)
    thread = f"lagging-{uuid.uuid4().hex[:8]}"
    send(ui.deployment, thread, "hello", "--new", "--model", "scripted")  # a creation and a message
    behind = partition_for(thread.encode(), PARTITIONS)
    wait_until(lambda: (lags := _lags(browser)) is not None and lags[behind] == 2, timeout=WAIT_S,
               message="the new thread's two inputs as lag on its partition")
    row = browser.find_element(By.CSS_SELECTOR, f'#lag tbody tr[data-partition="{behind}"]')
    points = row.find_element(By.CSS_SELECTOR, "svg.spark polyline").get_attribute("points") or ""
    heights = {point.split(",")[1] for point in points.split()}
    assert len(heights) >= 2, points  # at 0 before, above it now
    assert "total lag" in browser.find_element(By.ID, "lag-state").text
    picture(browser, "ui-lag.png")


def test_with_no_broker_the_panel_says_so_in_one_line(browser: WebDriver, tmp_path: Path) -> None:
    log = tmp_path / "ui.log"
    with open(log, "wb") as out:
        ui = subprocess.Popen([TORPOR, "ui", "--port", "0", "--bootstrap", "127.0.0.1:1", "--app", "app-x"],
                              cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        found = wait_until(lambda: re.search(r"torpor ui: (http://\S+/)", log.read_text()), timeout=60,
                           message="torpor ui's address")
        browser.get(found.group(1))
        state = wait_until(lambda: (text := _state(browser)).startswith("cannot") and text, timeout=WAIT_S,
                           message=f"the panel's complaint; ui log:\n{log.read_text()}")
        assert "\n" not in state and "Traceback" not in state
        assert browser.find_element(By.ID, "lag-state").get_attribute("class") == "error"
        assert "(group app-x" in browser.find_element(By.ID, "lag-group").text
        assert _rows(browser) == []
        assert ui.poll() is None  # still serving
    finally:
        ui.terminate()
        ui.wait(timeout=60)
