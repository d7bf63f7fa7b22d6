"""One local-or-cluster Spark session for the sync job, bound to loopback when local."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

MASTER_VAR = "CDC_SYNC_SPARK_MASTER"
PACKAGES_VAR = "CDC_SYNC_SPARK_PACKAGES"  # e.g. spark-sql-kafka and delta-spark coordinates


def spark_master(environ: Mapping[str, str]) -> str | None:
    """`CDC_SYNC_SPARK_MASTER` if set; else, under `spark-submit` (which started the JVM and
    passes its gateway), None: its `--master` stands; else `local[2]`."""
    if environ.get(MASTER_VAR):
        return environ[MASTER_VAR]
    if environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    return "local[2]"


def build_spark(app_name: str = "cdc-sync", shuffle_partitions: int = 2) -> SparkSession:
    # Workers must run the same interpreter (pyarrow, the project) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = spark_master(os.environ)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    builder = (
        builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        # Stage progress bars interleave with the job's own per-batch lines on the console.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    if master is not None and master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    packages = os.environ.get(PACKAGES_VAR)
    if packages:
        builder = builder.config("spark.jars.packages", packages)
        if "delta" in packages:
            builder = builder.config(
                "spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension"
            ).config(
                "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
            )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
