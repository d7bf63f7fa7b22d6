"""The job's Spark session writes streaming checkpoints through Hadoop's FileSystem API (a
quarter of the FileContext API's cost a file, most of Spark's own time a batch under load:
job/spark_session.py), and a query resumes from them."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from cdc_sync.job.spark_session import (
    CHECKPOINT_MANAGER_SETTING,
    FILE_SYSTEM_CHECKPOINTS,
    use_file_system_checkpoints,
)

FILE_CONTEXT_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)


def run_until_caught_up(spark: SparkSession, inbox: Path, checkpoint: Path) -> dict[int, list[int]]:
    """Every file in `inbox` not yet read, as one query run on `checkpoint`: its batches' ids and
    the values each held."""
    seen: dict[int, list[int]] = {}

    def keep(batch: DataFrame, batch_id: int) -> None:
        seen[batch_id] = sorted(row.n for row in batch.collect())

    query = (
        spark.readStream.schema("n INT")
        .json(str(inbox))
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    return seen


def test_checkpoints_go_through_the_file_system_api_and_a_query_resumes_from_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    assert spark.conf.get(CHECKPOINT_MANAGER_SETTING) in FILE_SYSTEM_CHECKPOINTS
    inbox, checkpoint = tmp_path / "inbox", tmp_path / "checkpoint"
    inbox.mkdir()
    (inbox / "a.json").write_text("".join(json.dumps({"n": n}) + "\n" for n in (1, 2)))
    first = run_until_caught_up(spark, inbox, checkpoint)
    assert first == {0: [1, 2]}
    (inbox / "b.json").write_text(json.dumps({"n": 3}) + "\n")
    assert run_until_caught_up(spark, inbox, checkpoint) == {1: [3]}  # batch 0 not read again
    assert (checkpoint / "commits" / "1").is_file()
    assert not list(checkpoint.rglob("*.tmp"))  # each file written whole, then renamed


def test_a_checkpoint_manager_the_user_chose_is_kept(spark: SparkSession) -> None:
    chosen = spark.conf.get(CHECKPOINT_MANAGER_SETTING)
    assert chosen is not None
    spark.conf.set(CHECKPOINT_MANAGER_SETTING, FILE_CONTEXT_CHECKPOINTS)
    try:
        assert use_file_system_checkpoints(spark) is None
        assert spark.conf.get(CHECKPOINT_MANAGER_SETTING) == FILE_CONTEXT_CHECKPOINTS
    finally:
        spark.conf.set(CHECKPOINT_MANAGER_SETTING, chosen)
