"""One evaluation of a trained model: held-out BPB, downstream tasks, boundary statistics and inference FLOPs,
collected into the JSON-ready report that `learntok eval` prints and writes as eval.json."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from learntok import atomic
from learntok.data import ByteSequences, Corpus, is_prepared, iter_documents, load_split, val_batches_with_flags
from learntok.evaluation.bpb import BoundaryMode, check_mode, heldout_bpb
from learntok.evaluation.byteclass import token_split
from learntok.evaluation.diagnostics import boundary_diagnostics
from learntok.evaluation.robustness import format_robustness, robustness
from learntok.evaluation.stability import format_stability, stability
from learntok.evaluation.stats import BoundaryStats
from learntok.evaluation.tasks import TASKS, format_metric, read_task, resolve_tasks, score_task

EVAL_VERSION = 1
"""Bumped when the meaning of an eval.json field changes; `read_eval` refuses other versions."""

DIAGNOSTIC_BYTES = 131_072
"""Held-out bytes (the first sequences) for the boundary diagnostics (three forward passes each)."""


@dataclass
class EvalConfig:
    """What `learntok eval` evaluates (its flags)."""

    data: str | None = None
    """Held-out text: any data spec `train` accepts (all its documents); None = the run's own split."""
    split: str = "val"
    """val | test: which split of the run's data (test: its test* files)."""
    tasks: str = ",".join(TASKS)
    """Comma-separated tasks, NAME or NAME=PATH; 'none' for none."""
    task_dir: str | None = None
    limit: int = 0
    """Examples per task (0 = all); with it, also at most limit sequences of held-out text."""
    mode: BoundaryMode = field(default_factory=BoundaryMode)
    batch_size: int = 16
    max_bytes: int = 0
    """Held-out bytes to evaluate (0 = the whole split)."""
    skip_bytes: int = 0
    """Held-out bytes left out at the start of the split (rounded up to whole sequences)."""
    per_document: bool = False
    """Also each document's held-out bits and bytes (for `learntok compare --paired`)."""
    by_class: bool = False
    """Also the held-out bits and bytes of each byte class (learntok.evaluation.byteclass)."""
    bpe_tokenizer: str | None = None
    """tokenizer.json of a byte-level BPE to compare boundaries with."""
    heldout: bool = True
    robustness: bool = False
    """CUTE-style tasks and noised-text BPB on the held-out documents (learntok.evaluation.robustness)."""
    rate: float | None = None
    """Ask the model for this boundary rate throughout (learntok.evaluation.rates); None: its trained rate."""
    rate_sweep: tuple[float, ...] = ()
    """Also BPB and realised rate at each of these asked rates on the first `sweep_bytes` held-out bytes."""
    sweep_bytes: int = 65_536
    progress: bool = True


def inference_flops(model, rate: float) -> dict:
    """Inference FLOPs per byte at a measured rate (tokens per byte-level position), the paper's accounting with
    2 x instead of 6 x: 2 x byte-level matrix params + 2 x token-level matrix params x rate. The early-exit heads
    are a training-time term and are left out of inference. A two-level model (--inner-layers) counts its mid
    layers per super-token, at its target --inner-rate per token."""
    if hasattr(model, "level_params"):
        pb, tok, sup = model.level_params()
        pt = tok + sup * model.cfg.inner_rate  # per token
    else:
        pb, pt = model.matrix_params()
    heads = [getattr(model, name, None) for name in ("head_early", "head_early2")]  # the BPE baseline has none
    early = sum(p.numel() for h in heads if h is not None for p in h.parameters() if p.dim() >= 2)
    byte = pb - early
    return {"per_byte": 2.0 * byte + 2.0 * pt * rate, "byte_params": byte, "token_params": pt, "rate": rate,
            "train_per_byte": 6.0 * (pb + pt * rate)}


def heldout_documents(cfg, data: str | None, split: str) -> tuple[str, Sequence[bytes]]:
    """(description, documents) of the held-out text: `data` (all its documents, or its `split` if it is a
    prepared corpus), or the run's validation / test split."""
    if data is None:
        return load_split(cfg.data, split)
    if is_prepared(data):
        return load_split(replace(cfg.data, source=data, val_data=None), split)
    return data, Corpus.from_documents((t for _, t in iter_documents(data, cfg.data.text_field, cfg.data.encoding)),
                                         "held-out data")


