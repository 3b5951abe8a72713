"""Documents: reading them from files, directories, globs, a local Hugging Face dataset (`hf:NAME[:SPLIT]`)
or the running interpreter's standard-library sources (`stdlib`), and splitting them into train / validation.

Files: .txt/.md/.py (one document each), .jsonl and .parquet (one document per row); each optionally .gz, .xz
or .zst. Bad input raises `DataError` with a one-line message naming the file (and line).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import sys
import sysconfig
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from learntok.config import DataConfig

WHOLE_FILE_SUFFIXES = (".txt", ".md", ".py")
"""Files read as one document each."""
ROW_SUFFIXES = (".jsonl", ".parquet")
"""Files holding one document per row (the `text_field` value)."""
COMPRESSION_SUFFIXES = (".gz", ".xz", ".zst")
"""Transparent decompression: gzip, lzma/xz, zstandard."""
STDLIB_EXCLUDE = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
                            "encodings", "pydoc_data"})
"""Path components that keep a standard-library file out of the `stdlib` corpus."""
STDLIB_VAL_PERCENT = 5
"""Percent of `stdlib` files (by hash of their relative path) held out for validation."""
_KINDS = "/".join(WHOLE_FILE_SUFFIXES + ROW_SUFFIXES) + ", optionally " + "/".join(COMPRESSION_SUFFIXES)
_VAL_NAME = re.compile(r"^(validation|valid|val|dev)(?![a-z])", re.IGNORECASE)


class DataError(ValueError):
    """Bad input data or data settings; the message names the problem and the path."""


def _split_suffix(path: Path) -> tuple[str, str]:
    """(format suffix, compression suffix) of a file name, e.g. ('.jsonl', '.xz'); lower-case."""
    name = path.name.lower()
    comp = next((c for c in COMPRESSION_SUFFIXES if name.endswith(c)), "")
    stem = name[: len(name) - len(comp)]
    return os.path.splitext(stem)[1], comp


def _supported(path: Path) -> bool:
    return _split_suffix(path)[0] in WHOLE_FILE_SUFFIXES + ROW_SUFFIXES


def open_decompressed(path: Path) -> IO[bytes]:
    """A binary reader of the decompressed content."""
    comp = _split_suffix(path)[1]
    if comp == ".gz":
        return gzip.open(path, "rb")
    if comp == ".xz":
        return lzma.open(path, "rb")
    if comp == ".zst":
        try:
            import zstandard
        except ImportError as e:
            raise DataError(f"{path}: reading .zst needs the zstandard package (pip install zstandard)") from e
        raw = open(path, "rb")  # noqa: SIM115 (closed by the returned reader)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
        return io.BufferedReader(reader)  # type: ignore[arg-type]
    return open(path, "rb")


def read_errors() -> tuple[type[BaseException], ...]:
    """Exceptions of reading or decompressing a file (zstandard's only once it has been imported)."""
    zstd = sys.modules.get("zstandard")
    return (OSError, EOFError, lzma.LZMAError, zlib.error) + ((zstd.ZstdError,) if zstd is not None else ())


def _read_all(path: Path) -> bytes:
    try:
        with open_decompressed(path) as f:
            return f.read()
    except read_errors() as e:
        raise DataError(f"{path}: cannot read or decompress: {e}") from e


def is_binary(data: bytes) -> bool:
    """True for content that is not text: invalid UTF-8, or more than 1% NUL bytes."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return data.count(b"\x00") > len(data) // 100


def _text_bytes(value: Any, where: str, text_field: str) -> bytes:
    """UTF-8 of a row's text value; None counts as empty, any other non-string is an error."""
    if value is None:
        return b""
    if not isinstance(value, str):
        raise DataError(f"{where}: field {text_field!r} is {type(value).__name__}, not a string")
    return value.encode("utf-8", errors="replace")  # lone surrogates from JSON escapes become '?'


def read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    """(`path:LINE`, row) of every non-blank line of a (possibly compressed) JSONL file; DataError naming the
    file and line for a line that is not a JSON object, or a file that cannot be read."""
    try:
        with open_decompressed(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    row = json.loads(line)
                except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
                    raise DataError(f"{where}: line is not valid JSON ({e})") from e
                if not isinstance(row, dict):
                    raise DataError(f"{where}: line is a JSON {type(row).__name__}, not an object")
                yield where, row
    except read_errors() as e:
        raise DataError(f"{path}: cannot read or decompress: {e}") from e


def _iter_jsonl(path: Path, text_field: str) -> Iterator[tuple[str, bytes]]:
    for where, row in read_jsonl(path):
        if text_field not in row:
            raise DataError(f"{where}: no field {text_field!r} (fields: {', '.join(sorted(row))})")
        yield where, _text_bytes(row[text_field], where, text_field)


def _iter_parquet(path: Path, text_field: str) -> Iterator[tuple[str, bytes]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataError(f"{path}: reading .parquet needs pyarrow (pip install 'learntok[parquet]')") from e
    source: Any = pa.BufferReader(_read_all(path)) if _split_suffix(path)[1] else str(path)
    try:
        pf = pq.ParquetFile(source)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable parquet file: {e}") from e
    names = pf.schema_arrow.names
    if text_field not in names:
        raise DataError(f"{path}: no column {text_field!r} (columns: {', '.join(names)})")
    row = 0
    for batch in pf.iter_batches(columns=[text_field]):
        for value in batch.column(0).to_pylist():
            yield f"{path}:{row}", _text_bytes(value, f"{path}:{row}", text_field)
            row += 1


def _iter_hf(spec: str, text_field: str) -> Iterator[tuple[str, bytes]]:
    """Rows of `hf:NAME` (split 'train') or `hf:NAME:SPLIT`; NAME may be a hub id (cached) or a local directory."""
    name, sep, split = spec[3:].rpartition(":")
    name, split = (name, split or "train") if sep else (split, "train")
    if not name:
        raise DataError(f"{spec}: expected hf:NAME or hf:NAME:SPLIT")
    try:
        import datasets
    except ImportError as e:
        raise DataError(f"{spec}: hf: data needs the datasets package (pip install 'learntok[hf]')") from e
    try:
        local = Path(name)
        if local.is_dir() and any((local / f).exists() for f in ("dataset_dict.json", "state.json")):
            ds: Any = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split]
        else:
            ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # the library raises many types (network, missing cache, bad split)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{spec}: cannot load Hugging Face dataset {name!r} split {split!r} "
                        f"(offline it must be cached or a local directory; HF_DATASETS_OFFLINE=1 skips the network): "
                        f"{msg}") from e
    if text_field not in ds.column_names:
        raise DataError(f"{spec}: no column {text_field!r} (columns: {', '.join(ds.column_names)})")
    for i, value in enumerate(ds[text_field]):
        yield f"hf:{name}:{i}", _text_bytes(value, f"hf:{name}:{i}", text_field)


def stdlib_dir() -> Path:
    """The standard-library directory of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative posix path, path) of every `stdlib` corpus file, sorted by relative path."""
    root = stdlib_dir()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDE]
        out += [((Path(dirpath) / f).relative_to(root).as_posix(), Path(dirpath) / f)
                for f in filenames if f.endswith(".py")]
    return sorted(out)


