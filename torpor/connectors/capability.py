"""The connector side of a capability: may this dispatch act at all?

Contract. Every `Dispatch` carries the thread's `Capability` snapshot (tenant, allowed
tools, scopes, expiry). The fold already refuses a model's call outside it, but a
connector is the last line before an effect: a forged, replayed or stale dispatch must
not act either. `check(dispatch, now_ms, required_scopes)` returns the refusal reason,
or None when the dispatch may act. A connector calls it before any work and, on a
refusal, answers the call with an error result naming the reason.

Only `invoke` is checked: a `cancel` or `close_thread` stops work and must never be
refused, and an `approval_decision` finishes a call whose `invoke` was already checked
(an expiry between the request and the decision is checked again by the tool).

Pure: no clock (the caller passes `now_ms`), no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from torpor.schemas.records import Dispatch


def check(dispatch: Dispatch, now_ms: int, required_scopes: Iterable[str] = ()) -> str | None:
    """Why `dispatch` must not act (a sentence for the model), or None if it may."""
    capability = dispatch.capability
    if not capability.tenant:
        return f"refused: {dispatch.tool} was dispatched without a tenant in its capability"
    if dispatch.tool not in capability.tools:
        return f"refused: {dispatch.tool} is outside the capability of tenant {capability.tenant}"
    if capability.expires_at is not None and now_ms >= capability.expires_at:
        return (f"refused: the capability of tenant {capability.tenant} expired at {capability.expires_at} "
                f"(now {now_ms})")
    missing = sorted(set(required_scopes) - set(capability.scopes))
    if missing:
        return (f"refused: {dispatch.tool} needs scope(s) {', '.join(missing)}, "
                f"not granted to tenant {capability.tenant}")
    return None
