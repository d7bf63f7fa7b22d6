"""bench_documents' drain bound (benchmarks/e2ebench/docbound.py): documents a change reaches,
from a drained step's own batch lines, against the same run's raw rewrite rate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from e2ebench.docbound import bound_line, documents_per_change, drain_bounds

pytestmark = pytest.mark.unit

# The index's own mapping (`nested`) is the documents' rate; `object` is another index's.
RAW = {"nested": {"rate": 400.0}, "object": {"rate": 900.0}}


def step(rate: float, drains: bool, changes: int, documents: int) -> dict[str, object]:
    return {
        "target_rate": rate,
        "drains": drains,
        "changes": changes,
        "probes_written": 0,
        "stages": {"documents:shop_order_documents": {"documents": documents}},
    }


def test_documents_a_change_reaches_come_from_the_fastest_drained_step() -> None:
    steps = [step(20, True, 1000, 8000), step(50, True, 2000, 18000), step(100, False, 6000, 900)]

    assert documents_per_change(steps) == 9.0


def test_a_rate_needing_more_than_the_raw_rate_is_the_servers_bound() -> None:
    steps = [step(20, True, 1200, 9840), step(100, False, 6000, 32000)]

    twenty, hundred = drain_bounds([20, 100], steps, RAW)

    assert twenty["documents_per_second_needed"] == 164.0 and twenty["server_allows"]
    assert hundred["documents_per_second_needed"] == 820.0
    assert hundred["raw_rewrites_per_second"] == 400.0 and hundred["server_allows"] is False
    assert "the server's bound" in bound_line(hundred, drains=False)
    assert bound_line(twenty, drains=True).endswith(": drained")


def test_a_rate_the_server_allows_that_did_not_drain_is_not_called_a_bound() -> None:
    steps = [step(20, True, 1000, 2000), step(100, False, 6000, 900)]

    hundred = drain_bounds([100], steps, RAW)[0]

    assert hundred["server_allows"] is True
    assert "did not drain, though the server allows it" in bound_line(hundred, drains=False)


def test_no_drained_step_or_no_raw_rate_claims_nothing() -> None:
    assert drain_bounds([100], [step(100, False, 10, 5)], RAW)[0]["server_allows"] is None
    assert drain_bounds([20], [step(20, True, 10, 5)], None)[0]["server_allows"] is None
    assert "no bound" in bound_line(drain_bounds([20], [], RAW)[0], drains=False)


def test_the_runs_own_index_bounds_the_rate_when_it_rewrites_slower_than_a_fresh_one() -> None:
    # The local server's work for a document grows with the rewrites its index has had: a
    # rate the fresh scratch index allows may be beyond the index the steps wrote.
    steps = [step(20, True, 1000, 7420), step(100, False, 6000, 900)]
    aged = {**RAW, "nested": {"rate": 1260.0}, "in_place": {"rate": 300.0}}

    hundred = drain_bounds([100], steps, aged)[0]

    assert hundred["raw_rewrites_per_second"] == 300.0 and hundred["server_allows"] is False
    assert (
        drain_bounds([100], steps, {**aged, "in_place": {"rate": 2000.0}})[0][
            "raw_rewrites_per_second"
        ]
        == 1260.0
    )
