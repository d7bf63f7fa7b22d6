"""`cdc-sync init --pg-url URL --tables 'schema.*,other.t' --name NAME`: reads the catalog and
writes connectors/NAME.json, mappings/NAME.yaml and NAME-setup.sql (`--apply` runs the SQL).

Run again on a changed schema it prints what would change and writes nothing; `--force` writes.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

import psycopg

from cdc_sync.connectors.init.render import (
    MODES,
    NAME,
    SINKS,
    Plan,
    connector_json,
    mapping_yaml,
    table_notes,
)
from cdc_sync.connectors.init.setup import setup_sql
from cdc_sync.connectors.init.survey import parse_patterns, survey
from cdc_sync.core.errors import ConfigError
from cdc_sync.core.settings import Connections, SettingsError
from cdc_sync.debezium.connector import describe_database


def _name(text: str) -> str:
    if not NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: lower-case letters, digits and underscores, starting with a letter, "
            "at most 40 (it names the slot, the publication and the topics)"
        )
    return text


def _sinks(text: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in chosen if s not in SINKS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"expected some of {','.join(SINKS)}, got {text!r}")
    return tuple(s for s in SINKS if s in chosen)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc-sync init", description=__doc__)
    parser.add_argument("--env-file", help="connection settings (default .cdc-sync/stack.env)")
    parser.add_argument(
        "--pg-url",
        help="the database, as its tables' owner or a superuser (default: CDC_SYNC_PG_URL)",
    )
    parser.add_argument(
        "--tables", required=True, help="comma-separated schema.table globs: 'shop.*,crm.users'"
    )
    parser.add_argument("--name", required=True, type=_name, help="the connector's name")
    parser.add_argument(
        "--sinks", type=_sinks, default=SINKS, help="search,cache,delta (default: all three)"
    )
    parser.add_argument("--out", default=".", help="where connectors/ and mappings/ are (.)")
    parser.add_argument("--apply", action="store_true", help="run the setup SQL on the database")
    parser.add_argument(
        "--force", action="store_true", help="overwrite files that differ from what init writes"
    )
    return parser


def init_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    pg_url = args.pg_url or Connections.load(
        Path(args.env_file) if args.env_file else None
    ).require("pg_url")
    out = Path(args.out)
    connector = out / "connectors" / f"{args.name}.json"
    mapping = out / "mappings" / f"{args.name}.yaml"
    setup = out / f"{args.name}-setup.sql"
    patterns = parse_patterns(args.tables)
    try:
        conn = psycopg.connect(pg_url)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = describe_database(pg_url)
        raise SettingsError(f"--pg-url: cannot connect to {where}: {first}") from exc
    with conn:
        found = survey(conn, patterns, MODES, args.name)
    for flag in found.flags:
        print(f"left out: {flag}")
    if not found.captured:
        raise ConfigError("command line", "--tables", "no table left to capture (see above)")
    plan = Plan(args.name, found, args.sinks, os.path.relpath(connector, mapping.parent))
    for facts in found.captured:
        for note in table_notes(plan, facts)[1:]:  # the key is in the mapping
            print(f"{facts.table}: {note}")
    for line in plan.names.renamed(args.name):
        print(line)
    files = {connector: connector_json(plan), mapping: mapping_yaml(plan), setup: setup_sql(plan)}
    if not write_files(files, args.force):
        return 1
    if args.apply:
        with psycopg.connect(pg_url) as conn:
            conn.execute(files[setup].encode())
        print(f"applied {setup} to {describe_database(pg_url)}")
    print(next_steps(plan, connector, mapping, setup, pg_url, args.apply))
    return 0


def write_files(files: dict[Path, str], force: bool) -> bool:
    """Writes new and unchanged files; for a file that differs prints the diff and, without
    `force`, writes nothing at all (False)."""
    changed = {path: text for path, text in files.items() if _current(path) not in (None, text)}
    for path, text in changed.items():
        sys.stdout.writelines(
            difflib.unified_diff(
                (_current(path) or "").splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"{path} (now)",
                f"{path} (init)",
            )
        )
    if changed and not force:
        print(
            f"{len(changed)} file(s) would change (diff above); nothing written: review, then "
            "run again with --force to write them"
        )
        return False
    for path, text in files.items():
        existing = _current(path)
        if existing == text:
            print(f"{path}: up to date")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"{path}: {'rewritten' if existing is not None else 'written'}")
    return True


def _current(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def next_steps(
    plan: Plan, connector: Path, mapping: Path, setup: Path, pg_url: str, applied: bool
) -> str:
    where = describe_database(pg_url).split("@", 1)[-1]
    steps = [] if applied else [f'psql "$ADMIN_URL" -f {setup}   # or run init with --apply']
    steps += [
        f"export CDC_SYNC_PG_URL=postgresql://{plan.role}@{where}   # the role the setup made",
        f"cdc-sync connectors validate --connector {connector} --mapping {mapping}",
        f"cdc-sync mappings validate --mapping {mapping}",
        f"cdc-sync capture --connector {connector}   # or: cdc-sync connectors apply",
        f"cdc-sync run --mapping {mapping}",
        f"cdc-sync verify --mapping {mapping}",
    ]
    return "next:\n" + "\n".join(f"  {step}" for step in steps)
