"""Kafka Connect connector files (`connectors/<name>.json`): load, validate, resolve, embed.

The same file is registered with Kafka Connect (production) and run by the embedded engine
(local stack). Database settings are `${env:CDC_SYNC_PG_*}` placeholders: Kafka Connect resolves
them with its EnvVarConfigProvider; the embedded runner resolves them from `CDC_SYNC_PG_URL`.
`source_conninfo` is the database a connector captures from; `debezium.database` makes it the
one every Postgres read goes to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.names import include_patterns, included
from cdc_sync.schema.catalog import ConverterModes

POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
PLACEHOLDER = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
# What the sync job relies on; anything else is the ops' choice.
REQUIRED = {
    "connector.class": POSTGRES_CONNECTOR,
    "plugin.name": "pgoutput",
    "key.converter": JSON_CONVERTER,
    "value.converter": JSON_CONVERTER,
}
PRESENT = ("topic.prefix", "slot.name", "publication.name", "database.dbname")
# Debezium's database.* settings -> libpq keywords. Without a port Debezium uses 5432.
DATABASE_SETTINGS = {
    "database.hostname": "host",
    "database.port": "port",
    "database.user": "user",
    "database.password": "password",
    "database.dbname": "dbname",
    "database.sslmode": "sslmode",
    "database.sslrootcert": "sslrootcert",
    "database.sslcert": "sslcert",
    "database.sslkey": "sslkey",
}
DATABASE_REQUIRED = ("database.hostname", "database.user", "database.dbname")


@dataclass(frozen=True)
class ConnectorFile:
    path: Path
    name: str
    config: Mapping[str, str]

    @property
    def topic_prefix(self) -> str:
        return self.config["topic.prefix"]

    def resolved(self, env: Mapping[str, str]) -> dict[str, str]:
        """The config with `${env:NAME}` placeholders replaced; unknown names are an error."""

        resolved: dict[str, str] = {}
        for key, value in self.config.items():
            for name in PLACEHOLDER.findall(value):
                if name not in env:
                    raise ConfigError(self.path, f"config.{key}", f"${{env:{name}}} is not set")
            resolved[key] = PLACEHOLDER.sub(lambda m: env[m.group(1)], value)
        return resolved


def load_connector(path: Path) -> ConnectorFile:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(path, "", f"cannot read: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(path, "", f"not JSON: {exc.msg} at line {exc.lineno}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not doc["name"]:
        raise ConfigError(path, "name", 'expected {"name": ..., "config": {...}}')
    config = doc.get("config")
    if not isinstance(config, dict):
        raise ConfigError(path, "config", "expected an object of string settings")
    for key, value in config.items():
        if not isinstance(value, str):
            raise ConfigError(path, f"config.{key}", "Kafka Connect settings are strings")
    for key, wanted in REQUIRED.items():
        if config.get(key) != wanted:
            raise ConfigError(
                path, f"config.{key}", f"must be {wanted!r} (got {config.get(key)!r})"
            )
    # With schemas the records describe themselves; without, the job reads the catalog
    # (mapping `source.schemas: catalog`). Key and value must agree either way.
    key_schemas = config.get("key.converter.schemas.enable", "true")
    if key_schemas not in ("true", "false"):
        raise ConfigError(path, "config.key.converter.schemas.enable", "must be true or false")
    if config.get("value.converter.schemas.enable", "true") != key_schemas:
        raise ConfigError(
            path,
            "config.value.converter.schemas.enable",
            f"must equal key.converter.schemas.enable ({key_schemas})",
        )
    for key in PRESENT:
        if not config.get(key):
            raise ConfigError(path, f"config.{key}", "is required")
    return ConnectorFile(path, doc["name"], config)


def converter_modes(connector: Path | None) -> ConverterModes:
    """How a connector file encodes values (Debezium's defaults without one)."""
    return ConverterModes.from_connector(load_connector(connector).config if connector else {})


def pg_env_from_url(pg_url: str) -> dict[str, str]:
    """`postgresql://user:pass@host:port/db` -> the CDC_SYNC_PG_* placeholder values."""
    parts = urlsplit(pg_url)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ValueError(
            f"CDC_SYNC_PG_URL: expected postgresql://user@host:port/db, got {pg_url!r}"
        )
    return {
        "CDC_SYNC_PG_HOST": parts.hostname,
        "CDC_SYNC_PG_PORT": str(parts.port or 5432),
        "CDC_SYNC_PG_USER": unquote(parts.username or "postgres"),
        "CDC_SYNC_PG_PASSWORD": unquote(parts.password or ""),
        "CDC_SYNC_PG_DB": parts.path.lstrip("/") or "postgres",
    }


def source_conninfo(
    connector: ConnectorFile, env: Mapping[str, str], overrides: Mapping[str, str] | None = None
) -> str:
    """libpq conninfo of the database the connector captures from.

    The file's `database.*` settings with `--set` overrides applied first and `${env:NAME}`
    placeholders resolved afterwards, as Kafka Connect resolves the config it is given (so an
    override may itself be a placeholder, and an overridden placeholder needs no value).
    """
    config = replace(connector, config={**connector.config, **(overrides or {})}).resolved(env)
    for key in DATABASE_REQUIRED:
        if not config.get(key):
            raise ConfigError(connector.path, f"config.{key}", "is required to reach the database")
    params = {word: config[key] for key, word in DATABASE_SETTINGS.items() if config.get(key)}
    params.setdefault("port", "5432")
    return make_conninfo(**params)


def describe_database(conninfo: str) -> str:
    """`user@host:port/dbname` of a conninfo or URL, without the password."""
    params = conninfo_to_dict(conninfo)
    user = f"{params['user']}@" if params.get("user") else ""
    return f"{user}{params.get('host', '')}:{params.get('port') or 5432}/{params.get('dbname', '')}"


def captured_tables(conn: psycopg.Connection[Any], connector: ConnectorFile) -> list[TableId]:
    """The tables the connector captures, by its include lists, read as Debezium reads them
    (`names.include_patterns`: case-insensitive, matched against `schema.table` as it is)."""
    schemas = include_patterns(connector.config.get("schema.include.list"))
    tables = include_patterns(connector.config.get("table.include.list"))
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "ORDER BY 1, 2"
    ).fetchall()
    found = [TableId(schema, table) for schema, table in rows]
    return [
        t
        for t in found
        if (not schemas or included(schemas, t.schema))
        and (not tables or included(tables, f"{t.schema}.{t.table}"))
    ]
