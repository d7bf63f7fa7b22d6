"""The ceiling of one driver for a document index: the job's document step at N roots, no server.

    .venv/bin/python benchmarks/probe_document_fanout.py [--roots 20000 | --roots-list A,B,...]
        [--lines 3] [--per-customer 10] [--products P] [--fanouts 1000,10000,100000,1000000]
        [--batch 20000] [--state-dir DIR] [--no-heap] [--output FILE]

For each size N: the demo's `shop_order_documents` (mappings/shop.yaml) over N orders of L lines
each, customers owning R orders each, P products (default N/10, the bench's ratio) and, for each
K of --fanouts that fits, one customer owning K orders and one product in line 1 of K orders
(e2ebench/ceiling.py lays the rows out). The job's own `DocumentSync` keeps the state (a SQLite
file in --state-dir, deleted after each size); the writer only counts, sizes and checks what it
is given, so the figures are the driver's own work:

1. the build: every row merged into the state in the job's batches (--batch records, shared
   across the four topics as the job's source shares them; full batches of snapshot rows, whose
   roots wait), then every root rendered and handed to the writer (the batch that ends the
   backlog): rows/s and documents/s, wall and CPU seconds, RSS;
2. the state's size on disk, per row, per root and per B-tree (SQLite's dbstat);
3. per K: the customer's rename (reaching its K orders), the product's rename (its K lines, their
   K orders) and a change of the customer's e-mail, which no document shows (K roots rendered,
   none written: the digest per root). Each rename is repeated under tracemalloc for the Python
   heap's peak (--no-heap skips the repeats: they take 2-3 times as long).

RSS is the process's (VmRSS at the start of a phase, VmHWM reset per phase). Writes JSON after
each size (benchmarks/results/probe-ceiling-<date>.json unless --output); exits 1 if a check
failed (a root not rendered with the new name, a document written for the e-mail change).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # e2ebench.*

from e2ebench.ceiling import (  # noqa: E402
    CUSTOMERS,
    FANOUTS,
    KEYS,
    PRODUCTS,
    SCHEMAS,
    Check,
    Layout,
    Phase,
    batch_slices,
    customer_row,
    fitting,
    mib,
    parse_sizes,
    product_row,
    renamed_customer,
    renamed_product,
    state_json,
)
from e2ebench.report import output_path, run_header  # noqa: E402

from cdc_sync.core.model import Change, Coordinates, Op, TableId  # noqa: E402
from cdc_sync.core.types import RowSchema  # noqa: E402
from cdc_sync.documents.comparisons import schema_types  # noqa: E402
from cdc_sync.documents.sync import DocumentSync  # noqa: E402
from cdc_sync.job.options import DEFAULT_MAX_OFFSETS_PER_TRIGGER  # noqa: E402
from cdc_sync.mapping import TableRoute, load_mapping  # noqa: E402
from cdc_sync.sinks.base import WriteResult  # noqa: E402
from cdc_sync.sinks.search.actions import BulkAction  # noqa: E402

MAPPING = ROOT / "mappings" / "shop.yaml"
DOCUMENT = "shop_order_documents"
SIZE_SAMPLE = 64  # every 64th document is serialized to size it (the writer's own cost stays low)
T = TypeVar("T")


class CountingWriter:
    """A writer that keeps nothing: counts documents, sizes a sample of them as JSON, and counts
    those `check` accepts."""

    def __init__(self) -> None:
        self.documents = 0
        self.sized = 0
        self.bytes = 0
        self.check: Check | None = None
        self.passed = 0

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        pass

    def holds(self, alias: str) -> bool:
        return True

    def index_exists(self, index: str) -> bool:
        return False

    def next_generation(self, route: TableRoute) -> str:
        raise AssertionError("no rebuild expected")

    def promote(self, alias: str, index: str) -> None:
        raise AssertionError("no rebuild expected")

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
        for action in actions:
            self.documents += 1
            document = action.document or {}
            if self.documents % SIZE_SAMPLE == 0:
                self.sized += 1
                self.bytes += len(json.dumps(document))
            if self.check is not None:
                self.passed += self.check(document)
        return WriteResult(applied=len(actions))


def change(table: TableId, row: dict[str, Any], version: int, op: Op) -> Change:
    return Change(
        table,
        tuple((k, row[k]) for k in KEYS[table]),
        op,
        version,
        row,
        Coordinates(f"cdc.{table}", 0, version),
        schema=SCHEMAS[table],
    )


# -- measuring ---------------------------------------------------------------------------------


def _status(field: str) -> int:
    """A VmRSS/VmHWM figure of this process, in bytes (0 where /proc is not there)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def start(phase: Phase) -> Phase:
    """The RSS now, and its high-water mark reset (Linux: clear_refs 5), so the peak is the
    phase's own."""
    with contextlib.suppress(OSError):  # else the peak is the process's since it started
        Path("/proc/self/clear_refs").write_text("5")
    phase.rss_start = _status("VmRSS")
    return phase


