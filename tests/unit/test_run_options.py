"""`cdc-sync run` flags reach the job's options: the value given, the job's default when absent,
and a value the flag refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_sync.cli import build_parser, job_options
from cdc_sync.documents import BULKS_IN_FLIGHT
from cdc_sync.job.runner import JobOptions

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("flag", "given", "field", "expected", "default"),
    [
        ("--maintain-every", "50", "maintain_every_batches", 50, None),
        ("--document-bulks", "4", "document_bulks_in_flight", 4, BULKS_IN_FLIGHT),
    ],
)
def test_run_takes_the_flag(
    tmp_path: Path, flag: str, given: str, field: str, expected: Any, default: Any
) -> None:
    defaults = JobOptions(checkpoint_dir=tmp_path, warehouse=tmp_path)
    parser = build_parser()
    args = parser.parse_args(["run", "--mapping", "m.yaml", flag, given])
    assert getattr(job_options(args, defaults), field) == expected
    args = parser.parse_args(["run", "--mapping", "m.yaml"])
    assert getattr(job_options(args, defaults), field) == default
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--mapping", "m.yaml", flag, "0"])
