"""Which part of the document path costs the time (issue 26, the diagnosis).

    .venv/bin/python benchmarks/probe_document_pattern.py [--documents 20000] [--quick]
        [--bulks 100,250,500,1000,2000] [--writers 2,4] [--output FILE]

Replays the document step's own work on the demo's `shop_order_documents` (mappings/shop.yaml)
for N orders, rows made as `make bench-documents` makes them (e2ebench/documents.py: N/10
customers, as many products, 1-5 lines an order) in a private Postgres, read back as the
decoder gives them and stopped before anything is timed. Then, in one run:

1. the driver's CPU (CPU seconds, not wall time), no server: the rows merged into the job's
   state (`DocumentSync.apply`), every root rendered from it as the step renders pending roots
   (the state's reads counted on their own), the job's bulk bodies serialized as its client
   does, and a content hash per document (what skipping an unchanged document would cost);
2. the documents' size (JSON bytes, objects nested per document);
3. on a private search server (the local stack's, warmed up by a scratch load first), the same
   documents written case by case, each on an index of its own (e2ebench/docwrites.py): raw
   (plain opensearch-py `_bulk`, no versions, relations mapped `object`, 5,000 a request, one
   writer), then each factor of the document path alone (versions, the nested mapping, bulk
   sizes, 2 and 4 writers), the job's combination, the best one found and raw again (how far
   the same writes moved during the run: the noise). Each case writes:
   new ids (every document once, in the order the step pages them); the stream (10-document
   bulks of random documents with a changed customer, raw.py's steady rule: first until the
   server's lazy work after the load is done, at most 60 s, then 30 s timed); rewrites (every
   document again, its customer renamed: a fan-out); the job's also every document once more
   unchanged; the server's CPU for each pass;
4. the job's own step on the same server: the index built from the state
   (`DocumentSync.ensure_targets` through `SearchSink`) and a rename of every customer applied
   (fan-out to every root: merge, render, write);
5. a verdict: the job's figures and each factor as ratios to raw, the costliest factor.

Prints a table as it goes; writes JSON (benchmarks/results/probe-documents-<date>.json unless
--output). Figures from a busy machine are indicative only (the load average is in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # e2ebench.*, the probes

import psycopg  # noqa: E402
from bench_pgsync import run_header, start_process  # noqa: E402
from e2ebench.docserver import Server  # noqa: E402
from e2ebench.documents import DOCUMENT, load_document_rows  # noqa: E402
from e2ebench.docwrites import (  # noqa: E402
    HEADER,
    JOB_BULK,
    Case,
    CaseResult,
    Document,
    Shape,
    as_objects,
    best_case,
    bulk_bodies,
    content_hash,
    document_shape,
    factor_cases,
    noise_case,
    raw_result,
    renamed,
    result_json,
    table_row,
    verdict,
)
from e2ebench.load import PRODUCTS  # noqa: E402
from e2ebench.raw import UPDATE_CHUNK  # noqa: E402
from e2ebench.report import output_path  # noqa: E402
from opensearchpy.serializer import JSONSerializer  # noqa: E402
from probe_document_fanout import CountingWriter  # noqa: E402

from cdc_sync.core.model import Change, Coordinates, Op, TableId  # noqa: E402
from cdc_sync.debezium.connector import converter_modes  # noqa: E402
from cdc_sync.documents.state import DocumentState  # noqa: E402
from cdc_sync.documents.sync import DocumentSync  # noqa: E402
from cdc_sync.documents.target import document_route  # noqa: E402
from cdc_sync.localstack.postgres import start_postgres, stop_postgres  # noqa: E402
from cdc_sync.localstack.process import stop_pid  # noqa: E402
from cdc_sync.localstack.services import start_search  # noqa: E402
from cdc_sync.mapping import MappingFile, load_mapping  # noqa: E402
from cdc_sync.schema import RowSchema  # noqa: E402
from cdc_sync.schema.catalog import primary_key_columns, row_schema_from_catalog  # noqa: E402
from cdc_sync.schema.source_rows import read_table  # noqa: E402
from cdc_sync.sinks.base import WriteResult  # noqa: E402
from cdc_sync.sinks.search import SearchSink  # noqa: E402
from cdc_sync.sinks.search.actions import BulkAction, bulk_operations  # noqa: E402

MAPPING = ROOT / "mappings" / "shop.yaml"
WARMUP_DOCUMENTS = 2_000  # the scratch load that starts the server's clock
RETENTION_SECONDS = 86_400


class Collecting(CountingWriter):
    """The step's writer that keeps the documents it is given (in the order it is given them)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Document] = []

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
        self.kept += [(a.doc_id, a.document) for a in actions if a.document is not None]
        return WriteResult(applied=len(actions))


