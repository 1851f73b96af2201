"""A run's settings between the domain's value and the contract's message (lane.v1.RunSettings):
the form the store keeps them in, and the form requests and GetOperation carry."""

from __future__ import annotations

from lane.v1 import lane_service_pb2 as pb

from lane.server.domain.run_inputs import RunSettings


def settings_of(message: pb.RunSettings) -> RunSettings:
    """The domain's value of a RunSettings message."""
    return RunSettings(
        tool_execution=message.tool_execution,
        steering_mode=message.steering_mode,
        follow_up_mode=message.follow_up_mode,
    )


def settings_message(settings: RunSettings) -> pb.RunSettings:
    """The RunSettings message of the domain's value."""
    return pb.RunSettings(
        tool_execution=pb.ToolExecution.ValueType(settings.tool_execution),
        steering_mode=pb.DeliveryMode.ValueType(settings.steering_mode),
        follow_up_mode=pb.DeliveryMode.ValueType(settings.follow_up_mode),
    )
