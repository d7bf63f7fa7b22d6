"""What `cdc-sync init` learns from the catalog: the tables selected, and for each its key,
replica identity and column types; what logical decoding cannot capture is flagged with the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import psycopg

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.schema import RowSchema, SchemaConversionError
from cdc_sync.schema.catalog import ConverterModes, primary_key_columns, row_schema_from_catalog

# cdc-sync's own tables, made by the setup SQL: never routed, whatever `--tables` matches.
HEARTBEAT_TABLE = "cdc_sync_heartbeat"
SIGNAL_TABLE = "cdc_sync_signal"
CONTROL_TABLES = (HEARTBEAT_TABLE, SIGNAL_TABLE)

_TABLES_SQL = """
SELECT n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname <> 'information_schema' AND n.nspname !~ '^pg_'
ORDER BY 1, 2
"""

_FACTS_SQL = """
SELECT c.relpersistence, c.relreplident, c.relkind,
       EXISTS (SELECT 1 FROM pg_constraint k
               WHERE k.conrelid = c.oid AND k.contype = 'p' AND k.condeferrable)
FROM pg_class c WHERE c.oid = %s::regclass
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

    @property
    def sql_name(self) -> str:
        return qualified(self.table)


@dataclass(frozen=True)
class Flag:
    """A table logical decoding cannot capture well, left out until fixed."""

    table: TableId
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.table}: {self.problem}. Fix: {self.fix}"


@dataclass(frozen=True)
class Survey:
    database: str
    control_schema: str  # where the heartbeat and signal tables go: the first selected schema
    captured: list[TableFacts]  # selected and capturable, in name order
    flags: list[Flag]  # selected tables left out, with the fix


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def qualified(table: TableId) -> str:
    return f"{quote_ident(table.schema)}.{quote_ident(table.table)}"


def parse_patterns(text: str) -> list[tuple[str, str]]:
    """`schema.*,other.t` -> [(schema glob, table glob)]; an error names `--tables`."""
    patterns = []
    for part in (p.strip() for p in text.split(",")):
        schema, sep, table = part.partition(".")
        if not part or not sep or not schema or not table:
            raise ConfigError(
                "command line", "--tables", f"expected schema.table globs, got {part!r}"
            )
        patterns.append((schema, table))
    return patterns


def select_tables(
    conn: psycopg.Connection[Any], patterns: Sequence[tuple[str, str]]
) -> list[TableId]:
    """The tables the globs match, in pattern order then name order, cdc-sync's own left out;
    a glob that matches nothing is an error (a typo would silently capture less)."""
    found = [TableId(s, t) for s, t in conn.execute(_TABLES_SQL).fetchall()]
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
    row = conn.execute(_FACTS_SQL, (qualified(table),)).fetchone()
    assert row is not None  # the table was just listed
    persistence, identity, kind, deferrable = row
    try:
        schema: RowSchema | None = row_schema_from_catalog(conn, table, modes)
        error = None
    except SchemaConversionError as exc:
        schema, error = None, str(exc)
    return TableFacts(
        table=table,
        key=tuple(primary_key_columns(conn, table)),
        identity=str(identity),
        unlogged=persistence == "u",
        partitioned=kind == "p",
        deferrable_key=bool(deferrable),
        schema=schema,
        conversion_error=error,
    )


def flags_for(facts: TableFacts) -> list[Flag]:
    """Why the table cannot be captured as it is, each with the statement that fixes it.
    Publishing a table without a usable replica identity would make Postgres refuse the
    application's UPDATEs and DELETEs on it, so such tables are left out, not warned about."""
    name, table = facts.sql_name, facts.table
    flags = []
    if facts.unlogged:
        flags.append(
            Flag(
                table, "UNLOGGED: its changes never reach the WAL", f"ALTER TABLE {name} SET LOGGED"
            )
        )
    if facts.partitioned:
        flags.append(
            Flag(
                table,
                "partitioned: init does not capture partitioned tables",
                "route it by hand (a publication WITH (publish_via_partition_root = true))",
            )
        )
    if not facts.key:
        flags.append(
            Flag(
                table,
                "no primary key: the sinks key every row by it",
                f"ALTER TABLE {name} ADD PRIMARY KEY (<columns>)",
            )
        )
    if facts.identity == "n":
        flags.append(
            Flag(
                table,
                "REPLICA IDENTITY NOTHING: updates and deletes carry no key",
                f"ALTER TABLE {name} REPLICA IDENTITY DEFAULT",
            )
        )
    elif facts.deferrable_key and facts.identity != "f":
        flags.append(
            Flag(
                table,
                "its primary key is DEFERRABLE, which cannot be the replica identity: updates "
                "and deletes would carry no key",
                f"ALTER TABLE {name} REPLICA IDENTITY FULL",
            )
        )
    if facts.conversion_error is not None:
        flags.append(
            Flag(
                table,
                facts.conversion_error,
                "change the column's type, or leave the table out of --tables",
            )
        )
    return flags


def survey(
    conn: psycopg.Connection[Any], patterns: Sequence[tuple[str, str]], modes: ConverterModes
) -> Survey:
    selected = select_tables(conn, patterns)
    captured, flags = [], []
    for table in selected:
        facts = table_facts(conn, table, modes)
        problems = flags_for(facts)
        flags += problems
        if not problems:
            captured.append(facts)
    database = conn.execute("SELECT current_database()").fetchone()
    assert database is not None
    return Survey(
        database=str(database[0]),
        control_schema=selected[0].schema,
        captured=sorted(captured, key=lambda f: f.table),
        flags=flags,
    )
