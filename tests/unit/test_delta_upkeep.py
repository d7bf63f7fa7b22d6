"""Delta upkeep settings: the mapping's change_data_feed, the job's every-N-batches hook, CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId
from cdc_sync.mapping import load_mapping
from cdc_sync.sinks.delta.maintenance import EveryNBatches, TableUpkeep, format_upkeep

pytestmark = pytest.mark.unit

MAPPING = """
version: 1
source: {topic_prefix: t}
tables:
  s.a:
    delta: {change_data_feed: %s}
"""


def test_change_data_feed_is_a_validated_delta_setting(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MAPPING % "true")
    delta = load_mapping(path).tables[TableId("s", "a")].delta
    assert delta is not None and delta.change_data_feed
    path.write_text(MAPPING % "'yes'")
    with pytest.raises(ConfigError, match=r"tables\.s\.a\.delta\.change_data_feed: expected"):
        load_mapping(path)


def test_upkeep_runs_every_nth_batch_and_never_fails_the_job() -> None:
    calls: list[int] = []

    def action() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("disk hiccup")  # logged; tried again N batches later

    upkeep = EveryNBatches(3, action)
    for _ in range(7):
        upkeep.after_batch()
    assert calls == [0, 1]
    with pytest.raises(ValueError, match="maintain_every_batches"):
        EveryNBatches(0, action)


def test_upkeep_report_has_a_line_per_table() -> None:
    text = format_upkeep(
        [
            TableUpkeep("s.a", 40, 1, 40, 0, None, ("delta.enableChangeDataFeed",)),
            TableUpkeep("s.a (tombstones)", 12, 1, 12, 0, 3),
        ],
        dry_run=False,
    )
    lines = text.splitlines()
    assert lines[0].split() == ["table", "files", "before", "after", "compacted", "vacuumed",
                                "tombstones", "pruned"]  # fmt: skip
    assert lines[1].split() == ["s.a", "40", "1", "40", "0", "-"]
    assert lines[2].split() == ["s.a", "(tombstones)", "12", "1", "12", "0", "3"]
    assert lines[3] == "s.a: set delta.enableChangeDataFeed"


def test_bad_command_line_options_exit_2_naming_the_option(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdc_sync import cli
    from cdc_sync.cli import main

    # The CLI's logging setup would keep this test's captured stderr for later tests.
    monkeypatch.setattr(cli, "_setup_logging", lambda *_args: None)

    mapping = "tests/adversarial/mapping.yaml"
    assert main(["maintain", "--mapping", mapping, "--retention-hours", "1"]) == 2
    assert "--retention-hours: 1 is below Delta's safety default" in capsys.readouterr().err
    assert main(["maintain", "--mapping", mapping, "--table", "adv.nope"]) == 2
    assert "--table: adv.nope is not routed" in capsys.readouterr().err
    assert main(["verify", "--mapping", mapping, "--sink", "search,redis"]) == 2
    assert "--sink: unknown ['redis']" in capsys.readouterr().err
    assert main(["repair", "--mapping", mapping, "--table", "nodot"]) == 2
    assert "--table: expected <schema>.<table>" in capsys.readouterr().err
