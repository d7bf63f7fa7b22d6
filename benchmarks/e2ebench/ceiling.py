"""The ceiling probe's pure parts (benchmarks/probe_document_fanout.py): the rows of N order
documents laid out so that chosen parents reach exactly K roots, the batches the job's source
reads them in, and the arithmetic of the figures.

The rows are those of mappings/shop.sql (every column: the state keeps whole rows), as the
decoder gives them (Decimal, aware datetime). A customer's orders and a product's lines are
spread over the id range by a bijection (`Spread`), not consecutive, so a render chunk of
consecutive roots reaches as many distinct parents as a real table's would, and a parent's
fan-out reads the state where its roots are, not one page.
"""

from __future__ import annotations

import bisect
import math
from argparse import ArgumentTypeError
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from itertools import accumulate
from typing import Any

from cdc_sync.core.model import TableId
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.source.offsets import cap_total

CUSTOMERS = TableId("shop", "customers")
ORDERS = TableId("shop", "orders")
LINES = TableId("shop", "order_lines")
PRODUCTS = TableId("shop", "products")
# The topics' order in the source (Debezium's snapshot reads the tables in name order).
TABLES = (CUSTOMERS, LINES, ORDERS, PRODUCTS)
KEYS = {CUSTOMERS: ("id",), ORDERS: ("id",), LINES: ("order_id", "line_no"), PRODUCTS: ("id",)}

FANOUTS = (1_000, 10_000, 100_000, 1_000_000)  # K: the parents that reach K roots, if they fit
DESCRIPTION_CHARS = 200  # a product's description (the bench's are ~5 kB: TOASTed on purpose)
TIERS = ("standard", "gold", "platinum")
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
Check = Callable[[Mapping[str, Any]], bool]  # what the writer checks in each document


def _column(name: str, kind: TypeKind, precision: int | None = None) -> Column:
    return Column(name, ColumnType(kind, precision=precision, scale=2 if precision else None))


INT64, INT32, TEXT, TS, DEC = (
    TypeKind.INT64,
    TypeKind.INT32,
    TypeKind.STRING,
    TypeKind.TIMESTAMP_TZ,
    TypeKind.DECIMAL,
)
# As the catalog reads mappings/shop.sql (schema.catalog.row_schema_from_catalog).
SCHEMAS: dict[TableId, RowSchema] = {
    CUSTOMERS: RowSchema(
        tuple(
            _column(*c)
            for c in (
                ("id", INT64),
                ("email", TEXT),
                ("full_name", TEXT),
                ("tier", TEXT),
                ("created_at", TS),
                ("updated_at", TS),
            )
        )
    ),
    ORDERS: RowSchema(
        (
            _column("id", INT64),
            _column("customer_id", INT64),
            _column("status", TEXT),
            _column("total", DEC, 12),
            _column("placed_at", TS),
            _column("internal_note", TEXT),
        )
    ),
    LINES: RowSchema(
        (
            _column("order_id", INT64),
            _column("line_no", INT32),
            _column("product_id", INT32),
            _column("quantity", INT32),
            _column("unit_price", DEC, 10),
        )
    ),
    PRODUCTS: RowSchema(
        (
            _column("id", INT32),
            _column("sku", TEXT),
            _column("name", TEXT),
            _column("description", TEXT),
            _column("price", DEC, 10),
            _column("in_stock", TypeKind.BOOLEAN),
            _column("attributes", TypeKind.JSON),
            _column("updated_at", TS),
        )
    ),
}

# Multipliers of the spreads: primes, the first one coprime with the range's size is taken.
_STEPS = (2_654_435_761, 2_246_822_519, 3_266_489_917, 668_265_263, 374_761_393)


@dataclass(frozen=True)
class Spread:
    """A bijection of range(size), `i -> (i * step + offset) % size`: consecutive ids land far
    apart."""

    size: int
    step: int
    offset: int = 0

    @classmethod
    def of(cls, size: int, salt: int = 0) -> Spread:
        """One of several spreads of range(size), by `salt`."""
        for step in _STEPS[salt:] + _STEPS[:salt]:
            if math.gcd(step, size) == 1:
                return cls(size, step, salt * 7919 % max(size, 1))
        return cls(size, 1, 0)  # every step divides size: only possible for tiny sizes

    def __call__(self, index: int) -> int:
        return (index * self.step + self.offset) % self.size


