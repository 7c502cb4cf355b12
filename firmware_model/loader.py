"""The program loader: validate a compiled :class:`~firmware_model.program.Program`, place it in
HBM, and run it.

:func:`load_program` (``Firmware.load``) first checks everything it can without touching the
device (the list is in ``docs/firmware.md``) and raises one
:class:`~npu_sim.errors.InvalidCommand` listing every problem found. Only then does it allocate
the ARENA and WEIGHTS regions, upload the weights through the firmware straight from their
host memory (:mod:`firmware_model.upload`: one DMA per run of weights contiguous in host memory
and in HBM, no staging copy), and relocate the command stream: every ``reloc(region, offset)``
address becomes the region's HBM base plus the offset.
A failed load frees what it allocated.

:meth:`LoadedProgram.run` checks the inputs, then submits one submission: the input DMAs
(host -> arena), a BARRIER, the program's commands, a BARRIER, the output DMAs (arena -> host).
The host streams it through the submission ring however long it is.
In timing-only mode (``functional=False``) kernels compute no values but every DMA and kernel is
still charged, and the outputs are returned as ``None``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import simpy

from npu_sim import dtypes
from npu_sim.dma import DMA_ALIGNMENT
from npu_sim.dtypes import TensorSpec
from npu_sim.errors import InvalidCommand, NpuSimError
from npu_sim.hbm import DeviceBuffer
from npu_sim.kernels import blas, registry

from . import prune, replay
from .commands import U32_MAX, Barrier, Command, Dma, Kernel, Signal, Wait, pack, unpack
from .program import Program, Region, TensorDesc, split_reloc
from .upload import host_address, host_bytes
from .weights import Placement

if TYPE_CHECKING:
    from npu_sim.device import Device

    from .processor import Firmware

_SCOPE = "npu.fw.loader"
_MAX_SHOWN = 20


def _problem_error(program: Program, problems: list[str]) -> InvalidCommand:
    shown = problems[:_MAX_SHOWN]
    more = f"\n  ... and {len(problems) - _MAX_SHOWN} more" if len(problems) > _MAX_SHOWN else ""
    err = InvalidCommand(_SCOPE, f"program {program.name!r} is invalid "
                                 f"({len(problems)} problem{'s' * (len(problems) > 1)}):\n  "
                                 + "\n  ".join(shown) + more)
    err.problems = list(problems)
    return err


def validate(program: Program, *, cores: int, semaphores: int,
             functional: bool = True) -> list[Command]:
    """Check ``program`` against a device with ``cores`` cores and a firmware with
    ``semaphores`` semaphores; returns its decoded commands. (A run may be longer than the
    submission ring: the host streams it.)

    Raises InvalidCommand listing every problem (``.problems`` holds them one per entry).
    ``functional=False`` allows weights to be absent (a timing-only load).
    """
    problems: list[str] = []
    sizes = {Region.ARENA: program.arena_bytes, Region.WEIGHTS: 0}
    if isinstance(program.arena_bytes, bool) or not isinstance(program.arena_bytes, int) \
            or program.arena_bytes < 0:
        problems.append(f"arena_bytes={program.arena_bytes!r}; expected an int >= 0")
        sizes[Region.ARENA] = 0
    nbytes, weight_idx, sizes[Region.WEIGHTS] = _check_tensors(program, sizes[Region.ARENA],
                                                               problems)
    _check_io(program, nbytes, problems)
    _check_weights(program, nbytes, weight_idx, problems, functional)
    _check_launches(program, problems)
    commands: list[Command] = []
    try:
        commands = unpack(program.commands)
    except InvalidCommand as exc:
        problems.append(f"command stream: {exc.message}")
    _check_commands(program, commands, sizes, problems, cores=cores, semaphores=semaphores)
    if problems:
        raise _problem_error(program, problems)
    return commands


_ITEMSIZE = {name: dtypes.itemsize(name) for name in dtypes.DTYPES}


def _check_tensors(program: Program, arena: int,
                   problems: list[str]) -> tuple[list[int | None], list[int], int]:
    """Per-tensor checks, and each ARENA tensor's end against ``arena`` (the arena's size);
    returns each tensor's byte size (None when it cannot be known), the indices of the WEIGHTS
    tensors and the end of the WEIGHTS region (the largest end of its tensors), all in one pass.

    A tensor that is plainly sound (a tuple of ints >= 0, a known dtype, ARENA or WEIGHTS, an
    aligned int offset: every tensor of a decoded binary) is sized inline; any other goes
    through :func:`_check_tensor`, which names what is wrong (per-tensor objects and messages
    were ~2 ms of a 100-tensor load)."""
    nbytes: list[int | None] = []
    weight_idx: list[int] = []
    weights_end = 0
    past: list[str] = []  # ARENA tensors past its end, reported after every tensor's own checks
    itemsize, prod, in_arena, in_weights = _ITEMSIZE, math.prod, Region.ARENA, Region.WEIGHTS
    for i, t in enumerate(program.tensors):
        shape, offset, region = t.shape, t.offset, t.region
        item = itemsize.get(t.dtype) if type(t.dtype) is str else None
        n = None
        if item and type(shape) is tuple and type(offset) is int and offset >= 0 \
                and not offset % item and (region is in_arena or region is in_weights):
            for d in shape:  # a loop, not all(...): a third of its time
                if type(d) is not int or d < 0:
                    break
            else:
                n = prod(shape) * item
        if n is None:
            n = _check_tensor(i, t, problems)
        nbytes.append(n)
        if region == in_weights:
            weight_idx.append(i)
            if n is not None and offset + n > weights_end:
                weights_end = offset + n
        elif n is not None and region == in_arena and offset + n > arena:
            past.append(f"tensor {i} {t.name!r}: [{offset}, {offset + n}) ends past the "
                        f"arena of {program.arena_bytes} bytes")
    problems.extend(past)
    return nbytes, weight_idx, weights_end


def _check_tensor(i: int, t: TensorDesc, problems: list[str]) -> int | None:
    where = f"tensor {i} {t.name!r}"
    try:
        item = dtypes.itemsize(t.dtype)
        n = TensorSpec(t.shape, t.dtype).nbytes
    except (NpuSimError, TypeError, ValueError) as exc:
        problems.append(f"{where}: bad shape {t.shape!r} or dtype {t.dtype!r} ({exc})")
        return None
    if t.region not in (Region.ARENA, Region.WEIGHTS):
        problems.append(f"{where}: region {t.region!r}; tensors live in ARENA or WEIGHTS")
        return None
    if isinstance(t.offset, bool) or not isinstance(t.offset, int) or t.offset < 0:
        problems.append(f"{where}: offset {t.offset!r}; expected an int >= 0")
        return None
    if t.offset % item:
        problems.append(f"{where}: offset {t.offset} is not a multiple of its {t.dtype} "
                        f"itemsize {item}")
    return n


def _ranges_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _check_io(program: Program, nbytes: list[int | None], problems: list[str]) -> None:
    """Inputs are written by DMA, so no two may share memory. Outputs are only read back, so
    they may alias each other, an input or a weight, as ONNX graphs do (``Identity`` of an
    initializer, a tensor that is an output and also reshaped into another output)."""
    ntensors = len(program.tensors)
    for role, indices in (("input", program.inputs), ("output", program.outputs)):
        if role == "input" and len(set(indices)) != len(indices):
            problems.append(f"{role}s {list(indices)} name a tensor twice")
        spans: list[tuple[int, int, int]] = []
        for k, idx in enumerate(indices):
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < ntensors:
                problems.append(f"{role} {k}: tensor index {idx!r} out of range [0, {ntensors})")
                continue
            t, n = program.tensors[idx], nbytes[idx]
            if role == "input" and t.region != Region.ARENA:
                problems.append(f"input {k} {t.name!r} is in {t.region.name}; inputs are "
                                "written by DMA and must live in the ARENA")
            if n is None:
                continue
            if t.offset % DMA_ALIGNMENT:
                problems.append(f"{role} {k} {t.name!r}: offset {t.offset} is not a multiple of "
                                f"the DMA alignment {DMA_ALIGNMENT}")
            if role == "output":
                continue
            for other, start, end in spans:
                if t.region == program.tensors[other].region and \
                        _ranges_overlap((t.offset, t.offset + n), (start, end)) and other != idx:
                    problems.append(f"{role}s {program.tensors[other].name!r} and {t.name!r} "
                                    f"overlap ([{start}, {end}) and [{t.offset}, "
                                    f"{t.offset + n}))")
            spans.append((idx, t.offset, t.offset + n))


def _check_weights(program: Program, nbytes: list[int | None], weight_idx: list[int],
                   problems: list[str], functional: bool) -> None:
    """``weight_idx``: the WEIGHTS tensors' indices, in order."""
    is_weight = set(weight_idx)
    for key in program.weights:
        if key not in is_weight:
            problems.append(f"weights has an entry for tensor {key!r}, which is not a WEIGHTS "
                            "tensor")
    entries: list[tuple[int, tuple[int, int]]] = []  # (tensor, HBM span), in tensor order
    for i in weight_idx:
        t, n = program.tensors[i], nbytes[i]
        if n is None:
            continue
        data = program.weights.get(i)
        if data is None:
            if functional:
                problems.append(f"weight tensor {i} {t.name!r} has no bytes in weights")
        elif not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != n:
            got = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else \
                type(data).__name__
            problems.append(f"weight tensor {i} {t.name!r}: expected {n} bytes, got {got}")
            continue
        entries.append((i, (t.offset, t.offset + n)))
    problems.extend(_weight_overlaps(program, entries))


