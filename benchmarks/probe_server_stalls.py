"""The local search server alone under a stream of document rewrites: does it stall, how often,
for how long (issue 26: the 20/s step's p99 and the fan-out after it).

    .venv/bin/python benchmarks/probe_server_stalls.py [--documents 51000] [--bulk 150]
        [--interval 0.5] [--seconds 90] [--versioned] [--fanout 1000] [--output FILE]

No job, no Postgres: a fresh search server (the local stack's), an index mapped as the order
documents are (customer an object, lines nested), `--documents` order-shaped documents loaded in
bulks of 5,000, then a paced stream as the document consumer's 20/s step writes (about 150
documents every 0.5 s: bench-documents' batch lines), each bulk rewriting random documents
with a changed customer name (plain `_bulk`, or with external versions), then `--fanout`
documents rewritten in one bulk, as a customer's rename reaches its orders. Prints every bulk
slower than 0.5 s (when, how long), the bulks' p50/p99 and the wait that 1% of writes arriving
at random moments exceed (e2ebench.raw.wait_quantile), and writes JSON
(benchmarks/results/probe-stalls-<date>.json unless --output).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # e2ebench.*

from bench_pgsync import run_header, start_process  # noqa: E402
from e2ebench.docserver import Server  # noqa: E402
from e2ebench.raw import wait_quantile  # noqa: E402
from e2ebench.report import output_path  # noqa: E402

from cdc_sync.localstack.process import stop_pid  # noqa: E402
from cdc_sync.localstack.services import start_search  # noqa: E402

INDEX = "probe_stalls"
LOAD_BULK = 5_000
SLOW_SECONDS = 0.5
MAPPING = {"properties": {"customer": {"type": "object"}, "lines": {"type": "nested"}}}


class Documents:
    """Order-shaped documents (a customer, 1-5 lines each with a product) and their versions."""

    def __init__(self, count: int, versioned: bool) -> None:
        self.count, self.versioned = count, versioned
        self.rng = random.Random(26)
        self.versions = [0] * count

    def document(self, ident: int, name: str) -> dict[str, Any]:
        rng = self.rng
        return {
            "id": ident,
            "status": "new",
            "total": f"{rng.random() * 100:.2f}",
            "customer": {"id": ident % 5_000, "full_name": name, "email": f"c{ident}@example.org"},
            "lines": [
                {
                    "line_no": n,
                    "quantity": rng.randint(1, 9),
                    "product": {
                        "id": rng.randint(1, 5_000),
                        "name": f"product {n}",
                        "price": f"{rng.random() * 50:.2f}",
                    },
                }
                for n in range(1, rng.randint(1, 5) + 1)
            ],
        }

    def body(self, idents: list[int], name: str) -> bytes:
        """One `_bulk` body rewriting `idents` with the customer named `name`."""
        lines: list[str] = []
        for ident in idents:
            self.versions[ident] += 1
            head: dict[str, Any] = {"_index": INDEX, "_id": str(ident)}
            if self.versioned:
                head |= {"version": self.versions[ident], "version_type": "external"}
            lines += [json.dumps({"index": head}), json.dumps(self.document(ident, name))]
        return ("\n".join(lines) + "\n").encode()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--documents", type=int, default=51_000, help="documents (51,000)")
    parser.add_argument("--bulk", type=int, default=150, help="documents a stream bulk (150)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between bulks")
    parser.add_argument("--seconds", type=float, default=90.0, help="stream seconds (90)")
    parser.add_argument("--versioned", action="store_true", help="external versions, as the job")
    parser.add_argument("--fanout", type=int, default=1_000, help="documents of the last bulk")
    parser.add_argument("--output", type=Path, help="JSON (benchmarks/results/probe-stalls-…)")
    return parser.parse_args(argv)


def stream(server: Server, documents: Documents, args: argparse.Namespace) -> list[Any]:
    """Paced bulks for `args.seconds`: each bulk's (start second, seconds)."""
    bulks: list[tuple[float, float]] = []
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        idents = [documents.rng.randrange(documents.count) for _ in range(args.bulk)]
        at = time.monotonic() - started
        took = server.bulk(documents.body(idents, f"stream {len(bulks)}"))
        bulks.append((round(at, 1), round(took, 3)))
        time.sleep(max(0.0, args.interval - took))
    return bulks


def main(argv: list[str] | None = None) -> int:
    start_process()
    args = parse_args(argv)
    output = output_path(args.output, "probe-stalls")
    result: dict[str, Any] = run_header(args)
    documents = Documents(args.documents, args.versioned)
    with tempfile.TemporaryDirectory(prefix="probe-stalls-") as tmp:
        started = start_search(Path(tmp))
        server = Server(started.url, started.pid, 1)
        try:
            server.client.indices.create(index=INDEX, body={"mappings": MAPPING})
            load = time.monotonic()
            for first in range(0, args.documents, LOAD_BULK):
                idents = list(range(first, min(args.documents, first + LOAD_BULK)))
                server.bulk(documents.body(idents, "loaded"))
            result["load_seconds"] = round(time.monotonic() - load, 1)
            bulks = stream(server, documents, args)
            fanout = server.bulk(documents.body(list(range(args.fanout)), "renamed"))
        finally:
            server.close()
            stop_pid(started.pid)
    seconds = [took for _, took in bulks]
    slow = [(at, took) for at, took in bulks if took > SLOW_SECONDS]
    result |= {
        "load_at_end": os.getloadavg()[0],
        "bulks": len(bulks),
        "bulk_p50_seconds": round(statistics.median(seconds), 3),
        "bulk_p99_seconds": round(statistics.quantiles(seconds, n=100)[98], 3),
        "wait_p99_seconds": round(wait_quantile(seconds), 2),
        "slow": slow,
        "fanout_seconds": round(fanout, 2),
    }
    print(f"loaded {args.documents:,} documents in {result['load_seconds']} s")
    print(
        f"stream: {len(bulks)} bulks of {args.bulk} every {args.interval} s"
        f"{' (versioned)' if args.versioned else ''}: p50 {result['bulk_p50_seconds']} s, "
        f"p99 {result['bulk_p99_seconds']} s; 1% of writes wait >= {result['wait_p99_seconds']} s"
    )
    print(f"bulks slower than {SLOW_SECONDS} s (second of the stream, seconds): {slow}")
    print(f"then {args.fanout:,} documents in one bulk: {result['fanout_seconds']} s")
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"JSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
