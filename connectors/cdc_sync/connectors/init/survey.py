"""What `cdc-sync init` learns from the catalog: the tables selected, and for each its key,
replica identity, column types, stored generated columns and, for a partitioned table, its
partitions; what logical decoding cannot capture is flagged with the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import psycopg

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.names import Claim as NameClaim
from cdc_sync.names import collisions, describe, topic_name
from cdc_sync.schema import RowSchema, SchemaConversionError
from cdc_sync.schema.catalog import (
    ConverterModes,
    catalog_columns,
    primary_key_columns,
    quoted,
    row_schema_from_catalog,
)

# cdc-sync's own tables, made by the setup SQL: never routed, whatever `--tables` matches.
HEARTBEAT_TABLE = "cdc_sync_heartbeat"
SIGNAL_TABLE = "cdc_sync_signal"
CONTROL_TABLES = (HEARTBEAT_TABLE, SIGNAL_TABLE)

# Every table (partitions too: an include-list entry may match one), whether it is a partition.
_TABLES_SQL = """
SELECT n.nspname, c.relname, c.relispartition
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p')
  AND n.nspname <> 'information_schema' AND n.nspname !~ '^pg_'
ORDER BY 1, 2
"""

_FACTS_SQL = """
SELECT c.relpersistence, c.relreplident, c.relkind,
       EXISTS (SELECT 1 FROM pg_constraint k
               WHERE k.conrelid = c.oid AND k.contype = 'p' AND k.condeferrable),
       (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = c.oid AND i.indisreplident)
