"""Sharing models on the Hugging Face Hub (optional extra: pip install 'learntok[hub]').

    learntok.hub.push_to_hub("runs/wiki", "user/learntok-wiki")     # a run, checkpoint or exported directory
    model = learntok.from_pretrained("user/learntok-wiki")          # downloaded once into the Hub's cache

`download` goes through `huggingface_hub.snapshot_download`, so the Hub's cache, tokens and environment
variables apply; with HF_HUB_OFFLINE=1 it reads the cache only and never touches the network. `push_to_hub`
exports the model (config.json, model.safetensors, the strategy's files) with a generated model card
(`write_model_card`: config, training data, validation BPB, boundary statistics, a boundary map) and uploads the
folder in one commit.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from learntok import __version__
from learntok.errors import LearntokError

CARD_SAMPLE = ("The quick brown fox jumps over the lazy dog. Tokenizers split text into pieces;\n"
               "def tokenize(text: str) -> list[str]:\n    return text.split()\n")
"""The text whose boundaries the model card shows."""


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:
        raise LearntokError("the Hugging Face Hub needs the huggingface_hub package: pip install 'learntok[hub]'"
                            ) from e
    return huggingface_hub


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot of Hub model `repo_id` (from the cache, or downloaded into it)."""
    hub = _hub()
    try:
        return Path(hub.snapshot_download(repo_id, revision=revision, local_files_only=offline(),
                                          library_name="learntok", library_version=__version__))
    except Exception as e:  # not cached offline, no such repository, no network, no access
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = "is not in the local Hub cache (HF_HUB_OFFLINE is set)" if offline() else \
            "could not be loaded from the Hugging Face Hub"
        raise LearntokError(f"{repo_id}: no such local directory, and the model {where}: {why}") from e


def push_to_hub(source, repo_id: str, *, private: bool = False, token: str | None = None,
                commit_message: str | None = None, revision: str | None = None) -> str:
    """Upload a model to the Hub as `repo_id` (created if needed); returns the commit's URL. `source` is a ByteLM
    with a `seq_len` attribute, or anything `learntok.pretrained.load` reads (run, checkpoint, exported directory
    or Hub id). The uploaded folder always has a model card."""
    from learntok.pretrained import load, save_pretrained

    hub = _hub()
    with tempfile.TemporaryDirectory(prefix="learntok-push-") as tmp:
        if isinstance(source, (str, Path)):
            loaded = load(source)
            model, seq_len, run_dir = loaded.model, loaded.seq_len, loaded.run_dir or loaded.path
        else:
            model, seq_len, run_dir = source, int(getattr(source, "seq_len", 512)), None
        save_pretrained(model, tmp, seq_len=seq_len, source_dir=run_dir, card=False)
        write_model_card(Path(tmp), model, seq_len, run_dir, repo_id=repo_id)
        api = hub.HfApi(token=token, library_name="learntok", library_version=__version__)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            info = api.upload_folder(folder_path=tmp, repo_id=repo_id, repo_type="model", revision=revision,
                                     commit_message=commit_message or f"Upload learntok model ({__version__})")
        except Exception as e:  # no token, no network, no permission
            raise LearntokError(f"push to {repo_id} failed: {str(e).strip().splitlines()[0]}") from e
    return str(getattr(info, "commit_url", info))


def _last_eval(run_dir: Path) -> dict:
    """The last evaluation line of a run's metrics.jsonl ({} without one)."""
    last: dict = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if "val/bpb" in row:
                last = row
    return last


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


def model_card(model, seq_len: int, run_dir: str | Path | None = None, image: str | None = None,
               repo_id: str = "USER/NAME") -> str:
    """The README.md of a shared model: Hub metadata, usage, config, data, results, boundary statistics and map."""
    from learntok.segment import Segmenter

    facts = _run_facts(Path(run_dir) if run_dir else None)
    mc, bc = model.cfg, model.bcfg
    spans = Segmenter(model, seed=1234, window=seq_len).segment(CARD_SAMPLE)
    n_bytes = len(CARD_SAMPLE.encode())
    params = sum(p.numel() for p in model.parameters())
    lines = ["---", "library_name: learntok", "tags:", "- byte-level", "- learned-tokenization", "- learntok",
             "---", "", f"# learntok byte-level model ({bc.boundaries} boundaries)", "",
             "A byte-level language model whose tokenization is part of the model: an autoregressive U-Net (byte "
             "encoder, token boundaries, token-level transformer, byte decoder) trained with "
             f"[learntok](https://pypi.org/project/learntok/) {__version__} (arXiv 2602.13940).", "",
             "## Use", "", "```python", "import learntok", "", f'model = learntok.from_pretrained("{repo_id}")',
             'print(learntok.generate(model, ["The river"], max_new_bytes=80)[0].decode(errors="replace"))', "```",
             "", f"or `learntok generate {repo_id} --prompt \"The river\"`, `learntok segment {repo_id} --text ...`.",
             "", "## Model", "", "| setting | value |", "|---|---|",
             f"| parameters | {params / 1e6:.2f} M |", f"| width, heads | {mc.d_model}, {mc.n_heads} |",
             f"| layers (byte encoder / token / byte decoder) | {mc.n_down} / {mc.n_mid} / {mc.n_up} |",
             f"| byte attention window | {mc.byte_window} |", f"| sequence length | {seq_len} bytes |",
             f"| boundary strategy | `{bc.boundaries}` |"]
    if hasattr(bc, "target_rate"):
        lines.append(f"| target boundary rate | {bc.target_rate:.3f} |")
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
        acc, bpb = res.get("acc", float("nan")), res.get("bpb", float("nan"))
        lines.append(f"- {name}: accuracy {acc:.3f}, gold BPB {bpb:.3f} (n = {res.get('n')})")
    if not ev and not report:
        lines.append("Not recorded.")
    lines += ["", "## Boundaries", "",
              f"On the sample below the model draws {len(spans)} segments over {n_bytes} bytes (rate "
              f"{len(spans) / n_bytes:.3f}, {n_bytes / max(len(spans), 1):.2f} bytes per segment); a `|` starts "
              "each segment:", "", "```", "|".join(s.text for s in spans).rstrip("\n"), "```"]
    stats = report.get("boundary_stats") or {}
    if stats.get("rate") is not None:
        lines += ["", f"On held-out text (`learntok eval`): rate {stats['rate']:.3f}."]
    if image:
        lines += ["", f"![boundary map]({image})"]
    return "\n".join(lines) + "\n"


def write_model_card(out: Path, model, seq_len: int, run_dir: str | Path | None = None,
                     repo_id: str = "USER/NAME") -> Path:
    """README.md (and boundary_map.png when matplotlib is installed) in model directory `out`."""
    image = None
    try:
        from learntok.viz.boundary_map import compute_map
        from learntok.viz.mpl import save_map_png

        save_map_png(compute_map(model, CARD_SAMPLE.encode(), window=max(1, seq_len - 1)), out / "boundary_map.png")
        image = "boundary_map.png"
    except ImportError:
        pass
    path = out / "README.md"
    path.write_text(model_card(model, seq_len, run_dir, image, repo_id), encoding="utf-8")
    return path
