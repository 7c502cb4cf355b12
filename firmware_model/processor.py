"""The command processor: doorbell, fetch, dependency tracking, dispatch, completions, faults.

:class:`Firmware` runs one simpy process per queue. Each waits for a doorbell write, fetches the
descriptors up to the new tail, decodes each one and starts it as its own simpy process, so
commands run concurrently: a command waits only for its own deps (and the submission's latest
BARRIER), never for unrelated earlier commands. DMA goes to ``device.dma``, KERNEL to
``device.compute`` on the cores of its mask, SIGNAL/WAIT act on the firmware's semaphores.

Every command ends with exactly one completion entry (:mod:`firmware_model.rings`) and one trace
record (kind ``"command"``, engine ``"fw.q<N>"``). A bad command never raises inside simpy: it
completes with a fault :class:`~firmware_model.rings.Status` and a message in the fault log, its
dependents complete ``CANCELLED``, and the host's :meth:`Firmware.wait` raises
:class:`~npu_sim.errors.DeviceFault` once the whole submission has settled. See
``docs/firmware.md`` for the full semantics.

A submission may be longer than the ring: the host streams it, and the firmware holds
completion entries back while the completion ring is full (:mod:`firmware_model.queue`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from npu_sim.errors import ConfigError, DeviceFault, InvalidCommand, NpuSimError
from npu_sim.trace import record_ids, tag

from .commands import (
    Barrier,
    Command,
    Dma,
    Kernel,
    Signal,
    Wait,
    decode,
    describe,
    pack,
)
from .queue import Queue, Submission
from .rings import Completion, Status
from .weights import WeightStore

if TYPE_CHECKING:
    from npu_sim.device import Device
    from npu_sim.hbm import DeviceBuffer

    from .loader import LoadedProgram
    from .program import Program

_SEQ_MASK = 0xFFFFFFFF


@dataclass(eq=False)
class _Cmd:
    """The firmware's tracking entry for one fetched command."""

    queue: int
    seq: int
    cmd_id: int
    command: Command | None
    done: simpy.Event
    functional: bool
    program: LoadedProgram | None
    status: Status = Status.OK
    message: str = ""
    start: int = 0
    fetched: int = 0
    wait_event: simpy.Event | None = None
    device_event: Any = None
    deps: list[_Cmd] = field(default_factory=list)
    why: list[str] = field(default_factory=list)


class _Fault(Exception):
    """Internal: ends a command's dispatch with a fault status (never leaves the firmware)."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Context:
    """What dependency resolution needs to know about the submission being fetched. It lives
    until the submission's last descriptor is fetched, so deps reach across ring refills."""

    by_id: dict[int, _Cmd] = field(default_factory=dict)
    since_barrier: list[_Cmd] = field(default_factory=list)
    barrier: _Cmd | None = None


