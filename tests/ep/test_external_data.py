"""A model's external data: which file each tensor is read from, what is refused, side by side
with the installed onnxruntime on the same files (ep/framework/external_data.py).

Each case lays out a model whose initializers live in external files (links, folders, entries
of ``external_data``), then opens it with onnxruntime's CPU provider and with ``ep``: where
onnxruntime loads it, the session must load it and give onnxruntime's outputs; where it
refuses, the session must refuse with the same error class.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework.external_data import tensors
from tests.ep.npusim_graphs import matmul_add, random_feed

MODEL = matmul_add(m=2, k=16, n=8, seed=5)
FEED = random_feed(MODEL)


def saved(folder: Path, name: str = "m.onnx", location: str = "m.data") -> Path:
    """MODEL in ``folder`` with every initializer in the external file ``location``."""
    folder.mkdir(parents=True, exist_ok=True)
    model = onnx.ModelProto()
    model.CopyFrom(MODEL)  # saving with external data empties the saved model's tensors
    onnx.save(model, folder / name, save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    return folder / name


def edited(path: Path, edit: Callable[[onnx.TensorProto], None]) -> Path:
    """The model at ``path`` with ``edit`` applied to its first initializer's entries."""
    model = onnx.load(path, load_external_data=False)
    edit(model.graph.initializer[0])
    path.write_bytes(model.SerializeToString())
    return path


def entry(key: str, value: str) -> Callable[[onnx.TensorProto], None]:
    """Set (or add) the ``external_data`` entry ``key``."""
    def edit(tensor: onnx.TensorProto) -> None:
        for item in tensor.external_data:
            if item.key == key:
                item.value = value
                return
        tensor.external_data.add(key=key, value=value)
    return edit


def moved(path: Path, location: str, to: Path) -> Path:
    """The data file moved to ``to``, the model's location naming it ``location``."""
    to.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "m.data").rename(to)
    model = onnx.load(path, load_external_data=False)
    for tensor in model.graph.initializer:
        for item in tensor.external_data:
            if item.key == "location":
                item.value = location
    path.write_bytes(model.SerializeToString())
    return path


def hugging_face_cache(root: Path) -> Path:
    """A snapshot whose model and data are links into ``blobs/``, named by content."""
    real = saved(root / "work", location="model.onnx_data")
    blobs, snapshot = root / "blobs", root / "snapshots" / "0123abcd"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    real.rename(blobs / "5f1e")
    (real.parent / "model.onnx_data").rename(blobs / "9c2a")
    os.symlink("../../blobs/5f1e", snapshot / "model.onnx")
    os.symlink("../../blobs/9c2a", snapshot / "model.onnx_data")
    return snapshot / "model.onnx"


def linked_model(root: Path, data_too: bool) -> Path:
    """A link in ``b/`` to the model in ``a/``; with ``data_too``, a link to its data too."""
    real = saved(root / "a")
    (root / "b").mkdir()
    os.symlink(real, root / "b" / "m.onnx")
    if data_too:
        os.symlink(real.parent / "m.data", root / "b" / "m.data")
    return root / "b" / "m.onnx"


def data_link_outside(root: Path) -> Path:
    path = moved(saved(root / "a"), "link.data", root / "outside.data")
    os.symlink(root / "outside.data", root / "a" / "link.data")
    return path


def second_tensor_without_length(root: Path) -> Path:
    """Two tensors in one file, neither with a ``length``: each reads its own size."""
    path = saved(root)
    model = onnx.load(path, load_external_data=False)
    for tensor in model.graph.initializer:
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
    data = b""
    for tensor in model.graph.initializer:
        raw = numpy_helper.to_array(next(t for t in MODEL.graph.initializer
                                         if t.name == tensor.name)).tobytes()
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value="m.data")
        tensor.external_data.add(key="offset", value=str(len(data)))
        data += raw + b"\0" * 7  # room after each: reading to the end would take it
    (root / "m.data").write_bytes(data)
    path.write_bytes(model.SerializeToString())
    return path


