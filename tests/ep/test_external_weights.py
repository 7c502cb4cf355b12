"""External weights (provider option ``external_weights``): files, meta.json, deduplication across
models and concurrent compiler processes, the compile summary, and refusal of damaged folders."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest

import ep
from ep.errors import InvalidArgument, InvalidGraph
from ep.npusim import binary_layout as L
from ep.npusim.binary import ContextBinary, pack_context
from tests.ep.external_worker import compile_models, shared_model
from tests.ep.npusim_graphs import matmul_add, ort_run, random_feed

NPU = "NpuSimExecutionProvider"


def generate(folder: Path, name: str, model: onnx.ModelProto, mode: str,
             **options: str) -> ep.InferenceSession:
    onnx.save(model, folder / f"{name}.onnx")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    for key, value in options.pop("session", {}).items():  # type: ignore[attr-defined]
        so.add_session_config_entry(key, value)
    return ep.InferenceSession(str(folder / f"{name}.onnx"), so,
                               providers=[(NPU, {"external_weights": mode, **options})])


def weight_digests(model: onnx.ModelProto) -> set[str]:
    return {hashlib.sha256(onnx.numpy_helper.to_array(t).tobytes()).hexdigest()
            for t in model.graph.initializer}


def check_matches(ctx: Path, source: onnx.ModelProto) -> ep.InferenceSession:
    session = ep.InferenceSession(str(ctx))
    feed = random_feed(source)
    for got, want in zip(session.run(None, feed), ort_run(source, feed), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return session


@pytest.mark.parametrize("mode", ["1", "2"])
def test_weights_leave_the_binary_and_the_summary_lists_them(tmp_path, mode):
    model = matmul_add(k=64, n=32, seed=3)
    session = generate(tmp_path, "m", model, mode)
    listed = session.get_external_weight_files()
    assert {item.id for item in listed} == weight_digests(model)
    for item in listed:  # each entry is where the bytes really are
        assert Path(item.path).parent == tmp_path / "weight"
        with open(item.path, "rb") as f:
            f.seek(item.offset)
            assert hashlib.sha256(f.read(item.size)).hexdigest() == item.id
        assert item.offset % 512 == 0
    files = {Path(item.path).name for item in listed}
    if mode == "1":
        assert files == {f"weight_{item.id}" for item in listed}
    else:
        assert files == {"m_weight_combined"}
    meta = json.loads((tmp_path / "weight" / "meta.json").read_text())
    assert meta["hash_to_weight_file"] == {i.id: Path(i.path).name for i in listed}
    assert meta["hash_to_weight_offset"] == {i.id: i.offset for i in listed}
    weights = sum(item.size for item in listed)
    with ContextBinary.open(tmp_path / "m_npusim.bin") as binary:
        assert binary.weights_summary.section_bytes == 0  # no weight byte in the binary
        assert binary.header.format_version == (2, 2)
        assert [w.path for w in binary.external_weights] == [i.path for i in listed]
    assert (tmp_path / "m_npusim.bin").stat().st_size < weights
    loaded = check_matches(tmp_path / "m_ctx.onnx", model)
    assert {(i.path, i.size, i.offset, i.id) for i in loaded.get_external_weight_files()} == \
        {(i.path, i.size, i.offset, i.id) for i in listed}


def test_the_binary_records_paths_relative_to_its_folder(tmp_path):
    generate(tmp_path, "m", matmul_add(seed=3), "1", external_weights_folder="w/sub")
    raw = (tmp_path / "m_npusim.bin").read_bytes()
    assert b"w/sub/weight_" in raw and str(tmp_path).encode() not in raw
    moved = tmp_path.parent / (tmp_path.name + "_moved")
    tmp_path.rename(moved)  # the folder moves as a whole: still loads
    check_matches(moved / "m_ctx.onnx", matmul_add(seed=3))


@pytest.mark.parametrize("mode", ["1", "2"])
def test_identical_weights_are_written_once_per_folder(tmp_path, mode):
    first = generate(tmp_path, "a", matmul_add(seed=1), mode)
    before = sorted(os.listdir(tmp_path / "weight"))
    second = generate(tmp_path, "b", matmul_add(act="Relu", seed=1), mode)  # same weights
    assert sorted(os.listdir(tmp_path / "weight")) == before
    assert second.get_external_weight_files() == first.get_external_weight_files()
    generate(tmp_path, "c", matmul_add(k=8, n=4, seed=7), mode)  # new weights: added
    meta = json.loads((tmp_path / "weight" / "meta.json").read_text())
    assert set(meta["hash_to_weight_file"]) == \
        weight_digests(matmul_add(seed=1)) | weight_digests(matmul_add(k=8, n=4, seed=7))
    for name, source in (("a", matmul_add(seed=1)), ("b", matmul_add(act="Relu", seed=1)),
                         ("c", matmul_add(k=8, n=4, seed=7))):
        check_matches(tmp_path / f"{name}_ctx.onnx", source)


@pytest.mark.parametrize("mode", ["1", "2"])
def test_concurrent_compiler_processes_share_one_folder(tmp_path, mode):
    """Four processes compile sixteen models (five weight sets) into one folder at once."""
    jobs = [[(f"p{p}m{k}", (p + k) % 5, "Relu" if k % 2 else None) for k in range(4)]
            for p in range(4)]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.starmap(compile_models, [(str(tmp_path), mode, j) for j in jobs])
    folder = tmp_path / "weight"
    meta = json.loads((folder / "meta.json").read_text())
    expected = set().union(*(weight_digests(shared_model(seed)) for seed in range(5)))
    assert set(meta["hash_to_weight_file"]) == expected
    names = os.listdir(folder)
    assert not [n for n in names if "npusim-" in n]  # no temporary left behind
    if mode == "1":  # one file per distinct weight, each written once
        assert sorted(n for n in names if n.startswith("weight_")) == \
            sorted(f"weight_{h}" for h in expected)
    sizes = {hashlib.sha256(raw).hexdigest(): len(raw) for seed in range(5)
             for raw in (onnx.numpy_helper.to_array(t).tobytes()
                         for t in shared_model(seed).graph.initializer)}
    for h, name in meta["hash_to_weight_file"].items():  # every file whole, nothing torn
        with open(folder / name, "rb") as f:
            f.seek(meta["hash_to_weight_offset"][h])
            assert hashlib.sha256(f.read(sizes[h])).hexdigest() == h
    for (p, k), ctx in zip([(p, k) for p in range(4) for k in range(4)],
                           [c for r in results for c in r], strict=True):
        check_matches(Path(ctx), shared_model((p + k) % 5, "Relu" if k % 2 else None))


def test_embedded_binary_finds_its_weights_beside_the_model(tmp_path):
    model = matmul_add(seed=5)
    generate(tmp_path, "m", model, "2", session={"ep.context_embed_mode": "1"})
    assert not (tmp_path / "m_npusim.bin").exists()
    check_matches(tmp_path / "m_ctx.onnx", model)
    data = (tmp_path / "m_ctx.onnx").read_bytes()
    with pytest.raises(InvalidGraph, match="external files.*ep.context_file_path"):
        ep.InferenceSession(data, providers=[NPU])


@pytest.mark.parametrize(("options", "match"), [
    ({"external_weights": "3"}, r"external_weights='3'; expected '0'"),
    ({"external_weights": "1", "external_weights_folder": "../up"}, r"inside the EPContext"),
    ({"external_weights": "1", "external_weights_folder": "/abs"}, r"relative folder"),
])
def test_bad_options_are_invalid_argument(tmp_path, options, match):
    onnx.save(matmul_add(), tmp_path / "m.onnx")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    with pytest.raises(InvalidArgument, match=match):
        ep.InferenceSession(str(tmp_path / "m.onnx"), so, providers=[(NPU, options)])
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


# -- damaged folders: InvalidGraph at session creation, naming the file ---------------------------

@pytest.fixture(params=["1", "2"])
def compiled(tmp_path, request) -> Path:
    generate(tmp_path, "m", matmul_add(k=64, n=32, seed=3), request.param)
    return tmp_path


def _big_weight(folder: Path) -> tuple[Path, int, str]:
    meta = json.loads((folder / "weight" / "meta.json").read_text())
    digest = max(meta["hash_to_weight_file"], key=lambda h: (folder / "weight" /
                                                                meta["hash_to_weight_file"][h])
                 .stat().st_size)
    return folder / "weight" / meta["hash_to_weight_file"][digest], \
        meta["hash_to_weight_offset"][digest], digest


def _refused(folder: Path, *patterns: str) -> None:
    with pytest.raises(InvalidGraph) as info:
        ep.InferenceSession(str(folder / "m_ctx.onnx"), providers=[NPU])
    for pattern in patterns:
        assert pattern in info.value.message, info.value.message


def test_missing_weight_file(compiled):
    path, _, _ = _big_weight(compiled)
    path.unlink()
    _refused(compiled, str(path), "cannot be opened")


def test_truncated_weight_file(compiled):
    path, offset, _ = _big_weight(compiled)
    os.truncate(path, offset + 100)
    _refused(compiled, str(path), "truncated")


def test_offset_out_of_range(tmp_path):
    generate(tmp_path, "m", matmul_add(k=64, n=32, seed=3), "2")
    path = tmp_path / "weight" / "m_weight_combined"
    meta = json.loads((tmp_path / "weight" / "meta.json").read_text())
    os.truncate(path, max(meta["hash_to_weight_offset"].values()))  # ends where one starts
    _refused(tmp_path, str(path), "offset out of range")


def test_hash_mismatch(compiled):
    path, offset, digest = _big_weight(compiled)
    with open(path, "r+b") as f:
        f.seek(offset + 17)
        byte = f.read(1)
        f.seek(offset + 17)
        f.write(bytes([byte[0] ^ 1]))
    _refused(compiled, str(path), "hash mismatch", digest)


def test_meta_json_that_does_not_match_the_files(compiled):
    meta_path = compiled / "weight" / "meta.json"
    meta = json.loads(meta_path.read_text())
    digest = next(iter(meta["hash_to_weight_offset"]))
    meta["hash_to_weight_offset"][digest] += 512
    meta_path.write_text(json.dumps(meta))
    _refused(compiled, str(meta_path), "does not match the files", digest)


@pytest.mark.parametrize("content", [b"{not json", b"[]", b'{"hash_to_weight_file": {}}'])
def test_malformed_meta_json(compiled, content):
    (compiled / "weight" / "meta.json").write_bytes(content)
    _refused(compiled, str(compiled / "weight" / "meta.json"))


def test_missing_meta_json(compiled):
    (compiled / "weight" / "meta.json").unlink()
    _refused(compiled, "meta.json", "does not exist")


def test_a_path_leaving_the_folder_is_refused(tmp_path):
    """A binary whose external entry names ``../x`` (patched, CRC resealed) is refused."""
    generate(tmp_path, "m", matmul_add(seed=3), "1", external_weights_folder="ab")
    path = tmp_path / "m_npusim.bin"
    data = bytearray(path.read_bytes())
    at = data.index(b"ab/weight_")
    data[at:at + 3] = b"../"
    fields = L.HEADER.unpack_from(data, 0)
    for i in range(fields[5]):  # reseal the section CRCs and the table's
        entry = fields[6] + i * L.SECTION.size
        kind, _, offset, length, _, _ = L.SECTION.unpack_from(data, entry)
        if kind != L.SectionKind.WEIGHTS:
            struct.pack_into("<I", data, entry + 24, zlib.crc32(data[offset:offset + length]))
    table = data[fields[6]:fields[6] + fields[5] * L.SECTION.size]
    struct.pack_into("<I", data, 264, zlib.crc32(table))
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, 0)
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, zlib.crc32(data[:L.HEADER_SIZE]))
    path.write_bytes(data)
    _refused(tmp_path, "stays inside")


def test_a_binary_without_external_weights_reads_as_before(tmp_path):
    """A 2.2 binary with its weights inside is what 2.1 wrote plus the version: relabelled 2.1
    (an old binary) it still loads, and it has no EXTERNAL_WEIGHTS section."""
    from tests.ep.test_binary import reseal, sample_programs

    data = bytearray(pack_context(sample_programs(), hardware_architecture="npu-m"))
    struct.pack_into("<H", data, 10, 1)
    binary = ContextBinary.from_bytes(reseal(data))
    assert binary.header.format_version == (2, 1)
    assert binary.external_weights == []
    assert binary.programs() == sample_programs()


def test_model_compiler_and_a_sharing_group_write_external_weights(tmp_path):
    from ep.npusim.shared import workspace

    so = ep.SessionOptions()
    so.add_provider(NPU, {"external_weights": "1"})
    onnx.save(matmul_add(seed=8), tmp_path / "c.onnx")
    ep.ModelCompiler(so, str(tmp_path / "c.onnx")).compile_to_file(str(tmp_path / "c_ctx.onnx"))
    check_matches(tmp_path / "c_ctx.onnx", matmul_add(seed=8))
    workspace().reset()
    try:
        sources = {"g1": matmul_add(seed=1), "g2": matmul_add(act="Relu", seed=1)}
        for k, (name, source) in enumerate(sources.items()):
            session = {"ep.share_ep_contexts": "1", "ep.context_node_name_prefix": f"{name}_"}
            if k == 1:
                session["ep.stop_share_ep_contexts"] = "1"
            last = generate(tmp_path, name, source, "2", session=session)
        with ContextBinary.open(tmp_path / "g1_npusim.bin") as binary:
            assert binary.weights_summary.section_bytes == 0
            assert {w.id for w in binary.external_weights} == weight_digests(sources["g1"])
        assert {w.id for w in last.get_external_weight_files()} == weight_digests(sources["g1"])
        for name, source in sources.items():
            check_matches(tmp_path / f"{name}_ctx.onnx", source)
    finally:
        workspace().reset()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_place_of_a_weight_file_is_refused_at_once(tmp_path):
    """A weight file replaced by a FIFO: the load opens it without blocking and refuses it
    (not a regular file) instead of waiting for a writer."""
    import time

    from tests.ep.test_external_data import _fifo_in_place_of

    model = matmul_add(k=64, n=32, seed=3)
    listed = generate(tmp_path, "m", model, "1").get_external_weight_files()
    _fifo_in_place_of(Path(listed[0].path))
    start = time.monotonic()
    with pytest.raises(InvalidGraph, match="not a regular file"):
        ep.InferenceSession(str(tmp_path / "m_ctx.onnx"))
    assert time.monotonic() - start < 3, "the load waited on the FIFO"
