"""Spark's local Python processes through the job's launcher (job.spark_session.worker_python):
the installed pyspark with its cached bytecode, not Spark's zips compiled at every start (a
query's source process must connect back within Spark's fixed 10 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from cdc_sync.job.spark_session import worker_python

pytestmark = pytest.mark.unit


def test_the_launcher_drops_sparks_zips_and_keeps_the_rest_of_the_path(tmp_path: Path) -> None:
    zips = Path(pyspark.__file__).parent / "python" / "lib"
    path = [str(zips / "pyspark.zip"), str(tmp_path), *map(str, zips.glob("py4j-*.zip"))]
    show = "import os, pyspark; print(os.environ['PYTHONPATH']); print(pyspark.__file__)"
    shown = subprocess.run(
        [worker_python(), "-c", show],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert shown == [str(tmp_path), pyspark.__file__]


def test_the_launcher_runs_this_interpreter_and_is_written_once() -> None:
    first, again = worker_python(), worker_python()
    assert first == again and os.access(first, os.X_OK)
    ran = subprocess.run(
        [first, "-c", "import sys; print(sys.executable)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(ran.stdout.strip()).resolve() == Path(sys.executable).resolve()
