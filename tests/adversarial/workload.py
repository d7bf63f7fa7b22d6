"""A seeded random workload on the adversarial schema (tests/adversarial/schema.sql), pure psycopg.

Every operation is a function `(ctx) -> label | None` (None: nothing to act on) that runs its own
transaction(s); the mix covers what a change-data-capture pipeline most easily gets wrong:

- every column type, and TOAST-only updates of rows whose big columns hold >8 kB of poorly
  compressible data stored out of line (Debezium sends `__debezium_unavailable_value`);
- intervals with fractional seconds of every magnitude and sign, months and days of either sign;
- an array column per element type, each stored out of line, left unchanged by updates of other
  columns (and by primary-key moves), set to null and back;
- a table written by its own operations that `truncate_under_load` TRUNCATEs;
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
TABLES = (
    "adv.parent",
    "adv.child",
    "adv.deferred",
    "adv.arrays",
    "adv.truncated",
    "adv.tag",
    "adv.child_tag",
    "adv.probe",  # the freshness probe's row (probe.py), not the workload's
)
TAGS = 12  # tag ids 1..TAGS: few, so a tag's change reaches many documents
BIG_MD5_CHUNKS = 300  # 300 x 32 hex chars: ~9.6 kB per big column, out of line (> 8 kB)
SPECIAL_KEY_PARTS = ("a|b", "a\\|b", "x\\", "\\", "|", "||", "p\\\\q", "plain", "é|ü", "")

Conn = psycopg.Connection[Any]


def create_schema(pg_url: str) -> None:
    """schema.sql, plus a citext[] column when the server has the extension (contrib)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SCHEMA_SQL.read_text().encode())
        available = conn.execute(
            b"SELECT 1 FROM pg_available_extensions WHERE name = 'citext'"
        ).fetchone()
        if available:
            conn.execute(b"CREATE EXTENSION IF NOT EXISTS citext")
            conn.execute(b"ALTER TABLE adv.arrays ADD COLUMN IF NOT EXISTS a_citext citext[]")
            conn.execute(b"ALTER TABLE adv.arrays ALTER COLUMN a_citext SET STORAGE EXTERNAL")


@dataclass
class Context:
    """What the operations share: the connection, the generator and the key counters."""

    conn: Conn
    pg_url: str
    rng: random.Random
    next_parent: int = 1
    next_deferred: int = 1
    next_child_n: int = 1
    next_arrays: int = 1
    next_truncated: int = 1
    changes: int = 0  # committed row changes (cascades not counted)

    def parent_id(self) -> int:
        self.next_parent += 1
        return self.next_parent - 1

    def deferred_id(self) -> int:
        self.next_deferred += 1
        return self.next_deferred - 1

    def arrays_id(self) -> int:
        self.next_arrays += 1
        return self.next_arrays - 1

    def truncated_id(self) -> int:
        self.next_truncated += 1
        return self.next_truncated - 1

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


# Magnitudes of an interval's time part, in microseconds: one µs to ~3,000 hours (pgjdbc parses
# the hours as an int), each of either sign.
INTERVAL_MICROS_SCALES = (1, 999, 999_999, 60 * 10**6, 86_400 * 10**6, 10**13)


def _interval(rng: random.Random) -> str:
    """Months, days and microseconds, each of either sign and any magnitude: fractional seconds
    Debezium's string mode computes through a double (schema/interval.py rounds them back)."""
    micros = rng.randint(-1, 1) * rng.randint(0, rng.choice(INTERVAL_MICROS_SCALES))
    if rng.random() < 0.1:  # a whole-second value next to the fractional ones
        micros -= micros % 10**6
    return (
        f"{rng.randint(-100, 100)} years {rng.randint(-11, 11)} mons "
        f"{rng.randint(-40000, 40000)} days {micros} microseconds"
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


# ---- tags (documents only: parent -> children -> tags) ----------------------------------------


def upsert_tag(ctx: Context) -> str:
    """A new tag or a relabelled one: every document whose children carry it re-renders."""
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "INSERT INTO adv.tag (id, label) VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET label = EXCLUDED.label",
            (ctx.rng.randint(1, TAGS), _text(ctx.rng)[:40]),
        )
    return "upsert tag (fans out to documents)"