class TimedState(DocumentState):
    """The job's state, counting the CPU of the reads a render makes: root rows, joined rows,
    filter matches."""

    read_seconds = 0.0

    def _timed(self, read: Callable[[], Any]) -> Any:
        started = time.process_time()
        try:
            return read()
        finally:
            self.read_seconds += time.process_time() - started

    def rows(self, table: TableId, ids: Sequence[str]) -> Any:
        return self._timed(lambda: super(TimedState, self).rows(table, ids))

    def joined(self, table: TableId, column: str, values: Iterable[str]) -> Any:
        return self._timed(lambda: super(TimedState, self).joined(table, column, values))

    def matching(self, doc: str, ids: Sequence[str]) -> Any:
        return self._timed(lambda: super(TimedState, self).matching(doc, ids))


@dataclass(frozen=True)
class Source:
    changes: dict[TableId, list[Change]]  # every row of the document's tables, as snapshot rows
    schemas: dict[TableId, RowSchema]
    counts: dict[str, int]  # rows per table
    expected: int  # documents (roots the filter keeps)


def load_source(root: Path, mapping: MappingFile, documents: int) -> Source:
    """The bench's rows in a private Postgres, read back as the decoder gives them; the server
    is stopped before anything is timed."""
    spec = mapping.documents[DOCUMENT]
    customers = max(documents // 10, 1)
    postgres = start_postgres(root / "postgres")
    try:
        rows = load_document_rows(
            postgres.url, spec, customers, documents, max(customers, PRODUCTS), fanout=0
        )
        modes = converter_modes(mapping.connector)
        changes: dict[TableId, list[Change]] = {}
        schemas: dict[TableId, RowSchema] = {}
        with psycopg.connect(postgres.url) as conn:
            for table in sorted(spec.tables()):
                schema = schemas[table] = row_schema_from_catalog(conn, table, modes)
                key = primary_key_columns(conn, table)
                changes[table] = [
                    Change(
                        table,
                        tuple((k, row[k]) for k in key),
                        Op.READ,
                        1,
                        row,
                        Coordinates(f"cdc.{table}", 0, offset),
                        schema=schema,
                    )
                    for offset, row in enumerate(read_table(conn, table, schema.columns, modes))
                ]
    finally:
        stop_postgres(postgres)
        shutil.rmtree(postgres.log.parent, ignore_errors=True)
    return Source(changes, schemas, rows.counts, rows.expected)


@dataclass(frozen=True)
class DriverCpu:
    """CPU seconds of this process (not wall time: a busy machine changes them less)."""

    merge_seconds: float  # every row into the state (documents: rows)
    rows: int
    read_seconds: float  # the render's state reads
    render_seconds: float  # reads included
    serialize_seconds: float  # the job's bulk bodies, as its client serializes them
    hash_seconds: float  # a content hash per document

    def rates(self, documents: int) -> dict[str, float]:
        """Per CPU second: rows merged (state merge), else documents."""
        return {
            "state merge": self.rows / self.merge_seconds,
            "state reads": documents / self.read_seconds,
            "render": documents / self.render_seconds,
            "serialize bulks": documents / self.serialize_seconds,
            "skip check": documents / self.hash_seconds,
        }


def render_from_state(
    mapping: MappingFile, source: Source, state: Path
) -> tuple[DocumentSync, list[Document], DriverCpu]:
    """The step's own work without a server: the rows merged (a full snapshot batch: its roots
    wait, as in the job), then every pending root rendered in the step's chunks."""
    collector = Collecting()
    rows = sum(len(found) for found in source.changes.values())
    sync = DocumentSync(mapping, state, collector, full_batch=1)
    sync.state.close()
    timed = sync.state = TimedState(state, mapping.documents.values())
    merged = _cpu_seconds(lambda: sync.apply([], source.changes, records=rows))
    sync.full_batch = None
    timed.read_seconds = 0.0  # the merge's fan-out read the state too
    rendered = _cpu_seconds(lambda: sync.apply([], {}))
    documents = collector.kept
    serialize = _cpu_seconds(lambda: _serialize_as_the_job(documents))
    hashed = _cpu_seconds(lambda: [content_hash(doc) for _, doc in documents])
    cpu = DriverCpu(merged, rows, timed.read_seconds, rendered, serialize, hashed)
    return sync, documents, cpu


def _serialize_as_the_job(documents: Sequence[Document]) -> None:
    serializer = JSONSerializer()
    table = TableId("shop", "orders")
    for start in range(0, len(documents), JOB_BULK):
        actions = [
            BulkAction(
                Change(table, (("_id", i),), Op.CREATE, 1, doc, Coordinates("", 0, 0)),
                "index",
                i,
                1,
                doc,
            )
            for i, doc in documents[start : start + JOB_BULK]
        ]
        "\n".join(serializer.dumps(line) for line in bulk_operations("alias", actions))


def _cpu_seconds(work: Callable[[], object]) -> float:
    started = time.process_time()
    work()
    return time.process_time() - started


def run_case(
    server: Server,
    case: Case,
    index_mapping: Mapping[str, Any],
    documents: Sequence[Document],
    args: argparse.Namespace,
) -> CaseResult:
    """One case on an index of its own (deleted after): new ids, the stream, rewrites."""
    index = f"probe_{case.factor}_{case.bulk}_{case.writers}"
    mapping = index_mapping if case.nested else as_objects(index_mapping)
    server.client.indices.create(index=index, body={"mappings": mapping})
    try:
        version = 1 if case.versioned else None
        new = server.send(bulk_bodies(index, documents, case.bulk, version), case.writers)
        stream, version = server.stream(
            index, documents, version, args.stream_seconds, args.warmup_limit
        )
        fanned = renamed(documents, "Renamed")
        rewrites = server.send(bulk_bodies(index, fanned, case.bulk, version), case.writers)
        unchanged = None
        if case.unchanged:
            again = None if version is None else version + 1
            unchanged = server.send(bulk_bodies(index, fanned, case.bulk, again), case.writers)
        return CaseResult(case, new, stream, rewrites, unchanged)
    finally:
        server.client.indices.delete(index=index)


def warm_up(server: Server, documents: Sequence[Document]) -> float:
    """A scratch load and its deletion: the first case does not pay the server's start."""
    started = time.monotonic()
    server.client.indices.create(index="probe_warmup")
    server.send(bulk_bodies("probe_warmup", documents[:WARMUP_DOCUMENTS], 500, None), 1)
    server.client.indices.delete(index="probe_warmup")
    return time.monotonic() - started


def job_step(
    sync: DocumentSync, source: Source, server: Server, documents: int
) -> dict[str, dict[str, float]]:
    """The job's own code on the same server: the index built from the state, then a rename of
    every customer applied (merge, fan-out, render, write to every root)."""
    sink = SearchSink("opensearch", server.url, RETENTION_SECONDS)
    sync.search = sink
    try:
        cpu, started = server.cpu(), time.monotonic()
        sync.ensure_targets(source.schemas)
        build = (time.monotonic() - started, server.cpu() - cpu)
        customers = TableId("shop", "customers")
        renames = [
            replace(c, op=Op.UPDATE, version=2, row={**(c.row or {}), "full_name": "Renamed"})
            for c in source.changes[customers]
        ]
        cpu, started = server.cpu(), time.monotonic()
        result = sync.apply([], {customers: renames})
        fanout = (time.monotonic() - started, server.cpu() - cpu)
        if result.rendered != documents or result.refused():
            raise RuntimeError(f"the fan-out wrote {result.rendered} of {documents} documents")
    finally:
        sink.close()
    return {
        name: {"seconds": round(s, 2), "rate": round(documents / s, 1), "server_cpu": round(c, 2)}
        for name, (s, c) in (("build", build), ("fanout", fanout))
    }


def print_head(source: Source, cpu: DriverCpu, shape: Shape, documents: int) -> None:
    print(f"{documents:,} documents of {DOCUMENT} from {source.counts}")
    print(
        f"document: {shape.mean_bytes:,.0f} bytes JSON on average (max {shape.max_bytes:,}), "
        f"{shape.mean_objects} objects below the root, {shape.mean_nested} of them in arrays "
        "(hidden documents under a nested mapping)"
    )
    for name, rate in cpu.rates(documents).items():
        unit = "rows" if name == "state merge" else "documents"
        print(f"driver CPU, no server: {name:<16} {rate:>10,.0f} {unit} a CPU second")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--documents", type=int, help="orders: documents (20,000; quick 2,000)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2,000 documents, bulks 100,1000, 2 writers, short stream",
    )
    parser.add_argument("--bulks", help="bulk sizes beside raw's (100,250,500,1000,2000)")
    parser.add_argument("--writers", help="parallel writers beside one (2,4)")
    parser.add_argument("--output", type=Path, help="JSON (benchmarks/results/probe-documents-…)")
    args = parser.parse_args(argv)
    args.documents = args.documents or (2_000 if args.quick else 20_000)
    bulks = args.bulks or ("100,1000" if args.quick else "100,250,500,1000,2000")
    args.bulks = [int(b) for b in bulks.split(",")]
    args.writers = [int(w) for w in (args.writers or ("2" if args.quick else "2,4")).split(",")]
    args.stream_seconds = 10.0 if args.quick else 30.0
    args.warmup_limit = 20.0 if args.quick else 60.0
    return args


