"""What every RPC group shares: the store and hub, a request's lane and request key, and the
RPC of a command (:func:`command_rpc`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from lane.server.api import validation as v
from lane.server.api.auth import Authenticator, caller_namespace
from lane.server.api.call import Call
from lane.server.api.errors import unary
from lane.server.api.fair_shares import FairShares, ShareLimits, ShareSettings
from lane.server.api.watch import WatchSettings
from lane.server.api.watcher_reads import WatcherReads
from lane.server.api.write_deadline import WriteDeadline
from lane.server.commands.base import Address, AnyCommand
from lane.server.commands.transfer import TransferUsage
from lane.server.hub import Hub
from lane.server.store import LaneRef, Store
from lane.server.store.requests import RequestKey

Q = TypeVar("Q", bound=Message)
R = TypeVar("R", bound=Message)


class ServicerBase:
    """The servicer's state; the RPC groups are mixins over it. Each RPC is one method named
    as in the service descriptor, taking the decoded request and its :class:`Call`."""

    def __init__(
        self,
        store: Store,
        hub: Hub,
        watch_settings: WatchSettings,
        authenticator: Authenticator,
        shares: ShareSettings | None = None,
    ) -> None:
        self.store = store
        self.hub = hub
        self.watch_settings = watch_settings
        self.watcher_reads = WatcherReads(store, watch_settings.max_concurrent_reads)
        self.write_deadline = WriteDeadline(watch_settings.write_deadline_seconds)
        #: What this server's exports and imports hold (commands/transfer.py).
        self.transfers = TransferUsage()
        self.authenticator = authenticator
        shares = shares or ShareSettings()
        #: WatchLane streams, DriveLane sessions, ExportLane and ImportLane calls, each capped
        #: per process and per namespace (fair_shares.py).
        self.watcher_shares = FairShares(
            "watchers",
            "TOO_MANY_WATCHERS",
            ShareLimits(
                watch_settings.max_watchers_per_process, watch_settings.max_watchers_per_namespace
            ),
            watch_settings.full_retry_seconds,
        )
        self.session_shares = FairShares(
            "sessions", "TOO_MANY_SESSIONS", shares.sessions, shares.retry_seconds
        )
        self.transfer_shares = FairShares(
            "transfers", "TOO_MANY_TRANSFERS", shares.transfers, shares.retry_seconds
        )

    @staticmethod
    def lane(lane_id: str) -> LaneRef:
        """The caller's lane ``lane_id`` (validated), in the namespace its token admits it to."""
        v.require_id(lane_id, "lane_id")
        return LaneRef(caller_namespace(), lane_id)

    @classmethod
    def addressed(cls, call: Call, request: Any) -> tuple[LaneRef, RequestKey | None]:
        """A command request's lane and request key (None without a request id), its lane id
        then its request id validated; the key names the call's method."""
        lane = cls.lane(request.lane_id)
        request_id = getattr(request, "request_id", "")  # lease renewal/release have none
        v.require_id(request_id, "request_id", optional=True)
        return lane, RequestKey.of(call.method, request, request_id)


def command_rpc(
    command: AnyCommand[Q, R], check: Callable[[Q], None] | None = None
) -> Callable[[ServicerBase, Q, Call], Awaitable[R]]:
    """The unary RPC of a command: ``check`` refuses a malformed request (all but its lane id
    and request id, checked after it), then ``command`` runs on the request's lane under its
    key; its response is the RPC's answer."""

    async def rpc(servicer: ServicerBase, request: Q, call: Call) -> R:
        if check is not None:
            check(request)
        lane, key = servicer.addressed(call, request)
        return await command(servicer.store, Address(lane, key), request)

    return unary(rpc)
