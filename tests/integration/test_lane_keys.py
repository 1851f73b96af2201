"""Every statement the service sends about a lane names the lane by its key, and no transaction
touches two lanes: so the tables can be distributed by (namespace, lane id), each command on
one shard (docs/deploying.md).

The test records every statement the store and the hub send (psycopg is wrapped in this
process, where the server runs) while the fuzzer drives every RPC through many lane states,
then holds each one to the rule. The only exceptions are the statements marked as lane scans
(maintenance, ListLanes, the hub's poll).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import grpc
import pytest
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.store import LANE_SCAN
from tests.integration.lanes import new_lane_id, user
from tests.integration.servers import extra_server
from tests.integration.statements import Statement, recording
from tests.integration.test_export_import import import_file
from tests.outage.fuzzing import fuzz

LANE_TABLES = ("lanes", "entries", "inbox", "operations", "tool_calls", "usage_rows", "events",
               "requests")  # fmt: skip
_TABLE = re.compile(r"\b(" + "|".join(LANE_TABLES) + r")\b")
_DDL = re.compile(r"^\s*(CREATE|ALTER|DROP|LISTEN|SET|INSERT INTO schema_migrations)\b", re.I)


def lane_key(statement: Statement) -> tuple[str, str] | None:
    """The lane a statement names through its ``%(ns)s`` / ``%(lane)s`` parameters."""
    params = statement.params
    if isinstance(params, dict) and "ns" in params and "lane" in params:
        return params["ns"], params["lane"]
    return None


def problems(statements: list[Statement]) -> list[str]:
    found: list[str] = []
    lanes_of: dict[int, set[tuple[str, str]]] = {}
    for statement in statements:
        sql = statement.sql
        if sql.startswith(LANE_SCAN) or _DDL.match(sql) or not _TABLE.search(sql):
            continue
        key = lane_key(statement)
        if key is None:
            found.append(f"names no lane: {sql[:160]}")
            continue
        # Every reference to a lane table is constrained by the lane id (a join on namespace
        # and operation id alone would reach other lanes' rows, on other shards).
        if sql.count("lane_id") < len(_TABLE.findall(sql)):
            found.append(f"a table without its lane id: {sql[:200]}")
        if statement.transaction is not None:
            lanes_of.setdefault(statement.transaction, set()).add(key)
    found += [
        f"transaction {tx} spans lanes {sorted(lanes)}"
        for tx, lanes in lanes_of.items()
        if len(lanes) > 1
    ]
    return found


@pytest.mark.slow  # the fuzzer drives 1,500 requests
@pytest.mark.asyncio(loop_scope="session")
async def test_every_statement_names_one_lane(
    fresh_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Recording starts once the server is up (its migrations are not lane statements).
    async with (
        extra_server(fresh_database_url) as (running, stub),
        recording(monkeypatch) as recorder,
    ):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
        try:
            await fuzz(channel, stub, requests=1500, batch_size=50, seed_value=1306)
            # The maintenance scans and the reconciler's commands, once more while recording.
            await running.store.reconcile_orphans(orphan_after=timedelta(0))
        finally:
            await channel.close()
    # The run reached the commands it should have (else the rule was checked on nothing).
    assert sum(1 for s in recorder.statements if "events_added AS" in s.sql) > 300
    assert any("tool_calls" in s.sql and "INSERT" in s.sql for s in recorder.statements)
    assert any(s.sql.startswith(LANE_SCAN) for s in recorder.statements)
    found = problems(recorder.statements)
    assert not found, f"{len(found)} statements break the lane-key rule:\n" + "\n".join(
        sorted(set(found))[:30]
    )


@pytest.mark.asyncio(loop_scope="session")
async def test_an_import_with_queued_messages_names_its_lane(
    lane_stub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the fuzzer (when it drew an import of a lane with queued messages): the
    # import's INSERT INTO inbox named the lane by positional parameters.
    source, copy = new_lane_id("keys-queued"), new_lane_id("keys-imported")
    await lane_stub.CreateLane(pb.CreateLaneRequest(lane_id=source))
    for text in ("one", "two"):
        await lane_stub.EnqueueMessage(
            pb.EnqueueMessageRequest(
                lane_id=source, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user(text)
            )
        )
    pieces = lane_stub.ExportLane(pb.ExportLaneRequest(lane_id=source))
    file = b"".join([piece.data async for piece in pieces])
    async with recording(monkeypatch) as recorder:
        await import_file(lane_stub, copy, file, 1 << 16)
    inserts = [s for s in recorder.statements if s.sql.startswith("INSERT INTO inbox")]
    assert [lane_key(s) for s in inserts] == [("default", copy)] * 2
    assert not problems(recorder.statements)


def test_the_rule_catches_a_statement_without_its_lane() -> None:
    # The checker itself: statements that reach past their lane are reported.
    statements = [
        Statement("SELECT * FROM tool_calls WHERE namespace = %s AND operation_id = %s", ("n", "o"),
                  None),
        Statement("SELECT * FROM lanes l JOIN operations o"
                  " ON o.operation_id = l.current_operation_id"
                  " WHERE l.namespace = %(ns)s AND l.lane_id = %(lane)s",
                  {"ns": "n", "lane": "a"}, None),
        Statement("UPDATE lanes SET revision = 1 WHERE namespace = %(ns)s AND lane_id = %(lane)s",
                  {"ns": "n", "lane": "a"}, 7),
        Statement("UPDATE lanes SET revision = 1 WHERE namespace = %(ns)s AND lane_id = %(lane)s",
                  {"ns": "n", "lane": "b"}, 7),
        Statement(LANE_SCAN + "SELECT lane_id FROM lanes", None, None),
    ]  # fmt: skip
    found = problems(statements)
    assert len(found) == 3
    assert found[0].startswith("names no lane")
    assert found[1].startswith("a table without its lane id")
    assert found[2] == "transaction 7 spans lanes [('n', 'a'), ('n', 'b')]"
