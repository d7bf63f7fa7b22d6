"""A seeded random workload on the adversarial schema (tests/adversarial/schema.sql), pure psycopg.

Every operation is a function `(ctx) -> label | None` (None: nothing to act on) that runs its own
transaction(s); the mix covers what a change-data-capture pipeline most easily gets wrong:

- every column type, and TOAST-only updates of rows whose big columns hold >8 kB of poorly
  compressible data stored out of line (Debezium sends `__debezium_unavailable_value`);
- primary-key updates, single (cascading into the child's foreign key) and composite;
- delete + re-insert of the same key in one transaction and in two;
- SAVEPOINT / ROLLBACK TO inside a transaction, and whole transactions rolled back;
- composite key values holding `|` and `\\` (the document-id escaping);
- a table whose primary key is DEFERRABLE INITIALLY DEFERRED;
- two interleaved connections whose first-write order differs from their commit order;
- one large transaction (`Workload.large_transaction(rows)`).

Deterministic for a seed: rows are chosen in key order with `random.Random(seed)` and new keys
come from counters, so the same seed on the same starting state runs the same statements.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

SCHEMA_SQL = Path(__file__).with_name("schema.sql")
MAPPING = Path(__file__).with_name("mapping.yaml")
CONNECTOR = Path(__file__).with_name("connector.json")
TABLES = ("adv.parent", "adv.child", "adv.deferred")
BIG_MD5_CHUNKS = 300  # 300 x 32 hex chars: ~9.6 kB per big column, out of line (> 8 kB)
SPECIAL_KEY_PARTS = ("a|b", "a\\|b", "x\\", "\\", "|", "||", "p\\\\q", "plain", "é|ü", "")

Conn = psycopg.Connection[Any]


def create_schema(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text().encode())


@dataclass
class Context:
    """What the operations share: the connection, the generator and the key counters."""

    conn: Conn
    pg_url: str
    rng: random.Random
    next_parent: int = 1
    next_deferred: int = 1
    next_child_n: int = 1
    changes: int = 0  # committed row changes (cascades not counted)

    def parent_id(self) -> int:
        self.next_parent += 1
        return self.next_parent - 1

    def deferred_id(self) -> int:
        self.next_deferred += 1
        return self.next_deferred - 1

    def child_n(self) -> int:
        self.next_child_n += 1
        return self.next_child_n - 1

    def child_k(self) -> str:
        part = self.rng.choice(SPECIAL_KEY_PARTS)
        return f"{part}{self.rng.randrange(50)}" if self.rng.random() < 0.7 else part


Operation = Callable[[Context], str | None]


def _pick(conn: Conn, sql: str, rng: random.Random) -> Any:
    """One row of `sql` (which must order its rows, for determinism), or None."""
    rows = conn.execute(sql.encode()).fetchall()
    return rng.choice(rows) if rows else None


def _run(ctx: Context, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> int:
    cursor = ctx.conn.execute(sql.encode(), params)
    return max(cursor.rowcount, 0)


# ---- values ---------------------------------------------------------------------------------


def _text(rng: random.Random) -> str:
    pieces = [
        "plain",
        "quote ' \" ",
        "pipe | back \\ ",
        "ünïcødé",
        "emoji 🚀",
        "tab\tnl\n",
        "{[,]}",
    ]
    return " ".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))


def _interval(rng: random.Random) -> str:
    """Whole seconds: Debezium's string mode can lose 1 µs of fractions (docs/types.md)."""
    return (
        f"{rng.randint(0, 5)} years {rng.randint(0, 11)} mons {rng.randint(-40, 40)} days "
        f"{rng.randint(0, 23)}:{rng.randint(0, 59)}:{rng.randint(0, 59)}"
    )


