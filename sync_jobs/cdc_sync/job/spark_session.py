"""One local-or-cluster Spark session for the sync job, bound to loopback when local."""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from py4j.protocol import Py4JJavaError
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
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


def spark_settings(app_name: str, shuffle_partitions: int) -> dict[str, str]:
    master = spark_master(os.environ)
    settings = {
        "spark.app.name": app_name,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        # Stage progress bars interleave with the job's own per-batch lines on the console.
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # One streaming query per consumer of the log (job.consumers), each in a pool of its
        # own: a large batch of one consumer shares the executors instead of queueing the
        # others' tasks behind its own.
        "spark.scheduler.mode": "FAIR",
        # Each query starts a Python process for its source (Python Data Source) at once; a
        # busy machine took longer than the default 15 s for them to connect back (seen with
        # four queries starting under load), which failed the query.
        "spark.python.authenticate.socketTimeout": "120s",
    }
    if master is not None:
        settings["spark.master"] = master
        if master.startswith("local"):
            settings["spark.driver.host"] = "127.0.0.1"
            settings["spark.driver.bindAddress"] = "127.0.0.1"
    packages = os.environ.get(PACKAGES_VAR)
    if packages:
        settings["spark.jars.packages"] = packages
        if "delta" in packages:
            settings["spark.sql.extensions"] = "io.delta.sql.DeltaSparkSessionExtension"
            settings["spark.sql.catalog.spark_catalog"] = (
                "org.apache.spark.sql.delta.catalog.DeltaCatalog"
            )
    return settings


def build_spark(
    app_name: str = "cdc-sync",
    shuffle_partitions: int = 2,
    jvm_log: Path | None = None,
    driver_memory: str | None = None,
) -> SparkSession:
    """`jvm_log`: where the driver JVM's stdout and stderr go (Spark's log4j WARN lines, its
    start-up banner, JVM warnings printed before log4j is configured); None leaves them on this
    process's console. `driver_memory`: the driver JVM's heap (`spark.driver.memory`, e.g.
    "2g"; Spark's default 1g when None). Both apply only when this call starts the JVM (not
    under spark-submit, not beside a running session)."""
    # Workers must run the same interpreter (pyarrow, the project) as the driver; locally through
    # the launcher that lets them import the installed pyspark (`worker_python`).
    if os.environ.get("PYSPARK_PYTHON", sys.executable) == sys.executable:
        local = (spark_master(os.environ) or "").startswith("local")
        os.environ["PYSPARK_PYTHON"] = worker_python() if local else sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    conf = SparkConf().setAll(list(spark_settings(app_name, shuffle_partitions).items()))
    if driver_memory is not None:
        conf.set("spark.driver.memory", driver_memory)  # read by spark-submit, before the JVM
    if jvm_log is not None and SparkContext._gateway is None and spark_master(os.environ):
        _start_jvm_logging_to(conf, jvm_log)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    use_file_system_checkpoints(spark)
    _quiet_accumulator_server(spark.sparkContext)
    return spark


# Spark 4.2 moved the class into `checkpointing`; pyproject allows pyspark 4.0 and 4.1 as well.
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)
CHECKPOINT_MANAGER_SETTING = "spark.sql.streaming.checkpointFileManagerClass"


def use_file_system_checkpoints(spark: SparkSession) -> str | None:
    """Each micro-batch writes two checkpoint files (its offsets, then its commit); through
    Hadoop's FileContext API, Spark's default, each cost 34-37 ms on this project's machine with
    the file system idle, through its FileSystem API 9 ms (an empty `rate` query at 0.25 s
    triggers, medians of 40 batches; 140-170 ms against 10-30 ms with the job's four consumers
    on two cores: most of Spark's own time a batch, `make bench`). Both write a
    temporary file and rename it over; the FileSystem API is safe where its rename is atomic
    (Spark falls back to it where FileContext is missing, with that warning), which POSIX's
    `rename` is: so it is chosen when checkpoints resolve to the local file system (a path
    without a scheme, `fs.defaultFS` local). Returns the class chosen (None: Spark's default
    kept: another file system, a class set by the user, or a Spark without either name)."""
    if spark.conf.get(CHECKPOINT_MANAGER_SETTING, None):
        return None
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    default_fs = spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS", "file:///")
    if not str(default_fs).startswith("file:"):
        return None
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for name in FILE_SYSTEM_CHECKPOINTS:
        try:
            jvm.java.lang.Class.forName(name, False, loader)
        except Py4JJavaError:  # ClassNotFoundException: not this Spark's name for it
            continue
        spark.conf.set(CHECKPOINT_MANAGER_SETTING, name)
        return name
    return None


def _quiet_accumulator_server(context: SparkContext) -> None:
    """PySpark's accumulator server (a socket server in this process that Spark's JVM connects
    to) prints a whole EOFError traceback to stderr when the JVM's connection ends without a
    goodbye: what a stop signal sent to the whole process group does (systemd's default
    KillMode, a terminal's Ctrl-C reaching the JVM). The JVM ending is the stop, not an error
    an operator can act on: one line to the log file instead."""
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = _accumulator_connection_ended  # shadows BaseServer.handle_error


def _accumulator_connection_ended(_request: object, client_address: object) -> None:
    log.debug("Spark's accumulator connection from %s ended: %r", client_address, sys.exc_info()[1])


# Spark puts its own pyspark.zip (and py4j's) first on its Python processes' path; imported from
# a zip, pyspark is compiled from source at every start (~0.9 s of CPU against ~0.3 s from the
# installed package's cached bytecode, measured). A query's source process must connect back to
# Spark within a fixed 10 s, which a loaded machine missed (8 busy processes: 4 of 12 query
# starts failed; through this launcher 0 of 12). The installed pyspark is the same release.
LAUNCHER = """#!/bin/sh
# cdc-sync: Spark's Python processes without Spark's zips on PYTHONPATH (job/spark_session.py)
PYTHONPATH=$(printf '%s' "$PYTHONPATH" | tr ':' '\\n' \\
    | grep -v -E '/pyspark[.]zip$|/py4j-[^/]*[.]zip$' | paste -sd: -)
export PYTHONPATH
exec {python} "$@"
"""


def worker_python(executable: str = sys.executable) -> str:
    """The launcher of `executable` for Spark's local Python processes (`LAUNCHER`), written
    once per interpreter under the temp directory."""
    text = LAUNCHER.format(python=shlex.quote(executable))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"cdc-sync-{os.getuid()}" / f"python-{digest}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temp, 0o755)
        os.replace(temp, path)  # whole and executable, or not there
    return str(path)


def _start_jvm_logging_to(conf: SparkConf, jvm_log: Path) -> None:
    """Launch the driver JVM with its output appended to `jvm_log` (pyspark's documented
    `popen_kwargs` hook), then create the context on it."""
    jvm_log.parent.mkdir(parents=True, exist_ok=True)
    with jvm_log.open("ab") as output:  # the JVM keeps its own copy of the descriptor
        gateway = launch_gateway(conf, popen_kwargs={"stdout": output, "stderr": output})
    SparkContext(conf=conf, gateway=gateway)
