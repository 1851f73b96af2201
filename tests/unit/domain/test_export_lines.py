"""The bounds of one export file line, read before it is parsed whole: its length, the JSON
values it holds (counted without the strings, which may hold commas), its nesting; and the
header's counters within the room a lane needs to go on counting."""

from __future__ import annotations

import pytest

from lane.server.domain.errors import InvalidArgument
from lane.server.domain.export_format import (
    MAX_COUNTER,
    MAX_LINE_BYTES,
    MAX_LINE_VALUES,
    parse_header,
    parse_object,
)


def refusal(raw: bytes) -> str:
    with pytest.raises(InvalidArgument) as raised:
        parse_object(raw, 7)
    assert raised.value.reason == "INVALID_EXPORT"
    assert raised.value.metadata["line"] == "7"
    return raised.value.metadata["problem"]


def test_a_line_over_the_value_limit_is_refused_before_it_is_parsed() -> None:
    values = b",".join([b"0"] * (MAX_LINE_VALUES + 2))
    assert "more than 1000000 JSON values" in refusal(b'{"entry":[' + values + b"]}")


def test_commas_inside_strings_are_not_values() -> None:
    # Far more commas than the limit, all inside one string: one value, parsed.
    text = "," * (MAX_LINE_VALUES + 10)
    assert parse_object(b'{"entry":{"text":"' + text.encode() + b'"}}', 1) == {
        "entry": {"text": text}
    }


def test_a_line_over_the_length_limit_is_refused() -> None:
    assert "longer than" in refusal(b'{"x":"' + b"a" * MAX_LINE_BYTES + b'"}')


def test_deep_nesting_is_refused_not_raised() -> None:
    assert "nested too deeply" in refusal(b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_nan_and_infinity_are_not_json() -> None:
    assert "not JSON" in refusal(b'{"x":NaN}')
    assert "not JSON" in refusal(b'{"x":-Infinity}')


def header(revision: object, floor: object = "0", version: object = 1) -> bytes:
    return (
        b'{"format":"lane.v1.export","version":'
        + repr(version).lower().encode()
        + b',"laneId":"l","revision":'
        + (f'"{revision}"' if isinstance(revision, str) else str(revision)).encode()
        + b',"retentionFloor":"'
        + str(floor).encode()
        + b'"}'
    )


@pytest.mark.parametrize(
    "revision", [str(MAX_COUNTER + 1), str(2**63 - 1), "-1", "4_2", " 42", "+42", "1e3", 4.0]
)
def test_a_revision_out_of_range_or_not_an_integer_is_refused(revision: object) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_header(header(revision))
    assert "revision must be an integer" in raised.value.message


def test_the_header_takes_counters_up_to_the_bound() -> None:
    parsed = parse_header(header(str(MAX_COUNTER), MAX_COUNTER))
    assert (parsed.revision, parsed.retention_floor) == (MAX_COUNTER, MAX_COUNTER)
    assert parse_header(header(42)).revision == 42  # a JSON integer is taken too
