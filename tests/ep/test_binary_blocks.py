"""The weights section's block checksums and the writer's weight layout.

A context binary checks its weights as a table of CRC-32s, one per fixed-size block (section
WEIGHT_CHECKSUMS), so a reader verifies them in parallel; a bad block is named with its index and
byte range. The writer lays a program's weights out in the order and with the padding of the
program's WEIGHTS region, so the loader moves them as one DMA.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import struct
import threading
import time
import zlib

import numpy as np
import pytest

from ep.errors import InvalidArgument, InvalidGraph
from ep.npusim import binary_layout as L
from ep.npusim import weight_checks
from ep.npusim.binary import ContextBinary, pack_context
from firmware_model import Firmware
from firmware_model.program import Program, Region, TensorDesc
from npu_sim.device import Device

BLOCK = L.MIN_BLOCK


def program(sizes_and_offsets: list[tuple[int, int]], name: str = "g", seed: int = 0) -> Program:
    """uint8 weights of the given sizes at the given WEIGHTS offsets, tensor i = entry i."""
    rng = np.random.default_rng(seed)
    tensors = tuple(TensorDesc(f"w{i}", (n,), "uint8", Region.WEIGHTS, at)
                    for i, (n, at) in enumerate(sizes_and_offsets))
    weights = {i: rng.integers(0, 256, n, dtype=np.uint8).tobytes()
               for i, (n, _) in enumerate(sizes_and_offsets)}
    return Program(name, tensors, (), b"", (), (), weights, 0)


def packed(p: Program, block: int = BLOCK) -> bytes:
    return pack_context([p], hardware_architecture="npu-m", weights_block=block)


def sections(data: bytes) -> dict[str, tuple[int, L.SectionEntry]]:
    return {s.kind_name: (i, s) for i, s in enumerate(ContextBinary.from_bytes(data).sections)}


def reseal(data: bytearray) -> bytes:
    """Recompute the section-table and header CRC-32s and every section's own but the weights'
    (whose blocks stay as they are)."""
    fields = L.HEADER.unpack_from(data, 0)
    count, table = fields[5], fields[6]
    for i in range(count):
        at = table + i * L.SECTION.size
        kind, _, offset, length, _, _ = L.SECTION.unpack_from(data, at)
        if kind != L.SectionKind.WEIGHTS:
            struct.pack_into("<I", data, at + 24, zlib.crc32(data[offset:offset + length]))
    struct.pack_into("<I", data, L.HEADER.size - 4,
                     zlib.crc32(data[table:table + count * L.SECTION.size]))
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, 0)
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, zlib.crc32(data[: L.HEADER_SIZE]))
    return bytes(data)


LARGE = program([(3 * BLOCK + 100, 0), (700, 3 * BLOCK + 512)])


@pytest.fixture(params=["head and tail", "whole", "runs of two"])
def verifier(request, monkeypatch):
    """Ways blocks are grouped into CRC-32 calls: a first run of most of them and short runs
    after (``_HEAD``), one call over the whole section, or runs of at most two blocks
    (``_SEGMENT``), whose last run is one short block."""
    if request.param == "head and tail":
        monkeypatch.setattr(weight_checks, "_WHOLE", 0)
    if request.param == "runs of two":
        monkeypatch.setattr(weight_checks, "_SEGMENT", 2 * BLOCK)
    return request.param


@pytest.mark.parametrize("size", [0, 1, BLOCK, 10 * BLOCK + 5, 413 << 20, 1100 << 20])
def test_runs_cover_every_block_once_in_order(size):
    """Up to ``_WHOLE`` one run, else a first run of about ``_HEAD`` of the bytes (half), then
    shorter runs; none over ``_SEGMENT`` (a CRC-32 detects every 2-bit error only under 2^32
    bits, 512 MiB)."""
    block = 4 << 20 if size > BLOCK * 100 else BLOCK
    blocks = [weight_checks._Block(4, i, i * block, min((i + 1) * block, size), i * block, 0)
              for i in range(-(-size // block))]
    runs = weight_checks._runs(blocks)
    assert [b for run in runs for b in run] == blocks
    sizes = [run[-1].end - run[0].start for run in runs]
    assert all(0 < n <= weight_checks._SEGMENT for n in sizes)
    if size <= weight_checks._WHOLE:
        assert len(runs) == min(len(blocks), 1)
    else:
        head = int(size * weight_checks._HEAD)
        assert min(head, weight_checks._SEGMENT) - block < sizes[0] <= head
        assert max(sizes[1:]) < sizes[0]


def test_a_block_larger_than_a_run_is_a_run_alone(monkeypatch):
    """A file's blocks may be up to ``L.MAX_BLOCK`` (1 GiB), more than ``_SEGMENT``: such a block
    is checked alone, against its own stored CRC-32, never with its neighbours."""
    monkeypatch.setattr(weight_checks, "_SEGMENT", 2 * BLOCK)
    monkeypatch.setattr(weight_checks, "_WHOLE", 0)
    sizes = [BLOCK, BLOCK, 3 * BLOCK, BLOCK, BLOCK]
    starts = np.cumsum([0, *sizes])
    blocks = [weight_checks._Block(4, i, int(starts[i]), int(starts[i + 1]), int(starts[i]), 0)
              for i in range(len(sizes))]
    runs = weight_checks._runs(blocks)
    assert [b for run in runs for b in run] == blocks
    assert [blocks[2]] in runs


@pytest.mark.parametrize(("first", "second"), [(0, 7), (7, 0), (1, 1), (4096, 4096 * 3 + 7),
                                               (100, 1 << 20), (1 << 22, 12345)])
def test_crc32_combine_is_zlibs(first, second):
    rng = np.random.default_rng(first + second)
    a, b = rng.bytes(first), rng.bytes(second)
    assert L.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_a_deferred_check_reports_a_bad_block_when_waited_for():
    """``defer_weights``: the programs come back while the checksum thread still runs; the bad
    block is the error of verify_weights, of every call of it, and closing never reports it."""
    data = packed(LARGE)
    index, weights = sections(data)["weights"]
    bad = bytearray(data)
    bad[weights.offset + 2 * BLOCK + 9] ^= 0x01
    binary = ContextBinary.from_bytes(bytes(bad), defer_weights=True)
    assert binary.graph_names() == ["g"]
    for _ in range(2):  # once found, a bad block stays the binary's error
        with pytest.raises(InvalidGraph, match=rf"section #{index} \(weights\), block 2 "):
            binary.verify_weights()
    binary.close()
    ContextBinary.from_bytes(bytes(bad), defer_weights=True).close()
    good = ContextBinary.from_bytes(data, defer_weights=True)
    good.verify_weights()
    assert good.program("g").weights[0] == LARGE.weights[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_checks_weights_on_a_thread_of_its_own():
    """The parent's checksum thread does not exist in a forked child: a deferred check there
    runs on a thread the child starts, and nothing is left queued holding views of a binary."""
    data = packed(LARGE)
    ContextBinary.from_bytes(data, defer_weights=True).verify_weights()  # the parent's thread
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_deferred_check_in_child, (data,)) == (0, True)


def _deferred_check_in_child(data: bytes) -> tuple[int, bool]:
    binary = ContextBinary.from_bytes(data, defer_weights=True)
    binary.verify_weights()
    binary.close()
    checks = weight_checks._pool()
    return checks._work_queue.qsize(), any(t.is_alive() for t in checks._threads)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_check_running_when_the_process_forks_is_done_again_in_the_child(monkeypatch):
    """The parent's thread is inside a run's CRC-32 at the fork: in the child that run never
    ends, so the child's wait checks every run itself instead of waiting forever."""
    started = threading.Event()

    def slow(*args):
        started.set()
        time.sleep(1.0)
        return real(*args)

    real = weight_checks._crc32_then_drop
    monkeypatch.setattr(weight_checks, "_crc32_then_drop", slow)
    data = packed(LARGE)
    binary = ContextBinary.from_bytes(data, defer_weights=True)
    _IN_FLIGHT.append(binary)
    assert started.wait(10)
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:
            assert pool.apply_async(_verify_in_child).get(timeout=30) == LARGE.weights[0]
    finally:
        _IN_FLIGHT.clear()
    binary.verify_weights()


