"""The LaneService servicer: the RPC groups together, WatchLane, WatchLanes, and registration."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError, Message
from lane.limits import MAX_MESSAGE_BYTES
from lane.v1 import lane_service_pb2 as pb

from lane.server.api.answer_size import answer_too_large
from lane.server.api.auth import Authenticator, caller_namespace
from lane.server.api.call import Call, Context
from lane.server.api.drive import DriveRpcs
from lane.server.api.encoded_counts import check_encoded_counts
from lane.server.api.errors import lane_error_status, unary
from lane.server.api.fair_shares import ShareSettings
from lane.server.api.framing import serialize
from lane.server.api.harness_rpcs import HarnessRpcs
from lane.server.api.history_rpcs import HistoryRpcs
from lane.server.api.instrument import binding_ids, observed
from lane.server.api.lane_lists import lane_filter
from lane.server.api.lane_rpcs import LaneRpcs
from lane.server.api.ownership_rpcs import OwnershipRpcs
from lane.server.api.run_rpcs import RunRpcs
from lane.server.api.tool_rpcs import ToolRpcs
from lane.server.api.transfer_rpcs import TransferRpcs
from lane.server.api.validation import check_counts, check_message, require_id
from lane.server.api.watch import WatchSettings, watch_lane
from lane.server.api.watch_lanes import watch_lanes
from lane.server.domain.errors import InvalidArgument
from lane.server.hub import Hub
from lane.server.store import Store


class LaneServicer(
    LaneRpcs,
    HistoryRpcs,
    RunRpcs,
    ToolRpcs,
    OwnershipRpcs,
    HarnessRpcs,
    TransferRpcs,
    DriveRpcs,
):
    """Implements lane.v1.LaneService on a :class:`Store` and a :class:`Hub`."""

    @unary
    def WatchLane(self, request: pb.WatchLaneRequest, call: Call) -> Awaitable[None]:
        lane = self.lane(request.lane_id)
        require_id(request.incarnation, "incarnation", optional=True)
        return watch_lane(
            self.watcher_reads,
            self.hub,
            self.watcher_shares,
            lane,
            request,
            call.context,
            self.watch_settings,
            self.write_deadline,
        )

    @unary
    def WatchLanes(self, request: pb.WatchLanesRequest, call: Call) -> Awaitable[None]:
        check_message(request, "")  # unknown statuses
        lanes = lane_filter(request.lane_id_prefix, request.statuses, request.lane_ids)
        return watch_lanes(
            self.watcher_reads,
            self.hub.lane_changes,
            self.watcher_shares,
            caller_namespace(),
            lanes,
            call.context,
            self.watch_settings,
            self.write_deadline,
        )


def _method_handlers(servicer: LaneServicer) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Handlers for every LaneService method, built from the service descriptor: the
    servicer's method of the same name serves it, with a :class:`Call` naming it (so the
    method's name is spelled once, in its ``def``; a method the servicer lacks fails here).

    Built here rather than by the generated ``add_LaneServiceServicer_to_server`` so WatchLane
    can send pre-encoded event frames (see framing.py) through a pass-through serializer.
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in pb.DESCRIPTOR.services_by_name["LaneService"].methods:
        if method.client_streaming and not method.server_streaming:
            # ImportLane: the file in pieces; the handler authenticates and decodes them itself.
            handlers[method.name] = grpc.stream_unary_rpc_method_handler(
                observed(method.name, False, getattr(servicer, method.name)),
                response_serializer=serialize,
            )
            continue
        if method.client_streaming:
            # DriveLane: many commands on one stream, each served by its unary handler
            # (drive.py), which authenticates the stream and decodes each message itself.
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                observed(method.name, True, getattr(servicer, method.name)),
                response_serializer=serialize,
            )
            continue
        # observed: log scope, metrics; binding_ids: the decoded request's ids into the scope.
        decoding = _decoding(
            binding_ids(
                _serving(method.name, getattr(servicer, method.name)),
                streaming=method.server_streaming,
            ),
            message_factory.GetMessageClass(method.input_type),
            servicer.authenticator,
        )
        if not method.server_streaming:
            decoding = _within_one_message(method.name, decoding)
        implementation = observed(method.name, method.server_streaming, decoding)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        # Requests arrive as bytes and are authenticated and decoded by _decoding, so
        # undecodable bytes get INVALID_ARGUMENT rather than the UNKNOWN a failing
        # deserializer would produce.
        handlers[method.name] = make(implementation, response_serializer=serialize)
    return handlers


# The wrappers below between the outermost (observed) and the servicer's method return the
# next one's awaitable instead of awaiting it: no coroutine frame of their own stays alive for
# the life of a stream. An idle WatchLane stream is mostly its chain of frames, and a process
# holds thousands of them.


def _serving(
    method: str, handler: Callable[[Any, Call], Awaitable[Any]]
) -> Callable[[Any, Context], Awaitable[Any]]:
    def serve(request: Any, context: Context) -> Awaitable[Any]:
        return handler(request, Call(method, context))

    return serve


def _within_one_message(
    method: str, implementation: Callable[[bytes, Context], Awaitable[Any]]
) -> Callable[[bytes, Context], Awaitable[Any]]:
    """A unary RPC's answer, encoded (the serializer passes bytes through), or its refusal
    when it is over the message limit (answer_size.py)."""

    async def handler(data: bytes, context: Context) -> Any:
        answer = await implementation(data, context)
        if not isinstance(answer, Message):
            return answer
        encoded = answer.SerializeToString()
        if len(encoded) > MAX_MESSAGE_BYTES:
            await context.abort_with_status(
                lane_error_status(answer_too_large(method, len(encoded)))
            )
        return encoded

    return handler


def _decoding(
    implementation: Callable[[Any, Context], Awaitable[Any]],
    request_type: type[Message],
    authenticator: Authenticator,
) -> Callable[[bytes, Context], Awaitable[Any]]:
    def handler(data: bytes, context: Context) -> Awaitable[Any]:
        refusal = authenticator.admit(context.invocation_metadata())
        if refusal is not None:
            return context.abort_with_status(refusal)
        try:
            # A large request's counts are read from its bytes first: decoding costs per element.
            check_encoded_counts(data, request_type)
            try:
                request = request_type.FromString(data)
            except DecodeError:
                raise InvalidArgument(
                    "MALFORMED_REQUEST",
                    f"the request is not a valid {request_type.DESCRIPTOR.name}",
                ) from None
            # Counted before any handler walks it: an over-numerous request is refused in
            # time bounded by the count limits (validation.check_counts).
            check_counts(request)
        except InvalidArgument as error:
            return context.abort_with_status(lane_error_status(error))
        return implementation(request, context)

    return handler


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LaneService"].full_name


def add_lane_service(
    server: grpc.aio.Server,
    store: Store,
    hub: Hub,
    watch_settings: WatchSettings | None = None,
    authenticator: Authenticator | None = None,
    shares: ShareSettings | None = None,
) -> LaneServicer:
    """Register the LaneService on ``server`` (without an ``authenticator``, auth is off)."""
    servicer = LaneServicer(
        store, hub, watch_settings or WatchSettings(), authenticator or Authenticator({}), shares
    )
    handlers = _method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    return servicer