def _weight_overlaps(program: Program, entries: list[tuple[int, tuple[int, int]]]) -> list[str]:
    """Each weight against every distinct range placed before it (the first tensor placed at
    each range stands for it): overlapping ranges are a problem unless they are the same range
    with the same bytes. Sorting the ranges finds the overlapping pairs in O(n log n) plus the
    number of overlaps."""
    spans = sorted(span for _, span in entries)
    if all(a[1] <= b[0] for a, b in itertools.pairwise(spans)):  # disjoint: none overlap
        return []
    first: dict[tuple[int, int], int] = {}  # range -> position in entries of its first tensor
    for pos, (_, span) in enumerate(entries):
        first.setdefault(span, pos)
    ranges = sorted(first)
    overlapping: dict[tuple[int, int], list[tuple[int, int]]] = {r: [] for r in ranges}
    for k, span in enumerate(ranges):
        for other in ranges[k:]:
            if other[0] >= span[1] and other != span:
                break
            if _ranges_overlap(span, other):
                overlapping[span].append(other)
                if other != span:
                    overlapping[other].append(span)
    weights = program.weights
    found: list[tuple[int, int, str]] = []  # (position, position of the range's first, message)
    for pos, (i, span) in enumerate(entries):
        t = program.tensors[i]
        for other in overlapping[span]:
            first_pos = first[other]
            if first_pos >= pos:
                continue
            j = entries[first_pos][0]
            same = span == other and (weights.get(i) is None or weights.get(j) is None
                                      or _same_bytes(weights[i], weights[j]))
            if not same:
                found.append((pos, first_pos,
                              f"weight tensors {program.tensors[j].name!r} and {t.name!r} "
                              f"overlap ([{other[0]}, {other[1]}) and [{span[0]}, {span[1]})); "
                              "only identical contents may share a range"))
    return [message for _, _, message in sorted(found)]


