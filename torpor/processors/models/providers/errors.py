"""The provider failures the model seam does not name, and how HTTP failures map onto it.

Everything here is a subclass of the seam's own classes (`torpor.processors.models.provider`), so
the model stage, which retries `TransientModelError` and fails on `PermanentModelError`,
needs no change to handle them::

    ModelError
    ├── TransientModelError          retry after a backoff
    │   ├── RateLimitedError         429 / overloaded / Bedrock throttling; `retry_after_s` if given
    │   ├── StreamStalledError       no chunk within the stall timeout
    │   └── IncompleteStreamError    the stream ended without its final message
    └── PermanentModelError          400, 401, 403, 404, 422: fix the request or the settings

`classify_status(status, message, headers)` is the one table from an HTTP status to a
class; every adapter calls it, so OpenAI-compatible servers, Anthropic and Bedrock agree
on what a 409 or a 529 means. Bedrock names its failures by an error code instead
(`x-amzn-ErrorType`, or an exception event inside a stream): `classify_bedrock` reads
that first and falls back on the status. It takes strings, not botocore's exceptions,
so this module imports no AWS library and every other provider runs without one.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Final

from torpor.processors.models.provider import ModelError, PermanentModelError, TransientModelError


class RateLimitedError(TransientModelError):
    """The provider asked us to slow down. `retry_after_s` is its hint, if it gave one.

    The model stage waits at least that long before the next attempt (up to its
    `StageConfig.max_retry_after_s`); waiting less only earns another 429.
    """

    kind = "rate_limited"

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StreamStalledError(TransientModelError):
    """No chunk arrived within the stall timeout; the partial turn was discarded."""

    kind = "stalled"


class IncompleteStreamError(TransientModelError):
    """The stream ended (or dropped) before its final message; the partial turn was discarded."""

    kind = "incomplete"


# Statuses a retry may cure: timeouts, conflicts (a concurrent request on the same
# resource), rate limits, server errors and Anthropic's 529 "overloaded".
_TRANSIENT_STATUSES: Final = frozenset({408, 409, 425, 429})
# A retry-after longer than this is a quota reset rather than a pause; we still report it,
# but cap it so one header cannot park a thread's retries for a day.
_MAX_RETRY_AFTER_S: Final = 3600.0


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The server's retry hint in seconds, from `retry-after-ms` or `retry-after`, or None.

    `retry-after` may be seconds or an HTTP date (RFC 9110); an unparseable value is no hint.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return min(max(float(raw_ms) / 1000.0, 0.0), _MAX_RETRY_AFTER_S)
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        return min(max(float(raw), 0.0), _MAX_RETRY_AFTER_S)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    moment = time.time() if now is None else now
    return min(max(when.timestamp() - moment, 0.0), _MAX_RETRY_AFTER_S)


def classify_status(status: int, message: str, headers: Mapping[str, str]) -> ModelError:
    """The model error for an HTTP error `status` (4xx or 5xx) with the server's `message`."""
    if status == 429:
        return RateLimitedError(f"rate limited (429): {message}", retry_after_s(headers))
    if status == 529:  # Anthropic: overloaded, which is a rate limit on the whole service
        return RateLimitedError(f"overloaded (529): {message}", retry_after_s(headers))
    if status in _TRANSIENT_STATUSES or status >= 500:
        return TransientModelError(f"server error ({status}): {message}")
    return PermanentModelError(f"request refused ({status}): {message}")


# Bedrock's error codes, lower-cased: an HTTP error names them `ThrottlingException`, an
# exception event inside a stream `throttlingException` (the stream member's name).
_BEDROCK_RATE_LIMITED: Final = frozenset({"throttlingexception", "servicequotaexceededexception"})
_BEDROCK_TRANSIENT: Final = frozenset(
    {
        "internalserverexception",
        "modelstreamerrorexception",
        "serviceunavailableexception",
        "modelnotreadyexception",
        "modeltimeoutexception",
    }
)
_BEDROCK_PERMANENT: Final = frozenset(
    {
        "validationexception",
        "accessdeniedexception",
        "resourcenotfoundexception",
        "unrecognizedclientexception",
        "invalidsignatureexception",
    }
)


def classify_bedrock(code: str, message: str, status: int | None, headers: Mapping[str, str]) -> ModelError:
    """The model error for a Bedrock failure with error `code` (either spelling) and `message`.

    `status` is the HTTP status, or None for an exception event inside a stream (whose
    status is the stream's 200). An unknown code is judged by its status; with neither,
    it is transient, since a stream that broke for an unnamed reason may work next time.
    """
    named = f"{code}: {message}" if code else message
    lowered = code.lower()
    if lowered in _BEDROCK_RATE_LIMITED:
        return RateLimitedError(named, retry_after_s(headers))
    if lowered in _BEDROCK_TRANSIENT:
        return TransientModelError(named)
    if lowered in _BEDROCK_PERMANENT:
        return PermanentModelError(f"{named} (fix the request, the model id or the AWS permissions)")
    if status is not None and status >= 400:
        return classify_status(status, named, headers)
    return TransientModelError(named)
