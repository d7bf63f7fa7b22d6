"""The pgsync comparison's pure parts: pgsync's schema carries the search routes' fields, its
settings come from the stack's URLs, a search-only probe resolves, and the ratios."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cdc_sync.mapping import load_mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_pgsync import compare, render
from e2ebench import pgsync
from e2ebench.sampler import Probe, latency_summary

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_pgsync_schema_has_the_search_routes_fields_flat() -> None:
    documents = pgsync.schema_document(load_mapping(ROOT / "mappings" / "shop.yaml"), "shop")
    by_index = {d["index"]: d for d in documents}
    orders = by_index["pgsync_shop_orders"]
    # The mapping's projection: internal_note stays out, as in cdc-sync's documents.
    assert orders["nodes"] == {
        "table": "orders",
        "schema": "shop",
        "columns": ["id", "customer_id", "status", "total", "placed_at"],
    }
    assert orders["mapping"]["total"] == {"type": "scaled_float", "scaling_factor": 100}
    customers = by_index["pgsync_shop_customers"]["nodes"]
    assert "children" not in customers  # flat: a root node only
    assert customers["columns"] == ["id", "email", "full_name", "tier", "created_at", "updated_at"]


def test_pgsync_environment_from_the_stack_urls(tmp_path: Path) -> None:
    env = pgsync.environment(
        "postgresql://cdc_admin@127.0.0.1:5433/shop",
        "http://127.0.0.1:9201",
        "redis://127.0.0.1:6380/0",
        tmp_path,
        {"REDIS_WRITE_CHUNK_SIZE": "1"},
    )
    assert env["PG_HOST"] == "127.0.0.1" and env["PG_PORT"] == "5433"
    assert env["PG_USER"] == "cdc_admin" and env["PG_DATABASE"] == "shop"
    assert "PG_PASSWORD" not in env
    assert (env["ELASTICSEARCH_HOST"], env["ELASTICSEARCH_PORT"]) == ("127.0.0.1", "9201")
    assert env["OPENSEARCH"] == "true"
    assert (env["REDIS_HOST"], env["REDIS_PORT"], env["REDIS_DB"]) == ("127.0.0.1", "6380", "0")
    assert env["CHECKPOINT_PATH"] == str(tmp_path)
    assert env["REDIS_WRITE_CHUNK_SIZE"] == "1"


def test_search_only_probes_resolve_and_summarise_search_only() -> None:
    probe = Probe(1, "probe-x", 0.0, sinks=("search",))
    assert not probe.done
    probe.seen["search"] = 0.25
    assert probe.done
    summary = latency_summary([probe])
    assert summary["unresolved"] == 0
    assert summary["search"]["p50"] == 0.25 and summary["all"]["p50"] == 0.25
    assert "redis" not in summary and "delta" not in summary


def _phase(initial: Any, p50: float, p99: float) -> dict[str, Any]:
    latency = {"p50": p50, "p99": p99}
    return {
        "initial_sync": {"rows_per_second": initial},
        "streaming": [
            {"target_rate": 20.0, "drains": True, "latency": {"search": latency, "all": latency}}
        ],
    }


def test_comparison_ratios_are_cdc_sync_over_pgsync() -> None:
    result: dict[str, Any] = {
        "started": "now",
        "machine": "test",
        "options": {
            "rates": [20.0],
            "customers": 1,
            "orders": 10,
            "step_seconds": 60.0,
            "tuning": {"REDIS_WRITE_CHUNK_SIZE": "1"},
        },
        "systems": {
            "pgsync": _phase(700.0, 17.0, 30.0),
            "pgsync-tuned": _phase(750.0, 0.1, 0.5),
            "cdc-sync": _phase({"search": 1400.0, "redis": 2000.0, "delta": 900.0}, 0.5, 1.0)
            | {
                "initial_sync": {
                    "rows_per_second": {"search": 1400.0},
                    "all_sinks_rows_per_second": 900.0,
                }
            },
        },
    }
    rows = {row["figure"]: row for row in compare(result)}
    initial = rows["initial sync into search"]
    assert initial["ratio vs pgsync"] == 2.0 and initial["cdc-sync"] == 1400.0
    p50 = rows["20 changes/s search p50"]
    assert p50["ratio vs pgsync-tuned"] == 5.0
    assert rows["20 changes/s search p99"]["ratio vs pgsync"] == round(1.0 / 30.0, 3)
    assert rows["cdc-sync initial sync, all three sinks"]["cdc-sync"] == 900.0
    result["comparison"] = list(rows.values())
    assert "ratio vs pgsync-tuned" in render(result)