def _check_launches(program: Program, problems: list[str]) -> None:
    ntensors = len(program.tensors)
    unknown = sorted({launch.op for launch in program.launches} - set(registry.names()))
    if unknown:
        problems.append(f"unknown kernels: {', '.join(unknown)}; registered: "
                        f"{', '.join(registry.names())}")
    tensors, in_weights = program.tensors, Region.WEIGHTS
    for k, launch in enumerate(program.launches):
        inputs, outputs = launch.inputs, launch.outputs
        for i in inputs:  # a sound launch (every one of a valid program) is not labelled
            if not (i == -1 or (isinstance(i, int) and 0 <= i < ntensors)):
                break
        else:
            for i in outputs:
                if not (isinstance(i, int) and 0 <= i < ntensors) \
                        or tensors[i].region == in_weights:
                    break
            else:
                if outputs:
                    continue
        where = f"launch {k} ({launch.op}, node {launch.node!r})"
        for i in inputs:
            if not (i == -1 or (isinstance(i, int) and 0 <= i < ntensors)):
                problems.append(f"{where}: input tensor index {i!r}; expected -1 (omitted) or "
                                f"[0, {ntensors})")
        if not outputs:
            problems.append(f"{where}: has no outputs")
        for i in outputs:
            if not (isinstance(i, int) and 0 <= i < ntensors):
                problems.append(f"{where}: output tensor index {i!r}; expected [0, {ntensors})")
            elif tensors[i].region == Region.WEIGHTS:
                problems.append(f"{where}: writes tensor {tensors[i].name!r} in the "
                                "read-only WEIGHTS region")


