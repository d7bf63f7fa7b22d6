"""Which part of the job's search write pattern costs the time (issue 18's diagnosis).

    .venv/bin/python benchmarks/probe_search_pattern.py [--docs 10000] [--touch 200]
        [--chunks 500,1000,2000,5000] [--output FILE]

Replays the job's own requests against a private search server (the local stack's stand-in, one
fresh server per case, stopped after it): the demo's `shop.orders` index as the sink creates it
(its mapping, `index.gc_deletes`), a snapshot of `--docs` documents written in bulks of a given
size with the job's versioned `external_gte` headers, then the streaming pattern, 10-document
bulks (a small micro-batch), of one kind at a time:

- first updates: re-index documents of the snapshot that no write has touched since;
- updates again: the same documents once more, in another order;
- inserts: new ids; deletes: versioned deletes of snapshot documents never touched.

Each line prints the documents per second, how many bulks stalled (> 0.2 s) and the longest.
What it showed on the build machine (2026-11-25, README Performance): only the snapshot's bulk
size matters. A snapshot written 500 or 1,000 documents at a time leaves documents whose first
later write (update or delete) stalls the server for seconds, about once per 30 documents;
written 2,000 or more at a time, none do. Versions, `gc_deletes`, the order of ids in a bulk
and the bulk size of the stream change nothing; the stall's length grows with the index and
with its indexed numeric and date fields. The job writes a snapshot `BULK_CHUNK` documents
per request (`cdc_sync.sinks.search.client`).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / d) for d in ("sync_jobs", "infra", "connectors")]

from cdc_sync.localstack.process import stop_pid  # noqa: E402
from cdc_sync.localstack.services import start_search  # noqa: E402
from cdc_sync.mapping import load_mapping  # noqa: E402
from cdc_sync.sinks.search.actions import VERSION_TYPE  # noqa: E402
from cdc_sync.sinks.search.backends import SearchBackend, open_backend  # noqa: E402
from cdc_sync.sinks.search.client import BULK_CHUNK  # noqa: E402
from cdc_sync.sinks.search.target import ensure_index  # noqa: E402

MAPPING = ROOT / "mappings" / "shop.yaml"
TABLE = "shop.orders"
STREAM_BULK = 10  # documents per streaming bulk: a micro-batch at tens of changes a second
STALL_SECONDS = 0.2
RETENTION_SECONDS = 86_400


@dataclass(frozen=True)
class Line:
    snapshot_chunk: int
    kind: str
    docs_per_second: float
    bulks: int
    stalls: int
    longest_seconds: float


def order(doc_id: int, version: int) -> dict[str, Any]:
    return {
        "id": doc_id,
        "customer_id": 1 + doc_id % 5000,
        "status": ("new", "paid", "shipped")[version % 3],
        "total": f"{doc_id % 5000 / 10:.2f}",
        "placed_at": "2026-11-25T08:00:00+00:00",
    }


class Writer:
    """The job's request shapes: versioned index and delete actions in `_bulk` requests."""

    def __init__(self, backend: SearchBackend, alias: str) -> None:
        self.backend = backend
        self.alias = alias
        self.version = 0

    def bulk(self, ids: list[int], op: str = "index") -> float:
        lines: list[dict[str, Any]] = []
        for doc_id in ids:
            self.version += 1
            header = {"_index": self.alias, "_id": str(doc_id), "version": self.version}
            lines.append({op: header | {"version_type": VERSION_TYPE}})
            if op == "index":
                lines.append(order(doc_id, self.version))
        started = time.monotonic()
        answer = self.backend.bulk(lines)
        if answer.get("errors"):
            raise RuntimeError(f"bulk item errors: {answer['items'][:2]}")
        return time.monotonic() - started


def timed(chunk: int, kind: str, ids: list[int], send: Callable[[list[int]], float]) -> Line:
    started = time.monotonic()
    seconds = [send(ids[i : i + STREAM_BULK]) for i in range(0, len(ids), STREAM_BULK)]
    rate = len(ids) / (time.monotonic() - started)
    stalls = sum(s > STALL_SECONDS for s in seconds)
    return Line(chunk, kind, round(rate, 1), len(seconds), stalls, round(max(seconds), 2))


def probe(chunk: int, docs: int, touch: int, kinds: list[str]) -> list[Line]:
    """One fresh server: the snapshot in `chunk`-document bulks, then each kind of stream."""
    route = next(r for t, r in load_mapping(MAPPING).tables.items() if str(t) == TABLE)
    assert route.search is not None
    with tempfile.TemporaryDirectory(prefix="probe-search-") as tmp:
        server = start_search(Path(tmp))
        backend = open_backend("opensearch", server.url, timeout_seconds=600)
        try:
            ensure_index(backend, route.search, None, RETENTION_SECONDS)
            writer = Writer(backend, route.search.index)
            loading = time.monotonic()
            for start in range(1, docs + 1, chunk):
                writer.bulk(list(range(start, min(start + chunk, docs + 1))))
            load = Line(chunk, "snapshot", round(docs / (time.monotonic() - loading), 1),
                        -(-docs // chunk), 0, 0.0)  # fmt: skip
            rng = random.Random(chunk)
            untouched = rng.sample(range(1, docs + 1), 2 * touch)
            first, deleted = untouched[:touch], untouched[touch:]
            again = rng.sample(first, len(first))
            new = list(range(docs + 1, docs + 1 + touch))
            plans: dict[str, tuple[list[int], Callable[[list[int]], float]]] = {
                "first updates": (first, writer.bulk),
                "updates again": (again, writer.bulk),
                "inserts": (new, writer.bulk),
                "deletes": (deleted, lambda ids: writer.bulk(ids, "delete")),
            }
            return [load] + [timed(chunk, k, *plans[k]) for k in kinds]
        finally:
            backend.close()
            stop_pid(server.pid)


def row(line: Line) -> str:
    return (
        f"{line.snapshot_chunk:>13} | {line.kind:<13} | {line.docs_per_second:>8} | "
        f"{line.bulks:>5} | {line.stalls:>6} | {line.longest_seconds:>9}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--docs", type=int, default=10_000, help="snapshot documents")
    parser.add_argument("--touch", type=int, default=200, help="documents per stream kind")
    parser.add_argument("--chunks", default=f"500,1000,2000,{BULK_CHUNK}",
                        help="snapshot bulk sizes to compare")  # fmt: skip
    parser.add_argument("--output", type=Path, help="JSON file (default: none)")
    args = parser.parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    every = ["first updates", "updates again", "inserts", "deletes"]
    lines: list[Line] = []
    print(f"{'snapshot bulk':>13} | {'writes':<13} | {'docs/s':>8} | bulks | stalls | longest s")
    for chunk in chunks:
        # The two ends get every kind; the sizes between them only the one that differs.
        kinds = every if chunk in (chunks[0], chunks[-1]) else ["first updates"]
        for line in probe(chunk, args.docs, args.touch, kinds):
            lines.append(line)
            print(row(line), flush=True)
    if args.output:
        result = {
            "started": datetime.now(tz=UTC).isoformat(timespec="seconds"),
            "docs": args.docs,
            "touch": args.touch,
            "stream_bulk": STREAM_BULK,
            "lines": [asdict(line) for line in lines],
        }
        args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
