"""Where the accepted schema of each table survives restarts: beside the Spark checkpoint.

`<checkpoint>/cdc_sync_schemas/<schema>.<table>.json` holds the schema the targets were last
evolved to (or, under `ignore`, kept at). It lives with the checkpoint, not in the targets,
because:

- it is state of the same streaming query as the offsets: a new checkpoint replays the topics
  from the start and must take a new baseline; deleting a checkpoint resets both together;
- the targets cannot give it back exactly: Delta and the search mapping lose Postgres types
  (uuid, json, time become strings; search integers are `long`), the cache has no schema at all,
  and a column `ignore` kept out of the sinks is indistinguishable from one never seen.

The tracker saves a table's file when the batch's schema decision is final and before any sink is
evolved; a file is replaced atomically (write to a temp file, fsync, rename), so a crash leaves
the old schema or the new one, never half of one. `fail` and `ignore` never save a changed schema,
so a batch that failed and re-runs meets the same decision; under `evolve` a re-run finds the
evolved schema already accepted and re-checks the targets (see `SchemaTracker`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from cdc_sync.core.files import write_atomically
from cdc_sync.core.model import TableId
from cdc_sync.core.types import RowSchema, row_schema_from_json, row_schema_to_json

log = logging.getLogger(__name__)

SCHEMAS_DIR = "cdc_sync_schemas"
FORMAT = 1


class SchemaStateCorrupt(RuntimeError):
    """A stored accepted schema that cannot be read; the message names the file."""


class SchemaStore(Protocol):
    def load(self, table: TableId) -> RowSchema | None: ...

    def save(self, table: TableId, schema: RowSchema) -> None: ...


class FileSchemaStore:
    """One JSON file per table under `root` (normally `<checkpoint>/cdc_sync_schemas`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def beside_checkpoint(cls, checkpoint_dir: Path) -> FileSchemaStore:
        return cls(checkpoint_dir / SCHEMAS_DIR)

    def path(self, table: TableId) -> Path:
        return self.root / f"{_file_part(table.schema)}.{_file_part(table.table)}.json"

    def load(self, table: TableId) -> RowSchema | None:
        path = self.path(table)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            log.info(
                "%s: no accepted schema at %s; the first schema seen is the baseline", table, path
            )
            return None
        try:
            schema = _parse(table, text)
        except (ValueError, KeyError, TypeError) as error:
            raise SchemaStateCorrupt(
                f"{path}: accepted schema of {table} is unreadable ({error}); restore it, or "
                "delete it to take the next schema seen as the baseline"
            ) from error
        log.info("%s: accepted schema %s loaded from %s", table, schema.fingerprint, path)
        return schema

    def save(self, table: TableId, schema: RowSchema) -> None:
        path = self.path(table)
        document = {
            "format": FORMAT,
            "table": str(table),
            "fingerprint": schema.fingerprint,
            "columns": row_schema_to_json(schema),
        }
        write_atomically(path, json.dumps(document, indent=2) + "\n")
        log.info("%s: accepted schema %s saved to %s", table, schema.fingerprint, path)


def _parse(table: TableId, text: str) -> RowSchema:
    document = json.loads(text)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"expected an object with format {FORMAT}")
    if document.get("table") != str(table):
        raise ValueError(f"holds table {document.get('table')!r}")
    schema = row_schema_from_json(document["columns"])
    # The fingerprint catches a hand edit that parses but is not what was saved.
    if schema.fingerprint != document.get("fingerprint"):
        raise ValueError("fingerprint does not match the columns")
    return schema


def _file_part(name: str) -> str:
    # Identifiers may hold any character: escape so names map to distinct, safe file names.
    return quote(name, safe="").replace(".", "%2E")
