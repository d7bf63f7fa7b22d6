"""Job metrics: what each applied batch adds, and what a scrape computes from the held state."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from cdc_sync.cli import build_parser, connector_status, job_options
from cdc_sync.core.model import Change, TableId, Truncate
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.slots import Slot
from cdc_sync.job.observe.capture_probes import (
    CaptureProbes,
    CaptureReadings,
    ConnectorState,
    connector_state,
)
from cdc_sync.job.observe.metrics import JobMetrics
from cdc_sync.job.runner import JobOptions
from cdc_sync.job.settle.applier import BatchApplier, BatchMetrics, TableProgress
from cdc_sync.job.write.health import SinkHealth
from cdc_sync.mapping import OnMalformed, Policies, TableRoute, load_mapping
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import RecordFailure, WriteResult
from tests.changes import change, mapping_of, products_route

pytestmark = pytest.mark.unit

PRODUCTS = "shop.products"
SECRET_SKU = "sku-payload-7731"
REFUSAL = "field [sku] of type [long] cannot hold sku-payload-7731"


class ScriptedSink:
    """Applies, fences or refuses changes by key, as a real sink's target would."""

    def __init__(
        self,
        name: str,
        fenced_keys: frozenset[int] = frozenset(),
        refused: frozenset[int] = frozenset(),
    ) -> None:
        self.name = name
        self.fenced_keys = fenced_keys
        self.refused = refused

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        return None

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        return 0

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        result = WriteResult()
        for one in changes:
            key = int(dict(one.key)["id"])
            if key in self.refused:
                result.failures.append(RecordFailure(one, "mapper_parsing_exception", REFUSAL))
            elif key in self.fenced_keys:
                result.fenced += 1
            else:
                result.applied += 1
        return result

    def close(self) -> None:
        return None


class Letters:
    def write(self, letters: Sequence[object], batch_id: int | None = None) -> None:
        return None


def applier_with(sinks: list[ScriptedSink]) -> tuple[BatchApplier, TableRoute]:
    route = dataclasses.replace(
        products_route(), policies=Policies(on_malformed=OnMalformed.DEAD_LETTER)
    )
    mapping = mapping_of(route)
    return BatchApplier(mapping, sinks, Letters()), route  # type: ignore[arg-type]


def rows(route: TableRoute, keys: range, lsn: int, ts_ms: int) -> list[Change]:
    return [
        dataclasses.replace(
            change(route, "c", lsn + key, key, {"id": key, "sku": SECRET_SKU, "in_stock": True}),
            source_ts_ms=ts_ms,
        )
        for key in keys
    ]


def apply(
    applier: BatchApplier, changes: list[Change], offsets: dict[tuple[str, int], int]
) -> None:
    applier.apply(
        1,
        records=len(changes),
        changes=len(changes),
        compacted=changes,
        rejected=[],
        schemas={},
        schema_fps=[None] * len(changes),
        stage_seconds={"decode": 0.2, "fold": 0.1},
        offsets=offsets,
    )


