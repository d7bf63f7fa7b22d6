"""Python's cycle collector, run less often while a batch's records become objects.

A batch turns its records into tens of thousands of small containers (a `Change`, its row
dict, key tuples; a document's nested dicts) that stay alive until the batch ends. With the
default threshold (a young-generation pass every 700 allocations) the passes, and the older
generations' passes they cascade into, scan those survivors and the process's whole heap again
and again, though they hold no reference cycle (reference counting frees them). Measured, CPU
a record or document, default threshold -> 10,000 (benchmarks/probe_record_costs.py, 20,000
records; benchmarks/probe_document_fanout.py, 20,000 roots): the write task 39.1 -> 26.1 us,
the driver's load of the tasks' writes 11.4 -> 7.0, a document's render 145 -> 85, a row's
merge into the document state 42 -> 33. Disabling the collector gained no more.

Only inside `collecting_less` sections (a write task, a batch's document step): outside them
the process collects as Python does by default, so what is left for the interpreter's final
collection at exit is what it always was. (A test session ended once with a segmentation fault
after the whole process ran at the raised threshold: at exit it holds a JVM, whose objects are
unsafe to free while the interpreter finalizes.) Sections are counted: the driver runs several
consumers' batches on threads, and the threshold comes back when the last one ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 10_000

_lock = threading.Lock()
_sections = 0
_restore: tuple[int, ...] | None = None  # the thresholds the first section found, if it raised


@contextmanager
def collecting_less() -> Iterator[None]:
    """The young generation's threshold at least `YOUNG_THRESHOLD` inside (a higher one, or a
    disabled collector, stays as it is); nested and concurrent sections share one raise."""
    global _sections, _restore
    with _lock:
        if _sections == 0:
            young, *older = gc.get_threshold()
            _restore = None
            if young < YOUNG_THRESHOLD:
                _restore = (young, *older)
                gc.set_threshold(YOUNG_THRESHOLD, *older)
        _sections += 1
    try:
        yield
    finally:
        with _lock:
            _sections -= 1
            if _sections == 0 and _restore is not None:
                gc.set_threshold(*_restore)
                _restore = None
