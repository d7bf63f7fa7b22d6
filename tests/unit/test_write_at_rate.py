"""The soak's paced writer (tests/adversarial/scenarios.py): the search freeze writes at a rate
the machine applies, so its check measures whether a sink waits for search, not throughput."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, cast

import pytest

from tests.adversarial.scenarios import write_at_rate

pytestmark = pytest.mark.unit


class CountingWorkload:
    """Each operation commits three changes (a workload operation commits one or more)."""

    def __init__(self) -> None:
        self.changes = 0

    def run(self, count: int) -> Counter[str]:
        self.changes += 3 * count
        return Counter(op=count)


def written_in(seconds: float, rate: float) -> int:
    workload = CountingWorkload()
    stop = threading.Event()
    writer = threading.Thread(target=write_at_rate, args=(cast(Any, workload), rate, stop))
    writer.start()
    time.sleep(seconds)
    stop.set()
    writer.join(timeout=5)
    assert not writer.is_alive()
    return workload.changes


def test_the_writer_holds_the_rate_on_average() -> None:
    changes = written_in(1.0, rate=60.0)

    # 60 due in the second, overshooting by at most one operation (3 changes) per catch-up.
    assert 45 <= changes <= 66, changes
