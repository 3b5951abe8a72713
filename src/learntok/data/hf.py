"""Hugging Face datasets as a source (`hf:NAME[:CONFIG][:SPLIT]`): a local `save_to_disk` directory or a hub id,
read row by row by `learntok prepare` and `train` (iter_hf) and streamed by `--stream` (data/stream.py); both
open the dataset through open_hf."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from learntok.data.base import DataError, _text_bytes


def parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    """`hf:NAME`, `hf:NAME:SPLIT` or `hf:NAME:CONFIG:SPLIT` -> (name, config or None, split; default train)."""
    parts = spec[3:].split(":")
    if not parts[0] or len(parts) > 3 or not all(parts):
        raise DataError(f"{spec}: expected hf:NAME, hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")
    name, config, split = parts[0], parts[1] if len(parts) == 3 else None, parts[-1] if len(parts) > 1 else "train"
    return name, config, split


def saved_split(ds, spec: str, split: str):
    """The split a `save_to_disk` dataset gives `spec`: a DatasetDict's named one; a single Dataset itself, unless
    the spec names a split that dataset is not (it would read, say, training rows as validation)."""
    import datasets

    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{spec}: no split {split!r} (it has {', '.join(ds)})")
        return ds[split]
    own = None if getattr(ds, "split", None) is None else str(ds.split)
    if len(spec[3:].split(":")) > 1 and split != (own or "train"):
        raise DataError(f"{spec}: the saved dataset has no splits ({'it is ' + repr(own) if own else 'one table'}); "
                        f"name it without :{split}")
    return ds


def open_hf(spec: str, *, whole: bool) -> Any:
    """The split of a Hugging Face dataset that `spec` names: a local `save_to_disk` directory, else the hub
    streamed, else the copy in the datasets cache (which `datasets` never streams from: huggingface/datasets#6327).
    whole: whether that cache load may download the whole dataset (prepare reads every row anyway); without it the
    cache is tried offline only (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), where it cannot download."""
    name, config, split = parse_hf_spec(spec)
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"{spec}: hf: data needs the datasets package (pip install 'learntok[hf]')") from e
    local = Path(name)
    try:
        if local.is_dir() and any((local / f).exists() for f in ("dataset_dict.json", "state.json")):
            return saved_split(datasets.load_from_disk(str(local)), spec, split)
        return datasets.load_dataset(name, config, split=split, streaming=True)
    except DataError:
        raise
    except Exception as e:  # the library raises many types (network, missing cache, bad split)
        error = e
    offline = any(getattr(datasets.config, k, False) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    if whole or offline:
        try:
            return datasets.load_dataset(name, config, split=split)
        except Exception as e:
            error = e
    msg = str(error).splitlines()[0] if str(error) else type(error).__name__
    where = f" ({'offline' if offline else 'not streamed'}, and not in the datasets cache either)" \
        if whole or offline else ""
    raise DataError(f"{spec}: cannot {'load' if whole else 'stream'} Hugging Face dataset {name!r} split {split!r}"
                    f"{where}: {msg}") from error


def iter_hf(spec: str, text_field: str) -> Iterator[tuple[str, bytes]]:
    """Rows of a Hugging Face dataset, one at a time (never the whole column at once)."""
    ds = open_hf(spec, whole=True)
    import datasets  # open_hf has checked it is installed

    rows = (r for batch in ds.iter(batch_size=1024) for r in _rows(batch)) if isinstance(ds, datasets.Dataset) \
        else iter(ds)
    name = parse_hf_spec(spec)[0]
    for i, row in enumerate(rows):
        if text_field not in row:
            raise DataError(f"{spec}: no column {text_field!r} (columns: {', '.join(row)})")
        yield f"hf:{name}:{i}", _text_bytes(row[text_field], f"hf:{name}:{i}", text_field)


def _rows(batch: dict[str, list]) -> Iterator[dict]:
    """The rows of a column-wise batch."""
    keys = list(batch)
    return (dict(zip(keys, values)) for values in zip(*(batch[k] for k in keys)))