def _check_commands(program: Program, commands: list[Command], sizes: dict[Region, int],
                    problems: list[str], *, cores: int, semaphores: int) -> None:
    seen: set[int] = set()
    for c in commands:
        where = f"command {c.cmd_id}"
        if c.cmd_id in seen:
            problems.append(f"{where}: cmd_id used twice")
        for d in c.deps:
            if d not in seen:
                problems.append(f"{where}: depends on {d}, not an earlier command")
        seen.add(c.cmd_id)
        if isinstance(c, Dma):
            for role, address, writes in (("src", c.src, False), ("dst", c.dst, True)):
                msg = _check_reloc(address, c.nbytes, sizes, writes)
                if msg:
                    problems.append(f"{where}: DMA {role}: {msg}")
            if c.nbytes == 0:
                problems.append(f"{where}: DMA of 0 bytes")
        elif isinstance(c, Kernel):
            if c.launch >= len(program.launches):
                problems.append(f"{where}: launch index {c.launch} out of range; the program "
                                f"has {len(program.launches)} launches")
            if c.core_mask >> cores:
                problems.append(f"{where}: core_mask {c.core_mask:#x} names cores beyond the "
                                f"device's {cores}")
        elif isinstance(c, (Signal, Wait)) and c.semaphore >= semaphores:
            problems.append(f"{where}: semaphore {c.semaphore} out of range [0, {semaphores})")


def _check_reloc(address: int, nbytes: int, sizes: dict[Region, int], writes: bool) -> str:
    region, offset = split_reloc(address)
    if region not in (Region.ARENA, Region.WEIGHTS):
        name = Region(region).name if region in Region._value2member_map_ else str(region)
        return (f"address {address:#x} is in region {name}; program DMAs use "
                "reloc(ARENA|WEIGHTS, offset) (host transfers are added by the loader)")
    region = Region(region)
    if writes and region == Region.WEIGHTS:
        return "writes the read-only WEIGHTS region"
    if offset + nbytes > sizes[region]:
        return (f"[{offset}, {offset + nbytes}) runs past the {region.name} region of "
                f"{sizes[region]} bytes")
    if offset % DMA_ALIGNMENT:
        return f"offset {offset} is not a multiple of the DMA alignment {DMA_ALIGNMENT}"
    return ""


