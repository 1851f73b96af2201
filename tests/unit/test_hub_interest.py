"""The announcements hubs exchange about the lanes their watchers follow."""

from __future__ import annotations

import time

import pytest

from lane.server.hub import interest
from lane.server.store import LaneRef


def test_announcements_carry_every_lane_within_the_payload_limit() -> None:
    lanes = [LaneRef("team-a", f"lane-{n:05d}-" + "x" * 100) for n in range(500)]
    payloads = interest.announcements(lanes)
    assert len(payloads) > 1
    assert all(len(p.encode()) <= interest.MAX_PAYLOAD_BYTES + 1 for p in payloads)
    heard = interest.RemoteInterest()
    for payload in payloads:
        assert payload.startswith(interest.ANNOUNCE)
        heard.heard(payload)
    assert all(heard.watched(lane) for lane in lanes)
    assert not heard.watched(LaneRef("team-b", lanes[0].lane_id))


def test_lane_ids_with_slashes_and_pluses_round_trip() -> None:
    lane = LaneRef("ns", "a/b+c z")
    assert interest.rung_lane(interest.doorbell(lane)) == lane
    heard = interest.RemoteInterest()
    heard.heard(interest.announcements([lane])[0])
    assert heard.watched(lane)


def test_an_announcement_lapses_unless_refreshed(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    heard = interest.RemoteInterest()
    lane = LaneRef("ns", "lane")
    heard.heard(interest.announcements([lane])[0])
    now[0] += interest.TTL_SECONDS - 1
    assert heard.watched(lane)
    heard.heard(interest.announcements([lane])[0])  # refreshed
    now[0] += interest.TTL_SECONDS - 1
    assert heard.watched(lane)
    now[0] += 2
    assert not heard.watched(lane)


def test_no_announcement_for_no_lanes() -> None:
    assert interest.announcements([]) == []


def test_a_namespace_announced_whole_counts_every_lane_of_it_as_watched() -> None:
    heard = interest.RemoteInterest()
    (payload,) = interest.announcements([interest.whole("team-a"), LaneRef("team-b", "one")])
    heard.heard(payload)
    assert heard.watched(LaneRef("team-a", "any-lane-at-all"))
    assert heard.watched(LaneRef("team-b", "one"))
    assert not heard.watched(LaneRef("team-b", "two"))
    assert not heard.watched(LaneRef("team-c", "any-lane-at-all"))
