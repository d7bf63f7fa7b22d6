"""failOnDataLoss: checkpoint offsets against the broker's watermarks (no Kafka, no Spark)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from cdc_sync.source import stream_options
from cdc_sync.source.data_loss import (
    DataLossError,
    LostOffset,
    carried_offsets,
    checked_span,
    checked_starts,
    find_lost,
    resolve_starts,
    stale_checkpoint,
)
from cdc_sync.source.end_offsets import EARLIEST, LATEST
from cdc_sync.source.offsets import PartitionRange, from_offset_json, to_offset_json
from cdc_sync.source.options import parse_options
from cdc_sync.source.python_kafka import CdcKafkaStreamReader, KafkaPartitionRange

pytestmark = pytest.mark.unit

MARKS = {("t", 0): (0, 5), ("t", 1): (40, 90), ("u", 0): (0, 0)}


def test_offsets_within_the_watermarks_are_kept() -> None:
    start = {("t", 0): 5, ("t", 1): 40, ("u", 0): 0}
    assert find_lost(start, MARKS) == []
    assert checked_starts(start, MARKS, fail_on_data_loss=True) == start


def test_offsets_past_the_end_and_below_the_start_are_lost() -> None:
    start = {("t", 0): 120, ("t", 1): 12, ("u", 0): 0}
    assert find_lost(start, MARKS) == [
        LostOffset("t", 0, 120, 0, 5),
        LostOffset("t", 1, 12, 40, 90),
    ]


def test_a_checkpoint_past_the_ends_or_on_missing_topics_is_stale() -> None:
    ends = {("t", 0): 5, ("t", 1): 90}
    processed = {("t", 0): 120, ("t", 1): 90, ("gone", 0): 7, ("other", 0): 3}
    stale = stale_checkpoint(processed, ends, ["t", "gone"])  # "other": not subscribed now
    assert stale is not None
    assert (stale.missing, stale.ahead) == (("gone",), ((("t", 0), 120, 5),))
    assert stale.describe() == (
        "it is ahead of the topics' ends (t[0] at offset 120, the broker's end 5): topics "
        "re-created or the broker reset; it read topics the broker does not have (gone): "
        "topics deleted or the broker reset"
    )
    # At (or below) the ends, on topics the broker has: not stale (below: retention's case).
    assert stale_checkpoint({("t", 0): 5, ("t", 1): 3}, ends, ["t"]) is None


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("abc"), st.integers(0, 2)), st.integers(0, 100), max_size=9
    ),
    st.dictionaries(
        st.tuples(st.sampled_from("abc"), st.integers(0, 2)), st.integers(0, 100), max_size=9
    ),
)
def test_stale_names_exactly_the_partitions_past_their_end_and_the_unlisted_topics(
    processed: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]
) -> None:
    stale = stale_checkpoint(processed, ends, ["a", "b", "c"])
    listed = {topic for topic, _ in ends}
    ahead = {tp for tp, offset in processed.items() if tp in ends and offset > ends[tp]}
    missing = {topic for topic, _ in processed} - listed
    if not ahead and not missing:
        assert stale is None
    else:
        assert stale is not None
        assert {tp for tp, _, _ in stale.ahead} == ahead and set(stale.missing) == missing


def test_a_vanished_topic_is_forgotten_only_leniently_and_not_for_a_metadata_error() -> None:
    begin = {("t", 0): 5, ("gone", 0): 7, ("flaky", 0): 3}
    listed = [("t", 0), ("t", 1)]
    strict = carried_offsets(begin, listed, {"flaky"}, fail_on_data_loss=True)
    assert strict == begin
    lenient = carried_offsets(begin, listed, {"flaky"}, fail_on_data_loss=False)
    # "gone" is read from its start when it exists again; "flaky"'s metadata error is no
    # deletion: replaying it from its start would cost the whole topic.
    assert lenient == {("t", 0): 5, ("flaky", 0): 3}


def test_partitions_the_broker_does_not_list_are_not_checked() -> None:
    # A deleted topic stops advancing; it is checked again once it exists.
    assert find_lost({("gone", 0): 7}, MARKS) == []


def test_data_loss_error_names_topic_partition_offsets_and_the_way_out() -> None:
    with pytest.raises(DataLossError) as caught:
        checked_starts({("t", 0): 120, ("t", 1): 12}, MARKS, fail_on_data_loss=True)
    message = str(caught.value)
    assert "topic 't' partition 0: checkpoint offset 120 is past the partition's end" in message
    assert "low watermark 0, high watermark 5" in message
    assert "topic 't' partition 1: checkpoint offset 12 is below the earliest retained" in message
    assert "low watermark 40, high watermark 90" in message
    assert "--checkpoint" in message
    assert "failOnDataLoss=false" in message
    assert "--no-fail-on-data-loss" in message
    assert [(item.topic, item.partition) for item in caught.value.lost] == [("t", 0), ("t", 1)]


def test_continuing_resumes_at_the_low_watermark_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    start = {("t", 0): 120, ("t", 1): 12, ("u", 0): 0}
    with caplog.at_level(logging.WARNING, logger="cdc_sync.source.data_loss"):
        resolved = checked_starts(start, MARKS, fail_on_data_loss=False)
    # Past the end: a re-created topic's records start again at 0, so 0 (not 5) reads them.
    assert resolved == {("t", 0): 0, ("t", 1): 40, ("u", 0): 0}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "topic 't' partition 0: checkpoint offset 120" in warnings[0]
    assert "high watermark 5" in warnings[0]
    assert "continuing from offset 0" in warnings[0]
    assert "continuing from offset 40" in warnings[1]


def test_new_partitions_start_at_their_low_watermark_without_loss() -> None:
    assert resolve_starts({("t", 0): 3}, MARKS, []) == {("t", 0): 3, ("t", 1): 40, ("u", 0): 0}
    assert checked_starts({}, MARKS, fail_on_data_loss=True) == {
        ("t", 0): 0,
        ("t", 1): 40,
        ("u", 0): 0,
    }


def test_read_time_check_of_a_planned_range() -> None:
    span = PartitionRange("t", 1, 50, 60)
    assert checked_span(span, (40, 90), fail_on_data_loss=True) == span
    with pytest.raises(DataLossError, match="checkpoint offset 50 is below"):
        checked_span(span, (55, 90), fail_on_data_loss=True)
    with pytest.raises(DataLossError, match="checkpoint offset 50 is past"):
        checked_span(span, (0, 3), fail_on_data_loss=True)
    assert checked_span(span, (55, 90), fail_on_data_loss=False) == PartitionRange("t", 1, 55, 60)
    assert checked_span(span, (70, 90), fail_on_data_loss=False).size == 0
    # Past the end when the read starts: nothing of this range exists; the next plan resumes.
    assert checked_span(span, (0, 3), fail_on_data_loss=False).size == 0


def test_fail_on_data_loss_option_defaults_to_true_like_the_builtin_source() -> None:
    base = {"kafka.bootstrap.servers": "h:1", "subscribe": "t"}
    assert parse_options(base).fail_on_data_loss is True
    assert parse_options({**base, "failondataloss": "False"}).fail_on_data_loss is False
    assert parse_options(stream_options(bootstrap="h:1", flavor="kafka", topics=["t"]))
    with pytest.raises(ValueError, match="failOnDataLoss"):
        parse_options({**base, "failOnDataLoss": "maybe"})


class FakeMetadataConsumer:
    """list_topics / get_watermark_offsets / offsets_for_times of a broker holding ``marks``;
    ``asked``: each ListOffsets request, as (side, partitions), side "low" or "high"."""

    def __init__(self, marks: dict[tuple[str, int], tuple[int, int]]) -> None:
        self.marks = marks
        self.asked: list[tuple[str, list[tuple[str, int]]]] = []

    def list_topics(self, timeout: float) -> Any:
        topics: dict[str, Any] = {}
        for topic, partition in self.marks:
            entry = topics.setdefault(topic, SimpleNamespace(error=None, partitions={}))
            entry.partitions[partition] = None
        return SimpleNamespace(topics=topics)

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.asked += [(side, [(tp.topic, tp.partition)]) for side in ("low", "high")]
        return self.marks[(tp.topic, tp.partition)]

    def offsets_for_times(self, partitions: list[Any], timeout: float) -> list[Any]:
        side = {EARLIEST: "low", LATEST: "high"}[partitions[0].offset]
        assert all(tp.offset == partitions[0].offset for tp in partitions)
        self.asked.append((side, [(tp.topic, tp.partition) for tp in partitions]))
        return [
            SimpleNamespace(
                topic=tp.topic,
                partition=tp.partition,
                offset=self.marks[(tp.topic, tp.partition)][side == "high"],
                error=None,
            )
            for tp in partitions
        ]

    def close(self) -> None:
        return None


def reader(marks: dict[tuple[str, int], tuple[int, int]], **options: str) -> CdcKafkaStreamReader:
    raw = {"kafka.bootstrap.servers": "h:1", "subscribe": "t", **options}
    result = CdcKafkaStreamReader(parse_options(raw))
    result._metadata_consumer = FakeMetadataConsumer(marks)  # type: ignore[assignment]
    return result


def test_planning_fails_when_the_topic_was_recreated_below_the_checkpoint() -> None:
    planner = reader({("t", 0): (0, 3)})
    checkpoint = to_offset_json({("t", 0): 120})
    with pytest.raises(DataLossError, match="topic 't' partition 0: checkpoint offset 120"):
        planner.latestOffset(checkpoint, ReadMaxRows(100))
    # After a restart Spark re-plans the uncommitted batch [120, 130) through partitions() alone.
    with pytest.raises(DataLossError, match="high watermark 3"):
        planner.partitions(checkpoint, to_offset_json({("t", 0): 130}))


def test_planning_continues_from_the_low_watermark_when_told_to() -> None:
    planner = reader({("t", 0): (0, 3), ("t", 1): (10, 30)}, failOnDataLoss="false")
    checkpoint = to_offset_json({("t", 0): 120, ("t", 1): 2})
    end = planner.latestOffset(checkpoint, ReadMaxRows(100))
    assert end == {"t": {"0": 3, "1": 30}}
    spans = planner.partitions(checkpoint, end)
    # Partition 1's start lies below its low watermark: planning did not ask that one, the
    # read does (`checked_span`), and starts at the low watermark.
    assert [p.span for p in spans if isinstance(p, KafkaPartitionRange)] == [
        PartitionRange("t", 0, 0, 3),
        PartitionRange("t", 1, 2, 30),
    ]
    below = PartitionRange("t", 1, 2, 30)
    assert checked_span(below, (10, 30), fail_on_data_loss=False) == PartitionRange("t", 1, 10, 30)
    # Re-planned after a restart (no latestOffset first): partitions() checks both itself.
    replanned = reader({("t", 0): (0, 3), ("t", 1): (10, 30)}, failOnDataLoss="false")
    spans = replanned.partitions(checkpoint, end)
    assert [p.span for p in spans if isinstance(p, KafkaPartitionRange)] == [
        PartitionRange("t", 0, 0, 3),
        PartitionRange("t", 1, 10, 30),
    ]


def test_planning_asks_each_partition_s_end_once_and_its_start_only_where_it_decides() -> None:
    """On the stand-in broker every ListOffsets costs in proportion to the partition's log:
    a trigger asked both watermarks of every partition in latestOffset and again in
    reportLatestOffset. Now one request holds every high watermark, the low one is asked only
    for partitions new since the checkpoint or past their end, and the report costs nothing."""
    marks = {("t", 0): (0, 50), ("t", 1): (0, 7), ("t", 2): (0, 3), ("t", 3): (5, 9)}
    planner = reader(marks)
    consumer = planner._metadata_consumer
    assert isinstance(consumer, FakeMetadataConsumer)
    begin = to_offset_json({("t", 0): 40, ("t", 1): 7, ("t", 2): 3})  # t-3 is new
    assert planner.latestOffset(begin, ReadAllAvailable()) == {
        "t": {"0": 50, "1": 7, "2": 3, "3": 9}
    }
    assert consumer.asked == [("high", sorted(marks)), ("low", [("t", 3)])]
    consumer.asked.clear()
    assert planner.reportLatestOffset() == {"t": {"0": 50, "1": 7, "2": 3, "3": 9}}
    assert consumer.asked == []
    # Without a latestOffset before it (never so in Spark), the report asks the broker.
    assert planner.reportLatestOffset() == {"t": {"0": 50, "1": 7, "2": 3, "3": 9}}
    assert consumer.asked == [("high", sorted(marks))]


def test_a_batch_s_partitions_reuse_its_planning_and_its_ranges_are_checked_when_read() -> None:
    """Spark asks partitions() for the batch latestOffset just planned: its watermarks are as
    fresh, so no request. A moving partition's low watermark is checked when its range is
    read (`consume_range`, in a task or on the driver), as it already was."""
    planner = reader({("t", 0): (7, 10)})
    consumer = planner._metadata_consumer
    assert isinstance(consumer, FakeMetadataConsumer)
    checkpoint = to_offset_json({("t", 0): 4})
    end = planner.latestOffset(checkpoint, ReadAllAvailable())
    assert end == {"t": {"0": 10}}
    consumer.asked.clear()
    spans = planner.partitions(checkpoint, end)
    assert consumer.asked == []
    assert [p.span for p in spans if isinstance(p, KafkaPartitionRange)] == [
        PartitionRange("t", 0, 4, 10)
    ]
    with pytest.raises(DataLossError, match="checkpoint offset 4 is below"):
        checked_span(PartitionRange("t", 0, 4, 10), (7, 10), fail_on_data_loss=True)
    # Another batch (or the same one re-planned after a restart) is looked up, and checked.
    with pytest.raises(DataLossError, match="checkpoint offset 4 is below"):
        planner.partitions(checkpoint, end)
    assert consumer.asked == [("low", [("t", 0)]), ("high", [("t", 0)])]


def test_planning_caps_a_backlog_from_the_checkpoint() -> None:
    planner = reader({("t", 0): (0, 100)})
    assert planner.latestOffset({"t": {"0": 10}}, ReadMaxRows(30)) == {"t": {"0": 40}}


def test_job_defaults_bound_the_micro_batch_and_fail_on_data_loss(tmp_path: Path) -> None:
    from cdc_sync.cli import build_parser, job_options
    from cdc_sync.job.runner import DEFAULT_MAX_OFFSETS_PER_TRIGGER, JobOptions

    defaults = JobOptions(checkpoint_dir=tmp_path / "c", warehouse=tmp_path / "w")
    assert defaults.max_offsets_per_trigger == DEFAULT_MAX_OFFSETS_PER_TRIGGER == 20_000
    assert defaults.fail_on_data_loss is True

    def parsed(*argv: str) -> JobOptions:
        args: argparse.Namespace = build_parser().parse_args(["run", "--mapping", "m", *argv])
        return job_options(args, defaults)

    assert parsed().max_offsets_per_trigger == 20_000
    assert parsed().fail_on_data_loss is True
    assert parsed("--max-offsets-per-trigger", "500").max_offsets_per_trigger == 500
    assert parsed("--max-offsets-per-trigger", "0").max_offsets_per_trigger is None
    assert parsed("--no-fail-on-data-loss").fail_on_data_loss is False
    assert parsed("--checkpoint", "elsewhere").checkpoint_dir == Path("elsewhere")


def offset_log(checkpoint: Path, batch_id: int, ends: dict[tuple[str, int], int]) -> None:
    """Spark's offset log entry of a batch: version, metadata, then the source's end offsets."""
    folder = checkpoint / "offsets"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / str(batch_id)).write_text(f"v1\n{{}}\n{json.dumps(to_offset_json(ends))}\n")


def test_the_driver_reads_a_rebased_partition_from_its_low_watermark_like_the_tasks(
    tmp_path: Path,
) -> None:
    """Topic t partition 0 was re-created (3 records) below the checkpoint (120); planning under
    failOnDataLoss=false rebased it, so batch 5 ends at 3. The driver's reader of small batches
    starts it at the low watermark, as the source's tasks do, not at 120 (which read nothing
    and committed 3: the new topic's records skipped)."""
    from cdc_sync.job.batch_phases import SmallBatches

    marks = {("t", 0): (0, 3), ("t", 1): (0, 35)}
    planner = reader(marks, failOnDataLoss="false")
    begin = {("t", 0): 120, ("t", 1): 30}
    end = from_offset_json(planner.latestOffset(to_offset_json(begin), ReadMaxRows(100)))
    assert end == {("t", 0): 3, ("t", 1): 35}
    offset_log(tmp_path, 4, begin)
    offset_log(tmp_path, 5, end)
    asked: list[list[tuple[str, int]]] = []

    def watermarks(options: Any, partitions: Any) -> dict[tuple[str, int], tuple[int, int]]:
        asked.append(list(partitions))
        return {tp: marks[tp] for tp in partitions}

    small = SmallBatches(planner.options, tmp_path, 1000, watermarks)
    expected = [PartitionRange("t", 0, 0, 3), PartitionRange("t", 1, 30, 35)]
    assert small._ranges(5) == expected
    assert asked == [[("t", 0)]]  # only the rebased partition: no broker call otherwise
    tasks = planner.partitions(to_offset_json(begin), to_offset_json(end))
    assert [p.span for p in tasks if isinstance(p, KafkaPartitionRange)] == expected
    # Re-planned after a restart, the new topic has grown past the old offset meanwhile: the
    # batch still starts at the low watermark (from 120 it would read nothing).
    marks[("t", 0)] = (0, 200)
    assert small._ranges(5) == expected
    tasks = planner.partitions(to_offset_json(begin), to_offset_json(end))
    assert [p.span for p in tasks if isinstance(p, KafkaPartitionRange)] == expected


def test_the_cli_prints_one_line_per_stale_consumer(capsys: pytest.CaptureFixture[str]) -> None:
    from cdc_sync.cli import _guarded
    from cdc_sync.job.stale_checkpoints import StaleCheckpoints

    def start() -> int:
        raise StaleCheckpoints(Path("/ck"), ["consumer search: it is ahead", "consumer redis: too"])

    assert _guarded(start) == 2
    assert (
        capsys.readouterr().err == "cdc-sync: consumer search: it is ahead\nconsumer redis: too\n"
    )
