"""Which failures of a consumer's query may pass by starting it again (job.consumer_job.may_pass):
also when raised in a Spark task, where the driver sees Spark's PythonException and the type
only in the task's traceback. Seen on a busy broker: an executor task's read that timed out
(KafkaRangeUnreachable) ended the whole job instead of restarting the consumer."""

from __future__ import annotations

import pytest
from pyspark.errors import PythonException

from cdc_sync.job.consumer_job import may_pass
from cdc_sync.source.offsets import PartitionRange
from cdc_sync.source.python_kafka import KafkaRangeUnreachable

pytestmark = pytest.mark.unit

TASK_TRACEBACK = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/work/sync_jobs/cdc_sync/source/python_kafka.py", line 324, in consume_range
    raise KafkaRangeUnreachable(span, next_offset, options.fetch_timeout_ms)
{last}
"""


def task_error(last: str) -> PythonException:
    return PythonException(message=TASK_TRACEBACK.format(last=last))


def test_a_broker_read_that_timed_out_may_pass_raised_here_or_in_a_task() -> None:
    here = KafkaRangeUnreachable(PartitionRange("t", 0, 0, 10), 0, 60_000)
    assert may_pass(here)
    assert may_pass(task_error(f"cdc_sync.source.python_kafka.KafkaRangeUnreachable: {here}"))
    assert may_pass(task_error("cdc_sync.sinks.base.TransientSinkError: search: timed out"))


def test_an_error_of_the_jobs_own_in_a_task_does_not_pass() -> None:
    assert not may_pass(ValueError("a policy says fail"))
    assert not may_pass(task_error("ValueError: unexpected schema"))
    # A passing error named earlier in the traceback, a terminal one raised last.
    chained = "cdc_sync.sinks.base.TransientSinkError: x\n\nDuring handling...\nKeyError: 'id'"
    assert not may_pass(task_error(chained))
