"""Where a read of a lane's event log may start: WatchLane's ``after_revision`` and
ReadLaneEvents' alike.

A read starts after a revision a client can hold: at or above the retention floor, at most the
head, at the end of an event group (groups are never split), and of the lane incarnation the
client names. Anything else is refused with the reason that says which rule it broke.
"""

from __future__ import annotations

from lane.server.domain.errors import FailedPrecondition, OutOfRange
from lane.server.store import ResumePoint


def check_start(
    lane_id: str, revision: int, incarnation: str, point: ResumePoint, *, verb: str = "resume"
) -> None:
    """Refuse starting after ``revision`` of the lane whose log stands at ``point``, for a client
    that named ``incarnation`` (empty: not checked). ``verb`` names the read in the messages."""
    head, floor, inside_group, current = point
    if incarnation and incarnation != str(current):
        # The revision counts events of a lane deleted since: this one's start over.
        raise FailedPrecondition(
            "LANE_INCARNATION_CHANGED",
            f"lane {lane_id} was deleted and created again since incarnation "
            f"{incarnation}: its revisions start over; take a new snapshot",
            laneId=lane_id,
            incarnation=current,
            resumedIncarnation=incarnation,
        )
    if not floor <= revision <= head:
        raise out_of_range(lane_id, revision, floor, head, verb=verb)
    if inside_group is not None:
        # Sending the rest of the group would hand the client part of a commit, which no
        # fold can apply: a client only ever holds whole groups, so this revision was not
        # one it reached by folding the log. Refuse; it starts at a boundary instead.
        first, last = inside_group
        raise OutOfRange(
            "REVISION_INSIDE_GROUP",
            f"cannot {verb} lane {lane_id} after revision {revision}: it is inside the "
            f"event group of revisions {first}-{last}, which is sent whole; {verb} after "
            f"revision {first - 1} or {last}",
            laneId=lane_id,
            afterRevision=revision,
            groupFirst=first,
            groupLast=last,
        )


def out_of_range(
    lane_id: str, revision: int, floor: int, head: int, *, verb: str = "resume"
) -> OutOfRange:
    """The refusal of a revision outside the kept log (retention floor, head]."""
    return OutOfRange(
        "REVISION_OUT_OF_RANGE",
        f"cannot {verb} lane {lane_id} after revision {revision}: events are kept after "
        f"revision {floor} up to the head {head}",
        laneId=lane_id,
        afterRevision=revision,
        floor=floor,
        head=head,
    )