def _bpe_reference(path: str) -> Callable[[bytes], np.ndarray]:
    """Reference boundaries of a byte-level BPE tokenizer (tokenizer.json): the BPE strategy's own flags, True at
    the first byte of every token but a text's first (the paper's right-shifted rule, App. D.1)."""
    from tokenizers import Tokenizer

    from learntok.boundaries.bpe import bpe_boundaries

    if not Path(path).is_file():
        raise FileNotFoundError(f"--bpe-tokenizer {path}: no such file")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises its own exception type
        raise ValueError(f"--bpe-tokenizer {path}: not a tokenizers JSON file ({e})") from e
    return lambda data: bpe_boundaries(tok, data)


def evaluate_model(cfg, model, opts: EvalConfig, log: Callable[[str], None] = print,
                   on_part: Callable[[dict], None] | None = None) -> dict:
    """The full report of one model (see the module docstring). `cfg` is the run's TrainConfig. `on_part` gets the
    report so far after each task (the CLI writes eval.json then, so an interrupted evaluation keeps the tasks that
    finished; the held-out part, which comes last, is written with the whole report)."""
    t0 = time.perf_counter()
    bm = opts.mode
    if opts.rate is not None:
        model.set_rate(opts.rate)
    calibrated = getattr(model.boundary, "calibration", None) is not None  # (the key only when true: older files)
    report: dict = {"eval_version": EVAL_VERSION, "boundaries": cfg.boundary.boundaries, "asked_rate": opts.rate,
                    **({"calibrated": True} if calibrated else {}),
                    "policy_window": cfg.boundary.policy_window if cfg.boundary.boundaries == "learned" else None,
                    "mode": {"mode": bm.mode, "samples": bm.draws, "seed": bm.seed,
                             "description": check_mode(model, bm)},
                    "limit": opts.limit, "tasks": {}, "heldout": None, "boundary_stats": None, "flops": None,
                    "diagnostics": None, "stability": None, "robustness": None}
    window = cfg.data.seq_len
    for name, path in resolve_tasks(opts.tasks, opts.task_dir):
        t = time.perf_counter()
        examples = read_task(name, path, opts.limit)
        res = score_task(model, name, examples, window, bm, batch_size=opts.batch_size, progress=opts.progress)
        report["tasks"][name] = {"file": str(path), **res, "seconds": time.perf_counter() - t}
        log(f"{TASKS[name].title}: BPB {format_metric(res['bpb'], res['bpb_se'])}, "
            f"accuracy {format_metric(res['acc'], res['acc_se'])} (n={res['n']})")
        if on_part is not None:
            on_part(report)
    if opts.rate_sweep:
        from learntok.evaluation.rates import rate_sweep

        t = time.perf_counter()
        desc, docs = heldout_documents(cfg, opts.data, opts.split)
        seqs = ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, name=f"held-out data {desc}")
        report["rate_sweep"] = {"data": desc, **rate_sweep(model, seqs, opts.rate_sweep, bm, max_bytes=opts.sweep_bytes,
                                                          batch_size=opts.batch_size, log=log),
                                "seconds": time.perf_counter() - t}
        if on_part is not None:
            on_part(report)
    if opts.robustness and not opts.heldout:  # with held-out BPB it reads the same documents, loaded once there
        _robustness(report, model, cfg, opts, bm, *heldout_documents(cfg, opts.data, opts.split), log)
    if opts.heldout:
        t = time.perf_counter()
        desc, docs = heldout_documents(cfg, opts.data, opts.split)
        dc = cfg.data
        seqs = ByteSequences(docs, dc.seq_len, dc.pack, name=f"held-out data {desc}", annotate=model.boundary.annotator)
        refs = {}
        if opts.bpe_tokenizer:
            refs["bpe"] = ByteSequences(docs, dc.seq_len, dc.pack, name="bpe reference",
                                        annotate=_bpe_reference(opts.bpe_tokenizer))
        if not getattr(model, "predicts_tokens", False):
            report["stability"] = stability(model, docs, dc.seq_len - 1)
        if opts.robustness:
            _robustness(report, model, cfg, opts, bm, desc, docs, log)
        del docs
        max_bytes = opts.max_bytes if not opts.limit else min(opts.max_bytes or 1 << 62, opts.limit * dc.seq_len)
        stats = BoundaryStats()
        res = heldout_bpb(model, seqs, bm, batch_size=opts.batch_size, max_bytes=max_bytes,
                          skip_bytes=opts.skip_bytes, per_document=opts.per_document, references=refs,
                          progress=opts.progress, stats=stats, by_class=opts.by_class)
        report["heldout"] = {"data": desc, "split": opts.split if opts.data is None else None, **res,
                             "seconds": time.perf_counter() - t}
        report["boundary_stats"] = stats.result()
        report["flops"] = inference_flops(model, report["boundary_stats"]["rate"])
        log(f"held-out BPB {format_metric(res['bpb'], res['bpb_se'], 4)} on {res['bytes']:,} bytes")
        if bm.mode == "sample" and bm.draws == 1 and not getattr(model, "predicts_tokens", False):
            # own vs rate-0 vs random boundaries on the same bytes (a U-Net's token stack; not the BPE baseline)
            diag_bytes = min(DIAGNOSTIC_BYTES, max_bytes or DIAGNOSTIC_BYTES)
            batches = val_batches_with_flags(seqs, opts.batch_size, diag_bytes, first=res["first_sequence"])
            report["diagnostics"] = boundary_diagnostics(model, batches, next(model.parameters()).device, bm.seed)
    report["seconds"] = time.perf_counter() - t0
    report["threads"] = torch.get_num_threads()
    return report


