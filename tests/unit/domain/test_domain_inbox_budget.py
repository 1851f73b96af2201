"""The inbox budget (MAX_INBOX_BYTES, RESOURCE_EXHAUSTED ``QUEUE_FULL``): what stays refused for
size besides payloads and counts. An enqueue that brings the inbox to the budget exactly is
accepted; one byte more is refused and changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lane.v1 import snapshot_pb2

from lane.server.domain import lanes
from lane.server.domain.errors import ResourceExhausted
from lane.server.domain.limits import MAX_INBOX_BYTES, MAX_PAYLOAD_BYTES
from lane.server.domain.state import evolve
from tests.unit.domain.support import LANE, default_configuration, queued_message

NOW = datetime(2025, 1, 1, tzinfo=UTC)
NEXT_RUN = snapshot_pb2.QUEUE_KIND_NEXT_RUN


def sized_item(index: int, size: int) -> snapshot_pb2.QueuedItem:
    """A queued message of exactly ``size`` bytes encoded."""
    text = size - queued_message(f"q{index:04d}", NEXT_RUN, "").ByteSize()
    # Length varints grow with the text: try lengths, and an entry id a byte longer.
    for entry_id in (f"q{index:04d}", f"q{index:05d}"):
        for length in range(max(0, text - 16), text + 1):
            item = queued_message(entry_id, NEXT_RUN, "x" * length)
            if item.ByteSize() == size:
                return item
    raise AssertionError(f"no item of {size} bytes")


def test_the_inbox_takes_its_budget_to_the_byte() -> None:
    created = lanes.create_lane(LANE, default_configuration(), NOW).state
    item_bytes = MAX_PAYLOAD_BYTES - 4096
    full, rest = divmod(MAX_INBOX_BYTES, item_bytes)
    inbox = tuple(sized_item(i, item_bytes) for i in range(full))
    state = evolve(created, inbox=inbox)

    with pytest.raises(ResourceExhausted) as refused:
        lanes.enqueue(state, sized_item(full, rest + 1), NOW)
    assert refused.value.reason == "QUEUE_FULL"
    assert refused.value.metadata["bytes"] == str(MAX_INBOX_BYTES + 1)
    assert refused.value.metadata["limit"] == str(MAX_INBOX_BYTES)
    assert state.inbox == inbox

    accepted = lanes.enqueue(state, sized_item(full, rest), NOW)
    assert sum(item.ByteSize() for item in accepted.state.inbox) == MAX_INBOX_BYTES
    assert len(accepted.state.inbox) == full + 1
