"""The domain's input values (domain/run_inputs.py) use the contract's numbers: each of its
enums has exactly the values and names of its lane.v1 enum, so values pass between the
requests and the domain unchanged."""

from __future__ import annotations

from enum import IntEnum

import pytest
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper
from lane.v1 import lane_service_pb2 as pb

from lane.server.domain.run_inputs import Cause, Delivery, Replay, ToolExecution


@pytest.mark.parametrize(
    ("ours", "theirs", "prefix"),
    [
        (Delivery, pb.DeliveryMode, "DELIVERY_MODE_"),
        (ToolExecution, pb.ToolExecution, "TOOL_EXECUTION_"),
        (Replay, pb.ReplayPolicy, "REPLAY_POLICY_"),
        (Cause, pb.SyntheticCause, "SYNTHETIC_CAUSE_"),
    ],
)
def test_the_domain_enums_are_the_contracts(
    ours: type[IntEnum], theirs: EnumTypeWrapper, prefix: str
) -> None:
    contract = {name.removeprefix(prefix): value for name, value in theirs.items()}
    assert {member.name: member.value for member in ours} == contract
