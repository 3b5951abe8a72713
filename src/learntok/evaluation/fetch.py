"""`learntok eval-data fetch`: the four evaluation tasks from the Hugging Face Hub, in the files `learntok eval`
reads (evaluation/tasks.py), with checksums.

Each task is downloaded with `datasets` (pip install 'learntok[hf]') and converted to the OLMES "rank
classification" rows of the paper's evaluation (Appendix D), the same formatting as OLMo's evaluation suite:

    piqa       baber/piqa, validation              {"query": "Goal: GOAL\nAnswer:", "choices": [sol1, sol2], "gold"}
    hellaswag  Rowan/hellaswag, validation         {"query": "ACTIVITY: CTX_A Ctx_b", "choices": endings, "gold"}
               (with HellaSwag's [title] / [step] markup removed, as OLMES does)
    arc_easy   allenai/ai2_arc ARC-Easy, test      {"query": "Question: Q\nAnswer:", "choices": texts, "gold"}
    lambada    EleutherAI/lambada_openai, test     {"context": text before the last space, "continuation": the rest}

Files are written atomically into the cache directory (tasks.eval_cache_dir: $LEARNTOK_EVAL_DIR, else
$XDG_CACHE_HOME/learntok/eval or ~/.cache/learntok/eval), which `learntok eval` then reads by default, and
checksums.json records each file's SHA-256, row count and source; `learntok eval-data verify` re-checks them.
REFERENCE_SHA256 holds the checksums of the conversion of the task data this project's results used; a
differing download is kept but reported (the upstream data may have changed).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from learntok import atomic
from learntok.evaluation.tasks import TASKS

SOURCES: dict[str, tuple[str, str | None, str]] = {
    "piqa": ("baber/piqa", None, "validation"),
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test"),
    "lambada": ("EleutherAI/lambada_openai", "default", "test"),
}
"""Task -> (Hub dataset, config, split)."""

REFERENCE_SHA256 = {
    "piqa": "6ff4c8d663c6c3b9e618e061862ab090fde47a0f983fd03d8ce827e38a76e1d4",
    "hellaswag": "72a41aeb8dfa0b5305bd68391b4c541774afce0823832e84204b9a774fe0cf6f",
    "arc_easy": "8aea15fbb3aa6b71b0458cc6cd6c271300f73d1314710a1576c4d9088491edb6",
    "lambada": "f9e4fa1646580000b89c1b37c19d5b4ff32700ea27798f24a45cccc3006bbfd0",
}
"""SHA-256 of each file as `write_task` writes it from the raw rows of the task data docs/results.md used (OLMo's
evaluation copies of the same datasets); converting those rows reproduces their OLMES query / choices / gold
exactly, row for row."""

CHECKSUMS = "checksums.json"


def _hellaswag_text(text: str) -> str:
    """OLMES's HellaSwag preprocessing: WikiHow's [title] becomes a sentence end (lm-eval's rule, without doubling
    a full stop already there), other [markup] goes, double spaces become one."""
    text = re.sub(r"\.? \[title\]", ". ", text.strip())
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _gold(value, n: int, where: str) -> int:
    gold = int(value)
    if not 0 <= gold < n:
        raise ValueError(f"{where}: label {value!r} is not an index into {n} choices")
    return gold


def convert_row(task: str, row: dict, where: str = "row") -> dict:
    """One source row -> the row `learntok eval` reads (see the module docstring)."""
    try:
        if task == "piqa":
            choices = [row["sol1"], row["sol2"]]
            return {"query": f"Goal: {row['goal']}\nAnswer:", "choices": choices,
                    "gold": _gold(row["label"], 2, where)}
        if task == "hellaswag":
            ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
            choices = [_hellaswag_text(e) for e in row["endings"]]
            return {"query": _hellaswag_text(row["activity_label"] + ": " + ctx), "choices": choices,
                    "gold": _gold(row["label"], len(choices), where)}
        if task == "arc_easy":
            labels, texts = row["choices"]["label"], row["choices"]["text"]
            if row["answerKey"] not in labels:
                raise ValueError(f"{where}: answerKey {row['answerKey']!r} is not among the labels {labels}")
            return {"query": f"Question: {row['question']}\nAnswer:", "choices": list(texts),
                    "gold": labels.index(row["answerKey"])}
        if task == "lambada":
            text = row["text"].strip()
            cut = text.rfind(" ")
            if cut <= 0:
                raise ValueError(f"{where}: no space to split off the final word")
            return {"context": text[:cut], "continuation": text[cut:]}
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where}: not a {task} row (missing or malformed field {e})") from e
    raise ValueError(f"unknown task {task!r}; choose from: {', '.join(SOURCES)}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_task(task: str, rows: Iterable[dict], out_dir: Path) -> dict:
    """Convert `rows` and write the task's file atomically; returns its checksum entry."""
    path = out_dir / TASKS[task].filename  # atomic_path makes out_dir
    n = 0
    with atomic.atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for i, row in enumerate(rows):
                f.write(json.dumps(convert_row(task, dict(row), f"{task} row {i}"), ensure_ascii=False) + "\n")
                n += 1
        if n == 0:
            raise ValueError(f"{task}: the source has no rows")
    digest = sha256(path)
    name, config, split = SOURCES[task]
    return {"file": path.name, "sha256": digest, "rows": n, "source": f"{name}{':' + config if config else ''}",
            "split": split, "reference": digest == REFERENCE_SHA256[task] if REFERENCE_SHA256[task] else None}


