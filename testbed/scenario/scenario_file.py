"""A scenario file on disk: its fields read without trusting them (`safe_yaml`'s caps), its
relative trace paths taken from its folder and kept inside it, and the resolved scenario
written back as YAML. Validating the fields is `checks.validate_schema`; the whole check,
plan included, is `testbed.plan.parse_scenario`/`load_scenario`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence, Union

import yaml

from testbed.scenario.checks import ScenarioError
from testbed.scenario.devices.catalog import read_device_file
from testbed.scenario.document import Scenario
from testbed.scenario.latency_traces import LATENCY_CATALOG
from testbed.scenario.safe_yaml import LoadError, excerpt, load_yaml_file
from testbed.scenario.traces import is_library_ref


def read_scenario_file(path: Union[str, Path], trace_dirs: Sequence[Union[str, Path]] = ()) -> Any:
    """A scenario file's fields, its relative trace paths taken from the file's folder.

    Traces are read from that folder and its subfolders only, or from `trace_dirs`: a scenario
    handed over by someone else cannot make edgebed open any file on the host."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError([f"{p}: no such scenario file"])
    try:
        data = load_yaml_file(p)
    except LoadError as e:
        raise ScenarioError([f"{p}: {e}"]) from None
    data = _resolve_event_traces(_resolve_trace_paths(data, p.parent), p.parent)
    _resolve_link_traces(data, p.parent)
    outside = traces_outside(data, [p.parent, *map(Path, trace_dirs)])
    if outside:
        raise ScenarioError(outside)
    return _read_devices(data, p.parent, [p.parent, *map(Path, trace_dirs)])


def _read_devices(data: Any, base: Path, roots: Sequence[Path]) -> Any:
    """`devices: FILE`: the entries of a YAML file in the scenario's folder (the traces' rule),
    read into the scenario, so RUN/scenario.yaml carries them."""
    name = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(name, str):
        return data
    path = Path(os.path.realpath(base / name.strip()))
    if not any(path == Path(os.path.realpath(r)) or Path(os.path.realpath(r)) in path.parents for r in roots):
        raise ScenarioError([f"devices: {excerpt(name)} is outside the scenario's folder ({excerpt(str(roots[0]))}); "
                             "a devices file is read from there only (or --trace-dir DIR)"])
    try:
        data["devices"] = read_device_file(path)
    except ValueError as e:
        raise ScenarioError(str(e).splitlines()) from None
    return data


def traces_outside(data: Any, roots: Sequence[Path]) -> list[str]:
    """A line per trace path (streaming rates, events) that resolves outside every root folder
    (symbolic links followed), naming the field."""
    folders = [Path(os.path.realpath(r)) for r in roots]
    lines = []
    for field, trace in _trace_fields(data):
        real = Path(os.path.realpath(trace))
        if not any(real == f or f in real.parents for f in folders):
            lines.append(f"{field}: {excerpt(trace)} is outside the scenario's folder ({excerpt(str(roots[0]))}); "
                         "traces are read from there only (edgebed up/validate --trace-dir DIR allows another)")
    return lines


def _trace_fields(data: Any) -> list[tuple[str, str]]:
    """(field, path) of every trace a scenario's raw fields name."""
    out = []
    st = data.get("streaming") if isinstance(data, dict) else None
    rates = st.get("rates") if isinstance(st, dict) else None
    for i, r in (enumerate(rates) if isinstance(rates, list) else [(None, rates)]):
        if isinstance(r, dict) and isinstance(r.get("trace"), str) and r["trace"].strip():
            out.append((f"streaming.rates{'' if i is None else f'[{i}]'}.trace", r["trace"]))
    events = data.get("events") if isinstance(data, dict) else None
    for i, ev in enumerate(events if isinstance(events, list) else []):
        if isinstance(ev, dict) and isinstance(ev.get("trace"), str) and ev["trace"].strip():
            out.append((f"events[{i}].trace", ev["trace"]))
    for i, entry in enumerate(_availability(data)):
        if isinstance(entry.get("trace"), str) and entry["trace"].strip():
            out.append((f"availability[{i}].trace", entry["trace"]))
    return out + [(f, d[k]) for f, d, k in _link_trace_slots(data) if not _in_library(d[k])]