def delete_tag(ctx: Context) -> str | None:
    row = _pick(ctx.conn, "SELECT id FROM adv.tag ORDER BY id", ctx.rng)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.tag WHERE id = %s", (row[0],))
    return "delete tag (cascades its links)"


def link_child_tag(ctx: Context) -> str | None:
    child = _some_child(ctx)
    tag = _pick(ctx.conn, "SELECT id FROM adv.tag ORDER BY id", ctx.rng)
    if child is None or tag is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "INSERT INTO adv.child_tag (k, n, tag_id) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (*child, tag[0]),
        )
    return "link a child to a tag"


def unlink_child_tag(ctx: Context) -> str | None:
    row = _pick(ctx.conn, "SELECT k, n, tag_id FROM adv.child_tag ORDER BY k, n, tag_id", ctx.rng)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx, "DELETE FROM adv.child_tag WHERE k = %s AND n = %s AND tag_id = %s", tuple(row)
        )
    return "unlink a child from a tag"


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


# ---- arrays of every element type, TOASTed ------------------------------------------------

# Array type (format_type) -> (element from g and h, a random int32 of the salted g; elements for
# more than ARRAY_BYTES on disk). The values are exact in every sink's representation: reals are
# multiples of 1/64 (verify reads Postgres' shortest text of a float4), dates and timestamps after
# 1582 (Debezium shifts older array elements to the Julian calendar: docs/known-limits.md).
ARRAY_BYTES = 3000
ARRAY_ELEMENTS: dict[str, tuple[str, int]] = {
    "double precision[]": ("h::float8 / 7", 8),
    "real[]": ("(h %% 65536)::real / 64", 4),
    "smallint[]": ("(h %% 32768)::int2", 2),
    "integer[]": ("h", 4),
    "bigint[]": ("h::int8 * 2147483647", 8),
    "numeric[]": ("h::numeric / 7", 14),
    "boolean[]": ("h %% 2 = 0", 1),
    "date[]": ("date '2000-01-01' + h %% 20000", 4),
    "timestamp with time zone[]": (
        "timestamptz '2000-01-01 00:00:00Z' + h::int8 * 997 * interval '1 microsecond'",
        8,
    ),
    "uuid[]": ("md5(g::text || h)::uuid", 16),
    "text[]": ("CASE WHEN g %% 17 = 0 THEN 'a,b {c} \"q\" | \\ é ' || h ELSE md5(h::text) END", 33),
    "character varying[]": ("md5(h::text)", 33),
    "character(8)[]": ("left(md5(h::text), 8)", 9),
    "jsonb[]": (
        "jsonb_build_object('h', h, 's', md5(g::text), 'l', jsonb_build_array(g, null))",
        50,
    ),
    "citext[]": ("md5(h::text)::citext", 33),
}
RANDOM_INT = "('x' || substr(md5(g::text || %s), 1, 8))::bit(32)::int"


def array_sql(array_type: str) -> str:
    """A new value of an array column, computed by Postgres from a salt (one `%s`)."""
    element, size = ARRAY_ELEMENTS[array_type]
    return (
        f"(SELECT array_agg({element} ORDER BY g) FROM (SELECT g, {RANDOM_INT} AS h "
        f"FROM generate_series(1, {ARRAY_BYTES // size + 1}) g) s)"
    )


