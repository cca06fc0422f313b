"""Fixtures of the inspector's page tests: headless Chromium (chromium.py) and a `torpor ui`
on a deployment of the test's own (rig.py). A module that needs its UI otherwise (one per
module, waited for) defines its own `ui`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from selenium.webdriver.remote.webdriver import WebDriver

from tests.inspector.chromium import chromium
from tests.inspector.rig import Inspected, inspected


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def ui(kafka_bootstrap: str, admin: AdminClient, tmp_path: Path) -> Iterator[Inspected]:
    with inspected(kafka_bootstrap, admin, tmp_path) as found:
        yield found
