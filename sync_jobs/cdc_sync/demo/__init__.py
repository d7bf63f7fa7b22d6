"""`cdc-sync demo`: local stack, demo schema, capture, sync job, mixed workload, report.

Everything runs in this process except the services: the embedded Debezium engine in a thread,
the Spark job as a streaming query. Ctrl-C stops all of it; `--keep-running` leaves the stack up
(and the capture and sync job running until Ctrl-C) for poking around.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

from cdc_sync.core.settings import Connections
from cdc_sync.demo.latency import LatencyProbe, LatencySample
from cdc_sync.demo.report import demo_report
from cdc_sync.demo.services import DemoServices
from cdc_sync.demo.workload import create_demo_schema, run_workload
from cdc_sync.mapping import MappingFile, load_mapping
from cdc_sync.verify.compare import Report, verify_all

log = logging.getLogger(__name__)

MAPPING = Path("mappings/shop.yaml")
CONNECTOR = Path("connectors/shop.json")
LATENCY_PROBES = 10
CONVERGE_TIMEOUT_SECONDS = 180


def run_demo(broker: str | None, keep_running: bool, operations: int) -> int:
    started = time.monotonic()
    mapping = load_mapping(MAPPING)
    services = DemoServices(broker)
    try:
        connections = services.up()
        print("local stack up:", connections.pg_url, connections.kafka_bootstrap, sep="\n  ")
        create_demo_schema(connections.require("pg_url"))
        capture = services.start_capture(CONNECTOR, mapping)
        print(f"capture: {CONNECTOR} on the {capture}")
        services.start_sync(mapping)
        report = _wait_converged(services, mapping, connections)
        print(f"snapshot synced in {time.monotonic() - started:.0f} s; running the workload")
        workload: Counter[str] = run_workload(connections.require("pg_url"), operations)
        report = _wait_converged(services, mapping, connections)
        probe = LatencyProbe(mapping, connections)
        samples: list[LatencySample] = []
        try:
            for _ in range(LATENCY_PROBES):
                samples.append(probe.sample())
        finally:
            probe.close()
        report = _wait_converged(services, mapping, connections)
        print(demo_report(report, workload, samples, time.monotonic() - started))
        if keep_running:
            print(
                "\nthe stack, capture and sync job keep running; try `psql "
                f"{connections.pg_url}` and watch the sinks. Ctrl-C stops capture and sync; "
                "`cdc-sync stack down` (or `make stack-down`) stops the services."
            )
            services.wait_for_interrupt()
        return 0 if report.converged else 1
    finally:
        services.down(stop_stack=not keep_running)


def _wait_converged(
    services: DemoServices, mapping: MappingFile, connections: Connections
) -> Report:
    deadline = time.monotonic() + CONVERGE_TIMEOUT_SECONDS
    while True:
        services.raise_if_failed()
        report = verify_all(mapping, connections)
        if report.converged or time.monotonic() > deadline:
            return report
        time.sleep(1.0)