FROM pg_class c WHERE c.oid = %s::regclass
"""

# The leaf partitions of a partitioned table (each holds rows: its own persistence and replica
# identity decide what logical decoding sees of them).
_LEAVES_SQL = """
SELECT n.nspname, c.relname
FROM pg_partition_tree(%s::regclass) t
JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE t.isleaf ORDER BY 1, 2
"""


@dataclass(frozen=True)
class TableFacts:
    table: TableId
    key: tuple[str, ...]  # primary-key columns in key order; () without one
    identity: str  # pg_class.relreplident: d default, n nothing, f full, i index
    unlogged: bool
    partitioned: bool
    deferrable_key: bool
    schema: RowSchema | None  # the columns as the job decodes them; None when one cannot be
    conversion_error: str | None = None
    identity_index: tuple[str, ...] = ()  # REPLICA IDENTITY USING INDEX: the index's columns
    generated: tuple[str, ...] = ()  # stored generated columns (`job.write.generated`)
    leaves: tuple[TableFacts, ...] = ()  # a partitioned table's leaf partitions


@dataclass(frozen=True)
class Flag:
    """A table logical decoding cannot capture well, left out until fixed."""

    table: TableId
    problem: str
    fix: str
    code: str = ""  # what kind of problem, for checks that report some kinds only

    def __str__(self) -> str:
        return f"{self.table}: {self.problem}. Fix: {self.fix}"


@dataclass(frozen=True)
class Survey:
    database: str
    control_schema: str  # where the heartbeat and signal tables go: the first selected schema
    captured: list[TableFacts]  # selected and capturable, in name order
    flags: list[Flag]  # selected tables left out, with the fix
    server_version: int = 150000  # server_version_num
    # Every table of the database, partitions too: the include list must match exactly ours.
    database_tables: frozenset[TableId] = frozenset()

    @property
    def partitioned(self) -> list[TableFacts]:
        return [facts for facts in self.captured if facts.partitioned]

    @property
    def publishes_generated(self) -> bool:
        """Postgres 18 publishes stored generated columns when the publication asks."""
        return self.server_version >= 180000


def parse_patterns(text: str) -> list[tuple[str, str]]:
    """`schema.*,other.t` -> [(schema glob, table glob)]; a part holding a dot is quoted as in
    a mapping (`"my.schema".*`, `TableId.parse`); an error names `--tables`."""
    patterns = []
    for part in (p.strip() for p in text.split(",")):
        try:
            glob = TableId.parse(part)
        except ValueError as exc:
            raise ConfigError(
                "command line", "--tables", f"expected schema.table globs, got {part!r}"
            ) from exc
        patterns.append((glob.schema, glob.table))
    return patterns


def select_tables(
    conn: psycopg.Connection[Any], patterns: Sequence[tuple[str, str]]
) -> list[TableId]:
    """The tables the globs match, in pattern order then name order, cdc-sync's own left out;
    a glob that matches nothing is an error (a typo would silently capture less)."""
    rows = conn.execute(_TABLES_SQL).fetchall()
    found = [TableId(schema, name) for schema, name, partition in rows if not partition]
    selected: list[TableId] = []
    for schema, table in patterns:
        matched = [
            t
            for t in found
            if fnmatchcase(t.schema, schema)
            and fnmatchcase(t.table, table)
            and t.table not in CONTROL_TABLES
        ]
        if not matched:
            raise ConfigError(
                "command line", "--tables", f"{schema}.{table} matches no table in the database"
            )
        selected += [t for t in matched if t not in selected]
    return selected


def table_facts(conn: psycopg.Connection[Any], table: TableId, modes: ConverterModes) -> TableFacts:
    row = conn.execute(_FACTS_SQL, (quoted(table),)).fetchone()
    assert row is not None  # the table was just listed
    persistence, identity, kind, deferrable, identity_index = row
    try:
        schema: RowSchema | None = row_schema_from_catalog(conn, table, modes)
        error = None
    except SchemaConversionError as exc:
        schema, error = None, str(exc)
    leaves: tuple[TableFacts, ...] = ()
    if kind == "p":
        names = conn.execute(_LEAVES_SQL, (quoted(table),)).fetchall()
        leaves = tuple(_leaf_facts(conn, TableId(s, t)) for s, t in names)
    return TableFacts(
        table=table,
        key=tuple(primary_key_columns(conn, table)),
        identity=str(identity),
        unlogged=persistence == "u",
        partitioned=kind == "p",
        deferrable_key=bool(deferrable),
        schema=schema,
        conversion_error=error,
        identity_index=tuple(identity_index or ()),
        generated=tuple(c.name for c in catalog_columns(conn, table) if c.generated),
        leaves=leaves,
    )


def _leaf_facts(conn: psycopg.Connection[Any], table: TableId) -> TableFacts:
    """What decides how a partition's changes reach the WAL: its persistence and identity."""
    row = conn.execute(_FACTS_SQL, (quoted(table),)).fetchone()
    assert row is not None
    persistence, identity, _, deferrable, identity_index = row
    return TableFacts(
        table=table,
        key=tuple(primary_key_columns(conn, table)),
        identity=str(identity),
        unlogged=persistence == "u",
        partitioned=False,
        deferrable_key=bool(deferrable),
        schema=None,
        identity_index=tuple(identity_index or ()),
    )


def flags_for(facts: TableFacts) -> list[Flag]:
    """Why the table cannot be captured as it is, each with the statement that fixes it.
    Publishing a table without a usable replica identity would make Postgres refuse the
    application's UPDATEs and DELETEs on it, so such tables are left out, not warned about.
    A partitioned table is published through its root (`publish_via_partition_root`): its
    partitions' own persistence and identity decide what their changes carry."""
    table = facts.table
    flags = [] if facts.key else [
        Flag(
            table,
            "no primary key: the sinks key every row by it",
            f"ALTER TABLE {quoted(table)} ADD PRIMARY KEY (<columns>)",
        )
    ]  # fmt: skip
    flags += name_flags(table) + decoding_flags(table, facts, facts.key) + partition_flags(facts)
    if facts.conversion_error is not None:
        flags.append(
            Flag(
                table,
                facts.conversion_error,
                "change the column's type, or leave the table out of --tables",
            )
        )
    return flags


def name_flags(table: TableId) -> list[Flag]:
    """A double quote in a schema or table name: Debezium 3.6 cannot snapshot the table
    (observed, tests/integration/test_debezium_names.py: its snapshot query reads `nm.say "hi"`
    as the relation `nm.say`), and the failed snapshot stops the whole connector."""
    if '"' not in table.schema + table.table:
        return []
    return [
        Flag(
            table,
            "a double quote in its name: Debezium cannot snapshot it (the connector would stop)",
            f"ALTER TABLE {quoted(table)} RENAME TO <a name without quotes> (or its schema)",
        )
    ]


