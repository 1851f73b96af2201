"""JSON texts (tool arguments, result details) come back from the service byte for byte:
through validation, the store, the event log and the capture, whatever their spacing, key
order, escapes, or integers beyond 2^53 and 2^64 (docs/contract.md: free-form JSON round-trips
unchanged). The schema side (every ``*_json`` field is text) is tests/unit/test_json_fields.py.
"""

from __future__ import annotations

import pytest
from lane.client.testing import LaneScript

from tests.support.lanes import Probe, kinds

pytestmark = pytest.mark.asyncio(loop_scope="session")

BIG = 2**53 + 1  # the first integer a double cannot hold
HUGE = 2**64 + 7  # beyond int64 and uint64

#: JSON objects as a client might send them; each must come back exactly so.
TEXTS = [
    '{"n":1,"f":1.0,"zero_float":0.0}',
    f'{{"big":{BIG},"huge":{HUGE},"neg_huge":-{HUGE}}}',
    '{"ratio":0.1,"exp":1e-7,"large":1.7976931348623157e308}',
    '{"nested":{"list":[1,2.5,"three",null,true,false,{"deep":[[]]}],"empty":{}}}',
    '{"path":"docs/\u00e9t\u00e9.md","snow":"\u2603","emoji":"\U0001f600"}',
    '{"escaped":"docs/\\u00e9t\\u00e9.md","quote":"\\"","nl":"a\\nb","ctrl":"\\u0001"}',
    '{ "spaced" : [ 1 , 2 ] ,\n  "order": "kept", "z": 1, "a": 0 }',
]


@pytest.mark.parametrize("json_text", TEXTS)
async def test_json_texts_come_back_byte_for_byte(lane_stub, json_text: str) -> None:
    lane = await LaneScript.create(lane_stub, prefix="json")
    probe = Probe(lane_stub, lane.lane_id)
    await probe.start()
    run = await lane.start_run("go")
    turn = await run.turn("calling", tool_calls=[("c1", "t", json_text)])
    await probe.check()
    call = await turn.call("c1").start(json_text).progress("half", details_json=json_text)
    running = await probe.check(["c1"])
    await call.stage("done", details_json=json_text)
    events = await probe.check(["c1"])
    # The assistant's tool call block, as settled and as captured.
    blocks = [
        block.tool_call
        for entry in probe.snapshot.transcript
        if entry.WhichOneof("payload") == "message"
        and entry.message.message.WhichOneof("message") == "assistant"
        for block in entry.message.message.assistant.content
        if block.WhichOneof("block") == "tool_call"
    ]
    assert [b.arguments_json for b in blocks] == [json_text]
    # The effective arguments and the progress details, in the events.
    assert kinds(running) == ["tool_start", "tool_update"]
    assert running[0].tool_start.arguments_json == json_text
    assert running[1].tool_update.partial_result.details_json == json_text
    # The staged result and the placed entry.
    assert events[0].tool_end.result.details_json == json_text
    placed = probe.snapshot.transcript[-1].message.message.tool_result
    assert placed.tool_call_id == "c1" and placed.details_json == json_text
