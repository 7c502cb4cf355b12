"""Context binaries through the user's functions (onnxruntime 1.32's
``ModelCompiler.set_ep_context_data_write_func`` and
``SessionOptions.set_ep_context_data_read_func``, :mod:`ep.framework.context_data`): stored
transformed (here XORed, as onnxruntime's test encrypts them), never as a file, and loaded
back with onnxruntime's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep

NPU = "NpuSimExecutionProvider"
KEY = 0x5A
A = np.arange(6, dtype=np.float32).reshape(3, 2)
FEEDS = {"X": A, "Y": 2 * A + 1}


def model() -> onnx.ModelProto:
    """Z = X * Y + W, on the NPU."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "Y"], ["M"]), helper.make_node("Add", ["M", "W"], ["Z"])],
        "mul", [helper.make_tensor_value_info(n, f, [3, 2]) for n in "XY"],
        [helper.make_tensor_value_info("Z", f, [3, 2])],
        [numpy_helper.from_array(A[::-1].copy(), "W")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def xor(data: bytes) -> bytes:
    return bytes(b ^ KEY for b in data)


class Store:
    """The user's side: binaries kept transformed, by name; calls counted."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}
        self.writes = self.reads = 0

    def write(self, name: str, data: ep.OrtEpContextData) -> None:
        self.writes += 1
        chunks = [data.read(offset, 100) for offset in range(0, data.size - 100, 100)]
        self.records[name] = xor(b"".join(chunks) + data.read(len(chunks) * 100))

    def read(self, name: str, output: ep.OrtEpContextDataBuffer) -> None:
        self.reads += 1
        plain = xor(self.records[name])
        output.allocate(len(plain))
        output.write(plain[:7])
        output.write(memoryview(plain)[7:], 7)


def compiler(source: bytes | str, store: Store) -> ep.ModelCompiler:
    options = ep.SessionOptions()
    options.add_provider(NPU, {})
    made = ep.ModelCompiler(options, source, embed_compiled_data_into_model=False)
    made.set_ep_context_data_write_func(store.write)
    return made


def reading(store: Store, max_size: int = 1 << 20) -> ep.SessionOptions:
    options = ep.SessionOptions()
    options.set_ep_context_data_read_func(store.read, max_size)
    return options


def test_a_binary_goes_through_the_functions_and_never_to_a_file(tmp_path: Path) -> None:
    store = Store()
    compiled = compiler(model().SerializeToString(), store).compile_to_bytes()
    (node,) = onnx.load_model_from_string(compiled).graph.node
    (name,) = store.records
    assert node.op_type == "EPContext" and store.writes == 1
    assert helper.get_attribute_value(next(a for a in node.attribute
                                           if a.name == "ep_cache_context")).decode() == name
    assert not Path(name).exists()
    session = ep.InferenceSession(compiled, sess_options=reading(store))
    want = ort.InferenceSession(model().SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, FEEDS)
    for _ in range(2):
        np.testing.assert_allclose(session.run(None, FEEDS)[0], want[0], rtol=1e-4, atol=1e-5)
    assert store.reads == 1
    assert session.get_node_assignment() == {node.name: NPU}


def test_a_model_compiled_to_a_file_has_no_binary_beside_it(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(model(), source)
    store = Store()
    compiler(str(source), store).compile_to_file(str(tmp_path / "m_ctx.onnx"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m_ctx.onnx"]
    assert list(store.records) == ["m_npusim.bin"]
    got = ep.InferenceSession(str(tmp_path / "m_ctx.onnx"), reading(store)).run(None, FEEDS)
    np.testing.assert_allclose(got[0], A * (2 * A + 1) + A[::-1], rtol=1e-4, atol=1e-5)


def failing(kind: str):
    def read(name: str, output: ep.OrtEpContextDataBuffer) -> None:
        if kind == "raises":
            raise ValueError("EPContext authentication failed")
        if kind == "too-large":
            output.allocate(101)
        if kind == "overrun":
            output.allocate(10)
            output.write(b"x" * 11)
        if kind == "twice":
            output.allocate(1)
            output.allocate(1)
    return read


@pytest.mark.parametrize(("kind", "says"), [
    ("raises", "ValueError: EPContext authentication failed"),
    ("too-large", "allocate(101): the size must be an integer from 0 to max_data_size (100)"),
    ("overrun", "write() of 11 bytes at offset 0 overruns the 10 allocated"),
    ("twice", "allocate() may be called once"),
    ("nothing", "returned without allocating its buffer"),
])
def test_a_read_function_that_fails_fails_the_load(kind: str, says: str) -> None:
    """An exception in the function is ``Fail`` carrying its message, as in onnxruntime; so is
    a buffer misused (the function's error, typed)."""
    compiled = compiler(model().SerializeToString(), Store()).compile_to_bytes()
    options = ep.SessionOptions()
    options.set_ep_context_data_read_func(failing(kind), 100)
    with pytest.raises(ep.Fail, match=r"the EPContext data read function failed for "
                                      r"'model_npusim.bin'|returned without allocating") as info:
        ep.InferenceSession(compiled, sess_options=options)
    assert says in info.value.message


def test_a_write_function_that_fails_fails_the_compilation(tmp_path: Path) -> None:
    def write(name: str, data: ep.OrtEpContextData) -> None:
        raise OSError("disk full")

    source = tmp_path / "m.onnx"
    onnx.save(model(), source)
    made = compiler(str(source), Store())
    made.set_ep_context_data_write_func(write)
    with pytest.raises(ep.Fail, match="write function failed for 'm_npusim.bin': OSError: disk"):
        made.compile_to_file(str(tmp_path / "m_ctx.onnx"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_the_data_views_are_valid_only_in_the_function() -> None:
    kept: list = []
    store = Store()

    def write(name: str, data: ep.OrtEpContextData) -> None:
        kept.append(data)
        store.write(name, data)

    def read(name: str, output: ep.OrtEpContextDataBuffer) -> None:
        kept.append(output)
        store.read(name, output)

    made = compiler(model().SerializeToString(), store)
    made.set_ep_context_data_write_func(write)
    options = ep.SessionOptions()
    options.set_ep_context_data_read_func(read, 1 << 20)
    ep.InferenceSession(made.compile_to_bytes(), sess_options=options)
    with pytest.raises(ep.InvalidArgument, match="only while the write function runs"):
        kept[0].read()
    with pytest.raises(ep.InvalidArgument, match="only while the read function runs"):
        kept[1].write(b"x")


def test_cleared_functions_go_back_to_files(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(model(), source)
    store = Store()
    made = compiler(str(source), store)
    made.clear_ep_context_data_write_func()
    made.compile_to_file(str(tmp_path / "m_ctx.onnx"))
    assert (tmp_path / "m_npusim.bin").is_file() and not store.records
    options = reading(store)
    options.clear_ep_context_data_read_func()
    ep.InferenceSession(str(tmp_path / "m_ctx.onnx"), options).run(None, FEEDS)
    assert store.reads == 0


def test_the_api_is_onnxruntimes() -> None:
    for owner, theirs, names in (
            (ep.ModelCompiler, ort.ModelCompiler, ("set_ep_context_data_write_func",
                                                   "clear_ep_context_data_write_func")),
            (ep.SessionOptions, ort.SessionOptions, ("set_ep_context_data_read_func",
                                                     "clear_ep_context_data_read_func"))):
        for name in names:
            assert hasattr(theirs, name) and hasattr(owner, name), name
    with pytest.raises(TypeError, match="must be callable"):
        ep.SessionOptions().set_ep_context_data_read_func("not a function", 1)
    with pytest.raises(TypeError, match="max_data_size must be an integer >= 0"):
        ep.SessionOptions().set_ep_context_data_read_func(print, -1)


def test_a_shared_context_with_a_write_function_is_not_implemented(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(model(), source)
    options = ep.SessionOptions()
    options.add_provider(NPU, {})
    options.add_session_config_entry("ep.share_ep_contexts", "1")
    options.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    made = ep.ModelCompiler(options, str(source))
    made.set_ep_context_data_write_func(Store().write)
    with pytest.raises(ep.NotImplemented, match="share_ep_contexts with an EPContext data write"):
        made.compile_to_file(str(tmp_path / "m_ctx.onnx"))
