"""Run every framed-group vector of tests/conformance/frames through the Python client's part
joiner and reducer (format: tests/conformance/README.md, "Framed groups").

A client folding a WatchLane stream applies only whole groups: after a part that continues the
state is unchanged, after a group's last part it is the group folded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from lane.client.message_parts import PartJoiner, PartsError
from lane.client.reducer import fold
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

FRAMES_DIR = Path(__file__).resolve().parent.parent / "conformance" / "frames"
VECTOR_FILES = sorted(FRAMES_DIR.glob("*.json"))


def _snapshot(value: Any) -> snapshot_pb2.LaneSnapshot:
    return json_format.ParseDict(value, snapshot_pb2.LaneSnapshot())


def test_there_are_framed_vectors_with_parts_and_an_error() -> None:
    vectors = [json.loads(path.read_text(encoding="utf-8")) for path in VECTOR_FILES]
    assert len(vectors) >= 4
    assert any(frame.get("error") for vector in vectors for frame in vector["frames"])
    for vector in vectors:
        assert vector["name"] == next(p.stem for p in VECTOR_FILES if p.stem == vector["name"])
        assert any("part" in frame["response"] for frame in vector["frames"]), vector["name"]


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_framed_vector(path: Path) -> None:
    vector = json.loads(path.read_text(encoding="utf-8"))
    snapshot = _snapshot(vector["initial"])
    joiner: PartJoiner[pb.WatchLaneResponse] = PartJoiner()
    for index, frame in enumerate(vector["frames"]):
        response = json_format.ParseDict(frame["response"], pb.WatchLaneResponse())
        if frame.get("error"):
            with pytest.raises(PartsError):
                joiner.take(response)
            assert index == len(vector["frames"]) - 1
            return
        whole = joiner.take(response)
        if whole is not None:
            assert whole.WhichOneof("item") == "event_group"
            snapshot = fold(snapshot, whole.event_group.events).snapshot
        assert snapshot == _snapshot(frame["expected"]), f"{path.stem}: frame {index}"
    assert not joiner.pending
