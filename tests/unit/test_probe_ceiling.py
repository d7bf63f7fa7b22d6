"""The ceiling probe (benchmarks/probe_document_fanout.py): its layout gives each chosen parent
exactly K roots, its batches read every row once as the job's source shares them, its figures'
arithmetic; and a small run of the probe itself, through the job's own document step."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import probe_document_fanout
from e2ebench.ceiling import (
    CUSTOMERS,
    KEYS,
    LINES,
    ORDERS,
    PRODUCTS,
    SCHEMAS,
    TABLES,
    Layout,
    Phase,
    Spread,
    batch_slices,
    fitting,
    parse_sizes,
    renamed_customer,
    renamed_product,
    state_json,
)

from cdc_sync.core.model import TableId

pytestmark = pytest.mark.unit


@given(st.integers(1, 3000), st.integers(0, 4))
def test_a_spread_is_a_bijection(size: int, salt: int) -> None:
    spread = Spread.of(size, salt)
    assert sorted(spread(i) for i in range(size)) == list(range(size))


@given(st.lists(st.integers(0, 5000), max_size=6), st.integers(1, 12_000))
def test_the_fanouts_that_fit_are_the_smallest_whose_sum_fits(
    fanouts: list[int], roots: int
) -> None:
    kept, skipped = fitting(fanouts, roots)
    assert list(kept) == sorted(kept) and sum(kept) <= roots
    assert set(kept) | set(skipped) == set(fanouts) and not set(kept) & set(skipped)
    for k in skipped:  # each left out because it would not fit after the smaller ones
        assert k <= 0 or sum(x for x in kept if x < k) + k > roots


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    roots = draw(st.integers(1, 1500))
    wanted = draw(st.lists(st.integers(1, roots), max_size=3, unique=True))
    return Layout(
        roots,
        draw(st.integers(1, 4)),
        draw(st.integers(1, 30)),
        draw(st.integers(1, 200)),
        fitting(wanted, roots)[0],
    )


@settings(deadline=None)
@given(layouts())
def test_each_chosen_parent_reaches_exactly_its_k_roots(layout: Layout) -> None:
    orders = range(1, layout.roots + 1)
    owners = Counter(layout.customer_of(o) for o in orders)
    products = Counter(layout.product_of(o, n) for o in orders for n in range(1, layout.lines + 1))
    rows = layout.rows()
    for ident, k in enumerate(layout.fanouts, start=1):
        assert owners[ident] == k
        assert products[ident] == k
        lines_of = {(o, n) for o in orders for n in range(2, layout.lines + 1)}
        assert all(layout.product_of(o, n) != ident for o, n in lines_of)  # line 1 only
    # Every other customer owns per_customer orders (the last one fewer), every row counted.
    regular = sorted(n for c, n in owners.items() if c > layout.hot)
    assert all(n == layout.per_customer for n in regular[1:])
    assert set(owners) == set(range(1, rows[CUSTOMERS] + 1))
    assert set(products) <= set(range(1, rows[PRODUCTS] + 1))
    assert rows[ORDERS] == layout.roots and rows[LINES] == layout.roots * layout.lines


@settings(deadline=None)
@given(layouts())
def test_rows_carry_their_schema_columns_and_the_layout_s_parents(layout: Layout) -> None:
    for table in TABLES:
        for index in (0, layout.rows()[table] - 1):
            row = layout.row(table, index)
            assert list(row) == [c.name for c in SCHEMAS[table].columns]
            assert all(row[k] is not None for k in KEYS[table])
    last = layout.row(LINES, layout.roots * layout.lines - 1)
    assert (last["order_id"], last["line_no"]) == (layout.roots, layout.lines)
    assert last["product_id"] == layout.product_of(layout.roots, layout.lines)
    assert layout.row(ORDERS, 0)["customer_id"] == layout.customer_of(1)


@settings(deadline=None)
@given(
    st.dictionaries(st.sampled_from(TABLES), st.integers(0, 5000), min_size=1),
    st.integers(20, 3000),
)
def test_batches_read_every_row_once_at_most_limit_at_a_time(
    rows: dict[TableId, int], limit: int
) -> None:
    seen: dict[TableId, list[int]] = {table: [] for table in rows}
    batches = list(batch_slices(rows, limit))
    for batch in batches:
        assert 0 < sum(len(r) for r in batch.values()) <= limit
        for table, indexes in batch.items():
            seen[table] += list(indexes)
    assert seen == {table: list(range(count)) for table, count in rows.items()}
    total = sum(rows.values())
    assert len(batches) == -(-total // limit)  # each batch full but the last


def test_batches_share_the_limit_by_backlog() -> None:
    first = next(batch_slices({ORDERS: 1000, LINES: 3000}, 400))
    assert (len(first[ORDERS]), len(first[LINES])) == (100, 300)


def test_the_checks_find_the_renamed_parent() -> None:
    document = {
        "customer": {"full_name": "New"},
        "lines": [{"product": {"id": 1, "name": "Old"}}, {"product": {"id": 2, "name": "New"}}],
    }
    assert renamed_customer("New")(document) and not renamed_customer("Old")(document)
    assert renamed_product(2, "New")(document) and not renamed_product(1, "New")(document)
    assert not renamed_product(1, "New")({"lines": []})


def test_figures_per_second_per_row_and_root() -> None:
    phase = Phase()
    phase.add(1000, 2.0, 0.5)
    phase.add(1000, 2.0, 0.5)
    figures = phase.json()
    assert (figures["items"], figures["per_second"], figures["per_cpu_second"]) == (
        2000,
        500.0,
        2000.0,
    )
    assert figures["heap_peak_mib"] is None
    state = state_json({"rows": 3 * 2**20, "links": 2**20}, 4 * 2**20, 1024, 256)
    assert (state["bytes_per_row"], state["bytes_per_root"]) == (4096.0, 16384.0)
    assert list(state["parts_mib"].items()) == [("rows", 3.0), ("links", 1.0)]


def test_sizes_parse_and_bad_ones_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_sizes("1_000,20000") == [1000, 20000]
    for option, bad in (("--roots-list", ""), ("--roots-list", "0,5"), ("--fanouts", "1e6")):
        with pytest.raises(SystemExit):
            probe_document_fanout.parse_args([option, bad])
        error = capsys.readouterr().err
        assert f"argument {option}: positive counts" in error and repr(bad) in error


def test_layout_refuses_what_it_cannot_lay_out() -> None:
    with pytest.raises(ValueError, match="per_customer"):
        Layout(10, 3, 0, 5)
    with pytest.raises(ValueError, match="fan-outs"):
        Layout(10, 3, 1, 5, (6, 5))


def test_a_small_run_passes_its_own_checks(tmp_path: Path) -> None:
    """The probe through the job's step: every root built, each fan-out reaching exactly K
    roots with the new name, the e-mail change writing nothing."""
    output = tmp_path / "ceiling.json"
    argv = ["--roots-list", "300,600", "--fanouts", "20,200,500", "--batch", "500"]
    code = probe_document_fanout.main(
        [*argv, "--state-dir", str(tmp_path), "--output", str(output)]
    )
    assert code == 0
    result = json.loads(output.read_text())
    small, large = result["sizes"]
    assert small["fanouts_not_fitting"] == [500] and large["fanouts_not_fitting"] == [500]
    assert small["build"]["render_documents"]["items"] == 300
    assert [(f["k"], f["written"]) for f in large["fanout"]] == [
        (20, 20),
        (20, 20),
        (20, 0),
        (200, 200),
        (200, 200),
        (200, 0),
    ]
    assert all(f["heap_peak_mib"] is not None for f in large["fanout"] if f["written"])
    assert large["state"]["bytes"] > small["state"]["bytes"] > 0
    assert not list(tmp_path.glob("probe-ceiling-*"))  # the states are deleted
