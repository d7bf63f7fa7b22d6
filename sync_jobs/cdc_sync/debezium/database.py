"""The database a connector captures: where every Postgres read of the job and the tools goes.

DESIGN.md invariant 7. The connector file's `database.*` settings, with `${env:...}` resolved as
its worker resolves them (`placeholder_env`), name that database. `CDC_SYNC_PG_URL`, when set,
must name the same one: checked at start by connecting to both and comparing
`current_database()` and the server's system identifier (one server holds many databases, and
one server answers to many host names), so a setting pointing elsewhere is refused before
anything is read, never found mid-stream. Reads then go through the URL (the operator's role
for reads); without it, through the connector's own settings. Without a connector file the URL
is all there is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.settings import PG_URL, Connections, SettingsError
from cdc_sync.debezium.connector import (
    ConnectorFile,
    describe_database,
    load_connector,
    pg_env_from_url,
    source_conninfo,
)

IDENTITY_QUERY = (
    "SELECT current_database(), (SELECT system_identifier FROM pg_control_system())::text"
)
CONNECT_TIMEOUT_SECONDS = 10


@dataclass(frozen=True)
class Identity:
    """Which database a connection reached: its name and its server's system identifier."""

    database: str
    system: str

    def __str__(self) -> str:
        return f"database {self.database} on server {self.system}"


@dataclass(frozen=True)
class SourceDatabase:
    """Where Postgres reads go, and what named it (for messages)."""

    conninfo: str  # CDC_SYNC_PG_URL when it names the captured database, else the connector's
    origin: str
    # The connector's own settings: what acts as the connector (signals, its slot, pre-flight
    # checks of its role). None without a connector file.
    connector_conninfo: str | None = None

    def describe(self) -> str:
        return f"{describe_database(self.conninfo)} ({self.origin})"


class SourceMismatch(ConfigError):
    """CDC_SYNC_PG_URL names another database than the one the connector captures."""


def placeholder_env(connections: Connections) -> dict[str, str]:
    """What `${env:NAME}` resolves against: the environment (and env file), as the worker's
    EnvVarConfigProvider reads its own; CDC_SYNC_PG_* not set there default to the parts of
    CDC_SYNC_PG_URL, which is how the local stack starts its worker (`pg_env_from_url`)."""
    derived = pg_env_from_url(connections.pg_url) if connections.pg_url else {}
    return derived | dict(connections.environment)


def source_database(
    connections: Connections,
    connector: ConnectorFile | Path | None,
    overrides: Mapping[str, str] | None = None,
) -> SourceDatabase:
    """The database `connector` captures (with `--set` overrides), checked against
    CDC_SYNC_PG_URL when that is set; SourceMismatch names both when they differ."""
    if connector is None:
        if not connections.pg_url:
            raise SettingsError(
                f"{PG_URL} is not set and no connector file names the source database "
                "(set the mapping's source.connector, or pass --connector)"
            )
        return SourceDatabase(connections.pg_url, PG_URL)
    if isinstance(connector, Path):
        connector = load_connector(connector)
    captured = source_conninfo(connector, placeholder_env(connections), overrides)
    name = (overrides or {}).get("name") or connector.name
    origin = f"connector {name}, {connector.path}"
    if not connections.pg_url:
        return SourceDatabase(captured, origin, captured)
    url = connections.pg_url
    ours = identity(captured, f"connector {name} ({connector.path}: database.*)")
    theirs = identity(url, PG_URL)
    if ours != theirs:
        raise SourceMismatch(
            connector.path,
            "config.database.*",
            f"connector {name} captures {describe_database(captured)} ({ours}), but {PG_URL} "
            f"names {describe_database(url)} ({theirs}). Every Postgres read (TOAST fill, "
            "catalog, verify, repair, status, signals) must go to the captured database: "
            f"point {PG_URL} at it, or unset it to read through the connector's settings",
        )
    return SourceDatabase(url, f"{PG_URL}, the database of {origin}", captured)


def identity(conninfo: str, setting: str) -> Identity:
    """Connect and ask; a failure names the setting that says where."""
    try:
        with psycopg.connect(conninfo, connect_timeout=CONNECT_TIMEOUT_SECONDS) as conn:
            row = conn.execute(IDENTITY_QUERY).fetchone()
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SettingsError(
            f"{setting}: cannot read which database {describe_database(conninfo)} is: {first}"
        ) from exc
    assert row is not None  # the query always returns one row
    return Identity(str(row[0]), str(row[1]))
