"""Document indices (mapping `documents`): nested documents kept current from the log.

`state.py` keeps every document table's rows (the job's own store, beside the checkpoint),
`fanout.py` finds the roots a batch touches, `render.py` builds documents in bulk from the
state, rows joined and arrays sorted as Postgres compares the columns' types (`comparisons.py`,
`equality.py`, `order.py`), `target.py` types the index's mapping, `builds.py` decides when an
index is built anew behind its alias, `checkpoint.py` whether a state belongs to its checkpoint
and `sync.py` is the job's step after each batch. Verify computes the same documents in
Postgres (`cdc_sync.verify`).
"""

from cdc_sync.documents.checkpoint import state_fits_checkpoint
from cdc_sync.documents.state import remove_state
from cdc_sync.documents.sync import (
    BULKS_IN_FLIGHT,
    DOCUMENTS_DEFERRED,
    DocumentResult,
    DocumentSync,
    StateMisfit,
)

__all__ = [
    "BULKS_IN_FLIGHT",
    "DOCUMENTS_DEFERRED",
    "DocumentResult",
    "DocumentSync",
    "StateMisfit",
    "remove_state",
    "state_fits_checkpoint",
]