def main(argv: list[str] | None = None) -> int:
    start_process()
    args = parse_args(argv)
    output = output_path(args.output, "probe-documents")
    result: dict[str, Any] = run_header(args)
    mapping = load_mapping(MAPPING)
    spec = mapping.documents[DOCUMENT]
    with tempfile.TemporaryDirectory(prefix="probe-documents-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # the Postgres service user works below it
        source = load_source(root, mapping, args.documents)
        sync, documents, cpu = render_from_state(mapping, source, root / "state.sqlite")
        if len(documents) != source.expected:
            raise RuntimeError(f"rendered {len(documents)} documents, expected {source.expected}")
        shape = document_shape(documents)
        print_head(source, cpu, shape, len(documents))
        route = document_route(spec, source.schemas, mapping.policies_for(spec.table))
        assert route.search is not None
        started = start_search(root)
        server = Server(started.url, started.pid, max([1, *args.writers]))
        results: list[CaseResult] = []
        try:
            result["warmup_seconds"] = round(warm_up(server, documents), 1)
            print(HEADER, flush=True)
            for case in factor_cases(args.bulks, args.writers):
                results.append(run_case(server, case, route.search.mapping, documents, args))
                print(table_row(results[-1], raw_result(results)), flush=True)
            for case in (best_case(results), noise_case()):
                results.append(run_case(server, case, route.search.mapping, documents, args))
                print(table_row(results[-1], raw_result(results)), flush=True)
            result["job_step"] = job_step(sync, source, server, len(documents))
        finally:
            server.close()
            stop_pid(started.pid)
            sync.close()
    raw = raw_result(results)
    steps = result["job_step"]
    print(
        f"job step (DocumentSync + SearchSink): build {steps['build']['rate']:,.0f} docs/s "
        f"(x{steps['build']['rate'] / raw.new.rate:.2f} raw new ids), fan-out of every "
        f"customer's rename {steps['fanout']['rate']:,.0f} docs/s "
        f"(x{steps['fanout']['rate'] / raw.rewrites.rate:.2f} raw rewrites)"
    )
    rates = cpu.rates(len(documents))
    line = verdict(results, rates)
    print(line)
    result |= {
        "load_at_end": os.getloadavg()[0],
        "documents": len(documents),
        "rows": source.counts,
        "shape": asdict(shape),
        "driver_cpu": {**asdict(cpu), "rates": {k: round(v, 1) for k, v in rates.items()}},
        "stream_bulk": UPDATE_CHUNK,
        "cases": [result_json(r, raw) for r in results],
        "verdict": line,
    }
    output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"JSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
