"""Group commit (service/lane/server/store/group_commit.py): commands of different lanes ready at
the same moment share one PostgreSQL transaction, each is committed exactly once, and one that
fails or conflicts does not fail its neighbours."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from lane.v1 import lane_service_pb2 as pb
from lane.v1 import snapshot_pb2

from lane.server.commands.base import Address
from lane.server.commands.lanes import create_lane, enqueue_message
from lane.server.domain.errors import AlreadyExists
from lane.server.store import DEFAULT_NAMESPACE, LaneRef, Store, group_commit, group_write
from lane.server.store.group_write import GroupFailed
from lane.server.store.requests import RequestKey
from tests.integration.lanes import hand_edit, new_lane_id, user

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def own_store(fresh_database_url: str) -> AsyncIterator[Store]:
    """A store of its own: its group commit counters count this test's commands only."""
    store = await Store.open(fresh_database_url)
    try:
        await store.migrate()
        yield store
    finally:
        await store.close()


async def new_lanes(store: Store, count: int, prefix: str) -> list[LaneRef]:
    """``count`` new lanes, each kept in the store's memory (its next command is optimistic)."""
    lanes = [LaneRef(DEFAULT_NAMESPACE, new_lane_id(prefix)) for _ in range(count)]
    for lane in lanes:
        await create_lane(store, Address(lane, None), pb.CreateLaneRequest(lane_id=lane.lane_id))
    return lanes


def enqueue(
    lane: LaneRef, note: str, request: RequestKey | None = None
) -> tuple[Address, pb.EnqueueMessageRequest]:
    """EnqueueMessage's address and request: ``note`` for the next run."""
    queued = pb.EnqueueMessageRequest(
        lane_id=lane.lane_id, kind=snapshot_pb2.QUEUE_KIND_NEXT_RUN, message=user(note)
    )
    return Address(lane, request), queued


async def inbox(store: Store, lane: LaneRef) -> tuple[int, list[tuple[str, str]]]:
    """The lane's revision and inbox as stored: (entry id, text) in order. A lane created and
    enqueued to n times is at revision 1 + n: a command written twice would show there even
    where its item, under the same entry id, would not."""
    snapshot = await store.snapshot(lane)
    items = [(item.entry_id, item.message.user.content[0].text.text) for item in snapshot.queues]
    return snapshot.revision, items


async def test_commands_of_many_lanes_ready_together_share_transactions(
    own_store: Store,
) -> None:
    lanes = await new_lanes(own_store, 12, "group")
    committer = own_store.committer
    transactions, statements = committer.transactions, committer.statements
    answers: dict[LaneRef, list[tuple[str, str]]] = {lane: [] for lane in lanes}
    for round_ in range(3):
        notes = [f"{lane.lane_id} round {round_}" for lane in lanes]
        queued = await asyncio.gather(
            *(
                enqueue_message(own_store, *enqueue(lane, note))
                for lane, note in zip(lanes, notes, strict=True)
            )
        )
        for lane, note, answer in zip(lanes, notes, queued, strict=True):
            answers[lane].append((answer.entry_id, note))
    committed = committer.statements - statements
    shared = committer.transactions - transactions
    assert committed == 36, "every command went through the group committer once"
    assert shared <= committed // 2, f"{committed} commands in {shared} transactions"
    for lane in lanes:
        # Exactly once each, in order: nothing lost, nothing written twice.
        assert await inbox(own_store, lane) == (1 + 3, answers[lane])


