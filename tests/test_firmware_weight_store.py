"""One device copy of every weight: programs loaded on one device share resident weights by
content, counted by ``hbm.weights.bytes``, freed with their last user in any unload order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware_model import Firmware, KernelLaunch, Program, Region, TensorDesc
from firmware_model.commands import Kernel, pack
from npu_sim.device import Device
from tests.ortref import run_ort

SHAPE = (4, 16)
NB = 4 * 16 * 4


def add_program(name: str, weight: np.ndarray, *, extra: np.ndarray | None = None) -> Program:
    """out = x + w (kernels read the weight in place; no DMA addresses the WEIGHTS region).
    ``extra`` adds a second, unused weight after the first."""
    tensors = [TensorDesc("x", SHAPE, "float32", Region.ARENA, 0),
               TensorDesc("w", SHAPE, "float32", Region.WEIGHTS, 0),
               TensorDesc("out", SHAPE, "float32", Region.ARENA, NB)]
    weights = {1: weight.tobytes()}
    if extra is not None:
        tensors.append(TensorDesc("w2", SHAPE, "float32", Region.WEIGHTS, 512))
        weights[3] = extra.tobytes()
    return Program(name, tuple(tensors), (KernelLaunch("Add", (0, 1), (2,), node="add"),),
                   pack([Kernel(1, 0, 0b1)]), (0,), (2,), weights, 2 * NB)


W = np.linspace(-2, 2, 64, dtype=np.float32).reshape(SHAPE)
V = np.linspace(5, 6, 64, dtype=np.float32).reshape(SHAPE)
X = np.arange(64, dtype=np.float32).reshape(SHAPE)


def test_identical_weights_of_two_programs_live_once():
    dev = Device("npu-s")
    fw = Firmware(dev)
    first = fw.load(add_program("a", W))
    uploaded = dev.stats()["dma.h2d.bytes"]
    second = fw.load(add_program("b", W.copy()))  # other host memory, same content
    stats = fw.stats()
    assert stats["hbm.weights.bytes"] == NB and stats["hbm.weights.references"] == 2
    assert stats["hbm.weights.shared_bytes"] == NB
    assert dev.stats()["dma.h2d.bytes"] == uploaded  # nothing uploaded for the second
    for loaded in (first, second):
        np.testing.assert_array_equal(loaded.run([X])[0], run_ort("Add", [X, W])[0])


def test_a_program_sharing_part_of_its_weights_uploads_only_the_rest():
    dev = Device("npu-s")
    fw = Firmware(dev)
    fw.load(add_program("a", W))
    before = dev.stats()["dma.h2d.bytes"]
    both = fw.load(add_program("b", W, extra=V))
    assert fw.stats()["hbm.weights.bytes"] == 2 * NB
    assert dev.stats()["dma.h2d.bytes"] - before == NB
    np.testing.assert_array_equal(both.run([X])[0], X + W)
    assert both.weights is None  # its weights are in two places: no single region


@settings(max_examples=20, deadline=None)
@given(st.permutations([0, 1, 2]), st.lists(st.sampled_from(["W", "V", "WV"]), min_size=3,
                                             max_size=3))
def test_unloading_in_any_order_frees_each_weight_with_its_last_user(order, kinds):
    dev = Device("npu-s")
    fw = Firmware(dev)
    arrays = {"W": (W, None), "V": (V, None), "WV": (W, V)}
    loaded = [fw.load(add_program(f"p{k}", arrays[kind][0], extra=arrays[kind][1]))
              for k, kind in enumerate(kinds)]
    distinct = {id(arr) for kind in kinds for arr in arrays[kind] if arr is not None}
    assert fw.stats()["hbm.weights.bytes"] == NB * len(distinct)
    assert fw.stats()["hbm.weights.references"] == sum(len(kind) for kind in kinds)
    for k in order:
        expected = np.asarray(X + arrays[kinds[k]][0])
        np.testing.assert_array_equal(loaded[k].run([X])[0], expected)
        loaded[k].unload()
        alive = [kinds[j] for j in range(3) if loaded[j].loaded]
        resident = {id(a) for kind in alive for a in arrays[kind] if a is not None}
        assert fw.stats()["hbm.weights.bytes"] == NB * len(resident)
        assert fw.stats()["hbm.weights.references"] == sum(len(kind) for kind in alive)
    assert dev.hbm.stats()["hbm.bytes_in_use"] == 0


@pytest.mark.parametrize("first_unloaded", [0, 1])
def test_the_device_stays_consistent_after_either_unload(first_unloaded):
    dev = Device("npu-s")
    fw = Firmware(dev)
    programs = [fw.load(add_program(n, W)) for n in ("a", "b")]
    programs[first_unloaded].unload()
    survivor = programs[1 - first_unloaded]
    np.testing.assert_array_equal(survivor.run([X])[0], X + W)
    survivor.unload()
    assert fw.stats()["hbm.weights.bytes"] == 0
    assert dev.hbm.stats()["hbm.bytes_in_use"] == 0
    assert fw.stats()["hbm.weights.references"] == 0


@pytest.mark.parametrize("dropped", ["indexed", "being_indexed"])
def test_a_program_unloaded_while_the_store_indexes_leaves_no_stale_weight(monkeypatch, dropped):
    """A finalizer may unload a program whenever the collector runs, also while the store is
    working out its weights' host addresses: the unloaded program's weights must leave the
    store (none counted, none shared later from freed memory)."""
    import firmware_model.weights as store_module

    dev = Device("npu-s")
    fw = Firmware(dev)
    first = fw.load(add_program("a", W))
    second = fw.load(add_program("b", V))  # its lookup indexed the first's weight
    victim = first if dropped == "indexed" else second
    real, fired = store_module.host_address, []

    def unloading(host):
        if not fired:
            fired.append(victim.unload())
        return real(host)

    monkeypatch.setattr(store_module, "host_address", unloading)
    stats = fw.stats()  # indexes the second's weight: the victim goes meanwhile
    assert fired and stats["hbm.weights.bytes"] == NB and stats["hbm.weights.references"] == 1
    monkeypatch.undo()
    (second if victim is first else first).unload()
    assert fw.stats()["hbm.weights.bytes"] == 0 and dev.hbm.stats()["hbm.bytes_in_use"] == 0
    again = fw.load(add_program("c", W, extra=V))
    assert fw.stats()["hbm.weights.shared_bytes"] == 0
    np.testing.assert_array_equal(again.run([X])[0], run_ort("Add", [X, W])[0])


def test_a_release_while_counting_is_counted_on_the_next_ask(monkeypatch):
    """stats() keeps its counts until the store changes; a release that runs while it counts
    (a finalizer the collector calls) must not leave the counts of before it kept."""
    import builtins

    from firmware_model import weights as weights_module

    fw = Firmware(Device("npu-s"))
    kept = fw.load(add_program("kept", W))
    dropped = fw.load(add_program("dropped", V))
    assert fw.stats()["hbm.weights.bytes"] == 2 * NB

    def sum_then_unload(values, *args):
        monkeypatch.delattr(weights_module, "sum")
        dropped.unload()  # between the residents' listing and the sums
        return builtins.sum(values, *args)

    fw.load(add_program("again", W)).unload()  # the store changed: the next ask counts
    monkeypatch.setattr(weights_module, "sum", sum_then_unload, raising=False)
    fw.stats()  # counted with the release in the middle
    assert fw.stats()["hbm.weights.bytes"] == NB
    assert fw.stats()["hbm.weights.references"] == 1
    assert kept.loaded and not dropped.loaded
