"""A chain of uploads, each behind the previous one's arrival, without a process per transfer.

The firmware streams a program's weights as one host-to-device transfer per weight, each
started once the previous one has arrived (:meth:`npu_sim.device.Device.memcpy_h2d_chain`).
Issued one by one, every transfer is a simpy process made when the program loads: an
``Initialize`` event, a generator, and a wait on an ``AllOf`` of the previous arrival; a model's
load made hundreds of them, most of the time the firmware spent placing weights.

:class:`UploadChain` moves the same transfers from callbacks. Each arrival is a plain event,
and every step a transfer's process took is taken at the same place in the simulator's event
order: a callback where the process's ``AllOf`` registered its check, a plain event scheduled
where that ``AllOf`` was (and where the first process's ``Initialize`` was, at the same
priority), the chunks started where the process started them, the arrival triggered where the
process ended. Chunks are :meth:`DmaEngine._chunk` processes as for every transfer. So the
simulator processes the same events in the same order: cycles, chunk records and their ids,
dependency arrows, counters and faults are the per-transfer processes' exactly
(``tests/test_dma_chain.py`` runs both side by side).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
from simpy.events import URGENT

from .errors import DmaFault
from .trace.recorder import record_ids, tag

if TYPE_CHECKING:
    from .dma import DmaEngine


class UploadChain:
    """Uploads ``(root, src, dst, shared)`` started one after another (see the module
    docstring); :attr:`arrivals` are their arrival events, in order."""

    __slots__ = ("_engine", "_uploads", "_submit", "_after", "arrivals", "_landed_count",
                 "_current", "_chunks", "_index", "_last", "__weakref__")

    def __init__(self, engine: DmaEngine, uploads: Sequence[tuple[np.ndarray, int, int, bool]],
                 after: simpy.Event | None) -> None:
        env = engine.env
        self._engine = engine
        self._submit = env.now
        self._after = after
        # Numbered, chunked and described now, as each transfer's process was when issued.
        self._uploads: list[tuple | None] = engine._issue_uploads(uploads)
        landed = self._landed  # one callback for every arrival
        self.arrivals: list[simpy.Event] = []
        for _ in uploads:
            arrival = simpy.Event(env)
            arrival.callbacks.append(landed)
            self.arrivals.append(arrival)
        self._landed_count = 0  # arrivals processed so far (they are processed in order)
        self._current = 0  # the transfer running, or the next to start
        self._chunks: list[simpy.Process] = []
        self._index = 0  # the chunk whose completion the running transfer waits for
        self._last: Any = None  # the trace record id of its last completed chunk
        # Where the first transfer's process had its Initialize: triggered now, urgent.
        start = simpy.Event(env)
        start.callbacks.append(self._first)
        start._ok, start._value = True, None
        env.schedule(start, URGENT)

    def forget(self) -> None:
        """Let go of the arrivals and the uploads (their host bytes) of a chain whose device is
        gone: its arrivals' callbacks refer to the chain, which refers to them, a cycle that
        otherwise keeps the engine, the HBM and the host mappings alive until the cyclic
        garbage collector runs."""
        self.arrivals, self._uploads = [], []

    def _first(self, _event: simpy.Event) -> None:
        """The first transfer's process starting: it waits for ``after``, if given. Here the
        processes of transfers 2..n had started too, each registering its wait on the arrival
        before it after whatever callbacks were added to that arrival since the chain was made."""
        for arrival in self.arrivals[:-1]:
            arrival.callbacks.append(self._release)
        after = self._after
        if after is None:
            self._begin(())
        elif after.callbacks is None:  # already processed: its AllOf triggered at once
            self._release(after)
        else:
            after.callbacks.append(self._release)

    def _landed(self, arrival: simpy.Event) -> None:
        """An arrival processed: its mapping goes (first, where each transfer's unmap was; the
        next transfer's wait is released by the callback :meth:`_first` registered)."""
        k = self._landed_count
        self._landed_count = k + 1
        self._engine.host_map.unmap(self._uploads[k][1])
        self._uploads[k] = None  # its host bytes are no longer needed here

    def _release(self, dependency: simpy.Event) -> None:
        """What the waiting transfer's AllOf did when its dependency was processed: trigger
        (fail, defusing the dependency, if that failed), to be processed in its turn."""
        hop = simpy.Event(self._engine.env)
        hop.callbacks.append(self._go)
        if dependency._ok:
            hop.succeed()
        else:
            dependency._defused = True
            hop.fail(dependency._value)

    def _go(self, hop: simpy.Event) -> None:
        """The waiting transfer's process resuming after its AllOf: start it, or fail with a
        copy of the dependency's error as the process did."""
        if not hop._ok:
            hop._defused = True
            self._end(_copy(hop._value))
            return
        k = self._current
        self._begin((self._after,) if k == 0 else (self.arrivals[k - 1],))

    def _begin(self, deps: tuple[simpy.Event, ...]) -> None:
        """Start the current transfer's chunks (:meth:`DmaEngine._run`'s body)."""
        engine = self._engine
        env = engine.env
        root, _, dst, shared, pieces, name, work = self._uploads[self._current]
        dep_ids = record_ids(deps)
        times = (self._submit, env.now)
        move = engine._uploader(root, dst, shared)
        count = len(pieces)
        self._chunks = [env.process(engine._chunk(move, off, n, i, count, name, work, dep_ids,
                                                  times))
                        for i, (off, n) in enumerate(pieces)]
        self._index = 0
        self._last = None
        if self._chunks:
            self._chunks[0].callbacks.append(self._chunk_done)
        else:
            self._end(None)

    def _chunk_done(self, chunk: simpy.Event) -> None:
        """A chunk processed: completions are taken in order, as the process took them; the
        transfer fails with a chunk's fault, and arrives after its last chunk."""
        while True:
            if not chunk._ok:
                chunk._defused = True
                self._end(_copy(chunk._value))
                return
            result = chunk._value
            if isinstance(result, DmaFault):
                self._end(result)
                return
            self._last = result
            self._index += 1
            if self._index == len(self._chunks):
                break
            chunk = self._chunks[self._index]
            if chunk.callbacks is not None:  # not processed yet: wait for it
                chunk.callbacks.append(self._chunk_done)
                return
        self._end(None)

    def _end(self, error: BaseException | None) -> None:
        """The current transfer's process ending: its arrival succeeds with its last record
        (tagged with it), or fails with ``error``; the next transfer becomes current."""
        arrival = self.arrivals[self._current]
        self._current += 1
        self._chunks = []
        if error is None:
            tag(arrival, self._last)
            arrival.succeed(self._last)
        else:
            arrival.fail(error)


def _copy(error: BaseException) -> BaseException:
    """The copy of a failed event's error a simpy process throws into its generator."""
    copy = type(error)(*error.args)
    copy.__cause__ = error
    return copy
