"""A row deleted in Postgres leaves the documents' state (cdc_sync.documents.state) for good:
neither its values nor its key stay in the SQLite file, its WAL or its freed pages, while the
delete still fences a stale change out (erasure, docs/erasure.md)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from cdc_sync.documents.sync import DocumentSync
from tests.erasure_audit import files_holding
from tests.unit.test_documents import SCHEMAS_BY_TABLE, MemoryIndex, change, folded, load

pytestmark = pytest.mark.unit

# Keys and values no other byte of the state could hold by chance.
PERSON, ORDER, OTHER_ORDER, PRODUCT = 7314159265, 8271828182, 5772156649, 9161803398
NAME = "Zq-erase-Ada-Lovelace"
PRODUCT_NAME = "Zq-erase-custom-engraving"


def test_deleted_rows_leave_neither_values_nor_keys_in_the_state_files(tmp_path: Path) -> None:
    mapping = load(tmp_path)
    index = MemoryIndex()
    folder = tmp_path / "checkpoint" / "documents"
    sync = DocumentSync(mapping, folder / "state.sqlite", index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    person: dict[str, Any] = {"id": PERSON, "name": NAME}
    order: dict[str, Any] = {"id": ORDER, "customer_id": PERSON, "status": "new"}
    line: dict[str, Any] = {"order_id": ORDER, "line_no": 1, "product_id": PRODUCT, "qty": 1}
    other: dict[str, Any] = {"id": OTHER_ORDER, "customer_id": 1, "status": "new"}
    other_line: dict[str, Any] = {
        "order_id": OTHER_ORDER,
        "line_no": 1,
        "product_id": PRODUCT,
        "qty": 2,
    }
    product: dict[str, Any] = {"id": PRODUCT, "name": PRODUCT_NAME}
    rows: list[tuple[str, dict[str, Any]]] = [
        ("customers", person),
        ("customers", {"id": 1, "name": "Bob"}),
        ("orders", order),
        ("lines", line),
        ("orders", other),
        ("lines", other_line),
        ("products", product),
    ]
    sync.apply([], folded([change(table, row, False, 10) for table, row in rows]))
    assert index.docs[str(ORDER)]["customer"]["name"] == NAME
    assert index.docs[str(OTHER_ORDER)]["lines"][0]["product"]["name"] == PRODUCT_NAME
    # Updates leave older copies of the values behind in the file too.
    sync.apply([], folded([change("customers", person, False, 15)]))

    # The privacy request: the person, their order and its line (ON DELETE CASCADE); the
    # product after the other order's line that referenced it. The other order stays.
    gone: list[tuple[str, dict[str, Any]]] = [
        ("customers", person),
        ("orders", order),
        ("lines", line),
        ("lines", other_line),
    ]
    sync.apply([], folded([change(table, row, True, 20) for table, row in gone]))
    sync.apply([], folded([change("products", product, True, 30)]))

    assert str(ORDER) not in index.docs
    assert index.docs[str(OTHER_ORDER)]["lines"] == []  # rendered again without them
    secrets = [NAME, PRODUCT_NAME, str(PERSON), str(ORDER), str(PRODUCT)]
    assert files_holding(folder, secrets) == {}
    # The deletes still fence: a stale change stays out, a newer one (a re-insert) is taken.
    sync.apply([], folded([change("customers", person, False, 12)]))
    sync.apply([], folded([change("orders", order, False, 19)]))
    assert str(ORDER) not in index.docs
    sync.apply([], folded([change("orders", order, False, 40)]))
    assert index.docs[str(ORDER)]["customer"] is None
    sync.close()
    reopened = DocumentSync(mapping, folder / "state.sqlite", index)
    reopened.apply([], folded([change("customers", person, False, 12)]))  # still fenced
    assert index.docs[str(ORDER)]["customer"] is None
    reopened.close()


def test_a_state_from_before_keeps_its_deleted_keys_by_digest_only(tmp_path: Path) -> None:
    """A state written before deleted keys were digested held them as rows without JSON: at
    open they are kept by digest, and they still fence."""
    mapping = load(tmp_path)
    index = MemoryIndex()
    path = tmp_path / "state.sqlite"
    with sqlite3.connect(path) as conn:  # the earlier layout's deleted row
        conn.execute(
            "CREATE TABLE rows (tbl TEXT NOT NULL, id TEXT NOT NULL, version INTEGER NOT NULL,"
            " key TEXT NOT NULL, doc TEXT, PRIMARY KEY (tbl, id)) WITHOUT ROWID"
        )
        conn.execute(
            "INSERT INTO rows VALUES ('s.customers', ?, 30, ?, NULL)", [str(PERSON), f"[{PERSON}]"]
        )
    sync = DocumentSync(mapping, path, index)
    sync.ensure_targets(SCHEMAS_BY_TABLE)
    assert files_holding(tmp_path, [str(PERSON)]) == {}
    order = {"id": ORDER, "customer_id": PERSON, "status": "new"}
    person = {"id": PERSON, "name": NAME}
    sync.apply(
        [], folded([change("orders", order, False, 40), change("customers", person, False, 20)])
    )
    assert index.docs[str(ORDER)]["customer"] is None  # the stale customer stayed out
    sync.close()