def small_columns(rng: random.Random) -> dict[str, Any]:
    """The parent's small columns, random over their types (with NULLs and extremes)."""
    values: dict[str, Any] = {
        "c_int2": rng.choice([-32768, 32767, rng.randint(-32768, 32767)]),
        "c_int4": rng.choice([-(2**31), 2**31 - 1, rng.randint(-(2**31), 2**31 - 1)]),
        "c_int8": rng.choice([-(2**63), 2**63 - 1, rng.randint(-(2**63), 2**63 - 1)]),
        "c_num": Decimal(rng.randint(-(10**14) + 1, 10**14 - 1)).scaleb(-4),
        "c_numv": Decimal(f"{rng.randint(-(10**20), 10**20)}.{rng.randint(0, 10**9)}"),
        "c_float8": rng.uniform(-1e9, 1e9),
        "c_bool": rng.random() < 0.5,
        "c_text": _text(rng),
        "c_varchar": _text(rng)[:64],
        "c_uuid": uuid.UUID(int=rng.getrandbits(128)),
        "c_jsonb": Jsonb({"n": rng.randrange(1000), "s": _text(rng), "l": [1, None, "x"]}),
        "c_bytea": rng.randbytes(rng.randint(0, 64)),
        "c_date": date(1970, 1, 1) + timedelta(days=rng.randint(0, 40000)),
        "c_ts": datetime(2000, 1, 1) + timedelta(microseconds=rng.randrange(10**15)),
        "c_tstz": datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(10**15)),
        "c_interval": _interval(rng),
        "c_tags": [_text(rng) for _ in range(rng.randint(0, 3))],
        "c_ints": [rng.randint(-(2**31), 2**31 - 1) for _ in range(rng.randint(0, 5))],
    }
    for name in rng.sample(sorted(values), k=rng.randint(0, 3)):
        values[name] = None
    return values


def _placeholder(name: str) -> str:
    return "%s::interval" if name == "c_interval" else "%s"


def _chain(expression: str, chunks: int) -> str:
    """`expression` over `chunks` md5 values of the salted series (one `%s`: the salt)."""
    return f"(SELECT {expression} FROM generate_series(1, {chunks}) g)"


# Big values computed by Postgres from a salt: md5 chains compress poorly, so they stay > 8 kB.
MD5 = "md5(g::text || %s)"
BIG_SQL = {
    "big_text": _chain(f"string_agg({MD5}, '')", BIG_MD5_CHUNKS),
    "big_bytes": _chain(f"decode(string_agg({MD5}, ''), 'hex')", 2 * BIG_MD5_CHUNKS),
    "big_json": _chain(f"jsonb_build_object('chunks', jsonb_agg({MD5}))", BIG_MD5_CHUNKS),
    "big_ints": _chain(
        f"array_agg(('x' || substr({MD5}, 1, 8))::bit(32)::int)", 8 * BIG_MD5_CHUNKS
    ),
}


# ---- parent ---------------------------------------------------------------------------------


def _insert_parent(ctx: Context, parent_id: int) -> None:
    small = small_columns(ctx.rng)
    names = ["id", *small, *BIG_SQL]
    values = ["%s", *(_placeholder(n) for n in small), *BIG_SQL.values()]
    salt = str(ctx.rng.randrange(10**9))
    params = [parent_id, *small.values(), *([salt] * len(BIG_SQL))]
    ctx.changes += _run(
        ctx,
        f"INSERT INTO adv.parent ({', '.join(names)}) VALUES ({', '.join(values)})",
        params,
    )


def _some_parent(ctx: Context) -> int | None:
    row = _pick(ctx.conn, "SELECT id FROM adv.parent ORDER BY id", ctx.rng)
    return None if row is None else int(row[0])


def insert_parent(ctx: Context) -> str:
    with ctx.conn.transaction():
        _insert_parent(ctx, ctx.parent_id())
    return "insert parent (big TOASTed columns)"


def update_parent_small(ctx: Context) -> str | None:
    """A TOAST-only update: the big columns stay out of line, unchanged."""
    parent = _some_parent(ctx)
    if parent is None:
        return None
    small = small_columns(ctx.rng)
    chosen = ctx.rng.sample(sorted(small), k=ctx.rng.randint(1, 4))
    assignments = ", ".join(f"{n} = {_placeholder(n)}" for n in chosen)
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            f"UPDATE adv.parent SET {assignments} WHERE id = %s",
            [*(small[n] for n in chosen), parent],
        )
    return "update parent small columns (TOAST unchanged)"


def update_parent_big(ctx: Context) -> str | None:
    parent = _some_parent(ctx)
    if parent is None:
        return None
    column = ctx.rng.choice(sorted(BIG_SQL))
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            f"UPDATE adv.parent SET {column} = {BIG_SQL[column]} WHERE id = %s",
            (str(ctx.rng.randrange(10**9)), parent),
        )
    return "update parent big column"


def delete_parent(ctx: Context) -> str | None:
    parent = _some_parent(ctx)
    if parent is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.parent WHERE id = %s", (parent,))
    return "delete parent (cascades to children)"


