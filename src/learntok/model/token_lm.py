"""A standard BPE-tokenized transformer (`--arch token --boundaries bpe`), the baseline every tokenizer-free
paper compares against, trained and evaluated on the same byte windows as the U-Net.

The `bpe` strategy trains the byte-level BPE tokenizer and flags the first byte of every token (learntok's data
pipeline annotates the documents); this model cuts each window's bytes at those flags into tokens, embeds them,
runs causal transformer blocks over them and predicts the next token out of the BPE vocabulary (+ BOS, EOS).
Bits per byte are the paper's for a tokenized model: the total NLL of the tokens in bits over the bytes they
cover. To share learntok's byte-level accounting, each token's NLL is placed at its last byte (`nll`, zero
elsewhere), so any sum over byte targets is a sum over whole tokens.

Training minimises the mean NLL per token (the usual LM objective); `loss/auto` logs NLL per byte. FLOPs: 6 x
matrix parameters (blocks and output head) per token. A window cut mid-token starts with the token's tail, which
the BPE model encodes into the tokens of that tail (as a tokenizer would if the text began there).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from learntok.boundaries import BoundaryOutput, build_strategy
from learntok.config import ModelConfig
from learntok.model.lm import ModelOutput
from learntok.nn.attention import softcap
from learntok.nn.layers import Block, RMSNorm, rope_tables, run_block
from learntok.nn.ngram import HashedNgrams
from learntok.vocab import EOS, IGNORE


class TokenLM(nn.Module):
    predicts_tokens = True
    """Its logits are over BPE tokens, not bytes (evaluation reads `nll`, and generation is not offered)."""

    def __init__(self, cfg: ModelConfig, bcfg):
        super().__init__()
        if bcfg.boundaries != "bpe" or not getattr(bcfg, "bpe_vocab_size", 0):
            raise ValueError("--arch token is a BPE-tokenized transformer: it needs --boundaries bpe and a fixed "
                             "--bpe-vocab-size (e.g. 4096)")
        self.cfg, self.bcfg = cfg, bcfg
        self.activation_checkpointing = False
        """Set by training (--activation-checkpointing)."""
        self.boundary = build_strategy(bcfg, cfg.d_model)  # trains / loads the tokenizer; annotates the data
        self.vocab = bcfg.bpe_vocab_size + 2  # BPE tokens, then BOS and EOS
        self.bos, self.eos = self.vocab - 2, self.vocab - 1
        d, H = cfg.d_model, cfg.n_heads
        backend = cfg.attn_backend  # "auto" is resolved per call, on the device of the inputs
        hidden = round(cfg.token_mlp_mult * d)
        self.embed = nn.Embedding(self.vocab, d)
        with torch.random.fork_rng(devices=[]):  # --ngram-sizes: hashed token n-grams (the control for byte n-grams)
            self.ngrams = HashedNgrams(d, cfg.ngram_sizes, cfg.ngram_table, before=self.vocab) \
                if cfg.ngram_sizes else None
        self.blocks = nn.ModuleList(Block(d, H, hidden, None, cfg.attn_softcap, backend) for _ in range(cfg.n_mid))
        self.norm_out = RMSNorm(d)
        self.head = nn.Linear(d, self.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=cfg.init_std)
        nn.init.normal_(self.embed.weight, std=1.0)  # unit scale, as the U-Net's byte embeddings
        for name, p in self.named_parameters():  # residual-output projections: smaller init (GPT-2)
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=cfg.init_std / math.sqrt(2 * max(cfg.n_mid, 1)))
        self._ids: dict[bytes, int] | None = None

    def _token_ids(self, piece: bytes) -> list[tuple[int, int]]:
        """(BPE id, bytes) of the tokens of one segment: itself if it is a token of the vocabulary, else what the
        BPE model makes of it (a window's cut-off first token)."""
        from learntok.boundaries.bpe import byte_chars

        tok, chars = self.boundary.tokenizer, byte_chars()
        if self._ids is None:
            table = {c: b for b, c in enumerate(chars)}
            self._ids = {bytes(table[c] for c in s): i for s, i in tok.get_vocab().items()}
        i = self._ids.get(piece)
        if i is not None:
            return [(i, len(piece))]
        return [(t.id, len(t.value)) for t in tok.model.tokenize("".join(chars[b] for b in piece))]

    def _tokenize(self, targets: torch.Tensor, starts: torch.Tensor) -> list[list[tuple[int, int]]]:
        """Per row, (token id, position of its last byte) for the bytes of `targets` (B,T) cut at `starts`."""
        rows = []
        for row, st in zip(targets.tolist(), starts.tolist()):
            n = next((i for i, t in enumerate(row) if t == IGNORE), len(row))
            cuts = [i for i in range(n) if st[i] or i == 0 or row[i] == EOS or row[i - 1] == EOS] + [n]
            out = []
            for a, b in zip(cuts, cuts[1:]):
                if row[a] == EOS:
                    out.append((self.eos, a))
                    continue
                end = a
                for i, n in self._token_ids(bytes(row[a:b])):  # one token, or the tokens of a cut-off piece
                    end += n
                    out.append((i, end - 1))
            rows.append(out)
        return rows

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None, *, noise=None, generator=None,
                prescribed: torch.Tensor | None = None, batch_stats=None, boundaries=None) -> ModelOutput:
        """ids, targets (B,T) bytes as for the U-Net; prescribed (B,T) the BPE token-start flags aligned with
        ids (the data pipeline's). The tokens are cut from the target bytes (without targets: from ids[:, 1:],
        for drawing the segmentation)."""
        if prescribed is None:
            raise ValueError("the BPE transformer needs the bpe strategy's prescribed flags")
        given = targets is not None
        if not given:
            targets = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], IGNORE)], 1)
        B, T = targets.shape
        starts = torch.cat([prescribed[:, 1:], torch.zeros_like(prescribed[:, :1])], 1)  # flags of the targets
        rows = self._tokenize(targets, starts)
        M = max(len(r) for r in rows)
        tok = torch.full((B, M + 1), self.eos, dtype=torch.long)
        last = torch.zeros(B, M, dtype=torch.long)
        valid = torch.zeros(B, M, dtype=torch.bool)
        for b, r in enumerate(rows):
            tok[b, 0] = self.bos
            if r:
                tok[b, 1:len(r) + 1] = torch.tensor([i for i, _ in r])
                last[b, :len(r)] = torch.tensor([e for _, e in r])
                valid[b, :len(r)] = True
        tok, last, valid = tok.to(targets.device), last.to(targets.device), valid.to(targets.device)
        inp, tgt = tok[:, :-1], tok[:, 1:]  # (B,M): predict token k from tokens before it
        rope = rope_tables(torch.arange(M, device=targets.device), self.cfg.d_model // self.cfg.n_heads,
                           self.cfg.rope_base)
        h = self.embed(inp)
        if self.ngrams is not None:
            h = h + self.ngrams(inp)
        for blk in self.blocks:
            h = run_block(blk, h, rope, recompute=self.activation_checkpointing and self.training)
        logits = softcap(self.head(self.norm_out(h)).float(), self.cfg.final_softcap)  # (B,M,V)
        tok_nll = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="none").view(B, M) * valid
        nll = torch.zeros(B, T, device=targets.device).scatter_add(1, last, tok_nll)  # (B,T) at each last byte
        mask = prescribed.bool().clone()  # boundaries as the U-Net's `bpe` arm reports them (stats and drawings)
        count = valid.sum(1)
        out = ModelOutput(logits=logits, boundaries=BoundaryOutput(mask=mask, probs=mask.float()), n_tokens=count,
                          nll=nll, nll_early=torch.zeros_like(nll))
        if given:
            n_bytes = (targets != IGNORE).sum().clamp(min=1)
            out.loss = tok_nll.sum() / count.sum().clamp(min=1)
            out.terms = {"loss/auto": (tok_nll.sum() / n_bytes).detach(), "loss/token": out.loss.detach()}
        return out

    def matrix_params(self) -> tuple[int, int]:
        """(byte-level, token-level) matrix parameters: everything runs per token (blocks and output head)."""
        return 0, sum(p.numel() for n, p in self.named_parameters()
                      if p.dim() >= 2 and not n.startswith(("embed", "ngrams.")))

    def train_flops(self, n_bytes: float, n_tokens: float) -> float:
        return 6.0 * self.matrix_params()[1] * n_tokens

    def flops_conventions(self, rows: int, seq_len: int, tokens: float, slots: float, token_pairs: float) -> dict:
        """The three conventions of learntok.model.flops: every layer runs per token (causal attention)."""
        from learntok.model.flops import conventions

        return conventions(0.0, self.matrix_params()[1], tokens, slots,
                           attention=self.cfg.d_model * self.cfg.n_mid * token_pairs)
