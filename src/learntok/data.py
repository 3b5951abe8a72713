"""Training data: reading documents, splitting them, packing bytes into sequences, and a resumable batch order.

Documents come from files (.txt/.md/.py whole, .jsonl rows, .parquet rows; optionally .gz/.xz/.zst),
directories, globs, a locally available Hugging Face dataset (`hf:NAME[:SPLIT]`) or, by default, the
running interpreter's standard-library sources (`stdlib`). Every sample is `[BOS] + seq_len` byte ids:
the model reads `ids[:-1]` and predicts `ids[1:]`.
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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from learntok.config import DataConfig
from learntok.vocab import BOS, EOS

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


def _iter_jsonl(path: Path, text_field: str) -> Iterator[tuple[str, bytes]]:
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
                if text_field not in row:
                    raise DataError(f"{where}: no field {text_field!r} (fields: {', '.join(sorted(row))})")
                yield where, _text_bytes(row[text_field], where, text_field)
    except read_errors() as e:
        raise DataError(f"{path}: cannot read or decompress: {e}") from e


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
    pair = None if cfg.data.startswith("hf:") or cfg.data == "stdlib" else find_split_files(cfg.data)
    if pair is not None:
        train = [t for p in pair[0] for t in _docs(str(p), cfg.text_field)]
        if cfg.val_data is not None:
            return train, _docs(cfg.val_data, cfg.text_field)
        return train, [t for p in pair[1] for t in _docs(str(p), cfg.text_field)]
    if cfg.val_data is not None:
        return _docs(cfg.data, cfg.text_field), _docs(cfg.val_data, cfg.text_field)
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise DataError(f"{cfg.data}: val_fraction must be in [0, 1), got {cfg.val_fraction}")
    rule = is_stdlib_val if cfg.data == "stdlib" else (lambda k: is_holdout(k, cfg.val_fraction))
    train, val = [], []
    for key, text in iter_documents(cfg.data, cfg.text_field):
        (val if rule(key) else train).append(text)
    if not val:
        n_move = max(1, int((len(train)) * cfg.val_fraction))
        train, val = train[:-n_move], train[-n_move:]
    if not train:
        raise DataError(f"{cfg.data}: only {len(val)} document(s), too few to hold out validation; "
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


class ByteSequences:
    """Fixed-length byte sequences of a list of documents, stored as uint16 windows of seq_len ids.

    Sample i is an int64 array `[BOS] + window_i` of seq_len + 1 ids. pack=True: the stream doc0, EOS, doc1,
    EOS, ... cut into consecutive non-overlapping windows (the incomplete tail is dropped). pack=False (the
    paper's rule): the first seq_len bytes of every document of at least seq_len bytes; shorter ones are dropped.
    Raises DataError if seq_len < 2 or no sequence can be formed (`name` says which data in the message).
    """

    def __init__(self, docs: Sequence[bytes], seq_len: int, pack: bool = True, name: str = "data",
                 annotate: Callable[[bytes], np.ndarray] | None = None) -> None:
        if seq_len < 2:
            raise DataError(f"{name}: seq_len must be at least 2, got {seq_len}")
        self.seq_len, self.pack, self.name = seq_len, pack, name
        self.n_docs = len(docs)
        if pack:
            stream = np.frombuffer(b"".join(d + b"\0" for d in docs), dtype=np.uint8).astype(np.uint16)
            stream[np.cumsum([len(d) + 1 for d in docs], dtype=np.int64) - 1] = EOS  # the separators
            n = len(stream) // seq_len
            self.windows = stream[: n * seq_len].reshape(n, seq_len)
            why = f"{len(stream):,} ids in {len(docs)} document(s) (with EOS)"
        else:
            heads = b"".join(d[:seq_len] for d in docs if len(d) >= seq_len)
            self.windows = np.frombuffer(heads, dtype=np.uint8).astype(np.uint16).reshape(-1, seq_len)
            why = f"none of its {len(docs)} document(s) has {seq_len} bytes (pack=False keeps only those)"
        if len(self.windows) == 0:
            raise DataError(f"{name}: not enough data for one sequence of seq_len={seq_len}: {why}")
        # Prescribed per-byte boundary flags (e.g. BPE guidance), computed once per document and stored beside
        # the ids: annotate(doc) -> bool array of len(doc). EOS separators are flagged (a token starts there).
        self.flags: np.ndarray | None = None
        if annotate is not None:
            if pack:
                parts = []
                for d in docs:
                    parts += [np.asarray(annotate(d), dtype=np.uint8), np.ones(1, dtype=np.uint8)]
                flags = np.concatenate(parts)
            else:
                kept = [np.asarray(annotate(d), dtype=np.uint8)[:seq_len] for d in docs if len(d) >= seq_len]
                flags = np.concatenate(kept)
            self.flags = flags[: self.windows.size].reshape(self.windows.shape)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.batch([i])[0]

    def batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64 array (len(indices), seq_len + 1) of the given samples, BOS first."""
        idx = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(idx), self.seq_len + 1), dtype=np.int64)
        out[:, 0] = BOS
        out[:, 1:] = self.windows[idx]
        return out


    def flag_batch(self, indices: Sequence[int] | np.ndarray) -> np.ndarray | None:
        """bool array (len(indices), seq_len + 1) of prescribed boundary flags aligned with `batch` (True at
        BOS), or None when the sequences carry no flags."""
        if self.flags is None:
            return None
        idx = np.asarray(indices, dtype=np.int64)
        out = np.ones((len(idx), self.seq_len + 1), dtype=bool)
        out[:, 1:] = self.flags[idx].astype(bool)
        return out


