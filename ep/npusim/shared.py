"""The NPU EP's shared workspace: EPContext weight sharing across sessions.

ONNX Runtime's "EP Context Design" ("EPContext with Weight Sharing"; ``docs/epcontext.md``)
groups sessions with ``ep.share_ep_contexts=1``; the last one sets
``ep.stop_share_ep_contexts=1``. The EP keeps what the group shares in a process-wide singleton,
:func:`workspace`, every access guarded by one lock.

**Generation** (``ep.context_enable=1``). The first session of a group fixes the context binary
``[model1_name]_npusim.bin`` beside its EPContext model; every session compiles its graphs,
writes its own ``modelN_ctx.onnx`` whose EPContext nodes reference that file, and adds its
programs to the group; the stop session writes the one binary holding every graph of the group
(each distinct weight stored once, the writer dedups by content) and clears the group. A session
works in two phases so that a failure leaves the group as it was: :meth:`SharedWorkspace.stage`
(at compile: checks the folder, device and graph names, and for the stop session writes the
binary) and :meth:`SharedWorkspace.commit` / :meth:`SharedWorkspace.abort` once the session's
EPContext model is written or has failed. Until the stop session commits, no binary exists.

**Loading** (``ep.context_enable`` off). Sessions share the opened binaries: the first session
whose node names a binary opens (mmaps and verifies) it and leaves the graphs it did not use in
the workspace; a later session *moves* its graphs out of the workspace and reuses the same
opened binary, without reading the file again. When every graph of a binary has been moved out,
the workspace drops it (the sessions keep it alive); a session whose graph was already moved out
opens the file itself. Sessions with the same device settings also share one simulated device
(:class:`~ep.npusim.runtime.NpuRuntime`), held weakly: it lives as long as a session uses it.
A loading session with ``ep.stop_share_ep_contexts=1`` releases everything the workspace holds
after taking its own graphs.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from firmware_model import Program

from ..errors import Fail, InvalidArgument
from .binary import ContextBinary, write_context_binary
from .external_weights import ExternalSpec, ExternalWeightFile
from .runtime import NpuRuntime

EP_SHORT_NAME = "npusim"


@dataclass
class GenerationGroup:
    """The session group being generated: where its binary goes and the graphs compiled so far.

    ``programs`` maps graph name -> program, in the order the sessions committed them;
    ``owners`` maps graph name -> the EPContext model file that references it.
    """

    binary_path: Path
    hardware_architecture: str
    config_digest: str
    programs: dict[str, Program] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    sessions: int = 0

    @property
    def folder(self) -> Path:
        """The folder every EPContext model of the group and the binary live in."""
        return self.binary_path.parent


@dataclass(frozen=True)
class Staged:
    """One session's graphs, checked against the group but not yet part of it."""

    ticket: int
    binary_path: Path
    hardware_architecture: str
    config_digest: str
    model_file: str
    programs: tuple[Program, ...]
    stop: bool
    external_weights: tuple[ExternalWeightFile, ...] = ()
    """The external weights of the group's binary, when this (stop) session wrote it."""


@dataclass
class _SharedBinary:
    binary: ContextBinary
    available: set[str]


RuntimeKey = tuple[str, str, bool]
"""(device config digest, allocator, functional): sessions that may share one device."""


