"""CPU microseconds a record of each consumer's per-record Python work, in process.

    .venv/bin/python benchmarks/probe_record_costs.py [--records 20000] [--rounds 3] [--profile]

Snapshot records of `shop.products` in Debezium's JsonConverter shape (`tests/envelopes.py`, with
their schemas) go through what a Spark task runs for each consumer of the log, without Spark and
without sinks: `decode_and_fold` (phase 1), `write_partition` with no row sinks and the routed
changes handed back (phase 2, as for the Delta consumer: TOAST fill off, conform, route), and the
driver's `load_writes` of what the tasks return. Prints the best of `--rounds` per stage (CPU
time of this process); `--profile` adds cProfile's busiest functions of one more round. What the
initial sync's job spends beyond these is Spark's (Arrow hops, the JVM) and the sinks' clients:
see docs/performance.md.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # tests.*

from cdc_sync.core.retry import RetryPolicy  # noqa: E402
from cdc_sync.job.decode.partition import KIND_CHANGE, decode_and_fold  # noqa: E402
from cdc_sync.job.settle.schema_changes import SchemaState  # noqa: E402
from cdc_sync.job.write.task_sinks import TaskSinkSpec  # noqa: E402
from cdc_sync.job.write.task_writes import (  # noqa: E402
    WRITE_COLUMNS,
    WritePlan,
    load_writes,
    write_partition,
)
from cdc_sync.schema import row_schema_from_connect  # noqa: E402
from tests.changes import products_route  # noqa: E402
from tests.envelopes import PRODUCT_FIELDS, envelope_bytes, key_bytes, product  # noqa: E402

STAGES = ("decode and fold", "write task (no sinks)", "driver: load_writes")


def records(count: int) -> pa.RecordBatch:
    """One Kafka partition's snapshot records, one per key, in offset order."""
    pairs = [
        (key_bytes("products", {"id": k}), envelope_bytes("products", "r", 1000 + k, product(k)))
        for k in range(count)
    ]
    return pa.RecordBatch.from_pydict(
        {
            "key": [key for key, _ in pairs],
            "value": [value for _, value in pairs],
            "topic": ["cdc.shop.products"] * count,
            "partition": [0] * count,
            "offset": list(range(count)),
        }
    )


def one_round(batch: pa.RecordBatch) -> list[float]:
    """CPU seconds of each stage over the batch."""
    route = products_route()
    schema = row_schema_from_connect({"type": "struct", "fields": PRODUCT_FIELDS})
    spec = TaskSinkSpec("opensearch", None, None, 60, RetryPolicy(attempts=1))  # no row sinks
    plan = WritePlan({"shop.products": (route, SchemaState(schema, False))}, spec, True)
    started = time.process_time()
    folded = pa.Table.from_batches(list(decode_and_fold(iter([batch]))))
    decoded = time.process_time()
    changes = folded.filter(pc.equal(folded["kind"], KIND_CHANGE)).select(list(WRITE_COLUMNS))
    out = list(write_partition(iter(changes.to_batches()), plan))
    written = time.process_time()
    load_writes([row for part in out for row in part.to_pylist()])
    loaded = time.process_time()
    return [decoded - started, written - decoded, loaded - written]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile one more round")
    args = parser.parse_args()
    batch = records(args.records)
    rounds = [one_round(batch) for _ in range(args.rounds)]
    best = [min(column) for column in zip(*rounds, strict=True)]
    print(f"{args.records:,} snapshot records, best of {args.rounds} rounds, CPU us a record:")
    for stage, seconds in zip(STAGES, best, strict=True):
        print(f"  {stage:<24} {1e6 * seconds / args.records:7.1f}")
    print(f"  {'all':<24} {1e6 * sum(best) / args.records:7.1f}")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(one_round, batch)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
