"""HBM regions that refer to a mapped file instead of copying it (``npu_sim.pieces``).

A DMA from an immutable host mapping (``share=True``) leaves HBM referring to the file's bytes;
every test compares with the same transfer copied (``share=False``), which is what the device
did before: the same bytes, cycles, counters and trace, and only the host copy gone.
"""

import gc
import mmap

import numpy as np
import pytest

from npu_sim import Device, DeviceConfig
from npu_sim.config import KiB
from npu_sim.pieces import immutable

CHUNKED = DeviceConfig.preset("npu-s").replace(dma_chunk_bytes=4 * KiB)
SIZE = 10 * KiB + 36  # three chunks, the last one short


@pytest.fixture
def mapped(tmp_path):
    """A read-only mapping of a file of SIZE random bytes, as a ``uint8`` array, and the bytes."""
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    yield np.frombuffer(mapping, np.uint8), data, mapping
    gc.collect()
    try:
        mapping.close()
    except BufferError:  # a failed test may still hold a view
        pass


def upload(array: np.ndarray, *, share: bool) -> tuple[Device, object]:
    dev = Device(CHUNKED)
    buf = dev.malloc(array.nbytes + 64)
    dev.memcpy_h2d_async(buf, array, 64, share=share)
    dev.synchronize()
    return dev, buf


def records(dev: Device) -> list[tuple]:
    return [(r.kind, r.engine, r.name, r.start, r.end, r.deps, r.work) for r in dev.trace.records]


def test_only_read_only_files_and_bytes_are_immutable(mapped):
    array, data, _ = mapped
    assert immutable(array) and immutable(array[5:100])
    assert immutable(np.frombuffer(memoryview(data)[3:], np.uint8))
    assert not immutable(np.zeros(4, np.uint8))
    frozen = np.zeros(4, np.uint8)
    frozen.flags.writeable = False
    assert not immutable(frozen)  # its owner may still change it
    assert not immutable(np.frombuffer(memoryview(bytearray(8)).toreadonly(), np.uint8))
    writable = mmap.mmap(-1, 4096)
    assert not immutable(np.frombuffer(memoryview(writable).toreadonly(), np.uint8))
    # A session's weights: arrays over memoryviews of read-only arrays of the model's bytes.
    weight = np.frombuffer(data, np.float32)
    assert immutable(np.frombuffer(memoryview(weight).cast("B"), np.uint8))
    assert not immutable(np.frombuffer(memoryview(frozen).cast("B"), np.uint8))
    assert not immutable(np.frombuffer(memoryview(np.zeros(4, np.uint8)).toreadonly(),
                                       np.uint8))


@pytest.mark.parametrize("skew", [0, 1, 4, 8, 32])
def test_bytes_aligned_otherwise_than_the_device_address_are_copied(skew):
    """A weight inside an ONNX file's protobuf starts at any offset: referred to there, a
    kernel's float32 view of it would be unaligned, which numpy copies on every use (GPT-2's
    runs took 1.8x as long). Only bytes aligned as the device address is (modulo 16, what
    any numpy dtype needs) are referred to; the others are copied, with the same bytes."""
    data = bytes(range(256)) * 64
    root = np.frombuffer(data, np.uint8)
    start = (-root.ctypes.data) % 64 + skew  # an offset of root at that distance from 64
    dev = Device(DeviceConfig.preset("npu-m"))
    buf = dev.malloc(SIZE)
    dev.memcpy_h2d_async(buf, root[start:start + 4096], 0, share=True)
    dev.synchronize()
    assert dev.hbm.read(buf.address, 4096).tobytes() == data[start:start + 4096]
    assert dev.stats()["hbm.mapped_bytes"] == (0 if skew % 16 else 4096)


def test_a_mapped_region_reads_the_files_bytes_with_the_same_timing(mapped):
    array, data, _ = mapped
    dev, buf = upload(array, share=True)
    copied, cbuf = upload(array, share=False)
    assert dev.hbm.read(buf.address + 64, SIZE).tobytes() == data
    assert dev.hbm.read(buf.address, 64).tobytes() == bytes(64)  # never written: zeros
    assert dev.now == copied.now and dev.stats()["dma.chunks"] == 3
    assert {k: v for k, v in dev.stats().items() if k != "hbm.mapped_bytes"} == \
        {k: v for k, v in copied.stats().items() if k != "hbm.mapped_bytes"}
    assert records(dev) == records(copied)
    assert dev.stats()["hbm.mapped_bytes"] == SIZE and copied.stats()["hbm.mapped_bytes"] == 0
    # The three chunks are one piece: a read across chunk boundaries is the file's memory.
    view = dev.hbm.peek(buf.address + 64, SIZE)
    assert np.shares_memory(view, array) and not view.flags.writeable
    assert not np.shares_memory(copied.hbm.peek(cbuf.address + 64, SIZE), array)


