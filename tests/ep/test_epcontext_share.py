"""EPContext with weight sharing: session groups (ep.share_ep_contexts / stop_share_ep_contexts)
generate one context binary for N models, and loading sessions share it and one device."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

import ep
from ep.framework import epcontext as E
from ep.framework.provider import ProviderContext
from ep.npusim import NpuSimExecutionProvider
from ep.npusim.binary import ContextBinary
from ep.npusim.shared import workspace
from npu_sim import Device
from tests.ep.npusim_graphs import matmul_add, ort_run, random_feed

NPU = "NpuSimExecutionProvider"


def sources() -> dict[str, onnx.ModelProto]:
    """m1 and m2 have identical weights (seed 1), m3 its own (seed 7)."""
    return {"m1": matmul_add(seed=1), "m2": matmul_add(act="Relu", seed=1),
            "m3": matmul_add(k=8, n=4, seed=7)}


@pytest.fixture(autouse=True)
def clean_workspace() -> Iterator[None]:
    workspace().reset()
    yield
    workspace().reset()


def gen(path: Path, *, stop: bool = False, prefix: str | None = None,
        **entries: str) -> ep.InferenceSession:
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    if stop:
        so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    so.add_session_config_entry("ep.context_node_name_prefix",
                                prefix if prefix is not None else f"{path.stem}_")
    for key, value in entries.items():
        so.add_session_config_entry(key, value)
    return ep.InferenceSession(str(path), so, providers=[NPU])


def save_sources(folder: Path) -> dict[str, Path]:
    paths = {}
    for name, model in sources().items():
        paths[name] = folder / f"{name}.onnx"
        onnx.save(model, paths[name])
    return paths


def ctx_nodes(path: Path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(path).graph.node if E.is_ep_context_node(n)]


def weights_alone(folder: Path, name: str) -> tuple[int, int]:
    """(distinct, referenced) weight bytes of ``name`` generated without sharing."""
    onnx.save(sources()[name], folder / f"{name}.onnx")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    ep.InferenceSession(str(folder / f"{name}.onnx"), so, providers=[NPU])
    with ContextBinary.open(folder / f"{name}_npusim.bin") as binary:
        summary = binary.weights_summary
        return summary.distinct_bytes, summary.referenced_bytes


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three models generated as one group in one folder."""
    workspace().reset()
    folder = tmp_path_factory.mktemp("group")
    paths = save_sources(folder)
    gen(paths["m1"])
    gen(paths["m2"])
    assert workspace().group is not None and not (folder / "m1_npusim.bin").exists()
    gen(paths["m3"], stop=True)
    return folder


def test_group_writes_n_plus_one_files(group: Path) -> None:
    assert sorted(os.listdir(group)) == ["m1.onnx", "m1_ctx.onnx", "m1_npusim.bin", "m2.onnx",
                                         "m2_ctx.onnx", "m3.onnx", "m3_ctx.onnx"]
    names = []
    for model in ("m1", "m2", "m3"):
        nodes = ctx_nodes(group / f"{model}_ctx.onnx")
        infos = [E.parse_ep_context_node(n) for n in nodes]
        assert [i.main_context for i in infos] == [1] + [0] * (len(infos) - 1)
        assert {i.ep_cache_context for i in infos} == {b"m1_npusim.bin"}
        assert all(i.embed_mode == 0 and i.name.startswith(f"{model}_") for i in infos)
        names += [i.graph_name for i in infos]
    with ContextBinary.open(group / "m1_npusim.bin") as binary:
        assert binary.graph_names() == names


def test_shared_weights_are_stored_once(group: Path, tmp_path: Path) -> None:
    alone = {name: weights_alone(tmp_path, name) for name in ("m1", "m2", "m3")}
    assert alone["m1"] == alone["m2"]  # same weights: the group must not store them twice
    with ContextBinary.open(group / "m1_npusim.bin") as binary:
        summary = binary.weights_summary
    assert summary.referenced_bytes == sum(r for _, r in alone.values())
    assert summary.distinct_bytes == alone["m1"][0] + alone["m3"][0]


def test_workspace_is_empty_after_the_last_session(group: Path) -> None:
    assert workspace().group is None and workspace().is_empty()


