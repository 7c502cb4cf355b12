"""External weights: a context binary's weights in files of their own, shared by every model
compiled into one folder (the external-weight design of ``shared/reference/ge-external-weights``).

Provider option ``external_weights``:

* ``0`` (default): the weights are in the context binary (its WEIGHTS section);
* ``1``: one file per distinct weight, ``weight_<sha256>``;
* ``2``: one combined file per compile, ``<model>_weight_combined``, every weight at a 512-byte
  aligned offset.

The files go to a folder (provider option ``external_weights_folder``, default ``weight``),
relative to the folder of the ``_ctx.onnx`` and inside it; the binary records each weight's file
relative to the binary's own folder (``weight/weight_<sha256>``), its offset, length and SHA-256.

``meta.json`` in the weight folder maps every weight's SHA-256 to its file (a name in the folder)
and its offset, in the design's format::

    {"hash_to_weight_file": {"<sha256>": "weight_<sha256>"},
     "hash_to_weight_offset": {"<sha256>": 0}}

A weight whose hash meta.json already lists (and whose file holds it) is not written again, so
identical weights are stored once across every model compiled into the folder. Compilers in
several threads or processes take an exclusive ``fcntl.flock`` on ``.meta.lock`` in the folder
for the whole update (read meta.json, write the new weight files, write meta.json); every file is
written atomically (:func:`~ep.framework.files.atomic_write`), so a killed compiler leaves at most
a temporary file, never a torn weight file or meta.json.

Reading (:func:`open_external`) refuses, with :class:`~ep.errors.InvalidGraph` naming the file
and what is wrong, a path that leaves the binary's folder, a missing or truncated file, an offset
outside the file, a meta.json that is missing, malformed or maps a hash elsewhere than the binary
says, and a weight whose bytes do not hash to the recorded SHA-256.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from firmware_model.upload import drop_resident

from ..errors import Fail, InvalidArgument, InvalidGraph
from ..framework.files import atomic_write, open_regular, remove_stale_temporaries

META = "meta.json"
LOCK = ".meta.lock"
ALIGN = 512
MODES = (0, 1, 2)
DEFAULT_FOLDER = "weight"

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ExternalWeightFile:
    """One external weight, as a compile summary lists it (GE's ``ExternalWeightDesc``):
    ``path`` of its file, ``size`` in bytes, ``offset`` in the file, ``id`` (its SHA-256)."""

    path: str
    size: int
    offset: int
    id: str


@dataclass(frozen=True)
class ExternalSpec:
    """Where a compile puts its weights: ``mode`` 1 or 2, ``folder`` (absolute), the binary's
    folder (what recorded paths are relative to) and the model name (mode 2's file name)."""

    mode: int
    folder: Path
    binary_folder: Path
    model_name: str


def external_spec(mode: str, folder: str, output_path: Path,
                  model_name: str) -> ExternalSpec | None:
    """The spec from the provider options (``None`` for mode 0); ``InvalidArgument`` for a mode
    other than 0, 1, 2 or a folder that is absolute or leaves the ``_ctx.onnx``'s folder."""
    if mode not in ("0", "1", "2"):
        raise InvalidArgument(f"NpuSimExecutionProvider option external_weights={mode!r}; "
                              "expected '0' (in the context binary), '1' (one file per weight) "
                              "or '2' (one combined file)")
    if mode == "0":
        return None
    relative = PurePosixPath(folder.replace(os.sep, "/"))
    if not folder or relative.is_absolute() or ".." in relative.parts or "\0" in folder:
        raise InvalidArgument(f"NpuSimExecutionProvider option external_weights_folder="
                              f"{folder!r}: expected a relative folder inside the EPContext "
                              f"model's folder {str(output_path.parent)!r} (default "
                              f"{DEFAULT_FOLDER!r})")
    base = output_path.parent.resolve()
    return ExternalSpec(int(mode), base / relative, base, model_name)


# -- meta.json -------------------------------------------------------------------------------

def read_meta(path: Path) -> dict[str, tuple[str, int]]:
    """``meta.json`` as hash -> (file name, offset); ``InvalidGraph`` naming the file if it is
    not the design's two maps of strings and non-negative integers over the same hashes."""
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InvalidGraph(f"external weights: {str(path)!r} does not exist; the weight folder "
                           "has no meta.json (recompile the model or restore the folder)") from None
    except (OSError, ValueError) as exc:
        raise InvalidGraph(f"external weights: {str(path)!r} is not readable JSON ({exc})") \
            from None
    files = raw.get("hash_to_weight_file") if isinstance(raw, dict) else None
    offsets = raw.get("hash_to_weight_offset") if isinstance(raw, dict) else None
    if not isinstance(files, dict) or not isinstance(offsets, dict) or set(files) != set(offsets):
        raise InvalidGraph(f"external weights: {str(path)!r} must hold the objects "
                           "hash_to_weight_file and hash_to_weight_offset over the same hashes")
    meta: dict[str, tuple[str, int]] = {}
    for digest, name in files.items():
        offset = offsets[digest]
        if not isinstance(name, str) or "/" in name or name in ("", ".", "..") or \
                isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidGraph(f"external weights: {str(path)!r} entry {digest!r}: file {name!r}"
                               f" and offset {offset!r}; expected a file name in the folder and "
                               "an integer >= 0")
        meta[digest] = (name, offset)
    return meta


def _meta_bytes(meta: dict[str, tuple[str, int]]) -> bytes:
    order = sorted(meta)
    return json.dumps({"hash_to_weight_file": {h: meta[h][0] for h in order},
                       "hash_to_weight_offset": {h: meta[h][1] for h in order}},
                      indent=1).encode()


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the folder's lock file, for threads and processes alike."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise Fail(f"cannot use the weight folder {str(folder)!r}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# -- writing -----------------------------------------------------------------------------------

@dataclass
class WeightWriter:
    """Collects a compile's weights and writes what the folder lacks (see the module doc).

    :meth:`add` is called for each distinct weight while the binary is laid out and returns
    where it will live; :meth:`commit` writes the files and meta.json under the folder lock.
    Offsets in a mode 2 combined file are fixed before anything is written, so the lock is held
    only for the writes; a weight another compiler stored meanwhile is then not written again
    (the binary records the other file)."""

    spec: ExternalSpec
    weights: dict[str, Buffer] = field(default_factory=dict)  # sha256 -> bytes, in order

    def add(self, data: Buffer) -> str:
        """Record ``data``; its SHA-256 (hex), by which :meth:`commit` locates it."""
        digest = hashlib.sha256(data).hexdigest()
        self.weights.setdefault(digest, data)
        return digest

    def commit(self) -> dict[str, tuple[str, int]]:
        """Write the weights the folder does not hold and meta.json; hash -> (path relative to
        the binary's folder, offset) for every weight added."""
        folder = self.spec.folder
        with _locked(folder):
            remove_stale_temporaries(folder)
            meta = read_meta(folder / META) if (folder / META).exists() else {}
            fresh = [h for h in self.weights if not self._stored(meta, h)]
            if self.spec.mode == 1:
                for digest in fresh:
                    atomic_write(folder / f"weight_{digest}", [self.weights[digest]])
                    meta[digest] = (f"weight_{digest}", 0)
            elif fresh:
                self._write_combined(meta, fresh)
            if fresh or not (folder / META).exists():
                atomic_write(folder / META, [_meta_bytes(meta)])
        prefix = self.spec.folder.relative_to(self.spec.binary_folder).as_posix()
        return {h: (f"{prefix}/{meta[h][0]}", meta[h][1]) for h in self.weights}

    def _stored(self, meta: dict[str, tuple[str, int]], digest: str) -> bool:
        """Whether meta.json lists ``digest`` in a file long enough to hold it."""
        if digest not in meta:
            return False
        name, offset = meta[digest]
        try:
            size = (self.spec.folder / name).stat().st_size
        except OSError:
            return False
        return offset + len(self.weights[digest]) <= size

    def _write_combined(self, meta: dict[str, tuple[str, int]], fresh: Sequence[str]) -> None:
        used = {name for name, _ in meta.values()}
        name, k = f"{self.spec.model_name}_weight_combined", 1
        while name in used or (self.spec.folder / name).exists():
            name, k = f"{self.spec.model_name}_weight_combined_{k}", k + 1
        pieces: list[Buffer] = []
        size = 0
        for digest in fresh:
            offset = -(-size // ALIGN) * ALIGN
            pieces.append(bytes(offset - size))
            pieces.append(self.weights[digest])
            size = offset + len(self.weights[digest])
            meta[digest] = (name, offset)
        atomic_write(self.spec.folder / name, pieces)


# -- reading -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExternalRef:
    """One external weight as the binary records it: file (relative to the binary's folder,
    ``/``-separated), offset, length and SHA-256."""

    file: str
    offset: int
    length: int
    sha256: bytes


_WORKERS = min(2, os.cpu_count() or 1)


class ExternalFiles:
    """The mapped weight files of one binary, validated (:func:`open_external`)."""

    def __init__(self) -> None:
        self.mappings: dict[Path, mmap.mmap] = {}
        self.views: list[memoryview] = []  # per reference, in the binary's order
        self.listing: list[ExternalWeightFile] = []

    def close(self) -> None:
        """Release every mapping no weight view still uses."""
        self.views.clear()
        for mapping in self.mappings.values():
            with contextlib.suppress(BufferError):
                mapping.close()
        self.mappings.clear()


def open_external(refs: Sequence[ExternalRef], base: Path | None) -> ExternalFiles:
    """Map and validate every file ``refs`` name, relative to ``base`` (the binary's folder).

    Each weight is hashed (two threads) before anything is returned: a wrong byte is refused at
    session creation, never computed with at run."""
    out = ExternalFiles()
    if not refs:
        return out
    if base is None:
        raise InvalidGraph("the context binary keeps its weights in external files, but its "
                           "folder is unknown (a binary from bytes needs the EPContext model's "
                           "folder: set ep.context_file_path)")
    try:
        metas: dict[Path, dict[str, tuple[str, int]]] = {}
        for ref in refs:
            path = _resolve(ref.file, base)
            if path.parent not in metas:
                metas[path.parent] = read_meta(path.parent / META)
            _check_meta(ref, path, metas[path.parent])
            if path not in out.mappings:
                out.mappings[path] = _map(path)
            mapping = out.mappings[path]
            if ref.offset % ALIGN or ref.offset + ref.length > len(mapping):
                what = "truncated" if ref.offset < len(mapping) else "offset out of range"
                raise InvalidGraph(f"external weight file {str(path)!r}: {what}: the weight "
                                   f"{ref.sha256.hex()[:16]}... is at [{ref.offset}, "
                                   f"{ref.offset + ref.length}) but the file has {len(mapping)} "
                                   f"bytes (offsets are multiples of {ALIGN} within the file)")
            out.views.append(memoryview(mapping)[ref.offset:ref.offset + ref.length])
            out.listing.append(ExternalWeightFile(str(path), ref.length, ref.offset,
                                                  ref.sha256.hex()))
        with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
            try:
                hashed = pool.map(_sha256_then_drop, out.views)
            except RuntimeError:  # an atexit handler's load: no new threads, hashed here
                hashed = map(_sha256_then_drop, out.views)
            digests = list(hashed)
        for ref, item, digest in zip(refs, out.listing, digests, strict=True):
            if digest != ref.sha256:
                raise InvalidGraph(f"external weight file {item.path!r}: hash mismatch at offset "
                                   f"{ref.offset} ({ref.length} bytes): the binary records "
                                   f"sha256 {ref.sha256.hex()}, the file holds {digest.hex()}")
    except BaseException:
        out.close()
        raise
    return out


def _sha256_then_drop(view: memoryview) -> bytes:
    """A weight's SHA-256; its mapped pages then leave the resident set (page cache keeps them)."""
    digest = hashlib.sha256(view).digest()
    drop_resident(view)
    return digest


def _resolve(file: str, base: Path) -> Path:
    relative = PurePosixPath(file)
    if not file or relative.is_absolute() or ".." in relative.parts or "\0" in file:
        raise InvalidGraph(f"external weight file {file!r}: expected a path relative to the "
                           f"binary's folder {str(base)!r} that stays inside it")
    path = base / relative
    try:
        inside = path.resolve().is_relative_to(base.resolve())
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        raise InvalidGraph(f"external weight file {str(path)!r} leaves the binary's folder "
                           f"{str(base)!r} (a symlink pointing outside?)")
    return path


def _check_meta(ref: ExternalRef, path: Path, meta: dict[str, tuple[str, int]]) -> None:
    digest = ref.sha256.hex()
    listed = meta.get(digest)
    if listed != (path.name, ref.offset):
        found = "does not list it" if listed is None else \
            f"maps it to {listed[0]!r} at offset {listed[1]}"
        raise InvalidGraph(f"external weights: {str(path.parent / META)!r} does not match the "
                           f"files: the binary keeps weight {digest} in {path.name!r} at offset "
                           f"{ref.offset}, meta.json {found}")


def _map(path: Path) -> mmap.mmap:
    """The regular file at ``path`` mapped read-only (:func:`~ep.framework.files.open_regular`:
    a FIFO there is refused, not waited on)."""
    try:
        fd, status = open_regular(path)
        with open(fd, "rb") as f:
            if status.st_size == 0:
                raise InvalidGraph(f"external weight file {str(path)!r} is empty (truncated)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise InvalidGraph(f"external weight file {str(path)!r} cannot be opened: "
                           f"{exc.strerror or exc}") from None
