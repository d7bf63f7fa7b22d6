"""The erasure audit's file check: which files under a folder still hold a value.

Raw bytes first (JSON commits, SQLite pages, Parquet footers' statistics), then, for Parquet
files, every decoded cell: a compressed page may hide a value from a byte search.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq


def files_holding(root: Path, values: Sequence[str]) -> dict[str, list[str]]:
    """relative path -> the `values` found in it, for every file under `root` holding one."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            data = path.read_bytes()
            text = _decoded(path) if path.suffix == ".parquet" else ""
        except FileNotFoundError:
            continue  # a running job's temporary file, renamed or deleted since the listing

        held = [v for v in values if v.encode() in data or v in text]
        if held:
            found[str(path.relative_to(root))] = held
    return found


def _decoded(path: Path) -> str:
    table = pq.read_table(path)
    return json.dumps(table.to_pylist(), default=str)
