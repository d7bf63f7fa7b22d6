"""Spark's built-in ``format("kafka")`` source, used when the spark-sql-kafka jar is present.

Availability is probed by building a (lazy) kafka stream and forcing its analysis via
``.schema``: that resolves the data source provider without touching a broker, and works the
same on classic Spark and Spark Connect (no ``spark._jvm``, which Connect does not have). A
missing jar surfaces as a structured error condition (see NOT_FOUND_CONDITIONS).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession

from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.source.options import BOOTSTRAP, FLAVOR, KAFKA_PREFIX

log = logging.getLogger(__name__)

BUILTIN_FORMAT = "kafka"
# Spark 4.2 reports a missing kafka provider as _LEGACY_ERROR_TEMP_1140 (its special
# "deploy the Kafka integration" message); other unknown formats as DATA_SOURCE_NOT_FOUND.
NOT_FOUND_CONDITIONS = frozenset({"_LEGACY_ERROR_TEMP_1140", "DATA_SOURCE_NOT_FOUND"})
# consumer_config() settings that mean the same in the Java client and that Spark's kafka
# source accepts (it rejects group.id management, auto.offset.reset and enable.auto.commit,
# which it owns itself).
JAVA_COMPATIBLE_SETTINGS = ("isolation.level", "fetch.max.bytes", "max.partition.fetch.bytes")


def builtin_kafka_available(spark: SparkSession) -> bool:
    try:
        probe = (
            spark.readStream.format(BUILTIN_FORMAT)
            .option(BOOTSTRAP, "127.0.0.1:9")
            .option("subscribe", "cdc-sync-availability-probe")
            .load()  # classic Spark resolves the provider here ...
        )
        probe.schema  # noqa: B018 - ... Spark Connect only when the schema is asked for
    except AnalysisException as error:
        log.debug("built-in kafka source probe: %s", error.getCondition())
        if error.getCondition() in NOT_FOUND_CONDITIONS:
            return False
        raise
    return True


def builtin_options(options: Mapping[str, str]) -> dict[str, str]:
    """Map ``cdc_kafka`` options onto the built-in source's.

    Stream options (subscribe, subscribePattern, startingOffsets, maxOffsetsPerTrigger,
    failOnDataLoss) have the same names and defaults in both, so they pass through as given.
    The flavour becomes the Java-compatible part of consumer_config().
    """
    flavor = next((v for k, v in options.items() if k.lower() == FLAVOR), "kafka")
    bootstrap = next(v for k, v in options.items() if k.lower() == BOOTSTRAP)
    mapped = {
        f"{KAFKA_PREFIX}{name}": str(value)
        for name, value in consumer_config(bootstrap, flavor).items()
        if name in JAVA_COMPATIBLE_SETTINGS
    }
    # cdc.kafka.* settings belong to cdc_kafka alone.
    mapped.update({k: v for k, v in options.items() if not k.lower().startswith("cdc.kafka.")})
    return mapped


def builtin_stream(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    return spark.readStream.format(BUILTIN_FORMAT).options(**builtin_options(options)).load()
