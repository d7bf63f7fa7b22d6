"""`hash`: a field's value replaced by its HMAC-SHA256 (hex), keyed by a secret.

The input is the value as a JSON document holds it (text as itself, other values as compact
JSON), so the job (decoded values) and verify (Postgres values read the way the decoder gives
them) hash the same bytes. The key is the secret, which also salts it: without the secret the
hash of a known value cannot be computed, and another deployment's secret gives other hashes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from cdc_sync.core.types import ColumnType
from cdc_sync.schema.values import to_json_value


def hashed(secret: bytes, column_type: ColumnType | None, value: Any) -> str | None:
    if value is None:
        return None
    document = to_json_value(column_type, value) if column_type is not None else value
    text = (
        document
        if isinstance(document, str)
        else json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    )
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()
