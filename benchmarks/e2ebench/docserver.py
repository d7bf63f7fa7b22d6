"""A search server the document benchmarks write scratch indices to, and its CPU
(benchmarks/probe_document_pattern.py's cases, bench_documents.py's raw rewrite rate)."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy.helpers import scan

from e2ebench.docbound import AS_INDEXED, IN_PLACE
from e2ebench.docwrites import (
    Document,
    Pass,
    Stream,
    as_objects,
    bulk_bodies,
    pass_json,
    renamed,
)
from e2ebench.observe import tree_usage
from e2ebench.raw import STEADY_BULK_SECONDS, UPDATE_CHUNK, steady_bulks

RAW_REWRITE_BULK = 5_000  # the probe's raw case: the server's best bulk size found
SUSTAINED_SECONDS = 60.0  # a raw rewrite rate is the pass that ends this long after the first


class Server:
    """The search server the cases write to, and its CPU."""

    def __init__(self, url: str, pid: int, writers: int) -> None:
        self.url, self.pid = url, pid
        self.client = OpenSearch(hosts=[url], timeout=900, max_retries=0, pool_maxsize=writers)

    def cpu(self) -> float:
        return tree_usage(self.pid).cpu_seconds

    def bulk(self, body: bytes) -> float:
        started = time.monotonic()
        answer = self.client.bulk(body=body)
        took = time.monotonic() - started
        if answer.get("errors"):
            failed = next(i for i in answer["items"] if i.get("index", {}).get("error"))
            raise RuntimeError(f"bulk item error: {failed}")
        return took

    def send(self, bodies: Sequence[bytes], writers: int) -> Pass:
        """Every body once; several writers send at once, each its next body."""
        cpu, started = self.cpu(), time.monotonic()
        with ThreadPoolExecutor(writers) as pool:
            seconds = list(pool.map(self.bulk, bodies))
        took = time.monotonic() - started
        documents = sum(body.count(b"\n") // 2 for body in bodies)
        return Pass(documents, took, len(bodies), max(seconds, default=0.0), self.cpu() - cpu)

    def stream(
        self,
        index: str,
        documents: Sequence[Document],
        version: int | None,
        seconds: float,
        warmup_limit: float,
    ) -> tuple[Stream, int | None]:
        """UPDATE_CHUNK random documents a bulk, each with a changed customer; raw.py's steady
        rule. Returns the next version to write at."""
        rng = random.Random(26)
        sent = 0

        def one_bulk() -> float:
            nonlocal sent
            sent += 1
            sample = renamed(rng.sample(documents, UPDATE_CHUNK), f"stream {sent}")
            at = None if version is None else version + sent
            return self.bulk(bulk_bodies(index, sample, UPDATE_CHUNK, at)[0])

        cpu = self.cpu()
        found = steady_bulks(one_bulk, seconds, warmup_limit)
        every = found.warmup + found.timed
        stream = Stream(
            round(found.warmup_seconds, 2),
            found.steady,
            UPDATE_CHUNK * len(found.timed),
            found.seconds,
            sum(s > STEADY_BULK_SECONDS for s in every),
            max(every),
            self.cpu() - cpu,
        )
        return stream, None if version is None else version + sent + 1

    def close(self) -> None:
        self.client.close()

    def documents(self, index: str, sample: int, seed: int = 26) -> list[Document]:
        """Up to `sample` documents of `index` as it holds them, picked at random."""
        found = [
            (hit["_id"], hit["_source"])
            for hit in scan(self.client, index=index, query={"query": {"match_all": {}}})
        ]
        return random.Random(seed).sample(found, min(sample, len(found)))

    def concrete(self, index: str) -> tuple[str, dict[str, Any]]:
        """The index behind `index` (an alias or an index) and its mappings."""
        name, found = next(iter(self.client.indices.get_mapping(index=index).items()))
        return str(name), dict(found["mappings"])

    def raw_rewrites(
        self, mapping: Mapping[str, Any], documents: Sequence[Document], name: str
    ) -> dict[str, Any]:
        """The server's own rate of rewriting these documents (what a fan-out is): into a
        scratch index with `mapping`, plain `_bulk` (no versions) of RAW_REWRITE_BULK, one
        writer; every document loaded, then rewritten as `sustained_rewrites` does."""
        self.client.indices.create(index=name, body={"mappings": dict(mapping)})
        try:
            self.send(bulk_bodies(name, documents, RAW_REWRITE_BULK, None), 1)
            return self.sustained_rewrites(name, documents, "Raw")
        finally:
            self.client.indices.delete(index=name)

    def sustained_rewrites(
        self, index: str, documents: Sequence[Document], label: str
    ) -> dict[str, Any]:
        """Every document of `index` rewritten with a changed customer, pass after pass, plain
        `_bulk` of RAW_REWRITE_BULK, one writer, until SUSTAINED_SECONDS have gone by: the last
        pass (`pass_json`: the sustained rate, what a rate of changes held for a step gets),
        with the first pass's rate and the passes. The server slows as an index takes rewrites
        (2026-11-29: 1,700 documents/s for its first 30,000 rewrites, then ~280/s;
        benchmarks/probe_server_stalls.py), so the first pass alone overstates what it allows."""
        started, passes = time.monotonic(), list[Pass]()
        while len(passes) < 2 or time.monotonic() - started < SUSTAINED_SECONDS:
            bodies = bulk_bodies(
                index, renamed(documents, f"{label} {len(passes)}"), RAW_REWRITE_BULK, None
            )
            passes.append(self.send(bodies, 1))
        found = pass_json(passes[-1]) or {}
        return found | {"first_pass_rate": round(passes[0].rate, 1), "passes": len(passes)}


def raw_rewrite_rates(url: str, pid: int, index: str, sample: int) -> dict[str, Any]:
    """The raw rewrite rate of `sample` documents of `index` on its own server: into scratch
    indices mapped as `index` is (`AS_INDEXED`) and with every relation `object`, then in
    `index` itself (`IN_PLACE`: last, it changes their content), per case (each pass as
    `pass_json` gives it)."""
    server = Server(url, pid, 1)
    try:
        documents = server.documents(index, sample)
        concrete, mapping = server.concrete(index)
        found = {
            kind: server.raw_rewrites(shape, documents, f"bench_raw_documents_{kind}")
            for kind, shape in ((AS_INDEXED, mapping), ("object", as_objects(mapping)))
        }
        found[IN_PLACE] = server.sustained_rewrites(concrete, documents, "In place")
        return found
    finally:
        server.close()