def move_parent_key(ctx: Context) -> str | None:
    """A primary-key update with unchanged TOASTed columns; cascades into child.parent_id."""
    parent = _some_parent(ctx)
    if parent is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx, "UPDATE adv.parent SET id = %s WHERE id = %s", (ctx.parent_id(), parent)
        )
    return "move parent primary key (TOAST unchanged, cascades)"


def reinsert_parent_one_transaction(ctx: Context) -> str | None:
    parent = _some_parent(ctx)
    if parent is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.parent WHERE id = %s", (parent,))
        _insert_parent(ctx, parent)
    return "delete + re-insert parent (one transaction)"


# ---- child ----------------------------------------------------------------------------------


def _some_child(ctx: Context) -> tuple[str, int] | None:
    row = _pick(ctx.conn, "SELECT k, n FROM adv.child ORDER BY k, n", ctx.rng)
    return None if row is None else (str(row[0]), int(row[1]))


def _insert_child(ctx: Context, k: str, n: int, parent: int) -> None:
    ctx.changes += _run(
        ctx,
        "INSERT INTO adv.child (k, n, parent_id, qty, note) VALUES (%s, %s, %s, %s, %s)",
        (k, n, parent, ctx.rng.randint(1, 100), _text(ctx.rng)),
    )


def insert_child(ctx: Context) -> str | None:
    parent = _some_parent(ctx)
    if parent is None:
        return None
    with ctx.conn.transaction():
        _insert_child(ctx, ctx.child_k(), ctx.child_n(), parent)
    return "insert child (composite key with | and \\)"


def update_child(ctx: Context) -> str | None:
    child = _some_child(ctx)
    if child is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "UPDATE adv.child SET qty = qty + 1, note = %s WHERE k = %s AND n = %s",
            (_text(ctx.rng), *child),
        )
    return "update child"


def delete_child(ctx: Context) -> str | None:
    child = _some_child(ctx)
    if child is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.child WHERE k = %s AND n = %s", child)
    return "delete child"


def move_child_key(ctx: Context) -> str | None:
    """A composite primary-key update: one part or both."""
    child = _some_child(ctx)
    if child is None:
        return None
    k = ctx.child_k() if ctx.rng.random() < 0.5 else child[0]
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "UPDATE adv.child SET k = %s, n = %s WHERE k = %s AND n = %s",
            (k, ctx.child_n(), *child),
        )
    return "move child composite key"


def reinsert_child_two_transactions(ctx: Context) -> str | None:
    child = _some_child(ctx)
    parent = _some_parent(ctx)
    if child is None or parent is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.child WHERE k = %s AND n = %s", child)
    with ctx.conn.transaction():
        _insert_child(ctx, *child, parent)
    return "delete + re-insert child (two transactions)"


# ---- deferred primary key -------------------------------------------------------------------


def insert_deferred(ctx: Context) -> str:
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "INSERT INTO adv.deferred (id, val) VALUES (%s, %s)",
            (ctx.deferred_id(), _text(ctx.rng)),
        )
    return "insert deferred"


def update_deferred(ctx: Context) -> str | None:
    row = _pick(ctx.conn, "SELECT id FROM adv.deferred ORDER BY id", ctx.rng)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx, "UPDATE adv.deferred SET val = %s WHERE id = %s", (_text(ctx.rng), row[0])
        )
    return "update deferred"


def delete_deferred(ctx: Context) -> str | None:
    row = _pick(ctx.conn, "SELECT id FROM adv.deferred ORDER BY id", ctx.rng)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.deferred WHERE id = %s", (row[0],))
    return "delete deferred"


def duplicate_then_move_deferred(ctx: Context) -> str | None:
    """Insert a duplicate key (allowed until commit), then move the old row to a new key.

    The rows' changes come in an order that never has two live rows per key at commit:
    create(k) duplicate, then the old row's move emits delete(k) + create(new). Convergence
    needs the sinks to end with k present."""
    row = _pick(ctx.conn, "SELECT id FROM adv.deferred ORDER BY id", ctx.rng)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx, "INSERT INTO adv.deferred (id, val) VALUES (%s, 'duplicate')", (row[0],)
        )
        ctx.changes += _run(
            ctx,
            "UPDATE adv.deferred SET id = %s WHERE id = %s AND val <> 'duplicate'",
            (ctx.deferred_id(), row[0]),
        )
        ctx.changes += _run(
            ctx, "UPDATE adv.deferred SET val = %s WHERE id = %s", (_text(ctx.rng), row[0])
        )
    return "deferred key: duplicate then move the old row (one transaction)"


