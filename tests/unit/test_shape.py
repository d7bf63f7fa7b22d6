"""Per-sink shapes (`cdc_sync.shape`): filters, computed / masked / hashed / dropped fields and
soft deletes, from a mapping file to each sink's changes and actions (no services)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import UNVERSIONED, Change, Coordinates, Op, TableId
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.mapping import TableRoute, load_mapping
from cdc_sync.schema.arrow import arrow_schema
from cdc_sync.shape.checks import missing_secrets, shape_problems
from cdc_sync.shape.engine import ExpressionError, result_types
from cdc_sync.shape.rows import marked_deleted, sink_rows
from cdc_sync.sinks.delta.actions import to_actions as delta_actions
from cdc_sync.sinks.delta.target import target_schema
from cdc_sync.sinks.redis.actions import to_actions as cache_actions
from cdc_sync.sinks.search.actions import to_actions as search_actions
from cdc_sync.verify.compare import compare_sink

pytestmark = pytest.mark.unit

TABLE = TableId("shop", "customers")
SCHEMA = RowSchema(
    (
        Column("id", ColumnType(TypeKind.INT64, optional=False)),
        Column("email", ColumnType(TypeKind.STRING)),
        Column("first", ColumnType(TypeKind.STRING)),
        Column("last", ColumnType(TypeKind.STRING)),
        Column("price", ColumnType(TypeKind.DECIMAL, precision=10, scale=2)),
        Column("active", ColumnType(TypeKind.BOOLEAN)),
        Column("bio", ColumnType(TypeKind.STRING)),
    )
)
SECRET_ENV = "CDC_SYNC_TEST_SHAPE_SECRET"

MAPPING = f"""
version: 1
source: {{topic_prefix: cdc}}
tables:
  shop.customers:
    rename: {{bio: about}}
    computed:
      full_name: "first || ' ' || last"
    search:
      filter: "active"
      computed:
        cents: "CAST(price * 100 AS BIGINT)"
      hash: {{fields: [email], secret_env: {SECRET_ENV}}}
      drop: [first, last]
    cache:
      mask: {{email: "***"}}
      columns: [id, email, full_name]
      on_delete: soft
    delta:
      on_delete: soft
