"""A failover of a replicated PostgreSQL mid-load (docs/deploying.md, "A replicated
PostgreSQL").

One drill (``lane.server.failover_drill``, which ``bench/failover.py`` runs too), observed by
the tests below: a primary and a synchronous hot standby (``lane.server.standby_pair``: the
system's PostgreSQL 15+ binaries as the ``postgres`` user, created if missing); the service as a
process of its own on ``postgresql://…@primary,standby/lane?target_session_attrs=read-write``;
drivers committing on their lanes with request ids (again after UNAVAILABLE) and a watcher
per lane; the primary stopped with ``pg_ctl stop -m immediate``, the standby promoted
:data:`PROMOTE_AFTER` seconds later — as a failover manager does once sure the primary is gone.

Why 16 s: psycopg_pool's own reconnect schedule (1, 2, 4, 8, 16 s ...) would try again only
about 31 s after the stop, 15 s after the promotion; the service follows within a second or
two. The bounds below are generous against a loaded machine and still far from that.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from lane.server.failover_drill import DrillPlan, DrillResult, run_drill

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

PROMOTE_AFTER = 16.0
LANES = 8
#: The first acknowledged command after the promotion comes within this (target: 2 s).
FOLLOW_WITHIN = 4.0
#: Every attempt sent while no server accepts writes is answered within this (target: ~1 s;
#: a command held in the pool's queue would wait for the 10 s checkout timeout).
ANSWER_WITHIN = 2.5
#: Readiness says NOT_SERVING from this long after the stop until the promotion, and SERVING
#: again within this long of it.
READINESS_SETTLES = 2.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def drill() -> DrillResult:
    result = await run_drill(
        DrillPlan(promote_after=PROMOTE_AFTER, lanes=LANES, warm_up=2.0, settle=2.0)
    )
    print("\n" + result.summary())
    return result


def _log_tail(result: DrillResult) -> str:
    return "\nservice log:\n" + "\n".join(result.service_log.splitlines()[-30:])


async def test_no_acknowledged_command_is_lost_or_doubled(drill: DrillResult) -> None:
    assert not drill.driver_failures, drill.driver_failures[:5]
    assert all(capture is not None for capture in drill.captures.values()), _log_tail(drill)
    assert drill.lost == [], drill.lost[:10]
    assert drill.doubled == [], drill.doubled[:10]
    before = [a for a in drill.acks if a.time < drill.stop_began]
    after = [a for a in drill.acks if a.time > drill.writable]
    assert before and after, "the drivers did not commit on both sides of the failover"


async def test_watchers_equal_fresh_snapshots(drill: DrillResult) -> None:
    assert drill.watchers_match() == []


async def test_only_ok_or_unavailable_with_a_retry_delay_is_answered(drill: DrillResult) -> None:
    wrong = [a for a in drill.attempts if a.code not in ("OK", "UNAVAILABLE")]
    assert wrong == [], wrong[:10]
    refused = [a for a in drill.attempts if a.code == "UNAVAILABLE"]
    assert refused, "no command was refused during the gap"
    assert all(a.reason == "UNAVAILABLE" for a in refused), refused[:5]
    without_delay = [a for a in refused if a.retry_after is None or a.retry_after <= 0]
    assert without_delay == [], f"UNAVAILABLE without a RetryInfo: {without_delay[:5]}"


async def test_commands_fail_fast_while_there_is_no_primary(drill: DrillResult) -> None:
    during = drill.gap_attempts
    assert len(during) > LANES, "too few attempts during the gap to tell"
    slow = [a for a in during if a.seconds > ANSWER_WITHIN]
    assert slow == [], (
        f"{len(slow)} of {len(during)} attempts sent during the gap took over {ANSWER_WITHIN}s: "
        + ", ".join(f"{a.method} {a.code} {a.seconds:.2f}s" for a in slow[:10])
    )


async def test_the_promoted_standby_is_followed_promptly(drill: DrillResult) -> None:
    first = drill.first_ack_after_promotion
    every = drill.every_lane_back_after_promotion
    assert first is not None and first <= FOLLOW_WITHIN, (
        f"first acknowledged command {first}s after the promotion" + _log_tail(drill)
    )
    assert every is not None and every <= FOLLOW_WITHIN + 1.0, (
        f"every lane committing again {every}s after the promotion"
    )


async def test_readiness_is_not_serving_during_the_gap_and_serving_after(
    drill: DrillResult,
) -> None:
    gap = [
        s
        for s in drill.health
        if drill.stop_began + READINESS_SETTLES <= s.time < drill.promotion_began
    ]
    after = [s for s in drill.health if s.time >= drill.writable + READINESS_SETTLES]
    assert gap and after
    assert {(s.readiness, s.http_readiness) for s in gap} == {("NOT_SERVING", 503)}, (
        drill.readiness_story()
    )
    assert {(s.readiness, s.http_readiness) for s in after} == {("SERVING", 200)}, (
        drill.readiness_story()
    )
    # Liveness never flips: restarting the process would not bring the database back.
    assert {s.liveness for s in drill.health} == {"SERVING"}
