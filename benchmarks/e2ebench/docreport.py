"""The document benchmark's side-by-side table: each figure per system, ratios cdc-sync / pgsync.

Postgres load per change is computed here, from each step's raw counter deltas and the baseline
phase's cost of the same workload (e2ebench/pgload.py), so the JSON keeps what was measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from e2ebench.docbound import AS_INDEXED, IN_PLACE, bound_line, drain_bounds
from e2ebench.pgload import sync_share, unit_costs
from e2ebench.report import cell, ratio, table, whole_processes

THEIRS = ("pgsync", "pgsync-tuned")
Phase = dict[str, Any] | None

# What pgsync's schema cannot say, printed with every table (see e2ebench/pgsync.py).
PGSYNC_LIMITS = (
    "pgsync cannot express the root filter (status <> 'cancelled'): it indexes every order; "
    "the rows and the workload hold no cancelled order, so both indices hold the same orders",
    "pgsync cannot order an array: its lines come in JSON_AGG's order, cdc-sync's by line_no",
    "pgsync's documents also carry its `_meta` (the keys of every nested row, which it searches "
    "to find the documents a child change touches); numbers and dates are Postgres's JSON "
    "(cdc-sync's: Debezium's, decimals as text)",
)


def _step(phase: Phase, rate: float) -> dict[str, Any] | None:
    if phase is None:
        return None
    return next((s for s in phase.get("streaming", []) if s["target_rate"] == rate), None)


def _costs(result: dict[str, Any], rate: float) -> dict[str, Any] | None:
    steps = (result.get("baseline") or {}).get("steps", [])
    found = next((s for s in steps if s["target_rate"] == rate), None)
    return None if found is None else unit_costs(found)


def step_load(result: dict[str, Any], phase: Phase, rate: float) -> dict[str, Any] | None:
    """A system's Postgres load per change at `rate` (None: the step did not run)."""
    step = _step(phase, rate)
    if step is None or "postgres" not in step:
        return None
    return sync_share(
        step["postgres"], step["changes"], step["probes_written"], _costs(result, rate)
    )