def load_program(fw: Firmware, program: Program, *, functional: bool = True,
                 stream: bool = False,
                 pinned: Mapping[int, tuple[DeviceBuffer, int]] | None = None) -> LoadedProgram:
    """Validate, allocate, upload weights and relocate; see the module docstring. ``stream``
    and ``pinned`` are :meth:`~firmware_model.weights.WeightStore.place`'s: weight uploads
    left in flight (kernels wait for their own weights), weights in caller-provided memory."""
    device = fw.device
    commands = validate(program, cores=device.config.cores, semaphores=len(fw.semaphores),
                        functional=functional)
    loaded = LoadedProgram(fw, program, functional)
    try:
        if program.arena_bytes:
            loaded.arena = device.malloc(program.arena_bytes)
        if program.weights_bytes:
            loaded.placement = fw.weights.place(
                program, shareable=not _reads_region(commands, Region.WEIGHTS),
                stream=stream, pinned=pinned)
            loaded.weights = loaded.placement.region
    except BaseException:
        loaded.unload()
        raise
    loaded.commands = [_relocate(c, loaded) for c in commands]
    return loaded


def _reads_region(commands: Sequence[Command], region: Region) -> bool:
    """Whether a DMA of ``commands`` addresses ``region`` (then its layout must stay whole)."""
    return any(isinstance(c, Dma) and region in (Region(split_reloc(c.src)[0]),
                                                 Region(split_reloc(c.dst)[0]))
               for c in commands)


def _same_bytes(a: bytes | bytearray | memoryview, b: bytes | bytearray | memoryview) -> bool:
    """Whether two weights hold the same bytes (at once when they are the same memory)."""
    x, y = host_bytes(a), host_bytes(b)
    if x.size == y.size and host_address(x) == host_address(y):
        return True
    return bool(np.array_equal(x, y))


def _relocate(cmd: Command, loaded: LoadedProgram) -> Command:
    if not isinstance(cmd, Dma):
        return cmd
    return Dma(cmd.cmd_id, loaded.absolute(cmd.src), loaded.absolute(cmd.dst), cmd.nbytes,
               deps=cmd.deps)


def _replayed(schedule: replay.Schedule, loaded: LoadedProgram, host_in: list[np.ndarray],
              host_out: list[np.ndarray]) -> bool:
    with blas.one_thread():
        return schedule.replay(loaded, host_in, host_out)