"""


def load(tmp_path: Path, text: str = MAPPING) -> TableRoute:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return load_mapping(path).tables[TABLE]


def upsert(key: int, version: int, **row: object) -> Change:
    full = {"id": key, "email": f"u{key}@x.io", "first": "Ada", "last": "L", "price": None}
    full |= {"active": True, "bio": "b"} | row
    return Change(TABLE, (("id", key),), Op.UPDATE, version, full, _at(version), schema=SCHEMA)


def delete(key: int, version: int) -> Change:
    return Change(TABLE, (("id", key),), Op.DELETE, version, None, _at(version), 1_700_000_000_000)


def _at(offset: int) -> Coordinates:
    return Coordinates("cdc.shop.customers", 0, offset)


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "s3cret")


def test_each_sink_gets_its_own_fields_typed_by_the_expressions(tmp_path: Path) -> None:
    route = load(tmp_path)
    search = route.sink_schema("search", SCHEMA)
    assert search.names == ("id", "email", "price", "active", "about", "full_name", "cents")
    assert search.column("cents").type.kind is TypeKind.INT64
    assert search.column("full_name").type.kind is TypeKind.STRING
    cache = route.sink_schema("cache", SCHEMA)
    assert cache.names == ("id", "email", "full_name", "_deleted", "_deleted_at")
    assert cache.column("_deleted_at").type.kind is TypeKind.TIMESTAMP_TZ
    delta = route.sink_schema("delta", SCHEMA)
    assert delta.names[-2:] == ("_cdc_is_deleted", "_cdc_deleted_at")
    assert "first" in delta.names and "email" in delta.names  # the warehouse keeps them
    assert {"_cdc_is_deleted", "_cdc_deleted_at"} <= set(target_schema(arrow_schema(delta)).names)


def test_computed_masked_hashed_and_dropped_fields_per_sink(tmp_path: Path) -> None:
    route = load(tmp_path)
    per_sink = route.sink_changes(SCHEMA, [upsert(1, 10, price=Decimal("12.34"))])
    (search,) = per_sink["search"]
    assert search.row is not None
    expected_hash = hmac.new(b"s3cret", b"u1@x.io", hashlib.sha256).hexdigest()
    assert search.row["email"] == expected_hash
    assert search.row["cents"] == 1234 and search.row["full_name"] == "Ada L"
    assert "first" not in search.row and search.row["about"] == "b"
    (cache,) = per_sink["cache"]
    assert cache.row == {
        "id": 1,
        "email": "***",
        "full_name": "Ada L",
        "_deleted": False,
        "_deleted_at": None,
    }
    (delta,) = per_sink["delta"]
    assert delta.row is not None and delta.row["email"] == "u1@x.io"
    assert delta.row["_cdc_is_deleted"] is False
    document = search_actions(route, per_sink["search"])
    assert document is not None and document.actions[0].document is not None
    assert document.actions[0].document["cents"] == 1234


def test_a_row_leaving_the_filter_is_deleted_at_its_own_version(tmp_path: Path) -> None:
    route = load(tmp_path)
    changes = [upsert(1, 10, active=False), upsert(2, 11, active=None), upsert(3, 12)]
    search = route.sink_changes(SCHEMA, changes)["search"]
    assert [(c.op, c.version, c.row is None) for c in search] == [
        (Op.DELETE, 10, True),
        (Op.DELETE, 11, True),  # NULL does not match
        (Op.UPDATE, 12, False),
    ]
    actions = search_actions(route, search)
    assert actions is not None
    assert [(a.op, a.version) for a in actions.actions] == [
        ("delete", 10),
        ("delete", 11),
        ("index", 12),
    ]
    # The unfiltered sinks keep both rows.
    assert all(c.row is not None for c in route.sink_changes(SCHEMA, changes)["delta"])


def test_a_computed_field_over_an_unavailable_column_keeps_the_stored_value(
    tmp_path: Path,
) -> None:
    route = load(tmp_path)
    toasted = upsert(1, 10)
    toasted = Change(
        TABLE,
        toasted.key,
        Op.UPDATE,
        10,
        {k: v for k, v in (toasted.row or {}).items() if k != "bio"},
        toasted.coordinates,
        unavailable_columns=frozenset({"bio"}),
        schema=SCHEMA,
    )
    (search,) = route.sink_changes(SCHEMA, [toasted])["search"]
    assert {"about", "full_name", "cents"} <= search.unavailable_columns


def test_soft_delete_writes_the_markers_at_the_delete_version_and_keeps_other_fields(
    tmp_path: Path,
) -> None:
    route = load(tmp_path)
    per_sink = route.sink_changes(SCHEMA, [delete(1, 20)])
    (search,) = per_sink["search"]
    assert search.is_delete  # search deletes (the default)
    (cache,) = per_sink["cache"]
    assert cache.op is Op.UPDATE and cache.version == 20 and cache.row is not None
    assert cache.marks_deleted  # written over the row the sink holds, or the delete
    assert cache.row["_deleted"] is True and cache.row["_deleted_at"].year == 2023
    assert cache.unavailable_columns == {"email", "full_name"}
    (action,) = cache_actions(route, per_sink["cache"])
    assert action.op == "mark" and set(action.unavailable) == {"email", "full_name"}
    delta = delta_actions(route, per_sink["delta"])
    # A write, never an insert; remembered as a delete (it fences when no row is held).
    assert delta is not None and delta.deleted_ids == [("1", 20)]
    row = delta.source.to_pylist()[0]
    assert row["_cdc_is_deleted"] is True and row["_cdc_deleted"] is False
    assert row["_cdc_mark"] is True and row["_cdc_version"] == 20
    assert row["_cdc_keep__email"] is True and row["_cdc_keep__first"] is True
    written = search_actions(route, route.sink_changes(SCHEMA, [upsert(1, 10)])["search"])
    assert written is not None and not written.actions[0].mark


def test_a_soft_delete_of_a_row_the_batch_held_is_shaped_from_that_row(tmp_path: Path) -> None:
    """The fold keeps the row a delete removes when the batch held it whole
    (`Change.deleted_row`): it decides the filter and is what the mark carries."""
    route = load(
        tmp_path,
        MAPPING.replace(
            "    delta:\n      on_delete: soft", "    delta:\n      filter: active"
        ).replace('      filter: "active"\n', '      filter: "active"\n      on_delete: soft\n'),
    )
    matched = replace(delete(1, 20), deleted_row=upsert(1, 10, first="Grace").row)
    left = replace(delete(2, 20), deleted_row=upsert(2, 10, active=False).row)
    per_sink = route.sink_changes(SCHEMA, [matched, left])
    search_mark, search_left = per_sink["search"]
    assert search_mark.marks_deleted and search_mark.version == 20
    assert search_mark.row is not None and not search_mark.unavailable_columns
    assert search_mark.row["full_name"] == "Grace L" and search_mark.row["_deleted"] is True
    assert search_mark.row["cents"] is None and len(search_mark.row["email"]) == 64  # shaped
    assert search_left.is_delete and not search_left.marks_deleted  # it had left the filter
    # The cache (soft, no filter) marks both, as they were; Delta (hard) deletes both.
    assert [c.marks_deleted for c in per_sink["cache"]] == [True, True]
    assert per_sink["cache"][0].row is not None and per_sink["cache"][0].row["email"] == "***"
    assert [c.is_delete for c in per_sink["delta"]] == [True, True]


def test_a_reinsert_clears_the_markers_and_a_tombstone_without_version_leaves_the_mark(
    tmp_path: Path,
) -> None:
    route = load(tmp_path)
    (reinsert,) = route.sink_changes(SCHEMA, [upsert(1, 30)])["cache"]
    assert reinsert.row is not None and reinsert.row["_deleted"] is False
    # Its delete event marked the row already: a soft sink keeps it, a hard one deletes.
    per_sink = route.sink_changes(SCHEMA, [delete(1, UNVERSIONED)])
    assert per_sink["cache"] == [] and per_sink["delta"] == []
    (forget,) = per_sink["search"]
    assert forget.is_delete and forget.is_unversioned


def test_verify_shapes_postgres_rows_by_the_same_rule(tmp_path: Path) -> None:
    route = load(tmp_path)
    rows = [dict(upsert(1, 0).row or {}), dict(upsert(2, 0, active=False).row or {})]
    search = sink_rows(route, route.shape("search"), TABLE, SCHEMA, ["id"], rows)
    assert set(search) == {"1"} and search["1"]["full_name"] == "Ada L"
    cache = sink_rows(route, route.shape("cache"), TABLE, SCHEMA, ["id"], rows)
    assert set(cache) == {"1", "2"} and cache["2"]["email"] == "***"
    assert marked_deleted(route.shape("cache"), {"_deleted": True})
    assert not marked_deleted(route.shape("search"), {"_deleted": True})


def test_a_plain_route_is_routed_as_before(tmp_path: Path) -> None:
    route = load(
        tmp_path,
        "version: 1\nsource: {topic_prefix: cdc}\ntables:\n"
        "  shop.customers: {search: true, cache: true}\n",
    )
    assert route.shapes == {}
    change = upsert(1, 5)
    per_sink = route.sink_changes(SCHEMA, [change])
    assert per_sink["search"] == per_sink["cache"] == [route.route(change)]


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ("filter: 'active AND'", "tables.shop.customers.filter", "syntax error"),
        (
            "search: {computed: {full_name: 'a, b'}}",
            "tables.shop.customers.search.computed.full_name",
            "single expression",
        ),
        ("cache: {on_delete: maybe}", "tables.shop.customers.cache.on_delete", "not one of"),
        ("search: {hash: {fields: [email]}}", "tables.shop.customers.search.hash.secret_env", ""),
        ("search: {sort: 1}", "tables.shop.customers.search.sort", "unknown key"),
    ],
)
def test_bad_settings_fail_at_load_naming_file_and_field(
    tmp_path: Path, body: str, path: str, message: str
) -> None:
    text = f"version: 1\nsource: {{topic_prefix: cdc}}\ntables:\n  shop.customers:\n    {body}\n"
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert caught.value.path == path and message in caught.value.message
    assert str(tmp_path / "m.yaml") in str(caught.value)


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ("search: {computed: {x: 'nope + 1'}}", "tables.shop.customers.search.computed.x", "nope"),
        ("search: {computed: {x: 'id + email'}}", "tables.shop.customers.search.computed.x", "+"),
        (
            "search: {computed: {x: 'sum(id)'}}",
            "tables.shop.customers.search.computed.x",
            "aggregate",
        ),
        ("filter: 'id + 1'", "tables.shop.customers.filter", "boolean"),
        ("cache: {mask: {phone: x}}", "tables.shop.customers.cache.mask", "'phone'"),
        ("cache: {drop: [nope]}", "tables.shop.customers.cache.drop", "'nope'"),
        ("delta: {drop: [id]}", "tables.shop.customers.delta", "key column 'id'"),
    ],
)
def test_expressions_are_checked_against_the_columns(
    tmp_path: Path, body: str, path: str, message: str
) -> None:
    text = (
        (
            "version: 1\nsource: {topic_prefix: cdc}\ntables:\n  shop.customers:\n"
            f"    search: true\n    cache: true\n    {body}\n"
        )
        .replace("    search: true\n    search:", "    search:")
        .replace("    cache: true\n    cache:", "    cache:")
    )
    route = load(tmp_path, text)
    problems = shape_problems(route, route.shapes, SCHEMA, ["id"])
    assert problems, "expected a problem"
    where, found = problems[0]
    assert where == f"{tmp_path / 'm.yaml'}: {path}" and message in found


@pytest.mark.parametrize("sink", ["search", "cache", "delta"])
@pytest.mark.parametrize(
    ("shaping", "field", "advice"),
    [
        ("mask: {id: '***'}", "mask", "ids would collide"),
        (f"hash: {{fields: [id], secret_env: {SECRET_ENV}}}", "hash.fields", "surrogate key"),
        # A renamed key column is still the key: shapes name the sink's fields.
        ("mask: {ident: x}", "mask", "ids would collide"),
    ],
)
def test_a_key_column_cannot_be_masked_or_hashed(
    tmp_path: Path, sink: str, shaping: str, field: str, advice: str
) -> None:
    """The search _id, the cache key and the Delta MERGE key are the raw key in every sink
    (and in verify, repair and erase): a masked or hashed key column would not change them, so
    the mapping is refused, naming the field and what to do instead."""
    rename = "    rename: {id: ident}\n" if "ident" in shaping else ""
    text = (
        "version: 1\nsource: {topic_prefix: cdc}\ntables:\n  shop.customers:\n"
        f"{rename}    {sink}: {{{shaping}}}\n"
    )
    route = load(tmp_path, text)
    problems = shape_problems(route, route.shapes, SCHEMA, ["id"])
    where = f"{tmp_path / 'm.yaml'}: tables.shop.customers.{sink}.{field}"
    assert [w for w, _ in problems] == [where], problems
    message = problems[0][1]
    assert "key column" in message and advice in message, message


def test_a_missing_hash_secret_names_the_field_and_never_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = load(tmp_path)
    assert missing_secrets(route.shapes) == []
    monkeypatch.delenv(SECRET_ENV)
    (error,) = missing_secrets(route.shapes)
    assert error.path == "tables.shop.customers.search.hash.secret_env"
    assert SECRET_ENV in error.message and "email" in error.message


def test_verify_expects_a_marked_row_exactly_where_postgres_lacks_it(tmp_path: Path) -> None:
    route = load(tmp_path)
    expected = {"1": {"id": "1", "_deleted": False}, "2": {"id": "2", "_deleted": False}}
    actual = {
        "1": {"id": "1", "_deleted": False},
        "2": {"id": "2", "_deleted": True},  # marked, but Postgres holds it: a difference
        "3": {"id": "3", "_deleted": True},  # marked, Postgres lacks it: as expected
        "4": {"id": "4", "_deleted": False},  # not marked, Postgres lacks it: extra
    }
    result = compare_sink(route, "cache", expected, actual)
    assert (result.missing, result.extra, result.different) == ([], ["4"], ["2"])
    assert result.count == 4
    # A sink without soft deletes counts every row it holds that Postgres lacks.
    plain = compare_sink(route, "search", expected, actual)
    assert plain.extra == ["3", "4"]
    # Postgres holds 5, which the sink's filter excludes: its marked row is extra; 6 is a
    # marked row the sink cannot have marked (`verify.soft_deletes`): extra too.
    actual |= {"5": {"id": "5", "_deleted": True}, "6": {"id": "6", "_deleted": True}}
    checked = compare_sink(route, "cache", expected, actual, {"1", "2", "5"}, {"6"})
    assert (checked.missing, checked.extra, checked.different) == ([], ["4", "5", "6"], ["2"])


def test_a_numeric_without_precision_in_an_expression_says_how_to_compare_it() -> None:
    """A `numeric` of any scale is held as exact text (no fixed decimal holds every value), so a
    filter such as `kg > 5` does not bind: the error names the column and the cast that does,
    which Postgres (verify, the document oracle) reads alike (seen with `cdc-sync init` on a
    schema of `numeric` columns)."""
    schema = RowSchema(
        (Column("id", ColumnType(TypeKind.INT64)), Column("kg", ColumnType(TypeKind.DECIMAL)))
    )
    with pytest.raises(ExpressionError) as refused:
        result_types(schema, {"filter": ("documents.d.filter", "kg > 5")})
    assert refused.value.path == "documents.d.filter"
    assert "kg is a numeric without a precision" in refused.value.message
    assert "CAST(kg AS numeric(38, 10))" in refused.value.message
    cast = result_types(
        schema, {"filter": ("documents.d.filter", "CAST(kg AS numeric(38, 10)) > 5")}
    )
    assert cast["filter"].kind is TypeKind.BOOLEAN
    # An expression over other columns keeps DuckDB's own message alone.
    with pytest.raises(ExpressionError) as other:
        result_types(schema, {"filter": ("f", "id > 'x' + 1")})
    assert "numeric without a precision" not in other.value.message
    # Nor one whose text merely contains the column's name.
    with pytest.raises(ExpressionError) as inside:
        result_types(schema, {"filter": ("f", "'pkg' || id > 5")})
    assert "numeric without a precision" not in inside.value.message
