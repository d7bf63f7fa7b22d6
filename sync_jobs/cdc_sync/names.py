"""The names a table gets outside Postgres, and which of them two tables must not share.

Debezium names a table's topic by a rule of its own (`topic_name`) and reads its include lists
by another (`include_patterns`); a search index name has rules of its own (`index_problem`); a
Delta table is a directory (`delta_problem`). Two routed tables that end up with one index,
one cache key space, one Delta directory or one topic overwrite each other's rows, so
`collisions` finds them before anything is written (mapping load, `cdc-sync init`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cdc_sync.core.model import TableId

# Debezium's topic naming (SchemaTopicNamingStrategy through AbstractTopicNamingStrategy, read in
# Debezium 3.x's sources and observed in tests/integration/test_debezium_names.py): the prefix,
# schema and table joined with ".", blank parts left out, then every UTF-16 code unit outside
# [a-zA-Z0-9._-] replaced with "_" (a character beyond the BMP: two), cut to 249 characters; a
# name that is only "." or ".." becomes "_" or "__".
TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]")
TOPIC_MAX = 249


def topic_name(prefix: str, table: TableId) -> str:
    parts = [part for part in (prefix, table.schema, table.table) if not _java_blank(part)]
    raw = ".".join(parts)
    units = raw.encode("utf-16-le")
    sanitized = "".join(
        chr(unit) if unit < 128 and TOPIC_CHARS.fullmatch(chr(unit)) else "_"
        for unit in (int.from_bytes(units[i : i + 2], "little") for i in range(0, len(units), 2))
    )
    if len(sanitized) > TOPIC_MAX:
        return sanitized[:TOPIC_MAX]
    return {".": "_", "..": "__"}.get(sanitized, sanitized)


def _java_blank(text: str) -> bool:
    """Java's `String.trim().isEmpty()`: only characters up to U+0020."""
    return all(ord(c) <= 0x20 for c in text)


def include_patterns(value: str | None) -> list[re.Pattern[str]]:
    """A Debezium include list (`table.include.list`, `schema.include.list`) as Debezium reads
    it: comma-separated regular expressions (`\\,` is a comma inside one), each trimmed (of
    characters up to U+0020, as Java's `trim`) and matched against the whole name,
    case-insensitively for ASCII letters only (Java's CASE_INSENSITIVE without UNICODE_CASE)."""
    items, current, escaped = [], [], False
    for char in value or "":
        if escaped:
            current.append("\\" + char if char != "," else ",")
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current) + ("\\" if escaped else ""))
    trimmed = (_java_trim(item) for item in items)
    return [re.compile(item, re.IGNORECASE | re.ASCII) for item in trimmed if item]


def _java_trim(text: str) -> str:
    return text.strip("".join(chr(c) for c in range(0x21)))


def include_entry(table: TableId, exact_case: bool) -> str:
    """`table` as one entry of `table.include.list` (see `include_literal`)."""
    return include_literal(f"{table.schema}.{table.table}", exact_case)


def include_literal(name: str, exact_case: bool) -> str:
    """`name` as an include-list entry matching exactly it, a regular expression Java and
    Python read alike: ASCII punctuation escaped, control characters and spaces as `\\xhh` (an
    entry is trimmed), a comma as `\\,` (entries are comma-separated); its case kept only when
    `exact_case` (another name differs from it by case alone)."""
    escaped = "".join(_literal(c) for c in name)
    return f"(?-i:{escaped})" if exact_case else escaped


def same_but_case(a: str, b: str) -> bool:
    """Whether an include-list entry for `a` matches `b` too (ASCII letters without case)."""
    return a != b and _ascii_fold(a) == _ascii_fold(b)


def _ascii_fold(text: str) -> str:
    return "".join(c.lower() if c.isascii() else c for c in text)


def _literal(char: str) -> str:
    if char == ",":
        return "\\,"
    if ord(char) <= 0x20 or ord(char) == 0x7F:
        return f"\\x{ord(char):02x}"
    if ord(char) < 0x80 and not (char.isalnum() or char == "_"):
        return "\\" + char
    return char


def included(patterns: Sequence[re.Pattern[str]], name: str) -> bool:
    return any(p.fullmatch(name) for p in patterns)


# Search index names (Elasticsearch and OpenSearch): lower case, none of these characters, not
# starting with -, _ or +, not . or .., at most 255 bytes.
INDEX_FORBIDDEN = re.compile(r'[\\/*?"<>| ,#:]')
INDEX_MAX_BYTES = 255


def index_problem(name: str) -> str | None:
    """Why `name` cannot be a search index name, else None."""
    if not name or name in (".", ".."):
        return "an index name cannot be empty, '.' or '..'"
    if name != name.lower():
        return "index names are lower case"
    bad = sorted(set(INDEX_FORBIDDEN.findall(name)))
    if bad:
        return f"index names cannot hold {' '.join(repr(c) for c in bad)}"
    if name[0] in "-_+":
        return "index names cannot start with -, _ or +"
    if len(name.encode()) > INDEX_MAX_BYTES:
        return f"index names are at most {INDEX_MAX_BYTES} bytes"
    return None


def index_for(*parts: str) -> str:
    """A valid index name from `parts` (joined with `_`): lower case, every character an index
    name cannot hold replaced with `_`, leading -, _ and + left out."""
    name = INDEX_FORBIDDEN.sub("_", "_".join(parts).lower()).lstrip("-_+")
    return name.encode()[:INDEX_MAX_BYTES].decode(errors="ignore") or "index"


def delta_problem(part: str) -> str | None:
    """Why `part` (a Delta table's schema or name: a directory) cannot name one, else None."""
    if part in (".", "..") or any(c in "/\\" or ord(c) < 0x20 for c in part):
        return "a Delta schema or table name is a directory: no '/', '\\', control characters"
    return None


@dataclass(frozen=True)
class Claim:
    """A name `owner` (a table, or a document index) takes in one store (`store`), as that store
    compares names (`same`), and the setting that chose it (`setting`, for the error)."""

    store: str  # "search index" | "cache key space" | "Delta table" | "Kafka topic"
    same: str
    owner: str
    setting: str
    shown: str = ""

    @property
    def name(self) -> str:
        return self.shown or self.same


def collisions(claims: Iterable[Claim]) -> list[list[Claim]]:
    """Groups of claims of different owners on one name of one store."""
    groups: dict[tuple[str, str], list[Claim]] = defaultdict(list)
    for claim in claims:
        group = groups[(claim.store, claim.same)]
        if all(c.owner != claim.owner for c in group):
            group.append(claim)
    return [group for group in groups.values() if len(group) > 1]


def describe(group: Sequence[Claim]) -> str:
    store = group[0].store
    owners = " and ".join(f"{c.owner} ({c.setting}: {c.name})" for c in group)
    return f"{owners} share one {store}: they would overwrite each other's rows"