def _walk(root: Path) -> list[Path]:
    """Supported files under a directory, recursively, skipping hidden entries; sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out += [Path(dirpath) / f for f in filenames if not f.startswith(".") and _supported(Path(f))]
    return sorted(out, key=lambda p: p.as_posix())


def resolve_files(spec: str) -> list[Path]:
    """The files a file/directory/glob spec names, sorted; errors for nothing found or unsupported files."""
    path = Path(spec).expanduser()
    if path.is_file():
        if not _supported(path):
            raise DataError(f"{spec}: unsupported file type (use {_KINDS})")
        return [path]
    if path.is_dir():
        files = _walk(path)
        if not files:
            raise DataError(f"{spec}: directory has no supported files ({_KINDS})")
        return files
    if any(c in spec for c in "*?["):
        matches = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
        if not matches:
            raise DataError(f"{spec}: glob matches nothing")
        files = []
        for m in matches:
            p = Path(m)
            files += _walk(p) if p.is_dir() else [p] if _supported(p) else []
        if not files:
            raise DataError(f"{spec}: glob matches no supported files ({_KINDS})")
        return sorted(set(files), key=lambda p: p.as_posix())
    raise DataError(f"{spec}: no such file or directory")


def _iter_files(spec: str, files: Sequence[Path], text_field: str,
                keys: Sequence[str] | None = None) -> Iterator[tuple[str, bytes]]:
    """Documents of files; whole-file documents that are binary are skipped (error if nothing is left)."""
    n_docs, binary = 0, []
    for i, path in enumerate(files):
        kind = _split_suffix(path)[0]
        if kind == ".jsonl":
            docs: Iterable[tuple[str, bytes]] = _iter_jsonl(path, text_field)
        elif kind == ".parquet":
            docs = _iter_parquet(path, text_field)
        else:
            data = _read_all(path)
            if data and is_binary(data):
                binary.append(path)
                continue
            docs = [(keys[i] if keys is not None else str(path), data)]
        for key, text in docs:
            if text:
                n_docs += 1
                yield key, text
    if n_docs == 0:
        if binary:
            raise DataError(f"{spec}: no text documents; {len(binary)} file(s) are binary (not UTF-8 or NUL-heavy), "
                            f"e.g. {binary[0]}")
        raise DataError(f"{spec}: no documents (all files are empty)")
    if binary:
        warnings.warn(f"{spec}: skipped {len(binary)} binary file(s) (not UTF-8 or NUL-heavy), e.g. {binary[0]}",
                      stacklevel=3)


def iter_documents(spec: str, text_field: str = "text") -> Iterator[tuple[str, bytes]]:
    """(key, UTF-8 bytes) of every non-empty document of `spec`, in a deterministic order.

    `spec` is a file, a directory (all supported files, recursively, sorted), a glob (sorted), `hf:NAME[:SPLIT]`
    or `stdlib`. Keys: the path for whole-file documents, `path:LINE` (1-based) for .jsonl rows, `path:ROW`
    (0-based) for .parquet rows, `hf:NAME:IDX` for Hugging Face rows and the path relative to the
    standard-library directory for `stdlib`. Raises DataError for missing, unsupported, malformed or empty data.
    """
    if spec == "stdlib":
        pairs = stdlib_files()
        if not pairs:
            raise DataError(f"stdlib: no .py files under {stdlib_dir()}")
        yield from _iter_files(f"stdlib ({stdlib_dir()})", [p for _, p in pairs], text_field, [k for k, _ in pairs])
    elif spec.startswith("hf:"):
        n = 0
        for key, text in _iter_hf(spec, text_field):
            if text:
                n += 1
                yield key, text
        if n == 0:
            raise DataError(f"{spec}: no documents (all rows are empty)")
    else:
        yield from _iter_files(spec, resolve_files(spec), text_field)


def is_stdlib_val(relpath: str) -> bool:
    """The fixed `stdlib` split: sha256("stdlib:" + relpath) % 100 < 5 is validation."""
    return int(hashlib.sha256(("stdlib:" + relpath).encode()).hexdigest(), 16) % 100 < STDLIB_VAL_PERCENT


def is_holdout(key: str, val_fraction: float) -> bool:
    """Hash hold-out of a document key: sha256(key) % 10000 < val_fraction * 10000 is validation."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 10000 < val_fraction * 10000


