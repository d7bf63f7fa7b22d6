"""Whether a rate of child changes can drain on this search server at all (issue 26: 100 child
changes/s drains where the raw rate of the same documents in the same run allows it, else the
bound, proven from that run).

A child change reaches documents (a line's order; a customer's or a product's every order), and
each reached document whose content changed must be written. So a rate needs `rate x documents
per change` documents/s, written documents counted from the job's own batch lines in a step that
drained (the workload's mix is the same at every rate). The server's raw rewrite rate of the
same documents into an index mapped as this one is, measured in the same run
(e2ebench.docserver: plain `_bulk` of 5,000, no versions, one writer, rewritten pass after pass
for a minute, the last pass: the sustained rate),
is the most any writer of these documents gets from it: a rate needing more documents/s than
that cannot drain here, for any system that keeps every reached document current. The same
rewrites in the run's own index after its steps (`IN_PLACE`) count where they were measured:
the local search server stalls more as an index takes rewrites
(benchmarks/probe_server_stalls.py), so a fresh scratch index may be faster than the index the
steps wrote, and the slower of the two is the bound. (The same documents under an all-`object`
mapping are measured too, for reference: another index, not these documents' rate.)
"""

from __future__ import annotations

from typing import Any

AS_INDEXED = "nested"  # the key of the raw rate under the index's own mapping (docserver)
IN_PLACE = "in_place"  # the key of the raw rate in the run's own index, after its steps


def documents_per_change(steps: list[dict[str, Any]]) -> float | None:
    """Documents written per change followed (workload and probes), from the highest-rate
    step that drained (its window holds every document its changes reached)."""
    drained = [s for s in steps if s.get("drains")]
    if not drained:
        return None
    step = max(drained, key=lambda s: s["target_rate"])
    written = sum(b.get("documents", 0) for b in (step.get("stages") or {}).values())
    followed = step["changes"] + step.get("probes_written", 0)
    return written / followed if followed else None


def raw_rate(raw: dict[str, Any] | None) -> float | None:
    """The server's raw rewrite rate of the documents under the index's own mapping: the
    slower of a fresh scratch index and the run's own index, where each was measured."""
    rates = [((raw or {}).get(kind) or {}).get("rate") for kind in (AS_INDEXED, IN_PLACE)]
    known = [rate for rate in rates if rate]
    return min(known) if known else None


def drain_bounds(
    rates: list[float], steps: list[dict[str, Any]], raw: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Per asked rate: documents/s it needs, the raw rate, and whether the server allows it."""
    per_change, ceiling = documents_per_change(steps), raw_rate(raw)
    found = []
    for rate in rates:
        needed = None if per_change is None else rate * per_change
        allowed = None if needed is None or ceiling is None else needed <= ceiling
        found.append(
            {
                "rate": rate,
                "documents_per_change": None if per_change is None else round(per_change, 2),
                "documents_per_second_needed": None if needed is None else round(needed, 1),
                "raw_rewrites_per_second": ceiling,
                "server_allows": allowed,
            }
        )
    return found


def bound_line(bound: dict[str, Any], drains: bool | None) -> str:
    """One sentence on a rate: drained, or not and whether the server could have."""
    rate = f"{bound['rate']:.0f} changes/s"
    needed, ceiling = bound["documents_per_second_needed"], bound["raw_rewrites_per_second"]
    if needed is None or ceiling is None:
        return f"{rate}: no bound (no drained step or no raw rate in this run)"
    need = (
        f"needs {needed:,.0f} documents/s ({bound['documents_per_change']} a change), the "
        f"server rewrites these documents at {ceiling:,.0f}/s raw"
    )
    if bound["server_allows"]:
        verdict = "drained" if drains else "did not drain, though the server allows it"
        return f"{rate} {need}: {verdict}"
    return f"{rate} {need}: the server's bound, no system keeping every document drains it here"
