"""The document probe's cases and figures (benchmarks/probe_document_pattern.py), without I/O.

A case writes the same rendered documents as the raw write does (plain `_bulk`, no versions,
every relation mapped `object`, RAW_BULK documents a request, one writer) with one factor of the
document path changed: versions (`external_gte`), the `nested` mapping, the bulk size, parallel
writers. The job's combination and the best one found are cases too. Every figure is read as a
ratio to the raw case's figure of the same kind, from the same run on the same server.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cdc_sync.documents.sync import CHUNK as JOB_BULK
from cdc_sync.sinks.search.actions import VERSION_TYPE
from cdc_sync.sinks.search.client import BULK_CHUNK as RAW_BULK

Document = tuple[str, Mapping[str, Any]]  # (doc id, _source)


@dataclass(frozen=True)
class Case:
    name: str
    factor: str  # raw, versions, mapping, bulk, writers (one differs from raw), job, best, noise
    nested: bool = False  # relations as the spec maps them (`nested`), else all `object`
    versioned: bool = False
    bulk: int = RAW_BULK
    writers: int = 1
    unchanged: bool = False  # also re-send every document with the content it has


@dataclass(frozen=True)
class Pass:
    """Every document written once, in bulks (several writers: at once)."""

    documents: int
    seconds: float
    bulks: int
    longest: float  # the slowest bulk's seconds
    server_cpu: float  # the search server's CPU seconds during the pass

    @property
    def rate(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Stream:
    """Small bulks of random existing documents: until the server's lazy work after the load
    is done (`steady`), then timed."""

    warmup_seconds: float
    steady: bool  # False: the warm-up ran out of time and the timed part includes it
    documents: int  # written in the timed part
    seconds: float
    stalls: int  # bulks slower than the steady rule's threshold, warm-up included
    longest: float
    server_cpu: float  # the search server's CPU seconds, warm-up included (a stall's work)

    @property
    def rate(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class CaseResult:
    case: Case
    new: Pass  # first writes: new ids
    stream: Stream
    rewrites: Pass  # every document again, content changed (a fan-out)
    unchanged: Pass | None = None  # every document again, content as it is


@dataclass(frozen=True)
class Shape:
    documents: int
    mean_bytes: float  # JSON
    max_bytes: int
    mean_nested: float  # objects in arrays: each a hidden document under a `nested` mapping
    mean_objects: float  # objects below the root (one-to-one relations included)


def factor_cases(bulks: Iterable[int], writers: Iterable[int]) -> list[Case]:
    """Raw, each factor of the document path alone, then the job's combination."""
    raw = Case(f"raw: object, plain, bulk {RAW_BULK}, 1 writer", "raw")
    cases = [
        raw,
        replace(raw, name="+ versions (external_gte)", factor="versions", versioned=True),
        replace(raw, name="+ nested mapping", factor="mapping", nested=True),
    ]
    cases += [replace(raw, name=f"bulk {b}", factor="bulk", bulk=b) for b in bulks if b != RAW_BULK]
    cases += [
        replace(raw, name=f"{w} writers", factor="writers", writers=w) for w in writers if w != 1
    ]
    cases.append(
        Case(
            f"job: nested, versioned, bulk {JOB_BULK}, 1 writer",
            "job",
            True,
            True,
            JOB_BULK,
            1,
            unchanged=True,
        )
    )
    return cases


def best_case(results: Sequence[CaseResult]) -> Case:
    """What the document path must keep (nested, versioned) with the bulk size and the number
    of writers that did best against raw: the bulk whose weakest figure (new ids, stream,
    rewrites) is highest; the writers whose weaker of new ids and rewrites is highest."""
    raw = raw_result(results)

    def weakest(result: CaseResult, kinds: Sequence[str]) -> float:
        return min(ratio(result, raw, kind) or 0.0 for kind in kinds)

    sizes = [r for r in results if r.case.factor in ("raw", "bulk")]
    bulk = max(sizes, key=lambda r: weakest(r, ("new", "stream", "rewrites"))).case.bulk
    counts = [r for r in results if r.case.factor in ("raw", "writers")]
    writers = max(counts, key=lambda r: weakest(r, ("new", "rewrites"))).case.writers
    name = f"best: nested, versioned, bulk {bulk}, {writers} writer{'s' if writers > 1 else ''}"
    return Case(name, "best", True, True, bulk, writers)


