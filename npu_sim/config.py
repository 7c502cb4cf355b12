"""Device configuration: the base parameters of a simulated NPU.

A :class:`DeviceConfig` holds only *base* parameters (clock, array geometry, memory sizes and
bandwidths); everything that follows from them (bytes per cycle, peak MACs per cycle, cycle time)
is a property, so a config can never disagree with itself. Values are validated when the object
is built: a bad value raises :class:`~npu_sim.errors.ConfigError` naming the field, the value and
the valid range. Configs are frozen; derive a variant with :meth:`DeviceConfig.replace`::

    cfg = DeviceConfig.preset("npu-m").replace(hbm_gbps=1600)

Units: bandwidths in GB/s (10**9 bytes per second), latencies in nanoseconds, sizes in bytes,
the clock in GHz. One simulated cycle is ``1 / clock_ghz`` nanoseconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .dtypes import itemsize
from .errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

DATAFLOWS = ("os", "ws", "is")
"""Systolic dataflows: output-, weight- and input-stationary."""

STATIONARY_LOADS = ("hidden", "exposed")
"""Whether loading the stationary operand into the array overlaps the previous fold (shadow
registers: ``hidden``) or costs ``R`` cycles per fold (``exposed``, as SCALE-Sim models it)."""

MAC_DTYPES = ("int8", "float16", "bfloat16", "float32")
"""Data types the systolic array has a MAC rate for (uint8 runs at the int8 rate)."""

# -- energy defaults --------------------------------------------------------------------------
# Per-action energies at 45 nm and 0.9 V from M. Horowitz, "Computing's energy problem (and what
# we can do about it)", ISSCC 2014: 8-bit integer multiply 0.2 pJ and 32-bit add 0.1 pJ; float16
# multiply 1.1 pJ and add 0.4 pJ; float32 multiply 3.7 pJ and add 0.9 pJ; a 64-bit access to a
# 32 KB SRAM 20 pJ. A MAC is one multiply plus one accumulate (int8 accumulates in 32 bits).
HOROWITZ_45NM_PJ = {
    "int8_mac_pj": 0.2 + 0.1,
    "float16_mac_pj": 1.1 + 0.4,
    "bfloat16_mac_pj": 1.1 + 0.4,  # no figure of its own; priced as float16 (same datapath)
    "float32_mac_pj": 3.7 + 0.9,
    "sram_read_pj_per_byte": 20.0 / 8,
    "sram_write_pj_per_byte": 20.0 / 8,  # Horowitz gives one figure per access
    "dma_pj_per_byte": 2 * 20.0 / 8,  # a DMA engine stages each byte: one SRAM write + read
}
LEAKAGE_SHARE = 0.1
"""Leakage per core per cycle, as a share of the core's peak float16 array energy per cycle."""


def scaled_energy(node_nm: float, vdd: float, *, pes: int, dram_pj_per_byte: float,
                  host_link_pj_per_byte: float) -> dict[str, float]:
    """Per-action energy defaults for a part built in ``node_nm`` at ``vdd`` volts.

    On-chip energies (MACs, SRAM, the DMA engine) scale from Horowitz's 45 nm / 0.9 V figures as
    switched capacitance times voltage squared, ``E = E45 * (node_nm / 45) * (vdd / 0.9)**2``.
    Off-chip energies (DRAM/HBM, the host link) belong to their own chips and PHYs and are given.
    Leakage is :data:`LEAKAGE_SHARE` of the core's peak float16 array energy per cycle
    (``pes * float16_mac_pj``). Values are rounded to four significant digits.
    """
    scale = (node_nm / 45.0) * (vdd / 0.9) ** 2
    out = {k: float(f"{v * scale:.4g}") for k, v in HOROWITZ_45NM_PJ.items()}
    out["hbm_pj_per_byte"] = float(dram_pj_per_byte)
    out["host_link_pj_per_byte"] = float(host_link_pj_per_byte)
    out["leakage_pj_per_core_cycle"] = float(f"{LEAKAGE_SHARE * pes * out['float16_mac_pj']:.4g}")
    return out


