"""Downstream tasks scored from local files, as in the paper's Table 1 (Appendix D).

Multiple choice (PIQA, HellaSwag, ARC-Easy), OLMES "rank classification" rows `{"query": str, "choices": [str],
"gold": int}`: each candidate is the continuation " " + choices[i] of `query`. Reported: the gold candidate's
bits per byte, -log2 p(" " + gold | query) / its UTF-8 bytes, averaged over questions; and accuracy, choosing the
candidate of lowest per-byte loss (the length-normalised score; lowest total loss is reported too).

LAMBADA, rows `{"context": str, "continuation": str}` (continuation = " " + final word) or `{"text": str}` (split at
the last space): bits per byte of the continuation; exact match = greedy byte decoding from the context produces
the continuation and then a word-ending byte (a SpaceByte "spacelike" byte: whitespace, punctuation, or an end of
text), i.e. the predicted final word is exactly the target word. `greedy_prefix` drops the word-end condition
(lm-evaluation-harness's `is_greedy` on the continuation bytes). For strategies whose boundaries are exactly
causal, greedy decoding equals the teacher-forced argmax with the same per-byte boundary noise, so one forward
scores both; for the others (BPE guidance) bytes are decoded one forward at a time, re-annotating each prefix.

Files: .jsonl, optionally .xz/.gz/.zst. Every metric carries its standard error over examples. Contexts longer
than the model's training length are left-truncated (their last bytes are kept; see `bpb._row`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from learntok.boundaries.whitespace import spacelike_table
from learntok.data import DataError, read_jsonl
from learntok.evaluation.bpb import LN2, BoundaryMode, greedy_decode, score_pairs
from learntok.evaluation.stats import mean_se


@dataclass(frozen=True)
class TaskSpec:
    name: str
    filename: str
    """File name (without compression suffix) in the task directory."""
    kind: str
    """choice | lambada."""
    title: str
    """Column title in tables."""


TASKS: dict[str, TaskSpec] = {
    "piqa": TaskSpec("piqa", "piqa_validation.jsonl", "choice", "PIQA"),
    "hellaswag": TaskSpec("hellaswag", "hellaswag_validation.jsonl", "choice", "HellaSwag"),
    "arc_easy": TaskSpec("arc_easy", "arc_easy_test.jsonl", "choice", "ARC-Easy"),
    "lambada": TaskSpec("lambada", "lambada_openai_test.jsonl", "lambada", "LAMBADA"),
}
COMPRESSIONS = ("", ".xz", ".gz", ".zst")


@dataclass(frozen=True)
class Example:
    context: bytes
    choices: tuple[bytes, ...]
    """Continuations to score (for LAMBADA the single gold continuation)."""
    gold: int
    where: str
    """file:line, for messages."""


def eval_cache_dir() -> Path:
    """Where fetched task files live: $LEARNTOK_EVAL_DIR, else $XDG_CACHE_HOME/learntok/eval (~/.cache)."""
    env = os.environ.get("LEARNTOK_EVAL_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "learntok" / "eval"


def default_task_dir() -> Path | None:
    """$LEARNTOK_EVAL_DIR, else the cache `learntok eval-data fetch` fills (~/.cache/learntok/eval), else a
    shared/data/eval directory beside the repository or the working directory (the project's own copy)."""
    env = os.environ.get("LEARNTOK_EVAL_DIR")
    if env:
        return Path(env)
    cands = [eval_cache_dir(), Path(__file__).resolve().parents[3].parent / "shared" / "data" / "eval",
             Path.cwd().parent / "shared" / "data" / "eval", Path.cwd() / "shared" / "data" / "eval"]
    return next((c for c in cands if c.is_dir()), None)


def resolve_tasks(spec: str, task_dir: str | Path | None) -> list[tuple[str, Path]]:
    """(task, file) for `spec`: comma-separated names (piqa, hellaswag, arc_easy, lambada), each optionally
    NAME=PATH for a user file in the same format; "none" or "" for no tasks."""
    if spec.strip().lower() in ("", "none"):
        return []
    items = [s.strip() for s in spec.split(",") if s.strip()]
    names = [item.partition("=")[0] for item in items]
    for name in names:
        if name not in TASKS:
            raise ValueError(f"--tasks: unknown task {name!r}; choose from: {', '.join(TASKS)} (NAME or NAME=PATH)")
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"--tasks: {', '.join(twice)} named twice (the report keeps one result per task)")
    out = []
    for item in items:
        name, _, path = item.partition("=")
        if path:
            if not Path(path).is_file():
                raise FileNotFoundError(f"--tasks {item}: no such file")
            out.append((name, Path(path)))
            continue
        root = Path(task_dir) if task_dir is not None else default_task_dir()
        if root is None or not root.is_dir():
            raise FileNotFoundError(f"no evaluation data{f' in {root}' if root else ''}: run `learntok eval-data "
                                    f"fetch` (PIQA, HellaSwag, ARC-Easy, LAMBADA into a cache), or give --task-dir "
                                    f"DIR or --tasks {name}=PATH")
        found = [root / (TASKS[name].filename + c) for c in COMPRESSIONS]
        found = [f for f in found if f.is_file()]
        if not found:
            raise FileNotFoundError(f"{root}: no {TASKS[name].filename}[.xz|.gz|.zst] for task {name} (run "
                                    f"`learntok eval-data fetch --tasks {name}`, or give --task-dir DIR or --tasks "
                                    f"{name}=PATH)")
        out.append((name, found[0]))
    return out


