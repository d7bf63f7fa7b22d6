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

    def mapping(self, index: str) -> dict[str, Any]:
        """The mappings of the concrete index behind `index` (an alias or an index)."""
        answer = self.client.indices.get_mapping(index=index)
        return dict(next(iter(answer.values()))["mappings"])

    def raw_rewrites(
        self, mapping: Mapping[str, Any], documents: Sequence[Document], name: str
    ) -> Pass:
        """The server's own rate of rewriting these documents (what a fan-out is): into a
        scratch index with `mapping`, plain `_bulk` (no versions) of RAW_REWRITE_BULK, one
        writer; every document loaded, then rewritten twice with a changed customer, the faster
        pass kept (the first pays the server's lazy work after a load)."""
        self.client.indices.create(index=name, body={"mappings": dict(mapping)})
        try:
            self.send(bulk_bodies(name, documents, RAW_REWRITE_BULK, None), 1)
            passes = [
                self.send(
                    bulk_bodies(name, renamed(documents, f"Raw {n}"), RAW_REWRITE_BULK, None), 1
                )
                for n in (1, 2)
            ]
            return max(passes, key=lambda p: p.rate)
        finally:
            self.client.indices.delete(index=name)

    def rewrites_in_place(self, index: str, documents: Sequence[Document]) -> Pass:
        """The server's own rate of rewriting these documents where they are: in `index` as
        the run left it (every rewrite it has had is part of the work the server does for it),
        plain `_bulk` of RAW_REWRITE_BULK, no versions, one writer; twice with a changed
        customer, the faster pass kept."""
        passes = [
            self.send(
                bulk_bodies(index, renamed(documents, f"In place {n}"), RAW_REWRITE_BULK, None), 1
            )
            for n in (1, 2)
        ]
        return max(passes, key=lambda p: p.rate)

    def concrete(self, index: str) -> str:
        """The index behind `index` (an alias or an index)."""
        return str(next(iter(self.client.indices.get_mapping(index=index))))


def raw_rewrite_rates(url: str, pid: int, index: str, sample: int) -> dict[str, Any]:
    """The raw rewrite rate of `sample` documents of `index` on its own server: into scratch
    indices mapped as `index` is (`AS_INDEXED`) and with every relation `object`, then in
    `index` itself (`IN_PLACE`: last, it changes their content), per case (each pass as
    `pass_json` gives it)."""
    server = Server(url, pid, 1)
    try:
        documents = server.documents(index, sample)
        mapping = server.mapping(index)
        found = {
            kind: pass_json(server.raw_rewrites(shape, documents, f"bench_raw_documents_{kind}"))
            for kind, shape in ((AS_INDEXED, mapping), ("object", as_objects(mapping)))
        }
        found[IN_PLACE] = pass_json(server.rewrites_in_place(server.concrete(index), documents))
        return found
    finally:
        server.close()