def finish(phase: Phase) -> Phase:
    phase.rss_peak = _status("VmHWM")
    return phase


def timed(phase: Phase, items: int, work: Callable[[], T]) -> T:
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    phase.add(items, time.perf_counter() - wall, time.process_time() - cpu)
    return result


def heap_peak(work: Callable[[], object]) -> int:
    """The Python heap's peak during `work`, tracemalloc's (which slows it 2-3 times)."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- the steps ---------------------------------------------------------------------------------


PROGRESS_BATCHES = 100  # merge batches between progress lines


def build(sync: DocumentSync, layout: Layout, writer: CountingWriter, batch: int) -> list[Phase]:
    """Every row merged in the job's batches (each taken as full: its roots wait), then every
    pending root rendered: the merge's and the render's figures."""
    merge = start(Phase())
    for number, slices in enumerate(batch_slices(layout.rows(), batch)):
        changes = {
            table: [change(table, layout.row(table, i), 1, Op.READ) for i in indexes]
            for table, indexes in slices.items()
        }
        records = sum(len(indexes) for indexes in slices.values())
        timed(merge, records, partial(sync.apply, [], changes, records=batch, batch_id=number))
        if number % PROGRESS_BATCHES == PROGRESS_BATCHES - 1:  # a long run shows its pace
            print(
                f"  merged {merge.items:,} rows in {merge.wall:.0f} s "
                f"({merge.items / merge.wall:,.0f}/s, {merge.cpu:.0f} CPU s)",
                flush=True,
            )
    finish(merge)
    print(
        f"  merge: {merge.items:,} rows in {merge.wall:.1f} s "
        f"({merge.items / merge.wall:,.0f}/s, {merge.cpu:.1f} CPU s)",
        flush=True,
    )
    render = start(Phase())
    before = writer.documents
    timed(render, 0, lambda: sync.apply([], {}))
    render.items = writer.documents - before
    return [merge, finish(render)]


def state_size(sync: DocumentSync) -> tuple[int, dict[str, int]]:
    """The state's files' bytes (its WAL checkpointed first), and each B-tree's (dbstat)."""
    sync.state.forget_freed()
    path = sync.state.path
    files = sum(
        p.stat().st_size
        for p in (path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm"))
        if p.exists()
    )
    parts = sync.state.conn.execute("SELECT name, pgsize FROM dbstat WHERE aggregate = TRUE")
    return files, {str(name): int(size) for name, size in parts}


def fanout(
    sync: DocumentSync,
    writer: CountingWriter,
    versions: Iterator[int],
    table: TableId,
    rows: Sequence[dict[str, Any]],
    check: Check | None,
    reached: int,
) -> tuple[Phase, int, int]:
    """The first row's update, reaching `reached` roots, applied and rendered (timed), the
    others under tracemalloc: the figures, the documents written, those `check` accepted (of
    the timed one)."""
    writer.check, writer.passed, before = check, 0, writer.documents
    phase = start(Phase())
    first = {table: [change(table, rows[0], next(versions), Op.UPDATE)]}
    timed(phase, reached, partial(sync.apply, [], first))
    finish(phase)
    written, passed = writer.documents - before, writer.passed
    for row in rows[1:]:
        update = {table: [change(table, row, next(versions), Op.UPDATE)]}
        peak = heap_peak(partial(sync.apply, [], update))
        phase.heap_peak = max(phase.heap_peak or 0, peak)
    writer.check = None
    return phase, written, passed


def fanouts(
    sync: DocumentSync, layout: Layout, writer: CountingWriter, heap: bool
) -> tuple[list[dict[str, Any]], list[str]]:
    """Per K: the hot customer's rename, its product's rename, the customer's e-mail change."""
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    versions = itertools.count(2)  # the build's rows are at version 1
    for ident, k in enumerate(layout.fanouts, start=1):
        names = [f"Renamed {k}", f"Renamed {k} again"][: 2 if heap else 1]
        cases: list[tuple[str, TableId, list[dict[str, Any]], Check | None, int]] = [
            (
                "customer renamed",
                CUSTOMERS,
                [customer_row(ident, full_name=n) for n in names],
                renamed_customer(names[0]),
                k,
            ),
            (
                "product renamed",
                PRODUCTS,
                [product_row(ident, name=n) for n in names],
                renamed_product(ident, names[0]),
                k,
            ),
            (
                "customer e-mail (in no document)",
                CUSTOMERS,
                [customer_row(ident, full_name=names[-1], email=f"moved{ident}@example.org")],
                None,
                0,
            ),
        ]
        for label, table, rows, check, expected in cases:
            phase, written, passed = fanout(sync, writer, versions, table, rows, check, k)
            ok = written == expected and (check is None or passed == expected)
            if not ok:
                failures.append(
                    f"K={k} {label}: {written} written, {passed} checked, {expected} expected"
                )
            results.append({"k": k, "change": label, "written": written, "ok": ok, **phase.json()})
            print(
                f"  fan-out K={k:>9,} {label:<34} {phase.wall:8.2f} s "
                f"{k / phase.wall:9,.0f} roots/s  written {written:>9,}  "
                f"RSS peak {mib(phase.rss_peak):8.1f} MiB"
                + (f"  heap {mib(phase.heap_peak):7.1f} MiB" if phase.heap_peak else ""),
                flush=True,
            )
    return results, failures


def run_size(roots: int, args: argparse.Namespace) -> dict[str, Any]:
    kept, skipped = fitting(args.fanouts, roots)
    layout = Layout(
        roots, args.lines, args.per_customer, args.products or max(roots // 10, 1), kept
    )
    rows = layout.rows()
    total = sum(rows.values())
    print(
        f"{roots:,} roots: {', '.join(f'{n:,} {t.table}' for t, n in rows.items())}; "
        f"fan-outs {', '.join(f'{k:,}' for k in kept) or 'none'}"
        + (f" (not fitting: {', '.join(f'{k:,}' for k in skipped)})" if skipped else ""),
        flush=True,
    )
    started = time.perf_counter()
    mapping = load_mapping(MAPPING)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="probe-ceiling-", dir=args.state_dir))
    try:
        writer = CountingWriter()
        sync = DocumentSync(mapping, directory / "state.sqlite", writer, full_batch=args.batch)
        sync.state.use_types(schema_types(SCHEMAS))  # as ensure_targets does without a catalog
        merge, render = build(sync, layout, writer, args.batch)
        print(
            f"  build: merge {merge.items:,} rows in {merge.wall:.1f} s "
            f"({merge.items / merge.wall:,.0f}/s, {merge.cpu:.1f} CPU s); "
            f"render {render.items:,} documents in {render.wall:.1f} s "
            f"({render.items / render.wall:,.0f}/s, {render.cpu:.1f} CPU s); "
            f"RSS peak {mib(max(merge.rss_peak, render.rss_peak)):.1f} MiB",
            flush=True,
        )
        failures = [] if render.items == roots else [f"build: {render.items} of {roots} rendered"]
        measured = time.perf_counter()
        files, parts = state_size(sync)
        sized = time.perf_counter() - measured
        state = state_json(parts, files, total, roots)
        print(
            f"  state: {state['mib']:,.1f} MiB, {state['bytes_per_row']:,.0f} bytes a row, "
            f"{state['bytes_per_root']:,.0f} a root ({sized:.1f} s to measure)",
            flush=True,
        )
        fanned, failed = fanouts(sync, layout, writer, args.heap)
        sync.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "roots": roots,
        "rows": {str(t): n for t, n in rows.items()},
        "products": layout.products,
        "fanouts_not_fitting": list(skipped),
        "seconds": round(time.perf_counter() - started, 1),
        "state": state,
        "build": {"merge_rows": merge.json(), "render_documents": render.json()},
        "mean_document_bytes": round(writer.bytes / max(writer.sized, 1)),
        "fanout": fanned,
        "failures": failures + failed,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--roots", type=int, default=20_000, help="orders (document roots)")
    sizes.add_argument("--roots-list", type=parse_sizes, help="several sizes: 100000,1000000")
    parser.add_argument("--lines", type=int, default=3, help="lines per order")
    parser.add_argument("--per-customer", type=int, default=10, help="orders per customer")
    parser.add_argument("--products", type=int, help="products (default: roots / 10)")
    parser.add_argument(
        "--fanouts",
        type=parse_sizes,
        default=list(FANOUTS),
        help="K: a customer owning K orders and a product in K lines each, those that fit",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_MAX_OFFSETS_PER_TRIGGER,
        help="records a batch (the job's maxOffsetsPerTrigger)",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=Path(tempfile.gettempdir()), help="where the state goes"
    )
    parser.add_argument("--no-heap", dest="heap", action="store_false", help="no traced repeats")
    parser.add_argument("--output", type=Path, help="JSON (benchmarks/results/probe-ceiling-…)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = args.roots_list or [args.roots]
    output = output_path(args.output, "probe-ceiling")
    result: dict[str, Any] = {**run_header(args), "sizes": []}
    for roots in sizes:
        result["sizes"].append(run_size(roots, args))
        # Written after each size: a long run that fails later keeps what it measured.
        output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    failures = [f for size in result["sizes"] for f in size["failures"]]
    for failure in failures:
        print(f"FAILED: {failure}")
    print(f"JSON: {output}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
