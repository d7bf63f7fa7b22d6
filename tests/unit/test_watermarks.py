"""Read-your-writes watermarks: the candidate of a change, the rule that makes it hold, the
observer that records it, the sinks' stored forms, and `wait`'s input checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cdc_sync.cli import main
from cdc_sync.core.errors import ConfigError
from cdc_sync.core.lsn import format_lsn, parse_lsn
from cdc_sync.core.model import Change, Op, TableId, Truncate
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import load_connector
from cdc_sync.job.observe.watermark_rule import WatermarkRule
from cdc_sync.job.observe.watermarks import WatermarkObserver
from cdc_sync.job.settle.applier import BatchApplier, BatchMetrics
from cdc_sync.mapping import MappingFile, TableRoute, load_mapping
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.delta.watermarks import watermark_rows
from cdc_sync.sinks.search.watermarks import WATERMARK_INDEX, watermark_operations
from cdc_sync.source.checkpoint import batch_end_offsets
from cdc_sync.verify.wait import SinkProgress, WaitError, wait_for_lsn
from tests.changes import change, mapping_of, products_route
from tests.envelopes import product

pytestmark = pytest.mark.unit

PRODUCTS = ("cdc.shop.products", 0)
HEARTBEATS = ("cdc.shop.cdc_sync_heartbeat", 0)
HEARTBEAT_TABLE = TableId("shop", "cdc_sync_heartbeat")


def test_lsn_text_round_trips_as_postgres_prints_it() -> None:
    assert parse_lsn("0/1A2B3C8") == 0x1A2B3C8
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert format_lsn((0x16 << 32) | 0xB374D848) == "16/B374D848"
    for bad in ("", "1A2B3C8", "0/", "0/XYZ", "0/123456789", "-1/0", "0 / 1"):
        with pytest.raises(ValueError, match="malformed LSN"):
            parse_lsn(bad)


def streamed(version: int, position: int | None, op: str = "u") -> Change:
    one = change(products_route(), op, version, 1, product(1))
    return dataclasses.replace(one, position=position)


def test_a_changes_bound_is_its_version_or_its_own_position_whichever_is_higher() -> None:
    assert streamed(100, 180).commit_bound == 180  # written after the previous commit
    assert streamed(100, None).commit_bound == 100
    # Snapshot rows: rows of other tables still follow them, whatever their position.
    assert streamed(100, 180, op="r").commit_bound is None
    unversioned = dataclasses.replace(streamed(100, None), op=Op.DELETE, version=-1, row=None)
    assert unversioned.commit_bound is None


def test_the_decoder_keeps_a_changes_own_position() -> None:
    assert change(products_route(), "u", 4242, 1, product(1)).position == 4242


def test_a_candidate_waits_until_every_partition_is_processed_to_the_brokers_end() -> None:
    """A capped batch (maxOffsetsPerTrigger) left records Debezium emitted earlier unread: its
    candidate must not become the watermark until a later batch has read up to the end offsets
    the broker had when the candidate was taken."""
    rule = WatermarkRule()
    ends = {PRODUCTS: 500, HEARTBEATS: 20}
    assert rule.observe(9_000, {PRODUCTS: 200, HEARTBEATS: 20}, ends) is None
    assert rule.watermark is None
    # The next batch reads more, still short of 500: nothing yet.
    assert rule.observe(None, {PRODUCTS: 499}, {PRODUCTS: 900, HEARTBEATS: 20}) is None
    # Reaching 500 makes 9_000 hold, though the broker has moved on since.
    assert rule.observe(None, {PRODUCTS: 500}, {PRODUCTS: 900, HEARTBEATS: 21}) == 9_000
    assert rule.watermark == 9_000


def test_idle_heartbeats_advance_the_watermark_batch_by_batch() -> None:
    rule = WatermarkRule()
    marks = []
    for beat in range(1, 4):
        ends = {PRODUCTS: 300, HEARTBEATS: beat}
        marks.append(rule.observe(1_000 + beat, {PRODUCTS: 300, HEARTBEATS: beat}, ends))
    assert marks == [1_001, 1_002, 1_003]


def test_a_partition_never_read_blocks_unless_it_is_empty() -> None:
    rule = WatermarkRule()
    ends = {PRODUCTS: 10, HEARTBEATS: 5, ("cdc.shop.orders", 0): 0}
    assert rule.observe(700, {HEARTBEATS: 5}, ends) is None  # products' 10 records unread
    assert rule.observe(None, {PRODUCTS: 10}, ends) == 700  # the empty orders partition is fine


def test_the_watermark_never_goes_down_and_unknown_end_offsets_drop_the_candidate() -> None:
    rule = WatermarkRule()
    assert rule.observe(800, {PRODUCTS: 5}, {PRODUCTS: 5}) == 800
    assert rule.observe(700, {PRODUCTS: 6}, {PRODUCTS: 6}) is None
    assert rule.observe(900, {PRODUCTS: 7}, None) is None  # broker unreachable
    assert rule.watermark == 800
    assert rule.observe(950, {PRODUCTS: 8}, {PRODUCTS: 8}) == 950


class RecordingSink:
    name = "search"

    def __init__(self) -> None:
        self.applied: list[Change] = []
        self.watermarks: list[tuple[dict[str, TableRoute], int]] = []

    def ensure_target(self, route: TableRoute, schema: object) -> None:
        return None

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        self.applied += changes
        return WriteResult(applied=len(changes))

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        self.watermarks.append((dict(routes), position))

    def close(self) -> None:
        return None


class FixedEnds:
    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends = ends

    def of(self, topics: Sequence[str]) -> dict[tuple[str, int], int]:
        return {tp: end for tp, end in self.ends.items() if tp[0] in topics}

    def close(self) -> None:
        return None


def heartbeat_mapping() -> tuple[MappingFile, TableRoute]:
    route = products_route()
    mapping = mapping_of(route, heartbeat_table=HEARTBEAT_TABLE)
    return mapping, route


def write_offset_log(checkpoint: Path, batch_id: int, ends: dict[str, dict[str, int]]) -> None:
    import json

    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0}), json.dumps(ends)]
    (checkpoint / "offsets" / str(batch_id)).write_text("\n".join(lines))


def test_the_checkpoint_offset_log_gives_every_partitions_end(tmp_path: Path) -> None:
    write_offset_log(tmp_path, 3, {"cdc.shop.products": {"0": 42, "1": 7}})
    assert batch_end_offsets(tmp_path, 3) == {
        ("cdc.shop.products", 0): 42,
        ("cdc.shop.products", 1): 7,
    }
    assert batch_end_offsets(tmp_path, 4) is None
    (tmp_path / "offsets" / "5").write_text("v9\n{}\n{}")
    assert batch_end_offsets(tmp_path, 5) is None


def test_heartbeats_advance_the_watermark_in_every_sink_without_being_written(
    tmp_path: Path,
) -> None:
    """A batch holding only a heartbeat change: nothing reaches a sink's data, the watermark
    moves to the heartbeat's position, recorded per topic of every routed table."""
    mapping, route = heartbeat_mapping()
    sink = RecordingSink()
    observer = WatermarkObserver(mapping, [sink], FixedEnds({HEARTBEATS: 1, PRODUCTS: 4}), tmp_path)
    applier = BatchApplier(mapping, [sink], None, observers=[observer])
    beat = dataclasses.replace(streamed(5_000, 5_120), table=HEARTBEAT_TABLE)
    # The products partition was read before this job started: the offset log says so.
    write_offset_log(tmp_path, 0, {HEARTBEATS[0]: {"0": 1}, PRODUCTS[0]: {"0": 4}})
    metrics = applier.apply(
        0, records=1, changes=1, compacted=[beat], rejected=[], schemas={}, schema_fps=[None],
        offsets={HEARTBEATS: 0},
    )  # fmt: skip
    assert metrics.commit_bound == 5_120
    assert observer.flush(10)  # recorded on the observer's own thread
    observer.close()
    assert sink.applied == []
    assert sink.watermarks == [({"cdc.shop.products": route}, 5_120)]
    assert observer.watermark == 5_120


