"""`cdc-sync stack up | down | status`: the local stack on free loopback ports."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cdc_sync.core.settings import KAFKA_FLAVOR, default_env_file, state_dir, write_env_file
from cdc_sync.localstack.process import StackError, alive
from cdc_sync.localstack.stack import LocalStack


def stack_main(argv: list[str]) -> int:
    """local stack: up | down | status (see `stack --help`)"""
    parser = argparse.ArgumentParser(prog="cdc-sync stack", description=__doc__)
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--env-file", help="where to write the URLs (default .cdc-sync/stack.env)")
    parser.add_argument("--dir", help="stack state directory (default .cdc-sync/stack)")
    parser.add_argument(
        "--broker",
        choices=("tansu", "noida"),
        default=os.environ.get(KAFKA_FLAVOR)
        if os.environ.get(KAFKA_FLAVOR) in ("tansu", "noida")
        else "tansu",
    )
    parser.add_argument(
        "--no-connect",
        action="store_true",
        help="skip the Kafka Connect worker (capture with the embedded engine instead)",
    )
    args = parser.parse_args(argv)
    root = Path(args.dir) if args.dir else state_dir() / "stack"
    env_file = Path(args.env_file) if args.env_file else default_env_file()
    stack = LocalStack(root, args.broker, with_connect=not args.no_connect)
    if args.action == "up":
        try:
            urls = stack.start()
        except StackError as exc:
            print(f"cdc-sync stack: {exc}", file=sys.stderr)
            return 2
        values = urls.env(state_dir() / "warehouse")
        write_env_file(env_file, values)
        print(f"local stack up; settings written to {env_file}:")
        for name, value in sorted(values.items()):
            print(f"  {name}={value}")
        print("stop it with: cdc-sync stack down")
        return 0
    if args.action == "down":
        stack.stop()
        env_file.unlink(missing_ok=True)
        print("local stack stopped")
        return 0
    services = stack.started()
    for service in services:
        state = "up" if alive(service.pid) else "DOWN"
        print(f"{service.name:<9} {state:<5} pid {service.pid:<7} {service.url}")
    if not services:
        print("local stack is not running (cdc-sync stack up)")
    return 0 if services and all(alive(s.pid) for s in services) else 1