_IN_FLIGHT: list[ContextBinary] = []
"""The binary being checked when the test forks: the child's copy (fork, not pickle)."""


def _verify_in_child() -> bytes:
    binary = _IN_FLIGHT[0]
    binary.verify_weights()
    return bytes(binary.program("g").weights[0])


def test_block_table_covers_the_weights_section():
    data = packed(LARGE)
    (_, weights), (_, table) = sections(data)["weights"], sections(data)["weight_checksums"]
    assert weights.crc32 == 0  # covered block by block instead
    block, count = L.CHECKSUMS_HEAD.unpack_from(data, table.offset)
    assert (block, count) == (BLOCK, -(-weights.length // BLOCK)) and count == 4
    crcs = struct.unpack_from(f"<{count}I", data, table.offset + L.CHECKSUMS_HEAD.size)
    body = data[weights.offset:weights.offset + weights.length]
    assert list(crcs) == [zlib.crc32(body[i:i + BLOCK]) for i in range(0, len(body), BLOCK)]


def test_every_block_is_verified_and_a_bad_one_is_named_with_its_range(verifier):
    data = packed(LARGE)
    index, weights = sections(data)["weights"]
    for k in range(4):
        for position in (k * BLOCK, min((k + 1) * BLOCK, weights.length) - 1):
            bad = bytearray(data)
            bad[weights.offset + position] ^= 0x10
            end = min((k + 1) * BLOCK, weights.length)
            with pytest.raises(InvalidGraph) as info:
                ContextBinary.from_bytes(bytes(bad))
            assert f"checksum mismatch in section #{index} (weights), block {k} (bytes " \
                   f"[{k * BLOCK}, {end}) of the section)" in info.value.message


def test_a_bad_block_is_reported_before_a_bad_record(verifier):
    """Checksums come before records: with both wrong, the block is what is reported."""
    data = bytearray(packed(LARGE))
    _, weights = sections(bytes(data))["weights"]
    _, records = sections(bytes(data))["programs"]
    data[weights.offset + 5] ^= 1
    struct.pack_into("<I", data, records.offset + 32, 2**32 - 1)  # absurd tensor count
    at = L.HEADER_SIZE + 2 * L.SECTION.size + 24
    struct.pack_into("<I", data, at, zlib.crc32(data[records.offset:records.offset +
                                                     records.length]))
    with pytest.raises(InvalidGraph, match=r"\(weights\), block 0 "):
        ContextBinary.from_bytes(reseal(data))


def test_weights_that_change_between_reads_are_refused(verifier, monkeypatch):
    """A run's CRC-32 is computed over bytes that differ from those its blocks are checked
    against again (the file changed under the mapping): the load fails naming the run, it does
    not go on with weights nobody verified."""
    data = bytearray(packed(LARGE))
    index, weights = sections(bytes(data))["weights"]
    checked = weight_checks._crc32_then_drop
    lock = threading.Lock()

    def changing(run: memoryview, *drop) -> int:  # the byte is wrong only while a run is checked
        with lock:
            data[weights.offset + 9] ^= 1
            try:
                return checked(run, *drop)
            finally:
                data[weights.offset + 9] ^= 1

    monkeypatch.setattr(weight_checks, "_crc32_then_drop", changing)
    first = weight_checks._runs(weight_checks.checksum_table(
        memoryview(bytes(data)), index, weights,
        sections(bytes(data))["weight_checksums"][1]).blocks())[0]
    end = first[-1].end - weights.offset
    for defer in (False, True):
        with pytest.raises(InvalidGraph) as info:
            ContextBinary.from_bytes(data, defer_weights=defer).verify_weights()
        assert f"checksum mismatch in section #{index} (weights), bytes [0, {end}) of the " \
               f"section (blocks 0 to {first[-1].index})" in info.value.message
        assert "the bytes changed while they were checked" in info.value.message


@pytest.mark.parametrize("defer", [False, True])
def test_a_bad_block_is_reported_before_a_bad_digest_table(verifier, defer):
    """A problem found after the records (2 digests for 1 graph) is reported as the bad block
    too, also when the checks are deferred: everything after the checks start waits for them."""
    data = bytearray(packed(LARGE))
    index, weights = sections(bytes(data))["weights"]
    _, digests = sections(bytes(data))["graph_digests"]
    data[weights.offset + 2 * BLOCK + 9] ^= 1
    struct.pack_into("<I", data, digests.offset, 2)
    sound = bytearray(packed(LARGE))
    struct.pack_into("<I", sound, digests.offset, 2)
    with pytest.raises(InvalidGraph, match="section graph_digests: 2 digests for 1 graphs"):
        ContextBinary.from_bytes(reseal(sound), defer_weights=defer)  # the digests alone
    with pytest.raises(InvalidGraph, match=rf"section #{index} \(weights\), block 2 "):
        ContextBinary.from_bytes(reseal(data), defer_weights=defer)


@pytest.mark.parametrize(("patch", "message"), [
    (lambda d, at: struct.pack_into("<I", d, at, 3000),
     r"block size 3000 is not a power of two in \[4096, 1073741824\]"),
    (lambda d, at: struct.pack_into("<I", d, at, 2**31),
     r"block size 2147483648 is not a power of two"),
    (lambda d, at: struct.pack_into("<I", d, at + 4, 3),
     r"3 blocks, expected 4 for \d+ bytes of weights in blocks of 4096"),
    (lambda d, at: struct.pack_into("<I", d, at + 4, 2**32 - 1),
     r"4294967295 blocks, expected 4"),
    (lambda d, at: struct.pack_into("<I", d, at, 8192),
     r"4 blocks, expected 2 for \d+ bytes of weights in blocks of 8192"),
])
def test_a_malformed_checksum_table_is_refused(patch, message):
    data = bytearray(packed(LARGE))
    _, table = sections(bytes(data))["weight_checksums"]
    patch(data, table.offset)
    with pytest.raises(InvalidGraph, match=f"section weight_checksums: {message}"):
        ContextBinary.from_bytes(reseal(data))


def test_a_checksum_table_of_the_wrong_length_is_refused():
    """A table entry shortened by 4 bytes (the last CRC dropped): the count no longer fits."""
    data = bytearray(packed(LARGE))
    index, table = sections(bytes(data))["weight_checksums"]
    at = L.HEADER_SIZE + index * L.SECTION.size + 16
    struct.pack_into("<Q", data, at, table.length - 4)
    end = table.offset + table.length
    data[end - 4:end] = bytes(4)  # now padding
    with pytest.raises(InvalidGraph, match=r"weight_checksums: 20 bytes, expected 24 for 4"):
        ContextBinary.from_bytes(reseal(data))


def test_a_missing_checksum_table_is_refused():
    data = bytearray(packed(LARGE))
    index, _ = sections(bytes(data))["weight_checksums"]
    struct.pack_into("<I", data, L.HEADER_SIZE + index * L.SECTION.size, 99)
    with pytest.raises(InvalidGraph, match="required sections missing: weight_checksums"):
        ContextBinary.from_bytes(reseal(data))


@pytest.mark.parametrize("block", [0, 4095, 6000, 2**31, 4096.0])
def test_writer_refuses_a_bad_block_size(block):
    with pytest.raises(InvalidArgument, match="weights_block .* must be a power of two"):
        packed(LARGE, block)


def test_empty_weights_have_an_empty_table():
    data = packed(program([]))
    _, table = sections(data)["weight_checksums"]
    assert L.CHECKSUMS_HEAD.unpack_from(data, table.offset) == (BLOCK, 0)
    assert ContextBinary.from_bytes(data).programs()[0].weights == {}


def test_writer_follows_the_programs_weights_layout_and_the_loader_moves_it_in_one_dma():
    """Tensor order differs from WEIGHTS order; offsets are 512-aligned with padding between
    them, as the compiler lays them out. The blobs keep those distances, so the weights come
    back as one contiguous run of the file and load as one DMA."""
    p = program([(1000, 2048), (300, 0), (5000, 3072), (10, 1024)])
    binary = ContextBinary.from_bytes(packed(p))
    loaded_program = binary.programs()[0]
    start = {i: np.frombuffer(w, np.uint8).__array_interface__["data"][0]
             for i, w in loaded_program.weights.items()}
    for i, t in enumerate(p.tensors):
        assert start[i] - start[1] == t.offset  # same distances as in WEIGHTS
    dev = Device("npu-s")
    loaded = Firmware(dev).load(loaded_program)
    got = dev.hbm.read(loaded.weights.address, p.weights_bytes)
    for i, t in enumerate(p.tensors):
        assert bytes(got[t.offset:t.offset + t.shape[0]]) == p.weights[i]
    assert dev.stats()["dma.transfers"] == 1


def test_a_deduplicated_blob_breaks_the_run_of_a_second_graph():
    """Each distinct content is stored once: the second graph reuses graph one's first blob (at
    0, where its own next weight cannot follow at the same distance), so its weights are two
    runs, and still load correctly."""
    one = program([(600, 0), (600, 1024)], "one", seed=1)
    two = program([(600, 0), (800, 1024)], "two", seed=2)
    two.weights[0] = one.weights[0]
    data = pack_context([one, two], hardware_architecture="npu-m", weights_block=BLOCK)
    binary = ContextBinary.from_bytes(data)
    assert binary.weights_summary.blobs == 4 - 1
    dev = Device("npu-s")
    loaded = Firmware(dev).load(binary.program("two"))
    got = dev.hbm.read(loaded.weights.address, two.weights_bytes)
    assert bytes(got[:600]) == two.weights[0] and bytes(got[1024:1824]) == two.weights[1]
    assert dev.stats()["dma.transfers"] == 2


def _rss_of_mapping_at(address: int) -> int:
    """Resident bytes of the mapping holding ``address``, from /proc/self/smaps."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds address 0x{address:x}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's smaps")
def test_an_opened_files_weights_leave_the_resident_set_once_checked(tmp_path):
    """The checksum thread drops the pages of a mapped file's weights after their CRC-32 (by
    offset in the mapping): opening a binary does not keep its weights resident; reading them
    brings them back (the test can see residency)."""
    size = 256 * BLOCK
    path = tmp_path / "m.bin"
    path.write_bytes(packed(program([(size, 0)])))
    with ContextBinary.open(path) as binary:
        weight = binary.program("g").weights[0]
        array = np.frombuffer(weight, np.uint8)
        address = array.ctypes.data
        assert _rss_of_mapping_at(address) < size // 4
        assert int(array.sum(dtype=np.uint64)) > 0  # every page read again
        assert _rss_of_mapping_at(address) >= size
        del array, weight


@pytest.mark.parametrize("defer", [False, True])
def test_a_closed_binary_is_unmapped_once_its_last_weight_view_goes(tmp_path, defer):
    """close() leaves the mapping to its last view; the weight checks must not keep it too."""
    path = tmp_path / "large.bin"
    path.write_bytes(packed(LARGE))

    def mapped() -> int:
        with open("/proc/self/maps") as maps:
            return sum(str(path) in line for line in maps)

    binary = ContextBinary.open(path, defer_weights=defer)
    view = binary.program(binary.graph_names()[0]).weights[0]
    binary.close()
    assert mapped() == 1  # the view keeps it
    del view
    gc.collect()
    assert mapped() == 0, "the closed binary, still referenced here, keeps its mapping"
    assert binary.source == str(path)


@pytest.mark.parametrize("madvise", ["no libc madvise", "no MADV_DONTNEED"])
def test_without_a_way_to_drop_pages_a_file_still_loads(tmp_path, monkeypatch, madvise):
    """Where libc's madvise or mmap.MADV_DONTNEED is missing, the checked pages simply stay
    resident: the load goes on as before."""
    monkeypatch.setattr(weight_checks, "_MADVISE", None)
    if madvise == "no MADV_DONTNEED":
        monkeypatch.delattr(weight_checks.mmap, "MADV_DONTNEED", raising=False)
    p = program([(64 * BLOCK, 0)])
    path = tmp_path / "m.bin"
    path.write_bytes(packed(p))
    with ContextBinary.open(path) as binary:
        assert bytes(binary.program("g").weights[0]) == p.weights[0]
