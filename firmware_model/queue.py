"""One queue's ring protocol: the host streams submissions in, the firmware posts completions out.

Real drivers do not need a whole job to fit the submission ring. :meth:`Queue.submit` writes
as many descriptors as there are free slots and rings the doorbell; whatever is left is written
by a host process (one per queue, a simpy process) that waits for the firmware's "slots freed"
notification, sent after each fetch (:meth:`Queue.fetched`), writes the next refill and rings
the doorbell again. The ring therefore bounds only the descriptors written and not yet fetched.
Submissions of one queue are written in the order they were submitted, so each occupies a
contiguous run of ring positions, known at submit time.

Every doorbell carries the new tail and the :class:`Job` it belongs to (its first position and
count, its loaded program and mode): the firmware scopes dependencies to the job, across all of
its refills.

Completions flow the other way under flow control: :meth:`Queue.post` writes an entry only into
a free completion slot. While the ring is full, finished commands' entries are held (in
completion order) by a firmware process that posts them as soon as the host has drained
(:meth:`Queue.drain`, which moves the head and wakes it). The host drains on every poll, so
during ``Firmware.wait`` entries are never held for any simulated time.

None of it is charged simulated time: writing, fetching and posting happen at the instant they
are possible, as events on the simpy clock, so the same inputs give the same cycles.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

from npu_sim.errors import InvalidCommand

from .commands import COMMAND_BYTES
from .rings import Completion, CompletionRing, RingOverflow, Status, SubmissionRing

if TYPE_CHECKING:
    from .loader import LoadedProgram


class Submission:
    """One submitted command list, as the host tracks it until every command has completed.

    It occupies ring positions ``first .. first + count - 1`` of its queue (mod 2**32 in the
    completion entries' ``seq``), written in one or several refills.
    """

    def __init__(self, queue: int, first: int, count: int, program: LoadedProgram | None):
        self.queue = queue
        self.first = first
        self.count = count
        self.program = program
        self.completions: list[Completion | None] = [None] * count
        self._missing = count

    @property
    def done(self) -> bool:
        """Whether the host has seen the completion of every command."""
        return self._missing == 0

    @property
    def faults(self) -> list[Completion]:
        """Completions with a status other than OK (CANCELLED ones included), in ring order."""
        return [c for c in self.completions if c is not None and not c.ok]

    def _complete(self, index: int, completion: Completion) -> None:
        self.completions[index] = completion
        self._missing -= 1


@dataclass(eq=False)
class Job:
    """A submission on its way through the ring: its descriptors, how many the host has
    written, and the context its doorbells carry to the firmware (program, mode)."""

    submission: Submission
    data: bytes
    functional: bool
    written: int = 0

    @property
    def unwritten(self) -> int:
        return self.submission.count - self.written


class Queue:
    """A submission ring, a completion ring and a doorbell, with both ends of the protocol."""

    def __init__(self, index: int, entries: int, env: simpy.Environment,
                 counters: dict[str, int]) -> None:
        self.index = index
        self.scope = f"npu.fw.q{index}"
        self.engine = f"fw.q{index}"
        self.env = env
        self.ring = SubmissionRing(entries, self.scope)
        self.cq = CompletionRing(entries, index)
        self.doorbell = simpy.Store(env)  # (tail, Job) per doorbell write
        self._counters = counters
        # Host side: jobs with descriptors still to write (ring order), positions claimed so
        # far, and the streaming process with the "slots freed" event it waits on.
        self._backlog: deque[Job] = deque()
        self._reserved = 0
        self._streamer: simpy.Process | None = None
        self._slots_freed: simpy.Event | None = None
        # Firmware side: completion entries waiting for a free slot, and their poster.
        self._held: deque[tuple[int, Status, int, int, int]] = deque()
        self._poster: simpy.Process | None = None
        self._drained: simpy.Event | None = None

    # -- host: submissions in -----------------------------------------------------------------

    def submit(self, data: bytes, program: LoadedProgram | None, functional: bool,
               stream: bool) -> Submission:
        """Write ``data`` (whole descriptors) now, or as much as fits and stream the rest;
        ``stream=False`` writes all at once or raises RingOverflow having written nothing."""
        count = len(data) // COMMAND_BYTES
        if len(data) % COMMAND_BYTES:
            raise InvalidCommand(self.scope, f"submission of {len(data)} bytes is not a "
                                             f"multiple of {COMMAND_BYTES}")
        if not stream:
            if self._backlog:
                raise RingOverflow(self.scope, f"submission of {count} commands cannot be "
                                   f"written raw: {sum(j.unwritten for j in self._backlog)} "
                                   "descriptors of earlier streaming submissions come first")
            self.ring.write(data)  # all or nothing
        sub = Submission(self.index, self._reserved, count, program)
        job = Job(sub, data, functional, written=0 if stream else count)
        self._reserved += count
        if not stream:
            self._ring_doorbell(job)
            return sub
        self._backlog.append(job)
        if self._streamer is None:
            self._write_backlog()
            if self._backlog:
                self._streamer = self.env.process(self._stream())
        return sub

    def skip(self, count: int) -> None:
        """Advance every position as a submission of ``count`` commands written, fetched,
        completed and drained would (a replayed run: ``firmware_model.replay``). Only while the
        queue is idle: nothing streaming, nothing fetched but not completed and drained."""
        if self._backlog or self._held or self.ring.fetched != self.ring.tail or \
                self.cq.pending:
            raise AssertionError(f"{self.scope}: skip({count}) on a busy queue")
        self._reserved += count
        self.ring.tail += count
        self.ring.fetched += count
        self.cq.tail += count
        self.cq.head += count

    def fetched(self) -> None:
        """Firmware: descriptors were fetched, their slots are free (wakes the host's writer)."""
        if self._slots_freed is not None and not self._slots_freed.triggered:
            self._slots_freed.succeed()

    def _ring_doorbell(self, job: Job) -> None:
        self.doorbell.put((self.ring.tail, job))
        self._counters["fw.doorbells"] += 1

    def _write_backlog(self) -> None:
        """Write what fits of the unwritten jobs, one doorbell per refill."""
        while self._backlog:
            job = self._backlog[0]
            n = min(self.ring.free, job.unwritten)
            if n or not job.submission.count:
                self.ring.write(job.data[job.written * COMMAND_BYTES:
                                         (job.written + n) * COMMAND_BYTES])
                job.written += n
                self._ring_doorbell(job)
            if job.unwritten:
                return
            self._backlog.popleft()

    def _stream(self):
        while self._backlog:
            self._slots_freed = self.env.event()
            yield self._slots_freed
            self._write_backlog()
        self._streamer = self._slots_freed = None

    # -- completions out ----------------------------------------------------------------------

    def post(self, cmd_id: int, status: Status, seq: int, start: int, end: int) -> None:
        """Firmware: post a completion entry, or hold it (in order) while the ring is full."""
        if not self._held and self.cq.free:
            self.cq.post(cmd_id, status, seq, start, end)
            return
        self._held.append((cmd_id, status, seq, start, end))
        if self._poster is None:
            self._poster = self.env.process(self._post_held())

    def drain(self) -> list[tuple[int, Status, int, int, int, int]]:
        """Host: consume every posted entry (see CompletionRing.drain); wakes held posts."""
        entries = self.cq.drain()
        if entries and self._drained is not None and not self._drained.triggered:
            self._drained.succeed()
        return entries

    def _post_held(self):
        while self._held:
            if not self.cq.free:
                self._drained = self.env.event()
                yield self._drained
            while self._held and self.cq.free:
                self.cq.post(*self._held.popleft())
        self._poster = self._drained = None