def array_columns(conn: Conn) -> list[tuple[str, str]]:
    """adv.arrays' array columns now (name, type), in column order: the drop/rename scenario
    changes them while the workload runs."""
    rows = conn.execute(
        b"SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        b"WHERE attrelid = 'adv.arrays'::regclass AND attnum > 0 AND NOT attisdropped "
        b"AND attname NOT IN ('id', 'n', 'note') ORDER BY attnum"
    ).fetchall()
    return [(str(name), str(type_)) for name, type_ in rows]


def _some_arrays(ctx: Context) -> int | None:
    row = _pick(ctx.conn, "SELECT id FROM adv.arrays ORDER BY id", ctx.rng)
    return None if row is None else int(row[0])


def _insert_arrays(ctx: Context, row_id: int) -> None:
    columns = array_columns(ctx.conn)
    names = ", ".join(["id", "n", "note", *(name for name, _ in columns)])
    values = ", ".join(["%s", "%s", "%s", *(array_sql(type_) for _, type_ in columns)])
    salt = str(ctx.rng.randrange(10**9))
    params = [row_id, ctx.rng.randrange(1000), _text(ctx.rng), *([salt] * len(columns))]
    ctx.changes += _run(ctx, f"INSERT INTO adv.arrays ({names}) VALUES ({values})", params)


def insert_arrays(ctx: Context) -> str:
    with ctx.conn.transaction():
        _insert_arrays(ctx, ctx.arrays_id())
    return "insert arrays (every element type TOASTed)"


def update_arrays_small(ctx: Context) -> str | None:
    """A TOAST-only update: every array stays out of line, unchanged."""
    row = _some_arrays(ctx)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "UPDATE adv.arrays SET n = n + 1, note = %s WHERE id = %s",
            (_text(ctx.rng), row),
        )
    return "update arrays small columns (TOAST unchanged)"


def update_arrays_one(ctx: Context) -> str | None:
    """One array replaced, or set to null (a null array is a placeholder to Debezium for some
    types: only Postgres can tell the two apart once it is unchanged)."""
    row = _some_arrays(ctx)
    if row is None:
        return None
    name, type_ = ctx.rng.choice(array_columns(ctx.conn))
    null = ctx.rng.random() < 0.3
    value = "NULL" if null else array_sql(type_)
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            f'UPDATE adv.arrays SET "{name}" = {value} WHERE id = %s',
            (row,) if null else (str(ctx.rng.randrange(10**9)), row),
        )
    return "update arrays: one array replaced or nulled"


def move_arrays_key(ctx: Context) -> str | None:
    """A primary-key move: no sink holds the new key, so its unchanged arrays come from
    Postgres."""
    row = _some_arrays(ctx)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx, "UPDATE adv.arrays SET id = %s WHERE id = %s", (ctx.arrays_id(), row)
        )
    return "move arrays primary key (TOAST unchanged)"


def delete_arrays(ctx: Context) -> str | None:
    row = _some_arrays(ctx)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.arrays WHERE id = %s", (row,))
    return "delete arrays"


# ---- the truncated table --------------------------------------------------------------------


def insert_truncated(ctx: Context) -> str:
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx,
            "INSERT INTO adv.truncated (id, val) VALUES (%s, %s)",
            (ctx.truncated_id(), _text(ctx.rng)),
        )
    return "insert truncated"


def update_truncated(ctx: Context) -> str | None:
    row = _pick(ctx.conn, "SELECT id FROM adv.truncated ORDER BY id", ctx.rng)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(
            ctx, "UPDATE adv.truncated SET val = %s WHERE id = %s", (_text(ctx.rng), row[0])
        )
    return "update truncated"


def delete_truncated(ctx: Context) -> str | None:
    row = _pick(ctx.conn, "SELECT id FROM adv.truncated ORDER BY id", ctx.rng)
    if row is None:
        return None
    with ctx.conn.transaction():
        ctx.changes += _run(ctx, "DELETE FROM adv.truncated WHERE id = %s", (row[0],))
    return "delete truncated"