async def test_a_conflict_inside_a_group_fails_no_neighbour(own_store: Store) -> None:
    lanes = await new_lanes(own_store, 6, "conflict")
    moved, reused = lanes[0], lanes[1]
    async with hand_edit(own_store) as conn:
        # Behind the store's back: the kept copy of `moved` is now stale (its statement writes
        # nothing and the command runs again under the lock)...
        await conn.execute(
            "UPDATE lanes SET version = version + 1 WHERE namespace = %s AND lane_id = %s",
            moved,
        )
        # ... and `reused` has an answer under request id "dup" for another request: its
        # statement fails on the primary key, which aborts the group's transaction.
        await conn.execute(
            "INSERT INTO requests (namespace, lane_id, request_id, method, request_hash,"
            " response) VALUES (%s, %s, 'dup', 'EnqueueMessage', %s, '')",
            (*reused, hashlib.sha256(b"another request").digest()),
        )
    committer = own_store.committer
    retried = committer.retried_groups
    key = RequestKey("dup", "EnqueueMessage", hashlib.sha256(b"this request").digest())
    commands = [
        enqueue(lane, f"{lane.lane_id} once", key if lane == reused else None) for lane in lanes
    ]
    outcomes = await asyncio.gather(
        *(enqueue_message(own_store, *command) for command in commands), return_exceptions=True
    )
    assert committer.retried_groups > retried, "the failed statement shared a group"
    refused = outcomes[1]
    assert isinstance(refused, AlreadyExists) and refused.reason == "REQUEST_ID_REUSED"
    assert await inbox(own_store, reused) == (1, [])
    for lane, outcome in zip(lanes, outcomes, strict=True):
        if lane == reused:
            continue
        assert not isinstance(outcome, BaseException), outcome
        # Committed exactly once: the moved lane's under its lock, the others' in the group
        # that went again without the failed statement.
        assert await inbox(own_store, lane) == (2, [(outcome.entry_id, f"{lane.lane_id} once")])


async def test_a_lone_command_commits_in_a_transaction_of_its_own(own_store: Store) -> None:
    (lane,) = await new_lanes(own_store, 1, "alone")
    committer = own_store.committer
    transactions, statements = committer.transactions, committer.statements
    for n in range(3):
        await enqueue_message(own_store, *enqueue(lane, f"note {n}"))
    assert committer.transactions - transactions == 3
    assert committer.statements - statements == 3


