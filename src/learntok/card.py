"""The model card: the README.md of an exported or pushed model (Hub metadata, usage, config, training data,
results, and the boundaries the model draws on a sample text, with a boundary map image when matplotlib is
installed). What the run recorded is read from its directory: config.json, the last evaluation in metrics.jsonl and
eval.json; a model saved without its run says so.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from learntok.version import __version__
from learntok.viz.boundary_map import compute_map
from learntok.viz.cells import BoundaryMap
from learntok.viz.curves import load_metrics

CARD_SAMPLE = ("The quick brown fox jumps over the lazy dog. Tokenizers split text into pieces;\n"
               "def tokenize(text: str) -> list[str]:\n    return text.split()\n")
"""The text whose boundaries the model card shows."""


def _last_eval(run_dir: Path) -> dict:
    """The last evaluation line of a run's metrics.jsonl ({} without one)."""
    try:
        evals = load_metrics(run_dir).evals
    except (FileNotFoundError, ValueError):
        return {}
    return evals[-1] if evals else {}


def _run_facts(run_dir: Path | None) -> dict:
    """What the run directory recorded: its config, last evaluation and eval.json (each {} when absent)."""
    facts = {"config": {}, "eval": {}, "report": {}}
    if run_dir is None or not (run_dir / "metrics.jsonl").exists():
        return facts
    try:
        facts["config"] = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        pass
    facts["eval"] = _last_eval(run_dir)
    try:
        facts["report"] = json.loads((run_dir / "eval.json").read_text())
    except (OSError, ValueError):
        pass
    return facts


def sample_map(model, seq_len: int) -> BoundaryMap:
    """The boundaries the model draws on CARD_SAMPLE, the evaluation way (as `learntok show` draws them)."""
    return compute_map(model, CARD_SAMPLE.encode(), window=max(1, seq_len - 1))


