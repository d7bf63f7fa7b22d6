"""The three files `cdc-sync init` writes, from a survey (pure: no I/O, deterministic, so a
re-run on an unchanged schema writes the same bytes and a changed one shows as a diff)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml
from psycopg import sql

from cdc_sync.connectors.init.names import TableNames
from cdc_sync.connectors.init.survey import (
    HEARTBEAT_TABLE,
    SIGNAL_TABLE,
    Flag,
    Survey,
    TableFacts,
)
from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import REQUIRED
from cdc_sync.names import include_entry, include_literal, same_but_case
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
    "poll.interval.ms": "10",
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

    @property
    def names(self) -> TableNames:
        """The index and Delta table each routed table gets (distinct: `init.names`)."""
        return TableNames.of(self.name, [f.table for f in self.survey.captured])

    def include_list(self) -> str:
        """`table.include.list`: exactly the captured tables, their own case kept where another
        table of the database differs by case alone (Debezium matches without case)."""
        every = {f"{t.schema}.{t.table}" for t in self.survey.database_tables}
        entries = []
        for table in self.captured:
            name = f"{table.schema}.{table.table}"
            entries.append(include_entry(table, any(same_but_case(name, o) for o in every)))
        return ",".join(entries)


def connector_config(plan: Plan) -> dict[str, str]:
    schemas = sorted({t.schema for t in plan.captured})
    heartbeat = sql.SQL(
        "INSERT INTO {} (connector, beat_at) VALUES ({}, now()) "
        "ON CONFLICT (connector) DO UPDATE SET beat_at = EXCLUDED.beat_at"
    ).format(sql.Identifier(plan.heartbeat.schema, plan.heartbeat.table), plan.name)
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
        "schema.include.list": ",".join(
            include_literal(s, any(same_but_case(s, o) for o in schemas)) for s in schemas
        ),
        "table.include.list": plan.include_list(),
        "signal.data.collection": str(plan.signal),
        "notification.enabled.channels": "sink",
        "notification.sink.topic.name": f"{plan.name}.notifications",
        # Truncates too (Debezium skips them by default): the job then sees them.
        "skipped.operations": "none",
        "heartbeat.action.query": heartbeat.as_string(),
        "key.converter": REQUIRED["key.converter"],
        "value.converter": REQUIRED["value.converter"],
        **JOB_SETTINGS,
    }


def connector_json(plan: Plan) -> str:
    return json.dumps({"name": plan.name, "config": connector_config(plan)}, indent=2) + "\n"


def table_route(plan: Plan, facts: TableFacts) -> dict[str, Any]:
    assert facts.schema is not None  # flagged and left out otherwise
    route: dict[str, Any] = {}
    if "search" in plan.sinks:
        properties = {c.name: search_field_mapping(c.type) for c in facts.schema.columns}
        route["search"] = {
            "index": plan.names.index(facts.table),
            "mapping": {"properties": properties},
        }
    if "cache" in plan.sinks:
        route["cache"] = {"prefix": plan.name}
    if "delta" in plan.sinks:
        route["delta"] = {"table": str(plan.names.delta(facts.table))}
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
        lines += [f"  # {note}" for note in table_notes(plan, facts)]
        lines.append(_indent(_dump({str(facts.table): table_route(plan, facts)}, True), 2))
    lines.append(
        "# Debezium's signal table (incremental snapshots, repair): captured, never synced."
    )
    lines.append(_dump({"ignore": [str(plan.signal)]}, True))
    lines += left_out("# ", plan.survey.flags)
    return "\n".join(lines) + "\n"


def table_notes(plan: Plan, facts: TableFacts) -> list[str]:
    """What the mapping says about a table above its route (and `init` prints)."""
    notes = [f"primary key ({', '.join(facts.key)})"]
    if facts.partitioned:
        notes.append(
            f"partitioned ({len(facts.leaves)} partitions now): captured through its root; a "
            "row moving between partitions is a delete and an insert of its key"
        )
    if facts.generated:
        how = (
            "published (publish_generated_columns = stored)"
            if plan.survey.publishes_generated
            else "not published by Postgres < 18: the job reads them back by key"
        )
        notes.append(f"stored generated columns {', '.join(facts.generated)}: {how}")
    return notes


def left_out(comment: str, flags: Iterable[Flag]) -> list[str]:
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