def test_without_the_offset_log_an_unread_partition_holds_the_watermark_back() -> None:
    mapping, _ = heartbeat_mapping()
    sink = RecordingSink()
    observer = WatermarkObserver(mapping, [sink], FixedEnds({HEARTBEATS: 1, PRODUCTS: 4}), None)
    metrics = BatchMetrics(0, offsets={HEARTBEATS: 0}, commit_bound=5_120)
    observer(metrics)
    assert observer.flush(10)
    assert sink.watermarks == []
    observer(BatchMetrics(1, offsets={PRODUCTS: 3}))
    assert observer.flush(10)
    assert [position for _, position in sink.watermarks] == [5_120]
    observer.close()


def test_stored_forms_name_the_topic_and_carry_the_position_as_version() -> None:
    route = products_route()
    now = datetime(2026, 11, 23, tzinfo=UTC)
    header, document = watermark_operations({"cdc.shop.products": route}, 0x1A2B3C8, now)
    assert header == {
        "index": {
            "_index": WATERMARK_INDEX,
            "_id": "cdc.shop.products",
            "version": 0x1A2B3C8,
            "version_type": "external_gte",
        }
    }
    assert document["lsn_text"] == "0/1A2B3C8" and document["table"] == "shop.products"
    # products_route has no Delta section: no row for it.
    assert watermark_rows({"cdc.shop.products": route}, 1, now).num_rows == 0


