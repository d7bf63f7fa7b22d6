"""Python's cycle collector, run less often than its default in the job's processes.

A batch turns its records into tens of thousands of small containers (a `Change`, its row
dict, key tuples; a document's nested dicts) that stay alive until the batch ends. With the
default threshold (a young-generation pass every 700 allocations) the passes, and the older
generations' passes they cascade into, scan those survivors and the process's whole heap again
and again, though they hold no reference cycle (reference counting frees them). Measured, CPU
a record or document, default threshold -> 10,000 (benchmarks/probe_record_costs.py, 20,000
records; benchmarks/probe_document_fanout.py, 20,000 roots): the write task 39.1 -> 26.1 us,
the driver's load of the tasks' writes 11.4 -> 7.0, a document's render 145 -> 85, a row's
merge into the document state 42 -> 33. Disabling the collector gained no more. The collector
still runs: a cycle (an exception and its traceback) is freed a little later, no more.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def collect_less_often() -> None:
    """Raise the young generation's threshold to `YOUNG_THRESHOLD` in this process (a higher
    one set by the user stays). Cheap: the job's per-partition functions call it each task, as
    Spark's Python workers are started without the job's own start-up code."""
    young, *older = gc.get_threshold()
    if young < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *older)
