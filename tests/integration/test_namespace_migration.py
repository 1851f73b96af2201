"""Migration 0004 (namespaces) on a database holding lanes written before it.

The rows are written with the schema of migrations 0001-0003, as the service of that time wrote
them; after the migration the lane is the ``default`` namespace's, whole: its transcript, its
open run with its tool call, its event log and its stored request answers.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
from lane.v1 import entries_pb2, events_pb2, lane_service_pb2, messages_pb2, snapshot_pb2

from lane.server.store import DEFAULT_NAMESPACE, LaneRef, Store
from lane.server.store.migrations import available_migrations
from lane.server.store.requests import RequestKey, replayed_answer


async def _write_pre_namespace_lane(conn: psycopg.AsyncConnection[object]) -> None:
    prompt = entries_pb2.Entry(id="e1", seq=1)
    prompt.message.message.user.content.add().text.text = "hello"
    event = events_pb2.HarnessEvent(lane_id="old-lane", revision=1)
    event.entry_added.entry.CopyFrom(prompt)
    event.commit_time.FromDatetime(datetime.now(UTC))
    answer = lane_service_pb2.StartRunResponse(operation_id="op1", revision=1)
    await conn.execute(
        "INSERT INTO lanes (lane_id, revision, tip_id, configuration, message_count,"
        " usage_totals, current_operation_id) VALUES ('old-lane', 1, 'e1', %s, 1, %s, 'op1')",
        (
            snapshot_pb2.LaneConfiguration().SerializeToString(),
            messages_pb2.Usage().SerializeToString(),
        ),
    )
    await conn.execute(
        "INSERT INTO entries (lane_id, entry_id, seq, kind, body)"
        " VALUES ('old-lane', 'e1', 1, 'message', %s)",
        (prompt.SerializeToString(),),
    )
    await conn.execute(
        "INSERT INTO events (lane_id, revision, group_end, kind, body, commit_time)"
        " VALUES ('old-lane', 1, 1, 'entry_added', %s, now())",
        (event.SerializeToString(),),
    )
    await conn.execute(
        "INSERT INTO operations (operation_id, lane_id, kind, started_time, settings, phase,"
        " continuation, turn_id) VALUES ('op1', 'old-lane', 1, now(), %s, 'turn_open',"
        " 'need_assistant', 't1')",
        (lane_service_pb2.RunSettings().SerializeToString(),),
    )
    await conn.execute(
        "INSERT INTO tool_calls (operation_id, source_index, turn_id, tool_call_id, tool_name,"
        " result_entry_id, status) VALUES ('op1', 0, 't1', 'c1', 'read', 'r1', 'planned')"
    )
    await conn.execute(
        "INSERT INTO requests (lane_id, request_id, method, request_hash, response)"
        " VALUES ('old-lane', 'req-1', 'StartRun', %s, %s)",
        (b"digest", answer.SerializeToString()),
    )


async def test_lanes_from_before_namespaces_belong_to_the_default_namespace(
    fresh_database_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(fresh_database_url, autocommit=True) as conn:
        for version, _, sql in available_migrations():
            if version < 4:
                await conn.execute(sql.encode())
        await _write_pre_namespace_lane(conn)

    store = await Store.open(fresh_database_url)
    try:
        # The migrator records versions in its own table; start it where the SQL above left off.
        async with store.pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_time timestamptz NOT NULL DEFAULT now())"
            )
            for version, name, _ in available_migrations():
                if version < 4:
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (version, name),
                    )
        applied = await store.migrate()
        assert applied[0] == "0004_namespaces.sql"
        assert all(name > "0004" for name in applied)

        lane = LaneRef(DEFAULT_NAMESPACE, "old-lane")
        snapshot = await store.snapshot(lane)
        assert [e.id for e in snapshot.transcript] == ["e1"]
        assert snapshot.operation.id == "op1"
        assert (await store.open_operation(lane)) is not None
        groups = await store.read_events(lane, 0, 10, 1 << 20)
        assert [group[0] for group in groups] == [1]
        async with store.pool.connection() as conn:
            key = RequestKey("req-1", "StartRun", b"digest")
            stored = await replayed_answer(conn, lane, key, lane_service_pb2.StartRunResponse)
            assert stored is not None and stored.operation_id == "op1"
            cur = await conn.execute(
                "SELECT DISTINCT namespace FROM tool_calls UNION SELECT namespace FROM operations"
            )
            assert await cur.fetchall() == [(DEFAULT_NAMESPACE,)]
        # In any other namespace the lane does not exist.
        assert await store.entry_exists(LaneRef("team-a", "old-lane"), "e1") is False
    finally:
        await store.close()
