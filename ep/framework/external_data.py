"""A model's external data, found, checked and read as onnxruntime does it.

onnxruntime reads an external tensor from its ``location`` joined to the folder of the model
path *as given* (for a model from bytes, the folder its session config names), and accepts the
file only if it lies, symbolic links resolved, inside the folder of the model file, symbolic
links resolved (``ValidateExternalDataPathFromDir``). So a model in a Hugging Face cache
snapshot loads, its ``model.onnx`` and ``model.onnx_data`` both links into the cache's
``blobs/``; a link to a model elsewhere does not, unless its data is linked beside it too.
onnx's ``load_external_data_for_model`` refuses every symbolic link, and resolving the model
path first looked for the data in ``blobs/`` under its ``location``'s name: both failed on the
cache.

The entries of a tensor's ``external_data`` are onnxruntime's (``ExternalDataInfo``):
``location``, ``offset`` and ``length`` (decimal integers), ``checksum`` (ignored); any other
key, a repeated one or an empty location is a format error. Without a ``length`` the tensor's
own size is read, and a ``length`` must be that size. Every error is onnxruntime's ``Fail``,
with its wording. The file read is the resolved path that was checked, so a link swapped after
the check cannot point the read elsewhere.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx

from ..errors import Fail
from .files import NotRegularFile, open_regular
from .tensors import raw_size

_KEYS = ("location", "offset", "length", "checksum")
_CHUNK = 1 << 30
"""The most bytes one read asks for."""
_NUMBERS = {"offset": (re.compile(r"-?[0-9]+"), -(1 << 63), 1 << 63),  # int64
            "length": (re.compile(r"[0-9]+"), 0, 1 << 64)}  # size_t
"""How onnxruntime parses ``offset`` and ``length``: the digits and bounds of its integer types
(no sign but a minus on the offset, no spaces)."""


def uses_external_data(tensor: onnx.TensorProto) -> bool:
    """Whether ``tensor``'s data is in a file of its own (``data_location`` EXTERNAL)."""
    return tensor.data_location == onnx.TensorProto.EXTERNAL


_PLAIN = frozenset({onnx.AttributeProto.FLOAT, onnx.AttributeProto.INT,
                    onnx.AttributeProto.STRING, onnx.AttributeProto.FLOATS,
                    onnx.AttributeProto.INTS, onnx.AttributeProto.STRINGS})
"""Attribute types whose value is never a tensor: their ``tensors`` field is not read."""


def tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """The tensors onnx's ``external_data_helper._get_all_tensors`` walks (initializers, also
    of subgraphs; attribute tensors of the graph's nodes and the model's functions), but a
    ``tensors`` field on an attribute of a plain type (ints, a string...), which no kernel
    reads. onnx's walk reads every attribute's ``tensors``: MobileNet-V3's model took 565 us
    that way and 174 through the types, of a 20 ms creation."""
    def graph(g: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from g.initializer
        yield from nodes(g.node)

    def nodes(found: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
        for node in found:
            for attribute in node.attribute:
                kind = attribute.type
                if attribute.HasField("t"):
                    yield attribute.t
                if kind not in _PLAIN:
                    yield from attribute.tensors
                if kind == onnx.AttributeProto.GRAPH:
                    yield from graph(attribute.g)
                elif kind == onnx.AttributeProto.GRAPHS:
                    for sub in attribute.graphs:
                        yield from graph(sub)

    yield from graph(model.graph)
    for function in model.functions:
        yield from nodes(function.node)


def load(external: Iterable[onnx.TensorProto], folder: str, model_file: str | None) -> None:
    """Read every tensor of ``external`` (tensors with external data) into its ``raw_data``
    (its ``external_data`` then cleared, as onnx's loader leaves it). ``folder``: where
    locations are joined (the model path's folder as given, or the configured folder of a
    model from bytes); ``model_file``: the model's path, whose resolved folder the data must
    lie in (None for a model from bytes: ``folder``, resolved)."""
    allowed = os.path.dirname(os.path.realpath(model_file)) if model_file is not None \
        else os.path.realpath(folder)
    files: dict[str, tuple[int, int]] = {}  # resolved path -> (descriptor, size)
    try:
        for tensor in external:
            location, offset, length = _entries(tensor)
            path = _checked_path(tensor.name, folder, location, allowed)
            if path not in files:
                files[path] = _open(tensor.name, path)
            fd, size = files[path]
            count = _byte_size(tensor)
            if length is not None and length != count:
                raise Fail(f"Deserialize tensor {tensor.name} failed. TensorProto: {tensor.name} "
                           f"external data size mismatch. Computed size: {count}, "
                           f"external_data.length: {length}")
            if offset < 0 or offset + count > size:
                raise Fail(f"Deserialize tensor {tensor.name} failed. External initializer: "
                           f"{tensor.name} offset: {offset} size to read: {count} given "
                           f"file_length: {size} are out of bounds or can not be read in full.")
            tensor.raw_data = _read(tensor.name, fd, count, offset, path)
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
    finally:
        for fd, _ in files.values():
            os.close(fd)


def _read(name: str, fd: int, count: int, offset: int, path: str) -> bytes:
    """``count`` bytes of ``fd`` from ``offset``, in reads of at most :data:`_CHUNK` (Linux
    reads at most 2 GiB a call: a larger tensor would come back short)."""
    chunks, done = [], 0
    while done < count:
        chunk = os.pread(fd, min(count - done, _CHUNK), offset + done)
        if not chunk:  # the file shrank since it was opened
            raise Fail(f"Deserialize tensor {name} failed. External initializer: {name}: read "
                       f"{done} of {count} bytes at offset {offset} of {path!r}")
        chunks.append(chunk)
        done += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _entries(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    """``location``, ``offset`` (0 if absent) and ``length`` (None if absent)."""
    seen: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key not in _KEYS:
            raise Fail(f"model format error! Unknown external data key {entry.key!r} of "
                       f"tensor '{tensor.name}' (known: {', '.join(_KEYS)})")
        if entry.key in seen:
            raise Fail(f"model format error! TensorProto external data has duplicate "
                       f"'{entry.key}' entries (tensor '{tensor.name}')")
        seen[entry.key] = entry.value
    location = seen.get("location", "")
    if not location:
        raise Fail(f"model format error! External data location cannot be empty (tensor "
                   f"'{tensor.name}')")
    if tensor.data_type in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
        raise Fail(f"Deserialize tensor {tensor.name} failed. External data type cannot be "
                   "UNDEFINED or STRING.")

    def number(key: str) -> int | None:
        text = seen.get(key)
        if text is None:
            return None
        pattern, low, high = _NUMBERS[key]
        value = int(text) if pattern.fullmatch(text) else None
        if value is None or not low <= value < high:
            raise Fail(f"Failed to parse value: {text!r} (external data {key} of tensor "
                       f"'{tensor.name}': a decimal integer in [{low}, {high}))")
        return value

    return location, number("offset") or 0, number("length")


def _checked_path(name: str, folder: str, location: str, allowed: str) -> str:
    """The resolved file ``location`` names, checked as onnxruntime checks it."""
    prefix = f"External data path validation failed for initializer: {name}. Error: "
    if os.path.isabs(location) or Path(location).drive or location.startswith(("/", "\\")):
        raise Fail(prefix + "Absolute path not allowed for external data location")
    given = os.path.join(folder or ".", location)
    resolved = os.path.realpath(given)
    try:
        inside = os.path.commonpath([resolved, allowed]) == allowed
    except ValueError:  # different drives
        inside = False
    if not inside:
        raise Fail(prefix + f'External data path escapes model directory. External data path: '
                   f'"{location}" resolved path: "{resolved}" allowed directory: "{allowed}"')
    if not os.path.exists(resolved):
        raise Fail(prefix + f'External data path does not exist: "{given}"')
    return resolved


def _open(name: str, path: str) -> tuple[int, int]:
    """A read-only descriptor of the regular file ``path`` (:func:`.files.open_regular`: a
    FIFO there is refused, not waited on) and its size."""
    try:
        fd, status = open_regular(path)
    except NotRegularFile:
        raise Fail(f"Deserialize tensor {name} failed. Random-access reads require a regular "
                   f"file: {path}") from None
    except OSError as exc:
        raise Fail(f"Deserialize tensor {name} failed. cannot open external data file "
                   f"{path!r}: {exc.strerror}") from None
    return fd, status.st_size


def _byte_size(tensor: onnx.TensorProto) -> int:
    """The bytes of ``tensor``'s data, from its type and shape (:func:`.tensors.raw_size`)."""
    if any(d < 0 for d in tensor.dims):
        raise Fail(f"Initializer '{tensor.name}': dims {list(tensor.dims)} has a negative "
                   "dimension")
    if tensor.data_type not in onnx.TensorProto.DataType.values():
        raise Fail(f"Deserialize tensor {tensor.name} failed. data_type {tensor.data_type} is "
                   "not a valid TensorProto data type")
    return raw_size(tensor.data_type, math.prod(int(d) for d in tensor.dims))
