"""Parsing a model without copying its weights: a scan of the protobuf wire format.

Parsing a serialized ``ModelProto`` copies every initializer's ``raw_data`` into the message,
and every later read of the field copies it again: for a model of hundreds of megabytes that is
most of a session's creation. :func:`split_weights` walks the wire format instead (model ->
``graph`` -> ``initializer``: a few thousand field headers, none of the payloads) and returns
the serialized model without the ``raw_data`` of its large initializers, plus where each of
those bytes lies in the input. Parsing that light model takes milliseconds; the weights become
read-only numpy views of the input bytes (:func:`~.tensors.check_model_tensors`), read once
from the file and never copied again.

A tensor stripped this way has no ``raw_data`` in the parsed model: whoever needs the complete
protobuf (the CPU fallback's subgraph, the EPContext writer, ``InferenceSession.model``) puts
the bytes back with :func:`~.tensors.restore_raw_data`. Anything unusual (a repeated ``graph``
field, a tensor with two ``raw_data`` fields, a deprecated group, a truncated field) is left to
protobuf: the scan returns None and the caller parses the input as it is.

The other way, :func:`tensor_value_info` writes the ``ValueInfoProto`` of a typed tensor (a
weight turned into a graph input) as bytes, for ``container.add().MergeFromString(...)``. A
message built field by field allocates and frees protobuf arenas: every standalone message is
one, and so is every sub-message read before it is set (``vi.type.tensor_type``: 8 arenas freed
for one ``helper.make_tensor_value_info``, 4 for the same built in place). protobuf's Python
runtime calls glibc's ``malloc_trim(0)`` at every 10,000th arena block it frees, a walk over
the whole heap: 0.18 ms in a plain process, 5 ms once ten EfficientNet loads had fragmented the
heap. MobileNet-V3's creation from source freed about 2,100 blocks, 1,000 since. Parsed into an
element its container has just added, the bytes allocate in the container's arena and free
nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_DATA_TYPE = 2
_TENSOR_SEGMENT = 3
_TENSOR_RAW_DATA = 9
_TENSOR_DATA_LOCATION = 14
_LENGTH_DELIMITED = 2
_VARINT = 0
_INT64_MASK = (1 << 64) - 1


class _Malformed(Exception):
    """The bytes are not what the scan expects: protobuf parses them (and reports errors)."""


@dataclass(frozen=True)
class Stripped:
    """The ``raw_data`` taken out of initializer ``index`` (its position in
    ``graph.initializer``): ``length`` bytes at ``offset`` of the scanned input."""

    index: int
    offset: int
    length: int


def split_weights(data: bytes, threshold: int,
                  types: Callable[[int], bool]) -> tuple[bytes, list[Stripped]] | None:
    """``data`` (a serialized ``ModelProto``) without the ``raw_data`` of the graph's
    initializers of ``threshold`` bytes or more whose data type passes ``types``, and where
    those bytes are; None when the scan does not apply (nothing to take, or bytes it leaves to
    protobuf)."""
    try:
        fields = list(_fields(data, 0, len(data)))
        graphs = [f for f in fields if f[0] == _MODEL_GRAPH]
        if len(graphs) != 1 or graphs[0][1] != _LENGTH_DELIMITED:
            return None
        _, _, tag_start, start, end = graphs[0]
        graph, stripped = _light_graph(data, start, end, threshold, types)
    except (_Malformed, IndexError):
        return None
    if not stripped:
        return None
    light = b"".join((data[:tag_start], _key(_MODEL_GRAPH), _varint(len(graph)), graph,
                      data[end:]))
    return light, stripped


def _light_graph(data: bytes, start: int, end: int, threshold: int,
                 types: Callable[[int], bool]) -> tuple[bytes, list[Stripped]]:
    parts: list[bytes] = []
    stripped: list[Stripped] = []
    cursor = start
    index = 0
    for number, wire, tag_start, value_start, value_end in _fields(data, start, end):
        if number != _GRAPH_INITIALIZER or wire != _LENGTH_DELIMITED:
            continue
        light = _light_tensor(data, value_start, value_end, threshold, types)
        if light is not None:
            tensor, offset, length = light
            parts += [data[cursor:tag_start], _key(_GRAPH_INITIALIZER), _varint(len(tensor)),
                      tensor]
            cursor = value_end
            stripped.append(Stripped(index, offset, length))
        index += 1
    parts.append(data[cursor:end])
    return b"".join(parts), stripped


def _light_tensor(data: bytes, start: int, end: int, threshold: int,
                  types: Callable[[int], bool]) -> tuple[bytes, int, int] | None:
    """The tensor's bytes without its ``raw_data`` field, and the field's payload offset and
    length; None to keep the tensor as it is."""
    raw = []
    data_type = 0  # UNDEFINED, never taken
    for number, wire, tag_start, value_start, value_end in _fields(data, start, end):
        if number == _TENSOR_RAW_DATA and wire == _LENGTH_DELIMITED:
            raw.append((tag_start, value_start, value_end))
        elif number == _TENSOR_DATA_TYPE and wire == 0:
            data_type, _ = _read_varint(data, value_start)
        elif number == _TENSOR_SEGMENT or (number == _TENSOR_DATA_LOCATION and wire == 0
                                           and _read_varint(data, value_start)[0] != 0):
            return None  # a segment, or bytes that live elsewhere: protobuf's as they are
    if len(raw) != 1 or not types(data_type):
        return None
    tag_start, value_start, value_end = raw[0]
    if value_end - value_start < threshold:
        return None
    light = data[start:tag_start] + data[value_end:end]
    return light, value_start, value_end - value_start


def _fields(data: bytes, start: int, end: int):
    """``(number, wire type, tag start, value start, value end)`` of each field in
    ``data[start:end]``; a varint's value span is the varint itself."""
    pos = start
    while pos < end:
        tag_start = pos
        key, pos = _read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, after = _read_varint(data, pos)
        elif wire == 1:
            after = pos + 8
        elif wire == _LENGTH_DELIMITED:
            length, pos = _read_varint(data, pos)
            after = pos + length
        elif wire == 5:
            after = pos + 4
        else:  # groups (3, 4) are deprecated; anything else is not protobuf
            raise _Malformed
        if number == 0 or after > end:
            raise _Malformed
        yield number, wire, tag_start, pos, after
        pos = after


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int) -> bytes:
    return _varint(number << 3 | _LENGTH_DELIMITED)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field ``number`` holding ``payload``."""
    return _key(number) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    """A varint field ``number``: an int32 or int64, negative ones as 64-bit two's complement,
    as protobuf writes them."""
    return _varint(number << 3 | _VARINT) + _varint(value & _INT64_MASK)


def tensor_value_info(name: str, elem_type: int, dims: Iterable[int]) -> bytes:
    """The serialized ``helper.make_tensor_value_info(name, elem_type, list(dims))``: a tensor
    type whose shape holds each dim as a ``dim_value`` (an empty shape for a scalar)."""
    shape = b"".join(_field(1, _int(1, d)) for d in dims)  # TensorShapeProto.dim.dim_value
    tensor = _int(1, elem_type) + _field(2, shape)  # TypeProto.Tensor: elem_type, shape
    return _field(1, name.encode()) + _field(2, _field(1, tensor))  # name, type.tensor_type
