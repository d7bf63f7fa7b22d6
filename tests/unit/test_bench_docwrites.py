"""The document probe's pure parts (benchmarks/probe_document_pattern.py): one factor per case,
the bulk bodies the server is sent, the documents' shape, the best case and the verdict read as
ratios to raw, and the steady rule shared with the end-to-end bench."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from e2ebench import raw
from e2ebench.docwrites import (
    JOB_BULK,
    RAW_BULK,
    Case,
    CaseResult,
    Pass,
    Stream,
    as_objects,
    best_case,
    bulk_bodies,
    content_hash,
    document_shape,
    factor_cases,
    nested_and_objects,
    noise_case,
    ratio,
    renamed,
    result_json,
    table_row,
    verdict,
)

from cdc_sync.sinks.search.actions import VERSION_TYPE

pytestmark = pytest.mark.unit

ORDER = {
    "id": 7,
    "status": "new",
    "customer": {"id": 1, "full_name": "Ann", "tier": "gold"},
    "lines": [
        {"line_no": 1, "quantity": 2, "product": {"id": 3, "name": "P3"}},
        {"line_no": 2, "quantity": 1, "product": {"id": 4, "name": "P4"}},
    ],
}


def test_each_case_changes_one_factor_of_raw() -> None:
    cases = factor_cases([100, RAW_BULK, 1000], [1, 2, 4])
    raw_case = cases[0]
    assert (raw_case.factor, raw_case.nested, raw_case.versioned) == ("raw", False, False)
    assert (raw_case.bulk, raw_case.writers) == (RAW_BULK, 1)
    for case in cases[1:-1]:
        differs = {
            field
            for field in ("nested", "versioned", "bulk", "writers")
            if getattr(case, field) != getattr(raw_case, field)
        }
        assert len(differs) == 1, case
    assert [c.bulk for c in cases if c.factor == "bulk"] == [100, 1000]  # raw's size once
    assert [c.writers for c in cases if c.factor == "writers"] == [2, 4]
    job = cases[-1]
    assert (job.factor, job.nested, job.versioned, job.bulk, job.writers) == (
        "job",
        True,
        True,
        JOB_BULK,
        1,
    )
    assert job.unchanged and not any(c.unchanged for c in cases[:-1])


def test_bulk_bodies_are_ndjson_of_index_actions_with_or_without_versions() -> None:
    documents = [(str(i), {"id": i}) for i in range(5)]
    versioned = bulk_bodies("idx", documents, 2, 9)
    assert len(versioned) == 3
    lines = [json.loads(line) for body in versioned for line in body.decode().splitlines()]
    assert lines[0] == {
        "index": {"_index": "idx", "_id": "0", "version": 9, "version_type": VERSION_TYPE}
    }
    assert lines[1::2] == [{"id": i} for i in range(5)]
    assert all(body.endswith(b"\n") for body in versioned)
    [plain] = bulk_bodies("idx", documents[:1], 10, None)
    assert json.loads(plain.decode().splitlines()[0]) == {"index": {"_index": "idx", "_id": "0"}}


def test_shape_counts_objects_and_array_elements() -> None:
    # customer, 2 lines, 2 products; the lines are array elements
    assert nested_and_objects(ORDER) == (2, 5)
    shape = document_shape([("7", ORDER), ("8", {"id": 8, "lines": []})])
    assert (shape.documents, shape.mean_objects, shape.mean_nested) == (2, 2.5, 1.0)
    assert shape.max_bytes == len(json.dumps(ORDER, separators=(",", ":")))


def test_as_objects_maps_every_nested_field_as_object_and_keeps_the_rest() -> None:
    mapping: dict[str, Any] = {
        "properties": {
            "id": {"type": "long"},
            "lines": {
                "type": "nested",
                "properties": {"tags": {"type": "nested", "properties": {}}},
            },
        }
    }
    flat = as_objects(mapping)
    assert flat["properties"]["lines"]["type"] == "object"
    assert flat["properties"]["lines"]["properties"]["tags"]["type"] == "object"
    assert flat["properties"]["id"] == {"type": "long"}
    assert mapping["properties"]["lines"]["type"] == "nested"  # the input is left alone


def test_renamed_changes_only_the_customer_name() -> None:
    [(doc_id, doc)] = renamed([("7", ORDER)], "Renamed")
    assert doc_id == "7" and doc["customer"] == {"id": 1, "full_name": "Renamed", "tier": "gold"}
    assert {k: v for k, v in doc.items() if k != "customer"} == {
        k: v for k, v in ORDER.items() if k != "customer"
    }
    assert ORDER["customer"]["full_name"] == "Ann"  # type: ignore[index]


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=6))
def test_content_hash_ignores_key_order_only(document: dict[str, object]) -> None:
    shuffled = dict(reversed(list(document.items())))
    assert content_hash(shuffled) == content_hash(document)
    assert content_hash({**document, "\x00changed": 1}) != content_hash(document)


def result(case: Case, new: float, stream: float, rewrites: float, cpu: float = 10.0) -> CaseResult:
    """A case whose passes wrote 1,000 documents at these rates (stream: per second)."""
    return CaseResult(
        case,
        Pass(1000, 1000 / new, 1, 0.1, cpu),
        Stream(0.5, True, int(stream * 10), 10.0, 0, 0.1, 1.0),
        Pass(1000, 1000 / rewrites, 1, 0.1, cpu),
    )


def results() -> list[CaseResult]:
    cases = {c.name: c for c in factor_cases([100, 1000], [2])}
    by_factor = {c.factor + (str(c.bulk) if c.factor == "bulk" else ""): c for c in cases.values()}
    return [
        result(by_factor["raw"], 400, 100, 300),
        result(by_factor["versions"], 390, 100, 290),
        result(by_factor["mapping"], 200, 80, 150, cpu=20.0),
        result(by_factor["bulk100"], 300, 100, 250),  # weakest 0.83
        result(by_factor["bulk1000"], 420, 2, 310),  # stalls after the load: weakest 0.02
        result(by_factor["writers"], 600, 100, 360),
        result(by_factor["job"], 150, 1, 100),
    ]


def test_ratios_are_to_raws_figure_of_the_same_kind() -> None:
    found = results()
    raw_result, mapping = found[0], found[2]
    assert ratio(mapping, raw_result, "new") == pytest.approx(0.5)
    assert ratio(mapping, raw_result, "stream") == pytest.approx(0.8)
    assert ratio(mapping, raw_result, "rewrites") == pytest.approx(0.5)
    again = Pass(1000, 1000 / 600, 1, 0.1, 1.0)
    unchanged = CaseResult(mapping.case, mapping.new, mapping.stream, mapping.rewrites, again)
    assert ratio(unchanged, raw_result, "unchanged") == pytest.approx(2.0)  # to raw's rewrites
    assert ratio(mapping, raw_result, "unchanged") is None


def test_best_case_keeps_versions_and_nested_and_takes_the_sweeps_best() -> None:
    best = best_case(results())
    # bulk 1000 loads fastest but its stream stalls: the weakest figure decides; raw's 5,000
    assert (best.factor, best.nested, best.versioned) == ("best", True, True)
    assert best.bulk == RAW_BULK
    assert best.writers == 2  # 2 writers: x1.5 new ids, x1.2 rewrites


def test_verdict_names_the_costliest_factor_and_whether_render_is_the_bound() -> None:
    line = verdict(results(), {"render": 3000.0, "skip check": 50_000.0})
    assert line.startswith("verdict (ratios to raw: new ids / stream / rewrites, the server's")
    assert "the job's writes x0.38 / x0.01 / x0.33, CPU x1.00;" in line
    assert "+ nested mapping x0.50 / x0.80 / x0.50, CPU x2.00;" in line
    assert "costliest factor: bulk 1000 (x0.02)" in line
    assert "render CPU x7.50 of raw new ids (not the bound)" in line
    assert "parallel writers (new ids / rewrites) 2: x1.50 / x1.20" in line
    assert "render CPU x0.50" in verdict(results(), {"render": 200.0})


def test_table_row_and_json_carry_the_ratios() -> None:
    found = results()
    row = table_row(found[2], found[0])
    assert row.startswith("+ nested mapping") and "x0.50" in row and "x0.80" in row
    data = result_json(found[2], found[0])
    assert data["x_raw"] == {"new": 0.5, "stream": 0.8, "rewrites": 0.5, "unchanged": None}
    assert data["new"]["rate"] == 200.0 and data["case"]["nested"] is True
    json.dumps(data)


def test_steady_bulks_warms_up_until_enough_fast_bulks_in_a_row() -> None:
    seconds = iter([1.0, 0.5] + [0.0] * 1000)  # what each bulk "took"
    found = raw.steady_bulks(lambda: next(seconds), seconds=0.0, warmup_limit=60.0)
    assert found.steady
    assert found.warmup == [1.0, 0.5] + [0.0] * raw.STEADY_BULKS
    assert found.timed == [0.0]  # at least one timed bulk


def test_steady_bulks_stops_warming_at_its_limit() -> None:
    found = raw.steady_bulks(lambda: 1.0, seconds=0.0, warmup_limit=0.0)
    assert not found.steady and found.warmup == [] and found.timed == [1.0]


def test_raw_again_at_the_end_gives_the_noise_band() -> None:
    again = noise_case()
    assert again.factor == "noise"
    assert (again.nested, again.versioned, again.bulk, again.writers) == (False, False, RAW_BULK, 1)
    line = verdict([*results(), result(again, 360, 110, 300)], {})
    assert "raw again at the end x0.90 / x1.10 / x1.00, CPU x1.00: ratios that close" in line
