"""Issue 26's first measurement: flat freshness while a document fan-out runs, beside the same
step without it, in the same run.

Rows (part of the bench's rows, loaded after e2ebench.load's): one customer owning `roots`
orders, each with LINES_PER_ORDER lines. The demo mapping's document index
`shop_order_documents` nests the customer in every order, so renaming that customer re-renders
`roots` documents. The fan-out step is a ladder step again at the same rate while the customer
is renamed every `interval` seconds (each batch of the document consumer folds the renames it
finds into one and renders every root: the consumer stays busy for the whole step); after the
step, outside its clock, the bench waits until the last name shows in every one of the
customer's documents. The flat sinks' probes are the ladder's (other customers).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_sync.core.settings import Connections
from cdc_sync.job.consumers import DOCUMENTS_PREFIX
from cdc_sync.sinks.search.backends import is_transient, open_backend
from e2ebench.consumer_report import step_label
from e2ebench.ladder import StepParts, StepPlan, run_step
from e2ebench.load import PRODUCTS, insert_fanout_customer
from e2ebench.report import cell, ratio, seconds_text, table

log = logging.getLogger(__name__)
LINES_PER_ORDER = 2
FLAT = ("search", "redis", "delta", "all")
# Within noise: a p50 or p99 beside the fan-out at most this much above the same step's without
# (a 60 s step's p99 rests on its two slowest probes).
NOISE_RATIO, NOISE_SECONDS = 1.25, 0.1
SETTLE_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class FanoutRows:
    customer_id: int
    roots: int  # its orders: the documents one rename re-renders
    lines: int


def load_fanout(pg_url: str, roots: int, lines_per_order: int = LINES_PER_ORDER) -> FanoutRows:
    """The fan-out customer, its `roots` orders and their lines (over the loaded products)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        customer = insert_fanout_customer(conn, roots)
        lines = conn.execute(
            "INSERT INTO shop.order_lines (order_id, line_no, product_id, quantity, unit_price) "
            "SELECT o.id, n, 1 + (o.id + 37 * n) %% %s, 1 + (o.id + n) %% 9, "
            "((o.id * n) %% 900 + 1)::numeric FROM shop.orders o "
            "CROSS JOIN generate_series(1, %s) n WHERE o.customer_id = %s",
            (PRODUCTS, lines_per_order, customer),
        ).rowcount
    return FanoutRows(customer, roots, lines)


class Renamer:
    """Renames the fan-out customer every `interval` seconds until told to stop."""

    def __init__(self, pg_url: str, customer_id: int, interval: float) -> None:
        self.conn = psycopg.connect(pg_url, autocommit=True)
        self.customer_id = customer_id
        self.interval = interval
        self.renames = 0
        self.marker = ""

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.rename()
            stop.wait(self.interval)

    def rename(self) -> None:
        marker = f"fanout-{self.renames}-{uuid.uuid4().hex[:8]}"
        self.conn.execute(
            "UPDATE shop.customers SET full_name = %s, updated_at = now() WHERE id = %s",
            (marker, self.customer_id),
        )
        self.renames += 1
        self.marker = marker

    def close(self) -> None:
        self.conn.close()


def settle(
    connections: Connections, alias: str, rows: FanoutRows, marker: str, timeout: float
) -> dict[str, Any]:
    """Seconds until every one of the customer's documents shows `marker` (a search count of
    those that do not; a slow answer of a busy server is waited for), or None after
    `timeout`, with how many still did not."""
    backend = open_backend(
        connections.search_client, connections.require("search_url"), timeout_seconds=120
    )
    client = backend.client  # type: ignore[attr-defined]
    stale = {"query": {"bool": {
        "filter": [{"term": {"customer.id": rows.customer_id}}],
        "must_not": [{"term": {"customer.full_name.keyword": marker}}],
    }}}  # fmt: skip
    started = time.monotonic()
    behind: int | None = None
    try:
        while time.monotonic() - started < timeout:
            try:
                behind = int(client.count(index=alias, body=stale)["count"])
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.info("fan-out count: %s; asking again", type(exc).__name__)
            if behind == 0:
                return {"settled_seconds": round(time.monotonic() - started, 1), "behind": 0}
            time.sleep(SETTLE_POLL_SECONDS)
    finally:
        backend.close()
    return {"settled_seconds": None, "behind": behind}


def run_fanout_step(
    plan: StepPlan,
    step_parts: StepParts,
    connections: Connections,
    alias: str,
    rows: FanoutRows,
    interval: float,
    settle_timeout: float,
) -> dict[str, Any]:
    """The ladder's step at `plan.rate` while the fan-out customer is renamed, then the wait
    for its last name in every one of its documents (alias: the document index's)."""
    renamer = Renamer(connections.require("pg_url"), rows.customer_id, interval)
    try:
        step = run_step(plan, *step_parts, during=renamer.run)
    finally:
        renamer.close()
    step["fanout"] = {
        "roots": rows.roots,
        "renames": renamer.renames,
        "interval_seconds": interval,
        "settle_timeout": settle_timeout,
        **settle(connections, alias, rows, renamer.marker, settle_timeout),
    }
    return step