@pytest.mark.parametrize("from_bytes", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_each_ctx_model_reloads_with_source_outputs(group: Path, from_bytes: bool,
                                                    share: bool) -> None:
    for name, source in sources().items():
        path = group / f"{name}_ctx.onnx"
        so = ep.SessionOptions()
        if share:
            so.add_session_config_entry("ep.share_ep_contexts", "1")
        if from_bytes:
            so.add_session_config_entry("ep.context_file_path", str(path))
        session = ep.InferenceSession(path.read_bytes() if from_bytes else str(path), so,
                                      providers=[NPU])
        assert set(session.get_node_assignment().values()) == {NPU}
        feeds = random_feed(source, seed=3)
        for got, want in zip(session.run(None, feeds), ort_run(source, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def npu(session: ep.InferenceSession) -> ep.npusim.NpuSimExecutionProvider:
    provider = session._providers[0]
    assert provider.type == NPU
    return provider


def test_loading_with_sharing_uses_one_device_and_one_binary(group: Path) -> None:
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    s1 = ep.InferenceSession(str(group / "m1_ctx.onnx"), so, providers=[NPU])
    # m1's graphs moved out; m2's and m3's wait in the workspace.
    (left,) = workspace().shared_binaries().values()
    assert left and all(not g.startswith("m1_") for g in left)
    s2 = ep.InferenceSession(str(group / "m2_ctx.onnx"), so, providers=[NPU])
    assert npu(s1).runtime is npu(s2).runtime
    assert npu(s1)._context_binaries[0] is npu(s2)._context_binaries[0]
    srcs = sources()
    stats = {}
    for session, name in ((s2, "m2"), (s1, "m1"), (s2, "m2")):  # interleaved on one device
        feeds = random_feed(srcs[name], seed=5)
        np.testing.assert_allclose(session.run(None, feeds)[0], ort_run(srcs[name], feeds)[0],
                                   rtol=1e-4, atol=1e-5)
        stats[name] = session.get_run_stats()[NPU]
        (only,) = stats[name]["partitions"].values()  # one NPU partition: the whole model
        assert only == npu(session).runtime.last_run_stats()
        assert stats[name]["cycles"] == only["cycles"]
    # Each session reports its own last run, not the shared device's last run.
    assert s1.get_run_stats()[NPU] == stats["m1"] != stats["m2"]
    plain = ep.InferenceSession(str(group / "m1_ctx.onnx"), providers=[NPU])
    assert npu(plain).runtime is not npu(s1).runtime
    stop = ep.SessionOptions()
    stop.add_session_config_entry("ep.share_ep_contexts", "1")
    stop.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    s3 = ep.InferenceSession(str(group / "m3_ctx.onnx"), stop, providers=[NPU])
    assert npu(s3).runtime is npu(s1).runtime
    assert workspace().shared_binaries() == {}
    del s1, s2, s3, plain
    assert workspace().is_empty()


def test_group_without_last_session_writes_no_binary(tmp_path: Path) -> None:
    paths = save_sources(tmp_path)
    gen(paths["m1"])
    gen(paths["m2"])
    assert not list(tmp_path.glob("*.bin"))
    with pytest.raises(ep.InvalidGraph, match="m1_npusim.bin.*does not exist"):
        ep.InferenceSession(str(tmp_path / "m1_ctx.onnx"), providers=[NPU])
    assert sorted(workspace().group.owners.values()) == ["m1_ctx.onnx", "m2_ctx.onnx"]
    workspace().reset()  # the abandoned group is dropped; a new group starts from scratch
    gen(paths["m3"], stop=True)
    with ContextBinary.open(tmp_path / "m3_npusim.bin") as binary:
        assert all(g.startswith("m3_") for g in binary.graph_names())


def test_name_clash_is_rejected_and_group_unchanged(tmp_path: Path) -> None:
    paths = save_sources(tmp_path)
    gen(paths["m1"], prefix="same_")  # one explicit prefix for two models: their names clash
    before = dict(workspace().group.owners)
    with pytest.raises(ep.InvalidArgument, match="already used by 'm1_ctx.onnx'.*"
                       "ep.context_node_name_prefix"):
        gen(paths["m2"], prefix="same_")
    assert not (tmp_path / "m2_ctx.onnx").exists()
    assert workspace().group.owners == before
    gen(paths["m2"], stop=True)
    with ContextBinary.open(tmp_path / "m1_npusim.bin") as binary:
        assert sorted(binary.graph_names()) == sorted([*before, *(
            n.name for n in ctx_nodes(tmp_path / "m2_ctx.onnx"))])


def test_model_in_another_folder_is_rejected(tmp_path: Path) -> None:
    paths = save_sources(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    gen(paths["m1"])
    with pytest.raises(ep.InvalidArgument, match="must be in the folder of the session group"):
        gen(paths["m2"], stop=True, **{"ep.context_file_path": str(other / "m2_ctx.onnx")})
    assert os.listdir(other) == [] and not list(tmp_path.glob("*.bin"))
    assert workspace().group is not None


@pytest.mark.parametrize("stop", [False, True])
def test_failed_session_leaves_group_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               stop: bool) -> None:
    paths = save_sources(tmp_path)
    gen(paths["m1"])
    before = dict(workspace().group.owners)
    real = os.replace

    def failing(src: str, dst: str | Path) -> None:
        if str(dst).endswith("m2_ctx.onnx"):
            raise OSError(28, "No space left on device")
        real(src, dst)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", failing)
        with pytest.raises(ep.Fail, match="No space left on device"):
            gen(paths["m2"], stop=stop)
    assert sorted(os.listdir(tmp_path)) == ["m1.onnx", "m1_ctx.onnx", "m2.onnx", "m3.onnx"]
    assert workspace().group.owners == before
    gen(paths["m2"], stop=True)  # the group goes on as if the failed session never ran
    assert (tmp_path / "m1_npusim.bin").exists() and workspace().group is None


def test_existing_binary_is_not_overwritten(tmp_path: Path) -> None:
    paths = save_sources(tmp_path)
    (tmp_path / "m1_npusim.bin").write_bytes(b"old")
    with pytest.raises(ep.Fail, match="exists already"):
        gen(paths["m1"])
    assert (tmp_path / "m1_npusim.bin").read_bytes() == b"old"
    assert workspace().group is None


@pytest.mark.parametrize("case", ["stop_alone", "embed_1", "other_device"])
def test_invalid_sharing_settings(tmp_path: Path, case: str) -> None:
    paths = save_sources(tmp_path)
    if case == "stop_alone":
        so = ep.SessionOptions()
        so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        with pytest.raises(ep.InvalidArgument, match="needs ep.share_ep_contexts=1"):
            ep.InferenceSession(str(paths["m1"]), so, providers=[NPU])
    elif case == "embed_1":
        with pytest.raises(ep.InvalidArgument, match="ep.context_embed_mode=0, got 1"):
            gen(paths["m1"], **{"ep.context_embed_mode": "1"})
    elif case == "other_device":
        gen(paths["m1"])
        so = ep.SessionOptions()
        for key in ("ep.context_enable", "ep.share_ep_contexts", "ep.stop_share_ep_contexts"):
            so.add_session_config_entry(key, "1")
        so.add_session_config_entry("ep.context_node_name_prefix", "m2_")
        with pytest.raises(ep.InvalidArgument, match="'npu-s'.*'npu-m'"):
            ep.InferenceSession(str(paths["m2"]), so, providers=[(NPU, {"device": "npu-s"})])
    assert not list(tmp_path.glob("*_ctx.onnx")) or case == "other_device"
    assert not list(tmp_path.glob("*.bin"))


@pytest.mark.parametrize("use_compiler", [False, True])
def test_a_group_needs_no_name_prefix(tmp_path: Path, use_compiler: bool) -> None:
    """Without ep.context_node_name_prefix, graph and node names are still unique per model (the
    model name prefixes them), through sessions and through ModelCompiler alike; m1 and m2
    would otherwise both name their partition NpuSim_0."""
    paths = save_sources(tmp_path)
    for name in ("m1", "m2", "m3"):
        so = ep.SessionOptions()
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        if name == "m3":
            so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        if use_compiler:
            so.add_provider(NPU, {})
            ep.ModelCompiler(so, str(paths[name])).compile_to_file(
                str(tmp_path / f"{name}_ctx.onnx"))
        else:
            so.add_session_config_entry("ep.context_enable", "1")
            ep.InferenceSession(str(paths[name]), so, providers=[NPU])
    assert sorted(p.name for p in tmp_path.glob("*.bin")) == ["m1_npusim.bin"]
    with ContextBinary.open(tmp_path / "m1_npusim.bin") as binary:
        assert sorted(binary.graph_names()) == ["m1_NpuSim_0", "m2_NpuSim_0", "m3_NpuSim_0"]
    for name, source in sources().items():
        session = ep.InferenceSession(str(tmp_path / f"{name}_ctx.onnx"), providers=[NPU])
        feeds = random_feed(source, seed=5)
        for got, want in zip(session.run(None, feeds), ort_run(source, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_sessions_sharing_a_device_hold_one_copy_of_equal_weights(group: Path) -> None:
    """m1 and m2 have identical weights: loaded by two sessions of one sharing group on one
    device, their weights are resident once (hbm.weights.bytes), and m3's add their own."""
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    sessions = [ep.InferenceSession(str(group / f"{m}_ctx.onnx"), so, providers=[NPU])
                for m in ("m1", "m2", "m3")]
    firmware = npu(sessions[0]).runtime.firmware
    assert all(npu(s).runtime.firmware is firmware for s in sessions)
    with ContextBinary.open(group / "m1_npusim.bin") as binary:
        distinct = binary.weights_summary.distinct_bytes
    stats = firmware.stats()
    assert stats["hbm.weights.bytes"] == distinct
    assert stats["hbm.weights.shared_bytes"] > 0
    for name, session in zip(("m1", "m2", "m3"), sessions, strict=True):
        feeds = random_feed(sources()[name], seed=9)
        np.testing.assert_allclose(session.run(None, feeds)[0],
                                   ort_run(sources()[name], feeds)[0], rtol=1e-4, atol=1e-5)


def test_eight_threads_on_instances_sharing_weights_get_serial_results(group: Path) -> None:
    """Two sessions of one ctx model on one device (PPLNN-style instances: one weight copy,
    each with its own activations) and eight threads running both at once: every result is
    the serial one, and the weights stay resident once."""
    from concurrent.futures import ThreadPoolExecutor

    so = ep.SessionOptions()
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    first = ep.InferenceSession(str(group / "m1_ctx.onnx"), so, providers=[NPU])
    firmware = npu(first).runtime.firmware
    alone = firmware.stats()["hbm.weights.bytes"]
    second = ep.InferenceSession(str(group / "m1_ctx.onnx"), so, providers=[NPU])
    assert npu(second).runtime.firmware is firmware
    assert firmware.stats()["hbm.weights.bytes"] == alone
    instances = [first, second]
    feeds = [random_feed(sources()["m1"], seed=s) for s in range(16)]
    serial = [instances[k % 2].run(None, f)[0] for k, f in enumerate(feeds)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        threaded = list(pool.map(lambda k: instances[k % 2].run(None, feeds[k])[0],
                                 range(len(feeds))))
    for got, want in zip(threaded, serial, strict=True):
        np.testing.assert_array_equal(got, want)


def corrupt_embedded_copy(folder: Path, name: str) -> Path:
    """``name``'s ctx model generated alone in embed mode 1, and a copy of it, ``bad.onnx``,
    whose binary has one bad weight byte."""
    onnx.save(sources()[name], folder / f"{name}.onnx")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_embed_mode", "1")
    ep.InferenceSession(str(folder / f"{name}.onnx"), so, providers=[NPU])
    model = onnx.load(folder / f"{name}_ctx.onnx")
    attr = next(a for a in ctx_nodes(folder / f"{name}_ctx.onnx")[0].attribute
                if a.name == "ep_cache_context")
    data = bytearray(attr.s)
    weights = next(s for s in ContextBinary.from_bytes(bytes(data)).sections
                   if s.kind_name == "weights")
    data[weights.offset + 5] ^= 0xFF
    node = next(n for n in model.graph.node if E.is_ep_context_node(n))
    next(a for a in node.attribute if a.name == "ep_cache_context").s = bytes(data)
    onnx.save(model, folder / "bad.onnx")
    return folder / "bad.onnx"


@pytest.mark.parametrize("streaming", ["1", "0"])
def test_a_failed_load_leaves_the_shared_device_as_it_was(tmp_path: Path, streaming: str) -> None:
    """An embedded binary with a bad weight block fails its load in a sharing group; the shared
    device keeps exactly the allocations it had, and the next run of a good session is the run
    it makes with no failed load before it (no upload of the failed load runs in it)."""
    bad = corrupt_embedded_copy(tmp_path, "m1")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    providers = [(NPU, {"weight_streaming": streaming})]
    feeds = random_feed(sources()["m1"], seed=5)

    def first_run(failed_loads: int) -> tuple:
        workspace().reset()
        good = ep.InferenceSession(str(tmp_path / "m1_ctx.onnx"), so, providers=providers)
        device = npu(good).runtime.device
        allocations = device.stats()["hbm.allocations"]
        for _ in range(failed_loads):
            with pytest.raises(ep.InvalidGraph, match=r"\(weights\), block 0 "):
                ep.InferenceSession(str(bad), so, providers=providers)
            assert device.stats()["hbm.allocations"] == allocations
        out = good.run(None, feeds)[0]
        stats = device.stats()
        return out, device.now, stats["dma.transfers"], stats["dma.h2d.bytes"], \
            stats["hbm.allocations"], good.get_run_stats()[NPU]["cycles"]

    alone, after_failures = first_run(0), first_run(2)
    np.testing.assert_allclose(alone[0], ort_run(sources()["m1"], feeds)[0], rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_array_equal(after_failures[0], alone[0])
    assert after_failures[1:] == alone[1:]


def test_a_failed_load_leaves_the_callers_device_as_it_was(tmp_path: Path) -> None:
    """The same on a device the caller gave the provider: nothing of the failed load stays."""
    bad = corrupt_embedded_copy(tmp_path, "m1")
    device = Device("npu-m")
    before = device.stats()
    with pytest.raises(ep.InvalidGraph, match=r"\(weights\), block 0 "):
        ep.InferenceSession(str(bad), providers=[
            NpuSimExecutionProvider(ProviderContext(provider_options={}), device=device)])
    device.synchronize()
    after = device.stats()
    assert (after["hbm.allocations"], after["dma.transfers"]) == \
        (before["hbm.allocations"], before["dma.transfers"])


@pytest.mark.parametrize("streaming", ["1", "0"])
def test_a_load_failing_after_a_node_was_placed_leaves_the_shared_device_as_it_was(
        tmp_path: Path, streaming: str) -> None:
    """Two EPContext nodes; the second one's input binding is wrong, so the load fails after
    the first node's program (and its weights) went onto the shared device: they are unloaded
    again, and nothing of the failed load is left queued on the device."""
    from tests.ep.test_epcontext_load import X, npu_cpu_model

    onnx.save(npu_cpu_model(), tmp_path / "m.onnx")
    gen = ep.SessionOptions()
    gen.add_session_config_entry("ep.context_enable", "1")
    gen.add_session_config_entry("ep.context_embed_mode", "1")
    ep.InferenceSession(str(tmp_path / "m.onnx"), gen, providers=[NPU])
    model = onnx.load(tmp_path / "m_ctx.onnx")
    first, last = (n for n in model.graph.node if E.is_ep_context_node(n))
    assert first.name != last.name
    binding = next(v for v in [*model.graph.value_info, *model.graph.input]
                   if v.name == last.input[0])
    binding.type.tensor_type.elem_type = onnx.TensorProto.INT8
    onnx.save(model, tmp_path / "bad.onnx")

    so = ep.SessionOptions()
    so.add_session_config_entry("ep.share_ep_contexts", "1")
    providers = [(NPU, {"weight_streaming": streaming})]
    feeds = {"x": X}

    def first_run(failed: bool) -> tuple:
        workspace().reset()
        good = ep.InferenceSession(str(tmp_path / "m_ctx.onnx"), so, providers=providers)
        device = npu(good).runtime.device
        allocations = device.stats()["hbm.allocations"]
        if failed:
            with pytest.raises(ep.InvalidGraph, match=f"EPContext node '{last.name}' input 0"):
                ep.InferenceSession(str(tmp_path / "bad.onnx"), so, providers=providers)
            assert device.stats()["hbm.allocations"] == allocations
        out = good.run(None, feeds)
        stats = device.stats()
        return out, stats["dma.transfers"], stats["dma.h2d.bytes"], stats["hbm.allocations"], \
            good.get_run_stats()[NPU]["cycles"]

    alone, after_failure = first_run(False), first_run(True)
    for got, want in zip(after_failure[0], alone[0], strict=True):
        np.testing.assert_array_equal(got, want)
    assert after_failure[1:] == alone[1:]
    workspace().reset()
