"""Pre-flight checks of a connector against its source database (`cdc-sync connectors validate`).

Each finding names the setting to change. Errors block `apply`; warnings are printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from cdc_sync.connectors.check import Check
from cdc_sync.connectors.schema_checks import schema_checks
from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import ConnectorFile, captured_tables, load_connector
from cdc_sync.debezium.signals import signal_table_id
from cdc_sync.mapping import MappingFile
from cdc_sync.names import include_patterns
from cdc_sync.schema.catalog import quoted

DEFAULT_NAMES = {"publication.name": "dbz_publication", "slot.name": "debezium"}
TOASTABLE = {"text", "bytea", "json", "jsonb", "xml", "varchar"}


def run_checks(
    connector: ConnectorFile,
    config: Mapping[str, str],
    conn: psycopg.Connection[Any],
    mapping: MappingFile | None = None,
) -> list[Check]:
    """`config`: the resolved connector config (placeholders replaced)."""
    checks: list[Check] = []
    checks += _wal_level(conn)
    checks += _names(config)
    checks += _heartbeat(config)
    checks += _heartbeat_query(conn, config)
    checks += _shared_names(connector, config)
    checks += truncate_checks(config)
    checks += _slot_retention(conn, config)
    tables = captured_tables(conn, connector)
    if not tables:
        checks.append(
            Check("error", "table.include.list", "matches no table in the source database")
        )
    checks += _signal_table(conn, config, tables)
    checks += _role(conn, config["database.user"], tables)
    for table in tables:
        checks += _table(conn, table, config)
    found, partitions = schema_checks(conn, connector, config, tables)
    checks += found
    if mapping is not None:
        for table in mapping.uncovered(t for t in tables if t not in partitions):
            checks.append(
                Check("error", f"{mapping.path}: tables", f"{table} is neither routed nor ignored")
            )
        checks += document_table_order(config, mapping)
    return checks


def document_table_order(config: Mapping[str, str], mapping: MappingFile) -> list[Check]:
    """A document's root table listed before a table its documents read. Debezium reads a
    snapshot's tables in `table.include.list` order, and during a snapshot a document renders
    only once its other tables are read (docs/documents.md): listed first, the root's documents
    are all written after the snapshot's end. Tables one pattern matches together are read in
    an order the list does not say: not flagged."""
    patterns = include_patterns(config.get("table.include.list"))

    def position(table: TableId) -> int | None:
        name = f"{table.schema}.{table.table}"
        return next((i for i, p in enumerate(patterns) if p.fullmatch(name)), None)

    checks = []
    for name, spec in mapping.documents.items():
        root = position(spec.table)
        if root is None:
            continue
        later = sorted(
            f"{t.schema}.{t.table}"
            for t in spec.read_besides_roots()
            if (found := position(t)) is not None and found > root
        )
        if later:
            checks.append(
                Check(
                    "warning",
                    "table.include.list",
                    f"lists {spec.table.schema}.{spec.table.table}, the root table of document "
                    f"{name!r}, before {', '.join(later)}: a snapshot reads the tables in this "
                    "order, so its documents are written only after the whole snapshot; list "
                    "the root table after them",
                )
            )
    return checks


def _setting(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else ""


def _wal_level(conn: psycopg.Connection[Any]) -> list[Check]:
    level = _setting(conn, "wal_level")
    if level != "logical":
        return [Check("error", "wal_level", f"is {level!r}; set wal_level=logical and restart")]
    return []


def _names(config: Mapping[str, str]) -> list[Check]:
    return [
        Check(
            "error",
            key,
            f"set a name of this connector's own (the default {default!r} collides between "
            "connectors on one database)",
        )
        for key, default in DEFAULT_NAMES.items()
        if config.get(key, default) == default
    ]


def _heartbeat(config: Mapping[str, str]) -> list[Check]:
    if int(config.get("heartbeat.interval.ms", "0") or 0) <= 0:
        return [
            Check(
                "error",
                "heartbeat.interval.ms",
                "not set: while the captured tables are idle the slot does not advance and "
                "pins WAL written by other tables",
            )
        ]
    if not config.get("heartbeat.action.query"):
        return [
            Check(
                "warning",
                "heartbeat.action.query",
                "not set: plain heartbeats carry no WAL position, so while the tables are idle "
                "the applied watermarks stand still and `cdc-sync wait` times out (upsert a "
                "captured heartbeat table, the mapping's source.heartbeat_table)",
            )
        ]
    return []


def _heartbeat_query(conn: psycopg.Connection[Any], config: Mapping[str, str]) -> list[Check]:
    """The query is planned, never run (EXPLAIN, rolled back): a missing table or a privilege
    the connector's role lacks shows now, not as a failed connector task once it is idle."""
    query = config.get("heartbeat.action.query", "").strip().rstrip(";")
    if not query:
        return []
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(f"EXPLAIN {query}".encode())
    except psycopg.errors.UndefinedTable as exc:
        return [
            Check(
                "error",
                "heartbeat.action.query",
                f"{_first_line(exc)}: create the heartbeat table (see `cdc-sync init`'s "
                "setup SQL) or point the query at an existing one",
            )
        ]
    except psycopg.Error as exc:
        return [
            Check(
                "error",
                "heartbeat.action.query",
                f"cannot run as the connector's role: {_first_line(exc)}",
            )
        ]
    return []


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# Names one connector must not share with another: a slot has one reader, a publication is
# altered by the connector that owns it, and a notification topic shared makes each connector's
# `connectors snapshot` and repair read the other's snapshot notifications as their own.
OWN_NAMES = ("slot.name", "publication.name", "notification.sink.topic.name")