CASES: dict[str, Callable[[Path], Path]] = {
    "beside the model": lambda root: saved(root),
    "in a subfolder": lambda root: moved(saved(root), "sub/x.data", root / "sub" / "x.data"),
    "a Hugging Face cache snapshot": hugging_face_cache,
    "a link to the model alone": lambda root: linked_model(root, data_too=False),
    "links to the model and its data": lambda root: linked_model(root, data_too=True),
    "a location up a folder": lambda root: moved(saved(root / "a"), "../m.data", root / "m.data"),
    "an absolute location": lambda root: edited(saved(root), entry("location",
                                                                   str(root / "m.data"))),
    "a missing file": lambda root: edited(saved(root), entry("location", "nope.data")),
    "a folder": lambda root: (root / "sub").mkdir(parents=True) or edited(
        saved(root), entry("location", "sub")),
    "a data link leaving the folder": data_link_outside,
    "an empty location": lambda root: edited(saved(root), entry("location", "")),
    "an offset past the end": lambda root: edited(saved(root), entry("offset", "100000")),
    "a negative offset": lambda root: edited(saved(root), entry("offset", "-4")),
    "an offset that is not a number": lambda root: edited(saved(root), entry("offset", "abc")),
    "an offset with a plus sign": lambda root: edited(saved(root), entry("offset", "+0")),
    "an offset with a space": lambda root: edited(saved(root), entry("offset", " 0")),
    "an offset past int64": lambda root: edited(saved(root),
                                                entry("offset", "9223372036854775808")),
    "a negative length": lambda root: edited(saved(root), entry("length", "-1")),
    "a basepath entry": lambda root: edited(saved(root), entry("basepath", str(root))),
    "a location through a subfolder": lambda root: (root / "sub").mkdir(parents=True) or edited(
        saved(root), entry("location", "sub/../m.data")),
    "an unaligned offset": lambda root: edited(saved(root), entry("offset", "3")),
    "a length that is not the tensor's": lambda root: edited(saved(root), entry("length", "12")),
    "a length too large to parse": lambda root: edited(
        saved(root), entry("length", "99999999999999999999999")),
    "an unknown key": lambda root: edited(saved(root), entry("foo", "bar")),
    "a checksum": lambda root: edited(saved(root), entry("checksum", "deadbeef")),
    "a repeated location": lambda root: edited(
        saved(root), lambda t: t.external_data.add(key="location", value="m.data")),
    "tensors without lengths in one file": second_tensor_without_length,
}


def outcome(open_session: Callable[[], object]) -> list[np.ndarray] | str:
    """The session's outputs on FEED, or the name of the error class it raised."""
    try:
        session = open_session()
    except Exception as exc:  # noqa: BLE001 - the class is what is compared
        return type(exc).__name__
    return session.run(None, FEED)


@pytest.mark.parametrize("case", list(CASES))
def test_external_data_is_found_and_refused_as_onnxruntime_does(tmp_path, case):
    path = str(CASES[case](tmp_path))
    want = outcome(lambda: ort.InferenceSession(path, providers=["CPUExecutionProvider"]))
    got = outcome(lambda: ep.InferenceSession(path))
    if isinstance(want, str):
        assert got == want, f"onnxruntime raised {want}; the session gave {got!r}"
    else:
        assert not isinstance(got, str), f"onnxruntime loads it; the session raised {got}"
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_hugging_face_cache_snapshot_loads(tmp_path):
    """The case the matrix above found: the model and its data are links into ``blobs/``,
    where no file has the location's name (the session looked there and refused it)."""
    session = ep.InferenceSession(str(hugging_face_cache(tmp_path)))
    assert session.get_providers()[0] == "NpuSimExecutionProvider"
    assert session.run(None, FEED)[0].shape == (2, 8)