class SharedWorkspace:
    """What the sessions of a group share (see the module docstring). Use :func:`workspace`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._group: GenerationGroup | None = None
        self._pending: dict[int, Staged] = {}
        self._tickets = 0
        self._binaries: dict[Path, _SharedBinary] = {}
        self._runtimes: weakref.WeakValueDictionary[RuntimeKey, NpuRuntime] = \
            weakref.WeakValueDictionary()

    # -- generation -------------------------------------------------------------------------

    def check_joinable(self, output_path: Path, hardware_architecture: str,
                       config_digest: str) -> None:
        """Raise if a session writing ``output_path`` for this device could not join the
        current group (checked when the provider is created, before compiling)."""
        with self._lock:
            if self._group is not None:
                self._check_group(self._group, output_path.resolve(), hardware_architecture,
                                  config_digest)

    def stage(self, output_path: Path, binary_path: Path, programs: Sequence[Program], *,
              hardware_architecture: str, config_digest: str, stop: bool,
              external: ExternalSpec | None = None) -> Staged:
        """Check one session's freshly compiled ``programs`` against the group and reserve
        their graph names; for the stop session, write the group's binary now (atomically).

        The first session of a group fixes ``binary_path`` (``[model1_name]_npusim.bin`` beside
        its EPContext model); later sessions' ``binary_path`` is ignored. Errors: a different
        folder, device or a graph name already in the group is ``InvalidArgument``; an
        existing binary, or a stop session while other sessions of the group are still
        generating, is ``Fail``.
        """
        output_path = output_path.resolve()
        with self._lock:
            group = self._group
            if group is None:
                binary_path = binary_path.resolve()
                known: dict[str, str] = {}
            else:
                self._check_group(group, output_path, hardware_architecture, config_digest)
                binary_path = group.binary_path
                known = dict(group.owners)
            for other in self._pending.values():
                known.update((p.name, other.model_file) for p in other.programs)
            self._check_names(programs, known, output_path.name)
            if binary_path.exists():
                raise Fail(f"cannot share EP contexts into {str(binary_path)!r}: the file exists "
                           "already. Remove it (or generate into another folder) and start the "
                           "session group again.")
            if stop and self._pending:
                busy = sorted({s.model_file for s in self._pending.values()})
                raise Fail(f"ep.stop_share_ep_contexts=1: sessions of the group are still "
                           f"generating {busy}; create the last session after they finish")
            self._tickets += 1
            written: list[ExternalWeightFile] = []
            if stop:
                everything = [*(group.programs.values() if group else ()), *programs]
                written = write_context_binary(binary_path, everything,
                                               hardware_architecture=hardware_architecture,
                                               config_digest=config_digest, external=external)
            staged = Staged(self._tickets, binary_path, hardware_architecture, config_digest,
                            output_path.name, tuple(programs), stop, tuple(written))
            self._pending[staged.ticket] = staged
            return staged

    def commit(self, staged: Staged) -> None:
        """The session's EPContext model is written: its graphs join the group (the first
        session creates it); the stop session's commit ends the group."""
        with self._lock:
            if self._pending.pop(staged.ticket, None) is None:
                return
            if self._group is None:
                self._group = GenerationGroup(staged.binary_path, staged.hardware_architecture,
                                              staged.config_digest)
            group = self._group
            for program in staged.programs:
                group.programs[program.name] = program
                group.owners[program.name] = staged.model_file
            group.sessions += 1
            if staged.stop:
                self._group = None

    def abort(self, staged: Staged) -> None:
        """The session failed: forget its graphs; the group is as it was before it."""
        with self._lock:
            self._pending.pop(staged.ticket, None)

    def finish_without_graphs(self, output_path: Path, *, hardware_architecture: str,
                              config_digest: str, external: ExternalSpec | None = None,
                              ) -> list[ExternalWeightFile]:
        """A stop session that compiled nothing for the NPU: write the group's binary from
        what the group holds and end the group (no group: nothing to do); returns the external
        weights it refers to."""
        with self._lock:
            group = self._group
            if group is None:
                return []
            self._check_group(group, output_path.resolve(), hardware_architecture,
                              config_digest)
            if self._pending:
                busy = sorted({s.model_file for s in self._pending.values()})
                raise Fail(f"ep.stop_share_ep_contexts=1: sessions of the group are still "
                           f"generating {busy}; create the last session after they finish")
            if group.binary_path.exists():
                raise Fail(f"cannot share EP contexts into {str(group.binary_path)!r}: the "
                           "file exists already. Remove it and start the session group again.")
            written = write_context_binary(group.binary_path, list(group.programs.values()),
                                           hardware_architecture=group.hardware_architecture,
                                           config_digest=group.config_digest, external=external)
            self._group = None
            return written

    @property
    def group(self) -> GenerationGroup | None:
        """The group being generated, or None when the next generating session is a first."""
        with self._lock:
            return self._group

    @staticmethod
    def _check_group(group: GenerationGroup, output_path: Path, hardware_architecture: str,
                     config_digest: str) -> None:
        if output_path.parent != group.folder:
            raise InvalidArgument(
                f"ep.share_ep_contexts=1: the EPContext model {str(output_path)!r} must be in "
                f"the folder of the session group, {str(group.folder)!r}, beside its context "
                f"binary {group.binary_path.name!r} (the design keeps every file of a group in "
                "one folder). Set ep.context_file_path into that folder.")
        if (hardware_architecture, config_digest) != (group.hardware_architecture,
                                                      group.config_digest):
            raise InvalidArgument(
                f"ep.share_ep_contexts=1: this session compiles for device "
                f"{hardware_architecture!r} (config digest {config_digest[:12]}), the session "
                f"group for {group.hardware_architecture!r} ({group.config_digest[:12]}); one "
                "context binary holds programs for one device. Use the same device option.")

    @staticmethod
    def _check_names(programs: Sequence[Program], known: dict[str, str], model: str) -> None:
        seen: set[str] = set()
        for program in programs:
            owner = known.get(program.name) or (model if program.name in seen else None)
            if owner is not None:
                raise InvalidArgument(
                    f"ep.share_ep_contexts=1: graph name {program.name!r} of {model!r} is "
                    f"already used by {owner!r} in the session group; graph names must be "
                    "unique in the shared context binary. Give each model its own "
                    "ep.context_node_name_prefix.")
            seen.add(program.name)

    # -- loading ----------------------------------------------------------------------------

    def acquire_binary(self, path: Path, wanted: Iterable[str],
                       opener: Callable[[Path], ContextBinary]) -> ContextBinary:
        """The opened binary at ``path`` for a session that uses graphs ``wanted`` of it.

        If the workspace holds it and every graph of ``wanted`` that the binary has is still
        available, those graphs move out to the session and the same opened binary is returned.
        If the workspace does not hold it, ``opener`` opens it and the graphs this session does
        not use stay available to the next sessions. If a wanted graph was moved out already,
        the session gets a binary of its own (``opener``), as the design prescribes.
        """
        path = path.resolve()
        wanted = set(wanted)
        with self._lock:
            shared = self._binaries.get(path)
            if shared is None:
                binary = opener(path)
                rest = set(binary.graph_names()) - wanted
                if rest:
                    self._binaries[path] = _SharedBinary(binary, rest)
                return binary
            mine = wanted & set(shared.binary.graph_names())
            if not mine <= shared.available:
                return opener(path)
            shared.available -= mine
            if not shared.available:
                del self._binaries[path]
            return shared.binary

    def runtime(self, key: RuntimeKey, factory: Callable[[], NpuRuntime]) -> NpuRuntime:
        """The device shared by sessions with settings ``key`` (made by ``factory`` when no
        live session uses one)."""
        with self._lock:
            runtime = self._runtimes.get(key)
            if runtime is None:
                runtime = factory()
                self._runtimes[key] = runtime
            return runtime

    def release_loaded(self) -> None:
        """End the loading group: drop the binaries and devices the workspace holds (sessions
        keep theirs)."""
        with self._lock:
            self._binaries.clear()
            self._runtimes.clear()

    def shared_binaries(self) -> dict[Path, list[str]]:
        """Binary path -> graphs still available in the workspace, for inspection."""
        with self._lock:
            return {p: sorted(s.available) for p, s in self._binaries.items()}

    # -- both -------------------------------------------------------------------------------

    def is_empty(self) -> bool:
        """True when nothing is shared: no group, no pending session, no binary, no device."""
        with self._lock:
            return self._group is None and not self._pending and not self._binaries \
                and not len(self._runtimes)

    def reset(self) -> None:
        """Forget everything (a group whose last session never came, for example). Files
        already written stay; no binary is written."""
        with self._lock:
            self._group = None
            self._pending.clear()
            self._binaries.clear()
            self._runtimes.clear()


_WORKSPACE = SharedWorkspace()


def workspace() -> SharedWorkspace:
    """The process-wide shared workspace of the NPU EP."""
    return _WORKSPACE
