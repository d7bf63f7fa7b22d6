"""`cdc-sync wait` as a script sees it: exit 0 every time it printed "reached".

Reading Delta leaves Arrow's C++ thread pools running; the interpreter's teardown could then
abort the process (SIGABRT, "terminate called without an active exception", exit -6) after the
report was printed: 6 of 60 runs under load before the CLI ended `wait` with `os._exit`.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cdc_sync.mapping import DeltaRoute
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.search import SearchSink
from tests.changes import products_route

pytestmark = pytest.mark.integration

RUNS = 20
AT_ONCE = 4  # load makes the teardown race likelier, and keeps the test under a minute


def test_wait_exits_0_every_time_it_reached(
    search_url: str, redis_url: str, tmp_path: Path
) -> None:
    route = dataclasses.replace(products_route(), delta=DeltaRoute("shop", "products"))
    topic = f"exit{os.getpid()}.shop.products"
    warehouse = tmp_path / "warehouse"
    for sink in (
        SearchSink("opensearch", search_url, 3600),
        RedisSink(redis_url, 3600),
        DeltaSink(warehouse, 3600),
    ):
        sink.record_watermark({topic: route}, 1000)
        sink.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_SYNC_")}
    env |= {
        "CDC_SYNC_SEARCH_URL": search_url,
        "CDC_SYNC_REDIS_URL": redis_url,
        "CDC_SYNC_WAREHOUSE": str(warehouse),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }

    def run(index: int) -> subprocess.CompletedProcess[str]:
        # Half read Delta only (the reader whose threads outlive the command), half every sink.
        sinks = ["--sink", "delta"] if index % 2 else []
        return subprocess.run(
            [sys.executable, "-m", "cdc_sync.cli", "wait", "--lsn", "0/3E8", *sinks],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    with ThreadPoolExecutor(AT_ONCE) as pool:
        results = list(pool.map(run, range(RUNS)))
    failed = [(r.returncode, r.stdout[:40], r.stderr[-200:]) for r in results if r.returncode]
    assert failed == []
    assert all(r.stdout.startswith("reached 0/3E8") for r in results)
