"""The three files `cdc-sync init` writes, from a survey (pure: no I/O, deterministic, so a
re-run on an unchanged schema writes the same bytes and a changed one shows as a diff)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from cdc_sync.connectors.init.survey import (
    HEARTBEAT_TABLE,
    SIGNAL_TABLE,
    Flag,
    Survey,
    TableFacts,
    qualified,
    quote_ident,
)
from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import REQUIRED
from cdc_sync.schema.catalog import ConverterModes
from cdc_sync.schema.search import search_field_mapping

SINKS = ("search", "cache", "delta")
NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")  # a slot name: lower case, digits, underscores

# What the job decodes exactly and relies on (connectors/shop.json holds the same; a unit test
# keeps them equal): converter modes, delete tombstones, compacted topics, heartbeats.
JOB_SETTINGS = {
    "decimal.handling.mode": "precise",
    "time.precision.mode": "adaptive_time_microseconds",
    "interval.handling.mode": "string",
    "tombstones.on.delete": "true",
    "key.converter.schemas.enable": "true",
    "value.converter.schemas.enable": "true",
    "heartbeat.interval.ms": "1000",
    "poll.interval.ms": "50",
    "snapshot.mode": "initial",
    "incremental.snapshot.chunk.size": "1024",
    "topic.creation.default.replication.factor": "1",
    "topic.creation.default.partitions": "1",
    "topic.creation.default.cleanup.policy": "compact",
    "topic.creation.default.min.compaction.lag.ms": "3600000",
    "topic.creation.default.delete.retention.ms": "604800000",
}
MODES = ConverterModes.from_connector(JOB_SETTINGS)


@dataclass(frozen=True)
class Plan:
    """What to write: the survey and the choices made on the command line."""

    name: str
    survey: Survey
    sinks: tuple[str, ...]
    connector_path: str  # as the mapping's source.connector names it (relative to the mapping)

    @property
    def role(self) -> str:
        return f"cdc_sync_{self.name}"

    @property
    def slot(self) -> str:
        return f"cdc_sync_{self.name}"

    @property
    def publication(self) -> str:
        return f"cdc_sync_{self.name}"

    @property
    def heartbeat(self) -> TableId:
        return TableId(self.survey.control_schema, HEARTBEAT_TABLE)

    @property
    def signal(self) -> TableId:
        return TableId(self.survey.control_schema, SIGNAL_TABLE)

    @property
    def captured(self) -> list[TableId]:
        """Every table the connector captures and the publication publishes."""
        return [*(f.table for f in self.survey.captured), self.signal, self.heartbeat]


def connector_config(plan: Plan) -> dict[str, str]:
    schemas = sorted({t.schema for t in plan.captured})
    heartbeat = (
        f"INSERT INTO {qualified(plan.heartbeat)} (connector, beat_at) "
        f"VALUES ('{plan.name}', now()) "
        "ON CONFLICT (connector) DO UPDATE SET beat_at = EXCLUDED.beat_at"
    )
    return {
        "connector.class": REQUIRED["connector.class"],
        "tasks.max": "1",
        "database.hostname": "${env:CDC_SYNC_PG_HOST}",
        "database.port": "${env:CDC_SYNC_PG_PORT}",
        "database.user": "${env:CDC_SYNC_PG_USER}",
        "database.password": "${env:CDC_SYNC_PG_PASSWORD}",
        "database.dbname": "${env:CDC_SYNC_PG_DB}",
        "topic.prefix": plan.name,
        "plugin.name": REQUIRED["plugin.name"],
        "publication.name": plan.publication,
        # The setup SQL made the publication with exactly these tables: the connector's role
        # needs neither CREATE on the database nor ownership of the tables.
        "publication.autocreate.mode": "disabled",
        "slot.name": plan.slot,
        "schema.include.list": ",".join(re.escape(s) for s in schemas),
        "table.include.list": ",".join(re.escape(str(t)) for t in plan.captured),
        "signal.data.collection": str(plan.signal),
        "notification.enabled.channels": "sink",
        "notification.sink.topic.name": f"{plan.name}.notifications",
        # Truncates too (Debezium skips them by default): the job then sees them.
        "skipped.operations": "none",
        "heartbeat.action.query": heartbeat,
        "key.converter": REQUIRED["key.converter"],
        "value.converter": REQUIRED["value.converter"],
        **JOB_SETTINGS,
    }


def connector_json(plan: Plan) -> str:
    return json.dumps({"name": plan.name, "config": connector_config(plan)}, indent=2) + "\n"


def index_name(plan: Plan, table: TableId) -> str:
    """Lower case (search index names must be), this connector's name first."""
    return re.sub(r"[^a-z0-9_]", "_", f"{plan.name}_{table.schema}_{table.table}".lower())


def table_route(plan: Plan, facts: TableFacts) -> dict[str, Any]:
    assert facts.schema is not None  # flagged and left out otherwise
    route: dict[str, Any] = {}
    if "search" in plan.sinks:
        properties = {c.name: search_field_mapping(c.type) for c in facts.schema.columns}
        route["search"] = {
            "index": index_name(plan, facts.table),
            "mapping": {"properties": properties},
        }
    if "cache" in plan.sinks:
        route["cache"] = {"prefix": plan.name}
    if "delta" in plan.sinks:
        route["delta"] = {"table": str(facts.table)}
    return route


