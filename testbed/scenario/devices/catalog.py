"""The device catalog: named devices in a host-independent speed unit, so a profile saying
`device: raspberry-pi-4` means the same compute on every host (the runner calibrates each host
and sets the node's quota from it: testbed/run/devices.py).

The unit, stated once: **effective GFLOP/s per core of PyTorch fp32 CPU training**, i.e. the
FLOPs of one training step (forward + backward, as `torch.utils.flop_counter.FlopCounterMode`
counts them: 2 per multiply-add of convolutions and matrix products) divided by the step's
seconds on one core, with the device's core count beside it. A device's speed is
`gflops * cores`; a node's target step time is `FLOPs per step / (gflops * cores * 1e9)`.

An accelerator entry (`accelerator:`: a GPU) states its datasheet's peak fp32 rate and memory
bandwidth, the fraction of that peak training reaches and a fixed cost per step instead; its step
time is a roofline of the model and the batch (step_time.py), and its `gflops` follows from them.
Every entry may state its power draw, idle and training (`power:`), for the run's energy.

Entries come from three places, every one with a `source:` and a `derivation:`:
edgebed's `catalog.yaml` (package data, sources in README.md beside it), packages registering
the entry point group `edgebed.devices` (an object that is, or a function returning, a mapping
name -> entry), and the scenario's `devices:` (inline, or a YAML file beside the scenario).
"""

from __future__ import annotations

import difflib
import functools
import re
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Callable, Optional, Union

from pydantic import Field, ValidationError, model_validator

from testbed.data.textfile import capped_text
from testbed.scenario.devices.step_time import StepCost, StepTime, proportional, roofline
from testbed.scenario.fields import Bytes, StrictModel
from testbed.scenario.safe_yaml import LoadError, load_yaml_text

ENTRY_POINT_GROUP = "edgebed.devices"
NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,39}")
MAX_FILE_BYTES = 256 << 10  # a catalog is a few pages of YAML
MAX_ENTRIES = 1000
MAX_TEXT = 600  # characters of a source or a derivation
UNIT = "effective GFLOP/s per core, PyTorch fp32 CPU training (forward+backward, FlopCounterMode's FLOPs)"


class Accelerator(StrictModel):
    """An accelerator's roofline (step_time.py): datasheet peaks, and what training reaches of them."""

    peak_tflops: float = Field(..., gt=0, le=10_000, description="peak fp32 TFLOP/s (datasheet)")
    memory_gbps: float = Field(..., gt=0, le=100_000, description="memory bandwidth, GB/s (datasheet)")
    efficiency: float = Field(..., gt=0, le=1, description="the fraction of peak fp32 a training step's "
                              "compute-bound work reaches")
    overhead_ms: float = Field(..., ge=0, le=10_000, description="fixed time per step: kernel launches, "
                               "the optimizer's pass, synchronisation")

    def step_time(self, cost: StepCost) -> StepTime:
        return roofline(cost, self.peak_tflops * 1e12, self.efficiency, self.memory_gbps * 1e9,
                        self.overhead_ms / 1e3)


class Power(StrictModel):
    """A device's power draw, whole board or card, in watts: idle, and while it trains."""

    idle_w: float = Field(..., ge=0, le=100_000)
    active_w: float = Field(..., gt=0, le=100_000)
    source: str = Field(..., min_length=10, max_length=MAX_TEXT, description="datasheet or published measurement")
    estimate: bool = Field(False, description="true where a number is an estimate, not a measurement")

    @model_validator(mode="after")
    def _ordered(self) -> "Power":
        if self.active_w < self.idle_w:
            raise ValueError("active_w: below idle_w; a training device draws at least its idle power")
        return self


class Speed(StrictModel):
    """A speed in the catalog's unit: GFLOP/s per core, and how many cores; for an accelerator, its
    roofline (then gflops is its compute-bound rate per core); and what it draws."""

    gflops: float = Field(..., gt=0, le=10_000_000, description="effective GFLOP/s per core (" + UNIT + ")")
    cores: int = Field(1, ge=1, le=256)
    accelerator: Optional[Accelerator] = None
    power: Optional[Power] = None

    @property
    def total_gflops(self) -> float:
        return self.gflops * self.cores

    def step_seconds(self, flops_per_step: float) -> float:
        """The device's time for a training step of `flops_per_step` FLOPs on all its cores."""
        return flops_per_step / (self.total_gflops * 1e9)

    def step_time(self, cost: StepCost) -> StepTime:
        """The device's step time for any batch of the model whose step `cost` is (a CPU's:
        proportional to the batch, as step_seconds; an accelerator's: its roofline)."""
        if self.accelerator is not None:
            return self.accelerator.step_time(cost)
        return proportional(cost.flops / cost.batch, self.total_gflops * 1e9)

    def dilated(self, k: float) -> "Speed":
        """The same device k times slower: every step time of it times k (virtual time)."""
        acc = self.accelerator
        if acc is not None:
            acc = acc.model_copy(update=dict(peak_tflops=acc.peak_tflops / k, memory_gbps=acc.memory_gbps / k,
                                             overhead_ms=acc.overhead_ms * k))
        return self.model_copy(update=dict(gflops=self.gflops / k, accelerator=acc))