def compare(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: cdc-sync's, each pgsync column's, and the ratios cdc-sync / pgsync."""
    phases = result["systems"]
    theirs = [name for name in THEIRS if name in phases]
    rows: list[dict[str, Any]] = []

    def add(figure: str, unit: str, pick: Callable[[Phase], float | None]) -> None:
        row: dict[str, Any] = {
            "figure": figure,
            "unit": unit,
            "cdc-sync": pick(phases.get("cdc-sync")),
        }
        for name in theirs:
            row[name] = pick(phases[name])
            row[f"ratio vs {name}"] = ratio(row["cdc-sync"], row[name])
        rows.append(row)

    def build(key: str) -> Callable[[Phase], float | None]:
        return lambda phase: ((phase or {}).get("initial_build") or {}).get(key)

    def latency(rate: float, cut: str) -> Callable[[Phase], float | None]:
        return lambda phase: (
            (_step(phase, rate) or {}).get("latency", {}).get("search") or {}
        ).get(cut)

    def fanout(key: str) -> Callable[[Phase], float | None]:
        return lambda phase: ((phase or {}).get("fanout") or {}).get(key)

    def load(rate: float, key: str) -> Callable[[Phase], float | None]:
        return lambda phase: (step_load(result, phase, rate) or {}).get(key)

    add("initial build", "s", build("seconds"))
    add("initial build", "docs/s", build("documents_per_second"))
    for rate in result["options"]["rates"]:
        for cut in ("p50", "p99"):
            add(f"{rate:.0f} changes/s, commit -> visible {cut}", "s", latency(rate, cut))
    orders = result["options"]["fanout"]
    add(f"fan-out: first of {orders:,} orders visible", "s", fanout("first_seconds"))
    add(f"fan-out: all {orders:,} orders visible", "s", fanout("all_seconds"))
    for rate in result["options"]["rates"]:
        add(
            f"{rate:.0f} changes/s: Postgres scans/change, doc tables",
            "n",
            load(rate, "scans_per_change"),
        )
        add(
            f"{rate:.0f} changes/s: Postgres scans/change, all tables",
            "n",
            load(rate, "all_scans_per_change"),
        )
        add(
            f"{rate:.0f} changes/s: Postgres rows read/change",
            "n",
            load(rate, "rows_read_per_change"),
        )
        add(
            f"{rate:.0f} changes/s: Postgres transactions/change",
            "n",
            load(rate, "commits_per_change"),
        )
    return rows


def render(result: dict[str, Any]) -> str:
    rows = result["comparison"]
    names = ("pgsync", "ratio vs pgsync", "pgsync-tuned", "ratio vs pgsync-tuned")
    columns = ["figure", "unit", "cdc-sync"] + [n for n in names if any(n in r for r in rows)]
    options = result["options"]
    lines = [
        f"cdc-sync vs pgsync, nested documents {result['started']} ({result['machine']})",
        f"index: {options['document']} of mappings/shop.yaml; rows: {options['customers']:,} "
        f"customers + {options['orders']:,} orders + {options['fanout']:,} fan-out orders, "
        f"{options['products']:,} products, 1-5 lines an order; steps of "
        f"{options['step_seconds']:.0f} s; tuned pgsync: "
        + " ".join(f"{k}={v}" for k, v in options["tuning"].items()),
        "ratio = cdc-sync / pgsync (docs/s: > 1 cdc-sync faster; seconds and loads: < 1 "
        "cdc-sync better)",
        "initial build: from capture start (cdc-sync: "
        + (
            "also its flat search, Redis and Delta routes of the four tables"
            if options.get("with_flat")
            else "the document index's consumer only"
        )
        + ") or pgsync's daemon start, until a search count shows every document",
        "freshness: child changes only (line quantity, line insert/delete, product price/name, "
        "customer rename); probes poll one order document each",
        "Postgres load: per change followed (workload + probes), over each step's whole window "
        "(workload, drain, 11 s settle: a system's steady background, e.g. heartbeats, counts), "
        + (
            "less the workload's and probes' own cost measured with no sync system attached"
            if result.get("baseline")
            else "RAW: no baseline ran, the workload's own statements are included"
        ),
        "",
        *table(
            columns,
            [[r["figure"], r["unit"]] + [cell(r.get(c)) for c in columns[2:]] for r in rows],
        ),
        "",
        *(f"- {limit}" for limit in PGSYNC_LIMITS),
    ]
    lines += _notes(result)
    lines += _bounds(result)
    return "\n".join(lines)


def bounds(result: dict[str, Any]) -> list[dict[str, Any]]:
    """cdc-sync's documents/s needed per asked rate against the same run's raw rewrite rate."""
    phase = result["systems"].get("cdc-sync") or {}
    if not phase.get("streaming"):
        return []
    return drain_bounds(result["options"]["rates"], phase["streaming"], phase.get("raw_rewrites"))


def _bounds(result: dict[str, Any]) -> list[str]:
    phase = result["systems"].get("cdc-sync") or {}
    raw = phase.get("raw_rewrites")
    if not raw:
        return []
    names = {
        AS_INDEXED: "mapped as the index is",
        "object": "every relation `object` (reference)",
        IN_PLACE: "in the run's own index, after its steps",
    }
    rates = "; ".join(
        f"{names.get(kind, kind)} {r['rate']:,.0f}/s ({r['documents']:,} documents"
        + (f", first pass {r['first_pass_rate']:,.0f}/s" if "first_pass_rate" in r else "")
        + ")"
        for kind, r in raw.items()
    )
    drained = {s["target_rate"]: s["drains"] for s in phase.get("streaming", [])}
    return [
        "",
        f"the server's raw rewrite rate of cdc-sync's documents, same run: {rates}",
        *(f"- {bound_line(b, drained.get(b['rate']))}" for b in bounds(result)),
    ]


def build_cpu(result: dict[str, Any]) -> str | None:
    """Each system's initial build in CPU seconds of every process it ran (the job's parts are
    inside its figure, not added again): how many of the machine's cores it kept busy, and how
    long the same CPU seconds take with every part overlapped. Not a bound on any system: what
    its way of building costs this machine, beside its wall time."""
    cores = result.get("cores")
    parts = []
    for name, phase in result["systems"].items():
        build = (phase or {}).get("initial_build") or {}
        cpu, seconds = build.get("cpu_seconds") or {}, build.get("seconds")
        if not cpu or not seconds:
            continue
        total = sum(whole_processes(cpu).values())
        text = f"{name} {total:.1f} CPU s in {seconds:.1f} s ({total / seconds:.2f} cores"
        if cores:
            text += f" of {cores}; all of it overlapped needs >= {total / cores:.1f} s"
        parts.append(text + ")")
    return "- initial build, CPU: " + "; ".join(parts) if parts else None


def _notes(result: dict[str, Any]) -> list[str]:
    notes = [line] if (line := build_cpu(result)) else []
    for name, phase in result["systems"].items():
        build = phase.get("initial_build") or {}
        if build and build.get("documents") != build.get("roots"):
            notes.append(
                f"- {name}: {build['documents']:,} documents expected of {build['roots']:,} orders"
            )
        for consumer, stages in (build.get("stages") or {}).items():
            notes.append(f"- {name} ({consumer}): initial build: {build_stages(stages)}")
        for step in phase.get("streaming", []):
            rate = step["target_rate"]
            if not step["drains"]:
                notes.append(
                    f"- {name}: {rate:.0f} changes/s did not drain (drain probe "
                    f"{step['drained_in_seconds']} s); higher rates not run"
                )
            if step["latency"].get("unresolved"):
                notes.append(
                    f"- {name}: {rate:.0f} changes/s: {step['latency']['unresolved']} of "
                    f"{step['latency']['probes']} probes never seen"
                )
            kinds = step.get("latency_by_kind") or {}
            if kinds:
                cells = ", ".join(
                    f"{kind} {cell(k['p50'])}/{cell(k['p99'])}"
                    + (f" ({k['unresolved']} unseen)" if k["unresolved"] else "")
                    for kind, k in kinds.items()
                )
                notes.append(f"- {name}: {rate:.0f} changes/s, p50/p99 s by probe kind: {cells}")
            for consumer, stages in (step.get("stages") or {}).items():
                if "documents" in stages.get("stage_mean_seconds", {}):
                    notes.append(
                        f"- {name} ({consumer}): {rate:.0f} changes/s: batches of "
                        f"{stages['records_per_batch']:.0f} records every "
                        f"{cell(stages['interval_mean_seconds'])} s, "
                        f"{cell(stages['stage_mean_seconds']['documents'])} s of it documents, "
                        f"{stages.get('documents', 0):,} documents written"
                    )
            load = step_load(result, phase, rate)
            if load is not None:
                tables = ", ".join(f"{t} {v}" for t, v in load["scans_per_change_by_table"].items())
                notes.append(
                    f"- {name}: {rate:.0f} changes/s, scans/change by table: {tables or 'none'}"
                )
        fan = phase.get("fanout") or {}
        renames = [r["all_seconds"] for r in fan.get("renames", [])]
        if len(renames) > 1:
            notes.append(
                f"- {name}: fan-out, all orders visible after each rename: "
                + ", ".join(cell(s) for s in renames)
                + " s (the median is the figure)"
            )
        if fan.get("missing"):
            notes.append(f"- {name}: fan-out: {fan['missing']} of {fan['orders']} never showed it")
    return notes


def build_stages(stages: dict[str, Any]) -> str:
    """A build's batches from the job's batch lines: how many, and the seconds each stage took
    over all of them (the documents stage's is the render and the writes)."""
    totals = {
        stage: mean * stages["stage_batches"][stage]
        for stage, mean in stages["stage_mean_seconds"].items()
    }
    spent = ", ".join(f"{stage} {cell(seconds)}" for stage, seconds in sorted(totals.items()))
    return (
        f"{stages['batches']} batches of up to {stages['max_records']:,} records, "
        f"{stages.get('documents', 0):,} documents written; seconds in all: {spent}; the longest "
        f"documents stage {cell(stages['stage_max_seconds'].get('documents'))} s"
    )