def load_rows(task: str) -> Iterable[dict]:
    """The task's source rows from the Hub with `datasets`."""
    try:
        import datasets
    except ImportError as e:
        raise ValueError("learntok eval-data fetch needs the datasets package: pip install 'learntok[hf]'") from e
    name, config, split = SOURCES[task]
    return datasets.load_dataset(name, config, split=split)


def fetch(tasks: list[str], out_dir: Path, load: Callable[[str], Iterable[dict]] | None = None,
          log: Callable[[str], None] = print) -> dict:
    """Download (with `load`, default `load_rows`), convert and checksum `tasks` into `out_dir`; returns the
    updated checksums.json content."""
    load = load or load_rows
    for task in tasks:
        if task not in SOURCES:
            raise ValueError(f"unknown task {task!r}; choose from: {', '.join(SOURCES)}")
    sums = read_checksums(out_dir)
    for task in tasks:
        name, config, split = SOURCES[task]
        log(f"{task}: {name}{' ' + config if config else ''} ({split}) ...")
        try:
            rows = load(task)
        except ValueError:
            raise
        except Exception as e:  # no network, no such dataset, ...
            raise ValueError(f"{task}: could not load {name} ({str(e).strip().splitlines()[0]})") from e
        entry = write_task(task, rows, out_dir)
        sums[task] = entry
        note = {True: "identical to the reference conversion", None: "",
                False: "differs from the reference conversion (the upstream data may have changed)"}[entry["reference"]]
        log(f"{task}: {entry['rows']:,} rows -> {out_dir / entry['file']}" + (f"; {note}" if note else ""))
        atomic.write_text(out_dir / CHECKSUMS, json.dumps(sums, indent=1) + "\n")
    return sums


def read_checksums(out_dir: Path) -> dict:
    path = out_dir / CHECKSUMS
    if not path.exists():
        return {}
    try:
        sums = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: damaged ({e}); fetch again") from e
    if not isinstance(sums, dict) or not all(isinstance(e, dict) and {"file", "sha256"} <= set(e)
                                             for e in sums.values()):
        raise ValueError(f"{path}: damaged (not an object of {{task: {{file, sha256}}}}); fetch again")
    return sums


def verify(out_dir: Path) -> list[str]:
    """Problems with the fetched files in `out_dir` ([] when every file matches checksums.json)."""
    sums = read_checksums(out_dir)
    if not sums:
        return [f"{out_dir}: no {CHECKSUMS} (run learntok eval-data fetch)"]
    problems = []
    for task, entry in sums.items():
        path = out_dir / entry["file"]
        if not path.is_file():
            problems.append(f"{task}: {path} is missing")
        elif sha256(path) != entry["sha256"]:
            problems.append(f"{task}: {path} does not match its checksum (fetch it again)")
    return problems
