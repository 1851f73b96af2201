"""Messages over the message limit in parts: the server's split (api/message_parts.py) is
byte-exact at its edges, and the client's joiner (lane.client.message_parts) gives back the
whole message and nothing before it."""

from __future__ import annotations

import pytest
from lane.client.message_parts import PartJoiner, PartsError
from lane.limits import MAX_MESSAGE_BYTES
from lane.v1 import events_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.message_parts import split_answer, split_watch


def group_of(size: int) -> bytes:
    """An encoded WatchLaneResponse (one event group) of exactly ``size`` bytes."""
    found = sized_group(size)
    if found is None:
        raise AssertionError(f"no group of {size} bytes")
    return found


def sized_group(size: int) -> bytes | None:
    """An encoded WatchLaneResponse of exactly ``size`` bytes, if this shape has one (where
    a length varint grows by a byte, a size or two is skipped)."""
    event = events_pb2.HarnessEvent(lane_id="lane-1", revision=1)
    event.handler_error.error = ""
    base = pb.WatchLaneResponse(event_group=pb.EventGroup(events=[event])).ByteSize()
    filler = size - base
    # Length varints grow with the text: try lengths and a second field until it is exact.
    for stack in (None, "", "s"):
        if stack is None:
            event.handler_error.ClearField("stack")
        else:
            event.handler_error.stack = stack
        for text in range(max(0, filler - 16), filler + 1):
            event.handler_error.error = "x" * text
            encoded = pb.WatchLaneResponse(event_group=pb.EventGroup(events=[event]))
            if encoded.ByteSize() == size:
                return encoded.SerializeToString()
    return None


def join(frames: list[bytes]) -> pb.WatchLaneResponse:
    joiner: PartJoiner[pb.WatchLaneResponse] = PartJoiner()
    whole = None
    for index, frame in enumerate(frames):
        whole = joiner.take(pb.WatchLaneResponse.FromString(frame))
        if index < len(frames) - 1:
            assert whole is None, "a whole message before its last part"
    assert whole is not None
    assert not joiner.pending
    return whole


@pytest.mark.parametrize("limit", [MAX_MESSAGE_BYTES, 4096, 200])
def test_a_group_exactly_at_the_limit_is_one_frame_as_it_is(limit: int) -> None:
    message = group_of(limit)
    frames = list(split_watch(message, limit))
    assert frames == [message]
    assert frames[0] is message  # no copy on the common path


@pytest.mark.parametrize("limit", [MAX_MESSAGE_BYTES, 4096, 200])
def test_one_byte_over_the_limit_goes_in_two_parts_each_within_it(limit: int) -> None:
    message = group_of(limit + 1)
    frames = list(split_watch(message, limit))
    assert len(frames) == 2
    assert all(len(frame) <= limit for frame in frames)
    # The first part is as large as the limit allows: the frame is the limit to the byte.
    assert len(frames[0]) == limit
    assert join(frames).SerializeToString() == message


@pytest.mark.parametrize("limit", [MAX_MESSAGE_BYTES, 65_536, 300])
def test_many_times_the_limit_goes_in_parts_each_within_it(limit: int) -> None:
    message = group_of(limit * 7 + 13)
    frames = list(split_watch(message, limit))
    assert len(frames) == 8
    assert all(len(frame) <= limit for frame in frames)
    assert all(len(frame) == limit for frame in frames[:-1])
    parts = [pb.WatchLaneResponse.FromString(frame).part for frame in frames]
    assert [part.continues for part in parts] == [True] * 7 + [False]
    assert b"".join(part.data for part in parts) == message
    assert join(frames) == pb.WatchLaneResponse.FromString(message)


def test_every_size_around_the_part_boundaries_splits_within_the_limit() -> None:
    limit = 150
    tried = 0
    for size in range(limit - 3, 3 * limit + 3):
        message = sized_group(size)
        if message is None:
            continue
        tried += 1
        frames = list(split_watch(message, limit))
        assert all(len(frame) <= limit for frame in frames), size
        assert len(frames) == 1 or all(len(frame) == limit for frame in frames[:-1]), size
        assert join(frames).SerializeToString() == message
    assert tried > 2 * limit


def test_a_drive_answer_over_the_limit_goes_in_parts_of_its_own_type() -> None:
    answer = pb.DriveLaneResponse(sequence=7)
    answer.get_operation.state.operation_id = "op-1"
    answer.get_operation.state.assistant.model = "m" * 5000
    message = answer.SerializeToString()
    frames = list(split_answer(message, 1000))
    assert len(frames) > 5
    assert all(len(frame) <= 1000 for frame in frames)
    joiner: PartJoiner[pb.DriveLaneResponse] = PartJoiner()
    taken = [joiner.take(pb.DriveLaneResponse.FromString(frame)) for frame in frames]
    assert taken[:-1] == [None] * (len(frames) - 1)
    assert taken[-1] == answer
    assert taken[-1] is not None and taken[-1].sequence == 7


def test_a_whole_message_between_parts_breaks_the_protocol() -> None:
    frames = list(split_watch(group_of(1000), 300))
    joiner: PartJoiner[pb.WatchLaneResponse] = PartJoiner()
    assert joiner.take(pb.WatchLaneResponse.FromString(frames[0])) is None
    heartbeat = pb.WatchLaneResponse(heartbeat=pb.Heartbeat(head_revision=1))
    with pytest.raises(PartsError):
        joiner.take(heartbeat)


def test_parts_that_do_not_decode_break_the_protocol() -> None:
    joiner: PartJoiner[pb.WatchLaneResponse] = PartJoiner()
    broken = pb.WatchLaneResponse(part=pb.MessagePart(data=b"\xff\xff\xff"))
    with pytest.raises(PartsError):
        joiner.take(broken)
    with pytest.raises(PartsError):
        joiner.take(pb.WatchLaneResponse(part=pb.MessagePart(data=b"", continues=True)))
