"""The page `bench_e2e.py` prints: raw rates, the initial sync per sink and the document
index's build, the ladder's freshness per sink, each step's breakdown and floor per consumer
of the log, the fan-out beside the flat steps, the CPU of the initial sync, and the targets
of issues 9, 28 and 26 with the bound of each missed one."""

from __future__ import annotations

from typing import Any

from e2ebench.consumer_report import floor_lines, stage_lines, step_label
from e2ebench.fanout import fanout_lines
from e2ebench.report import SINKS, seconds_text, table


def render(result: dict[str, Any]) -> str:
    lines = [f"cdc-sync end-to-end benchmark {result['started']} ({result['machine']})", ""]
    lines += [f"rows: {result['rows']}", ""]
    lines += _raw_lines(result["raw"])
    lines += ["", *_initial_lines(result)]
    steps = result.get("streaming", [])
    warmup = result.get("warmup")
    if warmup:
        lines += ["", _warmup_line(warmup)]
    if steps:
        lines += ["", *_latency_lines([*steps, *result.get("fanout_steps", [])])]
        lines += ["", *stage_lines([*steps, *result.get("fanout_steps", [])])]
        lines += ["", *floor_lines(steps)]
    fanout = fanout_lines(result)
    if fanout:
        lines += ["", *fanout]
    initial = result.get("initial_sync", {})
    if initial.get("cpu_seconds"):
        lines += ["", *_cpu_lines(initial, result["targets"])]
    lines += ["", *target_lines("targets (issue 9)", result["targets"])]
    for issue, key in (("28, deliverable 2", "targets_issue_28"), ("26", "targets_issue_26")):
        if result.get(key):
            lines += ["", *target_lines(f"targets (issue {issue})", result[key])]
    return "\n".join(lines)


def target_lines(title: str, found: list[dict[str, Any]]) -> list[str]:
    """The targets, met or not, then the bound of each missed one the run's figures prove."""
    return [
        title,
        *table(
            ["target", "figure", "met"],
            [[t["target"], t["figure"], "yes" if t["met"] else "NO"] for t in found],
        ),
        *(
            f"  bound of '{t['target']}': {t['bound']['verdict']}"
            for t in found
            if not t["met"] and "bound" in t
        ),
    ]


def _warmup_line(warmup: dict[str, Any]) -> str:
    """The warm-up before the ladder: not a step, its p50/p99 per sink for the record."""
    latency = warmup["latency"]
    sinks = ", ".join(
        f"{sink} {seconds_text(latency[sink]['p50'])}/{seconds_text(latency[sink]['p99'])}"
        for sink in SINKS
        if latency.get(sink)
    )
    return (
        f"warm-up before the ladder (not counted): {warmup['seconds']:.0f} s at "
        f"{warmup['rate']:g} changes/s, p50/p99 s: {sinks}"
    )


def _raw_lines(raw: dict[str, Any]) -> list[str]:
    lines = [
        "raw search re-index of existing documents (10 per bulk), in steady state after "
        f"{raw.get('search_update_warmup_seconds', 0.0):.1f} s of warm-up: "
        f"{raw['search_updates_per_second']:.1f} docs/s",
    ]
    bulks = raw.get("search_update_bulks")
    if bulks:
        lines.append(
            f"  its {bulks['count']} bulks took up to {bulks['max_seconds']:.2f} s: while it is "
            "kept busy so, a write arriving at a random moment waits on the server alone, p95 >= "
            f"{bulks['p95_wait_seconds']:.2f} s, p99 >= {bulks['p99_wait_seconds']:.2f} s"
        )
    return lines


def _initial_lines(result: dict[str, Any]) -> list[str]:
    """Per sink: its raw rate, the initial sync's seconds and rate, the ratio; into all three
    sinks; the document index's build (its consumer runs beside the sinks')."""
    raw = result["raw"]["rows_per_second"]
    initial = result.get("initial_sync", {})
    rows = [
        [
            sink,
            f"{raw[sink]:.0f}",
            f"{initial['seconds'][sink]:.1f}" if initial else "-",
            f"{initial['rows_per_second'][sink]:.0f}" if initial else "-",
            f"{initial['rows_per_second'][sink] / raw[sink]:.2f}" if initial else "-",
        ]
        for sink in SINKS
    ]
    if initial:
        slowest = min(raw, key=raw.get)
        every = initial["all_sinks_rows_per_second"]
        rows.append(
            [
                "all three",
                f"{raw[slowest]:.0f} ({slowest})",
                f"{max(initial['seconds'].values()):.1f}",
                f"{every:.0f}",
                f"{every / raw[slowest]:.2f}",
            ]
        )
    lines = table(["sink", "raw rows/s", "initial sync s", "initial rows/s", "x raw"], rows)
    build = result.get("documents_build")
    if build:
        lines.append(
            f"document index {build['index']}: {build['documents']:,} documents "
            + (
                f"built {build['seconds']:.1f} s after capture start ({build['per_second']:.0f}/s)"
                if build["seconds"] is not None
                else f"not built after {build['timeout']:.0f} s ({build['found']:,} found)"
            )
        )
    return lines


def _latency_lines(steps: list[dict[str, Any]]) -> list[str]:
    rows = []
    for s in steps:
        lat = s["latency"]
        cells = [
            step_label(s),
            f"{s['achieved_rate']:.0f}",
            f"{lat['probes']}",
        ]
        for sink in (*SINKS, "all"):
            p = lat[sink]
            cells.append(
                f"{seconds_text(p['p50'])}/{seconds_text(p['p95'])}/{seconds_text(p['p99'])}"
            )
        cells += [
            "yes" if s["drains"] else f"no ({s['drained_in_seconds']})",
            f"{s['job_cpu_percent']:.0f}%",
            f"{s['job_rss_mb']['max']}",
            f"{s['service_cpu_percent'].get('search', 0):.0f}%",
        ]
        rows.append(cells)
    return [
        "streaming: commit -> visible seconds (p50/p95/p99) per sink",
        *table(
            ["rate", "achieved", "probes", *SINKS, "all", "drains", "job cpu", "rss MB",
             "search cpu"],
            rows,
        ),
    ]  # fmt: skip


def _cpu_lines(initial: dict[str, Any], found: list[dict[str, Any]]) -> list[str]:
    cpu = initial["cpu_seconds"]
    parts = {name: secs for name, secs in cpu.items() if name.startswith("job: ")}
    whole = {name: secs for name, secs in cpu.items() if name not in parts}
    lines = [
        f"initial sync CPU seconds ({initial['cores']} cores): "
        + ", ".join(f"{n} {secs:.1f}" for n, secs in sorted(whole.items(), key=lambda i: -i[1]))
    ]
    if parts:
        lines.append("  the job's: " + ", ".join(f"{n[5:]} {s:.1f}" for n, s in parts.items()))
    bound = next((t["bound"] for t in found if "bound" in t), None)
    if bound is not None:
        lines.append(
            f"  machine busy {bound['busy_percent']:.0f}%; this work needs >= "
            f"{bound['floor_seconds']:.1f} s on these cores, the pipeline without the job "
            f"(search at its raw CPU cost) >= {bound['floor_without_job_seconds']:.1f} s; "
            "the 0.8 x target is "
            f"{bound['target_seconds']:.1f} s, leaving the job "
            f"{bound['job_budget_cpu_seconds']:.1f} CPU s (it spent {cpu['job']:.1f})"
        )
        lines.append(f"  bound: {bound['verdict']}")
    return lines