def _robustness(report: dict, model, cfg, opts: EvalConfig, bm: BoundaryMode, desc: str, docs, log) -> None:
    """--robustness on the held-out documents `docs` (described by `desc`, kept in the report)."""
    report["robustness"] = {"data": desc, **robustness(model, docs, cfg.data.seq_len, bm, n=opts.limit or 200,
                                                       batch_size=opts.batch_size)}
    log(f"robustness: {len(report['robustness']['cute'])} CUTE-style tasks, noised text at "
        f"{len(report['robustness']['noise']['rates'])} rates")


def _clean(x):
    """Non-finite floats (an undefined precision, say) become null: eval.json stays standard JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_eval(path: str | Path, report: dict) -> Path:
    """Write eval.json atomically (NaN / inf as null)."""
    return atomic.write_text(path, json.dumps(_clean(report), indent=2, allow_nan=False) + "\n")


SAME_EVAL = ("eval_version", "checkpoint", "mode", "limit", "asked_rate", "calibrated")
"""Fields two reports must share for one to add to the other (same weights, same boundary draw, same subset)."""


def merge_eval(old: dict | None, new: dict) -> dict:
    """`new`, keeping what `old` measured and `new` did not (tasks it did not run; held-out parts it skipped) when
    both evaluated the same checkpoint the same way (SAME_EVAL); otherwise `new` alone."""
    if not old or any(old.get(k) != new.get(k) for k in SAME_EVAL):
        return new
    merged = {**new, "tasks": {**old.get("tasks", {}), **new.get("tasks", {})}}
    for k in ("heldout", "boundary_stats", "flops", "diagnostics", "stability", "robustness", "rate_sweep"):
        if merged.get(k) is None and old.get(k) is not None:
            merged[k] = old[k]
    return merged


def read_eval(path: str | Path) -> dict:
    """Read an eval.json written by `write_eval`; ValueError for another version or a malformed file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (run `learntok eval` first)")
    try:
        report = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(report, dict) or report.get("eval_version") != EVAL_VERSION:
        found = report.get("eval_version") if isinstance(report, dict) else None
        raise ValueError(f"{path}: eval.json version {found} is not supported (this learntok writes {EVAL_VERSION})")
    return report