class BatchIterator:
    """Deterministic, resumable batches of a ByteSequences, sharded across ranks.

    Epoch e visits the permutation `default_rng([seed, e]).permutation(len(seqs))`; each step takes the next
    global batch of batch_size * world_size consecutive permuted indices and rank r keeps rows
    [r * batch_size, (r + 1) * batch_size) of it, so one process with batch 2b sees exactly what two processes
    with batch b see together. When fewer indices than a global batch are left, the next epoch starts (the tail
    is skipped). If the data holds fewer sequences than one global batch, every step is one epoch whose
    permutation is repeated cyclically to fill the batch (sampling with replacement). The state counts global
    batches, so a run may resume with another world_size as long as the global batch is unchanged.
    """

    def __init__(self, seqs: ByteSequences, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if len(seqs) == 0:
            raise DataError(f"{getattr(seqs, 'name', 'data')}: no sequences to iterate over")
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad batching: batch_size={batch_size}, rank={rank}, world_size={world_size}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.seqs, self.batch_size, self.rank, self.world_size = seqs, batch_size, rank, world_size
        self.seed, self.epoch, self.position = seed, 0, 0
        self._perm: tuple[int, np.ndarray] | None = None

    def _permutation(self) -> np.ndarray:
        if self._perm is None or self._perm[0] != self.epoch:
            self._perm = (self.epoch, np.random.default_rng([self.seed, self.epoch]).permutation(len(self.seqs)))
        return self._perm[1]

    def next_indices(self) -> np.ndarray:
        """The sequence indices of this rank's next batch (advances the state)."""
        n, g = len(self.seqs), self.batch_size * self.world_size
        if self.position > 0 and self.position + g > n:
            self.epoch, self.position = self.epoch + 1, 0
        perm = self._permutation()
        if g <= n:
            idx = perm[self.position:self.position + g]
            self.position += g
        else:
            idx = perm[np.arange(g) % n]
            self.position = n
        return idx[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def next_batch(self) -> torch.Tensor:
        """LongTensor (batch_size, seq_len + 1): BOS then seq_len bytes per row."""
        return torch.from_numpy(self.seqs.batch(self.next_indices()))

    def next_with_flags(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(ids, flags): ids as `next_batch`, flags the matching prescribed boundaries (or None)."""
        idx = self.next_indices()
        flags = self.seqs.flag_batch(idx)
        return torch.from_numpy(self.seqs.batch(idx)), None if flags is None else torch.from_numpy(flags)

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """JSON-ready position in the batch order."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Continue exactly where the iterator that produced `d` left off (same data required)."""
        epoch, position, seed = int(d["epoch"]), int(d["position"]), int(d["seed"])
        if epoch < 0 or seed < 0 or not 0 <= position <= len(self.seqs):
            raise ValueError(f"data iterator state {d} does not fit {len(self.seqs)} sequences (data changed?)")
        self.epoch, self.position, self.seed = epoch, position, seed
        self._perm = None


def val_batches(seqs: ByteSequences, batch_size: int, max_bytes: int) -> list[torch.Tensor]:
    """The first max(1, max_bytes // seq_len) validation sequences, in order, as LongTensor batches."""
    return [ids for ids, _ in val_batches_with_flags(seqs, batch_size, max_bytes)]


def val_batches_with_flags(seqs: ByteSequences, batch_size: int,
                           max_bytes: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """As `val_batches`, each batch paired with its prescribed boundary flags (or None)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    n = min(len(seqs), max(1, max_bytes // seqs.seq_len))
    out = []
    for i in range(0, n, batch_size):
        idx = np.arange(i, min(i + batch_size, n))
        flags = seqs.flag_batch(idx)
        out.append((torch.from_numpy(seqs.batch(idx)), None if flags is None else torch.from_numpy(flags)))
    return out
