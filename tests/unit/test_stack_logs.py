"""Which line of a local service's log says why it did not come up (`reason_line`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_sync.localstack.connect import worker_properties
from cdc_sync.localstack.process import START_MARK, reason_line

pytestmark = pytest.mark.unit

# Lines of the Kafka Connect worker's log on noida before the fix (trimmed), after an earlier
# start's part whose ERROR must not be named.
CONNECT_LOG = f"""{START_MARK}connect at 2026-11-27T01:00:00Z: java ...
[2026-11-27 01:00:03,000] ERROR an earlier start's failure (org.example.Old)
{START_MARK}connect at 2026-11-27T01:55:20Z: java -Xmx768m ...
[2026-11-27 01:55:29,100] INFO Kafka Connect started (org.apache.kafka.connect.runtime.Connect)
[2026-11-27 01:55:30,062] ERROR [Worker clientId=connect-1, groupId=g] JoinGroup failed due to \
fatal error: The session timeout is not within the range allowed by the broker (as configured by \
group.min.session.timeout.ms and group.max.session.timeout.ms). (org.apache.kafka.connect.runtime.\
distributed.WorkerCoordinator)
[2026-11-27 01:55:30,063] ERROR [Worker clientId=connect-1, groupId=g] Uncaught exception in \
herder work thread, exiting:  (org.apache.kafka.connect.runtime.distributed.DistributedHerder)
org.apache.kafka.common.errors.InvalidSessionTimeoutException: The session timeout is not within \
the range allowed by the broker
[2026-11-27 01:55:31,215] INFO Kafka Connect stopping (org.apache.kafka.connect.runtime.Connect)
"""

REDIS_LOG = f"""{START_MARK}redis at 2026-11-27T02:00:00Z: redis-server --port 6390
81:C 27 Nov 2026 02:00:00.101 # oO0OoO0OoO0Oo Redis is starting oO0OoO0OoO0Oo
81:M 27 Nov 2026 02:00:00.102 # Warning: Could not create server TCP listening socket \
127.0.0.1:6390: bind: Address already in use
81:M 27 Nov 2026 02:00:00.102 # Failed listening on port 6390 (tcp), aborting.
"""


def test_the_first_failure_of_this_start_is_named() -> None:
    line = reason_line(CONNECT_LOG)
    assert line is not None
    assert "JoinGroup failed due to fatal error: The session timeout" in line
    assert "earlier start" not in line


def test_without_a_failure_level_the_last_line_says_why() -> None:
    assert reason_line(REDIS_LOG) == (
        "81:M 27 Nov 2026 02:00:00.102 # Failed listening on port 6390 (tcp), aborting."
    )


def test_an_empty_start_names_nothing_and_a_long_line_is_cut() -> None:
    assert reason_line(f"{START_MARK}x at now: x\n\n") is None
    assert reason_line("") is None
    line = reason_line("ERROR " + "x" * 1000)
    assert line is not None and len(line) == 400 and line.endswith("...")


@pytest.mark.parametrize(("flavor", "session_ms"), [("tansu", 3000), ("noida", 6000)])
def test_the_worker_session_timeout_is_one_each_broker_accepts(
    flavor: str, session_ms: int
) -> None:
    """noida (as Kafka) refuses a JoinGroup below 6000 ms, probed with librdkafka: 5999 refused
    (INVALID_SESSION_TIMEOUT), 6000 joined. Tansu's joins take about half of it."""
    properties = worker_properties("127.0.0.1:9092", flavor, 8083, Path("/h"), "g")
    assert f"session.timeout.ms={session_ms}\n" in properties