def swap_deferred_keys(ctx: Context) -> str | None:
    """Two rows exchange primary keys in one statement (legal only with a deferred key)."""
    rows = ctx.conn.execute(b"SELECT id FROM adv.deferred ORDER BY id").fetchall()
    if len(rows) < 2:
        return None
    a, b = (int(r[0]) for r in ctx.rng.sample(rows, 2))
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "UPDATE adv.deferred SET id = CASE id WHEN %s THEN %s ELSE %s END WHERE id IN (%s, %s)",
            (a, b, a, a, b),
        )
    return "swap deferred primary keys (one statement)"


# ---- transactions ---------------------------------------------------------------------------


def savepoint_transaction(ctx: Context) -> str | None:
    """Writes, SAVEPOINT, writes rolled back to it, more writes, commit."""
    parent = _some_parent(ctx)
    child = _some_child(ctx)
    if parent is None or child is None:
        return None
    with ctx.conn.transaction():
        kept = _run(
            ctx, "UPDATE adv.parent SET c_int4 = %s WHERE id = %s", (ctx.rng.randrange(99), parent)
        )
        ctx.conn.execute(b"SAVEPOINT adv_sp")
        _run(ctx, "DELETE FROM adv.child WHERE k = %s AND n = %s", child)
        _run(ctx, "UPDATE adv.parent SET c_text = 'rolled back' WHERE id = %s", (parent,))
        _insert_child(ctx, "rolled|back\\", ctx.child_n(), parent)
        ctx.conn.execute(b"ROLLBACK TO SAVEPOINT adv_sp")
        kept += _run(
            ctx,
            "UPDATE adv.child SET qty = qty + 7 WHERE k = %s AND n = %s",
            child,
        )
        kept += _run(
            ctx,
            "UPDATE adv.parent SET c_bool = NOT coalesce(c_bool, false) WHERE id = %s",
            (parent,),
        )
    ctx.changes -= 1  # the rolled-back insert was counted by _insert_child
    ctx.changes += kept
    return "savepoint + rollback to savepoint + commit"


class _Abort(Exception):
    pass


def rolled_back_transaction(ctx: Context) -> str | None:
    parent = _some_parent(ctx)
    if parent is None:
        return None
    before = ctx.changes
    with ctx.conn.transaction(force_rollback=True):
        _run(ctx, "UPDATE adv.parent SET c_text = 'never committed' WHERE id = %s", (parent,))
        _run(ctx, "DELETE FROM adv.parent WHERE id = %s", (parent,))
        _insert_parent(ctx, ctx.parent_id())
        _run(ctx, "INSERT INTO adv.deferred (id, val) VALUES (%s, 'never')", (ctx.deferred_id(),))
    ctx.changes = before
    return "transaction rolled back"


def interleaved_transactions(ctx: Context) -> str | None:
    """T1 writes the parent first; T2 writes a child and commits; T1 writes that same child
    (and a deferred row) and commits: first-write order T1, T2; commit order T2, T1."""
    parent = _some_parent(ctx)
    child = _some_child(ctx)
    if parent is None or child is None:
        return None
    with psycopg.connect(ctx.pg_url) as t1, psycopg.connect(ctx.pg_url) as t2:
        t1.execute(b"UPDATE adv.parent SET c_varchar = 't1 first' WHERE id = %s", (parent,))
        t2.execute(
            b"UPDATE adv.child SET note = 't2 commits first', qty = qty + 1 "
            b"WHERE k = %s AND n = %s",
            child,
        )
        t2.execute(b"INSERT INTO adv.deferred (id, val) VALUES (%s, 't2')", (ctx.deferred_id(),))
        t2.commit()
        t1.execute(
            b"UPDATE adv.child SET note = 't1 commits last', qty = qty + 100 "
            b"WHERE k = %s AND n = %s",
            child,
        )
        t1.execute(b"UPDATE adv.parent SET c_int2 = 1 WHERE id = %s", (parent,))
        t1.commit()
    ctx.changes += 5
    return "interleaved transactions (commit order differs from first writes)"


