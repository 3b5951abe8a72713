"""Command-line entry points `learntok show`, `learntok plot` and `learntok report` (registered by learntok.cli).

Bad input raises ValueError / FileNotFoundError with a one-line message; the CLI prints it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from learntok.argtypes import Parser, non_negative_int

SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog. Tokenizers split text into pieces;\n"
               "def tokenize(text: str) -> list[str]:\n    return text.split()\n"
               "Grüße aus München! 東京は日本の首都です。 🙂\n")
"""What `learntok show` maps when given no --text or --file: prose, code and multi-byte characters."""

SHOW_EPILOG = """examples:
  learntok show runs/tiny                                   # a built-in sample, coloured in the terminal
  learntok show runs/tiny --text "Hello, world!" --greedy
  learntok show runs/tiny/step_000200 --file notes.txt --html map.html --png map.png
  cat notes.txt | learntok show runs/tiny --file -

Texts longer than the model's input (seq_len - 1 bytes) are processed in consecutive windows; each starts
afresh after BOS, as training sequences do."""




def show_parser() -> argparse.ArgumentParser:
    p = Parser(prog="learntok show", epilog=SHOW_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                description="The boundary map of a text: each character coloured by the model's boundary "
                            "probability p (of its last byte), drawn boundaries marked.")
    p.add_argument("checkpoint", help="run directory (its latest checkpoint) or a checkpoint directory run/step_N")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="the text to map")
    src.add_argument("--file", default=None, help="a file to map (its bytes as they are); - reads stdin")
    p.add_argument("--html", default=None, help="also write a self-contained HTML page here")
    p.add_argument("--png", default=None, help="also write a PNG image here (needs matplotlib)")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=1234,
                   help="seed of the boundary draws (default: validation's seed)")
    p.add_argument("--greedy", action="store_true", help="draw boundaries greedily (a = [p > 0.5]) instead")
    p.add_argument("--max-bytes", type=non_negative_int("--max-bytes"), default=16384,
                   help="map at most this many bytes of the text (0 = all)")
    p.add_argument("--width", type=non_negative_int("--width"), default=100, help="characters per PNG line")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="terminal colours (auto: when stdout is a terminal; never: '|' before each boundary)")
    p.add_argument("--quiet", action="store_true", help="do not print the map to the terminal")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    return p


def _read_text(args) -> bytes:
    if args.text is not None:
        return args.text.encode("utf-8")
    if args.file is None:
        return SAMPLE_TEXT.encode("utf-8")
    if args.file == "-":
        return sys.stdin.buffer.read()
    path = Path(args.file)
    if not path.exists():
        raise FileNotFoundError(f"--file {args.file}: no such file")
    if not path.is_file():
        raise ValueError(f"--file {args.file}: not a regular file")
    return path.read_bytes()


def cmd_show(argv: list[str]) -> int:
    args = show_parser().parse_args(argv)
    data = _read_text(args)
    if not data:
        raise ValueError("nothing to show: the text is empty")
    from learntok.checkpoint import load_run
    from learntok.viz.boundary_map import compute_map
    from learntok.viz.render import ansi_legend, render_ansi, render_html

    if args.max_bytes and len(data) > args.max_bytes:
        print(f"note: mapping the first {args.max_bytes} of {len(data)} bytes (--max-bytes)", file=sys.stderr)
        data = data[:args.max_bytes]
    cfg, model = load_run(args.checkpoint, device=args.device)
    bmap = compute_map(model, data, window=max(1, cfg.data_cfg.seq_len - 1), seed=args.seed, greedy=args.greedy)
    if not args.quiet:
        color = None if args.color == "auto" else args.color == "always"
        print(render_ansi(bmap, color=color).rstrip("\n"))
        print(ansi_legend(color))
        print(f"{bmap.label}; {len(bmap.ids)} bytes, {int(bmap.mask.sum())} boundaries (rate {bmap.rate:.3f})")
    if args.html:
        Path(args.html).parent.mkdir(parents=True, exist_ok=True)
        Path(args.html).write_text(render_html(bmap, f"learntok boundary map: {Path(args.checkpoint).name}"),
                                   encoding="utf-8")
        print(f"wrote {args.html}")
    if args.png:
        from learntok.viz.mpl import save_map_png

        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        for notice in save_map_png(bmap, args.png, width=max(20, args.width)):
            print(f"note: {notice}", file=sys.stderr)
        print(f"wrote {args.png}")
    return 0


def plot_parser() -> argparse.ArgumentParser:
    p = Parser(prog="learntok plot", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="Training curves of one or more runs from their metrics.jsonl: validation bits per "
                            "byte against FLOPs and bytes, boundary rate and -log pi, loss terms, throughput.",
                epilog="examples:\n  learntok plot runs/learned runs/uniform --out figs\n"
                       "  learntok plot runs/tiny --format svg              # writes runs/tiny/plots/*.svg")
    p.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", default=None, help="output directory (default: RUN_DIR/plots for one run, "
                   "./plots for several)")
    p.add_argument("--format", choices=("png", "svg"), default="png", help="image format")
    return p


def cmd_plot(argv: list[str]) -> int:
    args = plot_parser().parse_args(argv)
    from learntok.viz.curves import load_metrics, save_figures

    runs = [load_metrics(r) for r in args.runs]
    for run in runs:
        if run.skipped:
            print(f"note: {run.path}/metrics.jsonl: skipped {run.skipped} malformed line(s)", file=sys.stderr)
    out = args.out or (Path(args.runs[0]) / "plots" if len(runs) == 1 else Path("plots"))
    for path in save_figures(runs, out, args.format):
        print(f"wrote {path}")
    return 0


def report_parser() -> argparse.ArgumentParser:
    p = Parser(prog="learntok report", formatter_class=argparse.RawDescriptionHelpFormatter,
                description="One self-contained HTML page for a run: summary, curves, boundary maps of held-out "
                            "samples, final evaluation (eval.json), configuration and environment.",
                epilog="examples:\n  learntok report runs/tiny                  # writes runs/tiny/report.html\n"
                       "  learntok report runs/tiny --out tiny.html --samples 5")
    p.add_argument("run", help="run directory")
    p.add_argument("--out", default=None, help="output file (default: RUN_DIR/report.html)")
    p.add_argument("--samples", type=non_negative_int("--samples"), default=3, help="held-out sequences to map")
    p.add_argument("--sample-bytes", type=non_negative_int("--sample-bytes"), default=600,
                   help="bytes shown per sample")
    p.add_argument("--seed", type=non_negative_int("--seed"), default=1234, help="seed of the boundary draws")
    return p


def cmd_report(argv: list[str]) -> int:
    args = report_parser().parse_args(argv)
    from learntok.viz.report import write_report

    if not Path(args.run).is_dir():
        raise FileNotFoundError(f"{args.run}: no such run directory")
    path = write_report(args.run, args.out, n_samples=args.samples, sample_bytes=max(1, args.sample_bytes),
                        seed=args.seed)
    print(f"wrote {path}")
    return 0


COMMANDS = {"show": cmd_show, "plot": cmd_plot, "report": cmd_report}
"""Name -> entry point, for learntok.cli to register."""