def _shared_names(connector: ConnectorFile, config: Mapping[str, str]) -> list[Check]:
    """The connector files beside this one (same folder) that use one of its `OWN_NAMES`."""
    checks = []
    for other in sorted(connector.path.parent.glob("*.json")):
        if other.resolve() == connector.path.resolve():
            continue
        try:
            theirs = load_connector(other).config
        except ConfigError:
            continue  # not a connector file
        for key in OWN_NAMES:
            value = config.get(key)
            if value and theirs.get(key) == value:
                checks.append(
                    Check(
                        "error",
                        key,
                        f"{value!r} is also used by {other}: give each connector its own",
                    )
                )
    return checks


def _signal_table(
    conn: psycopg.Connection[Any], config: Mapping[str, str], captured: list[TableId]
) -> list[Check]:
    """Debezium reads signals from the WAL: the table must exist and be captured."""
    name = config.get("signal.data.collection")
    if not name:
        return []
    table = signal_table_id(name)
    found = None
    if table is not None:
        found = conn.execute("SELECT to_regclass(%s)", (quoted(table),)).fetchone()
    exists = found is not None and found[0] is not None
    if table is None or not exists:
        return [
            Check(
                "error",
                "signal.data.collection",
                f"table {name} does not exist: create it (id varchar(64) PRIMARY KEY, type "
                "varchar(32) NOT NULL, data varchar(2048)); incremental snapshots and repair "
                "need it",
            )
        ]
    if table not in captured:
        return [
            Check(
                "error",
                "signal.data.collection",
                f"{table} is not captured: add it to table.include.list (Debezium reads "
                "signals from the WAL)",
            )
        ]
    return []


def _slot_retention(conn: psycopg.Connection[Any], config: Mapping[str, str]) -> list[Check]:
    keep = _setting(conn, "max_slot_wal_keep_size")
    checks = []
    if keep in ("-1", ""):
        checks.append(
            Check(
                "warning",
                "max_slot_wal_keep_size",
                "unlimited: a stalled connector can fill the disk with WAL; set a limit "
                "(the slot is invalidated beyond it and the table needs a re-snapshot)",
            )
        )
    row = conn.execute(
        "SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (config.get("slot.name", "debezium"),),
    ).fetchone()
    if row is not None and row[0] in ("unreserved", "lost"):
        checks.append(
            Check("error", "slot.name", f"slot is {row[0]} (retained {row[1]} bytes): re-snapshot")
        )
    return checks


def _role(conn: psycopg.Connection[Any], user: str, tables: list[TableId]) -> list[Check]:
    row = conn.execute(
        "SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = %s", (user,)
    ).fetchone()
    if row is None:
        return [Check("error", "database.user", f"role {user!r} does not exist")]
    replication, superuser = row
    checks = []
    if not (replication or superuser):
        needed = f"ALTER ROLE {_role_name(user)} REPLICATION is needed"
        checks.append(Check("error", "database.user", needed))
    if superuser:
        checks.append(
            Check(
                "warning",
                "database.user",
                f"{user} is a superuser: capture needs only REPLICATION and SELECT on the "
                "captured tables (and CREATE on the database for the publication)",
            )
        )
    for table in tables:
        allowed = conn.execute(
            "SELECT has_table_privilege(%s, %s, 'SELECT')",
            (user, quoted(table)),
        ).fetchone()
        if not (allowed and allowed[0]):
            checks.append(
                Check(
                    "error",
                    "database.user",
                    f"GRANT SELECT ON {quoted(table)} TO {_role_name(user)} is needed",
                )
            )
    return checks


def _role_name(user: str) -> str:
    return sql.Identifier(user).as_string()


