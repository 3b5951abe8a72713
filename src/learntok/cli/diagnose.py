"""`learntok diagnose variance RUN`: how noisy the policy gradient is under each of the paper's variance
reductions (learntok.evaluation.variance)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from learntok.cli import UsageError, parse

DESCRIPTION = """Measure the policy gradient's variance, signal-to-noise ratio and bias under the paper's variance
reductions (naive REINFORCE, early-exit relative reward, reward-to-go, discounting, batch centring, normalisation)
by sampling the boundaries of one fixed held-out batch again and again. Writes variance.json and variance.png.

examples:
  learntok diagnose variance runs/small                  # the trained model
  learntok diagnose variance runs/small --init           # the same model at initialisation
  learntok diagnose variance runs/two-level --level 2    # a two-level model's second level
  learntok diagnose variance runs/small --gammas 0.5 0    # also measure shorter discounts"""


@dataclass(frozen=True, kw_only=True)
class DiagnoseArgs:
    what: Annotated[Literal["variance"], tyro.conf.Positional]
    """What to diagnose: variance (the policy gradient's)."""
    run: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")]
    """Run directory or checkpoint directory."""
    init: bool = False
    """Measure the run's model at initialisation (its config and seed) instead of its trained weights."""
    samples: int = 64
    """Boundary draws per estimator (the reference direction gets 16x as many)."""
    batch_size: int = 8
    """Held-out sequences in the batch (default: the run's per-update batch is usual)."""
    seed: int = 0
    """Seed of the boundary draws."""
    level: int = 1
    """Boundary level: 2 measures a two-level model's second level (--inner-layers), its decisions per token."""
    gammas: tuple[float, ...] = ()
    """Discounts to measure besides the run's own, 0.99, 0.9 and 1 (each uncentred and batch-centred): which
    horizon gives this policy a signal, before training with it."""
    out: str | None = None
    """Directory for variance.json / variance.png (default: RUN_DIR/diagnose[-init][-level2][-gammas])."""

    def __post_init__(self) -> None:
        if self.samples < 2 or self.batch_size < 2:
            raise ValueError("--samples and --batch-size must be at least 2 (centring needs two rows)")
        if any(not 0 <= g <= 1 for g in self.gammas):
            raise ValueError(f"--gammas must be in [0, 1], got {' '.join(f'{g:g}' for g in self.gammas)}")


def cmd_diagnose(argv: list[str]) -> int:
    a = parse(DiagnoseArgs, argv, "learntok diagnose", DESCRIPTION)
    import torch

    from learntok.checkpoint import load_run
    from learntok.data import ByteSequences, load_split
    from learntok.draw import check_level
    from learntok.evaluation.variance import format_table, policy_gradient_variance
    from learntok.model import build_model

    cfg, model = load_run(a.run)
    try:
        check_level(model, a.level)  # before the data is read
    except ValueError as e:
        raise UsageError(f"learntok diagnose variance {a.run}: {e}") from None
    if model.boundary.learns_by != "score_function":
        raise UsageError(f"learntok diagnose variance: {a.run} trains --boundaries {cfg.boundary.boundaries}, which "
                         "has no policy gradient")
    if a.init:
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, cfg.boundary)
    _, docs = load_split(cfg.data, "val")
    seqs = ByteSequences(docs, cfg.data.seq_len, cfg.data.pack, name="validation data")
    if len(seqs) < a.batch_size:
        raise UsageError(f"the validation split has {len(seqs)} sequences, fewer than --batch-size {a.batch_size}")
    batch = torch.from_numpy(seqs.batch(range(a.batch_size)))
    rows, info = policy_gradient_variance(model, batch, samples=a.samples, seed=a.seed, level=a.level,
                                           gammas=a.gammas)
    table = format_table(rows, info)
    print(f"{a.run} ({'initialisation' if a.init else 'trained'})\n{table}")
    run_dir = Path(a.run) if (Path(a.run) / "config.json").exists() else Path(a.run).parent
    name = (("diagnose-init" if a.init else "diagnose") + ("" if a.level == 1 else f"-level{a.level}")
            + ("-gammas" if a.gammas else ""))  # another measurement: it does not overwrite the default one
    out = Path(a.out) if a.out else run_dir / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "variance.json").write_text(json.dumps({"run": a.run, "init": a.init, **info,
                                                   "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    (out / "variance.md").write_text(table + "\n")
    try:
        level = "" if a.level == 1 else f", level {a.level}"
        _plot(rows, out / "variance.png", f"{run_dir.name} ({'init' if a.init else 'trained'}{level})")
    except ImportError as e:
        print(f"note: no plot ({e})", file=sys.stderr)
    print(f"written: {out}/variance.json, variance.md" + (", variance.png" if (out / 'variance.png').exists() else ""))
    return 0


def _plot(rows, path: Path, title: str) -> None:
    from learntok.viz.mpl import pyplot, save

    plt = pyplot()
    groups = sorted({r.group for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for gi, g in enumerate(groups):
        rs = [r for r in rows if r.group == g]
        xs = [i + 0.4 * gi for i in range(len(rs))]
        axes[0].bar(xs, [r.variance for r in rs], width=0.4, label=g)
        axes[1].bar(xs, [r.cosine for r in rs], width=0.4, label=g)
    names = [r.name for r in rows if r.group == groups[0]]
    for ax, label in zip(axes, ("variance of one batch's estimate (log)", "cosine to the reference")):
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_title(label)
    axes[0].set_yscale("log")
    axes[1].set_ylim(min(0.0, min(r.cosine for r in rows)), 1.05)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    save(fig, path, dpi=110)