def partition_flags(facts: TableFacts) -> list[Flag]:
    """What keeps a partitioned table's partitions from reaching the WAL whole: each partition's
    own persistence and replica identity decide what its changes carry."""
    return [flag for leaf in facts.leaves for flag in decoding_flags(facts.table, leaf, facts.key)]


def identity_flags(facts: TableFacts) -> list[Flag]:
    """REPLICA IDENTITY USING INDEX on an index that does not hold the primary key."""
    return [flag for flag in decoding_flags(facts.table, facts, facts.key) if flag.code == "index"]


def decoding_flags(table: TableId, part: TableFacts, key: tuple[str, ...]) -> list[Flag]:
    """What keeps `part` (the table, or one of its partitions) from reaching the WAL whole."""
    name = quoted(part.table)
    where = "" if part.table == table else f"its partition {part.table} is "
    flags = []
    if part.unlogged:
        flags.append(
            Flag(
                table,
                f"{where}UNLOGGED: its changes never reach the WAL",
                f"ALTER TABLE {name} SET LOGGED",
            )
        )
    if part.identity == "n":
        flags.append(
            Flag(
                table,
                f"{where}REPLICA IDENTITY NOTHING: updates and deletes carry no key",
                f"ALTER TABLE {name} REPLICA IDENTITY DEFAULT",
            )
        )
    elif part.identity == "i" and not set(key) <= set(part.identity_index):
        index, primary = ", ".join(part.identity_index), ", ".join(key)
        flags.append(
            Flag(
                table,
                f"{where}REPLICA IDENTITY USING INDEX on ({index}), which does not hold the "
                f"primary key ({primary}): a delete would carry no key the sinks know the row by",
                f"ALTER TABLE {name} REPLICA IDENTITY DEFAULT (or USING INDEX on a unique index "
                "of the key's columns)",
                code="index",
            )
        )
    elif part.deferrable_key and part.identity != "f":
        flags.append(
            Flag(
                table,
                f"{where}DEFERRABLE primary key, which cannot be the replica identity: updates "
                "and deletes would carry no key",
                f"ALTER TABLE {name} REPLICA IDENTITY FULL",
            )
        )
    return flags


def topic_flags(prefix: str, tables: Sequence[TableId]) -> list[Flag]:
    """Tables whose topics Kafka cannot tell apart (Debezium replaces characters Kafka does
    not allow with `_`, and Kafka refuses names that differ only by `.` and `_`): their
    records would share one compacted topic, so all of them are left out."""
    claims = [
        NameClaim("Kafka topic", topic_name(prefix, t).replace(".", "_"), str(t), "topic")
        for t in tables
    ]
    flags = []
    for group in collisions(claims):
        for claim in group:
            flags.append(
                Flag(
                    TableId.parse(claim.owner),
                    describe(group),
                    "rename one of them, or capture them with two connectors (`cdc-sync init "
                    "--name` each, a table each in --tables)",
                )
            )
    return flags


def survey(
    conn: psycopg.Connection[Any],
    patterns: Sequence[tuple[str, str]],
    modes: ConverterModes,
    prefix: str,
) -> Survey:
    """`prefix`: the topic prefix, which decides which names Kafka can tell apart."""
    selected = select_tables(conn, patterns)
    captured, flags = [], []
    for table in selected:
        facts = table_facts(conn, table, modes)
        problems = flags_for(facts)
        flags += problems
        if not problems:
            captured.append(facts)
    shared = topic_flags(prefix, [facts.table for facts in captured])
    flags += shared
    captured = [facts for facts in captured if facts.table not in {f.table for f in shared}]
    found = conn.execute(
        "SELECT current_database(), current_setting('server_version_num')::int"
    ).fetchone()
    assert found is not None
    every = frozenset(TableId(s, t) for s, t, _ in conn.execute(_TABLES_SQL).fetchall())
    return Survey(
        database=str(found[0]),
        control_schema=selected[0].schema,
        captured=sorted(captured, key=lambda f: f.table),
        flags=flags,
        server_version=int(found[1]),
        database_tables=every,
    )
