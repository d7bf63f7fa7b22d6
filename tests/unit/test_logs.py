"""The quiet console: one line per record, client libraries' reports in the log file only."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_sync.core.logs import setup_logging

pytestmark = pytest.mark.unit


@pytest.fixture
def quiet(tmp_path: Path) -> Iterator[Path]:
    setup_logging(verbose=False, directory=tmp_path)
    yield tmp_path / "job.log"
    setup_logging(verbose=True)


def test_an_error_prints_one_line_and_its_traceback_goes_to_the_file(
    quiet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        raise TimeoutError("timed out\nsecond line")
    except TimeoutError:
        logging.getLogger("cdc_sync.job.x").warning("writing failed", exc_info=True)
    console = capsys.readouterr().err.splitlines()
    assert len(console) == 1
    assert console[0].endswith(f"writing failed (TimeoutError: timed out; traceback in {quiet})")
    assert "Traceback (most recent call last)" in quiet.read_text()


@pytest.mark.parametrize("name", ["opensearch", "elastic_transport.node_pool", "urllib3.pool"])
def test_a_client_librarys_warning_goes_to_the_file_at_debug(
    quiet: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    logging.getLogger(name).warning("POST /_bulk [status:N/A request:30.0s]")
    logging.getLogger(name).error("a client error stays an error")
    assert capsys.readouterr().err.count("\n") == 1  # the error only
    log = quiet.read_text()
    assert f"DEBUG {name}: POST /_bulk" in log
    assert f"ERROR {name}: a client error stays an error" in log