def _table(conn: psycopg.Connection[Any], table: TableId, config: Mapping[str, str]) -> list[Check]:
    name = quoted(table)
    checks = []
    has_pk = conn.execute(
        "SELECT 1 FROM pg_index WHERE indrelid = %s::regclass AND indisprimary", (name,)
    ).fetchone()
    if not has_pk and str(table) not in config.get("message.key.columns", ""):
        checks.append(
            Check("error", "message.key.columns", f"{table} has no primary key: declare its key")
        )
    identity = conn.execute(
        "SELECT relreplident FROM pg_class WHERE oid = %s::regclass", (name,)
    ).fetchone()
    checks += _decodable(conn, table, name, identity[0] if identity else None)
    toastable = conn.execute(
        "SELECT count(*) FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "AND t.typname = ANY(%s)",
        (name, list(TOASTABLE)),
    ).fetchone()
    if identity and identity[0] == "n":
        checks.append(
            Check(
                "error", f"REPLICA IDENTITY of {table}", "NOTHING: updates and deletes carry no key"
            )
        )
    elif identity and identity[0] == "d" and toastable and toastable[0]:
        checks.append(
            Check(
                "warning",
                f"REPLICA IDENTITY of {table}",
                "DEFAULT with TOAST-able columns: unchanged large values arrive as "
                "__debezium_unavailable_value; the job fills them from the batch, the sinks or "
                "Postgres (read by key), or set FULL",
            )
        )
    if identity and identity[0] == "d":
        checks += _base64_bytea(conn, table, name, config)
    return checks


def _base64_bytea(
    conn: psycopg.Connection[Any], table: TableId, name: str, config: Mapping[str, str]
) -> list[Check]:
    """Under base64 binary modes Debezium sends an unchanged TOASTed bytea as null, which nothing
    can tell from a real null: the sinks would lose the value."""
    if not config.get("binary.handling.mode", "bytes").startswith("base64"):
        return []
    bytea = conn.execute(
        "SELECT count(*) FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "AND t.typname = 'bytea'",
        (name,),
    ).fetchone()
    if not bytea or not bytea[0]:
        return []
    return [
        Check(
            "warning",
            "binary.handling.mode",
            f"{table} has bytea columns and REPLICA IDENTITY DEFAULT: under base64 modes an "
            "unchanged TOASTed bytea arrives as null and would be written as null; use bytes "
            "(the default) or hex, or set REPLICA IDENTITY FULL",
        )
    ]


def _decodable(
    conn: psycopg.Connection[Any], table: TableId, name: str, identity: str | None
) -> list[Check]:
    """What logical decoding cannot capture: an unlogged table writes no WAL; a deferrable
    primary key cannot be the replica identity, so under DEFAULT updates and deletes carry no
    key (and fail in Postgres once the table is published)."""
    row = conn.execute(
        "SELECT c.relpersistence, EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conrelid = c.oid "
        "AND k.contype = 'p' AND k.condeferrable) FROM pg_class c WHERE c.oid = %s::regclass",
        (name,),
    ).fetchone()
    if row is None:
        return []
    persistence, deferrable = row
    checks = []
    if persistence == "u":
        checks.append(
            Check(
                "error",
                f"{table}",
                f"UNLOGGED: its changes never reach the WAL; ALTER TABLE {name} SET LOGGED",
            )
        )
    if deferrable and identity != "f":
        checks.append(
            Check(
                "error",
                f"REPLICA IDENTITY of {table}",
                f"its primary key is DEFERRABLE, which cannot serve as replica identity: "
                "Postgres refuses its updates and deletes once published, and key swaps need "
                f"full before images. Run ALTER TABLE {name} REPLICA IDENTITY FULL",
            )
        )
    return checks


def truncate_checks(config: Mapping[str, str]) -> list[Check]:
    """Truncate events: skipped by Debezium's default (`skipped.operations=t`), and keyless, which
    Apache Kafka refuses on a compacted topic."""
    skipped = {op.strip() for op in config.get("skipped.operations", "t").split(",")}
    if "t" in skipped:
        return [
            Check(
                "warning",
                "skipped.operations",
                "skips truncate events (Debezium's default `t`): a TRUNCATE never reaches the "
                "sinks, which keep every truncated row until `cdc-sync repair`; set it to none",
            )
        ]
    if "compact" in config.get("topic.creation.default.cleanup.policy", ""):
        return [
            Check(
                "warning",
                "topic.creation.default.cleanup.policy",
                "compact with truncate events on: a truncate event has no key, and Apache Kafka "
                "refuses keyless records on a compacted topic, which fails the task at the first "
                "TRUNCATE (the local stack's brokers accept them). On Apache Kafka key truncate "
                "events with a custom SMT, or skip them (skipped.operations=t) and run "
                "`cdc-sync repair` after a TRUNCATE",
            )
        ]
    return []