def truncate_and_reinsert(pg_url: str, round_: int) -> int:
    """TRUNCATE adv.truncated in a transaction of its own, then three quarters of its keys
    written again, half in the next transaction and a quarter in a later one (the rest stays
    gone: a sink that missed the truncate keeps them). Its own connection: the workload may run
    in another thread meanwhile (its writers of the table wait for the lock). Returns the row
    changes committed (the truncate counts one)."""
    changes = 1
    with psycopg.connect(pg_url, autocommit=True) as conn:
        keys = [int(r[0]) for r in conn.execute(b"SELECT id FROM adv.truncated ORDER BY id")]
        with conn.transaction():
            conn.execute(b"TRUNCATE adv.truncated")
        for part in (keys[::2], keys[1::4]):
            with conn.transaction():
                for key in part:
                    cursor = conn.execute(
                        b"INSERT INTO adv.truncated (id, val, round) "
                        b"VALUES (%s, md5(%s::text || 'again'), %s) "
                        b"ON CONFLICT (id) DO UPDATE "
                        b"SET val = EXCLUDED.val, round = EXCLUDED.round",
                        (key, key * 1000 + round_, round_),
                    )
                    changes += max(cursor.rowcount, 0)
    return changes


DROPPED_COLUMN = "spare_drop"
RENAMED_COLUMN = ("spare_name", "spare_renamed")


def drop_and_rename_after_toast_updates(pg_url: str) -> int:
    """For the job stopped meanwhile: TOAST-only updates and a key move of adv.arrays rows (their
    changes carry the old columns, unavailable), then a TOASTed column dropped and another
    renamed, then a TOAST-only update of every row (the new schema; it also carries the renamed
    column to the sinks, docs/schema-changes.md). The restarted job meets both schemas in one
    batch and fills what the sinks lack from Postgres, whose table has changed. Returns the row
    changes committed."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        changes = 0
        with conn.transaction():
            changes += conn.execute(b"UPDATE adv.arrays SET n = n + 1 WHERE id % 2 = 0").rowcount
        with conn.transaction():
            changes += conn.execute(
                b"UPDATE adv.arrays SET id = id + 1000000 "
                b"WHERE id = (SELECT min(id) FROM adv.arrays)"
            ).rowcount
        with conn.transaction():
            conn.execute(f"ALTER TABLE adv.arrays DROP COLUMN {DROPPED_COLUMN}".encode())
            conn.execute(
                "ALTER TABLE adv.arrays RENAME COLUMN {} TO {}".format(*RENAMED_COLUMN).encode()
            )
        with conn.transaction():
            changes += conn.execute(b"UPDATE adv.arrays SET note = 'after the drop'").rowcount
    return changes


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
    (insert_arrays, 1),
    (update_arrays_small, 3),
    (update_arrays_one, 1),
    (move_arrays_key, 1),
    (delete_arrays, 1),
    (insert_truncated, 3),
    (update_truncated, 2),
    (delete_truncated, 1),
    (upsert_tag, 2),
    (delete_tag, 1),
    (link_child_tag, 4),
    (unlink_child_tag, 2),
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
            ctx.next_arrays = _next(self._conn, "SELECT max(id) FROM adv.arrays")
            ctx.next_truncated = _next(self._conn, "SELECT max(id) FROM adv.truncated")
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
            insert_arrays(ctx)
            insert_truncated(ctx)
        self.done["seed rows"] += 6 * parents

    def large_transaction(self, rows: int) -> int:
        changed = large_transaction(self.context(), rows)
        self.done[f"large transaction ({rows} inserts, updates, deletes)"] += 1
        return changed

    def truncate_and_reinsert(self, round_: int = 1) -> int:
        """Thread-safe next to `run` (a connection of its own); returns the changes committed."""
        changes = truncate_and_reinsert(self.pg_url, round_)
        self.done["TRUNCATE adv.truncated, keys written again"] += 1
        return changes

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
