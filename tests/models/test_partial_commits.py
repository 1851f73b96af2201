"""The coalescing rule of lane.client.streaming.PartialCommits, with a commit function the test
holds open (no timing: the interval is 0, commits wait for the test)."""

from __future__ import annotations

import asyncio

import pytest
from lane.client.streaming import PartialCommits
from lane.v1 import messages_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")


class HeldCommits:
    """Records each commit's partials (their text); each commit waits until released."""

    def __init__(self) -> None:
        self.commits: list[list[str]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, partials: list[messages_pb2.AssistantMessage]) -> None:
        assert all(p.stop_reason == messages_pb2.STOP_REASON_PENDING for p in partials)
        self.commits.append(["|".join(b.text.text for b in p.content) for p in partials])
        self.started.set()
        await self.release.wait()
        self.release.clear()


def grow(message: messages_pb2.AssistantMessage, text: str, *, new_block: bool = False) -> None:
    if new_block or not message.content:
        message.content.append(messages_pb2.ContentBlock(text=messages_pb2.TextContent()))
    message.content[-1].text.text += text


async def test_partials_during_a_commit_are_coalesced_and_finished_blocks_kept() -> None:
    held = HeldCommits()
    commits = PartialCommits(held, interval=0.0)
    message = messages_pb2.AssistantMessage()
    grow(message, "a")
    commits(message)
    await held.started.wait()  # commit 1 in flight, holding "a"
    grow(message, "b")
    commits(message)
    grow(message, "c")
    commits(message, block_complete=True)  # block 1 finished as "abc"
    grow(message, "x", new_block=True)
    commits(message)
    grow(message, "y")
    commits(message)
    held.started.clear()
    held.release.set()
    await held.started.wait()  # commit 2 in flight
    # One commit for four reports: the finished block as it was, then the newest partial.
    assert held.commits == [["a"], ["abc", "abc|xy"]]
    held.release.set()
    await commits.close()
    assert commits.commits == 2 and commits.partials == 3
    # The message the model goes on growing is not the one committed.
    assert message.stop_reason == messages_pb2.STOP_REASON_UNSPECIFIED


async def test_close_waits_for_the_commit_in_flight_and_drops_the_rest() -> None:
    held = HeldCommits()
    commits = PartialCommits(held, interval=0.0)
    message = messages_pb2.AssistantMessage()
    grow(message, "first")
    commits(message)
    await held.started.wait()
    grow(message, " and more")
    commits(message)
    closing = asyncio.create_task(commits.close())
    await asyncio.sleep(0)
    assert not closing.done()  # the commit in flight holds it
    held.release.set()
    await closing
    assert held.commits == [["first"]]  # " and more" is left to the settlement
    commits(message)  # after close: ignored
    assert held.commits == [["first"]]


async def test_a_failed_commit_stops_committing_and_is_kept() -> None:
    called = asyncio.Event()

    async def refuse(partials: list[messages_pb2.AssistantMessage]) -> None:
        called.set()  # the committer keeps the failure before this test runs on
        raise RuntimeError("refused")

    commits = PartialCommits(refuse, interval=0.0)
    message = messages_pb2.AssistantMessage()
    grow(message, "x")
    commits(message)
    await called.wait()
    assert str(commits.failure) == "refused" and commits.commits == 0
    await commits.close()