def _str(row: dict, key: str, where: str) -> str:
    if key not in row:
        raise DataError(f"{where}: no field {key!r} (fields: {', '.join(sorted(row))})")
    if not isinstance(row[key], str):
        raise DataError(f"{where}: field {key!r} is {type(row[key]).__name__}, not a string")
    return row[key]


def _parse(kind: str, row: dict, where: str) -> Example:
    if kind == "lambada":
        if "context" in row or "continuation" in row:
            ctx, cont = _str(row, "context", where), _str(row, "continuation", where)
        else:
            text = _str(row, "text", where)
            cut = text.rstrip().rfind(" ")
            if cut <= 0:
                raise DataError(f"{where}: field 'text' has no space to split off the final word")
            ctx, cont = text[:cut], text[cut:].rstrip()
        if not cont:
            raise DataError(f"{where}: empty continuation")
        return Example(ctx.encode(), (cont.encode(),), 0, where)
    query = _str(row, "query", where)
    choices, gold = row.get("choices"), row.get("gold")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise DataError(f"{where}: field 'choices' must be a list of at least 2 strings")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise DataError(f"{where}: field 'gold' must be an integer index into the {len(choices)} choices, got {gold!r}")
    return Example(query.encode(), tuple((" " + c).encode() for c in choices), gold, where)


def read_task(name: str, path: str | Path, limit: int = 0) -> list[Example]:
    """The first `limit` (0 = all) examples of a task file; DataError naming file:line for a malformed line."""
    path, kind, out = Path(path), TASKS[name].kind, []
    for where, row in read_jsonl(path):
        if limit and len(out) >= limit:
            break
        try:
            out.append(_parse(kind, row, where))
        except UnicodeEncodeError:  # a lone surrogate ("\\ud800") in JSON
            raise DataError(f"{where}: text that is not valid Unicode (a lone surrogate)") from None
    if not out:
        raise DataError(f"{path}: no examples")
    return out


def _metric(d: dict, key: str, values) -> None:
    m = mean_se(values)
    d[key], d[key + "_se"] = m["mean"], m["se"]


def score_task(model, name: str, examples: list[Example], window: int, bm: BoundaryMode, *, batch_size: int = 16,
               progress: bool = False, kind: str | None = None, values: bool = False) -> dict:
    """Metrics of one task (see the module docstring); every mean has its standard error over examples. `kind`
    (choice | lambada) defaults to the named task's; generated tasks (learntok.evaluation.robustness) give it.
    `values`: also each example's gold BPB and correctness (multiple choice), for paired comparisons."""
    pairs, keys, owner = [], [], []
    for i, ex in enumerate(examples):
        for c in ex.choices:
            pairs.append((ex.context, c))
            keys.append(i)
            owner.append(i)
    scores = score_pairs(model, pairs, keys, window, bm, batch_size=batch_size, progress=progress, desc=name)
    res: dict = {"n": len(examples), "truncated": sum(s.truncated for s in scores)}
    if (kind or TASKS[name].kind) == "choice":
        per: list[list] = [[] for _ in examples]
        for i, s in zip(owner, scores):
            per[i].append(s)
        bpb = [[s.nll / (LN2 * max(s.n_bytes, 1)) for s in ss] for ss in per]
        gold = [b[ex.gold] for b, ex in zip(bpb, examples)]
        right = [float(int(np.argmin(b)) == ex.gold) for b, ex in zip(bpb, examples)]
        _metric(res, "bpb", gold)
        _metric(res, "acc", right)
        if values:
            res["values"] = {"bpb": gold, "acc": right}
        _metric(res, "acc_total", [float(int(np.argmin([s.nll for s in ss])) == ex.gold)
                                   for ss, ex in zip(per, examples)])
        res["chance"] = float(np.mean([1 / len(ex.choices) for ex in examples]))
        return res
    _metric(res, "bpb", [s.nll / (LN2 * s.n_bytes) for s in scores])
    res["chance"] = 0.0
    if getattr(model, "predicts_tokens", False):  # no byte predictions, so no greedy continuation: BPB only
        res["acc"] = res["acc_se"] = res["greedy_prefix"] = res["greedy_prefix_se"] = None
        return res
    spacelike = spacelike_table()
    if model.boundary.exactly_causal:
        prefix = [s.greedy for s in scores]
        exact = [s.greedy and bool(spacelike[s.next_byte]) for s in scores]
    else:
        conts = [ex.choices[0] for ex in examples]
        gen = greedy_decode(model, [ex.context for ex in examples], list(range(len(examples))),
                            [len(c) + 1 for c in conts], window, bm, batch_size=batch_size,
                            stop=lambda i, g: not conts[i].startswith(g[: len(conts[i])]))  # stop at a mismatch
        prefix = [g[: len(c)] == c for g, c in zip(gen, conts)]
        exact = [p and (len(g) == len(c) or bool(spacelike[g[len(c)]])) for p, g, c in zip(prefix, gen, conts)]
    _metric(res, "acc", [float(e) for e in exact])
    _metric(res, "greedy_prefix", [float(p) for p in prefix])
    return res


def format_metric(mean: float | None, se: float | None, digits: int = 3) -> str:
    """'1.234 ± 0.011', or 'n/a'."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{mean:.{digits}f} ± {se:.{digits}f}" if se is not None else f"{mean:.{digits}f}"
