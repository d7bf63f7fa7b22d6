"""The document benchmark's pure parts: pgsync's nested schema mirrors the document spec, probe
slots own distinct rows and read the field they write, the Postgres load takes the baseline's
cost off, and the side-by-side ratios."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from cdc_sync.core.model import TableId
from cdc_sync.mapping import load_mapping
from cdc_sync.relations import Through

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_documents import median_of
from e2ebench import pgsync
from e2ebench.docprobe import Target, kind_summary, probe_targets, probe_value, reserved
from e2ebench.docreport import PGSYNC_LIMITS, build_cpu, compare, render
from e2ebench.documents import CHILD_OPERATIONS, CHILD_WEIGHTS, DOCUMENT, delete_line, insert_line
from e2ebench.pgload import delta, sync_share, unit_costs
from e2ebench.sampler import Probe

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
SPEC = load_mapping(ROOT / "mappings" / "shop.yaml").documents[DOCUMENT]


def test_pgsync_nested_schema_mirrors_the_document_spec() -> None:
    properties = {"id": {"type": "long"}, "lines": {"type": "nested", "properties": {}}}
    [document] = pgsync.nested_schema_document(SPEC, "shop", properties)
    assert document["index"] == "pgsync_shop_order_documents"
    assert document["mapping"] == properties  # cdc-sync's own types, as given
    root = document["nodes"]
    assert (root["schema"], root["table"]) == ("shop", "orders")
    assert root["columns"] == ["id", "status", "total", "placed_at"]
    assert "relationship" not in root and "label" not in root
    customer, lines = root["children"]
    assert customer["label"] == "customer" and customer["columns"] == ["id", "full_name", "tier"]
    # many-to-one: pgsync's one_to_one, the foreign key on the parent's side
    assert customer["relationship"] == {
        "variant": "object",
        "type": "one_to_one",
        "foreign_key": {"parent": ["customer_id"], "child": ["id"]},
    }
    assert lines["relationship"]["type"] == "one_to_many"
    assert lines["relationship"]["foreign_key"] == {"parent": ["id"], "child": ["order_id"]}
    assert lines["transform"] == {"rename": {"unit_price": "price"}}
    [product] = lines["children"]
    assert product["label"] == "product" and "children" not in product
    assert product["relationship"]["foreign_key"] == {"parent": ["product_id"], "child": ["id"]}


def test_pgsync_nested_schema_refuses_a_join_table() -> None:
    tags = dataclasses.replace(
        SPEC.relations[0], through=Through(TableId("shop", "product_tags"), (("id", "x"),))
    )
    with pytest.raises(ValueError, match="join table"):
        pgsync.nested_schema_document(dataclasses.replace(SPEC, relations=(tags,)), "shop", {})


def test_pgsync_counts_its_flat_indices_unless_told_otherwise(tmp_path: Path) -> None:
    flat = pgsync.PgSync(Path("bin"), tmp_path, {}, "http://127.0.0.1:1")
    nested = pgsync.PgSync(Path("bin"), tmp_path, {}, "http://127.0.0.1:1", indices=("x",))
    assert flat.indices == ("pgsync_shop_customers", "pgsync_shop_orders")
    assert nested.indices == ("x",)


def test_probe_slots_take_kinds_in_turn_and_own_distinct_rows() -> None:
    rows = [(order, 100 + order, 1, 200 + order) for order in range(1, 7)]
    targets = probe_targets(rows)
    assert [t.kind for t in targets.values()] == ["customer", "line", "product"] * 2
    kept = reserved(targets)
    assert kept.orders == frozenset(range(1, 7))
    assert kept.customers == frozenset({101, 104})  # customer slots only
    assert kept.products == frozenset({203, 206})  # product slots only
    shared = [(1, 100, 1, 200), (2, 101, 1, 200), (3, 102, 1, 200), (4, 100, 1, 201)]
    with pytest.raises(ValueError, match="share a customer"):
        probe_targets(shared)


def test_a_probe_reads_the_field_it_writes() -> None:
    document: dict[str, Any] = {
        "customer": {"full_name": "probe-a"},
        "lines": [
            {"line_no": 2, "quantity": 7, "product": {"name": "other"}},
            {"line_no": 1, "quantity": 1000001, "product": {"name": "probe-b"}},
        ],
    }
    assert probe_value(Target("customer", 1, 5, 1, 9), document) == "probe-a"
    assert probe_value(Target("line", 1, 5, 1, 9), document) == "1000001"
    assert probe_value(Target("product", 1, 5, 1, 9), document) == "probe-b"
    assert probe_value(Target("line", 1, 5, 3, 9), document) is None  # no such line
    assert probe_value(Target("customer", 1, 5, 1, 9), {"customer": None}) is None


def test_probe_figures_by_kind() -> None:
    targets = probe_targets([(order, order, 1, order) for order in range(1, 4)])
    seen = [Probe(1, "a", 0.0, {"search": 0.5}, ("search",)), Probe(2, "b", 0.0, {}, ("search",))]
    summary = kind_summary(seen, targets)
    assert summary["customer"] == {"probes": 1, "unresolved": 0, "p50": 0.5, "p99": 0.5}
    assert summary["line"] == {"probes": 1, "unresolved": 1, "p50": None, "p99": None}
    assert summary["product"]["probes"] == 0


def test_child_workload_keeps_the_lines_steady() -> None:
    assert len(CHILD_OPERATIONS) == len(CHILD_WEIGHTS)
    weights = dict(zip(CHILD_OPERATIONS, CHILD_WEIGHTS, strict=True))
    assert weights[insert_line] == weights[delete_line]


def _counters(scans: dict[str, int], commits: int) -> dict[str, Any]:
    return {"scans": scans, "rows_read": {t: 10 * n for t, n in scans.items()}, "commits": commits}


def test_postgres_load_takes_the_baselines_own_cost_off() -> None:
    before = _counters({"shop.orders": 5}, 100)
    after = _counters({"shop.orders": 25, "shop._view": 3}, 160)
    assert delta(before, after) == _counters({"shop.orders": 20, "shop._view": 3}, 60)
    baseline = {
        "changes": 100,
        "probes": 10,
        "workload": {"postgres": _counters({"shop.order_lines": 120}, 100)},
        "probe_burst": {"postgres": _counters({"shop.customers": 10}, 10)},
    }
    costs = unit_costs(baseline)
    assert costs["change"]["scans"]["shop.order_lines"] == 1.2
    # A step of 50 changes and 5 probes: own cost 60 + 5 scans, 50 + 5 transactions.
    step = _counters({"shop.order_lines": 60 + 55, "shop.customers": 5, "shop._view": 11}, 55)
    share = sync_share(step, 50, 5, costs)
    assert share["changes"] == 55 and not share["raw"]
    assert share["scans_per_change"] == 1.0  # the four document tables: 55 / 55
    assert share["all_scans_per_change"] == 1.2  # and the trigger's view: 11 / 55
    assert share["commits_per_change"] == 0.0
    assert share["scans_per_change_by_table"] == {"shop._view": 0.2, "shop.order_lines": 1.0}
    raw = sync_share(step, 50, 5, None)
    assert raw["raw"] and raw["commits_per_change"] == 1.0


def _phase(seconds: float, p50: float, fanout: float, scans: int) -> dict[str, Any]:
    latency = {"p50": p50, "p99": 2 * p50}
    return {
        "initial_build": {"seconds": seconds, "documents_per_second": 600 / seconds,
                          "documents": 600, "roots": 600},
        "streaming": [{
            "target_rate": 20.0, "drains": True, "drained_in_seconds": 1.0, "changes": 19,
            "probes_written": 1, "latency": {"probes": 1, "unresolved": 0, "search": latency},
            "postgres": _counters({"shop.orders": scans}, 20),
            "latency_by_kind": {"line": {"probes": 1, "unresolved": 1, "p50": None, "p99": None}},
            "stages": {"documents:shop_order_documents": {
                "records_per_batch": 12.0, "interval_mean_seconds": 0.5,
                "stage_mean_seconds": {"documents": 0.25}, "documents": 160}},
        }],
        "fanout": {"orders": 100, "first_seconds": fanout / 2, "all_seconds": fanout, "missing": 0},
    }  # fmt: skip


def test_comparison_ratios_are_cdc_sync_over_pgsync_and_name_pgsyncs_limits() -> None:
    result: dict[str, Any] = {
        "started": "now",
        "machine": "test",
        "options": {"rates": [20.0], "customers": 50, "orders": 500, "products": 100,
                    "fanout": 100, "step_seconds": 10.0, "document": DOCUMENT,
                    "tuning": {"REDIS_WRITE_CHUNK_SIZE": "1"}},
        "baseline": None,
        "systems": {"pgsync": _phase(2.0, 5.0, 10.0, 200), "cdc-sync": _phase(4.0, 0.5, 1.0, 0)},
    }  # fmt: skip
    rows = {(r["figure"], r["unit"]): r for r in compare(result)}
    assert rows[("initial build", "docs/s")]["ratio vs pgsync"] == 0.5
    assert rows[("20 changes/s, commit -> visible p50", "s")]["ratio vs pgsync"] == 0.1
    assert rows[("fan-out: all 100 orders visible", "s")]["ratio vs pgsync"] == 0.1
    scans = rows[("20 changes/s: Postgres scans/change, doc tables", "n")]
    assert (scans["cdc-sync"], scans["pgsync"], scans["ratio vs pgsync"]) == (0.0, 10.0, 0.0)
    assert "pgsync-tuned" not in scans
    result["comparison"] = list(rows.values())
    text = render(result)
    assert all(limit in text for limit in PGSYNC_LIMITS)
    assert "RAW: no baseline ran" in text
    assert "pgsync: 20 changes/s, scans/change by table: shop.orders 10.0" in text
    assert "p50/p99 s by probe kind: line -/- (1 unseen)" in text
    assert "batches of 12 records every 0.50 s, 0.25 s of it documents, 160 documents" in text
    assert "raw rewrite rate" not in text  # cdc-sync's phase measured none
    result["systems"]["cdc-sync"]["initial_build"]["stages"] = {
        "documents:shop_order_documents": {
            "batches": 3, "max_records": 2000, "documents": 600,
            "stage_mean_seconds": {"decode": 0.5, "documents": 4.0},
            "stage_batches": {"decode": 3, "documents": 1},
            "stage_max_seconds": {"decode": 0.7, "documents": 4.0},
        }
    }  # fmt: skip
    assert (
        "cdc-sync (documents:shop_order_documents): initial build: 3 batches of up to 2,000 "
        "records, 600 documents written; seconds in all: decode 1.50, documents 4.00"
    ) in render(result)
    result["systems"]["cdc-sync"]["raw_rewrites"] = {"nested": {"rate": 100.0, "documents": 50}}
    # 160 documents for 20 changes followed: 8 a change, 160/s needed at 20/s, 100/s raw.
    assert "20 changes/s needs 160 documents/s (8.0 a change), the server rewrites these " in (
        render(result)
    )


def test_the_builds_cpu_counts_each_process_once_against_the_machines_cores() -> None:
    def build(seconds: float, cpu: dict[str, float]) -> dict[str, Any]:
        return {"initial_build": {"seconds": seconds, "cpu_seconds": cpu}}

    result: dict[str, Any] = {
        "machine": "vm, 2 cores, load 0.2",
        "cores": 2,
        "systems": {
            "pgsync": build(100.0, {"pgsync": 10.0, "postgres": 5.0, "search": 105.0}),
            "cdc-sync": build(
                200.0, {"job": 60.0, "job: spark jvm": 30.0, "capture": 40.0, "search": 100.0}
            ),
            "baseline": None,
        },
    }
    assert build_cpu(result) == (
        "- initial build, CPU: pgsync 120.0 CPU s in 100.0 s (1.20 cores of 2; all of it "
        "overlapped needs >= 60.0 s); cdc-sync 200.0 CPU s in 200.0 s (1.00 cores of 2; all "
        "of it overlapped needs >= 100.0 s)"
    )
    del result["cores"]  # a run that did not record its cores
    assert build_cpu(result) == (
        "- initial build, CPU: pgsync 120.0 CPU s in 100.0 s (1.20 cores); cdc-sync 200.0 CPU s "
        "in 200.0 s (1.00 cores)"
    )


def test_the_fan_out_figure_is_the_median_of_its_renames_and_each_is_reported() -> None:
    assert median_of([7.5, 1.3, 1.4]) == 1.4  # one rename met the server's stall
    assert median_of([1.3, None, 1.4]) is None  # a rename that never showed everywhere
    result: dict[str, Any] = {
        "started": "now",
        "machine": "test",
        "options": {"rates": [], "customers": 50, "orders": 500, "products": 100,
                    "fanout": 100, "step_seconds": 10.0, "document": DOCUMENT, "tuning": {}},
        "baseline": None,
        "systems": {"pgsync": _phase(2.0, 5.0, 10.0, 200), "cdc-sync": _phase(4.0, 0.5, 1.0, 0)},
    }  # fmt: skip
    result["systems"]["cdc-sync"]["fanout"]["renames"] = [
        {"all_seconds": s} for s in (7.5, 1.3, 1.4)
    ]
    result["comparison"] = compare(result)
    assert "cdc-sync: fan-out, all orders visible after each rename: 7.50, 1.30, 1.40 s" in (
        render(result)
    )
