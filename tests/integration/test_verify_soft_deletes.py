"""`verify` on a soft-delete sink with a filter (`on_delete: soft`), real Postgres and sinks.

What the sink must hold (docs/mappings.md "Soft deletes"): the rows Postgres holds that match
the filter, not marked; for a key Postgres lacks, nothing or the row as the sink held it,
marked. Rows the job wrote are exact; the rows planted beside them are what issue 27 found
(stub rows `{id, _deleted: true}` of rows the filter excluded) and their kin, and verify
counted none of them: a marked row was never extra.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.database import SourceDatabase
from cdc_sync.mapping import MappingFile, load_mapping
from cdc_sync.schema import RowSchema
from cdc_sync.schema.catalog import row_schema_from_catalog
from cdc_sync.sinks.base import Sink
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.search import SearchSink
from cdc_sync.verify.compare import SinkComparison, verify_all
from tests.pg import private_database

pytestmark = pytest.mark.integration
TABLE = TableId("t", "accounts")
# 1, 2: tenant A (in the filter); 3: tenant B; 4 was tenant A and is deleted.
ROWS = {
    1: ("A", "one", Decimal("10.50"), '{"vip": true}'),
    2: ("A", "two", Decimal("0.00"), None),
    3: ("B", "three", Decimal("7.00"), None),
    4: ("A", "four", Decimal("1.25"), '{"vip": false}'),
}


class Setup:
    def __init__(
        self, mapping: MappingFile, section: str, sink: Sink, schema: RowSchema, source: str
    ) -> None:
        self.mapping, self.section, self.sink, self.schema = mapping, section, sink, schema
        self.route = mapping.tables[TABLE]
        self.source = source
        self.connections: Connections | None = None

    def write(self, *changes: Change) -> None:
        """Through the job's shaping, as the job writes."""
        shaped = self.route.sink_changes(self.schema, list(changes))[self.section]
        assert not self.sink.apply(self.route, shaped).failures

    def plant(self, key: int, version: int, **fields: Any) -> None:
        """A marked row written as it is, past the shaping (what the job used to write)."""
        deleted, at = self.route.shape(self.section).markers
        row = {"id": key, **fields, deleted: True, at: None}
        schema = self.route.sink_schema(self.section, self.schema)
        kept = RowSchema(tuple(c for c in schema.columns if c.name in row))
        change = Change(TABLE, (("id", key),), Op.UPDATE, version, row, _at(version), schema=kept)
        assert not self.sink.apply(self.route, [change]).failures

    def verify(self) -> SinkComparison:
        assert self.connections is not None
        report = verify_all(
            self.mapping,
            self.connections,
            sinks=[self.section],
            source=SourceDatabase(self.source, "test"),
        )
        (table,) = report.tables
        (comparison,) = table.sinks
        return comparison


@pytest.fixture(params=["search", "cache", "delta"])
def setup(request: pytest.FixtureRequest, pg_url: str, tmp_path: Path) -> Iterator[Setup]:
    section = str(request.param)
    tag = uuid.uuid4().hex[:8]
    target = {
        "search": f"index: t_soft_{tag}",
        "cache": f"prefix: s{tag}",
        "delta": f"table: t.accounts_{tag}",
    }[section]
    path = tmp_path / "m.yaml"
    path.write_text(
        "version: 1\nsource: {topic_prefix: cdc}\ntables:\n  t.accounts:\n"
        "    on_delete: soft\n    filter: \"tenant = 'A' AND balance >= 0\"\n"
        f"    {section}: {{{target}}}\n"
    )
    mapping = load_mapping(path)
    with private_database(pg_url, "verify_soft") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "CREATE SCHEMA t; CREATE TABLE t.accounts (id int PRIMARY KEY, tenant text, "
                "name text, balance numeric(10,2), meta jsonb)"
            )
            for key, values in ROWS.items():
                conn.execute("INSERT INTO t.accounts VALUES (%s, %s, %s, %s, %s)", (key, *values))
            schema = row_schema_from_catalog(conn, TABLE)
        sink: Any
        if section == "search":
            sink = SearchSink("opensearch", request.getfixturevalue("search_url"), 3600)
        elif section == "cache":
            sink = RedisSink(request.getfixturevalue("redis_url"), 3600)
        else:
            sink = DeltaSink(tmp_path / "warehouse", 3600)
        setup = Setup(mapping, section, sink, schema, url)
        setup.connections = Connections(
            pg_url=url,
            kafka_bootstrap=None,
            kafka_flavor="tansu",
            search_url=request.getfixturevalue("search_url") if section == "search" else None,
            search_client="opensearch",
            redis_url=request.getfixturevalue("redis_url") if section == "cache" else None,
            connect_url=None,
            warehouse=str(tmp_path / "warehouse"),
        )
        sink.ensure_target(setup.route, setup.route.sink_schema(section, schema))
        yield setup
        sink.close()


def row(key: int) -> dict[str, Any]:
    tenant, name, balance, meta = ROWS[key]
    return {"id": key, "tenant": tenant, "name": name, "balance": balance, "meta": meta}


def _at(offset: int) -> Coordinates:
    return Coordinates("cdc.t.accounts", 0, offset)


def snapshot(setup: Setup) -> None:
    """The job's writes: 1, 2 held; 3 outside the filter; 4 held, then deleted: marked."""
    setup.write(
        *(
            Change(TABLE, (("id", k),), Op.READ, 10, row(k), _at(k), 1_000, schema=setup.schema)
            for k in ROWS
        )
    )
    with psycopg.connect(setup.source, autocommit=True) as conn:
        conn.execute("DELETE FROM t.accounts WHERE id = 4")
    setup.write(Change(TABLE, (("id", 4),), Op.DELETE, 20, None, _at(20), 2_000))


def test_the_jobs_soft_deletes_verify_exactly(setup: Setup) -> None:
    snapshot(setup)
    result = setup.verify()
    assert result.matches, (result.missing, result.extra, result.different)
    assert result.count == 3  # 1, 2, and 4 marked


def test_verify_counts_every_marked_row_that_should_not_be_there(setup: Setup) -> None:
    snapshot(setup)
    with psycopg.connect(setup.source, autocommit=True) as conn:  # gone, never in the sink
        conn.execute("DELETE FROM t.accounts WHERE id = 3")
    setup.plant(2, 30, tenant="A", name="two")  # Postgres holds it, in the filter
    setup.plant(3, 30, tenant="B", name="three")  # tenant B's deleted row in A's sink
    setup.plant(5, 30)  # a stub: nothing but the key and the markers
    setup.plant(6, 30, tenant="A", name="six", balance=Decimal("-1.00"))  # outside the filter
    setup.plant(7, 30, tenant="A", name="seven", balance=Decimal("3.00"))  # could have been
    result = setup.verify()
    assert (result.missing, result.extra, result.different) == ([], ["3", "5", "6"], ["2"])


def test_a_marked_row_of_a_row_postgres_holds_outside_the_filter_is_extra(setup: Setup) -> None:
    snapshot(setup)
    setup.plant(3, 30, tenant="B", name="three")
    result = setup.verify()
    assert (result.missing, result.extra, result.different) == ([], ["3"], [])
