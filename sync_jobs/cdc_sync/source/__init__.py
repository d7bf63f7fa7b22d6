"""The CDC topics as a Spark stream with the built-in kafka source's schema.

``kafka_stream`` uses Spark's built-in ``format("kafka")`` when its jar is on the classpath
(production) and otherwise the ``cdc_kafka`` Python Data Source (local stack, no Maven).
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame, SparkSession

from cdc_sync.source.builtin import builtin_kafka_available, builtin_stream
from cdc_sync.source.options import (
    BACKLOG_ORDER,
    BOOTSTRAP,
    FAIL_ON_DATA_LOSS,
    FLAVOR,
    LOG_RELAY,
    MAX_OFFSETS_PER_TRIGGER,
    SOURCE_NAME,
    SUBSCRIBE,
    SUBSCRIBE_PATTERN,
    parse_options,
)
from cdc_sync.source.python_kafka import KAFKA_SCHEMA, CdcKafkaDataSource

__all__ = [
    "KAFKA_SCHEMA",
    "CdcKafkaDataSource",
    "kafka_stream",
    "stream_options",
    "stream_with_options",
]

log = logging.getLogger(__name__)


def stream_options(
    *,
    bootstrap: str,
    flavor: str,
    topics: list[str] | None = None,
    pattern: str | None = None,
    max_offsets_per_trigger: int | None = None,
    fail_on_data_loss: bool = True,
    backlog_order: str | None = None,
    log_relay: tuple[str, int] | None = None,
) -> dict[str, str]:
    """Options understood by both sources (validated here, once); `backlog_order` and
    `log_relay` are the Python source's alone (`BACKLOG_ORDER`: the built-in source shares a
    capped batch proportionally; `LOG_RELAY`: where its worker processes' log records go)."""
    options = {
        BOOTSTRAP: bootstrap,
        FLAVOR: flavor,
        "startingOffsets": "earliest",
        FAIL_ON_DATA_LOSS: str(fail_on_data_loss).lower(),
    }
    if topics is not None:
        options[SUBSCRIBE] = ",".join(topics)
    if pattern is not None:
        options[SUBSCRIBE_PATTERN] = pattern
    if max_offsets_per_trigger is not None:
        options[MAX_OFFSETS_PER_TRIGGER] = str(max_offsets_per_trigger)
    if backlog_order is not None:
        options[BACKLOG_ORDER] = backlog_order
    if log_relay is not None:
        options[LOG_RELAY] = f"{log_relay[0]}:{log_relay[1]}"
    parse_options(options)
    return options


def kafka_stream(
    spark: SparkSession,
    *,
    bootstrap: str,
    flavor: str,
    topics: list[str] | None = None,
    pattern: str | None = None,
    max_offsets_per_trigger: int | None = None,
    fail_on_data_loss: bool = True,
) -> DataFrame:
    options = stream_options(
        bootstrap=bootstrap,
        flavor=flavor,
        topics=topics,
        pattern=pattern,
        max_offsets_per_trigger=max_offsets_per_trigger,
        fail_on_data_loss=fail_on_data_loss,
    )
    return stream_with_options(spark, options)


def stream_with_options(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    """The stream for options from `stream_options`: the built-in source when its jar is there."""
    if builtin_kafka_available(spark):
        log.info("kafka source: Spark built-in format('kafka')")
        return builtin_stream(spark, options)
    log.info("kafka source: %s Python data source (built-in kafka jar not found)", SOURCE_NAME)
    return python_stream(spark, options)


def python_stream(spark: SparkSession, options: dict[str, str]) -> DataFrame:
    spark.dataSource.register(CdcKafkaDataSource)
    return spark.readStream.format(SOURCE_NAME).options(**options).load()
