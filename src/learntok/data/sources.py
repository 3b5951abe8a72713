"""Documents: reading them from files, directories, globs, a local Hugging Face dataset (`hf:NAME[:SPLIT]`)
or the running interpreter's standard-library sources (`stdlib`), and the rules that split them into train /
validation (/ test): `split_documents`.

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

from learntok.data.base import DataError, _text_bytes
from learntok.data.hf import iter_hf

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
    row, batches = 0, pf.iter_batches(columns=[text_field])
    while True:
        try:  # a file damaged past its footer fails here, row group by row group
            batch = next(batches, None)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{path}: damaged: {e}") from e
        if batch is None:
            return
        for value in batch.column(0).to_pylist():
            yield f"{path}:{row}", _text_bytes(value, f"{path}:{row}", text_field)
            row += 1


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
    """Supported files under a directory, recursively, skipping hidden entries and following symlinked
    directories (each real directory once: a link loop ends); sorted."""
    out, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
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


def _decoded(data: bytes, path: Path, encoding: str) -> bytes | None:
    """A whole file's bytes as a document under `encoding` (DataConfig.encoding), or None if it is binary."""
    if encoding == "bytes":
        return data
    if encoding.replace("-", "").replace("_", "").lower() == "utf8":
        return None if is_binary(data) else data
    try:
        return data.decode(encoding).encode("utf-8")
    except LookupError:
        raise DataError(f"--encoding {encoding}: unknown encoding (use utf-8, bytes or a Python codec name)") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid {encoding} ({e.reason} at byte {e.start})") from None


def _iter_files(spec: str, files: Sequence[Path], text_field: str, keys: Sequence[str] | None = None,
                encoding: str = "utf-8", root: Path | None = None) -> Iterator[tuple[str, bytes]]:
    """Documents of files; whole-file documents that are binary (under `encoding`) are skipped (error if nothing
    is left). Keys name each file by its path relative to `root` when given (see `key_root`)."""
    n_docs, binary = 0, []
    for i, path in enumerate(files):
        name = _relative(path, root)
        kind = _split_suffix(path)[0]
        if kind == ".jsonl":
            docs: Iterable[tuple[str, bytes]] = _iter_jsonl(path, text_field)
        elif kind == ".parquet":
            docs = _iter_parquet(path, text_field)
        else:
            data = _read_all(path)
            text = _decoded(data, path, encoding) if data else data
            if text is None:
                binary.append(path)
                continue
            docs = [(keys[i] if keys is not None else str(path), text)]
        for key, text in docs:
            if text:
                n_docs += 1
                yield (key if keys is not None else name + key[len(str(path)):]), text
    if n_docs == 0:
        if binary:
            raise DataError(f"{spec}: no text documents; {len(binary)} file(s) are binary (not UTF-8 or NUL-heavy), "
                            f"e.g. {binary[0]} (train on them anyway with --encoding bytes, or give their codec, "
                            "e.g. --encoding latin-1)")
        raise DataError(f"{spec}: no documents (all files are empty)")
    if binary:
        warnings.warn(f"{spec}: skipped {len(binary)} binary file(s) (not UTF-8 or NUL-heavy), e.g. {binary[0]} "
                      "(--encoding bytes or --encoding CODEC reads them)",
                      stacklevel=3)


def iter_documents(spec: str, text_field: str = "text", encoding: str = "utf-8") -> Iterator[tuple[str, bytes]]:
    """(key, UTF-8 bytes) of every non-empty document of `spec`, in a deterministic order.

    `spec` is a file, a directory (all supported files, recursively, sorted), a glob (sorted), `hf:NAME[:SPLIT]`
    or `stdlib`. Keys: the path relative to `key_root(spec)` for whole-file documents, `path:LINE` (1-based) for
    .jsonl rows, `path:ROW` (0-based) for .parquet rows, `hf:NAME:IDX` for Hugging Face rows and the path
    relative to the standard-library directory for `stdlib`. Raises DataError for missing, unsupported, malformed
    or empty data.
    """
    if spec == "stdlib":
        pairs = stdlib_files()
        if not pairs:
            raise DataError(f"stdlib: no .py files under {stdlib_dir()}")
        yield from _iter_files(f"stdlib ({stdlib_dir()})", [p for _, p in pairs], text_field, [k for k, _ in pairs])
    elif spec.startswith("hf:"):
        n = 0
        for key, text in iter_hf(spec, text_field):
            if text:
                n += 1
                yield key, text
        if n == 0:
            raise DataError(f"{spec}: no documents (all rows are empty)")
    else:
        yield from _iter_files(spec, resolve_files(spec), text_field, encoding=encoding, root=key_root(spec))


