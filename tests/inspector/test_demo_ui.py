"""The README's flow: `torpor demo --ui` (what `bin/demo --ui` runs), then the page, in a real browser.

Against a real broker: the demo's checked run, then its second agent waiting for an
approval, then the inspector the demo started with its operator key. In headless
Chromium: both of the demo's threads are listed; the waiting one opens, its approve
button is pressed, the decision's receipt is `applied`, and the agent resumes and
answers; "fork from here" on its first entry makes a new thread that starts with that
entry and says where it was forked from. Then SIGINT ends the demo (page and processes)
cleanly and its topics go.
`TORPOR_UI_SCREENSHOTS=docs` saves the pictures the README and docs/ui.md show.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from confluent_kafka.admin import AdminClient
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.inspector.chromium import click, picture, thread_row
from tests.processors.test_processor import TORPOR
from tests.waiting import wait_until
from torpor.cli.demo import DEPLOYED_ANSWER, FINAL_ANSWER

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

WAIT_S: Final = 180.0


class _Demo:
    """`torpor demo --ui --port 0` as a process, its output in a file."""

    def __init__(self, bootstrap: str, root: Path) -> None:
        self.out = root / "demo.out"
        with self.out.open("wb") as sink:
            self.process = subprocess.Popen([TORPOR, "demo", "--ui", "--port", "0", "--bootstrap", bootstrap],
                                            stdout=sink, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def tail(self) -> str:
        return self.output()[-3000:]


@pytest.fixture
def demo(kafka_bootstrap: str, tmp_path: Path) -> Iterator[_Demo]:
    running = _Demo(kafka_bootstrap, tmp_path)
    try:
        yield running
    finally:
        if running.process.poll() is None:  # the test failed before it stopped the demo
            running.process.send_signal(signal.SIGINT)  # the demo stops its own processes
            try:
                running.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                running.process.kill()
                running.process.wait(timeout=60)


def _timeline(driver: WebDriver) -> str:
    return driver.find_element(By.ID, "timeline").text


def test_after_the_demo_the_page_shows_its_threads_approving_resumes_the_agent_and_it_forks(
        demo: _Demo, browser: WebDriver, admin: AdminClient) -> None:
    found = wait_until(lambda: re.search(r"== the inspector: (http://\S+/)", demo.output()), timeout=WAIT_S,
                       message=f"the demo's inspector address; demo output:\n{demo.tail()}")
    url = found.group(1)
    out = demo.output()
    assert "checked: 7 inputs, 7 receipts (all applied, 7 signed and verified)" in out, out[-3000:]
    assert FINAL_ANSWER in out
    run_id = re.search(r"topics demo\.(\w+)\.\*", out)
    assert run_id is not None, out[:500]
    builder, deployer = f"build-agent-{run_id.group(1)}", f"deploy-agent-{run_id.group(1)}"
    assert f"{deployer} waits for your approval" in out

    browser.get(url)
    wait_until(lambda: thread_row(browser, builder) and thread_row(browser, deployer), timeout=WAIT_S,
               message="the demo's two threads in the list")
    wait_until(lambda: browser.find_element(By.ID, "whoami").text.startswith("operator:demo (signed)"),
               timeout=WAIT_S, message="the page's operator: the demo's, signed")
    try:
        wait_until(lambda: "live" in browser.find_element(By.ID, "feed").text, timeout=WAIT_S,
                   message="the page's feed caught up")
    except AssertionError as late:  # say what the page said instead, and what the demo logged
        raise AssertionError(f"{late}; the page's feed line: {browser.find_element(By.ID, 'feed').text!r}; "
                             f"demo output:\n{demo.tail()}") from None
    # The lag panel watches the demo's processor (the demo names its group to the page): p0.
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, '#members tr[data-instance="p0"]'),
               timeout=WAIT_S, message="the demo's processor p0 among the instances")
    assert f"group demo-{run_id.group(1)}" in browser.find_element(By.ID, "lag-group").text
    picture(browser, "ui-demo-threads.png")

    click(lambda: (row := thread_row(browser, deployer))
          and row.find_element(By.CSS_SELECTOR, "a.thread-link"), "the waiting agent's link", WAIT_S)
    wait_until(lambda: "approval_requested" in _timeline(browser), timeout=WAIT_S,
               message="the approval request on the waiting agent's timeline")
    approve = '#approvals button[data-choice="approve"]'
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, approve), timeout=WAIT_S,
               message="the approve button")
    # create, message, completion, approval request: their receipts, all there before the picture
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#receipts tbody tr")) == 4, timeout=WAIT_S,
               message="the waiting agent's four receipts")
    picture(browser, "ui-demo-approval.png")
    click(lambda: browser.find_element(By.CSS_SELECTOR, approve), "the approve button", WAIT_S)
    action = wait_until(
        lambda: next((a for a in browser.find_elements(By.CSS_SELECTOR, "#actions li")
                      if a.get_attribute("data-disposition")), None),
        timeout=WAIT_S, message=f"the decision's receipt on the page; demo output:\n{demo.tail()}")
    assert action.get_attribute("data-disposition") == "applied", action.text
    assert "sent as operator:demo" in action.text, action.text
    wait_until(lambda: DEPLOYED_ANSWER in _timeline(browser), timeout=WAIT_S,
               message=f"the agent's answer after the approval; demo output:\n{demo.tail()}")
    assert "result deploy ok" in _timeline(browser) and "deployed web" in _timeline(browser)
    # The demo's transcript shows it too; the decision, the tool's result and the completion were
    # all applied and verified against the run's key ring (the operator key signed the decision).
    after = wait_until(lambda: (later := demo.output().split("== the inspector")[1]).count(" receipt ") >= 3
                       and later, timeout=WAIT_S, message=f"three receipts in the transcript:\n{demo.tail()}")
    assert re.search(r"decision +approve by operator:demo\n", after), after
    receipts = [line for line in after.splitlines() if " receipt " in line]
    assert len(receipts) == 3 and all(re.search(r"receipt +applied .* verified$", r) for r in receipts), after

    # Fork the agent from its first entry: a new thread with that history, going on from there.
    browser.get(url + "#thread=" + deployer)
    wait_until(lambda: DEPLOYED_ANSWER in _timeline(browser), timeout=WAIT_S,
               message="the agent's page again")
    click(lambda: next(iter(browser.find_elements(
        By.CSS_SELECTOR, '#timeline li[data-seq="0"] button.fork')), None), "entry #0's fork button", WAIT_S)
    forked = wait_until(
        lambda: next((a for a in browser.find_elements(By.CSS_SELECTOR, "#actions li")
                      if a.get_attribute("data-fork") and a.get_attribute("data-disposition")), None),
        timeout=WAIT_S, message=f"the fork control's receipt on the page; demo output:\n{demo.tail()}")
    assert forked.get_attribute("data-disposition") == "applied", forked.text
    fork = forked.get_attribute("data-fork")
    forked.find_element(By.CSS_SELECTOR, f'a.thread-link[data-thread="{fork}"]').click()
    wait_until(lambda: browser.find_element(By.ID, "missing").text
               == f"forked from {deployer} at entry #0 by operator:demo", timeout=WAIT_S,
               message="the fork's page, saying where it came from")
    source_first = wait_until(lambda: next(iter(browser.find_elements(
        By.CSS_SELECTOR, '#timeline li[data-kind="inherited"]')), None), timeout=WAIT_S,
        message="the fork's inherited entry")
    assert "#0 user:" in source_first.text, source_first.text

    demo.process.send_signal(signal.SIGINT)
    assert demo.process.wait(timeout=WAIT_S) == 0, demo.tail()
    assert "done: the inspector and every process stopped cleanly" in demo.output(), demo.tail()
    prefix = f"demo.{run_id.group(1)}."
    wait_until(lambda: not [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)],
               timeout=60, message=f"the demo's topics {prefix}* deleted")
