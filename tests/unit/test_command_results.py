"""A command answers with its RPC's response message, and that message is the form its answer
is recorded in under the request id: a retry returns the first answer, the same bytes
(service/lane/server/commands/base.py)."""

from __future__ import annotations

import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2

from lane.server.commands import harness, lanes, ownership, runs, tools
from lane.server.commands.base import Command, recording
from lane.server.store.requests import RequestKey

SERVICE = pb.DESCRIPTOR.services_by_name["LaneService"]
COMMANDS = {
    name: member
    for module in (lanes, runs, tools, ownership, harness)
    for name, member in vars(module).items()
    if isinstance(member, Command)
}


def _rpc(name: str) -> str:
    return "".join(word.capitalize() for word in name.split("_"))


def test_every_command_module_has_commands() -> None:
    assert len(COMMANDS) >= 22


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_answers_with_its_rpcs_response(name: str) -> None:
    method = SERVICE.methods_by_name[_rpc(name)]
    assert COMMANDS[name].response.DESCRIPTOR is method.output_type


def test_an_answer_is_recorded_as_itself() -> None:
    staged = messages_pb2.ToolResultMessage(tool_call_id="c0", tool_name="read", is_error=True)
    staged.content.add().text.text = "done"
    answer = pb.StageToolOutcomeResponse(
        staged_revision=7,
        revision=9,
        placed_tool_call_ids=["c0", "c1"],
        batch_complete=True,
        cancel_requested=True,
        staged=staged,
    )
    recorded = recording(RequestKey("r", "StageToolOutcome", b"d"), pb.StageToolOutcomeResponse)
    assert recorded is not None and recorded.form is pb.StageToolOutcomeResponse
    stored = recorded.encode(answer).SerializeToString(deterministic=True)
    again = recorded.decode(pb.StageToolOutcomeResponse.FromString(stored))
    assert again == answer
    assert again.SerializeToString(deterministic=True) == stored


def test_without_a_request_id_nothing_is_recorded() -> None:
    assert recording(None, pb.StartRunResponse) is None