class Device(StrictModel):
    """A catalog entry: cores, memory, speed, and what the speed rests on."""

    cores: int = Field(..., ge=1, le=256)
    memory: Bytes = Field(..., description="the device's RAM: the node's memory limit unless its profile sets one")
    gflops: Optional[float] = Field(None, gt=0, le=10_000, description="effective GFLOP/s per core (" + UNIT +
                                    "); an accelerator's follows from its roofline")
    accelerator: Optional[Accelerator] = Field(None, description="a GPU's roofline instead of gflops")
    power: Optional[Power] = Field(None, description="idle and training power, watts, with their source")
    source: str = Field("", max_length=MAX_TEXT, description="the published measurement or datasheet, citable")
    derivation: str = Field("", max_length=MAX_TEXT, description="how the speed follows from the source")
    estimate: bool = Field(False, description="true where the speed is an estimate, not a measurement")
    description: str = Field("", max_length=200)

    @model_validator(mode="after")
    def _cited(self) -> "Device":
        if not self.source.strip():
            raise ValueError("source: missing; every catalog entry cites the published measurement, paper or "
                             "datasheet its speed rests on")
        if not self.derivation.strip():
            raise ValueError("derivation: missing; say how the speed follows from the source")
        if self.memory is None:
            raise ValueError("memory: missing")
        if (self.gflops is None) == (self.accelerator is None):
            raise ValueError("gflops: give gflops (a CPU) or accelerator (a GPU's roofline), one of them")
        return self

    @property
    def speed(self) -> Speed:
        acc = self.accelerator
        gflops = acc.peak_tflops * 1e3 * acc.efficiency / self.cores if acc is not None else float(self.gflops or 0)
        return Speed(gflops=gflops, cores=self.cores, accelerator=acc, power=self.power)


def check_name(name: Any) -> Optional[str]:
    """Why `name` is not a device name, or None."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        return "is not a device name (lowercase letters, digits, '.' and '-', at most 40, e.g. raspberry-pi-4)"
    return None


def parse_entries(data: Any, where: str, line_of: Callable[[str], str] = lambda n: "") -> dict[str, Device]:
    """A mapping name -> entry as Devices; ValueError with one line per problem, each naming
    `where.NAME.field` (and the line, where `line_of` knows it), never quoting the content."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a device catalog is a mapping of device name -> entry")
    if len(data) > MAX_ENTRIES:
        raise ValueError(f"{where}: more than {MAX_ENTRIES} devices")
    out, lines = {}, []
    for name, entry in data.items():
        bad = check_name(name)
        if bad:
            lines.append(f"{where}: an entry's name {bad}")
            continue
        try:
            out[name] = Device.model_validate(entry)
        except ValidationError as e:
            lines += [f"{line_of(name)}{where}.{name}.{_field_message(err)}" for err in e.errors()]
    if lines:
        raise ValueError("\n".join(lines))
    return out


def _field_message(err: Any) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()))
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    if err.get("type") == "missing":
        msg = "missing"
    if not loc and ":" in msg:  # a model-level check names its own field ("source: missing; ...")
        return msg[:240]
    return f"{loc or '(entry)'}: {msg[:200]}"


@functools.lru_cache(maxsize=1)
def builtin() -> dict[str, Device]:
    """edgebed's own catalog (package data)."""
    text = resources.files(__package__).joinpath("catalog.yaml").read_text(encoding="utf-8")
    return parse_entries(load_yaml_text(text), "catalog.yaml")


@functools.lru_cache(maxsize=1)
def plugins() -> dict[str, Device]:
    """Entries registered by installed packages in the `edgebed.devices` group."""
    out: dict[str, Device] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            data = obj() if callable(obj) else obj
        except Exception as e:
            raise ValueError(f"devices: entry point '{ep.name}' ({ep.value}) does not load: {type(e).__name__}") \
                from None
        for name, dev in parse_entries(data, f"entry point {ep.name}").items():
            if name in builtin() or name in out:
                raise ValueError(f"devices: entry point '{ep.name}' adds '{name}', a device already in the catalog")
            out[name] = dev
    return out


def catalog(user: Optional[dict[str, Device]] = None) -> dict[str, Device]:
    """Every known device: edgebed's, the plugins', then the scenario's own."""
    return {**builtin(), **plugins(), **(user or {})}


def unknown_device_line(where: str, name: str, known: dict[str, Device]) -> str:
    """`where: unknown device 'x' (closest: a, b)`, or the known names when none is close."""
    shown = name if check_name(name) is None else "(not a device name)"
    close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6) if check_name(name) is None else []
    hint = f"closest: {', '.join(close)}" if close else f"known: {', '.join(sorted(known))}"
    return f"{where}: unknown device '{shown}' ({hint})"


def read_device_file(path: Union[str, Path], field: str = "devices") -> dict[str, Any]:
    """A user's catalog file (YAML: name -> entry), checked entry by entry; ValueError with one
    line per problem naming the file, the line and the field."""
    p = Path(path)
    try:
        text = capped_text(p, MAX_FILE_BYTES)
        data = load_yaml_text(text)
    except (ValueError, LoadError) as e:
        raise ValueError(f"{field}: {p.name}: {e}") from None
    if data is None:
        return {}
    starts = {m.group(1): i + 1 for i, line in enumerate(text.splitlines())
              if (m := re.match(r"^([a-z0-9][a-z0-9.-]{0,39})\s*:", line))}
    parse_entries(data, field, lambda n: f"{p.name} line {starts[n]}: " if n in starts else f"{p.name}: ")
    return data


def resolve_speed(device: Optional[str], speed: Optional[Speed],
                  known: dict[str, Device]) -> Optional[tuple[str, Speed]]:
    """(label, speed) of a profile's `device:` or `speed:`; None for a host-relative profile."""
    if device is not None:
        return device, known[device].speed
    if speed is not None:
        return f"speed {speed.gflops:g}x{speed.cores}", speed
    return None
