"""Boundaries drawn the evaluation way: the strategy in eval mode (the learned policy without its soft-cap) and one
sample from a generator seeded with EVAL_SEED, or greedily (u_t = 0.5, so a_t = [p_t > 0.5]).

Validation, `learntok eval`'s diagnostics, `show`, `report`, `segment` and the model card all draw here, so one
text gets the same boundaries everywhere. (Held-out and task BPB key their noise per text instead, with the same
seed: learntok.evaluation.bpb.) torch is imported on first use, so that the command line's option defaults can
read EVAL_SEED without loading it.
"""

from __future__ import annotations

from learntok.vocab import BOS

EVAL_SEED = 1234
"""The seed of every evaluation-time boundary draw."""


def eval_generator(device, seed: int = EVAL_SEED):
    """A torch.Generator on `device` seeded with `seed`: one per evaluation, drawn from batch after batch."""
    import torch

    return torch.Generator(device).manual_seed(seed)


def eval_forward(model, ids, targets=None, *, generator=None, greedy: bool = False, prescribed=None, **kw):
    """`model(ids, targets, ...)` without gradient in eval mode, its boundaries one sample from `generator` (default:
    a fresh eval_generator on ids' device) or greedy; the model's training flag is restored. ids (B,T) BOS first;
    prescribed (B,T) the strategy's flags or None; `kw` go to the model (e.g. boundaries=)."""
    import torch

    was_training = model.training
    model.eval()
    if greedy:
        kw["noise"] = torch.full(ids.shape, 0.5, device=ids.device)  # (B,T)
    else:
        kw["generator"] = generator if generator is not None else eval_generator(ids.device)
    try:
        with torch.no_grad():
            return model(ids, targets, prescribed=prescribed, **kw)
    finally:
        model.train(was_training)


PRECISIONS = ("fp32", "bf16")
"""What the boundary pass can run in: float32, or the encoder under bfloat16 autocast."""


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    return precision


def check_level(model, level: int) -> int:
    """`level` if the model has that boundary level (1: tokens over bytes; 2: a two-level model's super-tokens
    over tokens, `--inner-layers`), else a ValueError naming what it has."""
    if getattr(model, "predicts_tokens", False):
        raise ValueError("the BPE transformer (--arch token) draws no boundaries: its tokens are its BPE "
                         "tokenizer's (bpe_tokenizer.json); show, segment and boundary maps are for byte-level models")
    have = getattr(model, "levels", 1)
    if level < 1:
        raise ValueError(f"boundary level {level}: levels count from 1 (tokens over bytes)")
    if level > have:
        raise ValueError(f"boundary level {level}: this model has " + ("one level (a second needs training with "
                         "--inner-layers N)" if have == 1 else f"levels 1 to {have}"))
    return level


def evaluates_greedily(model) -> bool:
    """Whether the model's strategy is set to evaluate greedily (eval_boundaries = "greedy": a_t = [p_t > 0.5])."""
    return getattr(model.bcfg, "eval_boundaries", "sample") == "greedy"


def uniforms(n: int, greedy: bool, generator):
    """(n,) boundary uniforms on the CPU: 0.5 everywhere when greedy, else the next n draws of `generator`
    (drawn as a (1, n) tensor, the stream `learntok generate` reads for one prompt)."""
    import torch

    return torch.full((n,), 0.5) if greedy else torch.rand((1, n), generator=generator)[0]


def windows(n: int, window: int, context: int) -> list[tuple[int, int, int]]:
    """(first re-read byte, first new byte, end) of each window over n bytes: `window` bytes per window, every
    window after the first re-reading the `context` bytes before its new ones."""
    if window < 1:
        raise ValueError(f"window must be at least 1 byte, got {window}")
    if not 0 <= context < window:
        raise ValueError(f"context must be in [0, window), got {context} for window {window}")
    out, s = [], 0
    while s < n:
        lead = 0 if s == 0 else context
        end = min(n, s - lead + window)
        out.append((s - lead, s, end))
        s = end
    return out


def draw_texts(model, texts: list[bytes], window: int, *, seed: int = EVAL_SEED, greedy: bool = False,
               context: int | None = None, batch_size: int = 32, precision: str = "fp32", level: int = 1):
    """[(probs, mask)] per text, each (len(text),) on the CPU: boundaries drawn the evaluation way through the
    encoder and the strategy only (the token level and decoder are not needed to place boundaries; at level 2 the
    inner token layers run too).

    A text is read in windows of `window` bytes, each fed as BOS + its bytes; every window after the first
    re-reads the `context` bytes before its new ones (default window // 4) and keeps only the new bytes'
    boundaries, so a window start is not a forced boundary (with context=0 it is: consecutive windows, context
    restarting at each). Each text has its own generator seeded with `seed`, drawing its windows' uniforms in
    turn, so a text's boundaries do not depend on the other texts of the batch; windows of all texts run
    `batch_size` at a time (right-padded: no position reads a later one). A strategy that annotates gets the
    flags of the whole text. precision "bf16" runs the encoder under bfloat16 autocast (faster on CPUs with
    bfloat16 support; a few decisions near p = 0.5 can flip: learntok.evaluation.stability). level 2 (a two-level
    model): the second level's decisions at the bytes, drawn with the same uniforms (HierLM.super_boundaries: a
    super-token starts at a byte that starts a token and whose token the second level marks)."""
    import torch

    check_level(model, level)
    context = window // 4 if context is None else context
    jobs = (job for i, data in enumerate(texts) for job in _text_jobs(model, i, data, window, seed, greedy, context))
    probs = [[torch.zeros(0)] for _ in texts]
    mask = [[torch.zeros(0, dtype=torch.bool)] for _ in texts]
    for i, p, m in _run(model, jobs, batch_size, precision, level):
        probs[i].append(p)
        mask[i].append(m)
    return [(torch.cat(p), torch.cat(m)) for p, m in zip(probs, mask)]