class LoadedProgram:
    """A program resident on the device: its regions, its relocated commands, and :meth:`run`."""

    def __init__(self, firmware: Firmware, program: Program, functional: bool) -> None:
        self.firmware = firmware
        self.program = program
        self.functional = functional
        self.arena: DeviceBuffer | None = None
        self.weights: DeviceBuffer | None = None
        """The buffer holding the WEIGHTS region as compiled, if the program has one (see
        :class:`~firmware_model.weights.Placement`); its weights may also be shared."""
        self.placement: Placement | None = None
        self.commands: list[Command] = []
        self.last_run_cycles: int | None = None
        self.loaded = True
        self._operands: dict[int, tuple[int, TensorSpec]] = {}
        self.replay = True
        """Whether later runs may replay the first one's schedule (:mod:`.replay`); False
        simulates every run."""
        self._replayable: bool | None = None
        self._schedules: dict[tuple, replay.Schedule | None] = {}
        """Recorded runs by :func:`.replay.key`; later runs replay them (:mod:`.replay`)."""
        self._pruned: dict[frozenset[int], list[Command]] = {}
        """Command streams of partial runs by wanted outputs (:mod:`.prune`)."""

    def base(self, region: Region) -> int:
        """HBM address of ``region``."""
        buf = self.arena if region == Region.ARENA else self.weights
        if buf is None:
            raise InvalidCommand(_SCOPE, f"program {self.program.name!r} has no {region.name} "
                                         "region allocated")
        return buf.address

    def absolute(self, address: int) -> int:
        """The HBM address of a relocatable ``address``."""
        region, offset = split_reloc(address)
        return self.base(Region(region)) + offset

    def operand(self, tensor: int) -> tuple[int, TensorSpec]:
        """``(HBM address, spec)`` of tensor ``tensor`` (what ``compute.execute`` takes)."""
        operand = self._operands.get(tensor)
        if operand is None:  # regions never move while loaded: resolve each tensor once
            t = self.program.tensors[tensor]
            if t.region == Region.WEIGHTS and self.placement is not None:
                address = self.placement.addresses[tensor]
            elif t.spec.nbytes == 0:  # an empty tensor has no byte to address: any region
                address = 0           # may be unallocated (an empty weight makes none)
            else:
                address = self.base(t.region) + t.offset
            operand = self._operands[tensor] = (address, t.spec)
        return operand

    def arrivals(self, tensors: Sequence[int]) -> list[simpy.Event]:
        """The streamed uploads of ``tensors``' weights (what a kernel reading them waits for
        and names as dependencies), until the first run after which all have landed."""
        ready = self.placement.ready if self.placement is not None else None
        if not ready:
            return []
        return list(dict.fromkeys(ready[t] for t in tensors if t in ready))

    def _forget_landed(self) -> None:
        ready = self.placement.ready if self.placement is not None else None
        for t in [t for t in ready or () if ready[t].processed]:
            del ready[t]  # landed: later runs need not wait or depend on it

    @property
    def replayable(self) -> bool:
        """Whether every pair of conflicting kernels is ordered by dependencies
        (:func:`.replay.replayable`; worked out once)."""
        if self._replayable is None:
            self._replayable = replay.replayable(self)
        return self._replayable

    @property
    def relocated_commands(self) -> bytes:
        """The command stream with absolute addresses, as the firmware runs it."""
        return pack(self.commands)

    def run(self, inputs: Sequence[np.ndarray] | None, *, functional: bool = True,
            queue: int = 0, outputs: Sequence[int] | None = None) -> list[np.ndarray | None]:
        """Run once: inputs in, commands, outputs out; returns the outputs (``None`` each in
        timing-only mode, where ``inputs`` may also be None). Raises DeviceFault on a fault.

        ``outputs``: indices of the outputs wanted (default all). For a proper subset the run
        is partial: only the commands those outputs need do work (:mod:`.prune`; the others
        are NOPs), only they are downloaded, the others are returned as ``None``, and the run
        is simulated, never replayed or recorded (:mod:`.replay`)."""
        prog, fw, device = self.program, self.firmware, self.firmware.device
        if not self.loaded:
            raise InvalidCommand(_SCOPE, f"program {prog.name!r} was unloaded")
        if functional and not self.functional:
            raise InvalidCommand(_SCOPE, f"program {prog.name!r} was loaded timing-only "
                                         "(functional=False); load it again to compute values")
        host_in = self._host_inputs(inputs, functional)
        # An output that is a weight (a constant) is read by a DMA, which cannot wait for a
        # streamed upload: let those land first.
        fw.weights.settle([e for e in self.arrivals(prog.outputs) if not e.processed])
        host_out = [np.zeros(t.shape, dtypes.to_numpy(t.dtype)) for t in prog.output_descs()]
        wanted = frozenset(range(len(host_out)) if outputs is None else outputs)
        partial = len(wanted) < len(host_out)
        body = self.commands
        if partial:
            body = self._pruned.get(wanted)
            if body is None:
                body = self._pruned[wanted] = prune.pruned(self, wanted)
        key = replay.key(self, functional, queue)
        schedule = self._schedules.get(key) if self.replay and not partial else None
        if schedule is not None and _replayed(schedule, self, host_in, host_out):
            self.last_run_cycles = schedule.cycles
            return list(host_out) if functional else [None] * len(host_out)
        before = replay.Schedule.begin(self, queue) if self.replayable and self.replay and \
            schedule is None and not partial else None
        used = {c.semaphore for c in self.commands if isinstance(c, (Signal, Wait))}
        fw.reset_semaphores(sorted(used))
        mapped: list[int] = []
        try:
            io_id = max((c.cmd_id for c in self.commands), default=-1) + 1
            pre: list[Command] = []
            post: list[Command] = []
            for arrays, indices, out in ((host_in, prog.inputs, pre),
                                         (host_out, prog.outputs, post)):
                for k, (array, index) in enumerate(zip(arrays, indices, strict=True)):
                    if not array.nbytes or (out is post and k not in wanted):
                        continue
                    iova = device.map_host(array)
                    mapped.append(iova)
                    address = self.operand(index)[0]
                    src, dst = (iova, address) if out is pre else (address, iova)
                    if io_id + 2 > U32_MAX:
                        raise InvalidCommand(_SCOPE, "command ids exhausted for I/O DMAs")
                    out.append(Dma(io_id, src, dst, array.nbytes))
                    io_id += 1
            stream = [*pre, Barrier(io_id), *body, Barrier(io_id + 1), *post]
            self.last_run_cycles = None
            start = device.now
            with blas.one_thread():  # see npu_sim.kernels.blas: once per run, not per kernel
                fw.run(stream, queue=queue, program=self, functional=functional)
            self.last_run_cycles = device.now - start
            self._forget_landed()
            if before is not None:
                self._schedules[key] = replay.Schedule.end(
                    self, before, functional=functional, queue=queue, commands=len(stream),
                    iovas=mapped)
        finally:
            for iova in mapped:
                device.unmap_host(iova)
        if not functional:
            return [None] * len(host_out)
        return [a if k in wanted else None for k, a in enumerate(host_out)]

    def _host_inputs(self, inputs: Sequence[np.ndarray] | None,
                     functional: bool) -> list[np.ndarray]:
        descs = self.program.input_descs()
        if inputs is None and not functional:
            return [np.zeros(t.shape, dtypes.to_numpy(t.dtype)) for t in descs]
        if inputs is None or len(inputs) != len(descs):
            got = "None" if inputs is None else str(len(inputs))
            raise InvalidCommand(_SCOPE, f"program {self.program.name!r} takes {len(descs)} "
                                         f"inputs ({', '.join(t.name for t in descs)}), got {got}")
        out = []
        for k, (array, t) in enumerate(zip(inputs, descs, strict=True)):
            want = dtypes.to_numpy(t.dtype)
            shape, dtype = getattr(array, "shape", None), getattr(array, "dtype", None)
            if not isinstance(array, np.ndarray) or shape != t.shape or dtype != want:
                raise InvalidCommand(_SCOPE, f"input {k} {t.name!r}: expected shape {t.shape} "
                                             f"{t.dtype}, got "
                                             + (f"shape {shape} {dtype}"
                                                if isinstance(array, np.ndarray)
                                                else type(array).__name__))
            out.append(np.require(array, requirements="C"))  # 0-d stays 0-d
        return out

    def unload(self) -> None:
        """Free the program's arena and release its weights (freed with their last user); it
        cannot run afterwards."""
        if self.arena is not None and not self.arena.freed:
            self.firmware.device.free(self.arena)
        if self.placement is not None:
            self.firmware.weights.release(self.placement)
        self.arena = self.weights = self.placement = None
        self._operands.clear()
        self._schedules.clear()
        self._pruned.clear()
        self.loaded = False


def run_program(device: Device, program: Program, inputs: Sequence[np.ndarray], *,
                functional: bool = True) -> list[np.ndarray | None]:
    """Load ``program`` on ``device`` with a fresh one-queue firmware, run it once, unload it."""
    from .processor import Firmware

    loaded = Firmware(device).load(program, functional=functional)
    try:
        return loaded.run(inputs, functional=functional)
    finally:
        loaded.unload()
