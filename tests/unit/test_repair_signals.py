"""Snapshot signals narrowed to keys: signal size, filter splitting, whole-table fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.debezium.notifications import Notification, SnapshotOutcome, snapshot_outcome
from cdc_sync.debezium.signals import (
    SIGNAL_DATA_CHARS,
    filter_budget,
    key_filters,
    snapshot_signal_data,
)
from cdc_sync.mapping import load_mapping
from cdc_sync.verify.repair import repair_options
from cdc_sync.verify.resnapshot import (
    MAX_SIGNALS_PER_TABLE,
    SnapshotChannel,
    SnapshotSignal,
    merged,
    table_signals,
)

pytestmark = pytest.mark.unit
TABLE = TableId("adv", "child")


def test_signal_data_carries_debezium_additional_conditions() -> None:
    data = json.loads(snapshot_signal_data(["adv.child"], {"adv.child": '("id") IN (1)'}))
    assert data == {
        "data-collections": ["adv.child"],
        "type": "incremental",
        "additional-conditions": [{"data-collection": "adv.child", "filter": '("id") IN (1)'}],
    }
    assert "additional-conditions" not in json.loads(snapshot_signal_data(["adv.child"]))


def test_single_column_keys_become_one_in_list() -> None:
    assert key_filters(None, ["id"], [(1,), (2,), (30,)], 1000) == ['("id") IN (1, 2, 30)']


def test_composite_keys_are_row_values_with_quoted_literals() -> None:
    [condition] = key_filters(None, ["name", "n"], [("o'k|\\", 1), ("x", -2)], 1000) or []
    assert condition == "(\"name\", \"n\") IN ((E'o''k|\\\\', 1), ('x', -2))"


def test_long_key_lists_split_so_every_signal_fits() -> None:
    keys = [(f"key-{i:05d}-{'é' * 5}",) for i in range(400)]
    budget = filter_budget(str(TABLE))
    filters = key_filters(None, ["code"], keys, budget)
    assert filters is not None and len(filters) > 1
    for condition in filters:
        assert len(snapshot_signal_data([str(TABLE)], {str(TABLE): condition})) <= SIGNAL_DATA_CHARS
    listed = [item for f in filters for item in f.removeprefix('("code") IN (')[:-1].split(", ")]
    assert listed == [f"'{k}'" for (k,) in keys]  # every key once, in order


def test_a_key_longer_than_a_signal_gives_no_filter() -> None:
    assert key_filters(None, ["code"], [("x" * 3000,)], filter_budget(str(TABLE))) is None


def test_most_of_a_table_differing_snapshots_it_whole() -> None:
    keys = [(i,) for i in range(60)]
    assert table_signals(None, TABLE, ["id"], keys, source_rows=100) == [
        SnapshotSignal(("adv.child",))
    ]
    few = table_signals(None, TABLE, ["id"], keys[:10], source_rows=100)
    assert [s.conditions for s in few] == [
        {"adv.child": f'("id") IN ({", ".join(map(str, range(10)))})'}
    ]


def test_too_many_key_signals_snapshot_the_table_whole() -> None:
    keys = [("k" * 500 + str(i),) for i in range(4 * MAX_SIGNALS_PER_TABLE)]
    signals = table_signals(None, TABLE, ["id"], keys, source_rows=10**6)
    assert signals == [SnapshotSignal(("adv.child",))]


def test_whole_table_signals_merge_into_one() -> None:
    narrowed = SnapshotSignal(("adv.child",), {"adv.child": '("id") IN (1)'})
    signals = [SnapshotSignal(("adv.parent",)), narrowed, SnapshotSignal(("adv.deferred",))]
    assert merged(signals) == [SnapshotSignal(("adv.parent", "adv.deferred")), narrowed]


def _note(kind: str) -> Notification:
    return Notification("s", "Incremental Snapshot", kind, {}, None)


@pytest.mark.parametrize(
    ("kinds", "outcome"),
    [
        (["STARTED", "IN_PROGRESS", "COMPLETED"], SnapshotOutcome.COMPLETED),
        (["STARTED", "ABORTED"], SnapshotOutcome.ABORTED),
        (["STARTED"], SnapshotOutcome.INCOMPLETE),
        ([], SnapshotOutcome.SILENT),
    ],
)
def test_snapshot_outcome(kinds: list[str], outcome: SnapshotOutcome) -> None:
    assert snapshot_outcome(_note(k) for k in kinds) is outcome


def test_repair_needs_the_notification_channel() -> None:
    channel = SnapshotChannel({"name": "c", "signal.data.collection": "a.s"}, "", {})
    with pytest.raises(ConfigError, match=r"notification\.enabled\.channels"):
        _ = channel.topic


def test_repair_scope_names_the_bad_option() -> None:
    mapping = load_mapping(Path("tests/adversarial/mapping.yaml"))
    options = repair_options(mapping, ["adv.child"], ["cache,delta"])
    assert options.tables == {TABLE} and options.sinks == {"cache", "delta"}
    assert repair_options(mapping, [], []).tables is None
    with pytest.raises(ConfigError, match=r"--table: adv\.nope is not routed"):
        repair_options(mapping, ["adv.nope"], [])
    with pytest.raises(ConfigError, match=r"--sink: unknown \['redis'\]"):
        repair_options(mapping, [], ["redis"])