def draw_text(model, data: bytes, window: int, *, seed: int = EVAL_SEED, greedy: bool = False,
              context: int | None = None, level: int = 1):
    """(probs, mask) of one text, as `draw_texts` draws it."""
    return draw_texts(model, [data], window, seed=seed, greedy=greedy, context=context, level=level)[0]


def draw_stream(model, blocks, window: int, *, seed: int = EVAL_SEED, greedy: bool = False,
                context: int | None = None, batch_size: int = 32, precision: str = "fp32", level: int = 1):
    """The boundary flags of one long text given as an iterable of byte blocks (a file read piece by piece),
    yielded as (mask,) chunks in order: the same flags `draw_text` gives for the whole text, in memory bounded
    by the block size and batch_size windows. Strategies that annotate need the whole text (use draw_text)."""
    import torch

    if model.boundary.annotator is not None:
        raise ValueError("streaming needs a strategy that does not annotate the whole text (bpe does): segment "
                         "the text in one piece")
    check_level(model, level)
    context = window // 4 if context is None else context
    greedy = greedy or evaluates_greedily(model)

    def jobs():
        gen = torch.Generator().manual_seed(seed)
        buf, pos, s = b"", 0, 0  # buf holds the text from offset pos; s: the next window's first new byte
        blocks_it = iter(blocks)
        done = False
        while True:
            lead = 0 if s == 0 else context
            while not done and len(buf) - (s - pos) < window - lead + 1:  # need the window and one byte more
                nxt = next(blocks_it, None)
                if nxt is None:
                    done = True
                else:
                    buf += bytes(nxt)
            n_avail = pos + len(buf)
            if s >= n_avail:
                return
            end = min(n_avail, s - lead + window)
            chunk = buf[s - lead - pos:end - pos]
            yield 0, chunk, lead, uniforms(len(chunk) + 1, greedy, gen), None
            drop = max(0, end - context - pos)  # keep the next window's context
            buf, pos, s = buf[drop:], pos + drop, end

    for _, _, m in _run(model, jobs(), batch_size, precision, level):
        yield m


def _text_jobs(model, key, data: bytes, window: int, seed: int, greedy: bool, context: int):
    """The windows of one text as jobs (key, window bytes, re-read bytes, uniforms, flags or None)."""
    import numpy as np
    import torch

    greedy = greedy or evaluates_greedily(model)
    gen = torch.Generator().manual_seed(seed)  # on the CPU: the same draws on any device
    annotate = model.boundary.annotator
    flags_all = None if annotate is None else np.asarray(annotate(data), dtype=bool)
    for a, s, e in windows(len(data), window, context):
        flags = None if flags_all is None else np.concatenate([[True], flags_all[a:e]])
        yield key, data[a:e], s - a, uniforms(e - a + 1, greedy, gen), flags


def _run(model, jobs, batch_size: int, precision: str = "fp32", level: int = 1):
    """(key, probs, mask) of each job's new bytes, in order, running `batch_size` windows per encoder pass
    (under bfloat16 autocast with precision "bf16"); at level 2 the second level's, through the inner layers."""
    import contextlib
    import itertools

    import torch

    from learntok.vocab import PAD

    check_precision(precision)
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    cast = torch.autocast(dev.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    try:
        with torch.no_grad(), cast:
            it = iter(jobs)
            while chunk := list(itertools.islice(it, batch_size)):
                T = max(len(w) for _, w, _, _, _ in chunk) + 1
                ids = torch.full((len(chunk), T), PAD, dtype=torch.long)
                noise = torch.full((len(chunk), T), 0.5)
                annotated = chunk[0][4] is not None
                pres = torch.ones(len(chunk), T, dtype=torch.bool) if annotated else None
                for r, (_, w, _, u, flags) in enumerate(chunk):
                    ids[r, : len(w) + 1] = torch.tensor([BOS, *w])
                    noise[r, : len(w) + 1] = u
                    if annotated:
                        pres[r, : len(w) + 1] = torch.from_numpy(flags)
                if level == 2:
                    probs, mask = model.super_boundaries(ids.to(dev), noise.to(dev))
                else:
                    _, out = model._propose(ids.to(dev), noise.to(dev), None, None if pres is None else pres.to(dev))
                    probs, mask = out.probs, out.mask
                for r, (key, w, lead, _, _) in enumerate(chunk):
                    keep = slice(1 + lead, 1 + len(w))  # byte j of the window is at position j + 1
                    yield key, probs[r, keep].float().cpu(), mask[r, keep].cpu()
    finally:
        model.train(was_training)