def noise_case() -> Case:
    """Raw once more, after every other case: how far the same writes moved during the run (a
    busy machine, the server's own drift), the band within which a ratio says nothing."""
    return replace(factor_cases([], [])[0], name="raw again (the run's noise)", factor="noise")


def raw_result(results: Sequence[CaseResult]) -> CaseResult:
    return next(r for r in results if r.case.factor == "raw")


def figure(result: CaseResult, kind: str) -> float | None:
    """docs/s of one kind of write: new, stream, rewrites, unchanged."""
    if kind == "stream":
        return result.stream.rate
    found: Pass | None = getattr(result, kind)
    return found.rate if found is not None else None


def ratio(result: CaseResult, raw: CaseResult, kind: str) -> float | None:
    mine, base = figure(result, kind), figure(raw, "rewrites" if kind == "unchanged" else kind)
    return mine / base if mine is not None and base else None


def cpu_ratio(result: CaseResult, raw: CaseResult) -> float | None:
    """The search server's CPU a new document cost, to raw's (less sensitive to a busy machine
    than the rates: the server's CPU time, not its share of the cores)."""
    mine, base = (r.new.server_cpu / max(r.new.documents, 1) for r in (result, raw))
    return mine / base if base > 0 else None


def document_shape(documents: Sequence[Document]) -> Shape:
    sizes = [len(dumps(doc)) for _, doc in documents]
    counts = [nested_and_objects(doc) for _, doc in documents]
    n = max(len(documents), 1)
    return Shape(
        len(documents),
        round(sum(sizes) / n, 1),
        max(sizes, default=0),
        round(sum(c[0] for c in counts) / n, 2),
        round(sum(c[1] for c in counts) / n, 2),
    )


def nested_and_objects(value: Any, in_array: bool = False) -> tuple[int, int]:
    """(objects that are array elements, objects) below `value`, `value` itself not counted."""
    nested = objects = 0
    children: Iterable[tuple[Any, bool]] = ()
    if isinstance(value, Mapping):
        children = ((v, False) for v in value.values())
    elif isinstance(value, list):
        children = ((v, True) for v in value)
    for child, element in children:
        if isinstance(child, Mapping):
            objects += 1
            nested += element
        below = nested_and_objects(child, element)
        nested, objects = nested + below[0], objects + below[1]
    return nested, objects


def bulk_bodies(
    index: str, documents: Sequence[Document], bulk: int, version: int | None
) -> list[bytes]:
    """`_bulk` request bodies of `bulk` index actions each; `version`: every action's external
    version (as the job writes a render: all documents at the state's version), None: plain."""
    bodies = []
    for start in range(0, len(documents), bulk):
        lines = []
        for doc_id, document in documents[start : start + bulk]:
            header: dict[str, Any] = {"_index": index, "_id": doc_id}
            if version is not None:
                header |= {"version": version, "version_type": VERSION_TYPE}
            lines += [dumps({"index": header}), dumps(document)]
        bodies.append(("\n".join(lines) + "\n").encode())
    return bodies


def renamed(documents: Sequence[Document], name: str) -> list[Document]:
    """The documents after their customer's rename (what a parent's update fans out to)."""
    return [
        (doc_id, {**doc, "customer": {**(doc.get("customer") or {}), "full_name": name}})
        for doc_id, doc in documents
    ]


def content_hash(document: Mapping[str, Any]) -> bytes:
    """What a writer that skips unchanged documents compares (with the hash it stored)."""
    return hashlib.blake2b(json.dumps(document, sort_keys=True).encode(), digest_size=16).digest()