def find_split_files(directory: str | Path) -> tuple[list[Path], list[Path]] | None:
    """(train entries, validation entries) of a directory holding `train*` and `valid*`/`validation*`/`val*`/`dev*`
    files or subdirectories (top level only; `test*` and everything else is ignored), or None if it has not both."""
    root = Path(directory)
    if not root.is_dir():
        return None
    train, val = [], []
    for p in sorted(root.iterdir(), key=lambda p: p.name):
        if p.name.startswith(".") or not (p.is_dir() or (p.is_file() and _supported(p))):
            continue
        if p.name.lower().startswith("train"):
            train.append(p)
        elif _VAL_NAME.match(p.name):
            val.append(p)
    return (train, val) if train and val else None


def _docs(spec: str, text_field: str) -> list[bytes]:
    return [text for _, text in iter_documents(spec, text_field)]


def load_splits(cfg: DataConfig) -> tuple[list[bytes], list[bytes]]:
    """(train documents, validation documents) of a data config.

    In order of precedence: a `data` directory with `train*` and `valid*` entries (see find_split_files) trains
    on its train files and validates on its valid files (or on `val_data` if given); `val_data` if given (then
    all of `data` trains); for `stdlib` the fixed rule of is_stdlib_val (5% of files); otherwise a hold-out by
    hash of the document key (is_holdout with `val_fraction`). If the hold-out is empty, the last document(s)
    are moved to validation; an error is raised if training would then be empty.
    """
    pair = None if cfg.source.startswith("hf:") or cfg.source == "stdlib" else find_split_files(cfg.source)
    if pair is not None:
        train = [t for p in pair[0] for t in _docs(str(p), cfg.text_field)]
        if cfg.val_data is not None:
            return train, _docs(cfg.val_data, cfg.text_field)
        return train, [t for p in pair[1] for t in _docs(str(p), cfg.text_field)]
    if cfg.val_data is not None:
        return _docs(cfg.source, cfg.text_field), _docs(cfg.val_data, cfg.text_field)
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise DataError(f"{cfg.source}: val_fraction must be in [0, 1), got {cfg.val_fraction}")
    rule = is_stdlib_val if cfg.source == "stdlib" else (lambda k: is_holdout(k, cfg.val_fraction))
    train, val = [], []
    for key, text in iter_documents(cfg.source, cfg.text_field):
        (val if rule(key) else train).append(text)
    if not val:
        n_move = max(1, int((len(train)) * cfg.val_fraction))
        train, val = train[:-n_move], train[-n_move:]
    if not train:
        raise DataError(f"{cfg.source}: only {len(val)} document(s), too few to hold out validation; "
                        "give more data or a separate --val-data")
    return train, val


def describe(train_docs: Sequence[bytes], val_docs: Sequence[bytes]) -> str:
    """One log line: document counts and byte totals of both splits."""
    def part(name: str, docs: Sequence[bytes]) -> str:
        return f"{name} {len(docs):,} docs / {_human(sum(len(d) for d in docs))}"
    return f"data: {part('train', train_docs)}, {part('val', val_docs)}"


def _human(n: int) -> str:
    k = min(4, max(0, (len(str(n)) - 1) // 3))
    return f"{n} B" if k == 0 else f"{n / 1000 ** k:.1f} {'KMGT'[k - 1]}B"
