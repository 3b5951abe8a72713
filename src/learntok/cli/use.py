"""Using a trained model: `learntok generate`, `learntok segment`, `learntok vocab`."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from learntok.cli import UsageError, parse


def ask_rate(model, rate: float) -> None:
    """model.set_rate(rate), or a one-line error for a model without a rate knob."""
    if not getattr(getattr(model, "boundary", None), "rate_knob", False):
        raise UsageError(f"--rate: this model's boundaries ({model.bcfg.boundaries}) have no rate knob (a learned "
                         "policy has)")
    model.set_rate(rate)


def read_input(text: str | None, file: str | None, default: bytes | None = None) -> bytes:
    """The bytes of --text, or of --file (`-` = stdin), or `default` (None: stdin); both flags is an error."""
    if text is not None and file is not None:
        raise UsageError("give --text or --file, not both")
    if text is not None:
        return text.encode("utf-8", "surrogateescape")  # bytes that were not UTF-8 in argv come back as they were
    if file is None and default is not None:
        return default
    if file is None or file == "-":
        return sys.stdin.buffer.read()
    return input_path(file).read_bytes()


def input_path(file: str) -> Path:
    """--file's path, or a one-line error for a missing path or one that is not a regular file."""
    path = Path(file)
    if not path.exists():
        raise FileNotFoundError(f"--file {file}: no such file")
    if not path.is_file():
        raise UsageError(f"--file {file}: not a regular file")
    return path


@dataclass(frozen=True, kw_only=True)
class GenerateArgs:
    """Continue prompts, streaming bytes as they are produced (cached generation: learntok.generation)."""

    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="[MODEL]")] = "enwiki-small"
    """Run, checkpoint or exported model directory, Hugging Face Hub id user/name, or a bundled model (enwiki-small
    ships with learntok)."""
    prompt: Annotated[tuple[str, ...], tyro.conf.UseAppendAction]
    """A prompt; repeat the flag for a batch (then each output is printed as a JSON line)."""
    max_new_bytes: int = 200
    """Bytes to generate per prompt."""
    temperature: float = 0.8
    """Sampling temperature (0 = greedy)."""
    top_k: int = 0
    """Sample from the k most likely bytes (0 = all)."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of bytes with this much probability."""
    seed: int = 0
    """Seed of the byte sampling and the boundary noise."""
    stop: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """Stop a row when its output ends with this (repeatable)."""
    cache: bool = True
    """Cached steps (--no-cache recomputes the full forward pass every byte)."""
    rate: float | None = None
    """Ask a learned policy for this boundary rate (boundaries per byte; calibrated if `learntok calibrate` ran)
    instead of its trained one."""
    device: str = "cpu"
    """cpu, cuda, cuda:N or auto."""

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("give at least one --prompt")
        from learntok.generation import MAX_NEW_BYTES

        if (self.max_new_bytes < 0 or self.top_k < 0 or not 0 <= self.temperature < math.inf
                or not 0 < self.top_p <= 1):
            raise ValueError("--max-new-bytes, --top-k and --temperature must be non-negative (--temperature finite) "
                             "and --top-p in (0, 1] "
                             f"(got {self.max_new_bytes}, {self.top_k}, {self.temperature}, {self.top_p})")
        if self.max_new_bytes > MAX_NEW_BYTES:  # checked before the prompt is echoed, as the rest
            raise ValueError(f"--max-new-bytes must be at most {MAX_NEW_BYTES:,}, got {self.max_new_bytes:,}")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"--seed must be in [0, 2**63), got {self.seed}")
        if any(s == "" for s in self.stop):
            raise ValueError("--stop '': an empty stop string would end every row after one byte")


def cmd_generate(argv: list[str]) -> int:
    a = parse(GenerateArgs, argv, "learntok generate", GenerateArgs.__doc__ or "")
    from learntok.device import resolve_device
    from learntok.generation import generate
    from learntok.pretrained import from_pretrained

    model = from_pretrained(a.checkpoint, resolve_device(a.device))
    if a.rate is not None:
        ask_rate(model, a.rate)
    single = len(a.prompt) == 1
    prompts = [p.encode("utf-8", "surrogateescape") for p in a.prompt]  # bytes that were not UTF-8 in argv, as given
    if single:
        sys.stdout.write(prompts[0].decode("utf-8", errors="replace"))
    outs = generate(model, prompts, a.max_new_bytes, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                    seed=a.seed, stop=[s.encode("utf-8", "surrogateescape") for s in a.stop], use_cache=a.cache,
                    on_text=(lambda _b, text: (sys.stdout.write(text), sys.stdout.flush())) if single else None)
    if single:
        sys.stdout.write("\n")
    else:
        for prompt, out in zip(prompts, outs):
            print(json.dumps({"prompt": prompt.decode("utf-8", errors="replace"),
                              "output": out.decode("utf-8", errors="replace")}))
    return 0


