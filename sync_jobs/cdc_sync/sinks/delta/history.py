"""SCD type 2 history of one key, recomputed (pure, no I/O).

A history row is a version of the key's row and the interval it held: from its version
(`_cdc_version_from`, `_valid_from`: commit-order version and source commit time) to the next
row's (`_cdc_version_to`, `_valid_to`; null while it is the newest). A delete is a row too, with
`_cdc_op = 'd'` (a TRUNCATE: `'t'`) repeating the values the key held last (only the key columns
when the history holds nothing before it): it closes the row before it and holds the interval in
which the key did not exist, up to a re-insert.
A compacted topic's tombstone without a version closes the newest row just after it, with a
null `_valid_from` (a weak delete, `_weak_delete`). `_is_current` marks the newest row when it is
not a delete. A version whose tracked columns
(`track`, default every column) equal the row before it updates that row in place instead of
opening a new one: its values replace the row's and `_cdc_version` (the newest version merged
into the row) rises to it.

The writer recomputes a key's rows from the rows it holds and the batch's versions, whatever
their order: versions are deduplicated by their number (the incoming one wins a tie, as equal
versions apply in Kafka order everywhere), a version inside the span of a stored row
(`_cdc_version_from < v <= _cdc_version`) with the same tracked values was merged into it already,
then everything is sorted and the intervals follow. Replays and duplicates therefore give the same
rows, and a version that reaches the history after a newer one is put in its place
(`tests/unit/test_history.py`). One case cannot be exact: a version never seen before that
differs from a stored row whose span it falls in (the versions merged into that row are not kept
one by one). Reading a topic in order never produces it: every version first reaches the history
in log order, and a replay or a transaction Debezium sends again repeats versions already seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

ID = "_cdc_id"
VERSION_FROM = "_cdc_version_from"
VERSION_LAST = "_cdc_version"
VERSION_TO = "_cdc_version_to"
VALID_FROM = "_valid_from"
VALID_TO = "_valid_to"
IS_CURRENT = "_is_current"
OP = "_cdc_op"
HISTORY_COLUMNS = (ID, VERSION_FROM, VERSION_LAST, VERSION_TO, VALID_FROM, VALID_TO, IS_CURRENT, OP)
CLOSING_OPS = frozenset({"d", "t"})  # a delete, a TRUNCATE


@dataclass(frozen=True)
class Version:
    """One version of a key: a stored history row (`last` above `version` when later versions
    were merged into it) or a change of the batch (`last == version`)."""

    version: int
    op: str
    valid_from: datetime | None
    row: Mapping[str, Any]  # routed row columns (a delete's: its key columns)
    last: int = -1
    # Unchanged-TOAST columns the change did not carry: the version before it holds them.
    unavailable: frozenset[str] = field(default_factory=frozenset)
    stored: bool = False

    def __post_init__(self) -> None:
        if self.last < self.version:
            object.__setattr__(self, "last", self.version)

    @property
    def closing(self) -> bool:
        return self.op in CLOSING_OPS

    @property
    def weak(self) -> bool:
        """A delete placed by a tombstone without a version (`_weak_delete`): no commit time."""
        return self.op == "d" and self.valid_from is None and self.version >= 0


def stored_version(row: Mapping[str, Any]) -> Version:
    """A history row as read from the table."""
    return Version(
        version=int(row[VERSION_FROM]),
        op=str(row[OP]),
        valid_from=row[VALID_FROM],
        row={k: v for k, v in row.items() if k not in HISTORY_COLUMNS},
        last=int(row[VERSION_LAST]),
        stored=True,
    )


def recompute(
    doc_id: str,
    stored: Iterable[Version],
    incoming: Sequence[Version],
    track: frozenset[str] | None,
) -> list[dict[str, Any]]:
    """The key's history rows from the rows it holds (`stored`) and new versions (`incoming`,
    in Kafka order). `track`: routed column names; None = every column."""
    versioned = [v for v in incoming if v.version >= 0]
    upserts = [v.version for v in versioned if not v.closing]
    # A weak delete is undone by a version at or below it arriving after it: the log goes on
    # after the tombstone (a replay of a stale tombstone, the key written again).
    spans = [s for s in stored if not (s.weak and any(u < s.version for u in upserts))]
    chosen: dict[int, Version] = {v.version: v for v in spans}
    weak = _weak_delete(spans, incoming, versioned)
    if weak is not None:
        chosen[weak.version] = weak
    for version in versioned:
        span = next((s for s in spans if s.version < version.version <= s.last), None)
        if span is not None and _continues(span, version, track):
            continue  # merged into a stored row already (a replay, a duplicate)
        if span is not None:  # never seen, yet inside a row's span: the row ends before it
            chosen[span.version] = replace(span, last=span.version)
        known = chosen.get(version.version)
        if known is None or known.last <= version.version or not known.stored:
            chosen[version.version] = version
    merged: list[Version] = []
    for version in sorted(chosen.values(), key=lambda v: v.version):
        previous = merged[-1] if merged else None
        if previous is not None and version.closing and not previous.closing:
            version = replace(version, row={**version.row, **previous.row})
        elif previous is not None and version.unavailable and not previous.closing:
            carried = {c: previous.row.get(c) for c in version.unavailable}
            version = replace(version, row={**version.row, **carried}, unavailable=frozenset())
        if previous is not None and _continues(previous, version, track):
            merged[-1] = replace(previous, row=version.row, last=max(previous.last, version.last))
        else:
            merged.append(version)
    following = [*merged[1:], None]
    return [_history_row(doc_id, v, f) for v, f in zip(merged, following, strict=True)]


def _weak_delete(
    spans: Sequence[Version], incoming: Sequence[Version], versioned: Sequence[Version]
) -> Version | None:
    """A tombstone without a version (the compacted log's delete, alone in its batch): it
    follows every stored version in the log and precedes the batch's others, so it closes the
    newest stored row at the version just after it. Its commit time is unknown (null): that
    marks the row weak. Nothing when the newest row is closed already or the batch writes the
    key again at or below that version (a replay: the log goes on after the tombstone)."""
    tombstone = next((v for v in incoming if v.version < 0 and v.closing), None)
    if tombstone is None or not spans:
        return None
    newest = max(spans, key=lambda s: s.version)
    at = max(s.last for s in spans) + 1
    if newest.closing or any(v.version <= at for v in versioned):
        return None
    return Version(at, tombstone.op, None, tombstone.row)


def _continues(previous: Version, version: Version, track: frozenset[str] | None) -> bool:
    """`version` changes nothing that opens a new row: tracked columns equal to the row
    before. Deletes always open one (a second delete: a row of its own)."""
    if previous.closing or version.closing:
        return False
    compared = set(previous.row) | set(version.row) if track is None else track
    return all(previous.row.get(c) == version.row.get(c) for c in compared)


def _history_row(doc_id: str, version: Version, following: Version | None) -> dict[str, Any]:
    return dict(version.row) | {
        ID: doc_id,
        VERSION_FROM: version.version,
        VERSION_LAST: version.last,
        VERSION_TO: following.version if following is not None else None,
        VALID_FROM: version.valid_from,
        VALID_TO: following.valid_from if following is not None else None,
        IS_CURRENT: following is None and not version.closing,
        OP: version.op,
    }


def interval_problems(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What breaks the history rules in one key's rows (verify): versions must chain without
    gaps or overlaps (each `_cdc_version_to` and `_valid_to` the next row's from), only the
    newest row may be open, and it is current unless it is a closing row."""
    ordered = sorted(rows, key=lambda r: int(r[VERSION_FROM]))
    problems = []
    for row, following in zip(ordered, [*ordered[1:], None], strict=True):
        at = row[VERSION_FROM]
        if following is None:
            if row[VERSION_TO] is not None or row[VALID_TO] is not None:
                problems.append(f"newest version {at} is closed")
            if bool(row[IS_CURRENT]) == (row[OP] in CLOSING_OPS):
                problems.append(f"newest version {at}: _is_current={row[IS_CURRENT]}")
            continue
        if row[VERSION_TO] != following[VERSION_FROM] or row[VALID_TO] != following[VALID_FROM]:
            problems.append(f"version {at} does not end where {following[VERSION_FROM]} starts")
        if row[IS_CURRENT]:
            problems.append(f"version {at} is current but not the newest")
        last = int(row[VERSION_LAST])
        if last < int(at) or last >= int(following[VERSION_FROM]):
            problems.append(f"version {at} merged versions outside its interval")
    return problems
