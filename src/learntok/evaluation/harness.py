"""An lm-evaluation-harness model for learntok checkpoints (optional extra: `pip install 'learntok[eval]'`).

Importing this module registers `LearntokLM` under the model name "learntok" (lm_eval's registry is how the
harness finds models; nothing else happens at import). Usage:

    import lm_eval, learntok.evaluation.harness  # noqa: F401  (registers "learntok")
    lm_eval.simple_evaluate(model="learntok", model_args="pretrained=runs/tiny,boundaries_mode=sample",
                            tasks=["lambada_openai"])

Text is UTF-8 bytes. loglikelihood = sum of byte log-probabilities of the continuation given the context (the
context left-truncated to the model's training length), is_greedy = every continuation byte is the argmax;
loglikelihood_rolling scores a whole string in disjoint windows with maximal context (lm_eval's rolling windows,
over bytes); generate_until decodes greedy bytes (one forward per byte) until a stop string or max_gen_toks bytes.
Boundaries follow `learntok.evaluation.bpb` (sample with a fixed seed by default; greedy; average): the noise of a
text is keyed by a hash of its context, so every candidate continuation of one context sees the same context
boundaries, whatever the batching.
"""

from __future__ import annotations

import hashlib
import warnings

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from learntok.draw import EVAL_SEED
from learntok.errors import LearntokWarning
from learntok.evaluation.bpb import BoundaryMode, greedy_decode, score_pairs
from learntok.vocab import BOS


def text_key(data: bytes) -> int:
    """A stable non-negative 63-bit key of a text (its boundary-noise stream)."""
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") >> 1


@register_model("learntok")
class LearntokLM(LM):
    """lm_eval `LM` over a learntok run, checkpoint or exported directory or a Hub id (`pretrained=PATH`), or an
    in-memory model."""

    def __init__(self, pretrained: str | None = None, *, model=None, cfg=None, batch_size: int | str = 16,
                 max_batch_size: int | None = None, device: str | None = "cpu", boundaries_mode: str = "sample",
                 samples: int = 4, seed: int = EVAL_SEED, max_gen_toks: int = 256, **kwargs) -> None:
        super().__init__()
        if kwargs:
            raise ValueError(f"learntok model: unknown argument(s) {', '.join(sorted(kwargs))}")
        if model is None:
            if pretrained is None:
                raise ValueError("learntok model: give pretrained=RUN_DIR (or model= and cfg= in Python)")
            import torch

            from learntok.pretrained import load

            if str(device or "cpu").startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"  # lm_eval's CLI asks for cuda:0 unless told otherwise
            loaded = load(pretrained, device or "cpu")
            model, cfg, window = loaded.model, loaded.cfg, loaded.seq_len
        elif cfg is None:
            raise ValueError("learntok model: an in-memory model= needs its TrainConfig as cfg=")
        else:
            window = cfg.data.seq_len
        self.cfg, self.model = cfg, model.eval()
        self.window = window
        self.batch = int(batch_size) if str(batch_size).isdigit() else 16  # "auto" -> 16
        self.mode = BoundaryMode(boundaries_mode, int(samples) if boundaries_mode == "average" else 1, int(seed))
        self.max_gen_toks = int(max_gen_toks)

    def _score(self, pairs: list[tuple[bytes, bytes]], keys: list[int], disable_tqdm: bool):
        return score_pairs(self.model, pairs, keys, self.window, self.mode, batch_size=self.batch,
                           progress=not disable_tqdm, desc="learntok")

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [(ctx.encode(), cont.encode()) for ctx, cont in (r.args[:2] for r in requests)]
        scores = self._score(pairs, [text_key(c) for c, _ in pairs], disable_tqdm)
        if getattr(self.model, "predicts_tokens", False):
            warnings.warn("the BPE transformer (--arch token) predicts tokens, not bytes: is_greedy is False for "
                          "every request, so accuracies built on it (LAMBADA's) are not defined", LearntokWarning,
                          stacklevel=2)
        out = [(-s.nll, s.greedy) for s in scores]
        for r, o in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", r.args, o)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs, keys, owner = [], [], []
        for i, r in enumerate(requests):
            data = r.args[0].encode()
            # Inputs are BOS + context + continuation (+ one position), so windows hold window - 2 predictions.
            for ctx, cont in map(make_disjoint_window,
                                 get_rolling_token_windows(list(data), BOS, max(1, self.window - 2), 1)):
                c = bytes(t for t in ctx if t < 256)
                pairs.append((c, bytes(cont)))
                keys.append(text_key(c + bytes(cont)))
                owner.append(i)
        scores = self._score(pairs, keys, disable_tqdm)
        out = [0.0] * len(requests)
        for i, s in zip(owner, scores):
            out[i] -= s.nll
        for r, o in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, o)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if getattr(self.model, "predicts_tokens", False):
            raise ValueError("learntok model: generation is for byte-level models; the BPE baseline (--arch token) "
                             "predicts tokens")
        contexts, stops, limits = [], [], []
        for r in requests:
            ctx, kw = r.args[0], dict(r.args[1] if len(r.args) > 1 and r.args[1] else {})
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            contexts.append(ctx.encode())
            stops.append([u.encode() for u in until if u])
            limits.append(int(kw.get("max_gen_toks", self.max_gen_toks)))
        gen = greedy_decode(self.model, contexts, [text_key(c) for c in contexts], limits, self.window, self.mode,
                            batch_size=self.batch, stop=lambda i, g: any(s in g for s in stops[i]))
        out = []
        for r, g, row_stops in zip(requests, gen, stops):
            cut = min([g.find(s) for s in row_stops if s in g] or [len(g)])
            text = g[:cut].decode("utf-8", errors="ignore")
            self.cache_hook.add_partial("generate_until", r.args, text)
            out.append(text)
        return out


if __name__ == "__main__":  # `python -m learntok.evaluation.harness --model learntok ...`: lm_eval's CLI, registered
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
