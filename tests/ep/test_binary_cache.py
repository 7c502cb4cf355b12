"""The decoded-records cache of context binaries (``ep.npusim.binary_cache``): a hit gives the
programs a fresh decode gives, bound to the load's own mapping; a changed byte misses and fails
as a fresh decode does; the cache is bounded, thread-safe and keeps no mapping alive."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import struct
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

import ep
from ep.errors import InvalidGraph
from ep.npusim import binary_cache, weight_checks
from ep.npusim import binary_layout as L
from ep.npusim.binary import ContextBinary, pack_context, write_context_binary
from ep.npusim.binary_reader import remember
from ep.npusim.binary_records import Decoded, Template
from firmware_model.program import Program
from firmware_model.validate import MEMO, validate_structure
from tests.ep.test_binary import reseal, sample_programs, sections_of
from tests.ep.test_weight_mapping import compile_ctx, mapped
from tests.forking import finishes_after_fork, needs_fork
from tests.sizes import deep_size
from tests.threads import run_together

V = importlib.import_module("firmware_model.validate")  # the module, not the function

DIGEST = "0f" * 32


@pytest.fixture(autouse=True)
def empty_cache():
    binary_cache.DECODED.clear()
    yield
    binary_cache.DECODED.clear()


def fresh(path_or_data: Path | bytes, **kwargs) -> ContextBinary:
    """The binary decoded without the cache (emptied first)."""
    binary_cache.DECODED.clear()
    if isinstance(path_or_data, Path):
        return ContextBinary.open(path_or_data, **kwargs)
    return ContextBinary.from_bytes(path_or_data, **kwargs)


def same_binary(got: ContextBinary, want: ContextBinary) -> None:
    """Everything a reader hands out is equal, and the weights are views of ``got``'s own
    buffer."""
    assert got.graph_names() == want.graph_names()
    for name in want.graph_names():
        a, b = got.program(name), want.program(name)
        assert a == b
        assert a.weights_bytes == b.weights_bytes
        assert list(a.weights) == list(b.weights)  # same tensors, same order
        for view in a.weights.values():
            assert isinstance(view, memoryview) and view.readonly
        assert got.graph_digest(name) == want.graph_digest(name)
        assert got.external_weights_of(name) == want.external_weights_of(name)
    assert got.weights_summary == want.weights_summary
    assert got.external_weights == want.external_weights


def write(tmp_path: Path, name: str = "m_npusim.bin") -> Path:
    path = tmp_path / name
    write_context_binary(path, sample_programs(), hardware_architecture="npu-m",
                         config_digest=DIGEST)
    return path


def test_a_hit_gives_the_programs_of_a_fresh_decode_bound_to_its_own_mapping(tmp_path):
    path = write(tmp_path)
    first = ContextBinary.open(path)
    assert (binary_cache.DECODED.misses, binary_cache.DECODED.hits) == (1, 0)
    second = ContextBinary.open(path)
    assert binary_cache.DECODED.hits == 1
    same_binary(second, fresh(path))
    assert second.programs() == sample_programs()
    # The weights are views of each load's own mapping, never of an earlier load's.
    for a, b in zip(first.programs(), second.programs(), strict=True):
        for t in a.weights:
            assert a.weights[t].obj is first._mapping and b.weights[t].obj is second._mapping
        assert a.tensors is b.tensors and a.launches is b.launches  # decoded values shared
    first.close()
    second.close()


def test_remembering_a_written_binary_equals_decoding_it(tmp_path):
    path = write(tmp_path)
    MEMO.clear()
    remember(path)
    assert len(binary_cache.DECODED) == 1
    seeded = ContextBinary.open(path)
    assert binary_cache.DECODED.hits == 1
    # the structure was validated for the loader when remembered: the first load skips it
    assert all(MEMO.get(p) is not None for p in seeded.programs())
    same_binary(seeded, fresh(path))
    data = pack_context(sample_programs(), hardware_architecture="npu-m", config_digest=DIGEST)
    binary_cache.DECODED.clear()
    remember(data=data)
    embedded = ContextBinary.from_bytes(data)
    assert binary_cache.DECODED.hits == 1
    same_binary(embedded, fresh(data))


def test_remembering_a_bad_binary_keeps_nothing_and_raises_nothing(tmp_path):
    path = tmp_path / "bad.bin"
    path.write_bytes(b"NPUSIMCB" + bytes(40))
    remember(path)
    remember(tmp_path / "absent.bin")
    assert len(binary_cache.DECODED) == 0


def patched_launch_count(data: bytes) -> bytes:
    """``data`` with the first program's launch count raised by one, checksums resealed: the
    records then fail to decode (only the decoder can tell)."""
    programs = sections_of(data)["programs"]
    patched = bytearray(data)
    at = programs.offset + struct.calcsize("<IIQQQI")  # the program header's launch count
    (count,) = struct.unpack_from("<I", patched, at)
    struct.pack_into("<I", patched, at, count + 1)
    return reseal(patched)


def test_a_changed_byte_misses_and_fails_as_a_fresh_decode(sample_bytes):
    bad = patched_launch_count(sample_bytes)
    ContextBinary.from_bytes(sample_bytes)  # cached
    hits = binary_cache.DECODED.hits
    with pytest.raises(InvalidGraph) as cached:
        ContextBinary.from_bytes(bad)
    assert binary_cache.DECODED.hits == hits
    assert len(binary_cache.DECODED) == 1  # the failed decode is not kept
    with pytest.raises(InvalidGraph) as uncached:
        fresh(bad)
    assert cached.value.message == uncached.value.message
    assert "launch" in cached.value.message


def test_a_hit_still_checks_the_header_and_the_weights(sample_bytes):
    ContextBinary.from_bytes(sample_bytes)
    with pytest.raises(InvalidGraph, match="device config"):
        ContextBinary.from_bytes(sample_bytes, expected_config_digest="ab" * 32)
    weights = sections_of(sample_bytes)["weights"]
    flipped = bytearray(sample_bytes)
    flipped[weights.offset + 3] ^= 0x40
    with pytest.raises(InvalidGraph) as cached:
        ContextBinary.from_bytes(bytes(flipped))
    assert binary_cache.DECODED.hits >= 1  # the metadata is the same: decoded records reused
    with pytest.raises(InvalidGraph) as uncached:
        fresh(bytes(flipped))
    assert cached.value.message == uncached.value.message
    assert "checksum mismatch in section" in cached.value.message


@pytest.fixture
def sample_bytes() -> bytes:
    return pack_context(sample_programs(), hardware_architecture="npu-m", config_digest=DIGEST)


def test_the_cache_is_bounded_in_entries_and_bytes():
    value = Decoded({}, (), {}, {}, 0, 0, 0, 0)

    def key(n: int, size: int = 10) -> tuple:
        return (1, (2, 0), 0, bytes([n]) * size)

    factor = binary_cache.FOOTPRINT_FACTOR
    cache = binary_cache.DecodedCache(entries=2, max_bytes=4000 * factor)
    for n in range(3):
        cache.put(key(n), value)
    assert len(cache) == 2 and cache.get(key(0)) is None and cache.get(key(2)) is value
    cache.get(key(1))  # now the most recently used
    cache.put(key(3), value)
    assert cache.get(key(1)) is value and cache.get(key(2)) is None

    cache = binary_cache.DecodedCache(entries=10, max_bytes=4000 * factor)
    for n in range(4):
        cache.put(key(n, 1000), value)
    assert len(cache) == 4  # 4,000 bytes of keys, their estimated footprint at the bound
    cache.put(key(4, 1000), value)
    assert len(cache) == 4 and cache.get(key(0, 1000)) is None
    cache.put(key(5, 1001), value)  # more than a quarter of the bound: not kept
    assert cache.get(key(5, 1001)) is None and len(cache) == 4
    # The default bound is 64 MiB of estimated memory (keys and decoded records), not of keys.
    assert binary_cache.DECODED.max_bytes == 64 << 20
    assert binary_cache.footprint(key(0, 1000)) == 1000 * factor


def test_the_estimates_bound_what_an_entry_really_holds(sample_bytes):
    """The caches' bounds are on estimates: they must not be below the memory measured."""
    with ContextBinary.from_bytes(sample_bytes) as binary:
        ((key, decoded),) = binary_cache.DECODED._items.items()
        assert binary_cache.footprint(key) >= deep_size(key) + deep_size(decoded)
        MEMO.clear()
        for program in binary.programs():
            validate_structure(program)
            ((passed),) = MEMO._items.values()
            assert V._footprint(passed) >= deep_size(passed)
            MEMO.clear()