def model_card(model, seq_len: int, run_dir: str | Path | None = None, image: str | None = None,
               repo_id: str = "USER/NAME", bmap: BoundaryMap | None = None) -> str:
    """The README.md of a shared model: Hub metadata, usage, config, data, results, boundary statistics and map
    (`bmap`: sample_map's, computed if not given)."""
    facts = _run_facts(Path(run_dir) if run_dir else None)
    mc, bc = model.cfg, model.bcfg
    tokens = getattr(model, "predicts_tokens", False)  # the BPE transformer: no boundaries to draw, no generation
    params = sum(p.numel() for p in model.parameters())
    library = f"[learntok](https://pypi.org/project/learntok/) {__version__} (arXiv 2602.13940)"
    if tokens:
        title = f"learntok BPE-tokenized transformer (vocabulary {bc.bpe_vocab_size:,})"
        about = ("A transformer over BPE tokens (its tokenizer: bpe_tokenizer.json), the baseline that learned "
                 f"tokenization is compared with; trained with {library}. It predicts tokens, so it is scored in bits "
                 "per byte and does not generate bytes.")
        use = ["```", "", f"or `learntok eval {repo_id} --data FILE` (bits per byte)."]
        shape = [f"| layers | {mc.n_mid} |"]
    else:
        title = f"learntok byte-level model ({bc.boundaries} boundaries)"
        about = ("A byte-level language model whose tokenization is part of the model: an autoregressive U-Net (byte "
                 f"encoder, token boundaries, token-level transformer, byte decoder) trained with {library}.")
        use = ['print(learntok.generate(model, ["The river"], max_new_bytes=80)[0].decode(errors="replace"))', "```",
               "", f"or `learntok generate {repo_id} --prompt \"The river\"`, `learntok segment {repo_id} --text ...`."]
        shape = [f"| layers (byte encoder / token / byte decoder) | {mc.n_down} / {mc.n_mid} / {mc.n_up} |",
                 f"| byte attention window | {mc.byte_window} |"]
    lines = ["---", "library_name: learntok", "tags:", "- byte-level", "- learned-tokenization", "- learntok", "---",
             "", f"# {title}", "", about, "",
             "## Use", "", "```python", "import learntok", "", f'model = learntok.from_pretrained("{repo_id}")', *use,
             "", "## Model", "", "| setting | value |", "|---|---|",
             f"| parameters | {params / 1e6:.2f} M |", f"| width, heads | {mc.d_model}, {mc.n_heads} |", *shape,
             f"| sequence length | {seq_len} bytes |"]
    if not tokens:
        lines.append(f"| boundary strategy | `{bc.boundaries}` |")
        if hasattr(bc, "target_rate"):
            lines.append(f"| target boundary rate | {bc.target_rate:.3f} |")
    if getattr(bc, "rate_range", None):
        lines.append(f"| trained for any rate in | {bc.rate_range[0]:g} to {bc.rate_range[1]:g} (ask with `--rate R`, "
                     "`model.set_rate(R)`) |")
    cal = getattr(model.boundary, "calibration", None)
    if cal is not None:
        lines.append(f"| rate calibration | {len(cal.rates)} asked rates from {cal.rates[0]:.3g} to "
                     f"{cal.rates[-1]:.3g} (`rate_calibration.json`) |")
    if mc.ngram_sizes or mc.chunk_table:
        lines.append(f"| hashed embeddings | n-grams {' '.join(map(str, mc.ngram_sizes)) or 'none'}, chunk table "
                     f"{mc.chunk_table or 'none'} |")
    cfg, ev, report = facts["config"], facts["eval"], facts["report"]
    lines += ["", "## Training data", ""]
    if cfg:
        data = cfg.get("data", {})
        lines.append(f"Data: `{data.get('source', '?')}` (sequences of {data.get('seq_len', seq_len)} bytes). "
                     + (f"Trained for {ev['step']:,} steps, {ev['bytes'] / 1e6:,.1f} MB, "
                        f"{ev['flops']:.3g} FLOPs (6 x matrix parameters per position)." if ev else ""))
    else:
        lines.append("Not recorded (the model was saved without its training run).")
    lines += ["", "## Results", ""]
    if ev:
        lines.append(f"Validation bits per byte {ev['val/bpb']:.4f} at boundary rate {ev['val/rate']:.3f} "
                     f"(step {ev['step']:,}).")
    for name, res in (report.get("tasks") or {}).items():
        acc, bpb = (res.get(k) for k in ("acc", "bpb"))  # None: n/a (LAMBADA for the BPE transformer)
        lines.append(f"- {name}: accuracy {'n/a' if acc is None else f'{acc:.3f}'}, gold BPB "
                     f"{'n/a' if bpb is None else f'{bpb:.3f}'} (n = {res.get('n')})")
    if not ev and not report:
        lines.append("Not recorded.")
    if tokens:
        return "\n".join(lines) + "\n"
    data = CARD_SAMPLE.encode()
    mask = (bmap if bmap is not None else sample_map(model, seq_len)).mask
    starts = [i for i in range(len(data)) if i == 0 or mask[i]] + [len(data)]  # as `learntok segment` draws them
    spans = [data[a:b].decode("utf-8", errors="replace") for a, b in zip(starts, starts[1:])]
    n_bytes = len(data)
    lines += ["", "## Boundaries", "",
              f"On the sample below the model draws {len(spans)} segments over {n_bytes} bytes (rate "
              f"{len(spans) / n_bytes:.3f}, {n_bytes / max(len(spans), 1):.2f} bytes per segment); a `|` starts "
              "each segment:", "", "```", "|".join(spans).rstrip("\n"), "```"]
    stats = report.get("boundary_stats") or {}
    if stats.get("rate") is not None:
        lines += ["", f"On held-out text (`learntok eval`): rate {stats['rate']:.3f}."]
    if image:
        lines += ["", f"![boundary map]({image})"]
    return "\n".join(lines) + "\n"


def write_model_card(out: Path, model, seq_len: int, run_dir: str | Path | None = None,
                     repo_id: str = "USER/NAME") -> Path:
    """README.md (and boundary_map.png when matplotlib, an optional dependency, is installed) in model directory
    `out`."""
    bmap, image = None, None
    if not getattr(model, "predicts_tokens", False) and importlib.util.find_spec("matplotlib") is not None:
        bmap = sample_map(model, seq_len)
        from learntok.viz.mpl import save_map_png

        save_map_png(bmap, out / "boundary_map.png")
        image = "boundary_map.png"
    path = out / "README.md"
    path.write_text(model_card(model, seq_len, run_dir, image, repo_id, bmap), encoding="utf-8")
    return path