def _link_trace_slots(data: Any) -> list[tuple[str, dict, str]]:
    """(field, mapping, key) of every link `trace:` and `latency_trace:` in the raw fields: named and inline profiles
    (workers, ps, evaluator, sites' LANs), both-direction and per-direction."""
    if not isinstance(data, dict):
        return []
    profiles: list[tuple[str, Any]] = []
    if isinstance(data.get("profiles"), dict):
        profiles += [(f"profiles.{n}", p) for n, p in data["profiles"].items()]
    workers, sites = data.get("workers"), data.get("sites")
    for i, w in enumerate(workers if isinstance(workers, list) else []):
        profiles.append((f"workers[{i}].profile", w.get("profile") if isinstance(w, dict) else None))
    for role in ("ps", "evaluator"):
        profiles.append((f"{role}.profile", data[role].get("profile") if isinstance(data.get(role), dict) else None))
    for n, site in (sites if isinstance(sites, dict) else {}).items():
        profiles.append((f"sites.{n}.lan", site.get("lan") if isinstance(site, dict) else None))
    out = []
    for where, prof in profiles:
        if not isinstance(prof, dict):
            continue
        for field, holder in ((where, prof), (f"{where}.uplink", prof.get("uplink")),
                              (f"{where}.downlink", prof.get("downlink"))):
            for key in ("trace", "latency_trace"):
                if isinstance(holder, dict) and isinstance(holder.get(key), str) and holder[key].strip():
                    out.append((f"{field}.{key}", holder, key))
    return out


def _in_library(ref: str) -> bool:
    """A shipped trace: a rate or latency catalog name, or a path in the library."""
    return is_library_ref(ref) or ref in LATENCY_CATALOG


def _resolve_link_traces(data: Any, base: Path) -> None:
    """A link trace that is not the library's is a file taken from the scenario's folder."""
    for _, holder, key in _link_trace_slots(data):
        t = holder[key].strip()
        if not _in_library(t) and not Path(t).is_absolute():
            holder[key] = str((base / t).resolve())


def _resolve_trace_paths(data: Any, base: Path) -> Any:
    """Relative `{trace: FILE}` rates are taken from the scenario file's folder, not the cwd."""
    st = data.get("streaming") if isinstance(data, dict) else None
    if not isinstance(st, dict):
        return data

    def fix(r: Any) -> Any:
        if isinstance(r, dict) and set(r) == {"trace"} and isinstance(r["trace"], str) \
                and r["trace"].strip() and not Path(r["trace"].strip()).is_absolute():
            return {"trace": str((base / r["trace"].strip()).resolve())}
        return r

    if "rates" in st:
        rates = st["rates"]
        st["rates"] = [fix(r) for r in rates] if isinstance(rates, list) else fix(rates)
    return data


def _resolve_event_traces(data: Any, base: Path) -> Any:
    """Relative event (and availability) traces are taken from the scenario file's folder, not the cwd."""
    events = data.get("events") if isinstance(data, dict) else None
    for ev in [*(events if isinstance(events, list) else []), *_availability(data)]:
        t = ev.get("trace") if isinstance(ev, dict) else None
        if isinstance(t, str) and t.strip() and not Path(t.strip()).is_absolute():
            ev["trace"] = str((base / t.strip()).resolve())
    return data


def _availability(data: Any) -> list[dict]:
    """The raw `availability` entries that are mappings."""
    entries = data.get("availability") if isinstance(data, dict) else None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def scenario_data(sc: Scenario) -> dict:
    """A validated scenario's fields, to change and validate again (`up`'s overrides, api.vary).
    What the scenario left to edgebed stays left: a default subnet dumped would read as named on
    the way back, and a runtime could no longer move it off one the engine holds."""
    data = sc.model_dump(mode="json", exclude_none=True)
    if "subnet" not in sc.network.model_fields_set:
        data.get("network", {}).pop("subnet", None)
    return data


def scenario_to_yaml(sc: Scenario) -> str:
    """The resolved scenario (defaults filled in), as written to RUN/scenario.yaml."""
    return yaml.safe_dump(sc.model_dump(mode="json", exclude_none=True), sort_keys=False)
