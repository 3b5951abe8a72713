"""Prepared corpora: a one-time conversion of any data source into byte shards that training and evaluation
memory-map (`learntok prepare SOURCE OUT`).

    OUT/manifest.json        format, version, source and options, and per split its shards with their
                             document and byte counts and sha256 checksums
    OUT/train/00000.bin      the documents' UTF-8 bytes back to back (uint8; bytes are the tokens)
    OUT/train/00000.idx      int64 little-endian offsets of the documents in the .bin (n_docs + 1, from 0)
    OUT/val/..., OUT/test/...

A prepare writes into a temporary directory beside OUT and renames it when the manifest is complete, so an
interrupted prepare never leaves something that looks finished; its leftovers are removed by the next prepare.
Opening checks every shard's size against the manifest, and its checksum unless told not to (about 1 s per GB).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from learntok.data.corpus import Corpus
from learntok.data.sources import DataError, split_documents
from learntok.version import __version__

FORMAT = "learntok-prepared"
VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")


def is_prepared(path: str | Path) -> bool:
    """True if `path` is a prepared corpus: a directory whose manifest.json is learntok's (its format tag), or,
    unreadable, sits beside a train/ directory of shards. A data directory that ships some other tool's
    manifest.json is a source to read, never a corpus to refuse or to replace with `prepare --overwrite`."""
    mpath = Path(path) / MANIFEST
    if not mpath.is_file():
        return False
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError):  # a damaged manifest of ours still says prepared, so the error names it
        return (Path(path) / "train").is_dir()
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


class _ShardWriter:
    """Writes one split's documents into shards of about `shard_bytes` bytes each."""

    def __init__(self, root: Path, split: str, shard_bytes: int):
        self.dir, self.split, self.shard_bytes = root / split, split, shard_bytes
        self.dir.mkdir(parents=True)
        self.shards: list[dict] = []
        self.docs = self.bytes = 0
        self._file = None

    def add(self, doc: bytes) -> None:
        if self._file is not None and self._ends[-1] + len(doc) > self.shard_bytes:
            self._close()
        if self._file is None:
            self._name = f"{len(self.shards):05d}"
            self._file = open(self.dir / f"{self._name}.bin", "wb")  # noqa: SIM115 (closed in _close)
            self._hash, self._ends = hashlib.sha256(), [0]
        self._file.write(doc)
        self._hash.update(doc)
        self._ends.append(self._ends[-1] + len(doc))
        self.docs, self.bytes = self.docs + 1, self.bytes + len(doc)

    def _close(self) -> None:
        self._file.close()
        self._file = None
        index = self.dir / f"{self._name}.idx"
        np.asarray(self._ends, dtype="<i8").tofile(index)
        self.shards.append({"data": f"{self.split}/{self._name}.bin", "index": f"{self.split}/{self._name}.idx",
                            "docs": len(self._ends) - 1, "bytes": self._ends[-1], "sha256": self._hash.hexdigest(),
                            "index_sha256": _sha256(index)})

    def abandon(self) -> None:
        """Close an open shard file without finishing it (a prepare that failed)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish(self) -> dict:
        if self._file is not None:
            self._close()
        return {"docs": self.docs, "bytes": self.bytes, "shards": self.shards}


def prepare(cfg, out: str | Path, *, shard_bytes: int = 1 << 30, max_bytes: float = 0, min_doc_bytes: int = 0,
            overwrite: bool = False, progress: bool = True, log: Callable[[str], None] = print) -> Path:
    """Convert the documents of data config `cfg` (its source, val_data, text_field, val_fraction; split as
    `learntok train` splits them, with a directory's test* files as a test split) into a prepared corpus at
    `out`. `max_bytes` > 0 stops the training split after that many bytes; `min_doc_bytes` > 0 leaves out
    shorter documents (e.g. 4096: the only ones the paper's keep-and-truncate rule trains on). Returns `out`."""
    out, cwd = Path(out), Path.cwd()
    if out.resolve() in (cwd, *cwd.parents):  # the final rename would move the current directory
        raise DataError(f"{out}: the current directory or one above it; prepare into a new directory "
                        f"(e.g. {out / 'corpus'})")
    if is_prepared(cfg.source):
        raise DataError(f"{cfg.source}: already a prepared corpus; train on it with --data {cfg.source}")
    if cfg.val_data is not None and is_prepared(cfg.val_data):
        raise DataError(f"--val-data {cfg.val_data}: a prepared corpus; `learntok prepare` reads sources (give the "
                        "source it was prepared from, or train with --val-data pointing at it)")
    if out.exists():
        if not out.is_dir():
            raise DataError(f"{out}: exists and is not a directory; prepare into a new directory")
        prepared = is_prepared(out)  # it reads the manifest: once
        if (not overwrite or not prepared) and any(out.iterdir()):
            raise DataError(f"{out}: exists and is not empty"
                            + (" (replace a prepared corpus with --overwrite)" if prepared else ""))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:  # a file where a parent directory must be
        raise DataError(f"{out}: cannot make its directory ({e.strerror}: {e.filename})") from None
    with _exclusive(out):
        return _prepare(cfg, out, shard_bytes, max_bytes, min_doc_bytes, progress, log)


@contextlib.contextmanager
def _exclusive(out: Path):
    """Hold `.OUT.lock` (flock, released when the process dies); a DataError if another prepare holds it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): run unguarded
        yield
        return
    with open(out.parent / f".{out.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(f"{out}: another learntok prepare is writing it now (it holds {lock.name}); wait for "
                            "that one, or prepare once and let every rank read the result") from None
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _prepare(cfg, out: Path, shard_bytes: int, max_bytes: float, min_doc_bytes: int, progress: bool,
             log: Callable[[str], None]) -> Path:
    for pattern in (f".{out.name}.partial-*", f".{out.name}.replaced-*"):  # an earlier prepare, interrupted
        for stale in out.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    writers: dict[str, _ShardWriter] = {}
    short = dict.fromkeys(SPLITS, 0)
    t0 = time.perf_counter()
    from tqdm.auto import tqdm

    bar = tqdm(unit="B", unit_scale=True, unit_divisor=1000, disable=not progress, desc=f"prepare {out.name}")
    try:
        for split, doc in split_documents(cfg, test=True, max_train_bytes=max_bytes):
            if len(doc) < min_doc_bytes:
                short[split] += 1
                continue
            if split not in writers:
                writers[split] = _ShardWriter(tmp, split, shard_bytes)
            writers[split].add(doc)
            bar.update(len(doc))
        bar.close()
        for split in ("train", "val"):
            if split not in writers:
                raise DataError(f"{cfg.source}: the {split} split is empty (give --val-data, a directory with "
                                "train* and valid* files, or a larger --val-fraction)")
        manifest = {"format": FORMAT, "version": VERSION, "source": cfg.source, "val_data": cfg.val_data,
                    "text_field": cfg.text_field, "encoding": cfg.encoding, "val_fraction": cfg.val_fraction,
                    "max_bytes": max_bytes, "shard_bytes": shard_bytes, "min_doc_bytes": min_doc_bytes,
                    "short_docs_left_out": {s: n for s, n in short.items() if n}, "learntok": __version__,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "splits": {s: w.finish() for s, w in writers.items()}}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        old = out.parent / f".{out.name}.replaced-{os.getpid()}"
        if out.exists():  # two renames, then the slow delete: a kill leaves the old corpus or the new one
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        bar.close()
        for w in writers.values():
            w.abandon()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    seconds = time.perf_counter() - t0
    total = sum(w.bytes for w in writers.values())
    log(f"prepared {out}: " + ", ".join(f"{s} {w.docs:,} docs / {w.bytes / 1e6:,.1f} MB" for s, w in writers.items())
        + f" in {seconds:.1f} s ({total / 1e6 / max(seconds, 1e-9):.1f} MB/s)")
    return out


@dataclass
class Prepared:
    """An opened prepared corpus (the manifest checked); `split(name)` memory-maps one split."""

    root: Path
    manifest: dict = field(repr=False)

    @staticmethod
    def open(path: str | Path) -> Prepared:
        root = Path(path)
        mpath = root / MANIFEST
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"{mpath}: not a readable manifest ({e}); prepare the corpus again") from e
        if not isinstance(manifest, dict) or not isinstance(manifest.get("splits", {}), dict):
            raise DataError(f"{mpath}: not a prepared corpus's manifest (not a JSON object with splits); prepare "
                            "the corpus again")
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise DataError(f"{mpath}: format {manifest.get('format')!r} version {manifest.get('version')!r} is "
                            f"not {FORMAT!r} version {VERSION}; prepare it again with this learntok "
                            f"(learntok prepare {manifest.get('source', 'SOURCE')} {root} --overwrite)")
        if "splits" not in manifest:
            raise DataError(f"{mpath}: the manifest lists no splits; the corpus is damaged: prepare it again")
        return Prepared(root, manifest)

    @property
    def splits(self) -> list[str]:
        return [s for s in SPLITS if s in self.manifest["splits"]]

    def split(self, name: str, verify: bool = True) -> Corpus:
        """The documents of split `name`, memory-mapped; shard sizes (and with `verify` checksums) are
        checked against the manifest first."""
        if name not in self.manifest["splits"]:
            raise DataError(f"{self.root}: no {name} split (it has {', '.join(self.splits)})")
        keys = ("data", "index", "bytes", "docs", "sha256", "index_sha256")
        try:
            entries = self.manifest["splits"][name]["shards"]
            if any(not isinstance(e, dict) or any(k not in e for k in keys) for e in entries):
                raise TypeError("a shard entry lacks a field")
        except (KeyError, TypeError) as e:
            raise DataError(f"{self.root / MANIFEST}: the {name} split's entry is damaged ({e}); prepare the "
                            "corpus again") from e
        shards = []
        for entry in entries:
            data, index = self.root / entry["data"], self.root / entry["index"]
            for path, size in ((data, entry["bytes"]), (index, 8 * (entry["docs"] + 1))):
                actual = path.stat().st_size if path.is_file() else None
                if actual != size:
                    raise DataError(f"{path}: {'missing' if actual is None else f'{actual:,} bytes'}, the manifest "
                                    f"says {size:,}; the corpus is damaged: prepare it again")
            if verify:
                for path, digest in ((data, entry["sha256"]), (index, entry["index_sha256"])):
                    if _sha256(path) != digest:
                        raise DataError(f"{path}: checksum differs from the manifest; the corpus is damaged: "
                                        "prepare it again")
            offsets = np.fromfile(index, dtype="<i8")
            if offsets[0] != 0 or offsets[-1] != entry["bytes"] or (np.diff(offsets) < 0).any():
                raise DataError(f"{index}: document offsets do not describe {data}; prepare the corpus again")
            bytes_ = np.memmap(data, dtype=np.uint8, mode="r") if entry["bytes"] else np.zeros(0, np.uint8)
            shards.append((bytes_, offsets))
        return Corpus(shards, name=f"{self.root} ({name})")