def value(metrics: JobMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_batch_counts_applied_fenced_and_failed_per_table_and_sink() -> None:
    search = ScriptedSink("search", fenced_keys=frozenset({2}), refused=frozenset({3}))
    cache = ScriptedSink("cache")
    applier, route = applier_with([search, cache])
    metrics = JobMetrics()
    applier.observers.append(metrics.observer("job"))
    apply(applier, rows(route, range(1, 6), 100, 1_700_000_000_000), {("cdc.shop.products", 0): 9})

    assert value(metrics, "cdc_sync_sink_applied_total", table=PRODUCTS, sink="search") == 3
    assert value(metrics, "cdc_sync_sink_fenced_total", table=PRODUCTS, sink="search") == 1
    assert value(metrics, "cdc_sync_sink_failed_total", table=PRODUCTS, sink="search") == 1
    assert value(metrics, "cdc_sync_sink_applied_total", table=PRODUCTS, sink="cache") == 5
    assert value(metrics, "cdc_sync_table_changes_total", consumer="job", table=PRODUCTS) == 5
    assert value(metrics, "cdc_sync_dead_lettered_records_total", consumer="job") == 1
    assert value(metrics, "cdc_sync_records_total", consumer="job") == 5
    assert value(metrics, "cdc_sync_batches_total", consumer="job") == 1
    for stage in ("decode", "fold", "search", "cache", "dead_letter"):
        assert (
            value(metrics, "cdc_sync_batch_stage_seconds_count", consumer="job", stage=stage) == 1
        )
    assert value(metrics, "cdc_sync_batch_stage_seconds_sum", consumer="job", stage="decode") == 0.2

    apply(applier, rows(route, range(6, 8), 200, 1_700_000_001_000), {("cdc.shop.products", 0): 11})
    assert value(metrics, "cdc_sync_sink_applied_total", table=PRODUCTS, sink="cache") == 7
    processed = {"topic": "cdc.shop.products", "partition": "0"}
    assert value(metrics, "cdc_sync_processed_offset", consumer="job", **processed) == 11


def test_watermark_and_lag_seconds_are_computed_at_scrape_time_and_never_move_back() -> None:
    now = [1_700_000_010.0]
    metrics = JobMetrics(clock=lambda: now[0])
    table = TableId("shop", "products")
    newer = BatchMetrics(2, tables={table: TableProgress(3, 500, 1_700_000_004_000)})
    older = BatchMetrics(3, tables={table: TableProgress(1, 400, 1_700_000_002_000)})
    metrics.observe(newer, "search")
    metrics.observe(older, "search")  # a re-run batch: counted, but the watermark holds
    # Another consumer of the log, behind: its own watermark and lag (job.consumers).
    metrics.observe(older, "delta")
    search = {"consumer": "search", "table": PRODUCTS}
    assert value(metrics, "cdc_sync_applied_version", **search) == 500
    assert value(metrics, "cdc_sync_applied_source_timestamp_seconds", **search) == (
        1_700_000_004.0
    )
    assert value(metrics, "cdc_sync_lag_seconds", **search) == 6.0
    assert value(metrics, "cdc_sync_lag_seconds", consumer="delta", table=PRODUCTS) == 8.0
    now[0] += 30
    assert value(metrics, "cdc_sync_lag_seconds", **search) == 36.0
    assert value(metrics, "cdc_sync_table_changes_total", **search) == 4


def test_lag_in_records_is_the_end_offset_past_the_processed_one() -> None:
    readings = CaptureReadings(
        end_offsets={("t", 0): 120, ("t", 1): 50, ("t", 2): 7}, succeeded={"broker": True}
    )
    metrics = JobMetrics(capture=lambda: readings)
    metrics.observe(BatchMetrics(1, offsets={("t", 0): 99, ("t", 1): 49}), "search")
    metrics.observe(BatchMetrics(1, offsets={("t", 0): 9}), "redis")
    lag = partial(value, metrics, "cdc_sync_lag_records", topic="t")
    assert lag(consumer="search", partition="0") == 20
    assert lag(consumer="search", partition="1") == 0
    assert lag(consumer="redis", partition="0") == 110  # each consumer its own lag
    # Nothing processed from partition 2 since the job started: its end offset, no guessed lag.
    assert value(metrics, "cdc_sync_end_offset", topic="t", partition="2") == 7
    assert lag(consumer="search", partition="2") is None
    assert value(metrics, "cdc_sync_probe_success", probe="broker") == 1


def test_sink_state_and_retry_counts_follow_sink_health() -> None:
    health = SinkHealth(["search", "cache"])
    metrics = JobMetrics(health)
    error = ConnectionError("refused")
    health.waiting("search", "bulk of 10", 1_700_000_000.0, error)
    health.waiting("search", "bulk of 10", 1_700_000_000.0, error)
    assert value(metrics, "cdc_sync_sink_state", sink="search", state="waiting") == 1
    assert value(metrics, "cdc_sync_sink_state", sink="search", state="ok") == 0
    assert value(metrics, "cdc_sync_sink_state", sink="cache", state="ok") == 1
    assert value(metrics, "cdc_sync_sink_failed_attempts", sink="search") == 2
    health.recovered("search", "bulk of 10")
    assert value(metrics, "cdc_sync_sink_state", sink="search", state="ok") == 1
    assert value(metrics, "cdc_sync_sink_failed_attempts", sink="search") == 0
    assert value(metrics, "cdc_sync_sink_retries_total", sink="search") == 2
    health.gave_up("cache", "script", 1_700_000_000.0, error)
    assert value(metrics, "cdc_sync_sink_state", sink="cache", state="failed") == 1


def test_slot_and_connector_state_come_from_the_latest_readings() -> None:
    slot = Slot("shop_slot", "shop", "pgoutput", True, "reserved", 4096, 512)
    status = {
        "name": "shop",
        "connector": {"state": "RUNNING", "worker_id": "w:8083"},
        "tasks": [{"id": 0, "state": "RUNNING"}, {"id": 1, "state": "FAILED", "trace": "..."}],
    }
    assert connector_state(status) == ConnectorState("RUNNING", {"RUNNING": 1, "FAILED": 1})
    readings = CaptureReadings(slots=[slot], connector=connector_state(status))
    metrics = JobMetrics(capture=lambda: readings)
    assert value(metrics, "cdc_sync_slot_retained_wal_bytes", slot="shop_slot") == 4096
    assert value(metrics, "cdc_sync_slot_confirmed_lag_bytes", slot="shop_slot") == 512
    assert value(metrics, "cdc_sync_slot_active", slot="shop_slot") == 1
    assert value(metrics, "cdc_sync_connector_state", state="RUNNING") == 1
    assert value(metrics, "cdc_sync_connector_state", state="FAILED") == 0
    assert value(metrics, "cdc_sync_connector_tasks", state="FAILED") == 1


def test_a_failing_read_drops_its_values_until_it_recovers() -> None:
    ends = {("t", 0): 5}
    failing = [True]

    def read_ends() -> dict[tuple[str, int], int]:
        if failing[0]:
            raise TimeoutError("broker")
        return ends

    probes = CaptureProbes(end_offsets=read_ends, slots=lambda: [])
    probes.read_once()
    assert probes.readings().end_offsets is None
    assert probes.readings().succeeded == {"broker": False, "slot": True}
    failing[0] = False
    probes.read_once()
    assert probes.readings().end_offsets == ends
    assert probes.readings().succeeded["broker"] is True
    assert probes.stop()  # never started: nothing to wait for


def test_the_exposition_carries_no_row_values() -> None:
    applier, route = applier_with([ScriptedSink("search", refused=frozenset({1}))])
    metrics = JobMetrics(SinkHealth(["search"]))
    applier.observers.append(metrics.observer("job"))
    apply(applier, rows(route, range(1, 3), 100, 1_700_000_000_000), {("cdc.shop.products", 0): 1})
    text = generate_latest(metrics.registry).decode()
    assert "cdc_sync_sink_applied_total" in text
    assert SECRET_SKU not in text and REFUSAL not in text


def test_run_options_carry_the_metrics_port_and_host() -> None:
    defaults = JobOptions(Path("cp"), Path("wh"))
    parse = build_parser().parse_args
    off = job_options(parse(["run", "--mapping", "m.yaml"]), defaults)
    assert (off.metrics_port, off.metrics_host) == (None, "127.0.0.1")
    on = job_options(
        parse(
            ["run", "--mapping", "m.yaml", "--metrics-port", "9464", "--metrics-host", "0.0.0.0"]
        ),
        defaults,
    )
    assert (on.metrics_port, on.metrics_host) == (9464, "0.0.0.0")


def test_a_bad_metrics_port_is_refused_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--mapping", "m.yaml", "--metrics-port", "70000"])
    assert "--metrics-port" in capsys.readouterr().err


def test_run_reads_the_connector_state_only_when_a_connect_url_is_set() -> None:
    mapping = load_mapping(Path("mappings/shop.yaml"))
    plain = Connections(None, "k:9092", "kafka", None, "opensearch", None, None, None)
    assert connector_status(plain, mapping) is None
    with_connect = dataclasses.replace(plain, connect_url="http://127.0.0.1:8083")
    reader = connector_status(with_connect, mapping)
    assert isinstance(reader, partial) and reader.args == ("shop",)
