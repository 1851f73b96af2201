"""A command's typed result and its proto form (the response message an answer is recorded in
and sent as) map one to the other exactly: a retry decodes the first answer and sends the same
bytes (service/lane/server/commands/base.py)."""

from __future__ import annotations

import inspect
from dataclasses import fields
from typing import Any

import pytest
from google.protobuf.message import Message
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import messages_pb2, snapshot_pb2

from lane.server.commands import harness, lanes, ownership, runs, tools
from lane.server.commands.base import Result

RESULTS = sorted(
    {
        member
        for module in (lanes, runs, tools, ownership, harness)
        for _, member in inspect.getmembers(module, inspect.isclass)
        if issubclass(member, Result) and member is not Result
    },
    key=lambda cls: cls.__name__,
)


def test_every_command_module_has_results() -> None:
    assert len(RESULTS) >= 26


@pytest.mark.parametrize("result_type", RESULTS, ids=lambda cls: cls.__name__)
def test_a_result_names_fields_of_its_response(result_type: type[Result[Any]]) -> None:
    names = set(result_type.response.DESCRIPTOR.fields_by_name)
    assert {field.name for field in fields(result_type)} <= names


def _same(message: Message, result_type: type[Result[Any]]) -> None:
    again = result_type.from_proto(message).to_proto()
    assert again == message
    assert again.SerializeToString(deterministic=True) == message.SerializeToString(
        deterministic=True
    )


def test_a_full_answer_round_trips() -> None:
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
    _same(answer, tools.OutcomeStaged)


def test_an_absent_message_field_stays_absent() -> None:
    _same(pb.StartRunResponse(operation_id="op", revision=3), runs.RunStarted)
    leased = pb.StartRunResponse(operation_id="op", revision=3, lease=pb.Lease(token=1))
    _same(leased, runs.RunStarted)
    # A present but empty message stays present.
    _same(pb.EndRunResponse(result=snapshot_pb2.OperationResult(), revision=1), runs.RunEnded)
    _same(pb.ReleaseLeaseResponse(), ownership.LeaseReleased)


def test_a_result_builds_its_response() -> None:
    planned = pb.PlannedToolCall(tool_call_id="c0", tool_name="t", source_index=1)
    settled = runs.AssistantSettled(
        entry_id="e", revision=4, tool_calls=(planned,), cancel_requested=False
    )
    assert settled.to_proto() == pb.SettleAssistantMessageResponse(
        entry_id="e", revision=4, tool_calls=[planned]
    )
