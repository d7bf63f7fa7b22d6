"""Whether a documents' state belongs to the streaming query's checkpoint beside it.

Spark commits a batch (`commits/<n>`) only after the batch's foreachBatch returned, and the state
records each batch it applies, with the query id of its checkpoint, in that batch's transaction
(`state.applied`). So a state that belongs to its checkpoint ran under the checkpoint's query id
and applied at least the newest committed batch (one more when a crash came between the two).
Anything else (a state lost or deleted, restored from an older copy, kept while the checkpoint
was replaced, or written by a release that did not record batches) lacks rows the checkpoint
will never send again: documents rendered from it would lose nested rows, so the job must not
render from it, and starts the documents over on a new checkpoint instead.
"""

from __future__ import annotations

from pathlib import Path

from cdc_sync.documents.state import applied
from cdc_sync.source.checkpoint import last_committed_batch, query_id


def state_fits_checkpoint(checkpoint_dir: Path, state_path: Path) -> str | None:
    """None when the state at `state_path` belongs to the query checkpointed at
    `checkpoint_dir`; else the one-line reason it does not."""
    committed = last_committed_batch(checkpoint_dir)
    query = query_id(checkpoint_dir)
    state = applied(state_path)
    if state.batch is None:
        if state.rows:
            return f"{state_path} holds rows but records no batch it applied (an older release)"
        if committed is not None:
            return (
                f"{state_path} holds no batch, but checkpoint {checkpoint_dir} committed batches "
                f"up to {committed}"
            )
        return None
    if state.checkpoint != query:
        where = f"query {query}" if query is not None else "no query yet"
        return (
            f"{state_path} was written under the checkpoint of query {state.checkpoint}, "
            f"but {checkpoint_dir} holds {where}"
        )
    if committed is not None and state.batch < committed:
        return (
            f"{state_path} applied batches up to {state.batch}, but checkpoint {checkpoint_dir} "
            f"committed batches up to {committed}"
        )
    return None