@pytest.mark.parametrize("layout", ["beside the model", "a Hugging Face cache snapshot"])
def test_a_model_from_bytes_reads_its_data_as_onnxruntime_does(tmp_path, layout):
    """From bytes, the data is read from the folder the session config names and must lie in
    it, links resolved: a cache snapshot's links into ``blobs/`` leave it (onnxruntime 1.32
    refuses that; compared here with the installed one)."""
    path = CASES[layout](tmp_path)
    key = "session.model_external_initializers_file_folder_path"
    reference = ort.SessionOptions()
    reference.add_session_config_entry(key, str(path.parent))
    options = ep.SessionOptions()
    options.add_session_config_entry(key, str(path.parent))
    want = outcome(lambda: ort.InferenceSession(path.read_bytes(), reference,
                                                providers=["CPUExecutionProvider"]))
    got = outcome(lambda: ep.InferenceSession(path.read_bytes(), options))
    if isinstance(want, str):
        assert got == want
    else:
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_the_tensor_walk_finds_what_onnxs_does_but_stray_tensors_on_plain_attributes():
    """``external_data.tensors`` (which tensors may hold external data) against onnx's
    ``_get_all_tensors`` on initializers, Constant values, a TENSORS attribute, subgraphs
    (GRAPH and GRAPHS, with initializers and attribute tensors of their own) and a function's
    nodes; the one difference is a ``tensors`` field set on an ints attribute, which nothing
    reads."""
    from onnx import external_data_helper

    made = []

    def tensor(name):
        made.append(name)
        return numpy_helper.from_array(np.full(3, len(name), np.float32), name)

    def sub(tag):
        return helper.make_graph(
            [helper.make_node("Constant", [], [f"{tag}_k"], value=tensor(f"{tag}_value"))],
            tag, [], [helper.make_tensor_value_info(f"{tag}_k", TensorProto.FLOAT, [3])],
            [tensor(f"{tag}_init")])

    custom = helper.make_node("Custom", ["x"], ["z"], domain="custom",
                              weights=[tensor("list_a"), tensor("list_b")])
    loop = helper.make_node("Scan", ["x"], ["s"], domain="custom", bodies=[sub("g1"), sub("g2")])
    branch = helper.make_node("If", ["c"], ["y"], then_branch=sub("then"),
                              else_branch=sub("else"))
    stray = helper.make_node("Pad", ["x"], ["p"], pads=[0, 0])
    stray.attribute[0].tensors.append(tensor("stray"))
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=tensor("top_value")), custom, loop,
         branch, stray], "g", [], [], [tensor("top_init")])
    function = helper.make_function(
        "custom", "F", [], ["o"], [helper.make_node("Constant", [], ["o"],
                                                    value=tensor("fn_value"))],
        [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, functions=[function])
    onnx_names = sorted(t.name for t in external_data_helper._get_all_tensors(model))
    assert sorted(t.name for t in tensors(model)) == [n for n in onnx_names if n != "stray"]
    assert onnx_names == sorted(made)  # onnx's walk sees every tensor the model holds


def test_the_testing_kit_reads_a_model_path_as_a_session_does(tmp_path):
    """``assert_matches_onnxruntime`` given a path loads the model as the session does: a
    cache snapshot compares (onnx's loader refused its links with an untyped error), and a
    link whose data is not beside it raises the session's ``Fail``."""
    from ep.testing import assert_matches_onnxruntime

    got = assert_matches_onnxruntime(str(hugging_face_cache(tmp_path / "cache")), FEED)
    assert got is not None and got[0].shape == (2, 8)
    with pytest.raises(ep.Fail, match="escapes model directory"):
        assert_matches_onnxruntime(str(linked_model(tmp_path / "link", data_too=False)), FEED)


def test_a_tensor_is_read_in_chunks_when_it_is_larger_than_one_read(tmp_path, monkeypatch):
    """Linux reads at most 2 GiB a call: a larger tensor is read in several (here of 7 bytes,
    so every tensor of MODEL takes many), and comes back whole."""
    from ep.framework import external_data

    monkeypatch.setattr(external_data, "_CHUNK", 7)
    path = str(saved(tmp_path))
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, FEED)
    got = ep.InferenceSession(path).run(None, FEED)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def _fifo_in_place_of(path: Path) -> threading.Thread:
    """``path`` replaced by a FIFO, and a thread that opens it for writing after 5 s (so that
    a reader that blocks on it fails the test late instead of hanging it)."""
    path.unlink()
    os.mkfifo(path)

    def unblock() -> None:
        time.sleep(5)
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    return thread


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_place_of_the_data_is_refused_at_once(tmp_path):
    """Opening a FIFO for reading waits for a writer: the load opens without blocking and
    refuses it as onnxruntime does (not a regular file)."""
    path = str(saved(tmp_path))
    _fifo_in_place_of(tmp_path / "m.data")
    want = outcome(lambda: ort.InferenceSession(path, providers=["CPUExecutionProvider"]))
    start = time.monotonic()
    got = outcome(lambda: ep.InferenceSession(path))
    assert time.monotonic() - start < 3, "the load waited on the FIFO"
    assert want == got == "Fail"