def compare(plain: list[dict[str, Any]], fanned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fan-out step and flat sink: p50 and p99 without and with the fan-out (the same
    rate's plain step of the run), their ratios, and whether the pair is within noise."""
    by_rate = {s["target_rate"]: s for s in plain}
    found = []
    for step in fanned:
        before = by_rate.get(step["target_rate"])
        if before is None:
            continue
        for sink in FLAT:
            pair = {
                q: (before["latency"][sink][q], step["latency"][sink][q]) for q in ("p50", "p99")
            }
            found.append({
                "rate": step["target_rate"],
                "sink": sink,
                **{f"{q}_without": a for q, (a, _) in pair.items()},
                **{f"{q}_with": b for q, (_, b) in pair.items()},
                **{f"{q}_ratio": ratio(b, a) for q, (a, b) in pair.items()},
                "within_noise": all(_within_noise(a, b) for a, b in pair.values()),
            })  # fmt: skip
    return found


def _within_noise(without: float | None, with_fanout: float | None) -> bool:
    if without is None or with_fanout is None:
        return False
    return with_fanout <= max(NOISE_RATIO * without, without + NOISE_SECONDS)


def fanout_target(result: dict[str, Any]) -> dict[str, Any] | None:
    """Issue 26, deliverable 1: the flat figures unchanged beside the fan-out."""
    fanned = result.get("fanout_steps", [])
    if not fanned:
        return None
    pairs = compare(result.get("streaming", []), fanned)
    off = [p for p in pairs if not p["within_noise"]]
    roots = fanned[0]["fanout"]["roots"]
    rates = "/".join(f"{s['target_rate']:.0f}" for s in fanned)
    return {
        "target": f"{rates} changes/s: flat p50/p99 unchanged beside a {roots:,}-root document "
        f"fan-out (within {NOISE_RATIO}x or +{NOISE_SECONDS} s of the same step without)",
        "figure": "every sink within noise" if pairs and not off else
        "; ".join(f"{p['rate']:.0f}/s {p['sink']} p50 x{cell(p['p50_ratio'])} p99 "
                  f"x{cell(p['p99_ratio'])}" for p in off) or "no step to compare with",
        "met": bool(pairs) and not off,
    }  # fmt: skip


def fanout_lines(result: dict[str, Any]) -> list[str]:
    fanned = result.get("fanout_steps", [])
    if not fanned:
        return []
    steps = {step_label(s): s for s in (*result.get("streaming", []), *fanned)}
    rows = [
        [
            f"{p['rate']:.0f}",
            p["sink"],
            f"{seconds_text(p['p50_without'])} / {seconds_text(p['p50_with'])}",
            cell(p["p50_ratio"]),
            f"{seconds_text(p['p99_without'])} / {seconds_text(p['p99_with'])}",
            cell(p["p99_ratio"]),
            "yes" if p["within_noise"] else "NO",
        ]
        for p in compare(result.get("streaming", []), fanned)
    ]
    lines = [
        "flat freshness beside a document fan-out (the same rate without / with; ratio = with "
        "/ without)",
        *table(["rate", "sink", "p50 s", "ratio", "p99 s", "ratio", "within noise"], rows),
    ]
    for label, s in steps.items():
        if not s.get("fanout"):
            continue
        f = s["fanout"]
        plain = steps.get(label.removesuffix("+fan-out"), {})
        documents: dict[str, Any] = next(
            (b for n, b in s["stages"].items() if n.startswith(DOCUMENTS_PREFIX)), {}
        )
        lines.append(
            f"  {label}: {f['renames']} renames of a customer with {f['roots']:,} orders; the "
            f"document consumer ran {documents.get('batches', 0)} batches, "
            f"{documents.get('documents', 0):,} documents, "
            f"{documents.get('stage_mean_seconds', {}).get('documents', 0):.1f} s a batch; last "
            f"rename in every document {_settled(f)}; job cpu "
            f"{plain.get('job_cpu_percent', 0):.0f}% -> {s['job_cpu_percent']:.0f}%, search cpu "
            f"{plain.get('service_cpu_percent', {}).get('search', 0):.0f}% -> "
            f"{s['service_cpu_percent'].get('search', 0):.0f}%"
        )
    return lines


def _settled(fanout: dict[str, Any]) -> str:
    if fanout["settled_seconds"] is not None:
        return f"{fanout['settled_seconds']:.0f} s after the step"
    return f"not after {fanout['settle_timeout']:.0f} s ({fanout['behind']} behind)"
