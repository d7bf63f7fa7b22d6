"""`connectors validate` on the shape of the captured tables: partitioned tables (their
publication, their partitions, the event trigger that keeps them exact), replica identities
that lose the key, and how stored generated columns reach the sinks. The table facts and the
rules are `cdc-sync init`'s (`init.survey`): one home for what logical decoding cannot capture.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from cdc_sync.connectors.check import Check
from cdc_sync.connectors.init.setup import trigger_name
from cdc_sync.connectors.init.survey import (
    TableFacts,
    identity_flags,
    name_flags,
    partition_flags,
    table_facts,
)
from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import ConnectorFile
from cdc_sync.schema.catalog import ConverterModes, quoted

_PARTITION_OF = """
SELECT n.nspname, r.relname FROM pg_class c
JOIN pg_class r ON r.oid = pg_partition_root(c.oid)
JOIN pg_namespace n ON n.oid = r.relnamespace
WHERE c.oid = %s::regclass AND c.relispartition
"""


def schema_checks(
    conn: psycopg.Connection[Any],
    connector: ConnectorFile,
    config: Mapping[str, str],
    tables: Sequence[TableId],
) -> tuple[list[Check], frozenset[TableId]]:
    """The checks, and the captured tables that are partitions of a captured root (listed as
    a mistake here, not as tables the mapping must route)."""
    modes = ConverterModes.from_connector(config)
    facts = [table_facts(conn, table, modes) for table in tables]
    roots = [f for f in facts if f.partitioned]
    checks, partitions = _partitions_listed(conn, tables)
    if roots:
        checks += _publication(conn, config, roots)
        checks += _event_trigger(conn, connector.name, roots)
    for found in facts:
        for flag in name_flags(found.table):
            checks.append(Check("error", "table.include.list", str(flag)))
        for flag in [*identity_flags(found), *partition_flags(found)]:
            message = f"{flag.problem}. Fix: {flag.fix}"
            checks.append(Check("error", f"REPLICA IDENTITY of {flag.table}", message))
        if found.generated:
            checks.append(_generated(conn, config, found))
    return checks, partitions


def _partitions_listed(
    conn: psycopg.Connection[Any], tables: Sequence[TableId]
) -> tuple[list[Check], frozenset[TableId]]:
    checks, partitions = [], set()
    for table in tables:
        row = conn.execute(_PARTITION_OF, (quoted(table),)).fetchone()
        if row is None:
            continue
        root = TableId(row[0], row[1])
        partitions.add(table)
        where = "is captured too" if root in tables else "is not captured"
        checks.append(
            Check(
                "error",
                "table.include.list",
                f"{table} is a partition of {root}, which {where}: published through the root "
                f"(publish_via_partition_root), its changes arrive as {root}'s; list {root} "
                "alone (the snapshot would read this partition into a topic of its own)",
            )
        )
    return checks, frozenset(partitions)


def _publication(
    conn: psycopg.Connection[Any], config: Mapping[str, str], roots: Sequence[TableFacts]
) -> list[Check]:
    """Partitioned tables are captured through their root; a publication that does not publish
    via the root sends their changes under the partitions' names, which are not captured."""
    name = config.get("publication.name", "dbz_publication")
    listed = ", ".join(str(f.table) for f in roots)
    row = conn.execute(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (name,)
    ).fetchone()
    if row is not None and not row[0]:
        return [
            Check(
                "error",
                "publication.name",
                f"{name} publishes the changes of {listed} under their partitions' names, "
                "which Debezium does not capture: nothing streamed from them reaches the "
                f"sinks. ALTER PUBLICATION {name} SET (publish_via_partition_root = true)",
            )
        ]
    if row is None and config.get("publication.autocreate.mode", "all_tables") != "disabled":
        return [
            Check(
                "error",
                "publication.autocreate.mode",
                f"Debezium would create {name} without publish_via_partition_root (observed): "
                f"every streamed change of {listed} would be lost. Create it WITH "
                "(publish_via_partition_root = true), as `cdc-sync init`'s setup SQL does, and "
                "set publication.autocreate.mode=disabled",
            )
        ]
    return []


def _event_trigger(
    conn: psycopg.Connection[Any], connector: str, roots: Sequence[TableFacts]
) -> list[Check]:
    name = trigger_name(connector)
    row = conn.execute(
        "SELECT evtenabled FROM pg_event_trigger WHERE evtname = %s", (name,)
    ).fetchone()
    if row is not None and row[0] != "D":
        return []
    listed = ", ".join(str(f.table) for f in roots)
    return [
        Check(
            "warning",
            f"partitions of {listed}",
            f"no event trigger {name} (`cdc-sync init`'s setup SQL makes it, as a superuser): "
            "a partition attached with rows never reaches the sinks, and one detached or dropped "
            "stays in them. After ATTACH PARTITION run `cdc-sync connectors snapshot --table "
            "<root>`; after DETACH or DROP run `cdc-sync repair`",
        )
    ]


def _generated(
    conn: psycopg.Connection[Any], config: Mapping[str, str], facts: TableFacts
) -> Check:
    """How the table's stored generated columns reach the sinks (a note: nothing to fix)."""
    columns = ", ".join(facts.generated)
    version = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    publication = config.get("publication.name", "dbz_publication")
    published = None
    if version is not None and version[0] >= 180000:
        row = conn.execute(
            "SELECT pubgencols FROM pg_publication WHERE pubname = %s", (publication,)
        ).fetchone()
        published = row is not None and row[0] == "s"
    if published:
        how = f"published by {publication} (publish_generated_columns = stored)"
    elif published is None:
        how = (
            "not published by Postgres before 18: the job reads them back from Postgres by key "
            "in each batch"
        )
    else:
        how = (
            f"not published by {publication}: the job reads them back by key in each batch "
            f"(ALTER PUBLICATION {publication} SET (publish_generated_columns = stored) sends "
            "them instead)"
        )
    return Check("note", f"{facts.table}", f"stored generated columns {columns}: {how}")