def fitting(fanouts: Sequence[int], roots: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The fan-outs that fit in `roots` orders, smallest first, each parent owning roots of its
    own (their sum at most `roots`), and those that do not."""
    kept: list[int] = []
    for k in sorted(set(fanouts)):
        if k > 0 and sum(kept) + k <= roots:
            kept.append(k)
    return tuple(kept), tuple(sorted(set(fanouts) - set(kept)))


@dataclass(frozen=True)
class Layout:
    """N orders of `lines` lines each. Customer i and product i (1 <= i <= len(fanouts)) reach
    exactly `fanouts[i-1]` orders (the product is in line 1 of each); every other customer owns
    `per_customer` orders (the last one fewer), the other lines spread over `products` more
    products."""

    roots: int
    lines: int
    per_customer: int
    products: int
    fanouts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name, value in (
            ("roots", self.roots),
            ("lines", self.lines),
            ("per_customer", self.per_customer),
            ("products", self.products),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if sum(self.fanouts) > self.roots or list(self.fanouts) != sorted(self.fanouts):
            raise ValueError(f"fan-outs {self.fanouts} must ascend and sum to <= {self.roots}")

    @cached_property
    def _ends(self) -> tuple[int, ...]:
        return tuple(accumulate(self.fanouts))

    @cached_property
    def _orders(self) -> Spread:  # order -> its customer's slot
        return Spread.of(self.roots, 0)

    @cached_property
    def _first_lines(self) -> Spread:  # order -> its first line's product slot
        return Spread.of(self.roots, 1)

    @cached_property
    def _other_lines(self) -> Spread:  # line -> its product
        return Spread.of(self.roots * self.lines, 2)

    @property
    def hot(self) -> int:
        """The parents reaching K roots: customers and products 1..hot."""
        return len(self.fanouts)

    def rows(self) -> dict[TableId, int]:
        regular = self.roots - sum(self.fanouts)
        return {
            CUSTOMERS: self.hot + -(-regular // self.per_customer),
            ORDERS: self.roots,
            LINES: self.roots * self.lines,
            PRODUCTS: self.hot + self.products,
        }

    def customer_of(self, order: int) -> int:
        slot = self._orders(order - 1)
        hot = bisect.bisect_right(self._ends, slot)
        if hot < self.hot:
            return hot + 1
        return self.hot + 1 + (slot - sum(self.fanouts)) // self.per_customer

    def product_of(self, order: int, line_no: int) -> int:
        if line_no == 1:
            hot = bisect.bisect_right(self._ends, self._first_lines(order - 1))
            if hot < self.hot:
                return hot + 1
        return (
            self.hot
            + 1
            + self._other_lines((order - 1) * self.lines + line_no - 1) % (self.products)
        )

    # -- the rows, as the decoder gives them ---------------------------------------------------

    def row(self, table: TableId, index: int) -> dict[str, Any]:
        """Row `index` (0-based, in key order) of `table`."""
        if table == LINES:
            return line_row(self, 1 + index // self.lines, 1 + index % self.lines)
        if table == ORDERS:
            return order_row(self, index + 1)
        return customer_row(index + 1) if table == CUSTOMERS else product_row(index + 1)


def customer_row(
    ident: int, full_name: str | None = None, email: str | None = None
) -> dict[str, Any]:
    at = EPOCH + timedelta(seconds=ident)
    return {
        "id": ident,
        "email": email or f"user{ident}@example.com",
        "full_name": full_name or f"User {ident}",
        "tier": TIERS[ident % len(TIERS)],
        "created_at": at,
        "updated_at": at,
    }


def order_row(layout: Layout, ident: int) -> dict[str, Any]:
    return {
        "id": ident,
        "customer_id": layout.customer_of(ident),
        "status": "new",
        "total": Decimal(ident % 50_000).scaleb(-2),
        "placed_at": EPOCH + timedelta(seconds=ident),
        "internal_note": "not for search",
    }


def line_row(layout: Layout, order: int, line_no: int) -> dict[str, Any]:
    return {
        "order_id": order,
        "line_no": line_no,
        "product_id": layout.product_of(order, line_no),
        "quantity": 1 + (order + line_no) % 9,
        "unit_price": Decimal(1 + (order * line_no) % 90_000).scaleb(-2),
    }


def product_row(ident: int, name: str | None = None) -> dict[str, Any]:
    text = f"Product {ident} description. "
    return {
        "id": ident,
        "sku": f"SKU-{ident}",
        "name": name or f"Product {ident}",
        "description": (text * (1 + DESCRIPTION_CHARS // len(text)))[:DESCRIPTION_CHARS],
        "price": Decimal(1 + ident % 90_000).scaleb(-2),
        "in_stock": True,
        "attributes": None,
        "updated_at": EPOCH,
    }


def batch_slices(rows: Mapping[TableId, int], limit: int) -> Iterator[dict[TableId, range]]:
    """The row ranges of each micro-batch of an initial build: every table's rows in its topic,
    read at most `limit` records a batch, shared across the topics in proportion to their
    backlog (`source.offsets.cap_total`, the job's own rule)."""
    latest = {(str(table), 0): count for table, count in rows.items()}
    start: dict[tuple[str, int], int] = {}
    while any(start.get(tp, 0) < end for tp, end in latest.items()):
        end = cap_total(start, latest, limit)
        yield {
            table: range(start.get((str(table), 0), 0), end[(str(table), 0)])
            for table in rows
            if end[(str(table), 0)] > start.get((str(table), 0), 0)
        }
        start = dict(end)


def renamed_customer(name: str) -> Check:
    """A document whose customer is named `name`."""
    return lambda doc: (doc.get("customer") or {}).get("full_name") == name


def renamed_product(ident: int, name: str) -> Check:
    """A document with a line of product `ident`, named `name`."""

    def check(doc: Mapping[str, Any]) -> bool:
        products = [line.get("product") or {} for line in doc.get("lines") or []]
        return any(p.get("id") == ident and p.get("name") == name for p in products)

    return check


# -- figures -----------------------------------------------------------------------------------


@dataclass
class Phase:
    """One measured piece of work: how many items (rows merged, documents rendered), its wall
    and CPU seconds, the RSS when it started and at its peak, the Python heap's peak."""

    items: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    rss_start: int = 0  # bytes
    rss_peak: int = 0
    heap_peak: int | None = None  # tracemalloc, from a traced repeat; None: not traced

    def add(self, items: int, wall: float, cpu: float) -> None:
        self.items += items
        self.wall += wall
        self.cpu += cpu

    def json(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "seconds": round(self.wall, 2),
            "cpu_seconds": round(self.cpu, 2),
            "per_second": round(self.items / self.wall, 1) if self.wall else None,
            "per_cpu_second": round(self.items / self.cpu, 1) if self.cpu else None,
            "rss_start_mib": mib(self.rss_start),
            "rss_peak_mib": mib(self.rss_peak),
            "heap_peak_mib": None if self.heap_peak is None else mib(self.heap_peak),
        }


def mib(size: int) -> float:
    return round(size / 2**20, 1)


def state_json(parts: Mapping[str, int], files: int, rows: int, roots: int) -> dict[str, Any]:
    """The state's size: its files on disk (`files` bytes), per row and per root, and its
    B-trees' (`parts`: SQLite's dbstat, name -> bytes)."""
    return {
        "bytes": files,
        "mib": mib(files),
        "bytes_per_row": round(files / rows, 1),
        "bytes_per_root": round(files / roots, 1),
        "parts_mib": {name: mib(size) for name, size in sorted(parts.items(), key=lambda p: -p[1])},
    }


def parse_sizes(text: str) -> list[int]:
    """'20000,1_000_000' -> [20000, 1000000] (an option's value: argparse names the option)."""
    wanted = f"positive counts separated by commas (1_000_000 or 1000000), got {text!r}"
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ArgumentTypeError(wanted) from None
    if not sizes or min(sizes) < 1:
        raise ArgumentTypeError(wanted)
    return sizes