# HBM2e/HBM3 about 3.9 pJ/bit (O'Connor et al., "Fine-Grained DRAM", MICRO 2017); LPDDR5 about
# 5 pJ/bit; DDR3 at Horowitz's 1.3 nJ per 64-bit access; a PCIe SerDes about 5 pJ/bit.
_ENERGY = {
    "npu-s": scaled_energy(7, 0.75, pes=32 * 32, dram_pj_per_byte=40.0,
                           host_link_pj_per_byte=40.0),
    "npu-m": scaled_energy(16, 0.8, pes=64 * 64, dram_pj_per_byte=31.2,
                           host_link_pj_per_byte=40.0),
    "npu-l": scaled_energy(7, 0.75, pes=128 * 128, dram_pj_per_byte=31.2,
                           host_link_pj_per_byte=40.0),
    "os32": scaled_energy(45, 0.9, pes=32 * 32, dram_pj_per_byte=1300.0 / 8,
                          host_link_pj_per_byte=40.0),
}
ENERGY_FIELDS = tuple(_ENERGY["npu-m"])
"""The per-action energy fields of :class:`DeviceConfig`, all in picojoules."""


@dataclass(frozen=True)
class DeviceConfig:
    """Base parameters of one simulated NPU. See ``docs/device_config.md`` for each field."""

    name: str = "npu-m"
    clock_ghz: float = 1.2
    cores: int = 4
    array_rows: int = 64
    array_cols: int = 64
    dataflow: str = "os"
    stationary_load: str = "hidden"
    vector_lanes: int = 256
    sram_bytes_per_core: int = 4 * MiB
    hbm_bytes: int = 16 * GiB
    hbm_gbps: float = 460.0
    hbm_latency_ns: float = 120.0
    host_link_gbps: float = 25.0
    dma_channels: int = 4
    dma_setup_ns: float = 1000.0
    dma_chunk_bytes: int = 10 * MiB
    hbm_alignment: int = 512
    launch_overhead_ns: float = 2000.0
    int8_macs_per_pe: float = 4.0
    float16_macs_per_pe: float = 1.0
    bfloat16_macs_per_pe: float = 1.0
    float32_macs_per_pe: float = 0.25
    int8_mac_pj: float = _ENERGY["npu-m"]["int8_mac_pj"]
    float16_mac_pj: float = _ENERGY["npu-m"]["float16_mac_pj"]
    bfloat16_mac_pj: float = _ENERGY["npu-m"]["bfloat16_mac_pj"]
    float32_mac_pj: float = _ENERGY["npu-m"]["float32_mac_pj"]
    sram_read_pj_per_byte: float = _ENERGY["npu-m"]["sram_read_pj_per_byte"]
    sram_write_pj_per_byte: float = _ENERGY["npu-m"]["sram_write_pj_per_byte"]
    dma_pj_per_byte: float = _ENERGY["npu-m"]["dma_pj_per_byte"]
    hbm_pj_per_byte: float = _ENERGY["npu-m"]["hbm_pj_per_byte"]
    host_link_pj_per_byte: float = _ENERGY["npu-m"]["host_link_pj_per_byte"]
    leakage_pj_per_core_cycle: float = _ENERGY["npu-m"]["leakage_pj_per_core_cycle"]

    def __post_init__(self) -> None:
        for f in fields(self):
            check = _CHECKS[f.name]
            value = getattr(self, f.name)
            check(f.name, value)

    def __hash__(self) -> int:
        # The cost model's cache hashes the config on every launch: hash the fields once.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        # String hashes differ between processes: a pickled config recomputes its hash.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def preset(cls, name: str) -> DeviceConfig:
        """The named preset: ``npu-s``, ``npu-m`` (default), ``npu-l`` or ``os32``."""
        try:
            fields_ = PRESETS[name]
        except KeyError:
            raise ConfigError("preset", name, f"one of {sorted(PRESETS)}") from None
        # Configs are frozen: every session naming a preset can share one instance (each made
        # anew checked its 36 fields, and its digest was worked out again per EPContext load).
        made = _PRESETS_MADE.get(name) if cls is DeviceConfig else None
        if made is None or made[0] != fields_:  # PRESETS is a public dict: edits take effect
            made = dict(fields_), cls(**fields_)
            if cls is DeviceConfig:
                _PRESETS_MADE[name] = made
        return made[1]

    @classmethod
    def named(cls, device: str) -> DeviceConfig:
        """What a ``device`` option names: a preset, or the path of a ``.json`` / ``.toml``
        config file (:meth:`from_file`)."""
        if device in PRESETS:
            return cls.preset(device)
        if Path(device).suffix.lower() in (".json", ".toml"):
            return cls.from_file(device)
        raise ConfigError("device", device, f"a preset ({', '.join(sorted(PRESETS))}) or the "
                                            "path of a .json or .toml device config")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceConfig:
        """Build from a mapping of field names; unknown keys are an error, not ignored.

        A ``preset`` key names the base to start from; the other keys override it.
        """
        if not isinstance(data, dict):
            raise ConfigError("config", type(data).__name__, "a table/object of fields")
        data = dict(data)
        base: dict[str, Any] = {}
        if "preset" in data:
            base = cls.preset(data.pop("preset")).to_dict()
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(key, data[key], f"a known field: {', '.join(sorted(known))}")
        return cls(**{**base, **data})

    @classmethod
    def from_file(cls, path: str | Path) -> DeviceConfig:
        """Load a config from a ``.json`` or ``.toml`` file (same keys as :meth:`to_dict`)."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in (".json", ".toml"):
            raise ConfigError("path", str(path), "a file ending in .json or .toml")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("path", str(path), f"a readable file ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError("path", str(path), f"a UTF-8 text file ({exc.reason} at byte "
                                                 f"{exc.start})") from None
        try:
            data = json.loads(text) if suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError("path", str(path), f"valid {suffix[1:].upper()} ({exc})") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The base parameters as a plain dict; ``DeviceConfig(**cfg.to_dict()) == cfg``."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> DeviceConfig:
        """A copy with some base parameters changed (validated like a new config)."""
        known = {f.name for f in fields(self)}
        for key, value in changes.items():
            if key not in known:
                raise ConfigError(key, value, f"a known field: {', '.join(sorted(known))}")
        return dataclasses.replace(self, **changes)

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON form: identifies the config in traces and binaries."""
        # Every EPContext load compares it: worked out once (2% of a small model's load).
        cached = self.__dict__.get("_digest")
        if cached is None:
            blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
            cached = hashlib.sha256(blob.encode()).hexdigest()
            object.__setattr__(self, "_digest", cached)
        return cached

    # -- derived values -----------------------------------------------------------------------

    @property
    def cycle_ns(self) -> float:
        """Length of one clock cycle in nanoseconds."""
        return 1.0 / self.clock_ghz

    def ns_to_cycles(self, ns: float) -> int:
        """A duration in nanoseconds as a whole number of cycles (rounded up)."""
        return math.ceil(ns * self.clock_ghz - 1e-9)

    def cycles_to_us(self, cycles: float) -> float:
        """A cycle count as microseconds."""
        return cycles / (self.clock_ghz * 1000.0)

    @property
    def hbm_bytes_per_cycle(self) -> float:
        """HBM bandwidth in bytes per cycle (shared by all cores)."""
        return self.hbm_gbps / self.clock_ghz

    @property
    def host_link_bytes_per_cycle(self) -> float:
        """Host link (PCIe) bandwidth in bytes per cycle, shared by all DMA channels."""
        return self.host_link_gbps / self.clock_ghz

    @property
    def hbm_latency_cycles(self) -> int:
        return self.ns_to_cycles(self.hbm_latency_ns)

    @property
    def dma_setup_cycles(self) -> int:
        """Fixed cost of one DMA chunk (descriptor fetch, address translation, completion)."""
        return self.ns_to_cycles(self.dma_setup_ns)

    @property
    def launch_overhead_cycles(self) -> int:
        """Fixed cost of one kernel launch on a core."""
        return self.ns_to_cycles(self.launch_overhead_ns)

    @property
    def pes_per_core(self) -> int:
        """Processing elements in one core's systolic array."""
        return self.array_rows * self.array_cols

    def macs_per_pe(self, dtype: str) -> float:
        """MACs one PE completes per cycle for ``dtype`` (uint8 runs at the int8 rate)."""
        key = "int8" if dtype in ("int8", "uint8") else dtype
        if key not in MAC_DTYPES:
            raise ConfigError("dtype", dtype, f"one of {MAC_DTYPES + ('uint8',)}")
        return getattr(self, f"{key}_macs_per_pe")

    def mac_pj(self, dtype: str) -> float:
        """Energy of one MAC (or one vector lane-operation) on ``dtype``, in picojoules.

        Dtypes without a MAC rate are priced by element size: 1 byte as int8, 2 as float16,
        wider as float32 (bool, int32, int64 and float64 run on the vector unit only).
        """
        key = "int8" if dtype in ("int8", "uint8") else dtype
        if key not in MAC_DTYPES:
            size = itemsize(dtype)
            key = "int8" if size <= 1 else "float16" if size == 2 else "float32"
        return getattr(self, f"{key}_mac_pj")

    def peak_macs_per_cycle(self, dtype: str = "float16", cores: int | None = None) -> float:
        """Peak MACs per cycle for ``dtype`` on ``cores`` cores (default: all)."""
        n = self.cores if cores is None else cores
        return self.pes_per_core * self.macs_per_pe(dtype) * n

    def peak_tops(self, dtype: str = "int8") -> float:
        """Peak tera-operations per second (2 ops per MAC), the figure datasheets quote."""
        return 2 * self.peak_macs_per_cycle(dtype) * self.clock_ghz / 1000.0


