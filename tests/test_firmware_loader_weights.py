"""Weight upload and the weight-overlap check of the program loader, against simple references.

The loader DMAs each weight straight from its host memory (no staging copy) and finds
overlapping weight ranges by sorting; these tests compare both with the obvious O(n^2)
formulation on generated layouts, including byte-sized weights at unaligned offsets.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware_model import Firmware, Program, Region, TensorDesc
from firmware_model.loader import validate
from npu_sim.device import Device
from npu_sim.errors import InvalidCommand

ITEMSIZE = {"uint8": 1, "int16": 2, "float32": 4}
POOL = [bytes(range(7, 7 + 64)), bytes(64), bytes(range(200, 136, -1))]


@st.composite
def weight_layouts(draw, packed: bool = False) -> list[tuple[str, int, int, int]]:
    """(dtype, offset, element count, pool index) per weight. Ranges may touch or overlap;
    ``packed`` lays them out one after another with small gaps (no overlaps), sometimes
    repeating an earlier weight at the same range."""
    out: list[tuple[str, int, int, int]] = []
    end = 0
    for _ in range(draw(st.integers(1, 8))):
        if packed and out and draw(st.integers(0, 4)) == 0:
            out.append(draw(st.sampled_from(out)))
            continue
        dtype = draw(st.sampled_from(sorted(ITEMSIZE)))
        item = ITEMSIZE[dtype]
        count = draw(st.integers(0, 64 // item))
        if packed:
            offset = -(-(end + draw(st.integers(0, 5))) // item) * item
            end = offset + count * item
        else:
            offset = item * draw(st.integers(0, 96 // item))
        out.append((dtype, offset, count, draw(st.integers(0, len(POOL) - 1))))
    return out


def program_of(layout: list[tuple[str, int, int, int]], *, as_views: bool = False) -> Program:
    tensors, weights = [], {}
    for k, (dtype, offset, count, pool) in enumerate(layout):
        tensors.append(TensorDesc(f"w{k}", (count,), dtype, Region.WEIGHTS, offset))
        data = POOL[pool][: count * ITEMSIZE[dtype]]
        weights[k] = memoryview(data).toreadonly() if as_views else data
    return Program("weights", tuple(tensors), (), b"", (), (), weights, 0)


def reference_overlaps(program: Program) -> list[str]:
    """The overlap messages, found by comparing each weight with every earlier range."""
    problems, placed = [], {}
    for i, t in enumerate(program.tensors):
        span = (t.offset, t.offset + t.spec.nbytes)
        for (start, end), j in placed.items():
            if not (span[0] < end and start < span[1]):
                continue
            if span != (start, end) or program.weights[i] != program.weights[j]:
                problems.append(f"weight tensors {program.tensors[j].name!r} and {t.name!r} "
                                f"overlap ([{start}, {end}) and [{span[0]}, {span[1]})); only "
                                "identical contents may share a range")
        placed.setdefault(span, i)
    return problems


def problems_of(program: Program) -> list[str]:
    try:
        validate(program, cores=1, semaphores=1)
    except InvalidCommand as exc:
        return exc.problems
    return []


@settings(max_examples=150)
@given(weight_layouts())
def test_overlap_check_matches_the_pairwise_reference(layout):
    program = program_of(layout)
    assert problems_of(program) == reference_overlaps(program)


@pytest.mark.parametrize("stream", [False, True])
@settings(max_examples=60)
@given(weight_layouts(packed=True), st.booleans())
def test_upload_writes_every_weight_and_moves_each_range_once(stream, layout, as_views):
    """Loaded (runs of weights contiguous on host and device) or streamed (one DMA per weight,
    left in flight until the device runs)."""
    program = program_of(layout, as_views=as_views)
    if reference_overlaps(program):
        return
    dev = Device("npu-s")
    loaded = Firmware(dev, ring_entries=4).load(program, stream=stream)  # weights > ring slots
    dev.synchronize()
    expected = np.zeros(program.weights_bytes, np.uint8)
    ranges = {}
    for t, data in zip(program.tensors, program.weights.values(), strict=True):
        expected[t.offset:t.offset + len(data)] = np.frombuffer(data, np.uint8)
        if len(data):
            ranges[t.offset] = t.offset + len(data)
    if loaded.weights is not None:
        got = dev.hbm.read(loaded.weights.address, program.weights_bytes)
        np.testing.assert_array_equal(got, expected)
    # One DMA per distinct range; an unaligned range also carries the bytes below it.
    moved = sum(end - start + start % 4 for start, end in ranges.items())
    assert dev.stats()["dma.h2d.bytes"] == moved
    assert dev.host_map._starts == []  # every host mapping was released
    loaded.unload()


@settings(max_examples=40)
@given(weight_layouts(packed=True))
def test_streamed_weights_give_up_their_host_pages_as_their_uploads_land(layout):
    """Streaming drops each uploaded weight's host pages (``drop_resident``) when an upload
    carrying its bytes has landed (its own; an unaligned weight's staging window also carries
    the bytes below it), never before: at the end of that upload's last chunk."""
    from firmware_model import upload

    program = program_of(layout, as_views=True)
    if reference_overlaps(program):
        return
    dev = Device("npu-s")
    dropped: list[tuple[int, int]] = []  # (id of the weight's bytes, cycle)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(upload, "drop_resident", lambda data: dropped.append((id(data), dev.now)))
        loaded = Firmware(dev).load(program, stream=True)
        assert dropped == []  # nothing has landed yet
        dev.synchronize()
    transfers: dict[int, tuple[int, int, int]] = {}  # number -> (HBM start, end, landed)
    for r in dev.trace.records:
        start, end = r.work["dst"], r.work["dst"] + r.work["transfer_bytes"]
        landed = max(transfers.get(r.work["transfer"], (0, 0, 0))[2], r.end)
        transfers[r.work["transfer"]] = (start, end, landed)
    uploaded: dict[tuple[int, int], int] = {}  # the first tensor of each range is uploaded
    for i, t in enumerate(program.tensors):
        if len(program.weights[i]):
            uploaded.setdefault((t.offset, len(program.weights[i])), i)
    expected = []
    for i in uploaded.values():
        address = loaded.placement.addresses[i]
        expected += [(id(program.weights[i]), landed) for start, end, landed in transfers.values()
                     if start <= address and address + len(program.weights[i]) <= end]
    assert sorted(dropped) == sorted(expected)
    assert {d for d, _ in dropped} == {id(program.weights[i]) for i in uploaded.values()}
    loaded.unload()


