"""What the demo prints: per table the source and sink counts, whether contents match, latency."""

from __future__ import annotations

import statistics
from collections import Counter

from cdc_sync.demo.latency import LatencySample
from cdc_sync.verify.compare import Report


def latency_lines(samples: list[LatencySample]) -> list[str]:
    if not samples:
        return ["commit -> visible latency: no samples"]
    totals = sorted(s.seconds for s in samples)
    lines = [
        f"commit -> visible in all sinks ({len(totals)} probes): "
        f"p50 {statistics.median(totals) * 1000:.0f} ms, max {totals[-1] * 1000:.0f} ms"
    ]
    sinks = sorted({name for s in samples for name in s.per_sink})
    for sink in sinks:
        values = sorted(s.per_sink[sink] for s in samples if sink in s.per_sink)
        lines.append(f"  {sink:<7} p50 {statistics.median(values) * 1000:.0f} ms")
    return lines


def demo_report(
    report: Report, workload: Counter[str], samples: list[LatencySample], seconds: float
) -> str:
    lines = [
        "",
        f"workload: {sum(workload.values())} transactions "
        f"({', '.join(f'{n} {op}' for op, n in sorted(workload.items()))})",
        "",
        report.table(),
        "",
        *latency_lines(samples),
        "",
        f"converged: {'yes' if report.converged else 'NO'} (demo ran {seconds:.0f} s)",
    ]
    return "\n".join(lines)
