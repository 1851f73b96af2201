"""What traces cost while they are off (``LANE_OTEL`` unset), beside the code without them.

Times, per call, the pieces the traces added to the hot paths, with traces off, each beside
its baseline measured in the same run: the RPC wrapper (``instrument.observed``) beside the
same wrapper without the span check; the store's transaction span beside a bare ``with`` of a
null context; a watcher's delivery span likewise. Then the same pieces with traces on (a
tracer provider with no exporter, so only the SDK's span work is counted), for scale. Prints;
asserts nothing. About two seconds::

    python -m bench.traces_off
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from bench.micro import per_await, per_call
from lane.server import logs, traces
from lane.server.api.instrument import method_metrics, observed


async def handler(data: Any, context: Any) -> Any:
    return data


def baseline_observed(method: str) -> Callable[[Any, Any], Awaitable[Any]]:
    """``observed``'s unary wrapper as it was before traces: scope, timing, metrics."""
    answers = method_metrics(method)

    async def unary_rpc(data: Any, context: Any) -> Any:
        with logs.request_scope(method):
            start = time.perf_counter()
            code = "UNKNOWN"
            try:
                answer = await handler(data, context)
                code = "OK"
                return answer
            finally:
                answers.answered(code, "", time.perf_counter() - start)

    return unary_rpc


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


async def measure(label: str) -> None:
    wrapped = observed("BenchMethod", False, handler)
    base = baseline_observed("BenchMethod")
    context: Any = _Context()
    null = contextlib.nullcontext()

    def bare_with() -> None:
        with null:
            pass

    def transaction() -> None:
        with traces.transaction("command", "default", "lane-1"):
            pass

    def delivery() -> None:
        with traces.delivery(1, 2, "feed"):
            pass

    rpc = await per_await(lambda: wrapped(b"", context))
    spans = per_call(transaction), per_call(delivery)
    rpc_base = await per_await(lambda: base(b"", context))
    bare = per_call(bare_with)
    print(f"traces {label}:")
    print(f"  RPC wrapper        {rpc:7.3f} µs/call   baseline (no span check) {rpc_base:7.3f}")
    print(f"  transaction span   {spans[0]:7.3f} µs/call   baseline (bare with) {bare:7.3f}")
    print(f"  delivery span      {spans[1]:7.3f} µs/call   baseline (bare with) {bare:7.3f}")


async def main() -> None:
    assert traces.tracer is None
    await measure("off (the default)")
    traces.enable(TracerProvider())  # no span processor: the SDK's own cost only
    try:
        await measure("on, no exporter (for scale)")
    finally:
        traces.disable()


if __name__ == "__main__":
    asyncio.run(main())
