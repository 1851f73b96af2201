"""Terminal input bytes as key names, for ``lane watch``.

A terminal in cbreak mode sends a plain key as its character and a special key as an escape
sequence (``ESC [ 5 ~`` for PageUp); terminals differ in a few of them (Home is ``ESC [ H``,
``ESC O H``, ``ESC [ 1 ~`` or ``ESC [ 7 ~``), so every common form is known. A sequence arrives
in one read, so an ``ESC`` that ends a read is the Escape key itself.
"""

from __future__ import annotations

import re

__all__ = ["ESCAPE", "parse_keys"]

#: The Escape key's name (a lone ESC byte).
ESCAPE = "escape"

_SEQUENCES: dict[bytes, str] = {
    b"[A": "up",
    b"OA": "up",
    b"[B": "down",
    b"OB": "down",
    b"[5~": "pageup",
    b"[6~": "pagedown",
    b"[H": "home",
    b"OH": "home",
    b"[1~": "home",
    b"[7~": "home",
    b"[F": "end",
    b"OF": "end",
    b"[4~": "end",
    b"[8~": "end",
}
# Any CSI or SS3 sequence, so an unknown one (F5, Shift-arrows) is skipped whole rather than
# read as Escape followed by letters ("q" would quit).
_SEQUENCE = re.compile(rb"\[[0-9;?]*[~A-Za-z]|O[A-Za-z]")


def parse_keys(data: bytes) -> list[str]:
    """The keys in one read of terminal input: special keys by name (``up``, ``down``,
    ``pageup``, ``pagedown``, ``home``, ``end``, ``escape``; ``unknown`` for other sequences),
    other keys as their character (``q``, ``\\x03`` for Ctrl-C)."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        if data[i] != 0x1B:
            keys.append(chr(data[i]))
            i += 1
            continue
        match = _SEQUENCE.match(data, i + 1)
        if match is None:
            keys.append(ESCAPE)
            i += 1
            continue
        keys.append(_SEQUENCES.get(match.group(), "unknown"))
        i = match.end()
    return keys
