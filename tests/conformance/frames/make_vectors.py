"""Write the framed-group vectors of this folder from event vectors of the folder above.

Each framed vector takes a hand-written event vector (its ``source``), commits its steps as
event groups (``groups``: how many events each holds), and sends each group as the service
would to a watcher with a small message limit: a group over the limit in parts
(lane.v1.MessagePart). The expected state after a group's last frame is the source's
hand-written ``expected`` after the group's last event; after a part that continues, the state
is unchanged. So nothing here is produced by a reducer. Run from the repo root:

    python tests/conformance/frames/make_vectors.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from lane.v1 import events_pb2
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.framing import event_group_frame
from lane.server.api.message_parts import split_watch

HERE = Path(__file__).resolve().parent
SOURCES = HERE.parent
#: name: (source vector, events per group, message limit, whether a heartbeat cuts in).
VECTORS: dict[str, tuple[str, list[int], int, bool]] = {
    "framed-run-lifecycle-one-group": ("full-run-lifecycle", [12], 256, False),
    "framed-parallel-batch-two-groups": ("parallel-batch-early-settle", [1, 8, 9], 300, False),
    "framed-synthetic-outcome-small-parts": ("synthetic-start-end-one-group", [3], 64, False),
    "framed-heartbeat-between-parts-is-an-error": ("sequential-batch", [13], 256, True),
}


def _json(message: Any) -> Any:
    return json_format.MessageToDict(message)


def main() -> None:
    for name, (source, groups, limit, cut) in VECTORS.items():
        vector = json.loads((SOURCES / f"{source}.json").read_text(encoding="utf-8"))
        steps = vector["steps"]
        assert sum(groups) == len(steps), name
        frames: list[dict[str, Any]] = []
        state = vector["initial"]
        at = 0
        for count in groups:
            group = steps[at : at + count]
            at += count
            events = [json_format.ParseDict(s["event"], events_pb2.HarnessEvent()) for s in group]
            encoded = event_group_frame([e.SerializeToString() for e in events])
            parts = list(split_watch(encoded, limit))
            for index, frame in enumerate(parts):
                response = pb.WatchLaneResponse.FromString(frame)
                last = index == len(parts) - 1
                expected = group[-1]["expected"] if last else state
                frames.append({"response": _json(response), "expected": expected})
                if cut and index == 0 and len(parts) > 1:
                    heartbeat = pb.WatchLaneResponse(heartbeat=pb.Heartbeat(head_revision=1))
                    frames.append({"response": _json(heartbeat), "error": True})
                    break
            if cut:
                break
            state = group[-1]["expected"]
        out = {
            "name": name,
            "description": (
                f"The events of {source} committed as groups of {groups} events, sent with a "
                f"{limit}-byte message limit: a group over it comes in parts, applied only whole"
                + ("; a message between the parts of a group breaks the protocol." if cut else ".")
            ),
            "source": source,
            "initial": vector["initial"],
            "frames": frames,
        }
        text = json.dumps(out, indent=2, ensure_ascii=False) + "\n"
        (HERE / f"{name}.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
