""""Fork from here" in a real browser: Debian's headless Chromium, a real broker, `torpor ui`.

A thread talks twice (a scripted model answers "hello" and "tell me more"). On its page,
the first entry's "fork from here" sends a signed-or-not operator `fork` control; its
receipt shows on the action, with a link to the new thread. The new thread's page shows
the history it kept (the first entry, the same text), the model's new answer to it, and
where it was forked from; the second exchange is not there, and the source still has it.

Chromium is a hard requirement, as in test_browser.py (whose `browser` fixture this uses);
`TORPOR_UI_SCREENSHOTS=docs` saves the fork's page as docs/ui-fork.png.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.cli.rig import deploy, send
from tests.cli.test_fork import FIRST, SCRIPT, SECOND
from tests.inspector.chromium import picture
from tests.inspector.rig import Inspected, ui_log
from tests.processors.test_processor import TORPOR
from tests.waiting import wait_until

pytestmark = pytest.mark.kafka

WAIT_S: Final = 120.0


@pytest.fixture
def talking_ui(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Inspected]:
    with deploy(kafka_bootstrap, admin, tmp_path, SCRIPT, "torpor.connectors.echo:EchoTool") as deployment:
        deployment.start([TORPOR, "ui", "--port", "0", "--operator", "inspector-test"], "ui")
        found = wait_until(lambda: re.search(r"torpor ui: (http://\S+/)", deployment.log("ui")), timeout=60,
                           message="torpor ui's address on its output")
        yield Inspected(deployment, found.group(1))


def _timeline(driver: WebDriver) -> str:
    return driver.find_element(By.ID, "timeline").text


def _entry(driver: WebDriver, seq: int) -> WebElement | None:
    found = driver.find_elements(By.CSS_SELECTOR, f'#timeline li[data-seq="{seq}"] button.fork')
    return found[0] if found else None


def test_a_fork_from_an_earlier_entry_makes_a_new_thread_with_that_history(
        talking_ui: Inspected, browser: WebDriver) -> None:
    ui = talking_ui
    thread = f"talker-{uuid.uuid4().hex[:8]}"
    send(ui.deployment, thread, "hello", "--new", "--model", "scripted", "--wait", "60")
    send(ui.deployment, thread, "tell me more", "--wait", "60")
    browser.get(ui.url + "#thread=" + thread)
    wait_until(lambda: SECOND in _timeline(browser), timeout=WAIT_S,
               message=lambda: f"both answers on the source's timeline; ui log:\n{ui_log(ui)}")

    fork = f"{thread}-again"
    browser.find_element(By.ID, "fork-as").send_keys(fork)
    button = wait_until(lambda: _entry(browser, 0), timeout=WAIT_S, message="entry #0's fork button")
    button.click()
    action = wait_until(
        lambda: next((a for a in browser.find_elements(By.CSS_SELECTOR, "#actions li")
                      if a.get_attribute("data-disposition")), None),
        timeout=WAIT_S, message="the fork control's receipt on the page")
    assert action.get_attribute("data-disposition") == "applied", action.text
    assert action.get_attribute("data-fork") == fork and "fork from #0" in action.text, action.text
    assert "sent as operator:inspector-test" in action.text, action.text

    action.find_element(By.CSS_SELECTOR, f'a.thread-link[data-thread="{fork}"]').click()
    wait_until(lambda: browser.find_element(By.ID, "thread-title").text == fork, timeout=WAIT_S,
               message="the fork's page")
    wait_until(lambda: FIRST in _timeline(browser), timeout=WAIT_S,
               message=lambda: f"the fork's own answer to the kept entry; ui log:\n{ui_log(ui)}")
    timeline = _timeline(browser)
    assert "#0 user: hello" in timeline and f"#1 assistant: {FIRST}" in timeline, timeline
    assert "tell me more" not in timeline and SECOND not in timeline, timeline
    assert browser.find_element(By.ID, "missing").text == \
        f"forked from {thread} at entry #0 by operator:inspector-test"
    kinds = [li.get_attribute("data-kind") for li in browser.find_elements(By.CSS_SELECTOR, "#timeline li")]
    assert kinds[:2] == ["thread_created", "inherited"] and "turn_committed" in kinds, kinds
    receipts = wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#receipts tbody tr") or None,
                          timeout=WAIT_S, message="the fork's receipts")
    assert receipts[0].find_elements(By.TAG_NAME, "td")[2].text == "applied"  # its creation
    picture(browser, "ui-fork.png")

    # Time travel on the fork: its creation, re-folded from the log, gives the head its receipt recorded.
    after = receipts[0].find_elements(By.TAG_NAME, "td")[6].text.split("→")[-1].strip()
    receipts[0].find_element(By.CSS_SELECTOR, "button.travel").click()
    past = wait_until(lambda: (text := browser.find_element(By.ID, "past-head").text).startswith("after")
                      and text, timeout=WAIT_S, message="the fork as it stood after its creation")
    assert after and f"head {after}" in past and "1 entries" in past, (past, after)
    assert browser.find_element(By.ID, "past").text == "user: hello"

    browser.get(ui.url + "#thread=" + thread)  # the source keeps both exchanges
    wait_until(lambda: SECOND in _timeline(browser), timeout=WAIT_S, message="the source again")
    assert "fork_requested" in _timeline(browser)
