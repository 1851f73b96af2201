"""The rows of an export file being checked, by id, in a few bytes each.

An import checks the file line by line and keeps no row's content: only what the later lines
are checked against — each entry's or usage row's sequence number, a digest of its content
(the event that added it must carry the same), and whether an event added it. Some 60 bytes
per row beside its id, whatever the row's size.
"""

from __future__ import annotations

import hashlib
from array import array

from google.protobuf.message import Message

#: A row's flag: an event added it.
ADDED = 1
_DIGEST_BYTES = 16


def digest(message: Message) -> bytes:
    """A digest of ``message``'s content (its deterministic encoding)."""
    encoded = message.SerializeToString(deterministic=True)
    return hashlib.blake2b(encoded, digest_size=_DIGEST_BYTES).digest()


class RowIndex:
    """Entries or usage rows of a file, in file order: id → sequence number, digest, flags."""

    __slots__ = ("_at", "_digests", "_flags", "_seqs", "added")

    def __init__(self) -> None:
        self._at: dict[str, int] = {}
        self._seqs = array("q")
        self._digests = bytearray()
        self._flags = bytearray()
        #: Rows an event added (:meth:`mark_added`).
        self.added = 0

    def __len__(self) -> int:
        return len(self._seqs)

    def __contains__(self, row_id: str) -> bool:
        return row_id in self._at

    def add(self, row_id: str, seq: int, content: Message) -> None:
        """Index a row (its id not indexed yet)."""
        self._at[row_id] = len(self._seqs)
        self._seqs.append(seq)
        self._digests += digest(content)
        self._flags.append(0)

    def find(self, row_id: str) -> int | None:
        """The row's position, None if the file has no such row."""
        return self._at.get(row_id)

    def seq(self, at: int) -> int:
        """The sequence number of the row at ``at``."""
        return self._seqs[at]

    def same_content(self, at: int, content: Message) -> bool:
        """Whether ``content`` is the content of the row at ``at``."""
        start = at * _DIGEST_BYTES
        return self._digests[start : start + _DIGEST_BYTES] == digest(content)

    def mark_added(self, at: int) -> bool:
        """Note that an event added the row at ``at``; False when one had already."""
        if self._flags[at] & ADDED:
            return False
        self._flags[at] |= ADDED
        self.added += 1
        return True

    def first_not_added(self, after_seq: int) -> int | None:
        """The position of the first row after sequence number ``after_seq`` that no event
        added, None when every one was."""
        for at, seq in enumerate(self._seqs):
            if seq > after_seq and not self._flags[at] & ADDED:
                return at
        return None

    def row_id(self, at: int) -> str:
        """The id of the row at ``at`` (a scan: for refusals only)."""
        return next(row_id for row_id, position in self._at.items() if position == at)
