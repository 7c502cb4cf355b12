"""DeviceConfig: presets, round trips, validation of every field, derived values."""

import hashlib
import json
import math
import pickle
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim import DeviceConfig
from npu_sim.config import PRESETS, MiB
from npu_sim.errors import ConfigError

FIELDS = [f.name for f in fields(DeviceConfig)]
NUMERIC = [f for f in FIELDS if f not in ("name", "dataflow")]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_round_trip(name, tmp_path):
    cfg = DeviceConfig.preset(name)
    assert cfg.name == name
    assert DeviceConfig(**cfg.to_dict()) == cfg
    assert DeviceConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    assert DeviceConfig.from_file(tmp_path / "c.json") == cfg
    toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cfg.to_dict().items())
    (tmp_path / "c.toml").write_text(toml)
    assert DeviceConfig.from_file(tmp_path / "c.toml") == cfg
    assert cfg.digest == DeviceConfig.from_file(tmp_path / "c.toml").digest


def test_required_presets_exist():
    assert {"npu-s", "npu-m", "npu-l", "os32"} <= set(PRESETS)
    assert DeviceConfig() == DeviceConfig.preset("npu-m")
    assert DeviceConfig().dma_chunk_bytes == 10 * MiB and DeviceConfig().hbm_alignment == 512


def test_file_with_preset_base_and_override(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('preset = "npu-l"\nhbm_gbps = 3200.0\n')
    cfg = DeviceConfig.from_file(path)
    assert cfg == DeviceConfig.preset("npu-l").replace(hbm_gbps=3200.0)
    assert cfg.digest != DeviceConfig.preset("npu-l").digest


def test_unknown_keys_and_bad_files_are_errors(tmp_path):
    with pytest.raises(ConfigError) as info:
        DeviceConfig.from_dict({"cores": 2, "hbm_gb": 3})
    assert info.value.field == "hbm_gb" and "hbm_bytes" in info.value.valid
    with pytest.raises(ConfigError, match="hbm_gb"):
        DeviceConfig().replace(hbm_gb=3)
    with pytest.raises(ConfigError, match="preset"):
        DeviceConfig.preset("npu-xl")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        DeviceConfig.from_file(bad)
    with pytest.raises(ConfigError, match=r"\.json or \.toml"):
        DeviceConfig.from_file(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="readable"):
        DeviceConfig.from_file(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="table/object"):
        DeviceConfig.from_file(tmp_path / "list.json")


def bad_values(field):
    common = [None, [1], {"a": 1}]
    if field == "name":
        return common + ["", "x" * 65, "a\nb", 3]
    if field == "dataflow":
        return common + ["rs", "OS", "", 1]
    # Every numeric field has a non-negative lower bound and an upper bound below 10**15.
    return common + [-1, 10**15, "4", True, float("nan"), float("inf")]


@settings(max_examples=100)
@given(data=st.data())
def test_every_bad_field_value_names_the_field(data):
    field = data.draw(st.sampled_from(FIELDS))
    value = data.draw(st.sampled_from(bad_values(field)))
    with pytest.raises(ConfigError) as info:
        DeviceConfig().replace(**{field: value})
    assert info.value.field == field and repr(info.value.value) == repr(value)
    # The message names the field, the value given and what would be valid.
    assert f"{field}={value!r}" in str(info.value)
    assert info.value.valid and info.value.valid in str(info.value)


@pytest.mark.parametrize("field,value", [
    ("cores", 0), ("cores", 65), ("cores", 2.0), ("hbm_alignment", 384),
    ("clock_ghz", 0.0), ("dma_chunk_bytes", 1024), ("hbm_bytes", 1024),
])
def test_specific_ranges(field, value):
    with pytest.raises(ConfigError, match=field):
        DeviceConfig().replace(**{field: value})


@settings(max_examples=30)
@given(clock=st.floats(0.1, 5.0), gbps=st.floats(1.0, 4000.0), link=st.floats(1.0, 200.0),
       setup=st.floats(0.0, 10_000.0))
def test_derived_values(clock, gbps, link, setup):
    cfg = DeviceConfig().replace(clock_ghz=clock, hbm_gbps=gbps, host_link_gbps=link,
                                 dma_setup_ns=setup)
    assert cfg.cycle_ns == pytest.approx(1 / clock)
    assert cfg.hbm_bytes_per_cycle == pytest.approx(gbps / clock)
    assert cfg.host_link_bytes_per_cycle == pytest.approx(link / clock)
    # Setup is rounded up to whole cycles, never more than one cycle over.
    assert setup * clock - 1e-6 <= cfg.dma_setup_cycles < setup * clock + 1


def test_peak_rates_by_hand():
    m = DeviceConfig.preset("npu-m")
    assert m.pes_per_core == 64 * 64
    assert m.peak_macs_per_cycle("int8") == 4096 * 4 * 4
    assert m.peak_macs_per_cycle("uint8", cores=1) == 4096 * 4
    # 2 ops/MAC * 65536 MAC/cycle * 1.2 GHz = 157.3 TOPS int8
    assert m.peak_tops("int8") == pytest.approx(2 * 65536 * 1.2 / 1000)
    assert m.launch_overhead_cycles == 2400
    assert m.cycles_to_us(1200) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="dtype"):
        m.macs_per_pe("int4")
    assert math.isclose(DeviceConfig.preset("os32").dma_setup_cycles, 1000)


def test_equal_configs_hash_equal_also_after_pickling():
    a, b = DeviceConfig.preset("npu-l"), DeviceConfig(**DeviceConfig.preset("npu-l").to_dict())
    assert hash(a) == hash(b) and {a: 1}[b] == 1
    again = pickle.loads(pickle.dumps(a))
    assert again == a and hash(again) == hash(a) and again.to_dict() == a.to_dict()
    assert hash(a.replace(cores=2)) != hash(a)


def test_a_device_option_names_a_preset_or_a_config_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"preset": "npu-s", "cores": 2}))
    assert DeviceConfig.named("npu-l") == DeviceConfig.preset("npu-l")
    assert DeviceConfig.named(str(path)) == DeviceConfig.from_file(path)
    for bad, field in (("npu-xl", "device"), ("mine.yaml", "device"),
                       (str(tmp_path / "absent.toml"), "path")):
        with pytest.raises(ConfigError) as err:
            DeviceConfig.named(bad)
        assert err.value.field == field and err.value.value == bad
        assert field == "path" or "npu-m" in err.value.valid  # the presets are named


def test_a_preset_is_made_once_and_an_edit_of_presets_takes_effect(monkeypatch):
    first = DeviceConfig.preset("npu-s")
    assert DeviceConfig.preset("npu-s") is first  # frozen: sessions share it
    blob = json.dumps(first.to_dict(), sort_keys=True, separators=(",", ":"))
    assert first.digest == hashlib.sha256(blob.encode()).hexdigest() == first.digest
    monkeypatch.setitem(PRESETS, "npu-s", {**PRESETS["npu-s"], "cores": 1})
    edited = DeviceConfig.preset("npu-s")
    assert edited.cores == 1 and edited.digest != first.digest
    monkeypatch.undo()
    assert DeviceConfig.preset("npu-s") == first
