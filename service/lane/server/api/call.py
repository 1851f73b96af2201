"""One RPC being served: its method and its gRPC context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True)
class Call:
    """The RPC a handler serves: ``method`` is its name in the service descriptor (the one
    place RPC names come from: servicer.py registers each handler under it)."""

    method: str
    context: Context
    #: The answer may go in parts (DriveLane): it is not bound by one message.
    framed: bool = False