def mapping_yaml(plan: Plan) -> str:
    lines = [
        f"# Routing for connectors/{plan.name}.json, written by `cdc-sync init --name {plan.name}`"
        f" from database {plan.survey.database}.",
        "# Edit freely; `cdc-sync init` run again shows what a schema change would change.",
        "# Search _id and cache id: the primary key's value (a composite key's values joined in",
        "# key order with '|'); search field types follow the column types.",
        _dump(
            {
                "version": 1,
                "source": {
                    "topic_prefix": plan.name,
                    "connector": plan.connector_path,
                    # Written by the connector's heartbeat.action.query: watermarks advance while
                    # the tables are idle. Subscribed, never written to a sink.
                    "heartbeat_table": str(plan.heartbeat),
                },
                "defaults": {
                    "on_tombstone": "delete",
                    "on_malformed": "dead_letter",
                    "on_schema_change": "evolve",
                    "cache_prefix": plan.name,
                    "tombstone_retention_seconds": 86400,
                },
                "dead_letter": {"topic": f"{plan.name}.cdc_sync.dead_letter"},
            }
        ),
        "tables:",
    ]
    for facts in plan.survey.captured:
        lines.append(f"  # primary key ({', '.join(facts.key)})")
        lines.append(_indent(_dump({str(facts.table): table_route(plan, facts)}, True), 2))
    lines.append(
        "# Debezium's signal table (incremental snapshots, repair): captured, never synced."
    )
    lines.append(_dump({"ignore": [str(plan.signal)]}, True))
    lines += _left_out("# ", plan.survey.flags)
    return "\n".join(lines) + "\n"


def setup_sql(plan: Plan) -> str:
    role = quote_ident(plan.role)
    schemas = sorted({t.schema for t in plan.captured})
    routed = ", ".join(f.sql_name for f in plan.survey.captured)
    published = ", ".join(qualified(t) for t in plan.captured)
    heartbeat, signal = qualified(plan.heartbeat), qualified(plan.signal)
    lines = [
        f"-- Setup for cdc-sync connector {plan.name} on database {plan.survey.database}, written",
        "-- by `cdc-sync init` (`--apply` runs it). Idempotent: safe to run again. Run it as the",
        "-- tables' owner or a superuser.",
        *_left_out("-- ", plan.survey.flags),
        "",
        "-- The connector's heartbeat.action.query upserts its row every heartbeat.interval.ms:",
        "-- its changes carry WAL positions, so the slot and the job's watermarks advance while",
        "-- the other tables are idle.",
        f"CREATE TABLE IF NOT EXISTS {heartbeat} (",
        "    connector  text PRIMARY KEY,",
        "    beat_at    timestamptz NOT NULL",
        ");",
        "",
        "-- Debezium's signal table: incremental snapshots (`cdc-sync connectors snapshot`,",
        "-- `cdc-sync repair`) are requested here and read back from the WAL.",
        f"CREATE TABLE IF NOT EXISTS {signal} (",
        "    id    varchar(64) PRIMARY KEY,",
        "    type  varchar(32) NOT NULL,",
        "    data  varchar(2048)",
        ");",
        "",
        "-- The publication: exactly the captured tables (the connector never alters it).",
        "DO $$",
        "BEGIN",
        f"    IF EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '{plan.publication}') THEN",
        f"        ALTER PUBLICATION {quote_ident(plan.publication)} SET TABLE {published};",
        "    ELSE",
        f"        CREATE PUBLICATION {quote_ident(plan.publication)} FOR TABLE {published};",
        "    END IF;",
        "END $$;",
        "",
        "-- The role the connector and the job use: REPLICATION to stream (and create its slot),",
        "-- SELECT on the captured tables (snapshots, the TOAST fill, verify and repair read",
        "-- them), the heartbeat upsert, and INSERT on the signal table (Debezium's snapshot",
        "-- windows, `connectors snapshot` and repair signals). Nothing else.",
        "DO $$",
        "BEGIN",
        f"    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{plan.role}') THEN",
        f"        CREATE ROLE {role} LOGIN REPLICATION;",
        "    END IF;",
        "END $$;",
        f"-- Give it a password for connections that need one: ALTER ROLE {role} PASSWORD '...';",
        f"GRANT CONNECT ON DATABASE {quote_ident(plan.survey.database)} TO {role};",
        f"GRANT USAGE ON SCHEMA {', '.join(quote_ident(s) for s in schemas)} TO {role};",
        f"GRANT SELECT ON TABLE {routed} TO {role};",
        f"GRANT SELECT, INSERT, UPDATE ON TABLE {heartbeat} TO {role};",
        f"GRANT SELECT, INSERT ON TABLE {signal} TO {role};",
    ]
    return "\n".join(lines) + "\n"


def _left_out(comment: str, flags: Iterable[Flag]) -> list[str]:
    flags = list(flags)
    if not flags:
        return []
    return [
        f"{comment}Left out (logical decoding cannot capture them as they are); fix, then run",
        f"{comment}`cdc-sync init` again:",
        *(f"{comment}  {flag}" for flag in flags),
    ]


class _Dumper(yaml.SafeDumper):
    """Writes a repeated structure out each time: no `&id001` anchors in a file people edit."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(data: dict[str, Any], leaves_inline: bool = False) -> str:
    """Block style; with `leaves_inline` innermost mappings on one line (`id: {type: long}`)."""
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=None if leaves_inline else False,
        width=100,
    ).rstrip()


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())