def key_root(spec: str) -> Path:
    """The directory a file/directory/glob spec's document keys are relative to: the file's directory, the
    directory, or a glob's leading part without wildcards. So the hash hold-out does not depend on how the path
    is spelled (relative, absolute, another mount): the same corpus gives the same split anywhere."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path.parent
    if path.is_dir():
        return path
    parts = []
    for part in path.parts:
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _relative(path: Path, root: Path | None) -> str:
    if root is None:
        return str(path)
    try:
        return os.path.relpath(path, root).replace(os.sep, "/")
    except ValueError:  # another drive (Windows)
        return str(path)


def is_stdlib_val(relpath: str) -> bool:
    """The fixed `stdlib` split: sha256("stdlib:" + relpath) % 100 < 5 is validation."""
    return int(hashlib.sha256(("stdlib:" + relpath).encode()).hexdigest(), 16) % 100 < STDLIB_VAL_PERCENT


def is_holdout(key: str, val_fraction: float) -> bool:
    """Hash hold-out of a document key: sha256(key) % 10000 < val_fraction * 10000 is validation."""
    return int(hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest(), 16) % 10000 < val_fraction * 10000


def find_split_files(directory: str | Path) -> dict[str, list[Path]] | None:
    """{"train": [...], "val": [...], "test": [...]} entries of a directory holding `train*` and
    `valid*`/`validation*`/`val*`/`dev*` files or subdirectories (top level only; `test*` is optional, everything
    else is ignored), or None if it has not both train and validation entries."""
    root = Path(directory)
    if not root.is_dir():
        return None
    found: dict[str, list[Path]] = {"train": [], "val": [], "test": []}
    for p in sorted(root.iterdir(), key=lambda p: p.name):
        if p.name.startswith(".") or not (p.is_dir() or (p.is_file() and _supported(p))):
            continue
        if p.name.lower().startswith("train"):
            found["train"].append(p)
        elif _VAL_NAME.match(p.name):
            found["val"].append(p)
        elif p.name.lower().startswith("test"):
            found["test"].append(p)
    return found if found["train"] and found["val"] else None


def hf_split_specs(spec: str) -> dict[str, list[str]] | None:
    """The splits of `hf:DIR` when DIR is a `save_to_disk` DatasetDict with a train split and a validation one
    (`validation`, `valid`, `val` or `dev`; `test*` optional) and the spec names no split: {"train": [hf:DIR:train],
    "val": [...], "test": [...]}, as find_split_files gives for a directory. None otherwise (a hash hold-out)."""
    parts = spec[3:].split(":")
    meta = Path(parts[0]) / "dataset_dict.json"
    if len(parts) != 1 or not meta.is_file():
        return None
    try:
        names = list(json.loads(meta.read_text()).get("splits", []))
    except (ValueError, AttributeError):
        return None
    val = [n for n in names if _VAL_NAME.match(n)]
    if "train" not in names or not val:
        return None
    return {"train": [f"hf:{parts[0]}:train"], "val": [f"hf:{parts[0]}:{val[0]}"],
            "test": [f"hf:{parts[0]}:{n}" for n in names if n.lower().startswith("test")]}


def split_entries(spec: str, paths: Sequence[str | Path], text_field: str = "text",
                  encoding: str = "utf-8") -> Iterator[tuple[str, bytes]]:
    """The documents of one split's entries (find_split_files' paths, or hf_split_specs' specs) read as one
    source: an empty or binary file among them is skipped, not an error."""
    if paths and all(isinstance(p, Path) for p in paths):
        files = [f for p in paths for f in resolve_files(str(p))]
        yield from _iter_files(f"{spec} ({', '.join(p.name for p in paths)})", files, text_field, encoding=encoding)
    else:
        for p in paths:
            yield from iter_documents(str(p), text_field, encoding)


def split_documents(cfg: DataConfig, test: bool = False, max_train_bytes: float = 0,
                    with_val_data: bool = True) -> Iterator[tuple[str, bytes]]:
    """(split, document) for every document of a data config's source, split by these rules in order of
    precedence: a directory with `train*` and `valid*` entries (find_split_files), or an `hf:DIR` DatasetDict with
    train and validation splits (hf_split_specs), gives its splits (validation
    from `val_data` instead if given; with `test`, also its test* entries); `val_data` if given (then all of the
    source trains); for `stdlib` the fixed rule of is_stdlib_val (5% of files); otherwise a hold-out by hash of
    the document key (is_holdout with `val_fraction`). Streams: nothing is held. With `max_train_bytes`, the
    training documents end once that many bytes have been given (a hash hold-out then ends altogether).
    `with_val_data=False` leaves `val_data`'s documents out: the caller reads them (learntok.data.splits, which
    also takes a prepared corpus there)."""
    spec, field, enc = cfg.source, cfg.text_field, cfg.encoding
    budget = [max_train_bytes or float("inf")]

    def train_docs(paths: Sequence[str | Path]) -> Iterator[tuple[str, bytes]]:
        for _, text in split_entries(spec, paths, field, enc):
            if budget[0] <= 0:
                return
            budget[0] -= len(text)
            yield "train", text

    found = hf_split_specs(spec) if spec.startswith("hf:") else None if spec == "stdlib" else find_split_files(spec)
    if found is not None:
        yield from train_docs(found["train"])
        vals = found["val"] if cfg.val_data is None else [cfg.val_data] if with_val_data else []
        for split, paths in [("val", vals)] + \
                ([("test", found["test"])] if test else []):
            yield from ((split, text) for _, text in split_entries(spec, paths, field, enc))
        return
    if cfg.val_data is not None:
        yield from train_docs([spec])
        if with_val_data:
            yield from (("val", text) for _, text in iter_documents(cfg.val_data, field, enc))
        return
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise DataError(f"{spec}: val_fraction must be in [0, 1), got {cfg.val_fraction}")
    rule = is_stdlib_val if spec == "stdlib" else (lambda k: is_holdout(k, cfg.val_fraction))
    for key, text in iter_documents(spec, field, enc):
        if rule(key):
            yield "val", text
        elif budget[0] <= 0:
            return
        else:
            budget[0] -= len(text)
            yield "train", text