def test_weights_in_one_buffer_are_uploaded_from_views_without_copies():
    blob = np.arange(64, dtype=np.float32)
    view = memoryview(blob.tobytes()).toreadonly()
    tensors = (TensorDesc("a", (16,), "float32", Region.WEIGHTS, 0),
               TensorDesc("b", (16,), "float32", Region.WEIGHTS, 128))
    program = Program("views", tensors, (), b"", (), (),
                      {0: view[:64], 1: view[64:128]}, 0)
    dev = Device("npu-s")
    loaded = Firmware(dev).load(program)
    got = dev.hbm.read(loaded.weights.address, program.weights_bytes).view(np.float32)
    np.testing.assert_array_equal(got[:16], blob[:16])
    np.testing.assert_array_equal(got[32:48], blob[16:32])
    assert not got[16:32].any()
    assert dev.stats()["dma.h2d.bytes"] == 128


def test_a_failed_upload_unmaps_and_frees(monkeypatch):
    dev = Device("npu-s")
    fw = Firmware(dev)
    program = program_of([("float32", 0, 16, 0)])

    def fail(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(fw, "run", fail)
    with pytest.raises(RuntimeError, match="injected"):
        fw.load(program)
    assert dev.host_map._starts == []
    assert dev.hbm.stats()["hbm.bytes_in_use"] == 0


@st.composite
def runs_in_one_buffer(draw) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A host buffer and weights as (host start, HBM offset, bytes), in HBM order: 4-aligned,
    non-overlapping, with gaps that sometimes match between host and HBM (a run) and sometimes
    do not (a break)."""
    weights, host, hbm = [], draw(st.integers(0, 3)) * 4, 0
    for _ in range(draw(st.integers(1, 10))):
        size = draw(st.integers(1, 40))
        gap = draw(st.sampled_from([0, 4, 12, 512]))
        host_gap = gap if draw(st.integers(0, 2)) else gap + 4 * draw(st.integers(1, 3))
        if weights:
            host, hbm = host + host_gap, hbm + gap
        weights.append((host, hbm, size))
        host, hbm = host + size, hbm + size
        host, hbm = -(-host // 4) * 4, -(-hbm // 4) * 4
    data = bytes(draw(st.binary(min_size=host, max_size=host)))
    return data, weights


def reference_runs(weights: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Maximal runs (host start, HBM start, bytes): the next weight joins when both gaps are
    equal and shorter than 4096."""
    runs: list[list[int]] = []
    for host, hbm, size in weights:
        if runs:
            h, d, n = runs[-1]
            gap = hbm - (d + n)
            if host - (h + n) == gap and 0 <= gap < 4096:
                runs[-1][2] = hbm + size - d
                continue
        runs.append([host, hbm, size])
    return [tuple(r) for r in runs]


@settings(max_examples=60)
@given(runs_in_one_buffer(), st.booleans())
def test_contiguous_weights_go_as_one_dma_per_maximal_run(case, shuffled):
    data, weights = case
    view = memoryview(data).toreadonly()
    order = list(range(len(weights)))
    if shuffled:  # tensor order need not be HBM order
        order.reverse()
    tensors = tuple(TensorDesc(f"w{k}", (weights[k][2],), "uint8", Region.WEIGHTS, weights[k][1])
                    for k in order)
    program = Program("runs", tensors, (), b"", (), (),
                      {i: view[weights[k][0]:weights[k][0] + weights[k][2]]
                       for i, k in enumerate(order)}, 0)
    dev = Device("npu-s")
    loaded = Firmware(dev).load(program)
    runs = reference_runs(weights)
    expected = np.zeros(program.weights_bytes, np.uint8)
    for host, hbm, size in runs:  # a run carries the host bytes between its weights
        expected[hbm:hbm + size] = np.frombuffer(data, np.uint8)[host:host + size]
    got = dev.hbm.read(loaded.weights.address, program.weights_bytes)
    np.testing.assert_array_equal(got, expected)
    for host, hbm, size in weights:
        assert bytes(got[hbm:hbm + size]) == data[host:host + size]
    assert dev.stats()["dma.transfers"] == len(runs)
    assert dev.stats()["dma.h2d.bytes"] == sum(size for _, _, size in runs)
    assert dev.host_map._starts == []
    loaded.unload()


def test_adjacent_weights_in_different_buffers_are_not_joined():
    """Two bytes objects are two buffers, even if their gaps happened to match."""
    a, b = bytes(range(16)), bytes(range(16, 32))
    tensors = (TensorDesc("a", (16,), "uint8", Region.WEIGHTS, 0),
               TensorDesc("b", (16,), "uint8", Region.WEIGHTS, 16))
    dev = Device("npu-s")
    loaded = Firmware(dev).load(Program("two", tensors, (), b"", (), (), {0: a, 1: b}, 0))
    assert bytes(dev.hbm.read(loaded.weights.address, 32)) == a + b
    assert dev.stats()["dma.transfers"] == 2
