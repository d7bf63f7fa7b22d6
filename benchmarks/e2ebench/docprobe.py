"""Commit -> visible in an order document: e2ebench/sampler.py's probes, written to a child row.

Probe slot k (1 .. rows + 1, the last the drain probe's) owns order k and, by kind in turn: the
order's customer (a marker in `full_name`, polled at `customer.full_name`), the order's first
line (a unique `quantity`, polled in `lines[]` by `line_no`) or that line's product (a marker in
`name`, polled at `lines[].product.name`). Each slot's rows are `Reserved`: the workload leaves
them alone, so a probe is the only writer of its row. Documents are read by `_mget`, realtime,
from cdc-sync's alias or pgsync's index alike. Also: the fan-out (one customer renamed, all of
its orders polled) and the document count of an index.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opensearchpy import NotFoundError, OpenSearch

from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.search.backends import is_transient as search_transient
from e2ebench.documents import Reserved
from e2ebench.sampler import POLL_SECONDS, Probe, Sampler, percentiles

KINDS = ("customer", "line", "product")
QUANTITY_MARKERS = 1_000_000  # probe quantities count up from here: the workload's are < 21
MGET_CHUNK = 500


@dataclass(frozen=True)
class Target:
    kind: str  # one of KINDS
    order_id: int  # the document polled
    customer_id: int
    line_no: int  # the order's line probed (kind line) or holding the product (kind product)
    product_id: int


def probe_targets(rows: list[tuple[int, int, int, int]]) -> dict[int, Target]:
    """Slot -> target from (order id, customer id, first line_no, its product id) of orders
    1 .. n, in order; a slot's kind comes in turn. Two slots of a kind may not share a row."""
    targets: dict[int, Target] = {}
    for slot, (order_id, customer_id, line_no, product_id) in enumerate(rows, start=1):
        kind = KINDS[(slot - 1) % len(KINDS)]
        targets[slot] = Target(kind, order_id, customer_id, line_no, product_id)
    for kind, attribute in (("customer", "customer_id"), ("product", "product_id")):
        owned = [getattr(t, attribute) for t in targets.values() if t.kind == kind]
        if len(set(owned)) != len(owned):
            raise ValueError(f"probe slots share a {kind}: load more customers and products")
    return targets


def reserved(targets: Mapping[int, Target]) -> Reserved:
    """What the workload must leave alone: every slot's order (its lines), customer-kind slots'
    customers, product-kind slots' products."""
    return Reserved(
        orders=frozenset(t.order_id for t in targets.values()),
        customers=frozenset(t.customer_id for t in targets.values() if t.kind == "customer"),
        products=frozenset(t.product_id for t in targets.values() if t.kind == "product"),
    )


def probe_value(target: Target, document: Mapping[str, Any]) -> str | None:
    """What the document shows where `target`'s probe writes (as text, markers are text)."""
    if target.kind == "customer":
        return (document.get("customer") or {}).get("full_name")
    lines = document.get("lines") or []
    line = next((item for item in lines if item.get("line_no") == target.line_no), None)
    if line is None:
        return None
    if target.kind == "line":
        quantity = line.get("quantity")
        return None if quantity is None else str(quantity)
    return (line.get("product") or {}).get("name")


def kind_summary(probes: list[Probe], targets: Mapping[int, Target]) -> dict[str, Any]:
    """Per probe kind: probes, unresolved, p50/p99 seconds (a customer or product probe's
    change fans out to every order holding it, a line's to its order alone)."""
    summary: dict[str, Any] = {}
    for kind in KINDS:
        found = [p for p in probes if targets[p.row_id].kind == kind]
        cuts = percentiles([p.seen["search"] for p in found if "search" in p.seen])
        summary[kind] = {
            "probes": len(found),
            "unresolved": sum(not p.done for p in found),
            "p50": cuts["p50"],
            "p99": cuts["p99"],
        }
    return summary