# -- validation -------------------------------------------------------------------------------


def _int_range(lo: int, hi: int, *, power_of_two: bool = False):
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, value, f"an integer in [{lo}, {hi}]")
        if not lo <= value <= hi:
            raise ConfigError(name, value, f"an integer in [{lo}, {hi}]")
        if power_of_two and value & (value - 1):
            raise ConfigError(name, value, f"a power of two in [{lo}, {hi}]")

    return check


def _float_range(lo: float, hi: float, *, open_low: bool = False):
    bracket = "(" if open_low else "["

    def check(name: str, value: Any) -> None:
        valid = f"a number in {bracket}{lo}, {hi}]"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, value, valid)
        if not math.isfinite(value) or value > hi or value < lo or (open_low and value == lo):
            raise ConfigError(name, value, valid)

    return check


def _choice(options: tuple[str, ...]):
    def check(name: str, value: Any) -> None:
        if value not in options:
            raise ConfigError(name, value, f"one of {list(options)}")

    return check


def _name(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or len(value) > 64 or not value.isprintable():
        raise ConfigError(name, value, "a non-empty printable string of at most 64 characters")


_CHECKS = {
    "name": _name,
    "clock_ghz": _float_range(0.0, 10.0, open_low=True),
    "cores": _int_range(1, 64),
    "array_rows": _int_range(1, 1024),
    "array_cols": _int_range(1, 1024),
    "dataflow": _choice(DATAFLOWS),
    "stationary_load": _choice(STATIONARY_LOADS),
    "vector_lanes": _int_range(1, 65536),
    "sram_bytes_per_core": _int_range(4 * KiB, 1 * GiB),
    "hbm_bytes": _int_range(1 * MiB, 4096 * GiB),
    "hbm_gbps": _float_range(0.0, 1e5, open_low=True),
    "hbm_latency_ns": _float_range(0.0, 1e6),
    "host_link_gbps": _float_range(0.0, 1e4, open_low=True),
    "dma_channels": _int_range(1, 64),
    "dma_setup_ns": _float_range(0.0, 1e7),
    "dma_chunk_bytes": _int_range(4 * KiB, 1 * GiB),
    "hbm_alignment": _int_range(1, 1 * MiB, power_of_two=True),
    "launch_overhead_ns": _float_range(0.0, 1e7),
    "int8_macs_per_pe": _float_range(0.0, 64.0, open_low=True),
    "float16_macs_per_pe": _float_range(0.0, 64.0, open_low=True),
    "bfloat16_macs_per_pe": _float_range(0.0, 64.0, open_low=True),
    "float32_macs_per_pe": _float_range(0.0, 64.0, open_low=True),
    **{name: _float_range(0.0, 1e6) for name in ENERGY_FIELDS},
}

# -- presets ----------------------------------------------------------------------------------

_PRESETS_MADE: dict[str, tuple[dict[str, Any], DeviceConfig]] = {}
"""Preset name -> (its fields when made, the config): :meth:`DeviceConfig.preset`'s instances."""

PRESETS: dict[str, dict[str, Any]] = {
    # An edge NPU in a phone or camera SoC: two small arrays, LPDDR5 shared with the CPU,
    # a narrow link. Int8 first; float16 at a quarter of the int8 rate, float32 emulated.
    "npu-s": dict(
        name="npu-s", clock_ghz=1.0, cores=2, array_rows=32, array_cols=32, dataflow="os",
        vector_lanes=64, sram_bytes_per_core=1 * MiB, hbm_bytes=4 * GiB, hbm_gbps=51.2,
        hbm_latency_ns=150.0, host_link_gbps=8.0, dma_channels=2, dma_setup_ns=800.0,
        launch_overhead_ns=1500.0, int8_macs_per_pe=4.0, float16_macs_per_pe=1.0,
        bfloat16_macs_per_pe=1.0, float32_macs_per_pe=0.125,
        **_ENERGY["npu-s"],
    ),
    # A mid-range inference card: four 64x64 cores, one HBM2e stack, PCIe Gen4 x16.
    "npu-m": dict(
        name="npu-m", clock_ghz=1.2, cores=4, array_rows=64, array_cols=64, dataflow="os",
        vector_lanes=256, sram_bytes_per_core=4 * MiB, hbm_bytes=16 * GiB, hbm_gbps=460.0,
        hbm_latency_ns=120.0, host_link_gbps=25.0, dma_channels=4, dma_setup_ns=1000.0,
        launch_overhead_ns=2000.0, int8_macs_per_pe=4.0, float16_macs_per_pe=1.0,
        bfloat16_macs_per_pe=1.0, float32_macs_per_pe=0.25,
        **_ENERGY["npu-m"],
    ),
    # A datacenter training/inference part: eight 128x128 weight-stationary cores, four HBM3
    # stacks, PCIe Gen5 x16.
    "npu-l": dict(
        name="npu-l", clock_ghz=1.5, cores=8, array_rows=128, array_cols=128, dataflow="ws",
        vector_lanes=1024, sram_bytes_per_core=24 * MiB, hbm_bytes=64 * GiB, hbm_gbps=1600.0,
        hbm_latency_ns=100.0, host_link_gbps=50.0, dma_channels=8, dma_setup_ns=800.0,
        launch_overhead_ns=1500.0, int8_macs_per_pe=4.0, float16_macs_per_pe=1.0,
        bfloat16_macs_per_pe=1.0, float32_macs_per_pe=0.25,
        **_ENERGY["npu-l"],
    ),
    # Validation part: one 32x32 output-stationary core at 1 GHz (1 cycle = 1 ns), one MAC per
    # PE per cycle for every dtype, and the stationary operand's load exposed, so SCALE-Sim's
    # stall-free cycle counts (and hand-computed ones) apply directly.
    "os32": dict(
        name="os32", clock_ghz=1.0, cores=1, array_rows=32, array_cols=32, dataflow="os",
        stationary_load="exposed",
        vector_lanes=32, sram_bytes_per_core=512 * KiB, hbm_bytes=1 * GiB, hbm_gbps=64.0,
        hbm_latency_ns=100.0, host_link_gbps=16.0, dma_channels=1, dma_setup_ns=1000.0,
        launch_overhead_ns=0.0, int8_macs_per_pe=1.0, float16_macs_per_pe=1.0,
        bfloat16_macs_per_pe=1.0, float32_macs_per_pe=1.0, **_ENERGY["os32"],
    ),
}