def test_a_write_copies_the_region_first_and_leaves_the_file_alone(mapped):
    array, data, _ = mapped
    dev, buf = upload(array, share=True)
    before = dev.hbm.peek(buf.address + 64, 16)
    dev.hbm.write(buf.address + 64, np.full(8, 7, np.uint8))
    assert dev.stats()["hbm.mapped_bytes"] == 0  # real memory now
    got = dev.hbm.read(buf.address + 64, SIZE).tobytes()
    assert got == bytes([7] * 8) + data[8:]
    assert bytes(array[:16]) == data[:16]  # the file is unchanged
    assert before.tobytes() == data[:16]  # views taken before keep reading the file


def test_a_copied_transfer_into_a_mapped_region_keeps_the_rest_mapped(mapped):
    array, data, _ = mapped
    dev, buf = upload(array, share=True)
    patch = np.arange(12, dtype=np.uint8)
    dev.memcpy_h2d_async(buf, patch, 64 + 100)  # a staging window beside mapped weights
    dev.synchronize()
    want = data[:100] + patch.tobytes() + data[112:]
    assert dev.hbm.read(buf.address + 64, SIZE).tobytes() == want
    assert dev.stats()["hbm.mapped_bytes"] == SIZE - 12
    patch[:] = 0  # the source was copied, not referred to
    assert dev.hbm.read(buf.address + 164, 12).tobytes() == bytes(range(12))


def test_peeking_across_pieces_copies_only_the_range(mapped):
    """A range held by several pieces (a copied transfer of several chunks beside mapped
    weights) is peeked as a copy of that range alone: the rest of the region stays mapped."""
    array, data, _ = mapped
    dev, buf = upload(array, share=True)
    patch = np.arange(5 * KiB, dtype=np.uint32).view(np.uint8)[:5 * KiB].copy()
    dev.memcpy_h2d_async(buf, patch, 64 + 1024)  # two chunks: two private pieces
    dev.synchronize()
    want = data[:1024] + patch.tobytes() + data[1024 + patch.size:]
    view = dev.hbm.peek(buf.address + 64 + 512, 6 * KiB)  # mapped, both chunks, mapped
    assert view.tobytes() == want[512:512 + 6 * KiB]
    assert dev.stats()["hbm.mapped_bytes"] == SIZE - 6 * KiB
    assert dev.hbm.read(buf.address + 64, SIZE).tobytes() == want


def test_reading_a_mapped_region_back_does_not_copy_it(mapped):
    array, data, _ = mapped
    dev, buf = upload(array, share=True)
    out = np.empty(SIZE, np.uint8)
    dev.memcpy_d2h_async(out, buf, 64)
    other = dev.malloc(SIZE)
    dev.memcpy_d2d_async(other, buf, SIZE, src_offset=64)
    dev.synchronize()
    assert out.tobytes() == data == dev.hbm.read(other.address, SIZE).tobytes()
    assert dev.stats()["hbm.mapped_bytes"] == SIZE


def test_memory_that_may_change_is_copied_even_when_shared():
    host = np.arange(SIZE, dtype=np.uint32).view(np.uint8)[:SIZE].copy()
    dev, buf = upload(host, share=True)
    want = host.tobytes()
    host[:] = 0
    assert dev.stats()["hbm.mapped_bytes"] == 0
    assert dev.hbm.read(buf.address + 64, SIZE).tobytes() == want


def test_the_file_is_unmapped_only_after_the_last_region_is_freed(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * 40)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    dev, buf = upload(np.frombuffer(mapping, np.uint8), share=True)
    with pytest.raises(BufferError):  # HBM still refers to it
        mapping.close()
    assert dev.hbm.read(buf.address + 64, 10240).tobytes() == path.read_bytes()
    dev.free(buf)
    mapping.close()  # nothing refers to it any more
