import json
from decimal import Decimal

import pytest

from cdc_sync.core.model import Change, Op, TableId, Tombstone
from cdc_sync.debezium.decoder import MalformedRecord, parse_record
from tests.envelopes import UNAVAILABLE, coords, envelope_bytes, key_bytes, product

pytestmark = pytest.mark.unit


def test_insert_parses_to_change_with_converted_values_and_lsn_version() -> None:
    change = parse_record(
        key_bytes("products", {"id": 7}),
        envelope_bytes("products", "c", 1234, product(7, price="12.34")),
        coords(3),
    )
    assert isinstance(change, Change)
    assert change.table == TableId("shop", "products")
    assert change.key == (("id", 7),)
    assert change.doc_id == "7"
    assert change.op is Op.CREATE
    assert change.version == 1234
    assert change.row is not None and change.row["price"] == Decimal("12.34")
    assert change.coordinates.offset == 3
    assert change.source_ts_ms == 1_700_000_000_000
    assert change.unavailable_columns == frozenset()


def test_delete_has_no_row_and_takes_the_key_from_the_record_key() -> None:
    change = parse_record(
        key_bytes("products", {"id": 7}),
        envelope_bytes("products", "d", 99, None, before={"id": 7}),
        coords(4),
    )
    assert isinstance(change, Change)
    assert change.is_delete and change.row is None and change.doc_id == "7"


def test_composite_key_joins_values_in_key_order() -> None:
    change = parse_record(
        key_bytes("order_lines", {"line_no": 2, "order_id": 10}),
        envelope_bytes("order_lines", "d", 5, None),
        coords(0, topic="cdc.shop.order_lines"),
    )
    assert isinstance(change, Change)
    assert change.key == (("order_id", 10), ("line_no", 2))
    assert change.doc_id == "10|2"


def test_unchanged_toast_column_is_left_out_of_the_row_and_listed() -> None:
    after = product(7) | {"description": UNAVAILABLE}
    change = parse_record(
        key_bytes("products", {"id": 7}), envelope_bytes("products", "u", 50, after), coords(1)
    )
    assert isinstance(change, Change)
    assert change.unavailable_columns == frozenset({"description"})
    assert change.row is not None and "description" not in change.row


def test_null_value_is_a_tombstone() -> None:
    parsed = parse_record(key_bytes("products", {"id": 7}), None, coords(5))
    assert isinstance(parsed, Tombstone)
    assert parsed.table == TableId("shop", "products")


@pytest.mark.parametrize(
    ("key", "value", "field_path"),
    [
        (None, b"{}", "key"),
        (b"not json", b"{}", "key"),
        (b'{"id": 1}', b"{}", "key"),
        (
            key_bytes("products", {"id": 1}),
            b'{"schema": {}, "payload": {"op": "x"}}',
            "value.payload.op",
        ),
        (
            key_bytes("products", {"id": 1}),
            envelope_bytes("products", "c", 1, product(1)).replace(b'"lsn": 1', b'"lsn": null'),
            "value.payload.source.sequence",
        ),
        (
            key_bytes("products", {"id": 1}),
            envelope_bytes("products", "c", 1, None),
            "value.payload.after",
        ),
    ],
)
def test_malformed_records_name_the_failing_field(
    key: bytes | None, value: bytes, field_path: str
) -> None:
    with pytest.raises(MalformedRecord) as raised:
        parse_record(key, value, coords(9))
    assert raised.value.field_path == field_path
    assert "cdc.shop.products[0]@9" in str(raised.value)


def test_json_the_fast_parser_refuses_still_parses_as_json_reads_it() -> None:
    # orjson reads records first; NaN tokens and integers past 64 bits are JSON Python's json
    # module reads, so they fall back to it instead of becoming malformed records.
    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "float64", "optional": True, "field": "ratio"},
        {"type": "int64", "optional": True, "field": "big"},
    ]
    after = {"id": 1, "ratio": 0.5, "big": 7}
    value = envelope_bytes("products", "c", 3, after, fields=fields)
    value = value.replace(b'"ratio": 0.5', b'"ratio": NaN').replace(
        b'"big": 7', b'"big": 1' + b"0" * 20
    )
    parsed = parse_record(key_bytes("products", {"id": 1}), value, coords(4))
    assert isinstance(parsed, Change) and parsed.row is not None
    assert parsed.row["ratio"] != parsed.row["ratio"]  # NaN
    assert parsed.row["big"] == 10**20
    with pytest.raises(MalformedRecord) as raised:
        parse_record(key_bytes("products", {"id": 1}), b"\xff{", coords(5))
    assert raised.value.field_path == "value"


def test_records_without_schemas_parse_with_catalog_schemas() -> None:
    from cdc_sync.core.types import KnownSchema
    from cdc_sync.schema import Column, ColumnType, RowSchema, TypeKind

    id_column = Column("id", ColumnType(TypeKind.INT32, optional=False))
    row = RowSchema(
        (id_column, Column("price", ColumnType(TypeKind.DECIMAL, scale=2, precision=10)))
    )
    known = {TableId("shop", "products"): KnownSchema(key=RowSchema((id_column,)), row=row)}
    envelope = {
        "op": "u",
        "after": {"id": 7, "price": "MC0="},  # 123.33 as Connect's base64 unscaled bytes
        "source": {"lsn": 42, "schema": "shop", "table": "products", "ts_ms": 1},
    }
    parsed = parse_record(b'{"id": 7}', json.dumps(envelope).encode(), coords(1), known)
    assert isinstance(parsed, Change)
    assert parsed.key == (("id", 7),) and parsed.version == 42
    assert parsed.row == {"id": 7, "price": Decimal("123.33")}
    tombstone = parse_record(b'{"id": 7}', None, coords(2), known)
    assert isinstance(tombstone, Tombstone)
    with pytest.raises(MalformedRecord, match="no catalog schema"):
        parse_record(b'{"id": 7}', b"{}", coords(3, topic="cdc.shop.unknown"), known)