def test_decoded_values_hold_no_view_of_the_binary(tmp_path):
    path = write(tmp_path)
    ContextBinary.open(path).close()
    (decoded,) = binary_cache.DECODED._items.values()
    seen: list[object] = []

    def walk(value: object) -> None:
        assert not isinstance(value, memoryview), value
        seen.append(value)
        if isinstance(value, Template):
            walk(value.fields)
            walk(value.weights)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, (tuple, list)):
            for v in value:
                walk(v)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            walk(vars(value))

    walk(decoded)
    assert len(seen) > 100  # the walk went through every program's records
    gc.collect()
    assert not mapped(path)


def test_threads_loading_the_same_and_other_binaries_get_equal_programs(tmp_path):
    paths = [write(tmp_path, f"m{k}_npusim.bin") for k in range(2)]
    other = tmp_path / "other_npusim.bin"
    programs = sample_programs()
    renamed = [Program(**{**vars(p), "name": p.name + "_x"}) for p in programs]
    write_context_binary(other, renamed, hardware_architecture="npu-m", config_digest=DIGEST)

    def work(k: int) -> None:
        for i in range(20):
            path = other if (k + i) % 3 == 0 else paths[(k + i) % 2]
            with ContextBinary.open(path) as binary:
                want = renamed if path == other else programs
                assert binary.programs() == want

    run_together(work, 8)
    assert len(binary_cache.DECODED) == 2  # two distinct metadata: m0 and m1 are the same bytes
    # The checksum thread drops its last work item (the run's view) just after handing over
    # the result: once it has run another, it holds no view of any binary.
    weight_checks._pool().submit(int).result()
    gc.collect()
    assert not any(mapped(p) for p in [*paths, other])


