"""Postgres WAL positions (LSNs): the text form `pg_current_wal_lsn()` prints <-> an integer.

`0/1A2B3C8` is two hexadecimal halves of a 64-bit byte position, high then low 32 bits; Debezium
writes the same positions as plain integers (`source.lsn`, `source.sequence`).
"""

from __future__ import annotations

import re

_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def parse_lsn(text: str) -> int:
    """`0/1A2B3C8` -> 27448264. ValueError names the expected form."""
    match = _LSN_TEXT.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"malformed LSN {text!r}: expected the form pg_current_wal_lsn() prints, "
            "two hexadecimal numbers of up to 8 digits joined by '/' (e.g. 0/1A2B3C8)"
        )
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


def format_lsn(position: int) -> str:
    """27448264 -> `0/1A2B3C8` (as Postgres prints it)."""
    if not 0 <= position < 1 << 64:
        raise ValueError(f"an LSN is a 64-bit unsigned position, got {position}")
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"
