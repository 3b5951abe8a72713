"""Run config files: `learntok train --config run.yaml` (or .toml / .json), command-line flags overriding.

A file holds any part of a TrainConfig, in the sections of config.json (`model`, `boundary`, `data`, `optim`,
and run-level keys at the top), or flat with the flags' names (`lr = 1e-3`, `d_model = 256`; leaf names are
unique); `data = "PATH"` at the top sets the data source, `boundaries = "uniform"` the strategy. What it leaves
out comes from the preset (`preset = "small"` or --preset) or from the run being resumed. Values are checked
against the fields' types (a YAML `1e-3`, which YAML reads as a string, is accepted as a number) and an unknown
key is an error naming the file and the key.

`learntok train [options] --write-config run.toml` writes the effective config (any preset plus any flags) as
such a file and exits; reading it back gives the same config (tests/test_config_file.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from learntok.boundaries import config_class
from learntok.config import CONFIG_VERSION, DataConfig, ModelConfig, OptimConfig, TrainConfig, to_dict, upgrade

SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig}
RUN_CONTROL = ("resume", "overwrite")
"""TrainConfig fields that say how to start this one command, not what the run is: never written to a file."""


def _read(path: Path) -> dict:
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as e:
            raise ValueError(f"{path}: reading YAML needs PyYAML: pip install 'learntok[yaml]' (or use a .toml "
                             "file)") from e
        parse = yaml.safe_load
    elif suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:
            import tomli as tomllib
        parse = tomllib.loads
    elif suffix == ".json":
        parse = json.loads
    else:
        raise ValueError(f"{path}: unknown config file type {suffix!r} (use .yaml, .yml, .toml or .json)")
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path}: not valid {suffix[1:].upper()}: {str(e).splitlines()[0]}") from e
    except Exception as e:  # yaml.YAMLError
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    _check_keys(data, path)
    return data


def _check_keys(data: dict, path: Path, where: str = "") -> None:
    """Every key a string (YAML reads `1: 2` as an integer key)."""
    for k, v in data.items():
        if not isinstance(k, str):
            raise ValueError(f"{path}: {where}{k!r}: a setting's name must be a string")
        if isinstance(v, dict):
            _check_keys(v, path, f"{where}{k}.")


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """`value` as type `hint` (bool, int, float, str, Literal, Optional), or ValueError naming `where`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _coerce(value, hint, where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint in (int, float):
        num = value
        if isinstance(value, str):
            try:
                num = float(value)
            except ValueError:
                num = None
        if isinstance(num, bool) or not isinstance(num, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        if hint is int:
            if not (math.isfinite(num) and float(num).is_integer()):
                raise ValueError(f"{where}: expected a whole number, got {value!r}")
            return int(num)
        return float(num)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is tuple:  # tuple[int, ...] or tuple[float, float]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(kinds) != len(value):
            raise ValueError(f"{where}: expected a list of {len(kinds)}, got {value!r}")
        return tuple(_coerce(v, k, where) for v, k in zip(value, kinds))
    return value


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _merge(base: dict, updates: dict, cls: type, path: Path, section: str = "") -> dict:
    """base (a section of to_dict) with `updates` applied; unknown keys and wrong types are errors."""
    types = _fields(cls)
    out = dict(base)
    for key, value in updates.items():
        name = key.replace("-", "_")
        where = f"{path}: {section + '.' if section else ''}{name}"
        if name not in types:
            raise ValueError(f"{where}: unknown setting")
        out[name] = _coerce(value, types[name], where)
    return out


def _leaf_owners(boundary_cls: type) -> dict[str, str]:
    """Flat key -> the section holding it."""
    owners = {name: section for section, cls in SECTIONS.items() for name in _fields(cls)}
    owners.update({name: "boundary" for name in _fields(boundary_cls)})
    return owners


def preset_of(path: str | Path) -> str | None:
    """The `preset` a config file names (None if it names none)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    preset = _read(path).get("preset")
    return preset if isinstance(preset, str) else None


def apply_file(base: TrainConfig, path: str | Path) -> TrainConfig:
    """`base` with the settings of config file `path` applied (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--config {path}: no such file")
    raw = {k.replace("-", "_"): v for k, v in _read(path).items()}
    raw.pop("run_info", None)
    for key in RUN_CONTROL:  # a run's config.json has them: they say how that command started, not what to train
        raw.pop(key, None)
    version = raw.pop("config_version", CONFIG_VERSION)  # a file without one is read as the current version
    if version != CONFIG_VERSION:
        try:
            raw = upgrade(raw, version)  # e.g. a file written by an older --write-config
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    nested = {s: dict(raw.pop(s)) for s in [*SECTIONS, "boundary"] if isinstance(raw.get(s), dict)}
    if isinstance(raw.get("data"), str):  # `data = "PATH"`: the flag's name for the data source
        nested.setdefault("data", {})["source"] = raw.pop("data")
    strategy = raw.pop("boundaries", None) or nested.get("boundary", {}).get("boundaries")
    boundary = base.boundary
    if strategy and strategy != boundary.boundaries:
        boundary = boundary.converted(config_class(strategy))
    owners = _leaf_owners(type(boundary))
    run_fields = set(_fields(TrainConfig)) - {"model", "boundary", "data", "optim"}
    top = {}
    for key, value in raw.items():
        if key in run_fields:
            top[key] = value
        elif key in owners:
            nested.setdefault(owners[key], {})[key] = value
        else:
            raise ValueError(f"{path}: {key}: unknown setting")
    d = to_dict(dataclasses.replace(base, boundary=boundary))
    kw: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        kw[section] = cls(**_merge(d[section], nested.get(section, {}), cls, path, section))
    kw["boundary"] = type(boundary)(**_merge(d["boundary"], nested.get("boundary", {}), type(boundary), path,
                                             "boundary"))
    run = _merge({k: v for k, v in d.items() if k in run_fields}, top, TrainConfig, path)
    return TrainConfig(**{**run, **kw})


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else "nan" if math.isnan(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(v, ensure_ascii=False)  # a TOML basic string


def config_text(cfg: TrainConfig, fmt: str) -> str:
    """The effective config as a config file's text: toml, yaml or json."""
    d = {k: v for k, v in to_dict(cfg).items() if k not in RUN_CONTROL}
    if fmt == "json":
        return json.dumps(d, indent=2) + "\n"
    if fmt == "yaml":
        try:
            import yaml
        except ImportError as e:
            raise ValueError("writing YAML needs PyYAML: pip install 'learntok[yaml]' (or write .toml)") from e
        return yaml.safe_dump(d, sort_keys=False)
    sections = [k for k, v in d.items() if isinstance(v, dict)]
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if k not in sections and v is not None]
    for s in sections:
        lines += ["", f"[{s}]"] + [f"{k} = {_toml_value(v)}" for k, v in d[s].items() if v is not None]
    return "\n".join(lines) + "\n"


def write_file(cfg: TrainConfig, path: str) -> None:
    """Write `cfg` to `path` (format by suffix: .toml, .yaml / .yml, .json); "-" prints TOML."""
    if path == "-":
        sys.stdout.write(config_text(cfg, "toml"))
        return
    suffix = Path(path).suffix.lower()
    fmt = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}.get(suffix)
    if fmt is None:
        raise ValueError(f"--write-config {path}: unknown config file type {suffix!r} (use .toml, .yaml or .json)")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(config_text(cfg, fmt), encoding="utf-8")
