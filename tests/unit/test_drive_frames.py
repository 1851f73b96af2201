"""DriveLane's wire format (service/lane/server/api/drive_frames.py): a request read at its top
level agrees with protobuf's decoding, and answer messages stay within their bounds and decode
to the answers they were built from, in order. The Python session's reading of the service's
batch header (clients/python/lane/client/session.py)."""

from __future__ import annotations

from lane.client.session import _batch_bound
from lane.limits import DRIVE_BATCH_HEADER, MAX_DRIVE_BATCH, MAX_MESSAGE_BYTES
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.drive_frames import (
    MAX_TOP_FIELDS,
    Answer,
    answer,
    answer_messages,
    read_request,
)
from lane.server.api.framing import length_delimited

BATCH = pb.DriveLaneRequest.DESCRIPTOR.fields_by_name["batch"].number
CREATE = pb.DriveLaneResponse.DESCRIPTOR.fields_by_name["create_lane"].number


def create(sequence: int, lane: str = "l") -> pb.DriveLaneRequest:
    return pb.DriveLaneRequest(sequence=sequence, create_lane=pb.CreateLaneRequest(lane_id=lane))


def test_a_single_request_is_read_as_protobuf_decodes_it() -> None:
    data = create(7).SerializeToString()
    read = read_request(data)
    assert (read.sequence, read.command, read.batch, read.malformed) == (7, True, [], False)
    # Fields repeated: the last sequence wins, as when decoding.
    read = read_request(data + pb.DriveLaneRequest(sequence=9).SerializeToString())
    assert read.sequence == pb.DriveLaneRequest.FromString(data + b"\x08\x09").sequence == 9


def test_a_batch_is_read_as_the_spans_of_its_requests() -> None:
    message = pb.DriveLaneRequest(sequence=3, batch=[create(1, "a"), create(2, "b")])
    data = message.SerializeToString()
    read = read_request(data)
    assert (read.sequence, read.command, read.malformed, read.too_many) == (3, False, False, False)
    inner = [pb.DriveLaneRequest.FromString(data[start:end]) for start, end in read.batch]
    assert inner == list(message.batch)


def test_the_walk_stops_one_past_the_batch_bound_and_at_padding() -> None:
    entry = length_delimited(BATCH, create(1).SerializeToString())
    assert not read_request(entry * MAX_DRIVE_BATCH).too_many
    over = read_request(entry * (MAX_DRIVE_BATCH + 1000))
    assert over.too_many and len(over.batch) == MAX_DRIVE_BATCH
    padded = read_request(b"\x08\x01" * (MAX_TOP_FIELDS + 1))
    assert padded.malformed and padded.sequence == 1


def test_broken_encodings_are_malformed_with_the_sequence_read_before() -> None:
    for data in (b"\xff\xff\xff", b"\x08\x05\x1a\x10abc", b"\x08\x05\x0b", b"\x08\x05\x08"):
        read = read_request(data)
        assert read.malformed, data
        assert read.sequence == (5 if data.startswith(b"\x08\x05") else 0), data


def _decoded(messages: list[tuple[bytes, int]]) -> list[pb.DriveLaneResponse]:
    answers: list[pb.DriveLaneResponse] = []
    for data, count in messages:
        assert len(data) <= MAX_MESSAGE_BYTES
        message = pb.DriveLaneResponse.FromString(data)
        got = list(message.batch) or [message]
        assert len(got) == count and count <= MAX_DRIVE_BATCH
        assert (count == 1) == (not message.batch)  # one answer alone goes as itself
        answers += got
    return answers


def _created(sequence: int, padding: int = 0) -> Answer:
    body = pb.CreateLaneResponse(created=True).SerializeToString()
    return answer(sequence, CREATE, body + length_delimited(999, b"x" * padding))


def test_answers_are_batched_in_order_within_the_count_bound() -> None:
    answers = [_created(n) for n in range(1, 71)]
    messages = list(answer_messages(answers))
    assert [count for _, count in messages] == [MAX_DRIVE_BATCH, 70 - MAX_DRIVE_BATCH]
    assert [a.sequence for a in _decoded(messages)] == list(range(1, 71))


def test_answers_are_batched_within_the_message_limit() -> None:
    big = MAX_MESSAGE_BYTES // 3
    answers = [_created(n, big) for n in range(1, 6)]
    messages = list(answer_messages(answers))
    assert [count for _, count in messages] == [2, 2, 1]
    assert [a.sequence for a in _decoded(messages)] == [1, 2, 3, 4, 5]


def test_an_answer_too_large_for_a_batch_goes_alone() -> None:
    alone = _created(2, MAX_MESSAGE_BYTES - 17)
    # It fits a message of its own, not a batch entry (its tag and length: 6 bytes more).
    assert alone.size <= MAX_MESSAGE_BYTES < alone.size + 6
    messages = list(answer_messages([_created(1), alone, _created(3)]))
    assert [count for _, count in messages] == [1, 1, 1]
    assert [a.sequence for a in _decoded(messages)] == [1, 2, 3]


def test_the_session_batches_only_after_the_services_header() -> None:
    assert _batch_bound(None) == 1  # an older service: no header
    assert _batch_bound((("other", "5"),)) == 1
    assert _batch_bound(((DRIVE_BATCH_HEADER, "16"),)) == 16
    assert _batch_bound(((DRIVE_BATCH_HEADER, "1000"),)) == MAX_DRIVE_BATCH
    assert _batch_bound(((DRIVE_BATCH_HEADER, "many"),)) == 1
