"""Record the applied watermark off the micro-batch's critical path: one daemon thread.

The batch observer (`job.observe.watermarks`) hands each applied batch over as an `Observation` and
returns at once. This thread evaluates the observations in batch order with `WatermarkRule` and
writes the newest watermark that advanced to every sink, skipping the ones that advanced while
a write was in flight. That is safe: a watermark promises that what committed up to it is
applied, the batch's data is applied before it is handed over, so recording it later (or never
recording an intermediate value) only delays the promise, never breaks it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cdc_sync.core.lsn import format_lsn
from cdc_sync.job.observe.watermark_rule import WatermarkRule
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.base import Sink
from cdc_sync.source.offsets import PartitionOffsets

log = logging.getLogger(__name__)

# A failed sink write is tried again with the next batch, or after this long when none comes.
RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Observation:
    batch_id: int
    candidate: int | None  # the batch's commit bound
    processed: PartitionOffsets  # next offset to read per partition after the batch


class WatermarkWriter:
    def __init__(
        self,
        sinks: Sequence[Sink],
        routes: Mapping[str, TableRoute],
        broker_ends: Callable[[], PartitionOffsets | None],
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        """`broker_ends`: the broker's end offsets of every subscribed partition, None when
        they could not be read (the caller logs why)."""
        self.sinks = list(sinks)
        self.routes = dict(routes)
        self.broker_ends = broker_ends
        self.retry_seconds = retry_seconds
        self.rule = WatermarkRule()  # the thread's alone
        self._queue: queue.SimpleQueue[Observation | None] = queue.SimpleQueue()  # None: stop
        # Guards what other threads read (`recorded`, `flush`), notified when it changes.
        self._state = threading.Condition()
        self._submitted = 0  # observations handed over
        self._settled = 0  # ... evaluated, and the watermark they gave written (or tried)
        self._advanced: int | None = None  # the rule's newest watermark
        self._recorded: list[int | None] = [None] * len(self.sinks)  # per sink, last written
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="cdc-sync-watermarks", daemon=True)
        self._thread.start()

    def submit(self, observation: Observation) -> None:
        with self._state:
            if self._closed:  # a batch racing the job's stop: its successor job derives it
                log.debug("batch %d: watermark writer closed", observation.batch_id)
                return
            self._submitted += 1
            self._queue.put(observation)  # under the lock: never behind close's stop marker

    @property
    def recorded(self) -> int | None:
        """The highest watermark recorded in every sink (the newest advanced one without
        sinks); None before one."""
        with self._state:
            if not self.sinks:
                return self._advanced
            if any(position is None for position in self._recorded):
                return None
            return min(position for position in self._recorded if position is not None)

    def flush(self, timeout_seconds: float) -> bool:
        """Wait until every observation handed over so far is evaluated and the watermark they
        gave is recorded in every sink. False when `timeout_seconds` passed first (a sink
        keeps failing, or keeps being behind while batches keep coming)."""
        with self._state:
            target = self._submitted
            return self._state.wait_for(
                lambda: self._settled >= target and not self._behind(), timeout_seconds
            )

    def close(self, timeout_seconds: float) -> bool:
        """Flush (bounded), then stop the thread. True when it stopped; else it is still in
        a sink write and is left behind (a daemon)."""
        deadline = time.monotonic() + timeout_seconds
        if not self.flush(timeout_seconds):
            log.warning(
                "applied watermark %s not recorded in every sink within %.0fs of stopping "
                "(recorded: %s); the next run records a newer one",
                _text(self._advanced),
                timeout_seconds,
                _text(self.recorded),
            )
        with self._state:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def _behind(self) -> bool:
        advanced = self._advanced
        return advanced is not None and any(r is None or r < advanced for r in self._recorded)

    def _run(self) -> None:
        while True:
            with self._state:
                wait = self.retry_seconds if self._behind() else None
            try:
                items = [self._queue.get(timeout=wait)]
            except queue.Empty:
                items = []  # the retry tick: write again
            # Everything handed over meanwhile: evaluated in order, then one write of the newest.
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            observations = [item for item in items if item is not None]
            self._evaluate(observations)
            self._write()
            with self._state:
                self._settled += len(observations)
                self._state.notify_all()
            if None in items:
                return

    def _evaluate(self, observations: Sequence[Observation]) -> None:
        # The broker's end offsets are read at most once per pass, after every batch in it was
        # applied (each was handed over once applied). The rule asks for ends H_n read after
        # batch n was applied; ends read later are only higher (and name no fewer partitions),
        # and a candidate holds once the processed offsets reach them in every partition, so a
        # later read can only make it hold later (`WatermarkRule._reached`): more conservative.
        ends: PartitionOffsets | None = None
        read = False
        for observation in observations:
            try:
                candidate = observation.candidate
                if candidate is not None and self.rule.advances(candidate) and not read:
                    ends, read = self.broker_ends(), True
                advanced = self.rule.observe(candidate, observation.processed, ends)
            except Exception:  # a bug here must not stop the watermarks for good
                log.exception("batch %d: watermark evaluation failed", observation.batch_id)
                continue
            if advanced is not None:
                with self._state:
                    self._advanced = advanced
                log.debug("batch %d: applied watermark %s", observation.batch_id, _text(advanced))

    def _write(self) -> None:
        with self._state:
            target = self._advanced
            recorded = list(self._recorded)
        if target is None:
            return
        for index, sink in enumerate(self.sinks):
            done = recorded[index]
            if done is not None and done >= target:
                continue
            try:
                sink.record_watermark(self.routes, target)
            except Exception as exc:
                # After the sink's own retries (which its health status shows). The batches
                # go on; the watermark in this sink only stands still until a write succeeds.
                log.warning(
                    "%s: recording applied watermark %s failed (%s: %s); retried with the next "
                    "batch or in %.0fs",
                    sink.name,
                    _text(target),
                    type(exc).__name__,
                    exc,
                    self.retry_seconds,
                )
                continue
            with self._state:
                self._recorded[index] = target
                self._state.notify_all()


def _text(position: int | None) -> str:
    return "none" if position is None else format_lsn(position)