def _f(x, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _bar(frac: float, width: int = 20) -> str:
    return "#" * round(frac * width)


def format_report(report: dict, title: str = "") -> str:
    """A readable table of a report."""
    lines = [title] if title else []
    lines.append(f"boundaries: {report['mode']['description']}")
    if report.get("asked_rate") is not None:
        lines.append(f"asked rate {report['asked_rate']:g}" + (" (calibrated)" if report.get("calibrated") else
                                                               " (no calibration table: logit shifted only)"))
    if report.get("limit"):
        lines.append(f"(--limit {report['limit']}: a quick look, not the full evaluation)")
    if report["tasks"]:
        lines += ["", f"{'task':<11} {'n':>6}  {'BPB of gold':<17} {'accuracy':<17} chance"]
        for name, r in report["tasks"].items():
            lines.append(f"{TASKS[name].title:<11} {r['n']:>6}  {format_metric(r['bpb'], r['bpb_se']):<17} "
                         f"{format_metric(r['acc'], r['acc_se']):<17} {r['chance']:.3f}")
        if "lambada" in report["tasks"]:
            r = report["tasks"]["lambada"]
            lines.append(f"LAMBADA accuracy = exact match of the greedy final word; greedy bytes without the "
                         f"word-end check: {format_metric(r['greedy_prefix'], r['greedy_prefix_se'])}")
    h = report.get("heldout")
    if h:
        lines += ["", f"held-out BPB {format_metric(h['bpb'], h['bpb_se'], 4)}  ({h['data']}: {h['bytes']:,} bytes "
                      f"in {h['sequences']} sequences of {h['seq_len']})"]
        if "bpb_mean_over_samples" in h:
            lines.append(f"  mean of the per-sample BPBs: {h['bpb_mean_over_samples']:.4f}")
        if "by_class" in h:
            c = h["by_class"]
            total = sum(c["bytes"]) or 1
            lines.append("  by byte class: " + "; ".join(
                f"{name} {n / total:.0%} of the bytes, {bits / n:.4f} BPB" if n else f"{name}: none"
                for name, bits, n in zip(c["classes"], c["bits"], c["bytes"], strict=True)))
            if "token_first" in c:
                lines.append("  on a token's first byte | the rest: " + "; ".join(
                    f"{r['class']} {r['first']:.0%} first, "
                    f"{_f(r['bpb_first'], '.4f')} | {_f(r['bpb_rest'], '.4f')} BPB"
                    for r in token_split(c) if r["bytes"]))
    s = report.get("boundary_stats")
    if s:
        q = s["bytes_per_token_p10_p50_p90"]
        lines += ["", "boundaries on held-out text",
                  f"  rate {s['rate']:.4f} tokens per position, {_f(s['bytes_per_token'], '.2f')} bytes per "
                  f"token (p10/p50/p90: {q[0]}/{q[1]}/{q[2]})"]
        if s["neg_log_pi"] is not None:
            lines.append(f"  mean -log pi(a_t | a_<t) {_f(s['neg_log_pi'], '.4f')} nats, policy entropy "
                         f"{_f(s['policy_entropy'], '.4f')} nats per decision")
        else:
            lines.append("  mean -log pi(a_t | a_<t): n/a (the strategy has no policy)")
        for name, a in s["agreement"].items():
            lines.append(f"  vs {name:<10} precision {_f(a['precision'])} recall {_f(a['recall'])} F1 {_f(a['f1'])} "
                         f"(chance F1 {_f(a['f1_chance'])}; reference rate {_f(a['reference_rate'])})")
        hist = np.asarray(s["bytes_per_token_hist"], dtype=float)
        total = hist.sum() or 1.0
        lines.append("  bytes per token:")
        for k in range(min(12, len(hist))):
            lines.append(f"    {k + 1:>3} {hist[k] / total:6.1%} {_bar(hist[k] / total)}")
        lines.append(f"    >12 {hist[12:].sum() / total:6.1%} {_bar(hist[12:].sum() / total)}")
    d = report.get("diagnostics")
    if d:
        lines += ["", f"do the boundaries matter? (first {d['bytes']:,} held-out bytes)",
                  f"  sensitivity {d['sensitivity']:+.4f} BPB: {d['bpb_rate0']:.4f} with no boundaries (rate 0) vs "
                  f"{d['bpb']:.4f} with its own",
                  f"  placement   {d['placement']:+.4f} BPB: {d['bpb_random']:.4f} with iid random boundaries at its "
                  f"rate {d['rate']:.3f}",
                  f"  vs SpaceByte F1 {_f(d['spacebyte_f1'])} (chance {_f(d['spacebyte_f1_chance'])}), one byte later "
                  f"(word starts) F1 {_f(d['wordstart_f1'])}"]
    sw = report.get("rate_sweep")
    if sw:
        from learntok.evaluation.rates import format_sweep

        lines += ["", f"rate sweep ({sw['data']}: {sw['bytes']:,} bytes)", format_sweep(sw)]
    st = report.get("stability")
    if st:
        lines += ["", format_stability(st)]
    rb = report.get("robustness")
    if rb:
        lines += ["", format_robustness(rb)]
    f = report.get("flops")
    if f:
        lines += ["", f"inference FLOPs per byte {f['per_byte']:.4g} = 2 x {f['byte_params']:,} byte-level + "
                      f"2 x {f['token_params']:,} token-level x rate {f['rate']:.4f}"]
    lines.append(f"\n{report['seconds']:.1f} s on {report['threads']} thread(s)")
    return "\n".join(lines)


__all__ = ["EVAL_VERSION", "EvalConfig", "evaluate_model", "format_report", "heldout_documents", "inference_flops",
           "read_eval", "write_eval"]