def as_objects(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """An index mapping with every `nested` field mapped `object` (same fields, same types)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            out[key] = as_objects(value)
        elif key == "type" and value == "nested":
            out[key] = "object"
        else:
            out[key] = value
    return out


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _x(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


HEADER = (
    f"{'case':<48} | {'new ids/s':>9} {'x raw':>6} | {'stream/s':>8} {'x raw':>6} "
    f"{'warm-up s':>9} {'stalls':>6} {'longest s':>9} | {'rewrites/s':>10} {'x raw':>6} | "
    f"{'srv CPU ms/doc new, rewrite':>27}"
)


def table_row(result: CaseResult, raw: CaseResult) -> str:
    new, stream, rewrites = result.new, result.stream, result.rewrites
    warmup = f"{stream.warmup_seconds:.1f}" + ("" if stream.steady else "+")
    cpu = f"{1000 * new.server_cpu / max(new.documents, 1):.2f}, " + (
        f"{1000 * rewrites.server_cpu / max(rewrites.documents, 1):.2f}"
    )
    return (
        f"{result.case.name:<48} | {_rate(new.rate):>9} {_x(ratio(result, raw, 'new')):>6} | "
        f"{_rate(stream.rate):>8} {_x(ratio(result, raw, 'stream')):>6} {warmup:>9} "
        f"{stream.stalls:>6} {stream.longest:>9.2f} | "
        f"{_rate(rewrites.rate):>10} {_x(ratio(result, raw, 'rewrites')):>6} | {cpu:>27}"
    )


def verdict(results: Sequence[CaseResult], cpu_rates: Mapping[str, float]) -> str:
    """Which factor costs the time: the job's figures and each of its factors as ratios to raw,
    the costliest factor, whether the driver's CPU could be the bound, and the best found."""
    raw = raw_result(results)
    by_factor = {r.case.factor: r for r in results}

    def three(result: CaseResult) -> str:
        kinds = ("new", "stream", "rewrites")
        rates = " / ".join(_x(ratio(result, raw, kind)) for kind in kinds)
        return f"{rates}, CPU {_x(cpu_ratio(result, raw))}"

    parts = []
    job = by_factor.get("job")
    if job is not None:
        parts.append(f"the job's writes {three(job)}")
    costs: dict[str, float] = {}
    for result in results:
        if result.case.factor in ("versions", "mapping") or (
            result.case.factor == "bulk" and result.case.bulk == JOB_BULK
        ):
            parts.append(f"{result.case.name} {three(result)}")
            kinds = ("new", "stream", "rewrites")
            costs[result.case.name] = min(ratio(result, raw, k) or 0.0 for k in kinds)
    parallel = [r for r in results if r.case.factor == "writers"]
    if parallel:
        gains = ", ".join(
            f"{r.case.writers}: {_x(ratio(r, raw, 'new'))} / {_x(ratio(r, raw, 'rewrites'))}"
            for r in parallel
        )
        parts.append(f"parallel writers (new ids / rewrites) {gains}")
    if job is not None and job.unchanged is not None and "skip check" in cpu_rates:
        parts.append(
            f"unchanged documents re-sent {_rate(job.unchanged.rate)}/s, "
            f"skipped {_rate(cpu_rates['skip check'])}/s"
        )
    if costs:
        worst = min(costs, key=lambda name: costs[name])
        parts.append(f"costliest factor: {worst} ({_x(costs[worst])})")
    if "render" in cpu_rates:
        render_ratio = cpu_rates["render"] / raw.new.rate if raw.new.rate else None
        bound = "the bound" if render_ratio is not None and render_ratio < 1 else "not the bound"
        parts.append(f"render CPU {_x(render_ratio)} of raw new ids ({bound})")
    best = by_factor.get("best")
    if best is not None:
        parts.append(f"{best.case.name}: {three(best)}")
    noise = by_factor.get("noise")
    if noise is not None:
        parts.append(f"raw again at the end {three(noise)}: ratios that close to 1 are noise")
    legend = "ratios to raw: new ids / stream / rewrites, the server's CPU a new document"
    return f"verdict ({legend}): " + "; ".join(parts)


def pass_json(found: Pass | Stream | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in vars(found).items()},
        "rate": round(found.rate, 1),
    }


def result_json(result: CaseResult, raw: CaseResult) -> dict[str, Any]:
    return {
        "case": vars(result.case),
        **{
            kind: pass_json(getattr(result, kind))
            for kind in ("new", "stream", "rewrites", "unchanged")
        },
        "x_raw": {
            kind: None if (r := ratio(result, raw, kind)) is None else round(r, 3)
            for kind in ("new", "stream", "rewrites", "unchanged")
        },
    }
