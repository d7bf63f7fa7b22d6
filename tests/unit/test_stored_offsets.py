"""The embedded capture's stored offsets against its slot: which are stale, and why (one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_sync.connectors.stored_offsets import (
    StaleOffsets,
    StoredOffset,
    connector_offset,
    stale_reason,
)
from cdc_sync.debezium.slots import SlotPosition

pytestmark = pytest.mark.unit

# The entry Debezium 3 stored for connector `shop`, topic prefix `cdc`, after a streamed update.
KEY = b'["shop",{"server":"cdc"}]'
VALUE = (
    b'{"lsn_proc":26559424,"messageType":"UPDATE","lsn_commit":26559368,"lsn":26559424,'
    b'"txId":770,"ts_usec":1795745610433573}'
)


def test_the_connectors_offset_is_found_by_engine_name_and_server() -> None:
    other = json.dumps(["other", {"server": "cdc"}]).encode()
    entries = {other: b'{"lsn": 1}', b"not json": b"{", KEY: VALUE}
    assert connector_offset(entries, "shop", "cdc") == StoredOffset(26559424, 26559368)
    assert connector_offset(entries, "shop", "elsewhere") is None
    # Right after the snapshot there is no commit LSN yet.
    assert connector_offset({KEY: b'{"lsn": 7, "snapshot": "last"}'}, "shop", "cdc") == (
        StoredOffset(7, 7)
    )


STORED = StoredOffset(lsn=1000, commit_lsn=900)


@pytest.mark.parametrize(
    ("slot", "expected"),
    [
        (SlotPosition(True, 800, 5000), None),  # the slot keeps what the offsets need
        (SlotPosition(True, 900, 1000), None),  # at the very end of the WAL
        (SlotPosition(False, None, 5000), "replication slot s does not exist"),
        (SlotPosition(True, 10, 500), "they lie at 0/3E8, ahead of the server's WAL (0/1F4)"),
        (SlotPosition(True, 950, 5000), "they lie at 0/384, behind what slot s still keeps"),
    ],
)
def test_stale_when_the_slot_is_gone_behind_them_or_the_wal_is_behind(
    slot: SlotPosition, expected: str | None
) -> None:
    reason = stale_reason(STORED, slot, "s")
    assert (reason is None) if expected is None else (reason or "").startswith(expected)


def test_the_message_is_one_line_with_the_command() -> None:
    stale = StaleOffsets(Path("s/shop.offsets"), "u@h:5432/shop", "replication slot s is gone")
    line = stale.with_way_out("cdc-sync capture --connector c.json --reset")
    assert "\n" not in line
    assert line == (
        "the capture's stored offsets (s/shop.offsets) do not belong to database u@h:5432/shop: "
        "replication slot s is gone. Start over with a new snapshot: "
        "cdc-sync capture --connector c.json --reset"
    )
