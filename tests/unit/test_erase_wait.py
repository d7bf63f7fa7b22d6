"""Which consumers `cdc-sync erase` waits for, and how it reads a document index's progress
(cdc_sync.verify.erase; the waits themselves run on the real pipeline in
tests/e2e/test_erasure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_sync.core.model import TableId
from cdc_sync.mapping import load_mapping
from cdc_sync.verify.erase import document_behind, documents_holding, waited_sinks
from tests.unit.test_status import _offset_entry

pytestmark = pytest.mark.unit

MAPPING = """
version: 1
source: {topic_prefix: t}
tables:
  s.orders:
    search: {index: flat_orders}
    cache: {prefix: c}
  s.lines:
    delta: {table: s.lines}
documents:
  orders:
    root: s.orders
    relations:
      customer: {table: s.customers, kind: one, join: {customer_id: id}}
"""


def test_erase_waits_for_the_table_s_sinks_and_the_documents_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MAPPING)
    mapping = load_mapping(path)
    orders, customers = TableId("s", "orders"), TableId("s", "customers")
    assert waited_sinks(mapping, orders) == ["search", "cache"]
    # Held by a document index only: any sink's watermark says its changes are in Kafka.
    assert waited_sinks(mapping, customers) == ["search", "cache", "delta"]
    assert documents_holding(mapping, orders) == documents_holding(mapping, customers) == ["orders"]
    assert documents_holding(mapping, TableId("s", "lines")) == []


def test_a_document_index_is_behind_until_its_checkpoint_reaches_the_end_offsets(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "documents" / "orders"  # job.consumers.consumer_checkpoint
    wanted = {("t.s.orders", 0): 20, ("t.s.customers", 0): 7}
    assert "no batch committed" in str(document_behind(tmp_path, "orders", wanted))
    (folder / "offsets").mkdir(parents=True)
    (folder / "commits").mkdir()
    (folder / "offsets" / "0").write_text(_offset_entry({"t.s.orders": {"0": 20}}))
    (folder / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert document_behind(tmp_path, "orders", wanted) == "behind at t.s.customers[0] 0/7"
    entry = {"t.s.orders": {"0": 20}, "t.s.customers": {"0": 9}}
    (folder / "offsets" / "1").write_text(_offset_entry(entry))  # planned, not committed
    assert document_behind(tmp_path, "orders", wanted) == "behind at t.s.customers[0] 0/7"
    (folder / "commits" / "1").write_text('v1\n{"nextBatchWatermarkMs":0}')
    assert document_behind(tmp_path, "orders", wanted) is None