class DocumentSampler(Sampler):
    """Sampler whose probes change a child row and poll one order document (search only)."""

    def __init__(
        self, mapping: MappingFile, connections: Connections, rows: int, index: str
    ) -> None:
        super().__init__(mapping, connections, rows, sinks=("search",), search_index=index)
        found = self.pg.execute(
            "SELECT o.id, o.customer_id, l.line_no, l.product_id FROM shop.orders o "
            "JOIN LATERAL (SELECT line_no, product_id FROM shop.order_lines "
            "WHERE order_id = o.id ORDER BY line_no LIMIT 1) l ON true "
            "WHERE o.id <= %s ORDER BY o.id",
            (rows + 1,),
        ).fetchall()
        if len(found) != rows + 1:
            raise ValueError(f"probes need orders 1..{rows + 1} with a line each")
        self.targets = probe_targets([(int(o), int(c), int(n), int(p)) for o, c, n, p in found])
        self.reserved = reserved(self.targets)
        self._quantities = itertools.count(QUANTITY_MARKERS)
        self.by_kind: dict[str, Any] = {}  # the last `take`'s probes, by kind

    def take(self) -> list[Probe]:
        """As Sampler's; keeps the periodic probes' figures by kind (the drain probe's slot
        is left out, as run_step leaves it out of its latency)."""
        taken = super().take()
        self.by_kind = kind_summary([p for p in taken if p.row_id <= self.rows], self.targets)
        return taken

    def _marker(self, row_id: int) -> str:
        if self.targets[row_id].kind == "line":
            return str(next(self._quantities))
        return super()._marker(row_id)

    def _write(self, row_id: int, marker: str) -> None:
        target = self.targets[row_id]
        if target.kind == "customer":
            self.pg.execute(
                "UPDATE shop.customers SET full_name = %s WHERE id = %s",
                (marker, target.customer_id),
            )
        elif target.kind == "line":
            self.pg.execute(
                "UPDATE shop.order_lines SET quantity = %s WHERE order_id = %s AND line_no = %s",
                (int(marker), target.order_id, target.line_no),
            )
        else:
            self.pg.execute(
                "UPDATE shop.products SET name = %s WHERE id = %s", (marker, target.product_id)
            )

    def _search_values(self, ids: list[int]) -> dict[int, Any]:
        slots = {str(self.targets[slot].order_id): slot for slot in ids}
        docs = self.search.mget(self.alias, list(slots))
        return {
            slots[d["_id"]]: probe_value(self.targets[slots[d["_id"]]], d["_source"])
            for d in docs
            if d.get("found")
        }

    def write_unobserved(self, count: int) -> int:
        """`count` probe writes, slots in turn, nothing awaited: what probes cost Postgres alone
        (the baseline, where no system makes them visible)."""
        for n in range(count):
            slot = n % (self.rows + 1) + 1
            self._write(slot, self._marker(slot))
        return count

    def fanout(self, customer_id: int, timeout: float) -> dict[str, Any]:
        """Rename `customer_id`; seconds from the commit until the first and until every one of
        its orders' documents shows the new name (polled by `_mget`)."""
        ids = [
            str(row[0])
            for row in self.pg.execute(
                "SELECT id FROM shop.orders WHERE customer_id = %s", (customer_id,)
            )
        ]
        marker = f"fanout-{uuid.uuid4().hex[:12]}"
        self.pg.execute(
            "UPDATE shop.customers SET full_name = %s WHERE id = %s", (marker, customer_id)
        )
        committed = time.monotonic()
        pending, first = set(ids), None
        while pending and time.monotonic() - committed < timeout:
            waiting = sorted(pending)
            for start in range(0, len(waiting), MGET_CHUNK):
                try:
                    docs = self.search.mget(self.alias, waiting[start : start + MGET_CHUNK])
                except Exception as exc:  # the fan-out keeps the server busy: read again
                    if not search_transient(exc):
                        raise
                    continue
                for doc in docs:
                    customer = (doc.get("_source") or {}).get("customer") or {}
                    if doc.get("found") and customer.get("full_name") == marker:
                        pending.discard(doc["_id"])
            if first is None and len(pending) < len(ids):
                first = time.monotonic() - committed
            time.sleep(POLL_SECONDS)
        seconds = time.monotonic() - committed
        return {
            "orders": len(ids),
            "first_seconds": None if first is None else round(first, 2),
            "all_seconds": None if pending else round(seconds, 2),
            "missing": len(pending),
        }


def count_documents(search_url: str, index: str) -> int:
    """Documents behind `index` (an alias or an index): a search count; 0 before it exists."""
    client = OpenSearch(hosts=[search_url], timeout=30)
    try:
        return int(client.count(index=index)["count"])
    except NotFoundError:
        return 0
    finally:
        client.close()
