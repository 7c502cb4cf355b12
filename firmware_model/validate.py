"""Validating a compiled :class:`~firmware_model.program.Program` before it touches the device.

:func:`validate` checks everything the loader can without the device (the list is in
``docs/firmware.md``): tensors, inputs and outputs, weights, launches and the command stream
with every address it relocates. It raises one :class:`~npu_sim.errors.InvalidCommand` listing
every problem found (``.problems`` holds them one per entry), and returns the decoded commands.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from npu_sim import dtypes
from npu_sim.dma import DMA_ALIGNMENT
from npu_sim.dtypes import TensorSpec
from npu_sim.errors import InvalidCommand, NpuSimError
from npu_sim.kernels import registry

from .commands import Command, Dma, Kernel, Signal, Wait, unpack
from .program import KernelLaunch, Program, Region, TensorDesc, split_reloc
from .upload import host_address, host_bytes

SCOPE = "npu.fw.loader"
"""The scope of the loader's errors."""
_MAX_SHOWN = 20


def _problem_error(program: Program, problems: list[str]) -> InvalidCommand:
    shown = problems[:_MAX_SHOWN]
    more = f"\n  ... and {len(problems) - _MAX_SHOWN} more" if len(problems) > _MAX_SHOWN else ""
    err = InvalidCommand(SCOPE, f"program {program.name!r} is invalid "
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

    A program whose structure (tensors, launches, commands, inputs, outputs: the very objects)
    passed before is not checked again (:class:`_Memo`); its weights and what depends on the
    device (core masks, semaphores) are, on every load, with the same problems.
    """
    memo = MEMO.get(program)
    if memo is not None:
        problems: list[str] = []
        _check_weights(program, memo.nbytes, memo.weight_idx, problems, functional)
        for c in memo.commands:
            _check_device(c, problems, cores, semaphores)
        if problems:
            raise _problem_error(program, problems)
        return list(memo.commands)
    problems, commands = _validate(program, functional, cores, semaphores)
    if problems:
        raise _problem_error(program, problems)
    return commands


def validate_structure(program: Program) -> None:
    """Validate what of ``program`` does not depend on a device or its weights' bytes, and keep
    it in :data:`MEMO` if sound, so its first load checks only the rest (a context binary just
    written, whose records the EP keeps decoded). Reports nothing: a load reports problems."""
    if MEMO.get(program) is None:
        _validate(program, True, None, None)


def _validate(program: Program, functional: bool, cores: int | None,
              semaphores: int | None) -> tuple[list[str], list[Command]]:
    """Every problem of ``program`` (without a device's, when ``cores`` is None) and its
    decoded commands; a sound structure goes into :data:`MEMO`."""
    problems: list[str] = []
    sizes = {Region.ARENA: program.arena_bytes, Region.WEIGHTS: 0}
    if isinstance(program.arena_bytes, bool) or not isinstance(program.arena_bytes, int) \
            or program.arena_bytes < 0:
        problems.append(f"arena_bytes={program.arena_bytes!r}; expected an int >= 0")
        sizes[Region.ARENA] = 0
    nbytes, weight_idx, sizes[Region.WEIGHTS], plain = _check_tensors(
        program, sizes[Region.ARENA], problems)
    _check_io(program, nbytes, problems)
    structural = len(problems)
    _check_weights(program, nbytes, weight_idx, problems, functional)
    elsewhere = len(problems) - structural  # weights' problems, then the device's
    _check_launches(program, problems)
    commands: list[Command] = []
    try:
        commands = unpack(program.commands)
    except InvalidCommand as exc:
        problems.append(f"command stream: {exc.message}")
    elsewhere += _check_commands(program, commands, sizes, problems, cores=cores,
                                 semaphores=semaphores)
    if plain and len(problems) == elsewhere:  # sound, whatever the weights and the device
        MEMO.put(program, nbytes, weight_idx, commands)
    return problems, commands


@dataclass(frozen=True, eq=False)
class _Passed:
    """A program structure that passed :func:`validate`: the objects themselves (held, so their
    ids stay theirs while the entry lives) and what validating them found."""

    tensors: tuple[TensorDesc, ...]
    launches: tuple[KernelLaunch, ...]
    commands_bytes: bytes
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    arena_bytes: int
    ops: frozenset[str]
    nbytes: list[int | None]
    weight_idx: list[int]
    commands: tuple[Command, ...]


class _Memo:
    """The program structures that passed validation lately, found by identity: a program read
    again from a context binary whose decoded records were kept (:mod:`ep.npusim.binary_cache`)
    shares its tensors, launches and command bytes with the previous load (or with the records
    decoded when the binary was written, which the EP gives :func:`validate_structure`), and
    skips their checks (MobileNet-V3's 64 launches: about 0.2 ms a load).

    Only such programs are kept: structures made of immutable values, as a context binary's
    decoder builds them (tuples, ints, strings, bytes, frozen records, and each launch's
    ``attrs`` a read-only ``MappingProxyType``), so the same objects cannot hold other values
    later. A program compiled from source (its attrs are dicts) is never found by identity
    again and is not kept. A kernel unregistered since makes the entry not apply.

    An LRU of at most ``entries`` entries and ``max_bytes`` of estimated memory
    (:func:`_footprint`: the structure, which the entry keeps alive, and its decoded commands);
    an entry estimated over ``max_bytes / 4`` is not kept. Thread-safe."""

    def __init__(self, entries: int = 8, max_bytes: int = 64 << 20) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._items: OrderedDict[int, _Passed] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, program: Program) -> _Passed | None:
        with self._lock:
            found = self._items.get(id(program.tensors))
            if found is None or found.tensors is not program.tensors \
                    or found.launches is not program.launches \
                    or found.commands_bytes is not program.commands \
                    or found.inputs is not program.inputs or found.outputs is not program.outputs \
                    or found.arena_bytes != program.arena_bytes:
                return None
            self._items.move_to_end(id(program.tensors))
        return found if found.ops.issubset(registry.names()) else None

    def put(self, program: Program, nbytes: list[int | None], weight_idx: list[int],
            commands: list[Command]) -> None:
        if not _immutable(program):
            return
        passed = _Passed(program.tensors, program.launches, program.commands, program.inputs,
                         program.outputs, program.arena_bytes,
                         frozenset(launch.op for launch in program.launches), nbytes, weight_idx,
                         tuple(commands))
        size = _footprint(passed)
        if size > self.max_bytes // 4:
            return
        key = id(program.tensors)
        with self._lock:
            self._bytes += size - self._sizes.get(key, 0)
            self._items[key] = passed
            self._sizes[key] = size
            self._items.move_to_end(key)
            while len(self._items) > self.entries or self._bytes > self.max_bytes:
                old, _ = self._items.popitem(last=False)
                self._bytes -= self._sizes.pop(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._sizes.clear()
            self._bytes = 0

    def reset_after_fork(self) -> None:
        """A new lock and no entries, for a forked child: a thread of the parent may have held
        the lock (never released in the child) in the middle of changing the entries."""
        self._lock = threading.Lock()
        self._items = OrderedDict()
        self._sizes = {}
        self._bytes = 0


_ENTRY_BYTES = 1500
_TENSOR_BYTES = 600
_LAUNCH_BYTES = 500
_ATTR_BYTES = 300
_COMMAND_BYTES = 700
"""Estimated memory of a memo entry's parts (``sys.getsizeof`` summed over what each holds):
the tests' sample program measures about 515 bytes a tensor, 2,032 for a launch of 7
attributes, 590 a decoded command, and 1,100 the entry itself (its record, the set of ops and
the lists of sizes)."""


def _footprint(passed: _Passed) -> int:
    """The estimated memory a memo entry holds (see ``_TENSOR_BYTES``)."""
    return (_ENTRY_BYTES + _TENSOR_BYTES * len(passed.tensors) + len(passed.commands_bytes)
            + sum(_LAUNCH_BYTES + _ATTR_BYTES * len(k.attrs) for k in passed.launches)
            + _COMMAND_BYTES * len(passed.commands))


def _immutable(program: Program) -> bool:
    """Whether ``program``'s structure is made of values that cannot change, as a context
    binary's decoder builds it (a program compiled or built by hand holds dicts of attrs, and
    may hold lists), its tensors known to be (``_check_tensors``)."""
    if type(program.tensors) is not tuple or type(program.launches) is not tuple \
            or type(program.commands) is not bytes or type(program.inputs) is not tuple \
            or type(program.outputs) is not tuple or type(program.arena_bytes) is not int:
        return False
    return all(type(k) is KernelLaunch and type(k.op) is str and type(k.inputs) is tuple
               and type(k.outputs) is tuple and type(k.attrs) is MappingProxyType
               for k in program.launches)


MEMO = _Memo()
"""The process's memo of validated program structures (see :class:`_Memo`)."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=MEMO.reset_after_fork)


_ITEMSIZE = {name: dtypes.itemsize(name) for name in dtypes.DTYPES}


def _check_tensors(program: Program, arena: int,
                   problems: list[str]) -> tuple[list[int | None], list[int], int, bool]:
    """Per-tensor checks, and each ARENA tensor's end against ``arena`` (the arena's size);
    returns each tensor's byte size (None when it cannot be known), the indices of the WEIGHTS
    tensors, the end of the WEIGHTS region (the largest end of its tensors) and whether every
    tensor was plainly sound and made of immutable values (see below), all in one pass.

    A tensor that is plainly sound (a tuple of ints >= 0, a known dtype, ARENA or WEIGHTS, an
    aligned int offset: every tensor of a decoded binary) is sized inline; any other goes
    through :func:`_check_tensor`, which names what is wrong (per-tensor objects and messages
    were ~2 ms of a 100-tensor load)."""
    nbytes: list[int | None] = []
    weight_idx: list[int] = []
    weights_end = 0
    past: list[str] = []  # ARENA tensors past its end, reported after every tensor's own checks
    itemsize, prod, in_arena, in_weights = _ITEMSIZE, math.prod, Region.ARENA, Region.WEIGHTS
    plain = True
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
            plain = False
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
    return nbytes, weight_idx, weights_end, plain and all(type(t) is TensorDesc
                                                          for t in program.tensors)


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
                    problems: list[str], *, cores: int | None,
                    semaphores: int | None) -> int:
    """The commands' problems; those of the device (:func:`_check_device`, skipped when
    ``cores`` is None) in their place among them. Returns how many those were."""
    seen: set[int] = set()
    device = 0
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
        elif isinstance(c, Kernel) and c.launch >= len(program.launches):
            problems.append(f"{where}: launch index {c.launch} out of range; the program "
                            f"has {len(program.launches)} launches")
        if cores is not None and semaphores is not None:
            device += _check_device(c, problems, cores, semaphores)
    return device


def _check_device(c: Command, problems: list[str], cores: int, semaphores: int) -> int:
    """A command's problems on a device with ``cores`` cores and ``semaphores`` semaphores
    (a KERNEL's core mask, a SIGNAL's or WAIT's semaphore); returns how many."""
    if isinstance(c, Kernel):
        if c.core_mask >> cores:
            problems.append(f"command {c.cmd_id}: core_mask {c.core_mask:#x} names cores "
                            f"beyond the device's {cores}")
            return 1
    elif isinstance(c, (Signal, Wait)) and c.semaphore >= semaphores:
        problems.append(f"command {c.cmd_id}: semaphore {c.semaphore} out of range "
                        f"[0, {semaphores})")
        return 1
    return 0


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


def _same_bytes(a: bytes | bytearray | memoryview, b: bytes | bytearray | memoryview) -> bool:
    """Whether two weights hold the same bytes (at once when they are the same memory)."""
    x, y = host_bytes(a), host_bytes(b)
    if x.size == y.size and host_address(x) == host_address(y):
        return True
    return bool(np.array_equal(x, y))
