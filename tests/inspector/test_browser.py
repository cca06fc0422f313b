"""The inspector in a real browser: Debian's headless Chromium, driven through chromium-driver.

Against a real broker, a processor (scripted model) and the deploy connector, with
`torpor ui` as a process: a thread created after the page opened appears in the list
without a reload; its timeline grows as the agent works (the turn, the tool call, the
approval request); approving from the page is sent as a signed-or-not operator input
whose receipt the page shows, and the agent resumes and answers. A thread id and model
text that are HTML run nothing: they show as text.

Chromium is a hard requirement (`.ci/run` installs it): if it cannot start, the test
fails and says why; it never skips.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Final
from urllib.parse import quote

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from tests.cli.rig import send, start_thread
from tests.inspector.chromium import SCREENSHOTS_ENV, click, thread_row
from tests.inspector.rig import (
    CHILD_ANSWER,
    DONE,
    HOSTILE_TEXT,
    HOSTILE_THREAD,
    Inspected,
    ui_log,
)
from tests.waiting import wait_until
from torpor.schemas.records import Input, TextBlock, UserMessage

pytestmark = pytest.mark.kafka

WAIT_S: Final = 120.0


def _link(driver: WebDriver, thread: str) -> WebElement | None:
    row = thread_row(driver, thread)
    return row.find_element(By.CSS_SELECTOR, "a.thread-link") if row is not None else None


def _found(driver: WebDriver, css: str) -> list[WebElement] | None:
    """The elements `css` selects, or None while there are none (wait_until takes [] as an answer)."""
    return driver.find_elements(By.CSS_SELECTOR, css) or None


def _at_least(count: int, elements: list[WebElement]) -> list[WebElement] | None:
    return elements if len(elements) >= count else None


def _picture(driver: WebDriver, name: str) -> None:
    if folder := os.environ.get(SCREENSHOTS_ENV):
        driver.save_screenshot(str(Path(folder) / name))


def _timeline(driver: WebDriver) -> str:
    return driver.find_element(By.ID, "timeline").text


def test_a_thread_appears_live_grows_and_resumes_when_approved_from_the_page(
        ui: Inspected, browser: WebDriver) -> None:
    browser.get(ui.url)
    wait_until(lambda: "live" in browser.find_element(By.ID, "feed").text, timeout=WAIT_S,
               message=lambda: f"the page's feed to catch up; ui log:\n{ui_log(ui)}")
    thread = f"agent-{uuid.uuid4().hex[:8]}"
    assert thread_row(browser, thread) is None

    start_thread(ui.deployment, thread, "please deploy to staging", "deploy")
    wait_until(lambda: thread_row(browser, thread), timeout=WAIT_S,
               message=lambda: f"the new thread in the list, without a reload; ui log:\n{ui_log(ui)}")
    _picture(browser, "ui-threads.png")
    click(lambda: _link(browser, thread), "the thread's link", WAIT_S)

    wait_until(lambda: "Asking first." in _timeline(browser) and "approval_requested" in _timeline(browser),
               timeout=WAIT_S, message="the turn, the call and the approval request on the timeline")
    timeline = _timeline(browser)
    assert "input_accepted" in timeline and "#0 user: please deploy to staging" in timeline, timeline
    assert "call deploy" in timeline, timeline
    grown = len(browser.find_elements(By.CSS_SELECTOR, "#timeline li"))

    click(lambda: browser.find_element(By.CSS_SELECTOR, '#approvals button[data-choice="approve"]'),
           "the approve button", WAIT_S)
    action = wait_until(
        lambda: next((a for a in browser.find_elements(By.CSS_SELECTOR, "#actions li")
                      if a.get_attribute("data-disposition")), None),
        timeout=WAIT_S, message="the decision's receipt on the page")
    assert action.get_attribute("data-disposition") == "applied", action.text
    assert "sent as operator:inspector-test" in action.text and "receipt: applied" in action.text, action.text

    wait_until(lambda: DONE in _timeline(browser), timeout=WAIT_S,
               message=lambda: f"the agent's answer after the approval; connector log:\n"
                       f"{ui.deployment.log('connector')[-2000:]}")
    timeline = _timeline(browser)
    assert "approval_decided" in timeline and "decided_by" in timeline, timeline
    assert "result deploy ok" in timeline and "deployed staging" in timeline, timeline
    assert len(browser.find_elements(By.CSS_SELECTOR, "#timeline li")) > grown
    # create, message, completion, approval request, decision, tool result, completion
    receipts = wait_until(lambda: _at_least(7, browser.find_elements(By.CSS_SELECTOR, "#receipts tbody tr")),
                          timeout=WAIT_S, message="the seven receipts")
    assert len(receipts) == 7 and all(r.find_elements(By.TAG_NAME, "td")[2].text for r in receipts)

    # Time travel: each receipt's input re-folded from the log gives the head that receipt recorded.
    for row in (receipts[1], receipts[-1]):  # the user's message; the last input
        after = row.find_elements(By.TAG_NAME, "td")[6].text.split("→")[-1].strip()
        row.find_element(By.CSS_SELECTOR, "button.travel").click()
        past = wait_until(lambda: (text := browser.find_element(By.ID, "past-head").text).startswith("after")
                          and text, timeout=WAIT_S, message="the thread as it stood")
        assert after and f"head {after}" in past, (past, after)
    wait_until(lambda: "Deployed to staging." in browser.find_element(By.ID, "past").text, timeout=WAIT_S,
               message="the last input's past, whole")
    receipts[1].find_element(By.CSS_SELECTOR, "button.travel").click()
    wait_until(lambda: "awaiting_model, 1 entries" in browser.find_element(By.ID, "past-head").text,
               timeout=WAIT_S, message="the thread as it stood after the user's message")
    assert browser.find_element(By.ID, "past").text == "user: please deploy to staging"
    _picture(browser, "ui-thread.png")


def test_html_in_a_thread_id_or_model_text_is_shown_as_text_and_runs_nothing(
        ui: Inspected, browser: WebDriver) -> None:
    browser.get(ui.url)
    # Model text is the model's to write: here it is HTML that would run if parsed as markup.
    thread = f"hostile-{uuid.uuid4().hex[:8]}"
    send(ui.deployment, thread, "hostile", "--new", "--model", "scripted")
    # A thread id no client would send (the CLI refuses it) comes raw from a hostile producer;
    # the processor refuses it too, with a receipt that names it, which the page lists.
    ui.deployment.send(Input(message_id=f"m-{uuid.uuid4().hex}", thread_id=HOSTILE_THREAD, created_at=1,
                             source="user:mallory", expires_at=None, key_id=None, signature=None,
                             body=UserMessage((TextBlock(HOSTILE_TEXT),))))
    # Shown as the text it is (a stale row, redrawn meanwhile, raises: looked at again).
    wait_until(lambda: (link := _link(browser, HOSTILE_THREAD)) is not None and link.text == HOSTILE_THREAD,
               timeout=WAIT_S, message=lambda: f"the hostile thread id in the list, as text; ui log:\n"
                                               f"{ui_log(ui)}")
    click(lambda: _link(browser, thread), "the thread's link", WAIT_S)
    wait_until(lambda: HOSTILE_TEXT in _timeline(browser), timeout=WAIT_S,
               message="the model's hostile text on the timeline, as text")
    browser.get(ui.url + "#thread=" + quote(HOSTILE_THREAD, safe=""))
    wait_until(lambda: browser.find_element(By.ID, "thread-title").text == HOSTILE_THREAD, timeout=WAIT_S,
               message="the hostile thread's page")
    wait_until(lambda: _found(browser, "#receipts tbody tr"), timeout=WAIT_S,
               message="the hostile thread's receipt")
    assert browser.find_elements(By.CSS_SELECTOR, "main img, main script") == []
    assert browser.execute_script("return window.pwned === undefined") is True


def test_a_thread_s_children_are_links_to_their_own_timelines(ui: Inspected, browser: WebDriver) -> None:
    browser.get(ui.url)
    parent = f"parent-{uuid.uuid4().hex[:8]}"
    send(ui.deployment, parent, "please split the work", "--new", "--model", "scripted")
    click(lambda: _link(browser, parent), "the parent's link", WAIT_S)
    child = wait_until(lambda: _found(browser, "#children a.thread-link"), timeout=WAIT_S,
                       message="the child's link on the parent's page")[0]
    child_id = child.get_attribute("data-thread")
    assert child_id and child_id != parent
    click(lambda: browser.find_element(By.CSS_SELECTOR, "#children a.thread-link"), "the child's link",
          WAIT_S)
    wait_until(lambda: browser.find_element(By.ID, "thread-title").text == child_id, timeout=WAIT_S,
               message="the child's page")
    wait_until(lambda: CHILD_ANSWER in _timeline(browser), timeout=WAIT_S, message="the child's answer")
    # The child inherits its parent's history up to the spawn: its own timeline starts after it.
    assert f'"parent":"{parent}"' in _timeline(browser)
    assert browser.find_element(By.ID, "missing").text.endswith(f"were inherited from the parent {parent}")
    wait_until(lambda: _found(browser, f'#thread-summary a[data-thread="{parent}"]'), timeout=WAIT_S,
               message="the link back to the parent")
