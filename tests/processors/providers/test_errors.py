"""The status table and the retry-after hint."""

from __future__ import annotations

import email.utils

import pytest

from torpor.processors.models.provider import PermanentModelError, TransientModelError
from torpor.processors.models.providers.errors import RateLimitedError, classify_status, retry_after_s


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, PermanentModelError),
        (401, PermanentModelError),
        (403, PermanentModelError),
        (404, PermanentModelError),
        (422, PermanentModelError),
        (408, TransientModelError),
        (409, TransientModelError),
        (429, RateLimitedError),
        (500, TransientModelError),
        (502, TransientModelError),
        (503, TransientModelError),
        (529, RateLimitedError),
    ],
)
def test_each_status_has_a_class(status: int, kind: type[Exception]) -> None:
    assert type(classify_status(status, "m", {})) is kind


def test_retry_after_in_seconds_milliseconds_or_a_date() -> None:
    assert retry_after_s({"Retry-After": "2"}) == 2.0
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert retry_after_s({"retry-after": date}, now=1_000_000) == 30.0
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None
    assert retry_after_s({"retry-after": "999999"}) == 3600.0