@dataclass(frozen=True, kw_only=True)
class SegmentArgs:
    """Segment text with a model's learned boundaries (a boundary byte starts a segment)."""

    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="[MODEL]")] = "enwiki-small"
    """Run, checkpoint or exported model directory, Hugging Face Hub id user/name, or a bundled model (enwiki-small
    ships with learntok)."""
    text: str | None = None
    """The text to segment (default: standard input)."""
    file: str | None = None
    """A file to segment (its bytes as they are; - = standard input)."""
    greedy: bool = False
    """A boundary where p > 0.5, instead of sampling with --seed (the paper's evaluation). Without it: the
    setting saved with the tokenizer (`LearnedTokenizer.save_pretrained`), else sampling."""
    seed: int | None = None
    """Seed of the boundary draws (default: the one saved with the tokenizer, else the evaluation seed, as
    `learntok show` draws them)."""
    format: Literal["text", "jsonl"] = "text"
    """text: segments joined by --sep; jsonl: one {start, end, text} object per segment (byte offsets). A segment
    edge inside a UTF-8 character shows its bytes as \\xNN in text, and as surrogate escapes in jsonl (so the
    texts joined and encoded with errors="surrogateescape" give the input back)."""
    sep: str = "|"
    """Separator for --format text."""
    out: str | None = None
    """Write here instead of standard output."""
    stats: bool = False
    """Instead of the segments, print statistics as JSON: bytes per token (mean, CV), agreement with the
    whitespace rule, and boundary stability (flips under a shifted text and bf16 / int8 weights, greedy, on the
    first 64 KB); learntok.evaluation.stability."""
    rate: float | None = None
    """Ask a learned policy for this boundary rate (boundaries per byte; calibrated if `learntok calibrate` ran)
    instead of its trained one."""
    level: int | None = None
    """Boundary level: 2 segments a two-level model (trained with --inner-layers) into its super-tokens
    (default: the level saved with an exported tokenizer, else 1)."""


def cmd_segment(argv: list[str]) -> int:
    a = parse(SegmentArgs, argv, "learntok segment", SegmentArgs.__doc__ or "")
    from learntok.tokenizer import LearnedTokenizer

    streamed = a.file not in (None, "-") and a.text is None and not a.stats  # a file: read in blocks
    data = b"" if streamed else read_input(a.text, a.file)
    path = input_path(a.file) if streamed else None
    asked = (("rate", a.rate), ("level", a.level), ("seed", a.seed), ("greedy", a.greedy or None))
    tok = LearnedTokenizer.from_pretrained(a.checkpoint, **{k: v for k, v in asked if v is not None})
    if a.stats:
        from learntok.evaluation.stability import chunk_stats, stability

        enc = tok.encode(data)
        report = {"bytes": len(data), "mode": "greedy" if tok.greedy else f"sampled, seed {tok.seed}",
                  "level": tok.level, **chunk_stats(enc.token_lengths, [enc.boundaries], [data]),
                  "stability": stability(tok.model, [data], tok.window - 1, level=tok.level)}
        text = json.dumps(report, indent=2).replace("NaN", "null") + "\n"
        Path(a.out).write_text(text) if a.out else sys.stdout.write(text)
        return 0
    spans = tok.stream_spans(_blocks(path)) if streamed else \
        ((s, e, data[s:e]) for s, e in tok.encode(data).byte_offsets)
    out = open(a.out, "w", encoding="utf-8") if a.out else sys.stdout  # noqa: SIM115 (closed below)
    try:
        first = True
        for s, e, piece in spans:  # a character cut by a segment edge stays recoverable (not U+FFFD)
            if a.format == "jsonl":
                text = piece.decode("utf-8", errors="surrogateescape")
                out.write(json.dumps({"start": s, "end": e, "text": text}) + "\n")
            else:
                out.write(("" if first else a.sep) + piece.decode("utf-8", errors="backslashreplace"))
            first = False
        if a.format == "text":
            out.write("\n")
    finally:
        if a.out:
            out.close()
    return 0


def _blocks(path: Path, size: int = 1 << 20):
    """A file's bytes in blocks, with a progress bar on a terminal for files over 4 MB."""
    from tqdm import tqdm

    total = path.stat().st_size
    with open(path, "rb") as f, tqdm(total=total, unit="B", unit_scale=True, desc="segment",
                                     disable=None if total > 4 << 20 else True) as bar:
        while block := f.read(size):
            bar.update(len(block))
            yield block


@dataclass(frozen=True, kw_only=True)
class VocabArgs:
    """Statistics of the learned segments over a corpus: most frequent segments, mean length, share of whole
    words."""

    checkpoint: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="[MODEL]")] = "enwiki-small"
    """Run, checkpoint or exported model directory, Hugging Face Hub id user/name, or a bundled model (enwiki-small
    ships with learntok)."""
    data: str
    """Any data spec `learntok train --data` accepts."""
    text_field: str = "text"
    """Field holding the text in .jsonl/.parquet rows."""
    max_bytes: int = 200_000
    """Bytes of the corpus to segment."""
    top: int = 30
    """Most frequent segments to list."""
    level: int | None = None
    """Boundary level: 2 counts a two-level model's (trained with --inner-layers) super-tokens (default: the level
    saved with an exported tokenizer, else 1)."""

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.top < 0:
            raise ValueError(f"--max-bytes must be >= 1 and --top >= 0 (got {self.max_bytes}, {self.top})")


def cmd_vocab(argv: list[str]) -> int:
    a = parse(VocabArgs, argv, "learntok vocab", VocabArgs.__doc__ or "")
    from learntok.data import head_documents, iter_documents
    from learntok.segment import Segmenter, vocab_stats

    seg = Segmenter.from_pretrained(a.checkpoint, **({} if a.level is None else {"level": a.level}))
    docs = head_documents((doc for _, doc in iter_documents(a.data, a.text_field)), a.max_bytes)
    total = sum(map(len, docs))
    stats = vocab_stats(docs, [seg.segment(d) for d in docs], top=a.top)
    print(f"{stats['segments']:,} segments ({stats['distinct']:,} distinct) over {total:,} bytes; "
          f"mean {stats['mean_bytes']:.2f} bytes; whole words {100 * stats['whole_word_share']:.1f}%")
    for text, count in stats["most_frequent"]:
        print(f"{count:8d}  {text!r}")
    return 0
