"""A batch cut short by its query's stop raises to Spark a short error that Spark reads as a stop.

Spark tells a batch interrupted by `stop()` from a failed one by the text of the Python error
its `foreachBatch` raised (`StreamExecution.isInterruptionException`): a regular expression,
`py4j.protocol.Py4JJavaError: An error occurred while calling((.|\\r\\n|\\r|\\n)*)(<an
interruption's class name>)`, whose alternation recurses once a character in Java's regex engine.
The interrupted Spark call's Java stack trace inside the Python traceback (5 kB and more) overflowed
the stream thread's stack: `StackOverflowError` in "stream execution thread" at every stop that
cut a batch short (six in one e2e module), and once the e2e suite's JVM ended there. A batch cut
short by the stop raises `StoppedMidBatch` instead, without the chain that caused it: a few
hundred characters, matched at once, a clean stop. Its offsets are not committed either way.
"""

from __future__ import annotations

import logging
from typing import NoReturn

from py4j.protocol import Py4JError
from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

# What Spark's expression needs to read a stop: the Py4J marker, then an interruption's class.
SPARK_STOP_TEXT = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling foreachBatch: "
    "java.lang.InterruptedException"
)


class StoppedMidBatch(Exception):
    def __init__(self, batch_id: int, cause: BaseException) -> None:
        super().__init__(
            f"{SPARK_STOP_TEXT}: the query was stopped during batch {batch_id} "
            f"({type(cause).__name__}); its offsets are not committed, it runs again at the "
            "next start"
        )


def stopping(query: StreamingQuery | None) -> bool:
    """Whether `query` is being stopped (Spark marks it inactive before it interrupts the batch);
    a JVM that is gone stops it too. False before the query has started."""
    if query is None:
        return False
    try:
        return not query.isActive
    except (Py4JError, ConnectionError):
        return True


def raise_for_spark(error: BaseException, batch_id: int, query: StreamingQuery | None) -> NoReturn:
    """Raise `error` from the batch function, or `StoppedMidBatch` if the query is being
    stopped (the error is then logged here, at debug: it is the stop's doing)."""
    if not stopping(query):
        raise error
    log.debug("batch %d: cut short by the query's stop: %r", batch_id, error)
    raise StoppedMidBatch(batch_id, error) from None