async def test_a_statement_that_fails_before_it_is_sent_fails_alone(
    own_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    lanes = await new_lanes(own_store, 4, "unsent")
    real = psycopg.AsyncConnection.execute
    seen: list[dict[str, Any]] = []

    async def failing(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        if isinstance(query, str) and query.startswith("WITH lane AS"):
            seen.append(params)
            if len(seen) == 2:
                # The group's first statement is out already, in its open transaction.
                raise psycopg.InterfaceError("could not send the statement")
        return await real(self, query, params, **kw)

    def declined(*args: Any) -> Any:
        raise GroupFailed()  # the one-write path declines: the group goes statement by statement

    with monkeypatch.context() as patch:
        patch.setattr(group_commit, "write_group", declined)
        patch.setattr(psycopg.AsyncConnection, "execute", failing)
        outcomes = await asyncio.gather(
            *(enqueue_message(own_store, *enqueue(lane, "once")) for lane in lanes),
            return_exceptions=True,
        )
    loser = LaneRef(seen[1]["ns"], seen[1]["lane"])
    for lane, outcome in zip(lanes, outcomes, strict=True):
        if lane == loser:
            assert isinstance(outcome, psycopg.InterfaceError)
            assert await inbox(own_store, lane) == (1, [])
        else:
            # The statement sent before the failure was rolled back with the group and sent
            # again: written once, not twice.
            assert not isinstance(outcome, BaseException), outcome
            assert await inbox(own_store, lane) == (2, [(outcome.entry_id, "once")])


async def test_a_lane_locked_elsewhere_does_not_hold_its_neighbours(own_store: Store) -> None:
    lanes = await new_lanes(own_store, 4, "locked")
    held, others = lanes[0], lanes[1:]
    async with hand_edit(own_store) as conn, conn.transaction():
        # Another process's transaction on `held`: its row lock is kept until the block ends.
        await conn.execute(
            "SELECT 1 FROM lanes WHERE namespace = %s AND lane_id = %s FOR UPDATE", held
        )
        commands = [enqueue(lane, f"{lane.lane_id} once") for lane in lanes]
        # Ready together: one group, whose statement for `held` waits for the lock.
        running = [asyncio.ensure_future(enqueue_message(own_store, *c)) for c in commands]
        # The neighbours commit while the lock is still held (before: they waited with it).
        done = await asyncio.wait_for(asyncio.gather(*running[1:]), 20)
        assert not running[0].done(), "the locked lane's command waits for the lock"
        for lane, answer in zip(others, done, strict=True):
            assert await inbox(own_store, lane) == (2, [(answer.entry_id, f"{lane.lane_id} once")])
    # The lock gone, the held lane's command commits once, under the lane's lock.
    answer = await asyncio.wait_for(running[0], 20)
    assert await inbox(own_store, held) == (2, [(answer.entry_id, f"{held.lane_id} once")])


async def test_groups_survive_the_connection_losing_its_prepared_statements(
    fresh_database_url: str,
) -> None:
    # One connection: every group runs on it. psycopg deallocates all of a connection's
    # prepared statements when it rolls a transaction back there, the one-write path's too.
    store = await Store.open(fresh_database_url, min_size=1, max_size=1)
    try:
        await store.migrate()
        lanes = await new_lanes(store, 3, "dealloc")
        committer = store.committer
        notes: dict[LaneRef, list[tuple[str, str]]] = {lane: [] for lane in lanes}

        async def round_(n: int) -> None:
            answers = await asyncio.gather(
                *(enqueue_message(store, *enqueue(lane, f"round {n}")) for lane in lanes)
            )
            for lane, answer in zip(lanes, answers, strict=True):
                notes[lane].append((answer.entry_id, f"round {n}"))

        await round_(0)  # prepares the statements on the connection, in one write
        lost = group_write.stats.statements_lost
        async with store.pool.connection() as conn:
            await conn.execute("SELECT 1", prepare=True)
            with pytest.raises(ZeroDivisionError):
                async with conn.transaction():
                    raise ZeroDivisionError  # rolled back: DEALLOCATE ALL
        await round_(1)  # the statements are gone: this group goes again, and commits
        assert group_write.stats.statements_lost == lost + 1
        await round_(2)  # prepared again
        assert group_write.stats.statements_lost == lost + 1
        assert committer.groups_sent_again == 0  # never through psycopg's pipeline
        for lane in lanes:
            assert await inbox(store, lane) == (1 + 3, notes[lane])
    finally:
        await store.close()


async def test_failed_groups_keep_their_connections_prepared_statements(
    fresh_database_url: str,
) -> None:
    # Two connections: the group committer's, and the one a command waiting for a lane's lock
    # holds meanwhile.
    store = await Store.open(fresh_database_url, min_size=2, max_size=2)
    try:
        await store.migrate()
        lanes = await new_lanes(store, 3, "kept")
        held = lanes[0]
        seen: dict[LaneRef, int] = {lane: 1 for lane in lanes}

        async def round_() -> None:
            await asyncio.gather(*(enqueue_message(store, *enqueue(lane, "x")) for lane in lanes))
            for lane in lanes:
                seen[lane] += 1

        for _ in range(4):
            await round_()  # every shape prepared on both connections
        retried, lost = store.committer.retried_groups, group_write.stats.statements_lost
        for _ in range(3):
            async with hand_edit(store) as conn, conn.transaction():
                await conn.execute(
                    "SELECT 1 FROM lanes WHERE namespace = %s AND lane_id = %s FOR UPDATE", held
                )
                # The held lane's statement waits past the bound and fails its group, which is
                # rolled back and sent again without it; the held command waits under the lock.
                running = asyncio.ensure_future(round_())
                await asyncio.sleep(0.5)
            await asyncio.wait_for(running, 20)
        # Each failed group was sent again without the held lane's statement; and a failed
        # group is rolled back on its connection without deallocating anything, so no later
        # group finds a statement of its connection gone.
        assert store.committer.retried_groups == retried + 3
        assert group_write.stats.statements_lost == lost
        for lane in lanes:
            revision, items = await inbox(store, lane)
            assert (revision, len(items)) == (seen[lane], seen[lane] - 1)
    finally:
        await store.close()
