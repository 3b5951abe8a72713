"""learntok: byte-level language models that learn their own tokenization end to end."""

from learntok.version import __version__ as __version__


def from_pretrained(path, device="cpu"):
    """A trained ByteLM from an exported model directory, a run directory, a Hub id or a bundled model's name
    ("enwiki-small") (see learntok.pretrained)."""
    from learntok.pretrained import from_pretrained as _load

    return _load(path, device)


def save_pretrained(model, out_dir, *, seq_len: int, source_dir=None):
    from learntok.pretrained import save_pretrained as _save

    return _save(model, out_dir, seq_len=seq_len, source_dir=source_dir)


def generate(model, prompts, max_new_bytes: int = 200, **kw) -> list[bytes]:
    """Batched cached generation (see learntok.generation.generate for the options)."""
    from learntok.generation import generate as _generate

    return _generate(model, prompts, max_new_bytes, **kw)


def sweep(out, axes, **kw) -> list[dict]:
    """A grid of training runs, every cell at one FLOPs or time budget, resumable; its records (see
    learntok.cli.sweep.sweep for the options; the command line's `learntok sweep`)."""
    from learntok.cli.sweep import sweep as _sweep

    return _sweep(out, axes, **kw)


def __getattr__(name):  # lazy: `learntok.Segmenter` without importing torch at package import
    if name in ("Segmenter", "Span"):
        from learntok import segment

        return getattr(segment, name)
    if name in ("LearnedTokenizer", "Encoding"):
        from learntok import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(name)
