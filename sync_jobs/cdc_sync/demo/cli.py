"""`cdc-sync demo`, registered as a `cdc_sync.commands` entry point (the product CLI never
imports the demo)."""

from __future__ import annotations

import argparse

from cdc_sync.demo import run_demo


def demo_main(argv: list[str]) -> int:
    """local stack + demo schema + capture + sync + workload, then a per-table report"""
    parser = argparse.ArgumentParser(prog="cdc-sync demo", description=demo_main.__doc__)
    parser.add_argument("--env-file", help="ignored: the demo writes its own stack env file")
    parser.add_argument("--broker", default=None, help="tansu | noida (default: the stack's)")
    parser.add_argument("--operations", type=int, default=300)
    parser.add_argument(
        "--keep-running", action="store_true", help="leave the stack up after the demo"
    )
    args = parser.parse_args(argv)
    return run_demo(broker=args.broker, keep_running=args.keep_running, operations=args.operations)