def test_incremental_snapshot_rows_take_their_version_from_the_sequence() -> None:
    envelope = json.loads(envelope_bytes("products", "r", 0, product(1)))
    source = envelope["payload"]["source"]
    source.update(lsn=None, snapshot="incremental", sequence='["30855900","30855944"]')
    parsed = parse_record(
        key_bytes("products", {"id": 1}), json.dumps(envelope).encode(), coords(1)
    )
    assert isinstance(parsed, Change) and parsed.version == 30855900  # the last commit
    source.update(sequence=None)
    with pytest.raises(MalformedRecord, match="sequence"):
        parse_record(key_bytes("products", {"id": 1}), json.dumps(envelope).encode(), coords(2))


def versioned(key: int, lsn: int, sequence: str | None, offset: int) -> Change:
    envelope = json.loads(envelope_bytes("products", "u", lsn, product(key)))
    envelope["payload"]["source"]["sequence"] = sequence
    parsed = parse_record(
        key_bytes("products", {"id": key}), json.dumps(envelope).encode(), coords(offset)
    )
    assert isinstance(parsed, Change)
    return parsed


def test_versions_follow_commit_order_not_the_changes_own_lsn() -> None:
    # Observed on Debezium 3.6.3: T1 updates row 1 (lsn 30720856) before T2 updates row 2
    # (30720944), T2 commits first, then T1 updates row 3 and commits; then T3 updates row 1.
    t2 = versioned(2, 30720944, '["30720808","30720944"]', 0)
    t1_first = versioned(1, 30720856, '["30721080","30720856"]', 1)
    t1_last = versioned(3, 30721080, '["30721080","30721080"]', 2)
    t3 = versioned(1, 30721216, '["30721216","30721216"]', 3)
    assert t2.version < t1_first.version == t1_last.version < t3.version
    assert t1_first.version > t2.version  # by its own lsn it would come first


def test_a_change_written_first_but_committed_last_wins() -> None:
    """T1 writes key 5 first (lsn 100) and commits after T2 wrote it (lsn 110): in commit order
    T1 is newer, and the fold keeps it (by lsn T2 would win and T1 be fenced forever)."""
    from cdc_sync.job.decode.fold import fold

    t2 = versioned(5, 110, '["90","110"]', 0)
    t1 = versioned(5, 100, '["130","100"]', 1)
    older, newer = sorted([t1, t2], key=lambda c: c.version)
    assert fold(older, newer) is t1


def test_without_a_last_commit_the_changes_own_position_stands_in() -> None:
    # The first transaction after the connector starts or snapshots: `[null, lsn]`.
    assert versioned(1, 500, '[null,"500"]', 0).version == 500
    assert versioned(1, 500, None, 0).version == 500


def test_sinks_written_with_change_lsns_keep_converging_after_the_upgrade() -> None:
    """Before this release a version was the change's own lsn. Any later transaction's
    commit-order version is the commit end of a transaction that committed after those changes,
    so it exceeds every lsn stored before the upgrade: new changes are never fenced by old ones."""
    stored_before_upgrade = [30720944, 30720856, 30721080]  # T2, T1, T1 (their own lsns)
    next_change = versioned(1, 30721216, '["30721216","30721216"]', 3)
    assert all(next_change.version > old for old in stored_before_upgrade)
    # Written again after the upgrade (a replay), a change keeps at least its old version:
    # the floor only raises, so the sinks' >= fence lets it through or it was already there.
    replayed = parse_record(
        key_bytes("products", {"id": 1}),
        sourced(1, "u", 30720856, '[null,"30720856"]', "false"),
        coords(4),
        None,
        30721080,
    )
    assert isinstance(replayed, Change) and replayed.version >= 30720856


def sourced(key: int, op: str, lsn: int, sequence: str | None, snapshot: str) -> bytes:
    envelope = json.loads(envelope_bytes("products", op, lsn, product(key)))
    envelope["payload"]["source"].update(sequence=sequence, snapshot=snapshot)
    return json.dumps(envelope).encode()


def test_first_transaction_after_a_snapshot_is_no_older_than_the_records_before_it() -> None:
    """Observed (tests/e2e/test_commit_order.py): a transaction that wrote before the snapshot's
    consistent point S and committed after it streams first, as `[null, lsn]` with lsn < S.
    The partition's floor (S from the snapshot rows) lifts it; equal to them, it wins by Kafka
    order. Snapshot rows and changes with a last commit keep their own versions."""
    key = key_bytes("products", {"id": 1})
    first_after = parse_record(
        key, sourced(1, "u", 900, '[null,"900"]', "false"), coords(4), None, 1000
    )
    assert isinstance(first_after, Change) and first_after.version == 1000
    later = parse_record(
        key, sourced(1, "u", 1100, '[null,"1100"]', "false"), coords(5), None, 1000
    )
    assert isinstance(later, Change) and later.version == 1100  # past the floor: its own lsn
    snapshot_row = parse_record(
        key, sourced(1, "r", 800, '[null,"800"]', "true"), coords(1), None, 1000
    )
    assert isinstance(snapshot_row, Change) and snapshot_row.version == 800
    committed = parse_record(
        key, sourced(1, "u", 900, '["1200","900"]', "false"), coords(6), None, 5000
    )
    assert isinstance(committed, Change) and committed.version == 1200
    no_sequence = parse_record(key, sourced(1, "u", 900, None, "false"), coords(7), None, 1000)
    assert isinstance(no_sequence, Change) and no_sequence.version == 900