def test_sink_progress_is_reached_only_when_every_awaited_topic_is_at_or_past_the_target() -> None:
    assert SinkProgress("cache", {"a": 10, "b": 12}).reached(10)
    assert not SinkProgress("cache", {"a": 10, "b": None}).reached(10)
    assert not SinkProgress("cache", {}).reached(10)
    behind = SinkProgress("delta", {"cdc.shop.orders": 9}).describe(10)
    assert behind == "delta: behind 0/A: cdc.shop.orders 0/9"


NO_SERVICES = Connections(None, None, "kafka", None, "opensearch", None, None, None)


def test_wait_rejects_bad_input_before_touching_a_sink() -> None:
    with pytest.raises(WaitError, match="malformed LSN"):
        wait_for_lsn("0/zz", NO_SERVICES, sinks=["cache"])
    with pytest.raises(WaitError, match="unknown sink 'redis'; sinks: search, cache, delta"):
        wait_for_lsn("0/10", NO_SERVICES, sinks=["redis"])
    with pytest.raises(WaitError, match="no sink to wait for"):
        wait_for_lsn("0/10", NO_SERVICES)
    mapping, _ = heartbeat_mapping()  # products: search and cache, no Delta
    with pytest.raises(WaitError, match="routes no table to sink 'delta'"):
        wait_for_lsn("0/10", NO_SERVICES, sinks=["delta"], mapping=mapping)


def test_wait_command_exits_2_with_a_one_line_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["wait", "--lsn", "12345"]) == 2
    # Only the command's own lines: in a full session the e2e pipelines' jobs still run and log
    # their batch lines to whatever stderr is current.
    err = [line for line in capsys.readouterr().err.splitlines() if " batch " not in line]
    assert len(err) == 1 and err[0].startswith("cdc-sync wait: malformed LSN '12345'"), err
    assert main(["wait", "--lsn", "0/10", "--sink", "search,elastic"]) == 2
    assert "unknown sink 'elastic'" in capsys.readouterr().err


MAPPING_WITH_HEARTBEAT = """
version: 1
source: {topic_prefix: cdc, heartbeat_table: %s}
tables:
  shop.products: {cache: true}
ignore: [shop.cdc_sync_signal]
"""


def test_the_heartbeat_table_is_subscribed_and_counts_as_covered(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MAPPING_WITH_HEARTBEAT % "shop.cdc_sync_heartbeat")
    mapping = load_mapping(path)
    assert mapping.heartbeat_table == HEARTBEAT_TABLE
    assert mapping.topics() == ["cdc.shop.cdc_sync_heartbeat", "cdc.shop.products"]
    assert mapping.uncovered([HEARTBEAT_TABLE, TableId("shop", "other")]) == [
        TableId("shop", "other")
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("shop.products", "also under tables or ignore"),
        ("shop.cdc_sync_signal", "also under tables or ignore"),
        ("heartbeat", "expected <schema>.<table>"),
    ],
)
def test_a_bad_heartbeat_table_names_the_setting(tmp_path: Path, value: str, message: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MAPPING_WITH_HEARTBEAT % value)
    with pytest.raises(ConfigError, match=f"source.heartbeat_table.*{message}"):
        load_mapping(path)


@pytest.mark.parametrize("mapping_file", ["mappings/shop.yaml", "tests/adversarial/mapping.yaml"])
def test_shipped_connectors_beat_into_the_table_their_mapping_subscribes(mapping_file: str) -> None:
    mapping = load_mapping(Path(mapping_file))
    assert mapping.connector is not None and mapping.heartbeat_table is not None
    config = load_connector(mapping.connector).config
    table = str(mapping.heartbeat_table)
    assert table in config["table.include.list"].split(",")
    assert config["heartbeat.action.query"].startswith(f"INSERT INTO {table} ")
