"""How long the capture holds a change: Postgres commit -> acknowledged by the broker.

    .venv/bin/python benchmarks/probe_capture_latency.py [--broker tansu] [--poll-ms 10,50]
        [--rates 20,100] [--seconds 20] [--output FILE]

A local stack of its own per `--poll-ms` value (Postgres, the broker), the bench's shop rows
(500 customers, 5,000 orders), the demo connector's embedded capture with Debezium's
`poll.interval.ms` set to that value; after its snapshot, the bench's mixed workload at each
rate. Every record the capture publishes is timed from its transaction's commit
(`source.ts_ms`, Postgres's clock) to the handler's call (Debezium's hand-over) and to the
broker's acknowledgement of its publish (`publish_batch` returning). Prints p50/p99 per step
(p95 and max in the JSON), with the gap between publishes and records per publish. (The run
below took its p99s as `statistics.quantiles`' default, exclusive, method; since, as the bench's
latency figures: `e2ebench.sampler.percentiles`.)

2026-11-29, the build machine idle, Tansu (JSON in
benchmarks/results/probe-capture-latency-2026-11-29.json): commit -> acknowledged p50/p99
11 / 23 ms at 20 changes/s and 13 / 27 ms at 100/s with `poll.interval.ms=10`; 53 / 99 and
54 / 104 ms with 50 (the shipped connector's value before): Debezium hands a change on one
poll interval after it arrives, the publish itself takes about 1 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # tests.*, e2ebench.*

from e2ebench.load import MixedWorkload, load_rows  # noqa: E402
from e2ebench.pipeline import CONNECTOR, wait_captured  # noqa: E402
from e2ebench.report import output_path, run_header  # noqa: E402
from e2ebench.sampler import percentiles  # noqa: E402

from cdc_sync.connectors.engine import CaptureEngine  # noqa: E402
from cdc_sync.connectors.publisher import KafkaPublisher, Record  # noqa: E402
from cdc_sync.localstack.stack import LocalStack  # noqa: E402

log = logging.getLogger("probe_capture_latency")
CUSTOMERS, ORDERS = 500, 5_000


class TimedPublishes:
    """Wraps a publisher's `publish_batch`: each publish's start, seconds and its records'
    commit times (ms)."""

    def __init__(self, publisher: KafkaPublisher) -> None:
        self.publishes: list[tuple[float, float, int, list[int]]] = []
        self._publish = publisher.publish_batch
        publisher.publish_batch = self.publish_batch  # type: ignore[method-assign]

    def publish_batch(self, records: Sequence[Record]) -> None:
        started = time.time()
        commits = [c for c in (commit_ms(r.value) for r in records) if c is not None]
        self._publish(records)
        self.publishes.append((started, time.time() - started, len(records), commits))


def commit_ms(value: bytes | None) -> int | None:
    """A Debezium change's `source.ts_ms` (its transaction's commit); None for others."""
    if not value or b'"source"' not in value:
        return None
    payload = json.loads(value)
    payload = payload.get("payload", payload)
    source = payload.get("source") if isinstance(payload, dict) else None
    return int(source["ts_ms"]) if isinstance(source, dict) and "ts_ms" in source else None


def quantiles(values: list[float]) -> dict[str, float | None]:
    """p50/p95/p99/max in ms as the bench's latency figures (`sampler.percentiles`), rounded."""
    return {k: None if v is None else round(v, 1) for k, v in percentiles(values).items()}


def step(timed: TimedPublishes, pg_url: str, rate: float, seconds: float) -> dict[str, Any]:
    timed.publishes.clear()
    workload = MixedWorkload(pg_url, CUSTOMERS, ORDERS, 0, seed=int(time.time()))
    try:
        workload.run(rate, seconds, threading.Event())
    finally:
        workload.close()
    time.sleep(2.0)  # the last changes' publishes
    found = list(timed.publishes)
    starts = [p[0] for p in found]
    return {
        "rate": rate,
        "publishes": len(found),
        "records_per_publish": statistics.median([p[2] for p in found]) if found else 0,
        "gap_between_publishes_ms": quantiles(
            [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
        ),
        "publish_ms": quantiles([p[1] * 1000 for p in found]),
        "commit_to_handler_ms": quantiles([p[0] * 1000 - c for p in found for c in p[3]]),
        "commit_to_acknowledged_ms": quantiles(
            [(p[0] + p[1]) * 1000 - c for p in found for c in p[3]]
        ),
    }


def run(broker: str, poll_ms: int, rates: Sequence[float], seconds: float, base: Path) -> Any:
    run_dir = base / f"poll-{poll_ms}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh database and broker each time
    stack = LocalStack(run_dir / "stack", broker=broker, with_connect=False)
    urls = stack.start()
    capture = None
    try:
        load_rows(urls.pg_url, CUSTOMERS, ORDERS)
        connections = urls.connections(run_dir / "warehouse")
        overrides = {"poll.interval.ms": str(poll_ms)}
        capture = CaptureEngine.from_file(CONNECTOR, connections, run_dir / "capture", overrides)
        capture.start()
        wait_captured(capture)
        timed = TimedPublishes(capture.publisher)
        steps = []
        for rate in rates:
            found = step(timed, urls.pg_url, rate, seconds)
            log.info("poll.interval.ms=%d: %s", poll_ms, json.dumps(found))
            steps.append(found)
        return {"poll_interval_ms": poll_ms, "steps": steps}
    finally:
        if capture is not None:
            capture.stop()
        stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="tansu", choices=["tansu", "noida"])
    parser.add_argument("--poll-ms", default="10,50", help="poll.interval.ms values (10,50)")
    parser.add_argument("--rates", default="20,100", help="changes/s (20,100)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per rate (20)")
    parser.add_argument("--state-dir", type=Path, default=ROOT / ".cdc-sync" / "probe-capture")
    parser.add_argument("--output", help="JSON path")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    rates = [float(r) for r in args.rates.split(",")]
    result = {**run_header(args), "runs": []}
    for poll_ms in (int(p) for p in args.poll_ms.split(",")):
        result["runs"].append(run(args.broker, poll_ms, rates, args.seconds, args.state_dir))
    output = output_path(args.output, "probe-capture-latency")
    output.write_text(json.dumps(result, indent=2, default=str))
    print(
        f"\n{'poll ms':>8} {'rate':>6} {'publishes':>9} {'rec/pub':>7} "
        f"{'commit->acked p50/p99 ms':>25} {'gap p50/p99 ms':>15}"
    )
    for found in result["runs"]:
        for s in found["steps"]:
            acked, gap = s["commit_to_acknowledged_ms"], s["gap_between_publishes_ms"]
            print(
                f"{found['poll_interval_ms']:>8} {s['rate']:>6.0f} {s['publishes']:>9} "
                f"{s['records_per_publish']:>7} "
                f"{acked['p50']!s:>12} / {acked['p99']!s:<10} "
                f"{gap['p50']!s:>7} / {gap['p99']!s}"
            )
    print(f"JSON: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
