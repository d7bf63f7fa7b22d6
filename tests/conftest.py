"""Service fixtures (one per service: env URL, else container, else local process)."""

import os
import sys

import pytest

# Spark workers must run this interpreter (pyarrow and the project are installed here).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from tests.fixtures.services import *  # noqa: F403

EXIT_STATUS = pytest.StashKey[int]()  # the session's, kept for `pytest_unconfigure`


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A session that ran the embedded capture in this process (JPype's JVM) ends here, its
    reports written, without the interpreter's teardown: JPype's own at exit races with the
    JVM's threads and log4j's shutdown and ends about one pytest run in twenty with a
    segmentation fault after every test passed (jpype-project/jpype#934, #1144; seen in CI,
    2026-11-29). The session's exit status is kept."""
    jpype = sys.modules.get("jpype")
    if jpype is None or not jpype.isJVMStarted():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(config.stash.get(EXIT_STATUS, 0))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[EXIT_STATUS] = int(exitstatus)
