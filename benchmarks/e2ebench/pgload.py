"""What a sync system asks of Postgres per change, from Postgres's own statistics.

Counters (cumulative; a phase's figure is the delta between the reads around it): per user
table, the scans it served (`seq_scan + idx_scan`, pg_stat_user_tables: statements' table and
index scans, foreign-key checks' and triggers' included) and the rows they read
(`seq_tup_read + idx_tup_fetch`); for the database, committed transactions (`xact_commit`,
pg_stat_database: every session's, the benchmark's own included). Postgres counts no
statements without pg_stat_statements; for autocommit clients a transaction is a statement.

A phase's deltas hold the workload's and the probes' own work too. The baseline phase runs the
same workload and probe writes with no sync system attached and measures their cost per change
(`unit_costs`); `sync_share` takes that cost times a step's changes off the step's deltas: what
is left is the sync system's (its queries, its triggers, its heartbeats), divided by the
changes it had to follow (the workload's and the probes').
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import psycopg

# A backend flushes its statistics when it goes idle, but at most once a second; what it did
# in that second waits for its idle timer, 10 s (Postgres 15+, PGSTAT_IDLE_INTERVAL; seen: a
# burst of 99 probe writes showed as 1 scan after 2 s). Reads wait this long, so a phase's last
# statements, whoever ran them, are in its own counts.
SETTLE_SECONDS = 11.0
DOCUMENT_TABLES = ("shop.customers", "shop.orders", "shop.order_lines", "shop.products")
Counters = dict[str, Any]  # {"scans": {table: n}, "rows_read": {table: n}, "commits": n}


def read_counters(pg_url: str, settle: float = SETTLE_SECONDS) -> Counters:
    """The cumulative counters now (after `settle` seconds), one transaction of our own."""
    time.sleep(settle)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT schemaname || '.' || relname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0), "
            "coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables"
        ).fetchall()
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return {
        "scans": {str(name): int(scans) for name, scans, _ in tables},
        "rows_read": {str(name): int(rows) for name, _, rows in tables},
        "commits": int(commits[0]) if commits else 0,
    }


def delta(before: Counters, after: Counters) -> Counters:
    """after - before, table by table (a table new since `before` counts from 0)."""
    return {
        key: {t: n - before[key].get(t, 0) for t, n in after[key].items()}
        for key in ("scans", "rows_read")
    } | {"commits": after["commits"] - before["commits"]}


def _scaled(counters: Counters, factor: float) -> dict[str, Any]:
    return {
        key: {t: n * factor for t, n in counters[key].items()} for key in ("scans", "rows_read")
    } | {"commits": counters["commits"] * factor}


def unit_costs(baseline_step: Mapping[str, Any]) -> dict[str, Any]:
    """Per workload change and per probe write, from a baseline step: its workload's deltas over
    its changes, its probe burst's over its probes."""
    return {
        "change": _scaled(baseline_step["workload"]["postgres"], 1 / baseline_step["changes"]),
        "probe": _scaled(baseline_step["probe_burst"]["postgres"], 1 / baseline_step["probes"]),
    }


def sync_share(
    step_delta: Counters, changes: int, probes: int, costs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The sync system's load per change followed: the step's deltas less the workload's and
    the probes' own cost (`costs`, from the baseline; None: nothing taken off, `raw`)."""
    own: dict[str, Any] = {"scans": {}, "rows_read": {}, "commits": 0.0}
    if costs is not None:
        own = _sum(_scaled(costs["change"], changes), _scaled(costs["probe"], probes))
    followed = changes + probes

    def per_change(key: str, tables: tuple[str, ...] | None = None) -> dict[str, float]:
        names = set(step_delta[key]) | set(own[key])
        return {
            t: (step_delta[key].get(t, 0) - own[key].get(t, 0.0)) / followed
            for t in sorted(names)
            if tables is None or t in tables
        }

    scans = per_change("scans")
    return {
        "changes": followed,
        "raw": costs is None,
        "scans_per_change": round(sum(per_change("scans", DOCUMENT_TABLES).values()), 3),
        "all_scans_per_change": round(sum(scans.values()), 3),
        "rows_read_per_change": round(sum(per_change("rows_read").values()), 2),
        "commits_per_change": round((step_delta["commits"] - own["commits"]) / followed, 3),
        # tables where the share is visible at all (noise of a few scans over a step is not)
        "scans_per_change_by_table": {t: round(v, 3) for t, v in scans.items() if abs(v) >= 0.005},
    }


def _sum(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: {t: a[key].get(t, 0.0) + b[key].get(t, 0.0) for t in set(a[key]) | set(b[key])}
        for key in ("scans", "rows_read")
    } | {"commits": a["commits"] + b["commits"]}
