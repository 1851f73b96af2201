"""Run every language-neutral conformance vector in tests/conformance through the reducer.

Each ``*.json`` file there is one vector (format: tests/conformance/README.md). A vector added
later is picked up without code changes: the test is parametrized by file name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from lane.client.reducer import EVENT_KINDS, apply, fold
from lane.v1 import events_pb2, snapshot_pb2

CONFORMANCE_DIR = Path(__file__).resolve().parent.parent / "conformance"
VECTOR_FILES = sorted(CONFORMANCE_DIR.glob("*.json"))
VECTOR_KEYS = {"name", "description", "initial", "steps"}
STEP_KEYS = {"event", "expected", "rebase"}


def _load(path: Path) -> dict[str, Any]:
    vector = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(vector, dict)
    return vector


def _snapshot(value: Any) -> snapshot_pb2.LaneSnapshot:
    return json_format.ParseDict(value, snapshot_pb2.LaneSnapshot())


def _event(value: Any) -> events_pb2.HarnessEvent:
    return json_format.ParseDict(value, events_pb2.HarnessEvent())


def _as_json(message: Message) -> str:
    return json_format.MessageToJson(message, indent=1, ensure_ascii=False)


def test_there_are_enough_vectors() -> None:
    assert len(VECTOR_FILES) >= 30


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector(path: Path) -> None:
    vector = _load(path)
    snapshot = _snapshot(vector["initial"])
    events = []
    for index, step in enumerate(vector["steps"]):
        event = _event(step["event"])
        expected = _snapshot(step["expected"])
        events.append(event)
        before = snapshot.SerializeToString(deterministic=True)

        reduction = apply(snapshot, event)

        assert snapshot.SerializeToString(deterministic=True) == before, "input was mutated"
        assert reduction.snapshot == expected, (
            f"step {index} ({event.WhichOneof('kind')}): got\n{_as_json(reduction.snapshot)}\n"
            f"expected\n{_as_json(expected)}"
        )
        assert reduction.rebase is step["rebase"], f"step {index}: rebase flag"
        snapshot = reduction.snapshot

    # Folding the whole sequence at once gives the last expected state.
    folded = fold(_snapshot(vector["initial"]), events)
    assert folded.snapshot == _snapshot(vector["steps"][-1]["expected"])
    assert folded.rebase is any(step["rebase"] for step in vector["steps"])


@pytest.mark.parametrize("path", VECTOR_FILES, ids=lambda p: p.stem)
def test_vector_is_well_formed_and_canonical(path: Path) -> None:
    """Files follow the README: known keys, name = file stem, canonical protobuf JSON.

    Canonical means exactly what ``MessageToDict`` prints (lowerCamelCase names, int64 as
    strings, enum names, default values omitted), so a reader in any language sees each value
    in one spelling and an unknown or misspelt field fails here instead of being ignored.
    """
    vector = _load(path)
    assert set(vector) == VECTOR_KEYS
    assert vector["name"] == path.stem
    assert isinstance(vector["description"], str) and vector["description"]
    assert vector["steps"], "a vector has at least one step"
    assert json_format.MessageToDict(_snapshot(vector["initial"])) == vector["initial"]
    for step in vector["steps"]:
        assert set(step) == STEP_KEYS
        assert isinstance(step["rebase"], bool)
        assert json_format.MessageToDict(_event(step["event"])) == step["event"]
        assert json_format.MessageToDict(_snapshot(step["expected"])) == step["expected"]


def test_vectors_cover_every_event_kind() -> None:
    kinds_in_proto = {
        field.name for field in events_pb2.HarnessEvent.DESCRIPTOR.oneofs_by_name["kind"].fields
    }
    assert len(kinds_in_proto) == 28
    assert kinds_in_proto == EVENT_KINDS
    seen = set()
    for path in VECTOR_FILES:
        for step in _load(path)["steps"]:
            kind = _event(step["event"]).WhichOneof("kind")
            if kind is not None:
                seen.add(kind)
    assert seen == kinds_in_proto
