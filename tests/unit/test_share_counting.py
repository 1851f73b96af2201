"""Fair shares (service/lane/server/api/fair_shares.py): slots counted per namespace and per
process, refused past either cap with the kind's reason, given back once."""

from __future__ import annotations

import pytest

from lane.server.api.fair_shares import FairShares, ShareLimits
from lane.server.domain.errors import ResourceExhausted


def shares() -> FairShares:
    return FairShares("sessions", "TOO_MANY_SESSIONS", ShareLimits(3, 2), retry_seconds=1.5)


def test_a_namespace_at_its_cap_is_refused_while_another_still_gets_a_slot() -> None:
    kind = shares()
    held = [kind.acquire("a"), kind.acquire("a")]
    with pytest.raises(ResourceExhausted) as caught:
        kind.acquire("a", laneId="x")
    refusal = caught.value
    assert refusal.reason == "TOO_MANY_SESSIONS"
    assert refusal.metadata == {"laneId": "x", "scope": "namespace", "sessions": "2", "limit": "2"}
    assert refusal.retry_after_seconds == 1.5
    held.append(kind.acquire("b"))
    assert (kind.held("a"), kind.held("b"), kind.held()) == (2, 1, 3)
    # The process is full: every namespace is refused now, on the process's account.
    with pytest.raises(ResourceExhausted) as caught:
        kind.acquire("c")
    assert caught.value.metadata["scope"] == "process"
    assert kind.refusal("c") is not None


def test_a_slot_is_given_back_once() -> None:
    kind = shares()
    with kind.acquire("a") as share:
        assert kind.held("a") == 1
    share.release()  # again: nothing
    assert (kind.held("a"), kind.held()) == (0, 0)
    assert kind.refusal("a") is None


def test_a_namespace_cap_no_lower_than_the_process_cap_is_the_process_cap() -> None:
    # One namespace (auth off, or one token's): its cap is the process's, and so is a refusal.
    kind = FairShares("sessions", "TOO_MANY_SESSIONS", ShareLimits(1, 1))
    kind.acquire("default")
    refusal = kind.refusal("default")
    assert refusal is not None and refusal.metadata["scope"] == "process"