class Firmware:
    """The device firmware: per-queue rings and command processors in front of a Device.

    ``queues`` independent queues (each with a submission and a completion ring of
    ``ring_entries`` slots) share the device's engines and ``semaphores`` 64-bit counters.
    """

    scope = "npu.fw"

    def __init__(self, device: Device, *, queues: int = 1, ring_entries: int = 256,
                 semaphores: int = 64) -> None:
        for name, value, hi in (("queues", queues, 64), ("semaphores", semaphores, 1 << 16)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ConfigError(name, value, f"an integer in [1, {hi}]")
        self.device = device
        self.env: simpy.Environment = device.env
        self._counters = {"fw.commands": 0, "fw.faults": 0, "fw.cancelled": 0,
                          "fw.doorbells": 0, "fw.submissions": 0}
        self._queues = [Queue(i, ring_entries, self.env, self._counters) for i in range(queues)]
        self._sems = [0] * semaphores
        self._sem_waiters: list[_Cmd] = []
        self._pending: dict[tuple[int, int], tuple[Submission, int]] = {}
        self._fault_log: dict[tuple[int, int], str] = {}
        self.weights = WeightStore(self)
        """The device's resident weights, shared by content across loaded programs."""
        for q in self._queues:
            self.env.process(_processor(weakref.ref(self), q))

    # -- host API -----------------------------------------------------------------------------

    @property
    def queues(self) -> int:
        return len(self._queues)

    @property
    def ring_entries(self) -> int:
        return self._queues[0].ring.entries

    @property
    def semaphores(self) -> tuple[int, ...]:
        """Current semaphore values."""
        return tuple(self._sems)

    def reset_semaphores(self, indices: Sequence[int] | None = None) -> None:
        """Set semaphores (all, or ``indices``) back to 0; call only while no WAIT uses them."""
        for i in range(len(self._sems)) if indices is None else indices:
            self._check_semaphore(i)
            self._sems[i] = 0

    def free_slots(self, queue: int = 0) -> int:
        """Submission-ring slots of ``queue`` the host may write now."""
        return self._queue(queue).ring.free

    def submit(self, commands: bytes | Sequence[Command], *, queue: int = 0,
               program: LoadedProgram | None = None, functional: bool = True,
               stream: bool = True) -> Submission:
        """Write descriptors into ``queue``'s ring and ring its doorbell.

        ``program`` is the loaded program KERNEL commands refer to; ``functional=False`` runs
        kernels for timing only. A submission may be longer than the ring: the host writes what
        fits now and streams the rest as the firmware fetches (after any earlier submission of
        the queue still streaming). ``stream=False`` is the raw write: all descriptors at once,
        or :class:`~firmware_model.rings.RingOverflow` with nothing written if they do not fit
        the free slots.
        """
        q = self._queue(queue)
        data = bytes(commands) if isinstance(commands, (bytes, bytearray, memoryview)) \
            else pack(commands)
        sub = q.submit(data, program, functional, stream)
        for i in range(sub.count):
            self._pending[(queue, (sub.first + i) & _SEQ_MASK)] = (sub, i)
        self._counters["fw.submissions"] += 1
        return sub

    def poll(self) -> list[Completion]:
        """Drain every completion ring; returns the new completions (fault messages attached)."""
        out = []
        for q in self._queues:
            entries = q.drain()
            for cmd_id, status, queue, seq, start, end in entries:
                key = (queue, seq)
                message = self._fault_log.pop(key, "")
                comp = Completion(queue, seq, cmd_id, status, start, end, message)
                sub, index = self._pending.pop(key)
                sub._complete(index, comp)
                out.append(comp)
        return out

    def wait(self, submission: Submission) -> list[Completion]:
        """Run the device until every command of ``submission`` completed; its completions.

        If any completed with a fault, raises :class:`~npu_sim.errors.DeviceFault` for the first
        fault in ring order (the root cause; its dependents are CANCELLED), after the whole
        submission has settled, so the device stays usable.
        """
        env = self.env
        while True:
            self.poll()
            if submission.done:
                break
            if env.peek() == float("inf"):
                self._watchdog(submission)
            else:
                env.step()
        faults = submission.faults
        if faults:
            root = next((c for c in faults if c.status is not Status.CANCELLED), faults[0])
            raise DeviceFault(f"npu.fw.q{root.queue}", root.cmd_id, root.status.name,
                              f"{root.message} ({len(faults)} of {submission.count} commands "
                              f"did not complete OK)")
        return list(submission.completions)  # type: ignore[arg-type]

    def run(self, commands: bytes | Sequence[Command], **kwargs: Any) -> list[Completion]:
        """``wait(submit(commands, **kwargs))``."""
        return self.wait(self.submit(commands, **kwargs))

    def load(self, program: Program, *, functional: bool = True, stream: bool = False,
             pinned: Mapping[int, tuple[DeviceBuffer, int]] | None = None) -> LoadedProgram:
        """Validate ``program``, allocate its regions, upload weights (``stream``: without
        waiting; ``pinned``: into caller-provided memory); see :mod:`.loader`."""
        from .loader import load_program

        return load_program(self, program, functional=functional, stream=stream, pinned=pinned)

    def stats(self) -> dict[str, Any]:
        """The device's counters plus the firmware's: ``fw.commands`` completed, ``fw.faults``
        (fault completions other than CANCELLED), ``fw.cancelled``, ``fw.doorbells``,
        ``fw.submissions``."""
        return {**self.device.stats(), **self.weights.stats(), **self._counters}

    def reset_stats(self) -> None:
        """Zero the firmware's counters and the device's."""
        self.device.reset_stats()
        for key in self._counters:
            self._counters[key] = 0

    # -- command processor --------------------------------------------------------------------

    def _queue(self, queue: int) -> Queue:
        if isinstance(queue, bool) or not isinstance(queue, int) or \
                not 0 <= queue < len(self._queues):
            raise InvalidCommand(self.scope, f"queue={queue!r}; expected an integer in "
                                             f"[0, {len(self._queues)})")
        return self._queues[queue]

    def _start(self, q: Queue, ctx: _Context, seq: int, raw: bytes,
               program: LoadedProgram | None, functional: bool) -> None:
        """Decode one descriptor, resolve its deps and start its process."""
        cmd_id = int.from_bytes(raw[4:8], "little")
        rec = _Cmd(q.index, seq & _SEQ_MASK, cmd_id, None, self.env.event(), functional,
                   program, fetched=int(self.env.now))
        fault: _Fault | None = None
        try:
            rec.command = decode(raw)
        except InvalidCommand as exc:
            fault = _Fault(Status.INVALID_OPCODE, exc.message)
        if fault is None and cmd_id in ctx.by_id:
            fault = _Fault(Status.DUPLICATE_ID, f"cmd_id {cmd_id} was already used by an earlier "
                                                "command of this submission")
        if fault is None:
            for dep in rec.command.deps:
                if dep not in ctx.by_id:
                    earlier = sorted(ctx.by_id)
                    shown = ", ".join(map(str, earlier[:16])) + (" ..." if len(earlier) > 16
                                                                 else "")
                    fault = _Fault(Status.MISSING_DEPENDENCY,
                                   f"depends on command {dep}, which was not submitted earlier "
                                   f"in this submission (earlier ids: {shown or 'none'})")
                    break
                rec.deps.append(ctx.by_id[dep])
                rec.why.append("data")  # the trace tells arena reuse apart by address
        if fault is None and isinstance(rec.command, Barrier):
            rec.deps.extend(ctx.since_barrier)
            rec.why.extend("barrier" for _ in ctx.since_barrier)
        if ctx.barrier is not None:
            rec.deps.append(ctx.barrier)
            rec.why.append("barrier")
        ctx.by_id[cmd_id] = rec  # a faulted id still resolves: its dependents are CANCELLED
        if isinstance(rec.command, Barrier):
            ctx.barrier = rec
            ctx.since_barrier = []
        else:
            ctx.since_barrier.append(rec)
        self.env.process(self._execute(q, rec, fault))

    def _execute(self, q: Queue, rec: _Cmd, fault: _Fault | None):
        env = self.env
        if fault is None and rec.deps:
            yield simpy.AllOf(env, [d.done for d in rec.deps])
            failed = next((d for d in rec.deps if d.status is not Status.OK), None)
            if failed is not None:
                fault = _Fault(Status.CANCELLED, f"not run: dependency {failed.cmd_id} completed "
                                                 f"with {failed.status.name}")
        rec.start = env.now
        if fault is None:
            try:
                yield from self._dispatch(rec)
            except _Fault as exc:
                fault = exc
        if fault is not None:
            rec.status, rec.message = fault.status, fault.message
        self._finish(q, rec)

    def _dispatch(self, rec: _Cmd):
        cmd = rec.command
        dep_events = [d.done for d in rec.deps]
        name = f"q{rec.queue}.cmd{rec.cmd_id}"
        if isinstance(cmd, Dma):
            try:
                ev = self.device.dma.transfer(cmd.src, cmd.dst, cmd.nbytes, name=name,
                                              deps=dep_events)
                yield ev
            except NpuSimError as exc:
                raise _Fault(Status.DMA_FAULT, str(exc)) from None
            rec.device_event = ev
        elif isinstance(cmd, Kernel):
            op, inputs, outputs, attrs, cores, node = self._resolve_launch(rec, cmd)
            # Weight streaming: the kernel also waits for its weights' uploads still in flight
            # (and its trace record depends on them).
            arrivals = rec.program.arrivals(rec.program.program.launches[cmd.launch].inputs)
            try:
                proc = self.device.compute.execute(op, inputs, outputs, attrs, cores=cores,
                                                   node=node, functional=rec.functional,
                                                   deps=dep_events + arrivals)
                yield proc
            except Exception as exc:  # the kernel is user code: any failure is its fault
                text = str(exc) if isinstance(exc, NpuSimError) else f"{exc!r}"
                raise _Fault(Status.KERNEL_FAULT, text) from None
            rec.device_event = proc
        elif isinstance(cmd, Signal):
            self._check_sem_fault(cmd.semaphore)
            self._sems[cmd.semaphore] += cmd.value
            self._wake(cmd.semaphore)
        elif isinstance(cmd, Wait):
            self._check_sem_fault(cmd.semaphore)
            if self._sems[cmd.semaphore] < cmd.value:
                rec.wait_event = self.env.event()
                self._sem_waiters.append(rec)
                satisfied = yield rec.wait_event
                rec.wait_event = None
                if not satisfied:
                    raise _Fault(Status.WAIT_TIMEOUT,
                                 f"watchdog: the device went idle while waiting for semaphore "
                                 f"{cmd.semaphore} >= {cmd.value} (it holds "
                                 f"{self._sems[cmd.semaphore]})")

    def _resolve_launch(self, rec: _Cmd, cmd: Kernel):
        prog = rec.program
        if prog is None:
            raise _Fault(Status.INVALID_LAUNCH, f"KERNEL launch {cmd.launch} submitted without "
                                                "a loaded program")
        if not prog.loaded:
            raise _Fault(Status.INVALID_LAUNCH, f"program {prog.program.name!r} was unloaded")
        launches = prog.program.launches
        if cmd.launch >= len(launches):
            raise _Fault(Status.INVALID_LAUNCH, f"launch index {cmd.launch} out of range; program "
                                                f"{prog.program.name!r} has {len(launches)}")
        ncores = self.device.config.cores
        mask = cmd.core_mask or (1 << ncores) - 1
        if mask >> ncores:
            raise _Fault(Status.INVALID_LAUNCH, f"core_mask {cmd.core_mask:#x} names cores beyond "
                                                f"the device's {ncores} (valid bits 0..{ncores-1})")
        cores = [i for i in range(ncores) if mask >> i & 1]
        launch = launches[cmd.launch]
        inputs = [None if t < 0 else prog.operand(t) for t in launch.inputs]
        outputs = [prog.operand(t) for t in launch.outputs]
        return launch.op, inputs, outputs, launch.attrs, cores, launch.node

    def _check_semaphore(self, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or \
                not 0 <= index < len(self._sems):
            raise InvalidCommand(self.scope, f"semaphore {index!r} out of range; valid "
                                             f"0..{len(self._sems) - 1}")

    def _check_sem_fault(self, index: int) -> None:
        try:
            self._check_semaphore(index)
        except InvalidCommand as exc:
            raise _Fault(Status.INVALID_SEMAPHORE, exc.message) from None

    def _wake(self, semaphore: int) -> None:
        value = self._sems[semaphore]
        still = []
        for rec in self._sem_waiters:
            cmd = rec.command
            if cmd.semaphore == semaphore and value >= cmd.value:
                rec.wait_event.succeed(True)
            else:
                still.append(rec)
        self._sem_waiters = still

    def _watchdog(self, submission: Submission) -> None:
        """The device is idle but ``submission`` is unfinished: time out its blocked WAITs."""
        blocked = [r for r in self._sem_waiters if r.queue == submission.queue and
                   (r.seq - submission.first) & _SEQ_MASK < submission.count]
        if not blocked:
            raise AssertionError(f"{self.scope}: device idle with submission {submission.first} "
                                 "unfinished and no WAIT blocking it")
        for rec in blocked:
            self._sem_waiters.remove(rec)
            rec.wait_event.succeed(False)

    def _finish(self, q: Queue, rec: _Cmd) -> None:
        """Post the completion and trace record, then release the dependents."""
        now = self.env.now
        trace = self.device.trace
        dep_ids, why = [], []
        for d, reason in zip(rec.deps, rec.why, strict=True):
            for rid in record_ids([d.done]):
                dep_ids.append(rid)
                why.append(reason)
        if rec.device_event is not None:
            device_ids = record_ids([rec.device_event])
            dep_ids.extend(device_ids)
            why.extend("completion" for _ in device_ids)
        work: dict[str, Any] = {"queue": q.index, "cmd_id": rec.cmd_id, "status": rec.status.name,
                                "command": describe(rec.command) if rec.command else "invalid"}
        if isinstance(rec.command, Dma):
            work["bytes"] = rec.command.nbytes
        kind = type(rec.command).__name__.upper() if rec.command else "INVALID"
        rid = trace.record("command", q.engine, q.scope, f"{kind} #{rec.cmd_id}", rec.start, now,
                           dep_ids, work, why=why, submit=rec.fetched, ready=rec.start)
        tag(rec.done, rid)
        self._counters["fw.commands"] += 1
        if rec.status is Status.CANCELLED:
            self._counters["fw.cancelled"] += 1
        elif rec.status is not Status.OK:
            self._counters["fw.faults"] += 1
        if rec.message:
            self._fault_log[(q.index, rec.seq)] = rec.message
        q.post(rec.cmd_id, rec.status, rec.seq, rec.start, now)
        rec.done.succeed(rec.status)  # dependents need not wait for the completion entry


def _processor(firmware: weakref.ref[Firmware], q: Queue):
    """The command processor of queue ``q``: wait for a doorbell, fetch what it rang for and
    start each descriptor.

    It holds its firmware weakly while it waits: a process the simulation clock keeps alive
    must not keep the firmware (and through it the device and its HBM) alive, or a session's
    device would be freed only when the cyclic garbage collector runs, not when the session is
    dropped.
    """
    ctx = _Context()
    while True:
        tail, job = yield q.doorbell.get()
        fw = firmware()
        if fw is None:
            return
        sub = job.submission
        while q.ring.fetched < tail:
            seq, raw = q.ring.fetch()
            if seq == sub.first:
                ctx = _Context()
            fw._start(q, ctx, seq, raw, sub.program, job.functional)
        del fw
        if q.ring.fetched == sub.first + sub.count:
            ctx = _Context()  # the submission is fetched: forget its ids
        del job, sub  # a waiting processor holds no program (nor, through it, the firmware)
        q.fetched()  # their slots are free: the host may write the next refill
