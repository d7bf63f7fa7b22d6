"""Document indices (mapping `documents`): nested documents kept current from the log.

`state.py` keeps every document table's rows (the job's own store, beside the checkpoint),
`fanout.py` finds the roots a batch touches, `render.py` builds documents in bulk from the
state, rows joined and arrays sorted as Postgres compares the columns' types (`comparisons.py`,
`equality.py`, `order.py`), `target.py` types the index's mapping and `sync.py` is the job's
step after each batch. Verify computes the same documents in Postgres (`cdc_sync.verify`).
"""

from cdc_sync.documents.sync import DOCUMENTS_DEFERRED, DocumentResult, DocumentSync

__all__ = ["DOCUMENTS_DEFERRED", "DocumentResult", "DocumentSync"]
