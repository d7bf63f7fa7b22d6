"""What a small batch's read of one partition costs: with the watermarks asked first, or not.

    .venv/bin/python benchmarks/probe_range_reads.py [--broker tansu] [--records 60000]
        [--reads 20] [--tail 25] [--output FILE]

A private broker (the local stack's), one partition filled with `--records` records of 1.5 kB,
then `--reads` times: `--tail` new records produced, and the range of them read with the
source's own `read_range_arrow`, as the driver reads a small batch (read ahead on, as
`RecentReads` asks): once asking for the partition's watermarks before the fetch
(`consume_checked_range`, how every read went before) and once fetching at once
(`consume_range`). Prints the median and slowest read and the broker's CPU milliseconds per
read, each way.

2026-11-27, the build machine idle (JSON in benchmarks/results/probe-range-reads-2026-11-27.json):
Tansu 135 ms a read with the watermarks first, 47 ms fetching at once (broker CPU 149 and 45 ms
a read); noida 9.0 and 8.7 ms. A read ahead that asked for 1,000 records past the range's end
had cost every read the 50 ms poll timeout (52.7 ms on noida) until it asked for the range's
own records first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for folder in ("sync_jobs", "infra", "connectors"):
    sys.path.insert(0, str(ROOT / folder))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cdc_sync.core.kafka_clients import admin_config, producer_config  # noqa: E402
from cdc_sync.localstack.process import stop_pid  # noqa: E402
from cdc_sync.localstack.services import start_broker  # noqa: E402
from cdc_sync.source import stream_options  # noqa: E402
from cdc_sync.source.offsets import PartitionRange  # noqa: E402
from cdc_sync.source.options import parse_options  # noqa: E402
from cdc_sync.source.python_kafka import (  # noqa: E402
    RangeConsumer,
    Reach,
    consume_checked_range,
    consume_range,
    read_range_arrow,
)
from cdc_sync.source.recent_reads import READ_AHEAD  # noqa: E402

TOPIC = "probe"
PAYLOAD = os.urandom(1500)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Partition:
    """The probe's partition: records produced so far (its end offset)."""

    def __init__(self, producer: Producer, end: int) -> None:
        self.producer = producer
        self.end = end

    def grow(self, records: int) -> tuple[int, int]:
        for _ in range(records):
            self.producer.produce(TOPIC, key=b"tail", value=PAYLOAD)
        self.producer.flush(60)
        self.end += records
        return self.end - records, self.end


def timed_reads(
    partition: Partition,
    broker_pid: int,
    reads: int,
    tail: int,
    gap: float,
    read: Callable[[int, int], int],
) -> dict[str, float]:
    """`reads` times: `tail` records produced, then read([start, end)) timed."""
    seconds: list[float] = []
    cpu = 0.0
    for _ in range(reads):
        time.sleep(gap)
        start, end = partition.grow(tail)
        before, started = cpu_seconds(broker_pid), time.perf_counter()
        got = read(start, end)
        seconds.append(time.perf_counter() - started)
        cpu += cpu_seconds(broker_pid) - before
        if got != tail:
            raise AssertionError(f"read {got} records of {tail}")
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "broker_cpu_ms_per_read": round(cpu / reads * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="tansu", choices=("tansu", "noida"))
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--tail", type=int, default=25)
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between reads")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    broker = start_broker(Path(tempfile.mkdtemp(prefix="probe-reads-")), args.broker)
    try:
        bootstrap = broker.url.split("//")[-1]
        admin = AdminClient(admin_config(bootstrap))
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        queue: dict[str, Any] = {"queue.buffering.max.messages": 10**6}
        producer = Producer(producer_config(bootstrap, args.broker, **queue))
        for number in range(args.records):
            producer.produce(TOPIC, key=b"k%d" % number, value=PAYLOAD)
            if number % 1000 == 0:
                producer.poll(0)
        producer.flush(600)
        partition = Partition(producer, args.records)
        options = parse_options(
            stream_options(bootstrap=bootstrap, flavor=args.broker, topics=[TOPIC])
        )

        def reader(consume: RangeConsumer) -> Callable[[int, int], int]:
            def read(start: int, end: int) -> int:
                span = PartitionRange(TOPIC, 0, start, end)
                batches = read_range_arrow(options, span, READ_AHEAD, Reach(start), consume)
                return sum(batch.num_rows for batch in batches)

            return read

        results: dict[str, Any] = {}
        ways: tuple[tuple[str, RangeConsumer], ...] = (
            ("watermarks first", consume_checked_range),
            ("fetch at once", consume_range),
        )
        for name, consume in ways:
            results[name] = timed_reads(
                partition, broker.pid, args.reads, args.tail, args.gap, reader(consume)
            )
            print(f"{name:16} {results[name]}", flush=True)
        if args.output:
            args.output.write_text(
                json.dumps(
                    {
                        "started": datetime.now(UTC).isoformat(timespec="seconds"),
                        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
                        "options": {k: str(v) for k, v in vars(args).items()},
                        "results": results,
                    },
                    indent=1,
                )
            )
    finally:
        stop_pid(broker.pid)


if __name__ == "__main__":
    main()