def large_transaction(ctx: Context, rows: int) -> int:
    """One transaction: `rows` child inserts under one new parent, then updates of every third
    and deletes of every fifth of them. Returns the row changes committed."""
    with ctx.conn.transaction():
        parent = ctx.parent_id()
        _insert_parent(ctx, parent)
        first = ctx.next_child_n
        ctx.next_child_n += rows
        salt = ctx.rng.randrange(10**6)
        changed = _run(
            ctx,
            "INSERT INTO adv.child (k, n, parent_id, qty, note) "
            "SELECT 'bulk|' || %s || '\\' || (g %% 7), g, %s, g %% 100 + 1, md5(g::text) "
            "FROM generate_series(%s::int, %s::int) g",
            (salt, parent, first, first + rows - 1),
        )
        changed += _run(
            ctx,
            "UPDATE adv.child SET qty = qty + 1 WHERE parent_id = %s AND n %% 3 = 0",
            (parent,),
        )
        changed += _run(ctx, "DELETE FROM adv.child WHERE parent_id = %s AND n %% 5 = 0", (parent,))
    ctx.changes += changed
    return changed


OPERATIONS: list[tuple[Operation, int]] = [
    (insert_parent, 4),
    (update_parent_small, 8),
    (update_parent_big, 1),
    (delete_parent, 1),
    (move_parent_key, 2),
    (reinsert_parent_one_transaction, 1),
    (insert_child, 8),
    (update_child, 6),
    (delete_child, 2),
    (move_child_key, 3),
    (reinsert_child_two_transactions, 2),
    (insert_deferred, 3),
    (update_deferred, 2),
    (delete_deferred, 1),
    (duplicate_then_move_deferred, 1),
    (savepoint_transaction, 2),
    (rolled_back_transaction, 1),
    (interleaved_transactions, 2),
]


@dataclass
class Workload:
    """A seeded generator over one database; `run` may be called repeatedly (faults between)."""

    pg_url: str
    seed: int
    operations: list[tuple[Operation, int]] = field(default_factory=lambda: list(OPERATIONS))
    done: Counter[str] = field(default_factory=Counter)
    _conn: Conn | None = None
    _ctx: Context | None = None

    def context(self) -> Context:
        if self._ctx is None:
            self._conn = psycopg.connect(self.pg_url, autocommit=True)
            ctx = Context(self._conn, self.pg_url, random.Random(self.seed))
            ctx.next_parent = _next(self._conn, "SELECT max(id) FROM adv.parent")
            ctx.next_deferred = _next(self._conn, "SELECT max(id) FROM adv.deferred")
            ctx.next_child_n = _next(self._conn, "SELECT max(n) FROM adv.child")
            self._ctx = ctx
        return self._ctx

    @property
    def changes(self) -> int:
        return self._ctx.changes if self._ctx else 0

    def run(self, count: int) -> Counter[str]:
        """`count` operations drawn by weight; returns what ran in this call."""
        ctx = self.context()
        functions = [op for op, _ in self.operations]
        weights = [w for _, w in self.operations]
        ran: Counter[str] = Counter()
        for _ in range(count):
            label = ctx.rng.choices(functions, weights)[0](ctx)
            if label:
                ran[label] += 1
        self.done.update(ran)
        return ran

    def seed_rows(self, parents: int = 5) -> None:
        """Rows in every table (so every topic exists once the snapshot is published)."""
        ctx = self.context()
        for _ in range(parents):
            insert_parent(ctx)
            insert_child(ctx)
            insert_child(ctx)
            insert_deferred(ctx)
        self.done["seed rows"] += 4 * parents

    def large_transaction(self, rows: int) -> int:
        changed = large_transaction(self.context(), rows)
        self.done[f"large transaction ({rows} inserts, updates, deletes)"] += 1
        return changed

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._ctx = None


def paced(workload: Workload, operations: int, chunk: int = 10, pause: float = 0.2) -> None:
    """The workload in small chunks, so the job sees a stream of batches, not one."""
    for _ in range(operations // chunk):
        workload.run(chunk)
        time.sleep(pause)


def paced_in_background(workload: Workload, operations: int) -> threading.Thread:
    thread = threading.Thread(target=paced, args=(workload, operations), daemon=True)
    thread.start()
    return thread


def _next(conn: Conn, sql: str) -> int:
    row = conn.execute(sql.encode()).fetchone()
    return (int(row[0]) if row and row[0] is not None else 0) + 1
