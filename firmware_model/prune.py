"""Partial runs: the part of a program's command stream that some of its outputs need.

:func:`pruned` keeps the KERNEL commands that write the bytes of the wanted outputs and the
backward closure of their dependencies; every other command becomes a NOP with no dependencies,
so command ids (and the dependencies of what is kept) stay valid. It prunes only streams whose
conflicting kernels are all ordered by dependencies (:attr:`.LoadedProgram.replayable`) and
that hold no BARRIER: there a kept kernel's dependencies include every earlier writer of what
it reads, so its values are the full run's bit for bit. Any other stream is returned whole.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from .commands import Command, Kernel, Nop
from .program import Region

if TYPE_CHECKING:
    from .loader import LoadedProgram


def pruned(loaded: LoadedProgram, outputs: Collection[int]) -> list[Command]:
    """``loaded``'s commands with only what program outputs ``outputs`` (indices into
    ``program.outputs``) need still doing work."""
    commands = loaded.commands
    if not all(isinstance(c, (Kernel, Nop)) for c in commands) or not loaded.replayable:
        return list(commands)
    tensors, launches = loaded.program.tensors, loaded.program.launches
    spans = []
    for k in outputs:
        t = tensors[loaded.program.outputs[k]]
        if t.region == Region.ARENA and t.nbytes:
            spans.append((t.offset, t.offset + t.nbytes))
    position = {c.cmd_id: i for i, c in enumerate(commands)}
    pending = []
    for i, c in enumerate(commands):
        if isinstance(c, Kernel):
            written = [tensors[u] for u in launches[c.launch].outputs if u >= 0]
            if any(u.region == Region.ARENA and u.offset < hi and lo < u.offset + u.nbytes
                   for u in written for lo, hi in spans):
                pending.append(i)
    keep: set[int] = set()
    while pending:
        i = pending.pop()
        if i not in keep:
            keep.add(i)
            pending.extend(position[d] for d in commands[i].deps)
    return [c if i in keep else Nop(c.cmd_id) for i, c in enumerate(commands)]