def test_a_session_loaded_from_the_cache_releases_its_mapping(tmp_path):
    from tests.ep.npusim_graphs import matmul_add, ort_run, random_feed

    source = matmul_add(k=64, n=32, seed=3)
    ctx = compile_ctx(tmp_path, source)
    binary = tmp_path / "m_npusim.bin"
    assert len(binary_cache.DECODED) == 1  # remembered when written
    feed = random_feed(source)
    want = ort_run(source, feed)[0]
    for _ in range(2):
        session = ep.InferenceSession(str(ctx), providers=["NpuSimExecutionProvider"])
        np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-5, atol=1e-6)
        assert mapped(binary)
        del session
        gc.collect()
        assert not mapped(binary)
    assert binary_cache.DECODED.hits >= 2


def test_the_key_is_the_metadata_bytes_and_the_weights_length(sample_bytes):
    binary = ContextBinary.from_bytes(sample_bytes)
    sections = {s.kind: s for s in binary.sections}
    view = memoryview(sample_bytes)
    bodies = {L.SectionKind(k): view[s.offset:s.offset + s.length] for k, s in sections.items()
              if k != L.SectionKind.WEIGHTS}
    key = binary_cache.key(binary.header.format_version, bodies,
                           sections[L.SectionKind.WEIGHTS].length)
    assert binary_cache.DECODED.get(key) is not None
    assert binary_cache.DECODED.get(key[:2] + (key[2] + 512,) + key[3:]) is None


def test_bytes_changed_during_a_load_cannot_poison_the_cache(sample_bytes, monkeypatch):
    """The key is a copy of the metadata; the records are decoded from (and checked over) that
    copy, not from the buffer, which may change meanwhile (a file rewritten in place)."""
    at = sample_bytes.index(struct.pack("<d", 0.5), sections_of(sample_bytes)["programs"].offset)
    want = fresh(sample_bytes)
    assert want.programs()[0].launches[0].attrs["alpha"] == 0.5
    real_key = binary_cache.key
    for load in (ContextBinary.from_bytes, lambda data: remember(data=data)):
        binary_cache.DECODED.clear()
        buffer = bytearray(sample_bytes)

        def key_then_change(*args, buffer=buffer, **kwargs):
            k = real_key(*args, **kwargs)
            struct.pack_into("<d", buffer, at, 7.0)  # after the copy, before the decode
            return k

        monkeypatch.setattr(binary_cache, "key", key_then_change)
        racing = load(buffer)
        monkeypatch.setattr(binary_cache, "key", real_key)
        if racing is not None:  # a load decodes the bytes it checked
            same_binary(racing, want)
        later = ContextBinary.from_bytes(sample_bytes)  # pristine bytes: hits the kept entry
        assert binary_cache.DECODED.hits == 1
        same_binary(later, want)
        assert later.programs()[0].launches[0].attrs["alpha"] == 0.5


@needs_fork
def test_a_child_forked_while_the_cache_is_locked_still_loads(sample_bytes):
    ContextBinary.from_bytes(sample_bytes)
    assert finishes_after_fork(binary_cache.DECODED._lock,
                               lambda: ContextBinary.from_bytes(sample_bytes).close())


def test_the_decoded_attributes_shared_by_loads_are_read_only(tmp_path):
    path = write(tmp_path)
    sample = sample_programs()
    with ContextBinary.open(path) as first:
        launch = first.programs()[0].launches[0]
        assert launch.attrs == sample[0].launches[0].attrs and "alpha" in launch.attrs
        with pytest.raises(TypeError):
            launch.attrs["alpha"] = 99.0  # would change every later load of the same bytes
        with pytest.raises(TypeError):
            del launch.attrs["alpha"]
    with ContextBinary.open(path) as again:
        assert binary_cache.DECODED.hits == 1
        assert again.programs() == sample
    binary = fresh(path)  # a fresh decode is as read-only
    assert all(type(k.attrs) is MappingProxyType for p in binary.programs() for k in p.launches)


@pytest.mark.parametrize("kwargs", [{}, {"path": "m.bin", "data": b""}])
def test_remember_takes_exactly_one_of_path_and_data(kwargs):
    with pytest.raises(ep.errors.InvalidArgument, match="exactly one of path and data"):
        remember(**kwargs)
